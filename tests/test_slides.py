"""Slides from the H100 reference table, drawn with real matplotlib: 1920×1080, one panel,
no text under 20 pt, no text colliding; the deck in headless Chromium."""

from __future__ import annotations

import dataclasses
import re
import xml.etree.ElementTree as ET
from pathlib import Path
from typing import Any

import pytest
from browser import chromium

from cudalab import claims, figcheck, results, slides
from cudalab.experiments import REGISTRY

ROOT = Path(__file__).resolve().parent.parent
REFERENCE = ROOT / "reports" / "reference" / "NVIDIA-H100-80GB-HBM3" / "results.csv"
CHROMIUM_ARGS = ["--no-sandbox", "--disable-gpu", "--disable-background-networking",
                 "--disable-component-update", "--disable-sync", "--no-first-run"]


@pytest.fixture(scope="module")
def ref():
    assert REFERENCE.is_file()
    return results.read_table(REFERENCE)


def _names(df) -> list[str]:
    return [n for n in slides.experiments_with_slides() if (df["experiment"] == n).any()]


def _facts(fig: Any) -> dict[str, Any]:
    """What a slide test reads of a figure before it is saved and closed."""
    from matplotlib.text import Text

    panels = slides._panels(fig)
    host = panels[0] if panels else None
    # a twin shares its panel's place; a colour bar belongs to its panel
    extra = [a for a in fig.axes if a is not host and getattr(a, "_colorbar", None) is None
             and a.get_position().bounds != host.get_position().bounds]
    sizes = [t.get_fontsize() for t in fig.findobj(Text) if t.get_text().strip()]
    return {"px": tuple(round(v * fig.dpi) for v in fig.get_size_inches()),
            "panels": len(panels), "extra": len(extra), "min_pt": min(sizes),
            "n_texts": len(sizes), "problems": figcheck.problems(fig)}


@pytest.fixture(scope="module")
def built(ref, tmp_path_factory):
    """Every reference lesson's slide: its facts, then the files and the deck."""
    out = tmp_path_factory.mktemp("slides")
    facts = {}
    names = _names(ref)
    for name in names:
        fig = slides.slide(name, ref)
        facts[name] = _facts(fig)
        slides.save(fig, out / name)
    deck = slides.write_deck(ref, names, out)
    return out, facts, deck


def test_the_reference_has_at_least_ten_lessons_with_a_figure(ref):
    assert len(_names(ref)) >= 10


@pytest.mark.parametrize("name", [n for n, e in REGISTRY.items() if e.lesson.figures])
@pytest.mark.slow
def test_a_slide_is_1920x1080_with_one_panel_and_20_pt_text(built, name):
    out, facts, _ = built
    if name not in facts:
        pytest.skip(f"{name} is not in the reference run")
    f = facts[name]
    assert f["px"] == (1920, 1080)
    assert f["panels"] == 1 and f["extra"] == 0, f
    assert f["n_texts"] > 3 and f["min_pt"] >= slides.MIN_PT, f
    assert f["problems"] == [], f["problems"]


@pytest.mark.parametrize("name", [n for n, e in REGISTRY.items() if e.lesson.figures])
@pytest.mark.slow
def test_png_and_svg_are_written_and_valid(built, name):
    from PIL import Image

    out, facts, _ = built
    if name not in facts:
        pytest.skip(f"{name} is not in the reference run")
    with Image.open(out / f"{name}.png") as im:
        im.verify()
    with Image.open(out / f"{name}.png") as im:
        assert im.format == "PNG" and im.size == (1920, 1080)
        assert len(im.convert("L").getcolors(maxcolors=1 << 20) or []) > 10  # not blank
    svg = ET.parse(out / f"{name}.svg").getroot()
    assert svg.tag.endswith("svg")
    w, h = (float(re.sub(r"[a-z]+$", "", svg.get(k))) for k in ("width", "height"))
    assert abs(w / h - 16 / 9) < 1e-3


def test_the_lesson_s_slide_figure_picks_the_figure_and_panel(ref, monkeypatch):
    exp = REGISTRY["sobel"]
    monkeypatch.setattr(exp, "lesson", dataclasses.replace(exp.lesson, slide_figure=("gbps", -1)))
    fig = slides.slide("sobel", ref)
    title = slides._panels(fig)[0].get_title()
    sizes = sorted(set(ref.loc[ref["experiment"] == "sobel", "p_width"].dropna().astype(int)))
    assert f"{sizes[-1]}x{sizes[-1]}" in title.replace("\n", " ")
    assert slides.slide_choice("matmul") == (next(iter(REGISTRY["matmul"].lesson.figures)), 0)


