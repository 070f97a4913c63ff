"""Slides: one 16:9 figure per lesson (1920×1080, one panel, no text under MIN_PT) and a
one-file HTML deck that shows them with the lesson's headline claim (cudalab/slide_deck.py).

A slide is the experiment's own figure, so a lesson stays in one place: plot() draws the
figure the lesson's headline claim is about (Claim.figure), else the one its Lesson names in
`slide_figure = (figure, axes index)` (default: the first figure, its first axes); then the
figure is resized to 19.2×10.8 in at 100 dpi, every other panel is removed, the chosen one
fills the figure, and every text is raised to at least MIN_PT; labels that would then
collide are thinned. MIN_PT keeps the figure's smallest text at slide_deck.MIN_PX (28 px)
where the deck shows it at 1920×1080: scaled into the box under the title, about 0.7 of its
1920 px.
"""

from __future__ import annotations

import math
import textwrap
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pandas as pd

from cudalab.experiments import REGISTRY
from cudalab.results import atomic_path

if TYPE_CHECKING:
    from matplotlib.axes import Axes
    from matplotlib.figure import Figure

    from cudalab.run_claims import RunClaims

WIDTH_IN, HEIGHT_IN, DPI = 19.2, 10.8, 100  # 1920×1080 px
# 28 px on screen once the deck scales the figure into its box: about 0.66 to 0.72 of its
# 1920 px at 1920×1080, by how many lines the title and the claim under it take
# (tests/test_slides.py measures it in Chromium): 28 / 0.65 px = 31 pt at 100 dpi
MIN_PT = 31.0
TITLE_PT, SUPTITLE_PT, LABEL_PT = 34.0, 34.0, 32.0
FEW_TICKS = 8  # at most this many x labels are turned upright rather than thinned
LEGEND_SHARE = 0.25  # of the slide's width: the panel keeps the rest
LINE_SCALE = 1.6  # lines and markers drawn for a 9 in figure, seen from the back of a room


def slide_choice(name: str, judged: RunClaims | None = None) -> tuple[str, int]:
    """(figure, axes index) of an experiment's slide: the figure its headline claim is about
    (Claim.figure, as the run's claims.json names it), else its lesson's slide_figure, else
    its first figure's first axes."""
    lesson = REGISTRY[name].lesson
    head = judged.headline(name) if judged is not None else None
    about = judged.figure(name, head.key) if head is not None and judged is not None else None
    if about and about[0] in lesson.figures:
        return about
    if lesson.slide_figure:
        return str(lesson.slide_figure[0]), int(lesson.slide_figure[1])
    return next(iter(lesson.figures)), 0


def experiments_with_slides(names: list[str] | None = None) -> list[str]:
    """The experiments that have a figure (device_query has none: its table is the lesson)."""
    return [n for n in (names if names is not None else list(REGISTRY))
            if REGISTRY[n].lesson.figures]


def _placeholder(name: str, why: str) -> Figure:
    from cudalab import figures

    return figures.placeholder(REGISTRY[name].lesson.title, why)


def slide(name: str, df: pd.DataFrame, judged: RunClaims | None = None) -> Figure:
    """The lesson's slide figure from the run's table (the whole table or its rows): the
    figure its headline claim is about (judged: the run's claims.json)."""
    from cudalab import figures

    figures.setup_style()
    fig_name, index = slide_choice(name, judged)
    sub = df[df["experiment"] == name] if "experiment" in df else df
    fig = REGISTRY[name].plot(fig_name, sub) if not sub.empty else None
    if fig is None:
        fig, index = _placeholder(name, "no data for this figure in this run"), 0
    return to_slide(fig, index)


def _panels(fig: Figure) -> list[Axes]:
    """The figure's panels in drawing order: no colour bar, no twin (it shares its host's
    place), no unused cell of a grid."""
    out: list[Axes] = []
    for a in fig.axes:
        if (getattr(a, "_colorbar", None) is None and a.get_visible()
                and (a.axison or a.has_data() or a.texts)
                and all(a.get_position().bounds != o.get_position().bounds for o in out)):
            out.append(a)
    return out


