"""device_query on the CPU: config rules, the single grid point, measure() against a fake
driver shaped like an H100 SXM (so the table check, the peaks and the clock fallback are
exercised without a GPU), the deviceQuery-style HTML table, the claims, and the figure
set (none: the report shows the table).

On a GPU the generic smoke test (tests/gpu/test_experiments_gpu.py) runs the real query."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from cudalab import claims, devicespec, figures, results
from cudalab import config as cfg
from cudalab import occupancy as occ
from cudalab.experiments import REGISTRY
from cudalab.experiments import device_query as dq
from cudalab.experiments.base import Point, RunContext
from cudalab.harness import Harness, Settings

EXP = REGISTRY["device_query"]

# What the CUDA driver reports on an H100 SXM5 80GB (cc 9.0); synthetic test data shaped like
# deviceQuery's output on that card.
H100 = {
    "MULTIPROCESSOR_COUNT": 132, "CLOCK_RATE": 1_980_000, "MEMORY_CLOCK_RATE": 2_619_000,
    "GLOBAL_MEMORY_BUS_WIDTH": 5120, "L2_CACHE_SIZE": 52_428_800,
    "MAX_PERSISTING_L2_CACHE_SIZE": 32_768_000, "TOTAL_CONSTANT_MEMORY": 65536,
    "MAX_SHARED_MEMORY_PER_BLOCK": 49152, "MAX_SHARED_MEMORY_PER_BLOCK_OPTIN": 232_448,
    "MAX_SHARED_MEMORY_PER_MULTIPROCESSOR": 233_472, "RESERVED_SHARED_MEMORY_PER_BLOCK": 1024,
    "MAX_REGISTERS_PER_BLOCK": 65536, "MAX_REGISTERS_PER_MULTIPROCESSOR": 65536,
    "WARP_SIZE": 32, "MAX_THREADS_PER_BLOCK": 1024, "MAX_THREADS_PER_MULTIPROCESSOR": 2048,
    "MAX_BLOCKS_PER_MULTIPROCESSOR": 32, "MAX_BLOCK_DIM_X": 1024, "MAX_BLOCK_DIM_Y": 1024,
    "MAX_BLOCK_DIM_Z": 64, "MAX_GRID_DIM_X": 2_147_483_647, "MAX_GRID_DIM_Y": 65535,
    "MAX_GRID_DIM_Z": 65535, "ASYNC_ENGINE_COUNT": 3, "CONCURRENT_KERNELS": 1,
    "ECC_ENABLED": 1, "UNIFIED_ADDRESSING": 1, "MANAGED_MEMORY": 1,
    "CONCURRENT_MANAGED_ACCESS": 1, "INTEGRATED": 0, "KERNEL_EXEC_TIMEOUT": 0,
    "PCI_DOMAIN_ID": 0, "PCI_BUS_ID": 0x18, "PCI_DEVICE_ID": 0,
}
IDS = {v: k for k, v in devicespec.CU_DEVICE_ATTRIBUTE_IDS.items()}


class FakeDriver:
    """occupancy.CudaDriver's device_attribute on a dict of attributes."""

    attrs: dict[str, int] = H100

    def __init__(self) -> None:
        pass

    def device_attribute(self, ordinal: int, attr_id: int) -> int:
        name = IDS[attr_id]
        if name not in self.attrs:
            raise occ.CudaDriverError(f"cuDeviceGetAttribute({attr_id}) failed: "
                                      "CUDA_ERROR_INVALID_VALUE (1)")
        return self.attrs[name]


def _measure(monkeypatch, attrs=H100, nvml=None, cc="9.0", clock_source="driver"):
    drv = type("D", (FakeDriver,), {"attrs": attrs})
    monkeypatch.setattr(dq.occ, "CudaDriver", drv)
    monkeypatch.setattr(dq, "_nvml_facts", lambda gpu: dict(nvml or {}))
    gpu = SimpleNamespace(index=0, info={
        "compute_capability": cc, "total_memory_bytes": 85_028_896_768,
        "cuda_driver_api": "13.0", "gpu_pci_bus_id": "0000:18:00.0", "gpu_name": "fake"})
    block = cfg.validate({"experiments": {"device_query": {"clock_source": clock_source}}})[
        "experiments"]["device_query"]
    ctx = RunContext(gpu=gpu, harness=Harness(Settings()), rng=None, config={}, block=block)
    return EXP.measure(ctx, EXP.points(block)[0])


