"""`cudalab compare` on run folders built from the real H100 reference run (samples of
chosen points scaled, records removed or aged), through the real command line."""

from __future__ import annotations

import json
import math
import shutil
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from cudalab import cli, compare, compare_calibration, compare_text, result_folders, results

ROOT = Path(__file__).resolve().parent.parent
REFERENCE = ROOT / "reports" / "reference" / "NVIDIA-H100-80GB-HBM3"
EXPERIMENTS = ("matmul", "vector_add", "static_analysis")
QUIET = "naive-m4096-k4096-n4096-tile16"  # a long kernel with a small spread


def make_run(dest: Path, experiments=EXPERIMENTS) -> Path:
    """A run folder holding the reference's raw records of some experiments."""
    for e in experiments:
        shutil.copytree(REFERENCE / "raw" / e, dest / "raw" / e)
    return dest


def edit_record(run: Path, experiment: str, point: str, fn) -> None:
    path = run / "raw" / experiment / f"{point}.json"
    rec = json.loads(path.read_text())
    fn(rec)
    path.write_text(json.dumps(rec))


def scale(factor: float):
    def fn(rec):
        rec["timing"]["samples_s"] = [s * factor for s in rec["timing"]["samples_s"]]
    return fn


@pytest.fixture(scope="module")
def base(tmp_path_factory) -> Path:
    return make_run(tmp_path_factory.mktemp("base"))


def verdict_of(cmp, point: str) -> str:
    return cmp.loc[cmp["point_id"] == point, "verdict"].item()


def run_pair(base: Path, other: Path, **kw):
    [b] = result_folders.load_runs(base, "baseline")
    return compare.compare_runs(b, result_folders.load_runs(other), **kw)


def test_run_against_itself_is_same_everywhere(base):
    cmp = run_pair(base, base)
    assert set(cmp["verdict"]) == {"same", "untimed"}
    timed = cmp[cmp["verdict"] == "same"]
    assert len(timed) > 100 and np.allclose(timed["ratio"], 1.0)
    # untimed: static analysis (no kernel runs) and block sizes that cannot launch
    assert set(cmp.loc[cmp["verdict"] == "untimed", "experiment"]) == {"static_analysis"}


def test_quiet_point_has_little_noise(base):
    [b] = result_folders.load_runs(base)
    row = b.points[b.points["point_id"] == QUIET].iloc[0]
    assert row["noise"] < 0.02 and row["n_samples"] >= 5  # a later trial's minimum


@pytest.mark.parametrize("factor,expected", [(1.20, "slower"), (1.01, "same"),
                                             (1 / 1.2, "faster"), (0.99, "same")])
def test_made_up_change_on_one_point(base, tmp_path, factor, expected):
    run = make_run(tmp_path / "run")
    edit_record(run, "matmul", QUIET, scale(factor))
    cmp = run_pair(base, run)
    assert verdict_of(cmp, QUIET) == expected
    assert cmp.loc[cmp["point_id"] == QUIET, "ratio"].item() == pytest.approx(factor)
    others = cmp[(cmp["point_id"] != QUIET) & (cmp["verdict"] != "untimed")]
    assert set(others["verdict"]) == {"same"}


def test_noise_hides_a_change_smaller_than_the_spread(base, tmp_path):
    """20 % slower in the median, but samples spread over +-40 %: not a verdict."""
    run = make_run(tmp_path / "run")

    def noisy(rec):
        s = np.asarray(rec["timing"]["samples_s"])
        rec["timing"]["samples_s"] = list(np.median(s) * 1.2 * np.linspace(0.6, 1.4, s.size))
    edit_record(run, "matmul", QUIET, noisy)
    cmp = run_pair(base, run)
    row = cmp[cmp["point_id"] == QUIET].iloc[0]
    assert row["ratio"] == pytest.approx(1.2, rel=1e-6) and row["noise"] > 0.2
    assert row["verdict"] == "same"
    # the threshold still applies on its own: a bigger minimum also hides it
    assert verdict_of(run_pair(base, base, threshold=0.5), QUIET) == "same"


