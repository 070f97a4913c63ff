"""The build cache (cudalab/build_cache.py), static analysis' parallel builds through it
(builds.Builder), its target default (archs.py) and the plan's estimate (estimate.py)."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import pytest

from cudalab import build_cache
from cudalab.experiments import static_analysis as sa
from cudalab.experiments.static_analysis import archs as targets
from cudalab.experiments.static_analysis import builds, estimate
from cudalab.resources import CUDA_DIR

NVCC = sa.find_nvcc("nvcc")
needs_nvcc = pytest.mark.skipif(NVCC is None, reason="needs nvcc (the CUDA toolkit)")

KERNEL = '''#include "scale.h"
extern "C" __global__ void scale(float* p, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) p[i] *= FACTOR;
}
'''


@pytest.fixture(autouse=True)
def _isolated(monkeypatch, tmp_path):
    """No test reads this machine's GPUs or writes the user's build cache."""
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")
    monkeypatch.setenv(build_cache.ENV, str(tmp_path / "cache"))
    monkeypatch.setenv(estimate.LOAD_ENV, "0")
    targets.visible_gpu_archs.cache_clear()
    yield
    targets.visible_gpu_archs.cache_clear()


@pytest.fixture
def kernels(tmp_path) -> Path:
    """A kernel folder of one file that includes a header of its own."""
    d = tmp_path / "cuda"
    d.mkdir()
    (d / "scale.cu").write_text(KERNEL)
    (d / "scale.h").write_text("#define FACTOR 2.0f\n")
    return d


def _builder(kernels: Path, nvcc: str = NVCC) -> builds.Builder:
    return builds.Builder(nvcc, 120, build_cache.BuildCache(build_cache.root()), kernels)


# -- where it lives ---------------------------------------------------------------------------
def test_root_follows_the_environment(monkeypatch, tmp_path):
    monkeypatch.delenv(build_cache.ENV)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert build_cache.root() == tmp_path / "xdg" / "cudalab" / "builds"
    monkeypatch.delenv("XDG_CACHE_HOME")
    assert build_cache.root() == Path.home() / ".cache" / "cudalab" / "builds"
    monkeypatch.setenv(build_cache.ENV, str(tmp_path / "elsewhere"))
    assert build_cache.root() == tmp_path / "elsewhere"
    assert build_cache.root(enabled=False) is None  # the config's cache: false
    for off in ("off", "OFF", "0", "false"):
        monkeypatch.setenv(build_cache.ENV, off)
        assert build_cache.root() is None


# -- hits, misses and what invalidates ---------------------------------------------------------
@needs_nvcc
def test_hit_after_a_miss_and_invalidation_by_source_header_and_flags(kernels, tmp_path):
    need = ("scale.cu", "", "sm_90")
    first = _builder(kernels).build(need)
    assert not first.cached and first.report["scale"]["registers"] > 0 and first.seconds > 0
    entries = list((tmp_path / "cache").glob("??/*.json"))
    assert len(entries) == 1
    entry = json.loads(entries[0].read_text())
    assert (entry["file"], entry["flags"], entry["arch"]) == need
    # a new job (a new Builder): read, not compiled, the same report
    again = _builder(kernels).build(need)
    assert again.cached and again.report == first.report and again.key == first.key
    # another target, other flags: other keys
    assert not _builder(kernels).build(("scale.cu", "", "sm_80")).cached
    assert not _builder(kernels).build(("scale.cu", "FAST", "sm_90")).cached
    # the header it includes changes: a miss, though scale.cu's bytes did not change
    (kernels / "scale.h").write_text("#define FACTOR 3.0f\n")
    assert not _builder(kernels).build(need).cached
    # the source changes: a miss
    (kernels / "scale.cu").write_text(KERNEL.replace("*=", "+="))
    changed = _builder(kernels).build(need)
    assert not changed.cached and changed.key != first.key


@needs_nvcc
def test_another_toolkit_is_a_miss(kernels, tmp_path):
    need = ("scale.cu", "", "sm_90")
    assert not _builder(kernels).build(need).cached
    assert _builder(kernels).build(need).cached
    # the same compiler behind another nvcc (another path: another toolkit as far as the
    # cache can tell without running it), then that nvcc replaced in place
    other = tmp_path / "bin" / "nvcc"
    other.parent.mkdir()
    other.write_text(f"#!/bin/sh\nexec {NVCC} \"$@\"\n")
    other.chmod(0o755)
    assert not _builder(kernels, str(other)).build(need).cached
    assert _builder(kernels, str(other)).build(need).cached
    other.write_text(f"#!/bin/sh\n# upgraded\nexec {NVCC} \"$@\"\n")
    os.utime(other, ns=(time.time_ns(), time.time_ns() + 10**9))
    assert not _builder(kernels, str(other)).build(need).cached


def test_toolkit_id_reads_files_and_runs_nothing(tmp_path):
    nvcc = tmp_path / "cuda" / "bin" / "nvcc"
    nvcc.parent.mkdir(parents=True)
    nvcc.write_text("#!/bin/sh\nexit 1\n")
    (tmp_path / "cuda" / "version.json").write_text('{"cuda": "13.0"}')
    before = build_cache.toolkit_id(str(nvcc))
    assert str(nvcc) in before and "version.json" in before
    (tmp_path / "cuda" / "version.json").write_text('{"cuda": "13.1.0"}')
    assert build_cache.toolkit_id(str(nvcc)) != before


@needs_nvcc
def test_a_failed_build_is_raised_and_never_cached(kernels, tmp_path):
    (kernels / "scale.cu").write_text(KERNEL.replace("FACTOR", "UNDEFINED_NAME"))
    b = _builder(kernels)
    with pytest.raises(sa.CompileError, match="UNDEFINED_NAME"):
        b.build(("scale.cu", "", "sm_90"))
    with pytest.raises(sa.CompileError):  # every point that needs it says so
        b.build(("scale.cu", "", "sm_90"))
    assert not list((tmp_path / "cache").glob("??/*.json"))


def test_damaged_entries_are_misses_and_the_folder_is_bounded(tmp_path):
    cache = build_cache.BuildCache(tmp_path / "c", max_entries=3)
    report = {"k": {"registers": 8}}
    keys = [build_cache.build_key(f"src{i}".encode(), ["-O3"], "sm_90", "tk") for i in range(5)]
    for i, key in enumerate(keys):
        cache.put(key, build_cache.Build(report, 0.5 + i, False, key), file="f.cu", flags="",
                  arch=f"sm_{80 + i}")
        os.utime(cache._path(key), (1000 + i, 1000 + i))  # written in this order
    left = sorted(p.stem for p in cache.entries())
    assert left == sorted(keys[2:])  # the two oldest went
    got = cache.get(keys[4])
    assert got is not None and got.cached and got.report == report and got.seconds == 4.5
    cache._path(keys[4]).write_text('{"report": {"k": ')  # cut short (not via atomic_path)
    assert cache.get(keys[4]) is None
    cache._path(keys[3]).write_text('{"report": [1, 2], "seconds": 1}')  # not a report
    assert cache.get(keys[3]) is None
    assert not list((tmp_path / "c").rglob("*.tmp"))  # the atomic writer left no temp file
    off = build_cache.BuildCache(None)
    off.put(keys[0], build_cache.Build(report, 1.0, False, keys[0]))
    assert off.get(keys[0]) is None and off.entries() == []


# -- parallel builds give what one build at a time gives ---------------------------------------
@needs_nvcc
def test_prefetched_targets_give_the_rows_of_separate_builds(tmp_path):
    wanted = [("occupancy/occupancy.cu", "LIVE=32", a) for a in ("sm_75", "sm_80", "sm_90")]
    b = builds.Builder(NVCC, 120, build_cache.BuildCache(None))
    b.prefetch(wanted)
    for need in wanted:
        alone = sa.compile_report(NVCC, CUDA_DIR / need[0], need[1], need[2])
        assert b.build(need).report == alone, need
    assert all(b.build(n).report["vec_mul_regs"]["registers"] > 0 for n in wanted)


# -- which targets by default ------------------------------------------------------------------
def test_auto_is_the_visible_gpus_else_the_documented_fallback():
    assert targets.resolve("auto", gpus=()) == ["sm_90"]
    assert targets.resolve("auto", gpus=("sm_80",)) == ["sm_80"]
    assert targets.resolve("auto", gpus=("sm_120", "sm_86")) == ["sm_86", "sm_120"]
    assert targets.resolve("auto", gpus=("sm_999",)) == ["sm_90"]  # unknown: the fallback
    assert targets.resolve(["sm_90", "sm_75"]) == ["sm_90", "sm_75"]
    assert targets.resolve("all", ["sm_75", "sm_90", "sm_80", "compute_90a"]) == [
        "sm_75", "sm_80", "sm_90"]
    assert "sm_120" in targets.resolve("all") and "sm_70" not in targets.resolve("all")
    # CUDA_VISIBLE_DEVICES="" (the fixture) hides the GPUs from NVML's reading as from CUDA
    assert targets.visible_gpu_archs() == ()
    assert sa.resolved_archs({"archs": "auto"}) == ["sm_90"]


@needs_nvcc
def test_all_asks_the_configured_nvcc():
    got = sa.resolved_archs({"archs": "all", "nvcc": "nvcc"})
    assert got == [a for a in sa.supported_archs(NVCC) if a in sa.ARCHS]
    assert "sm_75" in got and "sm_90" in got


def test_archs_config_values():
    from cudalab import config as cfg

    def block(**kw):
        return cfg.validate({"experiments": {"static_analysis": kw}})["experiments"][
            "static_analysis"]

    assert block()["archs"] == "auto" and block(archs="all")["archs"] == "all"
    assert block(archs=["sm_90"])["archs"] == ["sm_90"]
    for bad in ("sm_90", "newest", []):
        with pytest.raises(cfg.ConfigError, match=r"experiments\.static_analysis\.archs"):
            block(archs=bad)
    with pytest.raises(cfg.ConfigError, match=r"experiments\.static_analysis\.cache"):
        block(cache="yes")


# -- the estimate ------------------------------------------------------------------------------
def test_makespan_runs_the_longest_first_on_the_free_worker():
    assert estimate.makespan([], 2) == 0
    assert estimate.makespan([5.0], 4) == 5.0
    assert estimate.makespan([1.0] * 10, 2) == 5.0
    assert estimate.makespan([23.0, 10.0, 10.0, 4.0, 1.0, 1.0], 2) == 25.0  # 23+1+1 | 10+10+4
    assert estimate.makespan([3.0, 3.0, 2.0, 2.0, 2.0], 2) == 7.0


@needs_nvcc
def test_estimate_reads_this_machines_build_times(kernels):
    need = ("scale.cu", "", "sm_90")
    todo = [need, ("scale.cu", "", "sm_80"), ("other.cu", "", "sm_90")]

    def guess(cache_on: bool = True) -> list[float]:
        return estimate.build_seconds(todo[:2], NVCC, cache_on, kernels) + \
            estimate.build_seconds(todo[2:], NVCC, cache_on)

    # nothing measured yet: the documented default per build
    assert guess() == [builds.DEFAULT_BUILD_S] * 3
    built = _builder(kernels).build(need)
    # cached: a read; the same file for another target: that file's measured mean
    assert guess() == [builds.HIT_S, pytest.approx(built.seconds, abs=1e-3),
                       builds.DEFAULT_BUILD_S]
    # the header changes: no longer cached, and the last build of that need is the guess
    (kernels / "scale.h").write_text("#define FACTOR 4.0f\n")
    assert guess()[0] == pytest.approx(built.seconds, abs=1e-3)
    assert guess(cache_on=False) == [builds.DEFAULT_BUILD_S] * 3  # no cache: no timings
    assert estimate.build_seconds(todo, None, True) == [0.0] * 3  # no nvcc: fails at once


def test_job_estimate_and_the_plan_line(monkeypatch):
    from cudalab import config as cfg
    from cudalab import guards
    from cudalab.experiments import REGISTRY

    monkeypatch.setenv(build_cache.ENV, "off")  # nothing measured: the documented defaults
    config = cfg.validate(
        {"experiments": {"static_analysis": {
                                "files": ["vector_add/vector_add.cu"]}}})
    pts = REGISTRY["static_analysis"].grid(config)
    assert len(pts) == 1  # one kernel x sm_90 (auto without a GPU)
    idle = estimate.JOB_START_S + builds.DEFAULT_BUILD_S + estimate.POINT_S
    if NVCC is not None:
        got = estimate.job_seconds(pts, NVCC, True, n_workers=2, load=0.0)
        assert got == pytest.approx(idle)
        # 3 other runnable threads beside its one nvcc on 2 cores: twice as long
        assert estimate.job_seconds(pts, NVCC, True, n_workers=2, load=3.0) == \
            pytest.approx(2 * idle)
        assert REGISTRY["static_analysis"].estimate_seconds(config, pts) >= idle
    lines = guards.plan_estimate(config)
    assert "static_analysis about" in lines[0] and "build times" in lines[0]
    assert any("here, without a GPU" in x for x in lines)


@needs_nvcc
def test_the_job_records_whether_a_row_came_from_the_cache(tmp_path):
    from cudalab import config as cfg
    from cudalab import results
    from cudalab.runner import run_experiment

    config = cfg.validate({"telemetry": {"nvidia_smi": False, "nvml": False},
                           "experiments": {"static_analysis": {
                                "files": ["vector_add/vector_add.cu"]}}})
    run_experiment(config, "static_analysis", tmp_path / "first")
    run_experiment(config, "static_analysis", tmp_path / "second")
    first, second = (results.build_table(list(results.iter_records(tmp_path / r / "raw")))
                     for r in ("first", "second"))
    assert len(first) == len(second) == 1
    assert not first["m_build_cached"].astype(bool).any()
    assert second["m_build_cached"].astype(bool).all()
    cols = ["point_id", "m_registers", "m_occupancy_256", "m_max_block_size"]
    assert first[cols].sort_values("point_id").reset_index(drop=True).equals(
        second[cols].sort_values("point_id").reset_index(drop=True))
    recs = list(results.iter_records(tmp_path / "second" / "raw"))
    assert all(r["extra"]["build"]["cached"] and len(r["extra"]["build"]["key"]) == 16
               for r in recs)


def test_the_plan_warns_when_the_machine_is_busier_than_its_cores():
    from cudalab import guards

    assert guards.load_note(1.5, 2) == ""
    assert "counts the load now, 9.0 on 2 cores" in guards.load_note(9.0, 2)


def test_the_load_can_be_pinned(monkeypatch):
    monkeypatch.setenv(estimate.LOAD_ENV, "3.5")
    assert estimate.load_now() == 3.5
    monkeypatch.setenv(estimate.LOAD_ENV, "busy")  # not a number: no load assumed
    assert estimate.load_now() == 0.0


def test_slowdown_shares_the_cores_with_the_load():
    assert estimate.slowdown(0.0, 2, 2) == 1.0  # an idle machine: each thread its core
    assert estimate.slowdown(0.5, 1, 2) == 1.0
    assert estimate.slowdown(3.0, 2, 2) == 2.5  # 5 runnable on 2 cores
    assert estimate.slowdown(9.0, 1, 16) == 1.0



def test_a_hung_nvcc_is_stopped_at_the_timeout(tmp_path):
    fake = tmp_path / "nvcc"
    fake.write_text("#!/bin/sh\nsleep 30\n")
    fake.chmod(0o755)
    start = time.monotonic()
    # a sleeping build uses no CPU: the wall clock stops it, at WALL_FACTOR x timeout_s
    with pytest.raises(sa.CompileError, match="longer than 10 s of wall time"):
        sa.compile_report(str(fake), CUDA_DIR / "vector_add/vector_add.cu", "", "sm_90",
                          timeout_s=1)
    assert time.monotonic() - start < 20


def test_another_gpu_reruns_a_finished_auto_job(monkeypatch):
    from cudalab import config as cfg
    from cudalab.runner import job_fingerprint

    auto = cfg.validate({"experiments": {"static_analysis": {}}})
    listed = cfg.validate({"experiments": {"static_analysis": {"archs": ["sm_90"]}}})
    here = job_fingerprint(auto, "static_analysis")
    assert job_fingerprint(listed, "static_analysis") == job_fingerprint(listed,
                                                                         "static_analysis")
    with monkeypatch.context() as m:  # the same config where NVML sees an A100: other
        m.setattr(targets, "visible_gpu_archs", lambda: ("sm_80",))  # targets, so it reruns
        assert job_fingerprint(auto, "static_analysis") != here
        m.setattr(targets, "visible_gpu_archs", lambda: ("sm_90",))  # an H100: sm_90 too
        assert job_fingerprint(auto, "static_analysis") == here

