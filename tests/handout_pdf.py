"""A report printed on A4 by Chromium and measured in the PDF it prints (pdfminer.six):
the size of every character of text, the printed size of each handout figure's smallest
label, each printed section's height and the page count. Used by the handout tests of the
H100 reference and of a GPU-less run."""

from __future__ import annotations

import base64
import io
import json
import math
import re
import unicodedata
from pathlib import Path
from typing import Any

import pytest
from browser import chromium

from cudalab import handout
from cudalab.experiments import REGISTRY

BODY_PT = 9.0  # the handout's body text, at least
FIGURE_PT = 6.0  # its figures' labels, at least
MM = 96 / 25.4  # CSS px per mm
A4_PRINTABLE_MM = (210 - 16, 297 - 16)  # the stylesheet's 8 mm margins
MARGIN_PT = 8 / 25.4 * 72
# blank at the foot of a page that is followed by another, on average: a lesson's title
# kept with its first lines, a lesson whose text ends before the figure pushed to the next
# page. A page per lesson, or figures that leave the rest of their page blank, waste more.
MAX_BLANK_PER_PAGE = 0.08
PAGE_PX = A4_PRINTABLE_MM[1] * MM
CHROMIUM_ARGS = ["--no-sandbox", "--disable-gpu", "--disable-background-networking",
                 "--disable-component-update", "--disable-sync", "--no-first-run"]
# each printed section's height on the printable width, in CSS px
HEIGHTS_JS = """() => Array.from(document.querySelectorAll('section'))
  .filter(e => getComputedStyle(e).display !== 'none')
  .map(e => [e.id, e.getBoundingClientRect().height])"""


def print_a4(page_html: Path) -> tuple[bytes, dict[str, float]]:
    """(the PDF Chromium prints on A4, each printed section's height in pages)."""
    exe, sync_playwright = chromium()
    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=exe, args=CHROMIUM_ARGS)
        page = browser.new_page(viewport={"width": round(A4_PRINTABLE_MM[0] * MM),
                                          "height": 1000})
        page.goto(page_html.as_uri(), wait_until="load")
        page.emulate_media(media="print")
        heights = {k: h / PAGE_PX for k, h in page.evaluate(HEIGHTS_JS)}
        pdf = page.pdf(format="A4", print_background=True)
        browser.close()
    return pdf, heights


def pages(pdf: bytes) -> list[Any]:
    high_level = pytest.importorskip("pdfminer.high_level",
                                     reason="needs pdfminer.six (the dev extra)")
    return list(high_level.extract_pages(io.BytesIO(pdf)))


def _walk(obj: Any):
    yield obj
    if hasattr(obj, "__iter__"):
        for child in obj:
            yield from _walk(child)


def text_sizes(pdf: bytes) -> dict[float, tuple[int, str]]:
    """Each size (pt) of the PDF's text -> (page, a character) where it first occurs."""
    from pdfminer.layout import LTChar

    sizes: dict[float, tuple[int, str]] = {}
    for n, page in enumerate(pages(pdf), 1):
        for obj in _walk(page):
            if isinstance(obj, LTChar) and obj.get_text().strip():
                sizes.setdefault(round(obj.size, 2), (n, obj.get_text()))
    return sizes


def _lines(page: Any) -> list[Any]:
    from pdfminer.layout import LTImage, LTTextLine

    return [o for o in _walk(page) if isinstance(o, LTTextLine | LTImage)
            and (isinstance(o, LTImage) or o.get_text().strip())]


def blank_at_foot(pdf: bytes) -> list[float]:
    """The share of each page's printable height left blank below its last line or image."""
    out = []
    for page in pages(pdf):
        lowest = min((o.y0 for o in _lines(page)), default=page.height - MARGIN_PT)
        out.append(max(0.0, (lowest - MARGIN_PT) / (page.height - 2 * MARGIN_PT)))
    return out


