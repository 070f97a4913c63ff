"""The printed handout, measured in the PDF that Chromium prints: the H100 reference run
re-rendered with this code (its figures, its handout figures and its report, into a temp
folder), printed on A4.

- body text: every character of the PDF's text is at least BODY_PT;
- figure text: each printed figure is a handout PNG (cudalab/handout.py) whose smallest
  font is written in it; at the width the PDF sets it, that font prints at least FIGURE_PT;
- paper: one figure per lesson; each lesson takes at most the pages it declares
  (Lesson.print_pages), and the PDF at most the sum of those of its printed lessons
  (with the title and course table's share), which for the default grid is at most
  handout.DEFAULT_GRID_PAGES.
"""

from __future__ import annotations

import base64
import io
import json
import math
import re
from pathlib import Path

import pytest
from browser import chromium

from cudalab import config as cfg
from cudalab import figures, handout, report, results, roofline, run_figures
from cudalab.cli import run_config_path
from cudalab.experiments import REGISTRY

ROOT = Path(__file__).resolve().parent.parent
REFERENCE = ROOT / "reports" / "reference" / "NVIDIA-H100-80GB-HBM3"
BODY_PT = 9.0
FIGURE_PT = 6.0
MM = 96 / 25.4  # CSS px per mm
A4_PRINTABLE_MM = (210 - 16, 297 - 16)  # the stylesheet's 8 mm margins
CHROMIUM_ARGS = ["--no-sandbox", "--disable-gpu", "--disable-background-networking",
                 "--disable-component-update", "--disable-sync", "--no-first-run"]
# each printed section's height on the printable width, in CSS px
HEIGHTS_JS = """() => Array.from(document.querySelectorAll('section'))
  .filter(e => getComputedStyle(e).display !== 'none')
  .map(e => [e.id, e.getBoundingClientRect().height])"""


def test_every_lesson_declares_a_print_figure_it_draws():
    """A lesson's handout figure is one of its own figures, its panel index an int."""
    for name, exp in REGISTRY.items():
        choice = handout.print_choice(name)
        assert (choice is None) == (not exp.lesson.figures), name
        if choice:
            assert choice[0] in exp.lesson.figures, (name, choice)
            assert choice[1] is None or isinstance(choice[1], int), (name, choice)
        assert 0 < exp.lesson.print_pages <= 2, name


def test_the_default_grids_handout_is_declared_within_its_pages():
    """The lessons of the shipped config declare at most DEFAULT_GRID_PAGES together."""
    names = cfg.enabled_experiments(cfg.load(ROOT / "config.yaml"))
    total = handout.declared_pages(names)
    assert total <= handout.DEFAULT_GRID_PAGES, (total, names)


def test_to_print_fits_the_page_and_lifts_small_labels():
    """A wide two-panel figure with 5 pt labels comes out within the printed box, one
    panel where one is named, every label at least MIN_PT."""
    import matplotlib.pyplot as plt

    figures.setup_style()

    def wide():
        fig, axes = plt.subplots(1, 2, figsize=(14, 6))
        for ax in axes:
            ax.plot([1, 2, 3], [3, 1, 2], label="a line")
            ax.legend(fontsize=5)
            ax.set_title("a panel")
        fig.suptitle("the figure")
        return fig

    for index, panels in ((None, 2), (1, 1)):
        fig = handout.to_print(wide(), index)
        w, h = handout._printed_size(fig)
        assert w <= handout.PRINT_WIDTH_IN * 1.01 and h <= handout.PRINT_HEIGHT_IN * 1.01
        assert handout.min_font_pt(fig) >= handout.MIN_PT
        assert len([a for a in fig.axes if a.has_data()]) == panels
        plt.close(fig)


@pytest.fixture(scope="module")
def reference_pdf(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, bytes, dict]:
    """The H100 reference re-rendered here (never in place) and printed on A4."""
    exe, sync_playwright = chromium()
    out = tmp_path_factory.mktemp("h100-handout")
    fig_dir = out / "figures"
    table = REFERENCE / "results.csv"
    # the config a re-rendering reads: the run's own, found in its folder
    config = cfg.load(run_config_path(None, REFERENCE))
    raw = results.read_table(table)
    for name in sorted(set(raw["experiment"])):
        figures.draw_experiment(name, raw, fig_dir)
        handout.draw(name, raw[raw["experiment"] == name], fig_dir)
    df = roofline.load_table(table)
    run_figures.draw(df, REFERENCE, fig_dir)
    run_figures.draw_comparisons(df, config, fig_dir)
    page_html = report.render(df, fig_dir, config, out / "report.html", results_dir=REFERENCE)
    width = round(A4_PRINTABLE_MM[0] * MM)
    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=exe, args=CHROMIUM_ARGS)
        page = browser.new_page(viewport={"width": width, "height": 1000})
        page.goto(page_html.as_uri(), wait_until="load")
        page.emulate_media(media="print")
        heights = dict(page.evaluate(HEIGHTS_JS))
        pdf = page.pdf(format="A4", print_background=True)
        browser.close()
    return page_html, pdf, heights


