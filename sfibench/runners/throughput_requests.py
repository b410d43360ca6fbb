"""Request mode of `sfibench throughput` (--prompt-len, --gen-len): requests as a serving user measures them.

Each (prompt length P, batch B) is prefilled once, really (timed, after a short warm-up prefill), and then
every (method, path) serves B requests of P prompt tokens and G generated tokens: the first token chosen from
the prefill's logits, then G - 1 decode steps with the cache growing to P + G, every step graphed where the
run uses graphs (kv lengths are device tensors, reads are sized to the length bucket, so a new graph is
captured once per bucket and kind). One untimed pass captures those graphs, then `repeats` timed passes.

The text: with `own`, each step feeds the model's own greedy tokens, so SFI's sentence triggers fire where
the model's text ends a sentence; with `replay`, a real-text stream is teacher-forced, as the fixed-context
mode does (random weights write no text). `auto` takes `own` for real weights and `replay` for random ones.

Clocks: one host clock per request. Every token is copied to the host as it is chosen, as a streaming client
receives it, and each mark is read when it arrives. Time to first token = the shape's prefill + this pass's
method start (its bootstrap on the prompt) + choosing the first token. A step's time = from the previous
token on the host to this one (its planning, its graph replay, the copy of its tokens). End-to-end is the
same clock read once the request's loop is done; it exceeds TTFT + the sum of the steps only by the host's
bookkeeping after the last mark (the trigger rules reading the last token), which each row records as
`unmarked_s`.
"""

from __future__ import annotations

import statistics
import time
from itertools import pairwise

import torch

from sfibench import registry
from sfibench.core.progress import starting
from sfibench.engine.cache import KVCache
from sfibench.engine.decode import batch_step_kind
from sfibench.engine.driver import StepDriver
from sfibench.engine.method import MethodSpec
from sfibench.engine.prefill import Prefilled, prefill
from sfibench.engine.sampling import Sampler, SamplingConfig
from sfibench.engine.session import Session
from sfibench.metrics.memory import memory_record
from sfibench.metrics.stats import percentiles, spread
from sfibench.runners.throughput_measure import finished_row, largest_batch, method_specs, prepare_cache
from sfibench.runners.throughput_memory import run_estimate
from sfibench.runners.throughput_run import ThroughputRun, check_request_limit
from sfibench.workloads.replay import load_replay, own_stream, step_inputs, take, take_rows

TEXTS = {"own": "the model's own greedy tokens", "replay": "a replayed real-text stream, teacher-forced"}
WARM_PREFILL = 2048 + 64  # one whole prefill chunk and part of a second: both attention branches compiled
SLOW = "slow"


def text_source(run: ThroughputRun, session: Session) -> str:
    """`own` or `replay`: what the decode steps feed, and so what drives SFI's triggers."""
    if run.text != "auto":
        return run.text
    return "replay" if session.loaded.config.source == "random" else "own"


def measure_requests(session: Session, run: ThroughputRun, progress=None,
                     earlier: list[dict] = ()) -> list[dict]:
    """One row per (prompt length, batch, method spec), in the order of the fixed-context mode; a row
    `earlier` holds (a resumed run's) is kept, and a shape whose rows it all holds is not prefilled."""
    check_request_limit(session.loaded.config, list(run.contexts), run.steps)
    text = text_source(run, session)
    if text == "own":
        stream, tokenizer = own_stream(session.loaded.tokenizer), session.loaded.tokenizer
    else:
        stream, tokenizer = load_replay(session.loaded.config.vocab_size, session.loaded.tokenizer)
    batches = [largest_batch(session, run, max(run.contexts)) if b == "max" else int(b) for b in run.batches]
    rows = []
    for context in run.contexts:
        for batch in dict.fromkeys(batches):
            for row in request_shape(session, run, context, batch, stream, tokenizer, text, earlier):
                rows.append(row)
                if progress:
                    progress(row)
    return rows


