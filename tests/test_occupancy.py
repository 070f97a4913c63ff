"""The occupancy calculator (cudalab.occupancy), the limits table (cudalab.devicespec) and
the occupancy experiment on the CPU.

- known values: the CUDA C++ Best Practices Guide's worked example and cases computed by
  hand below (each comment shows the arithmetic);
- NVIDIA's own calculator: cuda_occupancy.h (header-only, in every CUDA toolkit) is compiled
  into a tiny host program and must give the same blocks per SM, per-limit blocks,
  limiting factors and potential block size as ours for every tabled compute capability
  over a sweep of block sizes, registers, shared memory and barriers (skipped where no
  toolkit header or C++ compiler is installed);
- the experiment: config validation, grid expansion, the reference of the shared-memory
  kernel, the lesson's claims and figures on a synthetic results table.

The GPU side (calculator == the CUDA driver) is tests/gpu/test_occupancy_gpu.py."""

from __future__ import annotations

import glob
import os
import random
import shutil
import subprocess
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest

from cudalab import claims, devicespec, figures, results
from cudalab import config as cfg
from cudalab import occupancy as occ
from cudalab.experiments import REGISTRY
from cudalab.experiments import occupancy as oexp
from cudalab.experiments.base import Point

EXP = REGISTRY["occupancy"]
KB = 1024


# -- known values -----------------------------------------------------------------------------
def test_cc80_256_threads_32_registers_no_smem_is_full():
    # 8 warps per block; a warp takes 32 * 32 = 1024 registers -> 16384 / 1024 = 16 warps per
    # sub-partition, 64 per SM -> 8 blocks; 64 warp slots / 8 = 8 blocks: 64 warps = 100 %.
    o = occ.occupancy("8.0", 256, 32)
    assert (o.active_blocks, o.active_warps, o.occupancy) == (8, 64, 1.0)
    assert set(o.limiters) == {"warps", "registers"}
    assert o.smem_per_block == 1024  # the 1 KB the driver reserves per block from cc 8.0


def test_cc75_has_1024_threads_per_sm():
    s = devicespec.spec("7.5")
    assert (s.max_threads_per_sm, s.max_warps_per_sm, s.max_blocks_per_sm) == (1024, 32, 16)
    o = occ.occupancy("7.5", 1024, 32)  # one 1024-thread block fills the SM
    assert (o.active_blocks, o.occupancy) == (1, 1.0)
    assert occ.occupancy("7.5", 512, 64).occupancy == 1.0  # 64 regs: 2048/warp, 8 per part


@pytest.mark.parametrize("block, blocks, occupancy", [(128, 12, 0.75), (320, 4, 40 / 64)])
def test_best_practices_guide_example(block, blocks, occupancy):
    # CUDA C++ Best Practices Guide, "Calculating Occupancy" (cc 7.0): 37 registers per
    # thread give 75 % occupancy with 128-thread blocks (12 blocks per SM) but 63 % with
    # 320-thread blocks (4 blocks). 37 * 32 = 1184 -> 1280 registers per warp; 16384 / 1280
    # = 12 warps per sub-partition, 48 per SM; 48 // 4 = 12 blocks, 48 // 10 = 4 blocks.
    o = occ.occupancy("7.0", block, 37)
    assert o.active_blocks == blocks and o.occupancy == pytest.approx(occupancy)
    assert o.limiter == "registers"


def test_register_limited_hopper():
    # cc 9.0, 77 registers (vec_mul_regs with LIVE=64 on sm_90): 77 * 32 = 2464 -> 2560 per
    # warp; 16384 // 2560 = 6 warps per sub-partition -> 24 per SM; 256 threads = 8 warps
    # -> 3 blocks = 24 warps = 37.5 %.
    o = occ.occupancy("9.0", 256, 77)
    assert (o.regs_per_warp, o.active_blocks, o.active_warps) == (2560, 3, 24)
    assert o.occupancy == pytest.approx(0.375) and o.limiter == "registers"


def test_register_limited_ga10x_out_of_48_warps():
    # cc 8.6, 128 registers: 4096 per warp, 4 warps per sub-partition, 16 per SM; 128-thread
    # blocks (4 warps) -> 4 blocks = 16 of the 48 warp slots = 33 %.
    o = occ.occupancy("8.6", 128, 128)
    assert (o.active_blocks, o.active_warps, o.max_warps) == (4, 16, 48)
    assert o.occupancy == pytest.approx(1 / 3)


def test_too_many_registers_for_the_block_cannot_launch():
    # 1024 threads x 72 registers: 72 * 32 = 2304 per warp x 32 warps = 73728 > 65536.
    o = occ.occupancy("9.0", 1024, 72)
    assert not o.launchable and o.occupancy == 0 and "registers" in o.limiters
    assert "73728" in o.reason and "65536" in o.reason
    assert occ.max_block_size("9.0", 72) == 896  # 65536 // 2304 = 28 warps


