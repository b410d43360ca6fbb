"""Scripted decoding: answer turns chosen greedily, question turns forced, in one decode pass.

`generate` either samples every token or forces every token. A multi-turn quality sample needs both
in one stream: the model answers, its answer ends (end token or length cap), the next question is
fed token by token through the method (so the method sees it, as decode steps), the model answers
again, and so on. Each row of the batch follows its own script.

`teacher` replays a given stream instead (Full-KV's, for fidelity): every fed token is forced and the
logits at the answer positions are kept, so KL and top-1 agreement are measured on identical inputs.
If a method's argmax equals the teacher at every answer position, its free run is exactly the
teacher's stream (same inputs, same computation), which lets callers skip that free run.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from sfibench.engine.cache import KVCache
from sfibench.engine.decode import step_kinds
from sfibench.engine.driver import StepDriver
from sfibench.engine.method import AttentionMethod
from sfibench.engine.prefill import Prefilled
from sfibench.models.decoder import Decoder


@dataclass
class Script:
    max_answer_tokens: int  # per turn
    follow_ups: list[list[int]]  # forced ids before turns 2..n
    stop_ids: frozenset[int]  # an answer ends after one of these (the end-of-turn token)


@dataclass
class Stream:
    """What one row fed, and which of those tokens were the model's answers (per turn)."""

    tokens: list[int] = field(default_factory=list)
    is_answer: list[bool] = field(default_factory=list)
    answers: list[list[int]] = field(default_factory=lambda: [[]])
    answer_logits: list[torch.Tensor] = field(default_factory=list)  # [V] per answer position, if kept
    retention: list[float] = field(default_factory=list)  # tokens read / KV length per decode step
    # the same over the global layers only: a sliding-window layer (Gemma-3) reads its window under every
    # method, so a budget's retention is that of the layers holding a selection (SPEC 2)
    retention_global: list[float] = field(default_factory=list)
    kinds: dict[str, int] = field(default_factory=dict)  # decode steps by kind (dense, slow, fast, ...)
    # index of each slow step among this row's decode steps: decode step j feeds tokens[j], so a slow step at j
    # is the one that reads the first token of a new sentence densely and refreshes the selection
    slow_steps: list[int] = field(default_factory=list)

    @property
    def answer_tokens(self) -> list[int]:
        return [t for t, a in zip(self.tokens, self.is_answer) if a]


class _Row:
    """One row's position in its script."""

    def __init__(self, script: Script, teacher: Stream | None):
        self.script, self.teacher = script, teacher
        self.stream = Stream()
        self.queue: list[int] = []  # forced ids still to feed
        self.turn, self.count, self.done = 0, 0, False

    def choose(self, greedy: int | None, logits: torch.Tensor | None) -> int:
        """The id fed next, given the greedy id after the previous one (None when a teacher decides) and, when
        they are kept, its logits (`[V]`, a row of the step's copy on the model's device)."""
        index = len(self.stream.tokens)
        if self.teacher is not None:
            token, answer = self.teacher.tokens[index], self.teacher.is_answer[index]
            self.done = index + 1 == len(self.teacher.tokens)
        elif self.queue:
            token, answer = self.queue.pop(0), False
        else:
            token, answer = greedy, True
            self.count += 1
            if token in self.script.stop_ids or self.count == self.script.max_answer_tokens:
                if self.turn == len(self.script.follow_ups):
                    self.done = True
                else:  # queue the next question; skip its end-of-turn token if the model just wrote it
                    segment = self.script.follow_ups[self.turn]
                    self.queue = segment[1:] if segment and segment[0] == token else list(segment)
                    self.turn, self.count = self.turn + 1, 0
        if answer:
            if self.stream.tokens and not self.stream.is_answer[-1]:  # forced tokens came between: new turn
                self.stream.answers.append([])
            self.stream.answers[-1].append(token)
            if logits is not None:
                self.stream.answer_logits.append(logits)
        self.stream.tokens.append(token)
        self.stream.is_answer.append(answer)
        return token


@torch.no_grad()
def run_scripts(model: Decoder, cache: KVCache, method: AttentionMethod, prefilled: Prefilled,
                scripts: list[Script], teacher: list[Stream] | None = None, keep_logits: bool = False,
                pad_id: int = 0, on_step=None, use_graphs: bool = False) -> list[Stream]:
    """Decode every row along its script (or the teacher's stream); returns one Stream per row.

    The cache must have room for the longest script. Rows that finish early keep being fed `pad_id`
    (their outputs are ignored) until every row is done. With `use_graphs` (a GPU) each step is replayed
    from a CUDA graph; its logits are the graph's buffer, read before the next step overwrites them.
    """
    return drive_scripts(StepDriver(model, cache, method, use_graphs), prefilled, scripts, teacher, keep_logits,
                         pad_id, on_step)


@torch.no_grad()
def drive_scripts(driver: StepDriver, prefilled: Prefilled, scripts: list[Script],
                  teacher: list[Stream] | None = None, keep_logits: bool = False, pad_id: int = 0,
                  on_step=None) -> list[Stream]:
    """run_scripts through a given driver: one kept from an earlier batch replays the graphs it captured then
    (its method restarts on `prefilled`)."""
    method = driver.method
    driver.start(prefilled)
    rows = [_Row(s, None if teacher is None else teacher[i]) for i, s in enumerate(scripts)]
    logits, step, tokens = prefilled.last_logits, 0, None
    while True:
        if step > 0:
            result = driver.step(tokens)
            logits, ctx = result.logits, result.ctx
        active = [not row.done for row in rows]  # rows that still need this step's logits
        if step > 0:
            _record(rows, ctx, method, active, driver.model.config.global_layers)
        # One copy of the greedy ids to the host per step for the whole batch (a copy per row waits on the device
        # B times); a teacher-forced pass feeds the teacher's ids and needs none. Kept logits stay on the device in
        # their own dtype, and KL is computed there: on the host they would cost a B x V float copy every step
        # (9.7 MB at B = 16 and a 152K vocabulary). They are copied because a graph's output buffer is overwritten.
        greedy = logits.argmax(dim=-1).tolist() if teacher is None else [None] * len(rows)
        kept = logits.clone() if keep_logits else None
        chosen = [row.choose(greedy[i], None if kept is None else kept[i]) if active[i] else pad_id
                  for i, row in enumerate(rows)]
        tokens = torch.tensor(chosen, device=logits.device)
        method.observe(tokens)
        if on_step is not None:
            on_step(step)
        step += 1
        if all(row.done for row in rows):
            return [row.stream for row in rows]


def _record(rows: list[_Row], ctx, method: AttentionMethod, active: list[bool], global_layers: list[int]) -> None:
    tokens_read = ctx.tokens_read.cpu().float()  # [L, B, H_kv]: one copy to the host per step
    read = tokens_read.mean(dim=(0, 2))  # [B] mean over layers and KV heads
    read_global = tokens_read[global_layers].mean(dim=(0, 2))
    lengths = ctx.kv_lengths.cpu()
    kinds = step_kinds(method, ctx)
    for i, row in enumerate(rows):
        if active[i]:
            row.stream.retention.append(float(read[i]) / int(lengths[i]))
            row.stream.retention_global.append(float(read_global[i]) / int(lengths[i]))
            kind = kinds[i]
            row.stream.kinds[kind] = row.stream.kinds.get(kind, 0) + 1
            if kind == "slow":
                row.stream.slow_steps.append(len(row.stream.retention) - 1)
