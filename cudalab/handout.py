"""The printed handout's figure: one per lesson, drawn by the figures step at the size it
prints, so its labels stay legible on A4.

A lesson names it in `print_figure = (figure, axes index or None)` (default: its first
figure, every panel). The experiment's own plot() draws it; then, where one panel is named,
the others are removed; the figure is scaled to fit PRINT_WIDTH_IN x PRINT_HEIGHT_IN (never
enlarged), its texts scaled with it but none below MIN_PT, and it is saved at DPI as
figures/<experiment>/handout.png. The smallest font it holds is written into the PNG
(text chunk FONT_KEY), so the report sets the image at its natural size and a test can
compute the printed size of its smallest label from the PDF (font x printed / natural
width). The rest of a lesson's figures stay on screen.
"""

from __future__ import annotations

import json
import struct
from pathlib import Path
from typing import TYPE_CHECKING, Any

from cudalab.experiments import REGISTRY
from cudalab.results import atomic_path

if TYPE_CHECKING:
    from matplotlib.figure import Figure

FILE = "handout"  # figures/<experiment>/handout.png
PRINT_WIDTH_IN = 7.2  # 183 mm of A4's 194 mm between the handout's 8 mm margins
PRINT_HEIGHT_IN = 3.0  # 76 mm: under a third of the page, the rest is the lesson's text
# a figure at most this wide prints beside the lesson's claims, which keep a column of at
# least 60 mm (about 35 characters at 9 pt) of the 194 mm between the margins
BESIDE_TEXT_MM = 130.0
MIN_PT = 7.0  # every label of the printed figure (legible on paper from 6 pt)
DPI = 200
FONT_KEY = "cudalab-print"  # PNG text chunk: {"min_font_pt": .., "dpi": ..}


def print_choice(name: str) -> tuple[str, int | None] | None:
    """(figure, axes index or None: every panel) of an experiment's handout figure: its
    lesson's print_figure, else its first figure; None where it has no figure."""
    lesson = REGISTRY[name].lesson
    if lesson.print_figure:
        fig_name, index = lesson.print_figure
        return str(fig_name), index
    return (next(iter(lesson.figures)), None) if lesson.figures else None


def _one_panel(fig: Figure, index: int) -> None:
    """Only panel `index` (with its twins and colour bars) stays; it takes the figure."""
    from matplotlib.gridspec import GridSpec

    from cudalab import slides

    drawn = slides._panels(fig)
    ax = drawn[max(-len(drawn), min(index, len(drawn) - 1))]
    keep, _ = slides._panel(fig, ax)
    bars = [cax for cax in fig.axes if getattr(cax, "_colorbar", None) is not None
            and cax._colorbar.mappable in [m for a in keep for m in a.collections + a.images]]
    for other in list(fig.axes):
        if other not in keep and other not in bars:
            other.remove()
    slides._fold_titles(fig, keep)  # the figure's title and the panel's: one, no overlap
    spec = GridSpec(1, 1, figure=fig)[0]
    for a in keep:
        if a.get_subplotspec() is not None:
            a.set_subplotspec(spec)


def _texts(fig: Figure) -> list[Any]:
    from matplotlib.text import Text

    return [t for t in fig.findobj(Text) if t.get_visible() and t.get_text().strip()]


def _printed_size(fig: Figure) -> tuple[float, float]:
    """(width, height) in inches of the figure as saved with bbox_inches='tight'."""
    fig.canvas.draw()
    box = fig.get_tightbbox(fig.canvas.get_renderer())
    return box.width, box.height


