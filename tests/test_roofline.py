"""The roofline figure and the memory-level columns, from synthetic results tables (with and
without the ceilings columns, with and without profiler columns) and from the committed H100
reference (which has none of them)."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from cudalab import (
    figcheck,
    figures,
    fmt,
    results,
    roofline,
    roofline_figure,
    run_ceilings,
    run_figures,
)

ROOT = Path(__file__).resolve().parent.parent
REFERENCE = ROOT / "reports" / "reference" / "NVIDIA-H100-80GB-HBM3" / "results.csv"
# the H100 reference as it was before ceilings existed (tests/data/h100_before_ceilings)
OLD_TABLE = ROOT / "tests" / "data" / "h100_before_ceilings" / "results.csv"
MiB = 1 << 20
L2 = 50 * MiB
HOT = json.dumps({"cold_l2": False, "method": "cuda_event_queued"})
COLD = json.dumps({"cold_l2": True, "method": "cuda_event_queued"})
CEILINGS = {"ceil_dram_gbps": 3000.0, "ceil_dram_memcpy_gbps": 2900.0, "ceil_l2_gbps": 9000.0,
            "ceil_smem_gbps": 30000.0, "ceil_fp32_gflops": 60000.0, "peak_fp32_gflops": 66900.0,
            "peak_l2_gbps": math.nan, "peak_smem_gbps": 33000.0, "l2_bytes": float(L2)}


def row(experiment: str, variant: str, flops: float, nbytes: float, seconds: float,
        harness: str = HOT, **extra) -> dict:
    """One ok GPU point as results.record_to_row would make it (theoretical peaks set)."""
    gbps = nbytes / seconds / 1e9
    gflops = flops / seconds / 1e9 if flops > 0 else math.nan
    return {"experiment": experiment, "variant": variant,
            "point_id": f"{variant}-{len(extra)}-{nbytes:g}-{flops:g}", "status": "ok",
            "timer": "cuda_event_queued", "harness": harness, "flops": flops or math.nan,
            "bytes": nbytes, "time_median_s": seconds, "gbps": gbps, "gflops": gflops,
            "peak_mem_gbps": 3352.0, "pct_peak_gbps": 100 * gbps / 3352.0,
            "pct_peak_gflops": 100 * gflops / 66900.0, "gpu_name": "Test GPU", **extra}


def synthetic(ceilings: bool, ncu: bool = False) -> pd.DataFrame:
    """matmul (flops), a copy in DRAM, a transpose in L2, one above the DRAM peak, and the
    device_query row that carries the L2 size in old tables."""
    n = 4096
    mm_bytes, mm_flops = 4.0 * 3 * n * n, 2.0 * n ** 3
    rows = [
        row("matmul", "naive", mm_flops, mm_bytes, mm_flops / 5e12, p_m=n, p_k=n, p_n=n),
        row("matmul", "cublas", mm_flops, mm_bytes, mm_flops / 50e12, p_m=n, p_k=n, p_n=n),
        row("vector_add", "gpu", 2.0 ** 26, 12 * 2.0 ** 26, 12 * 2.0 ** 26 / 2.7e12,
            p_n=2 ** 26, p_threads=256),
        row("coalescing", "copy", 0, 512.0 * MiB, 512 * MiB / 2.4e12),
        row("coalescing", "transpose_tiled", 0, 32.0 * MiB, 32 * MiB / 2.0e12, p_size=2048),
        row("coalescing", "transpose_padded", 0, 32.0 * MiB, 32 * MiB / 3.8e12, p_size=2048),
        row("coalescing", "transpose_padded", 0, 32.0 * MiB, 32 * MiB / 3.8e12, harness=COLD,
            p_size=2047),
        {"experiment": "matmul", "variant": "cpu", "point_id": "cpu", "status": "ok",
         "timer": "perf_counter", "flops": mm_flops, "bytes": mm_bytes,
         "time_median_s": 10.0, "gflops": mm_flops / 1e10, "gbps": mm_bytes / 1e10},
        {"experiment": "transfer", "variant": "pinned", "point_id": "h2d", "status": "ok",
         "timer": "cuda_event", "bytes": 1e9, "time_median_s": 0.02, "gbps": 50.0},
        {"experiment": "device_query", "variant": "device", "point_id": "dev",
         "status": "ok", "m_l2_bytes": float(L2), "m_peak_fp32_gflops": 66900.0},
    ]
    df = pd.DataFrame(rows)
    if ceilings:  # the columns of the contract, as results.py fills them
        for k, v in CEILINGS.items():
            df[k] = np.where(df["peak_mem_gbps"].notna(), v, np.nan)
        df["working_set_bytes"] = df["bytes"]
        df["memory_level"] = ["dram", "dram", "dram", "dram", "l2", "l2", "dram", "", "", ""]
        ceil = df["memory_level"].map({"dram": 3000.0, "l2": 9000.0})
        df["pct_ceil_gbps"] = 100 * df["gbps"] / ceil
        df["pct_ceil_gflops"] = 100 * df["gflops"] / 60000.0
        df["suspect"] = df["pct_ceil_gbps"] > 100
    if ncu:
        df["m_ncu_status"] = "ok"
        df["m_ncu_l2_hit_rate_pct"] = 91.0
    return df


@pytest.fixture(autouse=True, scope="module")
def style():
    figures.setup_style()


def _close(fig) -> None:
    import matplotlib.pyplot as plt

    plt.close(fig)


def test_intensity_is_declared_flops_over_declared_bytes():
    d = roofline.roofline_points(synthetic(ceilings=False))
    mm = d[d["variant"] == "naive"].iloc[0]
    assert mm["intensity"] == pytest.approx(2.0 * 4096 ** 3 / (12.0 * 4096 * 4096))
    va = d[d["experiment"] == "vector_add"].iloc[0]
    assert va["intensity"] == pytest.approx(1 / 12)
    # CPU points, PCIe copies, points without flops and device_query are not on the roofline
    assert set(d["variant"]) == {"naive", "cublas", "gpu"}
    bw = roofline.bandwidth_points(synthetic(ceilings=False))
    assert set(bw["variant"]) == {"copy", "transpose_tiled", "transpose_padded"}


@pytest.mark.parametrize("ceilings", [False, True])
def test_figure_places_every_point_on_its_panel(ceilings):
    df = synthetic(ceilings)
    fig = roofline_figure.draw(df)
    try:
        roof, bw = fig.axes[0], fig.axes[1]
        xy = np.vstack([c.get_offsets() for c in roof.collections if len(c.get_offsets())])
        pts = roofline.roofline_points(df)
        expect = {(round(a, 6), round(g, 3)) for a, g in zip(pts["intensity"], pts["gflops"],
                                                            strict=True)}
        drawn = {(round(float(a), 6), round(float(g), 3)) for a, g in xy}
        assert expect <= drawn
        assert roof.get_xscale() == "log" and roof.get_yscale() == "log"
        assert "FLOP/byte" in roof.get_xlabel() and "GFLOP/s" in roof.get_ylabel()
        labels = [t.get_text() for t in roof.get_legend().get_texts()]
        assert "FP32 theoretical: 66.9 TFLOP/s" in labels
        assert "DRAM theoretical: 3.35 TB/s" in labels
        assert ("DRAM measured: 3.00 TB/s" in labels) is ceilings
        assert ("L2 measured: 9.00 TB/s" in labels) is ceilings
        assert ("FP32 measured: 60.0 TFLOP/s" in labels) is ceilings
        bw_y = sorted(float(y) for c in bw.collections for _, y in c.get_offsets())
        assert pytest.approx(2400.0, rel=1e-6) in bw_y
        assert figcheck.problems(fig) == []
        assert fig.get_size_inches()[0] <= 11.5
    finally:
        _close(fig)


def test_measured_roof_lines_are_solid_theoretical_dashed():
    fig = roofline_figure.draw(synthetic(ceilings=True))
    try:
        styles = {ln.get_label(): ln.get_linestyle() for ln in fig.axes[0].get_lines()}
        assert styles["DRAM measured: 3.00 TB/s"] == "-"
        assert styles["DRAM theoretical: 3.35 TB/s"] == "--"
        # the DRAM slope bends into the FP32 roof at the ridge point
        ln = next(x for x in fig.axes[0].get_lines() if x.get_label().startswith("DRAM meas"))
        xs, ys = ln.get_data()
        assert ys[0] == pytest.approx(3000 * xs[0]) and ys[-1] == pytest.approx(60000)
    finally:
        _close(fig)


def test_lesson_points_are_labelled_best_and_worst():
    fig = roofline_figure.draw(synthetic(ceilings=True))
    try:
        texts = [t.get_text() for t in fig.axes[0].texts]
        assert "best matmul: cublas" in texts and "worst matmul: naive" in texts
        assert "best vector_add: gpu" in texts
    finally:
        _close(fig)


@pytest.mark.slow
def test_labels_never_collide_and_give_up_rather_than_overlap():
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(3, 2))
    ax.set(xlim=(0, 1), ylim=(0, 1))
    fig.tight_layout()
    fig.canvas.draw()
    labels = [(0.5, 0.5, f"a rather long label {i}") for i in range(12)]
    left = roofline_figure.place_labels(ax, labels)
    assert left  # the small axes cannot hold twelve: some are left out, none overlap
    assert figcheck.problems(fig) == []
    plt.close(fig)


def test_copies_only_gives_one_panel_and_nothing_gives_none():
    df = synthetic(ceilings=True)
    fig = roofline_figure.draw(df, "coalescing")
    try:
        assert len(fig.axes) == 1 and "bandwidth" in fig.axes[0].get_title()
    finally:
        _close(fig)
    assert roofline_figure.draw(df, "transfer") is None  # PCIe only: no device-memory point


def test_caption_says_when_ceilings_are_theoretical_only():
    old, new = synthetic(ceilings=False), synthetic(ceilings=True)
    assert "No ceilings were measured" in roofline_figure.caption(old)
    assert "Solid lines: ceilings measured" in roofline_figure.caption(new)
    assert "Red rings: 1 suspect" in roofline_figure.caption(new)


def test_ceilings_of_an_old_table_come_from_the_theoretical_columns():
    c = run_ceilings.ceilings_of(synthetic(ceilings=False))
    assert not c.measured
    assert c.dram_peak == 3352.0 and c.fp32_peak == pytest.approx(66900.0)
    assert c.l2_bytes == L2  # from device_query's row
    assert c.bandwidth("dram") == (3352.0, "theoretical")
    assert math.isnan(c.bandwidth("l2")[0])
    new = run_ceilings.ceilings_of(synthetic(ceilings=True))
    assert new.bandwidth("dram") == (3000.0, "measured")
    assert new.bandwidth("l2") == (9000.0, "measured")
    assert new.flops() == (60000.0, "measured")


def test_memory_level_is_derived_for_old_tables_by_the_contract_rule():
    d = roofline.annotate(synthetic(ceilings=False)).set_index("point_id")
    lv = dict(zip(d["variant"] + d["harness"].map(lambda h: "-cold" if h == COLD else ""),
                  d["memory_level"], strict=True))
    assert lv["copy"] == "dram"  # 512 MiB > 50 MiB L2
    assert lv["transpose_tiled"] == "l2"  # 32 MiB fits, hot
    assert lv["transpose_padded-cold"] == "dram"  # fits, but L2 flushed
    assert lv["cpu"] == "" and lv["pinned"] == ""  # CPU point, PCIe


def test_suspect_old_table_is_above_the_dram_peak_with_why():
    bad = roofline.distrust(synthetic(ceilings=False))
    assert len(bad) == 2  # the hot and the cold padded transpose, 3,800 GB/s > 3,352
    hot = next(b for b in bad if b["level"] == "l2")
    assert "fits the 50 MiB L2" in hot["why"] and "compare it with the L2 ceiling" in hot["why"]
    assert "113 % of the theoretical DRAM ceiling" in hot["why"]
    cold = next(b for b in bad if b["level"] == "dram")
    assert "from DRAM nothing is faster" in cold["why"]


def test_suspect_new_table_compares_each_point_with_its_level():
    d = roofline.annotate(synthetic(ceilings=True))
    bad = d[d["suspect"]]
    # hot L2 transpose at 3,800 < 9,000 GB/s is fine; the cold one is above DRAM's 3,000
    assert list(bad["harness"]) == [COLD]
    assert "of the measured DRAM ceiling 3.00 TB/s" in bad["suspect_why"].iloc[0]


def test_a_suspect_flag_of_the_table_is_kept_even_without_a_reason_here():
    df = synthetic(ceilings=True)
    df.loc[df["variant"] == "copy", "suspect"] = True
    d = roofline.annotate(df)
    why = d.loc[d["variant"] == "copy", "suspect_why"].iloc[0]
    assert "the results table compares it with" in why


def test_gflops_above_the_fp32_roof_is_suspect():
    df = synthetic(ceilings=True)
    df.loc[df["variant"] == "cublas", "gflops"] = 70000.0
    why = roofline.annotate(df).set_index("variant").loc["cublas", "suspect_why"]
    assert "above the measured FP32 ceiling" in why


def test_hot_cold_note():
    df = synthetic(ceilings=False)
    c = run_ceilings.ceilings_of(df)
    note = roofline.hot_cold_note(df[df["experiment"] == "coalescing"], c)
    assert note.startswith("Bandwidth measured mixed: 1 of 4 points cold")
    assert "2 of 4 points have a working set that fits the 50 MiB L2" in note
    hot = df[(df["experiment"] == "vector_add")]
    assert "hot: L2 not flushed" in roofline.hot_cold_note(hot, run_ceilings.ceilings_of(df))
    assert roofline.hot_cold_note(df[df["experiment"] == "transfer"]) == ""


def test_aggregate_writes_the_derived_columns_and_an_older_table_gets_them_on_load(tmp_path):
    """aggregate writes the memory level, roof and why-suspect columns once; the figures
    and the report read them back as they are. A table aggregated before those columns
    gets them derived on load, the same as annotating it."""
    import shutil

    from cudalab import cli

    shutil.copytree(ROOT / "tests" / "data" / "recorded_h100" / "raw", tmp_path / "raw")
    out = tmp_path / "results.csv"
    assert cli.main(["aggregate", "--results", str(tmp_path), "--out", str(out)]) == 0
    written = pd.read_csv(out)
    assert set(results.DERIVED_COLUMNS) <= set(written.columns)
    assert written["roof_name"].notna().all() and written["intensity"].notna().any()
    table = results.read_table(out)
    assert results.check_table(table) == []
    # read back as written: nothing is derived again
    assert roofline.annotate(table) is table
    pd.testing.assert_frame_equal(roofline.load_table(out), table)
    # a table from before the derived columns: derived on load, as annotate derives them
    old = roofline.load_table(OLD_TABLE)
    expect = roofline.annotate(results.read_table(OLD_TABLE).drop(
        columns=list(results.DERIVED_COLUMNS)))
    assert old["roof_name"].notna().all()
    for col in ("memory_level", "suspect", "suspect_why", "intensity", "roof_gflops"):
        pd.testing.assert_series_equal(old[col], expect[col], check_dtype=False)


def test_a_run_without_records_aggregates_and_draws_nothing(tmp_path):
    from cudalab import cli

    (tmp_path / "raw").mkdir()
    out = tmp_path / "results.csv"
    assert cli.main(["aggregate", "--results", str(tmp_path), "--out", str(out)]) == 0
    df = roofline.load_table(out)
    assert df.empty and set(results.DERIVED_COLUMNS) <= set(df.columns)
    drawn = run_figures.draw(df, tmp_path, tmp_path / "figures")
    assert drawn == {"roofline": 0, "telemetry": 0}
    assert (tmp_path / "figures" / "_roofline" / "index.json").is_file()


@pytest.mark.slow
def test_reference_table_without_new_columns():
    """An H100 table from before the ceilings: theoretical ceilings only, the 32 MiB
    transpose at 2048^2 above the DRAM peak flagged as L2-resident."""
    df = results.read_table(OLD_TABLE)
    # read_table gives the old table the new columns, empty
    assert df["ceil_dram_gbps"].isna().all() and (df["memory_level"] == "").all()
    bad = roofline.distrust(df)
    assert [b["point_id"] for b in bad] == ["transpose_padded-size2048"]
    assert "32 MiB fits the 50 MiB L2" in bad[0]["why"]
    fig = roofline_figure.draw(df)
    try:
        assert figcheck.problems(fig) == []
    finally:
        _close(fig)


@pytest.mark.slow
def test_the_figures_step_draws_every_roofline_and_the_report_reads_them(tmp_path):
    df = synthetic(ceilings=True)
    drawn = run_figures.draw(df, tmp_path / "results", tmp_path / "figures")
    assert drawn == {"roofline": 4, "telemetry": 0}  # no GPU job: no telemetry figure
    for name in ("run", "matmul", "vector_add", "coalescing"):
        for ext in ("png", "svg"):
            assert (tmp_path / "figures" / "_roofline" / f"{name}.{ext}").stat().st_size > 1000
    got = run_figures.read(tmp_path / "figures")
    assert set(got["rooflines"]) == {"run", "matmul", "vector_add", "coalescing"}
    run = got["rooflines"]["run"]
    assert run["src"].startswith("data:image/png;base64,")
    assert run["caption"] == roofline_figure.caption(df)
    assert got["telemetry"] == [] and got["telemetry_summary"] == {}
    # a folder the figures step has not drawn into: nothing to show, no error
    assert run_figures.read(tmp_path / "nothing") == {
        "rooflines": {}, "telemetry": [], "telemetry_summary": {}, "comparisons": {}}


# -- roofs per precision, the ceilings the run measured elsewhere -----------------------------
def test_each_point_is_judged_against_the_roof_of_its_dtype():
    """cuBLAS DGEMM at 4096 on the H100: against the FP64 tensor-core peak (94 %), never
    the FP32 ceiling; SGEMM against the FP32 ceiling."""
    df = results.read_table(REFERENCE)
    a = roofline.annotate(df)
    cub = a[(a["experiment"] == "matmul") & (a["variant"] == "cublas") & (a["p_n"] == 4096)]
    d = cub[cub["p_dtype"] == "float64"].iloc[0]
    s = cub[cub["p_dtype"] != "float64"].iloc[0]
    assert d["roof_name"] == "FP64 tensor-core"
    assert d["pct_ceil_gflops"] == pytest.approx(94.16, abs=0.01)
    assert s["roof_name"] == "FP32" and s["roof_gflops"] == pytest.approx(63288.5, abs=0.1)
    naive64 = a[(a["variant"] == "naive") & (a["p_dtype"] == "float64")].iloc[0]
    assert naive64["roof_name"] == "FP64" and naive64["roof_gflops"] == pytest.approx(33454.08)


def test_ceilings_measured_elsewhere_in_the_run_and_the_shared_memory_formula():
    c = run_ceilings.ceilings_of(results.read_table(REFERENCE))
    # coalescing's memcpy point measured cudaMemcpy D2D: never "not measured"
    assert c.dram_memcpy == pytest.approx(2976.79, abs=0.01)
    assert "memcpy" in c.dram_memcpy_source
    # 32 banks x 4 bytes x 132 SMs x 1.98 GHz
    assert c.smem_peak == pytest.approx(32 * 4 * 132 * 1.98, rel=1e-9)
    rows = {r["level"].split(" (")[0]: r for r in run_ceilings.ceilings_rows(c)}
    assert rows["DRAM, cudaMemcpy D2D alone"]["measured"] == fmt.bandwidth(c.dram_memcpy)
    assert rows["shared memory"]["theoretical"] == fmt.bandwidth(c.smem_peak)
    assert rows["FP64 tensor cores"]["theoretical"] == fmt.flop_rate(66908.16)
    assert rows["FP64"]["measured"] == "not measured"


def test_the_roofline_caption_names_its_panels_by_place():
    df = results.read_table(REFERENCE)
    both = roofline_figure.caption(df)
    assert both.startswith("Top:") and "Bottom:" in both and "Left" not in both
    one = roofline_figure.caption(df, "matmul")
    assert one.startswith("The figure:") and "Top" not in one and "Right" not in one


# -- tensor-core points: the roof of their input precision -----------------------------------
TENSOR_PEAKS = {"fp32": 66900.0, "tf32": 535000.0, "fp16": 1070000.0, "bf16": 1070000.0}


def _with_tensor_points(*precs: str, tflops: float = 400.0) -> pd.DataFrame:
    """The synthetic run plus cuBLAS at 4096 in each precision (each point carrying its
    precision's dense peak, as the tensor_cores experiment records it)."""
    n = 4096
    rows = [row("tensor_cores", "cublas", 2.0 * n ** 3, 2.0 * 2 * n * n + 4.0 * n * n,
                2.0 * n ** 3 / ((50.0 if p == "fp32" else tflops) * 1e12), p_precision=p,
                p_m=n, p_k=n, p_n=n, m_peak_precision_gflops=TENSOR_PEAKS[p],
                pct_peak_gflops=math.nan, peak_mem_gbps=math.nan)
            for p in precs]
    return pd.concat([synthetic(ceilings=True), pd.DataFrame(rows)], ignore_index=True)


def test_tensor_core_points_are_judged_against_the_peak_of_their_precision():
    df = _with_tensor_points("fp32", "tf32", "fp16", "bf16")
    a = roofline.annotate(df)
    t = a[a["experiment"] == "tensor_cores"].set_index("p_precision")
    assert t.loc["tf32", "roof_name"] == "TF32 tensor-core"
    assert t.loc["tf32", "pct_ceil_gflops"] == pytest.approx(100 * 400e3 / 535e3)
    assert t.loc["fp16", "roof_gflops"] == 1070000.0
    # FP32 on the CUDA cores: the run's measured FP32 ceiling
    assert t.loc["fp32", "roof_name"] == "FP32" and t.loc["fp32", "roof_gflops"] == 60000.0
    assert not t["suspect"].any()  # 400 TFLOP/s is far above FP32, under TF32's peak
    c = run_ceilings.ceilings_of(df)
    assert (c.tf32_tensor_peak, c.fp16_tensor_peak) == (535000.0, 1070000.0)
    levels = [r["level"] for r in run_ceilings.ceilings_rows(c)]
    assert any(lv.startswith("TF32 tensor cores") for lv in levels)
    # above its own peak: suspect, and why names the precision's roof
    fast = roofline.annotate(_with_tensor_points("tf32", tflops=600.0))
    bad = fast[fast["experiment"] == "tensor_cores"].iloc[0]
    assert bad["suspect"] and "TF32 tensor-core ceiling" in bad["suspect_why"]


def test_tensor_peaks_come_from_the_device_row_where_no_point_carries_them():
    df = synthetic(ceilings=True)
    dev = df["experiment"] == "device_query"
    df.loc[dev, "m_peak_tf32_tensor_gflops"] = 535000.0
    c = run_ceilings.ceilings_of(df)
    assert c.tf32_tensor_peak == 535000.0 and math.isnan(c.bf16_tensor_peak)
    assert math.isnan(run_ceilings.Ceilings().tensor("fp16")[0])


def test_the_roofline_draws_the_roofs_of_the_precisions_plotted():
    df = _with_tensor_points("fp32", "tf32", "fp16", "bf16")
    fig = roofline_figure.draw(df, "tensor_cores")
    try:
        ax = fig.axes[0]
        labels = [t.get_text() for t in ax.get_legend().get_texts()]
        assert any(lb.startswith("FP16/BF16 tensor cores theoretical") for lb in labels)
        assert any(lb.startswith("TF32 tensor cores theoretical") for lb in labels)
        # the DRAM slope rises to the highest roof drawn, not the FP32 one
        ln = next(x for x in ax.get_lines() if x.get_label().startswith("DRAM meas"))
        assert ln.get_data()[1][-1] == pytest.approx(1070000.0)
        assert ax.get_ylim()[1] > 1070000.0
    finally:
        _close(fig)
    fig = roofline_figure.draw(_with_tensor_points("fp32", "tf32"), "tensor_cores")
    try:
        labels = [t.get_text() for t in fig.axes[0].get_legend().get_texts()]
        assert not any("FP16" in lb for lb in labels)
    finally:
        _close(fig)
    fig = roofline_figure.draw(df, "matmul")  # no tensor point drawn: no tensor roof
    try:
        labels = [t.get_text() for t in fig.axes[0].get_legend().get_texts()]
        assert not any("tensor" in lb for lb in labels)
    finally:
        _close(fig)


def test_the_roofline_takes_the_lessons_declarations_as_data(monkeypatch):
    """Which experiments' points sit under the device's roofs is what the lessons declare
    (vs_device_peak, precision_roofs), given to the roofline; without them it says so."""
    from cudalab.experiments import device_experiments

    assert set(roofline.device_experiments()) == set(device_experiments())
    assert "transfer" not in roofline.device_experiments()  # PCIe: its own link, no roof
    monkeypatch.setattr(roofline, "_device_experiments", None)
    with pytest.raises(roofline.RooflineError, match="no lesson has declared its roofs"):
        roofline.on_device("matmul", "cuda_event")
    roofline.declare_device_experiments(["matmul"])
    assert roofline.on_device("matmul", "cuda_event")
    assert not roofline.on_device("coalescing", "cuda_event")
    assert not roofline.on_device("matmul", "perf_counter")  # a CPU point