def test_times_taken_by_another_method_get_no_ratio_and_no_speed_verdict(base, tmp_path,
                                                                         capsys):
    """The vector add at 50 000 timed with plain events (the host's launch cost in every
    launch: ~5x the queued kernel time) is not 'slower': it is another method."""
    run = make_run(tmp_path / "run")
    point = "gpu-n50000-threads256"

    def plain_events(rec):
        rec["timing"]["timer"] = "cuda_event"
        rec["timing"]["samples_s"] = [s * 5 for s in rec["timing"]["samples_s"]]
    edit_record(run, "vector_add", point, plain_events)
    cmp = run_pair(base, run)
    row = cmp[cmp["point_id"] == point].iloc[0]
    assert row["verdict"] == "other method" and pd.isna(row["ratio"])
    assert (row["baseline_method"], row["method"]) == ("cuda_event_queued", "cuda_event")
    assert row["this_s"] == pytest.approx(5 * row["baseline_s"])
    s = compare.summary(cmp).iloc[0]
    assert s["other method"] == 1 and s["slower"] == 0 and s["worst_ratio"] < 1.05
    assert "other method (cuda_event_queued / cuda_event)" in compare_text.format_text(cmp)


def test_points_on_one_side_are_listed(base, tmp_path):
    run = make_run(tmp_path / "run")
    (run / "raw" / "matmul" / f"{QUIET}.json").unlink()
    edit_record(run, "vector_add", "gpu-n50000-threads256",
                lambda r: r.update(point_id="gpu-n50001-threads256"))
    cmp = run_pair(base, run)
    assert verdict_of(cmp, QUIET) == "only baseline"
    assert verdict_of(cmp, "gpu-n50000-threads256") == "only baseline"
    assert verdict_of(cmp, "gpu-n50001-threads256") == "only this"


def test_not_ok_points_get_no_speed_verdict(base, tmp_path):
    run = make_run(tmp_path / "run")
    edit_record(run, "matmul", QUIET, lambda r: r.update(status="wrong"))
    assert verdict_of(run_pair(base, run), QUIET) == "not ok"


def test_cli_fail_on_slower_and_csv(base, tmp_path, capsys):
    run = make_run(tmp_path / "run")
    edit_record(run, "matmul", QUIET, scale(1.2))
    out_csv = tmp_path / "cmp.csv"
    assert cli.main(["compare", str(base), str(run), "--csv", str(out_csv)]) == 0
    text = capsys.readouterr().out
    assert "== matmul" in text and "slower" in text and "verdicts per run" in text
    import pandas as pd

    df = pd.read_csv(out_csv)
    assert (df["verdict"] == "slower").sum() == 1
    assert cli.main(["compare", str(base), str(run), "--fail-on-slower"]) == 1
    assert f"matmul/{QUIET}" in capsys.readouterr().out
    # a 20 % threshold lets it pass
    assert cli.main(["compare", str(base), str(run), "--fail-on-slower",
                     "--threshold", "0.25"]) == 0
    assert cli.main(["compare", "--baseline", str(base), str(base), "--fail-on-slower"]) == 0


def test_results_csv_alone_is_enough(tmp_path):
    only_csv = tmp_path / "csv"
    only_csv.mkdir()
    shutil.copy(REFERENCE / "results.csv", only_csv / "results.csv")
    [b] = result_folders.load_runs(REFERENCE)
    [c] = result_folders.load_runs(only_csv)
    assert len(c.points) == len(b.points) == len(pd.read_csv(REFERENCE / "results.csv"))
    cmp = compare.compare_runs(b, [c])
    assert set(cmp["verdict"]) == {"same", "untimed"}
    assert np.allclose(cmp["ratio"].dropna(), 1.0, rtol=1e-9)


def test_a_folder_with_two_gpus_is_two_runs(base, tmp_path):
    """A GPU-model sweep keeps each model's records in raw/<experiment>/<model>/."""
    sweep = tmp_path / "sweep"
    for model, name, factor in (("h100", "NVIDIA H100 80GB HBM3", 1.0),
                                ("h200", "NVIDIA H200", 0.2)):
        shutil.copytree(base / "raw" / "matmul", sweep / "raw" / "matmul" / model)
        for p in (sweep / "raw" / "matmul" / model).glob("[!_]*.json"):
            rec = json.loads(p.read_text())
            rec["provenance"]["gpu_name"] = name
            rec["timing"]["samples_s"] = [s * factor for s in rec["timing"]["samples_s"]]
            for t in rec["timing"].get("trials", []):  # each trial's median moves too
                t["median"] *= factor
            p.write_text(json.dumps(rec))
    shutil.copytree(base / "raw" / "static_analysis", sweep / "raw" / "static_analysis")
    runs = result_folders.load_runs(sweep)
    assert [r.gpu for r in runs] == ["NVIDIA H100 80GB HBM3", "NVIDIA H200"]
    assert all("static_analysis" in set(r.points["experiment"]) for r in runs)
    cmp = compare.compare_runs(runs[0], runs[1:])
    gpu_points = cmp[cmp["experiment"] == "matmul"]
    assert np.allclose(gpu_points["ratio"], 0.2)
    kernels = gpu_points["variant"] != "cpu"
    assert set(gpu_points.loc[kernels, "verdict"]) == {"faster"}
    # the numpy reference is host work: beyond the bar it is unstable, never faster
    assert set(gpu_points.loc[~kernels, "verdict"]) == {"unstable"}


