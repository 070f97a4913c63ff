"""The interconnect lesson (links between GPUs) without a GPU: its grid for 0, 1, 2, 4 and 8
GPUs, what it says on a machine of one GPU or none (a real job of the runner, GPUs from
CUDALAB_TEST_GPUS), its claims and course rows on the two H200s' links, and its matrix
figure for 2, 4 and 8 GPUs. The copies themselves run on a machine of 2+ GPUs
(tests/gpu/test_interconnect_gpu.py)."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest

from cudalab import claims, course, figcheck, results
from cudalab import config as cfg
from cudalab.experiments import REGISTRY
from cudalab.experiments.interconnect import spec
from cudalab.experiments.lesson import State
from cudalab.gpu_slots import TEST_GPUS_ENV

ROOT = Path(__file__).resolve().parent.parent
REF = ROOT / "reports" / "reference" / "interconnect-2xH200-2026-11-27" / "results.csv"
EXP = REGISTRY["interconnect"]


def gpus_env(n: int) -> str:
    return json.dumps([{"index": i, "uuid": f"GPU-{i:08d}-aaaa", "pci_bus_id":
                        f"00000000:{16 + i:02X}:00.0", "name": "NVIDIA H100"} for i in range(n)])


def config(**block) -> dict:
    c = cfg.load(ROOT / "config.yaml")
    c["experiments"] = {"interconnect": {**c["experiments"]["interconnect"], "enabled": True,
                                         **block}}
    return cfg.validate(c)


@pytest.mark.parametrize(("n", "pairs"), [(0, 0), (1, 0), (2, 2), (4, 12), (8, 56)])
def test_the_grid_is_every_ordered_pair_of_the_machines_gpus(monkeypatch, n, pairs):
    monkeypatch.setenv(TEST_GPUS_ENV, gpus_env(n))
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    pts = EXP.grid(config())
    assert pts[0].variant == "topology" and not pts[0].gpu and pts[0].params == {"gpus": n}
    gpu = pts[1:]
    assert len(gpu) == 5 * pairs and all(p.gpu for p in gpu)
    assert len({p.point_id for p in pts}) == len(pts)
    if pairs:
        assert {(p.params["src"], p.params["dst"]) for p in gpu} == {
            (s, d) for s in range(n) for d in range(n) if s != d}


def test_the_config_restricts_the_gpus_and_their_number(monkeypatch):
    monkeypatch.setenv(TEST_GPUS_ENV, gpus_env(8))
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    c = config(modes=["peer"])
    c["gpus"] = [2, 5]
    assert [(p.params["src"], p.params["dst"]) for p in EXP.grid(c)[1:]] == [(2, 5), (5, 2)]
    assert len(EXP.grid(config(max_gpus=3, modes=["peer"]))) == 1 + 6


def test_a_bad_block_is_named():
    c = cfg.load(ROOT / "config.yaml")
    c["experiments"]["interconnect"] = {"modes": ["peer", "teleport"]}
    with pytest.raises(cfg.ConfigError, match="interconnect.*modes"):
        cfg.validate(c)


def _job(tmp_path: Path, n: int) -> pd.DataFrame:
    """The lesson's job on a machine of n GPUs as NVML would list them (no GPU here)."""
    conf = tmp_path / "c.json"
    conf.write_text(json.dumps(config()))
    env = {**os.environ, TEST_GPUS_ENV: gpus_env(n), "PYTHONPATH": str(ROOT)}
    env.pop("CUDA_VISIBLE_DEVICES", None)
    r = subprocess.run([sys.executable, "-m", "cudalab.cli", "measure", "interconnect",
                        "--config", str(conf), "--results", str(tmp_path)], env=env,
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    return results.build_table(results.iter_records(tmp_path / "raw"))


@pytest.mark.parametrize(("n", "state", "why"), [
    (1, State.NOT_APPLICABLE, "not applicable: this machine has 1 GPU"),
    (0, State.NOT_MEASURED, "not measured: no GPU here")])
def test_one_gpu_or_none_says_why_for_every_claim(tmp_path, n, state, why):
    df = _job(tmp_path, n)
    assert list(df["variant"]) == ["topology"] and df["status"].iloc[0] == "ok"
    got = claims.evaluate("interconnect", df)
    assert len(got) == len(EXP.lesson.claims)
    assert all(c.state is state and c.evidence == why for c in got), got


@pytest.fixture(scope="module")
def ref() -> pd.DataFrame:
    return results.read_table(REF)


def test_two_h200s_joined_by_nvlink_show_every_claim(ref):
    got = {c.key: c for c in claims.evaluate("interconnect", ref)}
    assert all(c.state is State.SEEN for c in got.values()), got
    assert "391 GB/s against 38.2 GB/s" in got["peer_beats_no_peer"].evidence
    assert "of 450 GB/s per direction in theory" in got["near_link_spec"].evidence


def test_a_pcie_machine_has_no_nvlink_claim_and_no_nvlink_course_row(ref):
    pcie = ref.copy()
    pcie["m_link"] = pcie["m_link"].where(pcie["m_link"].isna(), "SYS")
    pcie["m_link_kind"] = pcie["m_link_kind"].where(pcie["m_link_kind"].isna(), "PCIe")
    got = {c.key: c for c in claims.evaluate("interconnect", pcie)}
    assert got["nvlink_reaches_course"].state is State.NOT_APPLICABLE
    row = next(r for r in course.course_table(pcie) if "NVLink" in r["lesson"])
    assert row["this"] is None and row["verdict"]["state"] == course.NOT_MEASURED


def test_no_peer_access_is_not_applicable_not_a_failure(ref):
    d = ref.copy()
    peerish = d["variant"].isin(["peer", "bidirectional", "remote_read"])
    d.loc[peerish, "status"] = "skipped"
    got = {c.key: c for c in claims.evaluate("interconnect", d)}
    assert got["peer_beats_no_peer"].state is State.NOT_APPLICABLE
    assert "no pair of GPUs here has peer access" in got["peer_beats_no_peer"].evidence


def test_the_course_rows_beside_this_machine(ref):
    rows = {r["lesson"]: r for r in course.course_table(ref) if r["experiment"] == "interconnect"}
    nv, host = rows["multi-GPU: NVLink between two GPUs"], rows["multi-GPU: the host link"]
    assert nv["course"] == 300 and nv["this"] == pytest.approx(388.8, abs=0.1)
    assert host["this"] == pytest.approx(27.6, abs=0.1)
    assert host["why"]["kind"] == "claim" and host["why"]["state"] == "seen"


def _many(n: int) -> pd.DataFrame:
    """The reference's rows repeated for n GPUs (every pair as 0 -> 1 measured)."""
    base = spec.links_frame(results.read_table(REF))
    rows = []
    for s in range(n):
        for d in range(n):
            if s != d:
                one = base[(base["src"] == 0) & (base["dst"] == 1)]
                rows.append(one.assign(src=s, dst=d))
    return pd.concat(rows, ignore_index=True)


@pytest.mark.parametrize("n", [2, 4, 8])
def test_the_matrix_has_one_cell_per_pair_labels_and_units(n):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from cudalab import links

    fig = links.matrix_figure(_many(n), links.MODES, "Bandwidth between GPUs (GB/s)")
    try:
        panels = [ax for ax in fig.axes if ax.get_visible() and ax.get_title()]
        assert len(panels) == 5
        for ax in panels:
            assert ax.get_xlabel() == "destination GPU" and ax.get_ylabel() == "source GPU"
            assert [t.get_text() for t in ax.get_xticklabels()] == [str(i) for i in range(n)]
            numbers = [t for t in ax.texts if t.get_text()]
            assert len(numbers) == n * (n - 1), "one number per pair, none on the diagonal"
        assert any(ax.get_ylabel() == "GB/s" for ax in fig.axes), "the colour bar's unit"
        assert fig._suptitle.get_text() == "Bandwidth between GPUs (GB/s)"
        assert not figcheck.problems(fig), figcheck.problems(fig)
    finally:
        plt.close(fig)


def test_the_lessons_figure_and_tables_from_its_rows(ref):
    import matplotlib.pyplot as plt

    fig = EXP.plot("matrix", ref)
    try:
        assert "NVIDIA H200" in fig._suptitle.get_text()
        assert "256 MiB per copy" in fig._suptitle.get_text()
    finally:
        plt.close(fig)
    tables = {t["title"]: t["html"] for t in EXP.tables(ref)}
    assert "NV18" in tables["nvidia-smi topo -m"]
    assert "NVLink (18 links)" in tables["The link of each pair (nvidia-smi topo -m)"]
    assert "450 GB/s" in tables["The link of each pair (nvidia-smi topo -m)"]


def test_link_specs():
    assert spec.nvlink_gbps("NV18", "9.0") == 450 and spec.nvlink_gbps("NV12", "8.0") == 300
    assert spec.nvlink_gbps("NV18", "10.0") == 900 and math.isnan(spec.nvlink_gbps("SYS", "9.0"))
    m = spec.metrics("SYS", "9.0", "host_staged", False, [63.0, 31.5])
    assert m["link_kind"] == "PCIe" and m["path_spec_gbps"] == pytest.approx(31.5 / 2)
    assert spec.metrics("NV4", "7.0", "bidirectional", True, [None, None])["path_spec_gbps"] \
        == 200
