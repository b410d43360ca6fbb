"""How close to its floor can a launch-bound step get? A graphed step split into what its attention costs.

    python benchmarks/launch_floor_probe.py MODEL CONTEXT BUDGETS OUT.json
    e.g. python benchmarks/launch_floor_probe.py qwen3-0.6b 8192 64,512,1152,2308 probe.json

At B = 1 on a small model a decode step is a chain of ~146 short kernels, and the floor it is judged against
(metrics/floor.py: the model's weight GEMVs graphed back to back, plus the step's K/V bytes at copy bandwidth)
has ~113 of them. This probe measures, at B = 1 and one cache length, the graphed step replayed alone (CUDA
events, no host loop) of:

- `no attention`: the optimized StreamingLLM's step with its attention replaced by nothing (o_proj reads the
  queries): every kernel of a step except the 28-36 attention launches;
- `one launch`: the same with the attention replaced by one minimal Triton launch per layer that copies the
  queries to the output, launched as a short-split attention launch is (as many programs, PDL the same): what
  a launch costs in this chain, whatever it reads;
- the real optimized StreamingLLM step at each budget in BUDGETS (tokens read per layer and KV head, the
  fast-step kernel SFI uses): the fixed cost of the attention kernel (the line through them at zero rows) and
  the cost of its rows;
- the weights floor (metrics/floor.weights_floor_seconds) and the copy bandwidth, so that each step's floor
  is the report's (weights floor + its K/V bytes / copy bandwidth).

On the CPU (PROBE_DEVICE=cpu with TRITON_INTERPRET=1, the tiny model) nothing is graphed and times mean
nothing: that only checks the script.
"""

from __future__ import annotations

import json
import os
import statistics
import sys
import types

import torch
import triton
import triton.language as tl

from sfibench.baselines.streaming_llm import StreamingLLMConfig
from sfibench.core.provenance import provenance
from sfibench.engine.cache import KVCache
from sfibench.engine.driver import StepDriver
from sfibench.engine.method import MethodSpec
from sfibench.engine.session import Session
from sfibench.engine.synthetic import synthetic_prefill
from sfibench.metrics.bytes_model import kv_read_bytes
from sfibench.metrics.floor import step_floor_seconds, weights_floor_seconds
from sfibench.metrics.timing import measure_copy_bandwidth, time_region
from sfibench.optimized import pdl
from sfibench.optimized.decode_attention import KernelConfig, default_num_splits, sm_count
from sfibench.registry import create_method

REPLAYS = int(os.environ.get("PROBE_REPLAYS", "200"))
DEVICE = os.environ.get("PROBE_DEVICE", "cuda")


@triton.jit
def _copy_queries_kernel(q_ptr, out_ptr, stride_qb, stride_qh, stride_ob, stride_oh, chunk, total,
                         HEAD_DIM: tl.constexpr, BLOCK: tl.constexpr, PDL: tl.constexpr):
    """Program (p, b) copies elements [p * chunk, (p + 1) * chunk) of q[b] (heads x dims flattened)."""
    program, seq = tl.program_id(0), tl.program_id(1)
    pdl.wait_for_inputs(PDL)  # q is the kernel before's output, as for the attention kernel
    pdl.release_dependents(PDL)
    element = program * chunk + tl.arange(0, BLOCK)
    mine = (tl.arange(0, BLOCK) < chunk) & (element < total)
    head, dim = element // HEAD_DIM, element % HEAD_DIM
    row = tl.load(q_ptr + seq * stride_qb + head * stride_qh + dim, mask=mine)
    tl.store(out_ptr + seq * stride_ob + head * stride_oh + dim, row, mask=mine)


def copy_queries(q: torch.Tensor, programs: int) -> torch.Tensor:
    """q `[B, H, D]` (unit stride over D) copied by `programs` programs per row, in one launch."""
    batch, heads, dim = q.shape
    if q.stride(2) != 1:
        raise ValueError("copy_queries needs q with unit stride over its last dimension")
    chunk = triton.cdiv(heads * dim, programs)
    out = torch.empty_like(q)
    _copy_queries_kernel[(triton.cdiv(heads * dim, chunk), batch)](
        q, out, q.stride(0), q.stride(1), out.stride(0), out.stride(1), chunk, heads * dim, HEAD_DIM=dim,
        BLOCK=triton.next_power_of_2(chunk), **pdl.launch_options(q.device, "short_attention"))
    return out


def replay_times(driver: StepDriver, tokens: torch.Tensor) -> list[float]:
    """Milliseconds of the step's graph replayed alone (on the CPU: eager steps)."""
    for _ in range(3):
        driver.step(tokens)  # captures on a GPU
    if driver.use_graphs:
        run = next(iter(driver.graphs.values())).graph.replay
    else:
        def run():
            driver.step(tokens)
    return [seconds * 1e3 for seconds in time_region(run, driver.cache.k.device, warmup=5, repeats=REPLAYS)]


