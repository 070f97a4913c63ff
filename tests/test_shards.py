"""A lesson's grid split over the GPUs of a local run (cudalab/shards.py): the split itself
(deterministic, complete, disjoint, balanced), how many shards a lesson gets, the shard jobs
through the real run_experiment, the merged manifest and what reads it (the table's GPUs,
the telemetry jobs, a shard's own rerun reasons)."""

from __future__ import annotations

import json
import random

import pytest

from cudalab import cli, results, runner, telemetry_report
from cudalab import config as cfg
from cudalab.experiments import REGISTRY
from cudalab.experiments.base import Check, Experiment, Point, Result
from cudalab.harness import WallTimer
from cudalab.shards import (
    MIN_POINTS_PER_SHARD,
    Shard,
    ShardError,
    all_shards,
    estimate,
    merge,
    points_of,
    shard_count,
    split,
)


def _default_grids() -> dict[str, list[Point]]:
    config = cfg.from_files(["config.yaml"], {})
    cfg.validate(config, source="config.yaml", notes=[])
    return {e: REGISTRY[e].grid(config) for e in cfg.enabled_experiments(config)}


GRIDS = _default_grids()


@pytest.mark.parametrize("name", ["matmul", "occupancy", "vector_add", "transfer"])
@pytest.mark.parametrize("k", [1, 2, 3, 4, 8])
def test_the_split_is_complete_disjoint_and_deterministic(name, k):
    grid = GRIDS[name]
    parts = split(grid, k)
    ids = [p.point_id for s in parts for p in s]
    assert len(parts) == k
    assert sorted(ids) == sorted(p.point_id for p in grid), "every point, once"
    assert len(set(ids)) == len(ids), "no point in two shards"
    shuffled = random.Random(k).sample(grid, len(grid))
    again = split(shuffled, k)
    assert [{p.point_id for p in s} for s in again] == [{p.point_id for p in s} for s in parts], \
        "the shards depend on the points, not on the order they come in"
    order = [p.point_id for p in grid]
    for s in parts:  # each shard walks its points in grid order
        assert [p.point_id for p in s] == sorted((p.point_id for p in s), key=order.index)
    assert [points_of(grid, sh) for sh in all_shards(k)] == parts


@pytest.mark.parametrize("name", ["matmul", "occupancy", "coalescing"])
@pytest.mark.parametrize("k", [2, 4, 8])
def test_the_split_is_balanced_in_points_and_in_estimated_work(name, k):
    grid = GRIDS[name]
    parts = split(grid, k)
    sizes = [len(s) for s in parts]
    assert max(sizes) - min(sizes) <= 1, sizes
    work = [sum(estimate(p) for p in s) for s in parts]
    assert max(work) - min(work) <= max(estimate(p) for p in grid), work
    # the k largest points go to k different shards (never two big ones on one GPU)
    largest = sorted(grid, key=lambda p: (-estimate(p), p.point_id))[:k]
    homes = {i for i, s in enumerate(parts) for p in s if p in largest}
    assert len(homes) == k


def test_matmul_shards_each_get_small_and_large_sizes():
    parts = split(GRIDS["matmul"], 4)
    biggest = max(estimate(p) for p in GRIDS["matmul"])
    for s in parts:
        w = sorted(estimate(p) for p in s)
        assert w[0] < biggest / 100 and w[-1] > biggest / 100, "each shard: small and large"


def test_estimate_multiplies_numeric_parameters_only():
    assert estimate(Point("e", "v", {"m": 4, "k": 2, "n": 8})) == 64
    assert estimate(Point("e", "v", {"shape": [4, 4], "name": "x", "on": True})) == 16
    assert estimate(Point("e", "v", {})) == 1