def _panel(fig: Figure, ax: Axes) -> tuple[list[Axes], list[Any]]:
    """The axes that draw the chosen panel (it and its twins: same place) and the
    mappables of its colour bars (redrawn beside it once it fills the figure)."""
    bounds = ax.get_position().bounds
    twins = [o for o in fig.axes if o is not ax and o.get_position().bounds == bounds
             and getattr(o, "_colorbar", None) is None]
    bars = [cax._colorbar for cax in getattr(ax, "_colorbars", [])]
    return [ax, *twins], [(b.mappable, b.ax.get_ylabel() or b.ax.get_xlabel()) for b in bars]


def _legend_of(fig: Figure, axes: list[Axes]) -> tuple[list[Any], list[str], str]:
    """Every legend of the panel and the figure merged: handles, labels, title; the
    legends themselves are removed (one legend beside the panel covers no data)."""
    handles: list[Any] = []
    labels: list[str] = []
    title = ""
    legends = [*fig.legends, *(a.get_legend() for a in axes)]
    for leg in legends:
        if leg is None:
            continue
        for h, t in zip(leg.legend_handles, leg.get_texts(), strict=False):
            if t.get_text() not in labels:
                handles.append(h)
                labels.append(t.get_text())
        title = title or leg.get_title().get_text()
        leg.remove()
    return handles, labels, title


def _wrap(text: str, size_pt: float, width_px: float) -> str:
    """Text wrapped to the width a line of it may take (about 0.55 em per character)."""
    chars = max(16, int(width_px / (0.55 * size_pt * DPI / 72)))
    return "\n".join(textwrap.fill(line, chars) for line in text.split("\n"))


def to_slide(fig: Figure, index: int = 0) -> Figure:
    """fig as a slide: 1920×1080, only axes `index` (with its twins and colour bar)
    filling it, every text at least MIN_PT."""
    from matplotlib.gridspec import GridSpec

    drawn = _panels(fig)
    ax = drawn[max(-len(drawn), min(index, len(drawn) - 1))]  # -1: the last panel
    keep, bars = _panel(fig, ax)
    handles, labels, legend_title = _legend_of(fig, keep)
    for other in list(fig.axes):
        if other not in keep:
            other.remove()
    _fold_titles(fig, keep)
    fig.set_size_inches(WIDTH_IN, HEIGHT_IN, forward=True)
    fig.set_dpi(DPI)
    fig.set_layout_engine("constrained")
    spec = GridSpec(1, 1, figure=fig)[0]
    for a in keep:
        if a.get_subplotspec() is not None:
            a.set_subplotspec(spec)
    for mappable, label in bars:
        fig.colorbar(mappable, ax=ax, label=label)
    if labels:  # beside the panel, at most LEGEND_SHARE of the slide's width
        room = LEGEND_SHARE * WIDTH_IN * DPI
        leg = fig.legend(handles, [_wrap(t, MIN_PT, room) for t in labels],
                         loc="outside right upper",
                         title=_wrap(legend_title, LABEL_PT, room) if legend_title else None)
        leg.get_title().set_fontsize(LABEL_PT)
    _restyle(fig, keep)
    _wrap_to_axes(fig)
    _declutter(fig)
    _lift_titles(fig)
    return fig


def _fold_titles(fig: Figure, axes: list[Axes]) -> None:
    """One title above the panel: the figure's title, then the panel's own (a twin's
    too), as lines of the panel's title, so no title sits under the legend beside it."""
    sup = getattr(fig, "_suptitle", None)
    lines = [sup.get_text()] if sup is not None and sup.get_text().strip() else []
    for a in axes:
        if a.get_title() and a.get_title() not in lines:
            lines.append(a.get_title())
        a.set_title("")
    if sup is not None:
        sup.remove()
        fig._suptitle = None
    axes[0].set_title("\n".join(lines))


