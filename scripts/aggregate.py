"""Snakemake script: raw per-point records -> results/results.csv (rule aggregate)."""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(snakemake.scriptdir).parent))  # noqa: F821 - set by Snakemake

from cudalab.cli import main  # noqa: E402
from cudalab.logs import tee_to  # noqa: E402

with tee_to(snakemake.log[0]):  # noqa: F821
    rc = main(["aggregate", "--results", snakemake.params.results,  # noqa: F821
               "--out", snakemake.output[0],  # noqa: F821
               "--manifests", *snakemake.input])  # noqa: F821 - this run's experiments only
sys.exit(rc)