def _error(capsys, *args) -> str:
    assert cli.main(["compare", *map(str, args)]) == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err
    return err


def test_bad_input_is_named(base, tmp_path, capsys):
    err = _error(capsys, tmp_path / "nope", base)
    assert f"baseline folder {tmp_path / 'nope'} does not exist" in err
    (tmp_path / "empty").mkdir()
    err = _error(capsys, base, tmp_path / "empty")
    assert f"run folder {tmp_path / 'empty'} holds no results" in err
    other = make_run(tmp_path / "other", ("transfer",))
    err = _error(capsys, base, other)
    assert f"{other} shares no grid point with the baseline {base}" in err
    assert "transfer" in err
    assert "at least two result folders" in _error(capsys, base)
    assert "--threshold -1.0: allowed values" in _error(capsys, base, base, "--threshold", "-1")


def test_older_schema_says_what_is_missing(base, tmp_path, capsys):
    old = make_run(tmp_path / "old", ("vector_add",))

    def age(rec):
        rec["schema_version"] = 0
        del rec["timing"]
    for p in (old / "raw" / "vector_add").glob("[!_]*.json"):
        rec = json.loads(p.read_text())
        age(rec)
        p.write_text(json.dumps(rec))
    err = _error(capsys, base, old)
    assert "older schema" in err and "schema_version 0" in err and "missing timing" in err
    old_csv = tmp_path / "oldcsv"
    old_csv.mkdir()
    import pandas as pd

    pd.read_csv(REFERENCE / "results.csv").drop(columns=["time_iqr_s", "gpu_name"]).to_csv(
        old_csv / "results.csv", index=False)
    err = _error(capsys, base, old_csv)
    assert "older schema: missing column(s) time_iqr_s, gpu_name" in err


def test_a_sweep_results_folder_is_one_run_per_model(base, tmp_path):
    """results/ of a GPU-model sweep: results/gpu/<model>/ are complete run folders."""
    results = tmp_path / "results"
    make_run(results / "gpu" / "a100")
    make_run(results / "gpu" / "h100")
    edit_record(results / "gpu" / "h100", "matmul", QUIET, scale(0.5))
    runs = result_folders.load_runs(results)
    assert [r.label for r in runs] == [str(results / "gpu" / m) for m in ("a100", "h100")]
    cmp = compare.compare_runs(runs[0], runs[1:])
    assert verdict_of(cmp, QUIET) == "faster"


def test_course_beside_several_runs(base, tmp_path, capsys):
    assert cli.main(["compare", "--course", str(REFERENCE), str(base)]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0] == (f"| lesson | course | {REFERENCE.name} (NVIDIA H100 80GB HBM3) | "
                      f"{base.name} (NVIDIA H100 80GB HBM3) |")
    sms = next(line for line in out if line.startswith("| vectorAdd"))
    # base holds no device_query: its cell is empty, the reference's is 132 SMs
    assert sms.endswith("| 132 SMs (10.2×) | — |"), sms
    occ = next(line for line in out if line.startswith("| occupancy: 32-thread blocks |"))
    assert "25 % occupancy (Tesla K80; cudalab's calculator: 25 % occupancy)" in occ
    assert "Traceback" not in _error(capsys, "--course", tmp_path / "missing")


def _points(rows: list[tuple], spread: float = math.nan, floor_s: float = math.nan
            ) -> result_folders.Run:
    """A run of (experiment, point, time, timer[, trial spread]) rows; `spread` and
    `floor_s` for every row that gives none (NaN: measured without trials)."""
    df = pd.DataFrame([{"experiment": r[0], "point_id": r[1], "variant": r[1].split("-")[0],
                        "gpu": "G", "status": "ok", "median_s": r[2], "noise": 0.002,
                        "n_samples": 10, "method": r[3],
                        "trial_spread": r[4] if len(r) > 4 else spread, "floor_s": floor_s}
                       for r in rows], columns=result_folders.POINT_COLS)
    return result_folders.Run("x", Path("x"), "G", df)