def _restyle(fig: Figure, axes: list[Axes]) -> None:
    """Titles, labels and ticks at slide sizes, thicker lines; then every text >= MIN_PT."""
    from matplotlib.text import Text

    for a in fig.axes:
        for t in (a.title, a._left_title, a._right_title):
            t.set_fontsize(TITLE_PT)
        a.xaxis.label.set_fontsize(LABEL_PT)
        a.yaxis.label.set_fontsize(LABEL_PT)
        a.tick_params(which="both", labelsize=MIN_PT)
        for off in (a.xaxis.get_offset_text(), a.yaxis.get_offset_text()):
            off.set_fontsize(MIN_PT)
    for a in fig.axes:
        _plain_log_ticks(a)
    for a in axes:
        for line in a.get_lines():
            line.set_linewidth(line.get_linewidth() * LINE_SCALE)
            line.set_markersize(line.get_markersize() * LINE_SCALE)
    for t in fig.findobj(Text):
        if t.get_fontsize() < MIN_PT:
            t.set_fontsize(MIN_PT)


def log_tick(v: float, _pos: Any = None) -> str:
    """A log axis' tick as plain text: '0.01', '1000', '1e-6'. Matplotlib's '10⁻⁶' draws its
    exponent at 0.7 of the label's size, under MIN_PT on a slide."""
    if v <= 0 or not math.isfinite(v):
        return ""
    text = f"{v:g}" if 1e-3 <= v < 1e5 else f"{v:.3g}"
    if "e" in text:
        mantissa, exp = text.split("e")
        text = f"{mantissa}e{int(exp)}"
    return text


def _plain_log_ticks(ax: Axes) -> None:
    """matplotlib's own log labels (mathtext powers) in plain text, their minor ticks
    unlabelled (fewer, larger texts); a lesson's own labels stay. A secondary axis too."""
    from matplotlib.ticker import FuncFormatter, LogFormatter, NullFormatter

    for a in (ax, *ax.child_axes):
        for axis in (a.xaxis, a.yaxis):
            if isinstance(axis.get_major_formatter(), LogFormatter):
                axis.set_major_formatter(FuncFormatter(log_tick))
            if isinstance(axis.get_minor_formatter(), LogFormatter):
                axis.set_minor_formatter(NullFormatter())


def _wrap_to_axes(fig: Figure) -> None:
    """Titles and axis labels wrapped to their axes once laid out (a centred title wider
    than its panel would leave the canvas)."""
    fig.canvas.draw()
    renderer = fig.canvas.get_renderer()
    # a centred text may be wider than its panel while both ends stay clear of the canvas'
    # edges and of the legend beside the panel
    right = min([fig.bbox.width] + [g.get_window_extent(renderer).x0 for g in fig.legends])
    for a in fig.axes:
        box = a.get_window_extent(renderer)
        middle = box.x0 + box.width / 2
        room = max(box.width, 2 * min(middle, right - middle) - 40)
        for t in (a.title, a._left_title, a._right_title, a.xaxis.label):
            if t.get_text():
                t.set_text(_wrap(t.get_text(), t.get_fontsize(), room))
        if a.yaxis.label.get_text():
            a.yaxis.label.set_text(_wrap(a.yaxis.label.get_text(), LABEL_PT, box.height))


def _overlaps(a: Any, b: Any) -> bool:
    return min(a.x1, b.x1) - max(a.x0, b.x0) > 1 and min(a.y1, b.y1) - max(a.y0, b.y0) > 1


def _thin_ticks(axis: Any, renderer: Any) -> None:
    """Keep every k-th tick label where MIN_PT labels would touch (a heatmap's 60 rows)."""
    labels = [t for t in axis.get_ticklabels() if t.get_visible() and t.get_text()]
    boxes = [t.get_window_extent(renderer) for t in labels]
    if len(boxes) < 2 or not any(_overlaps(a, b) for a, b in zip(boxes, boxes[1:])):
        return
    horizontal = axis.axis_name == "x"
    if horizontal and len(labels) <= FEW_TICKS:  # a few categories: upright, none dropped
        for t in labels:
            t.set_rotation(90)
        boxes = [t.get_window_extent(renderer) for t in labels]
        if not any(_overlaps(a, b) for a, b in zip(boxes, boxes[1:])):
            return
    need = max((b.width if horizontal else b.height) for b in boxes) * 1.15
    ticks = axis.get_ticklocs()
    pixels = axis.axes.transData.transform(
        [(v, 0) if horizontal else (0, v) for v in ticks])[:, 0 if horizontal else 1]
    step = abs(pixels[-1] - pixels[0]) / max(len(ticks) - 1, 1)
    k = max(2, math.ceil(need / max(step, 1e-9)))
    texts = [t.get_text() for t in axis.get_ticklabels()]
    axis.set_ticks(ticks[::k], texts[::k])