def request_shape(session: Session, run: ThroughputRun, context: int, batch: int, stream: torch.Tensor,
                  tokenizer, text: str, earlier=()):
    """Prefill B prompts of `context` tokens once and yield each method spec's row."""
    specs = method_specs(run, context)
    kept = [finished_row(earlier, spec, context, batch) for spec in specs]
    if all(kept):
        yield from kept
        return
    warm_prefill(session, stream)
    starting(f"prefill of {context:,} tokens x {batch} (timed: each request's time to first token)")
    prefilled, synthetic, prefill_seconds = prepare_cache(session, run, context, batch, stream, seed=0)
    # the replayed stream goes on where each prompt ends (own text feeds the model's tokens instead)
    replayed = step_inputs(take_rows(stream, context, batch, run.steps), session.device) if text == "replay" \
        else None
    for spec, row in zip(specs, kept):
        if row is not None:
            yield row
            continue
        starting(f"{spec.name}/{spec.path}: {batch} request(s) of {context:,} + {run.steps:,} tokens, "
                 f"1 warm-up + {run.repeats} timed")
        records, driver, method = measure_method(session, run, spec, prefilled, replayed, tokenizer)
        for record in records:  # every request waited for the shape's prefill first
            record["ttft_s"] += prefill_seconds
            record["e2e_s"] += prefill_seconds
        facts = {"prefill": "synthetic" if synthetic else "real", "prefill_seconds": prefill_seconds,
                 "text": TEXTS[text]}
        yield summarize(records, driver, method, facts, session, spec, run, context)


def warm_prefill(session: Session, stream: torch.Tensor) -> None:
    """A short prefill into a cache of its own, so the timed one pays no first-call costs (kernel compilation,
    library handles): a request's time to first token is the model's, not the process's. The previous
    shape's cache is freed first, so the two never sit in memory together."""
    session.cache = None
    cache = KVCache(session.loaded.config, 1, WARM_PREFILL, session.device, session.dtype)
    prefill(session.loaded.model, cache, [take(stream, 0, WARM_PREFILL).tolist()])
    del cache


def measure_method(session: Session, run: ThroughputRun, spec: MethodSpec, prefilled: Prefilled,
                   replayed: torch.Tensor | None, tokenizer) -> tuple[list[dict], StepDriver, object]:
    """One warm-up request pass (it captures the graphs), then `run.repeats` timed ones."""
    method = registry.create_method(spec, session.loaded.config, tokenizer)
    driver = StepDriver(session.loaded.model, session.cache, method, run.graphs, run.length_bucket)
    sampler = Sampler(SamplingConfig(), session.device, session.parallel)
    if session.device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(session.device)
    request_pass(driver, method, sampler, prefilled, replayed, run.steps)
    records = [request_pass(driver, method, sampler, prefilled, replayed, run.steps)
               for _ in range(run.repeats)]
    return records, driver, method


def request_pass(driver: StepDriver, method, sampler: Sampler, prefilled: Prefilled,
                 replayed: torch.Tensor | None, gen_len: int) -> dict:
    """Serve every sequence's request once from the prefilled prompts: `gen_len` tokens each. `replayed
    [gen_len, B]`: step i feeds row i - 1 and the triggers read row i; None: the model's own tokens."""
    device = driver.cache.k.device
    _synchronize(device)
    began = time.perf_counter()
    driver.start(prefilled)
    token = sampler(prefilled.last_logits)
    emitted = [token.cpu()]  # on the host: the request's first token has arrived
    marks = [time.perf_counter()]
    method.observe(emitted[0] if replayed is None else replayed[0])
    kinds, slow_rows, reads, captures = [], 0, 0, 0
    for index in range(1, gen_len):
        fed = token if replayed is None else replayed[index - 1].to(device, non_blocking=True)
        captured_before = driver.capture_seconds
        result = driver.step(fed)
        token = sampler(result.logits)
        emitted.append(token.cpu())
        marks.append(time.perf_counter())
        captures += driver.capture_seconds > captured_before
        kinds.append(batch_step_kind(method, result.ctx))
        slow_rows += int(result.ctx.slow.sum())
        reads = reads + result.ctx.tokens_read.sum()  # stays on the device until the pass ends
        method.observe(emitted[-1] if replayed is None else replayed[index])
    finished = time.perf_counter()
    steps = [later - earlier for earlier, later in pairwise(marks)]
    return {"ttft_s": marks[0] - began, "step_s": steps, "e2e_s": finished - began,
            "unmarked_s": finished - marks[-1], "kinds": kinds, "slow_rows": slow_rows,
            "tokens_read": float(reads), "timed_captures": captures,
            "first_sequence_ids": [int(t[0]) for t in emitted]}


