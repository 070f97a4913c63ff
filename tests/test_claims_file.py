"""claims.json: every claim judged once per run, by aggregate, and only read afterwards.

On the committed H100 reference (its raw records aggregated again in a temporary folder, its
table re-rendered; the reference itself is never written): aggregate writes claims.json
beside results.csv; the file follows its schema and is refused, with the command that
writes it again, when damaged or judged on another table; a folder from before claims.json
is judged once and its claims.json written beside the output, not into the folder.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from cudalab import claims, claims_file, course, report, roofline, run_claims
from cudalab.cli import main
from cudalab.experiments import REGISTRY
from cudalab.experiments.lesson import State

ROOT = Path(__file__).resolve().parent.parent
REFERENCE = ROOT / "reports" / "reference" / "NVIDIA-H100-80GB-HBM3"


@pytest.fixture(scope="module")
def ref():
    return roofline.load_table(REFERENCE / "results.csv")


@pytest.fixture(scope="module")
def aggregated(tmp_path_factory) -> Path:
    """The reference's raw records aggregated again, as a run's aggregate step does."""
    run = tmp_path_factory.mktemp("run")
    shutil.copytree(REFERENCE / "raw", run / "raw")
    assert main(["aggregate", "--results", str(run), "--out", str(run / "results.csv")]) == 0
    return run


def test_aggregate_writes_claims_json_beside_the_table(aggregated, capsys):
    path = aggregated / claims_file.FILE
    run = claims_file.read(path, aggregated / "results.csv")  # schema and table hash checked
    doc = json.loads(path.read_text())
    assert doc["table"] == {"file": "results.csv",
                            "sha256": claims_file.sha256(aggregated / "results.csv")}
    assert doc["gpu"] == "NVIDIA H100 80GB HBM3"
    # one path: what the file holds is what the judge says on the table read back
    df = roofline.load_table(aggregated / "results.csv")
    for name in doc["lessons"]:
        want = [(r.key, r.state, r.evidence) for r in claims.evaluate(name, df)]
        assert [(r.key, r.state, r.evidence) for r in run.claims(name)] == want, name
    assert {r["lesson"] for r in run.course} == {e["lesson"] for e in course.load()}


def test_the_schema_is_printed_for_other_tools(capsys, aggregated):
    import jsonschema

    assert main(["claims", "--schema"]) == 0
    schema = json.loads(capsys.readouterr().out)
    jsonschema.validate(_doc(aggregated), schema)


def test_every_lesson_s_claims_with_their_numbers(ref):
    run = claims_file.judge_run(ref, REFERENCE / "results.csv")
    assert set(run.doc["lessons"]) == set(ref["experiment"]) & set(REGISTRY)
    for name, lesson in run.doc["lessons"].items():
        assert [c["key"] for c in lesson["claims"]] == [
            c.name for c in REGISTRY[name].lesson.claims]
        assert len(lesson["try_this"]) == len(REGISTRY[name].lesson.try_this)
        assert lesson["headline"] is None or run.claim(name, lesson["headline"]) is not None
    bw = run.claim("vector_add", "large_near_bandwidth")
    numbers = next(c["numbers"] for c in run.doc["lessons"]["vector_add"]["claims"]
                   if c["key"] == "large_near_bandwidth")
    assert bw.state is State.SEEN
    assert {n["unit"] for n in numbers} >= {"TB/s", "%"}
    assert all(n["text"] in bw.evidence for n in numbers)


@pytest.mark.parametrize(("text", "want"), [
    ("2.75 TB/s at n = 67\u202f108\u202f864: 91 % of 3.01 TB/s",
     [(2.75, "TB/s"), (67108864.0, ""), (91.0, "%"), (3.01, "TB/s")]),
    ("tiled / naive = 1.31× (needs 1.2×)", [(1.31, "×"), (1.2, "×")]),
    ("error 9.00\u00a0×\u00a010⁻⁷ against 1e-06", [(9.0e-7, ""), (1e-6, "")]),
    ("23 cycles, 412 ns; -3.5 %", [(23.0, "cycles"), (412.0, "ns"), (-3.5, "%")]),
    ("sm_90 at 8192², 32x8 blocks", [(8192.0, "")]),
])
def test_the_numbers_of_an_evidence(text, want):
    got = run_claims.numbers_in(text)
    assert [n["value"] for n in got] == pytest.approx([v for v, _ in want])
    assert [n["unit"] for n in got] == [u for _, u in want]
    assert all(n["text"] in text for n in got)


def _doc(aggregated: Path) -> dict:
    return json.loads((aggregated / claims_file.FILE).read_text())


@pytest.mark.parametrize("damage", ["not json", "schema", "state"])
def test_a_damaged_claims_json_is_refused_with_how_to_write_it_again(aggregated, tmp_path,
                                                                     damage, capsys):
    doc = _doc(aggregated)
    bad = tmp_path / claims_file.FILE
    if damage == "not json":
        bad.write_text('{"format": "cudalab-claims", ')
    else:
        if damage == "schema":
            del doc["lessons"]["vector_add"]["headline"]
        else:
            doc["lessons"]["vector_add"]["claims"][0]["state"] = "passed"
        bad.write_text(json.dumps(doc))
    with pytest.raises(claims_file.ClaimsFileError) as got:
        claims_file.read(bad, aggregated / "results.csv")
    assert str(bad) in str(got.value) and "cudalab claims --table" in str(got.value)
    code = main(["slides", "--table", str(aggregated / "results.csv"), "--claims", str(bad),
                 "--out", str(tmp_path / "slides"), "--experiments", "vector_add"])
    err = capsys.readouterr().err
    assert code == 2 and err.startswith("error: ") and "Traceback" not in err
    assert not (tmp_path / "slides").exists()


def test_claims_judged_on_another_table_are_refused(aggregated, tmp_path):
    """A results.csv written again after its claims.json (another aggregate, a hand edit)
    no longer matches what was judged."""
    (tmp_path / "results.csv").write_bytes(
        (aggregated / "results.csv").read_bytes().replace(b"vector_add", b"vector_add", 1)
        + b"\n")
    shutil.copy(aggregated / claims_file.FILE, tmp_path / claims_file.FILE)
    with pytest.raises(claims_file.ClaimsFileError, match="judged on another results.csv"):
        claims_file.read(tmp_path / claims_file.FILE, tmp_path / "results.csv")
    assert main(["claims", "--table", str(tmp_path / "results.csv")]) == 0  # written again
    claims_file.read(tmp_path / claims_file.FILE, tmp_path / "results.csv")


def test_a_folder_from_before_claims_json_is_judged_once_beside_the_output(ref, tmp_path,
                                                                           capsys):
    """A run folder without claims.json (the reference's table, in a folder of its own): a
    re-render judges it once and writes claims.json where it writes, never into the folder
    it reads."""
    old = tmp_path / "old-run"
    old.mkdir()
    shutil.copy(REFERENCE / "results.csv", old / "results.csv")
    out = tmp_path / "out"
    out.mkdir()
    run = claims_file.for_table(old / "results.csv", ref, out)
    assert "judged it once" in capsys.readouterr().err
    assert (out / claims_file.FILE).is_file()
    assert not (old / claims_file.FILE).exists()
    assert claims_file.read(out / claims_file.FILE, old / "results.csv").doc == run.doc


def test_the_report_renders_the_states_the_file_holds(aggregated, tmp_path):
    """The report judges nothing: a state changed in claims.json is the state it shows."""
    import re

    from cudalab import config

    doc = _doc(aggregated)
    claim = doc["lessons"]["vector_add"]["claims"][1]
    assert claim["state"] == "seen"
    claim.update(state="not seen", evidence="set in claims.json by the test")
    run = run_claims.RunClaims(doc)
    df = roofline.load_table(aggregated / "results.csv")
    conf = config.load(ROOT / "config.yaml")
    page = report.render(df[df["experiment"].isin(["vector_add", "device_query"])],
                         tmp_path / "figures", conf, tmp_path / "r.html",
                         judged=run).read_text()
    shown = dict(re.findall(r'<li data-claim="([^"]+)" data-state="([^"]+)"', page))
    assert shown[f"vector_add:{claim['key']}"] == "not seen"
    assert "set in claims.json by the test" in page


def test_the_renderers_judge_no_claim():
    """The report, the slides, the course table and the comparison read claims.json: none of
    them imports the module that judges a claim (cudalab/claims.py)."""
    import ast

    for module in ("report", "slides", "slide_deck", "course", "compare"):
        tree = ast.parse((ROOT / "cudalab" / f"{module}.py").read_text())
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom):
                names = {f"{node.module}.{a.name}" for a in node.names} | {node.module}
            elif isinstance(node, ast.Import):
                names = {a.name for a in node.names}
            else:
                continue
            assert "cudalab.claims" not in names, (module, ast.unparse(node))