# -- config and grid -------------------------------------------------------------------------
def test_config():
    b = cfg.validate({"experiments": {"device_query": {}}})["experiments"]["device_query"]
    assert b == {"enabled": True, "clock_source": "driver"}
    with pytest.raises(cfg.ConfigError, match=r"experiments\.device_query\.clock_source.*"
                                               r"'smi'.*allowed values"):
        cfg.validate({"experiments": {"device_query": {"clock_source": "smi"}}})
    with pytest.raises(cfg.ConfigError, match=r"experiments\.device_query: unknown key 'peak'"):
        cfg.validate({"experiments": {"device_query": {"peak": True}}})


def test_one_gpu_point_and_no_figures():
    pts = EXP.points({"clock_source": "nvml"})
    assert len(pts) == 1 and pts[0].gpu and pts[0].params == {"clock_source": "nvml"}
    assert EXP.lesson.figures == {} and EXP.smoke == {}


# -- measure against a fake driver ----------------------------------------------------------
def test_measure_h100(monkeypatch):
    r = _measure(monkeypatch, nvml={"pcie_gen_max": 5, "pcie_width_max": 16,
                                    "pcie_gen_current": 5, "pcie_width_current": 16})
    m = r.metrics
    assert r.timing is None and r.check.passed and r.check.metric == "table_mismatches"
    assert m["table_mismatches"] == "none" and m["cc"] == "9.0"
    assert (m["sm_count"], m["copy_engines"], m["concurrent_kernels"]) == (132, 3, 1)
    assert m["smem_per_sm"] == 233_472 and m["l2_bytes"] == 50 * 2**20
    assert m["peak_mem_gbps"] == pytest.approx(3352.32)
    assert m["peak_fp32_gflops"] == pytest.approx(66908.16)
    assert m["fp32_cores"] == 16896 and m["max_warps_per_sm"] == 64
    assert m["clock_source"] == "driver" and m["sm_clock_mhz"] == 1980
    assert m["pcie_gen_max"] == 5 and "attributes_missing" not in m


def test_table_mismatch_is_a_wrong_point_naming_the_limit(monkeypatch):
    r = _measure(monkeypatch, attrs=H100 | {"MAX_BLOCKS_PER_MULTIPROCESSOR": 16})
    assert not r.check.passed and r.check.error == 1
    assert "max_blocks_per_sm: table 32, device 16" in r.check.detail
    assert "max_blocks_per_sm" in r.metrics["table_mismatches"]


def test_clocks_fall_back_to_nvml(monkeypatch):
    no_clock = {k: v for k, v in H100.items() if k not in ("CLOCK_RATE", "MEMORY_CLOCK_RATE")}
    r = _measure(monkeypatch, attrs=no_clock,
                 nvml={"max_sm_clock_mhz": 1980.0, "max_mem_clock_mhz": 2619})
    m = r.metrics
    assert m["clock_source"] == "nvml" and m["peak_mem_gbps"] == pytest.approx(3352.32)
    assert "CLOCK_RATE" in m["attributes_missing"]
    # neither source: no peak, and the expectation says so
    r = _measure(monkeypatch, attrs=no_clock)
    assert "peak_mem_gbps" not in r.metrics and r.metrics["clock_source"] == "none"
    assert r.check.passed  # the table still matches


def test_unknown_compute_capability_is_not_checked(monkeypatch):
    r = _measure(monkeypatch, cc="11.0")
    assert r.check.passed and "not in cudalab.devicespec" in r.check.detail
    assert r.metrics["table_mismatches"].startswith("not checked")


