"""A baseline folder is untrusted: records that are deeply nested JSON, a list where a record
belongs, text or a list where a number belongs, negative, NaN and infinite times, a FIFO among
the records, `raw -> /`, a 1100-deep tree, a results.csv with a negative time. Each is named
and left out (or the folder refused with a clear error); the comparison of the rest goes on.
"""

from __future__ import annotations

import json
import math
import os
from pathlib import Path

import pandas as pd
import pytest
from hostile import REFERENCE, deadline, make_run

from cudalab import compare, results
from cudalab.cli import main

EXP = "vector_add"
POINT = "gpu-n16777216-threads256"  # a DRAM-bound kernel of the reference


@pytest.fixture(scope="module")
def this_run(tmp_path_factory) -> Path:
    return make_run(tmp_path_factory.mktemp("this"))


def _record(run: Path, point: str = POINT) -> Path:
    return run / "raw" / EXP / f"{point}.json"


def _edit(run: Path, fn, point: str = POINT) -> None:
    path = _record(run, point)
    rec = json.loads(path.read_text())
    out = fn(rec)
    path.write_text(out if isinstance(out, str) else json.dumps(rec if out is None else out))


def _nested(rec) -> str:
    """The record with an 1100-deep list in it (as text: Python's own parser fails on it)."""
    return json.dumps(rec)[:-1] + ', "deep": ' + "[" * 1100 + "]" * 1100 + "}"


def _compare(capsys, base: Path, this: Path, *more: str) -> tuple[int, str, str]:
    with deadline(60):
        code = main(["compare", str(base), str(this), *more])
    cap = capsys.readouterr()
    return code, cap.out, cap.err


def _verdict(out_csv: Path, point: str = POINT) -> str:
    cmp = compare.read_comparison(out_csv)
    return cmp.loc[cmp["point_id"] == point, "verdict"].item()


def _set_samples(value):
    def fn(rec):
        rec["timing"]["samples_s"] = [value] * len(rec["timing"]["samples_s"])
    return fn


@pytest.mark.parametrize("name, edit, why", [
    ("negative time", _set_samples(-1e-3), "timing.samples_s[0] is -0.001, not a time > 0"),
    ("NaN times", _set_samples(math.nan), "not a time > 0"),
    ("infinite times", _set_samples(math.inf), "not a time > 0"),
    ("a list, not a record", lambda rec: [rec], "a JSON list, not a record"),
    ("provenance a list", lambda rec: rec.update(provenance=[1]), "provenance is a JSON list"),
    ("timing a text", lambda rec: rec.update(timing="fast"), "timing is a JSON str"),
    ("trial spread a mapping", lambda rec: rec["timing"].update(trial_spread={"a": 1}),
     "timing.trial_spread is {'a': 1}, not a number"),
    ("samples a mapping", lambda rec: rec["timing"].update(samples_s={"a": 1}),
     "timing.samples_s is {'a': 1}"),
    ("deep nesting", _nested, "nests 1101 levels deep; at most 64"),
    ("a control character in the id", lambda rec: rec.update(point_id="x\x1b[2Jy"),
     "point_id is 'x\\x1b[2Jy'"),
])
def test_a_bad_record_is_named_and_left_out(name, edit, why, this_run, tmp_path, capsys):
    base = make_run(tmp_path / "base")
    _edit(base, edit)
    code, out, err = _compare(capsys, base, this_run, "--csv", str(tmp_path / "c.csv"))
    assert code == 0, err
    assert f"left out {_record(base)}" in err and why in err, err
    assert _verdict(tmp_path / "c.csv") == "only this"  # the others still compared
    assert "Traceback" not in err


def test_a_negative_time_never_gives_a_negative_ratio(this_run, tmp_path, capsys):
    """The hostile case of the issue: -264.7 called "faster"."""
    base = make_run(tmp_path / "base")
    _edit(base, _set_samples(-1e-3))
    _compare(capsys, base, this_run, "--csv", str(tmp_path / "c.csv"))
    cmp = compare.read_comparison(tmp_path / "c.csv")
    assert not (cmp["ratio"] < 0).any()


