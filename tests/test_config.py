"""Config validation: a bad key or value stops the run, naming the key path and what is allowed."""

from __future__ import annotations

import copy
import json
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


def test_schema_and_cross_field_problems_come_in_one_pass():
    msg = _err({"measurement": {"min_samples": 300, "max_samples": 20},
                "experiments": {"matmul": {"tiles": [7],
                                           "register_tiles": [{"rt": 2, "bt": 128, "bk": 8}]},
                                "transfer": {"min_bytes": 8192, "max_bytes": 4096}}})
    for needle in ["experiments.matmul.tiles[0]", "measurement.min_samples: 300 is larger",
                   "experiments.matmul.register_tiles[0]", "experiments.transfer.min_bytes"]:
        assert needle in msg, msg


@pytest.mark.parametrize("bad, needle", [
    ({"measurement": {"min_samples": 3.0}}, "measurement.min_samples: 3.0 has the wrong type"),
    ({"experiments": {"matmul": {"sizes": [64.0]}}}, "sizes[0]: 64.0 has the wrong type"),
    ({"experiments": {"matmul": {"tiles": [16.0]}}}, "tiles[0]: 16.0 is not allowed"),
    ({"experiments": {"matmul": {"naive_block": True}}}, "naive_block: True is not allowed"),
    ({"measurement": {"target_cv": float("nan")}}, "target_cv: nan is not allowed"),
    ({"experiments": {"matmul": {"tolerance": float("inf")}}}, "tolerance: inf is not allowed"),
])
def test_whole_numbers_are_integers_and_nan_is_never_a_number(bad, needle):
    c = {"experiments": {"matmul": {}}}
    c.update({k: v for k, v in bad.items() if k != "experiments"})
    c["experiments"]["matmul"].update(bad.get("experiments", {}).get("matmul", {}))
    assert needle in _err(c)


def test_a_cross_field_rule_on_a_malformed_value_does_not_crash():
    # atomics' check unpacks each launch as (grid, block): a string must not crash it
    msg = _err({"experiments": {"atomics": {"counter_launches": ["ab"]}}})
    assert "experiments.atomics.counter_launches[0]" in msg


def test_duplicate_yaml_keys_name_both_lines(tmp_path):
    p = tmp_path / "c.yaml"
    p.write_text("experiments:\n  matmul:\n    sizes: [256]\n    sizes: [512]\n")
    with pytest.raises(cfg.ConfigError, match=r"duplicate key 'sizes' \(first given on line 3, "
                                               r"again on line 4\)"):
        cfg.load(p)
    p.write_text("a: &x {b: 1}\nexperiments:\n  <<: {}\n  matmul: {}\n")  # merge keys are fine
    assert cfg.read_mapping(p)["experiments"] == {"matmul": {}}


def test_size_guards_use_gpu_memory_gb_and_max_points():
    from cudalab import guards

    ok = {"gpu_memory_gb": 80, "experiments": {"matmul": {"sizes": [4096]}}}
    cfg.validate(copy.deepcopy(ok))
    msg = _err({"gpu_memory_gb": 4, "experiments": {"matmul": {"sizes": [4096, 20000]}}})
    assert "experiments.matmul:" in msg and "-m20000-k20000-n20000-tile8 needs 9.6 GB" in msg
    assert "4096" not in msg  # only the points that do not fit
    c = cfg.validate({"max_points": 200, "experiments": {"vector_add": {}}})
    # 24 points and the block-rate probe's 60
    assert guards.plan_estimate(c)[0].startswith("  size: 84 grid points (max_points 200)")
    assert "max_points (83)" in _err({"max_points": 83, "experiments": {"vector_add": {}}})


def test_notes_say_what_could_not_be_checked(monkeypatch):
    from cudalab import guards

    monkeypatch.setattr(guards, "nvidia_smi_memory", lambda: None)
    notes: list[str] = []
    cfg.validate({"experiments": {"static_analysis": {"nvcc": "nvcc-no-such-version"}}},
                 notes=notes)
    assert any("archs not checked" in n and "nvcc-no-such-version" in n for n in notes)
    assert not any("GPU memory" in n for n in notes)  # no GPU point: nothing to check
    cfg.validate({"experiments": {"vector_add": {}}}, notes=notes)
    assert any("GPU memory not checked" in n for n in notes)


def test_exponent_floats_without_a_dot_are_numbers(tmp_path, validated):
    """YAML 1.1 reads 1e-6 as a string; json.dumps writes small floats that way, and the
    workflow's jobs read results/config.json through the same loader."""
    from cudalab import config as cfg

    (tmp_path / "c.yaml").write_text(
        "experiments:\n  vector_add:\n    sizes: [1000]\n    tolerance: 1e-6\n")
    c = cfg.load(tmp_path / "c.yaml")
    assert c["experiments"]["vector_add"]["tolerance"] == 1e-6
    full = validated(c)
    (tmp_path / "config.json").write_text(json.dumps(full))
    again = cfg.load(tmp_path / "config.json")
    assert again == full  # the jobs read exactly what the workflow validated
    assert isinstance(again["experiments"]["vector_add"]["tolerance"], float)
