"""On a GPU machine (pytest -m gpu): the size guard reads the GPU's memory from nvidia-smi
(no gpu_memory_gb in the config) and refuses exactly the points that cannot fit."""

from __future__ import annotations

import shutil

import pytest

from cudalab import config as cfg
from cudalab import guards
from cudalab.experiments import REGISTRY

pytestmark = pytest.mark.gpu


@pytest.mark.skipif(shutil.which("nvidia-smi") is None, reason="needs nvidia-smi")
def test_nvidia_smi_memory_matches_the_driver():
    import pycuda.driver as cuda

    cuda.init()
    smallest = min(cuda.Device(i).total_memory() for i in range(cuda.Device.count()))
    smi = guards.nvidia_smi_memory()
    assert smi is not None and abs(smi - smallest) / smallest < 0.05, (smi, smallest)


@pytest.mark.skipif(shutil.which("nvidia-smi") is None, reason="needs nvidia-smi")
def test_points_are_refused_exactly_when_they_do_not_fit():
    mem = guards.nvidia_smi_memory()
    # 46 000^2 floats: the largest edge the 32-bit-indexed kernels allow (~51 GB counted):
    # refused on a 40 GB card, accepted on an 80 GB one
    block = {"sizes": [4096, 46000], "variants": ["tiled"], "tiles": [32]}
    c = {"experiments": {"matmul": block}}
    pts = REGISTRY["matmul"].points(cfg.validate({"gpu_memory_gb": 1e5, **c})["experiments"]
                                    ["matmul"])
    too_big = [p for p in pts if REGISTRY["matmul"].gpu_bytes(p) > guards.GPU_MEMORY_SHARE * mem]
    notes: list[str] = []
    if too_big:
        with pytest.raises(cfg.ConfigError, match="from nvidia-smi") as e:
            cfg.validate(c, notes=notes)
        assert f"{len(too_big)} point(s) need more GPU memory" in str(e.value)
    else:
        cfg.validate(c, notes=notes)
    assert not any("GPU memory not checked" in n for n in notes)
    plan = guards.plan_estimate(cfg.validate({"experiments": {"vector_add": {}}}))
    assert "(nvidia-smi)" in plan[1], plan
