"""`cudalab compare` on the folder of a run without a GPU: its GPU points are recorded
not_measured (no timing, as the runner writes them). The folder is read, and those points
are listed as "not measured": never slower or faster, never a reason for --fail-on-slower."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pandas as pd
import pytest

from cudalab import cli, compare, result_folders, results

ROOT = Path(__file__).resolve().parent.parent
REFERENCE = ROOT / "reports" / "reference" / "NVIDIA-H100-80GB-HBM3"
REASON = ("not measured: no GPU here (pycuda is not importable (No module named 'pycuda'); "
          "CUDA_VISIBLE_DEVICES=unset)")
QUIET = "naive-m4096-k4096-n4096-tile16"


def gpu_less_run(dest: Path, experiments=("matmul", "vector_add", "static_analysis")) -> Path:
    """The reference's records as a run without a GPU writes them: CPU points and static
    analysis as measured, every GPU point not_measured with no timing, check or metrics."""
    for e in experiments:
        shutil.copytree(REFERENCE / "raw" / e, dest / "raw" / e)
        for p in (dest / "raw" / e).glob("[!_]*.json"):
            rec = json.loads(p.read_text())
            prov = {k: v for k, v in rec["provenance"].items()  # a job that found no GPU
                    if not k.startswith(("gpu_", "cuda_", "driver", "pycuda"))}
            if rec["variant"] == "cpu" or e == "static_analysis":
                p.write_text(json.dumps(rec | {"provenance": prov}))
                continue
            p.write_text(json.dumps({
                k: rec[k] for k in ("schema_version", "experiment", "variant", "point_id",
                                    "params", "job_id", "t_start", "t_end")}
                | {"provenance": prov, "status": "not_measured", "reason": REASON}))
    return dest


@pytest.fixture(scope="module")
def gpu_less(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return gpu_less_run(tmp_path_factory.mktemp("nogpu"))


def test_a_gpu_less_folder_is_read_and_its_points_are_not_measured(gpu_less: Path) -> None:
    [base] = result_folders.load_runs(REFERENCE, "baseline")
    [run] = result_folders.load_runs(gpu_less)
    assert run.gpu == ""  # no point ran on a GPU
    cmp = compare.compare_runs(base, [run])
    nm = cmp[cmp["verdict"] == "not measured"]
    here = cmp["experiment"].isin(["matmul", "vector_add"])
    assert len(nm) == int((here & (cmp["variant"] != "cpu")).sum()) > 100
    assert (nm["status"] == "not_measured").all() and nm["ratio"].isna().all()
    assert nm["this_s"].isna().all() and nm["baseline_s"].notna().all()
    # the rest is judged as always: the CPU points and static analysis were measured
    assert set(cmp.loc[cmp["variant"] == "cpu", "verdict"]) == {"same"}
    assert set(cmp.loc[cmp["experiment"] == "static_analysis", "verdict"]) == {"untimed"}
    assert set(cmp.loc[~here & (cmp["experiment"] != "static_analysis"), "verdict"]) == {
        "only baseline"}


def test_not_measured_never_gates_fail_on_slower(gpu_less: Path, capsys) -> None:
    assert cli.main(["compare", str(REFERENCE), str(gpu_less), "--fail-on-slower"]) == 0
    out = capsys.readouterr().out
    assert "older schema" not in out and "not measured" in out
    assert f"{QUIET}" in out  # listed point by point
    assert "never slower or faster" in out
    s = compare.summary(compare.compare_runs(result_folders.load_runs(REFERENCE)[0],
                                             result_folders.load_runs(gpu_less))).iloc[0]
    assert s["not measured"] > 100 and s["slower"] == 0 and s["faster"] == 0


def test_either_side_not_measured(gpu_less: Path, tmp_path: Path, capsys) -> None:
    """The GPU-less run as the baseline: its points are still 'not measured', and the one
    timed pair (the CPU reference, host work) beyond the bar is 'unstable', named by class,
    and does not fail the gate."""
    run = tmp_path / "run"
    shutil.copytree(REFERENCE / "raw" / "matmul", run / "raw" / "matmul")
    cpu = next(p for p in (run / "raw" / "matmul").glob("cpu-*.json"))
    rec = json.loads(cpu.read_text())
    rec["timing"]["samples_s"] = [3 * s for s in rec["timing"]["samples_s"]]
    cpu.write_text(json.dumps(rec))
    [base] = result_folders.load_runs(gpu_less, "baseline")
    cmp = compare.compare_runs(base, result_folders.load_runs(run))
    mm = cmp[cmp["experiment"] == "matmul"]
    assert (mm.loc[mm["variant"] != "cpu", "verdict"] == "not measured").all()
    assert (cmp.loc[cmp["point_id"] == cpu.stem, "verdict"] == "unstable").all()
    assert cli.main(["compare", str(gpu_less), str(run), "--fail-on-slower"]) == 0
    out = capsys.readouterr().out
    assert "host: 1 (1 unstable" in out and cpu.stem in out and "in the baseline" in out


def test_a_results_csv_with_not_measured_rows(gpu_less: Path, tmp_path: Path) -> None:
    only_csv = tmp_path / "csv"
    df = results.build_table(results.iter_records(gpu_less / "raw"))
    results.write_table(df, only_csv / "results.csv")
    [base] = result_folders.load_runs(REFERENCE, "baseline")
    cmp = compare.compare_runs(base, result_folders.load_runs(only_csv))
    a = compare.compare_runs(base, result_folders.load_runs(gpu_less))
    pd.testing.assert_series_equal(cmp["verdict"].value_counts().sort_index(),
                                   a["verdict"].value_counts().sort_index())


def test_a_run_of_only_not_measured_points_outside_the_baseline_shares_nothing(
        gpu_less: Path, tmp_path: Path, capsys) -> None:
    other = gpu_less_run(tmp_path / "other", ("vector_add",))
    for p in (other / "raw" / "vector_add").glob("[!_]*.json"):
        rec = json.loads(p.read_text())
        rec["point_id"] += "-renamed"
        p.write_text(json.dumps(rec))
    assert cli.main(["compare", str(REFERENCE), str(other)]) == 2
    assert "shares no grid point" in capsys.readouterr().err
