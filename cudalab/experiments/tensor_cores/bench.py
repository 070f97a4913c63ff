"""On a GPU machine, after `cudalab measure tensor_cores` and `cudalab aggregate`: print the
summary at the largest size (TFLOP/s, % of cuBLAS of the same precision, % of peak, errors),
every mma tile at that size, and the lesson's claims; optionally check that pycuda can build
an sm_90a (wgmma) module.

    python -m cudalab.experiments.tensor_cores.bench results/results.csv [--probe-wgmma]
"""

from __future__ import annotations

import argparse
import sys

import pandas as pd

from cudalab import claims
from cudalab.experiments.tensor_cores.figures import largest, summary_rows, tile_label

WGMMA_PROBE = r"""
extern "C" __global__ void probe(float* out)
{
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
    asm volatile("wgmma.fence.sync.aligned;\n" ::);
    out[threadIdx.x] = 1.0f;
#else
    out[threadIdx.x] = 2.0f;
#endif
}
"""


def probe_wgmma() -> str:
    """Build a module with a wgmma instruction for sm_90a through pycuda and run it: what
    happened, in one line."""
    try:
        import numpy as np
        import pycuda.driver as cuda
        from pycuda.compiler import SourceModule

        from cudalab.gpu import open_session

        open_session()
        mod = SourceModule(WGMMA_PROBE, no_extern_c=True, arch="sm_90a")
        out = np.zeros(128, np.float32)
        mod.get_function("probe")(cuda.Out(out), block=(128, 1, 1), grid=(1, 1))
        return f"sm_90a module built and ran through pycuda: wrote {out[0]:g} (1 = wgmma path)"
    except Exception as exc:  # noqa: BLE001 - report whatever stops it
        return f"sm_90a probe failed: {type(exc).__name__}: {str(exc)[:300]}"


def launch_once(tile: dict[str, int], n: int = 4096) -> None:
    """One mma fp16 launch of `tile` and one cuBLAS fp16 GemmEx at n, for a profiler to
    attach to (ncu -k regex:'tc_mma|gemm')."""
    import numpy as np

    from cudalab.experiments.base import Point
    from cudalab.experiments.tensor_cores import cublas_ex, kernels, numerics
    from cudalab.gpu import open_session

    gpu = open_session()
    cuda = gpu.cuda
    rng = np.random.default_rng(0)
    a = numerics.device_input(rng.uniform(-1, 1, (n, n)).astype(np.float32), "fp16")
    a_d, b_d, c_d = cuda.to_device(a), cuda.to_device(a), cuda.mem_alloc(4 * n * n)
    p = Point("tensor_cores", "mma", {"m": n, "k": n, "n": n, "precision": "fp16", **tile})
    func = gpu.compile(kernels.kernel_source(p), kernels.kernel_defines(p)).function(
        "tc_mma_fp16")
    grid, block, smem = kernels.launch_geometry(p)
    attr = cuda.function_attribute
    func.set_attribute(attr.MAX_DYNAMIC_SHARED_SIZE_BYTES, smem)
    func.set_attribute(attr.PREFERRED_SHARED_MEMORY_CARVEOUT, 100)
    func(a_d, b_d, c_d, np.int32(n), np.int32(n), np.int32(n), block=block, grid=grid,
         shared=smem)
    launch, _, sync, _ = cublas_ex.gemm_ex_launcher(gpu, a_d, b_d, c_d, n, n, n, "fp16")
    launch()
    sync()


def report(df: pd.DataFrame) -> list[str]:
    d = df[df["experiment"] == "tensor_cores"]
    if "p_precision" not in d or d.empty:
        return ["no tensor_cores rows in the table"]
    lines = [f"{'prec':5} {'variant':7} {'TFLOP/s':>8} {'%cuBLAS':>8} {'%peak':>6} "
             f"{'err_input':>10} {'err_check':>10} {'tol':>8}  tile"]
    for r in summary_rows(d):
        lines.append(f"{r['precision']:5} {r['variant']:7} {r['tflops']:8.1f} "
                     f"{r['pct_cublas']:8.1f} {r['pct_peak']:6.1f} {r['err_input']:10.2e} "
                     f"{r['err_check']:10.2e} {r['tolerance']:8.1e}  {r['tile']}")
    big = largest(d[d["status"] == "ok"])
    mma = big[big["variant"] == "mma"].sort_values("gflops", ascending=False)
    lines.append("mma tiles at the largest size:")
    for _, r in mma.iterrows():
        lines.append(f"  {r['p_precision']} {tile_label(r)}: {r['gflops'] / 1e3:.1f} TFLOP/s, "
                     f"{r.get('m_regs', float('nan')):.0f} regs")
    bad = d[d["status"] != "ok"]
    for _, r in bad.head(12).iterrows():
        lines.append(f"NOT OK {r['point_id']}: {r['status']} {str(r.get('reason'))[:200]}")
    if len(bad) > 12:
        lines.append(f"... {len(bad) - 12} more not ok")
    lines += [f"[{r.state.value}] {r.statement}: {r.evidence}"
              for r in claims.evaluate("tensor_cores", df)]
    return lines


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("table", nargs="?")
    ap.add_argument("--probe-wgmma", action="store_true")
    ap.add_argument("--launch-once", metavar="BM,BN,BK,WM,WN,STAGES",
                    help="launch this mma fp16 tile and cuBLAS fp16 once at 4096 (to profile)")
    a = ap.parse_args(argv)
    if a.launch_once:
        from cudalab.experiments.tensor_cores.kernels import MMA_KEYS

        launch_once(dict(zip(MMA_KEYS, map(int, a.launch_once.split(",")))))
        return 0
    print("\n".join(report(pd.read_csv(a.table))))
    if a.probe_wgmma:
        print(probe_wgmma())
    return 0


if __name__ == "__main__":
    sys.exit(main())
