"""static_analysis on the CPU (it never needs a GPU): config rules, grid expansion from the
kernel files, the ptxas report parser on recorded output, the occupancy metrics, nvcc runs
on the real kernel files (skipped where no nvcc is installed), the runner end to end, and
claims and figures on a synthetic table."""

from __future__ import annotations

import os
import sys

import numpy as np
import pytest

from cudalab import claims, figures, results
from cudalab import config as cfg
from cudalab import occupancy as occ
from cudalab.experiments import REGISTRY
from cudalab.experiments import matmul as mm
from cudalab.experiments import static_analysis as sa
from cudalab.experiments.base import Point, RunContext, Skipped
from cudalab.experiments.static_analysis import archs as targets
from cudalab.gpu import CUDA_DIR
from cudalab.harness import Harness, Settings

EXP = REGISTRY["static_analysis"]
NVCC = sa.find_nvcc("nvcc")
needs_nvcc = pytest.mark.skipif(NVCC is None, reason="needs nvcc (the CUDA toolkit)")


@pytest.fixture(autouse=True)
def _isolated(monkeypatch, tmp_path):
    """No test reads this machine's GPUs or writes the user's build cache."""
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")
    monkeypatch.setenv("CUDALAB_BUILD_CACHE", str(tmp_path / "build-cache"))
    targets.visible_gpu_archs.cache_clear()
    yield
    targets.visible_gpu_archs.cache_clear()


def _judged(df):
    """The lesson's claims judged on a table, by key."""
    return {r.key: r for r in claims.evaluate("static_analysis", df)}


def _err(block: dict) -> str:
    with pytest.raises(cfg.ConfigError) as e:
        cfg.validate({"experiments": {"static_analysis": block}})
    return str(e.value)


def _block(**kw) -> dict:
    return cfg.validate({"experiments": {"static_analysis": kw}})["experiments"][
        "static_analysis"]


# -- config ----------------------------------------------------------------------------------
@pytest.mark.parametrize("block, needles", [
    ({"archs": ["sm_99"]}, ["experiments.static_analysis.archs[0]", "'sm_99'", "allowed values",
                            "'sm_90'"]),
    ({"archs": []}, ["experiments.static_analysis.archs", "at least 1"]),
    ({"files": ["matmul.cpp"]}, ["experiments.static_analysis.files[0]", "matmul.cpp"]),
    ({"files": ["nope.cu"]}, ["experiments.static_analysis.files:", "'nope.cu'",
                              "not a file in cuda/", "matmul/matmul.cu"]),
    ({"variants": {"matmul/matmul.cu": ["TILE=8; rm -rf /"]}},
     ["experiments.static_analysis.variants.matmul/matmul.cu[0]"]),
    ({"dynamic_smem_bytes": {"vec_mul_smem": -1}},
     ["experiments.static_analysis.dynamic_smem_bytes.vec_mul_smem", "-1", ">= 0"]),
    ({"timeout_s": 1}, ["experiments.static_analysis.timeout_s", ">= 5"]),
    ({"arch": ["sm_90"]}, ["unknown key 'arch'", "did you mean 'archs'"]),
])
def test_bad_values_name_the_key(block, needles):
    msg = _err(block)
    for n in needles:
        assert n in msg, (n, msg)


def test_defaults_are_targets_nvcc_13_supports():
    b = _block()
    # auto: no GPU visible here (the fixture hides them), so the documented fallback
    assert b["archs"] == "auto" and sa.resolved_archs(b) == ["sm_90"]
    assert b["cache"] is True
    assert b["files"] == [] and b["variants"] == {} and b["nvcc"] == "nvcc"
    assert set(sa.ARCHS) >= {"sm_30", "sm_70", "sm_90", "sm_100", "sm_120"}


# -- grid ------------------------------------------------------------------------------------
SRC = '''
// extern "C" __global__ void commented_out(float* p)
/* __global__ void also_commented(float* p) */
#ifndef TILE
#define TILE 16
#endif
// cudalab-variant: TILE=8
// cudalab-variant:   TILE=32 --use_fast_math
extern "C" __global__ void plain(float* p) { }
template <int N> __global__ void templ(float* p) { }
extern "C" __global__ void __launch_bounds__(256)
bounded(float* p) { }
__global__ void
__launch_bounds__(128, 4) bounded2(float* p) { }
'''


