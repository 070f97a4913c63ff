"""Experiment registry: every module in this package that defines an Experiment subclass
with a `name` is found here, so adding an experiment touches no list."""

from __future__ import annotations

import importlib
import pkgutil

from cudalab.experiments.base import Experiment

REGISTRY: dict[str, Experiment] = {}


def _discover() -> None:
    found = []
    for mod in pkgutil.iter_modules(__path__):
        if mod.name == "base" or mod.name.startswith("_"):
            continue
        module = importlib.import_module(f"{__name__}.{mod.name}")
        for obj in vars(module).values():
            if (
                isinstance(obj, type)
                and issubclass(obj, Experiment)
                and obj is not Experiment
                and obj.__module__ == module.__name__
                and obj.name
            ):
                found.append(obj())
    for exp in sorted(found, key=lambda e: (getattr(e, "order", 100), e.name)):
        REGISTRY[exp.name] = exp


_discover()
