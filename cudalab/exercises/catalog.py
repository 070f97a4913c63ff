"""The exercises. Each is a kernel slot: a fixed name and signature, the -D defines the
harness compiles it with, and a grid rule; the checks, tolerance and timing are those of the
experiment it belongs to. The course's own kernels go through the very same slot (the
class report's baselines, and the test that the checker is real).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from cudalab.resources import CUDA_DIR

EXERCISE_DIR = CUDA_DIR / "exercises"


@dataclass(frozen=True)
class CourseKernel:
    """One of the course's kernels put in a slot: cuda/<file>'s `kernel`, compiled with the
    slot's defines plus `defines` (REAL=double for the float64 slot)."""

    label: str
    file: str
    kernel: str
    defines: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class Exercise:
    name: str
    title: str
    kind: str  # vector_add | matmul | transpose | reduction: the slot's inputs and check
    experiment: str  # whose checks and tolerance
    kernel: str  # the extern "C" name of the slot
    params: tuple[str, ...]  # PTX parameter types of the signature, in order
    signature: str
    grid_rule: str
    defines: dict[str, Any]
    check_sizes: tuple[tuple[int, ...], ...]  # the small grid of a check (odd sizes in it)
    time_size: tuple[int, ...]  # the size a check times
    class_size: tuple[int, ...]  # the size a class run times
    course: tuple[CourseKernel, ...]
    hint: str  # the lesson's next step
    dtype: str = "float32"
    cublas: bool = False  # cuBLAS (through CuPy) is this slot's ceiling

    @property
    def starter(self) -> str:
        return f"{self.name}.cu"


_MATMUL_PARAMS = ("u64", "u64", "u64", "u32", "u32", "u32")
_MATMUL_SIZES = ((5, 7, 3), (160, 240, 320), (100, 100, 100), (257, 129, 65))
_MATMUL_SIG = "(const {t}* A, const {t}* B, {t}* C, int M, int N, int K)"
REGISTER_DEFINES = {"BM": 64, "BN": 64, "BK": 16, "RM": 4, "RN": 4}

