"""The one part of the build that pyproject.toml cannot declare: the kernels, templates and
schema stay in the project's layout (cuda/, reports/templates/, workflow/schemas/) and are
built into subpackages of cudalab (cudalab/resources.py's LAYOUT), so an installed package
carries them. Everything else is in pyproject.toml."""

import runpy
from pathlib import Path

from setuptools import find_namespace_packages, setup

HERE = Path(__file__).resolve().parent
# resources.py is read as a file: importing cudalab here would need its dependencies
LAYOUT: dict[str, str] = runpy.run_path(str(HERE / "cudalab" / "resources.py"))["LAYOUT"]
BUNDLED = {f"cudalab.{sub}": folder for sub, folder in LAYOUT.items()}

setup(
    packages=[*find_namespace_packages(include=["cudalab", "cudalab.*"]), *BUNDLED],
    package_dir=BUNDLED,
)
