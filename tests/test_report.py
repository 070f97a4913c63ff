"""Report rendering from records recorded on a real H100, and in a real headless Chromium."""

from __future__ import annotations

import math
import re
from pathlib import Path

import pandas as pd
import pytest
from browser import chromium

from cudalab import config as cfg
from cudalab import figures, fmt, handout, report, results, roofline, run_figures

ROOT = Path(__file__).resolve().parent.parent
DEFAULT_CONFIG = ROOT / "config.yaml"  # the default grid

RECORDED = ROOT / "tests" / "data" / "recorded_h100" / "raw"


@pytest.fixture(scope="module")
def rendered(tmp_path_factory):
    out = tmp_path_factory.mktemp("report")
    # as the pipeline does: aggregate derives the columns, the figures step draws
    df = roofline.annotate(results.build_table(results.iter_records(RECORDED)))
    figures.draw_experiment("matmul", df, out / "figures")
    handout.draw("matmul", df, out / "figures")  # the figure the handout prints
    run_figures.draw(df, out / "results", out / "figures")
    config = cfg.validate({"run_name": "h100-recorded", "experiments": {"matmul": {}}})
    path = report.render(df, out / "figures", config, out / "report.html")
    return path, df


def test_report_is_self_contained(rendered):
    path, _ = rendered
    html = path.read_text()
    # nothing to fetch: no external scripts, styles or images
    assert not re.search(r'(src|href)="(https?:)?//', html)
    assert "<script" not in html
    from cudalab.experiments import REGISTRY

    # matmul's own figures, its handout figure, the run's roofline and matmul's roofline
    assert html.count("data:image/png;base64,") == len(REGISTRY["matmul"].lesson.figures) + 3


def test_report_has_summary_device_sections_and_checks(rendered):
    path, df = rendered
    html = path.read_text()
    for needle in ["h100-recorded", "NVIDIA H100 80GB HBM3", "Device and run",
                   "Matrix multiplication", "claims, judged", "Provenance",
                   "every GPU result matches the float64 CPU reference",
                   "shared-memory tiling (best tile) is at least 1.20× faster", "15 ok"]:
        assert needle in html, needle


def test_throttle_note_separates_unchecked_samples():
    import pandas as pd

    df = pd.DataFrame({"n_samples": [10, 20, 5, None], "n_throttled": [0, 3, None, None]})
    note = report.throttle_note(df)
    assert note == ("35 timed samples; 30 checked for throttling (NVML), 3 taken while "
                    "throttled; 5 not checked (CPU points, or NVML unavailable)")
    # nothing watched the clocks: never reported as "0 throttled"
    unchecked = report.throttle_note(df.iloc[[2]])
    assert "checked for" not in unchecked and "5 not checked" in unchecked
    assert report.throttle_note(df.iloc[[3]]) == "no timed samples"


def test_long_text_metrics_stay_out_of_the_report_tables():
    import pandas as pd

    df = pd.DataFrame({"m_speedup": [1.5, None], "m_timeline": ["x" * 500, None],
                       "m_empty": [None, None], "m_limiter": ["warps", "registers"]})
    assert report._metric_cols(df) == ["m_limiter", "m_speedup"]


def test_failed_points_are_listed_not_plotted(tmp_path):
    recs = list(results.iter_records(RECORDED))
    bad = dict(recs[5])
    bad["status"] = "wrong"
    bad["reason"] = "rel_fro = 0.5 exceeds tolerance 0.0001"
    recs[5] = bad
    df = results.build_table(recs)
    config = cfg.validate({"experiments": {"matmul": {}}})
    path = report.render(df, tmp_path, config, tmp_path / "r.html")
    html = path.read_text()
    assert "Points that are not ok" in html and "exceeds tolerance" in html
    assert bad["point_id"] in html
    assert 'class="fail"' in html  # the correctness expectation now fails


