"""Where each kernel file of cuda/ belongs, paths relative to cuda/.

- A lesson's kernels lie in cuda/<lesson>/ (the lesson's folder name under
  cudalab/experiments/), and the lesson names them (Experiment.kernel_files).
- The framework's own kernels lie in cuda/common/: the stream-holding kernel of queued timing,
  the ceilings step's kernels, and the resolution floor's empty and tiny kernels.
- The exercises' starters lie in cuda/exercises/, one per exercise of the catalogue.

Kernels stay under cuda/ rather than beside the lesson's Python: the package builds cuda/ into
cudalab._kernels (resources.py), and nvcc, the static-analysis lesson and the build cache read
them all from that one folder.
"""

from __future__ import annotations

from pathlib import Path

from cudalab.resources import CUDA_DIR

HOLD_SOURCE = "common/hold.cu"  # holds the default stream while launches queue behind it
CEILINGS_SOURCE = "common/ceilings.cu"  # each GPU job's measured ceilings
FLOOR_SOURCE = "common/floor.cu"  # the empty and the tiny kernel of the resolution floor
FRAMEWORK_KERNELS = (HOLD_SOURCE, CEILINGS_SOURCE, FLOOR_SOURCE)
EXERCISES_FOLDER = "exercises"


def relative(path: Path, root: Path = CUDA_DIR) -> str:
    """A kernel file's name as the lessons and the config write it: its path under cuda/."""
    return path.relative_to(root).as_posix()


def built_kernels(root: Path = CUDA_DIR) -> list[Path]:
    """Every kernel of the lessons and the framework (cuda/<folder>/*.cu), the exercises'
    starters left out: what the static-analysis lesson analyses when it names no files."""
    return sorted(p for p in root.glob("*/*.cu") if p.parent.name != EXERCISES_FOLDER)