def test_a_fifo_among_the_records_is_named_not_opened(this_run, tmp_path, capsys):
    base = make_run(tmp_path / "base")
    os.mkfifo(base / "raw" / EXP / "zz-fifo.json")
    code, _, err = _compare(capsys, base, this_run)
    assert code == 0 and "zz-fifo.json: a FIFO (named pipe), not a regular file" in err


def test_raw_linked_to_the_root_is_refused_not_walked(this_run, tmp_path, capsys):
    base = tmp_path / "base"
    base.mkdir()
    (base / "raw").symlink_to("/")
    code, _, err = _compare(capsys, base, this_run)
    assert code == 2
    assert f"baseline folder {base}: {base / 'raw'} leads to /, outside {base}" in err


def test_a_1100_deep_tree_under_raw_is_cut_at_its_depth(this_run, tmp_path, capsys):
    base = make_run(tmp_path / "base")
    deep = path = base / "raw" / EXP / "d"
    deep.mkdir()
    for _ in range(1099):  # os.makedirs would recurse 1100 deep itself
        path = path / "d"
        path.mkdir()
    try:
        code, _, err = _compare(capsys, base, this_run)
    finally:  # shutil.rmtree (pytest's clean-up of old tmp folders) recurses too
        for _ in range(1100):
            path.rmdir()
            path = path.parent
    assert code == 0, err
    assert f"left out {deep / 'd'}: a folder deeper than 2 level(s)" in err


def test_a_results_csv_with_a_negative_time_leaves_that_row_out(tmp_path, capsys):
    base = tmp_path / "base"
    base.mkdir()
    df = pd.read_csv(REFERENCE / "results.csv", low_memory=False)
    df = df[df["experiment"] == EXP].copy()
    df.loc[df["point_id"] == POINT, "time_median_s"] = -0.5
    df.to_csv(base / "results.csv", index=False)
    this = make_run(tmp_path / "this")
    code, _, err = _compare(capsys, base, this, "--csv", str(tmp_path / "c.csv"))
    assert code == 0, err
    assert f"left out the row of {POINT}: time_median_s -0.5 is not a time > 0" in err
    assert _verdict(tmp_path / "c.csv") == "only this"


def test_results_csv_as_a_fifo_is_refused_unopened(tmp_path, capsys):
    base = tmp_path / "base"
    base.mkdir()
    os.mkfifo(base / "results.csv")
    code, _, err = _compare(capsys, base, REFERENCE)
    assert code == 2 and "results.csv is a FIFO (named pipe), not a regular file" in err


def test_aggregate_reads_own_records_with_the_same_limits(tmp_path, capsys):
    """results.iter_records (aggregate, the course table) leaves the same records out."""
    run = make_run(tmp_path / "run")
    _edit(run, _nested)
    _edit(run, _set_samples(-1.0), point="gpu-n16777216-threads1024")
    os.mkfifo(run / "raw" / EXP / "zz-fifo.json")
    with deadline(30):
        recs = list(results.iter_records(run / "raw"))
    err = capsys.readouterr().err
    ids = {r["point_id"] for r in recs}
    assert POINT not in ids and "gpu-n16777216-threads1024" not in ids and len(ids) > 10
    assert "nests 1101 levels" in err and "not a time > 0" in err and "FIFO" in err
    assert results.read_json(_record(run)) is None


def test_results_csv_linked_out_of_the_folder_is_not_read(tmp_path, capsys):
    base = tmp_path / "base"
    base.mkdir()
    (base / "results.csv").symlink_to(REFERENCE / "results.csv")
    code, _, err = _compare(capsys, base, REFERENCE)
    assert code == 2 and "outside" in err and "symbolic link out of the folder" in err
