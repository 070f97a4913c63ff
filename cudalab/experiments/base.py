"""What an experiment is. Adding one = a kernel file in cuda/, a folder in this package (its
Experiment in __init__.py, its Lesson in lesson.py), a config block.

The Experiment subclass declares its config schema, expands its grid into Points, measures
one Point at a time through the shared Harness, checks the result against a CPU reference,
declares its work (FLOPs, bytes) and draws its figures; its Lesson states what the report
says, the expected effects included, which the report checks against the data.
"""

from __future__ import annotations

import copy
import math
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np
import pandas as pd

from cudalab.experiments.job_cache import JobCache
from cudalab.experiments.lesson import Lesson
from cudalab.harness import Harness, Settings, Timer, Timing

NAN_BITS = 0x7FC00000  # float32 quiet NaN: poisons float outputs before every check
POISON_64_WORD = 0xFFFFFFFF  # both halves of an 8-byte output: a float64 NaN

if TYPE_CHECKING:
    from matplotlib.figure import Figure

    from cudalab.gpu import GpuSession


@dataclass(frozen=True)
class Point:
    experiment: str
    variant: str
    params: dict[str, Any]
    gpu: bool = True  # needs the GPU

    @property
    def point_id(self) -> str:
        parts = [self.variant] + [f"{k}{_fmt(v)}" for k, v in self.params.items()]
        return re.sub(r"[^A-Za-z0-9_.=-]", "_", "-".join(parts))

    def label(self) -> str:
        return f"{self.experiment} {self.variant} " + " ".join(
            f"{k}={v}" for k, v in self.params.items()
        )


def _fmt(v: Any) -> str:
    if isinstance(v, (list, tuple)):
        return "x".join(map(str, v))
    return str(v)


class Skipped(Exception):
    """Raised by kernel_for() or measure() when a point cannot be measured here for a reason
    that is no fault (an optional library such as CuPy is not installed). The runner records
    the point with status "skipped" and the message as its reason."""


class CompileFailure(RuntimeError):
    """nvcc could not build a kernel (missing, cannot target an architecture, failed): the
    runner reports the point as 'nvcc failed'."""


@dataclass
class Check:
    """Correctness against the CPU reference."""

    error: float
    tolerance: float
    metric: str
    detail: str = ""

    @property
    def passed(self) -> bool:
        return bool(np.isfinite(self.error) and self.error <= self.tolerance)

    def as_dict(self) -> dict[str, Any]:
        return {
            "error": float(self.error),
            "tolerance": float(self.tolerance),
            "metric": self.metric,
            "passed": self.passed,
            "detail": self.detail,
        }


@dataclass(frozen=True)
class Launch:
    """The launch configuration of the timed kernel: grid and block, in blocks and threads
    per dimension (missing dimensions are 1). A grid with fewer blocks than the GPU has SMs
    runs one partial wave on a few SMs (cudalab compare's small-grid class)."""

    grid: tuple[int, ...]
    block: tuple[int, ...]

    @property
    def blocks(self) -> int:
        return math.prod(int(x) for x in self.grid)

    @property
    def threads_per_block(self) -> int:
        return math.prod(int(x) for x in self.block)

    def as_dict(self) -> dict[str, Any]:
        """The record's launch: grid, block, blocks, threads_per_block."""
        return {"grid": [int(x) for x in self.grid], "block": [int(x) for x in self.block],
                "blocks": self.blocks, "threads_per_block": self.threads_per_block}


@dataclass
class Result:
    """What measure() returns for one point."""

    timing: Timing | None
    flops: float = float("nan")
    bytes: float = float("nan")
    check: Check | None = None
    metrics: dict[str, Any] = field(default_factory=dict)
    phases: dict[str, Timing] = field(default_factory=dict)
    kernel: Any = None  # cudalab.gpu.Kernel used (provenance: options, source hash)
    extra: dict[str, Any] = field(default_factory=dict)  # free-form, kept in the raw record
    # Why this timed GPU result has no correctness check (else the runner refuses it).
    no_check_reason: str = ""
    # Device memory one launch touches, bytes (results: working_set_bytes, memory_level);
    # NaN: the declared bytes are the working set.
    working_set: float = float("nan")
    # The timed kernel's grid and block where the experiment launches it itself (the
    # record's launch; None: a library call such as cuBLAS, host work, several kernels).
    launch: Launch | None = None