def test_kernel_names_and_variants_from_the_source():
    assert sa.kernel_names(SRC) == ["plain", "templ", "bounded", "bounded2"]
    assert sa.file_variants(SRC) == ["TILE=8", "TILE=32 --use_fast_math"]
    assert sa.file_variants("__global__ void k() {}") == [""]
    assert sa.flag_tokens("TILE=32 FAST --use_fast_math") == ["-DTILE=32", "-DFAST",
                                                             "--use_fast_math"]
    opts = sa.nvcc_options("TILE=8", "sm_90")
    assert opts[:2] == ["-O3", "-lineinfo"] and "-arch=sm_90" in opts and "-DTILE=8" in opts


def test_grid_covers_every_file_kernel_variant_and_arch():
    b = _block(archs=["sm_80", "sm_90"])
    pts = EXP.points(b)
    assert pts and not any(p.gpu for p in pts)
    assert len({p.point_id for p in pts}) == len(pts)
    files = {p.params["file"] for p in pts}
    want = {p.relative_to(CUDA_DIR).as_posix() for p in CUDA_DIR.glob("*/*.cu")
            if p.parent.name != "exercises"}
    assert files == want and "common/hold.cu" in files
    occ_pts = [p for p in pts if p.params["file"] == "occupancy/occupancy.cu"]
    # occupancy.cu: 2 kernels x 2 declared variants x 2 archs, and the two extern __shared__
    # kernels as the occupancy experiment launches them (Experiment.compile_variants):
    # vec_mul_smem once, matmul_tiled_dyn once per default tile (5), each x 2 archs
    assert len(occ_pts) == 2 * 2 * 2 + 1 * 2 + 5 * 2
    assert {p.params["flags"] for p in occ_pts} == {"LIVE=64", "LIVE=32", ""}
    smem = [p for p in occ_pts if p.variant == "vec_mul_smem"]
    assert {p.params["dynamic_smem"] for p in smem} == {32 * 1024}
    dyn = {(p.params["tile"], p.params["dynamic_smem"]) for p in occ_pts
           if p.variant == "matmul_tiled_dyn"}
    assert dyn == {(t, 2 * t * t * 4) for t in (8, 12, 16, 24, 32)}
    # the config's variants replace the file's own lines (not an experiment's own)
    b2 = _block(files=["occupancy/occupancy.cu"], archs=["sm_90"],
                variants={"occupancy/occupancy.cu": ["LIVE=16"]})
    assert {p.params["flags"] for p in EXP.points(b2)} == {"LIVE=16", ""}
    assert len(EXP.points(_block(**EXP.smoke))) == 2 * 2 + 1 + 5


def test_the_run_s_occupancy_block_shapes_the_extern_shared_rows():
    config = cfg.validate({"experiments": {"occupancy": {"matmul_tiles": [8, 16],
                                                         "smem_bytes": 8192}}})
    pts = EXP.points(_block(files=["occupancy/occupancy.cu"], archs=["sm_90"]), config=config)
    got = {(p.variant, p.params.get("tile"), p.params.get("dynamic_smem")) for p in pts
           if p.variant in ("vec_mul_smem", "matmul_tiled_dyn")}
    assert got == {("vec_mul_smem", None, 8192), ("matmul_tiled_dyn", 8, 512),
                   ("matmul_tiled_dyn", 16, 2048)}


TWO_TILES = [{"rt": 2, "bt": 16, "bk": 8}, {"rt": 4, "bt": 64, "bk": 16}]


def _register_points(config: dict | None, block: dict) -> list[Point]:
    return [p for p in EXP.points(block, config=config) if p.variant == "matmul_register"]


def _matmul_flags(tile: dict) -> tuple[str, list[str]]:
    """The defines matmul.py compiles matmul_register with for `tile`: as a flags string and
    as the -D options GpuSession.compile passes (sorted by name)."""
    defines = mm.kernel_defines(Point("matmul", "register", dict(tile)))
    return (" ".join(f"{k}={v}" for k, v in sorted(defines.items())),
            [f"-D{k}={v}" for k, v in sorted(defines.items())])


