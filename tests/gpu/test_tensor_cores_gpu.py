"""On a GPU machine (pytest -m gpu): the tensor-core kernels and cuBLAS in every precision
are right against the float64 product of their rounded inputs, their error against the
unrounded product is what rounding the inputs predicts, and a kernel fed the wrong
precision fails its check. The wgmma rungs run on compute capability 9.x and are skipped
elsewhere as not applicable."""

from __future__ import annotations

import numpy as np
import pytest

from cudalab import config as cfg
from cudalab import results
from cudalab.experiments import REGISTRY
from cudalab.experiments.tensor_cores import numerics, wgmma
from cudalab.runner import run_experiment

pytestmark = pytest.mark.gpu


@pytest.fixture(scope="module")
def smoke(tmp_path_factory):
    exp = REGISTRY["tensor_cores"]
    config = cfg.validate({
        "measurement": {"warmup": 1, "min_samples": 3, "max_samples": 10, "budget_s": 0.05},
        "experiments": {"tensor_cores": dict(exp.smoke)},
    })
    out = tmp_path_factory.mktemp("tc")
    run_experiment(config, "tensor_cores", out)
    return results.build_table(list(results.iter_records(out / "raw")))


def _hopper() -> bool:
    from cudalab.gpu import open_session

    return open_session().info["compute_capability"].startswith("9.")


def test_every_kernel_and_precision_is_right(smoke):
    wg = smoke["variant"].isin(wgmma.RUNGS)
    if not _hopper():  # not applicable, with the reason, and nothing else
        assert (smoke.loc[wg, "status"] == "skipped").all()
        assert smoke.loc[wg, "reason"].str.startswith("not applicable: wgmma").all()
        smoke = smoke[~wg]
    bad = smoke[smoke["status"] != "ok"]
    assert bad.empty, dict(zip(bad["point_id"], bad["reason"]))
    assert set(smoke["variant"]) >= {"wmma", "mma", "cublas"}
    assert set(smoke["p_precision"]) == {"fp32", "tf32", "fp16", "bf16"}


def test_the_wgmma_rungs_run_hopper_instructions_on_their_grids(smoke):
    if not _hopper():
        pytest.skip("wgmma needs compute capability 9.x")
    wg = smoke[smoke["variant"].isin(wgmma.RUNGS)]
    assert set(wg["variant"]) == set(wgmma.RUNGS)
    assert set(wg["p_precision"]) == set(wgmma.PRECISIONS)
    sms = int(smoke["sm_count"].dropna().iloc[0])
    for _, r in wg.iterrows():
        st, bn = (r.get(c) for c in ("p_stages", "p_bn"))
        s = wgmma.shape(r["variant"], int(st) if st == st else 4, int(bn) if bn == bn else 256)
        tiles = (int(r["p_m"]) // wgmma.BM) * (int(r["p_n"]) // s.bn)
        assert int(r["launch_blocks"]) == (min(tiles, sms) if s.persistent else tiles)
        assert int(r["launch_threads"]) == s.threads


def test_input_error_is_what_rounding_predicts(smoke):
    smoke = smoke[smoke["status"] == "ok"]  # the wgmma rungs skipped before 9.x
    for prec in ("tf32", "fp16", "bf16"):
        err = smoke.loc[smoke["p_precision"] == prec, "m_err_input"].astype(float)
        want = numerics.expected_input_error(prec)
        assert ((err > want / 2) & (err < 1.5 * want)).all(), (prec, list(err), want)
    fp32 = smoke.loc[smoke["p_precision"] == "fp32", "m_err_input"].astype(float)
    assert (fp32 < 1e-5).all()


def test_a_kernel_fed_the_wrong_precision_fails_the_check():
    from cudalab.gpu import open_session

    gpu = open_session()
    cuda = gpu.cuda
    n = 256
    rng = np.random.default_rng(1)
    a = rng.uniform(-1, 1, (n, n)).astype(np.float32)
    b = rng.uniform(-1, 1, (n, n)).astype(np.float32)
    ha, hb = numerics.device_input(a, "fp16"), numerics.device_input(b, "fp16")
    ref = numerics.exact_values(ha, "fp16") @ numerics.exact_values(hb, "fp16")
    # reads fp16 as bf16
    func = gpu.compile("tensor_cores/tensor_core_wmma.cu").function("tc_wmma_bf16")
    a_d, b_d, c_d = cuda.to_device(ha), cuda.to_device(hb), cuda.mem_alloc(4 * n * n)
    func(a_d, b_d, c_d, np.int32(n), np.int32(n), np.int32(n), block=(256, 1, 1),
         grid=(n // 128, n // 128))
    c = cuda.from_device(c_d, (n, n), np.float32)
    from cudalab.experiments.base import rel_fro_error

    assert not rel_fro_error(c, ref) <= numerics.check_tolerance(n)
    good = gpu.compile("tensor_cores/tensor_core_wmma.cu").function("tc_wmma_fp16")
    good(a_d, b_d, c_d, np.int32(n), np.int32(n), np.int32(n), block=(256, 1, 1),
         grid=(n // 128, n // 128))
    c = cuda.from_device(c_d, (n, n), np.float32)
    assert rel_fro_error(c, ref) <= numerics.check_tolerance(n)