def test_hardware_check_rounds_warps_to_the_sub_partitions():
    # cc 8.0, 80 registers -> 2560 per warp. 800 threads = 25 warps need 64000 <= 65536
    # registers, but the hardware assumes 28 warps (rounded up to 4 sub-partitions):
    # 71680 > 65536, so the block cannot launch (cuda_occupancy.h's "hardware check").
    assert occ.occupancy("8.0", 800, 80).active_blocks == 0
    assert occ.occupancy("8.0", 768, 80).active_blocks == 1  # 24 warps: 61440


def test_shared_memory_limited_with_the_reserved_kilobyte():
    # cc 8.0, 40 KB dynamic + 1 KB reserved = 41984 B per block (a multiple of 128);
    # 164 KB // 41984 = 4 blocks -> 4 warps each = 16 warps = 25 %.
    o = occ.occupancy("8.0", 128, 32, 0, 40 * KB)
    assert (o.smem_per_block, o.active_blocks, o.occupancy) == (41984, 4, 0.25)
    assert o.limiter == "shared_memory"


def test_shared_memory_rounds_to_the_allocation_unit():
    # cc 7.0: 256-byte units, no reserved memory. 33 KB + 1 B -> 33 KB + 256 B = 34048 B;
    # 96 KB // 34048 = 2 blocks. cc 8.0: 128-byte units, +1 KB: 1000 B -> 2048 B.
    assert occ.occupancy("7.0", 64, 16, 33 * KB + 1).smem_per_block == 34048
    assert occ.occupancy("7.0", 64, 16, 33 * KB + 1).blocks_by_shared_memory == 2
    assert occ.occupancy("8.0", 64, 16, 1000).smem_per_block == 2048
    assert occ.occupancy("7.0", 64, 16, 1000).smem_per_block == 1024


def test_48_kb_per_block_without_opt_in():
    # cc 8.0: 48 KB + the reserved 1 KB is the limit of a block that did not opt in.
    assert occ.occupancy("8.0", 128, 32, 0, 48 * KB).active_blocks == 3
    o = occ.occupancy("8.0", 128, 32, 0, 48 * KB + 1)
    assert o.active_blocks == 0 and "without opt-in" in o.reason
    # with the opt-in (cuFuncSetAttribute MAX_DYNAMIC_SHARED_SIZE_BYTES = 100 KB):
    # 49153 + 1024 -> 50304 B; 167936 // 50304 = 3 blocks
    assert occ.occupancy("8.0", 128, 32, 0, 48 * KB + 1,
                         optin_max_dynamic=100 * KB).active_blocks == 3


def test_block_slots_limit_small_blocks():
    # cc 8.6: 16 resident blocks at most; 32-thread blocks -> 16 warps of 48 = 33 %.
    o = occ.occupancy("8.6", 32, 16)
    assert (o.active_blocks, o.limiter) == (16, "blocks")
    assert o.occupancy == pytest.approx(16 / 48)
    # cc 9.0 allows 32 blocks: 32 warps of 64 = 50 %
    assert occ.occupancy("9.0", 32, 16).occupancy == 0.5


def test_carveout_preference():
    # cc 9.0, 100 KB dynamic: the default (largest) carve-out 228 KB holds 2 blocks; a 50 %
    # preference (114 KB -> the 132 KB step) holds 1.
    assert occ.occupancy("9.0", 256, 32, 0, 100 * KB).active_blocks == 0  # no opt-in
    o = occ.occupancy("9.0", 256, 32, 0, 100 * KB, optin_max_dynamic=200 * KB)
    assert o.active_blocks == 2 and o.smem_per_sm == 228 * KB
    o = occ.occupancy("9.0", 256, 32, 0, 100 * KB, optin_max_dynamic=200 * KB, carveout=50)
    assert o.active_blocks == 1 and o.smem_per_sm == 132 * KB


def test_barriers_bind_on_hopper_only_with_several():
    assert occ.occupancy("9.0", 32, 16, barriers=1).active_blocks == 32
    o = occ.occupancy("9.0", 32, 16, barriers=3)  # 2 x 32 slots // 3 = 21 blocks
    assert (o.active_blocks, o.limiter) == (21, "barriers")
    assert occ.occupancy("8.0", 32, 16, barriers=3).active_blocks == 32  # not before 9.0


def test_block_size_above_1024_and_bad_inputs():
    assert occ.occupancy("9.0", 1056, 16).active_blocks == 0
    with pytest.raises(ValueError):
        occ.occupancy("9.0", 0, 16)
    with pytest.raises(ValueError):
        occ.occupancy("9.0", 128, -1)
    with pytest.raises(KeyError, match="known"):
        occ.occupancy("4.0", 128, 16)


def test_max_potential_block_size_prefers_the_largest_full_block():
    assert occ.max_potential_block_size("9.0", 32) == (2, 1024)
    assert occ.max_potential_block_size("9.0", 32, sm_count=132) == (264, 1024)
    # 77 registers: 24 warps at most; 768 threads (one block of 24 warps) is the largest
    assert occ.max_potential_block_size("9.0", 77)[1] == 768
    # the function's own limit caps the search
    assert occ.max_potential_block_size("9.0", 32, func_max_threads=600)[1] == 512
    # block-size-dependent dynamic shared memory (the B2DSize callback)
    assert occ.max_potential_block_size("8.0", 16, 0, lambda b: 64 * b)[1] > 0