def test_a_lesson_without_data_gets_a_slide_that_says_so(ref):
    fig = slides.slide("sobel", ref[ref["experiment"] != "sobel"])
    f = _facts(fig)
    assert f["px"] == (1920, 1080) and f["min_pt"] >= slides.MIN_PT
    texts = [t.get_text() for t in fig.findobj(lambda a: hasattr(a, "get_text"))]
    assert any("no data" in t for t in texts)


@pytest.mark.slow
def test_the_deck_is_one_file_with_one_slide_per_lesson(built, ref):
    out, facts, deck = built
    page = deck.read_text()
    sections = re.findall(r'<section class="slide"', page)
    assert len(sections) == len(facts)
    assert page.count("data:image/png;base64,") == len(facts)
    assert not re.search(r'(src|href)="(?!data:|#)', page)  # nothing outside the file
    for name in facts:
        assert REGISTRY[name].lesson.title.split(":")[0] in page
    assert page.count('class="claim"') == len(facts)


def test_a_slide_states_the_lesson_s_point_not_its_correctness_check(ref):
    h = slides.headline("vector_add", ref)
    assert h is not None and h.state in {"seen", "not seen", "not measured", "not applicable"}
    keys = [c.key for c in claims.evaluate("vector_add", ref)]
    assert keys[0] == "correct"  # every lesson opens with it: a precondition, not the point
    point = next(c for c in claims.evaluate("vector_add", ref) if c.key != "correct")
    assert h.statement == point.statement


CURRENT_JS = """() => {
  const s = Array.from(document.querySelectorAll('.slide'));
  const shown = s.filter(e => getComputedStyle(e).display !== 'none');
  const r = shown[0].getBoundingClientRect();
  const img = shown[0].querySelector('img');
  return {index: s.indexOf(shown[0]), shown: shown.length, w: r.width, h: r.height,
          img: img ? {ok: img.complete, w: img.naturalWidth, h: img.naturalHeight,
                      shownW: img.getBoundingClientRect().width} : null,
          overflow: document.documentElement.scrollWidth > innerWidth
                    || document.documentElement.scrollHeight > innerHeight};
}"""


@pytest.mark.browser
def test_the_deck_presents_in_headless_chromium(built, tmp_path):
    exe, sync_playwright = chromium()
    _, facts, deck = built
    errors: list[str] = []
    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=exe, args=CHROMIUM_ARGS)
        page = browser.new_page(viewport={"width": 1280, "height": 720})
        page.on("console", lambda m: errors.append(m.text) if m.type == "error" else None)
        page.on("pageerror", lambda e: errors.append(str(e)))
        page.goto(deck.as_uri(), wait_until="load")
        seen = [page.evaluate(CURRENT_JS)]
        for key in ["ArrowRight", "Space", *["ArrowRight"] * (len(facts) - 1), "ArrowLeft"]:
            page.keyboard.press(key)
            seen.append(page.evaluate(CURRENT_JS))
        page.screenshot(path=str(tmp_path / "slide.png"))
        page.keyboard.press("Home")
        first = page.evaluate(CURRENT_JS)
        pdf = page.pdf(prefer_css_page_size=True, print_background=True)
        browser.close()
    assert errors == []
    assert [s["index"] for s in seen] == [*range(len(facts) + 1), len(facts), len(facts) - 1]
    assert first["index"] == 0
    for s in seen:  # one 16:9 slide filling the 1280×720 window, nothing to scroll
        assert s["shown"] == 1 and (s["w"], s["h"]) == (1280, 720) and not s["overflow"], s
    for s in seen[1:-2]:
        assert s["img"]["ok"] and (s["img"]["w"], s["img"]["h"]) == (1920, 1080), s
        assert s["img"]["shownW"] >= 800, s  # the figure takes most of the slide
    pages = re.findall(rb"/Type\s*/Page\b", pdf)
    assert len(pages) == len(facts) + 1  # print: one slide per page, the cover included


@pytest.mark.browser
def test_the_deck_screenshots_with_the_chromium_command_line(built, tmp_path):
    """As a teacher would check it: chromium --headless --screenshot at 1280×720."""
    import subprocess

    from PIL import Image

    exe, _ = chromium()
    _, _, deck = built
    shot = tmp_path / "deck.png"
    subprocess.run([exe, "--headless", *CHROMIUM_ARGS, "--hide-scrollbars",
                    "--window-size=1280,720", f"--screenshot={shot}", f"{deck.as_uri()}#2"],
                   check=True, capture_output=True, timeout=120)
    with Image.open(shot) as im:
        assert im.size == (1280, 720)
        # the second slide (a figure) is shown: far more colours than the cover's text
        assert len(im.convert("RGB").getcolors(maxcolors=1 << 20) or []) > 200
