"""`cudalab exercise ...`: the student's check and the steps of a class run.

  cudalab exercise list                        the exercises, their slots and grid rules
  cudalab exercise check FILE [--sanitize]     feedback on one file (exit 0: correct,
                                               1: not correct, 3: compiled, not judged)
                   [--sandbox required|optional|off]   (default optional: without
                                               bubblewrap it says so once and runs as is)
  cudalab exercise judge FILE --student ID --exercise NAME --out VERDICT.json
                                               one submission of a class (exit 0 with a
                                               verdict; 2 without a sandbox, which class
                                               mode requires: --sandbox required)
  cudalab exercise baseline --exercise NAME --out BASELINE.json
                                               the course's kernels and cuBLAS in the slot
  cudalab exercise report --exercise NAME --verdicts DIR --baseline FILE
                          --submissions DIR --out DIR
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from cudalab.exercises import catalog
from cudalab.safe_text import printable

# `exercise check` exit codes (docs/exercises.md); 2 is argparse's, for a bad command line
EXIT_CORRECT = 0  # every check passed on the GPU
EXIT_FAILED = 1  # judged, or caught without a GPU, and not correct
EXIT_NOT_JUDGED = 3  # compiled, not judged: no GPU here (or --no-gpu, or another arch)


def cmd_list(a: argparse.Namespace) -> int:
    for ex in catalog.EXERCISES.values():
        print(f"{ex.name}: {ex.title} ({ex.experiment})\n  kernel: {ex.signature}\n"
              f"  grid:   {ex.grid_rule}\n  starter: {catalog.EXERCISE_DIR / ex.starter}")
    return 0


def _judge_options(a: argparse.Namespace) -> dict[str, Any]:
    return {"arch": a.arch, "seed": a.seed, "launch_timeout_s": a.timeout,
            "sandbox": a.sandbox}


def _sandbox_refused(a: argparse.Namespace) -> bool:
    """Under --sandbox required with no working sandbox: says why on one line (True)."""
    from cudalab import jail

    try:
        jail.use(a.sandbox)
    except jail.SandboxUnavailable as exc:
        print(f"cudalab exercise: {exc}", file=sys.stderr)
        return True
    return False


def cmd_check(a: argparse.Namespace) -> int:
    from cudalab.exercises import feedback, pipeline

    if _sandbox_refused(a):
        return 2
    v = pipeline.judge_file(Path(a.file), exercise=a.exercise, student=a.student or "me",
                            gpu=not a.no_gpu, sanitize=a.sanitize, **_judge_options(a))
    print(feedback.render(v))
    if a.json:
        Path(a.json).write_text(json.dumps(v, indent=1))
    return {"ok": EXIT_CORRECT, "compiled": EXIT_NOT_JUDGED}.get(v["status"], EXIT_FAILED)


def _no_gpu_in_slurm_job(verdicts: list[dict[str, Any]]) -> bool:
    """Inside a Slurm job (which asked for a GPU), entries left `compiled` for want of a GPU
    mean the node is wrong, not the students' files: says so on one line (True), and the
    job fails without writing its verdicts, so the next run judges them again."""
    import os

    from cudalab.gpu import NoGpuError, _no_gpu

    lost = [v for v in verdicts
            if v.get("status") == "compiled" and "no GPU here" in v.get("message", "")]
    if not lost or not os.environ.get("SLURM_JOB_ID"):
        return False
    err: NoGpuError = _no_gpu(lost[0]["message"].removeprefix("no GPU here").strip(" ()"))
    print(f"error: NoGpuError: {err} Nothing was judged: no verdict is written "
          "(the next run judges these entries again).", file=sys.stderr)
    return True


def cmd_judge(a: argparse.Namespace) -> int:
    from cudalab import results
    from cudalab.exercises import pipeline

    if _sandbox_refused(a):
        return 2  # no verdict: the teacher's setup, not the student's file, is at fault
    v = pipeline.judge_file(Path(a.file), exercise=a.exercise, student=a.student,
                            mode="class", sanitize=a.sanitize, **_judge_options(a))
    if _no_gpu_in_slurm_job([v]):
        return EXIT_NOT_JUDGED
    results.write_json_atomic(Path(a.out), v)
    print(printable(f"{a.student}: {v['status']}"
                    + (f": {v['message']}" if v.get("message") else "")))
    return 0


def cmd_baseline(a: argparse.Namespace) -> int:
    from cudalab import results
    from cudalab.exercises import pipeline

    if _sandbox_refused(a):
        return 2
    ex = catalog.get(a.exercise)
    opts = _judge_options(a) | {"mode": "class"}
    out = [pipeline.judge_course(ex, k, **opts) for k in ex.course]
    if ex.cublas:
        out.append(pipeline.judge_cublas(ex, **opts))
    for v in out:
        print(printable(f"{v['student']}: {v['status']} {v.get('message', '')}".rstrip()))
    if _no_gpu_in_slurm_job(out):
        return EXIT_NOT_JUDGED
    results.write_json_atomic(Path(a.out), {"baselines": out})
    return 0


def cmd_report(a: argparse.Namespace) -> int:
    from cudalab import results
    from cudalab.exercises import classroom

    try:
        subs, rejected = classroom.discover(Path(a.submissions))
    except classroom.ClassFolderError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    verdicts = []
    for student in sorted(subs):
        v = results.read_json(Path(a.verdicts) / f"{student}.json")
        verdicts.append(v or {"student": student, "exercise": a.exercise, "status": "crashed",
                              "message": "no verdict was written"})
    base = (results.read_json(Path(a.baseline)) or {}).get("baselines", []) if a.baseline \
        else []
    index = classroom.write_report(verdicts, base, rejected, a.exercise, Path(a.out),
                                   salt=a.salt)
    print(f"class report: {index.resolve()}")
    return 0


def _common(s: argparse.ArgumentParser, default_box: str = "optional") -> None:
    s.add_argument("--arch", help="compile for this target (default: the GPU's, else sm_90)")
    s.add_argument("--seed", type=int, default=0, help="seed of the inputs (0: fresh)")
    s.add_argument("--timeout", type=float, default=10.0,
                   help="per-launch wall-clock limit in seconds (default 10)")
    s.add_argument("--sanitize", action="store_true",
                   help="also run the small grid under compute-sanitizer memcheck "
                   "(an invalid access wins over the plain verdict)")
    s.add_argument("--sandbox", choices=["required", "optional", "off"], default=default_box,
                   help="compile and judge in a bubblewrap sandbox: required (refuse to "
                   "run without one), optional (say so once and run without), off "
                   f"(default {default_box})")


def add_parser(sub: Any) -> None:
    p = sub.add_parser("exercise", help="check a student's kernel; judge a class",
                       description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    esub = p.add_subparsers(dest="exercise_cmd", required=True)
    esub.add_parser("list").set_defaults(fn=cmd_list)
    s = esub.add_parser("check", help="compile, check and time one file")
    s.add_argument("file")
    s.add_argument("--exercise", choices=sorted(catalog.EXERCISES))
    s.add_argument("--student", default="")
    s.add_argument("--no-gpu", action="store_true", help="compile and analyse only")
    s.add_argument("--json", help="also write the verdict to this file")
    _common(s)
    s.set_defaults(fn=cmd_check)
    s = esub.add_parser("judge")
    s.add_argument("file")
    s.add_argument("--student", required=True)
    s.add_argument("--exercise", required=True, choices=sorted(catalog.EXERCISES))
    s.add_argument("--out", required=True)
    _common(s, "required")
    s.set_defaults(fn=cmd_judge)
    s = esub.add_parser("baseline")
    s.add_argument("--exercise", required=True, choices=sorted(catalog.EXERCISES))
    s.add_argument("--out", required=True)
    _common(s, "required")
    s.set_defaults(fn=cmd_baseline)
    s = esub.add_parser("report")
    s.add_argument("--exercise", required=True, choices=sorted(catalog.EXERCISES))
    s.add_argument("--submissions", required=True)
    s.add_argument("--verdicts", required=True)
    s.add_argument("--baseline")
    s.add_argument("--salt", default="", help="salt of the anonymous view's pseudonyms")
    s.add_argument("--out", required=True)
    s.set_defaults(fn=cmd_report)
