"""Every kernel file of cuda/ has exactly one owner: the lesson whose folder holds it (and
which names it), the framework (cuda/common/), or one exercise (its starter)."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

from cudalab import kernel_sources
from cudalab.exercises.catalog import EXERCISES
from cudalab.experiments import REGISTRY
from cudalab.resources import CUDA_DIR


def owners() -> list[tuple[str, str]]:
    """(kernel file under cuda/, its owner), one pair per naming."""
    named = [(f, f"lesson {name}") for name, exp in REGISTRY.items() for f in exp.kernel_files]
    named += [(f, "the framework") for f in kernel_sources.FRAMEWORK_KERNELS]
    named += [(f"{kernel_sources.EXERCISES_FOLDER}/{e.starter}", f"exercise {e.name}")
              for e in EXERCISES.values()]
    return named


def test_every_kernel_file_is_named_by_exactly_one_owner():
    on_disk = {kernel_sources.relative(p) for p in CUDA_DIR.rglob("*.cu")}
    count = Counter(f for f, _ in owners())
    assert not [f for f in on_disk if count[f] == 0], "kernel files nobody names"
    assert not [f for f, n in count.items() if n > 1], "kernel files named twice"
    assert not set(count) - on_disk, "named kernel files that do not exist"


def test_a_lessons_kernels_lie_in_its_own_folder():
    for name, exp in REGISTRY.items():
        for f in exp.kernel_files:
            assert Path(f).parent.as_posix() == name, f"{name}: {f} is not in cuda/{name}/"
    assert all(f.startswith("common/") for f in kernel_sources.FRAMEWORK_KERNELS)


def test_no_kernel_file_is_left_at_the_top_of_cuda():
    assert not list(CUDA_DIR.glob("*.cu")), "a kernel belongs in cuda/<lesson>/ or cuda/common/"


def test_the_static_analysis_default_is_every_lesson_and_framework_kernel():
    built = {kernel_sources.relative(p) for p in kernel_sources.built_kernels()}
    want = {f for f, owner in owners() if not owner.startswith("exercise")}
    assert built == want