def main(model: str, context: int, budgets: str, out: str) -> None:
    session = Session.open(model, DEVICE)
    cfg, device = session.loaded.config, session.device
    cache = KVCache(cfg, 1, context + 64, device, session.dtype)
    prefilled = synthetic_prefill(cache, context, cfg.vocab_size, cfg.num_heads)
    tokens = torch.zeros(1, dtype=torch.long, device=device)
    floor = weights_floor_seconds(session.loaded.model, 1, device, repeats=50)
    bandwidth = measure_copy_bandwidth(device) if device.type == "cuda" else None
    programs = default_num_splits(1, cfg.num_kv_heads, 2308, sm_count(device)) * cfg.num_kv_heads

    def no_attention(self, q, cache, ctx, plan):
        return q

    def one_launch(self, q, cache, ctx, plan):
        return copy_queries(q[:, :, 0], programs)[:, :, None]

    variants = [("no attention", 2308, no_attention, {}, {}), ("one launch", 2308, one_launch, {}, {})]
    variants += [(f"streaming_llm budget {b}", int(b), None, {}, {}) for b in budgets.split(",")]
    if os.environ.get("PROBE_AB"):  # the fast-step kernel's split counts at SFI's budget
        variants += [(f"ab splits={n}: budget 2308", 2308, None, {}, {"num_splits": n, "one_loop": True})
                     for n in (8, 12, 16, 24, 32)]
    # PROBE_SWEEP="splits:block_n:stages:warps,...": the fast-step kernel's launch at budget 2,308 under each
    # (one loop).
    for item in filter(None, os.environ.get("PROBE_SWEEP", "").split(",")):
        splits, block_n, stages, warps = (int(part) for part in item.split(":"))
        variants.append((f"sweep {item}: budget 2308", 2308, None, {}, {
            "num_splits": splits, "one_loop": True, "config": KernelConfig(block_n, warps, stages, None)}))
    rows = []
    for name, budget, attend, env, launch in variants:
        saved = {key: os.environ.get(key) for key in env}
        os.environ.update(env)  # read when the graph is captured (the kernels' launch choices)
        spec = MethodSpec("streaming_llm", "optimized", StreamingLLMConfig(budget=budget))
        method = create_method(spec, cfg, session.loaded.tokenizer)
        if attend is not None:
            method.attend = types.MethodType(attend, method)
        driver = StepDriver(session.loaded.model, cache, method, use_graphs=device.type == "cuda")
        driver.start(prefilled)
        if launch:
            method.launch.update(launch)  # after start, which chose the split count and loop form
        try:
            times = replay_times(driver, tokens)
        except Exception as error:  # noqa: BLE001 - a variant that fails (e.g. does not compile) loses no row
            print(f"{name}: failed: {error!r}"[:400], flush=True)
            rows.append({"variant": name, "error": repr(error)[:2000]})
            continue
        finally:
            for key, value in saved.items():
                if value is None:
                    os.environ.pop(key)
                else:
                    os.environ[key] = value
        read = float(driver.tokens_read.float().mean()) if attend is None else 0.0
        kv_bytes = kv_read_bytes(cfg, driver.tokens_read if attend is None else 0, 1, cache.k.element_size())
        step_floor = step_floor_seconds(floor, kv_bytes, bandwidth) if bandwidth else None  # as the report's
        p50 = statistics.median(times)
        row = {"variant": name, "budget": budget, "rows_read": read, "replay_ms_p50": p50,
               "replay_ms_min": min(times), "replay_ms_max": max(times), "replays": len(times),
               "floor_ms": step_floor * 1e3 if step_floor else None,
               "ratio_to_floor": p50 / (step_floor * 1e3) if step_floor else None}
        rows.append(row)
        ratio = f", {row['ratio_to_floor']:.3f}x its floor {row['floor_ms']:.4f} ms" if step_floor else ""
        spread_ms = f"(min {min(times):.4f}, max {max(times):.4f})"
        print(f"{name}: p50 {p50:.4f} ms {spread_ms}, rows read {read:.0f}{ratio}", flush=True)
        del driver, method
    layers = cfg.num_layers
    by = {r["variant"]: r["replay_ms_p50"] for r in rows if "error" not in r}
    real = [r for r in rows if r["variant"].startswith("streaming_llm") and "error" not in r]
    derived = {"launch_us_per_layer": (by["one launch"] - by["no attention"]) * 1e3 / layers,
               "weights_floor_ms": floor["seconds"] * 1e3}
    if len(real) >= 2:  # least squares: step = fixed + per_row * rows
        xs, ys = [r["rows_read"] for r in real], [r["replay_ms_p50"] for r in real]
        slope = statistics.linear_regression(xs, ys).slope
        intercept = statistics.fmean(ys) - slope * statistics.fmean(xs)
        derived.update({"step_at_zero_rows_ms": intercept, "us_per_1000_rows_per_layer": slope * 1e6 / layers,
                        "attention_fixed_us_per_layer": (intercept - by["no attention"]) * 1e3 / layers})
    derived["no_attention_over_weights_floor"] = by["no attention"] / derived["weights_floor_ms"]
    derived["one_launch_over_weights_floor"] = by["one launch"] / derived["weights_floor_ms"]
    print("derived: " + ", ".join(f"{k} {v:.4f}" for k, v in derived.items()), flush=True)
    result = {"provenance": provenance(), "model": model, "context": context, "batch": 1, "layers": layers,
              "graphs": device.type == "cuda", "pdl": pdl.describe(), "copy_bandwidth": bandwidth,
              "weights_floor": floor, "rows": rows, "derived": derived}
    with open(out, "w") as f:
        json.dump(result, f, indent=1)


if __name__ == "__main__":
    if len(sys.argv) != 5:
        sys.exit(__doc__)
    main(sys.argv[1], int(sys.argv[2]), sys.argv[3], sys.argv[4])