def test_how_many_shards_a_lesson_gets():
    big = GRIDS["matmul"]  # 185 points
    assert shard_count(big, gpus=1, max_shards=8) == 1, "one GPU: nothing changes"
    assert shard_count(big, gpus=4, max_shards=8) == 4
    assert shard_count(big, gpus=8, max_shards=3) == 3
    assert shard_count(big, gpus=4, max_shards=1) == 1, "max_shards: 1 turns it off"
    assert shard_count(big, gpus=4, max_shards=8, all_gpus=True) == 1
    assert shard_count(GRIDS["static_analysis"], gpus=4, max_shards=8) == 1, "no GPU point"
    assert shard_count(GRIDS["device_query"], gpus=4, max_shards=8) == 1
    small = GRIDS["vector_add"][:2 * MIN_POINTS_PER_SHARD - 1]
    assert shard_count(small, gpus=4, max_shards=8) == 1, "too few points for two shards"
    assert shard_count(GRIDS["vector_add"][:3 * MIN_POINTS_PER_SHARD], 8, 8) == 3


@pytest.mark.parametrize("text", ["0of2", "3of2", "x", "1of", "-1/2", "1of1000"])
def test_a_bad_shard_is_refused_with_what_is_allowed(text):
    with pytest.raises(ShardError, match=r"allowed: i/k or iofk"):
        Shard.parse(text)
    assert Shard.parse("2/4") == Shard.parse("2of4") == Shard(2, 4)
    assert Shard(2, 4).manifest == "_shard-2of4.json"


def test_max_shards_is_validated_with_a_clear_error():
    for bad, why in [(0, "out of range; allowed: >= 1 and <= 64"), ("two", "wrong type")]:
        config = cfg.from_files(["config.yaml"], {"max_shards": bad})
        with pytest.raises(cfg.ConfigError, match=f"max_shards: .*{why}"):
            cfg.validate(config, source="config.yaml", notes=[])


# -- shard jobs through the real runner (a CPU-only lesson) ---------------------------------
class Many(Experiment):
    """20 CPU points of growing size."""

    name = "many"
    schema = {"type": "object"}

    def points(self, block):
        return [Point(self.name, "cpu", {"n": 2 ** i}, gpu=False) for i in range(20)]

    def measure(self, ctx, point):
        t = ctx.harness.measure(lambda: None, WallTimer())
        return Result(t, flops=1.0, check=Check(0.0, 0.5, "abs"))


@pytest.fixture
def many():
    REGISTRY["many"] = Many()
    yield REGISTRY["many"]
    REGISTRY.pop("many")


def _config():
    return cfg.validate({"measurement": {"min_samples": 3, "budget_s": 0.01, "trials": 1},
                         "experiments": {"many": {}}})


def _run_shards(tmp_path, k=3):
    return [runner.run_experiment(_config(), "many", tmp_path, s) for s in all_shards(k)]


def test_shard_jobs_measure_their_points_and_merge_into_one_lesson(many, tmp_path):
    manifests = _run_shards(tmp_path)
    raw = tmp_path / "raw" / "many"
    assert not (raw / "_manifest.json").exists(), "a shard never writes the lesson's manifest"
    for m, s in zip(manifests, all_shards(3)):
        assert m["shard"] == s.tag and s.tag in m["job_id"]
        assert json.loads((raw / s.manifest).read_text())["points"] == m["points"]
    grid = many.grid(_config())
    merged = merge("many", grid, manifests)
    assert list(merged["points"]) == [p.point_id for p in grid], "grid order"
    assert merged["counts"]["ok"] == 20 and merged["fingerprint"] == manifests[0]["fingerprint"]
    assert [j["job_id"] for j in results.jobs_of(merged)] == [m["job_id"] for m in manifests]
    recs = list(results.iter_records(tmp_path / "raw"))
    assert len(recs) == 20 and {r["job_id"] for r in recs} == {m["job_id"] for m in manifests}


def test_merging_refuses_shards_of_other_settings_or_a_missing_point(many, tmp_path):
    manifests = _run_shards(tmp_path)
    grid = many.grid(_config())
    with pytest.raises(ShardError, match="under other settings"):
        merge("many", grid, [manifests[0], manifests[1] | {"fingerprint": "x"}, manifests[2]])
    with pytest.raises(ShardError, match="lack 6 point"):
        merge("many", grid, manifests[:2])