def test_best_square_tile():
    # 32 registers, 2 T^2 floats of shared memory: T = 32 (1024 threads, 8 KB) reaches 100 %
    # on cc 9.0 and is the largest tile that does.
    t, o = occ.best_square_tile("9.0", 32)
    assert t == 32 and o.occupancy == 1.0
    # cc 7.5 (32 warps): T = 32 still fits (1 block = 32 warps)
    assert occ.best_square_tile("7.5", 32)[0] == 32
    # 64 registers on cc 8.0: T = 32 needs 64 * 1024 = 65536 registers, one block = 50 %;
    # T = 16 (8 warps) gives 4 blocks = 32 warps = 50 % too, T = 22 -> 484 threads 16 warps
    t, o = occ.best_square_tile("8.0", 64)
    assert o.occupancy == max(occ.occupancy("8.0", s * s, 64, 0, 8 * s * s).occupancy
                              for s in range(1, 33))
    assert t == max(s for s in range(1, 33)
                    if occ.occupancy("8.0", s * s, 64, 0, 8 * s * s).occupancy == o.occupancy)


def test_occupancy_curve_and_as_dict():
    c = occ.occupancy_curve("8.0", 32)
    assert [o.block_size for o in c] == list(range(32, 1025, 32))
    d = c[0].as_dict()
    assert {"occupancy", "limiter", "launchable", "active_threads"} <= set(d)


# -- the limits table -------------------------------------------------------------------------
def test_table_covers_the_required_compute_capabilities():
    need = ["3.0", "3.5", "3.7", "5.0", "5.2", "5.3", "6.0", "6.1", "6.2", "7.0", "7.2", "7.5",
            "8.0", "8.6", "8.7", "8.9", "9.0"]
    assert set(need) <= set(devicespec.SPECS)
    for s in devicespec.SPECS.values():
        assert s.max_threads_per_sm % 32 == 0 and s.max_warps_per_sm <= 64
        assert s.smem_per_sm == max(s.smem_carveouts_kb) * KB
        assert s.smem_per_block_optin <= s.smem_per_sm
        assert s.smem_alloc_unit == (128 if s.major >= 8 else 256)
        assert s.smem_reserved_per_block == (KB if s.major >= 8 else 0)
        assert s.reg_alloc_unit == 256 and s.reg_alloc_granularity == "warp"
        assert s.warp_alloc_granularity == (2 if s.cc == "6.0" else 4)


@pytest.mark.parametrize("cc, warps, blocks, smem_kb, cores", [
    ("3.5", 64, 16, 48, 192), ("5.2", 64, 32, 96, 128), ("6.0", 64, 32, 64, 64),
    ("7.0", 64, 32, 96, 64), ("7.5", 32, 16, 64, 64), ("8.0", 64, 32, 164, 64),
    ("8.6", 48, 16, 100, 128), ("8.9", 48, 24, 100, 128), ("9.0", 64, 32, 228, 128),
])
def test_programming_guide_values(cc, warps, blocks, smem_kb, cores):
    s = devicespec.spec(cc)
    assert (s.max_warps_per_sm, s.max_blocks_per_sm, s.smem_per_sm // KB,
            s.fp32_cores_per_sm) == (warps, blocks, smem_kb, cores)


@pytest.mark.parametrize("given", ["9.0", (9, 0), [9, 0], "sm_90", "90", 90, "sm_90a",
                                   "compute_90"])
def test_cc_spellings(given):
    assert devicespec.cc_key(given) == "9.0"
    assert devicespec.cc_key("sm_120") == "12.0" and devicespec.cc_key("10.0") == "10.0"


def test_cc_errors():
    with pytest.raises(ValueError):
        devicespec.cc_key("hopper")
    with pytest.raises(KeyError, match="9.0"):
        devicespec.spec("2.0")


def test_theoretical_peaks_h100_sxm():
    # H100 SXM: 132 SMs, 1980 MHz boost, HBM3 2619 MHz x 5120 bit
    p = devicespec.theoretical_peaks("9.0", 132, 1_980_000, 2_619_000, 5120)
    assert p["peak_mem_gbps"] == pytest.approx(2 * 2.619e9 * 640 / 1e9)  # 3352 GB/s
    assert p["peak_fp32_gflops"] == pytest.approx(2 * 128 * 132 * 1.98)  # 66.9 TFLOP/s
    assert p["fp32_cores"] == 128 * 132


def test_compare_with_device_and_from_device():
    attrs = {"MAX_THREADS_PER_MULTIPROCESSOR": 2048, "MAX_SHARED_MEMORY_PER_MULTIPROCESSOR":
             233472, "RESERVED_SHARED_MEMORY_PER_BLOCK": 1024, "MAX_BLOCKS_PER_MULTIPROCESSOR":
             32, "MAX_REGISTERS_PER_MULTIPROCESSOR": 65536}
    assert devicespec.compare_with_device("9.0", attrs) == {}
    bad = attrs | {"MAX_BLOCKS_PER_MULTIPROCESSOR": 16}
    assert devicespec.compare_with_device("9.0", bad) == {"max_blocks_per_sm": (32, 16)}
    assert devicespec.from_device("9.0", bad).max_blocks_per_sm == 16
    assert set(devicespec.DEVICE_ATTRIBUTES.values()) <= set(devicespec.CU_DEVICE_ATTRIBUTE_IDS)


