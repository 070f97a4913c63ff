"""Checking a config runs no program the config names (cudalab/toolkit.py).

A script planted as experiments.static_analysis.nvcc creates a marker file when run: it must
not run under `cudalab validate`, `cudalab plan` or `snakemake -n` (the Snakefile validates
at parse), whether it sits in a trusted folder (the architectures are still checked, from
the toolkit's version file) or in a world-writable one (refused, naming the folder). A job
refuses to run a toolkit no one but root or the user could have put there, and records the
check in its provenance.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np
import pytest

from cudalab import provenance, toolkit
from cudalab.experiments import REGISTRY
from cudalab.experiments import static_analysis as sa
from cudalab.experiments.base import Point, RunContext
from cudalab.harness import Harness, Settings

ROOT = Path(__file__).resolve().parent.parent
EXP = REGISTRY["static_analysis"]


def _plant(bindir: Path, marker: Path, version: str | None = "12.4.1") -> Path:
    """bin/nvcc that touches `marker` when run, and (optionally) the toolkit's version.json."""
    bindir.mkdir(parents=True)
    nvcc = bindir / "nvcc"
    nvcc.write_text(f"#!/bin/sh\ntouch {marker}\necho compute_90\n")
    nvcc.chmod(0o755)
    if version:
        (bindir.parent / "version.json").write_text(json.dumps(
            {"cuda": {"name": "CUDA SDK", "version": version},
             "cuda_nvcc": {"name": "CUDA NVCC", "version": version}}))
    return nvcc


def _config(folder: Path, nvcc: Path, archs: list[str]) -> Path:
    path = folder / "planted.yaml"
    path.write_text(f"experiments:\n  static_analysis:\n    nvcc: {nvcc}\n"
                    f"    archs: {json.dumps(archs)}\n    files: [vector_add/vector_add.cu]\n")
    return path


def _run(args: list[str], cwd: Path) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    env = {k: v for k, v in env.items() if not k.startswith("SLURM")}
    return subprocess.run([sys.executable, *args], capture_output=True, text=True, cwd=cwd,
                          env=env, timeout=300)


@pytest.fixture
def trusted_dir():
    """A folder only this user can write (pytest's tmp_path is under the world-writable
    /tmp): inside the checkout, removed after."""
    if toolkit.untrusted_reasons(str(ROOT)):
        pytest.skip(f"the checkout {ROOT} is itself in a folder others can write")
    d = Path(tempfile.mkdtemp(prefix=".tmp-trusted-", dir=ROOT))
    yield d
    shutil.rmtree(d, ignore_errors=True)


def test_validate_plan_and_a_dry_run_never_run_a_trusted_planted_nvcc(trusted_dir, tmp_path):
    marker = tmp_path / "ran"
    nvcc = _plant(trusted_dir / "cuda" / "bin", marker)
    good = _config(tmp_path, nvcc, ["sm_80", "sm_90"])
    r = _run(["-m", "cudalab.cli", "validate", str(good)], tmp_path)
    assert r.returncode == 0, r.stderr
    r = _run(["-m", "cudalab.cli", "plan", str(good)], tmp_path)
    assert r.returncode in (0, 1), r.stderr  # 1: a Slurm here that the request does not fit
    r = _run(["-m", "snakemake", "-s", str(ROOT / "Snakefile"), "-d", str(tmp_path / "w"),
              "-c1", "-n", "--configfile", str(good)], tmp_path)
    assert r.returncode == 0, r.stderr[-3000:]
    # the release comes from version.json (12.4): sm_120 is refused without running nvcc
    bad = _config(tmp_path, nvcc, ["sm_90", "sm_120"])
    r = _run(["-m", "cudalab.cli", "validate", str(bad)], tmp_path)
    assert r.returncode == 2
    assert "experiments.static_analysis.archs[1]: 'sm_120' cannot be built by CUDA 12.4" \
        in r.stderr and "allowed with this toolkit: " in r.stderr, r.stderr
    assert not marker.exists()


def test_a_planted_nvcc_in_a_world_writable_folder_is_refused_unrun(tmp_path):
    marker = tmp_path / "ran"
    shared = tmp_path / "shared"
    nvcc = _plant(shared / "cuda" / "bin", marker)
    shared.chmod(0o1777)  # as /tmp is
    cfg = _config(tmp_path, nvcc, ["sm_90"])
    for args in (["-m", "cudalab.cli", "validate", str(cfg)],
                 ["-m", "cudalab.cli", "plan", str(cfg)],
                 ["-m", "snakemake", "-s", str(ROOT / "Snakefile"), "-d", str(tmp_path / "w"),
                  "-c1", "-n", "--configfile", str(cfg)]):
        r = _run(args, tmp_path)
        assert r.returncode != 0
        out = r.stdout + r.stderr
        assert "experiments.static_analysis.nvcc" in out, out[-3000:]
        assert f"{shared} is writable by every user" in out, out[-3000:]
        assert "Traceback" not in out
    assert not marker.exists()


