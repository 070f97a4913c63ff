"""The project's own occupancy calculator: theoretical occupancy without a GPU.

Given a compute capability (any row of cudalab.devicespec), the registers per thread and the
shared memory per block of a kernel, and a block size, it returns the resident blocks and
warps per SM, the occupancy (active warps / max warps per SM) and which limit binds.

The rules are the CUDA Occupancy Calculator's, as NVIDIA ships them in cuda_occupancy.h
(cudaOccMaxActiveBlocksPerMultiprocessor), with partitioned global caching off and no
carve-out preference (the defaults of a kernel launched by pycuda):

- warps:     blocks <= max warps per SM // ceil(block size / 32); 0 above 1024 threads.
- blocks:    blocks <= the architecture's max resident blocks per SM.
- registers: a warp is allocated ceil(regs * 32 / 256) * 256 registers; registers live in
             4 sub-partitions (2 on GP100), so warps per SM = (regs per SM / 4 //
             registers per warp) * 4 (the spreadsheet's "warp allocation granularity").
             A block whose warps, rounded up to a multiple of 4, need more registers than
             the per-block limit cannot launch at all (the hardware check).
- shared memory: per block = static + dynamic + 1 KB reserved (cc >= 8.0), rounded up to
             the allocation unit (256 B, 128 B from cc 8.0); blocks <= carve-out // that.
             The carve-out is the largest one unless a preference is given; more than
             48 KB per block (+ the reserved 1 KB) needs the kernel's opt-in.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import asdict, dataclass, replace
from typing import Any

from cudalab.devicespec import KB, ArchSpec, spec

UNLIMITED = 2**31 - 1  # cuda_occupancy.h's INT_MAX: a resource the kernel does not use
LIMITS = ("warps", "blocks", "registers", "shared_memory", "barriers")


def _ceil_div(a: int, b: int) -> int:
    return -(-a // b)


def _round_up(a: int, b: int) -> int:
    return _ceil_div(a, b) * b


@dataclass(frozen=True)
class Occupancy:
    cc: str
    block_size: int
    regs_per_thread: int
    smem_static: int
    smem_dynamic: int
    warps_per_block: int
    regs_per_warp: int  # allocated (rounded to the allocation unit)
    regs_per_block: int  # allocated
    smem_per_block: int  # allocated: static + dynamic + reserved, rounded to the unit
    smem_per_sm: int  # the carve-out the driver would pick
    blocks_by_warps: int
    blocks_by_blocks: int
    blocks_by_registers: int  # UNLIMITED if the kernel uses no registers
    blocks_by_shared_memory: int  # UNLIMITED if nothing is allocated
    blocks_by_barriers: int  # UNLIMITED before cc 9.0 or without barriers
    active_blocks: int
    active_warps: int
    max_warps: int
    limiters: tuple[str, ...]  # every limit equal to the binding one
    reason: str = ""  # why no block fits, if none does

    @property
    def occupancy(self) -> float:
        return self.active_warps / self.max_warps

    @property
    def active_threads(self) -> int:
        return self.active_blocks * self.block_size

    @property
    def launchable(self) -> bool:
        return self.active_blocks > 0

    @property
    def limiter(self) -> str:
        """The binding limits joined with '+' (e.g. 'registers', 'warps+blocks')."""
        return "+".join(self.limiters)

    def as_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d |= {"occupancy": self.occupancy, "active_threads": self.active_threads,
              "launchable": self.launchable, "limiter": self.limiter}
        d["limiters"] = list(self.limiters)
        return d


# -- the four limits (each mirrors its cuda_occupancy.h function) -----------------------------
def _sub_partitions(s: ArchSpec) -> int:
    return s.warp_alloc_granularity


def _max_regs_per_thread(s: ArchSpec) -> int:
    # cudaOccRegAllocationMaxPerThread says 256 from cc 7.0 (255 before); ptxas never uses
    # more than 255, the Programming Guide's limit. The table's value decides (63 on 3.0).
    return 256 if s.major >= 7 else s.max_regs_per_thread


def blocks_by_registers(s: ArchSpec, block_size: int, regs: int) -> tuple[int, str]:
    """(blocks, why-zero) limited by the register file (cudaOccMaxBlocksPerSMRegsLimit)."""
    warps = _ceil_div(block_size, s.warp_size)
    per_warp = _round_up(regs * s.warp_size, s.reg_alloc_unit)
    per_block = per_warp * warps
    parts = _sub_partitions(s)
    assumed = per_warp * _round_up(warps, parts)  # the hardware's per-block check
    if regs > _max_regs_per_thread(s):
        return 0, f"{regs} registers per thread exceed the {s.max_regs_per_thread} allowed"
    if s.max_regs_per_block < assumed or s.max_regs_per_block < per_block:
        return 0, (f"{block_size} threads x {regs} registers need {max(assumed, per_block)} "
                   f"registers per block (allocated per warp in units of {s.reg_alloc_unit}), "
                   f"more than the {s.max_regs_per_block} a block may have")
    if per_warp == 0:
        return UNLIMITED, ""
    warps_per_part = (s.regs_per_sm // parts) // per_warp
    blocks = warps_per_part * parts // warps
    if s.cc == "6.0" and blocks:
        # GP100 (2 sub-partitions) refuses what GP10x (4) cannot run (forward compatibility)
        if blocks_by_registers(replace(s, cc="6.1", warp_alloc_granularity=4),
                               block_size, regs)[0] == 0:
            return 0, "does not fit a GP10x SM (cuda_occupancy.h forward-compatibility rule)"
    return blocks, ""


def carveout_bytes(s: ArchSpec, preference: int | None = None) -> int:
    """The shared memory per SM a launch gets with a carve-out preference in percent
    (None / -1: no preference, i.e. the largest) - cudaOccSMemPerMultiprocessor."""
    if s.major < 7:
        # Kepler defaults to prefer-shared (48 KB); Maxwell/Pascal shared memory is fixed
        return s.smem_per_sm
    want = s.smem_per_sm if preference in (None, -1) else preference * s.smem_per_sm // 100
    return _align_carveout(s, want)


def _align_carveout(s: ArchSpec, size: int) -> int:
    """The smallest carve-out >= size (cudaOccAlignUpShmemSizeVoltaPlus)."""
    steps = [kb * KB for kb in s.smem_carveouts_kb]
    if s.cc == "7.5":  # Turing: 32 or 64 KB, never 0
        steps = [32 * KB, 64 * KB]
    for b in steps:
        if size <= b:
            return b
    raise ValueError(f"{size} B of shared memory per SM is more than cc {s.cc} has "
                     f"({s.smem_per_sm} B)")


def blocks_by_shared_memory(
    s: ArchSpec, static: int, dynamic: int, *, optin_max_dynamic: int | None = None,
    carveout: int | None = None,
) -> tuple[int, int, int, str]:
    """(blocks, allocated per block, shared memory per SM, why-zero) -
    cudaOccMaxBlocksPerSMSmemLimit. `optin_max_dynamic`: the kernel's
    MAX_DYNAMIC_SHARED_SIZE_BYTES if it opted in to more than 48 KB (None: it did not)."""
    static_total = static + s.smem_reserved_per_block
    total = static_total + dynamic
    allocated = _round_up(total, s.smem_alloc_unit)
    pref = carveout_bytes(s, carveout)
    if optin_max_dynamic is not None and s.major >= 7:
        if dynamic > optin_max_dynamic:
            return 0, allocated, pref, (f"{dynamic} B dynamic shared memory exceed the "
                                        f"kernel's opt-in maximum {optin_max_dynamic} B")
        limit = (s.smem_per_block_optin if static_total + optin_max_dynamic > s.smem_per_block
                 else s.smem_per_block)
    else:
        limit = s.smem_per_block
    if s.major >= 8:
        limit += s.smem_reserved_per_block
    if allocated > limit:
        return 0, allocated, pref, (
            f"{allocated} B of shared memory per block (static {static} + dynamic {dynamic}"
            + (f" + {s.smem_reserved_per_block} reserved" if s.smem_reserved_per_block else "")
            + f", rounded to {s.smem_alloc_unit} B) exceed the {limit} B a block may have"
            + ("" if optin_max_dynamic is not None else " without opt-in"))
    if pref >= allocated:
        per_sm = pref
    elif s.major >= 7:
        per_sm = _align_carveout(s, allocated)
    else:
        per_sm = s.smem_per_sm
    blocks = per_sm // allocated if allocated > 0 else UNLIMITED
    return blocks, allocated, per_sm, ""


# -- the calculator ---------------------------------------------------------------------------
def occupancy(
    cc: Any,
    block_size: int,
    regs_per_thread: int,
    smem_static: int = 0,
    smem_dynamic: int = 0,
    *,
    optin_max_dynamic: int | None = None,
    carveout: int | None = None,
    barriers: int = 1,
) -> Occupancy:
    """Theoretical occupancy of one launch configuration (see the module docstring).

    cc: "9.0", (9, 0), "sm_90" or an ArchSpec (e.g. devicespec.from_device(...)).
    smem_static: the kernel's static shared memory (SHARED_SIZE_BYTES, ptxas "smem").
    smem_dynamic: the dynamic shared memory of the launch.
    barriers: block barriers the kernel uses (ptxas "used N barriers"); from cc 9.0 an SM
        holds barrier_factor x max-blocks of them (1 barrier never binds there).
    """
    s = spec(cc)
    if block_size <= 0:
        raise ValueError(f"block size must be positive, not {block_size}")
    if regs_per_thread < 0 or smem_static < 0 or smem_dynamic < 0:
        raise ValueError("registers and shared memory must not be negative")
    warps = _ceil_div(block_size, s.warp_size)
    why = []
    if block_size > s.max_threads_per_block:
        by_warps = 0
        why.append(f"{block_size} threads exceed the {s.max_threads_per_block} a block may have")
    else:
        by_warps = s.max_warps_per_sm // warps
    by_blocks = s.max_blocks_per_sm
    by_regs, why_regs = blocks_by_registers(s, block_size, regs_per_thread)
    by_smem, smem_alloc, smem_sm, why_smem = blocks_by_shared_memory(
        s, smem_static, smem_dynamic, optin_max_dynamic=optin_max_dynamic, carveout=carveout)
    why += [w for w in (why_regs, why_smem) if w]
    by_bars = UNLIMITED
    if s.major >= 9 and barriers > 0:
        by_bars = s.barrier_factor * by_blocks // barriers
    limits = {"warps": by_warps, "blocks": by_blocks, "registers": by_regs,
              "shared_memory": by_smem, "barriers": by_bars}
    active = min(limits.values())
    per_warp = _round_up(regs_per_thread * s.warp_size, s.reg_alloc_unit)
    return Occupancy(
        cc=s.cc, block_size=block_size, regs_per_thread=regs_per_thread,
        smem_static=smem_static, smem_dynamic=smem_dynamic, warps_per_block=warps,
        regs_per_warp=per_warp, regs_per_block=per_warp * warps, smem_per_block=smem_alloc,
        smem_per_sm=smem_sm, blocks_by_warps=by_warps, blocks_by_blocks=by_blocks,
        blocks_by_registers=by_regs, blocks_by_shared_memory=by_smem,
        blocks_by_barriers=by_bars,
        active_blocks=active, active_warps=active * warps, max_warps=s.max_warps_per_sm,
        limiters=tuple(k for k in LIMITS if limits[k] == active),
        reason="; ".join(why),
    )


def max_potential_block_size(
    cc: Any,
    regs_per_thread: int,
    smem_static: int = 0,
    smem_dynamic: int | Callable[[int], int] = 0,
    *,
    block_size_limit: int = 0,
    func_max_threads: int | None = None,
    sm_count: int = 1,
    optin_max_dynamic: int | None = None,
    barriers: int = 1,
) -> tuple[int, int]:
    """(min grid size, block size) the occupancy API picks (cuOccupancyMaxPotentialBlockSize /
    cudaOccMaxPotentialOccupancyBlockSize): try every multiple of 32 from the largest allowed
    down, keep the one with the most resident threads, ties going to the larger block.
    smem_dynamic may be a function of the block size (the B2DSize callback)."""
    s = spec(cc)
    limit = s.max_threads_per_block
    if func_max_threads:
        limit = min(limit, func_max_threads)
    if block_size_limit > 0:
        limit = min(limit, block_size_limit)
    best_bs, best_blocks, best_threads = 0, 0, 0
    for aligned in range(_round_up(limit, s.warp_size), 0, -s.warp_size):
        bs = min(limit, aligned)
        dyn = smem_dynamic(bs) if callable(smem_dynamic) else smem_dynamic
        occ = occupancy(s, bs, regs_per_thread, smem_static, dyn,
                        optin_max_dynamic=optin_max_dynamic, barriers=barriers)
        threads = bs * occ.active_blocks
        if threads > best_threads:
            best_bs, best_blocks, best_threads = bs, occ.active_blocks, threads
        if threads == s.max_threads_per_sm:
            break
    return best_blocks * sm_count, best_bs


def max_block_size(cc: Any, regs_per_thread: int, smem_static: int = 0,
                   smem_dynamic: int = 0, optin_max_dynamic: int | None = None) -> int:
    """The largest block size (multiple of the warp size) that can launch at all - what the
    driver reports as the kernel's MAX_THREADS_PER_BLOCK when registers limit it."""
    s = spec(cc)
    for bs in range(s.max_threads_per_block, 0, -s.warp_size):
        if occupancy(s, bs, regs_per_thread, smem_static, smem_dynamic,
                     optin_max_dynamic=optin_max_dynamic).launchable:
            return bs
    return 0


