"""Activation offloading (``activation_offloading``: torchtune, trl, trl_sync; src/fitplan/trace/offload.py).

What runs on the CPU is measured: TRL's hooks without streams (``trl_sync``) by the torch referee
(fitplan-torch ``offload.py``: the pack copies a saved tensor of at least 1 KiB off the live-storage counter's
view, the unpack copies it back). The streams' forward stash, the pinned host memory and the copy time are derived
here by hand from the sources (torchtune @ 30b8519 ``torchtune/training/_activation_offloading.py``, trl 1.16.0
``trl/models/activation_offloading.py``, torch 2.13 ``ATen/core/CachingHostAllocator.h``). Every scenario states
``optim`` and ``precision``.
"""

from __future__ import annotations

from pathlib import Path

import pytest

import fitplan
from fitplan import FitplanError
from fitplan.inputs.recipes import recipe_fields
from referee_support import fitplan_torch_referee

ROOT = Path(__file__).resolve().parents[1]
CONFIGS = ROOT / "tests" / "data" / "configs"

# Llama-3.1-8B (its config.json: h = 4096, 32 layers, V = 128256), b = 2, s = 2048, bf16 weights, CUDA
B, S, H, L, V = 2, 2048, 4096, 32, 128256
LAYER_INPUT = 2 * B * S * H  # a decoder layer's input, bf16: 33,554,432 = 2^25 bytes
NORM_X = 4 * B * S * H  # the final RMSNorm's fp32 input (hidden_states.to(torch.float32)): 2^26
NORM_R = 4 * B * S  # its rsqrt, fp32 per row: 16,384 = 2^14
LORA = dict(method="lora", lora_r=8, lora_target_modules=("q_proj", "v_proj"), autocast_adapter_dtype=False)


def _llama_8b(offload: str, loss: str = "chunked_compiled", **extra):
    extra = {**LORA, "gradient_checkpointing": True, **extra}
    return fitplan.estimate(model="llama-3.1-8b", precision="bf16-true", dtype="bfloat16", optim="adamw_torch_fused",
                            per_device_train_batch_size=B, max_seq_length=S, loss_implementation=loss,
                            activation_offloading=offload, **extra)


# --------------------------------------------------------------------------- by hand from the sources


def test_torchtune_moves_the_layer_checkpoints_to_pinned_host_memory():
    # Under non-reentrant checkpointing the outer hooks see each layer's positional argument only (the hidden states;
    # transformers' GradientCheckpointingLayer binds the rest with functools.partial): 32 packs of 2^25 bytes. The
    # final norm runs inside the hooks (torchtune wraps the model's forward; only the output projection is under
    # NoOpManager and the loss outside): RMSNorm's pow saves x (fp32), rsqrt its result, the mul both again, each a
    # pack of its own (torchtune copies every pack). Pinned blocks are rounded up to a power of two; all are
    # powers of two already.
    e = _llama_8b("torchtune")
    host = L * LAYER_INPUT + 2 * NORM_X + 2 * NORM_R
    assert e["activation_offload_host_bytes"] == host == 1_207_992_320
    assert e["activation_offload_copy_bytes"] == host
    assert e["offload_host_bytes"]["activations"] == host
    assert e["cpu_offload_bytes"] == host  # one GPU on the node


def test_torchtune_keeps_five_packs_on_the_gpu_until_the_backward_starts():
    # Without offloading every layer input h_0..h_31 is kept by its checkpoint. With it, h_0 stays anyway (peft's
    # enable_input_require_grads makes the embedding output a leaf that AccumulateGrad holds) and the stream's
    # forward stash still holds the last 5 packs when the forward returns: h_31 and the final norm's 4 (x and its
    # rsqrt, already kept by their saves). So 30 layer inputs leave the GPU.
    none, tt = _llama_8b("none"), _llama_8b("torchtune")
    assert none["step_trace"].retained_bytes - tt["step_trace"].retained_bytes == 30 * LAYER_INPUT
    assert tt["peak_bytes"] < none["peak_bytes"]


