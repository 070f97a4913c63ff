"""The slides' one-file HTML deck: a cover, what held of the course on this GPU, then per
lesson its title, its slide figure and its headline claim with the mark the report gives it.

Everything it says about the run comes from the run's claims.json (cudalab/claims_file.py):
the headline claim, its state and evidence, and the course table's verdicts. Nothing here
judges a claim. At 1920×1080 no text is under MIN_PX (the base font is 1/48 of the slide's
width, 40 px; the smallest text 0.7 of it), and the slide figures' own text is sized so that
it too stays above MIN_PX once the figure is scaled into its box (slides.MIN_PT).
"""

from __future__ import annotations

import html
from pathlib import Path
from typing import Any

from cudalab.embed import data_uri
from cudalab.experiments import REGISTRY
from cudalab.experiments.lesson import ClaimResult
from cudalab.results import atomic_path
from cudalab.run_claims import RunClaims

DECK = "index.html"
MIN_PX = 28  # at 1920×1080: readable from the back of a classroom
# the course slide: at most this many lessons (a table of 28 px rows that fits one slide),
# the ones that did not hold first
COURSE_ROWS = 8
# which course rows matter most: those whose effect this GPU does not show teach the most
_VERDICT_RANK = {"not reproduced": 0, "partly": 1, "reproduced": 2}
MARK = {"seen": "✔", "not seen": "✘", "not measured": "not measured",
        "not applicable": "not applicable"}
VERDICT_MARK = {"reproduced": "✔ reproduced", "partly": "◐ partly",
                "not reproduced": "✘ not reproduced", "not measured": "not measured"}

_CSS = """
:root { --w: min(100vw, 177.778vh); }
html, body { margin: 0; height: 100%; background: #1b1b1b; }
body { display: flex; align-items: center; justify-content: center;
  font-family: "DejaVu Sans", system-ui, sans-serif; }
.slide { display: none; position: relative; box-sizing: border-box; width: var(--w);
  height: calc(var(--w) * 0.5625); padding: calc(var(--w) * 0.02) calc(var(--w) * 0.03);
  background: #fff; color: #111; flex-direction: column; overflow: hidden;
  font-size: calc(var(--w) / 48); }
.slide.current { display: flex; }
.slide h1 { font-size: 1em; line-height: 1.15; margin: 0 0 0.2em; flex: none; }
.claim, .evidence, .course-note { flex: none; }
.cover { justify-content: center; }
.cover h1 { font-size: 2em; }
.cover p { font-size: 1em; margin: 0.3em 0; }
.figure { flex: 1 1 auto; min-height: 0; display: flex; justify-content: center; }
.figure img { max-width: 100%; max-height: 100%; object-fit: contain; }
.claim { margin: 0.25em 0 0; font-size: 0.75em; line-height: 1.25; }
.state { font-weight: bold; white-space: nowrap; margin-right: 0.4em; }
.seen, .reproduced { color: #1a7f37; } .not-seen, .not-reproduced { color: #c0392b; }
.partly { color: #9a6700; }
.not-measured, .not-applicable { color: #555; }
.evidence { margin: 0.1em 0 0; font-size: 0.7em; color: #333; line-height: 1.25;
  display: -webkit-box; -webkit-line-clamp: 2; -webkit-box-orient: vertical;
  overflow: hidden; }
.course { border-collapse: collapse; font-size: 0.7em; line-height: 1.2; width: 100%; }
.course th, .course td { text-align: left; padding: 0.15em 0.5em; border-bottom: 1px solid #ccc;
  vertical-align: top; }
.course td.num { white-space: nowrap; }
.course-note { font-size: 0.7em; color: #333; margin: 0.4em 0 0; }
.number { position: absolute; right: 1em; bottom: 0.4em; font-size: 0.7em; color: #666; }
@page { size: 13.333in 7.5in; margin: 0; }
@media print {
  :root { --w: 13.333in; }
  html, body { height: auto; background: #fff; display: block; }
  .slide { display: flex; break-after: page; page-break-after: always; }
  .slide:last-child { break-after: auto; page-break-after: auto; }
  .hint { display: none; }
}
"""

# Arrow keys, space, Page Up/Down, Home/End and a click move between slides; #3 opens the
# third (a reload keeps the place).
_JS = """
(function () {
  var slides = Array.prototype.slice.call(document.querySelectorAll('.slide'));
  var i = 0;
  function show(n) {
    i = Math.max(0, Math.min(slides.length - 1, n));
    slides.forEach(function (s, k) { s.classList.toggle('current', k === i); });
    try { history.replaceState(null, '', '#' + (i + 1)); } catch (e) {}
  }
  var next = ['ArrowRight', 'ArrowDown', 'PageDown', ' ', 'Enter'];
  var prev = ['ArrowLeft', 'ArrowUp', 'PageUp', 'Backspace'];
  document.addEventListener('keydown', function (e) {
    if (next.indexOf(e.key) >= 0) { show(i + 1); }
    else if (prev.indexOf(e.key) >= 0) { show(i - 1); }
    else if (e.key === 'Home') { show(0); }
    else if (e.key === 'End') { show(slides.length - 1); }
    else { return; }
    e.preventDefault();
  });
  document.addEventListener('click', function (e) {
    show(e.clientX < window.innerWidth / 3 ? i - 1 : i + 1);
  });
  var n = parseInt(location.hash.slice(1), 10);
  show(isNaN(n) ? 0 : n - 1);
})();
"""