def test_matmul_register_is_analysed_once_per_register_tile_of_the_matmul_block():
    config = cfg.validate({"experiments": {
        "static_analysis": {"files": ["matmul/matmul.cu"], "archs": ["sm_80", "sm_90"]},
        "matmul": {"register_tiles": TWO_TILES}}})
    block = config["experiments"]["static_analysis"]
    pts = EXP.points(block, config=config)
    assert len({p.point_id for p in pts}) == len(pts)
    reg = [p for p in pts if p.variant == "matmul_register"]
    # one point per (register tile, arch), never the defaults that compile it out
    assert len(reg) == len(TWO_TILES) * 2
    assert all(p.params["flags"] for p in reg)
    for tile in TWO_TILES:
        flags, dopts = _matmul_flags(tile)
        mine = [p for p in reg if {k: p.params[k] for k in ("rt", "bt", "bk")} == tile]
        assert {p.params["arch"] for p in mine} == {"sm_80", "sm_90"}
        assert {p.params["flags"] for p in mine} == {flags}
        assert all(f"rt{tile['rt']}-bt{tile['bt']}-bk{tile['bk']}" in p.point_id for p in mine)
        # nvcc gets exactly the -D defines the matmul experiment compiles the kernel with
        k = EXP.kernel_for(_ctx(block), mine[0])
        assert k.options[-len(dopts):] == dopts and "-arch=" + mine[0].params["arch"] in k.options
    # the file's other kernels keep the file's defaults
    others = [p for p in pts if p.variant != "matmul_register"]
    assert {p.variant for p in others} == {"matmul_naive", "matmul_tiled", "matmul_tiled_padded",
                                           "matmul_tiled_conflict"}
    assert {p.params["flags"] for p in others} == {""}


def test_register_tiles_fall_back_to_the_matmul_defaults():
    defaults = [dict(t) for t in mm.Matmul.schema["properties"]["register_tiles"]["default"]]
    want = {_matmul_flags(t)[0] for t in defaults}
    b = _block(files=["matmul/matmul.cu"], archs=["sm_90"])
    absent = cfg.validate({"experiments": {"static_analysis": {"files": ["matmul/matmul.cu"],
                                                               "archs": ["sm_90"]}}})
    disabled = cfg.validate({"experiments": {
        "static_analysis": {"files": ["matmul/matmul.cu"], "archs": ["sm_90"]},
        "matmul": {"enabled": False, "register_tiles": TWO_TILES}}})
    for config in (None, absent, disabled):
        assert {p.params["flags"] for p in _register_points(config, b)} == want
    # the grid the runner and the plan see is the one of the run's matmul block
    from cudalab.cli import plan_lines

    enabled = cfg.validate({"experiments": {
        "static_analysis": {"files": ["matmul/matmul.cu"], "archs": ["sm_90"]},
        "matmul": {"register_tiles": TWO_TILES[:1]}}})
    line = next(x for x in plan_lines(enabled) if "static_analysis" in x)
    assert " 5 grid points" in line  # 4 kernels under the defaults + 1 register tile


# -- ptxas report ----------------------------------------------------------------------------
# Recorded nvcc 13.0 output (sm_80, occupancy.cu with -DLIVE=128 --maxrregcount=32, and a
# template kernel calling a non-inlined device function on sm_90).
PTXAS = """\
ptxas info    : Overriding maximum register limit 256 for 'vec_mul_regs' with  32 of maxrregcount option
ptxas info    : 0 bytes gmem
ptxas info    : Compiling entry function 'vec_mul_smem' for 'sm_80'
ptxas info    : Function properties for vec_mul_smem
    0 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads
ptxas info    : Used 14 registers, used 1 barriers, 380 bytes cmem[0]
ptxas info    : Compile time = 6.1 ms
ptxas info    : Compiling entry function 'vec_mul_regs' for 'sm_80'
ptxas info    : Function properties for vec_mul_regs
    840 bytes stack frame, 1684 bytes spill stores, 1692 bytes spill loads
ptxas info    : Used 32 registers, used 0 barriers, 840 bytes cumulative stack size, 384 bytes cmem[0]
ptxas info    : Compiling entry function '_Z2tkILi64EEvPf' for 'sm_90'
ptxas info    : Function properties for _Z2tkILi64EEvPf
    64 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads
ptxas info    : Used 25 registers, used 1 barriers, 64 bytes cumulative stack size, 256 bytes smem
ptxas info    : Function properties for _Z6helperf
    0 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads
"""  # noqa: E501


