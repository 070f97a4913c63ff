"""Nsight Compute counters (cudalab/profiler.py) on the CPU: reading ncu's `--csv --page raw`
table, grouping its rows by the marker kernel, the counters of a point, the harness's
profile mode, the config block, and every failure path through the real runner with a fake
`ncu` on PATH (tests/data/fake_ncu: it imitates ncu's output and exit, it runs no child)."""

from __future__ import annotations

import json
import math
import os
import shutil
from pathlib import Path

import pytest
import yaml

from cudalab import config as cfg
from cudalab import doctor, ncu_csv, profiler, results, runner
from cudalab.experiments import REGISTRY
from cudalab.experiments.base import Check, Experiment, Point, Result
from cudalab.harness import PROFILE_TIMER, Harness, Settings, WallTimer

ROOT = Path(__file__).resolve().parent.parent
FAKE_NCU = ROOT / "tests" / "data" / "fake_ncu"
STALL = "smsp__average_warps_issue_stalled_{}_per_issue_active.ratio"
DEFAULTS = yaml.safe_load((ROOT / "workflow" / "schemas" / "config.schema.yaml").read_text())[
    "properties"]["profile"]["properties"]["metrics"]["default"]
# Real output of Nsight Compute 2025.3.1 on an H100 (a probe with this design: a marker
# with grid = point + 1, then vadd; point 1 also runs scale), every column ncu printed.
H100_CSV = ROOT / "tests" / "data" / "ncu_h100_sample_raw.csv"

# Written by hand after the real format: ==PROF== lines, a header (11 fixed columns, then
# the metrics), a units row, one row per kernel; values quoted, thousands separators, n/a.
RAW_CSV = "\n".join([
    "==PROF== Connected to process 9157 (/usr/bin/python3.12)",
    '==PROF== Profiling "cudalab_marker" - 0: 0%....50%....100% - 9 passes',
    '"ID","Process ID","Process Name","Host Name","Kernel Name","Context","Stream",'
    '"Block Size","Grid Size","Device","CC","gpu__time_duration.sum",'
    '"launch__registers_per_thread","lts__t_sector_hit_rate.pct",'
    f'"{STALL.format("long_scoreboard")}","{STALL.format("selected")}",'
    f'"{STALL.format("barrier")}"',
    '"","","","","","","","","","","","nsecond","register/thread","%","","",""',
    '"0","9157","python3.12","127.0.0.1","cudalab_marker","1","7","(1, 1, 1)",'
    '"(1, 1, 1)","0","9.0","1,632","4","0","0","1","0"',
    '"1","9157","python3.12","127.0.0.1","matmul_tiled","1","7","(16, 16, 1)",'
    '"(20, 10, 1)","0","9.0","8,064.5","38","93.71","3.05","1.00","1.52"',
    '"2","9157","python3.12","127.0.0.1","cudalab_marker","1","7","(1, 1, 1)",'
    '"(2, 1, 1)","0","9.0","1,600","4","0","0","1","0"',
    '"3","9157","python3.12","127.0.0.1","void gemm<float, 128>(int, const float *, '
    'float *)","1","7","(256, 1, 1)","(1,024, 1, 1)","0","9.0","1,204,224","128","n/a",'
    '"0.4","1","7.25"',
    '"4","9157","python3.12","127.0.0.1","splitk_reduce(float *)","1","7","(256, 1, 1)",'
    '"(64, 1, 1)","0","9.0","3,776","32","81.5","2.1","1","0"',
    "==PROF== Disconnected from process 9157",
])


# -- reading the CSV ----------------------------------------------------------------------
def test_raw_csv_rows_keep_launch_order_names_grids_and_values():
    rows = ncu_csv.parse_raw_csv(RAW_CSV)
    assert [r.name.split("(")[0] for r in rows] == [
        "cudalab_marker", "matmul_tiled", "cudalab_marker", "void gemm<float, 128>",
        "splitk_reduce"]
    assert [r.grid_x for r in rows] == [1, 20, 2, 1024, 64]
    gemm = rows[3]
    assert gemm.values["gpu__time_duration.sum"] == 1204224.0  # "1,204,224"
    assert gemm.units["gpu__time_duration.sum"] == "nsecond"
    assert gemm.time_us() == pytest.approx(1204.224)
    assert math.isnan(gemm.values["lts__t_sector_hit_rate.pct"])  # "n/a"
    assert rows[1].values["launch__registers_per_thread"] == 38.0
    assert [r.is_marker for r in rows] == [True, False, True, False, False]


