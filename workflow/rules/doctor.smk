# `cudalab doctor` runs first, as one job with the measure jobs' request and modules, and
# every measure job waits for it. Under Slurm, when a GPU experiment could not run (no GPU,
# no pycuda, a module that does not load, nvcc missing) the run stops with the doctor's
# table and no measure job is submitted; locally it only writes its table (a run without a
# GPU goes on). `slurm: {doctor: false}` turns it off. Also here: the watcher that reports
# Slurm jobs PENDING for a reason that will not clear.
import os
import time as _time

from cudalab import pending as cudalab_pending

DOCTOR_OK = f"{RESULTS}/doctor/ok"  # temp: made again by every run that submits measure jobs
DOCTOR_TABLE = f"{RESULTS}/doctor/doctor.md"  # the table (also .json), kept after the run
_SLURM = config["slurm"]
ANY_GPU = any(needs_gpu(e) for e in EXPERIMENTS)
_STARTED = _time.time()
_WATCH = []


def doctor_first(wildcards):
    """The measure rule's input: the doctor's flag. The same locally and under Slurm (and in
    dry runs), so switching executors never changes a measure job's inputs (a rerun)."""
    return ancient(DOCTOR_OK) if _SLURM["doctor"] else []


def start_pending_watch():
    """Called in onstart under Slurm: report jobs stuck in PENDING (see cudalab/pending.py)."""
    _WATCH.append(cudalab_pending.start(os.getcwd()))


def print_doctor_failure():
    """Called in onerror: show the doctor's table when it failed in this run."""
    table = Path(DOCTOR_TABLE)
    if table.is_file() and table.stat().st_mtime >= _STARTED:
        text = table.read_text()
        if "FAILED" in text.splitlines()[0]:
            print(f"\n{text}\n(no measure job was submitted; the table: {table})",
                  file=sys.stderr)


rule doctor:
    output:
        temp(DOCTOR_OK),
    params:
        fingerprint=cudalab_config.block_hash([_SLURM, ANY_GPU]),
        modules=" ".join(_SLURM["modules"]),  # the schema allows no shell characters
        need_gpu="yes" if ANY_GPU else "no",
        need_nvcc="yes" if ANY_GPU or "static_analysis" in EXPERIMENTS else "no",
        gpu_index=config["gpu_index"],
        python=sys.executable,
        root=workflow.basedir,
        table=DOCTOR_TABLE,
        table_json=DOCTOR_TABLE.replace(".md", ".json"),
    log:
        f"{RESULTS}/logs/doctor.log",
    envmodules:
        *_SLURM["modules"]
    # the same request as a measure job that needs a GPU (measure.smk)
    resources:
        gpu=1 if ANY_GPU else 0,
        runtime=_SLURM["runtime_min"],
        mem_mb=_SLURM["mem_mb"],
        cpus_per_task=_SLURM["cpus_per_task"],
        **{k: v for k, v in {
            "slurm_partition": _SLURM["partition"],
            "slurm_account": _SLURM["account"],
            "constraint": _SLURM["constraint"],
        }.items() if v},
        **({"gpu_model": _SLURM["gpu_model"]} if _SLURM["gpu_model"] and ANY_GPU else {}),
    shell:
        "PYTHONPATH={params.root:q}${{PYTHONPATH:+:$PYTHONPATH}} {params.python:q} -m cudalab.cli "
        "doctor --config '' --modules {params.modules} --need-gpu {params.need_gpu} "
        "--need-nvcc {params.need_nvcc} --gpu-index {params.gpu_index} "
        "--gate slurm --md {params.table:q} --json {params.table_json:q} > {log:q} 2>&1 && touch {output:q}"
