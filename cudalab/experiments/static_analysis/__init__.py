"""Static analysis: what nvcc makes of every kernel, per target architecture, without a GPU.

Every .cu file in cuda/ is compiled to a cubin for each configured target (`nvcc -cubin
-arch=sm_XX -Xptxas -v` with the experiments' own -O3 -lineinfo), and ptxas' resource
report is parsed per kernel: registers per thread, static shared memory, constant memory,
stack frame, spill stores and loads, barriers. From registers and static shared memory the
project's occupancy calculator gives the theoretical occupancy at every block size.

One row per (file, compile variant, kernel, arch). A file declares the compile variants
worth analysing in comment lines of its own, one per variant:

    // cudalab-variant: TILE=32              -> -DTILE=32
    // cudalab-variant: USE_INTRINSICS       -> -DUSE_INTRINSICS
    // cudalab-variant: --use_fast_math      -> passed to nvcc as is

(no such line: the file's defaults); the config's `variants` overrides them per file.

Every experiment is asked how it compiles and launches its kernels
(Experiment.compile_variants): a kernel it declares is analysed exactly so instead, e.g.
matmul.cu's matmul_register once per register tile of the run's matmul block (the matmul
defaults where that block is absent or disabled), its rows carrying the tile (rt, bt, bk)
next to the flags; occupancy/occupancy.cu's extern __shared__ kernels with the dynamic shared memory
their launches ask for. Any other kernel the flags compile out is recorded as skipped.

Dynamic shared memory is a launch parameter nvcc cannot see: what an experiment declares is
used, and `dynamic_smem_bytes` overrides it per kernel.
"""

from __future__ import annotations

import dataclasses
import hashlib
import os
import re
import subprocess
from functools import lru_cache
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import pandas as pd

from cudalab import build_cache, devicespec, nvcc_flags, toolkit
from cudalab import occupancy as occ
from cudalab.experiments import base
from cudalab.experiments import matmul as mm
from cudalab.experiments.base import Check, Experiment, Point, Result, block_schema
from cudalab.experiments.static_analysis import archs as targets
from cudalab.experiments.static_analysis import estimate, lesson
from cudalab.experiments.static_analysis.archs import _sm
from cudalab.experiments.static_analysis.builds import (  # noqa: F401 - re-exported
    Builder,
    CompileError,
    compile_report,
    run_in_background,
)
from cudalab.experiments.static_analysis.lesson import LESSON, TILE_PARAMS, _tile_labels  # noqa: F401
from cudalab.gpu import Kernel, nvcc_banner
from cudalab.kernel_sources import built_kernels, relative
from cudalab.ptxas_info import (  # noqa: F401 - the lesson's parsers, re-exported
    BASE_OPTIONS,
    find_kernel,
    flag_tokens,
    nvcc_options,
    parse_maxntid,
    parse_ptxas,
)
from cudalab.resources import CUDA_DIR
from cudalab.toolkit import find_nvcc  # re-exported: callers use sa.find_nvcc

if TYPE_CHECKING:
    from cudalab.experiments.base import RunContext

ARCHS = devicespec.sm_targets()
DEFAULT_ARCHS = targets.AUTO  # the visible GPUs' targets, else sm_90 (archs.py)
BLOCK_SIZES = list(range(32, 1025, 32))
SUMMARY_BLOCKS = (128, 256, 512, 1024)

_KERNEL_RE = re.compile(
    r"__global__\s+(?:void\s+)?(?:__launch_bounds__\s*\([^)]*\)\s*)?(?:void\s+)?(\w+)\s*\(")
_CU_FILE = r"(?:[A-Za-z0-9][A-Za-z0-9_-]{0,63}/)?[A-Za-z0-9][A-Za-z0-9_.-]{0,127}\.cu"
_CU_ALLOWED = ("a kernel file under cuda/, <folder>/<file>.cu (letters, digits, _ - in the "
               "folder; letters, digits, _ . - in the file)")
_VARIANT_RE = re.compile(r"^\s*//\s*cudalab-variant:\s*(.*?)\s*$", re.M)