def _ctx(block):
    return RunContext(gpu=None, harness=Harness(Settings()), rng=np.random.default_rng(0),
                      config={}, block=block)


def test_a_job_refuses_a_toolkit_in_a_world_writable_folder(tmp_path):
    """The job checks again (a folder may change after validation): the point fails naming
    the path and why, and the toolkit never runs."""
    marker = tmp_path / "ran"
    nvcc = _plant(tmp_path / "cuda" / "bin", marker)  # under /tmp: world-writable, sticky
    block = {"nvcc": str(nvcc), "archs": ["sm_90"], "files": ["vector_add/vector_add.cu"],
             "variants": {}, "dynamic_smem_bytes": {}, "timeout_s": 30}
    point = Point("static_analysis", "vec_add", {"file": "vector_add/vector_add.cu", "flags": "",
                                                 "arch": "sm_90"}, gpu=False)
    with pytest.raises(sa.CompileError, match=r"refusing to run .*/nvcc: .* is writable by "
                       r"every user .*sticky bit does not help"):
        EXP.measure(_ctx(block), point)
    assert not marker.exists()
    prov = EXP.tool_provenance(block)
    assert prov["toolkit_nvcc"] == str(nvcc)
    assert prov["toolkit_check"].startswith("refused: ") and "writable by every user" in \
        prov["toolkit_check"]


def test_a_toolkit_owned_by_another_user_is_refused(trusted_dir, tmp_path):
    if os.geteuid() != 0:
        pytest.skip("giving a file to another user needs root")
    nvcc = _plant(trusted_dir / "cuda" / "bin", tmp_path / "ran")
    os.chown(nvcc.parent, 4242, -1)
    reasons = toolkit.untrusted_reasons(str(nvcc))
    assert len(reasons) == 1 and reasons[0].startswith(
        f"{nvcc.parent} is owned by uid 4242, neither root nor the user running cudalab")
    # a symlink from a trusted place to it is followed: the real folder is checked too
    link = trusted_dir / "nvcc-link"
    link.symlink_to(nvcc)
    assert any("uid 4242" in r for r in toolkit.untrusted_reasons(str(link)))


def test_a_site_names_the_software_account_its_toolkits_belong_to(trusted_dir, tmp_path,
                                                                   monkeypatch):
    """Toolkits of a software account (spack, apps) run once whoever runs cudalab names that
    account in the environment; a config cannot (it may come from someone else)."""
    if os.geteuid() != 0:
        pytest.skip("giving a file to another user needs root")
    nvcc = _plant(trusted_dir / "cuda" / "bin", tmp_path / "ran")
    os.chown(nvcc.parent, 4242, -1)
    monkeypatch.setenv(toolkit.TRUSTED_OWNERS_ENV, "4242")
    assert toolkit.untrusted_reasons(str(nvcc)) == []
    monkeypatch.setenv(toolkit.TRUSTED_OWNERS_ENV, "nosuchaccount-xyz, 4243")
    assert toolkit.untrusted_reasons(str(nvcc)), "another account is still refused"


def test_a_trusted_toolkit_is_recorded_as_checked(trusted_dir, tmp_path):
    nvcc = _plant(trusted_dir / "cuda" / "bin", tmp_path / "ran")
    assert toolkit.untrusted_reasons(str(nvcc)) == []
    p = provenance.toolkit_provenance(str(nvcc))
    assert p == {"toolkit_nvcc": str(nvcc), "toolkit_check": toolkit.check_result(str(nvcc))}
    assert p["toolkit_check"].startswith("ok: ")
    assert provenance.toolkit_provenance(None)["toolkit_check"] == "not found"


@pytest.mark.parametrize("files, version", [
    ({"version.json": json.dumps({"cuda": {"version": "11.8.0"}})}, (11, 8)),
    ({"version.txt": "CUDA Version 10.2.89\n"}, (10, 2)),
    ({"include/cuda.h": "/* header */\n#define CUDA_VERSION 12040\n"}, (12, 4)),
    ({"version.json": "{not json", "include/cuda.h": "#define CUDA_VERSION 13000\n"}, (13, 0)),
    ({}, None),
])
def test_the_release_is_read_from_the_toolkits_files(tmp_path, files, version):
    root = tmp_path / "cuda"
    (root / "bin").mkdir(parents=True)
    for name, text in files.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_text(text)
    found, where = toolkit.toolkit_version(str(root / "bin" / "nvcc"))
    assert found == version
    assert (str(root) in where)


def test_a_fifo_named_version_json_is_not_waited_on(tmp_path):
    root = tmp_path / "cuda"
    (root / "bin").mkdir(parents=True)
    os.mkfifo(root / "version.json")
    (root / "version.txt").write_text("CUDA Version 11.4.0\n")
    assert toolkit.toolkit_version(str(root / "bin" / "nvcc"))[0] == (11, 4)


