"""Hypothesis: malformed config.json files, policy conditions, scenario files and ruleset files always end in a
FitplanError (or a valid result), never another exception, and JSON output never carries NaN or infinity."""

from __future__ import annotations

import json
import math

import hypothesis.strategies as st
from hypothesis import HealthCheck, given, settings

import fitplan
from fitplan.errors import FitplanError
from fitplan.arch.architecture import spec_from_config
from fitplan.inputs.files import loads_json, loads_toml
from fitplan.rulesets.conditions import compile_condition

SCALARS = st.one_of(st.none(), st.booleans(), st.integers(-10**6, 10**12), st.floats(allow_nan=True, allow_infinity=True),
                    st.text(max_size=20))
CONFIG_KEYS = ["model_type", "hidden_size", "num_hidden_layers", "num_attention_heads", "num_key_value_heads", "head_dim",
               "intermediate_size", "vocab_size", "max_position_embeddings", "attention_dropout", "tie_word_embeddings",
               "num_local_experts", "num_experts_per_tok", "hidden_act", "attention_bias", "n_embd", "rotary_pct"]
BASE = {"model_type": "llama", "hidden_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4,
        "intermediate_size": 128, "vocab_size": 256}
FAST = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@FAST
@given(st.dictionaries(st.sampled_from(CONFIG_KEYS), SCALARS, max_size=6))
def test_fuzzed_configs_end_in_a_spec_or_a_fitplan_error(changes):
    try:
        spec = spec_from_config({**BASE, **changes}, file="config.json")
    except FitplanError as e:
        assert "config.json" in e.render()
        return
    assert spec.param_count > 0


CONDITION = st.recursive(
    st.dictionaries(st.sampled_from(["gt", "lt", "eq", "in", "not_in", "ge"]),
                    st.dictionaries(st.sampled_from(["peak_bytes", "method", "fits", "train_hours", "market", "x"]),
                                    st.one_of(SCALARS, st.lists(SCALARS, max_size=3)), min_size=1, max_size=2),
                    min_size=1, max_size=1),
    lambda inner: st.one_of(st.fixed_dictionaries({"not": inner}),
                            st.fixed_dictionaries({"all": st.lists(inner, max_size=3)}),
                            st.fixed_dictionaries({"any": st.lists(inner, max_size=3)}),
                            st.dictionaries(st.text(max_size=5), inner, max_size=2)),
    max_leaves=8)


@FAST
@given(CONDITION)
def test_fuzzed_conditions_compile_or_fail_cleanly(cond):
    try:
        compile_condition(cond)
    except FitplanError:
        pass


@FAST
@given(st.text(max_size=200))
def test_fuzzed_text_parses_or_fails_cleanly(text):
    for parse in (loads_json, loads_toml):
        try:
            data = parse(text, file="f")
        except FitplanError:
            continue
        assert "NaN" not in json.dumps(data, allow_nan=False)  # never a non-finite number


@FAST
@given(st.dictionaries(st.sampled_from(["per_device_train_batch_size", "max_seq_length", "num_train_epochs", "lora_dropout",
                                        "tokens_per_second", "mfu", "num_gpus", "lora_r", "params"]),
                       st.one_of(st.integers(-5, 10**12), st.floats(allow_nan=True, allow_infinity=True)), max_size=4))
def test_fuzzed_numbers_never_reach_the_report_as_nan(fields):
    try:
        e = fitplan.estimate(**{"params": "1B", "num_examples": 10, "tokens_per_example": 10, "gpu": "a100-80gb",
                                **{k: (str(v) if k == "params" else v) for k, v in fields.items()}})
    except FitplanError:
        return
    from fitplan.assess import assess
    from fitplan.output.console import dumps_json
    from fitplan.output.estimate_report import to_json

    text = dumps_json(to_json(assess(e, advice=False)))  # raises on NaN or infinity
    assert all(math.isfinite(v) for v in (e["peak_bytes"], e["device_total_bytes"]))
    assert text
