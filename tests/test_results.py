"""The results schema, enforced on records recorded on a real H100 (tests/data/recorded_h100)."""

from __future__ import annotations

import json
import math
import os
import stat
from pathlib import Path

import pandas as pd
import pytest

from cudalab import results

ROOT = Path(__file__).resolve().parent.parent

RECORDED = ROOT / "tests" / "data" / "recorded_h100" / "raw"


@pytest.fixture
def recorded():
    return list(results.iter_records(RECORDED))


def test_recorded_records_aggregate_into_a_valid_table(recorded):
    df = results.build_table(recorded)
    assert results.check_table(df) == []
    assert len(df) == len(recorded) == 15
    assert list(df.columns[: len(results.COLUMNS)]) == list(results.COLUMNS)
    gpu = df[df["variant"] != "cpu"]
    assert (gpu["gpu_name"] == "NVIDIA H100 80GB HBM3").all()
    assert (gpu["timer"] == "cuda_event").all()
    assert gpu["nvcc_options"].str.contains("-O3").all()
    # GFLOP/s is derived in one place: flops / median time
    r = df.iloc[0]
    assert math.isclose(r["gflops"], r["flops"] / r["time_median_s"] / 1e9)
    assert {"p_m", "p_k", "p_n", "p_tile", "m_h2d_s", "m_copy_share"} <= set(df.columns)


def test_csv_round_trip_keeps_the_schema(recorded, tmp_path):
    df = results.build_table(recorded)
    written = results.write_table(df, tmp_path / "results.csv")
    assert written[0].exists()
    back = results.read_table(tmp_path / "results.csv")
    assert results.check_table(back) == []
    pd.testing.assert_series_equal(back["gflops"], df["gflops"], check_dtype=False)


def test_wrong_and_failed_points_carry_no_speed(recorded):
    wrong = dict(recorded[3])
    wrong["status"] = "wrong"
    wrong["reason"] = "rel_fro = 0.5 exceeds tolerance 0.0001"
    failed = {"schema_version": 1, "experiment": "matmul", "variant": "tiled",
              "point_id": "tiled-oom", "params": {"m": 1}, "status": "failed",
              "reason": "out of GPU memory: cuMemAlloc failed"}
    df = results.build_table([wrong, failed])
    assert results.check_table(df) == []
    assert df["gflops"].isna().all() and df["time_median_s"].isna().all()
    assert set(df["status"]) == {"wrong", "failed"}


def test_check_table_catches_schema_breaks(recorded):
    df = results.build_table(recorded)
    assert "missing column gflops" in results.check_table(df.drop(columns=["gflops"]))
    bad = df.copy()
    bad.loc[0, "status"] = "great"
    assert any("unknown status" in p for p in results.check_table(bad))
    leak = df.copy()
    leak["status"] = leak["status"].astype(object)
    leak.loc[0, "status"] = "wrong"
    leak["status"] = leak["status"].astype("string")
    assert any("carry a speed" in p for p in results.check_table(leak))
    assert any("duplicate" in p for p in results.check_table(pd.concat([df, df.iloc[:1]])))
    assert any("unexpected column" in p for p in results.check_table(df.assign(foo=1)))


def test_atomic_write_leaves_no_partial_file(tmp_path):
    p = tmp_path / "a" / "rec.json"
    results.write_json_atomic(p, {"x": 1})
    assert json.loads(p.read_text()) == {"x": 1}

    class Boom:
        pass

    with pytest.raises(TypeError):
        results.write_json_atomic(p, {"x": Boom()})
    assert json.loads(p.read_text()) == {"x": 1}  # old content intact
    assert [f.name for f in p.parent.iterdir()] == ["rec.json"]  # no temp left behind


@pytest.mark.parametrize("umask, mode", [(0o022, 0o644), (0o002, 0o664), (0o077, 0o600)])
def test_atomic_write_respects_the_umask(tmp_path, umask, mode):
    """Records are readable by the group/others as far as the umask allows (a mkstemp file
    would be 0600)."""
    old = os.umask(umask)
    try:
        p = tmp_path / "rec.json"
        results.write_json_atomic(p, {"x": 1})
        results.write_json_atomic(p, {"x": 2})  # a rewrite keeps the mode
        assert stat.S_IMODE(p.stat().st_mode) == mode
    finally:
        os.umask(old)


def test_truncated_or_foreign_records_are_ignored(tmp_path):
    d = tmp_path / "raw" / "matmul"
    d.mkdir(parents=True)
    (d / "half.json").write_text('{"schema_version": 1, "experi')
    (d / "old.json").write_text('{"schema_version": 0}')
    assert list(results.iter_records(tmp_path / "raw")) == []


def test_the_manual_documents_every_column():
    doc = (ROOT / "docs" / "results-schema.md").read_text()
    for col, (dtype, what) in results.COLUMNS.items():
        what = what.replace("|", "\\|")  # a Markdown table cell escapes its pipes
        assert f"| `{col}` | {dtype} | {what} |" in doc, col


def test_percent_of_peak_comes_from_the_declared_work_and_device_peaks(recorded):
    rec = next(r for r in recorded if r["variant"] == "tiled" and r["status"] == "ok")
    with_peaks = rec | {"work": rec["work"] | {"peak_mem_gbps": 3352.32,
                                                "peak_fp32_gflops": 66908.16}}
    df = results.build_table([with_peaks, rec])
    r = df[df["pct_peak_gflops"].notna()].iloc[0]
    assert r["pct_peak_gflops"] == pytest.approx(100 * r["gflops"] / 66908.16)
    assert r["pct_peak_gbps"] == pytest.approx(100 * r["gbps"] / 3352.32)
    # no peaks in the record (CPU point, PCIe experiment, older record): empty, not 0
    assert df["pct_peak_gflops"].isna().sum() == 1
    wrong = with_peaks | {"status": "wrong"}
    assert results.build_table([wrong])["pct_peak_gflops"].isna().all()


