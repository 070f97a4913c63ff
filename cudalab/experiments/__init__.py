"""Experiment registry: an experiment is a folder (a subpackage) of this package whose
module defines an Experiment subclass with a `name` and a `lesson`; every such folder is
found here, so adding an experiment touches no list.

Folders elsewhere (a site's own lessons, a test's toy experiment) are found the same way
when their parent directory is listed in CUDALAB_EXPERIMENTS (os.pathsep-separated): it is
added to this package's search path, so such a folder is imported as
cudalab.experiments.<name> like the shipped ones.
"""

from __future__ import annotations

import importlib
import os
import pkgutil
from pathlib import Path

from cudalab import roofline
from cudalab.experiments.base import Experiment
from cudalab.experiments.lesson import Lesson

ENV_PATH = "CUDALAB_EXPERIMENTS"
REGISTRY: dict[str, Experiment] = {}
_SHIPPED = list(__path__)


def _search_path() -> list[str]:
    extra = [str(Path(p).resolve()) for p in os.environ.get(ENV_PATH, "").split(os.pathsep)
             if p.strip()]
    return _SHIPPED + [p for p in extra if p not in _SHIPPED]


def _experiments_of(module_name: str) -> list[Experiment]:
    module = importlib.import_module(module_name)
    found = [obj for obj in vars(module).values()
             if isinstance(obj, type) and issubclass(obj, Experiment)
             and obj is not Experiment and obj.__module__ == module.__name__ and obj.name]
    for cls in found:
        if not isinstance(getattr(cls, "lesson", None), Lesson):
            raise TypeError(f"experiment {cls.name!r} ({module_name}) declares no lesson: "
                            "set `lesson = LESSON`, a Lesson built in its folder's lesson.py")
    return [cls() for cls in found]


def discover() -> dict[str, Experiment]:
    """(Re)fill REGISTRY from every experiment folder on the search path, in course order
    (Experiment.order, then name). The dict is updated in place: modules that imported it
    see the new contents."""
    __path__[:] = _search_path()
    found: list[Experiment] = []
    for mod in pkgutil.iter_modules(__path__):
        if mod.ispkg and not mod.name.startswith("_"):
            found += _experiments_of(f"{__name__}.{mod.name}")
    REGISTRY.clear()
    for exp in sorted(found, key=lambda e: (e.order, e.name)):
        REGISTRY[exp.name] = exp
    # the roofline reads these declarations as data rather than reading the registry
    roofline.declare_device_experiments(device_experiments())
    return REGISTRY


def device_experiments() -> list[str]:
    """The lessons whose points are judged against the device's roofs: compared with its
    peaks (vs_device_peak) or with the peak of their own precision (precision_roofs)."""
    return [n for n, e in REGISTRY.items() if e.vs_device_peak or e.precision_roofs]


discover()
