"""Every value a config takes has a range and a unit, checked against the others: durations
as text, time limits against the Slurm job's, keys that cancel each other, and warnings
for values that are legal but costly (cudalab/limits.py, cudalab/durations.py)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from cudalab import cli, limits
from cudalab import config as cfg

ROOT = Path(__file__).resolve().parent.parent


def _problems(config: dict) -> str:
    with pytest.raises(cfg.ConfigError) as e:
        cfg.validate(config)
    return str(e.value)


def _cli(args: list[str], capsys, monkeypatch) -> tuple[int, str]:
    monkeypatch.setenv("PATH", str(Path(sys.executable).parent))  # no sinfo: no cluster
    try:
        code = cli.main(args)
    except SystemExit as exc:
        code = exc.code
    r = capsys.readouterr()
    return int(code or 0), r.out + r.err


def _class(tmp_path: Path, students: int) -> Path:
    folder = tmp_path / "class"
    folder.mkdir()
    for i in range(students):
        (folder / f"s{i:03d}.cu").write_text("// a submission\n")
    return folder


# -- ranges ------------------------------------------------------------------------------------
@pytest.mark.parametrize("bad", [1e-9, 0.5, 0])
def test_a_launch_timeout_below_a_second_is_refused_with_its_reason(bad):
    out = _problems({"experiments": {"vector_add": {}}, "exercises": {"launch_timeout_s": bad}})
    assert "exercises.launch_timeout_s: " in out and "allowed: >= 1 and <= 600" in out
    assert "judged a hang" in out  # the reason for the minimum
    cfg.validate({"experiments": {"vector_add": {}}, "exercises": {"launch_timeout_s": 1}})


def _numeric_keys(node, path=""):
    if isinstance(node, dict):
        t = node.get("type")
        if t in ("integer", "number") or (isinstance(t, list) and {"integer", "number"} & set(t)):
            yield path, node
        for k, v in node.items():
            yield from _numeric_keys(v, f"{path}/{k}")
    elif isinstance(node, list):
        for i, v in enumerate(node):
            yield from _numeric_keys(v, f"{path}[{i}]")


def test_every_numeric_key_has_a_minimum_and_a_maximum():
    missing = [p for p, n in _numeric_keys(cfg.full_schema())
               if "enum" not in n and not (
                   {"minimum", "exclusiveMinimum"} & set(n)
                   and {"maximum", "exclusiveMaximum"} & set(n))]
    assert missing == []


def test_every_duration_key_declares_its_unit():
    """A key named *_s, *_ms or *_min holds seconds, milliseconds or minutes: its x-unit says
    so (the docs list it, and duration text on it is refused naming the number meant)."""
    unit_of = {"_s": "s", "_ms": "ms", "_min": "min"}
    for path, node in _numeric_keys(cfg.full_schema()):
        key = path.rsplit("/", 1)[-1]
        want = next((u for suffix, u in unit_of.items() if key.endswith(suffix)), None)
        if want and not path.endswith("/items"):
            assert node.get("x-unit") == want, path


# -- durations ---------------------------------------------------------------------------------
@pytest.mark.parametrize("text, needles", [
    ("runtime_min: 2:00:00", ["slurm.runtime_min: '2:00:00' is a duration written as text",
                              "runtime_min: 120 (2:00:00 read as H:MM:SS)"]),
    ("runtime_min: '2:00:00'", ["runtime_min: 120 (2:00:00 read as H:MM:SS)"]),
    ("runtime_min: 2:00", ["runtime_min: 2 (2:00 read as M:SS, as Slurm does)",
                           "runtime_min: 120 (2:00 read as H:MM, as a clock)"]),
    ("runtime_min: 1-12", ["runtime_min: 2160 (1-12 read as D-H)"]),
    ("runtime_min: 90min", ["runtime_min: 90 (90min read as written)"]),
    ("runtime_min: 2h", ["runtime_min: 120 (2h read as written)"]),
])
def test_duration_text_is_refused_with_the_minutes_meant(tmp_path, capsys, monkeypatch,
                                                         text, needles):
    """YAML 1.1 reads unquoted 2:00:00 as the base-60 integer 7200: 7200 minutes."""
    p = tmp_path / "c.yaml"
    p.write_text(f"experiments: {{vector_add: {{}}}}\nslurm:\n  {text}\n")
    assert cfg.read_mapping(p)["slurm"]["runtime_min"] != 7200
    code, out = _cli(["validate", str(p)], capsys, monkeypatch)
    assert code == 2 and "Traceback" not in out
    for n in needles:
        assert n in out, out


def test_base_60_is_text_everywhere_and_seconds_keys_say_seconds(tmp_path):
    p = tmp_path / "c.yaml"
    p.write_text("experiments: {vector_add: {}}\nmeasurement: {budget_s: 1:30}\nseed: 1:00\n")
    raw = cfg.read_mapping(p)
    assert raw["measurement"]["budget_s"] == "1:30" and raw["seed"] == "1:00"
    out = _problems(raw)
    assert "measurement.budget_s: '1:30' is a duration written as text; allowed: a plain " \
        "number of seconds" in out and "budget_s: 90 (1:30 read as M:SS" in out
    assert "seed: '1:00' has the wrong type" in out  # no unit: the plain type message


# -- limits against each other -----------------------------------------------------------------
def test_a_memcheck_hang_limit_longer_than_the_slurm_job_is_refused(tmp_path):
    folder = _class(tmp_path, 2)
    config = {"experiments": {"vector_add": {}}, "slurm": {"runtime_min": 30},
              "exercises": {"submissions": str(folder), "exercise": "vector_add",
                            "launch_timeout_s": 600, "sanitize": True}}
    out = _problems(config)
    assert "exercises.launch_timeout_s: 600 s per launch x 50 under memcheck " \
        "(exercises.sanitize: true) plus 60 s of start-up = 30060 s" in out
    assert "slurm.runtime_min (30 min = 1800 s)" in out
    assert "allowed: exercises.launch_timeout_s < 34.8, or slurm.runtime_min >= 502" in out
    # without memcheck 660 s fit the 30 minutes; with it, 30 s per launch do
    cfg.validate(config | {"exercises": config["exercises"] | {"sanitize": False}})
    cfg.validate(config | {"exercises": config["exercises"] | {"launch_timeout_s": 30}})
    # no class run: the exercises block is not used, and not held to the Slurm limit
    cfg.validate(config | {"exercises": config["exercises"] | {"submissions": ""}})
    assert limits.judge_hang_limit({"launch_timeout_s": 10, "sanitize": True}) == 560


def test_a_judge_that_cannot_even_start_in_the_job_is_refused(tmp_path):
    folder = _class(tmp_path, 1)
    out = _problems({"experiments": {"vector_add": {}}, "slurm": {"runtime_min": 1},
                     "exercises": {"submissions": str(folder), "launch_timeout_s": 10}})
    assert "exercises.launch_timeout_s: 10 s per launch plus 60 s of start-up = 70 s" in out
    assert "allowed: slurm.runtime_min >= 2" in out  # no launch limit would fit 1 minute


def test_an_nvcc_timeout_longer_than_the_slurm_job_is_refused():
    out = _problems({"experiments": {"static_analysis": {"timeout_s": 3600}},
                     "slurm": {"runtime_min": 30}})
    assert "experiments.static_analysis.timeout_s: 3600 s" in out
    assert "slurm.runtime_min (30 min = 1800 s)" in out and "allowed: timeout_s < 1800 s" in out


def test_gpu_model_beside_gpu_models_is_refused_not_ignored():
    out = _problems({"experiments": {"vector_add": {}},
                     "slurm": {"gpu_model": "a100", "gpu_models": ["h100", "l40s"]}})
    assert "slurm.gpu_model: 'a100' would be ignored beside slurm.gpu_models" in out
    assert "allowed: one of them, e.g. gpu_models: [a100, h100, l40s] and gpu_model: ''" in out
    cfg.validate({"experiments": {"vector_add": {}}, "slurm": {"gpu_models": ["h100"]}})
    cfg.validate({"experiments": {"vector_add": {}}, "slurm": {"gpu_model": "h100"}})


# -- the plan's job count and the warnings -----------------------------------------------------
def test_the_plan_counts_one_judge_job_per_student_and_warns_of_many(tmp_path, capsys,
                                                                     monkeypatch):
    folder = _class(tmp_path, 300)
    (folder / "bad name.cu").write_text("")
    p = tmp_path / "c.yaml"
    p.write_text(f"experiments: {{vector_add: {{}}}}\nexercises: {{submissions: {folder}, "
                 f"exercise: vector_add}}\n")
    code, out = _cli(["plan", str(p)], capsys, monkeypatch)
    assert code == 0, out
    assert f"class run (snakemake exercises): exercise vector_add, 300 judge job(s), one " \
        f"per submission of {folder}, + 1 baseline job + 1 doctor job (the judges' GPU, " \
        "first) = 302 sbatch job(s)" in out
    assert "the leaderboard (results/class/vector_add/index.html)" in out
    assert "1 entry of the folder rejected" in out
    assert "at most 2 sbatch job(s) for `snakemake` (the class run's jobs are counted below)" \
        in out
    warned = [x for x in out.splitlines() if x.strip().startswith("warning: exercises.")]
    assert len(warned) == 1 and "submits 302 sbatch jobs" in warned[0], out
    code, out = _cli(["validate", str(p)], capsys, monkeypatch)  # warned, not refused
    assert code == 0 and "warning: exercises.submissions: " in out


def test_a_small_class_is_counted_without_a_warning(tmp_path, capsys, monkeypatch):
    folder = _class(tmp_path, 3)
    p = tmp_path / "c.yaml"
    p.write_text(f"experiments: {{vector_add: {{}}}}\nexercises: {{submissions: {folder}}}\n")
    code, out = _cli(["plan", str(p)], capsys, monkeypatch)
    assert code == 0 and "3 judge job(s)" in out and "= 5 sbatch job(s)" in out
    assert "warning:" not in out


@pytest.mark.parametrize("metric, warned", [
    ("regex:.*", True), ("regex:__", True), ("regex:^(dram|lts)__", True),
    ("regex:^smsp__average_warps_issue_stalled_.+_per_issue_active\\.ratio$", False),
    ("regex:^dram__", False), ("dram__bytes.sum", False),
])
def test_a_broad_regex_metric_gets_a_cost_warning(tmp_path, capsys, monkeypatch, metric,
                                                  warned):
    p = tmp_path / "c.yaml"
    p.write_text(f"experiments: {{vector_add: {{}}}}\nprofile:\n  ncu: true\n  metrics: "
                 f"['{metric}']\n")
    for command in ("validate", "plan"):
        code, out = _cli([command, str(p)], capsys, monkeypatch)
        assert code == 0, out
        lines = [x for x in out.splitlines() if "warning: profile.metrics[0]: " in x]
        assert bool(lines) == warned, out
        if warned:
            assert "ncu collects every metric it matches" in lines[0]


def test_the_default_metrics_are_not_warned_about(capsys, monkeypatch):
    code, out = _cli(["validate", str(ROOT / "config.yaml")], capsys, monkeypatch)
    assert code == 0 and "warning:" not in out


def test_the_workflow_prints_the_warnings_at_its_start(tmp_path):
    p = tmp_path / "c.yaml"
    p.write_text("experiments: {vector_add: {sizes: [1024]}}\n"
                 "profile: {ncu: true, metrics: ['regex:.*']}\n")
    env = {k: v for k, v in os.environ.items() if not k.startswith("SLURM")}
    env["PYTHONPATH"] = str(ROOT)
    r = subprocess.run([sys.executable, "-m", "snakemake", "-s", str(ROOT / "Snakefile"),
                        "-d", str(tmp_path / "w"), "-c1", "-n", "--configfile", str(p)],
                       capture_output=True, text=True, env=env, timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    assert "warning: profile.metrics[0]: 'regex:.*' matches metrics of" in r.stderr


def test_a_path_component_longer_than_the_system_allows_is_named_not_a_traceback(
        tmp_path, capsys, monkeypatch):
    long = "a" * 300
    p = tmp_path / "c.yaml"
    p.write_text(f"experiments: {{vector_add: {{}}}}\nreport: {{baselines: [{tmp_path}/{long}]}}\n"
                 f"exercises: {{submissions: {tmp_path}/{long}}}\n")
    for command in ("validate", "plan"):
        code, out = _cli([command, str(p)], capsys, monkeypatch)
        assert code == 2 and "Traceback" not in out, out
        assert "report.baselines[0]: " in out and "at most 255" in out  # the name's limit
        assert long not in out  # a value is shown cut


def test_the_submit_line_counts_every_job_and_names_a_few():
    jobs = [(f"exercise_judge s{i}", "--gpus=1") for i in range(300)]
    line = cli.slurm_submit_line([*jobs, ("exercise_baseline", "--gpus=1")], 0)
    assert "submitting 301 Slurm job(s)" in line
    assert "exercise_judge s11 (--gpus=1), ... and 289 more." in line
    assert "exercise_judge s12" not in line


@pytest.mark.parametrize("value", ["9" * 400 + "h", "9" * 400 + ":00:00", "1:" * 300 + "1"])
def test_hostile_duration_text_gets_a_message_not_a_traceback(value):
    out = _problems({"experiments": {"vector_add": {}}, "slurm": {"runtime_min": value}})
    assert "slurm.runtime_min: " in out and " ... " in out  # named, the value cut
