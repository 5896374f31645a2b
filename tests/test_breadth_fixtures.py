"""The breadth bench's config fixtures (``bench/breadth/configs/<type>.json``, issue #32): each names its source
and the label the table shows, holds only fields the class declares, and the bench passes them to the config
class over its defaults, so that the row starts from the class defaults plus those few fields.

Expected values are the fixtures' own fields and the class defaults read from transformers 5.24 (needs
transformers: slow, marked by tests/conftest.py).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from conftest import bench_module

pytest.importorskip("transformers")

ROOT = Path(__file__).resolve().parents[1]
FIXTURES = sorted((ROOT / "bench/breadth/configs").glob("*.json"))


def _bench():
    return bench_module("learn_breadth")


def test_there_are_fixtures():
    assert len(FIXTURES) >= 8


@pytest.mark.parametrize("path", FIXTURES, ids=[p.stem for p in FIXTURES])
def test_a_fixture_names_its_source_and_only_sets_declared_fields(path):
    from transformers import AutoConfig

    raw = json.loads(path.read_text())
    assert len(raw.get("_source", "")) > 40 and raw.get("_config")
    fields = {k: v for k, v in raw.items() if not k.startswith("_")}
    assert fields, "a fixture states at least one field"
    cls = type(AutoConfig.for_model(path.stem, **fields))
    declared = set(getattr(cls, "__dataclass_fields__", {})) | set(getattr(cls, "attribute_map", {}))
    assert set(fields) <= declared, f"{path.stem}: {set(fields) - declared} not declared by {cls.__name__}"


def test_the_bench_passes_a_fixture_over_the_class_defaults():
    """deepseek_v2's fixture states ``num_experts_per_tok`` (None in DeepseekV2Config) and nothing else: the
    bench's config has it, and every other field is the class default; a type without a fixture is the class
    defaults alone."""
    from transformers import AutoConfig

    lb = _bench()
    cfg = lb.default_config("deepseek_v2")
    plain = AutoConfig.for_model("deepseek_v2").to_dict()
    assert plain["num_experts_per_tok"] is None and cfg["num_experts_per_tok"] == 2
    assert cfg["n_routed_experts"] == plain["n_routed_experts"] and cfg["hidden_size"] == plain["hidden_size"]
    assert lb.fixture_label("deepseek_v2") == "transformers tests"
    assert lb.fixture("llama") is None
    assert lb.default_config("llama")["num_hidden_layers"] == AutoConfig.for_model("llama").num_hidden_layers