# A GPU point of a run without a GPU: never a speed and never a verdict. An effect whose
# points were not measured is "not measured", never "not seen".
NOT_MEASURED = "not_measured"


def measured(df: pd.DataFrame) -> pd.DataFrame:
    """The rows that were measured (any status but not_measured)."""
    return df[df["status"].astype(str) != NOT_MEASURED] if "status" in df else df


def not_measured_evidence(rows: pd.DataFrame, what: str = "point") -> str:
    """'not measured: 12 points (no GPU here ...)': the evidence of an expectation none of
    whose rows was measured (the first reason names what was looked for)."""
    nm = rows[rows["status"].astype(str) == NOT_MEASURED] if "status" in rows else rows[:0]
    if nm.empty:
        return f"not measured: no {what} in this run"
    why = str(nm["reason"].dropna().iloc[0]) if nm["reason"].notna().any() else ""
    # the gist ('no GPU here'): the whole reason is in the section's list of points
    why = why.removeprefix("not measured: ").split(" (")[0].strip()
    return (f"not measured: {len(nm)} {what}{'s' * (len(nm) != 1)}"
            + (f" ({why})" if why else ""))


def not_measured_note(rows: pd.DataFrame) -> str:
    """'; 3 not measured' where some rows were not measured, else ''."""
    n = int((rows["status"].astype(str) == NOT_MEASURED).sum()) if "status" in rows else 0
    return f"; {n} not measured" if n else ""


def _trial_check(ctx: RunContext, check: Callable[..., Check], args: tuple[Any, ...],
                 reuse: bool) -> Check:
    """check(*args), or on a later trial the first trial's Check where `reuse` allows."""
    trial = ctx.harness.trial
    if trial is None or not reuse:
        return check(*args)
    key = (getattr(check, "__code__", type(check)),
           *((a.shape, a.dtype.str) for a in args))
    return trial.check(key, lambda: check(*args))


@dataclass
class RunContext:
    gpu: GpuSession | None
    harness: Harness
    rng: np.random.Generator
    config: dict[str, Any]  # the whole validated config
    block: dict[str, Any]  # this experiment's block
    cache: JobCache = field(default_factory=JobCache)  # per-job scratch (inputs, refs)


@dataclass(frozen=True)
class CompileVariant:
    """How an experiment compiles and launches one kernel, for static analysis: the -D
    defines it compiles with, extra parameters that tell the rows apart (a tile), and the
    dynamic shared memory its launches ask for (nvcc cannot see it: extern __shared__)."""

    file: str  # in cuda/
    kernel: str
    defines: dict[str, Any] = field(default_factory=dict)
    params: dict[str, Any] = field(default_factory=dict)
    dynamic_smem: int = 0
    # The launch raises the kernel's dynamic shared memory limit to dynamic_smem
    # (cuFuncSetAttribute MAX_DYNAMIC_SHARED_SIZE_BYTES): above 48 KB a block needs it.
    optin: bool = False
    # The lowest compute capability (as 80 for sm_80) the kernel is built for; targets below
    # it are not analysed (0: every target the config names).
    min_sm: int = 0


def block_schema(properties: dict[str, Any]) -> dict[str, Any]:
    """An experiment block's JSON schema: `enabled` (default true) and these properties, no
    others (a misspelt key is named, never ignored)."""
    return {"type": "object", "additionalProperties": False,
            "properties": {"enabled": {"type": "boolean", "default": True}, **properties}}


def choices_schema(values: list[Any], description: str = "") -> dict[str, Any]:
    """A non-empty list of distinct values out of `values` (all of them by default)."""
    out: dict[str, Any] = {"type": "array", "items": {"enum": values}, "minItems": 1,
                           "uniqueItems": True, "default": values}
    return out | ({"description": description} if description else {})