KERNEL, EVENTS, HOST = "cuda_event_queued", "cuda_event", "perf_counter"


def test_what_an_older_baseline_lacks_is_said():
    """A baseline made by older code: an experiment it never measured, a point it lacks in
    a shared one, and no trials; each is named, with counts. A baseline that lacks nothing
    gets no line."""
    base = _points([("k", "a-1", 1e-4, KERNEL), ("k", "a-2", 1e-4, KERNEL)])
    run = _points([("k", "a-1", 1e-4, KERNEL), ("k", "a-2", 1e-4, KERNEL),
                   ("k", "a-3", 1e-4, KERNEL), ("lat", "chase-1", 1e-5, KERNEL),
                   ("lat", "chase-2", 1e-5, KERNEL)], spread=0.01, floor_s=1e-7)
    [line] = compare_text.baseline_gaps(compare.compare_pair(base, run))
    assert line == ("x lacks what this run has: the experiments lat (2 points); 1 points of "
                    "the experiments both measured; trials at 2 of its 2 timed points "
                    "(judged by the class floors there)")
    same = _points([("k", "a-1", 1e-4, KERNEL)], spread=0.01, floor_s=1e-7)
    assert compare_text.baseline_gaps(compare.compare_pair(same, same)) == []
    assert line in compare_text.format_text(compare.compare_pair(base, run))


def test_without_trials_the_class_floors_judge():
    """Records from before trials: a 2 us kernel moving by 0.3 us (15 %) is within the
    kernel floor (0.5 us), a 100 us kernel 10 % slower is slower; host work within 75 %
    (host) or 40 % (host-synchronous) of its time is same, beyond it unstable; the output
    says these points were judged by the class floors."""
    base = _points([("k", "short-a", 2e-6, KERNEL), ("k", "long-a", 100e-6, KERNEL),
                    ("k", "long-b", 100e-6, KERNEL), ("c", "cpu-a", 1e-3, HOST),
                    ("c", "cpu-b", 1e-3, HOST), ("t", "pageable-a", 1e-3, EVENTS),
                    ("t", "pageable-b", 1e-3, EVENTS)])
    run = _points([("k", "short-a", 2.3e-6, KERNEL), ("k", "long-a", 110e-6, KERNEL),
                   ("k", "long-b", 104e-6, KERNEL), ("c", "cpu-a", 1.5e-3, HOST),
                   ("c", "cpu-b", 2e-3, HOST), ("t", "pageable-a", 0.6e-3, EVENTS),
                   ("t", "pageable-b", 1.3e-3, EVENTS)])
    cmp = compare.compare_pair(base, run).set_index("point_id")
    assert cmp.loc["short-a", "verdict"] == "same"
    assert cmp.loc["short-a", "bar_from"] == "class floor"
    assert cmp.loc["short-a", "bar"] == pytest.approx(0.5e-6 / 2e-6)
    assert cmp.loc["long-a", "verdict"] == "slower"
    assert cmp.loc["long-a", "bar_from"] == "threshold"
    assert cmp.loc["long-b", "verdict"] == "same"
    assert cmp.loc["cpu-a", "verdict"] == "same" and cmp.loc["cpu-a", "class"] == "host"
    assert cmp.loc["cpu-b", "verdict"] == "unstable"
    assert cmp.loc["pageable-a", "verdict"] == "unstable"
    assert cmp.loc["pageable-a", "class"] == "host-synchronous"
    assert cmp.loc["pageable-b", "verdict"] == "same"
    assert not cmp["trials"].any()
    text = compare_text.format_text(cmp.reset_index())
    grouped = text[text.index("by class"):]
    assert "kernel: 1 (1 slower" in grouped and "host: 1 (1 unstable" in grouped
    assert "host-synchronous: 1 (1 unstable" in grouped
    assert "k/long-a" in grouped and "1.100x > 1 + bar, bar 5.0 % (threshold)" in grouped
    assert ("7 of 7 timed comparison(s) have a side measured without trials" in text
            and "0.5 us for kernel, 0.5 us or 10 % for small-grid, 40 % for "
                "host-synchronous, 75 % for host" in text)


