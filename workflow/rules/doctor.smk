# `cudalab doctor` runs first, as one job with the measure jobs' request and modules, and
# every measure job waits for it. Under Slurm, when a GPU experiment could not run (no GPU,
# no pycuda, a module that does not load, nvcc missing) the run stops with the doctor's
# table and no measure job is submitted; locally it only writes its table (a run without a
# GPU goes on). `slurm: {doctor: false}` turns it off. Also here: the watcher that reports
# Slurm jobs PENDING for a reason that will not clear.
import os
import time as _time

from cudalab import pending as cudalab_pending
from cudalab import slurm_request

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


rule doctor:
    output:
        temp(DOCTOR_OK),
    params:
        fingerprint=cudalab_config.block_hash([_SLURM, ANY_GPU]),
        modules=_SLURM["modules"],  # a list: `:q` quotes each name
        need_gpu="yes" if ANY_GPU else "no",
        need_nvcc="yes" if ANY_GPU or "static_analysis" in EXPERIMENTS else "no",
        gpu_index=config["gpu_index"],
        table=DOCTOR_TABLE,
        table_json=DOCTOR_TABLE.replace(".md", ".json"),
    log:
        f"{RESULTS}/logs/doctor.log",
    envmodules:
        *_SLURM["modules"]
    # a short check: the measure jobs' GPU request (and site settings) with a small allocation
    resources:
        **slurm_request.resources(
            _SLURM, 1 if ANY_GPU else 0,
            _SLURM["gpu_model"] if _SLURM["gpu_model"] and ANY_GPU else None, small=True),
    conda:
        CONDA_ENV
    shell:
        "{CUDALAB} doctor --config '' --modules {params.modules:q} --need-gpu {params.need_gpu}"
        " --need-nvcc {params.need_nvcc} --gpu-index {params.gpu_index}"
        " --gate slurm --md {params.table:q} --json {params.table_json:q} > {log:q} 2>&1"
        " && touch {output:q}"
