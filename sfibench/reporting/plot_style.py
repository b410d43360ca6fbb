"""Conventions every sfibench plot follows, written once so no figure can skip them.

- a measured spread or interval on every point (`yerr`: asymmetric bars, never negative);
- contexts on a log2 axis with a tick, labelled, at every context that was measured and no others;
- one legend per figure, below the panels, so it never covers data;
- log axes labelled at a few round values only (`log_axis`), so tick labels never run into each other.
"""

from __future__ import annotations

import math
import textwrap

import matplotlib

matplotlib.use("Agg")  # files only; never needs a display
import matplotlib.pyplot as plt
from matplotlib.ticker import LogLocator, MaxNLocator, NullFormatter, NullLocator, ScalarFormatter


def yerr(values: list[float | None], lows: list[float | None], highs: list[float | None]) -> list[list[float]]:
    """Asymmetric error bars for matplotlib: distances below and above each value, 0 where none was measured.

    Clamped at 0: an interval bound can miss its own estimate by a rounding error (Wilson at 0 or 1),
    and matplotlib refuses a negative bar.
    """
    below = [0.0 if v is None or lo is None else max(v - lo, 0.0) for v, lo in zip(values, lows)]
    above = [0.0 if v is None or hi is None else max(hi - v, 0.0) for v, hi in zip(values, highs)]
    return [below, above]


def context_label(tokens: int) -> str:
    """1024 -> '1K', 130944 -> '127.9K', 1000 -> '1,000': the K (1,024) spelling the CLI accepts."""
    if tokens >= 1024 and tokens % 1024 == 0:
        return f"{tokens // 1024}K"
    if tokens >= 10 * 1024:
        return f"{tokens / 1024:.1f}K"
    return f"{tokens:,}"


def context_axis(ax, contexts: list[int], label: str = "context (tokens)") -> None:
    """Log2 x axis ticked and labelled at exactly the measured contexts."""
    measured = sorted(set(contexts))
    if len(measured) > 1:
        ax.set_xscale("log", base=2)
        span = math.log2(measured[-1] / measured[0])
        pad = 2 ** (0.08 * max(span, 1.0))
        ax.set_xlim(measured[0] / pad, measured[-1] * pad)
    ax.set_xticks(measured, [context_label(c) for c in measured])
    ax.xaxis.set_minor_locator(NullLocator())
    ax.set_xlabel(label)


def log_axis(ax, axis: str = "y") -> None:
    """A log scale labelled in plain numbers (20, not 2 x 10^1) at 1, 2 and 5 per decade (only powers of ten
    over a wide span, a few round values over a narrow one) and no labels on minor ticks: matplotlib's own
    minor labels on a log axis print 60 70 80 90 into one another. Call after the data is drawn."""
    which = ax.yaxis if axis == "y" else ax.xaxis
    (ax.set_yscale if axis == "y" else ax.set_xscale)("log")
    low, high = ax.get_ylim() if axis == "y" else ax.get_xlim()
    decades = math.log10(high / low) if low > 0 and high > low else 1.0
    if decades > 0.6:
        which.set_major_locator(LogLocator(base=10, subs=(1.0,) if decades > 3 else (1.0, 2.0, 5.0)))
    else:  # under a factor of four no 1-2-5 value may fall inside: round values, as on a linear axis
        which.set_major_locator(MaxNLocator(nbins=4))
    formatter = ScalarFormatter()
    formatter.set_useOffset(False)
    which.set_major_formatter(formatter)
    which.set_minor_locator(LogLocator(base=10, subs=tuple(float(k) for k in range(2, 10))))
    which.set_minor_formatter(NullFormatter())


def legend_below(fig, axes, columns: int = 4, caption: str = "") -> None:
    """One legend for the whole figure, outside and under its panels (the figure must use
    layout="constrained", which makes room for it); a label used in several panels appears once. Columns
    are dropped until the legend fits the figure's width, so no entry is cut at an edge. A `caption` (lines
    no wider than the figure) heads the legend, where the layout makes room for it too."""
    handles = {}
    for ax in axes:
        for handle, text in zip(*ax.get_legend_handles_labels()):
            handles.setdefault(text, handle)
    if not handles:
        return
    renderer = fig.canvas.get_renderer()
    for ncol in range(max(1, min(columns, len(handles))), 0, -1):
        legend = fig.legend(handles.values(), handles.keys(), loc="outside lower center", ncol=ncol, fontsize=8,
                            frameon=False, title=caption or None, title_fontsize=8)
        if ncol == 1 or legend.get_window_extent(renderer).width <= 0.98 * fig.bbox.width:
            return
        legend.remove()


def wrapped(text: str, width: int) -> str:
    """A label broken into lines of at most `width` characters, so it stays inside a narrow figure."""
    return "\n".join(textwrap.wrap(text, width)) or text


def save(fig, path) -> None:
    """`fig` saved as a PNG and closed; the file is then rewritten with at most 256 colours (a third of the
    bytes of matplotlib's own PNG for these plots, which draw a few dozen colours; committed reports carry
    hundreds of them)."""
    from PIL import Image

    fig.savefig(path, dpi=110)
    plt.close(fig)
    with Image.open(path) as image:
        palette = image.convert("RGB").quantize(colors=256, method=Image.Quantize.MEDIANCUT,
                                               dither=Image.Dither.NONE)
    palette.save(path, format="PNG", optimize=True)
