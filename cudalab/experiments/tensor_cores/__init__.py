"""Tensor cores: matrix products in TF32, FP16 and BF16 with FP32 accumulation, by WMMA,
by mma.sync with ldmatrix and cp.async stages, by Hopper's wgmma on TMA-loaded tiles (four
rungs, sm_90a only: wgmma.py) and by cuBLAS (cublasGemmEx through CuPy, math mode and
compute type set explicitly) in the same job as the ceiling; cuBLAS SGEMM in FP32 is the
CUDA-core baseline. The lesson: precision is a knob, speed against error.

C[M x N] = A[M x K] B[K x N], row-major, C in float32. A point is a size (m, k, n), a
variant (wmma, mma, wgmma_*, cublas), a precision (fp32, tf32, fp16, bf16) and, for mma,
its tile (bm, bn, bk, wm, wn, stages); for the pipelined wgmma rungs its stages (and bn).
Inputs are rounded to the precision on the host (numerics.py says how and derives the
check's tolerance): every point is checked against the float64
product of its rounded inputs, and its error against the float64 product of the unrounded
float32 inputs is recorded as m_err_input.

The wgmma rungs build for sm_90a (SourceModule(arch="sm_90a")); TMA's tensor maps come
from the driver's cuTensorMapEncodeTiled through ctypes (tma.py) and travel as 128-byte
__grid_constant__ kernel parameters. On a GPU other than compute capability 9.x their points
are skipped as not applicable, with the reason.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

import numpy as np
import pandas as pd

from cudalab import tensor_peaks
from cudalab.experiments import base
from cudalab.experiments.base import Check, Experiment, Point, Result, block_schema
from cudalab.experiments.tensor_cores import cublas_ex, kernels, numerics, wgmma
from cudalab.experiments.tensor_cores import figures as tc_figures
from cudalab.experiments.tensor_cores.kernels import (
    DEFAULT_MMA_TILES,
    ITEMSIZE,
    MMA_ENUMS,
    MMA_KEYS,
    RUNS,
    SHIPPED_VARIANTS,
    SIZE_MULTIPLE,
    VARIANTS,
)
from cudalab.experiments.tensor_cores.lesson import LESSON

if TYPE_CHECKING:
    from cudalab.experiments.base import RunContext

_size = {"oneOf": [{"type": "integer", "minimum": SIZE_MULTIPLE, "maximum": 16384},
                   base.int_tuple_schema(3, SIZE_MULTIPLE, 16384)]}


def mkn(size: Any) -> tuple[int, int, int]:
    return (size, size, size) if isinstance(size, int) else tuple(int(x) for x in size)


class TensorCores(Experiment):
    name = "tensor_cores"
    kernel_files = ("tensor_cores/tensor_core_mma.cu", "tensor_cores/tensor_core_wmma.cu",
                    "tensor_cores/wgmma.cu")
    order = 32
    vs_device_peak = False  # the FP32 CUDA-core peak is not these points' ceiling
    # each point carries its precision's dense peak (m_peak_precision_gflops): the roofline
    # draws these points under the roof of their precision
    precision_roofs = True
    roofline = True
    lesson = LESSON
    schema = block_schema({
        "sizes": {"type": "array", "items": _size, "minItems": 1,
                  "default": [1024, 2048, 4096],
                  "description": f"matrix sizes n or [m, k, n]; every dimension a multiple "
                                 f"of {SIZE_MULTIPLE} (the kernels have no edge code)"},
        # the wgmma rungs are chosen by name only: their first GPU run (H200) failed its
        # checks (docs/experiments.md), and a wrong rung must not reach a default run
        "variants": base.choices_schema(VARIANTS) | {"default": SHIPPED_VARIANTS},
        "precisions": base.choices_schema(
            numerics.PRECISIONS, "input precisions (fp32: cuBLAS SGEMM only; mma: fp16 and "
            "bf16; wmma and wgmma_*: tf32, fp16, bf16)"),
        "mma_tiles": {
            "type": "array", "minItems": 1, "uniqueItems": True,
            "default": DEFAULT_MMA_TILES,
            "description": "tile configurations of the mma kernel (block bm x bn, k-slice "
                           "bk, warp wm x wn, cp.async stages); the figures keep the best",
            "items": {"type": "object", "additionalProperties": False,
                      "required": list(MMA_KEYS),
                      "properties": {k: {"enum": v} for k, v in MMA_ENUMS.items()}},
        },
        "wgmma_stages": {
            "type": "array", "items": {"enum": wgmma.STAGE_CHOICES}, "minItems": 1,
            "uniqueItems": True, "default": wgmma.DEFAULT_STAGE_SWEEP,
            "description": "shared-memory stages of the pipelined wgmma rungs (wgmma_pipe, "
                           "wgmma_ws, wgmma_persist), one point per value: pipeline depth "
                           "against time; wgmma_tma has one stage by design",
        },
        "wgmma_bn": {"enum": wgmma.BN_CHOICES, "default": wgmma.DEFAULT_BN,
                     "description": "block tile width of wgmma_ws and wgmma_persist (128 rows "
                                    "x bn; bn / 2 FP32 accumulators a consumer thread)"},
    })
    smoke = {"sizes": [256, [512, 256, 768]],
             "mma_tiles": DEFAULT_MMA_TILES[:1] + DEFAULT_MMA_TILES[3:4]}

    def check_config(self, block: dict[str, Any]) -> list[str]:
        msgs = []
        for i, s in enumerate(block.get("sizes", [])):
            if any(d % SIZE_MULTIPLE for d in mkn(s)):
                msgs.append(f"sizes[{i}]: {s}: every dimension must be a multiple of "
                            f"{SIZE_MULTIPLE}")
        for i, t in enumerate(block.get("mma_tiles", [])):
            msgs += [f"mma_tiles[{i}]: {m}" for m in kernels.check_mma_tile(t)]
        chosen = block.get("variants", SHIPPED_VARIANTS)
        for rung in (r for r in wgmma.RUNGS[1:] if r in chosen):
            for st in block.get("wgmma_stages", wgmma.DEFAULT_STAGE_SWEEP):
                bn = block.get("wgmma_bn", wgmma.DEFAULT_BN)
                msgs += [f"wgmma_stages: {m}" for m in wgmma.shape_problems(rung, st, bn)]
        return msgs

    def points(self, block: dict[str, Any]) -> list[Point]:
        """By size (inputs made once per size), then precision (its rounded inputs and
        reference made once), then variant."""
        pts = []
        for size in sorted(block["sizes"], key=lambda s: math.prod(mkn(s))):
            m, k, n = mkn(size)
            for prec in block["precisions"]:
                for v in block["variants"]:
                    if prec not in RUNS[v]:
                        continue
                    base_p = {"m": m, "k": k, "n": n, "precision": prec}
                    tiles = (block["mma_tiles"] if v == "mma" else
                             self._wgmma_shapes(v, block) if v in wgmma.RUNGS else [{}])
                    pts += [Point(self.name, v, base_p | {x: int(t[x]) for x in t})
                            for t in tiles]
        return pts

    @staticmethod
    def _wgmma_shapes(rung: str, block: dict[str, Any]) -> list[dict[str, int]]:
        """The extra point parameters of a wgmma rung: none for the one-stage rung, stages
        for the pipeline, stages and bn for the warp-specialised ones."""
        if rung == "wgmma_tma":
            return [{}]
        stages = block.get("wgmma_stages", wgmma.DEFAULT_STAGE_SWEEP)
        if rung == "wgmma_pipe":
            return [{"stages": int(s)} for s in stages]
        return [{"stages": int(s), "bn": int(block.get("wgmma_bn", wgmma.DEFAULT_BN))}
                for s in stages]

    def gpu_bytes(self, point: Point) -> int:
        p = point.params
        one = ITEMSIZE[p["precision"]] * (p["m"] * p["k"] + p["k"] * p["n"]) + 4 * p["m"] * p["n"]
        if point.variant in wgmma.RUNGS and p["precision"] in wgmma.K_MAJOR_B:
            one += ITEMSIZE[p["precision"]] * p["k"] * p["n"]  # B^T
        return 2 * one if point.variant == "cublas" else one

    def compile_variants(self, config: dict[str, Any] | None) -> list[base.CompileVariant]:
        tiles = self.settings_in(config).get("mma_tiles") or DEFAULT_MMA_TILES
        out = []
        for t in tiles:
            p = Point(self.name, "mma", {"m": 0, "n": 0, "precision": "fp16", **t})
            for prec in RUNS["mma"]:
                # sm_80+ code (empty below), launched with the shared memory opt-in
                out.append(base.CompileVariant("tensor_cores/tensor_core_mma.cu", f"tc_mma_{prec}",
                                               kernels.kernel_defines(p), dict(t),
                                               kernels.mma_smem_bytes(t), optin=True,
                                               min_sm=80))
        return out

    # -- measuring ---------------------------------------------------------------------
    def kernel_for(self, ctx: RunContext, point: Point) -> Any:
        if point.variant == "cublas":
            return cublas_ex.cublas_kernel_info(point.params["precision"])
        if kernels.is_wgmma(point):
            cc = tuple(int(x) for x in str(ctx.gpu.info["compute_capability"]).split("."))
            if (why := wgmma.not_applicable(cc)):
                raise base.Skipped(f"not applicable: {why}")
            return ctx.gpu.compile(kernels.kernel_source(point), kernels.kernel_defines(point),
                                   arch=wgmma.ARCH)
        return ctx.gpu.compile(kernels.kernel_source(point), kernels.kernel_defines(point))

    def _inputs(self, ctx: RunContext, m: int, k: int, n: int, prec: str):
        """(device A, device B, reference of the rounded inputs, reference of the unrounded
        inputs): one size and one precision in memory at a time."""
        def make_exact():
            a = base.uniform_f32(ctx.rng, (m, k))
            b = base.uniform_f32(ctx.rng, (k, n))
            return a, b, a.astype(np.float64) @ b.astype(np.float64)

        a, b, exact = ctx.cache.one_per_slot("tc_inputs", ("tc", m, k, n), make_exact)

        def make_rounded():
            da, db = numerics.device_input(a, prec), numerics.device_input(b, prec)
            ref = exact if prec == "fp32" else (
                numerics.exact_values(da, prec) @ numerics.exact_values(db, prec))
            return da, db, ref

        da, db, ref = ctx.cache.one_per_slot("tc_rounded", ("tc", m, k, n, prec), make_rounded)
        return da, db, ref, exact

    def measure(self, ctx: RunContext, point: Point) -> Result:
        p = point.params
        m, k, n, prec = p["m"], p["k"], p["n"], p["precision"]
        kernel = self.kernel_for(ctx, point)  # Skipped before inputs where CuPy is missing
        da, db, ref, exact = self._inputs(ctx, m, k, n, prec)
        cuda = ctx.gpu.cuda
        c = ctx.cache.one_per_slot("tc_out", ("tc_out", m, n),
                                   lambda: np.empty((m, n), np.float32))
        a_d, b_d, c_d = (cuda.mem_alloc(x.nbytes) for x in (da, db, c))
        # B^T for a wgmma rung that reads B K-major (tf32), made in every timed launch
        bufs = [a_d, b_d, c_d] + ([cuda.mem_alloc(db.nbytes)] if kernels.is_wgmma(point)
                                  and prec in wgmma.K_MAJOR_B else [])
        tol = numerics.check_tolerance(k)
        err_input: dict[str, float] = {}

        def check(out: np.ndarray) -> Check:
            err = base.rel_fro_error(out, ref)
            err_input["v"] = base.rel_fro_error(out, exact)
            return Check(err, tol, "rel_fro_rounded_inputs",
                         detail="" if math.isfinite(err) else "unwritten or non-finite output")

        try:
            cuda.memcpy_htod(a_d, da)
            cuda.memcpy_htod(b_d, db)
            launch, timer, sync, extra, metrics = self._launcher(ctx, point, kernel, *bufs)
            chk, timing = self.verify_then_time(ctx, launch, check, output=(c_d, c), timer=timer,
                                                sync=sync, asynchronous=extra.pop("queued", True),
                                                check_each_trial=True)  # it records err_input
            sync()
        finally:
            for d in bufs:
                d.free()
        flops = 2.0 * m * n * k
        metrics |= self._peak_metrics(ctx, prec, flops, timing.stats()["median"])
        metrics |= {"err_input": err_input.get("v", float("nan")), "check_tolerance": tol,
                    "expected_input_error": numerics.expected_input_error(prec)}
        nbytes = float(ITEMSIZE[prec] * (m * k + k * n) + 4 * m * n)
        shape = (base.Launch(extra.pop("grid"), extra.pop("block")) if "grid" in extra
                 else None)  # cuBLAS picks its own kernels and grids
        return Result(timing, flops, nbytes, chk, metrics, kernel=kernel, extra=extra,
                      launch=shape)

    def _launcher(self, ctx: RunContext, point: Point, kernel: Any, a_d: Any, b_d: Any,
                  c_d: Any, scratch: Any = None):
        p = point.params
        m, k, n = p["m"], p["k"], p["n"]
        gpu = ctx.gpu
        if point.variant == "cublas":
            launch, timer, sync, extra = cublas_ex.gemm_ex_launcher(
                gpu, a_d, b_d, c_d, m, k, n, p["precision"])
            return launch, timer, sync, extra, {}
        if kernels.is_wgmma(point):
            launch, facts = wgmma.launcher(
                kernel.module, point.variant, p["precision"], int(a_d), int(b_d), int(c_d),
                m, k, n, gpu.attr("MULTIPROCESSOR_COUNT"),
                None if scratch is None else int(scratch),
                p.get("stages", wgmma.DEFAULT_STAGES), p.get("bn", wgmma.DEFAULT_BN))
            metrics = {"regs": facts["regs"], "dynamic_smem_bytes": facts["dynamic_smem_bytes"],
                       "threads": facts["block"][0], "transposes_b": facts["transposes_b"]}
            extra = {"grid": facts["grid"], "block": facts["block"], "queued": True}
            return launch, gpu.event_timer(), gpu.synchronize, extra, metrics
        func = kernel.function(kernels.kernel_name(point))
        func.prepare("PPPiii")
        grid, block, smem = kernels.launch_geometry(point)
        if smem > 48 * 1024:
            attr = gpu.cuda.function_attribute
            func.set_attribute(attr.MAX_DYNAMIC_SHARED_SIZE_BYTES, smem)
            # the whole carveout as shared memory: two blocks of over 100 KiB fit an SM
            func.set_attribute(attr.PREFERRED_SHARED_MEMORY_CARVEOUT, 100)
        dims = (np.int32(m), np.int32(n), np.int32(k))

        def launch() -> None:
            func.prepared_call(grid, block, a_d, b_d, c_d, *dims, shared_size=smem)

        metrics = {"regs": int(getattr(func, "num_regs", -1)), "dynamic_smem_bytes": smem,
                   "static_smem_bytes": int(getattr(func, "shared_size_bytes", -1)),
                   "threads": block[0]}
        extra = {"grid": list(grid), "block": list(block), "queued": True}
        return launch, gpu.event_timer(), gpu.synchronize, extra, metrics

    @staticmethod
    def _peak_metrics(ctx: RunContext, prec: str, flops: float, median_s: float) -> dict[str, Any]:
        """The precision's dense tensor peak on this device and the point's share of it
        (FP32: the CUDA cores' peak, 2 flops x FP32 cores x clock)."""
        gpu = ctx.gpu
        try:
            cc = gpu.info["compute_capability"]
            sms, khz = gpu.attr("MULTIPROCESSOR_COUNT"), gpu.attr("CLOCK_RATE")
            name = str(gpu.info.get("gpu_name", ""))
        except Exception:  # noqa: BLE001 - a stand-in session without attributes
            return {}
        if prec == "fp32":
            from cudalab import devicespec

            peak = devicespec.peak_fp32_gflops(cc, sms, khz)
        else:
            peak = tensor_peaks.tensor_peak_gflops(cc, prec, sms, khz,
                                                   tensor_peaks.is_geforce(name))
        out: dict[str, Any] = {"peak_precision_gflops": peak}
        if math.isfinite(peak) and peak > 0 and median_s > 0:
            out["pct_peak_precision"] = 100.0 * flops / median_s / 1e9 / peak
        return out

    # -- report --------------------------------------------------------------------------
    def plot(self, name: str, df: pd.DataFrame):
        return tc_figures.plot(name, self.ok(df))

    def tables(self, df: pd.DataFrame) -> list[dict[str, str]]:
        html = tc_figures.summary_html(self.ok(df))
        return [{"title": "At the largest size: each precision's best hand kernel against "
                          "cuBLAS of the same precision", "html": html}] if html else []
