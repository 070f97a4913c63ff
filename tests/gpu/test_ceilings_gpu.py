"""On a GPU machine (pytest -m gpu): the measured ceilings are real numbers in the range the
theoretical peaks allow, and the coalescing experiment's memcpy / copy_vec4 points are
correct and compared with them."""

from __future__ import annotations

import math
import time

import pytest

from cudalab import ceilings, devicespec, results
from cudalab import config as cfg
from cudalab.harness import Harness, Settings
from cudalab.runner import run_experiment

pytestmark = pytest.mark.gpu


@pytest.fixture(scope="module")
def gpu():
    from cudalab import gpu as gpumod

    try:
        return gpumod.open_session(0)
    except gpumod.NoGpuError as exc:
        pytest.skip(str(exc))


@pytest.fixture(scope="module")
def measured(gpu):
    gpu.compile(ceilings.SOURCE, ceilings.DEFINES)  # nvcc's first build is not the step's cost
    t0 = time.perf_counter()
    c = ceilings.measure(gpu, Harness(Settings()))
    return c, time.perf_counter() - t0


def test_every_ceiling_is_measured_and_checked(measured):
    c, _ = measured
    v = c.values
    for k in (*ceilings.MEASURED_KEYS, "peak_smem_gbps", "l2_bytes"):
        assert math.isfinite(v[k]) and v[k] > 0, (k, v[k], c.notes)
    assert c.notes == {}, c.notes  # every check passed, nothing fell back
    assert math.isnan(v["peak_l2_gbps"])  # no reliable formula (devicespec.memory_peaks)
    assert set(c.detail) == {"dram_copy_f4", "dram_memcpy", "l2_copy_f4", "smem_read",
                             "fma_chains"}
    # the DRAM working set is 16 x L2 (two buffers of 8 x L2) on any card with room for it
    assert c.detail["dram_copy_f4"]["working_set_bytes"] == 2 * 8 * v["l2_bytes"]
    assert c.detail["l2_copy_f4"]["working_set_bytes"] <= v["l2_bytes"] / 2


def test_ceilings_sit_where_the_theoretical_peaks_allow(gpu, measured):
    c, _ = measured
    v, peaks = c.values, devicespec.device_peaks(gpu)
    dram = v["ceil_dram_gbps"] / peaks["peak_mem_gbps"]
    fma = v["ceil_fp32_gflops"] / peaks["peak_fp32_gflops"]
    smem = v["ceil_smem_gbps"] / v["peak_smem_gbps"]
    summary = c.summary() + f"; DRAM {dram:.0%}, FP32 {fma:.0%}, smem {smem:.0%} of theory"
    assert 0.60 <= dram <= 1.05, summary
    assert 0.50 <= fma <= 1.05, summary
    assert 0.30 <= smem <= 1.05, summary
    assert v["ceil_l2_gbps"] > 1.2 * v["ceil_dram_gbps"], summary
    assert v["ceil_dram_memcpy_gbps"] <= v["ceil_dram_gbps"], summary  # the better of two


def test_the_ceilings_step_is_short(measured):
    _, seconds = measured
    assert seconds < 2.5, f"measuring the ceilings took {seconds:.2f} s"


def test_coalescing_memcpy_and_vec4_copies_are_correct_and_compared(tmp_path):
    block = {"n": 1 << 26, "variants": ["memcpy", "copy", "copy_vec4", "transpose_padded"],
             "transpose_sizes": [2048, 8192], "offsets": [0], "strides": [1]}
    config = cfg.validate({
        "measurement": {"warmup": 2, "min_samples": 5, "max_samples": 50, "budget_s": 0.1},
        "telemetry": {"nvidia_smi": False, "nvml": False},
        "experiments": {"coalescing": block}})
    manifest = run_experiment(config, "coalescing", tmp_path)
    recs = list(results.iter_records(tmp_path / "raw"))
    bad = {r["point_id"]: r.get("reason") for r in recs if r["status"] != "ok"}
    assert not bad, bad
    assert all(math.isfinite(manifest["ceilings"][k]) for k in ceilings.MEASURED_KEYS), \
        manifest.get("ceilings_note")
    df = results.build_table(recs).set_index("point_id")
    assert results.check_table(df.reset_index()) == []
    l2 = df["l2_bytes"].iloc[0]
    assert l2 == manifest["ceilings"]["l2_bytes"]
    # 2 x 256 MiB of copies and the 8192^2 transpose: DRAM; the 2048^2 transpose (32 MiB)
    # fits any L2 of 32 MiB and more
    for pid in ("memcpy-n67108864", "copy-n67108864", "copy_vec4-n67108864",
                "transpose_padded-size8192"):
        assert df.loc[pid, "memory_level"] == "dram", pid
    expected_small = "l2" if l2 >= 2 * 4 * 2048 ** 2 else "dram"
    assert df.loc["transpose_padded-size2048", "memory_level"] == expected_small
    for pid in ("copy-n67108864", "copy_vec4-n67108864", "transpose_padded-size8192"):
        pct = df.loc[pid, "m_pct_of_memcpy"]
        assert 5 < pct < 110, (pid, pct)
    # the copies of the DRAM lesson stay at or below the DRAM ceiling (5 % noise allowed)
    for pid in ("memcpy-n67108864", "copy_vec4-n67108864"):
        pct = df.loc[pid, "pct_ceil_gbps"]
        assert 50 < pct <= 105, (pid, pct, df.loc[pid, "ceil_dram_gbps"])