@pytest.mark.browser
def test_report_loads_in_headless_chromium_without_errors(rendered, tmp_path):
    exe, sync_playwright = chromium()
    path, _ = rendered
    errors: list[str] = []
    with sync_playwright() as pw:
        browser = pw.chromium.launch(
            executable_path=exe,
            args=["--no-sandbox", "--disable-gpu", "--disable-background-networking",
                  "--disable-component-update", "--disable-sync", "--no-first-run"],
        )
        page = browser.new_page(viewport={"width": 1300, "height": 900})
        page.on("console", lambda m: errors.append(m.text) if m.type == "error" else None)
        page.on("pageerror", lambda e: errors.append(str(e)))
        page.on("requestfailed", lambda r: errors.append(f"request failed: {r.url}"))
        page.goto(path.as_uri(), wait_until="load")
        images = page.evaluate(
            "Array.from(document.images).map(i => ({alt: i.alt, ok: i.complete,"
            " w: i.naturalWidth, h: i.naturalHeight}))")
        page.screenshot(path=str(tmp_path / "report.png"), full_page=True)
        browser.close()
    assert errors == []
    from cudalab.experiments import REGISTRY

    # matmul's figures, the run's roofline, matmul's own and its printed handout figure (as
    # in the self-contained test)
    assert len(images) == len(REGISTRY["matmul"].lesson.figures) + 3
    for img in images:
        assert img["ok"] and img["w"] > 100 and img["h"] > 100, img


# -- teaching: "Try this" and questions -------------------------------------------------------
def _apply_change(config: dict, change: str) -> dict:
    """'a.b.c: <yaml>' applied to a copy of config; keys that are not top-level config keys
    are under experiments."""
    import copy

    import yaml

    m = re.match(r"^([\w.]+): (.+)$", change)
    assert m, f"not a config change: {change!r}"
    keys, value = m.group(1).split("."), yaml.safe_load(m.group(2))
    out = copy.deepcopy(config)
    node = out if keys[0] in cfg.full_schema()["properties"] else out["experiments"]
    for k in keys[:-1]:
        node = node.setdefault(k, {})
    node[keys[-1]] = value
    return out


@pytest.mark.slow
def test_every_experiment_has_try_this_and_questions_that_are_valid_configs():
    import yaml

    from cudalab.experiments import REGISTRY
    from cudalab.experiments.lesson import TRY_THIS_COUNT

    base = yaml.safe_load((ROOT / "config.yaml").read_text())
    least, most = TRY_THIS_COUNT
    for name, exp in REGISTRY.items():
        lesson = exp.lesson
        assert least <= len(lesson.try_this) <= most, name
        assert least <= len(lesson.questions) <= most, name
        for change, expect, *_ in lesson.try_this:
            assert len(expect) > 40, (name, change)  # what to expect, and why
            cfg.validate(_apply_change(base, change))  # raises ConfigError if not valid
        assert all(q.text.endswith(("?", ".")) for q in lesson.questions), name


def test_try_this_and_questions_are_rendered(rendered):
    path, _ = rendered
    page = path.read_text()
    assert "<h3>Try this " in page and "<h3>Questions</h3>" in page
    assert "<code>matmul.tiles: [8]</code>" in page


# -- print and projector: the committed reference report in a real Chromium ------------------
REFERENCE_HTML = ROOT / "reports" / "reference" / "NVIDIA-H100-80GB-HBM3" / "report.html"
# the H100 reference as it was before ceilings existed (tests/data/h100_before_ceilings)
OLD_TABLE = ROOT / "tests" / "data" / "h100_before_ceilings" / "results.csv"
# every committed reference report is checked in print and on a narrow screen
REFERENCE_REPORTS = sorted((ROOT / "reports" / "reference").glob("*/report.html"))
CHROMIUM_ARGS = ["--no-sandbox", "--disable-gpu", "--disable-background-networking",
                 "--disable-component-update", "--disable-sync", "--no-first-run"]
MM = 96 / 25.4  # CSS px per millimetre
# paper -> (PDF page width in pt, printable width in CSS px with the stylesheet's 8 mm margins)
PAPERS = {"A4": (595.92, round((210 - 16) * MM)), "Letter": (612.0, round((215.9 - 16) * MM))}
# The handout: the title and the course table, then the lessons one after the other; the
# appendix (per-point tables, telemetry, provenance) is left out of print. Its pages are
# the lessons' own declarations (Lesson.print_pages): tests/test_handout_print.py measures
# them, its type and its figures' labels in the PDF.

# the course tables' numbers (class "num") that the browser broke over two lines
WRAPPED_JS = """() => Array.from(document.querySelectorAll('table.course .num')).filter(
  n => n.getClientRects().length > 1).map(n => n.textContent)"""
