"""Hostile and careless configs (tests/data/adversarial/), by class: strings that could reach
a shell, an sbatch line, a path or nvcc; YAML bombs; resource bombs; the keys added lately.

Each file says in its header its class, what the output must name, and whether it is
rejected (`cudalab validate` exits 2) or warned about (`cudalab plan` exits 0 with a
`warning:` line). Every case answers within LIMIT_S, with one line per problem and no
traceback.
A payload that would run a command touches $CANARY: the canary must never appear, not after
`validate`, not after a real (not dry) `snakemake --sdm env-modules` run of the file.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from cudalab import cli, safe_yaml

ROOT = Path(__file__).resolve().parent.parent
CASES = sorted((ROOT / "tests" / "data" / "adversarial").glob("*.yaml"))
# A bound, not a benchmark: a case answers in well under a second on an idle machine; an
# exponential blow-up (aliases, a huge grid) would take minutes. Generous, so that a loaded
# machine never fails it.
LIMIT_S = 30.0


# A case's "must name" is its meaning (a key path, a line), not a library's wording:
# deep_brackets.yaml names its line, as cudalab says it ("nested more than 24 deep") and as
# libyaml says it where its own nesting limit comes first (PyYAML 6.0.4).


def _header(path: Path, field: str) -> str:
    m = re.search(rf"^# {field}: (.+)$", path.read_text(), re.M)
    assert m, f"{path.name} has no '# {field}:' line"
    return m.group(1).strip()


def _armed(path: Path, tmp_path: Path) -> tuple[Path, Path]:
    """The case with $CANARY replaced by a file path in tmp_path (and that path)."""
    canary = tmp_path / "canary"
    armed = tmp_path / path.name
    armed.write_text(path.read_text().replace("$CANARY", str(canary)))
    return armed, canary


def _run_cli(args: list[str], capsys) -> tuple[int, str, float]:
    t0 = time.monotonic()
    try:
        code = cli.main(args)
    except SystemExit as exc:
        code = exc.code
    took = time.monotonic() - t0
    r = capsys.readouterr()
    return int(code or 0), r.out + r.err, took


def test_the_set_covers_every_class_with_at_least_60_cases():
    classes = {p.name: _header(p, "class") for p in CASES}
    assert len(CASES) >= 60
    for cls in ("shell", "sbatch", "path", "nvcc", "yaml", "bounds", "estimate",
                "checked-late"):
        assert cls in classes.values(), cls


@pytest.mark.parametrize("path", CASES, ids=[p.stem for p in CASES])
def test_each_case_is_rejected_or_warned_naming_its_key(path, tmp_path, capsys, monkeypatch):
    armed, canary = _armed(path, tmp_path)
    expect, must = _header(path, "expect"), _header(path, "must name")
    command = "validate" if expect == "reject" else "plan"
    if command == "plan":  # the estimate, not this machine's Slurm (a test cluster may run)
        monkeypatch.setenv("PATH", str(Path(sys.executable).parent))
    code, out, took = _run_cli([command, str(armed)], capsys)
    assert "Traceback" not in out
    assert must in out, out
    assert took < LIMIT_S, f"{took:.1f} s"
    assert not canary.exists()
    if expect == "reject":
        assert code == 2, out
        assert out.startswith("error: ")
        lines = [line for line in out.splitlines() if line.strip()]
        if lines[0].endswith("is invalid:"):  # then one "  - key: ..." line per problem
            assert len(lines) > 1 and all(x.startswith("  - ") for x in lines[1:]), out
        else:  # a file that is not read at all: one line
            assert len(lines) == 1, out
    else:
        assert code == 0, out
        assert any(line.strip().startswith("warning:") and must in line
                   for line in out.splitlines()), out


def test_the_canary_is_live(tmp_path):
    """The injection payloads do run a command when a shell meets them unquoted: what the
    workflow must never let happen (so the canary checks above can fail)."""
    armed, canary = _armed(CASES[0].with_name("module_newline_command.yaml"), tmp_path)
    payload = "cuda/12.4\ntouch " + str(canary)
    assert str(canary) in armed.read_text()
    subprocess.run(["bash", "-c", f"true {payload}"], check=True)
    assert canary.exists()


@pytest.mark.parametrize("make, must", [
    (lambda: "run_name: x\n" + "#" * (safe_yaml.MAX_BYTES + 10) + "\n", "larger than"),
    (lambda: "experiments:\n  vector_add:\n    sizes: [" + ", ".join(["1"] * 300_000) + "]\n",
     "larger than"),
    (lambda: "experiments:\n  vector_add:\n    sizes: [" + ",".join(["1"] * 110_000) + "]\n",
     "holds more than 100\u202f000 values"),
    (lambda: "profile:\n  metrics: [" + ", ".join(f"a__m{i}.sum" for i in range(5000))
     + "]\nexperiments: {vector_add: {}}\n", "profile.metrics"),
    (lambda: "experiments:\n  vector_add:\n    sizes: [" + ", ".join(
        str(1000 + i) for i in range(20000)) + "]\n", "max_points"),
    (lambda: 'run_name: "' + "a" * 200_000 + '"\nexperiments: {vector_add: {}}\n', "run_name"),
], ids=["over_size_limit", "flat_300k_list", "flat_110k_list", "5000_metrics", "20000_sizes",
        "200k_string"])
def test_generated_bombs_are_refused_quickly(make, must, tmp_path, capsys):
    p = tmp_path / "bomb.yaml"
    p.write_text(make())
    code, out, took = _run_cli(["validate", str(p)], capsys)
    assert code == 2 and must in out and "Traceback" not in out, out[:2000]
    assert took < LIMIT_S, f"{took:.1f} s"
    assert len(out) < 20_000  # cut values, at most MAX_MESSAGES lines


SHELL_CASES = [p for p in CASES if _header(p, "class") in ("shell", "nvcc")
               and "$CANARY" in p.read_text()]


@pytest.mark.skipif(shutil.which("snakemake") is None and not (
    Path(sys.executable).parent / "snakemake").exists(), reason="needs snakemake")
@pytest.mark.parametrize("path", SHELL_CASES, ids=[p.stem for p in SHELL_CASES])
def test_snakemake_runs_nothing_of_it(path, tmp_path):
    """A real run (not -n) under --sdm env-modules, as profiles/slurm sets it: Snakemake
    stops at start-up naming the key; no rule, no `module load`, no canary."""
    armed, canary = _armed(path, tmp_path)
    work = tmp_path / "work"
    work.mkdir()
    env = {k: v for k, v in os.environ.items() if not k.startswith("SLURM")}
    env["PATH"] = str(Path(sys.executable).parent) + os.pathsep + env.get("PATH", "")
    r = subprocess.run(["snakemake", "-s", str(ROOT / "Snakefile"), "-d", str(work), "-c1",
                        "--sdm", "env-modules", "--configfile", str(armed)],
                       capture_output=True, text=True, env=env, timeout=120)
    out = r.stdout + r.stderr
    assert r.returncode != 0, out[-3000:]
    assert _header(path, "must name") in out, out[-3000:]
    assert not canary.exists()
    assert not (work / "results" / "logs").exists()  # no job started
