"""One batch of quality samples through every method: prefill once, decode each method from the snapshot.

Per batch: the dense method (Full-KV) decodes freely and its logits at answer positions are kept.
Every other (method, retention) condition is first teacher-forced on the dense stream (KL, top-1
agreement, perplexity on identical inputs), then decodes freely for its own answers, unless its argmax
already matched at every answer position, in which case its free run is the dense one (engine/turns).

Budget: round(retention x context target) tokens read per (layer, KV head), which each method turns
into its own settings by its budget rule (its MethodConfig.with_budget). A method may read more than
the budget on some steps (SFI's slow steps are dense, and its recent window grows between refreshes),
so every result also reports the retention actually measured (tokens read / KV length per step),
which is what plots put on the x axis.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from itertools import pairwise

import torch

from sfibench import registry
from sfibench.core.budget import BudgetError
from sfibench.core.oom import DeviceOutOfMemoryError
from sfibench.engine.driver import StepDriver
from sfibench.engine.method import MethodSpec
from sfibench.engine.prefill import Prefilled
from sfibench.engine.session import Session
from sfibench.engine.turns import Script, Stream, drive_scripts
from sfibench.engine.workspace import LENGTH_BUCKET
from sfibench.metrics import quality
from sfibench.workloads.base import Sample


@dataclass
class Condition:
    method: str
    retention: float | None  # None: the dense method, which reads everything at every step
    spec: MethodSpec

    @property
    def label(self) -> str:
        return condition_label(self.method, self.retention)


def condition_label(method: str, retention: float | None) -> str:
    """'<method>' (dense) or '<method>@0.15': how reports, progress lines and a resumed run's records name a condition."""
    return method if retention is None else f"{method}@{retention:g}"


def make_condition(method: str, retention: float | None, context: int, path: str = "reference",
                   variant: dict | None = None) -> Condition:
    """Method `method` at `retention` x `context` tokens read per (layer, KV head), by its own budget rule,
    with an ablation's `variant` settings (e.g. {"use_nms": False}) applied where they are the method's."""
    config = registry.default_config(method).with_variant(variant)
    if retention is None:
        return Condition(method, None, registry.spec(method, path, config))
    budget = round(retention * context)
    try:
        return Condition(method, retention, registry.at_budget(method, path, budget, config))
    except BudgetError as error:
        raise BudgetError(f"retention {retention:g} of a {context}-token context is {budget} tokens: {error}; "
                          "use a larger --budget or --ctx") from None


def conditions(methods: list[str], retentions: list[float], context: int,
               variant: dict | None = None, path: str = "reference") -> list[Condition]:
    """The dense method first (every other method is compared with it), then each other method x retention,
    every one on `path`."""
    dense = registry.dense().name
    out = [make_condition(dense, None, context, path)]
    out += [make_condition(m, r, context, path, variant) for m in methods if m != dense for r in retentions]
    return out


def _teacher_streams(samples: list[Sample]) -> list[Stream] | None:
    if samples[0].teacher is None:
        return None
    return [Stream(tokens=list(s.teacher), is_answer=[True] * len(s.teacher)) for s in samples]


