"""Which batches a throughput run measures each method spec at: every spec at each batch given as a number,
and where the run asks for "max" each at its own largest batch (the equal-memory view's rows). No torch here.
"""

from __future__ import annotations

from sfibench.engine.method import MethodSpec


def spec_key(spec: MethodSpec) -> tuple:
    """What tells a method spec's rows apart from another's, whatever the context's budget."""
    return spec.name, spec.path, tuple(spec.config.row_facts().items())


def batch_plan(specs: list[MethodSpec], fixed: list[int], own: dict[tuple, int]) -> dict[int, list[MethodSpec]]:
    """Which specs run at each batch: every spec at each of the `fixed` batches, and each at its own largest
    (`own`, where the run asked for "max")."""
    plan = {batch: list(specs) for batch in fixed}
    for spec in specs:
        batch = own.get(spec_key(spec))
        if batch is not None and spec not in plan.setdefault(batch, []):
            plan[batch].append(spec)
    return plan


def marked(row: dict, spec: MethodSpec, batch: int, own: dict[tuple, int] | None) -> dict:
    """`row` saying whether it was measured at its method's own largest batch (`own`: spec_key -> batch, empty
    where the run asked for no "max"); a resumed run's row keeps what it says."""
    row.setdefault("largest_batch", bool(own) and own.get(spec_key(spec)) == batch)
    return row
