"""Occupancy: block size against resident warps, for kernels of different register and
shared-memory appetite; the project's calculator checked against the CUDA driver.

Variants (kernels of cuda/occupancy/occupancy.cu), each at every configured block size:
  vec_mul           c = a * b, one thread per element (the course kernel)
  vec_mul_regs      the same product with LIVE values kept live: many registers per thread
  vec_mul_smem      the same product staged through `smem_bytes` of dynamic shared memory
  matmul_tiled_dyn  tiled matmul, tile T x T in dynamic shared memory (block = T * T)

Each point records the measured kernel time (CUDA events, the shared harness), GB/s (or
GFLOP/s), the correctness check against numpy float64, and three views of occupancy:
the project's calculator (cudalab.occupancy, from the compute capability's table row and
the kernel's NUM_REGS / SHARED_SIZE_BYTES + the launch's dynamic shared memory), the
driver's cuOccupancyMaxActiveBlocksPerMultiprocessor, and the block size that
cuOccupancyMaxPotentialBlockSize picks (with the calculator's own pick next to it).
Block sizes no block of the kernel can launch with (too many registers) are recorded with
their occupancy (0) and no time.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import numpy as np
import pandas as pd

from cudalab import devicespec
from cudalab import occupancy as occ
from cudalab.experiments import base, shared
from cudalab.experiments.base import Check, Experiment, Point, Result, block_schema
from cudalab.experiments.occupancy.lesson import LESSON

if TYPE_CHECKING:
    from cudalab.experiments.base import RunContext

VEC = ["vec_mul", "vec_mul_regs", "vec_mul_smem"]
VARIANTS = [*VEC, "matmul_tiled_dyn"]
SOURCE = "occupancy/occupancy.cu"
ALL_BLOCKS = list(range(32, 1025, 32))
LABELS = {
    "vec_mul": "vec_mul (few registers)",
    "vec_mul_regs": "vec_mul_regs (register-heavy)",
    "vec_mul_smem": "vec_mul_smem (dynamic shared memory)",
    "matmul_tiled_dyn": "matmul_tiled_dyn (T x T tile)",
}


class Occupancy(Experiment):
    name = "occupancy"
    kernel_files = ("occupancy/occupancy.cu",)
    order = 25
    lesson = LESSON
    roofline = True
    schema = block_schema({
            "variants": base.choices_schema(
                VARIANTS, "kernels of cuda/occupancy/occupancy.cu to run"),
            "block_sizes": {
                "type": "array", "minItems": 1, "uniqueItems": True,
                "items": {"type": "integer", "minimum": 32, "maximum": 1024, "multipleOf": 32},
                "default": ALL_BLOCKS,
                "description": "threads per block of the vector kernels (multiples of 32)",
            },
            "n": {
                "type": "integer", "minimum": 1024, "maximum": 1 << 28, "default": 1 << 24,
                "description": "vector length (float32 elements)",
            },
            "live_values": {
                "enum": [16, 32, 48, 64, 96, 128], "default": 64,
                "description": "values vec_mul_regs keeps live (-DLIVE): 64 is about 72-80 "
                "registers per thread",
            },
            "smem_bytes": {
                "type": "integer", "minimum": 4096, "maximum": 48 * 1024, "default": 32 * 1024,
                "description": "dynamic shared memory per block of vec_mul_smem, bytes "
                "(at most 48 KB: no opt-in)",
            },
            "matmul_size": {
                "type": "integer", "minimum": 16, "maximum": 8192, "default": 2048,
                "description": "n of the n x n matrices of matmul_tiled_dyn",
            },
            "matmul_tiles": {
                "type": "array", "minItems": 1, "uniqueItems": True,
                "items": {"type": "integer", "minimum": 1, "maximum": 32},
                "default": [8, 12, 16, 24, 32],
                "description": "tile widths T of matmul_tiled_dyn (a block is T x T threads)",
            },
            "tolerance": {
                "type": "number", "exclusiveMinimum": 0, "maximum": 1, "default": 1e-4,
                "description": "largest ||out - ref||_F / ||ref||_F that passes",
            },
        })
    smoke = {"block_sizes": [32, 256, 1024], "n": 100_000, "matmul_size": 200,
             "matmul_tiles": [8, 16]}

    # -- grid --------------------------------------------------------------------------
    def points(self, block: dict[str, Any]) -> list[Point]:
        pts = []
        for v in block["variants"]:
            if v == "matmul_tiled_dyn":
                for t in sorted(block["matmul_tiles"]):
                    pts.append(Point(self.name, v, {"block_size": t * t, "tile": t,
                                                    "size": block["matmul_size"]}))
                continue
            for bs in sorted(block["block_sizes"]):
                p = {"block_size": bs, "n": block["n"]}
                if v == "vec_mul_smem":
                    p["smem_bytes"] = block["smem_bytes"]
                pts.append(Point(self.name, v, p))
        return pts

    def compile_variants(self, config: dict[str, Any] | None) -> list[base.CompileVariant]:
        """The extern __shared__ kernels, with the dynamic shared memory of their launches
        (compiled without defines, as measure() compiles them)."""
        blk = self.settings_in(config)
        out = [base.CompileVariant(SOURCE, "vec_mul_smem", dynamic_smem=int(blk["smem_bytes"]))]
        for t in sorted(blk["matmul_tiles"]):
            pt = Point(self.name, "matmul_tiled_dyn", {"tile": t})
            out.append(base.CompileVariant(SOURCE, "matmul_tiled_dyn", params={"tile": t},
                                      dynamic_smem=_dynamic_smem(pt)))
        return out

    def gpu_bytes(self, point: Point) -> int:
        p = point.params
        count = p["size"] ** 2 if "size" in p else p["n"]
        return 3 * 4 * count  # a, b, c in float32

    # -- measuring ---------------------------------------------------------------------
    def _defines(self, ctx: RunContext, variant: str) -> dict[str, Any]:
        return {"LIVE": ctx.block["live_values"]} if variant == "vec_mul_regs" else {}

    def kernel_for(self, ctx: RunContext, point: Point) -> Any:
        return ctx.gpu.compile(SOURCE, self._defines(ctx, point.variant))

    def prepare(self, ctx: RunContext) -> None:
        gpu = ctx.gpu
        cc = "{}.{}".format(*gpu.device.compute_capability())
        ctx.cache["occ_cc"] = cc
        ctx.cache["occ_driver"] = occ.CudaDriver()
        attrs = _device_limits(gpu, ctx.cache["occ_driver"])
        ctx.cache["occ_attrs"] = attrs
        try:
            mism = devicespec.compare_with_device(cc, attrs)
            ctx.cache["occ_spec_note"] = "; ".join(
                f"{k}: table {a}, device {b}" for k, (a, b) in mism.items())
        except KeyError as exc:
            ctx.cache["occ_spec_note"] = str(exc)

    def _driver_function(self, ctx: RunContext, point: Point, func: Any) -> Any:
        """The driver-API CUfunction of the kernel pycuda launches."""
        key = ("occ_fn", point.variant, ctx.block["live_values"])
        return ctx.cache.keep(key, lambda: driver_function(
            ctx.cache["occ_driver"], self.kernel_for(ctx, point), point.variant, func))

    def measure(self, ctx: RunContext, point: Point) -> Result:
        p = point.params
        kernel = self.kernel_for(ctx, point)
        func = kernel.function(point.variant)
        regs, static = int(func.num_regs), int(func.shared_size_bytes)
        dyn = _dynamic_smem(point)
        metrics = self._occupancy_metrics(ctx, point, func, regs, static, dyn)
        if not metrics["launchable_driver"] or not metrics["launchable_theory"]:
            # No block of this size can be resident: nothing to time. The point documents
            # the limit (occupancy 0); its check is that calculator and driver agree on it.
            diff = abs(metrics.get("blocks_theory", 0) - metrics["blocks_driver"])
            check = Check(float(diff), 0.0, "blocks_calc_vs_driver",
                          detail=f"not launchable: {metrics.get('limit_note', '')}".strip())
            return Result(None, check=check, metrics=metrics, kernel=kernel,
                          extra={"not_launchable": metrics.get("limit_note", "")})
        if point.variant == "matmul_tiled_dyn":
            timing, check, flops, nbytes = self._run_matmul(ctx, func, p, dyn)
            metrics |= _best_tile(ctx.cache["occ_cc"], regs, static)
        else:
            timing, check, flops, nbytes = self._run_vec(ctx, point, func, dyn)
        metrics["kernel_s"] = timing.stats()["median"]
        return Result(timing, flops, nbytes, check, metrics, kernel=kernel)

    def _occupancy_metrics(self, ctx, point, func, regs, static, dyn) -> dict[str, Any]:
        bs = point.params["block_size"]
        cc = ctx.cache["occ_cc"]
        drv = ctx.cache["occ_driver"]
        fn = self._driver_function(ctx, point, func)
        max_warps = ctx.cache["occ_attrs"]["MAX_THREADS_PER_MULTIPROCESSOR"] // 32
        warps = -(-bs // 32)
        driver_error = ""
        try:
            blocks_drv = drv.max_active_blocks(fn, bs, dyn)
        except occ.CudaDriverError as exc:  # a block size the driver refuses outright
            blocks_drv, driver_error = 0, str(exc)
        api_grid, api_bs = drv.max_potential_block_size(fn, dyn)
        func_max = int(func.max_threads_per_block)
        m: dict[str, Any] = {
            "driver_error": driver_error,
            "num_regs": regs, "static_smem_bytes": static, "dynamic_smem_bytes": dyn,
            "local_bytes": int(func.local_size_bytes), "func_max_threads": func_max,
            "blocks_driver": blocks_drv, "warps_driver": blocks_drv * warps,
            "occupancy_driver": blocks_drv * warps / max_warps,
            "launchable_driver": int(blocks_drv > 0),
            "api_block_size": api_bs, "api_min_grid": api_grid,
            "spec_note": ctx.cache.get("occ_spec_note", ""),
        }
        try:
            th = occ.occupancy(cc, bs, regs, static, dyn)
        except KeyError as exc:  # a compute capability the table does not know
            m |= {"launchable_theory": m["launchable_driver"], "calc_agrees": float("nan"),
                  "limit_note": str(exc)}
            return m
        _, calc_bs = occ.max_potential_block_size(cc, regs, static, dyn,
                                                  func_max_threads=func_max)
        m |= {
            "blocks_theory": th.active_blocks, "warps_theory": th.active_warps,
            "occupancy_theory": th.occupancy, "limiter": th.limiter,
            "launchable_theory": int(th.launchable),
            "blocks_by_warps": th.blocks_by_warps, "blocks_by_blocks": th.blocks_by_blocks,
            "blocks_by_registers": min(th.blocks_by_registers, 9999),
            "blocks_by_shared_memory": min(th.blocks_by_shared_memory, 9999),
            "regs_per_block": th.regs_per_block, "smem_per_block": th.smem_per_block,
            "calc_agrees": int(th.active_blocks == blocks_drv),
            "api_block_size_calc": calc_bs, "api_agrees": int(calc_bs == api_bs),
            "max_block_size_calc": occ.max_block_size(cc, regs, static, dyn),
            "limit_note": th.reason,
        }
        return m

    # vector kernels ------------------------------------------------------------------
    def _vec_inputs(self, ctx: RunContext, n: int):
        def make():
            return base.uniform_f32(ctx.rng, n), base.uniform_f32(ctx.rng, n)

        return ctx.cache.one_per_slot("occ_vec", ("occ_vec", n), make)

    def _run_vec(self, ctx: RunContext, point: Point, func: Any, dyn: int):
        bs, n = point.params["block_size"], point.params["n"]
        a, b = self._vec_inputs(ctx, n)
        # made where the check runs: a later trial takes the first one's check
        ref = lambda: vec_reference(point.variant, a, b, bs)  # noqa: E731
        grid = (shared.grid_size(n, bs), 1)
        if point.variant == "vec_mul_regs":
            func.prepare("PPPif")
            extra: tuple = (np.float32(0.0),)
        else:
            func.prepare("PPPi")
            extra = ()

        def launcher(a_d: Any, b_d: Any, c_d: Any) -> Callable[[], None]:
            return lambda: func.prepared_call(grid, (bs, 1, 1), a_d, b_d, c_d, np.int32(n),
                                              *extra, shared_size=dyn)

        check, timing = self._run_checked(ctx, a, b, np.empty(n, np.float32), ref, launcher)
        nbytes = 12.0 * n  # read a and b, write c
        flops = float(n) if point.variant != "vec_mul_regs" else float("nan")
        return timing, check, flops, nbytes

    # matmul -------------------------------------------------------------------------
    def _run_matmul(self, ctx: RunContext, func: Any, p: dict[str, Any], dyn: int):
        n, t = p["size"], p["tile"]

        def make():
            a = base.uniform_f32(ctx.rng, (n, n))
            b = base.uniform_f32(ctx.rng, (n, n))
            return a, b, a.astype(np.float64) @ b.astype(np.float64)

        a, b, ref = ctx.cache.keep(("occ_mm", n), make)
        func.prepare("PPPiii")
        grid = (shared.grid_size(n, t), shared.grid_size(n, t))
        dims = (np.int32(n),) * 3

        def launcher(a_d: Any, b_d: Any, c_d: Any) -> Callable[[], None]:
            return lambda: func.prepared_call(grid, (t, t, 1), a_d, b_d, c_d, *dims,
                                              shared_size=dyn)

        check, timing = self._run_checked(ctx, a, b, np.empty((n, n), np.float32),
                                          lambda: ref, launcher)
        return timing, check, 2.0 * n**3, 12.0 * n * n

    def _run_checked(self, ctx: RunContext, a: np.ndarray, b: np.ndarray, out: np.ndarray,
                     ref: Callable[[], np.ndarray], launcher: Callable[..., Callable[[], None]]):
        """Both inputs uploaded, launcher(a_d, b_d, c_d) checked into `out` against ref(),
        then timed (plain kernel launches: asynchronous); the device buffers retired."""
        cuda = ctx.gpu.cuda
        a_d, b_d, c_d = (cuda.mem_alloc(x.nbytes) for x in (a, b, out))
        try:
            cuda.memcpy_htod(a_d, a)
            cuda.memcpy_htod(b_d, b)
            return self.verify_then_time(
                ctx, launcher(a_d, b_d, c_d),
                lambda o: _fro_check(o, ref(), ctx.block["tolerance"]),
                output=(c_d, out), asynchronous=True)
        finally:
            ctx.cache.retire(a_d, b_d, c_d)  # freed after the point's trials: each lands anew

    # -- figures -----------------------------------------------------------------------
    def _frame(self, df: pd.DataFrame) -> pd.DataFrame:
        d = self.ok(df).copy()
        if d.empty:
            return d
        for c in ("m_occupancy_theory", "m_occupancy_driver", "time_median_s", "gbps"):
            if c not in d:
                d[c] = np.nan
            d[c] = pd.to_numeric(d[c], errors="coerce")
        d["p_block_size"] = pd.to_numeric(d["p_block_size"], errors="coerce")
        d["kernel"] = d["variant"].map(LABELS).fillna(d["variant"])
        return d.sort_values(["variant", "p_block_size"])

    def plot(self, name: str, df: pd.DataFrame):
        import matplotlib.pyplot as plt
        import seaborn as sns

        d = self._frame(df)
        if d.empty:
            return None
        if name == "occupancy":
            kernels = [v for v in VARIANTS if v in set(d["variant"])]
            ncol = 2 if len(kernels) > 1 else 1
            nrow = -(-len(kernels) // ncol)
            fig, axes = plt.subplots(nrow, ncol, figsize=(5.5 * ncol, 4.2 * nrow), squeeze=False)
            pal = sns.color_palette("deep")
            for ax, v in zip(axes.flat, kernels):
                k = d[d["variant"] == v]
                sns.lineplot(x=k["p_block_size"], y=100 * k["m_occupancy_theory"], ax=ax,
                             marker="o", color=pal[0], label="calculator")
                ax.scatter(k["p_block_size"], 100 * k["m_occupancy_driver"], marker="x",
                           s=50, color=pal[3], label="CUDA driver", zorder=3)
                ax.set(ylim=(0, 105), xlabel="threads per block",
                       ylabel="theoretical occupancy (%)", title=LABELS.get(v, v))
                tw = ax.twinx()
                timed = k.dropna(subset=["time_median_s"])
                if not timed.empty:
                    sns.lineplot(x=timed["p_block_size"], y=timed["time_median_s"] * 1e6,
                                 ax=tw, marker="s", color=pal[1], label="kernel time")
                    tw.set_ylim(0, timed["time_median_s"].max() * 1e6 * 1.15)
                tw.set_ylabel("median kernel time (µs)")
                tw.grid(False)
                h1, l1 = ax.get_legend_handles_labels()
                h2, l2 = tw.get_legend_handles_labels()
                if tw.get_legend():
                    tw.get_legend().remove()
                ax.legend(h1 + h2, l1 + l2, loc="best", fontsize=8, framealpha=0.85)
                if v == "matmul_tiled_dyn":
                    for _, r in k.iterrows():
                        ax.annotate(f"T={int(r['p_tile'])}",
                                    (r["p_block_size"], 100 * r["m_occupancy_theory"]),
                                    textcoords="offset points", xytext=(0, -14), fontsize=8,
                                    ha="center")
            for ax in list(axes.flat)[len(kernels):]:
                ax.axis("off")
            gpu = d["gpu_name"].dropna().iloc[0] if d["gpu_name"].notna().any() else ""
            fig.suptitle("Theoretical occupancy and kernel time against block size"
                         + (f" ({gpu})" if gpu else ""))
            fig.tight_layout()
            return fig
        if name == "bandwidth":
            v = d[d["variant"].isin(VEC)].dropna(subset=["gbps", "m_occupancy_theory"])
            if v.empty:
                return None
            v = v.assign(occ_pct=100 * v["m_occupancy_theory"],
                         threads=v["p_block_size"].astype(int))
            fig, ax = plt.subplots(figsize=(8.5, 5))
            sns.scatterplot(data=v, x="occ_pct", y="gbps", hue="kernel", style="kernel",
                            size="threads", sizes=(25, 160), alpha=0.75, ax=ax)
            ax.set(xlabel="theoretical occupancy (%)", ylabel="achieved bandwidth (GB/s)",
                   title="Achieved bandwidth against theoretical occupancy (vector kernels)",
                   xlim=(0, 105), ylim=(0, None))
            h, lab = ax.get_legend_handles_labels()
            lab = ["threads per block" if x == "threads" else x for x in lab]
            ax.legend(h, lab, fontsize=8, bbox_to_anchor=(1.01, 1), loc="upper left")
            fig.tight_layout()
            return fig
        raise KeyError(name)


# -- helpers ------------------------------------------------------------------------------
def _fro_check(out: np.ndarray, ref: np.ndarray, tolerance: float) -> Check:
    return Check(base.rel_fro_error(out, ref), tolerance, "rel_fro",
                 detail="" if np.isfinite(out).all() else "unwritten (NaN) elements")


def _dynamic_smem(point: Point) -> int:
    if point.variant == "vec_mul_smem":
        return int(point.params["smem_bytes"])
    if point.variant == "matmul_tiled_dyn":
        t = point.params["tile"]
        return 2 * t * t * 4
    return 0


def vec_reference(variant: str, a: np.ndarray, b: np.ndarray, block_size: int) -> np.ndarray:
    """float64 reference of the vector kernels (vec_mul_smem rotates a within each block)."""
    a64, b64 = a.astype(np.float64), b.astype(np.float64)
    if variant != "vec_mul_smem":
        return a64 * b64
    n = a.size
    i = np.arange(n)
    start = i - i % block_size
    src = start + (i - start + 1) % block_size
    ok = src < n
    rot = np.where(ok, a64[np.minimum(src, n - 1)], 0.0)
    return rot * b64


def _best_tile(cc: str, regs: int, static: int) -> dict[str, Any]:
    try:
        t, o = occ.best_square_tile(cc, regs, static)
    except KeyError:
        return {}
    return {"best_tile": t, "best_tile_occupancy": o.occupancy}


def driver_function(drv: occ.CudaDriver, kernel: Any, name: str, func: Any) -> Any:
    """The driver-API CUfunction of `name` in `kernel` (a cudalab.gpu.Kernel) - the very
    machine code pycuda's `func` runs: pycuda's own handle where it has one, else the same
    cubin (pycuda.compiler.compile with GpuSession.compile's arguments hits pycuda's cache)
    loaded once more through the driver API, checked to use the same registers."""
    handle = _pycuda_handle(func)
    if handle is not None:
        return handle
    from pycuda.compiler import compile as nvcc_compile

    from cudalab.resources import CUDA_DIR

    src = (CUDA_DIR / kernel.source_file).read_text()
    cubin = nvcc_compile(src, options=list(kernel.options), no_extern_c=True,
                         include_dirs=[str(CUDA_DIR)])
    return drv.function(cubin, name, expect_regs=int(func.num_regs))


def _pycuda_handle(func: Any) -> Any:
    """A CUfunction handle from pycuda, if this pycuda exposes one (none does as of 2025:
    Function.__getattr__ maps unknown names to function attributes, so only a real,
    class-level `handle` is trusted)."""
    h = None
    if "handle" in dir(type(func)):
        try:
            h = func.handle
        except Exception:  # noqa: BLE001
            h = None
    if isinstance(h, int) and h:
        import ctypes

        return ctypes.c_void_p(h)
    return None


def _device_limits(gpu: Any, drv: occ.CudaDriver) -> dict[str, int]:
    """The device's own limits (names of devicespec.DEVICE_ATTRIBUTES), via the driver."""
    out = {}
    for attr in devicespec.DEVICE_ATTRIBUTES.values():
        try:
            out[attr] = drv.device_attribute(gpu.index, devicespec.CU_DEVICE_ATTRIBUTE_IDS[attr])
        except occ.CudaDriverError:  # an attribute this driver does not know
            continue
    if "MAX_THREADS_PER_MULTIPROCESSOR" not in out:
        out["MAX_THREADS_PER_MULTIPROCESSOR"] = 2048
    return out
