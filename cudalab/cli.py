"""`cudalab` command line: the steps the Snakemake rules call, usable by hand too.

  cudalab validate [config.yaml]           check a config (exit 2 with every problem named)
  cudalab plan [config.yaml]               grid points and jobs a run will have (exit 0;
                                           1: the slurm: request cannot fit this cluster;
                                           2: an invalid config)
  cudalab measure EXPERIMENT [--config ..]  measure one experiment's grid (one job)
  cudalab aggregate                         raw records -> results/results.csv, claims.json
  cudalab claims [--table T] [--out F]      results.csv -> claims.json (every claim judged once)
  cudalab figures EXPERIMENT                results.csv -> results/figures/EXPERIMENT/*.png|svg
  cudalab run-figures                       results.csv, telemetry -> results/figures/_roofline,
                                           results/figures/_telemetry (figures + index.json)
  cudalab compare-figures                   results.csv, report.baselines -> results/figures/
                                           _compare (comparison.csv, ratio figures, index.json)
  cudalab report                            -> results/report.html
  cudalab report --teacher                  -> results/teacher.html (the questions answered)
  cudalab slides                            -> results/slides/EXPERIMENT.png|svg, index.html
  cudalab compare RUN... [--baseline DIR]    point-by-point verdicts against a baseline
  cudalab doctor [--config ..]              can this node / Slurm job run the grid? (a table)
  cudalab site [config.yaml]                sinfo -> partitions, GPU models, a slurm: block
  cudalab exercise check FILE               feedback on a student's kernel (docs/exercises.md)
"""

from __future__ import annotations

import argparse
import errno
import json
import sys
from pathlib import Path
from typing import Any

from cudalab import config as cfg


def _config(path: str, show_notes: bool = False) -> dict[str, Any]:
    """The validated config, or exit 2 with every problem named (never a traceback)."""
    notes: list[str] = []
    try:
        config = cfg.load(path, notes=notes)
    except cfg.ConfigError as exc:
        print(f"error: {exc}", file=sys.stderr)
        raise SystemExit(2) from None
    for n in notes if show_notes else []:
        print(f"note: {n}", file=sys.stderr)
    return config


def plan_lines(config: dict[str, Any], fit: Any = None, class_only: bool = False
               ) -> list[str]:
    """The plan: jobs (every job that runs code, the doctors included), grid points, the
    estimate, and whether the request fits this cluster (`fit`: a site.FitCheck, else
    sinfo is asked here). class_only: the plan of `snakemake exercises`, which runs the
    class's jobs and no experiment."""
    from cudalab import site, sweep
    from cudalab.experiments import REGISTRY
    from cudalab.guards import plan_estimate

    fit = site.check_fit(config) if fit is None else fit
    if class_only:
        return ["cudalab plan: a class run (snakemake exercises); no experiment is measured",
                *_class_lines(config), *site.fit_lines(fit, quiet=True)]
    lines = []
    names = cfg.enabled_experiments(config)
    total = gpu_exps = 0
    for name in names:
        pts = REGISTRY[name].grid(config)
        n_gpu = sum(p.gpu for p in pts)
        total += len(pts)
        gpu_exps += n_gpu > 0
        lines.append(f"  {name:14s} {len(pts):4d} grid points ({n_gpu} on the GPU) -> 1 job"
                     + (" per GPU model" if sweep.gpu_models(config) else ""))
    n = sweep.job_counts(config, names, gpu_exps)
    doctors = f" + {n.doctors} doctor job(s)" if n.doctors else ""
    lines.insert(0, f"cudalab plan: {n.measure} experiment job(s) ({n.gpu_measure} need a GPU)"
                    f"{doctors}, {total} grid points; aggregate, figures and report run "
                    "locally")
    per = "experiment and GPU model" if n.models else "experiment"
    for_what = (" for `snakemake` (the class run's jobs are counted below)"
                if config["exercises"]["submissions"] else "")
    lines.insert(1, f"  under Slurm (--profile slurm): at most {n.total} sbatch job(s)"
                    f"{for_what}, one allocation per {per} ({n.gpu_measure} with a GPU)"
                    + (f", and {n.doctors} short doctor job(s) (1 CPU, a few minutes) before "
                       "them" if n.doctors else ""))
    lines += _class_lines(config)
    return (lines + sweep.plan_lines(config, names) + plan_estimate(config)
            + site.fit_lines(fit, quiet=True))


