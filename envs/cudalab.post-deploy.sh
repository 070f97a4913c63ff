#!/usr/bin/env bash
# Snakemake runs this once inside a new --sdm conda env (envs/cudalab.yaml), from its working
# directory: the checkout, where config.yaml and results/ live. It installs this checkout's
# cudalab so the rules' `cudalab` entry point is there.
#
# Not a pip section of envs/cudalab.yaml: Snakemake copies that file to
# .snakemake/conda/<hash>.yaml and conda runs pip from there, so no relative path in it names
# the checkout. Editable (-e): Snakemake rebuilds the env only when envs/cudalab.yaml or this
# script change, so a copy of the sources would go stale as they are edited. No dependencies
# and no build isolation: conda installed them (setuptools and wheel included), offline.
# One env per checkout: a --conda-prefix shared by several checkouts would share this env,
# and with it the first checkout's sources.
set -euo pipefail
if ! grep -qs '^name = "cudalab"' pyproject.toml; then
    echo "envs/cudalab.post-deploy.sh: $PWD is not the cudalab checkout (no cudalab" \
         "pyproject.toml); run snakemake from the checkout" >&2
    exit 1
fi
python -m pip install --quiet --no-deps --no-build-isolation -e .
command -v cudalab >/dev/null