def test_parse_number_reads_separators_and_refuses_text():
    assert ncu_csv.parse_number("1,024") == 1024.0
    assert ncu_csv.parse_number(" 93.71 ") == 93.71
    assert math.isnan(ncu_csv.parse_number("n/a")) and math.isnan(ncu_csv.parse_number(""))


def test_columns_that_are_no_metric_are_not_read_as_counters():
    text = ('"ID","Kernel Name","Grid Size","CC","Estimated Speedup","dram__bytes.sum"\n'
            '"","","","","","byte"\n"0","k","(4, 1, 1)","9.0","12.5","2,048"\n')
    (row,) = ncu_csv.parse_raw_csv(text)
    assert (row.values, row.units, row.grid_x) == ({"dram__bytes.sum": 2048.0},
                                                   {"dram__bytes.sum": "byte"}, 4)


def test_output_without_a_table_has_no_rows():
    perm = ("==PROF== Connected to process 1\n==ERROR== ERR_NVGPUCTRPERM - The user does not "
            "have permission to access NVIDIA GPU Performance Counters on the target device 0.")
    assert ncu_csv.parse_raw_csv(perm) == [] and ncu_csv.parse_raw_csv("") == []


# -- grouping by the marker ---------------------------------------------------------------
def _row(name: str, grid: int, t_ns: float = 1000.0, **values: float) -> ncu_csv.KernelRow:
    return ncu_csv.KernelRow(name, grid, {"gpu__time_duration.sum": t_ns, **values},
                              {"gpu__time_duration.sum": "nsecond"})


def test_kernels_up_to_the_next_marker_belong_to_the_marker_point():
    groups = ncu_csv.group_by_marker(ncu_csv.parse_raw_csv(RAW_CSV), n_points=2)
    assert [k.name for k in groups[0]] == ["matmul_tiled"]
    assert [k.grid_x for k in groups[1]] == [1024, 64]


def test_grouping_merges_a_point_that_opened_its_range_twice_and_drops_strays():
    m = ncu_csv.MARKER_KERNEL
    rows = [_row("stray_before_any_marker", 1), _row(m, 1), _row("a", 1), _row(m, 1),
            _row("a_again", 1), _row(m, 3), _row("c", 1), _row(m, 9), _row("out_of_range", 1),
            _row(m, 2)]
    groups = ncu_csv.group_by_marker(rows, n_points=3)
    assert {i: [k.name for k in ks] for i, ks in groups.items()} == {
        0: ["a", "a_again"], 2: ["c"], 1: []}
    runs = ncu_csv.group_runs(rows, n_points=3)
    assert {i: [[k.name for k in run] for run in rs] for i, rs in runs.items()} == {
        0: [["a"], ["a_again"]], 2: [["c"]], 1: [[]]}


def test_the_time_pass_keeps_the_median_run_of_summed_kernels():
    def k(t_ns: float) -> ncu_csv.KernelRow:
        return ncu_csv.KernelRow("k", 1, {ncu_csv.TIME_METRIC: t_ns},
                                  {ncu_csv.TIME_METRIC: "nsecond"})

    runs = [[k(1000), k(500)], [k(2000), k(900)], [k(1100), k(450)], []]
    v = ncu_csv.time_pass_values(runs)
    # per run 1.5, 2.9, 1.55 us (an empty run launched nothing and is no time)
    assert v == {"ncu_time_us": pytest.approx(1.55), "ncu_time_runs": 3}
    nothing = ncu_csv.time_pass_values([])
    assert math.isnan(nothing["ncu_time_us"]) and nothing["ncu_time_runs"] == 0


# -- one point's counters -----------------------------------------------------------------
def test_the_longest_kernel_gives_the_counters_and_the_times_add_up():
    groups = ncu_csv.group_by_marker(ncu_csv.parse_raw_csv(RAW_CSV), n_points=2)
    c = ncu_csv.point_counters(groups[1], DEFAULTS)
    assert c["ncu_kernel"] == "void gemm<float, 128>"  # 1204 us beats 3.8 us
    assert c["ncu_kernels"] == 2
    assert c["ncu_replay_time_us"] == pytest.approx(1204.224 + 3.776)
    assert c["ncu_registers"] == 128.0
    assert math.isnan(c["ncu_l2_hit_rate_pct"])
    # stall reasons: selected is no stall, the largest first, one decimal
    assert c["ncu_top_stall"] == "barrier 7.2, long_scoreboard 0.4"
    single = ncu_csv.point_counters(groups[0], DEFAULTS)
    assert single["ncu_replay_time_us"] == pytest.approx(8.0645)
    assert (single["ncu_l2_hit_rate_pct"], single["ncu_kernel"]) == (93.71, "matmul_tiled")
    assert single["ncu_top_stall"] == "long_scoreboard 3.0, barrier 1.5"


