"""The wgmma rungs off the GPU: the kernel file builds for sm_90a with nvcc (no spills, the
register moves honoured, every rung and precision present) and for an older target as
empty bodies; the tensor-map rules; the rung shapes and grids; the config's limits; and the
points skipped as not applicable on a GPU before compute capability 9.x."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path
from types import SimpleNamespace

import pytest

from cudalab import config as cfg
from cudalab.experiments import REGISTRY, base
from cudalab.experiments.base import Point
from cudalab.experiments.tensor_cores import tma, wgmma

ROOT = Path(__file__).resolve().parent.parent
SOURCE = ROOT / "cuda" / wgmma.SOURCE
KERNELS = {wgmma.kernel_name(r, p) for r in wgmma.RUNGS for p in wgmma.PRECISIONS}

needs_nvcc = pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc not installed")


def _ptxas(target: list[str], *defines: str, tmp: Path) -> str:
    out = subprocess.run(["nvcc", "-cubin", "-O3", *target, "-Xptxas", "-v", *defines,
                          "-o", str(tmp / "k.cubin"), str(SOURCE)],
                         capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    return out.stderr


@needs_nvcc
@pytest.mark.parametrize("defines", [(), ("-DSTAGES=2", "-DWS_BN=128")])
def test_the_kernels_build_for_sm90a_without_spills(defines, tmp_path):
    log = _ptxas(["-gencode=arch=compute_90a,code=sm_90a"], *defines, tmp=tmp_path)
    built = set(re.findall(r"Compiling entry function '(\w+)' for 'sm_90a'", log))
    assert KERNELS <= built
    assert "tc_wgmma_ws_fp16_bt" in built and "tc_transpose_b32" in built
    spills = re.findall(r"(\d+) bytes spill stores, (\d+) bytes spill loads", log)
    frames = re.findall(r"(\d+) bytes stack frame", log)
    assert spills and all(s == ("0", "0") for s in spills)
    assert frames and all(f == "0" for f in frames)
    # the producer/consumer kernels run at the cap of 384 threads, one block an SM: 168
    regs = dict(re.findall(r"Compiling entry function '(\w+)'.*?Used (\d+) registers", log,
                           re.S))
    assert int(regs["tc_wgmma_ws_fp16"]) <= 168
    assert "C7508" not in log and "setmaxnreg" not in log.lower()  # honoured, not ignored


@needs_nvcc
def test_older_targets_build_empty_bodies(tmp_path):
    """sm_80 has no wgmma: the file still builds (the experiment never launches it there)."""
    log = _ptxas(["-arch=sm_80"], tmp=tmp_path)
    assert "tc_wgmma_ws_fp16" in log


def test_tensor_map_rules_are_said_before_the_driver_is_asked():
    assert tma.box_problems("fp16", 4096, 4096, 128, 64) == []
    assert tma.box_problems("tf32", 4096, 4096, 256, 32) == []
    assert "exactly 128" in tma.box_problems("fp16", 4096, 4096, 128, 32)[0]
    assert "1 to 256" in tma.box_problems("bf16", 4096, 4096, 512, 64)[0]
    assert "whole boxes" in tma.box_problems("fp16", 4000, 4096, 128, 64)[0]
    assert "precision 'fp8'" in tma.box_problems("fp8", 64, 64, 64, 128)[0]
    with pytest.raises(ValueError, match="exactly 128"):
        tma.encode_2d(0x10000, "fp16", 256, 256, 64, 32)
    with pytest.raises(ValueError, match="16-byte aligned"):
        tma.encode_2d(0x10002, "fp16", 256, 256, 64, 64)


def test_without_a_driver_the_tensor_map_error_names_it():
    try:
        import ctypes

        ctypes.CDLL("libcuda.so.1")
        pytest.skip("a driver is installed here")
    except OSError:
        pass
    tma._encode_fn.cache_clear()
    with pytest.raises(tma.TmaError, match="libcuda.so.1 cannot be loaded"):
        tma.encode_2d(0x10000, "fp16", 256, 256, 64, 64)


def test_rung_shapes_grids_and_limits():
    assert wgmma.shape("wgmma_tma") == wgmma.Shape(256, 128, 1)
    ws = wgmma.shape("wgmma_ws", 4, 256)
    assert ws.threads == 384 and ws.smem_bytes == 4 * (128 + 256) * 128 + 1024
    assert wgmma.shape_problems("wgmma_ws", 4, 256) == []
    assert "shared memory" in wgmma.shape_problems("wgmma_persist", 5, 256)[0]
    assert wgmma.shape_problems("wgmma_pipe", 6, 256) == []  # the pipe rung is 128 wide
    assert wgmma.grid("wgmma_ws", 4096, 4096, 256, 132) == 32 * 16
    assert wgmma.grid("wgmma_persist", 4096, 4096, 256, 132) == 132
    assert wgmma.grid("wgmma_persist", 256, 256, 256, 132) == 2
    assert wgmma.grid("wgmma_tma", 4096, 4096, 256, 132) == 32 * 32
    assert wgmma.kernel_name("wgmma_ws", "fp16", kmajor_b=True) == "tc_wgmma_ws_fp16_bt"
    assert wgmma.kernel_name("wgmma_ws", "tf32", kmajor_b=True) == "tc_wgmma_ws_tf32"
    with pytest.raises(ValueError, match="one of wgmma_tma"):
        wgmma.shape("wgmma_fast")


def test_only_hopper_runs_the_rungs():
    assert wgmma.not_applicable((9, 0)) == ""
    for cc in ((8, 0), (8, 9), (10, 0), (12, 0)):
        why = wgmma.not_applicable(cc)
        assert "sm_90a" in why and f"{cc[0]}.{cc[1]}" in why


def test_a_wgmma_point_is_skipped_as_not_applicable_before_sm90():
    exp = REGISTRY["tensor_cores"]
    pt = Point("tensor_cores", "wgmma_ws", {"m": 256, "k": 256, "n": 256,
                                            "precision": "fp16", "stages": 4, "bn": 256})
    ctx = SimpleNamespace(gpu=SimpleNamespace(info={"compute_capability": "8.0"}))
    with pytest.raises(base.Skipped, match="not applicable: wgmma.*compute capability 8.0"):
        exp.kernel_for(ctx, pt)


def test_the_config_names_stage_counts_that_do_not_fit():
    with pytest.raises(cfg.ConfigError, match="wgmma_ws with 6 stages of 128 x 256 needs"):
        cfg.validate({"experiments": {"tensor_cores": {"variants": ["wgmma_ws", "cublas"],
                                                        "wgmma_stages": [2, 6]}}})
    ok = cfg.validate({"experiments": {"tensor_cores": {
        "variants": ["wgmma_pipe", "wgmma_tma"], "wgmma_stages": [2, 6], "sizes": [256]}}})
    pts = REGISTRY["tensor_cores"].grid(ok)
    assert sorted({p.params.get("stages", 1) for p in pts}) == [1, 2, 6]
    with pytest.raises(cfg.ConfigError, match="wgmma_bn: 192 is not allowed"):
        cfg.validate({"experiments": {"tensor_cores": {"wgmma_bn": 192}}})