def test_device_peaks_from_driver_attributes():
    from cudalab import devicespec

    class FakeGpu:  # H100 SXM's driver attributes
        def __init__(self, attrs):
            self.attrs = attrs

        def attr(self, name):
            return self.attrs[name]

    h100 = {"COMPUTE_CAPABILITY_MAJOR": 9, "COMPUTE_CAPABILITY_MINOR": 0,
            "MULTIPROCESSOR_COUNT": 132, "CLOCK_RATE": 1_980_000,
            "MEMORY_CLOCK_RATE": 2_619_000, "GLOBAL_MEMORY_BUS_WIDTH": 5120}
    p = devicespec.device_peaks(FakeGpu(h100))
    assert p["peak_mem_gbps"] == pytest.approx(3352.32)
    assert p["peak_fp32_gflops"] == pytest.approx(66908.16)
    missing = devicespec.device_peaks(FakeGpu({}))
    assert all(math.isnan(v) for v in missing.values())
    future = devicespec.device_peaks(FakeGpu(h100 | {"COMPUTE_CAPABILITY_MAJOR": 99}))
    assert future["peak_mem_gbps"] == pytest.approx(3352.32)
    assert math.isnan(future["peak_fp32_gflops"])


def _copy_recorded(tmp_path: Path) -> Path:
    import shutil

    raw = tmp_path / "results" / "raw"
    shutil.copytree(RECORDED, raw)
    return raw


def test_aggregate_keeps_only_this_grid_on_this_runs_gpus(tmp_path, capsys):
    """Records of points no longer in the grid, and GPU points measured on another GPU, are
    left out of the table and counted in one line; CPU points are kept across GPUs."""
    from cudalab import cli

    raw = _copy_recorded(tmp_path)
    mm = raw / "matmul"
    n_grid = len(json.loads((mm / "_manifest.json").read_text())["points"])
    gpu_rec = json.loads(next(mm.glob("naive-*.json")).read_text())
    cpu_rec = json.loads(next(mm.glob("cpu-*.json")).read_text())
    stale = gpu_rec | {"point_id": "naive-m7-k7-n7-tile16"}  # an earlier grid's point
    other = gpu_rec | {"provenance": gpu_rec["provenance"] | {"gpu_uuid": "GPU-other"}}
    cpu_elsewhere = cpu_rec | {"provenance": cpu_rec["provenance"] | {"gpu_uuid": "GPU-other"}}
    results.write_json_atomic(mm / "naive-m7-k7-n7-tile16.json", stale)
    results.write_json_atomic(mm / f"{gpu_rec['point_id']}.json", other)
    results.write_json_atomic(mm / f"{cpu_rec['point_id']}.json", cpu_elsewhere)
    out = tmp_path / "results" / "results.csv"
    assert cli.main(["aggregate", "--results", str(tmp_path / "results"), "--out", str(out),
                     "--manifests", str(mm / "_manifest.json")]) == 0
    df = results.read_table(out)
    assert len(df) == n_grid - 1
    assert gpu_rec["point_id"] not in set(df["point_id"])
    assert cpu_rec["point_id"] in set(df["point_id"])
    assert "naive-m7-k7-n7-tile16" not in set(df["point_id"])
    line = capsys.readouterr().out
    assert (f"aggregate: {n_grid - 1} record(s) of this run's grid and GPU(s) in the table; "
            "left out 2 older record(s) under results/raw: 1 of points not in this config's "
            "grid, 1 measured on a GPU other than this run's") in line
    left = results.read_left_out(tmp_path / "results")
    assert left["not_in_grid"] == 1 and left["other_gpu"] == 1
    assert left["by_reason"] == {"not_in_grid": {"matmul": 1}, "other_gpu": {"matmul": 1}}


def test_aggregate_without_a_manifest_for_an_experiment_leaves_it_out(tmp_path):
    raw = _copy_recorded(tmp_path)
    recs = list(results.iter_records(raw))
    kept, left = results.select_records(recs, [])  # no experiment of this run
    assert kept == [] and left["not_in_grid"] == len(recs)
    kept, left = results.select_records(recs, results.read_manifests(raw))
    assert len(kept) == len(recs) and left["not_in_grid"] == left["other_gpu"] == 0


def test_the_launch_and_the_sm_count_become_columns(recorded):
    """A record's launch (blocks, threads per block) and its GPU's SM count are columns; a
    record without them (cuBLAS, host work, an older record) leaves them empty."""
    rec = next(r for r in recorded if r["variant"] == "tiled" and r["status"] == "ok")
    launch = {"grid": [3, 2, 1], "block": [16, 16, 1], "blocks": 6, "threads_per_block": 256}
    with_launch = rec | {"launch": launch, "point_id": "with-launch",
                         "provenance": rec["provenance"] | {"sm_count": 132}}
    df = results.build_table([with_launch, rec]).set_index("point_id")
    assert df.loc["with-launch", "launch_blocks"] == 6
    assert df.loc["with-launch", "launch_threads"] == 256
    assert df.loc["with-launch", "sm_count"] == 132
    assert df.loc[rec["point_id"], ["launch_blocks", "launch_threads", "sm_count"]].isna().all()
    assert not results.check_table(df.reset_index())