def test_the_table_covers_every_schema_arch_and_agrees_with_nvcc_13():
    from cudalab import devicespec

    assert set(devicespec.sm_targets()) <= set(toolkit.KNOWN_ARCHS)
    assert "sm_70" not in toolkit.buildable((13, 0)) and "sm_70" in toolkit.buildable((12, 9))
    assert "sm_120" in toolkit.buildable((12, 8)) and "sm_120" not in toolkit.buildable((12, 6))
    real = sa.find_nvcc("nvcc")
    if real is None:
        return
    version, _ = toolkit.toolkit_version(os.path.realpath(real))
    if version is None:
        return
    listed = set(sa._listed_archs(real))  # a test may run the installed toolkit
    assert set(toolkit.buildable(version)) <= listed


def test_a_wrapper_script_is_read_for_the_toolkit_it_runs(trusted_dir, tmp_path):
    """`exec /opt/cuda/bin/nvcc "$@"` (as /usr/local/bin/nvcc on some images): the version
    is the target's, and the target's folders are checked too."""
    marker = tmp_path / "ran"
    real = _plant(trusted_dir / "cuda-12.6" / "bin", marker, version="12.6.2")
    wrapper = trusted_dir / "bin" / "nvcc"
    wrapper.parent.mkdir()
    wrapper.write_text(f'#!/bin/sh\nexec {real} "$@"\n')
    wrapper.chmod(0o755)
    assert toolkit.toolkit_version(str(wrapper))[0] == (12, 6)
    assert toolkit.untrusted_reasons(str(wrapper)) == []
    shared = tmp_path / "shared" / "cuda" / "bin" / "nvcc"
    shared.parent.mkdir(parents=True)
    shutil.copy(real, shared)
    (tmp_path / "shared").chmod(0o777)
    wrapper.write_text(f"#!/bin/sh\nexec '{shared}' \"$@\"\n")
    assert f"{tmp_path / 'shared'} is writable by every user (mode 777)" in "; ".join(
        toolkit.untrusted_reasons(str(wrapper)))
    assert not marker.exists()


@pytest.mark.skipif(sa.find_nvcc("nvcc") is None, reason="needs nvcc (the CUDA toolkit)")
def test_a_static_analysis_record_names_the_toolkit_and_its_check(tmp_path):
    from cudalab import config as cfg
    from cudalab.runner import run_experiment

    config = cfg.validate({"experiments": {"static_analysis": {
        "files": ["vector_add/vector_add.cu"], "archs": ["sm_90"]}}})
    run_experiment(config, "static_analysis", tmp_path)
    records = [json.loads(p.read_text()) for p in
               (tmp_path / "raw" / "static_analysis").glob("*.json")
               if not p.name.startswith("_")]
    assert records
    for rec in records:
        prov = rec["provenance"]
        assert prov["toolkit_nvcc"] == sa.find_nvcc("nvcc")
        assert prov["toolkit_check"].startswith("ok: "), prov["toolkit_check"]


def test_validate_and_plan_start_only_nvidia_smi_and_sinfo(tmp_path, monkeypatch, capsys):
    """Every program validate and plan start, whatever the config: nvidia-smi (the GPU's
    memory) and sinfo (does the request fit), both by name from PATH."""
    from cudalab import cli, guards

    started: list[str] = []
    real_init = subprocess.Popen.__init__

    def spy(self, args, *a, **kw):
        started.append(os.path.basename(str(args[0] if isinstance(args, list) else args)))
        return real_init(self, args, *a, **kw)

    monkeypatch.setattr(subprocess.Popen, "__init__", spy)
    guards.nvidia_smi_memory.cache_clear()
    cfg = tmp_path / "every.yaml"
    cfg.write_text(
        "experiments:\n  static_analysis: {nvcc: nvcc, archs: [sm_90],\n"
        "    files: [vector_add/vector_add.cu]}\n"
        "  vector_add: {}\n  matmul: {sizes: [64]}\n"
        "profile: {ncu: true}\nslurm: {modules: [cuda/12.4], gpu_model: a100}\n"
        f"exercises: {{submissions: {tmp_path}}}\n")
    for command in ("validate", "plan"):
        try:
            cli.main([command, str(cfg)])
        except SystemExit:
            pass
    capsys.readouterr()
    assert set(started) <= {"nvidia-smi", "sinfo"}, started


def test_a_version_json_nested_past_the_stack_is_no_release(tmp_path):
    root = tmp_path / "cuda"
    (root / "bin").mkdir(parents=True)
    (root / "version.json").write_text("[" * 200_000)
    assert toolkit.toolkit_version(str(root / "bin" / "nvcc"))[0] is None
