"""Long-answer tasks (niah_list): generation, the ordered-list scorer, slow-step bookkeeping, a full reader = Full-KV
(niah_list and niah_reason)."""

from __future__ import annotations

import random
import re

import pytest
from typer.testing import CliRunner

from sfibench.cli import app
from sfibench.engine.session import Session
from sfibench.engine.turns import Script, run_scripts
from sfibench.metrics import quality
from sfibench.models.tokenizer import ByteTokenizer, Tokenizer
from sfibench.registry import create_method
from sfibench.runners.quality_batch import evaluate_batch, make_condition, refresh_fields
from sfibench.commands.quality_options import quality_run
from sfibench.sfi.config import SFIConfig
from sfibench.workloads.base import TASKS, PromptFormat
from sfibench.workloads.needle_list import answer_cap, list_needle, needle_list
from sfibench.workloads.tasks import make_samples

REFS = ["4821937", "1093385", "7724016", "5550912"]


@pytest.fixture(scope="module")
def byte_fmt():
    return PromptFormat(Tokenizer(ByteTokenizer()), chat=True)


@pytest.fixture(scope="module")
def tiny():
    return Session.open("tiny-llama", "cpu")


def test_generation_is_deterministic_per_seed_and_seeds_differ(byte_fmt):
    a = make_samples("niah_list", byte_fmt, 3000, 2, seed=5)
    b = make_samples("niah_list", byte_fmt, 3000, 2, seed=5)
    c = make_samples("niah_list", byte_fmt, 3000, 2, seed=6)
    assert [s.prompt for s in a] == [s.prompt for s in b] and [s.answers for s in a] == [s.answers for s in b]
    assert a[0].prompt != c[0].prompt and a[0].answers != c[0].answers and a[0].prompt != a[1].prompt


@pytest.mark.parametrize(("task", "values"), [("niah_list", 16), ("niah_list_32", 32)])
@pytest.mark.parametrize("chat", [True, False])
def test_the_prompt_holds_every_needle_and_asks_in_another_order(task, values, chat):
    fmt = PromptFormat(Tokenizer(ByteTokenizer()), chat=chat)
    sample = make_samples(task, fmt, 6000, 1, seed=0)[0]
    text = fmt.tokenizer.decode(sample.prompt)
    needles = sample.meta["needles"]
    assert len(needles) == values and 0.97 * 6000 <= len(sample.prompt) <= 6000
    assert all(list_needle(n["key"], n["value"]) in text for n in needles)
    # needles appear in insertion order (increasing depth); the question lists the keys in the asked order
    positions = [text.index(list_needle(n["key"], n["value"])) for n in needles]
    assert positions == sorted(positions)
    asked = sample.meta["asked"]
    assert f"in exactly this order: {', '.join(asked)}." in text
    assert asked != [n["key"] for n in needles] and sorted(asked) == sorted(n["key"] for n in needles)
    value_of = {n["key"]: n["value"] for n in needles}
    assert sample.answers == [[value_of[k] for k in asked]]
    assert text.endswith(f"The special magic number for {asked[0]} is")  # the answer prefix starts sentence 1
    assert sample.scorer == "ordered_list" and sample.max_answer_tokens == answer_cap(fmt, values)
    # the cap holds every sentence of the right answer with room to spare
    right = " ".join(list_needle(k, value_of[k]) for k in asked)
    assert fmt.count(right) * 1.3 < sample.max_answer_tokens


def _answer(values: list[str], keys: list[str] | None = None) -> str:
    keys = keys or ["amber-lantern", "quiet-harbor", "silver-meadow", "copper-kettle"][:len(values)]
    first = f" {values[0]}."  # what follows the answer prefix, which names the first key
    return first + "".join(f" The special magic number for {k} is {v}." for k, v in zip(keys[1:], values[1:]))


def test_ordered_list_scorer_on_hand_made_answers():
    right = _answer(REFS)
    assert quality.ordered_recall(right, REFS) == 1.0 and quality.ordered_exact(right, REFS) == 1.0
    swapped = _answer([REFS[0], REFS[2], REFS[1], REFS[3]])  # two values in each other's place: one is out of order
    assert quality.ordered_recall(swapped, REFS) == 0.75 and quality.ordered_exact(swapped, REFS) == 0.0
    missing = _answer([REFS[0], REFS[1], REFS[3]])
    assert quality.ordered_recall(missing, REFS) == 0.75 and quality.ordered_exact(missing, REFS) == 0.0
    chatter = "Sure! Here they are, as the 4 keys you asked for:" + right + " I hope this helps 100%."
    assert quality.ordered_recall(chatter, REFS) == 1.0 and quality.ordered_exact(chatter, REFS) == 0.0
    trailing = right + "\nThe special magic number for another-key is 9999999."  # a base model going on
    assert quality.ordered_exact(trailing, REFS) == 1.0
    near = _answer([REFS[0], REFS[1] + "0", REFS[2][:-1], REFS[3]])  # a digit added, a digit dropped
    assert quality.ordered_recall(near, REFS) == 0.5
    reversed_ = _answer(REFS[::-1])
    assert quality.ordered_recall(reversed_, REFS) == 0.25
    assert quality.score_answer("ordered_list", missing, REFS) == 0.75
    assert quality.exact_list("ordered_list", right, REFS) == 1.0 and quality.exact_list("string_match_all", right,
                                                                                         REFS) is None


