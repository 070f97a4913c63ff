"""A GPU-model sweep on Slurm (issue 9): `slurm.gpu_models: [a100, h100]` measures every
experiment once per model, each job its own allocation with `--gpus=<model>:1`, into a
complete run folder per model, results/gpu/<model>/ (raw/, telemetry/): results of different
GPUs never overwrite or reuse each other. CPU-only experiments are measured per model too
(their job also asks for that model's GPU): what a sweep compares is the node type, host
CPU included. results.csv and the report are of the first model; the report puts the others
beside it (cudalab.compare). An empty list (the default) is a normal run into results/.
"""

from __future__ import annotations

from typing import Any


def gpu_models(config: dict[str, Any]) -> list[str]:
    return list(config.get("slurm", {}).get("gpu_models") or [])


def model_folder(results: str, model: str) -> str:
    return f"{results}/gpu/{model}"


def measured_folder(config: dict[str, Any], results: str = "results") -> str:
    """The folder whose raw/ and telemetry/ make this run's table and report."""
    models = gpu_models(config)
    return model_folder(results, models[0]) if models else results


def other_model_folders(config: dict[str, Any], results: str = "results") -> list[str]:
    """The other models' folders: baselines of the report."""
    return [model_folder(results, m) for m in gpu_models(config)[1:]]


def plan_lines(config: dict[str, Any], experiments: list[str]) -> list[str]:
    """What `cudalab plan` adds for a sweep: the jobs per model."""
    models = gpu_models(config)
    if not models:
        return []
    lines = [f"  GPU-model sweep (slurm.gpu_models): {len(experiments)} experiment(s) x "
             f"{len(models)} model(s) = {len(experiments) * len(models)} sbatch job(s), one "
             "allocation each; results/gpu/<model>/ per model, the report compares "
             f"{models[0]} with {', '.join(models[1:]) or 'nothing else'}"]
    for m in models:
        lines.append(f"    --gpus={m}:1  {len(experiments)} job(s): {', '.join(experiments)}"
                     f"  -> {model_folder('results', m)}/")
    return lines