FITS_JS = """(width) => {
  const bad = [];
  const out = (e) => e.getBoundingClientRect().right > width + 1;
  for (const t of document.querySelectorAll('table')) {
    if (t.getClientRects().length === 0) continue;
    if (out(t) || t.scrollWidth > t.clientWidth + 1)
      bad.push('table in #' + t.closest('section').id + ' is ' + t.scrollWidth + ' px wide');
  }
  for (const t of document.querySelectorAll('table.results')) {
    if (t.closest('.appendix')) continue;  // the appendix stays on screen, out of print
    const box = t.parentElement;  // the on-screen scroll box must not clip in print
    if (box.scrollHeight > box.clientHeight + 1 || t.getClientRects().length === 0)
      bad.push('results table in #' + t.closest('section').id + ' is clipped or hidden');
  }
  for (const i of document.images)
    if (i.getClientRects().length && out(i)) bad.push('image ' + i.alt + ' overflows');
  return {scrollWidth: document.documentElement.scrollWidth, bad: bad,
          sections: document.querySelectorAll('section').length,
          lessons: document.querySelectorAll('section.lesson').length,
          lesson_ids: Array.from(document.querySelectorAll('section.lesson')).map(e => e.id),
          printed: Array.from(document.querySelectorAll('section')).filter(
            e => getComputedStyle(e).display !== 'none').length,
          nav: getComputedStyle(document.querySelector('nav')).display};
}"""


def _pdf_pages(data: bytes) -> tuple[int, set[float]]:
    """Pages and page widths (pt) of a Chromium (Skia) PDF: one /Type /Page object each."""
    pages = re.findall(rb"/Type\s*/Page\b", data)
    widths = {float(w) for w in re.findall(rb"/MediaBox\s*\[\s*0\s+0\s+([\d.]+)", data)}
    return len(pages), widths


@pytest.mark.browser
@pytest.mark.parametrize("paper", list(PAPERS))
@pytest.mark.parametrize("which", [*(p.parent.name for p in REFERENCE_REPORTS), "rendered"])
def test_report_prints_without_clipping(paper, which, rendered):
    """The committed references (the H100's is the default grid) and a report rendered with
    this code, printed by Chromium."""
    exe, sync_playwright = chromium()
    refs = {p.parent.name: p for p in REFERENCE_REPORTS}
    path = refs[which] if which in refs else rendered[0]
    page_pt, width = PAPERS[paper]
    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=exe, args=CHROMIUM_ARGS)
        page = browser.new_page(viewport={"width": width, "height": 1000})
        page.goto(path.as_uri(), wait_until="load")
        page.emulate_media(media="print")
        fit = page.evaluate(FITS_JS, width)
        wrapped = page.evaluate(WRAPPED_JS)
        pdf = page.pdf(format=paper, print_background=True)
        browser.close()
    assert fit["nav"] == "none"  # no navigation on paper
    assert wrapped == []
    assert fit["bad"] == [] and fit["scrollWidth"] <= width, fit
    n_pages, widths = _pdf_pages(pdf)
    assert {round(w, 1) for w in widths} == {round(page_pt, 1)}, widths
    # on paper: the course table and the lessons, nothing of the appendix
    assert fit["printed"] == fit["lessons"] + 1, fit
    # within the pages its printed lessons declare (and the course table's share)
    assert n_pages <= math.ceil(handout.declared_pages(fit["lesson_ids"])), n_pages


@pytest.mark.browser
@pytest.mark.parametrize("screen", [400, 1280])  # a phone, a projector
@pytest.mark.parametrize("which", [*(p.parent.name for p in REFERENCE_REPORTS), "rendered"])
def test_report_fits_a_narrow_screen_and_a_projector(which, screen, rendered):
    """No horizontal overflow, and no number of the course tables broken over two lines."""
    exe, sync_playwright = chromium()
    refs = {p.parent.name: p for p in REFERENCE_REPORTS}
    path = refs[which] if which in refs else rendered[0]
    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=exe, args=CHROMIUM_ARGS)
        page = browser.new_page(viewport={"width": screen, "height": 720})
        page.goto(path.as_uri(), wait_until="load")
        width = page.evaluate("document.documentElement.scrollWidth")
        wrapped = page.evaluate(WRAPPED_JS)
        browser.close()
    assert width <= screen
    assert wrapped == []


def test_reference_report_rows_link_to_raw_records_beside_it():
    page = REFERENCE_HTML.read_text()
    links = re.findall(r'<a href="(raw/[^"]+\.json)">', page)
    assert len(links) >= 400  # every point of the run but device_query's key/value list
    for href in links:
        assert (REFERENCE_HTML.parent / href).is_file(), href
    assert "spread (IQR · CV)" in page


