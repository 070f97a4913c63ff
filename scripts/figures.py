"""Snakemake script: one experiment's figures, PNG + SVG (rule figures_<experiment>)."""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(snakemake.scriptdir).parent))  # noqa: F821 - set by Snakemake

from cudalab.cli import main  # noqa: E402
from cudalab.logs import tee_to  # noqa: E402

with tee_to(snakemake.log[0]):  # noqa: F821
    rc = main(["figures", snakemake.params.experiment, "--table", snakemake.input[0],  # noqa: F821
               "--out", snakemake.params.out])  # noqa: F821
sys.exit(rc)