def _drawn_tick_labels(ax: Axes) -> list[Any]:
    """The tick labels drawn: a locator's ticks beyond the view limits are laid out but
    never drawn."""
    out = []
    for axis, lim in ((ax.xaxis, ax.get_xlim()), (ax.yaxis, ax.get_ylim())):
        lo, hi = min(lim), max(lim)
        slack = (hi - lo) * 1e-9
        out += [t.label1 for t in axis.get_major_ticks() if lo - slack <= t.get_loc() <= hi + slack]
    return out


def _lift_titles(fig: Figure) -> None:
    """A note drawn just above the panel's top (a ceiling's label) or a tick label reaching
    over it would sit under the title: the title goes up until it clears them."""
    for _ in range(3):
        fig.canvas.draw()
        renderer = fig.canvas.get_renderer()
        moved = False
        for a in fig.axes:
            title = a.title.get_window_extent(renderer) if a.get_title() else None
            near = [*a.texts, *_drawn_tick_labels(a)]
            notes = [t.get_window_extent(renderer) for t in near
                     if t.get_visible() and t.get_text().strip()]
            clash = [b for b in notes if title is not None and _overlaps(title, b)]
            if clash:
                height = max(a.get_window_extent(renderer).height, 1.0)
                dy = (max(b.y1 for b in clash) - title.y0 + 6) / height
                # set_title(y=...) also ends matplotlib's own placement, which would undo it
                a.set_title(a.get_title(), y=a.title.get_position()[1] + dy,
                            fontsize=a.title.get_fontsize())
                moved = True
        if not moved:
            return


def _declutter(fig: Figure) -> None:
    """Labels that collide once they are MIN_PT: tick labels thinned; annotations inside
    the panel (a heatmap's cell numbers) dropped when many collide, else the later of
    each colliding pair (the colour bar still reads the value)."""
    fig.canvas.draw()
    renderer = fig.canvas.get_renderer()
    for a in fig.axes:
        for axis in (a.xaxis, a.yaxis):
            _thin_ticks(axis, renderer)
        notes = [t for t in a.texts if t.get_visible() and t.get_text().strip()]
        boxes = [t.get_window_extent(renderer) for t in notes]
        clash = [any(_overlaps(b, o) for o in boxes if o is not b) for b in boxes]
        if sum(clash) >= max(4, len(notes) // 4):
            for t in notes:
                t.remove()
            continue
        kept: list[Any] = []
        for t, b in zip(notes, boxes, strict=True):
            if any(_overlaps(b, k) for k in kept):
                t.remove()
            else:
                kept.append(b)


def save(fig: Figure, stem: Path) -> list[Path]:
    """stem.png (1920×1080) and stem.svg, each written to a temp name then renamed; never
    bbox_inches='tight', which would change the size. The SVG keeps its text as text (with
    its font size), so it stays editable and its sizes can be checked."""
    import matplotlib.pyplot as plt
    from matplotlib import rc_context

    stem.parent.mkdir(parents=True, exist_ok=True)
    out = []
    for ext in ("png", "svg"):
        path = stem.with_suffix(f".{ext}")
        with atomic_path(path) as tmp, rc_context({"svg.fonttype": "none"}):
            fig.savefig(tmp, format=ext, dpi=DPI)
        out.append(path)
    plt.close(fig)
    return out


def write_slides(df: pd.DataFrame, out: Path, names: list[str] | None = None,
                 judged: RunClaims | None = None) -> list[Path]:
    """Every lesson's slide (out/<experiment>.png and .svg) and the deck (out/index.html).
    names: the experiments to show (default: every one of the table that has a figure);
    judged: the run's claims.json (a table in memory without one: claims_file.judge_run)."""
    from cudalab import claims_file, slide_deck

    judged = judged if judged is not None else claims_file.judge_run(df)
    written = []
    present = set(df["experiment"]) if "experiment" in df else set()
    shown = experiments_with_slides(names if names is not None
                                    else [n for n in REGISTRY if n in present])
    for name in shown:
        written += save(slide(name, df, judged), out / name)
    return [*written, slide_deck.write_deck(judged, shown, out)]
