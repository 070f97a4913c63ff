"""The Slurm request of a job, from the config's `slurm:` block: one place for the resources
every GPU-capable rule asks for.

snakemake-executor-plugin-slurm turns them into sbatch flags: gpu -> --gpus=N (with
gpu_model: --gpus=<model>:N), runtime -> -t (minutes), mem_mb -> --mem, cpus_per_task ->
--cpus-per-task, slurm_partition -> -p, slurm_account -> -A, qos -> --qos, constraint ->
-C. Empty site settings are left out, so the cluster's defaults apply. Locally only `gpu` counts
(profiles/default caps it at 1). Every string here passed the config schema's whole-value
grammars (no spaces, quotes, newlines or leading dashes), and the plugin quotes them again.
"""

from __future__ import annotations

import shlex
from typing import Any

Value = Any  # an int or str, or a function of a job's wildcards (Snakemake calls it)


def resources(slurm: dict[str, Any], gpu: Value, gpu_model: Value | None = None,
              small: bool = False) -> dict[str, Value]:
    """The resources block of one rule. `gpu_model` is only set where the job asks for a
    GPU (the plugin would write --gpus=<model>:0 for a CPU job); `small` is the doctor's
    short check: one CPU, a few GB, a few minutes, the same GPU request."""
    out: dict[str, Value] = {
        "gpu": gpu,
        "runtime": min(10, slurm["runtime_min"]) if small else slurm["runtime_min"],
        "mem_mb": min(4000, slurm["mem_mb"]) if small else slurm["mem_mb"],
        "cpus_per_task": 1 if small else slurm["cpus_per_task"],
    }
    site = {"slurm_partition": slurm["partition"], "slurm_account": slurm["account"],
            "qos": slurm.get("qos", ""), "constraint": slurm["constraint"]}
    out.update({k: v for k, v in site.items() if v})
    if gpu_model:
        out["gpu_model"] = gpu_model
    return out


def modules_guard(modules: list[str]) -> str:
    """Shell put before a job's command: it fails (status 1, a message naming the module on
    stderr) unless every module is loaded, i.e. in LOADEDMODULES (Lmod and Environment
    Modules both keep it). Snakemake's env-modules runs `module purge && module load X;
    <command>`, so a module that does not load would otherwise leave the job running with
    the node's default nvcc. `cuda` is loaded when LOADEDMODULES has `cuda/12.4`. '' when
    there is nothing to check."""
    if not modules:
        return ""
    names = " ".join(shlex.quote(m) for m in modules)
    return (f'_ok=1; for _m in {names}; do case ":${{LOADEDMODULES:-}}:" in '
            '*":$_m:"*|*":$_m/"*) ;; '
            '*) echo "cudalab: module $_m is not loaded in this job (LOADEDMODULES='
            r'${LOADEDMODULES:-}): its \`module load\` failed, or another module of the list '
            'is unknown (Lmod then loads none of them; its error, in the Slurm log of the job, '
            'names the unknown one). Fix slurm.modules in config.yaml (module avail / '
            'module spider $_m list what exists on the compute node)." >&2; _ok=0;; esac; done; '
            '[ "$_ok" = 1 ] && ')
