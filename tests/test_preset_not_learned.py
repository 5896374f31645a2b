"""A model preset that the architecture files in force do not describe is unavailable alone (issue #32).

A learned file in the user's folders wins over the bundled one (fitplan/arch/archfile.py ``find``). Learned from a
config whose switches differ from a bundled preset's (Qwen3MoeConfig's class default ``norm_topk_prob = False``,
transformers 5.24 models/qwen3_moe/configuration_qwen3_moe.py, against ``norm_topk_prob = true`` in
rulesets/models/qwen3_moe.toml), it cannot serve that preset. The loader rejected the whole bundled directory then,
so every command failed, for every model; the preset is now reported when it is used, naming it, and the rest loads.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from fitplan.api import clear_arch_caches
from fitplan.arch.archfile import BUNDLED, NotLearned
from fitplan.rulesets import loader

CLASS_DEFAULT_FLAGS = {"values": {"hidden_act": "silu", "attention_bias": False, "norm_topk_prob": False},
                       "when": "hidden_act == 'silu' and not attention_bias and not norm_topk_prob"}
"""What a learning of Qwen3MoeConfig's defaults records as its switches: ``hidden_act = "silu"``,
``attention_bias = False``, ``norm_topk_prob = False`` (configuration_qwen3_moe.py), in the bundled file's form."""


@pytest.fixture
def class_default_file(tmp_path, monkeypatch) -> Path:
    """A user folder holding a qwen3_moe file whose switches are the class defaults' only (the bundled file with
    the switches such a learning states; its graphs stay the bundled ones, so it serves no estimate: the real
    learned pair is tests/test_learn_fields.py's), in force through ``FITPLAN_ARCH_DIR``."""
    d = tmp_path / "arch"
    d.mkdir()
    data = json.loads((BUNDLED / "qwen3_moe.json").read_text())
    data["flags"] = CLASS_DEFAULT_FLAGS
    (d / "qwen3_moe.json").write_text(json.dumps(data))
    shutil.copy(BUNDLED / "qwen3_moe.graphs.json", d)
    monkeypatch.setenv("FITPLAN_ARCH_DIR", str(d))
    monkeypatch.setenv("FITPLAN_NO_CACHE", "1")
    clear_arch_caches()
    yield d / "qwen3_moe.json"
    clear_arch_caches()


def test_the_bundled_directory_loads_and_the_preset_names_itself(class_default_file):
    rs = loader.load()
    assert {"qwen3-30b-a3b", "qwen3-235b-a22b", "llama-2-7b"} <= set(rs.models)  # nothing dropped
    assert rs.preset_spec(rs.models["llama-2-7b"]).num_hidden_layers == 32  # another type: as before
    with pytest.raises(NotLearned) as e:
        rs.preset_spec(rs.models["qwen3-30b-a3b"])
    assert e.value.message.startswith("model preset 'qwen3-30b-a3b' is unavailable: qwen3_moe: this config's "
                                      "switches (attention_bias=False, hidden_act='silu', norm_topk_prob=True)")
    assert str(class_default_file) in e.value.message
    assert e.value.file == str(loader.bundled_dir() / "models" / "qwen3_moe.toml")
    assert "remove it to use the bundled file" in e.value.suggestion


def test_the_commands_name_the_preset(class_default_file, cli_in_process):
    bad = cli_in_process("estimate", "--model", "qwen3-30b-a3b", "--gpu", "h100-sxm", "--optim", "adamw_torch",
                         "--precision", "bf16-mixed")
    assert bad.returncode == 2 and "Traceback" not in bad.stderr
    assert "model preset 'qwen3-30b-a3b' is unavailable" in bad.stderr
    ok = cli_in_process("estimate", "--model", "llama-2-7b", "--gpu", "h100-sxm", "--optim", "adamw_torch",
                        "--precision", "bf16-mixed")
    assert ok.returncode == 0, ok.stderr
    listed = cli_in_process("models", "list", "--format", "json")
    assert listed.returncode == 0, listed.stderr
    ids = {r["id"] for r in json.loads(listed.stdout)}
    assert "llama-2-7b" in ids and not ids & {"qwen3-30b-a3b", "qwen3-235b-a22b"}
    assert listed.stderr.count("warning: ") == 2 and "'qwen3-235b-a22b' is unavailable" in listed.stderr
    check = cli_in_process("rulesets", "check", str(loader.bundled_dir()))
    assert check.returncode == 0 and check.stderr.count("is unavailable") == 2


def test_a_preset_of_a_type_no_file_describes_is_unavailable_alone(tmp_path, cli_in_process):
    """A user's ruleset directory with a preset of a model type nobody learned (yet) loads; its other presets
    are used, and the unlearned one says which command learns it."""
    d = tmp_path / "rules"
    d.mkdir()
    (d / "models.toml").write_text(
        '[[model]]\nid = "new-lm"\nsource = "s"\nconfig = { model_type = "brand_new_lm", hidden_size = 64 }\n'
        '[[model]]\nid = "small-llama"\nsource = "s"\n'
        'config = { model_type = "llama", hidden_size = 256, intermediate_size = 512, num_hidden_layers = 2, '
        'num_attention_heads = 4, num_key_value_heads = 4, vocab_size = 1000 }\n')
    rs = loader.load(extra_dirs=[d])
    assert rs.preset_spec(rs.models["small-llama"]).num_hidden_layers == 2
    with pytest.raises(NotLearned) as e:
        rs.preset_spec(rs.models["new-lm"])
    assert e.value.message.startswith("model preset 'new-lm' is unavailable: unknown model_type 'brand_new_lm'")
    assert e.value.file == str(d / "models.toml") and e.value.field == "$.model.config.model_type"
    assert "learn-architecture" in e.value.suggestion
    out = cli_in_process("estimate", "--model", "new-lm", "--ruleset-dir", str(d), "--gpu", "h100-sxm",
                         "--optim", "adamw_torch", "--precision", "bf16-mixed")
    assert out.returncode == 2 and "model preset 'new-lm' is unavailable" in out.stderr


def test_a_preset_with_a_wrong_value_still_rejects_its_directory(tmp_path):
    """A mistake in the preset itself (a width that is no integer) is no fact about the installed files: the
    directory is refused as before, naming the preset and the field."""
    d = tmp_path / "rules"
    d.mkdir()
    (d / "models.toml").write_text('[[model]]\nid = "m"\nsource = "s"\n'
                                   'config = { model_type = "llama", hidden_size = "x" }\n')
    errors = loader.check_paths([d])
    assert len(errors) == 1 and "model 'm': hidden_size must be an integer" in errors[0]