def test_parse_ptxas():
    r = sa.parse_ptxas(PTXAS)
    assert set(r) == {"vec_mul_smem", "vec_mul_regs", "_Z2tkILi64EEvPf"}
    assert r["vec_mul_smem"] == {"registers": 14, "smem_static": 0, "cmem0": 380, "stack": 0,
                                 "spill_stores": 0, "spill_loads": 0, "barriers": 1,
                                 "local": 0}
    assert (r["vec_mul_regs"]["spill_stores"], r["vec_mul_regs"]["spill_loads"],
            r["vec_mul_regs"]["stack"], r["vec_mul_regs"]["registers"]) == (1684, 1692, 840, 32)
    t = sa.find_kernel(r, "tk")
    assert t is not None and (t["registers"], t["smem_static"], t["stack"]) == (25, 256, 64)
    assert sa.find_kernel(r, "helper") is None and sa.find_kernel(r, "vec_mul") is None


def test_usage_metrics_by_hand():
    # sm_80, 77 registers, 8 KB static smem: 2560 registers per warp -> 24 warps per SM;
    # 256 threads: 3 blocks (24 warps, 37.5 %); shared memory: (8192 + 1024) -> 18 blocks.
    u = {"registers": 77, "smem_static": 8192, "cmem0": 0, "stack": 0, "spill_stores": 0,
         "spill_loads": 0, "barriers": 1, "local": 0}
    m = sa.usage_metrics("sm_80", u)
    assert m["cc"] == "8.0" and m["occupancy_256"] == pytest.approx(0.375)
    assert m["limiter_256"] == "registers" and m["blocks_256"] == 3
    assert m["max_block_size"] == 768 and m["best_occupancy"] == pytest.approx(0.375)
    assert m["best_block_size"] == 768 and m["api_block_size"] == 768
    assert m["occupancy_1024"] == 0.0
    # dynamic shared memory given in the config counts
    m2 = sa.usage_metrics("sm_80", u | {"registers": 16}, dynamic_smem=64 * 1024)
    assert m2["occupancy_256"] == occ.occupancy("8.0", 256, 16, 8192, 64 * 1024).occupancy
    assert m2["dynamic_smem"] == 64 * 1024
    # a kernel no block can run
    m3 = sa.usage_metrics("sm_80", u | {"smem_static": 60 * 1024})
    assert m3["max_block_size"] == 0 and "exceed" in m3["limit_note"]


# -- nvcc on the real files -----------------------------------------------------------------
@needs_nvcc
def test_compile_report_of_the_occupancy_kernels():
    r64 = sa.compile_report(NVCC, CUDA_DIR / "occupancy/occupancy.cu", "LIVE=64", "sm_90")
    r16 = sa.compile_report(NVCC, CUDA_DIR / "occupancy/occupancy.cu", "LIVE=16", "sm_90")
    assert set(r64) == {"vec_mul", "vec_mul_regs", "vec_mul_smem", "matmul_tiled_dyn"}
    assert r64["vec_mul_regs"]["registers"] > r16["vec_mul_regs"]["registers"] > \
        r64["vec_mul"]["registers"] > 0
    assert r64["vec_mul_smem"]["barriers"] == 1 and r64["vec_mul"]["smem_static"] == 0
    spill = sa.compile_report(NVCC, CUDA_DIR / "occupancy/occupancy.cu",
                              "LIVE=128 --maxrregcount=32",
                              "sm_80")
    assert spill["vec_mul_regs"]["spill_stores"] > 0 and spill["vec_mul_regs"]["registers"] <= 32