def _class_lines(config: dict[str, Any]) -> list[str]:
    """A class run's jobs (`snakemake exercises`): one judge job per submission and one for
    the course's kernels and cuBLAS, each an sbatch job with a GPU under Slurm."""
    from cudalab import limits

    found = limits.class_jobs(config)
    if found is None:
        return []
    judged, rejected = found
    ex = config["exercises"]
    doctor = limits.class_doctor(config)
    model = config["slurm"]["gpu_model"] or next(iter(config["slurm"]["gpu_models"]), "")
    return [f"  class run (snakemake exercises): exercise {ex['exercise']}, {judged} judge "
            f"job(s), one per submission of {ex['submissions']}, + 1 baseline job"
            + (" + 1 doctor job (the judges' GPU, first)" if doctor else "")
            + f" = {judged + 1 + doctor} sbatch job(s) under Slurm, each with a GPU"
            + (f" of model {model}" if model else "")
            + f"; the leaderboard (results/class/{ex['exercise']}/index.html) is written "
            "locally"
            + (f"; {rejected} entr{'y' if rejected == 1 else 'ies'} of the folder rejected "
               f"(listed in the report)" if rejected else "")]


SUBMIT_NAMES = 12  # jobs named in the submit line (a class submits hundreds)


def slurm_submit_line(jobs: list[tuple[str, str]], measured: int) -> str:
    """The line a Slurm run prints before submitting: jobs = [(name, GPU request or ''),
    ...], every job the run submits (the doctors too); `measured`: measure jobs already
    done, not resubmitted."""
    shown = [e + (f" ({g})" if g else "") for e, g in jobs[:SUBMIT_NAMES]]
    names = ", ".join(shown) + (f", ... and {len(jobs) - SUBMIT_NAMES} more"
                                if len(jobs) > SUBMIT_NAMES else "")
    return (f"cudalab: submitting {len(jobs)} Slurm job(s) with sbatch"
            + (f": {names}" if jobs else "")
            + (f"; {measured} experiment job(s) already measured, not resubmitted"
               if measured else "")
            + ". Slurm logs: .snakemake/slurm_logs/, job logs: results/logs/")


# `cudalab plan` exit codes: what a script (or CI) can act on
PLAN_OK, PLAN_DOES_NOT_FIT, PLAN_INVALID = 0, 1, 2


def cmd_validate(a: argparse.Namespace) -> int:
    from cudalab import limits

    config = _config(a.config, show_notes=True)
    for w in limits.warnings(config):  # legal but costly: said, never failed
        print(f"warning: {w}", file=sys.stderr)
    print(f"{a.config}: valid")
    return 0


def cmd_plan(a: argparse.Namespace) -> int:
    """0: the run can start (the request fits, or no sinfo to ask); 1: sinfo answered and
    the request cannot fit (the jobs would wait for ever); 2: the config is invalid."""
    from cudalab import site

    config = _config(a.config, show_notes=True)  # exits PLAN_INVALID
    fit = site.check_fit(config)
    print("\n".join(plan_lines(config, fit)))
    if not fit.fits:
        print(f"cudalab plan: {a.config}: the slurm: request cannot fit this cluster (exit "
              f"{PLAN_DOES_NOT_FIT}); fix the lines above", file=sys.stderr)
        return PLAN_DOES_NOT_FIT
    return PLAN_OK


def cmd_measure(a: argparse.Namespace) -> int:
    from cudalab import shards
    from cudalab.gpu import NoGpuError
    from cudalab.runner import run_experiment

    config = _config(a.config)
    if a.experiment not in cfg.enabled_experiments(config):
        print(f"error: experiment {a.experiment!r} is not enabled in {a.config}", file=sys.stderr)
        return 2
    try:
        shard = shards.Shard.parse(a.shard) if a.shard else None
    except shards.ShardError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    try:
        run_experiment(config, a.experiment, Path(a.results), shard)
    except NoGpuError as exc:  # only under Slurm (a GPU job); elsewhere: not_measured points
        print(f"error: NoGpuError: {exc}", file=sys.stderr)
        return 3
    return 0