def test_bank_conflicts_add_loads_and_stores_and_unknown_metrics_get_a_column_name():
    ld, st = ("l1tex__data_bank_conflicts_pipe_lsu_mem_shared_op_ld.sum",
              "l1tex__data_bank_conflicts_pipe_lsu_mem_shared_op_st.sum")
    extra = "sm__inst_executed.avg.per_cycle_active"
    row = _row("k", 1, **{ld: 1024.0, st: 3.0, extra: 1.5, "device__attribute_chip": 384.0})
    c = ncu_csv.point_counters([row], [ld, st, extra, ncu_csv.TIME_METRIC])
    assert (c["ncu_smem_bank_conflicts_ld"], c["ncu_smem_bank_conflicts_st"]) == (1024.0, 3.0)
    assert c["ncu_smem_bank_conflicts"] == 1027.0
    assert c["ncu_sm_inst_executed_avg_per_cycle_active"] == 1.5
    assert c["ncu_top_stall"] == "" and "ncu_device_attribute_chip" not in c


def test_the_real_h100_output_gives_each_point_its_kernel_and_only_the_asked_counters():
    rows = ncu_csv.parse_raw_csv(H100_CSV.read_text())
    assert len(rows[0].values) > 200  # the raw page prints every device__/launch__ attribute
    groups = ncu_csv.group_by_marker(rows, n_points=3)
    assert {i: [k.name for k in ks] for i, ks in groups.items()} == {
        0: ["vadd"], 1: ["vadd", "scale"], 2: ["vadd"]}
    c = [ncu_csv.point_counters(groups[i], profiler.metric_list(DEFAULTS)) for i in range(3)]
    assert [x["ncu_replay_time_us"] for x in c] == pytest.approx([6.304, 6.304 + 7.680, 6.144])
    assert [x["ncu_kernel"] for x in c] == ["vadd", "scale", "vadd"]  # scale: 7.7 > 6.3 us
    assert c[1] == pytest.approx({
        "ncu_achieved_occupancy_pct": 43.73, "ncu_theoretical_occupancy_pct": 100.0,
        "ncu_dram_throughput_pct": 16.42, "ncu_l2_hit_rate_pct": 56.84,
        "ncu_l2_throughput_pct": 34.01, "ncu_smem_bank_conflicts_ld": 0.0,
        "ncu_smem_bank_conflicts_st": 0.0, "ncu_smem_bank_conflicts": 0.0,
        "ncu_registers": 16.0, "ncu_occupancy_limit_blocks": 32.0,
        "ncu_occupancy_limit_registers": 32.0, "ncu_occupancy_limit_smem": 32.0,
        "ncu_occupancy_limit_warps": 16.0, "ncu_replay_time_us": 13.984,
        "ncu_top_stall": "long_scoreboard 42.2", "ncu_kernel": "scale", "ncu_kernels": 2})


def test_top_stalls_keeps_three_and_skips_zeros():
    values = {STALL.format(r): v for r, v in
              [("wait", 1.0), ("barrier", 5.0), ("long_scoreboard", 4.14), ("mio_throttle", 0.5),
               ("drain", 0.0), ("selected", 9.0)]}
    assert ncu_csv.top_stalls(values) == "barrier 5.0, long_scoreboard 4.1, wait 1.0"


# -- the harness's profile mode -----------------------------------------------------------
class Recorder:
    """A Profiler and fn that log what happens, in order."""

    def __init__(self, profile_all: bool = True, runs: int = 1) -> None:
        self.events: list[str] = []
        self.profile_all = profile_all
        self.runs = runs

    def begin(self) -> bool:
        self.events.append("begin")
        return self.profile_all

    def mark(self) -> None:
        self.events.append("mark")

    def end(self) -> None:
        self.events.append("end")

    def fn(self) -> None:
        self.events.append("fn")


def test_profile_mode_warms_up_as_the_timings_do_then_runs_once_profiled_and_times_nothing():
    rec = Recorder()
    h = Harness(Settings(warmup=2, min_samples=10), profiler=rec)
    t = h.measure(rec.fn, WallTimer(), asynchronous=True)
    assert rec.events == ["fn", "fn", "begin", "fn", "end"]
    assert (t.timer, t.n, t.batch, t.stop_reason) == (PROFILE_TIMER, 1, 1, "profiled")
    assert "not a timing" in t.note