def test_with_trials_the_spread_and_the_floor_judge():
    """Both sides in trials: no class floor, so a 2 us kernel 15 % slower whose trials
    agree within 1 % is slower (bar: k x trial spread, or the floor of 100 ns over 2 us);
    a 100 us kernel whose trials spread by 8 % is same at 1.10x; host work beyond
    k x its spread is unstable."""
    base = _points([("k", "short-a", 2e-6, KERNEL, 0.01), ("k", "short-b", 2e-6, KERNEL, 0.01),
                    ("k", "long-a", 100e-6, KERNEL, 0.08), ("c", "cpu-a", 1e-3, HOST, 0.02)],
                   floor_s=70e-9)
    run = _points([("k", "short-a", 2.3e-6, KERNEL, 0.01), ("k", "short-b", 2.1e-6, KERNEL, 0.01),
                   ("k", "long-a", 110e-6, KERNEL, 0.01), ("c", "cpu-a", 1.3e-3, HOST, 0.02)],
                  floor_s=70e-9)
    rule = compare.Rule(k=2.0, class_floors_always=False)
    cmp = compare.compare_pair(base, run, rule=rule).set_index("point_id")
    assert cmp["trials"].all()
    assert cmp.loc["short-a", "verdict"] == "slower"
    assert cmp.loc["short-a", "bar_from"] == "threshold"
    assert cmp.loc["short-b", "verdict"] == "same"  # 5 % is the threshold
    assert cmp.loc["long-a", "verdict"] == "same"
    assert cmp.loc["long-a", "bar_from"] == "k x trial spread"
    assert cmp.loc["long-a", "bar"] == pytest.approx(2 * math.hypot(0.08, 0.01))
    assert cmp.loc["cpu-a", "verdict"] == "unstable"
    # a floor above the rest sets the bar: 1 us of floor over 2 us
    wide = compare.compare_pair(_points([("k", "short-a", 2e-6, KERNEL, 0.01)], floor_s=0.7e-6),
                                _points([("k", "short-a", 2.3e-6, KERNEL, 0.01)],
                                        floor_s=0.7e-6), rule=rule).iloc[0]
    assert wide["verdict"] == "same" and wide["bar_from"] == "resolution floor"
    assert wide["bar"] == pytest.approx(math.hypot(0.7e-6, 0.7e-6) / 2e-6)
    # where asked, the class floors apply with trials too; a kernel whose job measured no
    # floor takes its class floor
    always = compare.compare_pair(base, run, rule=compare.Rule(k=2.0, class_floors_always=True))
    assert always.set_index("point_id").loc["short-a", "verdict"] == "same"
    nofloor = compare.compare_pair(_points([("k", "short-a", 2e-6, KERNEL, 0.01)]),
                                   _points([("k", "short-a", 2.3e-6, KERNEL, 0.01)]),
                                   rule=rule).iloc[0]
    assert nofloor["verdict"] == "same" and nofloor["bar_from"] == "class floor"
    assert "have a side measured without trials" not in compare_text.format_text(cmp.reset_index())


def test_unstable_never_fails_the_gate(tmp_path, capsys):
    """Host work slower beyond any bar leaves --fail-on-slower at exit 0; a kernel slower
    by 10 % exits 1."""
    folders = []
    for name, cpu_t, k_t in (("a", 1e-3, 100e-6), ("b", 3e-3, 100e-6), ("c", 1e-3, 110e-6)):
        raw = tmp_path / name / "raw" / "e"
        raw.mkdir(parents=True)
        for pid, t, timer in (("cpu-x", cpu_t, HOST), ("gpu-x", k_t, KERNEL)):
            rec = {"schema_version": results.SCHEMA_VERSION, "experiment": "e",
                   "variant": pid.split("-")[0], "point_id": pid, "status": "ok",
                   "provenance": {"gpu_name": "G"},
                   "timing": {"samples_s": [t] * 10, "timer": timer}}
            (raw / f"{pid}.json").write_text(json.dumps(rec))
        folders.append(tmp_path / name)
    assert cli.main(["compare", str(folders[0]), str(folders[1]), "--fail-on-slower"]) == 0
    assert cli.main(["compare", str(folders[0]), str(folders[2]), "--fail-on-slower"]) == 1
    capsys.readouterr()


