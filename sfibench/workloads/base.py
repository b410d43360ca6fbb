"""What every quality workload produces: token-exact samples sized to a target context.

A task generator turns (prompt format, target tokens, seeded rng, sample index) into a `Sample`:
the prompt ids to prefill, the reference answers of each turn, the forced follow-up segments of a
multi-turn conversation, and metadata saying where the needles are. Lengths are in tokens of the
model's own tokenizer: `fit_to_tokens` searches for the largest amount of filler whose rendered
prompt does not exceed the target, so prompts land just below it (within one filler unit).
"""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass, field

from sfibench.models.tokenizer import Tokenizer

LENGTH_TOLERANCE = 0.03  # a prompt may fall at most this fraction short of its target


class UnknownTaskError(ValueError):
    pass


class ContextSizeError(ValueError):
    pass


@dataclass
class Sample:
    task: str
    index: int
    prompt: list[int]  # prefilled once, shared by every method
    answers: list[list[str]]  # reference strings per turn (empty for teacher-forced-only tasks)
    max_answer_tokens: int  # per turn
    follow_ups: list[list[int]] = field(default_factory=list)  # forced ids before turns 2..n
    teacher: list[int] | None = None  # perplexity tasks: the continuation every method is forced on
    scorer: str = "string_match_all"
    meta: dict = field(default_factory=dict)

    @property
    def decode_budget(self) -> int:
        """Most decode steps this sample can take (sizes the cache)."""
        if self.teacher is not None:
            return len(self.teacher)
        return self.max_answer_tokens * len(self.answers) + sum(len(f) for f in self.follow_ups)


class PromptFormat:
    """Renders a user message, an answer prefix and follow-up questions to ids, chat-templated or not.

    An instruct model answers needle questions far more reliably inside its chat template with the
    start of the answer already written (RULER's answer prefix), so that is the default. A prompt starts
    the way the model's tokenizer starts one by default: Gemma's adds `<bos>`, and without it the model
    was trained on no such input (gemma3-270m's needle answers fall from 2 of 4 to 0 of 4).
    """

    def __init__(self, tokenizer: Tokenizer, chat: bool = True):
        tokenizer.check_chat(chat)  # before any prompt is built: a run refused here has decoded nothing
        self.tokenizer, self.chat = tokenizer, chat
        self.bos = default_bos(tokenizer)

    def starting(self, ids: list[int]) -> list[int]:
        """`ids` as the first tokens of a prompt: after the BOS the tokenizer adds by default, unless already there."""
        return ids if ids[:len(self.bos)] == self.bos else self.bos + ids

    def first_turn(self, user_text: str, answer_prefix: str) -> list[int]:
        head = self.tokenizer.encode(user_text if self.chat else user_text + "\n", chat=self.chat)
        return self.starting(head + self.tokenizer.encode(answer_prefix))

    def follow_up(self, question: str, answer_prefix: str) -> list[int]:
        """Ids that close the previous answer and ask the next question (with its answer prefix)."""
        if not self.chat:
            return self.tokenizer.encode("\n" + question + "\n" + answer_prefix)
        marker = "\x00ANSWER\x00"  # render the template around a placeholder answer, keep what follows it
        text = self.tokenizer.backend.apply_chat_template(
            [{"role": "user", "content": "U"}, {"role": "assistant", "content": marker},
             {"role": "user", "content": question}], add_generation_prompt=True, tokenize=False)
        return self.tokenizer.encode(text.split(marker, 1)[1] + answer_prefix)

    def count(self, text: str) -> int:
        return len(self.tokenizer.encode(text))


def default_bos(tokenizer: Tokenizer) -> list[int]:
    """The BOS id the tokenizer puts before a text by default (`[]` if none): `Tokenizer.encode` never adds
    special tokens, so a prompt gets it here."""
    if tokenizer.byte_table:
        return []
    plain = tokenizer.backend("a", add_special_tokens=False)["input_ids"]
    full = tokenizer.backend("a")["input_ids"]
    bos = tokenizer.backend.bos_token_id
    return [bos] if bos is not None and full[:1] == [bos] and plain[:1] != [bos] else []


def fit_to_tokens(render: Callable[[int], list[int]], target: int, most: int, what: str) -> tuple[int, list[int]]:
    """Largest n in [1, most] with len(render(n)) <= target, by bisection; returns (n, ids).

    `render` must grow with n. Raises ContextSizeError when even n = 1 overflows or the best fit is
    more than LENGTH_TOLERANCE short of the target (the filler ran out).
    """
    low_ids = render(1)
    if len(low_ids) > target:
        raise ContextSizeError(f"{what}: the shortest prompt already has {len(low_ids)} tokens, more than "
                               f"the {target}-token target; use a larger --ctx")
    lo, hi, best = 1, most, low_ids
    while lo < hi:
        mid = (lo + hi + 1) // 2
        ids = render(mid)
        if len(ids) <= target:
            lo, best = mid, ids
        else:
            hi = mid - 1
    if len(best) < (1 - LENGTH_TOLERANCE) * target:
        raise ContextSizeError(f"{what}: only {len(best)} of the {target} target tokens could be filled; "
                               "use a smaller --ctx")
    return lo, best


Generator = Callable[[PromptFormat, int, random.Random, int], Sample]


@dataclass(frozen=True)
class TaskSpec:
    name: str
    generate: Generator
    description: str


TASKS: dict[str, TaskSpec] = {}


def register_task(name: str, description: str):
    def decorator(generate: Generator) -> Generator:
        TASKS[name] = TaskSpec(name, generate, description)
        return generate

    return decorator