@needs_nvcc
def test_static_shared_memory_of_the_tiled_matmul():
    r = sa.compile_report(NVCC, CUDA_DIR / "matmul/matmul.cu", "TILE=32", "sm_80")
    assert r["matmul_tiled"]["smem_static"] == 2 * 32 * 32 * 4


@needs_nvcc
def test_unsupported_arch_fails_with_a_clear_reason():
    if "sm_70" in sa.supported_archs(NVCC):
        pytest.skip("this nvcc still supports sm_70")
    with pytest.raises(sa.CompileError, match=r"cannot compile for sm_70 \(it supports .*sm_90"):
        sa.compile_report(NVCC, CUDA_DIR / "vector_add/vector_add.cu", "", "sm_70")


@needs_nvcc
def test_compile_errors_show_nvcc_output(tmp_path, monkeypatch):
    bad = tmp_path / "bad.cu"
    bad.write_text('extern "C" __global__ void k(float* p) { p[0] = undefined_name; }\n')
    with pytest.raises(sa.CompileError, match="undefined_name"):
        sa.compile_report(NVCC, bad, "", "sm_90")


@pytest.mark.skipif(not hasattr(os, "SCHED_IDLE"), reason="Linux scheduling classes")
def test_nvcc_runs_in_the_background(tmp_path):
    # a local run puts this job beside the timed ones: its nvcc must not delay their CPU work
    fake, policy = tmp_path / "nvcc", str(tmp_path / "policy")
    fake.write_text(f"#!{sys.executable}\nimport os\n"
                    f"open({policy!r}, 'w').write(str(os.sched_getscheduler(0)))\n"
                    "raise SystemExit(1)\n")
    fake.chmod(0o755)
    with pytest.raises(sa.CompileError):
        sa.compile_report(str(fake), CUDA_DIR / "vector_add/vector_add.cu", "", "sm_90")
    assert int((tmp_path / "policy").read_text()) == os.SCHED_IDLE
    assert os.sched_getscheduler(0) != os.SCHED_IDLE  # only the child


def _ctx(block):
    return RunContext(gpu=None, harness=Harness(Settings()), rng=np.random.default_rng(0),
                      config={}, block=block)


def test_find_nvcc_looks_in_the_toolkit_homes(monkeypatch, tmp_path):
    fake = tmp_path / "cuda-12.4" / "bin"
    fake.mkdir(parents=True)
    (fake / "nvcc").write_text("#!/bin/sh\n")
    (fake / "nvcc").chmod(0o755)
    monkeypatch.setenv("PATH", "/nonexistent")
    monkeypatch.setenv("CUDA_HOME", str(tmp_path / "cuda-12.4"))
    assert sa.find_nvcc("nvcc") == str(fake / "nvcc")
    assert sa.find_nvcc("no-such-nvcc-here") is None


def test_missing_nvcc_fails_the_point_naming_nvcc():
    b = _block(files=["vector_add/vector_add.cu"], archs=["sm_90"], nvcc="nvcc-no-such-version")
    p = EXP.points(b)[0]
    with pytest.raises(sa.CompileError, match="nvcc not found.*nvcc-no-such-version"):
        EXP.measure(_ctx(b), p)


@needs_nvcc
def test_measure_and_kernel_for():
    b = _block(files=["occupancy/occupancy.cu"], archs=["sm_90"])
    ctx = _ctx(b)
    p = Point("static_analysis", "vec_mul_regs",
              {"file": "occupancy/occupancy.cu", "flags": "LIVE=64", "arch": "sm_90"}, gpu=False)
    r = EXP.measure(ctx, p)
    assert r.timing is None and r.check.passed and r.check.metric == "launchable"
    assert r.metrics["registers"] > 40 and r.metrics["cc"] == "9.0"
    k = EXP.kernel_for(ctx, p)
    assert "-DLIVE=64" in k.options and len(k.source_hash) == 16
    k2 = EXP.kernel_for(ctx, Point("static_analysis", "vec_mul_regs",
                                   {"file": "occupancy/occupancy.cu", "flags": "LIVE=32",
                                    "arch": "sm_90"}, gpu=False))
    assert k2.source_hash != k.source_hash
    # a kernel the flags compile out is skipped, naming what was compiled
    gone = Point("static_analysis", "matmul_register",
                 {"file": "matmul/matmul.cu", "flags": "", "arch": "sm_90"}, gpu=False)
    with pytest.raises(Skipped, match="matmul_register is not compiled.*matmul_naive"):
        EXP.measure(ctx, gone)