# -- NVIDIA's calculator, compiled here -----------------------------------------------------
REF_CPP = r"""
#include <cstdio>
#include <cuda_occupancy.h>
int main() {
  int major, minor, mtpb, mtsm, rpb, rpsm, nsm, regs, bs, bars;
  long long spb, spsm, optin, reserved, sstat, sdyn;
  while (scanf("%d %d %d %d %d %d %lld %lld %d %lld %lld %d %lld %d %lld %d", &major, &minor,
               &mtpb, &mtsm, &rpb, &rpsm, &spb, &spsm, &nsm, &optin, &reserved, &regs, &sstat,
               &bs, &sdyn, &bars) == 16) {
    cudaOccDeviceProp p;
    p.computeMajor = major; p.computeMinor = minor; p.maxThreadsPerBlock = mtpb;
    p.maxThreadsPerMultiprocessor = mtsm; p.regsPerBlock = rpb; p.regsPerMultiprocessor = rpsm;
    p.warpSize = 32; p.sharedMemPerBlock = spb; p.sharedMemPerMultiprocessor = spsm;
    p.numSms = nsm; p.sharedMemPerBlockOptin = optin; p.reservedSharedMemPerBlock = reserved;
    cudaOccFuncAttributes a;  // a kernel that did not opt in to more shared memory
    a.maxThreadsPerBlock = mtpb; a.numRegs = regs; a.sharedSizeBytes = sstat;
    a.numBlockBarriers = bars;
    cudaOccDeviceState st;
    cudaOccResult r;
    int e = cudaOccMaxActiveBlocksPerMultiprocessor(&r, &p, &a, &st, bs, sdyn);
    int grid = 0, best = 0;
    int e2 = cudaOccMaxPotentialOccupancyBlockSize(&grid, &best, &p, &a, &st, sdyn);
    if (e || e2) { printf("error %d %d\n", e, e2); continue; }
    printf("%d %u %d %d %d %d %d %d\n", r.activeBlocksPerMultiprocessor, r.limitingFactors,
           r.blockLimitRegs, r.blockLimitSharedMem, r.blockLimitWarps, r.blockLimitBlocks,
           best, grid);
  }
  return 0;
}
"""


def _occupancy_header() -> Path | None:
    cands = [os.environ.get("CUDA_HOME", ""), os.environ.get("CUDA_PATH", ""), "/usr/local/cuda"]
    nvcc = shutil.which("nvcc")
    if nvcc:
        cands.append(str(Path(nvcc).resolve().parent.parent))
        try:  # /usr/local/bin/nvcc may be a wrapper script: exec /usr/local/cuda-X/bin/nvcc
            text = Path(nvcc).read_text(errors="ignore")[:4096]
            cands += [str(Path(w).parent.parent) for w in text.split() if w.endswith("/nvcc")]
        except OSError:
            pass
    cands += sorted(glob.glob("/usr/local/cuda-*"), reverse=True) + ["/opt/cuda"]
    for c in cands:
        if c and (Path(c) / "include" / "cuda_occupancy.h").is_file():
            return Path(c) / "include"
    return None


@pytest.fixture(scope="module")
def nvidia_calculator(tmp_path_factory):
    inc = _occupancy_header()
    cxx = shutil.which("c++") or shutil.which("g++") or shutil.which("clang++")
    if inc is None or cxx is None:
        pytest.skip("needs cuda_occupancy.h (a CUDA toolkit) and a C++ compiler")
    d = tmp_path_factory.mktemp("occref")
    (d / "occref.cpp").write_text(REF_CPP)
    out = subprocess.run([cxx, "-O1", f"-I{inc}", str(d / "occref.cpp"), "-o",
                          str(d / "occref")], capture_output=True, text=True)
    if out.returncode != 0:
        pytest.skip(f"cuda_occupancy.h did not compile here: {out.stderr[-500:]}")
    known = {l_.split()[-1] for l_ in (inc / "cuda_occupancy.h").read_text().splitlines()
             if "#define __CUDA_OCC_MAJOR__" in l_}
    return d / "occref", int(next(iter(known), "0"))


BITS = {"warps": 1, "registers": 2, "shared_memory": 4, "blocks": 8, "barriers": 16}