def cmd_merge_shards(a: argparse.Namespace) -> int:
    """raw/<E>/_manifest.json from the manifests of its shards' measure jobs."""
    from cudalab import results, shards
    from cudalab.experiments import REGISTRY

    config = _config(a.config)
    raw = Path(a.results) / "raw" / a.experiment
    if a.experiment not in cfg.enabled_experiments(config):
        print(f"error: experiment {a.experiment!r} is not enabled in {a.config}", file=sys.stderr)
        return 2
    parts = []
    for shard in shards.all_shards(a.count):
        m = results.read_json(raw / shard.manifest)
        if m is None:
            print(f"error: {raw / shard.manifest} is missing or unreadable: its measure job "
                  "must run (again) first", file=sys.stderr)
            return 2
        parts.append(m)
    try:
        merged = shards.merge(a.experiment, REGISTRY[a.experiment].grid(config), parts)
    except shards.ShardError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    results.write_json_atomic(raw / shards.MANIFEST, merged)
    c = merged["counts"]
    print(f"{a.experiment}: merged {a.count} shards: {len(merged['points'])} points, "
          + ", ".join(f"{n} {k}" for k, n in c.items() if n))
    return 0


def cmd_aggregate(a: argparse.Namespace) -> int:
    from cudalab import results, roofline
    from cudalab.experiments import device_experiments

    # the roofline reads which experiments' points are on device from the lessons, as data
    roofline.declare_device_experiments(device_experiments())

    # Only this run's records (this grid, this run's GPUs): robust hook, see select_records.
    raw = Path(a.results) / "raw"
    manifests = results.read_manifests(raw, a.manifests and [Path(p) for p in a.manifests])
    records, left_out = results.select_records(results.iter_records(raw), manifests)
    print(left_out["line"])
    results.write_json_atomic(Path(a.out).parent / results.LEFT_OUT_FILE, left_out)
    # every derived column (memory level, roof, why a point is suspect) written here, once
    df = results.conform(roofline.annotate(results.build_table(records)))
    problems = results.check_table(df)
    if problems:
        print("error: results table breaks its schema: " + "; ".join(problems), file=sys.stderr)
        return 1
    for p in results.write_table(df, Path(a.out)):
        print(f"wrote {p} ({len(df)} rows)")
    _write_ceilings(manifests, Path(a.out).parent / "ceilings.csv")
    # every claim judged once, on the table as every reader reads it back
    from cudalab import claims_file

    print(f"wrote {claims_file.write_for_table(Path(a.out))}")
    return 0


def cmd_claims(a: argparse.Namespace) -> int:
    from cudalab import claims_file

    if a.schema:  # the JSON schema claims.json is checked against, for other tools
        print(json.dumps(claims_file.SCHEMA, indent=1, ensure_ascii=False))
        return 0
    path = claims_file.write_for_table(Path(a.table), Path(a.out) if a.out else None)
    print(f"wrote {path}")
    return 0


def _judged(a: argparse.Namespace, df: Any, out_dir: Path) -> Any:
    """The claims a renderer shows (run_claims.RunClaims): --claims, else the table's
    folder's claims.json (a run from before it: judged once, written into out_dir)."""
    from cudalab import claims_file

    if a.claims:
        return claims_file.read(Path(a.claims), Path(a.table))
    return claims_file.for_table(Path(a.table), df, out_dir)


def _write_ceilings(manifests: list[dict[str, Any]], path: Path) -> None:
    """results/ceilings.csv: the measured and theoretical ceilings of every GPU job."""
    from cudalab import ceilings, results
    from cudalab.results import atomic_path

    table = ceilings.ceilings_table(j for m in manifests for j in results.jobs_of(m))
    with atomic_path(path) as tmp:
        table.to_csv(tmp, index=False)
    print(f"wrote {path} ({len(table)} GPU jobs)")


def cmd_figures(a: argparse.Namespace) -> int:
    from cudalab import figures, handout, results

    df = results.read_table(Path(a.table))
    drawn = figures.draw_experiment(a.experiment, df, Path(a.out))
    # and the one the printed handout shows, at its printed size
    handout.draw(a.experiment, df[df["experiment"] == a.experiment], Path(a.out))
    print(f"{a.experiment}: figures {json.dumps(drawn)}")
    return 0


def cmd_run_figures(a: argparse.Namespace) -> int:
    from cudalab import roofline, run_figures

    drawn = run_figures.draw(roofline.load_table(Path(a.table)), Path(a.results), Path(a.out),
                             workers=a.jobs)
    print(f"run figures: {json.dumps(drawn)}")
    return 0


def cmd_compare_figures(a: argparse.Namespace) -> int:
    from cudalab import roofline, run_figures
    from cudalab.result_folders import CompareError

    config = _config(run_config_path(a.config, Path(a.table).parent))
    try:
        n = run_figures.draw_comparisons(roofline.load_table(Path(a.table)), config,
                                         Path(a.out))
    except CompareError as exc:  # a report.baselines folder missing, empty or unmatched
        print(f"error: {exc}", file=sys.stderr)
        return 2
    print(f"comparison figures: {n}")
    return 0


