"""On a GPU machine (pytest -m gpu): trials on a real device. The job's cache moves its
device buffers to new addresses with their contents, the resolution floor measures, and a
small grid through the runner records three trials per point, each on moved buffers, with
one correctness check per point."""

from __future__ import annotations

import math

import numpy as np
import pytest

from cudalab import config as cfg
from cudalab import results, runner, trials
from cudalab.experiments.job_cache import JobCache
from cudalab.harness import Harness, Settings

pytestmark = pytest.mark.gpu


@pytest.fixture(scope="module")
def session():
    from cudalab.gpu import open_session

    return open_session(0)


def test_the_cache_moves_real_device_buffers_with_their_contents(session):
    cuda = session.cuda
    x = np.arange(1 << 20, dtype=np.float32)
    a = cuda.mem_alloc(x.nbytes)
    cuda.memcpy_htod(a, x)
    cache = JobCache()
    cache["set"] = {"host": x, "a_d": a}
    assert cache.replace_device(cuda) == (1, 0)
    new = cache["set"]["a_d"]
    assert int(new) != int(a)
    back = np.empty_like(x)
    cuda.memcpy_dtoh(back, new)
    assert np.array_equal(back, x)
    cache.release_retired()
    new.free()


def test_the_resolution_floor_is_measured(session):
    f = trials.measure_floor(session, Harness(Settings(trials=3)))
    assert f["trials"] == 3 and f["timer"] == "cuda_event_queued"
    assert 0 < f["empty_s"] < 20e-6 and 0 < f["tiny_s"] < 20e-6
    assert math.isfinite(f["floor_s"]) and 0 <= f["floor_s"] < 1e-6


def test_a_small_grid_in_three_trials(session, tmp_path):
    config = cfg.validate({
        "measurement": {"warmup": 1, "min_samples": 5, "max_samples": 60, "budget_s": 0.1,
                        "trials": 3},
        "telemetry": {"nvidia_smi": False, "nvml": False},
        "experiments": {"vector_add": {"sizes": [50000, 1 << 22], "threads": [256],
                                          "probe_blocks": []}}})
    m = runner.run_experiment(config, "vector_add", tmp_path)
    assert m["counts"]["ok"] == 2 and math.isfinite(m["floor"]["floor_s"])
    for rec in results.iter_records(tmp_path / "raw"):
        t = rec["timing"]
        assert [x["moved"] for x in t["trials"]] == [0, 3, 3]  # a, b and c moved
        assert [x["checks_reused"] for x in t["trials"]] == [0, 1, 1]
        assert math.isfinite(t["trial_spread"]) and rec["floor"] == m["floor"]
