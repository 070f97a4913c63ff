"""The wgmma rungs off the GPU: the kernel file builds for sm_90a with nvcc (no spills, the
register moves honoured, every rung and precision present) and for an older target as
empty bodies; the tensor-map rules; the rung shapes and grids; the config's limits; and the
points skipped as not applicable on a GPU before compute capability 9.x."""

from __future__ import annotations

import re
import shutil
import struct
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


def _kernel_params(cubin: bytes, kernel: str) -> list[tuple[int, int]]:
    """(offset, size) of each parameter of `kernel`, in order, as the cubin's .nv.info.<kernel>
    section tells the driver (EIATTR_KPARAM_INFO records; what cuobjdump -elf prints)."""
    shoff = struct.unpack_from("<Q", cubin, 0x28)[0]
    entsize, count, strndx = struct.unpack_from("<HHH", cubin, 0x3A)
    secs = [struct.unpack_from("<IIQQQQ", cubin, shoff + i * entsize) for i in range(count)]
    names = secs[strndx][4]

    def name(sec: tuple) -> str:
        start = names + sec[0]
        return cubin[start:cubin.index(b"\0", start)].decode()

    sec = next(s for s in secs if name(s) == f".nv.info.{kernel}")
    info, i, params = cubin[sec[4]:sec[4] + sec[5]], 0, {}
    while i < len(info):
        fmt, attr = info[i], info[i + 1]
        if fmt != 4:  # records without a payload: format, attribute, 16-bit value
            i += 4
            continue
        size = struct.unpack_from("<H", info, i + 2)[0]
        if attr == 0x17:  # KPARAM_INFO: index, ordinal, offset, flags (size in bits 18..31)
            _, ordinal, offset, flags = struct.unpack_from("<IHHI", info, i + 4)
            params[ordinal] = (offset, (flags >> 18) & 0x3FFF)
        i += 4 + size
    return [params[k] for k in sorted(params)]


def _packed_fields(fmt: str) -> list[tuple[int, int]]:
    """(offset, size) of each field that pycuda's packing (native alignment, like struct's)
    gives the arguments of `fmt`, pad bytes ('x') skipped."""
    fields = re.findall(r"(\d*)([xsPi])", fmt)
    out, prefix = [], ""
    for count, code in fields:
        prefix += count + code
        if code != "x":
            size = struct.calcsize(count + code)
            out.append((struct.calcsize(prefix) - size, size))
    return out


@needs_nvcc
def test_the_parameter_buffer_is_packed_where_the_kernels_read_it(tmp_path):
    """The first GPU run faulted writing to address 0: pycuda packed the two 64-byte aligned
    tensor maps from byte 0, the kernels read them from 48 and C, M, N, K past the end of
    the buffer. PARAM_FORMAT must put every argument where the compiled kernels read it."""
    _ptxas(["-gencode=arch=compute_90a,code=sm_90a"], tmp=tmp_path)
    cubin = (tmp_path / "k.cubin").read_bytes()
    packed = _packed_fields(wgmma.PARAM_FORMAT)
    assert packed == [(48, 128), (176, 128), (304, 8), (312, 4), (316, 4), (320, 4)]
    for kernel in ("tc_wgmma_tma_fp16", "tc_wgmma_ws_tf32", "tc_wgmma_persist_fp16_bt",
                   "tc_wgmma_dump_fp16", wgmma.PROBE_KERNEL):
        assert _kernel_params(cubin, kernel) == packed, kernel
    assert _kernel_params(cubin, "tc_wgmma_tma_fp16") != _packed_fields("128s128sPiii")
    assert _kernel_params(cubin, "tc_transpose_b16") == _packed_fields("PPii")


def test_the_probe_expects_what_was_packed():
    map_a, map_b = bytes(range(128)), bytes(range(128, 256))
    sent = wgmma.params_sent((map_a, map_b, 0x7F0000001000, 256, 384, 512))
    assert sent[:4] == [0x7F0000001000, 256, 384, 512]
    assert sent[4] == int.from_bytes(bytes(range(8)), "little")
    assert sent[7] == int.from_bytes(bytes(range(248, 256)), "little")


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
