"""What a decode step costs through sfibench.hf, beside stock transformers and the engine's reference path.

    python benchmarks/hf_step_cost.py [--ctx 1024] [--steps 32] [--budget 15%] [--threads 1]

smollm2-135m on the CPU in float32 (its weights must be installed), the shipped essays' first --ctx tokens; for each
configuration the decode time per step is (time to make steps + 1 tokens - time to make 1 token) / steps,
the best of three, so the prefill and the method's construction cancel out. Prints one line per row.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))  # the transformers twin of a Decoder
from helpers import hf_twin

import sfibench.hf
from sfibench import registry
from sfibench.core.budget import Budget
from sfibench.engine.cache import KVCache
from sfibench.engine.decode import generate
from sfibench.engine.prefill import prefill
from sfibench.engine.sampling import Sampler, SamplingConfig
from sfibench.models.loading import load_model
from sfibench.workloads.essay_prompt import essay_prompt


def per_step(run, steps: int) -> float:
    """Milliseconds per decode step of `run(new_tokens)`, the best of three."""
    run(2)  # warm up

    def seconds(new_tokens: int) -> float:
        start = time.perf_counter()
        run(new_tokens)
        return time.perf_counter() - start

    return min((seconds(steps + 1) - seconds(1)) / steps * 1000 for _ in range(3))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ctx", type=int, default=1024)
    parser.add_argument("--steps", type=int, default=32)
    parser.add_argument("--budget", default="15%", help="the sparse methods' budget (tokens or a percentage)")
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    loaded = load_model("smollm2-135m")
    twin = hf_twin(loaded.model)
    prompt = essay_prompt(loaded.tokenizer, args.ctx)  # the shipped essays: prose, so SFI's triggers fire
    ids = torch.tensor([prompt])
    print(f"smollm2-135m, CPU float32, {args.threads} thread(s), a {len(prompt)}-token prompt, ms per decode step")
    stock = per_step(lambda n: twin.generate(ids, max_new_tokens=n, do_sample=False, pad_token_id=0), args.steps)
    print(f"  stock transformers (SDPA, DynamicCache)   {stock:7.1f}")
    tokens = Budget.parse(args.budget).resolve(len(prompt))
    for method in registry.names():
        budget = None if registry.get(method).dense else args.budget

        def through_hf(n, method=method, budget=budget):
            with sfibench.hf.apply(twin, loaded.tokenizer, method, budget=budget):
                twin.generate(ids, max_new_tokens=n, do_sample=False, pad_token_id=0)

        spec = registry.spec(method) if budget is None else registry.at_budget(method, "reference", tokens)
        cache = KVCache(loaded.config, 1, len(prompt) + args.steps + 1, "cpu", torch.float32)
        prefilled = prefill(loaded.model, cache, [prompt])

        def in_engine(n, spec=spec, cache=cache, prefilled=prefilled):
            method_object = registry.create_method(spec, loaded.config, loaded.tokenizer)
            generate(loaded.model, cache, method_object, prefilled, n, Sampler(SamplingConfig(), "cpu"))

        label = method if budget is None else f"{method} at {args.budget}"
        print(f"  sfibench.hf {label:<29} {per_step(through_hf, args.steps):7.1f}")
        print(f"  engine reference path {label:<19} {per_step(in_engine, args.steps):7.1f}")


if __name__ == "__main__":
    main()