@pytest.mark.slow
def test_a_failed_check_is_flagged_as_contradicting_the_caption(tmp_path):
    """The H100 does not show the course's 'shared tiles win' for sobel: the section says
    so under its caption; matmul, which shows every effect, has no such flag."""
    df = results.read_table(REFERENCE_HTML.parent / "results.csv")
    df = df[df["experiment"].isin(["sobel", "matmul"])]
    config = cfg.validate({"experiments": {"sobel": {}, "matmul": {}}})
    ctx = report.build_context(df, tmp_path, config)
    by = {s["name"]: s for s in ctx["sections"]}
    assert [e.claim[:40] for e in by["sobel"]["contradictions"]] == [
        "(course expectation) the shared-memory t"]
    assert by["matmul"]["contradictions"] == []
    page = report.render(df, tmp_path, config, tmp_path / "r.html").read_text()
    assert page.count("This run contradicts the lesson") == 1


# -- issue 10: roofline, memory levels, explanations, caption checks ------------------------
@pytest.mark.slow
def test_reference_report_without_the_new_columns(tmp_path):
    """An H100 results.csv from before the ceilings has no ceilings, memory level or ncu
    columns: the report still builds, derives the memory levels, says the ceilings are
    theoretical and flags the transpose above the DRAM peak."""
    df = results.read_table(OLD_TABLE)
    assert df["ceil_dram_gbps"].isna().all() and (df["memory_level"] == "").all()
    df = roofline.load_table(OLD_TABLE)  # the columns derived on load
    config = cfg.validate({"experiments": {n: {} for n in ["matmul", "coalescing", "sobel",
                                                           "vector_add", "device_query"]}})
    run_figures.draw(df, tmp_path / "results", tmp_path)
    page = report.render(df, tmp_path, config, tmp_path / "r.html").read_text()
    assert '<section id="roofline"' in page and 'alt="roofline of the run"' in page
    for name in ("matmul", "coalescing", "sobel", "vector_add"):
        assert f'alt="{name}: roofline"' in page, name
    assert "No ceilings were measured for this run" in page
    assert f"<td>not measured</td><td>{fmt.bandwidth(3352.32)}</td>" in page  # theoretical
    # the list of measurements to distrust, and the marker in coalescing's table
    distrust = page[page.index('id="distrust"'):]
    assert "transpose_padded-size2048" in distrust[:3000]
    assert "32 MiB fits the 50 MiB L2" in distrust[:3000]
    assert page.count('<tr class="st-ok suspect">') == 1
    assert f"{fmt.bandwidth(3836.9)} <span class=\"suspect-mark\"" in page
    # memory levels beside GB/s; hot runs said so
    assert "<th>level</th>" in page and "<td>l2</td>" in page and "<td>dram</td>" in page
    assert "Bandwidth measured hot: L2 not flushed" in page
    # data-driven explanations and the caption check
    assert "served by the L1 and L2 caches" in page
    # every claim holds on the H100 but the course's "shared tiles win" for sobel
    assert page.count("This run contradicts the lesson") == 1
    sobel = page[page.index('<section id="sobel"'):]
    assert "This run contradicts the lesson" in sobel


def _with_new_columns(df: pd.DataFrame) -> pd.DataFrame:
    """The reference table with the ceilings and profiler columns of the contract, as the
    ceilings and ncu steps would add them (ceilings here: made-up round numbers)."""
    df = df.copy()
    gpu = df["peak_mem_gbps"].notna()
    ceil = {"ceil_dram_gbps": 3000.0, "ceil_dram_memcpy_gbps": 2900.0, "ceil_l2_gbps": 9000.0,
            "ceil_smem_gbps": 30000.0, "ceil_fp32_gflops": 60000.0,
            "peak_fp32_gflops": 66908.16, "peak_smem_gbps": 33000.0, "peak_l2_gbps": float("nan"),
            "l2_bytes": 50.0 * 2 ** 20}
    for k, v in ceil.items():
        df[k] = df["peak_mem_gbps"].where(~gpu, v).where(gpu)
    df["working_set_bytes"] = df["bytes"]
    fits = (df["working_set_bytes"] <= df["l2_bytes"])
    df["memory_level"] = fits.map({True: "l2", False: "dram"}).where(gpu, "")
    level_ceiling = df["memory_level"].map({"l2": 9000.0, "dram": 3000.0})
    df["pct_ceil_gbps"] = 100 * df["gbps"] / level_ceiling
    df["pct_ceil_gflops"] = 100 * df["gflops"] / df["ceil_fp32_gflops"]
    df["suspect"] = (df["pct_ceil_gbps"] > 100) | (df["pct_ceil_gflops"] > 100)
    naive = df["variant"] == "naive"
    df["m_ncu_status"] = naive.map({True: "ok", False: "not profiled: not selected"})
    df["m_ncu_l2_hit_rate_pct"] = df["variant"].map({"naive": 91.0})
    return df