def test_without_streams_only_the_leaf_and_the_keyword_arguments_stay():
    # trl_sync (use_streams=False): no stash, and TRL's hooks pack the loss's saves too (the chunked loss's bf16
    # chunks, its targets and row statistics); what the forward leaves on the GPU: h_0 (the leaf), what the
    # checkpoints keep as keywords (cos and sin, (1, s, 128) bf16 each, and position_ids (1, s) int64) and the
    # loss's 8-byte token count (under 1 KiB: not offloaded; one 512-byte allocator block)
    e = _llama_8b("trl_sync")
    assert e["step_trace"].retained_bytes == LAYER_INPUT + 2 * (S * 128 * 2) + S * 8 + 512


def test_trl_with_streams_keeps_its_last_five_packs_and_copies_a_storage_once_while_stashed():
    # The hf loss inside TRL's hooks: after the layers' 32 packs and the final norm's (x, r, x, r), log_softmax packs
    # its fp32 output (4·b·s·V) and nll_loss packs it again with the target (the shifted labels' clone, 8·b·s): the
    # stash's last five at the end of the forward are r, logp, logp, target with x before them... ids: x(33) r(34)
    # x(35) r(36) logp(37) logp(38) target(39): the stash keeps ids 35..39: x, r, logp, target on the GPU.
    # TRL skips a storage still in its stash (x, r, logp are copied once each).
    trl, sync = _llama_8b("trl", "hf"), _llama_8b("trl_sync", "hf")
    logp, target = 4 * B * S * V, 8 * B * S
    assert trl["step_trace"].retained_bytes - sync["step_trace"].retained_bytes == NORM_X + NORM_R + logp + target
    pow2 = 1 << (logp - 1).bit_length()  # 2,101,346,304 -> 2^31
    assert trl["activation_offload_host_bytes"] == L * LAYER_INPUT + NORM_X + NORM_R + pow2 + target
    assert trl["activation_offload_copy_bytes"] == L * LAYER_INPUT + NORM_X + NORM_R + logp + target


def test_the_copies_cost_pcie_time_hidden_with_streams_exposed_without():
    # every micro-step copies its packs to the host and back: 2 · copied bytes · k at 25 GB/s (builtin/time/comm.py
    # PCIE_HOST_GBPS); with streams they join the offload copies the compute can hide, without they are exposed
    k = 4
    none = _llama_8b("none", gradient_accumulation_steps=k, gpu="rtx-4090")
    tt = _llama_8b("torchtune", gradient_accumulation_steps=k, gpu="rtx-4090")
    sync = _llama_8b("trl_sync", gradient_accumulation_steps=k, gpu="rtx-4090")
    assert tt["offload_seconds_per_step"] == pytest.approx(2 * tt["activation_offload_copy_bytes"] * k / 25e9)
    copies = 2 * sync["activation_offload_copy_bytes"] * k / 25e9
    assert sync["exposed_transfer_seconds"] - none["exposed_transfer_seconds"] == pytest.approx(copies)
    assert sync["step_seconds"] - none["step_seconds"] == pytest.approx(copies)


def test_an_unknown_mode_is_refused():
    with pytest.raises(FitplanError) as e:
        _llama_8b("cpu")
    assert e.value.field == "$.training.activation_offloading"
    assert "one of none, torchtune, trl, trl_sync, unsloth, got 'cpu'" in e.value.message


# --------------------------------------------------------------------------- recipe import


TORCHTUNE = ("model:\n  _component_: torchtune.models.llama3_2.lora_llama3_2_1b\n  lora_attn_modules: [q_proj]\n"
             "dtype: bf16\nenable_activation_checkpointing: True\n")


