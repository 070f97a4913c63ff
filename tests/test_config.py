"""Config validation: a bad key or value stops the run, naming the key path and what is allowed."""

from __future__ import annotations

import copy
from pathlib import Path

import pytest
import yaml

from cudalab import config as cfg

ROOT = Path(__file__).resolve().parent.parent


def _err(c: dict) -> str:
    with pytest.raises(cfg.ConfigError) as e:
        cfg.validate(copy.deepcopy(c))
    return str(e.value)


def test_shipped_config_is_valid_and_defaults_fill_in():
    c = cfg.load(ROOT / "config.yaml")
    assert c["measurement"]["min_samples"] >= 1
    assert c["report"]["title"]
    m = c["experiments"]["matmul"]
    assert 1000 in m["sizes"] and [160, 240, 320] in m["sizes"]
    assert max(s if isinstance(s, int) else max(s) for s in m["sizes"]) >= 4096
    assert {8, 16, 32} <= set(m["tiles"])


def test_minimal_config_gets_every_default():
    c = cfg.validate({"experiments": {"matmul": {}}})
    assert c["measurement"]["target_cv"] == 0.02
    assert c["experiments"]["matmul"]["variants"]
    assert c["telemetry"]["nvidia_smi"] is True


@pytest.mark.parametrize(
    "bad, needles",
    [
        ({"measurment": {}}, ["(top level)", "'measurment'", "did you mean 'measurement'",
                              "allowed keys"]),
        ({"experiments": {"matmul": {"tile": [16]}}},
         ["experiments.matmul", "'tile'", "did you mean 'tiles'"]),
        ({"experiments": {"matmul": {"tiles": [7]}}},
         ["experiments.matmul.tiles[0]", "7", "allowed values", "[8, 16, 32]"]),
        ({"experiments": {"matmul": {"tiles": [64]}}},
         ["experiments.matmul.tiles[0]", "64", "[8, 16, 32]"]),
        ({"experiments": {"matmul": {"sizes": [0]}}},
         ["experiments.matmul.sizes[0]", "0", ">= 1"]),
        ({"experiments": {"matmul": {"sizes": [-5]}}}, ["experiments.matmul.sizes[0]", "-5"]),
        ({"experiments": {"matmul": {"sizes": [[1, 2]]}}},
         ["experiments.matmul.sizes[0]", "exactly 3"]),
        ({"experiments": {"matmul": {"variants": ["fancy"]}}},
         ["experiments.matmul.variants[0]", "'fancy'", "allowed values"]),
        ({"experiments": {"nosuch": {}}}, ["experiments", "'nosuch'", "allowed keys", "matmul"]),
        ({"measurement": {"min_samples": 0}}, ["measurement.min_samples", ">= 1"]),
        ({"measurement": {"target_cv": "low"}}, ["measurement.target_cv", "wrong type"]),
        ({"experiments": {}}, ["experiments"]),
    ],
)
def test_bad_values_are_rejected_with_key_path_and_allowed(bad, needles):
    base = {"experiments": {"matmul": {}}}
    c = {**base, **bad}
    msg = _err(c)
    for n in needles:
        assert n in msg, f"{n!r} not in:\n{msg}"


def test_every_problem_is_reported_at_once():
    msg = _err({"experiments": {"matmul": {"tiles": [7, 64], "variants": ["x"]}}})
    assert msg.count("\n  - ") == 3


def test_load_rejects_non_mapping_and_bad_yaml(tmp_path):
    p = tmp_path / "c.yaml"
    p.write_text("- a\n- b\n")
    with pytest.raises(cfg.ConfigError, match="mapping"):
        cfg.load(p)
    p.write_text("experiments: {matmul: [\n")
    with pytest.raises(cfg.ConfigError, match="not valid YAML"):
        cfg.load(p)


def test_grid_expansion_matches_config():
    from cudalab.experiments import REGISTRY

    c = cfg.validate({"experiments": {"matmul": {
        "sizes": [[160, 240, 320], 1000], "variants": ["cpu", "naive", "tiled"],
        "tiles": [8, 16, 32]}}})
    pts = REGISTRY["matmul"].points(c["experiments"]["matmul"])
    # per size: 1 cpu + 1 naive + 3 tiled
    assert len(pts) == 10
    assert len({p.point_id for p in pts}) == 10
    rect = [p for p in pts if p.params["m"] == 160]
    assert all((p.params["k"], p.params["n"]) == (240, 320) for p in rect)
    assert sum(not p.gpu for p in pts) == 2


def test_schema_file_documents_every_top_level_key():
    schema = yaml.safe_load((ROOT / "workflow/schemas/config.schema.yaml").read_text())
    for key, sub in schema["properties"].items():
        assert "description" in sub or "properties" in sub, key
