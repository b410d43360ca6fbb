"""What a family report's run can ask for on this GPU, by sfibench's memory estimate (every registered method
on the optimized path, bfloat16, synthetic prefill), so benchmarks/family_report.sh asks only for shapes
`sfibench throughput` accepts:

    python benchmarks/fit_plan.py methods MODEL CTX BATCH STEPS   # the methods whose run fits, comma-separated
    python benchmarks/fit_plan.py context MODEL BATCH STEPS       # the longest --ctx (whole K) every method fits

`--memory 139.8GiB` plans in that much memory instead of the GPU's (no GPU needed). The methods left out,
with the memory each would need, go to stderr.
"""

from __future__ import annotations

import argparse
import sys

import torch

from sfibench import registry
from sfibench.metrics.memory import GIB, planning_bytes
from sfibench.models.presets import get_preset
from sfibench.commands.options import parse_memory
from sfibench.runners.throughput_measure import method_specs
from sfibench.runners.throughput_memory import capacity, planned_before_loading, shape_estimate
from sfibench.runners.throughput_run import ThroughputRun

DTYPE_BYTES = 2  # bfloat16, the GPU's default


def optimized_methods() -> list[tuple[str, str]]:
    """Every method with an optimized path, in the registry's order (the order reports list them in)."""
    return [(name, "optimized") for name in registry.names() if (name, "optimized") in registry.available()]


def fitting_methods(model: str, context: int, batch: int, steps: int, planned: int) -> tuple[list[str], dict]:
    """The methods whose run of `batch` x `context` fits `planned` bytes, and {method: GiB} of the others."""
    dims, kept, left_out = get_preset(model), [], {}
    for method in optimized_methods():
        cfg = ThroughputRun(model=model, contexts=[context], batches=[batch], methods=[method], steps=steps)
        total = shape_estimate(dims, method_specs(cfg, context), batch, context + steps + 1, DTYPE_BYTES, True,
                               True, steps)["total"]
        if total <= planned:
            kept.append(method[0])
        else:
            left_out[method[0]] = total / GIB
    return kept, left_out


def longest_context(model: str, batch: int, steps: int, planned: int) -> int:
    """The longest --ctx, in whole K (1,024 tokens), at which a run of every method at `batch` fits (0: none)."""
    dims = get_preset(model)
    longest = dims.max_context - steps
    cfg = ThroughputRun(model=model, contexts=[longest], batches=[batch], methods=optimized_methods(),
                           steps=steps)
    (tokens,), _ = capacity(dims, method_specs(cfg, longest), DTYPE_BYTES, True, planned, steps, [batch], [])
    return tokens if tokens == longest else tokens // 1024 * 1024


def main(argv: list[str]) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("ask", choices=("methods", "context"))
    parser.add_argument("model")
    parser.add_argument("numbers", type=int, nargs="+", help="methods: CTX BATCH STEPS; context: BATCH STEPS")
    parser.add_argument("--memory", help="plan in this much memory (e.g. 139.8GiB) instead of the GPU's")
    args = parser.parse_args(argv)
    if len(args.numbers) != (3 if args.ask == "methods" else 2):
        parser.error(f"{args.ask} takes {'CTX BATCH STEPS' if args.ask == 'methods' else 'BATCH STEPS'}")
    if args.memory:
        planned = planning_bytes(parse_memory(args.memory), parse_memory(args.memory))
    else:
        planned = planned_before_loading(torch.device("cuda"))
    if args.ask == "methods":
        kept, left_out = fitting_methods(args.model, *args.numbers, planned)
        for name, gib in left_out.items():
            print(f"{name}: needs {gib:.2f} GiB of the {planned / GIB:.2f} planned", file=sys.stderr)
        print(",".join(kept))
    else:
        print(longest_context(args.model, *args.numbers, planned))


if __name__ == "__main__":
    main(sys.argv[1:])
