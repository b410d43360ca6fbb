"""Paths agree on the GPU in bf16: the optimized path against the reference, one JSON record per method.

python benchmarks/paths_agree_gpu.py MODEL CONTEXT OUT.json [--forced] [--steps N] [--device D]

MODEL is a preset name or a .gguf path (real weights: the H200 run reads smollm2-135m's GGUF this way).

Both paths decode greedily from one shared real-text prefill (`steps` tokens, batch 2). For every method
with both paths: the first step where the emitted tokens differ (None = identical) and whether the
tokens read per step are equal; for SFI also the selection overlap at the end, |A ∩ B| / |A| per
(layer, sequence, KV head), averaged and at its minimum. In float32 the tests demand identity; in bf16
summation order can flip near-ties, which is what this measures. Random weights at the real shape
unless the model has real ones here.
"""

from __future__ import annotations

import argparse
import json

import torch

from sfibench import registry
from sfibench.engine.decode import generate
from sfibench.engine.method import MethodSpec
from sfibench.engine.sampling import Sampler, SamplingConfig
from sfibench.engine.session import Session
from sfibench.registry import create_method
from sfibench.sfi.config import SFIConfig, TriggerConfig
from sfibench.workloads.replay import load_replay, take

BATCH = 2


def selection_overlap(a, b) -> list[float]:
    overlaps = []
    for layer, row in (a.published >= 0).nonzero().tolist():
        ba, bb = int(a.published[layer, row]), int(b.published[layer, row])
        for head in range(a.positions.shape[3]):
            count = int(a.counts[ba, layer, row, head])
            if count == 0:
                continue
            left = set(a.positions[ba, layer, row, head, :count].tolist())
            right = set(b.positions[bb, layer, row, head, :int(b.counts[bb, layer, row, head])].tolist())
            overlaps.append(len(left & right) / len(left))
    return overlaps


def main(model: str, context: int, out: str, forced_run: bool, steps: int, device: str) -> None:
    session = Session.open(model, device)
    stream, _ = load_replay(session.loaded.config.vocab_size, session.loaded.tokenizer)
    prompts = [take(stream, 1000 * row, context).tolist() for row in range(BATCH)]
    prefilled = session.prefill(prompts, steps)
    budget = 4 + 512 + 256
    # With --forced, both paths are fed the same replayed text (teacher forcing), so a bf16 rounding
    # flip of one greedy token cannot make the two runs see different streams; the emitted (argmax)
    # tokens are still compared step by step, and the selections are made from identical inputs.
    forced = torch.stack([take(stream, 1000 * row + context, steps) for row in range(BATCH)]).to(device) \
        if forced_run else None
    records = []
    both_paths = [m.name for m in registry.METHODS if {"reference", "optimized"} <= set(m.paths)]
    for name in ("full_kv", "sfi") if forced_run else both_paths:
        runs = {}
        for path in ("reference", "optimized"):
            # a refresh every 16 steps: random weights emit no sentence enders, and the check needs refreshes
            sfi = SFIConfig(k_head=512, trigger=TriggerConfig(policy="fixed", interval=16))
            spec = MethodSpec(name, path, sfi) if name == "sfi" else registry.at_budget(name, path, budget)
            method = create_method(spec, session.loaded.config, session.loaded.tokenizer)
            trace = generate(session.loaded.model, session.cache, method, prefilled, steps,
                             Sampler(SamplingConfig(), session.device), forced=forced)
            runs[path] = (trace, method)
        (ref, ref_m), (opt, opt_m) = runs["reference"], runs["optimized"]
        differs = (ref.tokens != opt.tokens).any(dim=0).nonzero().flatten().tolist()
        record = {"method": name, "model": model, "context": context, "batch": BATCH, "steps": steps,
                  "teacher_forced": forced_run, "argmax_agreement": float((ref.tokens == opt.tokens).float().mean()),
                  "dtype": str(session.dtype), "first_token_difference": differs[0] if differs else None,
                  "tokens_identical": not differs,
                  "reads_equal_steps": sum(torch.equal(a.tokens_read, b.tokens_read) for a, b in zip(ref.steps, opt.steps)),
                  "slow_steps": sum("slow" in s.kinds for s in ref.steps)}
        if name == "sfi":
            overlaps = selection_overlap(ref_m.sel, opt_m.sel)
            record |= {"selection_overlap_mean": sum(overlaps) / len(overlaps), "selection_overlap_min": min(overlaps),
                       "selections_compared": len(overlaps)}
        records.append(record)
        print(json.dumps(record))
    with open(out, "w") as f:
        name = torch.cuda.get_device_name() if device == "cuda" else device
        json.dump({"device": name, "records": records}, f, indent=1)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("model")
    parser.add_argument("context", type=int)
    parser.add_argument("out")
    parser.add_argument("--forced", action="store_true", help="teacher-force both paths with the same text")
    parser.add_argument("--steps", type=int, default=64)
    parser.add_argument("--device", default="cuda")
    args = parser.parse_args()
    main(args.model, args.context, args.out, args.forced, args.steps, args.device)