@pytest.mark.slow
def test_calculator_equals_cuda_occupancy_h(nvidia_calculator):
    exe, max_major = nvidia_calculator
    rng = random.Random(7)
    cases, lines = [], []
    regs_all = [0, 1, 16, 24, 31, 32, 33, 40, 48, 56, 63, 64, 65, 72, 77, 80, 96, 110, 128,
                142, 168, 200, 232, 255]
    blocks_all = [1, 31, 32, 33, 64, 96, 100, 128, 144, 160, 192, 256, 320, 384, 480, 512,
                  576, 640, 768, 800, 896, 992, 1024, 1025]
    smem_all = [(0, 0), (0, 4096), (8192, 0), (1000, 3000), (0, 16 * KB), (0, 32 * KB),
                (0, 48 * KB), (4096, 44 * KB), (0, 48 * KB + 1), (0, 100 * KB), (12345, 0)]
    for cc, s in devicespec.SPECS.items():
        if s.major > max_major:
            continue  # an older toolkit's header does not know this architecture
        for regs in [r for r in regs_all if r <= s.max_regs_per_thread]:
            for bs in blocks_all:
                for st, dyn in smem_all:
                    bars = 1 if rng.random() < 0.85 else rng.choice([0, 2, 3])
                    cases.append((cc, regs, bs, st, dyn, bars))
                    lines.append(" ".join(map(str, [
                        s.major, s.minor, s.max_threads_per_block, s.max_threads_per_sm,
                        s.max_regs_per_block, s.regs_per_sm, s.smem_per_block, s.smem_per_sm,
                        100, s.smem_per_block_optin, s.smem_reserved_per_block, regs, st, bs,
                        dyn, bars])))
    out = subprocess.run([str(exe)], input="\n".join(lines) + "\n", capture_output=True,
                         text=True, check=True).stdout.splitlines()
    assert len(out) == len(cases)
    bad, potential = [], {}
    for (cc, regs, bs, st, dyn, bars), line in zip(cases, out):
        assert not line.startswith("error"), (cc, line)
        blocks, lim, lr, ls, lw, lb, best, grid = map(int, line.split())
        o = occ.occupancy(cc, bs, regs, st, dyn, barriers=bars)
        mine_lim = sum(BITS[k] for k in o.limiters)
        got = (o.active_blocks, o.blocks_by_registers, o.blocks_by_shared_memory,
               o.blocks_by_warps, o.blocks_by_blocks)
        ref = (blocks, lr, ls, lw, lb)
        # cuda_occupancy.h sets the four classic factor bits against the limit *before* the
        # barrier limit; ours lists what binds the final limit. They agree unless barriers
        # bind, so compare the bits only where they do not.
        lim_ok = mine_lim == lim or "barriers" in o.limiters
        # the potential block size tries 32 block sizes: check it once per kernel shape
        # (every 1-barrier shape, a sample of the others) to keep the test fast
        key = (cc, regs, st, dyn, bars)
        pot = (grid, best)
        if key not in potential and (bars == 1 or len(potential) % 8 == 0):
            potential[key] = occ.max_potential_block_size(cc, regs, st, dyn, sm_count=100,
                                                          barriers=bars)
            pot = potential[key]
        if got != ref or not lim_ok or pot != (grid, best):
            bad.append(((cc, regs, bs, st, dyn, bars), got, mine_lim, pot, ref, lim,
                        (grid, best)))
    assert len(cases) > 50_000
    assert not bad, f"{len(bad)} of {len(cases)} differ, e.g. {bad[:3]}"


# -- the experiment: config and grid ------------------------------------------------------------
def _err(block: dict) -> str:
    with pytest.raises(cfg.ConfigError) as e:
        cfg.validate({"experiments": {"occupancy": block}})
    return str(e.value)


def _block(**kw) -> dict:
    return cfg.validate({"experiments": {"occupancy": kw}})["experiments"]["occupancy"]


@pytest.mark.parametrize("block, needles", [
    ({"block_sizes": [48]}, ["experiments.occupancy.block_sizes[0]", "48", "multiple of 32"]),
    ({"block_sizes": [2048]}, ["experiments.occupancy.block_sizes[0]", "2048", "<= 1024"]),
    ({"variants": ["vec_add"]}, ["experiments.occupancy.variants[0]", "'vec_add'",
                                 "allowed values", "'vec_mul_regs'"]),
    ({"smem_bytes": 64 * KB}, ["experiments.occupancy.smem_bytes", "65536", "<= 49152"]),
    ({"smem_bytes": 1024}, ["experiments.occupancy.smem_bytes", ">= 4096"]),
    ({"live_values": 50}, ["experiments.occupancy.live_values", "50", "allowed values"]),
    ({"matmul_tiles": [33]}, ["experiments.occupancy.matmul_tiles[0]", "33", "<= 32"]),
    ({"blocks": [32]}, ["experiments.occupancy", "unknown key 'blocks'",
                        "did you mean 'block_sizes'"]),
])
def test_bad_values_name_the_key(block, needles):
    msg = _err(block)
    for n in needles:
        assert n in msg, (n, msg)


def test_defaults_and_grid():
    b = _block()
    assert b["block_sizes"] == list(range(32, 1025, 32)) and b["variants"] == oexp.VARIANTS
    pts = EXP.points(b)
    assert len(pts) == 3 * 32 + len(b["matmul_tiles"])
    assert all(p.gpu for p in pts)
    smem = [p for p in pts if p.variant == "vec_mul_smem"]
    assert all(p.params["smem_bytes"] == 32 * KB for p in smem)
    mm = [p for p in pts if p.variant == "matmul_tiled_dyn"]
    assert [p.params["block_size"] for p in mm] == [t * t for t in sorted(b["matmul_tiles"])]
    assert len({p.point_id for p in pts}) == len(pts)
    # the smoke grid validates and stays small
    sb = _block(**EXP.smoke)
    assert len(EXP.points(sb)) <= 12