def last_lines(pdf: bytes) -> list[str]:
    """The text of each page's lowest line."""
    from pdfminer.layout import LTTextLine

    out = []
    for page in pages(pdf):
        text = [o for o in _lines(page) if isinstance(o, LTTextLine)]
        line = min(text, key=lambda o: o.y0).get_text() if text else ""
        out.append(unicodedata.normalize("NFKC", line).strip())  # "ﬁ" -> "fi"
    return out


def assert_no_page_wasted(pdf: bytes, titles: list[str]) -> None:
    """Pages are filled: on average at most MAX_BLANK_PER_PAGE of a page that has another
    after it is blank at its foot, and no page ends on a lesson's title."""
    blank = blank_at_foot(pdf)[:-1]
    assert sum(blank) <= MAX_BLANK_PER_PAGE * len(blank), (
        f"{sum(blank):.2f} pages blank at the feet of {len(blank)} pages: "
        f"{[round(b, 2) for b in blank]}")
    alone = [(n, line) for n, line in enumerate(last_lines(pdf)[:-1], 1)
             if line and any(t.startswith(line) for t in titles)]
    assert not alone, f"a lesson's title alone at a page's foot (page, line): {alone}"


def handout_pngs(page_html: Path) -> list[dict[str, Any]]:
    """The handout PNG's info (pixel size, smallest font, dpi) of each printed figure."""
    return [handout.png_info(base64.b64decode(src)) for src in re.findall(
        r'<figure class="handout print-only[^"]*"[^>]*>\s*<img src="data:image/png;base64,([^"]+)"',
        page_html.read_text())]


def figure_label_sizes(pdf: bytes, page_html: Path) -> list[tuple[int, float]]:
    """(page, printed pt of its smallest label) of each image in the PDF: its drawn font x
    the width the PDF sets it at / the width it was drawn at. An image that is no handout
    figure fails."""
    from pdfminer.layout import LTImage

    pngs: dict[tuple[int, int], dict[str, Any]] = {}
    for info in handout_pngs(page_html):  # two of one pixel size: the smaller font counts
        key = (info["width"], info["height"])
        if key not in pngs or info["min_font_pt"] < pngs[key]["min_font_pt"]:
            pngs[key] = info
    out = []
    for n, page in enumerate(pages(pdf), 1):
        for obj in _walk(page):
            if isinstance(obj, LTImage):
                info = pngs.get(tuple(obj.srcsize))
                assert info is not None, f"page {n}: an image that is no handout figure"
                drawn_pt = info["width"] / info["dpi"] * 72
                out.append((n, info["min_font_pt"] * obj.width / drawn_pt))
    return out


def assert_legible_handout(page_html: Path, pdf: bytes, heights: dict[str, float],
                           experiments: list[str]) -> None:
    """Body text >= BODY_PT; one figure per lesson with a figure, its labels >= FIGURE_PT;
    each lesson within its declared pages, the PDF within their sum, no page wasted."""
    sizes = text_sizes(pdf)
    assert sizes, "no text in the PDF"
    small = {s: where for s, where in sizes.items() if s < BODY_PT - 0.01}
    assert not small, f"text under {BODY_PT} pt (size: (page, a character)): {small}"
    printed = figure_label_sizes(pdf, page_html)
    with_figure = [n for n in experiments if handout.print_choice(n)]
    assert len(printed) == len(handout_pngs(page_html)) == len(with_figure), printed
    tiny = [(n, round(pt, 2)) for n, pt in printed if pt < FIGURE_PT]
    assert not tiny, f"figure text under {FIGURE_PT} pt (page, pt): {tiny}"
    over = {name: f"{h:.2f} pages, declares {REGISTRY[name].lesson.print_pages}"
            for name, h in heights.items() if name in REGISTRY
            and h > REGISTRY[name].lesson.print_pages}
    assert not over, f"lessons over their declared print_pages: {json.dumps(over)}"
    lessons = [n for n in heights if n in REGISTRY]
    assert sorted(lessons) == sorted(experiments)
    n_pages = len(pages(pdf))
    assert n_pages <= math.ceil(handout.declared_pages(lessons)), (n_pages, lessons)
    assert_no_page_wasted(pdf, [REGISTRY[n].lesson.title for n in lessons])