_e = html.escape


def claim_html(c: ClaimResult | None) -> str:
    """The headline claim under a slide's figure: its mark (the report's state), its words
    and the numbers that judged it."""
    if c is None:
        return '<p class="claim">This lesson states no claim to check on the data.</p>'
    state = c.state.value
    return (f'<p class="claim"><span class="state {_e(state.replace(" ", "-"))}" '
            f'data-state="{_e(state)}" data-key="{_e(c.key)}">{_e(MARK[state])}</span>'
            f'{_e(c.statement)}</p><p class="evidence">{_e(c.evidence)}</p>')


def course_rows(judged: RunClaims, limit: int = COURSE_ROWS) -> list[dict[str, Any]]:
    """The course rows the slide shows: lesson rows this run measured, those whose effect
    this GPU does not show first, at most `limit`, then in the course's order."""
    measured = [(k, r) for k, r in enumerate(judged.course)
                if r["kind"] == "lesson" and r["verdict"]
                and r["verdict"]["state"] in _VERDICT_RANK]
    picked = sorted(measured, key=lambda kr: (_VERDICT_RANK[kr[1]["verdict"]["state"]],
                                              kr[0]))[:limit]
    return [r for _, r in sorted(picked, key=lambda kr: kr[0])]


def course_source(course_gpu: str) -> str:
    """Where a course number not measured on the K80 comes from, in a word or two for the
    slide's course column ('' for the K80's, which the column header names)."""
    if course_gpu == "Tesla K80" or course_gpu.startswith("Tesla K80,"):
        return ""
    return " (slides)" if "slides" in course_gpu else " (older GPU)"


def _course_slide(judged: RunClaims, gpu: str) -> str:
    rows = course_rows(judged)
    lessons = [r for r in judged.course if r["kind"] == "lesson" and r["verdict"]]
    counts = {v: sum(r["verdict"]["state"] == v for r in lessons) for v in VERDICT_MARK}
    body = "".join(
        f'<tr><td>{_e(r["lesson"])}</td><td class="num">{_e(r["text"]["course_q"])}'
        f'{_e(course_source(r["course_gpu"]))}</td>'
        f'<td class="num">{_e(r["text"]["this_q"])}</td>'
        f'<td class="num"><span class="state {_e(r["verdict"]["state"].replace(" ", "-"))}" '
        f'data-state="{_e(r["verdict"]["state"])}">'
        f'{_e(VERDICT_MARK[r["verdict"]["state"]])}</span></td></tr>' for r in rows)
    summary = ", ".join(f"{n} {v}" for v, n in counts.items() if n)
    table = (f'<table class="course"><thead><tr><th>course lesson</th><th>course (K80)</th>'
             f"<th>{_e(gpu)}</th><th>does this GPU show it?</th></tr></thead>"
             f"<tbody>{body}</tbody></table>" if rows else
             '<p class="claim">This run measured none of the course\'s numbers.</p>')
    where = f"on {_e(gpu)}" if judged.gpu else "(this run had no GPU)"
    return (f'<section class="slide course-slide" id="course"><h1>What held of the course '
            f"{where}</h1>{table}<p class=\"course-note\">{len(lessons)} course "
            f"measurements: {_e(summary or 'none measured')}. The report's course table "
            "has every row, with why they differ.</p>")


def deck_html(judged: RunClaims, names: list[str], folder: Path) -> str:
    """The deck: a cover, the course slide, then per lesson its title, its slide
    (folder/<name>.png, embedded) and its headline claim as the run's claims.json judged it."""
    gpu = judged.gpu or "no GPU"
    total = len(names) + 2
    measured = f"measured on {_e(gpu)}" if judged.gpu else "a run without a GPU"
    parts = [f'<section class="slide cover"><h1>The CUDA course, {measured}</h1>'
             f"<p>{len(names)} lessons, one slide each, from this run's results.</p>"
             '<p class="hint">→, space or a click: next slide; ←: back; '
             "print: one slide per page.</p>"
             f'<span class="number">1 / {total}</span></section>',
             _course_slide(judged, gpu) + f'<span class="number">2 / {total}</span></section>']
    for k, name in enumerate(names, start=3):
        title = REGISTRY[name].lesson.title
        img = data_uri(folder / f"{name}.png")
        parts.append(
            f'<section class="slide lesson" id="{_e(name)}"><h1>{_e(title)}</h1>'
            f'<div class="figure"><img src="{img}" alt="{_e(title)}"></div>'
            f"{claim_html(judged.headline(name))}"
            f'<span class="number">{k} / {total}</span></section>')
    return ("<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">"
            "<meta name=\"viewport\" content=\"width=device-width, initial-scale=1\">"
            f"<title>cudalab slides: {_e(gpu)}</title><style>{_CSS}</style>"
            "<noscript><style>.slide { display: flex; margin: 0 auto 1em; }</style></noscript>"
            f"</head><body>{''.join(parts)}<script>{_JS}</script></body></html>\n")


def write_deck(judged: RunClaims, names: list[str], out: Path) -> Path:
    """out/index.html from the slides already in out/ (out/<name>.png)."""
    deck = out / DECK
    with atomic_path(deck) as tmp:
        tmp.write_text(deck_html(judged, names, out), encoding="utf-8")
    return deck