EXERCISES: dict[str, Exercise] = {e.name: e for e in (
    Exercise(
        name="vector_add", title="Vector addition c = a + b", kind="vector_add",
        experiment="vector_add", kernel="vector_add", params=("u64", "u64", "u64", "u32"),
        signature="vector_add(const float* a, const float* b, float* c, int n)",
        grid_rule="blocks of `threads` threads (32, 256 and 1024 are all checked), "
                  "grid = ceil(n / threads)",
        defines={}, check_sizes=((1, 256), (50_000, 256), (1_000_003, 32), (1_000_003, 1024)),
        time_size=(1 << 20, 256), class_size=(1 << 24, 256),
        course=(CourseKernel("course: vector_add", "vector_add/vector_add.cu", "vector_add"),),
        hint="Time your kernel at 50 000 and at 2^24 elements: the small vector is "
             "launch-bound, the large one reaches most of the DRAM bandwidth. Then try "
             "32-thread blocks: too few warps per SM to hide the memory latency."),
    Exercise(
        name="tiled_matmul", title="Shared-memory tiled matrix multiply", kind="matmul",
        experiment="matmul", kernel="matmul_tiled", params=_MATMUL_PARAMS,
        signature="matmul_tiled" + _MATMUL_SIG.format(t="float"),
        grid_rule="TILE x TILE threads a block (TILE = 16, a -D define), grid = "
                  "(ceil(N / TILE), ceil(M / TILE)); row-major C[M x N] = A[M x K] B[K x N]",
        defines={"TILE": 16}, check_sizes=_MATMUL_SIZES, time_size=(512, 512, 512),
        class_size=(2048, 2048, 2048),
        course=(CourseKernel("course: naive", "matmul/matmul.cu", "matmul_naive"),
                CourseKernel("course: tiled", "matmul/matmul.cu", "matmul_tiled"),
                CourseKernel("course: tiled, padded B tile", "matmul/matmul.cu",
                             "matmul_tiled_padded")),
        hint="Look for shared-memory bank conflicts. A warp reading down a column of "
             "a TILE x TILE float tile hits one bank TILE times; one float of padding per "
             "row (TILE + 1) spreads it over all 32 banks. Then register tiling: each "
             "thread computes several elements of C.",
        cublas=True),
    Exercise(
        name="register_matmul", title="Register-tiled matrix multiply", kind="matmul",
        experiment="matmul", kernel="matmul_register", params=_MATMUL_PARAMS,
        signature="matmul_register" + _MATMUL_SIG.format(t="float"),
        grid_rule="a block computes a BM x BN tile of C with (BN / RN) x (BM / RM) threads "
                  "(BM = BN = 64, BK = 16, RM = RN = 4: 16 x 16 threads), grid = "
                  "(ceil(N / BN), ceil(M / BM))",
        defines=REGISTER_DEFINES, check_sizes=_MATMUL_SIZES, time_size=(512, 512, 512),
        class_size=(2048, 2048, 2048),
        course=(CourseKernel("course: register (64/16/4)", "matmul/matmul.cu", "matmul_register"),),
        hint="The ladder to cuBLAS. Load the tiles with float4 (128-bit) loads, then "
             "double-buffer the shared slices so the next tile loads while this one "
             "computes; watch registers and occupancy as the tile grows.",
        cublas=True),
    Exercise(
        name="transpose", title="Matrix transpose through shared memory", kind="transpose",
        experiment="coalescing", kernel="transpose", params=("u64", "u64", "u32", "u32"),
        signature="transpose(float* out, const float* in, int rows, int cols)",
        grid_rule="TILE x BLOCK_ROWS threads a block (32 x 8) covering a TILE x TILE tile, "
                  "grid = (ceil(cols / TILE), ceil(rows / TILE)); out is cols x rows",
        defines={"TILE": 32, "BLOCK_ROWS": 8},
        check_sizes=((1, 1), (33, 65), (256, 256), (1000, 777)), time_size=(1024, 1024),
        class_size=(4096, 4096),
        course=tuple(CourseKernel(f"course: {v}", "coalescing/coalescing.cu", f"transpose_{v}")
                     for v in ("naive", "tiled", "padded")),
        hint="Reads and writes should both be coalesced: stage the tile in shared memory, "
             "then pad its rows by one float so reading a column of it is conflict-free."),
    Exercise(
        name="reduction", title="Sum reduction in shared memory", kind="reduction",
        experiment="atomics", kernel="sum_reduce", params=("u64", "u64", "u32"),
        signature="sum_reduce(const float* x, float* out, int n)",
        grid_rule="BLOCK threads a block (BLOCK = 256), each block sums 2 * BLOCK elements, "
                  "grid = ceil(n / (2 * BLOCK)); each block adds its sum to *out with one "
                  "atomicAdd (out starts at 0)",
        defines={"BLOCK": 256},
        check_sizes=((1,), (1000,), (100_003,), (1 << 20,)), time_size=(1 << 22,),
        class_size=(1 << 24,),
        course=(CourseKernel("course: tree reduction", "atomics/atomics.cu", "sum_reduce"),),
        hint="Sequential addressing (stride halves from BLOCK / 2) avoids bank "
             "conflicts and divergent warps; unroll the last warp with __shfl_down_sync."),
    Exercise(
        name="dgemm", title="DGEMM: double-precision matrix multiply", kind="matmul",
        experiment="matmul", kernel="dgemm", params=_MATMUL_PARAMS,
        signature="dgemm" + _MATMUL_SIG.format(t="double"),
        grid_rule="TILE x TILE threads a block (TILE = 16), grid = (ceil(N / TILE), "
                  "ceil(M / TILE)); row-major, float64",
        defines={"TILE": 16}, check_sizes=_MATMUL_SIZES, time_size=(512, 512, 512),
        class_size=(2048, 2048, 2048),
        course=(CourseKernel("course: naive (double)", "matmul/matmul.cu", "matmul_naive",
                             {"REAL": "double"}),
                CourseKernel("course: tiled (double)", "matmul/matmul.cu", "matmul_tiled",
                             {"REAL": "double"})),
        hint="First the simple version (one thread per element of C), then shared-memory "
             "tiles: each value of A and B is then loaded once per tile, not once per "
             "thread. cuBLAS DGEMM uses the FP64 tensor cores where the GPU has them.",
        dtype="float64", cublas=True),
)}


def get(name: str) -> Exercise:
    """The exercise called `name`, or KeyError naming the ones there are."""
    try:
        return EXERCISES[name]
    except KeyError:
        raise KeyError(f"no exercise {name!r}; there are: {', '.join(EXERCISES)}") from None