def test_profile_mode_marks_every_further_run_of_a_point():
    rec = Recorder(runs=3)
    Harness(Settings(warmup=0), profiler=rec).measure(rec.fn, WallTimer())
    assert rec.events == ["fn", "begin", "fn", "mark", "fn", "mark", "fn", "end"]


def test_a_run_the_profiler_declines_is_not_closed_nor_repeated():
    rec = Recorder(profile_all=False, runs=3)
    Harness(Settings(warmup=1), profiler=rec).measure(rec.fn, WallTimer())
    assert rec.events == ["fn", "begin", "fn"]


def test_the_ncu_range_profiles_a_point_once_with_its_marker_grid():
    log: list[str] = []
    rng = profiler.NcuRange(start=lambda: log.append("start") or 0,
                            stop=lambda: log.append("stop") or 0,
                            marker=lambda blocks: log.append(f"marker<<<{blocks}>>>"),
                            sync=lambda: log.append("sync"))
    h = Harness(Settings(warmup=1), profiler=rng)
    h.measure(lambda: log.append("fn"), WallTimer())  # before any point: not profiled
    assert log == ["fn", "fn"]
    log.clear()
    rng.point_index = 4
    h.measure(lambda: log.append("fn"), WallTimer())
    h.measure(lambda: log.append("phase"), WallTimer())  # the same point's copy phase
    assert log == ["fn", "start", "marker<<<5>>>", "fn", "sync", "stop", "phase", "phase"]


def test_a_profiler_call_the_driver_refuses_is_an_error():
    rng = profiler.NcuRange(start=lambda: 1, stop=lambda: 0, marker=lambda b: None,
                            sync=lambda: None)
    rng.point_index = 0
    with pytest.raises(RuntimeError, match=r"cuProfilerStart failed \(CUresult 1\)"):
        rng.begin()


# -- the config block ---------------------------------------------------------------------
def _schema_profile() -> dict:
    schema = yaml.safe_load((ROOT / "workflow" / "schemas" / "config.schema.yaml").read_text())
    return schema["properties"]["profile"]


def test_profile_is_off_by_default_and_config_yaml_lists_the_default_metrics(validated):
    c = validated({"experiments": {"vector_add": {}}})
    defaults = _schema_profile()["properties"]["metrics"]["default"]
    assert c["profile"] == {"ncu": False, "metrics": defaults, "timeout_s": 600}
    assert cfg.load(ROOT / "config.yaml")["profile"] == c["profile"]
    # every default metric but the stall regex has a short column name
    assert set(defaults) - set(ncu_csv.SHORT_NAMES) == {
        m for m in defaults if m.startswith("regex:")}


@pytest.mark.parametrize("profile, needles", [
    ({"ncu": "yes"}, ["profile.ncu", "wrong type"]),
    ({"nuc": True}, ["profile", "'nuc'", "did you mean 'ncu'"]),
    ({"metrics": []}, ["profile.metrics", "needs at least 1"]),
    ({"metrics": ["a__b.sum,c__d.sum"]}, ["profile.metrics[0]", "no commas"]),
    ({"metrics": ["dram throughput"]}, ["profile.metrics[0]", "ncu metric name"]),
    ({"timeout_s": 0}, ["profile.timeout_s", ">= 10"]),
])
def test_bad_profile_blocks_are_named(profile, needles):
    with pytest.raises(cfg.ConfigError) as exc:
        cfg.validate({"profile": profile, "experiments": {"vector_add": {}}})
    for n in needles:
        assert n in str(exc.value), str(exc.value)


def test_turning_counters_on_reruns_the_job_and_their_settings_matter_only_then(validated):
    base = validated({"experiments": {"vector_add": {}}})
    off_other = validated({"profile": {"timeout_s": 60}, "experiments": {"vector_add": {}}})
    on = validated({"profile": {"ncu": True}, "experiments": {"vector_add": {}}})
    on_other = validated({"profile": {"ncu": True, "timeout_s": 60},
                          "experiments": {"vector_add": {}}})
    fp = [runner.job_fingerprint(c, "vector_add") for c in (base, off_other, on, on_other)]
    assert fp[0] == fp[1] and len({fp[0], fp[2], fp[3]}) == 3