def test_dynamic_shared_memory_of_each_variant():
    assert oexp._dynamic_smem(Point("occupancy", "vec_mul", {"block_size": 64})) == 0
    assert oexp._dynamic_smem(Point("occupancy", "vec_mul_smem",
                                    {"block_size": 64, "smem_bytes": 5000})) == 5000
    assert oexp._dynamic_smem(Point("occupancy", "matmul_tiled_dyn",
                                    {"block_size": 144, "tile": 12})) == 2 * 144 * 4


# -- the kernels' arithmetic, transcribed ------------------------------------------------------
def _smem_kernel_numpy(a, b, bs):
    """cuda/occupancy/occupancy.cu vec_mul_smem, block by block: s[t] = a[i] (0 past n), then
    c[i] = s[(t + 1) % bs] * b[i]."""
    n = a.size
    c = np.empty(n, np.float64)
    for start in range(0, n, bs):
        s = np.zeros(bs)
        m = min(bs, n - start)
        s[:m] = a[start:start + m]
        for t in range(m):
            c[start + t] = s[(t + 1) % bs] * b[start + t]
    return c


@pytest.mark.parametrize("n, bs", [(100, 32), (96, 32), (1000, 96), (7, 64)])
def test_vec_reference_matches_the_kernel_logic(n, bs):
    rng = np.random.default_rng(1)
    a, b = rng.uniform(-1, 1, n).astype(np.float32), rng.uniform(-1, 1, n).astype(np.float32)
    np.testing.assert_array_equal(oexp.vec_reference("vec_mul_smem", a, b, bs),
                                  _smem_kernel_numpy(a.astype(np.float64), b, bs))
    np.testing.assert_array_equal(oexp.vec_reference("vec_mul", a, b, bs),
                                  a.astype(np.float64) * b)


def test_kernels_are_declared_in_the_source():
    from cudalab.experiments.static_analysis import kernel_names
    from cudalab.gpu import CUDA_DIR

    src = (CUDA_DIR / "occupancy/occupancy.cu").read_text()
    assert set(kernel_names(src)) == set(oexp.VARIANTS)


# -- claims and figures on a synthetic table -------------------------------------------------
SYNTHETIC = "synthetic test data (not a GPU)"


def _rec(variant, params, t, metrics, status="ok"):
    pid = Point("occupancy", variant, params).point_id
    rec = {"schema_version": results.SCHEMA_VERSION, "experiment": "occupancy",
           "variant": variant, "point_id": pid, "params": params, "job_id": "synthetic",
           "seed": 0, "status": status, "reason": "", "t_start": 0.0, "t_end": 1.0,
           "provenance": {"gpu_name": SYNTHETIC, "compute_capability": "9.0"},
           "work": {"flops": float("nan"), "bytes": 12.0 * 2**24},
           "metrics": metrics}
    if t is None:
        rec |= {"timing": None, "check": {"error": 0.0, "tolerance": 0.0, "passed": True,
                                          "metric": "blocks_calc_vs_driver", "detail": ""}}
    else:
        rec |= {"timing": {"median": t, "iqr": 0.0, "cv": 0.01, "min": t, "mean": t, "std": 0,
                           "n": 10, "batch": 1, "timer": "cuda_event",
                           "stop_reason": "converged", "n_throttled": 0},
                "check": {"error": 1e-8, "tolerance": 1e-4, "metric": "rel_fro",
                          "passed": True, "detail": ""}}
    return rec


def synthetic_records(mismatch: bool = False):
    """Occupancy from our calculator for an H100-like cc 9.0; invented times that grow as
    occupancy drops below half (NOT measured)."""
    recs = []
    regs = {"vec_mul": 12, "vec_mul_regs": 77, "vec_mul_smem": 12, "matmul_tiled_dyn": 32}
    for v in oexp.VARIANTS:
        sizes = [(t * t, t) for t in (8, 16, 32)] if v == "matmul_tiled_dyn" else \
            [(bs, None) for bs in (32, 64, 128, 256, 512, 768, 1024)]
        for bs, tile in sizes:
            dyn = 2 * tile * tile * 4 if tile else (32 * KB if v == "vec_mul_smem" else 0)
            o = occ.occupancy("9.0", bs, regs[v], 0, dyn)
            api = occ.max_potential_block_size("9.0", regs[v], 0, 0 if tile else dyn)[1]
            blocks_drv = o.active_blocks + (1 if mismatch and v == "vec_mul" and bs == 256
                                            else 0)
            m = {"num_regs": regs[v], "occupancy_theory": o.occupancy,
                 "blocks_theory": o.active_blocks, "limiter": o.limiter,
                 "blocks_driver": blocks_drv,
                 "occupancy_driver": blocks_drv * o.warps_per_block / 64,
                 "calc_agrees": int(blocks_drv == o.active_blocks),
                 "api_block_size": api, "api_block_size_calc": api, "api_agrees": 1,
                 "launchable_theory": int(o.launchable), "launchable_driver": int(o.launchable),
                 "spec_note": ""}
            params = {"block_size": bs, "n": 2**24}
            if tile:
                params = {"block_size": bs, "tile": tile, "size": 2048}
                m |= {"best_tile": 32, "best_tile_occupancy": 1.0}
            if v == "vec_mul_smem":
                params["smem_bytes"] = 32 * KB
            t = None
            if o.launchable:
                t = 60e-6 / min(1.0, 2 * o.occupancy) if not tile else 2e-3 * (1 + 8 / tile)
                m["kernel_s"] = t
            recs.append(_rec(v, params, t, m))
    return recs