def int_tuple_schema(length: int, minimum: int, maximum: int | None = None,
                     description: str = "") -> dict[str, Any]:
    """JSON schema of `length` integers in [minimum, maximum] ([blocks, threads], [M, K, N])."""
    item: dict[str, Any] = {"type": "integer", "minimum": minimum}
    if maximum is not None:
        item["maximum"] = maximum
    out: dict[str, Any] = {"type": "array", "items": item, "minItems": length,
                           "maxItems": length}
    return out | ({"description": description} if description else {})


def size_schema(length: int, minimum: int, maximum: int, description: str) -> dict[str, Any]:
    """A problem size: one integer n (square) or `length` integers (its dimensions)."""
    return {"oneOf": [{"type": "integer", "minimum": minimum, "maximum": maximum},
                      int_tuple_schema(length, minimum, maximum)],
            "description": description}


def verify_then_time(
    ctx: RunContext,
    launch: Callable[[], Any],
    check: Callable[..., Check],
    *,
    output: tuple[Any, np.ndarray] | None = None,
    fill: int = NAN_BITS,
    timer: Timer | None = None,
    sync: Callable[[], None] | None = None,
    asynchronous: bool = False,
    batchable: bool = True,
    settings: Settings | None = None,
    check_each_trial: bool | None = None,
) -> tuple[Check, Timing]:
    """Correct first, then timed: the one sequence every GPU experiment uses.

    With `output` (the device buffer and the host array the D2H copy overwrites whole):
    poison it with `fill` (a 32-bit word: NaN bits for floats, 0 for counters and sums;
    a byte for 1-byte outputs; 8-byte outputs get all-ones words, a NaN), launch once,
    wait (sync, default the context), copy it back, check(host array). Without:
    check() runs its own verification (a round trip, a traced run) and must do so
    before returning. Then launch() is timed with the harness (timer: CUDA events on
    the default stream unless given). `asynchronous`: launch() only enqueues GPU work
    (kernel launches, async copies), nothing that synchronises or allocates; the
    harness may then queue launches ahead. `settings`: this point's own harness settings
    (they travel with its timing), else the job's.

    Trials after a point's first (ctx.harness.trial) still poison, launch once and copy
    the output back (the host array holds this trial's output, and the moved buffers
    run), but take the first trial's Check instead of calling check(host): same kernel,
    same inputs, the buffers' contents copied. Without `output`, check() runs every
    trial (its own verification may prime what is timed). `check_each_trial` True: run
    check every trial (it records what the caller reads); False: take the first
    trial's without `output` too (check() does nothing the timing needs)."""
    gpu = ctx.gpu
    if output is not None:
        cuda = gpu.cuda
        device, host = output
        if host.itemsize == 4:
            cuda.memset_d32(device, fill, host.size)
        elif host.itemsize == 1:
            cuda.memset_d8(device, fill, host.size)
        elif host.itemsize == 8:  # all-ones words: every double a NaN (fill is 32-bit)
            cuda.memset_d32(device, POISON_64_WORD, 2 * host.size)
        else:
            raise ValueError(f"cannot poison a {host.dtype} output: 1-, 4- or 8-byte "
                             "elements")
        launch()
        (sync or gpu.synchronize)()
        cuda.memcpy_dtoh(host, device)
        result = _trial_check(ctx, check, (host,), check_each_trial is not True)
    else:
        result = _trial_check(ctx, check, (), check_each_trial is False)
    timing = ctx.harness.measure(launch, timer or gpu.event_timer(), batchable=batchable,
                                 asynchronous=asynchronous, settings=settings)
    return result, timing


