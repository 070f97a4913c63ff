"""The printed handout, measured in the PDF that Chromium prints: the H100 reference run
re-rendered with this code (its figures, its handout figures and its report, into a temp
folder), printed on A4.

- body text: every character of the PDF's text is at least BODY_PT;
- figure text: each printed figure is a handout PNG (cudalab/handout.py) whose smallest
  font is written in it; at the width the PDF sets it, that font prints at least FIGURE_PT;
- paper: one figure per lesson; each lesson takes at most the pages it declares
  (Lesson.print_pages), and the PDF at most the sum of those of its printed lessons
  (with the title and course table's share), which for the default grid is at most
  handout.DEFAULT_GRID_PAGES; the reference (the default grid and tensor cores) prints
  within them too;
- no page wasted: pages that have another after them are filled but for a small share
  at their feet (figures float to the next page's top while the text fills this one), and
  none ends on a lesson's title.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from handout_pdf import (
    BODY_PT,
    FIGURE_PT,
    assert_legible_handout,
    assert_no_page_wasted,
    figure_label_sizes,
    pages,
    print_a4,
    text_sizes,
)

from cudalab import config as cfg
from cudalab import figures, handout, report, results, roofline, run_figures
from cudalab.cli import run_config_path
from cudalab.experiments import REGISTRY

ROOT = Path(__file__).resolve().parent.parent
REFERENCE = ROOT / "reports" / "reference" / "NVIDIA-H100-80GB-HBM3"
TENSOR_CORES_RUN = REFERENCE / "tensor-cores-2026-11-27"


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


def _rerender(folder: Path, out: Path) -> tuple[Path, bytes, dict]:
    """A committed run re-rendered here (never in place) and printed on A4."""
    fig_dir = out / "figures"
    table = folder / "results.csv"
    # the config a re-rendering reads: the run's own, found in its folder
    config = cfg.load(run_config_path(None, folder))
    raw = results.read_table(table)
    for name in sorted(set(raw["experiment"])):
        figures.draw_experiment(name, raw, fig_dir)
        handout.draw(name, raw[raw["experiment"] == name], fig_dir)
    df = roofline.load_table(table)
    run_figures.draw(df, folder, fig_dir)
    run_figures.draw_comparisons(df, config, fig_dir)
    page_html = report.render(df, fig_dir, config, out / "report.html", results_dir=folder)
    pdf, heights = print_a4(page_html)
    return page_html, pdf, heights


@pytest.fixture(scope="module")
def reference_pdf(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, bytes, dict]:
    """The H100 reference re-rendered here and printed on A4."""
    return _rerender(REFERENCE, tmp_path_factory.mktemp("h100-handout"))


@pytest.mark.slow
@pytest.mark.browser
def test_the_tensor_core_lesson_with_its_wgmma_facts_prints_within_its_pages(tmp_path):
    """The H100 run of the tensor-core lesson with every wgmma rung (its ladder, its
    pipeline depths and Nsight Compute's counts in the text): legible, within the pages the
    lesson declares, no page wasted."""
    page_html, pdf, heights = _rerender(TENSOR_CORES_RUN, tmp_path)
    assert "Nsight Compute counted" in page_html.read_text()
    assert_legible_handout(page_html, pdf, heights, ["tensor_cores"])


@pytest.mark.slow
@pytest.mark.browser
def test_the_reference_handout_is_legible_and_keeps_to_its_pages(reference_pdf):
    page_html, pdf, heights = reference_pdf
    experiments = sorted(set(results.read_table(REFERENCE / "results.csv")["experiment"]))
    assert_legible_handout(page_html, pdf, heights, experiments)
    # the default grid and the tensor-core lesson: still within the default grid's pages
    assert len(pages(pdf)) <= handout.DEFAULT_GRID_PAGES, len(pages(pdf))


@pytest.mark.slow
@pytest.mark.browser
def test_the_measurement_sees_wasted_pages(reference_pdf, tmp_path):
    """The same report with a page per lesson fails the waste check, and so does one whose
    figures stay where they stand in the text (a figure that does not fit under the text
    before it leaves the rest of that page blank)."""
    page_html, _, _ = reference_pdf
    titles = [REGISTRY[n].lesson.title for n in REGISTRY]
    for css in ("section.lesson { break-before: page; }",
                "figure.handout { float: none !important; width: auto !important; }"):
        html = page_html.read_text().replace("</style>", f"@media print {{ {css} }}</style>", 1)
        path = tmp_path / "wasteful.html"
        path.write_text(html)
        pdf, _ = print_a4(path)
        with pytest.raises(AssertionError, match="blank at the feet"):
            assert_no_page_wasted(pdf, titles)
        assert len(pages(pdf)) > handout.DEFAULT_GRID_PAGES, css


@pytest.mark.slow
@pytest.mark.browser
def test_the_measurement_sees_small_type(reference_pdf, tmp_path):
    """The same report with the handout's type and figure set smaller fails both floors:
    the measurement reads the PDF, not the stylesheet."""
    page_html, _, _ = reference_pdf
    smaller = page_html.read_text().replace(
        "body { background: #fff; font-size: 9pt;", "body { background: #fff; font-size: 8pt;")
    smaller = smaller.replace("figure.handout img { border: none;",
                              "figure.handout img { zoom: .6; border: none;")
    assert smaller != page_html.read_text()
    path = tmp_path / "smaller.html"
    path.write_text(smaller)
    pdf, _ = print_a4(path)
    assert min(text_sizes(pdf)) < BODY_PT
    assert min(pt for _, pt in figure_label_sizes(pdf, path)) < FIGURE_PT


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