def _claims(df):
    return {r.key: r for r in claims.evaluate("occupancy", df)}


def test_claims_seen_on_a_consistent_table():
    df = results.build_table(synthetic_records())
    assert results.check_table(df) == []
    ex = _claims(df)
    agree = ex["calc_agrees_driver"]
    assert agree.passed is True and "24/24" in agree.evidence
    # the invented times follow the occupancy alone: small blocks lose nothing else here
    assert ex.pop("blocks_of_32_slower").passed is False
    assert ex.pop("full_but_slow").passed is False
    assert all(e.passed is not False for e in ex.values()), ex
    assert ex["low_occupancy_loses"].passed is True
    assert ex["regs_lower_occupancy"].passed is True
    assert "77 registers" in ex["regs_lower_occupancy"].evidence
    assert "small_blocks_block_limited" not in ex  # arithmetic, not a claim: a course fact
    from cudalab.experiments.occupancy.lesson import small_blocks_limiter

    said = small_blocks_limiter(df.assign(experiment="occupancy"), None)
    assert "32-thread blocks holds" in said and "From the limits table (arithmetic" in said
    assert ex["small_blocks_underfilled"].passed is None  # no Nsight Compute columns


def test_a_calculator_driver_mismatch_is_visible():
    df = results.build_table(synthetic_records(mismatch=True))
    e = _claims(df)["calc_agrees_driver"]
    assert e.passed is False
    assert "vec_mul at 256 threads" in e.evidence and "23/24" in e.evidence


def test_the_api_keeps_the_largest_of_the_tied_block_sizes():
    df = results.build_table(synthetic_records())
    assert _claims(df)["api_picks_largest"].passed is True
    df.loc[df["variant"] == "vec_mul", "m_api_block_size"] = 256  # a tie, not the largest
    e = _claims(df)["api_picks_largest"]
    assert e.passed is False and "vec_mul: the API picks 256" in e.evidence


def test_not_launchable_points_are_ok_without_a_time():
    df = results.build_table(synthetic_records())
    regs = df[(df["variant"] == "vec_mul_regs") & (df["p_block_size"] == 1024)]
    assert regs["status"].tolist() == ["ok"] and regs["time_median_s"].isna().all()
    assert float(regs["m_occupancy_theory"].iloc[0]) == 0.0


@pytest.mark.slow
def test_figures_draw(tmp_path):
    df = results.build_table(synthetic_records())
    drawn = figures.draw_experiment("occupancy", df, tmp_path)
    assert drawn == {"occupancy": True, "bandwidth": True}
    for name in EXP.lesson.figures:
        assert (tmp_path / "occupancy" / f"{name}.png").stat().st_size > 5000


def test_figures_and_claims_on_an_empty_or_failed_table(tmp_path):
    recs = synthetic_records()[:2]
    for r in recs:
        r["status"], r["reason"] = "failed", "kernel launch failed: synthetic"
    df = results.build_table(recs)
    assert EXP.plot("occupancy", df[df["status"] == "ok"]) is None
    ex = _claims(df)
    assert ex["correct"].passed is False and "synthetic" in ex["correct"].evidence
    drawn = figures.draw_experiment("occupancy", df, tmp_path)
    assert drawn == {"occupancy": False, "bandwidth": False}


# -- measure() end to end on a fake GPU --------------------------------------------------------
# The real thing runs in tests/gpu. Here pycuda's few calls the experiment makes are emulated
# with numpy (the kernels' semantics as cuda/occupancy/occupancy.cu states them) and the driver's
# occupancy answers come from the calculator, so the whole measure() path - inputs, launch
# geometry, poisoning, checks, metrics, the not-launchable branch - runs on the CPU.
class _Alloc:
    def __init__(self, nbytes):
        self.buf = np.zeros(nbytes, np.uint8)

    def free(self):
        self.buf = None


class _FakeCuda:
    @staticmethod
    def mem_alloc(nbytes):
        return _Alloc(nbytes)

    @staticmethod
    def memcpy_htod(dst, src):
        dst.buf[:] = np.ascontiguousarray(src).view(np.uint8).ravel()

    @staticmethod
    def memcpy_dtoh(dst, src):
        dst.view(np.uint8).ravel()[:] = src.buf

    @staticmethod
    def memset_d32(dst, value, count):
        dst.buf.view(np.uint32)[:count] = value