# -- through the real runner, with a fake GPU session and a fake ncu ------------------------
class FakeGpu(Experiment):
    """Three GPU points (the middle one fails its check) and a CPU point."""

    name = "fakencu"
    schema = {"type": "object"}

    def points(self, block):
        return [Point(self.name, "cpu", {"n": 0}, gpu=False)] + [
            Point(self.name, "k", {"n": n}) for n in (1, 2, 3, 4)]

    def measure(self, ctx, point):
        t = ctx.harness.measure(lambda: None, WallTimer())
        wrong = point.params["n"] == 2
        return Result(t, flops=1.0, check=Check(1.0 if wrong else 0.0, 0.5, "abs"))


class FakeSession:
    index = 0
    info = {"gpu_name": "Fake H100", "gpu_uuid": "GPU-fake", "gpu_pci_bus_id": "0000:18:00.0",
            "compute_capability": "9.0"}


@pytest.fixture
def fake_job(monkeypatch, tmp_path):
    """run(mode, **profile) -> (manifest, records by point id, stderr) of one job."""
    from cudalab import gpu as gpumod

    monkeypatch.setitem(REGISTRY, "fakencu", FakeGpu())
    monkeypatch.setattr(gpumod, "open_session", lambda index=0: FakeSession())
    bindir = tmp_path / "bin"
    bindir.mkdir()
    shutil.copy(FAKE_NCU, bindir / "ncu")
    monkeypatch.setenv("PATH", f"{bindir}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.setenv("FAKE_NCU_ARGV", str(tmp_path / "argv.json"))
    out = tmp_path / "results"

    def run(mode: str = "ok", capsys=None, **profile):
        monkeypatch.setenv("FAKE_NCU_MODE", mode)
        (tmp_path / "argv.json").unlink(missing_ok=True)
        config = cfg.validate({"measurement": {"warmup": 0, "min_samples": 3, "budget_s": 0.01},
                               "telemetry": {"nvidia_smi": False, "nvml": False},
                               "profile": {"ncu": True}, "experiments": {"fakencu": {}}})
        config["profile"] |= profile  # below the schema's minimum timeout: tests only
        manifest = runner.run_experiment(config, "fakencu", out)
        recs = {r["point_id"]: r for r in results.iter_records(out / "raw")}
        return manifest, recs

    run.argvs = lambda: json.loads((tmp_path / "argv.json").read_text())
    run.argv = lambda: run.argvs()[-1]  # the counters pass: the last ncu run
    run.out = out
    return run


OK_GPU = ["k-n1", "k-n3", "k-n4"]  # k-n2 is wrong: not profiled


def _ncu_status(recs: dict) -> dict[str, str | None]:
    return {k: r["metrics"].get("ncu_status") for k, r in recs.items()}


def test_counters_land_in_the_records_and_the_table(fake_job, capsys):
    m, recs = fake_job("ok")
    assert _ncu_status(recs) == {"cpu-n0": None, "k-n1": "ok", "k-n2": None, "k-n3": "ok",
                                 "k-n4": "ok"}
    n3 = recs["k-n3"]["metrics"]
    # the fake's point 1 (k-n3) ran two kernels: the second (500 ns longer) is the kernel
    assert n3["ncu_kernel"] == "kernel_1_1" and n3["ncu_kernels"] == 2
    assert n3["ncu_replay_time_us"] == pytest.approx(2.2345 + 2.7345)
    # the time pass: 5 runs, run r 100*r ns longer per kernel: the median run is r = 2
    assert n3["ncu_time_us"] == pytest.approx(2.4345 + 2.9345)
    assert n3["ncu_time_runs"] == profiler.TIME_RUNS == 5
    assert n3["ncu_clock_mhz"] == pytest.approx(1970.0) and n3["ncu_time_status"] == "ok"
    assert n3["ncu_registers"] == 24.0 and n3["ncu_dram_bytes"] == 2 * 1048576
    assert n3["ncu_smem_bank_conflicts"] == 2048 + 2049
    assert n3["ncu_top_stall"] == "long_scoreboard 4.1, barrier 2.0, wait 1.1"
    assert math.isnan(recs["k-n4"]["metrics"]["ncu_l2_hit_rate_pct"])  # n/a
    assert recs["k-n1"]["metrics"]["ncu_l2_hit_rate_pct"] == 50.25
    assert recs["k-n1"]["profile"]["version"] == "2025.3.1.0"
    df = results.build_table(recs.values())
    assert results.check_table(df) == []
    asked = {"achieved_occupancy_pct", "theoretical_occupancy_pct", "dram_throughput_pct",
             "dram_bytes", "l2_hit_rate_pct", "l2_throughput_pct", "l1_hit_rate_pct",
             "sm_throughput_pct", "smem_bank_conflicts_ld", "smem_bank_conflicts_st",
             "registers", "occupancy_limit_registers", "occupancy_limit_smem",
             "occupancy_limit_warps", "occupancy_limit_blocks", "replay_time_us",
             "smem_lsu_wavefronts", "cp_async_inst", "ldmatrix_inst", "tma_load_inst",
             "warp_inst"}
    derived = {"smem_bank_conflicts", "top_stall", "kernel", "kernels", "status",
               "time_us", "time_runs", "clock_mhz", "time_status"}
    assert {c for c in df.columns if c.startswith("m_ncu_")} == {
        f"m_ncu_{x}" for x in asked | derived}
    row = df.set_index("point_id").loc["k-n3"]
    assert row["m_ncu_achieved_occupancy_pct"] == 20.5 and row["m_ncu_status"] == "ok"
    assert m["profile"]["profiled"] == 3 and m["profile"]["status"] == "ok"
    assert "fakencu: ncu: 3 of 3 GPU point(s) profiled" in capsys.readouterr().err


def test_ncu_is_asked_for_the_ok_gpu_points_in_grid_order_with_the_configured_metrics(fake_job):
    fake_job("ok", metrics=["dram__throughput.avg.pct_of_peak_sustained_elapsed"])
    argv = fake_job.argv()
    for a, b in [("--target-processes", "all"), ("--profile-from-start", "off"),
                 ("--page", "raw"), ("--cache-control", "none"), ("--clock-control", "none"),
                 ("--metrics", "dram__throughput.avg.pct_of_peak_sustained_elapsed,"
                               "gpu__time_duration.sum,gpc__cycles_elapsed.avg.per_second")]:
        assert argv[argv.index(a) + 1] == b, (a, argv)
    assert "--csv" in argv
    child = argv[argv.index("-m"):]
    assert child[:3] == ["-m", "cudalab.profiler", "fakencu"]
    assert child[child.index("--points") + 1] == ",".join(OK_GPU)
    assert child[child.index("--runs") + 1] == "1"
    # first the time pass: the duration alone (one pass: nothing replayed, no other counter
    # collected: on an H100 the SM clock beside it added 0.1-0.26 us to every kernel), 5 runs
    first = fake_job.argvs()[0]
    assert first[first.index("--metrics") + 1] == "gpu__time_duration.sum"
    assert first[first.index("--runs") + 1] == "5"
    assert first[first.index("--cache-control") + 1] == "none"


def test_timings_are_untouched_and_profiled_points_are_not_profiled_again(fake_job, capsys):
    m, before = fake_job("ok", ncu=False)
    assert "profile" not in m and not any("ncu_status" in r["metrics"] for r in before.values())
    m, after = fake_job("ok")
    for pid in OK_GPU:
        assert after[pid]["cached"] and after[pid]["timing"] == before[pid]["timing"]
        assert after[pid]["metrics"]["ncu_status"] == "ok"
    fake_job("perm")  # nothing left to profile: ncu is not even started
    assert not (fake_job.out.parent / "argv.json").exists()
    assert "ncu: nothing to profile" in capsys.readouterr().err


@pytest.mark.parametrize("rc", ["0", "1"])
def test_counters_not_permitted_are_named_whatever_ncu_exits_with(fake_job, monkeypatch, rc):
    monkeypatch.setenv("FAKE_NCU_RC", rc)
    m, recs = fake_job("perm")
    assert {_ncu_status(recs)[p] for p in OK_GPU} == {profiler.PERM_REASON}
    assert profiler.PERM_REASON == (
        "not profiled: ERR_NVGPUCTRPERM (GPU performance counters not permitted for this "
        "user: see https://developer.nvidia.com/ERR_NVGPUCTRPERM)")
    assert m["counts"]["ok"] == 4 and m["profile"]["profiled"] == 0
    assert all(r["timing"]["timer"] == "perf_counter" for r in recs.values())
    assert len(fake_job.argvs()) == 1  # the counters pass would be refused just the same


def test_without_ncu_every_gpu_point_says_so_and_the_job_goes_on(fake_job, monkeypatch,
                                                                  capsys):
    monkeypatch.setenv("PATH", str(fake_job.out.parent / "nothing-here"))
    m, recs = fake_job("ok")
    assert {_ncu_status(recs)[p] for p in OK_GPU} == {"not profiled: ncu not found on PATH"}
    assert m["counts"]["ok"] == 4
    assert "3 GPU point(s) not profiled: ncu not found on PATH" in capsys.readouterr().err


def test_a_hung_ncu_is_killed_at_its_timeout(fake_job):
    m, recs = fake_job("timeout", timeout_s=1)
    assert {_ncu_status(recs)[p] for p in OK_GPU} == {
        "not profiled: ncu timed out after 1 s (profile.timeout_s)"}
    assert m["profile"]["rc"] is None and m["profile"]["seconds"] < 30
    assert len(fake_job.argvs()) == 1  # the longer counters pass is not even started


def test_a_crash_keeps_the_points_profiled_before_it(fake_job):
    _, recs = fake_job("crash")
    st = _ncu_status(recs)
    assert st["k-n1"] == "ok"
    assert st["k-n3"] == st["k-n4"] == (
        "not profiled: ncu exited with code 1: ==ERROR== Unknown Error on device 0.")


def test_a_point_missing_from_the_csv_is_named_and_the_others_are_kept(fake_job, capsys):
    m, recs = fake_job("missing")
    st = _ncu_status(recs)
    assert st["k-n1"] == st["k-n4"] == "ok"
    assert st["k-n3"] == "not profiled: no result for this point in ncu's CSV"
    assert m["profile"]["status"] == st["k-n3"]
    assert ("ncu: 2 of 3 GPU point(s) profiled in " in capsys.readouterr().err)


def test_a_point_that_failed_in_the_child_says_why(fake_job):
    _, recs = fake_job("failed")
    assert _ncu_status(recs)["k-n3"] == (
        "not profiled: failed in the profiling run: out of GPU memory: cuMemAlloc failed: "
        "out of memory")


def test_a_kernel_that_times_itself_brings_its_own_reading_from_the_time_pass(
        fake_job, monkeypatch):
    # the fake child reports own readings 100 + point index + runs / 10: the time pass's
    # (5 runs) end up in the record, not the counters pass's (1 run)
    monkeypatch.setattr(FakeGpu, "own_timer", "ns", raising=False)
    _, recs = fake_job("own")
    own = {p: recs[p]["metrics"].get("ncu_own_timer") for p in OK_GPU}
    assert own == {"k-n1": pytest.approx(100.5), "k-n3": pytest.approx(101.5),
                   "k-n4": pytest.approx(102.5)}
    _, plain = fake_job("ok")  # cached and profiled: unchanged
    assert plain["k-n1"]["metrics"]["ncu_own_timer"] == pytest.approx(100.5)


def test_the_child_records_the_own_timer_of_each_point(tmp_path, monkeypatch):
    """The profiling child itself, with an experiment whose kernel times itself (no GPU:
    a fake session; the harness in profile mode with a fake profiler range)."""
    from cudalab import gpu as gpumod

    class Own(FakeGpu):
        name = "fakeown"
        own_timer = "ns"

        def measure(self, ctx, point):
            res = super().measure(ctx, point)
            res.metrics["ns"] = 10.0 * point.params["n"]
            return res

    monkeypatch.setitem(REGISTRY, "fakeown", Own())
    monkeypatch.setattr(gpumod, "open_session", lambda index=0: FakeSession())
    monkeypatch.setattr(profiler.NcuRange, "for_session", classmethod(
        lambda cls, gpu, runs=1: cls(lambda: 0, lambda: 0, lambda blocks: None, lambda: None,
                                     runs)))
    config = cfg.validate({"measurement": {"warmup": 0}, "experiments": {"fakeown": {}}})
    (tmp_path / "config.json").write_text(json.dumps(config, default=str))
    rc = profiler.child_main(["fakeown", "--config", str(tmp_path / "config.json"),
                              "--points", "k-n1,k-n3", "--report", str(tmp_path / "r.json")])
    assert rc == 0
    assert json.loads((tmp_path / "r.json").read_text()) == {"k-n1": "ok", "k-n3": "ok"}
    assert json.loads((tmp_path / profiler.OWN_TIMER_FILE).read_text()) == {
        "k-n1": 10.0, "k-n3": 30.0}


def test_a_point_without_a_kernel_is_not_profiled(fake_job):
    _, recs = fake_job("nokernel")
    assert _ncu_status(recs)["k-n3"] == profiler.NO_KERNEL
    assert recs["k-n3"]["metrics"]["ncu_time_status"] == profiler.NO_KERNEL
    assert "ncu_time_us" not in recs["k-n3"]["metrics"]
    # the time pass saw it launch nothing: the counters pass does not walk it again
    time_argv, count_argv = fake_job.argvs()
    assert time_argv[time_argv.index("--points") + 1] == "k-n1,k-n3,k-n4"
    assert count_argv[count_argv.index("--points") + 1] == "k-n1,k-n4"
    # nor does a later run of the job
    fake_job("nokernel")
    assert not (fake_job.out.parent / "argv.json").exists()


def test_a_job_of_copies_gets_no_counters_pass(fake_job, capsys):
    m, recs = fake_job("copies")
    assert {_ncu_status(recs)[p] for p in OK_GPU} == {profiler.NO_KERNEL}
    assert len(fake_job.argvs()) == 1  # the time pass only
    assert "counters pass skipped: no kernel" in capsys.readouterr().err
    assert m["profile"]["rc"] is None and m["profile"]["time_rc"] == 0


def test_without_a_gpu_nothing_is_profiled(fake_job, monkeypatch):
    from cudalab import gpu as gpumod

    def no_gpu(index=0):
        raise gpumod.NoGpuError("no GPU")

    monkeypatch.setattr(gpumod, "open_session", no_gpu)
    m, recs = fake_job("ok")
    assert "profile" not in m and not (fake_job.out.parent / "argv.json").exists()
    assert {r["status"] for p, r in recs.items() if p != "cpu-n0"} == {"not_measured"}


# -- cudalab doctor's row -----------------------------------------------------------------
@pytest.mark.parametrize("mode, status, value", [
    ("ok", "ok", "(2025.3.1.0): counters permitted"),
    ("perm", "warn", "(2025.3.1.0): counters not permitted (ERR_NVGPUCTRPERM)"),
])
def test_doctor_names_ncu_its_version_and_whether_counters_are_permitted(
        tmp_path, monkeypatch, mode, status, value):
    shutil.copy(FAKE_NCU, tmp_path / "ncu")
    env = {**os.environ, "PATH": f"{tmp_path}{os.pathsep}{os.environ['PATH']}",
           "FAKE_NCU_MODE": mode}
    c = doctor.check_ncu(env, 0, have_gpu=True)
    assert (c.name, c.status) == ("ncu (Nsight Compute)", status)
    assert c.value == f"{tmp_path / 'ncu'} {value}"
    no_gpu = doctor.check_ncu(env, 0, have_gpu=False)
    assert no_gpu.value.endswith("(2025.3.1.0); counters not tried (no GPU)")
    absent = doctor.check_ncu({"PATH": str(tmp_path / "none")}, 0, have_gpu=True)
    assert (absent.status, absent.value) == ("info", "not found (optional: hardware counters)")


def test_the_profiler_writes_its_own_files_never_the_records(fake_job):
    """Each stage writes once: the counters land in profile/<experiment>/<point>.json, tied
    to the record's cache key; the raw record (its timing above all) keeps its bytes."""
    fake_job("ok", ncu=False)
    raw = fake_job.out / "raw" / "fakencu"
    before = {p.name: p.read_bytes() for p in raw.glob("*.json")}
    m, recs = fake_job("ok")
    for pid in OK_GPU:
        assert recs[pid]["metrics"]["ncu_status"] == "ok"
        counters = json.loads((fake_job.out / "profile" / "fakencu" / f"{pid}.json").read_text())
        assert counters["cache_key"] == recs[pid]["cache_key"]
        assert "timing" not in counters and counters["metrics"]["ncu_status"] == "ok"
        on_disk = json.loads((raw / f"{pid}.json").read_text())
        assert "ncu_status" not in on_disk.get("metrics", {}) and "profile" not in on_disk
        # the runner marks a reused record cached; nothing else of it changes
        first = json.loads(before[f"{pid}.json"])
        assert on_disk == first | {"cached": True}


def test_counters_of_another_measurement_are_not_merged(tmp_path):
    """A record measured again under another cache key does not take the old counters."""
    path = tmp_path / "raw" / "x" / "p.json"
    path.parent.mkdir(parents=True)
    rec = {"schema_version": results.SCHEMA_VERSION, "experiment": "x", "variant": "v",
           "point_id": "p", "status": "ok", "cache_key": "new", "metrics": {"gbps": 1.0}}
    path.write_text(json.dumps(rec))
    cpath = results.counters_path(path)
    assert cpath == tmp_path / "profile" / "x" / "p.json"
    cpath.parent.mkdir(parents=True)
    cpath.write_text(json.dumps({"schema_version": results.SCHEMA_VERSION, "cache_key": "old",
                                 "metrics": {"ncu_status": "ok"}, "profile": {"status": "ok"}}))
    assert results.read_record(path) == rec
    cpath.write_text(cpath.read_text().replace('"old"', '"new"'))
    assert results.read_record(path)["metrics"] == {"gbps": 1.0, "ncu_status": "ok"}
