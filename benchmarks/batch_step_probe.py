"""Why one sparse method's graphed step is slower than another's at the same shape: every timed step with
what it read, then each captured graph replayed alone and traced kernel by kernel.

    python benchmarks/batch_step_probe.py MODEL CONTEXT BATCHES OUT.json
    e.g. python benchmarks/batch_step_probe.py qwen3-0.6b 8192 7,1 probe.json

Per batch, the throughput benchmark's workload (runners/throughput_measure: the cache prefilled from real
text, replayed real text teacher-forced, CUDA graphs), for the optimized SFI (synchronous and asynchronous),
SnapKV and StreamingLLM: one warm and three timed passes, keeping per timed step its time, its kind, the kind
of the step before, and the tokens each sequence read at layer 0 (mean over KV heads; then the batch's mean and
its longest row). Then, where the last pass ended, every captured graph is replayed alone (GPU time without
the host loop, 50 replays; its rows as they stand) and the first fast-step graph (no evidence, no dense read) traced
(step_trace.trace).
"""

from __future__ import annotations

import json
import os
import statistics
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))

from step_trace import trace

from sfibench.config import SFIConfig
from sfibench.core.provenance import provenance
from sfibench.engine.decode import batch_step_kind
from sfibench.engine.driver import StepDriver
from sfibench.engine.session import Session
from sfibench.methods import create_method
from sfibench.metrics.timing import StepTimer
from sfibench.runners.throughput_measure import ThroughputConfig, method_specs, prepare_cache
from sfibench.workloads.replay import load_replay, step_inputs, take_rows

STEPS, PASSES, REPLAYS = int(os.environ.get("PROBE_STEPS", "96")), 3, 50
DEVICE = os.environ.get("PROBE_DEVICE", "cuda")
METHODS = [("sfi", "optimized"), ("snapkv", "optimized"), ("streaming_llm", "optimized")]


def decode_passes(session: Session, runner: StepDriver, method, inputs: torch.Tensor) -> list[dict]:
    """One warm pass, then PASSES timed ones: a record per timed step."""
    records = []
    for number in range(PASSES + 1):
        runner.start(runner.prefilled)
        method.observe(inputs[0])
        timer, kinds, reads = StepTimer(session.device), [], []
        for index in range(1, STEPS + 1):
            with timer.step():
                result = runner.step(inputs[index - 1].to(session.device, non_blocking=True))
            kinds.append(batch_step_kind(method, result.ctx))
            method.observe(inputs[index])
            reads.append(result.ctx.tokens_read[0].float().mean(-1))  # [B], a new tensor every step
        seconds = [s for _, s in timer.durations()]
        if number == 0:
            continue
        rows = torch.stack(reads).cpu()
        for i, (kind, s) in enumerate(zip(kinds, seconds)):
            records.append({"pass": number, "index": i, "kind": kind, "after": kinds[i - 1] if i else None,
                            "ms": s * 1e3, "read_mean": float(rows[i].mean()), "read_max": float(rows[i].max())})
    return records


def replay_alone(graph: torch.cuda.CUDAGraph) -> list[float]:
    for _ in range(5):
        graph.replay()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    times = []
    for _ in range(REPLAYS):
        start.record()
        graph.replay()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end))
    return times


def summarize(records: list[dict]) -> dict:
    out = {}
    for kind in sorted({r["kind"] for r in records}):
        mine = [r for r in records if r["kind"] == kind]
        out[kind] = {"n": len(mine), "p50_ms": statistics.median(r["ms"] for r in mine),
                     "read_mean": statistics.fmean(r["read_mean"] for r in mine),
                     "read_max_mean": statistics.fmean(r["read_max"] for r in mine)}
        for after in ("fast", "slow", "sparse"):
            following = [r["ms"] for r in mine if r["after"] == after]
            if following:
                out[kind][f"p50_ms_after_{after}"] = statistics.median(following)
                out[kind][f"n_after_{after}"] = len(following)
    return out


def main(model: str, context: int, batches: str, out: str) -> None:
    session = Session.open(model, DEVICE)  # "cpu" (with TRITON_INTERPRET=1) checks the script itself
    cfg = ThroughputConfig(model=session.loaded.config.name, contexts=[context], batches=[], methods=METHODS,
                           steps=STEPS, repeats=PASSES, sfi=SFIConfig())
    stream, tokenizer = load_replay(session.loaded.config.vocab_size, session.loaded.tokenizer)
    rows = []
    for batch in (int(b) for b in batches.split(",")):
        prefilled, _, _ = prepare_cache(session, cfg, context, batch, stream, seed=0)
        inputs = step_inputs(take_rows(stream, context, batch, STEPS + 1), session.device)
        for spec in method_specs(cfg, context):
            method = create_method(spec, session.loaded.config, tokenizer)
            graphs = session.device.type == "cuda"
            runner = StepDriver(session.loaded.model, session.cache, method, graphs, cfg.length_bucket)
            runner.prefilled = prefilled
            records = decode_passes(session, runner, method, inputs)
            name = spec.name + (f" {spec.sfi.publish}" if spec.name == "sfi" else "")
            row = {"method": name, "batch": batch, "context": context, "summary": summarize(records),
                   "steps": records, "graphs": []}
            for plan, captured in runner.graphs.items():
                times = replay_alone(captured.graph)
                reads = runner.tokens_read[0].float().mean(-1)
                row["graphs"].append({"plan": repr(plan), "replay_ms_p50": statistics.median(times),
                                      "replay_ms_min": min(times), "read_mean": float(reads.mean()),
                                      "read_max": float(reads.max())})
            fast = [g for g in row["graphs"] if "evidence=True" not in g["plan"] and "dense=True" not in g["plan"]]
            if fast and graphs:
                plan = next(p for p in runner.graphs if repr(p) == fast[0]["plan"])
                row["trace"] = trace(runner.graphs[plan].graph.replay)
            rows.append(row)
            for kind, s in row["summary"].items():
                after = ", ".join(f"after {k[len('p50_ms_after_'):]} {v:.4f}" for k, v in s.items()
                                  if k.startswith("p50_ms_after_"))
                print(f"{name} B={batch} ctx={context}: {kind} n={s['n']} p50 {s['p50_ms']:.4f} ms ({after}); rows "
                      f"read mean {s['read_mean']:.0f}, longest row's mean {s['read_max_mean']:.0f}", flush=True)
            for g in row["graphs"]:
                print(f"    replay alone {g['replay_ms_p50']:.4f} ms (min {g['replay_ms_min']:.4f}), rows read mean "
                      f"{g['read_mean']:.0f} max {g['read_max']:.0f}: {g['plan']}", flush=True)
            if "trace" in row:
                t = row["trace"]
                kinds = "  ".join(f"{k} {v:.1f}" for k, v in t["by_kind_us"].items())
                print(f"    trace: {t['kernels_per_step']} kernels, span {t['span_us']:.1f} us, "
                      f"kernels {t['kernel_us']:.1f} us; {kinds}")
                for kernel, us in list(t["by_name_us"].items())[:6]:
                    print(f"      {us:8.1f} us x{t['count_by_name'][kernel]:<3} {kernel}", flush=True)
            del runner, method
    with open(out, "w") as f:
        json.dump({"provenance": provenance(), "model": model, "rows": rows}, f, indent=1)


if __name__ == "__main__":
    if len(sys.argv) != 5:
        sys.exit(__doc__)
    main(sys.argv[1], int(sys.argv[2]), sys.argv[3], sys.argv[4])
