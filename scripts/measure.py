"""Snakemake script: measure one experiment's grid (rule measure)."""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(snakemake.scriptdir).parent))  # noqa: F821 - set by Snakemake

from cudalab.logs import tee_to  # noqa: E402
from cudalab.runner import run_experiment  # noqa: E402

with tee_to(snakemake.log[0]):  # noqa: F821
    run_experiment(snakemake.config, snakemake.wildcards.experiment,  # noqa: F821
                   Path(snakemake.params.results))  # noqa: F821