def test_the_cli_merges_the_shards_and_names_a_missing_one(many, tmp_path, capsys):
    _run_shards(tmp_path)
    conf = tmp_path / "c.json"
    conf.write_text(json.dumps(_config()))
    args = ["merge-shards", "many", "--count", "3", "--config", str(conf),
            "--results", str(tmp_path)]
    assert cli.main(args) == 0
    merged = json.loads((tmp_path / "raw" / "many" / "_manifest.json").read_text())
    assert merged["counts"]["ok"] == 20 and len(merged["shards"]) == 3
    assert cli.main(args[:3] + ["4"] + args[4:]) == 2
    assert "_shard-1of4.json is missing" in capsys.readouterr().err
    assert cli.main(["measure", "many", "--shard", "5of4", "--config", str(conf),
                     "--results", str(tmp_path)]) == 2
    assert "allowed: i/k" in capsys.readouterr().err


def test_a_shard_is_stale_for_its_own_damaged_records_only(many, tmp_path):
    _run_shards(tmp_path, 2)
    first, second = all_shards(2)
    victim = points_of(many.grid(_config()), second)[0]
    (tmp_path / "raw" / "many" / f"{victim.point_id}.json").write_text("{broken")
    assert runner.rerun_reasons(tmp_path, "many", first) == []
    assert "damaged record" in runner.rerun_reasons(tmp_path, "many", second)[0]


def test_a_rerun_of_a_shard_reuses_its_points(many, tmp_path):
    _run_shards(tmp_path, 2)
    again = runner.run_experiment(_config(), "many", tmp_path, Shard(1, 2))
    recs = [results.read_record(tmp_path / "raw" / "many" / f"{p}.json") for p in again["points"]]
    assert all(r["cached"] for r in recs)


# -- what reads the merged manifest -----------------------------------------------------------
def _gpu_job(uuid, shard, points):
    return {"experiment": "mm", "job_id": f"mm-{shard}-t", "shard": shard, "t_start": 1.0,
            "t_end": 2.0, "points": dict.fromkeys(points, "ok"), "fingerprint": "f",
            "counts": {"ok": len(points)}, "provenance": {"gpu_uuid": uuid},
            "telemetry_dir": f"/nowhere/{shard}", "telemetry": {"nvidia_smi": "ok"},
            "ceilings": {"dram_gbs": 1.0}}


def _gpu_record(point, uuid):
    return {"experiment": "mm", "point_id": point, "provenance": {"gpu_uuid": uuid},
            "timing": {"timer": "cuda_event"}, "status": "ok"}


def test_the_table_keeps_the_records_of_every_shards_gpu():
    grid = [Point("mm", "v", {"n": i}) for i in range(4)]
    ids = [p.point_id for p in grid]
    merged = merge("mm", grid, [_gpu_job("GPU-a", "1of2", ids[:2]),
                                _gpu_job("GPU-b", "2of2", ids[2:])])
    recs = [_gpu_record(ids[0], "GPU-a"), _gpu_record(ids[3], "GPU-b"),
            _gpu_record(ids[1], "GPU-old")]
    kept, left = results.select_records(recs, [merged])
    assert [r["point_id"] for r in kept] == [ids[0], ids[3]]
    assert left["other_gpu"] == 1 and left["run_gpus"] == ["GPU-a", "GPU-b"]


def test_telemetry_and_ceilings_see_each_shard_as_a_job(tmp_path):
    from cudalab.ceilings import ceilings_table

    grid = [Point("mm", "v", {"n": i}) for i in range(2)]
    ids = [p.point_id for p in grid]
    merged = merge("mm", grid, [_gpu_job("GPU-a", "1of2", ids[:1]),
                                _gpu_job("GPU-b", "2of2", ids[1:])])
    (tmp_path / "raw" / "mm").mkdir(parents=True)
    (tmp_path / "raw" / "mm" / "_manifest.json").write_text(json.dumps(merged))
    jobs = telemetry_report.load_jobs(tmp_path)
    assert [j["job_id"] for j in jobs] == ["mm-1of2-t", "mm-2of2-t"]
    table = ceilings_table(j for j in results.jobs_of(merged))
    assert list(table["gpu_uuid"]) == ["GPU-a", "GPU-b"]


