"""The audit of what the report says about a run.

- Every claim of every lesson carries a flip, and the flip turns its verdict over on a
  committed reference (H100, H200): seen <-> not seen (claims.flip_audit). A claim whose
  check gives the same answer on the data and on its flipped data could not fail: the
  audit fails it (a planted always-true claim shows it does).
- No prose (captions, figure captions, Try-this, questions, the course table's hypotheses)
  states a measured number: every number a sentence holds about a run comes from a claim
  or a fact. A number in prose is a static fact with its source (ALLOWED, or a lesson's
  `sources`), or a value of the config (Try-this's config change is code, not prose).
- The committed references and a GPU-less run of the default config judge every claim
  without an error, and the GPU-less run judges none of them seen or not seen.
"""

from __future__ import annotations

import re
from html.parser import HTMLParser
from pathlib import Path

import cause_data
import pandas as pd
import pytest

from cudalab import claims, config, report, results, roofline, run_claims
from cudalab.experiments import REGISTRY
from cudalab.experiments.base import Experiment
from cudalab.experiments.lesson import Claim, Lesson, State

ROOT = Path(__file__).resolve().parent.parent
REFERENCES = {
    "H100": ROOT / "reports" / "reference" / "NVIDIA-H100-80GB-HBM3" / "results.csv",
    "H200": ROOT / "reports" / "reference" / "NVIDIA-H200" / "results.csv",
    # the last H100 run with Nsight Compute on: the claims that read the profiler's counters
    "H100 profiled": ROOT / "tests" / "data" / "h100_profiled_2026-11-25.csv.gz",
    # tensor_cores is off in the default grid: its own H100 run is its reference (the
    # shipped block with the wgmma rungs and Nsight Compute's operand counters)
    "H100 tensor cores": ROOT / "reports" / "reference" / "NVIDIA-H100-80GB-HBM3"
    / "tensor-cores-2026-11-27" / "results.csv",
    # the links between two H200s (cudalab.links), as the interconnect lesson's rows
    "2 H200s' links": ROOT / "reports" / "reference" / "interconnect-2xH200-2026-11-27"
    / "results.csv",
}
JUDGED = (State.SEEN, State.NOT_SEEN)

# Numbers prose may state without a claim: facts of CUDA and of every NVIDIA GPU since
# Kepler, with their source. A lesson adds its own (Lesson.sources).
ALLOWED = {
    "0": "zero", "1": "one", "2": "two", "3": "three", "4": "four (bytes of a float)",
    "8": "eight (bytes of a double)", "16": "half-warp / 16-byte vector",
    "32": "threads per warp; shared-memory banks (CUDA C++ Programming Guide)",
    "64": "64-bit", "128": "a 128-byte cache line / memory transaction",
    "1024": "the most threads per block (CUDA C++ Programming Guide, compute capability "
            "table)",
    "3.7": "the Tesla K80's compute capability, the course's GPU (NVIDIA's CUDA GPUs list)",
}
NUMBER = re.compile(r"(?<![\w^.])\d+(?:[.,\u202f\u2009 ]\d{3})*(?:\.\d+)?(?![\w.]\d)(?![\w])")


def _experiments() -> list[tuple[str, Experiment]]:
    return sorted(REGISTRY.items())


@pytest.fixture(scope="module")
def refs() -> dict[str, pd.DataFrame]:
    got = {k: results.read_table(p) for k, p in REFERENCES.items() if p.is_file()}
    # the committed references predate the cause probes: the H100 reference plus probe rows
    # from a model judges (and flips) the claims that read them
    got.update(cause_data.synthetic_references(got["H100"]))
    return got


# -- flips -----------------------------------------------------------------------------------
def test_every_claim_has_a_flip_and_no_lesson_computes_its_own_list():
    missing = [f"{n}:{c.name}" for n, e in _experiments() for c in claims.lesson_claims(e)
               if c.flip is None]
    assert not missing, f"claims without a flip: {missing}"
    older = [n for n, e in _experiments() if hasattr(e, "expectations")]
    assert not older, f"lessons that still compute their own list of claims: {older}"
    keys = [(n, c.name) for n, e in _experiments() for c in claims.lesson_claims(e)]
    assert len(keys) == len(set(keys)), "two claims of a lesson share a key"


def _cases() -> list[tuple[str, str]]:
    return [(n, c.name) for n, e in _experiments() for c in claims.lesson_claims(e)]


def _claim(name: str, key: str) -> Claim:
    return next(c for c in claims.lesson_claims(REGISTRY[name]) if c.name == key)