class KeptDrivers:
    """Each condition's method and step driver, kept from one batch of a quality run to the next.

    On a GPU a driver captures a CUDA graph the first time it meets each step plan, so kept for the whole run it
    captures each of a condition's graphs once, not on every decode pass (up to two per condition and batch).
    A kept driver restarts its method on the next batch's prefill (methods reset their state in place:
    AttentionMethod.state) and replays what it captured. Graphs read the cache's
    tensors, so every driver is dropped before the session allocates another cache. Every condition's method
    state is then held at once; where that runs out of device memory, only the running condition's is kept
    from then on (`forget`).
    """

    def __init__(self, session: Session, graphs: bool):
        self.session, self.graphs = session, graphs
        self.kept: dict[int, tuple[Condition, StepDriver]] = {}  # id(condition) -> (condition, its driver)
        self.keep_all = True  # False once the held state ran out of memory: one condition's driver at a time

    def prefill(self, prompts: list[list[int]], decode_budget: int) -> Prefilled:
        """The session's prefill with room for `decode_budget` more tokens, the cache's length rounded up to
        the graphs' length bucket so that batches whose longest prompts differ by a few tokens share a cache."""
        longest = max(len(p) for p in prompts)
        room = -(-(longest + decode_budget) // LENGTH_BUCKET) * LENGTH_BUCKET
        room = max(min(room, self.session.max_tokens), longest + decode_budget)
        if not self.session.holds(len(prompts), room):
            self.kept.clear()  # before the new cache is allocated: the old one is freed only once nothing holds it
        return self.session.prefill(prompts, room - longest)

    def driver(self, condition: Condition) -> StepDriver:
        cache = self.session.cache
        kept = self.kept.get(id(condition))
        if kept is None or kept[1].cache is not cache:
            if not self.keep_all:
                self.kept.clear()
            loaded = self.session.loaded
            method = registry.create_method(condition.spec, loaded.config, loaded.tokenizer)
            kept = self.kept[id(condition)] = (condition, StepDriver(loaded.model, cache, method, self.graphs))
        return kept[1]

    def forget(self, condition: Condition) -> bool:
        """After running out of device memory in `condition`'s decode: drop every driver and keep one at a time
        from now on. True if another condition's was dropped (so trying again may fit)."""
        others = len(self.kept) - (id(condition) in self.kept)
        self.kept.clear()
        self.keep_all = False
        if torch.cuda.is_available():
            torch.cuda.empty_cache()
        return others > 0


@dataclass
class BatchTimes:
    """Where one batch's wall time went, for the run's log: a batch costs far more than its decode steps' bytes
    when something outside the steps dominates (host copies, metrics on the CPU)."""
    prefill_s: float = 0.0
    decode_s: float = 0.0  # every decode pass, the host work between its steps included
    passes: int = 0
    steps: int = 0  # decode steps over all passes (a pass runs as long as its longest row)
    capture_s: float = 0.0  # of decode_s: capturing CUDA graphs for plans no earlier batch met
    records_s: float = 0.0  # KL, agreement and scores from the kept logits

    def describe(self) -> str:
        per_step = f", {1000 * self.decode_s / self.steps:.1f} ms a step" if self.steps else ""
        capture = f" (graph capture {self.capture_s:.1f} s)" if self.capture_s else ""
        return (f"prefill {self.prefill_s:.1f} s, {self.passes} decode passes of {self.steps} steps "
                f"{self.decode_s:.1f} s{capture}{per_step}, records {self.records_s:.1f} s")


def _decode(drivers: KeptDrivers, condition: Condition, prefilled, scripts, teacher, keep_logits, on_step,
            times: BatchTimes):
    started = time.perf_counter()
    streams = _decode_streams(drivers, condition, prefilled, scripts, teacher, keep_logits, on_step, times)
    times.decode_s += time.perf_counter() - started  # each step's argmax or host copy waits on the device
    times.passes += 1
    times.steps += max(len(s.tokens) for s in streams) - 1  # the first token comes from the prefill
    return streams


def _decode_streams(drivers: KeptDrivers, condition: Condition, prefilled, scripts, teacher, keep_logits, on_step,
                    times: BatchTimes):
    def run():
        driver = drivers.driver(condition)
        captured_before = driver.capture_seconds
        try:
            return drive_scripts(driver, prefilled, scripts, teacher=teacher, keep_logits=keep_logits,
                                 pad_id=drivers.session.loaded.tokenizer.eos_token_id or 0, on_step=on_step)
        finally:
            times.capture_s += driver.capture_seconds - captured_before

    try:
        return run()
    except DeviceOutOfMemoryError:
        if not drivers.forget(condition):  # nothing else was held: this condition alone does not fit
            raise
        return run()


def evaluate_batch(session: Session, samples: list[Sample], conds: list[Condition], on_decode=None,
                   on_step=None, on_records=None, done: frozenset[str] = frozenset(),
                   drivers: KeptDrivers | None = None, times: BatchTimes | None = None) -> list[dict]:
    """One record per (sample, condition) not in `done` (labels of conditions a resumed run already has).

    `on_decode(label)` is called before each decode pass, `on_records(records)` with each condition's
    records as soon as they exist (so they can be saved). Full-KV is decoded even when done: every
    other condition is compared with its logits. `drivers` (one per run, which says whether steps replay CUDA
    graphs) keeps each condition's driver and graphs for the next batch; without it the batch decodes eagerly.
    `times`, when given, is filled with where the batch's wall time went.
    """
    times = times if times is not None else BatchTimes()
    tokenizer = session.loaded.tokenizer
    stop = tokenizer.stop_ids()
    scripts = [Script(s.max_answer_tokens, s.follow_ups, stop) for s in samples]
    drivers = drivers or KeptDrivers(session, graphs=False)
    started = time.perf_counter()
    prefilled = drivers.prefill([s.prompt for s in samples], max(s.decode_budget for s in samples))
    if prefilled.last_logits.is_cuda:  # the prefill's kernels finish here, not inside the first decode pass
        torch.cuda.synchronize(prefilled.last_logits.device)
    times.prefill_s += time.perf_counter() - started
    forced = _teacher_streams(samples)
    records = []
    full = None
    for condition in conds:
        if full is not None and condition.label in done:
            continue
        if on_decode:
            on_decode(condition.label)
        if full is None:  # Full-KV: free run (or the given continuation), logits kept as the reference
            full = _decode(drivers, condition, prefilled, scripts, forced, True, on_step, times)
            runs = (full, full)
        else:
            taught = _decode(drivers, condition, prefilled, scripts, full, True, on_step, times)
            free = taught
            if forced is None and any(_diverges(t, f) for t, f in zip(taught, full)):
                if on_decode:
                    on_decode(condition.label + " (free)")
                free = _decode(drivers, condition, prefilled, scripts, None, False, on_step, times)
            runs = (taught, free)
        if condition.label in done:
            continue
        started = time.perf_counter()
        new = [_record(tokenizer, sample, condition, full[row], runs[0][row], runs[1][row], stop)
               for row, sample in enumerate(samples)]
        times.records_s += time.perf_counter() - started
        if on_records:
            on_records(new)
        records += new
    return records


def _diverges(taught: Stream, full: Stream) -> bool:
    """Whether the method's argmax differs from Full-KV's token at some answer position (one copy to the host)."""
    count = min(len(taught.answer_logits), len(full.answer_tokens))
    if count == 0:
        return False
    return torch.stack(taught.answer_logits[:count]).argmax(dim=-1).tolist() != full.answer_tokens[:count]


def _record(tokenizer, sample: Sample, condition: Condition, full: Stream, taught: Stream, free: Stream,
            stop: frozenset) -> dict:
    # Fidelity over decode-step positions only: the first answer token comes from the shared prefill.
    full_logits = torch.stack(full.answer_logits[1:]) if len(full.answer_logits) > 1 else torch.zeros(0, 1)
    method_logits = torch.stack(taught.answer_logits[1:]) if len(taught.answer_logits) > 1 else full_logits
    kl = quality.kl_per_step(full_logits, method_logits) if len(full_logits) else torch.zeros(0)
    record = {
        "task": sample.task, "index": sample.index, "prompt_tokens": len(sample.prompt),
        "method": condition.method, "retention": condition.retention, "depth": sample.meta.get("depth"),
        "kl": float(kl.mean()) if len(kl) else 0.0,
        "top1_agreement": quality.top1_agreement(full_logits, method_logits),
        # tokens read / KV length per decode step, averaged: over all layers, and over the global layers only
        "measured_retention": sum(free.retention) / max(len(free.retention), 1) if free.retention else 1.0,
        "measured_retention_global": (sum(free.retention_global) / len(free.retention_global)
                                      if free.retention_global else 1.0),
        "steps_by_kind": free.kinds,
        **refresh_fields(free),
    }
    if condition.retention is not None:
        record.update(long_fidelity(sample, kl, full_logits, method_logits, taught))
    if sample.teacher is not None:
        targets = torch.tensor(sample.teacher[1:], device=method_logits.device)
        nll = quality.negative_log_likelihood(method_logits, targets) if len(targets) else torch.zeros(0)
        record["nll"] = float(nll.mean()) if len(nll) else 0.0
        return record
    matches = sum(a == b for f, m in zip(full.answers, free.answers) for a, b in zip(f, m))
    total = sum(len(f) for f in full.answers)
    texts = [tokenizer.decode([t for t in ids if t not in stop]) for ids in free.answers]
    turn_scores = [quality.score_answer(sample.scorer, text, refs, sample.meta)
                   for text, refs in zip(texts, sample.answers)]
    record.update({
        "prediction": texts, "answers": sample.answers, "turn_scores": turn_scores,
        "score": sum(turn_scores) / len(turn_scores), "token_agreement": matches / total if total else 1.0,
        # whether an answer ran into max_answer_tokens instead of ending with the end-of-turn token
        "answer_capped": any(len(ids) >= sample.max_answer_tokens and ids[-1] not in stop for ids in free.answers),
    })
    exact = [quality.exact_list(sample.scorer, text, refs) for text, refs in zip(texts, sample.answers)]
    if None not in exact:
        record["exact_match"] = float(all(e == 1.0 for e in exact))
    if "sample_id" in sample.meta:
        record["sample_id"] = sample.meta["sample_id"]
    if not sample.meta.get("store_text", True):  # the prompt holds a data set's text: results keep none of it
        del record["prediction"], record["answers"]
    return record


LONG_FIDELITY_STEPS = 256  # answers this long keep their per-step fidelity; shorter ones only its means


def long_fidelity(sample: Sample, kl: torch.Tensor, full_logits: torch.Tensor, method_logits: torch.Tensor,
                  taught: Stream) -> dict:
    """Fidelity along a long single-turn answer, per decode step of the teacher-forced run: KL(full || method)
    (3 significant digits), top-1 agreement (1/0), and the decode steps that were the method's slow steps.

    Entry j is the step that fed the answer's token j, which is also the index `Stream.slow_steps` uses, so the
    slow steps mark their own entries. Empty below LONG_FIDELITY_STEPS steps (needle answers: results.json
    stays small) and for multi-turn samples, whose forced questions interleave the answer steps."""
    if len(kl) < LONG_FIDELITY_STEPS or sample.follow_ups:
        return {}
    top1 = (full_logits.argmax(dim=-1) == method_logits.argmax(dim=-1)).tolist()
    return {"kl_steps": [float(f"{v:.3g}") for v in kl.tolist()], "top1_steps": [int(t) for t in top1],
            "taught_slow_steps": list(taught.slow_steps)}


def refresh_fields(stream: Stream) -> dict:
    """How often a method refreshed its selection along a row's decode steps: the slow steps, the mean number
    of decode steps between consecutive ones (None with fewer than two), and the answer's length in tokens
    (the end-of-turn token included where the model wrote one; forced question tokens excluded)."""
    slow = stream.slow_steps
    gaps = [b - a for a, b in pairwise(slow)]
    return {"slow_steps": len(slow), "slow_interval": sum(gaps) / len(gaps) if gaps else None,
            "answer_tokens": len(stream.answer_tokens)}