@pytest.mark.slow
def test_report_from_a_table_with_every_new_column(tmp_path):
    df = _with_new_columns(results.read_table(REFERENCE_HTML.parent / "results.csv"))
    df = df[df["experiment"].isin(["matmul", "coalescing", "vector_add", "device_query"])]
    df = roofline.annotate(df)  # as aggregate would
    config = cfg.validate({"experiments": {"matmul": {}, "coalescing": {}, "vector_add": {}}})
    ctx = report.build_context(df, tmp_path, config)
    assert ctx["roofline"]["measured"]
    rows = {r["level"].split(" ")[0]: r for r in ctx["roofline"]["ceilings"]}
    assert rows["DRAM"]["measured"] == fmt.bandwidth(3000)
    assert rows["L2"]["measured"] == fmt.bandwidth(9000)
    # against its level: the L2-resident transpose is no longer suspect, DRAM copies above
    # the (made-up) 3,000 GB/s are
    flagged = {d["point_id"] for d in ctx["roofline"]["distrust"]}
    assert "transpose_padded-size2048" not in flagged
    assert flagged == set(df.loc[df["suspect"], "point_id"])
    run_figures.draw(df, tmp_path / "results", tmp_path)
    page = report.render(df, tmp_path, config, tmp_path / "r.html").read_text()
    assert "<th>% ceiling of level</th>" in page and "<th>% of its FLOP roof</th>" in page
    assert "Solid lines: ceilings measured on this GPU" in page
    assert "Nsight Compute: L2 hit rate 91 %" in page  # the naive kernel's claim
    assert (f"measured DRAM ceiling {fmt.bandwidth(3000)} could feed at 4 bytes per flop "
            f"({fmt.flop_rate(750)})") in page


@pytest.mark.slow
def test_a_contradicted_caption_claim_is_shown_under_the_caption(tmp_path):
    df = results.read_table(OLD_TABLE)
    df = df[df["experiment"].isin(["sobel", "device_query"])].copy()
    config = cfg.validate({"experiments": {"sobel": {}}})
    far = "contradicts the lesson:</b> <span class=\"claim-statement\">far from"
    page = report.render(df, tmp_path, config, tmp_path / "r.html").read_text()
    assert far not in page  # 18 % of DRAM: far from it, as claimed
    df["gbps"] = df["gbps"] * 4  # now close to the bandwidth: the claim fails
    page = report.render(df, tmp_path, config, tmp_path / "r.html").read_text()
    sobel = page[page.index('<section id="sobel"'):]
    warn = sobel.index(far)
    assert sobel.index('<p class="caption prose"') < warn
    assert f"of the theoretical DRAM ceiling {fmt.bandwidth(3352.32)}" in sobel[warn:warn + 500]


def test_a_report_drawn_again_reads_the_runs_own_config(tmp_path, monkeypatch):
    """`cudalab report` without --config describes the run (its folder's config.json), not
    whatever config.yaml says today; --config still wins."""
    from cudalab.cli import run_config_path

    monkeypatch.chdir(tmp_path)
    assert run_config_path(None, tmp_path / "results") == "config.yaml"
    (tmp_path / "results").mkdir()
    (tmp_path / "results" / "config.json").write_text("{}")
    assert run_config_path(None, tmp_path / "results") == str(tmp_path / "results" /
                                                              "config.json")
    assert run_config_path("mine.yaml", tmp_path / "results") == "mine.yaml"
    # an older stored run (a committed reference) kept report-config.yaml
    (tmp_path / "old").mkdir()
    (tmp_path / "old" / "report-config.yaml").write_text("run_name: old\n")
    assert run_config_path(None, tmp_path / "old") == str(tmp_path / "old" /
                                                          "report-config.yaml")