def _layout(pdf: bytes):
    pdfminer = pytest.importorskip("pdfminer.high_level", reason="needs pdfminer.six (dev)")
    return list(pdfminer.extract_pages(io.BytesIO(pdf)))


def _walk(obj):
    yield obj
    if hasattr(obj, "__iter__"):
        for child in obj:
            yield from _walk(child)


def _handout_pngs(page_html: Path) -> dict[tuple[int, int], dict]:
    """(width, height) in pixels -> the handout PNG's info, for each printed figure."""
    html = page_html.read_text()
    out = {}
    for src in re.findall(r'<figure class="handout print-only">\s*<img src="data:image/png;'
                          r'base64,([^"]+)"', html):
        info = handout.png_info(base64.b64decode(src))
        out[(info["width"], info["height"])] = info
    return out


@pytest.mark.slow
@pytest.mark.browser
def test_handout_body_text_prints_at_least_9_pt(reference_pdf):
    _, pdf, _ = reference_pdf
    sizes = {}
    for n, page in enumerate(_layout(pdf), 1):
        from pdfminer.layout import LTChar

        for obj in _walk(page):
            if isinstance(obj, LTChar) and obj.get_text().strip():
                sizes.setdefault(round(obj.size, 2), (n, obj.get_text()))
    assert sizes, "no text in the PDF"
    small = {s: where for s, where in sizes.items() if s < BODY_PT - 0.01}
    assert not small, f"text under {BODY_PT} pt (size: (page, a character)): {small}"


@pytest.mark.slow
@pytest.mark.browser
def test_handout_figures_print_their_labels_at_least_6_pt(reference_pdf):
    """Every image on paper is a lesson's handout figure, one per lesson with a figure;
    its smallest label x (printed width / drawn width) is at least FIGURE_PT."""
    from pdfminer.layout import LTImage

    page_html, pdf, _ = reference_pdf
    pngs = _handout_pngs(page_html)
    printed = []
    for n, page in enumerate(_layout(pdf), 1):
        for obj in _walk(page):
            if isinstance(obj, LTImage):
                info = pngs.get(tuple(obj.srcsize))
                assert info is not None, f"page {n}: an image that is no handout figure"
                drawn_pt = info["width"] / info["dpi"] * 72
                printed.append((n, info["min_font_pt"] * obj.width / drawn_pt))
    df = results.read_table(REFERENCE / "results.csv")
    with_figure = [n for n in sorted(set(df["experiment"])) if handout.print_choice(n)]
    assert len(printed) == len(pngs) == len(with_figure), (printed, with_figure)
    small = [(n, round(pt, 2)) for n, pt in printed if pt < FIGURE_PT]
    assert not small, f"figure text under {FIGURE_PT} pt (page, pt): {small}"


@pytest.mark.slow
@pytest.mark.browser
def test_handout_keeps_to_the_pages_its_lessons_declare(reference_pdf):
    """Each lesson within its declared pages; the PDF within their sum and the title and
    course table's share (the reference runs one lesson beyond the default grid)."""
    _, pdf, heights = reference_pdf
    page_px = A4_PRINTABLE_MM[1] * MM
    over = {name: f"{h / page_px:.2f} pages, declares {REGISTRY[name].lesson.print_pages}"
            for name, h in heights.items() if name in REGISTRY
            and h / page_px > REGISTRY[name].lesson.print_pages}
    assert not over, f"lessons over their declared print_pages: {json.dumps(over)}"
    lessons = [n for n in heights if n in REGISTRY]
    n_pages = len(_layout(pdf))
    assert n_pages <= math.ceil(handout.declared_pages(lessons)), (n_pages, lessons)


@pytest.mark.slow
@pytest.mark.browser
def test_the_rerendered_reference_states_its_own_config_and_no_mixed_state(reference_pdf):
    """The re-rendered H100 reference states the config it ran with (its report-config.yaml),
    and no course row reads "measured, not measured"."""
    import html

    page_html, _, _ = reference_pdf
    page = page_html.read_text()
    block = page[page.index("<summary>Configuration of this run</summary>"):]
    shown = json.loads(html.unescape(block[block.index("<pre>") + 5:block.index("</pre>")]))
    assert shown == cfg.load(REFERENCE / "report-config.yaml")
    assert shown["experiments"]["tensor_cores"]["enabled"] is True  # not today's default
    assert "measured, not measured" not in page
    assert "No GPU was used" not in page  # a run on a GPU has no banner
