"""The first run a new user makes: plain `snakemake` of the shipped config.yaml, on a
machine without a GPU, runs to the end: exit 0, a report, every GPU point named in it as not
measured, and the last screen says how to measure them.

It runs in a copy of the checkout (its tracked and new files, as they are now), exactly as
a user runs it: no --configfile, no --config overrides, profiles/default picked up by
Snakemake. CUDA_VISIBLE_DEVICES='' hides any GPU, so the test means the same on a GPU
machine. About 80 s on 2 cores, with an empty build cache of its own (about 45 s of it the
static analysis' nvcc builds for sm_90).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from cudalab import results

pytestmark = pytest.mark.slow  # a real snakemake of the default grid: minutes
ROOT = Path(__file__).resolve().parent.parent
TIMEOUT_S = 600  # ~80 s on 2 cores; a hang must not hold CI for long


def checkout_files() -> list[str]:
    """The files a checkout of this working tree has: tracked (as edited now) and new ones
    git does not ignore; results/ and .snakemake/ of earlier runs are ignored."""
    out = subprocess.run(["git", "ls-files", "-z", "--cached", "--others",
                          "--exclude-standard"], cwd=ROOT, capture_output=True, check=True)
    names = [n for n in out.stdout.decode().split("\0") if n]
    return [n for n in dict.fromkeys(names) if (ROOT / n).is_file()]


@pytest.fixture(scope="module")
def default_run(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, str, float]:
    if shutil.which("git") is None or not (ROOT / ".git").exists():
        pytest.skip("needs the git checkout (the copy is made from git ls-files)")
    repo = tmp_path_factory.mktemp("checkout")
    for name in checkout_files():
        dst = repo / name
        dst.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(ROOT / name, dst)
    env = {k: v for k, v in os.environ.items() if not k.startswith("SLURM")}
    env["CUDA_VISIBLE_DEVICES"] = ""  # no GPU, even on a GPU machine
    # an empty build cache, as a new user's, and never the user's own
    env["CUDALAB_BUILD_CACHE"] = str(tmp_path_factory.mktemp("build-cache"))
    bindir = str(Path(sys.executable).parent)  # the snakemake of this Python
    env["PATH"] = bindir + os.pathsep + env.get("PATH", "")
    t0 = time.monotonic()
    r = subprocess.run(["snakemake"], cwd=repo, env=env, capture_output=True, text=True,
                       timeout=TIMEOUT_S)
    took = time.monotonic() - t0
    out = r.stdout + r.stderr
    assert r.returncode == 0, f"exit {r.returncode} after {took:.0f} s:\n{out[-6000:]}"
    return repo, out, took


def test_the_default_config_without_a_gpu_ends_with_a_report(default_run) -> None:
    repo, out, took = default_run
    report = repo / "results" / "report.html"
    assert report.is_file(), out[-3000:]
    assert "cudalab: report written to" in out
    assert "Traceback" not in out
    # the last screen: how to measure what this run could not
    assert "GPU point(s) were not measured: no GPU here" in out
    assert "run the same command on a GPU machine" in out
    assert took < TIMEOUT_S


def test_its_report_names_every_not_measured_point(default_run) -> None:
    repo, _, _ = default_run
    df = results.read_table(repo / "results" / "results.csv")
    assert results.check_table(df) == []
    nm = df[df["status"] == "not_measured"]
    assert len(nm) and set(nm["experiment"]) >= {"vector_add", "matmul", "atomics"}
    assert (df.loc[df["status"] != "not_measured", "status"] == "ok").all(), \
        df[df["status"] != "ok"][["point_id", "status", "reason"]].to_string()
    page = (repo / "results" / "report.html").read_text()
    for pid in nm["point_id"]:
        assert pid in page, f"{pid} not named in the report"
    assert 'data-state="not measured"' in page
    # not measured is never "not seen", nor a contradiction of the lesson
    assert 'data-state="not seen"' not in page and 'class="fail"' not in page
    assert "contradicts the lesson:" not in page
    assert "This run contradicts the lesson" not in page


def test_its_report_says_at_the_top_that_no_gpu_was_used(default_run) -> None:
    """A banner under the title; points not measured are never "not ok"; the roofline says
    the run had no GPU (not that its table predates the ceilings); no course row reads
    "measured, not measured"; no template leftovers."""
    repo, _, _ = default_run
    page = (repo / "results" / "report.html").read_text()
    banner = page.index('<div class="banner no-gpu"')
    assert page.index("</header>") < banner < page.index("<nav>")
    assert "No GPU was used for this run" in page[banner:page.index("<nav>")]
    assert "not ok" not in page
    assert "results from before the ceilings step" not in page and "this run had no GPU" in page
    assert "measured, not measured" not in page
    for leftover in ("{{", "}}", "{%", ">None<", ">nan<", "undefined"):
        assert leftover not in page, leftover


def _config_shown(page: str) -> dict:
    import html
    import json

    block = page[page.index("<summary>Configuration of this run</summary>"):]
    return json.loads(html.unescape(block[block.index("<pre>") + 5:block.index("</pre>")]))


def test_a_report_drawn_again_elsewhere_states_the_runs_own_config(default_run,
                                                                   tmp_path) -> None:
    """`cudalab report` run again from another folder, whose config.yaml names another run,
    still states the run's config (results/config.json), as the workflow's report did."""
    import json

    from cudalab import config as cfg

    repo, _, _ = default_run
    res = repo / "results"
    own = json.loads((res / "config.json").read_text())
    assert _config_shown((res / "report.html").read_text()) == cfg.load(res / "config.json")
    (tmp_path / "config.yaml").write_text("run_name: another-run\nexperiments:\n"
                                          "  vector_add: {}\n")
    env = {k: v for k, v in os.environ.items() if not k.startswith("SLURM")}
    out = tmp_path / "again.html"
    r = subprocess.run([sys.executable, "-m", "cudalab.cli", "report", "--table",
                        str(res / "results.csv"), "--figures", str(res / "figures"),
                        "--results", str(res), "--out", str(out)], cwd=tmp_path, env=env,
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    shown = _config_shown(out.read_text())
    assert shown == cfg.load(res / "config.json")
    assert shown["run_name"] == own["run_name"] != "another-run"
    assert set(shown["experiments"]) == set(own["experiments"])


@pytest.mark.browser
def test_its_handout_is_legible_too(default_run) -> None:
    """Printed on A4, the GPU-less report keeps the handout's floors (its figures are the
    placeholders that say why nothing was measured) and its pages."""
    from handout_pdf import assert_legible_handout, print_a4

    repo, _, _ = default_run
    page = repo / "results" / "report.html"
    pdf, heights = print_a4(page)
    experiments = sorted(set(results.read_table(repo / "results" / "results.csv")["experiment"]))
    assert_legible_handout(page, pdf, heights, experiments)