@needs_nvcc
def test_runner_end_to_end_without_a_gpu(tmp_path):
    from cudalab.runner import run_experiment

    config = cfg.validate({"telemetry": {"nvidia_smi": False, "nvml": False},
                           "experiments": {"static_analysis": dict(EXP.smoke)}})
    manifest = run_experiment(config, "static_analysis", tmp_path)
    recs = list(results.iter_records(tmp_path / "raw"))
    # the 4 kernels of the smoke grid plus the extern __shared__ ones per occupancy tile
    assert len(recs) == 10 and all(r["status"] == "ok" for r in recs), \
        [(r["point_id"], r.get("reason")) for r in recs if r["status"] != "ok"]
    assert manifest["counts"]["ok"] == 10
    df = results.build_table(recs)
    assert results.check_table(df) == []
    assert df["m_registers"].notna().all() and (df["p_arch"] == "sm_90").all()
    assert df["nvcc_options"].str.contains("-arch=sm_90").all()


@needs_nvcc
@pytest.mark.slow
def test_runner_analyses_every_register_tile_for_every_arch(tmp_path):
    from cudalab.runner import run_experiment

    config = cfg.validate({"telemetry": {"nvidia_smi": False, "nvml": False},
                           "experiments": {"static_analysis": {"files": ["matmul/matmul.cu"],
                                                               "archs": ["sm_80", "sm_90"]},
                                           "matmul": {"register_tiles": TWO_TILES}}})
    run_experiment(config, "static_analysis", tmp_path)
    df = results.build_table(list(results.iter_records(tmp_path / "raw")))
    assert results.check_table(df) == []
    assert (df["status"] == "ok").all(), df.loc[df["status"] != "ok", ["point_id", "reason"]]
    reg = df[df["variant"] == "matmul_register"]
    assert len(reg) == len(TWO_TILES) * 2
    for tile in TWO_TILES:
        rows = reg[(reg["p_rt"] == tile["rt"]) & (reg["p_bt"] == tile["bt"])
                   & (reg["p_bk"] == tile["bk"])]
        assert sorted(rows["p_arch"]) == ["sm_80", "sm_90"]
        assert (rows["m_registers"] > 0).all()
        assert (rows["m_smem_static"] == mm.register_smem_bytes(tile["bt"], tile["bk"])).all()
        assert rows["nvcc_options"].str.endswith(" ".join(_matmul_flags(tile)[1])).all()
    # the report's section: the claims and both figures on these rows
    comp = _judged(df)["compiles"]
    assert comp.passed is True and "skipped" not in comp.evidence
    assert figures.draw_experiment("static_analysis", df, tmp_path / "fig") == {
        name: True for name in EXP.lesson.figures}
    labels = set(EXP._frame(df)["label"])
    assert {"matmul:matmul_register [rt=2 bt=16 bk=8]",
            "matmul:matmul_register [rt=4 bt=64 bk=16]"} <= labels


# -- claims and figures ---------------------------------------------------------------------
def _rec(kernel, file, flags, arch, usage, status="ok", **extra):
    params = {"file": file, "flags": flags, "arch": arch, **extra}
    rec = {"schema_version": results.SCHEMA_VERSION, "experiment": "static_analysis",
           "variant": kernel, "point_id": Point("static_analysis", kernel, params).point_id,
           "params": params, "job_id": "synthetic", "seed": 0, "status": status, "reason": "",
           "t_start": 0.0, "t_end": 1.0, "provenance": {"host": "synthetic"},
           "timing": None, "work": {"flops": float("nan"), "bytes": float("nan")}}
    if status == "ok":
        m = sa.usage_metrics(arch, usage)
        rec |= {"check": {"error": 0.0, "tolerance": 0.0, "metric": "launchable",
                          "passed": m["max_block_size"] > 0, "detail": ""}, "metrics": m}
    else:
        rec["reason"] = "nvcc failed: synthetic"
    return rec