@pytest.mark.parametrize(("text", "want"), [
    (TORCHTUNE + "enable_activation_offloading: True\n", {"activation_offloading": "torchtune", "gradient_checkpointing": True}),
    (TORCHTUNE + "enable_activation_offloading: False\n", {"gradient_checkpointing": True}),
    # axolotl @ 067b021: offloading turns the Trainer's checkpointing off; adapters are not re-wrapped
    ("base_model: x/y\nadapter: lora\nactivation_offloading: true\ngradient_checkpointing: true\n",
     {"activation_offloading": "trl", "gradient_checkpointing": False}),
    ("base_model: x/y\nadapter: lora\nactivation_offloading: legacy\n",
     {"activation_offloading": "trl_sync", "gradient_checkpointing": False}),
    # a full fine-tune is wrapped in non-reentrant checkpoints again (ac_wrap_hf_model); "offload" is the old spelling
    ("base_model: x/y\ngradient_checkpointing: offload\n", {"activation_offloading": "trl", "gradient_checkpointing": True}),
    ("base_model: x/y\nactivation_offloading: true\n", {"activation_offloading": "trl", "gradient_checkpointing": True}),
])
def test_recipes_import_activation_offloading(tmp_path, text, want):
    path = tmp_path / "recipe.yaml"
    path.write_text(text)
    fields, _ = recipe_fields(path)
    assert {k: fields.get(k) for k in want} == want
    if "activation_offloading" not in want:
        assert "activation_offloading" not in fields


def test_an_axolotl_offloading_value_it_does_not_know_names_file_key_and_value(tmp_path):
    path = tmp_path / "recipe.yml"
    path.write_text("base_model: x/y\nactivation_offloading: gpu\n")
    with pytest.raises(FitplanError) as e:
        recipe_fields(path)
    assert (e.value.file, e.value.field, e.value.value) == (str(path), "$.activation_offloading", "gpu")


# --------------------------------------------------------------------------- the torch referee (trl_sync)


CASES = [
    # (model, precision, method, checkpointing): checkpointed layer inputs, every saved tensor, autocast's weight
    # copies under the LM head's NoOpManager, an MoE layer, a fused QKV projection, LayerNorm and dropout (GPT-2)
    ("tiny-llama", "bf16-true", "lora", True),
    ("tiny-llama", "bf16-true", "full", False),
    ("tiny-llama", "32-true", "lora", False),
    ("tiny-llama", "bf16-mixed", "full", False),
    ("tiny-mistral", "bf16-true", "lora", True),
    ("tiny-mixtral", "bf16-true", "full", False),
    ("tiny-phi3", "32-true", "full", False),
    ("tiny-gpt2", "bf16-mixed", "full", True),
]


@pytest.mark.parametrize(("name", "precision", "method", "ckpt"), CASES, ids=lambda v: str(v))
def test_synchronous_offloading_against_torch(name, precision, method, ckpt):
    fitplan_torch = fitplan_torch_referee()
    lora = dict(method="lora", lora_r=8, lora_target_modules=("q_proj", "v_proj")) if method == "lora" else {}
    est = fitplan.estimate(model=str(CONFIGS / name / "config.json"), precision=precision, optim="adamw_torch",
                           per_device_train_batch_size=2, max_seq_length=64, gradient_checkpointing=ckpt,
                           loss_implementation="hf", device="cpu", activation_offloading="trl_sync", **lora)
    report = fitplan_torch.validate(est, mode="cpu", memtracker=False)
    errors = {k: c["relative_error"] for k, c in report["components"].items()}
    assert all(v == 0 for v in errors.values()), errors
    assert report["peak_phase"]["predicted"] == report["peak_phase"]["measured"]


def test_the_referee_packs_what_fitplan_copies():
    # the referee's hooks count the bytes they copy in one forward: fitplan's activation_offload_copy_bytes
    fitplan_torch = fitplan_torch_referee()
    import torch

    from fitplan_torch.estimation_bridge import run_config
    from fitplan_torch.single import build_all

    est = fitplan.estimate(model=str(CONFIGS / "tiny-llama" / "config.json"), precision="bf16-true", optim="adamw_torch",
                           per_device_train_batch_size=2, max_seq_length=64, gradient_checkpointing=True,
                           loss_implementation="hf", device="cpu", activation_offloading="trl_sync", method="full")
    assert fitplan_torch is not None
    model, _, batch = build_all(run_config(est, {"memtracker": False}, "cpu"))
    loss = model(**batch).loss
    hooks = model._fitplan_offload
    assert hooks.host_bytes == est["activation_offload_copy_bytes"] > 0
    loss.backward()
    assert all(p.grad is not None and torch.isfinite(p.grad).all() for p in model.parameters())