class _FakeFunction:
    REGS = {"vec_mul": 12, "vec_mul_regs": 77, "vec_mul_smem": 12, "matmul_tiled_dyn": 32}

    def __init__(self, name):
        self.name = name
        self.num_regs = self.REGS[name]
        self.shared_size_bytes = 0
        self.local_size_bytes = 0
        self.max_threads_per_block = occ.max_block_size("9.0", self.num_regs)
        self.launches = []

    def prepare(self, fmt):
        self.fmt = fmt

    def prepared_call(self, grid, block, *args, shared_size=0):
        assert len(args) == len(self.fmt)
        assert block[0] * block[1] * block[2] <= self.max_threads_per_block
        self.launches.append((grid, block, shared_size))
        f32 = lambda a: a.buf.view(np.float32)  # noqa: E731
        if self.name == "matmul_tiled_dyn":
            A, B, C, m, n, k = args
            assert block[0] == block[1] and shared_size == 2 * block[0] ** 2 * 4
            assert grid[0] * block[0] >= n and grid[1] * block[1] >= m
            C.buf.view(np.float32)[:] = (f32(A).reshape(m, k) @ f32(B).reshape(k, n)).ravel()
            return
        a, b, c, n = args[:4]
        bs = block[0]
        assert grid[0] * bs >= n
        if self.name == "vec_mul_smem":
            assert shared_size >= 4 * bs
            out = oexp.vec_reference("vec_mul_smem", f32(a)[:n], f32(b)[:n], bs)
        else:
            assert shared_size == 0
            out = f32(a)[:n] * f32(b)[:n]
        f32(c)[:n] = out


class _FakeKernel:
    def __init__(self, defines):
        self.options = ["-O3", "-lineinfo"] + [f"-D{k}={v}" for k, v in defines.items()]
        self.source_file = "occupancy/occupancy.cu"
        self.source_hash = "fake"
        self.functions = {}

    def function(self, name):
        return self.functions.setdefault(name, _FakeFunction(name))


class _FakeGpu:
    index = 0
    cuda = _FakeCuda
    device = SimpleNamespace(compute_capability=lambda: (9, 0))
    info = {"compute_capability": "9.0"}

    def __init__(self):
        self.kernels = {}

    def compile(self, file, defines=None):
        key = (file, tuple(sorted((defines or {}).items())))
        return self.kernels.setdefault(key, _FakeKernel(defines or {}))

    def event_timer(self):
        from cudalab.harness import WallTimer

        return WallTimer()

    def synchronize(self):
        pass


class _FakeDriver:
    """The driver's occupancy answers = the calculator's (a real GPU checks they agree)."""

    def device_attribute(self, ordinal, attr_id):
        name = {v: k for k, v in devicespec.CU_DEVICE_ATTRIBUTE_IDS.items()}[attr_id]
        s = devicespec.spec("9.0")
        field = {v: k for k, v in devicespec.DEVICE_ATTRIBUTES.items()}[name]
        return int(getattr(s, field))

    def max_active_blocks(self, fn, bs, dyn):
        return occ.occupancy("9.0", bs, fn.num_regs, 0, dyn).active_blocks

    def max_potential_block_size(self, fn, dyn):
        return occ.max_potential_block_size("9.0", fn.num_regs, 0, dyn,
                                            func_max_threads=fn.max_threads_per_block)


def test_measure_on_a_fake_gpu(monkeypatch):
    from cudalab.experiments.base import RunContext
    from cudalab.harness import Harness, Settings

    monkeypatch.setattr(oexp.occ, "CudaDriver", _FakeDriver)
    monkeypatch.setattr(oexp, "driver_function", lambda drv, kernel, name, func: func)
    block = _block(n=3000, block_sizes=[32, 96, 256, 1024], matmul_size=50,
                   matmul_tiles=[7, 16])
    gpu = _FakeGpu()
    ctx = RunContext(gpu=gpu, harness=Harness(Settings(warmup=1, min_samples=3, max_samples=5,
                                                       budget_s=0.01, min_sample_s=0)),
                     rng=np.random.default_rng(0), config={}, block=block)
    EXP.prepare(ctx)
    assert ctx.cache["occ_cc"] == "9.0" and ctx.cache["occ_spec_note"] == ""
    recs = []
    for p in EXP.points(block):
        r = EXP.measure(ctx, p)
        m = r.metrics
        assert m["calc_agrees"] == 1 and m["api_agrees"] == 1, (p, m)
        if p.variant == "vec_mul_regs" and p.params["block_size"] == 1024:
            # 77 registers: 1024 threads cannot launch; recorded with occupancy 0, no time
            assert r.timing is None and r.check.passed and m["occupancy_theory"] == 0
            assert "need 81920 registers per block" in m["limit_note"]  # 2560 x 32 warps
        else:
            assert r.timing is not None and r.check.passed, (p, r.check)
            assert r.check.error < 1e-6 and m["kernel_s"] > 0
        if p.variant == "vec_mul_smem":
            assert m["dynamic_smem_bytes"] == 32 * KB
            assert m["occupancy_theory"] == occ.occupancy("9.0", p.params["block_size"], 12, 0,
                                                          32 * KB).occupancy
        if p.variant == "matmul_tiled_dyn":
            assert m["best_tile"] == 32 and r.flops == 2 * 50**3
        recs.append(r)
    # the register-heavy kernel was compiled with LIVE, the others without
    assert {k[1] for k in gpu.kernels} == {(), (("LIVE", 64),)}
