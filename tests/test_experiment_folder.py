"""A new lesson is one folder plus one config block: a toy experiment folder, copied to a
temporary directory and registered the way the shipped ones are (CUDALAB_EXPERIMENTS names
its parent), shows in the plan, is measured, aggregated into the table, drawn, and has its
section, claims, explanation and course row in the report."""

from __future__ import annotations

import html
import re
import shutil
import sys
from pathlib import Path

import pandas as pd
import pytest

from cudalab import cli
from cudalab import experiments as exps
from cudalab.experiments.lesson import Lesson

TOY = Path(__file__).resolve().parent / "toy_experiment" / "toy"
CONFIG = """run_name: toy
measurement: {warmup: 1, min_samples: 3, max_samples: 3, budget_s: 0.01, ceilings: false}
telemetry: {nvidia_smi: false, nvml: false}
experiments:
  toy: {}
"""


@pytest.fixture()
def toy(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    where = tmp_path / "site_experiments"
    shutil.copytree(TOY, where / "toy")
    monkeypatch.setenv(exps.ENV_PATH, str(where))
    exps.discover()
    yield tmp_path
    monkeypatch.delenv(exps.ENV_PATH)
    for module in ("cudalab.experiments.toy", "cudalab.experiments.toy.lesson"):
        sys.modules.pop(module, None)
    exps.discover()
    assert "toy" not in exps.REGISTRY


def _text(page: str) -> str:
    page = re.sub(r"<(script|style)[^>]*>.*?</\1>", "", page, flags=re.S)
    return re.sub(r"\s+", " ", html.unescape(re.sub(r"<[^>]+>", " ", page)))


def test_a_toy_folder_is_planned_measured_tabled_and_reported(toy: Path, capsys) -> None:
    assert list(exps.REGISTRY)[-1] == "toy"  # its order puts it last
    conf, res, figs = toy / "c.yaml", toy / "results", toy / "figures"
    conf.write_text(CONFIG)
    assert cli.main(["plan", str(conf)]) == 0
    assert re.search(r"toy\s+2 grid points \(0 on the GPU\)", capsys.readouterr().out)

    assert cli.main(["measure", "toy", "--config", str(conf), "--results", str(res)]) == 0
    assert cli.main(["aggregate", "--results", str(res), "--out", str(res / "results.csv")]) == 0
    table = pd.read_csv(res / "results.csv")
    assert list(table["point_id"]) == ["numpy-n1000", "numpy-n100000"]
    assert (table["status"] == "ok").all()

    assert cli.main(["figures", "toy", "--table", str(res / "results.csv"),
                     "--out", str(figs)]) == 0
    assert (figs / "toy" / "time.png").is_file()
    out = toy / "report.html"
    assert cli.main(["report", "--config", str(conf), "--table", str(res / "results.csv"),
                     "--figures", str(figs), "--results", str(res), "--out", str(out)]) == 0
    text = _text(out.read_text())
    for says in ("Toy: a sum on the CPU", "The toy summed 2 arrays.", "every sum is exact",
                 "time per sum against n", "experiments.toy.sizes: [10]",
                 "toy: a sum of 1000 floats"):
        assert says in text, says


def test_an_experiment_without_a_lesson_is_refused(tmp_path: Path,
                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    where = tmp_path / "site_experiments"
    shutil.copytree(TOY, where / "toy")
    init = where / "toy" / "__init__.py"
    init.write_text(init.read_text().replace("    lesson = LESSON\n", ""))
    monkeypatch.setenv(exps.ENV_PATH, str(where))
    try:
        with pytest.raises(TypeError, match="'toy' .* declares no lesson"):
            exps.discover()
    finally:
        monkeypatch.delenv(exps.ENV_PATH)
        for module in ("cudalab.experiments.toy", "cudalab.experiments.toy.lesson"):
            sys.modules.pop(module, None)
        exps.discover()
    assert "toy" not in exps.REGISTRY


def test_what_the_report_says_is_declared_in_the_lesson_alone() -> None:
    """A caption or claims set on the experiment class would be silently ignored: the
    report reads the Lesson only."""
    lesson_fields = set(Lesson.__dataclass_fields__)
    stray = {name: sorted(lesson_fields & set(dir(type(exp))))
             for name, exp in exps.REGISTRY.items()}
    assert not any(stray.values()), stray
