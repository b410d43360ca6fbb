"""The throughput report's equal-memory view: each method at its own largest batch (`--batch max`) at the same
context, its tokens per second and tokens per second per GiB of device memory, beside the equal-batch table.

A method that keeps only part of each prompt (a compact cache, engine/compact.py) frees the rest and fits
more sequences; a method that may read any cached token keeps the whole cache. At equal batch that cost is
invisible; at equal memory it is the batch each can decode. The memory is the decode's
measured peak where a GPU measured one, else the run's estimate (metrics/memory.py).
"""

from __future__ import annotations

GIB = 1 << 30


def largest_batch_rows(rows: list[dict]) -> list[dict]:
    """The rows measured at their method's own largest batch, by context and then as the table lists methods."""
    return sorted((r for r in rows if r.get("largest_batch")), key=lambda r: r["context"])


def held_gib(row: dict) -> tuple[float, str]:
    """The device memory a row's decode held, in GiB, and where the number comes from."""
    if row.get("peak_memory_bytes"):
        return row["peak_memory_bytes"] / GIB, "peak"
    return row["memory_estimate"]["total"] / GIB, "estimate"


def markdown_section(rows: list[dict], label) -> list[str]:
    """The equal-memory table (nothing where the run asked for no "max" batch); `label(row)` names a method."""
    chosen = largest_batch_rows(rows)
    if not chosen:
        return []
    lines = ["## Equal memory: each method at its own largest batch", "",
             "Each method at the largest batch its memory estimate fits on this device (`--batch max`), at the "
             "same context: what one device decodes with each. Methods that keep only part of each prompt "
             "(compact cache) fit more sequences than those that keep the whole cache.", "",
             "| method | path | ctx | batch | cache | tok/s | memory GiB | tok/s per GiB |", "|---|---|---|---|---|---|---|---|"]
    sources = set()
    for row in chosen:
        gib, source = held_gib(row)
        sources.add(source)
        cache = "compact" if row["memory_estimate"].get("prompt_cache") else "whole"
        lines.append(f"| {label(row)} | {row['path']} | {row['context']:,} | {row['batch']} | {cache} | "
                     f"{row['tokens_per_s']:,.1f} | {gib:,.2f} | {row['tokens_per_s'] / gib:,.1f} |")
    what = {"peak": "the decode's measured peak", "estimate": "the run's memory estimate"}
    lines += ["", f"Memory: {' or '.join(what[s] for s in sorted(sources))} (weights included).", ""]
    return lines


def draw(ax, rows: list[dict], label, context_axis) -> bool:
    """tok/s per GiB by context at each method's own largest batch on `ax`; False (nothing drawn) where the run
    has no such rows."""
    chosen = largest_batch_rows(rows)
    if not chosen:
        return False
    series: dict[tuple, list[dict]] = {}
    for row in chosen:
        series.setdefault((label(row), row["path"]), []).append(row)
    for (method, path), points in sorted(series.items()):
        ax.plot([p["context"] for p in points], [p["tokens_per_s"] / held_gib(p)[0] for p in points], marker="o",
                ms=4, label=f"{method}/{path} at its largest batch")
        for p in points:
            ax.annotate(f"B={p['batch']}", (p["context"], p["tokens_per_s"] / held_gib(p)[0]), fontsize=7,
                        textcoords="offset points", xytext=(3, 3))
    context_axis(ax, [r["context"] for r in chosen])
    ax.set_title("equal memory: each method at its own largest batch", fontsize=9)
    ax.set_ylabel("tokens/s per GiB held")
    ax.grid(alpha=0.3)
    return True