class Experiment:
    """One lesson's measurement. The framework owns timing, checking and rendering; an
    experiment declares three groups of members, each with a default where one makes sense:

    - what it measures: name, order, schema, smoke; points() (or grid()), prepare(),
      kernel_for(), measure(), and notes on its measurements (noise, own_timer,
      no_check_reason);
    - optional plan-time hooks, asked before any job: check_config(), toolchain(),
      gpu_bytes(), plan_warnings(), compile_variants(), reads_blocks, point_cost_s,
      needs_nvcc, all_gpus;
    - presentation: lesson (a Lesson from its folder's lesson.py: title, caption, figure
      captions, claims, facts, Try-this, questions), plot() for each of the lesson's
      figures, tables(), summary_table(), and the flags roofline, vs_device_peak and
      precision_roofs.

    Subclasses measure through verify_then_time() (correct first, then timed) and read
    their block with settings_in() where the block may be absent."""

    # -- what it measures ----------------------------------------------------------------
    name: str = ""
    # Position in the report (course order).
    order: int = 100
    schema: dict[str, Any] = {}
    # A small grid (a config block) for the GPU smoke test (tests/gpu) and quick runs.
    smoke: dict[str, Any] = {}
    # variant -> why its samples may not converge (the report's list of such points says it)
    noise: dict[str, str] = {}
    # The Result.metrics key of a kernel's own timer, where the kernel times itself (latency:
    # ns per load from %globaltimer). The profiling child records it too (m_ncu_own_timer),
    # so ncu's duration of a kernel that ran at another speed there is told apart from a
    # timing that disagrees (timing_report.ncu_agreement).
    own_timer: str = ""
    # Why this experiment's timed GPU results carry no correctness check ('' : they all do;
    # the runner marks a timed GPU result without a check failed unless this is set).
    no_check_reason: str = ""

    def points(self, block: dict[str, Any]) -> list[Point]:
        """The points of this experiment's validated block, in the order they run."""
        raise NotImplementedError

    def grid(self, config: dict[str, Any]) -> list[Point]:
        """The points of this experiment in a validated config (its block, by default)."""
        return self.points(config["experiments"][self.name])

    def prepare(self, ctx: RunContext) -> None:
        """Once per job, before any point (compile kernels, allocate shared buffers)."""

    def kernel_for(self, ctx: RunContext, point: Point) -> Any:
        """The compiled kernel (cudalab.gpu.Kernel) a GPU point uses, for its cache key and
        provenance; compiling is cached, so this is cheap after the first call."""
        return None

    def measure(self, ctx: RunContext, point: Point) -> Result:
        raise NotImplementedError

    # -- optional plan-time hooks ----------------------------------------------------------
    # Other experiments' blocks this one's grid reads (static_analysis: matmul's register
    # tiles): grid() gets the whole config, and the workflow reruns the job when they change.
    reads_blocks: tuple[str, ...] = ()
    # Seconds one point takes where it is not timed under the harness's budget (a compile);
    # None: a timed point (the plan's estimate counts the measurement settings).
    point_cost_s: float | None = None
    # Whether its jobs run nvcc themselves, GPU or not (the doctor checks the toolkit).
    needs_nvcc: bool = False
    # Whether its GPU job measures between GPUs: a local run then locks every usable GPU
    # for it and shows it all of them (gpu_slots.claim_all), and Snakemake runs it alone.
    all_gpus: bool = False

    def check_config(self, block: dict[str, Any]) -> list[str]:
        """Cross-field rules the schema cannot express; messages start with the key."""
        return []

    def toolchain(self, block: dict[str, Any], notes: list[str]) -> list[str]:
        """Before any job: errors (each starting with its key) where a tool this
        experiment's jobs run cannot do what the block asks; what cannot be checked here
        goes to notes. [] : nothing to check."""
        return []

    def tool_provenance(self, block: dict[str, Any]) -> dict[str, Any]:
        """Provenance of the tools a config names that this experiment's jobs run (static
        analysis: its nvcc and the owner and mode check that let it run); {} : none."""
        return {}

    def gpu_bytes(self, point: Point) -> int:
        """Device memory one point allocates at once (inputs, outputs), for the plan's size
        guard; 0 = not declared (never refused)."""
        return 0

    def machine_facts(self, block: dict[str, Any]) -> Any:
        """What the machine decides about this block's grid (static analysis: the targets
        `archs: auto` resolves to): a change reruns the finished job. None: nothing."""
        return None

    def estimate_seconds(self, config: dict[str, Any], points: list[Point],
                         load: float | None = None) -> float | None:
        """The job's expected wall time where this experiment knows better than points x
        point cost (static analysis: its builds' measured times), at the machine's load
        (None: the load now); None: count points."""
        return None

    def plan_warnings(self, block: dict[str, Any]) -> list[str]:
        """Warnings `cudalab plan` prints for a valid block (e.g. a CPU reference that will
        take very long); messages start with the key."""
        return []

    def compile_variants(self, config: dict[str, Any] | None) -> list[CompileVariant]:
        """The kernels this experiment compiles with its own defines or launches with
        dynamic shared memory, as static analysis must analyse them (config: the whole
        validated config, or None for the defaults). [] : the files' defaults are right."""
        return []

    # -- presentation ----------------------------------------------------------------------
    # What the report, the slides and the course table say about it: every experiment
    # declares one (its folder's lesson.py builds it).
    lesson: Lesson
    # Whether the report section shows a roofline of this experiment's points of its own.
    roofline: bool = False
    # The lesson's kernel files, paths under cuda/, each in cuda/<name>/ (kernel_sources.py):
    # the files it compiles, and the only ones of that folder.
    kernel_files: tuple[str, ...] = ()
    # The kernel slot the lesson offers the exercises (a cudalab.kernel_slot.KernelSlot, in
    # its folder's slot.py), None where it offers none.
    slot: Any = None
    # Whether GB/s and GFLOP/s of this experiment's GPU points are shown as % of the device's
    # theoretical DRAM bandwidth and FP32 peak (results: pct_peak_gbps, pct_peak_gflops).
    # False where the bytes do not go through device memory alone (PCIe copies).
    vs_device_peak: bool = True
    # Whether the roofline draws its points under the roof of their own precision (tensor
    # cores, whose roof is not the FP32 peak) where vs_device_peak is off.
    precision_roofs: bool = False

    def plot(self, name: str, df: pd.DataFrame) -> Figure | None:
        """Draw figure `name` (a key of lesson.figures) from this experiment's rows (None if
        nothing to draw)."""
        raise NotImplementedError

    def tables(self, df: pd.DataFrame) -> list[dict[str, str]]:
        """Small extra tables for the report section: [{"title": ..., "html": ...}]."""
        return []

    def summary_table(self, df: pd.DataFrame) -> str:
        """HTML shown instead of the section's results table ('' : the results table)."""
        return ""

    # -- helpers for subclasses ------------------------------------------------------------
    def settings_in(self, config: dict[str, Any] | None) -> dict[str, Any]:
        """This experiment's block in `config`, or its schema defaults where the block is
        absent or disabled (a disabled block is not validated, so it may not even hold)."""
        blk = ((config or {}).get("experiments") or {}).get(self.name) or {}
        if blk and blk.get("enabled", True):
            return blk
        props = self.schema.get("properties", {})
        return {k: copy.deepcopy(v["default"]) for k, v in props.items() if "default" in v}

    # correct first, then timed: the framework's sequence (a function: it needs no
    # experiment, and the exercises' slots call it through cudalab.kernel_slot)
    verify_then_time = staticmethod(verify_then_time)

    @staticmethod
    def ok(df: pd.DataFrame) -> pd.DataFrame:
        return df[df["status"] == "ok"]


