"""Slides from the H100 reference table, drawn with real matplotlib: 1920×1080, one panel,
no text under MIN_PT, no text colliding; the deck in headless Chromium: no text under 28 px at
1920×1080, on the slide or in its figure, and each slide's mark the state claims.json holds."""

from __future__ import annotations

import dataclasses
import html
import re
import xml.etree.ElementTree as ET
from pathlib import Path
from typing import Any

import pandas as pd
import pytest
from browser import chromium

from cudalab import claims, claims_file, figcheck, results, roofline, slide_deck, slides
from cudalab.experiments import REGISTRY

ROOT = Path(__file__).resolve().parent.parent
REFERENCE = ROOT / "reports" / "reference" / "NVIDIA-H100-80GB-HBM3" / "results.csv"
CHROMIUM_ARGS = ["--no-sandbox", "--disable-gpu", "--disable-background-networking",
                 "--disable-component-update", "--disable-sync", "--no-first-run"]


@pytest.fixture(scope="module")
def ref():
    assert REFERENCE.is_file()
    return roofline.load_table(REFERENCE)


@pytest.fixture(scope="module")
def judged(ref):
    """The reference's claims.json as aggregate would write it (the reference has none)."""
    return claims_file.judge_run(ref, REFERENCE)


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
def built(ref, judged, tmp_path_factory):
    """Every reference lesson's slide: its facts, then the files and the deck."""
    out = tmp_path_factory.mktemp("slides")
    facts = {}
    names = _names(ref)
    for name in names:
        fig = slides.slide(name, ref, judged)
        facts[name] = _facts(fig)
        slides.save(fig, out / name)
    deck = slide_deck.write_deck(judged, names, out)
    return out, facts, deck


def test_the_reference_has_at_least_ten_lessons_with_a_figure(ref):
    assert len(_names(ref)) >= 10


@pytest.mark.parametrize("name", [n for n, e in REGISTRY.items() if e.lesson.figures])
@pytest.mark.slow
def test_a_slide_is_1920x1080_with_one_panel_and_min_pt_text(built, name):
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


def test_a_slide_shows_the_figure_its_headline_claim_is_about(ref, judged):
    """Sobel's headline is about the largest image: its slide is that panel, not 512²."""
    assert judged.headline("sobel").key == "far_from_bandwidth"
    assert slides.slide_choice("sobel", judged) == ("gbps", -1)
    fig = slides.slide("sobel", ref, judged)
    title = slides._panels(fig)[0].get_title().replace("\n", " ")
    widths = ref.loc[ref["experiment"] == "sobel", "p_width"].dropna().astype(int)
    assert f"{widths.max()}x{widths.max()}" in title and f"{widths.min()}x" not in title


def test_headlines_are_lessons_not_checks_of_the_tool(judged):
    """A slide states the lesson's point: never the correctness check, a Claim(tool=True),
    nor a lesson's "it compiles"."""
    for name in judged.doc["lessons"]:
        head = judged.headline(name)
        if head is None:
            continue
        entry = next(c for c in judged.doc["lessons"][name]["claims"] if c["key"] == head.key)
        assert head.key != claims.CORRECTNESS_KEY and not entry["tool"], name
    assert judged.headline("static_analysis").key == "registers_per_arch"
    assert judged.headline("atomics").key == "racy_loses"


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
    sections = re.findall(r'<section class="slide lesson"', page)
    assert len(sections) == len(facts)
    assert page.count("data:image/png;base64,") == len(facts)
    assert not re.search(r'(src|href)="(?!data:|#)', page)  # nothing outside the file
    for name in facts:
        assert REGISTRY[name].lesson.title.split(":")[0] in page
    assert page.count('class="claim"') == len(facts)


def test_a_slide_states_the_lesson_s_point_not_its_correctness_check(ref, judged):
    h = judged.headline("vector_add")
    assert h is not None and h.state.value in {"seen", "not seen", "not measured",
                                               "not applicable"}
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
        for key in ["ArrowRight", "Space", *["ArrowRight"] * len(facts), "ArrowLeft"]:
            page.keyboard.press(key)
            seen.append(page.evaluate(CURRENT_JS))
        page.screenshot(path=str(tmp_path / "slide.png"))
        page.keyboard.press("Home")
        first = page.evaluate(CURRENT_JS)
        pdf = page.pdf(prefer_css_page_size=True, print_background=True)
        browser.close()
    assert errors == []
    last = len(facts) + 1  # the cover, the course slide, one slide per lesson
    assert [s["index"] for s in seen] == [*range(last + 1), last, last - 1]
    assert first["index"] == 0
    for s in seen:  # one 16:9 slide filling the 1280×720 window, nothing to scroll
        assert s["shown"] == 1 and (s["w"], s["h"]) == (1280, 720) and not s["overflow"], s
    for s in seen[2:-2]:
        assert s["img"]["ok"] and (s["img"]["w"], s["img"]["h"]) == (1920, 1080), s
        assert s["img"]["shownW"] >= 800, s  # the figure takes most of the slide
    pages = re.findall(rb"/Type\s*/Page\b", pdf)
    assert len(pages) == last + 1  # print: one slide per page, the cover included