class StaticAnalysis(Experiment):
    name = "static_analysis"
    order = 27
    lesson = LESSON
    schema = block_schema({
            "archs": {
                "anyOf": [
                    {"enum": [targets.AUTO, targets.ALL]},
                    {"type": "array", "items": {"enum": ARCHS}, "minItems": 1,
                     "uniqueItems": True},
                ],
                "default": DEFAULT_ARCHS,
                "description": "target architectures: auto (the GPUs NVML sees here, else "
                "sm_90), all (every target the nvcc builds), or a list (nvcc 13 supports sm_75 "
                "and newer); each target costs a full nvcc run per file and variant",
            },
            "cache": {
                "type": "boolean", "default": True,
                "description": "reuse builds across runs from the user's build cache: "
                "$CUDALAB_BUILD_CACHE, else $XDG_CACHE_HOME/cudalab/builds, else "
                "~/.cache/cudalab/builds (CUDALAB_BUILD_CACHE=off turns it off too)",
            },
            "files": {
                "type": "array", "uniqueItems": True,
                "items": {"type": "string", "pattern": _CU_FILE, "x-allowed": _CU_ALLOWED},
                "default": [],
                "description": ("kernel files under cuda/ to analyse, as <lesson>/<file>.cu "
                                "([] = every lesson's and the framework's kernels)"),
            },
            "variants": {
                "type": "object", "default": {},
                "propertyNames": {"pattern": _CU_FILE, "x-allowed": _CU_ALLOWED},
                "additionalProperties": {
                    "type": "array", "minItems": 1,
                    "items": {"type": "string", "maxLength": 512,
                              "pattern": r"[A-Za-z0-9_=., +-]*",
                              "x-allowed": "NAME[=VALUE] macros and nvcc options separated "
                              "by spaces (letters, digits, _ = . , + -)"},
                },
                "description": "per file, the compile variants to analyse instead of the "
                "file's own '// cudalab-variant:' lines; each a string of NAME=VALUE, NAME or "
                "-nvcc-flag tokens ('' = the defaults)",
            },
            "dynamic_smem_bytes": {
                "type": "object", "default": {},
                "propertyNames": {"pattern": r"[A-Za-z_][A-Za-z0-9_]{0,127}",
                                  "x-allowed": "a kernel name (a C identifier)"},
                "additionalProperties": {"type": "integer", "minimum": 0,
                                         "maximum": 256 * 1024},
                "description": "kernel name -> dynamic shared memory per block its launches "
                "ask for (counted in the occupancy; nvcc cannot know it)",
            },
            "nvcc": {
                "type": "string", "default": "nvcc", "maxLength": 4096,
                # a config names a compiler, never another program
                "pattern": r"((/[^/\x00-\x1f]+)*/)?nvcc([-_.][A-Za-z0-9_.-]*)?",
                "x-allowed": "nvcc or a name like nvcc-12.4 (found on PATH or in the usual "
                "CUDA homes), or an absolute path ending in /nvcc",
                "description": "the nvcc to run (a name on PATH or a path)",
            },
            "timeout_s": {
                "type": "integer", "minimum": 5, "maximum": 3600, "default": 300,
                "x-unit": "s",
                "description": "CPU seconds each process of one nvcc run may use (cicc, "
                "ptxas); its wall time may be 10 times that, as a build at idle priority "
                "waits for free cores (below the job's slurm.runtime_min)",
            },
        })
    smoke = {"archs": ["sm_90"], "files": ["occupancy/occupancy.cu"]}
    # no timing: the plan asks estimate_seconds (this machine's build times), not a per-point cost
    point_cost_s = 0.0
    needs_nvcc = True

    def toolchain(self, block: dict[str, Any], notes: list[str]) -> list[str]:
        """Its nvcc, read and never run (toolkit.config_problems): an executable a job may
        run, whose toolkit's release builds every requested architecture."""
        name = block.get("nvcc")
        if not isinstance(name, str):
            return []
        nvcc = name if os.sep in name else find_nvcc(name)
        return toolkit.config_problems(f"experiments.{self.name}", name, nvcc,
                                       _listed(block.get("archs")), notes)

    def tool_provenance(self, block: dict[str, Any]) -> dict[str, Any]:
        """The nvcc this job runs and the verdict of its owner and mode check."""
        from cudalab.provenance import toolkit_provenance

        return toolkit_provenance(find_nvcc(block["nvcc"]))

    # -- grid --------------------------------------------------------------------------
    def check_config(self, block: dict[str, Any]) -> list[str]:
        msgs = []
        for f in block.get("files", []):
            if not (CUDA_DIR / f).is_file():
                have = ", ".join(relative(p) for p in built_kernels())
                msgs.append(f"files: {f!r} is not a file in cuda/ (there: {have})")
        for f, variants in block.get("variants", {}).items():
            for i, flags in enumerate(variants):
                msgs += [f"variants[{f!r}][{i}]: {m}" for m in nvcc_flags.problems(flags)]
        return msgs

    # the blocks whose compile_variants() shape this grid (matmul's register tiles,
    # occupancy's tiles and dynamic shared memory): the workflow reruns the job on a change
    reads_blocks = ("matmul", "occupancy")

    def grid(self, config: dict[str, Any]) -> list[Point]:
        return self.points(config["experiments"][self.name], config=config)

    def points(self, block: dict[str, Any],
               config: dict[str, Any] | None = None) -> list[Point]:
        """One point per (file, compile variant, kernel, arch). A kernel some experiment
        declares in compile_variants() (from `config`, the whole validated config; without
        it, the experiments' defaults) is analysed as that experiment compiles and launches
        it, instead of with the file's variants."""
        own = declared_variants(config)
        archs = resolved_archs(block)
        pts = []
        for path in kernel_files(block.get("files", [])):
            src = path.read_text()
            name = relative(path)
            variants = block.get("variants", {}).get(name) or file_variants(src)
            for kernel in kernel_names(src):
                declared = own.get((name, kernel))
                rows = [(flags, {}) for flags in variants] if declared is None else [
                    (define_flags(cv.defines), _extra_params(cv)) for cv in declared]
                pts += [Point(self.name, kernel, {"file": name, "flags": flags,
                                                  "arch": arch, **extra}, gpu=False)
                        for flags, extra in rows for arch in archs
                        if _sm(arch) >= extra.get("min_sm", 0)]
        return pts

    # -- measuring ---------------------------------------------------------------------
    def kernel_for(self, ctx: RunContext, point: Point) -> Any:
        """Provenance of a point (no GPU needed): the file's hash and the nvcc command line."""
        p = point.params
        src = (CUDA_DIR / p["file"]).read_text()
        opts = nvcc_options(p["flags"], p["arch"])
        h = hashlib.sha256((src + "\0" + " ".join(opts) + "\0"
                            + _nvcc_version(ctx.block["nvcc"])).encode()).hexdigest()[:16]
        return Kernel(None, p["file"], opts, h)

    def measure(self, ctx: RunContext, point: Point) -> Result:
        p = point.params
        blk = ctx.block
        nvcc = find_nvcc(blk["nvcc"])
        if not nvcc:
            raise CompileError(
                f"nvcc not found (looked for {blk['nvcc']!r} on PATH, in $CUDA_HOME/bin, "
                "$CUDA_PATH/bin and /usr/local/cuda*/bin): static analysis needs the CUDA "
                "toolkit's compiler; install it or set experiments.static_analysis.nvcc to "
                "its path")
        # a job runs only a toolkit no one but root or this user could have put there
        reasons = toolkit.untrusted_reasons(nvcc)
        if reasons:
            raise CompileError(f"experiments.static_analysis.nvcc: "
                               f"{toolkit.refusal(nvcc, reasons)}")
        builder = ctx.cache.keep("static_builds", lambda: self._builder(ctx, nvcc))
        built = builder.build((p["file"], p["flags"], p["arch"]))
        report = built.report
        usage = find_kernel(report, point.variant)
        if usage is None:
            raise base.Skipped(f"{point.variant} is not compiled with flags {p['flags']!r} for "
                          f"{p['arch']} (inside an #if?); ptxas compiled: "
                          f"{', '.join(report) or 'nothing'}")
        # the config's dynamic_smem_bytes wins over what the kernel's experiment declares
        dyn = int(blk.get("dynamic_smem_bytes", {}).get(point.variant,
                                                         p.get("dynamic_smem", 0)))
        metrics = usage_metrics(p["arch"], usage, dyn, optin=bool(p.get("optin")))
        launchable = metrics["max_block_size"] > 0
        check = Check(0.0 if launchable else 1.0, 0.0, "launchable",
                      detail="" if launchable else metrics.get("limit_note", ""))
        # provenance: whether this row's ptxas report came from the build cache
        metrics["build_cached"] = built.cached
        return Result(None, check=check, metrics=metrics, kernel=self.kernel_for(ctx, point),
                      extra={"build": {"cached": built.cached, "key": built.key[:16],
                                       "nvcc_s": round(built.seconds, 3)}})

    def _builder(self, ctx: RunContext, nvcc: str) -> Builder:
        """The job's builds, every one its grid needs started at once on every core (a point
        the runner then measures finds its build done)."""
        blk = ctx.block
        builder = Builder(nvcc, blk["timeout_s"],
                          build_cache.BuildCache(build_cache.root(blk.get("cache", True))))
        builder.prefetch(estimate.needs(self.points(blk, config=ctx.config)))
        return builder

    def machine_facts(self, block: dict[str, Any]) -> Any:
        """The targets auto or all resolve to here: a GPU-less run's sm_90 rows are redone
        for an A100's sm_80 when the same results folder runs there."""
        archs = block.get("archs", DEFAULT_ARCHS)
        return None if isinstance(archs, list) else resolved_archs(block)

    def estimate_seconds(self, config: dict[str, Any], points: list[Point],
                         load: float | None = None) -> float:
        """The job's wall time from this machine's measured build times (estimate.py)."""
        blk = config["experiments"][self.name]
        return estimate.job_seconds(points, find_nvcc(blk["nvcc"]), blk.get("cache", True),
                                    load=load)

    # -- figures -----------------------------------------------------------------------
    def _frame(self, df: pd.DataFrame) -> pd.DataFrame:
        return lesson.frame(df)

    def plot(self, name: str, df: pd.DataFrame):
        import matplotlib.pyplot as plt
        import seaborn as sns

        d = self._frame(df)
        if d.empty:
            return None
        if name == "occupancy":
            arch = max(set(d["p_arch"]), key=_arch_order)
            a = d[d["p_arch"] == arch].sort_values("label")
            grid = {}
            for _, r in a.iterrows():
                curve = bounded_curve(arch, int(r["m_registers"]), int(r["m_smem_static"]),
                                      int(r["m_dynamic_smem"]), int(r["m_barriers"]),
                                      int(r["m_launch_bounds"]))
                lab = (f"{r['label']} ({int(r['m_registers'])} regs"
                       + (f", {int(r['m_smem_static'] + r['m_dynamic_smem'])} B smem"
                          if r["m_smem_static"] + r["m_dynamic_smem"] else "") + ")")
                grid[lab] = [100 * o.occupancy for o in curve]
            heat = pd.DataFrame(grid, index=BLOCK_SIZES).T
            heat.index = [_wrap(str(x)) for x in heat.index]
            # every 64 threads (and 32): a number fits in each cell at the report's width
            heat = heat[[b for b in BLOCK_SIZES if b == 32 or b % 64 == 0]]
            annot = heat.map(lambda v: "" if v == 0 else f"{v:.0f}")
            fig, ax = plt.subplots(figsize=(min(MAX_WIDTH_IN, 11 + _label_extra_in(heat.index)),
                                            1.8 + _row_in(heat.index) * len(heat)),
                                   layout="constrained")
            sns.heatmap(heat, vmin=0, vmax=100, cmap="viridis", ax=ax, linewidths=0.3,
                        annot=annot, fmt="", annot_kws={"fontsize": 6.5},
                        cbar_kws={"label": "theoretical occupancy (%)"})
            ax.set_xticks([i + 0.5 for i in range(heat.shape[1])], list(heat.columns),
                          rotation=90, fontsize=8)
            ax.set(xlabel="threads per block", ylabel="",
                   title=f"Theoretical occupancy (%) from ptxas resource usage, {arch} "
                         f"(cc {devicespec.spec(arch).cc})\nblack = cannot launch "
                         "(registers, shared memory or __launch_bounds__)")
            ax.tick_params(axis="y", labelsize=7.5)
            # blocks that cannot launch at all: black
            for i, row in enumerate(heat.to_numpy()):
                for j, v in enumerate(row):
                    if v == 0:
                        ax.add_patch(plt.Rectangle((j, i), 1, 1, color="black"))
            return fig
        if name == "registers":
            pivot = d.pivot_table(index="label", columns="p_arch", values="m_registers",
                                  aggfunc="max")
            spill = d.assign(s=d["m_spill_stores"] + d["m_spill_loads"]).pivot_table(
                index="label", columns="p_arch", values="s", aggfunc="max")
            cols = sorted(pivot.columns, key=_arch_order)
            pivot, spill = pivot[cols], spill.reindex(columns=cols)
            pivot.index = spill.index = [_wrap(str(x)) for x in pivot.index]
            annot = pivot.map(lambda v: "" if pd.isna(v) else f"{int(v)}")
            annot = annot.where(~(spill.fillna(0) > 0), annot + "*")
            width = 4.5 + 1.0 * len(cols) + _label_extra_in(pivot.index)
            fig, ax = plt.subplots(figsize=(min(MAX_WIDTH_IN, width),
                                            1.4 + _row_in(pivot.index) * len(pivot)),
                                   layout="constrained")  # fits the colour bar's label too
            sns.heatmap(pivot, annot=annot, fmt="", cmap="rocket_r", ax=ax,
                        cbar_kws={"label": "registers per thread"}, linewidths=0.5)
            ax.set(xlabel="target architecture", ylabel="",
                   title="Registers per thread (ptxas)\n* = spills to local memory")
            ax.tick_params(axis="x", rotation=0)
            ax.tick_params(axis="y", labelsize=7.5)
            return fig
        if name == "registers_by_arch":
            return _registers_by_arch(d)
        raise KeyError(name)


