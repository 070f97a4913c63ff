"""On a GPU machine (pytest -m gpu): the project's occupancy calculator gives the same resident
blocks per SM as the CUDA driver (cuOccupancyMaxActiveBlocksPerMultiprocessor) and picks the
same block size as cuOccupancyMaxPotentialBlockSize, for kernels with few and many registers,
static and dynamic shared memory, at every block size; and the limits table row of this
GPU's compute capability matches what the driver reports."""

from __future__ import annotations

import pytest

from cudalab import devicespec
from cudalab import occupancy as occ
from cudalab.experiments.occupancy import driver_function

pytestmark = pytest.mark.gpu

BLOCKS = list(range(32, 1025, 32)) + [1, 33, 100, 1000]
DYN = [0, 1000, 4096, 16 * 1024, 32 * 1024, 48 * 1024]
# (file, defines, kernel)
KERNELS = [
    ("occupancy/occupancy.cu", {}, "vec_mul"),
    ("occupancy/occupancy.cu", {"LIVE": 32}, "vec_mul_regs"),
    ("occupancy/occupancy.cu", {"LIVE": 64}, "vec_mul_regs"),
    ("occupancy/occupancy.cu", {"LIVE": 128}, "vec_mul_regs"),
    ("occupancy/occupancy.cu", {}, "vec_mul_smem"),
    ("occupancy/occupancy.cu", {}, "matmul_tiled_dyn"),
    ("matmul/matmul.cu", {"TILE": 8}, "matmul_tiled"),
    ("matmul/matmul.cu", {"TILE": 32}, "matmul_tiled"),
    ("matmul/matmul.cu", {}, "matmul_naive"),
]


@pytest.fixture(scope="module")
def gpu():
    from cudalab.gpu import open_session

    return open_session(0)


@pytest.fixture(scope="module")
def drv(gpu):
    return occ.CudaDriver()


@pytest.fixture(scope="module")
def cc(gpu):
    cc = gpu.info["compute_capability"]
    try:
        devicespec.spec(cc)
    except KeyError:
        pytest.skip(f"compute capability {cc} is not in cudalab.devicespec")
    return cc


def _limits(gpu, drv):
    out = {}
    for attr in devicespec.DEVICE_ATTRIBUTES.values():
        try:
            out[attr] = drv.device_attribute(gpu.index, devicespec.CU_DEVICE_ATTRIBUTE_IDS[attr])
        except occ.CudaDriverError:
            pass
    return out


def test_table_row_matches_the_device(gpu, drv, cc):
    assert devicespec.compare_with_device(cc, _limits(gpu, drv)) == {}


def _kernel(gpu, drv, file, defines, name):
    kernel = gpu.compile(file, defines)
    func = kernel.function(name)
    fn = driver_function(drv, kernel, name, func)
    return func, fn, int(func.num_regs), int(func.shared_size_bytes)


@pytest.mark.parametrize("file, defines, name", KERNELS,
                         ids=[f"{f}:{n}:{d}" for f, d, n in KERNELS])
def test_calculator_equals_driver(gpu, drv, cc, file, defines, name):
    func, fn, regs, static = _kernel(gpu, drv, file, defines, name)
    assert drv.func_attribute(fn, "NUM_REGS") == regs
    assert drv.func_attribute(fn, "SHARED_SIZE_BYTES") == static
    bad = []
    for dyn in DYN:
        if static + dyn > devicespec.spec(cc).smem_per_block:
            continue  # would need the opt-in (tested below)
        for bs in BLOCKS:
            mine = occ.occupancy(cc, bs, regs, static, dyn)
            try:
                theirs = drv.max_active_blocks(fn, bs, dyn)
            except occ.CudaDriverError:  # a block the kernel can never launch
                theirs = 0
            if mine.active_blocks != theirs:
                bad.append((bs, dyn, mine.active_blocks, mine.limiter, theirs))
        _, api = drv.max_potential_block_size(fn, dyn)
        _, calc = occ.max_potential_block_size(cc, regs, static, dyn,
                                               func_max_threads=int(func.max_threads_per_block))
        if api != calc:
            bad.append(("potential block size", dyn, calc, api))
    assert not bad, f"{name} ({regs} regs, {static} B static smem): (block, dyn smem, " \
                    f"calculator, limiter, driver) {bad[:10]}"


def test_max_threads_per_block_of_a_register_heavy_kernel(gpu, drv, cc):
    func, fn, regs, static = _kernel(gpu, drv, "occupancy/occupancy.cu", {"LIVE": 128},
                                       "vec_mul_regs")
    assert int(func.max_threads_per_block) == occ.max_block_size(cc, regs, static)


def test_block_size_dependent_shared_memory(gpu, drv, cc):
    # the B2DSize callback: 8 bytes per thread (like a two-tile matmul)
    func, fn, regs, static = _kernel(gpu, drv, "occupancy/occupancy.cu", {}, "vec_mul_smem")
    _, api = drv.max_potential_block_size(fn, lambda b: 8 * b)
    _, calc = occ.max_potential_block_size(cc, regs, static, lambda b: 8 * b,
                                           func_max_threads=int(func.max_threads_per_block))
    assert api == calc


def test_opt_in_to_more_shared_memory(gpu, drv, cc):
    s = devicespec.spec(cc)
    if s.major < 7 or s.smem_per_block_optin <= s.smem_per_block:
        pytest.skip("no opt-in shared memory on this architecture")
    # a separate driver-API copy of the kernel so pycuda's own function keeps its default
    kernel = gpu.compile("occupancy/occupancy.cu", {})
    from pycuda.compiler import compile as nvcc_compile

    from cudalab.gpu import CUDA_DIR

    cubin = nvcc_compile((CUDA_DIR / "occupancy/occupancy.cu").read_text(),
                         options=list(kernel.options),
                         no_extern_c=True, include_dirs=[str(CUDA_DIR)])
    fn = drv.function(cubin, "vec_mul_smem")
    regs = drv.func_attribute(fn, "NUM_REGS")
    limit = s.smem_per_block_optin
    drv.set_func_attribute(fn, "MAX_DYNAMIC_SHARED_SIZE_BYTES", limit)
    bad = []
    for dyn in (48 * 1024 + 1, 64 * 1024, 100 * 1024, limit // 2, limit):
        if dyn > limit:
            continue
        for bs in (32, 128, 256, 1024):
            mine = occ.occupancy(cc, bs, regs, 0, dyn, optin_max_dynamic=limit)
            theirs = drv.max_active_blocks(fn, bs, dyn)
            if mine.active_blocks != theirs:
                bad.append((bs, dyn, mine.active_blocks, mine.limiter, theirs))
    assert not bad, bad