def test_a_stopped_run_names_the_shards_it_finished(tmp_path):
    from cudalab import interrupts

    raw = tmp_path / "raw" / "mm"
    raw.mkdir(parents=True)
    (raw / "_shard-1of2.json").write_text("{}")
    (raw / "v-n0.json").write_text("{}")
    line = interrupts.stopped_line([("mm", raw)], started=0.0)
    assert "kept: 0 of 1 experiment job(s) finished, 1 shard job(s) of split lessons " \
           "finished, and 1 point record(s)" in line
    assert telemetry_report.job_label({"experiment": "mm", "shard": "1of2"}) == "mm 1of2"
    assert telemetry_report.job_label({"experiment": "mm"}) == "mm"


def test_a_cached_image_that_does_not_load_is_built_again_without_the_cache(monkeypatch,
                                                                             tmp_path):
    """pycuda writes its disk cache in place: a shard that reads an entry another shard is
    still writing loads a truncated image. pycuda cannot run here, so its SourceModule is a
    stand-in that fails the way a truncated cached image does, once."""
    import types

    from cudalab.gpu import GpuSession
    from cudalab.shards import build_lock

    class LogicError(Exception):
        pass

    class CompileError(Exception):
        pass

    calls = []

    def source_module(src, cache_dir=None, **kw):
        calls.append(cache_dir)
        if kw["options"][-1] == "-DBROKEN=1":
            raise CompileError("nvcc failed")
        if cache_dir is None:
            raise LogicError("cuModuleLoadDataEx failed: device kernel image is invalid")
        return "module"

    compiler = types.ModuleType("pycuda.compiler")
    compiler.SourceModule = source_module
    monkeypatch.setitem(__import__("sys").modules, "pycuda.compiler", compiler)
    cuda = types.SimpleNamespace(LogicError=LogicError, RuntimeError=RuntimeError)
    monkeypatch.setenv("XDG_RUNTIME_DIR", str(tmp_path))
    gpu = GpuSession(index=0, cuda=cuda, device=None, context=None, build_lock=build_lock)
    assert gpu.compile("matmul/matmul.cu").module == "module"
    assert calls == [None, False], "once with pycuda's cache, then without"
    assert list(tmp_path.glob("cudalab-gpu-locks-*/build-*.lock")), "a shard's build locks"
    calls.clear()
    with pytest.raises(CompileError):
        gpu.compile("matmul/matmul.cu", defines={"BROKEN": 1})
    assert calls == [None], "a failed build is not built again"


def test_each_shard_walks_its_points_from_its_own_place():
    from cudalab.shards import walk_order

    grid = GRIDS["matmul"]
    firsts = set()
    for sh in all_shards(4):
        mine = points_of(grid, sh)
        walk = walk_order(mine, sh)
        assert sorted(p.point_id for p in walk) == sorted(p.point_id for p in mine)
        firsts.add(walk[0].point_id)
        i = walk.index(mine[0])  # the rest of the grid order, round to the start
        assert walk[i:] + walk[:i] == mine
    assert walk_order(grid, Shard(1, 4)) == list(grid)
    assert len(firsts) == 4


def test_one_build_of_a_kernel_at_a_time_among_the_shards(tmp_path, monkeypatch):
    """Real locks between two threads (flock: one per open file): the second build of a key
    waits for the first; other keys mostly do not (BUILD_LOCKS stripes)."""
    import threading
    import time

    from cudalab.shards import BUILD_LOCKS, build_lock

    monkeypatch.setenv("XDG_RUNTIME_DIR", str(tmp_path))
    held, waited = threading.Event(), []

    def first():
        with build_lock("kernel A"):
            held.set()
            time.sleep(0.4)

    t = threading.Thread(target=first)
    t.start()
    held.wait(5)
    t0 = time.monotonic()
    with build_lock("kernel A"):
        waited.append(time.monotonic() - t0)
    t.join()
    assert waited[0] > 0.25, "the second build of the key waited for the first"
    locks = list((tmp_path / f"cudalab-gpu-locks-{__import__('os').getuid()}").glob("build-*"))
    assert len(locks) == 1 and int(locks[0].stem.split("-")[1]) < BUILD_LOCKS
