"""Text that collides: every drawn text of a matplotlib figure (titles, axis labels, tick
labels, legends, annotations) by its window extent, for the figure tests."""

from __future__ import annotations

from typing import Any

# Boxes may touch: one pixel of overlap is antialiasing, not a collision.
SLACK_PX = 1.0


def _tick_labels(ax: Any) -> list[Any]:
    out = []
    for axis, lim in ((ax.xaxis, ax.get_xlim()), (ax.yaxis, ax.get_ylim())):
        if not axis.get_visible():  # a twin's shared axis is not drawn
            continue
        lo, hi = min(lim), max(lim)
        span = (hi - lo) * 1e-9
        for tick in axis.get_major_ticks() + axis.get_minor_ticks():
            if not lo - span <= tick.get_loc() <= hi + span:
                continue  # outside the view: not drawn
            out += [t for t in (tick.label1, tick.label2) if t.get_visible()]
    return out


def texts(fig: Any) -> list[Any]:
    """The figure's visible, non-empty text artists."""
    found = list(fig.texts)
    if getattr(fig, "_suptitle", None) is not None:
        found.append(fig._suptitle)
    for leg in fig.legends:
        found += leg.get_texts() + [leg.get_title()]
    for ax in fig.axes:
        if not ax.get_visible() or not ax.axison and not ax.texts:
            continue
        found += [ax.title, ax._left_title, ax._right_title]
        found += [a.label for a in (ax.xaxis, ax.yaxis) if a.get_visible()]
        found += _tick_labels(ax) + list(ax.texts)
        leg = ax.get_legend()
        if leg is not None and leg.get_visible():
            found += leg.get_texts() + [leg.get_title()]
    unique = {id(t): t for t in found}  # the suptitle is in fig.texts too
    return [t for t in unique.values() if t.get_visible() and t.get_text().strip()]


def problems(fig: Any) -> list[str]:
    """'a' overlaps 'b' / 'a' leaves the canvas, for every such text of the figure."""
    fig.canvas.draw()
    renderer = fig.canvas.get_renderer()
    canvas = fig.bbox
    boxes = [(t.get_text().strip()[:40], t.get_window_extent(renderer)) for t in texts(fig)]
    out = []
    for name, b in boxes:
        if (b.x0 < canvas.x0 - SLACK_PX or b.y0 < canvas.y0 - SLACK_PX
                or b.x1 > canvas.x1 + SLACK_PX or b.y1 > canvas.y1 + SLACK_PX):
            out.append(f"{name!r} leaves the canvas")
    for i, (na, a) in enumerate(boxes):
        for nb, b in boxes[i + 1:]:
            w = min(a.x1, b.x1) - max(a.x0, b.x0)
            h = min(a.y1, b.y1) - max(a.y0, b.y0)
            if w > SLACK_PX and h > SLACK_PX:
                out.append(f"{na!r} overlaps {nb!r}")
    return out
