"""A GPU-model sweep on Slurm: `slurm.gpu_models: [a100, h100]` measures every experiment
once per model, each job its own allocation with `--gpus=<model>:1`, into a complete run
folder per model, results/gpu/<model>/ (raw/, telemetry/, logs/, results.csv, figures/):
results of different GPUs never overwrite or reuse each other. CPU-only experiments are
measured per model too (their job also asks for that model's GPU): what a sweep compares is
the node type, host CPU included. Each model gets its own doctor job, its table and its
figures; the one report (results/report.html) is drawn from the first model's folder and sets
every other model beside it (cudalab.compare). An empty list (the default) is a normal run
into results/ itself.

The workflow has one measure rule whose `folder` wildcard is one of `folders()`: the
no-sweep layout (results/raw/<experiment>/) is the folder `results`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


def gpu_models(config: dict[str, Any]) -> list[str]:
    return list(config.get("slurm", {}).get("gpu_models") or [])


def model_folder(results: str, model: str) -> str:
    return f"{results}/gpu/{model}"


def folders(config: dict[str, Any], results: str = "results") -> list[str]:
    """Every run folder a run measures into: results/, or one per GPU model."""
    models = gpu_models(config)
    return [model_folder(results, m) for m in models] if models else [results]


def model_of(folder: str, results: str = "results") -> str:
    """The GPU model a run folder is of ('' for results/ itself: no sweep)."""
    prefix = f"{results}/gpu/"
    return folder[len(prefix):] if folder.startswith(prefix) else ""


def doctor_tag(folder: str, results: str = "results") -> str:
    """The name of the doctor job that checks a folder's GPU: `doctor`, or
    `doctor_<model>` in a sweep (its table results/doctor/<tag>.md, its log
    results/logs/<tag>.log)."""
    model = model_of(folder, results)
    return f"doctor_{model}" if model else "doctor"


def measured_folder(config: dict[str, Any], results: str = "results") -> str:
    """The folder whose table, figures and telemetry the report is drawn from."""
    return folders(config, results)[0]


def other_model_folders(config: dict[str, Any], results: str = "results") -> list[str]:
    """The other models' folders: set beside the first one in the report."""
    return folders(config, results)[1:] if gpu_models(config) else []


@dataclass(frozen=True)
class JobCounts:
    """The jobs a run can submit (each is one sbatch allocation under Slurm)."""

    experiments: int
    models: int  # 0: no sweep
    gpu_experiments: int  # experiments with GPU points
    doctors: int

    @property
    def measure(self) -> int:
        return self.experiments * max(1, self.models)

    @property
    def gpu_measure(self) -> int:
        """Measure jobs that ask for a GPU (every job of a sweep does)."""
        return self.measure if self.models else self.gpu_experiments

    @property
    def total(self) -> int:
        return self.measure + self.doctors


def job_counts(config: dict[str, Any], experiments: list[str], gpu_experiments: int
               ) -> JobCounts:
    """Measure jobs (one per experiment, per model in a sweep) and doctor jobs (one, or one
    per model in a sweep; none with slurm.doctor: false or nothing to measure)."""
    models = len(gpu_models(config))
    doctors = max(1, models) if config["slurm"]["doctor"] and experiments else 0
    return JobCounts(len(experiments), models, gpu_experiments, doctors)


def plan_lines(config: dict[str, Any], experiments: list[str]) -> list[str]:
    """What `cudalab plan` adds for a sweep: the jobs per model."""
    models = gpu_models(config)
    if not models:
        return []
    n = job_counts(config, experiments, 0)
    lines = [f"  GPU-model sweep (slurm.gpu_models): {len(experiments)} experiment(s) x "
             f"{len(models)} model(s) = {n.measure} measure job(s)"
             + (f" + {n.doctors} doctor job(s) (one per model)" if n.doctors else "")
             + f"; results/gpu/<model>/ per model (its table and figures), the report sets "
             f"{models[0]} beside {', '.join(models[1:]) or 'nothing else'}"]
    for m in models:
        lines.append(f"    --gpus={m}:1  {len(experiments)} job(s): {', '.join(experiments)}"
                     f"  -> {model_folder('results', m)}/")
    return lines
