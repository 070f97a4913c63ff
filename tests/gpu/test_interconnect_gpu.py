"""The interconnect lesson on a machine of 2+ GPUs: its job (all GPUs locked and visible)
measures every pair and mode, every copy arrives intact, the claims are judged, the matrix
is drawn, and its peer copy agrees with CuPy's cudaMemcpyPeer measured in the same test.
The job and CuPy run in processes of their own (CuPy's runtime would leave this process's
pycuda context stack wrong for the tests after it)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest
from test_links_gpu import cupy_peer_gbps

from cudalab import claims, results
from cudalab import config as cfg
from cudalab.experiments import REGISTRY
from cudalab.experiments.interconnect import spec
from cudalab.experiments.lesson import State

pytestmark = [pytest.mark.gpu, pytest.mark.multi_gpu(2)]
ROOT = Path(__file__).resolve().parents[2]
SIZE_MIB = 256


def run_lesson(out: Path) -> tuple[pd.DataFrame, dict[str, str], str]:
    """The lesson's job on every GPU of this machine: its table, the env it ran with, its log."""
    c = cfg.load(ROOT / "config.yaml")
    c["experiments"] = {"interconnect": {"size_mib": SIZE_MIB}}
    conf = out / "config.json"
    out.mkdir(parents=True, exist_ok=True)
    conf.write_text(json.dumps(cfg.validate(c)))
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(
        [str(ROOT), os.environ.get("PYTHONPATH", "")]), "XDG_RUNTIME_DIR": str(out)}
    r = subprocess.run([sys.executable, "-m", "cudalab.cli", "measure", "interconnect",
                        "--config", str(conf), "--results", str(out)], env=env,
                       capture_output=True, text=True, timeout=900)
    assert r.returncode == 0, r.stderr[-3000:]
    return results.build_table(results.iter_records(out / "raw")), env, r.stderr


def test_every_pair_every_mode_intact_and_peer_agrees_with_cupy(tmp_path):
    df, env, log = run_lesson(tmp_path / "run")
    pairs = df[df["variant"] != "topology"]
    n = int(df[df["variant"] == "topology"]["m_gpus"].iloc[0])
    assert len(pairs) == 5 * n * (n - 1)
    assert pairs["status"].isin(["ok", "skipped"]).all(), pairs[["point_id", "status", "reason"]]
    assert "measures on GPU 0" in log and "; GPU 1" in log, "the job held every GPU"
    got = {c.key: c for c in claims.evaluate("interconnect", df)}
    assert all(c.state in (State.SEEN, State.NOT_SEEN, State.NOT_APPLICABLE)
               for c in got.values()), got
    import matplotlib

    matplotlib.use("Agg")
    fig = REGISTRY["interconnect"].plot("matrix", df)
    fig.savefig(tmp_path / "matrix.png")
    out = os.environ.get("OUT")
    if out:  # the lead's call keeps the run: figure, table, claims
        fig.savefig(Path(out) / "interconnect_matrix.png", dpi=110)
        df.to_csv(Path(out) / "interconnect_results.csv", index=False)
        (Path(out) / "interconnect_claims.txt").write_text(
            "\n".join(f"{c.state.value}: {c.statement} -- {c.evidence}" for c in got.values()))
    f = spec.links_frame(df)
    for mode, peer in (("peer", True), ("no_peer", False)):
        ours = float(f[(f["src"] == 0) & (f["dst"] == 1) & (f["mode"] == mode)]["gbps"].iloc[0])
        theirs = cupy_peer_gbps(SIZE_MIB << 20, env, peer)
        print(f"interconnect: {mode} 0->1 {ours:.1f} GB/s (cudalab, harness) vs "
              f"{theirs:.1f} GB/s (CuPy memcpyPeer, peer access {'on' if peer else 'off'})")
        assert ours == pytest.approx(theirs, rel=0.15), mode