def _synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def summarize(records: list[dict], driver: StepDriver, method, facts: dict, session: Session,
              spec: MethodSpec, run: ThroughputRun, context: int) -> dict:
    """The results row of one method's requests at (P, B): per-request latencies over every timed pass, step
    time by position (the median over the passes at each position), slow-step rate and share, memory."""
    batch, dims, gen_len = session.cache.batch, session.loaded.config, run.steps
    steps = [s for r in records for s in r["step_s"]]
    kinds = [k for r in records for k in r["kinds"]]
    by_kind: dict[str, list[float]] = {}
    for kind, seconds in zip(kinds, steps):
        by_kind.setdefault(kind, []).append(seconds)
    e2e = [r["e2e_s"] for r in records]
    tok_s = [batch * gen_len / seconds for seconds in e2e]
    decode_steps = len(records) * (gen_len - 1)
    slow_rows = sum(r["slow_rows"] for r in records)
    ids = [r["first_sequence_ids"] for r in records]
    first = records[0]
    return {
        "method": spec.name, "path": spec.path, "context": context, "batch": batch, **spec.config.row_facts(),
        **facts, "gen_len": gen_len,
        "ttft_s": statistics.median(r["ttft_s"] for r in records),
        "tpot_ms": {q: v * 1e3 for q, v in percentiles(steps).items() if q != "n"} | {"n": len(steps)},
        "e2e_s": statistics.median(e2e), "e2e_spread": spread(e2e),
        "unmarked_s": statistics.median(r["unmarked_s"] for r in records),
        # output tokens per second: every sequence's G tokens over the request's end-to-end time
        "tokens_per_s": statistics.median(tok_s), "tokens_per_s_spread": spread(tok_s),
        "decode_tokens_per_s": statistics.median(batch * (gen_len - 1) / sum(r["step_s"]) for r in records),
        "ms_per_step": {k: {q: v * 1e3 for q, v in percentiles(s).items() if q != "n"} | {"n": len(s)}
                        for k, s in by_kind.items()},
        "tokens_read_mean": sum(r["tokens_read"] for r in records) / (decode_steps * dims.num_layers * batch
                                                                       * dims.num_kv_heads),
        "achieved_gb_s": None,  # no bytes model over a growing cache: the fixed-context mode has it
        # per sequence: slow (refreshing) rows per 1,000 generated tokens, and the share of the decode time
        # spent in batch steps filed slow
        "slow_steps": len(by_kind.get(SLOW, [])) // len(records),
        "slow_per_1k_tokens": 1e3 * slow_rows / (len(records) * batch * gen_len),
        "slow_time_share": sum(by_kind.get(SLOW, [])) / sum(steps),
        "mean_slow_interval": method.summary().get("mean_slow_interval"),
        # the per-position series of the plot: the median over the timed passes, and the steps filed slow in
        # the first of them
        "step_ms": [round(statistics.median(at) * 1e3, 4) for at in zip(*(r["step_s"] for r in records))],
        "slow_positions": [i + 1 for i, kind in enumerate(first["kinds"]) if kind == SLOW],
        "first_sequence_ids": ids[-1], "passes_agree": all(i == ids[0] for i in ids),
        "graphs": {"used": run.graphs, "captured": len(driver.graphs),
                   "capture_seconds": driver.capture_seconds, "length_bucket": driver.length_bucket,
                   "timed_captures": sum(r["timed_captures"] for r in records)},
        "peak_memory_bytes": torch.cuda.max_memory_allocated(session.device)
        if session.device.type == "cuda" else None,
        # every method decodes from the whole cache here, an eviction method too (no compact cache)
        "memory_estimate": memory_record(run_estimate(session, [spec], batch, context + gen_len + 1,
                                                      facts["prefill"] == "synthetic", gen_len, compact=False)),
    }