def _registers_by_arch(d: pd.DataFrame):
    """One line per kernel across the targets (registers per thread): a flat line is a
    kernel whose count does not depend on the architecture; spilling kernels are marked.
    Compact (no kernel names), so it stays legible on a printed page."""
    import matplotlib.pyplot as plt

    regs = d.pivot_table(index="label", columns="p_arch", values="m_registers", aggfunc="max")
    spill = d.assign(s=d["m_spill_stores"] + d["m_spill_loads"]).pivot_table(
        index="label", columns="p_arch", values="s", aggfunc="max").reindex_like(regs)
    cols = sorted(regs.columns, key=_arch_order)
    regs, spill = regs[cols], spill[cols]
    x = range(len(cols))
    fig, ax = plt.subplots(figsize=(6, 4.2), layout="constrained")
    same = regs.nunique(axis=1, dropna=True) <= 1
    for label, row in regs.iterrows():
        ax.plot(x, row.to_numpy(), color="0.6" if same[label] else "C0",
                alpha=0.6 if same[label] else 0.8, lw=1, marker="o", ms=3)
    hit = spill.fillna(0) > 0
    if hit.to_numpy().any():
        xs, ys = np.nonzero(hit.to_numpy().T)
        ax.scatter(xs, regs.to_numpy().T[xs, ys], marker="x", s=50, color="C3", zorder=3,
                   label="spills to local memory")
    ax.axhline(255, color="0.3", ls=":", lw=1, label="at most 255 registers per thread")
    ax.plot([], [], color="C0", label="count differs between targets")
    ax.plot([], [], color="0.6", label="same count on every target")
    ax.set_xticks(list(x), cols)
    ax.set(xlabel="target architecture", ylabel="registers per thread (ptxas)",
           title=f"Registers per thread of each of the {len(regs)} kernels, per target"
           + ("" if len(cols) > 1 else "\n(one target analysed: no slope to compare)"))
    fig.legend(loc="outside lower center", ncols=2, fontsize=8)
    return fig