def _state(name: str, key: str, df: pd.DataFrame) -> claims.ClaimResult:
    got = claims.evaluate_claim(name, _claim(name, key), df)
    assert got is not None, (name, key)
    return got


# Claims of kernels that no committed reference has run yet (none now: the wgmma rungs' H100
# run is committed): their flips are shown on made-up rows in their lesson's tests. A
# reference that judges one makes this test fail until its entry goes.
AWAITING_A_RUN: set[tuple[str, str]] = set()


def no_gpu_reference_yet(refs: dict[str, pd.DataFrame], name: str) -> bool:
    """No committed reference holds a row of this lesson: a lesson added since the last GPU
    run. Its claims are flipped once a reference with it is committed; until then the test
    says so (a skip naming the lesson) rather than failing the new lesson."""
    return not any((df["experiment"] == name).any() for df in refs.values())


@pytest.mark.parametrize(("name", "key"), _cases())
def test_the_flip_turns_the_verdict_over(refs, name, key):
    if no_gpu_reference_yet(refs, name):
        pytest.skip(f"lesson {name} has no GPU reference yet: its claim {key} is flipped "
                    "once a reference run with it is committed")
    claim = _claim(name, key)
    turned = []
    for label, df in refs.items():
        judged, problem = claims.flip_audit(name, claim, df)
        if not judged:  # a reference older than the experiment, or one it leaves unjudged
            continue
        assert not problem, (label, problem)
        rows = df["experiment"] == name
        flipped = pd.concat([df[~rows], claim.flip(df[rows].copy())], ignore_index=True)
        want = _state(name, key, flipped).state
        # what the report's section renders, flipped too: on the first reference that judges
        # the claim (the rendering is the same code on every reference, and slow)
        if not turned and claim in REGISTRY[name].lesson.claims:
            rendered = {c.key: c.state for c in _section_claims(name, flipped)}
            assert rendered[key] is want, (label, key, rendered.get(key))
        turned.append(label)
    if (name, key) in AWAITING_A_RUN:
        assert not turned, f"{name}:{key} is judged on {turned}: take it out of AWAITING_A_RUN"
        return
    assert turned, f"{name}:{key} is judged on no reference: nothing shows it can fail"


def _racy(d: pd.DataFrame) -> pd.DataFrame:
    return d[d["variant"] == "racy_counter"].astype({"m_counted": float, "m_expected": float})


def _planted(judge, flip) -> Claim:
    return Claim("planted", judge, flip, "planted")


def test_the_audit_fails_a_claim_that_cannot_fail(refs):
    """A planted claim whose check passes whatever the data (and one whose flip changes
    nothing, and one without a flip) fails the audit; a real claim passes it."""
    from cudalab.experiments.lesson import judged, slower

    df = refs["H100"]
    every = lambda d: d["experiment"] == d["experiment"]  # noqa: E731 - a mask for a flip
    always = _planted(lambda d, c: judged(True, "always"), lambda d: slower(d, every, 4.0))
    got = claims.flip_audit("vector_add", always, df)
    assert got[0] and "cannot fail" in got[1], got
    # a bound that holds by construction: under 1/32 of the increments, the old racy claim
    by_construction = _planted(
        lambda d, c: judged(bool((_racy(d)["m_counted"] <= _racy(d)["m_expected"] / 32)
                                 .all()), "racy"),
        lambda d: slower(d, every, 4.0))
    assert "cannot fail" in claims.flip_audit("atomics", by_construction, df)[1]
    idle = _planted(lambda d, c: judged(len(d) > 0, "rows"), lambda d: d)
    assert "changes no value" in claims.flip_audit("vector_add", idle, df)[1]
    assert "has no flip" in claims.flip_audit("vector_add", _planted(
        lambda d, c: judged(True, "x"), None), df)[1]
    real = _claim("vector_add", "blocks_of_32_lag")
    assert claims.flip_audit("vector_add", real, df) == (True, "")


def _section_claims(name: str, df: pd.DataFrame) -> list[claims.ClaimResult]:
    """The claims the report's section of `name` renders (data-state in its HTML)."""
    full = roofline.annotate(df)
    judged = run_claims.RunClaims({"lessons": run_claims.judge_lessons(full, [name])})
    sec = report._section(name, REGISTRY[name], full[full["experiment"] == name],
                          Path("/nonexistent"), 10, "raw", full, {}, judged)
    return sec["claims"]


