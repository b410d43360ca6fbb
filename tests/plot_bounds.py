"""A figure read as a reader sees it: every label, title and legend whole on the canvas, no two tick
labels of an axis printed over each other. Used by the plot tests on every figure a report draws."""

from __future__ import annotations

import math

from matplotlib.text import Text

SLACK = 1.0  # pixels: antialiasing may put a glyph's box a fraction outside the canvas


def problems(fig) -> list[str]:
    """What a reader would find cut or overprinted in `fig`, drawn as it would be saved."""
    fig.canvas.draw()
    renderer = fig.canvas.get_renderer()
    canvas = fig.bbox
    found = []
    pooled = {id(text) for ax in fig.axes for axis in (ax.xaxis, ax.yaxis)  # every tick's labels, drawn or not
              for tick in (*axis.majorTicks, *axis.minorTicks) for text in (tick.label1, tick.label2)}
    texts = [t for t in fig.findobj(Text) if id(t) not in pooled] + _drawn_tick_labels(fig)
    for artist in [*texts, *fig.legends, *(ax.get_legend() for ax in fig.axes if ax.get_legend())]:
        if not artist.get_visible() or (isinstance(artist, Text) and not artist.get_text().strip()):
            continue
        box = artist.get_window_extent(renderer)
        if box.x0 < canvas.x0 - SLACK or box.y0 < canvas.y0 - SLACK or box.x1 > canvas.x1 + SLACK or \
                box.y1 > canvas.y1 + SLACK:
            found.append(f"{_name(artist)} outside the canvas: {_corners(box)} on a {canvas.width:.0f} x "
                         f"{canvas.height:.0f} canvas")
    for ax in fig.axes:
        if not ax.get_visible():
            continue
        for axis in ("x", "y"):
            labels = [label for label in getattr(ax, f"get_{axis}ticklabels")(which="both")
                      if label.get_visible() and label.get_text().strip() and _inside_axis(ax, axis, label)]
            for i, label in enumerate(labels):
                for other in labels[i + 1:]:
                    if _overprinted(label, other, renderer):
                        found.append(f"{axis} tick labels {label.get_text()!r} and {other.get_text()!r} overlap")
    return found


def _drawn_tick_labels(fig) -> list[Text]:
    """The tick labels matplotlib draws: those of the current ticks that lie within the axis limits (an axis
    keeps spare ticks from earlier draws, never drawn)."""
    return [label for ax in fig.axes if ax.get_visible() for axis in ("x", "y")
            for label in getattr(ax, f"get_{axis}ticklabels")(which="both")
            if label.get_visible() and _inside_axis(ax, axis, label)]


def _overprinted(label: Text, other: Text, renderer) -> bool:
    """Whether two tick labels of one axis print over each other. Labels set at a slant are parallel
    strips, whose upright boxes overlap long before their glyphs do: they collide when the strips' distance
    across the slant is less than a label's height."""
    box, other_box = label.get_window_extent(renderer), other.get_window_extent(renderer)
    angle = math.radians(label.get_rotation() % 180)
    if min(abs(math.sin(angle)), abs(math.cos(angle))) < 1e-3:  # upright or on end: the boxes are the glyphs
        return box.overlaps(other_box)
    label.set_rotation(0)
    height = max(label.get_window_extent(renderer).height, 1.0)
    label.set_rotation(math.degrees(angle))
    (x, y), (ox, oy) = (label.get_transform().transform(label.get_position()),
                        other.get_transform().transform(other.get_position()))
    across = abs((ox - x) * math.sin(angle) - (oy - y) * math.cos(angle))  # anchor distance normal to the text
    return across < height and box.overlaps(other_box)


def _corners(box) -> str:
    return f"({box.x0:.0f}, {box.y0:.0f})-({box.x1:.0f}, {box.y1:.0f})"


def _inside_axis(ax, axis: str, label: Text) -> bool:
    low, high = sorted(ax.get_xlim() if axis == "x" else ax.get_ylim())
    x, y = label.get_position()
    value = x if axis == "x" else y
    return low - 1e-9 * abs(high) <= value <= high + 1e-9 * abs(high)


def _name(artist) -> str:
    return f"text {artist.get_text()!r}" if isinstance(artist, Text) else type(artist).__name__.lower()