def _grid_points(rows: list[tuple[str, float, float]], sm_count: float = 132) -> result_folders.Run:
    """Kernel points (point, time, blocks of its launch) timed in trials that agree within
    0.2 %, on a job with a 20 ns floor and `sm_count` SMs."""
    df = pd.DataFrame([{"experiment": "matmul", "point_id": pid, "variant": "warptile",
                        "gpu": "G", "status": "ok", "median_s": t, "noise": 0.002,
                        "n_samples": 10, "method": KERNEL, "trial_spread": 0.002,
                        "floor_s": 20e-9, "blocks": blocks, "sm_count": sm_count}
                       for pid, t, blocks in rows], columns=result_folders.POINT_COLS)
    return result_folders.Run("x", Path("x"), "G", df)


def test_a_kernel_with_fewer_blocks_than_sms_is_small_grid():
    """The 1.089x two H100s gave a 6-block warp tile of unchanged code is 'same' under the
    small-grid floor (10 %), whatever the rule; 1.12x is still slower. A grid of at least
    one block per SM, or a record without the block count or the SM count, is a kernel
    judged as before (slower at 1.089x)."""
    base = _grid_points([("six", 44.5e-6, 6), ("six-far", 44.5e-6, 6), ("full", 44.5e-6, 132),
                         ("unknown", 44.5e-6, math.nan)])
    run = _grid_points([("six", 48.46e-6, 6), ("six-far", 49.9e-6, 6), ("full", 48.46e-6, 132),
                        ("unknown", 48.46e-6, math.nan)])
    for rule in (compare.Rule(3.0, True), compare.Rule(3.0, False)):
        cmp = compare.compare_pair(base, run, rule=rule).set_index("point_id")
        assert cmp.loc["six", "class"] == "small-grid" and cmp.loc["six", "verdict"] == "same"
        assert cmp.loc["six", "bar_from"] == "class floor"
        assert cmp.loc["six", "bar"] == pytest.approx(compare.SMALL_GRID_FLOOR)
        assert cmp.loc["six-far", "verdict"] == "slower"
        for pid in ("full", "unknown"):
            assert cmp.loc[pid, "class"] == "kernel" and cmp.loc[pid, "verdict"] == "slower"
    no_sms = compare.compare_pair(_grid_points([("six", 44.5e-6, 6)], math.nan),
                                  _grid_points([("six", 48.46e-6, 6)], math.nan)).iloc[0]
    assert no_sms["class"] == "kernel" and no_sms["verdict"] == "slower"
    text = compare_text.format_text(compare.compare_pair(base, run))
    assert "small-grid: 1 (1 slower" in text and "kernel: 2 (2 slower" in text


def test_launch_blocks_and_sm_count_come_from_the_records(tmp_path, capsys):
    """A record's launch.blocks and provenance sm_count make a point small-grid: the gate
    passes the 1.089x of a 6-block kernel; without them (an older record) it fails."""
    def write(folder: Path, t: float, launch: bool) -> Path:
        raw = folder / "raw" / "matmul"
        raw.mkdir(parents=True)
        rec = {"schema_version": results.SCHEMA_VERSION, "experiment": "matmul",
               "variant": "warptile", "point_id": "warptile-m256", "status": "ok",
               "provenance": {"gpu_name": "G", **({"sm_count": 132} if launch else {})},
               "floor": {"floor_s": 20e-9},
               "timing": {"samples_s": [t] * 10, "timer": KERNEL, "trial_spread": 0.002}}
        if launch:
            rec["launch"] = {"grid": [3, 2, 1], "block": [128, 1, 1], "blocks": 6,
                             "threads_per_block": 128}
        (raw / "warptile-m256.json").write_text(json.dumps(rec))
        return folder
    new = [str(write(tmp_path / n, t, True)) for n, t in (("a", 44.5e-6), ("b", 48.46e-6))]
    old = [str(write(tmp_path / n, t, False)) for n, t in (("c", 44.5e-6), ("d", 48.46e-6))]
    assert cli.main(["compare", *new, "--fail-on-slower"]) == 0
    assert cli.main(["compare", *old, "--fail-on-slower"]) == 1
    pts = result_folders.load_points(Path(new[0]))
    assert pts.loc[0, "blocks"] == 6 and pts.loc[0, "sm_count"] == 132
    capsys.readouterr()