def test_the_referee_refuses_streams():
    fitplan_torch = fitplan_torch_referee()
    est = fitplan.estimate(model=str(CONFIGS / "tiny-llama" / "config.json"), precision="bf16-true", optim="adamw_torch",
                           per_device_train_batch_size=1, max_seq_length=16, device="cpu", activation_offloading="trl")
    with pytest.raises(FitplanError, match="without streams"):
        fitplan_torch.validate(est, mode="cpu", memtracker=False)


@pytest.mark.parametrize("extra", [dict(activation_offloading="trl"), dict(method="qlora", load_in_8bit=True)])
def test_trl_trainers_refuse_what_their_traces_do_not_model(extra):
    # builtin/trl/ builds the policy's and the reference's traces itself (DPO's chosen and rejected rows, ...)
    kw = {"method": "lora", **extra}
    with pytest.raises(FitplanError) as e:
        fitplan.estimate(model="llama-3.1-8b", precision="bf16-true", optim="adamw_torch", trainer="dpo",
                         lora_target_modules=("q_proj",), **kw)
    assert e.value.field in ("activation_offloading", "load_in_8bit")


def test_the_stash_is_a_window_of_tensor_ids_that_only_an_offloaded_pack_moves():
    # torchtune @ 30b8519 pack_tensor: tensor_id = get_tensor_id() for every pack; only a pack that is offloaded runs
    # "for id in fwd_stash: if id <= tensor_id - max_fwd_stash_size: del" and stashes itself
    from fitplan.trace.offload import OffloadPlan, Stash

    st = Stash(OffloadPlan({}, {}, {}, 5, 0, 0))
    assert st.push((10, 11)) == []  # ids 1, 2
    assert st.push((-1, -1, -1)) == []  # ids 3-5: a parameter, small tensors: nothing leaves
    assert st.push((12,)) == [10]  # id 6 drops ids <= 1
    assert st.order == [11, 12]
    assert st.push((-1,) * 10) == [] and st.order == [11, 12]  # still stashed: no offloaded pack came
    assert st.clear() == [11, 12] and not st.holds(11)
    sync = Stash(OffloadPlan({}, {}, {}, 0, 0, 0))  # use_streams=False: nothing is kept
    assert sync.push((10, -1, 11)) == [10, 11]


def test_what_is_derived_from_the_source_says_so():
    # the referee measures trl_sync; the streams' stash and 8-bit LoRA are read from the source
    streams = _llama_8b("torchtune", device="cpu")["memory_confidence"]["activations"]
    assert streams["level"] == "source" and "stash" in streams["basis"]
    assert _llama_8b("trl_sync", device="cpu")["memory_confidence"]["activations"]["level"] == "exact"


def test_trls_sft_config_offloads_with_streams_and_keeps_checkpointing(tmp_path):
    # trl 1.16 SFTTrainer.training_step: with self.maybe_activation_offload_context (get_act_offloading_ctx_manager)
    from fitplan.inputs.importers import training_args_fields

    path = tmp_path / "args.json"
    path.write_text('{"activation_offloading": true, "gradient_checkpointing": true}')
    fields, _ = training_args_fields(path)
    assert (fields["activation_offloading"], fields["gradient_checkpointing"]) == ("trl", True)
    path.write_text('{"activation_offloading": "yes"}')
    with pytest.raises(FitplanError) as e:
        training_args_fields(path)
    assert (e.value.file, e.value.field, e.value.value) == (str(path), "$.activation_offloading", "yes")
    # SFTConfig's default (to_json_string writes it): false states no mode, so a recipe's or scenario's stays
    path.write_text('{"activation_offloading": false}')
    assert "activation_offloading" not in training_args_fields(path)[0]
    path.write_text('{"activation_offloading": 1}')  # TRL's field is a bool: 1 is no value of it
    with pytest.raises(FitplanError) as e:
        training_args_fields(path)
    assert (e.value.message, e.value.field) == ("activation_offloading must be true or false, got 1",
                                                "$.activation_offloading")