@pytest.mark.browser
def test_the_deck_screenshots_with_the_chromium_command_line(built, tmp_path):
    """As a teacher would check it: chromium --headless --screenshot at 1280×720."""
    import subprocess

    from PIL import Image

    exe, _ = chromium()
    _, _, deck = built
    shot = tmp_path / "deck.png"
    subprocess.run([exe, "--headless", *CHROMIUM_ARGS, "--hide-scrollbars",
                    "--window-size=1280,720", f"--screenshot={shot}", f"{deck.as_uri()}#3"],
                   check=True, capture_output=True, timeout=120)
    with Image.open(shot) as im:
        assert im.size == (1280, 720)
        # the third slide (a lesson's figure) is shown: far more colours than text alone
        assert len(im.convert("RGB").getcolors(maxcolors=1 << 20) or []) > 200


# -- legible from the back of the room, and the report's verdicts -----------------------------
SLIDE_TEXT_JS = """() => {
  const slide = document.querySelector('.slide.current');
  const texts = [];
  const walk = document.createTreeWalker(slide, NodeFilter.SHOW_TEXT);
  while (walk.nextNode()) {
    const el = walk.currentNode.parentElement;
    const r = el.getBoundingClientRect();
    if (!walk.currentNode.textContent.trim() || r.width === 0 || r.height === 0) continue;
    texts.push({text: walk.currentNode.textContent.trim().slice(0, 40),
                px: parseFloat(getComputedStyle(el).fontSize)});
  }
  const img = slide.querySelector('img');
  const marks = Array.from(slide.querySelectorAll('.state')).map(
    m => ({state: m.dataset.state, key: m.dataset.key || '', text: m.textContent}));
  return {id: slide.id, texts: texts, marks: marks,
          scale: img ? img.getBoundingClientRect().width / img.naturalWidth : null};
}"""


def _walk_deck(deck: Path, n_slides: int) -> list[dict[str, Any]]:
    """Every slide of the deck as headless Chromium shows it at 1920×1080."""
    exe, sync_playwright = chromium()
    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=exe, args=CHROMIUM_ARGS)
        page = browser.new_page(viewport={"width": 1920, "height": 1080})
        page.goto(deck.as_uri(), wait_until="load")
        seen = []
        for _ in range(n_slides):
            seen.append(page.evaluate(SLIDE_TEXT_JS))
            page.keyboard.press("ArrowRight")
        browser.close()
    return seen


def svg_text_px(svg: Path) -> list[float]:
    """The size of every text of a slide's SVG in pixels of its 1920 px PNG (the SVG keeps
    text as text: its font-size is in the SVG's units, points at 72 per inch)."""
    root = ET.parse(svg).getroot()
    width_units = float(root.get("viewBox").split()[2])
    sizes = []
    ns = "{http://www.w3.org/2000/svg}"
    for el in root.iter(f"{ns}text"):
        # a text's own size, or each of its spans' (mathtext: an exponent is a smaller span)
        styles = [el.get("style", "")] if el.get("style") else [
            t.get("style", "") for t in el.iter(f"{ns}tspan")]
        for style in styles:
            found = re.search(r"font(?:-size)?:\s*([\d.]+)px", style)
            assert found, el.attrib  # every text states its size
            sizes.append(float(found.group(1)) * slides.WIDTH_IN * slides.DPI / width_units)
    return sizes


@pytest.mark.browser
@pytest.mark.slow
def test_no_text_under_28_px_at_1920x1080_on_a_slide_or_in_its_figure(built):
    out, facts, deck = built
    shown = _walk_deck(deck, len(facts) + 2)
    assert [s["id"] for s in shown[2:]] == list(facts)
    for s in shown:
        small = [t for t in s["texts"] if t["px"] < slide_deck.MIN_PX]
        assert s["texts"] and not small, (s["id"], small)
    for s in shown[2:]:  # a lesson: its figure's text as the deck scales the figure
        px = svg_text_px(out / f"{s['id']}.svg")
        assert len(px) > 3 and 0.5 < s["scale"] < 1, s["scale"]
        assert min(px) * s["scale"] >= slide_deck.MIN_PX, (s["id"], min(px), s["scale"])