RUN_CONFIG = "config.json"  # the run's validated config, written beside its results
# what older stored runs (the committed references) kept instead
RUN_CONFIG_OLD = "report-config.yaml"


def run_config_path(given: str | None, run_folder: Path) -> str:
    """The config a re-rendering reads: the one given, else the run's own (config.json in
    its folder, as the workflow wrote it, or an older reference's report-config.yaml), else
    config.yaml. A report drawn again later must describe the run, not today's config.yaml."""
    if given:
        return given
    for name in (RUN_CONFIG, RUN_CONFIG_OLD):
        if (run_folder / name).is_file():
            return str(run_folder / name)
    return "config.yaml"


def cmd_report(a: argparse.Namespace) -> int:
    from cudalab import claims_file, report, roofline
    from cudalab.result_folders import CompareError

    config = _config(run_config_path(a.config, Path(a.results)))
    df = roofline.load_table(Path(a.table))
    if a.teacher:  # the teacher's edition: a file of its own, the student edition untouched
        from cudalab import teacher

        out = teacher.render(df, config, Path(a.out or f"results/{teacher.FILE_NAME}"))
        print(f"teacher's edition: {out.resolve()}")
        return 0
    try:
        out_path = Path(a.out or "results/report.html")
        out = report.render(df, Path(a.figures), config, out_path,
                            results_dir=Path(a.results),
                            judged=_judged(a, df, out_path.parent))
    except (CompareError, claims_file.ClaimsFileError) as exc:
        # a report.baselines folder missing, empty or unmatched; a claims.json unusable
        print(f"error: {exc}", file=sys.stderr)
        return 2
    print(f"report: {out.resolve()}")
    return 0


def cmd_slides(a: argparse.Namespace) -> int:
    from cudalab import claims_file, roofline, slide_deck, slides

    df = roofline.load_table(Path(a.table))
    try:
        judged = _judged(a, df, Path(a.out))
    except claims_file.ClaimsFileError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    written = slides.write_slides(df, Path(a.out), a.experiments, judged)
    print(f"slides: {len(written)} files, the deck: {(Path(a.out) / slide_deck.DECK).resolve()}")
    return 0


def cmd_compare(a: argparse.Namespace) -> int:
    from cudalab import compare_text, result_folders

    try:
        return compare_text.run_command(a.runs, a.baseline, a.threshold, a.csv, a.fail_on_slower,
                                   a.detail_runs, a.course)
    except result_folders.CompareError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2


def _add_compare(sub: Any) -> None:
    s = sub.add_parser("compare", help="compare result folders point by point",
                       description="Compare result folders (a run's results/ or "
                       "reports/reference/<gpu>/) point by point; the first (or --baseline) "
                       "is the baseline. A point is slower/faster when its time ratio is "
                       "beyond both the threshold and the samples' combined noise.")
    s.add_argument("runs", nargs="+", metavar="RUN")
    s.add_argument("--baseline", help="baseline folder (default: the first RUN)")
    s.add_argument("--threshold", type=float, default=0.05,
                   help="minimum relative difference that counts (default 0.05 = 5%%)")
    s.add_argument("--csv", help="write every comparison row to this CSV file")
    s.add_argument("--fail-on-slower", action="store_true",
                   help="exit 1 when any matched point is slower beyond the threshold")
    s.add_argument("--detail-runs", type=int, default=5,
                   help="print every point up to this many compared runs; beyond it only "
                   "points that are not 'same' (default 5)")
    s.add_argument("--course", action="store_true",
                   help="print the course's published numbers beside every RUN (a Markdown "
                   "table, one row per lesson) instead of the point-by-point comparison")
    s.set_defaults(fn=cmd_compare)


def _add_claims(sub: Any) -> None:
    s = sub.add_parser("claims", help="judge every claim of a run once: its claims.json",
                       description="Judge every claim of the run of a results.csv and write "
                       "claims.json (aggregate does this for every run; use it for a folder "
                       "from before claims.json).")
    s.add_argument("--table", default="results/results.csv")
    s.add_argument("--out", default=None, help="default: claims.json beside the table")
    s.add_argument("--schema", action="store_true", help="print claims.json's JSON schema")
    s.set_defaults(fn=cmd_claims)


def _claims_arg(s: Any) -> None:
    s.add_argument("--claims", default=None, help="the run's claims.json (default: beside "
                   "--table; a folder without one is judged once and claims.json written "
                   "beside the output)")


