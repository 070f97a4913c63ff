"""On a GPU machine (pytest -m gpu): every registered experiment's smoke grid runs through
the real runner and every point passes its correctness check."""

from __future__ import annotations

import pytest

from cudalab import config as cfg
from cudalab import results
from cudalab.experiments import REGISTRY
from cudalab.runner import run_experiment

pytestmark = pytest.mark.gpu


@pytest.mark.parametrize("name", list(REGISTRY))
def test_smoke_grid_is_correct_on_gpu(name, tmp_path):
    config = cfg.validate({
        "measurement": {"warmup": 1, "min_samples": 3, "max_samples": 20, "budget_s": 0.05},
        "experiments": {name: dict(REGISTRY[name].smoke)},
    })
    manifest = run_experiment(config, name, tmp_path)
    recs = list(results.iter_records(tmp_path / "raw"))
    assert recs, "no records written"
    bad = {r["point_id"]: r.get("reason") for r in recs if r["status"] != "ok"}
    assert not bad, bad
    assert manifest["counts"]["ok"] == len(recs)
    df = results.build_table(recs)
    assert results.check_table(df) == []
    # % of peak on every timed GPU point of an experiment compared with the device's peaks
    timed = df[df["timer"].str.startswith("cuda_event") & df["time_median_s"].notna()
               & (df["gbps"].notna() | df["gflops"].notna())]
    if REGISTRY[name].vs_device_peak and not timed.empty:
        pct = timed["pct_peak_gbps"].fillna(timed["pct_peak_gflops"])
        assert pct.notna().all() and (pct > 0).all(), timed[["point_id", "pct_peak_gbps"]]
    else:
        assert df["pct_peak_gbps"].isna().all() and df["pct_peak_gflops"].isna().all()