# -- kernels as their experiments compile and launch them (Experiment.compile_variants) -----
def declared_variants(config: dict[str, Any] | None) -> dict[tuple[str, str],
                                                              list[base.CompileVariant]]:
    """(file, kernel) -> the compile variants every experiment declares for it."""
    from cudalab.experiments import REGISTRY  # filled once every module is imported

    out: dict[tuple[str, str], list[base.CompileVariant]] = {}
    for exp in REGISTRY.values():
        for cv in exp.compile_variants(config):
            out.setdefault((cv.file, cv.kernel), []).append(cv)
    return out


def define_flags(defines: dict[str, Any]) -> str:
    """{'RM': 2, 'BM': 32} -> 'BM=32 RM=2': -D defines as a flags string, sorted by name as
    GpuSession.compile passes them."""
    return " ".join(f"{k}={v}" for k, v in sorted(defines.items()))


def _extra_params(cv: base.CompileVariant) -> dict[str, Any]:
    return (cv.params | ({"dynamic_smem": cv.dynamic_smem} if cv.dynamic_smem else {})
            | ({"optin": True} if cv.optin else {}) | ({"min_sm": cv.min_sm} if cv.min_sm else {}))


def resolved_archs(block: dict[str, Any]) -> list[str]:
    """The block's `archs` as a list: auto and all resolved here (archs.py)."""
    value = block.get("archs", DEFAULT_ARCHS)
    if value == targets.ALL:
        nvcc = find_nvcc(block.get("nvcc", "nvcc"))
        return targets.resolve(value, supported_archs(nvcc) if nvcc else None)
    return targets.resolve(value)