# --------------------------------------------------------------------------- one declaration (issue #26)


def test_activation_offloading_is_declared_once_by_the_activations_plugin(tmp_path):
    # builtin/activations.py's Setting gives the field, its flag, the form's choices and the TOML export
    import tomllib

    import attrs
    import click

    from fitplan.app.options import scenario_from, scenario_options
    from fitplan.cli.commands.plugins import listing
    from fitplan.context import get_context
    from fitplan.inputs.scenario import Training
    from fitplan.output.exports import scenario_toml
    from fitplan.web.api import field_rows

    assert "activation_offloading" not in attrs.fields_dict(Training)  # no hand-written field
    ctx = get_context()
    rows = {r["name"]: r for r in listing(ctx.registry)["plugins"]}
    assert rows["fitplan.builtin.activations"]["settings"] == ["activation_offloading", "liger_kernel"]
    modes = ["none", "torchtune", "trl", "trl_sync", "unsloth"]  # docs/memory-model.md "Activation offloading"
    form = {r["field"]: r for r in field_rows(ctx)}["activation_offloading"]
    assert (form["name"], form["section"], form["default"], form["choices"]) == (
        "activation-offloading", "training", "none", modes)
    command = scenario_options(click.command()(lambda **kw: None))
    option = next(p for p in command.params if p.name == "activation_offloading")
    assert option.opts == ["--activation-offloading"] and option.help.startswith("none (default) | torchtune")
    options = command.make_context("estimate", ["--params", "1B", "--activation-offloading", "trl_sync"]).params
    assert scenario_from(options).scenario.training.activation_offloading == "trl_sync"
    s = fitplan.Scenario().replace(params="1B", loss_implementation="liger", activation_offloading="trl")
    text = scenario_toml(s)
    assert 'loss_implementation = "liger"\nactivation_offloading = "trl"\n' in text  # after= loss_implementation
    assert fitplan.scenario_from_dict(tomllib.loads(text)) == s
    with pytest.raises(FitplanError) as e:
        fitplan.scenario_from_dict({"training": {"activation_offloading": "torchtun"}}, file="job.toml")
    assert (e.value.file, e.value.field, e.value.suggestion) == ("job.toml", "$.training.activation_offloading",
                                                                 "did you mean 'torchtune'?")


def test_unsloths_checkpointing_offloads_the_layer_inputs_only():
    # LLaMA-Factory @ ff6d4d1 model_utils/checkpointing.py UnslothGradientCheckpointing.forward:
    # hidden_states.to("cpu", non_blocking=True) (a pinned copy: non_blocking device-to-host), the layer under
    # no_grad; nothing else passes through hooks: 32 layer inputs on the host, the final norm's saves stay
    e = _llama_8b("unsloth")
    assert e["activation_offload_host_bytes"] == L * LAYER_INPUT
    none = _llama_8b("none")
    # no stash: h_1..h_31 leave (h_0 is the embedding output's leaf)
    assert none["step_trace"].retained_bytes - e["step_trace"].retained_bytes == 31 * LAYER_INPUT
    with pytest.raises(FitplanError) as err:
        _llama_8b("unsloth", gradient_checkpointing=False)
    assert err.value.field == "activation_offloading"


def test_llamafactory_use_unsloth_gc_is_unsloths_offloaded_checkpointing(tmp_path):
    path = tmp_path / "recipe.yaml"
    path.write_text("model_name_or_path: x/y\nstage: sft\nuse_unsloth_gc: true\n")
    fields, _ = recipe_fields(path)
    assert (fields["activation_offloading"], fields["gradient_checkpointing"]) == ("unsloth", True)