def test_the_rendered_states_are_the_judged_ones(refs, h100_page):
    """The HTML's data-state of every claim is the state the audit judges."""
    df, page = refs["H100"], h100_page
    shown = dict(re.findall(r'<li data-claim="([^"]+)" data-state="([^"]+)"', page))
    judged = {f"{n}:{c.key}": c.state.value for n in REGISTRY
              for c in claims.evaluate(n, df)}
    assert shown and shown == {k: v for k, v in judged.items() if k in shown}
    assert set(judged) <= set(shown), set(judged) - set(shown)


# -- prose states no measured number ---------------------------------------------------------
def _allowed(name: str) -> set[str]:
    exp = REGISTRY.get(name)
    own = exp.lesson.sources if exp is not None else {}
    return set(ALLOWED) | set(own)


def _numbers(text: str) -> list[str]:
    return [m.group(0).replace("\u202f", " ").replace("\u2009", " ")
            for m in NUMBER.finditer(text)]


def _prose_of(lesson: Lesson) -> list[tuple[str, str]]:
    """(where, text) of every sentence a lesson writes in advance of any run."""
    out = [("caption", lesson.caption)]
    out += [(f"figure {k}", v) for k, v in lesson.figures.items()]
    out += [(f"try {t[0]}", t[1]) for t in lesson.try_this]
    out += [(f"question {i}", q.text) for i, q in enumerate(lesson.questions)]
    return out


@pytest.mark.parametrize("name", sorted(REGISTRY))
def test_a_lesson_s_prose_states_no_measured_number(name):
    allowed = _allowed(name)
    bad = [(where, n) for where, text in _prose_of(REGISTRY[name].lesson) for n in _numbers(text)
           if n not in allowed]
    assert not bad, (f"{name}: numbers in prose that no claim or fact produced (state them "
                     f"as a claim, or add the static fact with its source to `sources`): {bad}")


class _Prose(HTMLParser):
    """The text of every element of class "prose", <code> left out."""

    def __init__(self) -> None:
        super().__init__()
        self.depth = 0
        self.code = 0
        self.stack: list[bool] = []
        self.found: list[tuple[str, str]] = []
        self.lesson: list[str] = []

    def handle_starttag(self, tag, attrs):
        a = dict(attrs)
        prose = "prose" in (a.get("class") or "").split()
        self.stack.append(prose)
        if prose:
            self.depth += 1
            self.lesson.append(a.get("data-lesson", ""))
            self.found.append((self.lesson[-1], ""))
        if tag == "code":
            self.code += 1

    def handle_endtag(self, tag):
        if tag == "code":
            self.code = max(0, self.code - 1)
        if self.stack and self.stack.pop():
            self.depth -= 1
            self.lesson.pop()

    def handle_data(self, data):
        if self.depth and not self.code:
            lesson, text = self.found[-1]
            self.found[-1] = (lesson, text + data)


def _render(df: pd.DataFrame, tmp: Path) -> str:
    conf = config.load(ROOT / "config.yaml")
    return report.render(df, tmp / "figures", conf, tmp / "report.html").read_text()


@pytest.fixture(scope="module")
def h100_page(refs, tmp_path_factory) -> str:
    """The H100 reference's report rendered once for the module's audits."""
    return _render(refs["H100"], tmp_path_factory.mktemp("h100"))


def test_the_rendered_reports_prose_states_no_measured_number(h100_page):
    page = h100_page
    p = _Prose()
    p.feed(page)
    assert len(p.found) > 20, "the report marks its prose (class prose)"
    bad = [(lesson, n, text[:80]) for lesson, text in p.found for n in _numbers(text)
           if n not in _allowed(lesson)]
    assert not bad, bad


@pytest.mark.slow
def test_every_claim_is_judged_on_the_references(refs):
    counts: dict[str, int] = {}
    for label, df in refs.items():
        for name in REGISTRY:
            for r in claims.evaluate(name, df):
                counts[r.state.value] = counts.get(r.state.value, 0) + 1
                assert r.evidence, (label, name, r.statement)
    assert counts.get("seen", 0) > 40


def test_a_headline_is_a_lesson_not_a_check_of_the_tool(refs):
    """The slides' one sentence is the lesson's point: the checks of cudalab itself (its
    calculator against the driver, its limits table, its peaks) are never chosen where the
    lesson has a claim of its own."""
    tools = {(n, c.name) for n, e in REGISTRY.items() for c in e.lesson.claims if c.tool}
    assert {("occupancy", "calc_agrees_driver"), ("occupancy", "api_agrees_driver"),
            ("device_query", "limits_table_matches")} <= tools
    got = claims.headline("occupancy", refs["H100"])
    assert got is not None and got.key == "regs_lower_occupancy", got