def synthetic_records(spill=False, failed=False, register=False):
    """Invented ptxas numbers (NOT compiled)."""
    base = {"smem_static": 0, "cmem0": 380, "stack": 0, "spill_stores": 0, "spill_loads": 0,
            "barriers": 0, "local": 0}
    recs = []
    for arch, dr in (("sm_75", 0), ("sm_80", 2), ("sm_90", 4)):
        recs.append(_rec("vec_mul", "occupancy/occupancy.cu", "", arch, base | {"registers": 12}))
        recs.append(_rec("vec_mul_regs", "occupancy/occupancy.cu", "LIVE=64", arch,
                         base | {"registers": 72 + dr,
                                 "spill_stores": 16 if spill and arch == "sm_90" else 0}))
        recs.append(_rec("matmul_tiled", "matmul/matmul.cu", "TILE=32", arch,
                         base | {"registers": 32, "smem_static": 8192, "barriers": 1}))
        if register:
            for tile, regs in ((TWO_TILES[0], 40), (TWO_TILES[1], 64 + dr)):
                recs.append(_rec("matmul_register", "matmul/matmul.cu",
                                 _matmul_flags(tile)[0], arch,
                                 base | {"registers": regs, "barriers": 1,
                                         "smem_static": mm.register_smem_bytes(tile["bt"],
                                                                               tile["bk"])},
                                 **tile))
    if failed:
        recs.append(_rec("sobel_shared", "sobel/sobel.cu", "", "sm_90", base, status="failed"))
    return recs


def test_claims_on_a_synthetic_table():
    df = results.build_table(synthetic_records())
    assert results.check_table(df) == []
    ex = _judged(df)
    assert ex["compiles"].passed is True
    assert ex["no_spills"].passed is True
    fit = ex["launch_256"]
    assert fit.passed is True and "occupancy:vec_mul_regs on sm_80, 38 %" in fit.evidence
    assert "(registers)" in fit.evidence
    # one kernel of three changes its registers per target: not "most"
    arch = ex["registers_per_arch"]
    assert arch.passed is False and "1/3 kernels" in arch.evidence
    # one target only: nothing to compare
    one = _judged(df[df["p_arch"] == "sm_90"])["registers_per_arch"]
    assert one.state.value == "not measured" and "one target" in one.evidence


def test_claims_report_spills_failures_and_kernels_that_cannot_launch():
    recs = synthetic_records(spill=True, failed=True)
    recs.append(_rec("huge", "sobel/sobel.cu", "", "sm_90",
                     {"registers": 32, "smem_static": 60 * 1024, "cmem0": 0, "stack": 0,
                      "spill_stores": 0, "spill_loads": 0, "barriers": 0, "local": 0}))
    df = results.build_table(recs)
    ex = _judged(df)
    comp = ex["compiles"]
    assert comp.passed is False and "synthetic" in comp.evidence
    sp = ex["no_spills"]
    assert sp.passed is False and "occupancy:vec_mul_regs" in sp.evidence
    fit = ex["launch_256"]
    assert fit.passed is False and "cannot launch: sobel:huge sm_90" in fit.evidence


def test_a_variant_that_changes_nothing_is_shown_once():
    base = {"smem_static": 0, "cmem0": 0, "stack": 0, "spill_stores": 0, "spill_loads": 0,
            "barriers": 0, "local": 0}
    recs = [_rec(k, "occupancy/occupancy.cu", fl, "sm_90", base | {"registers": r})
            for k, fl, r in (("vec_mul", "LIVE=64", 12), ("vec_mul", "LIVE=32", 12),
                             ("vec_mul_regs", "LIVE=64", 77), ("vec_mul_regs", "LIVE=32", 45))]
    d = EXP._frame(results.build_table(recs))
    assert sorted(d["label"]) == ["occupancy:vec_mul", "occupancy:vec_mul_regs [LIVE=32]",
                                  "occupancy:vec_mul_regs [LIVE=64]"]


def test_figures_draw(tmp_path):
    df = results.build_table(synthetic_records(spill=True))
    assert figures.draw_experiment("static_analysis", df, tmp_path) == {
        name: True for name in EXP.lesson.figures}
    for name in EXP.lesson.figures:
        assert (tmp_path / "static_analysis" / f"{name}.png").stat().st_size > 5000


