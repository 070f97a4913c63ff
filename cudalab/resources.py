"""Where the package finds its non-Python files: the CUDA kernels, the report templates and
the config schema. Every module asks here, so the answer is the same everywhere.

The project keeps them in its own layout (top-level cuda/, reports/templates/,
workflow/schemas/); a built package carries copies inside itself (setup.py maps each folder
to a subpackage of cudalab, see LAYOUT). So an installed cudalab reads its own copies, and a
checkout (editable install, or PYTHONPATH) reads the project's folders.
"""

from __future__ import annotations

from pathlib import Path

PACKAGE_DIR = Path(__file__).resolve().parent
# The folder cudalab is imported from (a checkout or site-packages): a child process that
# must run this same copy of cudalab gets it on its PYTHONPATH.
IMPORT_ROOT = PACKAGE_DIR.parent

# subpackage of cudalab in a built package -> the folder it is copied from in the checkout
LAYOUT = {
    "_kernels": "cuda",
    "_templates": "reports/templates",
    "_schemas": "workflow/schemas",
}


def locate(subpackage: str) -> Path:
    """The folder holding one kind of resource: the installed copy where there is one, else
    the checkout's folder. The installed copy goes first: beside site-packages the checkout's
    path may name some other project's folder (cuda-python installs a `cuda` package there)."""
    installed = PACKAGE_DIR / subpackage
    return installed if installed.is_dir() else IMPORT_ROOT / LAYOUT[subpackage]


CUDA_DIR = locate("_kernels")
TEMPLATES_DIR = locate("_templates")
SCHEMAS_DIR = locate("_schemas")
CONFIG_SCHEMA = SCHEMAS_DIR / "config.schema.yaml"
