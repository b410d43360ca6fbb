"""Budget accounting from a decode trace: what each step read, and the retention read / L.

Methods are compared at equal tokens *read*, never at nominal ratios, so these numbers come from what
each method recorded while attending, not from its configuration.
"""

from __future__ import annotations

from sfibench.engine.decode import Trace


def step_stats(trace: Trace, row: int) -> list[dict]:
    """One dict per decode step of sequence `row`: kind, KV length, tokens read per (layer, KV head)."""
    stats = []
    for index, record in enumerate(trace.steps, start=1):
        read = record.tokens_read[:, row].float()  # [L, H_kv]
        length = int(record.kv_lengths[row])
        stats.append({
            "step": index,
            "kind": record.kinds[row],
            "kv_length": length,
            "tokens_read_mean": round(float(read.mean()), 2),
            "tokens_read_min": int(read.min()),
            "tokens_read_max": int(read.max()),
            "retention": round(float(read.mean()) / length, 4),
        })
    return stats


def summarize(trace: Trace, row: int) -> dict:
    """Totals for one sequence: steps by kind, mean tokens read and mean retention."""
    stats = step_stats(trace, row)
    kinds: dict[str, int] = {}
    for s in stats:
        kinds[s["kind"]] = kinds.get(s["kind"], 0) + 1
    n = max(len(stats), 1)
    return {
        "decode_steps": len(stats),
        "steps_by_kind": kinds,
        "mean_tokens_read": sum(s["tokens_read_mean"] for s in stats) / n,
        "mean_retention": sum(s["retention"] for s in stats) / n,
    }