def _listed(value: Any) -> list[Any]:
    """The architectures a config names one by one (auto and all name none)."""
    return value if isinstance(value, list) else []


def matmul_register_variants(config: dict[str, Any] | None) -> list[tuple[str, dict[str, int]]]:
    """(flags, tile params) of matmul_register, one per register tile of the run's matmul
    block (its defaults where the block is absent or disabled)."""
    return [(define_flags(cv.defines), cv.params)
            for cv in mm.Matmul().compile_variants(config) if cv.kernel == "matmul_register"]


# -- compiling and parsing ------------------------------------------------------------------
def _arch_order(arch: str) -> tuple[int, int]:
    s = devicespec.spec(arch)
    return s.major, s.minor


def kernel_files(files: list[str]) -> list[Path]:
    """The files named in the block, else every lesson's and the framework's kernels."""
    if files:
        return [CUDA_DIR / f for f in files]
    return built_kernels()


def kernel_names(src: str) -> list[str]:
    """Kernels (__global__ functions) a source declares, in order, without comments."""
    code = re.sub(r"//[^\n]*|/\*.*?\*/", " ", src, flags=re.S)
    return list(dict.fromkeys(_KERNEL_RE.findall(code)))


def file_variants(src: str) -> list[str]:
    """The file's own '// cudalab-variant: ...' lines ([''] = its defaults)."""
    found = [v.strip() for v in _VARIANT_RE.findall(src)]
    return found or [""]