def _add_report(sub: Any) -> None:
    s = sub.add_parser("report")
    s.add_argument("--config", default=None, help="default: the run's own config.json in "
                   "--results, else config.yaml")
    s.add_argument("--table", default="results/results.csv")
    s.add_argument("--figures", default="results/figures")
    s.add_argument("--results", default="results")
    s.add_argument("--out", default=None, help="default: results/report.html, with "
                   "--teacher results/teacher.html")
    s.add_argument("--teacher", action="store_true", help="write the teacher's edition: "
                   "every lesson's questions answered from this run's numbers, with the "
                   "working")
    _claims_arg(s)
    s.set_defaults(fn=cmd_report)


def _at_least_one(text: str) -> int:
    """An argparse type: a whole number of at least 1."""
    n = int(text)
    if n < 1:
        raise argparse.ArgumentTypeError(f"{text}: give 1 or more")
    return n


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="cudalab", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="cmd", required=True)
    s = sub.add_parser("validate")
    s.add_argument("config", nargs="?", default="config.yaml")
    s.set_defaults(fn=cmd_validate)
    s = sub.add_parser("plan")
    s.add_argument("config", nargs="?", default="config.yaml")
    s.set_defaults(fn=cmd_plan)
    s = sub.add_parser("measure")
    s.add_argument("experiment")
    s.add_argument("--config", default="config.yaml")
    s.add_argument("--results", default="results")
    s.add_argument("--shard", default="", help="measure one shard of the grid: i/k")
    s.set_defaults(fn=cmd_measure)
    s = sub.add_parser("merge-shards", help="a lesson's manifest from its shards'")
    s.add_argument("experiment")
    s.add_argument("--count", type=int, required=True, help="how many shards it ran in")
    s.add_argument("--config", default="config.yaml")
    s.add_argument("--results", default="results")
    s.set_defaults(fn=cmd_merge_shards)
    s = sub.add_parser("aggregate")
    s.add_argument("--results", default="results")
    s.add_argument("--out", default="results/results.csv")
    s.add_argument("--manifests", nargs="*", default=None,
                   help="job manifests of this run (default: every results/raw/*/_manifest.json)")
    s.set_defaults(fn=cmd_aggregate)
    s = sub.add_parser("figures")
    s.add_argument("experiment")
    s.add_argument("--table", default="results/results.csv")
    s.add_argument("--out", default="results/figures")
    s.set_defaults(fn=cmd_figures)
    s = sub.add_parser("run-figures", help="the run's rooflines and GPU telemetry figures")
    s.add_argument("--table", default="results/results.csv")
    s.add_argument("--results", default="results", help="the folder whose telemetry is drawn")
    s.add_argument("--out", default="results/figures")
    s.add_argument("--jobs", type=_at_least_one, default=1,
                   help="draw the figures in this many processes (default 1)")
    s.set_defaults(fn=cmd_run_figures)
    s = sub.add_parser("compare-figures",
                       help="this run against report.baselines: comparison.csv and the "
                       "time-ratio figures")
    s.add_argument("--config", default=None, help="default: the run's own config.json "
                   "beside the table, else config.yaml")
    s.add_argument("--table", default="results/results.csv")
    s.add_argument("--out", default="results/figures")
    s.set_defaults(fn=cmd_compare_figures)
    _add_report(sub)
    s = sub.add_parser("slides", help="one 16:9 slide per lesson and a one-file HTML deck")
    s.add_argument("--table", default="results/results.csv")
    s.add_argument("--out", default="results/slides")
    s.add_argument("--experiments", nargs="*", default=None,
                   help="the lessons to show (default: every experiment of the table with a "
                   "figure)")
    _claims_arg(s)
    s.set_defaults(fn=cmd_slides)
    _add_claims(sub)
    _add_compare(sub)
    from cudalab import accept, doctor, site  # their subcommands live with their code
    from cudalab.exercises import cli as exercise_cli

    accept.add_parser(sub)
    doctor.add_parser(sub)
    site.add_parser(sub)
    exercise_cli.add_parser(sub)
    a = p.parse_args(argv)
    from cudalab.safe_io import InputRefused, shown

    try:
        return a.fn(a)
    except InputRefused as exc:  # a path given that cannot be read safely (safe_io says why)
        print(f"error: {exc}", file=sys.stderr)
    except OSError as exc:
        if exc.errno != errno.ENAMETOOLONG:
            raise
        print(f"error: {shown(exc.filename or '')}: a file or folder name is longer than the "
              "file system allows", file=sys.stderr)
    return 2


if __name__ == "__main__":
    raise SystemExit(main())
