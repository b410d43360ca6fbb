"""`sfibench generate`'s closing summary in words: the steps by kind, the tokens each kind read per layer
and KV head against the method's budget, and why the two differ."""

from __future__ import annotations

import statistics

DENSE_SHARE = 0.99  # a step reading this share of its cache read all of it


def _plural(count: int, noun: str) -> str:
    return f"{count:,} {noun}{'' if count == 1 else 's'}"


def summary_lines(result: dict) -> list[str]:
    """Three or four sentences from a generate result (the dict `--json` prints)."""
    summary, steps, budget = result["summary"], result["steps"], result.get("budget_tokens")
    kinds = summary["steps_by_kind"]
    counted = " and ".join(_plural(n, f"{kind} step") for kind, n in kinds.items())
    interval = summary.get("mean_slow_interval")
    lines = [f"{result['prompt_tokens']:,} prompt tokens, {len(result['generated_ids']):,} generated: the first by the "
             f"prefill, then {counted}" + (f" (a refresh every {interval:.1f} steps on average)" if interval else "")
             + "."]
    if not steps:
        return lines
    read = {kind: statistics.fmean(s["tokens_read_mean"] for s in steps if s["kind"] == kind) for kind in kinds}
    cached = {kind: statistics.fmean(s["kv_length"] for s in steps if s["kind"] == kind) for kind in kinds}
    against = "" if budget is None else (f" against a budget of {budget:,} "
                                         f"({budget / result['prompt_tokens']:.1%} of the prompt)")
    lines.append("Tokens read per layer and KV head: " + ", ".join(f"{read[k]:,.0f} on a {k} step" for k in kinds)
                 + against + ".")
    reasons = [_reason(kind, read[kind], cached[kind], budget) for kind in kinds]
    reasons = [reason for reason in reasons if reason]
    if reasons:
        lines.append(" ".join(reasons))
    lines.append(f"Mean retention {summary['mean_retention']:.3f}: tokens read over the cache's length, averaged over "
                 "every step" + ("" if budget is None else
                                 f" (the budget is {budget / result['prompt_tokens']:.3f} of the prompt)") + ".")
    return lines


def _reason(kind: str, read: float, cached: float, budget: int | None) -> str:
    """Why one kind of step read what it read, as far as the numbers tell."""
    if read >= DENSE_SHARE * cached and (budget is None or budget < cached):
        return f"A {kind} step reads every cached token."
    if budget is None or abs(read - budget) < 0.5:
        return ""
    if read > budget:
        return (f"A {kind} step reads {read - budget:,.0f} more than the budget on average: the tokens generated "
                "since the last selection are read beside it (and, where the read is paged, the rest of a page).")
    if cached <= budget:
        return f"A {kind} step reads fewer: the cache ({cached:,.0f} tokens) is shorter than the budget."
    return f"A {kind} step reads {budget - read:,.0f} fewer than the budget on average."