def usage_metrics(arch: str, usage: dict[str, int], dynamic_smem: int = 0,
                  optin: bool = False) -> dict[str, Any]:
    """The metrics of one row: ptxas' numbers and the calculator's occupancy, at block sizes
    the kernel's __launch_bounds__ allow (usage['max_threads'], 0 = no bound). optin: the
    launch raises the dynamic shared memory limit to dynamic_smem, as its experiment does."""
    opt = dynamic_smem if optin else None
    regs, smem = usage["registers"], usage["smem_static"]
    bound = int(usage.get("max_threads", 0))
    s = devicespec.spec(arch)
    m: dict[str, Any] = {
        "registers": regs, "smem_static": smem, "dynamic_smem": dynamic_smem,
        "cmem0": usage["cmem0"], "stack": usage["stack"],
        "spill_stores": usage["spill_stores"], "spill_loads": usage["spill_loads"],
        "barriers": usage["barriers"], "cc": s.cc, "launch_bounds": bound,
    }
    curve = bounded_curve(s, regs, smem, dynamic_smem, usage["barriers"], bound, opt)
    at = {o.block_size: o for o in curve}
    for bs in SUMMARY_BLOCKS:
        m[f"occupancy_{bs}"] = at[bs].occupancy
    m["limiter_256"], m["blocks_256"] = at[256].limiter, at[256].active_blocks
    best = max(o.occupancy for o in curve)
    m["best_occupancy"] = best
    m["best_block_size"] = max(o.block_size for o in curve if o.occupancy == best)
    fits = occ.max_block_size(s, regs, smem, dynamic_smem, optin_max_dynamic=opt)
    m["max_block_size"] = min(fits, bound - bound % s.warp_size) if bound else fits
    m["api_block_size"] = occ.max_potential_block_size(s, regs, smem, dynamic_smem,
                                                       block_size_limit=bound,
                                                       optin_max_dynamic=opt)[1]
    if m["max_block_size"] == 0:
        m["limit_note"] = occ.occupancy(s, 32, regs, smem, dynamic_smem,
                                        optin_max_dynamic=opt).reason
    return m