def test_register_tile_rows_are_labelled_with_their_tile_and_drawn(tmp_path):
    df = results.build_table(synthetic_records(register=True))
    assert results.check_table(df) == []
    d = EXP._frame(df)
    reg = sorted(set(d.loc[d["variant"] == "matmul_register", "label"]))
    assert reg == ["matmul:matmul_register [rt=2 bt=16 bk=8]",
                   "matmul:matmul_register [rt=4 bt=64 bk=16]"]
    ex = _judged(df)  # two of five kernels change registers per target: not most of them
    assert all(e.passed for k, e in ex.items() if k != "registers_per_arch"), ex
    assert figures.draw_experiment("static_analysis", df, tmp_path) == {
        name: True for name in EXP.lesson.figures}


PTX_BOUNDS = """
.visible .entry bounded(
\t.param .u64 bounded_param_0
)
.maxntid 128, 2, 1
.minnctapersm 2
{
\tret;
}
.visible .entry free(
\t.param .u64 free_param_0
)
{
\tret;
}
"""


def test_parse_maxntid_reads_launch_bounds_from_ptx():
    assert sa.parse_maxntid(PTX_BOUNDS) == {"bounded": 256}
    assert sa.parse_maxntid("") == {}


def test_launch_bounds_cap_the_block_sizes():
    u = {"registers": 32, "smem_static": 0, "cmem0": 0, "stack": 0, "spill_stores": 0,
         "spill_loads": 0, "barriers": 1, "local": 0}
    free = sa.usage_metrics("sm_90", u)
    capped = sa.usage_metrics("sm_90", u | {"max_threads": 256})
    assert free["occupancy_512"] == 1.0 and free["max_block_size"] == 1024
    assert capped["launch_bounds"] == 256 and free["launch_bounds"] == 0
    assert capped["occupancy_256"] == free["occupancy_256"] == 1.0
    assert capped["occupancy_512"] == capped["occupancy_1024"] == 0.0  # the driver refuses
    assert capped["max_block_size"] == 256 and capped["api_block_size"] <= 256
    assert capped["best_block_size"] <= 256
    curve = sa.bounded_curve("sm_90", 32, 0, 0, 1, 256)
    over = [o for o in curve if o.block_size > 256]
    assert over and all(not o.launchable and o.limiter == "launch bounds" for o in over)


@needs_nvcc
def test_register_tiled_matmul_is_bounded_to_its_tile():
    for flags, tile in sa.matmul_register_variants(None):
        r = sa.compile_report(NVCC, CUDA_DIR / "matmul/matmul.cu", flags, "sm_90")
        threads = (tile["bt"] // tile["rt"]) ** 2
        assert r["matmul_register"]["max_threads"] == threads, (flags, r["matmul_register"])
        assert r["matmul_tiled"]["max_threads"] == 0  # no bound declared
        m = sa.usage_metrics("sm_90", r["matmul_register"])
        assert m["max_block_size"] <= threads and m["occupancy_1024"] == 0.0


@needs_nvcc
def test_declared_dynamic_shared_memory_reaches_the_occupancy():
    """vec_mul_smem's extern __shared__ buffer: the occupancy experiment declares what its
    launches ask for; the config's dynamic_smem_bytes still overrides it."""
    b = _block(files=["occupancy/occupancy.cu"], archs=["sm_80"])
    p = next(p for p in EXP.points(b) if p.variant == "vec_mul_smem")
    m = EXP.measure(_ctx(b), p).metrics
    assert m["dynamic_smem"] == 32 * 1024
    # 164 KiB of shared memory per SM on sm_80 holds 5 blocks of 32 KiB (plus reserves)
    assert m["occupancy_1024"] < 1.0 or m["occupancy_256"] < 1.0
    b0 = _block(files=["occupancy/occupancy.cu"], archs=["sm_80"],
                dynamic_smem_bytes={"vec_mul_smem": 0})
    m0 = EXP.measure(_ctx(b0), p).metrics
    assert m0["dynamic_smem"] == 0 and m0["occupancy_256"] >= m["occupancy_256"]