@pytest.mark.parametrize("args, want", [
    ((1_980_000, 2_619_000, 1980, 2619, "driver"), (1_980_000, 2_619_000, "driver")),
    ((1_980_000, 2_619_000, 1755, 1593, "nvml"), (1_755_000, 1_593_000, "nvml")),
    ((0, None, 1980, 2619, "driver"), (1_980_000, 2_619_000, "nvml")),
    ((1_980_000, None, None, 2619, "driver"), (1_980_000, 2_619_000, "driver+nvml")),
    ((None, None, None, None, "driver"), (None, None, "none")),
    ((float("nan"), 5, "x", None, "driver"), (None, 5.0, "driver")),
])
def test_pick_clocks(args, want):
    assert dq.pick_clocks(*args) == want


# -- table, expectations, figures ----------------------------------------------------------
def _records(monkeypatch, **kw):
    r = _measure(monkeypatch, **kw)
    rec = {"schema_version": results.SCHEMA_VERSION, "experiment": "device_query",
           "variant": "device", "params": {"clock_source": "driver"},
           "point_id": Point("device_query", "device", {"clock_source": "driver"}).point_id,
           "job_id": "synthetic", "seed": 0, "reason": "" if r.check.passed else "mismatch",
           "status": "ok" if r.check.passed else "wrong", "t_start": 0.0, "t_end": 1.0,
           "provenance": {"gpu_name": "NVIDIA H100 80GB HBM3 (synthetic)",
                          "compute_capability": "9.0"},
           "timing": None, "work": {"flops": float("nan"), "bytes": float("nan")},
           "check": r.check.as_dict(), "metrics": r.metrics}
    return [rec]


def test_summary_table_and_expectations(monkeypatch):
    df = results.build_table(_records(monkeypatch, nvml={"pcie_gen_max": 5,
                                                         "pcie_width_max": 16}))
    assert results.check_table(df) == []
    page = EXP.summary_table(df)
    for needle in ("<th>Device</th><td>NVIDIA H100 80GB HBM3 (synthetic)</td>",
                   "<th>Multiprocessors (SMs)</th><td>132</td>",
                   "<th>Theoretical peak DRAM bandwidth</th><td>3.35 TB/s</td>",
                   "<th>Theoretical peak FP32 (FMA = 2 flops)</th><td>66.9 TFLOP/s</td>",
                   "<th>Shared memory per SM</th><td>228 KiB (233\u202f472 B)</td>",
                   "<th>Concurrent copy and kernel execution: copy engines</th><td>3</td>",
                   "<th>ECC enabled</th><td>yes</td>", "<th>PCIe link width (max)</th>"):
        assert needle in page, needle
    ex = {r.key: r for r in claims.evaluate("device_query", df)}
    assert [e.passed for e in ex.values()] == [True, True]
    assert "3.35 TB/s" in ex["peaks_computed"].evidence


def test_claims_flag_a_wrong_table(monkeypatch):
    df = results.build_table(_records(monkeypatch, attrs=H100 | {"WARP_SIZE": 64}))
    ex = {r.key: r for r in claims.evaluate("device_query", df)}
    assert ex["limits_table_matches"].passed is False
    assert "warp_size: table 32, device 64" in ex["limits_table_matches"].evidence


def test_no_course_sentence_is_filled_with_the_device_s_numbers():
    assert not hasattr(EXP, "course_vars")


def test_no_figures_are_drawn(tmp_path, monkeypatch):
    df = results.build_table(_records(monkeypatch))
    assert figures.draw_experiment("device_query", df, tmp_path) == {}
    with pytest.raises(KeyError):
        EXP.plot("anything", df)
    assert EXP.summary_table(df.iloc[0:0]) == ""


def test_fmt():
    assert dq._fmt(1, "bool") == "yes" and dq._fmt(0, "bool") == "no"
    assert dq._fmt(50 * 2**20, "B") == "50 MiB (52\u202f428\u202f800 B)"
    assert dq._fmt(3352.32, "GB/s") == "3.35 TB/s" and dq._fmt(None) == "?"
    assert dq._fmt(1024, "") == "1\u202f024" and dq._fmt(1980.0, "MHz") == "1\u202f980 MHz"