def _trial_run(rows: list[tuple[str, str, float]], name: str) -> result_folders.Run:
    """Kernel points timed in trials that agree within 2 %, on a job with a 20 ns floor."""
    df = pd.DataFrame([{"experiment": e, "point_id": pid, "variant": "v", "gpu": "G",
                        "status": "ok", "median_s": t, "noise": 0.002, "n_samples": 10,
                        "method": KERNEL, "trial_spread": 0.02, "floor_s": 20e-9}
                       for e, pid, t in rows], columns=result_folders.POINT_COLS)
    return result_folders.Run(name, Path(name), "G", df)


def _choose_k_runs():
    """100 kernel points; the unchanged rerun moves 3 of them by 6 %; the planted run makes
    the 10 points of experiment 'v' 15 % slower."""
    pts = [("v" if i < 10 else "w", f"p{i}", 10e-6 * (1 + i)) for i in range(100)]
    base = _trial_run(pts, "a")
    same = _trial_run([(e, p, t * (1.06 if i in (20, 40, 60) else 1.0))
                       for i, (e, p, t) in enumerate(pts)], "b")
    planted = _trial_run([(e, p, t * (1.15 if e == "v" else 1.0)) for e, p, t in pts], "p")
    return base, same, planted


def test_choose_k_finds_the_k_that_passes_unchanged_code_and_catches_the_plant():
    base, same, planted = _choose_k_runs()
    ks = (0.0, 1.0, 2.0, 2.5, 3.0, 4.0, 5.0, 6.0)
    table = compare_calibration.choose_k(base, same, planted, ks=ks)
    t = table[~table["class_floors_always"]].set_index("k")
    # 6 % against a bar of max(5 %, k x 2.8 %): not 'same' up to k = 2, same from 2.5
    assert t.loc[2.0, "not_same"] == 3 and t.loc[2.0, "slower"] == 3 and not t.loc[2.0, "ok"]
    assert t.loc[2.5, "not_same"] == 0 and t.loc[2.5, "ok"]
    # 15 % is caught while k x 2.8 % stays below it: k <= 5
    assert (t["planted"] == 10).all() and t.loc[5.0, "caught"] == 10 and t.loc[5.0, "ok"]
    assert t.loc[6.0, "caught"] == 0 and not t.loc[6.0, "ok"]
    assert t.loc[0.0, "other_slower"] == 0 and t.loc[0.0, "planted_exit"] == 1
    rule, why = compare_calibration.recommend_k(table)
    assert rule == compare.Rule(4.0, False) and "from 2.5 to 5" in why


def test_choose_k_without_a_candidate_says_what_is_closest():
    base, same, _ = _choose_k_runs()
    table = compare_calibration.choose_k(base, same, ks=(0.0, 1.0))
    rule, why = compare_calibration.recommend_k(table)
    assert rule is None and "the fewest not 'same' is 3.0 %" in why


def test_the_choose_k_tool_on_result_folders(tmp_path, capsys):
    import importlib.util

    spec = importlib.util.spec_from_file_location("choose_k", ROOT / "tools" / "choose_k.py")
    tool = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(tool)
    folders = {}
    for run in _choose_k_runs():
        for r in run.points.itertuples():
            raw = tmp_path / run.label / "raw" / r.experiment
            raw.mkdir(parents=True, exist_ok=True)
            samples = [r.median_s] * 10
            rec = {"schema_version": results.SCHEMA_VERSION, "experiment": r.experiment,
                   "variant": r.variant, "point_id": r.point_id, "status": "ok",
                   "provenance": {"gpu_name": "G"}, "floor": {"floor_s": r.floor_s},
                   "timing": {"samples_s": samples, "timer": KERNEL,
                              "trial_spread": r.trial_spread}}
            (raw / f"{r.point_id}.json").write_text(json.dumps(rec))
        folders[run.label] = tmp_path / run.label
    rc = tool.main([str(folders["a"]), str(folders["b"]), "--planted", str(folders["p"]),
                    "--ks", "1", "3", "8", "--csv", str(tmp_path / "k.csv")])
    out = capsys.readouterr().out
    assert rc == 0 and "k = 3: every k from 3 to 3" in out
    assert "Set K_TRIALS = 3 and CLASS_FLOORS_ALWAYS = False" in out
    assert len(pd.read_csv(tmp_path / "k.csv")) == 6
    assert tool.main([str(folders["a"]), str(folders["b"]), "--ks", "0"]) == 1
    assert tool.main([str(tmp_path / "missing"), str(folders["b"])]) == 2