def _flipped_run(ref: Any, folder: Path, name: str) -> Path:
    """A run folder whose table is the reference with `name`'s headline claim turned over by
    that claim's own flip (its judge then says not seen)."""
    head = claims.headline(name, ref)
    claim = next(c for c in claims.lesson_claims(REGISTRY[name]) if c.name == head.key)
    rows = ref["experiment"] == name
    table = folder / "results.csv"
    flipped = pd.concat([ref[~rows], claim.flip(ref[rows].copy())], ignore_index=True)
    results.write_table(results.conform(flipped), table)
    return table


@pytest.mark.browser
@pytest.mark.slow
def test_each_slide_s_mark_is_the_state_claims_json_holds(ref, tmp_path):
    """✔, ✘ or not measured: what the run's claims.json says (a claim this run's data turns
    over shows ✘; a state changed in the file shows as the file says: the deck judges
    nothing itself)."""
    import json

    from cudalab.cli import main

    table = _flipped_run(ref, tmp_path, "vector_add")
    assert main(["claims", "--table", str(table)]) == 0
    path = tmp_path / claims_file.FILE
    doc = json.loads(path.read_text())
    head = doc["lessons"]["vector_add"]["headline"]
    assert next(c for c in doc["lessons"]["vector_add"]["claims"]
                if c["key"] == head)["state"] == "not seen"
    key = doc["lessons"]["transfer"]["headline"]
    for c in doc["lessons"]["transfer"]["claims"]:
        if c["key"] == key:
            c.update(state="not measured", evidence="edited: the deck must read the file")
    path.write_text(json.dumps(doc))
    names = ["vector_add", "transfer", "sobel"]
    assert main(["slides", "--table", str(table), "--out", str(tmp_path / "slides"),
                 "--experiments", *names]) == 0
    shown = _walk_deck(tmp_path / "slides" / slide_deck.DECK, len(names) + 2)
    marks = {s["id"]: s["marks"] for s in shown[2:]}
    want = {n: next(c for c in doc["lessons"][n]["claims"]
                    if c["key"] == doc["lessons"][n]["headline"]) for n in names}
    for n in names:
        [mark] = marks[n]
        assert (mark["key"], mark["state"]) == (want[n]["key"], want[n]["state"]), n
        assert mark["text"] == slide_deck.MARK[want[n]["state"]], n
    assert [marks[n][0]["text"] for n in names] == ["✘", "not measured", "✔"]
    course = shown[1]["marks"]  # the course slide: the verdicts claims.json holds
    rows = slide_deck.course_rows(claims_file.read(path, table))
    assert [m["state"] for m in course] == [r["verdict"]["state"] for r in rows]
    assert 0 < len(course) <= slide_deck.COURSE_ROWS


def test_the_course_slide_shows_the_lessons_that_did_not_hold_first(judged):
    rows = slide_deck.course_rows(judged, limit=3)
    lessons = [r for r in judged.course if r["kind"] == "lesson" and r["verdict"]]
    states = [r["verdict"]["state"] for r in lessons]
    ranked = sorted(states, key=lambda s: slide_deck._VERDICT_RANK.get(s, 9))[:3]
    assert sorted(r["verdict"]["state"] for r in rows) == sorted(ranked)
    order = [judged.course.index(r) for r in rows]
    assert order == sorted(order)  # shown in the course's order
    assert all(r["kind"] == "lesson" for r in rows)  # no property of the GPU, no self-test


def test_the_course_slide_names_numbers_not_measured_on_the_k80(judged):
    """The course column is headed K80; a number from the course's slides or an older GPU
    says where it comes from (the latency rows are the slides' ~5 cycles)."""
    page = slide_deck._course_slide(judged, judged.gpu or "no GPU")
    rows = slide_deck.course_rows(judged)
    assert {r["course_gpu"] for r in rows} - {"Tesla K80"}, "no row to check"
    for r in rows:
        cell = html.escape(r["text"]["course_q"] + slide_deck.course_source(r["course_gpu"]))
        assert f'<td class="num">{cell}</td>' in page, cell
        assert (slide_deck.course_source(r["course_gpu"]) == "") == r["course_gpu"].startswith(
            "Tesla K80"), r["course_gpu"]


def test_a_run_without_a_gpu_says_not_measured_on_every_slide(ref, tmp_path):
    """Every point left out (no GPU): every mark reads "not measured", never ✔ or ✘, and the
    course slide says the run measured none of the course's numbers."""
    none = ref.assign(status="not_measured", gpu_name=pd.NA)
    judged = claims_file.judge_run(none)
    names = ["vector_add", "sobel"]
    for name in names:
        (tmp_path / f"{name}.png").write_bytes(b"\x89PNG\r\n\x1a\n")  # the deck embeds it
    page = slide_deck.deck_html(judged, names, tmp_path)
    marks = re.findall(r'data-state="([^"]+)" data-key="[^"]*">([^<]+)<', page)
    assert marks == [("not measured", "not measured")] * len(names)
    assert "measured none of the course" in page and "this run had no GPU" in page