def occupancy_curve(cc: Any, regs_per_thread: int, smem_static: int = 0,
                    smem_dynamic: int | Callable[[int], int] = 0,
                    block_sizes: list[int] | None = None, barriers: int = 1,
                    optin_max_dynamic: int | None = None) -> list[Occupancy]:
    """Occupancy at every block size (default 32, 64, ..., 1024): the calculator's
    'impact of varying block size' graph."""
    s = spec(cc)
    sizes = block_sizes or list(range(s.warp_size, s.max_threads_per_block + 1, s.warp_size))
    return [occupancy(s, bs, regs_per_thread, smem_static,
                      smem_dynamic(bs) if callable(smem_dynamic) else smem_dynamic,
                      barriers=barriers, optin_max_dynamic=optin_max_dynamic)
            for bs in sizes]


def best_square_tile(cc: Any, regs_per_thread: int, smem_static: int = 0,
                     smem_per_tile: Callable[[int], int] = lambda t: 2 * t * t * 4,
                     tiles: list[int] | None = None) -> tuple[int, Occupancy]:
    """The largest square tile T (block T x T threads, dynamic shared memory
    smem_per_tile(T), default two float tiles) whose occupancy is the best of all T."""
    s = spec(cc)
    cand = tiles or [t for t in range(1, 33) if t * t <= s.max_threads_per_block]
    occs = {t: occupancy(s, t * t, regs_per_thread, smem_static, smem_per_tile(t))
            for t in cand}
    best = max(o.occupancy for o in occs.values())
    t = max(t for t, o in occs.items() if o.occupancy == best)
    return t, occs[t]