def test_quality_accepts_the_list_tasks_and_the_help_lists_every_task():
    run = quality_run("tiny-llama", ["sfi"], ["niah_list", "niah_list_64"], ["2k"], ["0.5"], ["1"], device="cpu")
    assert run.tasks == ("niah_list", "niah_list_64")
    result = CliRunner().invoke(app, ["quality", "--help"], terminal_width=400)
    help_text = " ".join(re.sub(r"[│\s]+", " ", result.output).split())
    assert all(name in help_text for name in TASKS)


def _list_sample(fmt, values: int, target: int, seed: int):
    return needle_list(fmt, target, random.Random(seed), 0, values, "niah_list")


def _full_kv_and_whole_reading_sfi(tiny, samples) -> tuple[list[dict], list[dict]]:
    """Full-KV's records and those of SFI with a k_head beyond prompt + answer, which reads every token."""
    context = max(len(s.prompt) for s in samples)
    whole = 4 * (context + max(s.max_answer_tokens for s in samples))
    conds = [make_condition("full_kv", None, context), make_condition("sfi", whole / context, context)]
    records = evaluate_batch(tiny, samples, conds)
    return [r for r in records if r["method"] == "full_kv"], [r for r in records if r["method"] == "sfi"]


def test_a_method_that_reads_everything_scores_as_full_kv(tiny):
    """SFI with a k_head beyond prompt + answer reads every token at every step: its answers, scores, slow-step
    records aside, are Full-KV's."""
    fmt = PromptFormat(tiny.loaded.tokenizer, chat=False)
    samples = [_list_sample(fmt, 2, 700, seed) for seed in (1, 2)]
    full, sfi = _full_kv_and_whole_reading_sfi(tiny, samples)
    records = full + sfi
    assert [r["prediction"] for r in sfi] == [r["prediction"] for r in full]
    assert [(r["score"], r["exact_match"]) for r in sfi] == [(r["score"], r["exact_match"]) for r in full]
    assert all(r["token_agreement"] == 1.0 and r["top1_agreement"] == 1.0 for r in sfi)
    assert all(r["answer_capped"] == (r["answer_tokens"] >= samples[0].max_answer_tokens) for r in records)
    assert all(r["slow_steps"] == 0 and r["slow_interval"] is None for r in full)


def test_a_method_that_reads_everything_answers_niah_reason_as_full_kv(tiny):
    """SFI with a k_head beyond prompt + answer reads every token at every step: on niah_reason its reasoning and
    final answer are Full-KV's."""
    fmt = PromptFormat(tiny.loaded.tokenizer, chat=False)
    samples = make_samples("niah_reason", fmt, 1600, 2, seed=3)
    for sample in samples:
        sample.max_answer_tokens = 96  # a random model never writes "Answer:"; the text is what is compared
    full, sfi = _full_kv_and_whole_reading_sfi(tiny, samples)
    assert [r["prediction"] for r in sfi] == [r["prediction"] for r in full]
    assert [r["score"] for r in sfi] == [r["score"] for r in full]
    assert all(r["token_agreement"] == 1.0 for r in sfi)


ENDERS = tuple(e.encode() for e in (".", "?", "!", "。", "？", "！"))


def _opens_sentence(tokens: list[int], j: int) -> bool:
    """Whether byte token j starts a sentence (SPEC 3): the stream so far ends with an ender (trailing blanks
    aside) and token j is neither blank nor completes another ender (ids past the bytes hold no text)."""
    text = b"".join(bytes([t]) for t in tokens[:j] if t < 256)
    token = bytes([tokens[j]]) if tokens[j] < 256 else b""
    return (text.rstrip().endswith(ENDERS) and token != b"" and not token.isspace()
            and not (text.rstrip() + token).endswith(ENDERS))


def test_slow_step_bookkeeping_matches_the_step_kinds(tiny):
    """On a byte tokenizer whose stream has sentence enders, SFI's slow steps are listed at their decode steps:
    as many as steps_by_kind counts, each one where SPEC 3's triggers put it (the first token of a sentence, or
    t_max after the previous refresh), and the interval is their mean gap."""
    fmt = PromptFormat(tiny.loaded.tokenizer, chat=False)
    prompts = [_list_sample(fmt, 2, 700, seed).prompt for seed in (3, 4)]
    prefilled = tiny.prefill(prompts, 400)
    condition = make_condition("sfi", 0.3, len(prompts[0]))
    method = create_method(condition.spec, tiny.loaded.config, tiny.loaded.tokenizer)
    streams = run_scripts(tiny.loaded.model, tiny.cache, method, prefilled, [Script(400, [], frozenset())] * 2)
    trigger = SFIConfig().trigger
    sentence_starts = 0
    for stream in streams:
        slow = stream.slow_steps
        assert len(slow) == stream.kinds["slow"] >= 3
        assert sum(stream.kinds.values()) == len(stream.retention) == len(stream.tokens) - 1
        previous = -1  # the prefill is the refresh before decode step 0
        for j in slow:  # decode step j feeds tokens[j]
            gap = j - previous
            assert gap == trigger.t_max or (trigger.min_gap <= gap < trigger.t_max
                                            and _opens_sentence(stream.tokens, j)), (j, gap)
            sentence_starts += gap < trigger.t_max
            previous = j
        fields = refresh_fields(stream)
        assert fields["slow_steps"] == len(slow) and fields["answer_tokens"] == 400
        assert fields["slow_interval"] == pytest.approx((slow[-1] - slow[0]) / (len(slow) - 1))
    assert sentence_starts > 0  # the random model's bytes hold enders, so some refreshes are sentence triggers