def to_print(fig: Figure, index: int | None = None) -> Figure:
    """fig at its printed size: one panel where index is given, everything scaled to fit
    PRINT_WIDTH_IN x PRINT_HEIGHT_IN, every text at least MIN_PT."""
    if index is not None:
        _one_panel(fig, index)
    if fig.get_layout_engine() is None:
        fig.set_layout_engine("tight")
    sizes = {id(t): t.get_fontsize() for t in _texts(fig)}
    # tick labels are made anew at each draw from their axis' settings
    ticks = {(a, axis): (axis.get_ticklabels() or [None])[0] for a in fig.axes
             for axis in (a.xaxis, a.yaxis)}
    tick_pt = {k: t.get_fontsize() for k, t in ticks.items() if t is not None}
    scale = 1.0
    # lifting small labels widens the figure: shrink again until it fits
    for _ in range(4):
        w, h = _printed_size(fig)
        step = min(1.0, PRINT_WIDTH_IN / w, PRINT_HEIGHT_IN / h)
        if step > 0.995:
            break
        scale *= step
        fig.set_size_inches(*(fig.get_size_inches() * step), forward=True)
        for (a, axis), pt in tick_pt.items():
            a.tick_params(axis=axis.axis_name, which="both", labelsize=max(pt * scale, MIN_PT))
        for t in _texts(fig):
            t.set_fontsize(max(sizes.get(id(t), t.get_fontsize()) * scale, MIN_PT))
    return fig


def min_font_pt(fig: Figure) -> float:
    return min((t.get_fontsize() for t in _texts(fig)), default=MIN_PT)


def save(fig: Figure, path: Path) -> Path:
    """path (PNG at DPI, tight), with its smallest font in the text chunk FONT_KEY."""
    import matplotlib.pyplot as plt

    path.parent.mkdir(parents=True, exist_ok=True)
    meta = json.dumps({"min_font_pt": round(min_font_pt(fig), 2), "dpi": DPI})
    with atomic_path(path) as tmp:
        fig.savefig(tmp, format="png", dpi=DPI, bbox_inches="tight",
                    metadata={FONT_KEY: meta})
    plt.close(fig)
    return path


def draw(name: str, sub: Any, out_dir: Path) -> Path | None:
    """The experiment's handout figure from its rows, into out_dir/<name>/handout.png
    (None where the lesson has no figure or the run no data for it)."""
    from cudalab import figures

    choice = print_choice(name)
    if choice is None:
        return None
    figures.setup_style()
    fig = REGISTRY[name].plot(choice[0], sub) if not sub.empty else None
    if fig is None:
        fig = figures.placeholder(REGISTRY[name].lesson.title, figures.nothing_to_plot(sub))
        choice = (choice[0], None)
    return save(to_print(fig, choice[1]), Path(out_dir) / name / f"{FILE}.png")


def png_info(data: bytes) -> dict[str, Any]:
    """A PNG's pixel size and the handout's text chunk: {"width", "height", and FONT_KEY's
    fields where present}."""
    if data[:8] != b"\x89PNG\r\n\x1a\n":
        raise ValueError("not a PNG")
    width, height = struct.unpack(">II", data[16:24])
    info: dict[str, Any] = {"width": width, "height": height}
    pos = 8
    while pos + 8 <= len(data):
        length, kind = struct.unpack(">I4s", data[pos:pos + 8])
        if kind == b"tEXt":
            key, _, value = data[pos + 8:pos + 8 + length].partition(b"\0")
            if key.decode("latin-1") == FONT_KEY:
                info.update(json.loads(value.decode("latin-1")))
        if kind == b"IEND":
            break
        pos += 12 + length
    return info


def printed_width_mm(info: dict[str, Any]) -> float | None:
    """The width a handout figure prints at (its natural size at its DPI), None where the
    PNG does not say its DPI."""
    dpi = info.get("dpi")
    return round(info["width"] / dpi * 25.4, 1) if dpi else None


# The title and the course table open the handout; each lesson then takes at most its
# Lesson.print_pages. The shipped config's lessons declare at most DEFAULT_GRID_PAGES.
COURSE_TABLE_PAGES = 1.0
DEFAULT_GRID_PAGES = 12


def declared_pages(names: list[str]) -> float:
    """The pages the handout of these experiments may take: the course table's share and
    each lesson's declared print_pages."""
    return COURSE_TABLE_PAGES + sum(REGISTRY[n].lesson.print_pages for n in names)
