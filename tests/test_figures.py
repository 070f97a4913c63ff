"""Every figure, drawn from the H100 reference results, has no text that collides with other
text or leaves the canvas (window extents from matplotlib's renderer), and a width that
reads at the report's width."""

from __future__ import annotations

from pathlib import Path

import cause_data
import pytest

from cudalab import figcheck, figures, results, telemetry_report
from cudalab.experiments import REGISTRY

ROOT = Path(__file__).resolve().parent.parent
REFERENCE = ROOT / "reports" / "reference" / "NVIDIA-H100-80GB-HBM3"
# Widest figure in inches: at 130 dpi it is shown at about 1:1 in the report's 1150 px
# column, so 8 pt text stays 8 pt (the old three-panel matmul figure was 18.6 in).
MAX_WIDTH_IN = 11.5

FIGS = [(name, fig) for name, exp in REGISTRY.items() for fig in exp.lesson.figures]
# Figures of a probe newer than the reference: drawn from the reference plus model rows.
PROBED = {("vector_add", "block_rate"): cause_data.block_rate_run}
# Lessons off in the default grid are drawn from their own reference run (tensor_cores: the
# shipped block with the wgmma rungs, tools/gpu_tensor_cores.sh).
OWN_RUN = {"tensor_cores": REFERENCE / "tensor-cores-2026-11-27" / "results.csv"}
# figures of kernels no reference has run yet (none now): their own tests draw them
AWAITING_A_RUN: set[tuple[str, str]] = set()


@pytest.fixture(scope="module")
def ref():
    figures.setup_style()
    return results.read_table(REFERENCE / "results.csv")


def _check(fig) -> None:
    import matplotlib.pyplot as plt

    try:
        assert figcheck.problems(fig) == []
        assert fig.get_size_inches()[0] <= MAX_WIDTH_IN
    finally:
        plt.close(fig)


@pytest.mark.parametrize("name, fig_name", FIGS, ids=[f"{n}/{f}" for n, f in FIGS])
def test_figure_text_never_collides(ref, name, fig_name):
    if name in OWN_RUN:
        ref = results.read_table(OWN_RUN[name])
    if not (ref["experiment"] == name).any():  # newer than the reference: its own tests draw it
        pytest.skip(f"{name} is not in the reference run")
    ref = PROBED.get((name, fig_name), lambda d: d)(ref)
    fig = REGISTRY[name].plot(fig_name, ref[ref["experiment"] == name])
    if (name, fig_name) in AWAITING_A_RUN:  # its own tests draw it from made-up rows
        assert fig is None, f"{name}/{fig_name} has rows now: take it out of AWAITING_A_RUN"
        pytest.skip(f"no reference has run what {name}/{fig_name} draws")
    assert fig is not None
    _check(fig)


@pytest.mark.slow
def test_telemetry_figures_text_never_collides():
    figures.setup_style()
    df, jobs = telemetry_report._run_samples(REFERENCE)
    gpu_jobs = len(list((REFERENCE / "telemetry").glob("*/nvidia_smi.csv")))
    # a job stopped by the reference run's time box left telemetry but no manifest
    assert 10 <= len(jobs) <= gpu_jobs and len(df) > 1000
    _check(telemetry_report.plot_run(df, jobs))
    for m in jobs:
        smi = telemetry_report.telemetry_dir(REFERENCE, m) / "nvidia_smi.csv"
        fig = telemetry_report.plot_job(smi, m)
        if fig is not None:
            _check(fig)


def test_the_check_finds_collisions_and_clipping():
    """figcheck itself can fail: two labels on one spot, and a title off the canvas."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(4, 3))
    ax.text(0.5, 0.5, "first label", transform=ax.transAxes)
    ax.text(0.52, 0.5, "second label", transform=ax.transAxes)
    ax.set_title("a title much too long for a figure four inches wide, it runs off both sides")
    found = figcheck.problems(fig)
    plt.close(fig)
    assert "'first label' overlaps 'second label'" in found
    assert any("leaves the canvas" in p and p.startswith("'a title") for p in found)
    fig, ax = plt.subplots(figsize=(4, 3))
    ax.set(title="fine", xlabel="x", ylabel="y")
    fig.tight_layout()
    assert figcheck.problems(fig) == []
    plt.close(fig)