def bounded_curve(cc: Any, regs: int, smem: int, dynamic_smem: int, barriers: int,
                  bound: int = 0, optin_max_dynamic: int | None = None
                  ) -> list[occ.Occupancy]:
    """The calculator's occupancy at BLOCK_SIZES; block sizes above the kernel's
    __launch_bounds__ (bound > 0) get occupancy 0: the driver refuses to launch them."""
    curve = occ.occupancy_curve(cc, regs, smem, dynamic_smem, block_sizes=BLOCK_SIZES,
                                barriers=barriers, optin_max_dynamic=optin_max_dynamic)
    if not bound:
        return curve
    why = f"above the kernel's __launch_bounds__ ({bound} threads)"
    return [o if o.block_size <= bound else dataclasses.replace(
                o, active_blocks=0, active_warps=0, limiters=("launch bounds",), reason=why)
            for o in curve]


def supported_archs(nvcc: str) -> list[str]:
    """The targets nvcc's toolkit builds, read from its files (toolkit.py); nothing runs."""
    return toolkit.archs_of(nvcc)


@lru_cache(maxsize=8)
def _listed_archs(nvcc: str) -> list[str]:
    """What `nvcc --list-gpu-arch` prints: only in a job, after the trust check passed."""
    try:
        out = subprocess.run([nvcc, "--list-gpu-arch"], capture_output=True, text=True,
                             timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        return []
    return [a.replace("compute_", "sm_") for a in out.stdout.split()]


@lru_cache(maxsize=8)
def _nvcc_version(nvcc: str) -> str:
    text = nvcc_banner(find_nvcc(nvcc))
    if text is None:
        return "nvcc unavailable"
    m = re.search(r"release ([\d.]+)", text)
    return f"nvcc {m.group(1)}" if m else "nvcc"


# Kernel labels carry their -D list (the ladder's run to 90 characters): longer ones wrap
# onto two lines, and the heat maps grow a little wider (at most to the figures' 11.5 in).
LABEL_WIDTH = 56
MAX_WIDTH_IN = 11.5


def _wrap(label: str, width: int = LABEL_WIDTH) -> str:
    import textwrap

    return "\n".join(textwrap.wrap(label, width)) if len(label) > width else label


def _row_in(labels: Any) -> float:
    """Height of a heat-map row, inches (one 7.5 pt line fits 0.32 in)."""
    lines = max((str(x).count("\n") + 1 for x in labels), default=1)
    return 0.32 if lines == 1 else 0.08 + 0.15 * lines


def _label_extra_in(labels: Any) -> float:
    """Width the row labels need beyond the ~40 characters the base figure leaves them."""
    longest = max((len(line) for x in labels for line in str(x).split("\n")), default=0)
    return max(0.0, 0.075 * (longest - 40))