# -- the CUDA driver's answer (ctypes on libcuda), to check the calculator on a GPU -----------
# pycuda wraps neither cuOccupancyMaxActiveBlocksPerMultiprocessor nor
# cuOccupancyMaxPotentialBlockSize, and its Function exposes no CUfunction handle. So the
# same cubin pycuda loaded (pycuda.compiler.compile is cached and deterministic) is loaded
# once more through the driver API into the current context, and the occupancy API is asked
# about that CUfunction: the same machine code, so the same registers and shared memory
# (CudaDriver.function checks NUM_REGS against pycuda's).
CU_FUNC_ATTRIBUTE = {"MAX_THREADS_PER_BLOCK": 0, "SHARED_SIZE_BYTES": 1, "CONST_SIZE_BYTES": 2,
                     "LOCAL_SIZE_BYTES": 3, "NUM_REGS": 4, "MAX_DYNAMIC_SHARED_SIZE_BYTES": 8}


class CudaDriverError(RuntimeError):
    pass


class CudaDriver:
    """The few driver-API calls pycuda does not wrap. Needs a current context (pycuda's)."""

    def __init__(self, lib: str = "libcuda.so.1") -> None:
        import ctypes as C

        self.C = C
        try:
            self.lib = C.CDLL(lib)
        except OSError as exc:
            raise CudaDriverError(f"cannot load the CUDA driver library {lib}: {exc}") from exc
        L = self.lib
        vp, i, sz = C.c_void_p, C.c_int, C.c_size_t
        self.B2D = C.CFUNCTYPE(sz, i)  # CUoccupancyB2DSize
        for name, args in {
            "cuGetErrorName": [i, C.POINTER(C.c_char_p)],
            "cuDeviceGet": [C.POINTER(i), i],
            "cuDeviceGetAttribute": [C.POINTER(i), i, i],
            "cuModuleLoadData": [C.POINTER(vp), C.c_char_p],
            "cuModuleUnload": [vp],
            "cuModuleGetFunction": [C.POINTER(vp), vp, C.c_char_p],
            "cuFuncGetAttribute": [C.POINTER(i), i, vp],
            "cuFuncSetAttribute": [vp, i, i],
            "cuOccupancyMaxActiveBlocksPerMultiprocessor": [C.POINTER(i), vp, i, sz],
            "cuOccupancyMaxPotentialBlockSize": [C.POINTER(i), C.POINTER(i), vp, self.B2D,
                                                 sz, i],
        }.items():
            fn = getattr(L, name)
            fn.argtypes = args
            fn.restype = i
        self._modules: list[Any] = []

    def _check(self, rc: int, what: str) -> None:
        if rc != 0:
            name = self.C.c_char_p()
            self.lib.cuGetErrorName(rc, self.C.byref(name))
            raise CudaDriverError(f"{what} failed: {(name.value or b'?').decode()} ({rc})")

    def function(self, cubin: bytes, name: str, expect_regs: int | None = None) -> Any:
        """Load `cubin` into the current context and return the CUfunction `name`."""
        C = self.C
        mod = C.c_void_p()
        self._check(self.lib.cuModuleLoadData(C.byref(mod), cubin), "cuModuleLoadData")
        self._modules.append(mod)  # kept loaded for the life of the job
        fn = C.c_void_p()
        self._check(self.lib.cuModuleGetFunction(C.byref(fn), mod, name.encode()),
                    f"cuModuleGetFunction({name})")
        if expect_regs is not None and self.func_attribute(fn, "NUM_REGS") != expect_regs:
            raise CudaDriverError(
                f"{name}: the driver's copy uses {self.func_attribute(fn, 'NUM_REGS')} "
                f"registers, pycuda's {expect_regs}: not the same cubin")
        return fn

    def func_attribute(self, fn: Any, attr: str) -> int:
        v = self.C.c_int()
        self._check(self.lib.cuFuncGetAttribute(self.C.byref(v), CU_FUNC_ATTRIBUTE[attr], fn),
                    f"cuFuncGetAttribute({attr})")
        return int(v.value)

    def set_func_attribute(self, fn: Any, attr: str, value: int) -> None:
        """e.g. MAX_DYNAMIC_SHARED_SIZE_BYTES: the opt-in to more than 48 KB per block."""
        self._check(self.lib.cuFuncSetAttribute(fn, CU_FUNC_ATTRIBUTE[attr], int(value)),
                    f"cuFuncSetAttribute({attr})")

    def device_attribute(self, ordinal: int, attr_id: int) -> int:
        C = self.C
        dev, v = C.c_int(), C.c_int()
        self._check(self.lib.cuDeviceGet(C.byref(dev), ordinal), "cuDeviceGet")
        self._check(self.lib.cuDeviceGetAttribute(C.byref(v), attr_id, dev),
                    f"cuDeviceGetAttribute({attr_id})")
        return int(v.value)

    def max_active_blocks(self, fn: Any, block_size: int, dynamic_smem: int = 0) -> int:
        n = self.C.c_int()
        self._check(self.lib.cuOccupancyMaxActiveBlocksPerMultiprocessor(
            self.C.byref(n), fn, int(block_size), int(dynamic_smem)),
            "cuOccupancyMaxActiveBlocksPerMultiprocessor")
        return int(n.value)

    def max_potential_block_size(self, fn: Any, dynamic_smem: int | Callable[[int], int] = 0,
                                 block_size_limit: int = 0) -> tuple[int, int]:
        """(min grid size, block size) from cuOccupancyMaxPotentialBlockSize."""
        C = self.C
        grid, bs = C.c_int(), C.c_int()
        if callable(dynamic_smem):
            cb = self.B2D(lambda b: int(dynamic_smem(b)))
            rc = self.lib.cuOccupancyMaxPotentialBlockSize(C.byref(grid), C.byref(bs), fn, cb,
                                                           0, int(block_size_limit))
        else:
            rc = self.lib.cuOccupancyMaxPotentialBlockSize(
                C.byref(grid), C.byref(bs), fn, self.B2D(0), int(dynamic_smem),
                int(block_size_limit))
        self._check(rc, "cuOccupancyMaxPotentialBlockSize")
        return int(grid.value), int(bs.value)
