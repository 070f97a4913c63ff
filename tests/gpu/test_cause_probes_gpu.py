"""On a GPU machine (pytest -m gpu): the cause probes measure something sane, and the claims
that read them are judged (seen or not seen) on the run.

- the block-rate probe: empty and one-load kernels over block counts at several block sizes;
  each fitted rate is positive and finite, within what a GPU can do, and the one-load
  probe's loads were checked; the small-block claim is judged at 2^26 elements;
- the duplex copies: H2D alone, D2H alone and both at once; (H2D + D2H) / both lies between
  0.9 (both at once no faster than in turn, give or take noise) and 2.1 (perfect overlap);
- the register tiles' FMAs per shared-memory load against their speed at 4096^3.

CUDALAB_PROBE_OUT=DIR keeps each run's table (DIR/<experiment>.csv) and the judged claims
(DIR/claims.txt) for a reader.
"""

from __future__ import annotations

import math
import os
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from cudalab import claims, results
from cudalab import config as cfg
from cudalab.experiments.lesson import State
from cudalab.experiments.streams import duplex
from cudalab.experiments.vector_add import block_rate
from cudalab.runner import run_experiment

pytestmark = pytest.mark.gpu
MEASUREMENT = {"warmup": 2, "min_samples": 5, "max_samples": 50, "budget_s": 0.1}
# A GPU starts and retires between a block per 100 ns and a thousand per ns, GPU-wide.
RATE_RANGE = (0.01, 1000.0)
JUDGED = (State.SEEN, State.NOT_SEEN)


def _run(name: str, block: dict, tmp_path: Path) -> pd.DataFrame:
    config = cfg.validate({"measurement": MEASUREMENT, "experiments": {name: block}})
    run_experiment(config, name, tmp_path)
    recs = list(results.iter_records(tmp_path / "raw"))
    bad = {r["point_id"]: r.get("reason") for r in recs if r["status"] != "ok"}
    assert recs and not bad, bad
    df = results.build_table(recs)
    out = os.environ.get("CUDALAB_PROBE_OUT")
    if out:
        Path(out).mkdir(parents=True, exist_ok=True)
        df.to_csv(Path(out) / f"{name}.csv", index=False)
    return df


def _judged(name: str, key: str, df: pd.DataFrame) -> claims.ClaimResult:
    got = {r.key: r for r in claims.evaluate(name, df)}[key]
    line = f"{name}:{key}: {got.state.value}: {got.evidence}"
    print(line)
    out = os.environ.get("CUDALAB_PROBE_OUT")
    if out:
        with open(Path(out) / "claims.txt", "a", encoding="utf-8") as f:
            f.write(line + "\n")
    return got


def test_block_rate_probe_measures_a_sane_rate(tmp_path):
    blocks = [4096, 65536, 262144, 1048576]
    df = _run("vector_add", {"sizes": [1 << 26], "threads": [32, 64, 128, 256, 1024],
                             "probe_blocks": blocks}, tmp_path)
    probe = block_rate.probe_rows(df)
    assert len(probe) == len(block_rate.KINDS) * 5 * len(blocks)
    r = block_rate.rates(df)
    print(r.to_string())
    assert set(r["kind"]) == set(block_rate.KINDS) and (r["counts"] == len(blocks)).all()
    assert np.isfinite(r["rate"]).all(), r
    assert r["rate"].between(*RATE_RANGE).all(), r
    # time grows with the number of blocks: the largest count takes longer than the smallest
    for (_, _), g in probe.groupby(["p_kind", "p_threads"]):
        g = g.sort_values("p_blocks")
        assert g["time_median_s"].iloc[-1] > g["time_median_s"].iloc[0], g
    got = _judged("vector_add", "fixed_cost_per_block", df)
    assert got.state in JUDGED, got.evidence


def test_duplex_copies_give_a_ratio_between_serial_and_full_overlap(tmp_path):
    df = _run("streams", {"n": 1 << 26, "variants": ["duplex"]}, tmp_path)
    t = duplex.times(df)
    assert t is not None, df[["point_id", "status"]]
    r = duplex.ratio(t)
    print(f"duplex ratio {r:.3f}: {t}")
    assert math.isfinite(r) and 0.9 <= r <= 2.1, (r, t)
    got = _judged("streams", "copies_full_duplex", df)
    assert got.state in JUDGED, got.evidence
    assert duplex.duplex_fact(df, None)


def test_fmas_per_shared_load_against_the_register_tiles_speed(tmp_path):
    df = _run("matmul", {"sizes": [4096], "variants": ["tiled", "register"],
                         "dtypes": ["float32"]}, tmp_path)
    got = _judged("matmul", "fma_per_load_sets_speed", df)
    assert got.state in JUDGED, got.evidence
    assert "register rt 8" in got.evidence