# Elements per block of the blockwise error: 2^16 float64 values (512 KiB) stay in a core's
# L2 cache between the subtraction and the two dot products; the per-block Python overhead
# (~5 us) is small against the ~100 us of memory traffic of a block.
REL_FRO_CHUNK = 1 << 16


def rel_fro_error(out: np.ndarray, ref: np.ndarray) -> float:
    """||out - ref||_F / ||ref||_F in float64; inf if anything is not finite (unwritten).

    Computed block by block (rel_fro_error_blocks): no full-size float64 copy of either
    array is made, and the result equals the dense formula
    norm(out.astype(f64) - ref.astype(f64)) / norm(ref.astype(f64)) up to float64 rounding
    (~1e-15 relative). A zero reference divides by 1 instead (the absolute error)."""
    o = np.asarray(out)
    r = np.asarray(ref)
    if o.shape != r.shape or o.dtype.kind not in "biuf" or r.dtype.kind not in "biuf":
        return _rel_fro_error_dense(o, r)  # broadcasting or exotic dtypes: the plain formula
    r = r.reshape(-1)  # a view where contiguous
    return rel_fro_error_blocks(o, lambda i, j: r[i:j])


def rel_fro_error_blocks(out: np.ndarray, ref_block: Callable[[int, int], np.ndarray],
                         chunk: int = REL_FRO_CHUNK) -> float:
    """rel_fro_error(out, ref) where ref is not materialised: ref_block(i, j) returns the
    reference values of out.reshape(-1)[i:j] (float64, or any real dtype, converted exactly
    to float64 here; the returned array may be a buffer reused by the next call).

    Sums of squares of (out - ref) and of ref are accumulated in float64 over blocks of
    `chunk` elements. Any NaN or inf in `out` makes its block's sum of squares non-finite
    (NaN - x = NaN, inf - finite = inf, inf - inf = NaN, and the squares of those are not
    finite), so only such a block is scanned for non-finite outputs, and the result is then
    inf, as in the dense formula. Non-finite references give NaN or inf as there too."""
    o = np.asarray(out).reshape(-1)
    n = o.size
    chunk = max(1, int(chunk))
    diff = np.empty(min(chunk, n), np.float64)
    ref64: np.ndarray | None = None
    ss_diff = ss_ref = 0.0
    for i in range(0, n, chunk):
        j = min(i + chunk, n)
        oc = o[i:j]
        rc = np.asarray(ref_block(i, j))
        if rc.shape != (j - i,):
            raise ValueError(f"ref_block({i}, {j}) returned shape {rc.shape}, not ({j - i},)")
        if rc.dtype != np.float64:
            if ref64 is None:
                ref64 = np.empty(min(chunk, n), np.float64)
            np.copyto(ref64[: j - i], rc, casting="same_kind")
            rc = ref64[: j - i]
        d = diff[: j - i]
        with np.errstate(invalid="ignore", over="ignore"):  # inf - inf: reported below
            np.subtract(oc, rc, out=d, dtype=np.float64)
        sd = float(np.dot(d, d))
        if not math.isfinite(sd) and not np.isfinite(oc).all():
            return float("inf")
        ss_diff += sd
        ss_ref += float(np.dot(rc, rc))
    denom = math.sqrt(ss_ref)
    return math.sqrt(ss_diff) / (denom if denom > 0 else 1.0)


def _rel_fro_error_dense(out: Any, ref: Any) -> float:
    """The plain formula: full float64 copies of both arrays."""
    o = np.asarray(out, dtype=np.float64)
    r = np.asarray(ref, dtype=np.float64)
    if not np.all(np.isfinite(o)):
        return float("inf")
    denom = np.linalg.norm(r)
    return float(np.linalg.norm(o - r) / (denom if denom > 0 else 1.0))


def uniform_f32(rng: np.random.Generator, shape: int | tuple[int, ...], lo: float = -1.0,
                hi: float = 1.0) -> np.ndarray:
    """Fresh float32 inputs uniform in [lo, hi), drawn in float32 directly: a float64 draw
    plus a cast takes ~3x longer, which at 2^26 elements is most of a grid point's
    overhead."""
    x = rng.random(shape, dtype=np.float32)
    x *= np.float32(hi - lo)
    x += np.float32(lo)
    return x


def poison(a: np.ndarray) -> None:
    """Fill an output with NaN (floats) or a sentinel so unwritten elements show."""
    if np.issubdtype(a.dtype, np.floating):
        a.fill(np.nan)
    else:
        a.fill(np.iinfo(a.dtype).max if np.issubdtype(a.dtype, np.integer) else 0)

