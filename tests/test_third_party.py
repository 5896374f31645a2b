"""The example third-party distributions, used the way an outside author's users use them: installed
(``pip install -e plugins/...``) and reached through their ``fitplan`` entry points, never imported.

* ``plugins/fitplan-optimizers-extra``: Lion, GaLore AdamW, Adam-mini, Muon (state bytes by hand from
  each reference implementation; measured exactly with torch when it is installed).
* ``plugins/acme-fitplan-rules``: an organisation's prices through ``fitplan_ruleset_dirs``, and the
  same folder through ``--ruleset-dir``.

Every expected number is derived by hand below from the architecture of llama-2-7b
(h = 4096, L = 32, intermediate I = 11008, vocab V = 32000, untied LM head, RMSNorm weights only):
  per layer: q, k, v, o (h × h); gate, up (I × h); down (h × I); 2 norms (h)
  once: embed_tokens (V × h), lm_head (V × h), final norm (h)
"""

from __future__ import annotations

import importlib
import importlib.metadata
import json
from pathlib import Path

import pytest

from fitplan.testing import assert_explains

ROOT = Path(__file__).resolve().parents[1]
OPTIMIZERS_DIST = "fitplan-optimizers-extra"
RULES_DIST = "acme-fitplan-rules"
ACME_DIR = ROOT / "plugins" / "acme-fitplan-rules" / "src" / "acme_fitplan_rules" / "rulesets"


def _require(dist: str) -> None:
    try:
        importlib.metadata.distribution(dist)
    except importlib.metadata.PackageNotFoundError:
        pytest.skip(f"{dist} is not installed: pip install -e plugins/{dist}")  # fails under FITPLAN_CI=1 (skip_policy.py)


@pytest.fixture
def optimizers_extra():
    _require(OPTIMIZERS_DIST)
    return OPTIMIZERS_DIST


@pytest.fixture
def acme():
    _require(RULES_DIST)
    return RULES_DIST


# --------------------------------------------------------------------------- llama-2-7b by hand

H, L, I, V = 4096, 32, 11008, 32000
SQUARE = 4  # q, k, v, o: (h, h)
TALL = 2  # gate, up: (I, h)
WIDE = 1  # down: (h, I)
LAYER_MATRIX_PARAMS = SQUARE * H * H + TALL * I * H + WIDE * H * I
HIDDEN_MATRIX_PARAMS = L * LAYER_MATRIX_PARAMS  # 6,476,005,376
EMBED_HEAD_PARAMS = 2 * V * H  # 262,144,000
ONE_D_PARAMS = L * 2 * H + H  # norms: 266,240
PARAMS = HIDDEN_MATRIX_PARAMS + EMBED_HEAD_PARAMS + ONE_D_PARAMS
TENSORS = L * (7 + 2) + 2 + 1  # 7 matrices + 2 norms per layer; embeddings, head, final norm


def test_hand_count_matches_the_model_card():
    assert PARAMS == 6_738_415_616  # "7B": meta-llama/Llama-2-7b-hf, 6.74B parameters


# --------------------------------------------------------------------------- the optimizer plugin


def test_plugins_lists_the_optimizer_distribution(cli, optimizers_extra):
    proc = cli("plugins", "--check", "--format", "json")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    rows = {p["name"]: p for p in json.loads(proc.stdout)["plugins"]}
    row = rows[OPTIMIZERS_DIST]
    assert row["builtin"] is False
    assert row["hooks"] == ["fitplan_register_optimizers"]
    assert row["optimizers"] == sorted(["lion", "galore_adamw_r128", "galore_adamw_r256", "galore_adamw_r512",
                                        "galore_adamw_r1024", "adam_mini", "muon"])


@pytest.mark.parametrize("precision,state_bytes", [("bf16-true", 2), ("32-true", 4)])
def test_cli_estimate_with_lion(cli, optimizers_extra, precision, state_bytes):
    proc = cli("estimate", "--model", "llama-2-7b", "--optim", "lion", "--precision", precision, "--format", "json")
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout)
    assert out["optimizer"] == "lion"
    # Lion: one state like the parameter, no step scalar
    assert out["memory"]["per_gpu_bytes"]["optimizer_states"] == 6_738_415_616 * state_bytes


def test_galore_rank_128_on_llama_2_7b(estimate_with, optimizers_extra):
    est = estimate_with(plugins=[OPTIMIZERS_DIST], model="llama-2-7b", optim="galore_adamw_r128", precision="bf16-true")
    r, b = 128, 2  # bf16 parameters: projector and states both 2 bytes
    # (h, h), m >= n: projector r × h, two states h × r
    square = r * H * b + 2 * H * r * b
    # (I, h), m >= n: projector r × h, two states I × r
    tall = r * H * b + 2 * I * r * b
    # (h, I), m < n: projector h × r, two states r × I
    wide = H * r * b + 2 * r * I * b
    hidden = L * (SQUARE * square + TALL * tall + WIDE * wide)
    adamw_rest = 2 * (EMBED_HEAD_PARAMS + ONE_D_PARAMS) * b  # no step tensor: GaLore's step is a Python int
    assert est["optimizer_state_bytes"] == hidden + adamw_rest == 2_094_022_656


def test_galore_variants_scale_with_rank(estimate_with, optimizers_extra, fitplan_registry):
    reg = fitplan_registry(OPTIMIZERS_DIST)
    rest = 2 * (EMBED_HEAD_PARAMS + ONE_D_PARAMS) * 4
    for name, r in (("galore_adamw_r128", 128), ("galore_adamw_r256", 256), ("galore_adamw_r512", 512),
                    ("galore_adamw_r1024", 1024)):
        est = estimate_with(registry=reg, model="llama-2-7b", optim=name, precision="32-true")
        per_layer = SQUARE * 3 * r * H + TALL * (r * H + 2 * I * r) + WIDE * (H * r + 2 * r * I)
        assert est["optimizer_state_bytes"] == L * per_layer * 4 + rest, name
        assert reg.resolve_optimizer(name).torch_kwargs["rank"] == r


def test_muon_on_llama_2_7b(estimate_with, optimizers_extra):
    est = estimate_with(plugins=[OPTIMIZERS_DIST], model="llama-2-7b", optim="muon", precision="bf16-true")
    # hidden matrices: one momentum buffer; embeddings, head, norms: AdamW's two states (step: Python int)
    assert est["optimizer_state_bytes"] == HIDDEN_MATRIX_PARAMS * 2 + 2 * (EMBED_HEAD_PARAMS + ONE_D_PARAMS) * 2


def test_adam_mini_on_llama_2_7b(estimate_with, optimizers_extra):
    est = estimate_with(plugins=[OPTIMIZERS_DIST], model="llama-2-7b", optim="adam_mini", precision="bf16-true")
    # embeddings and head: fp32 m and v; every other tensor: fp32 m + one vmean element in bf16
    other_tensors = TENSORS - 2
    expected = EMBED_HEAD_PARAMS * 8 + (HIDDEN_MATRIX_PARAMS + ONE_D_PARAMS) * 4 + other_tensors * 2
    assert est["optimizer_state_bytes"] == expected == 28_002_239_042


def test_lion_on_lora_adapters(estimate_with, optimizers_extra):
    est = estimate_with(plugins=[OPTIMIZERS_DIST], model="llama-2-7b", optim="lion", method="lora", lora_r=8,
                        lora_target_modules=["q_proj", "v_proj"], precision="bf16-true")
    adapters = L * 2 * (8 * H + H * 8)  # A (r × in) and B (out × r) for q and v
    assert est["optimizer_state_bytes"] == adapters * 4  # peft keeps adapters in fp32


def test_optimizer_provenance_names_the_plugin(estimate_with, optimizers_extra):
    est = estimate_with(plugins=[OPTIMIZERS_DIST], model="llama-2-7b", optim="lion", precision="bf16-true")
    tree = assert_explains(est, "optimizer_state_bytes", depends_on=["optimizer_spec", "optimizer_context"],
                           not_applied=["zero", "offload"], plugin="fitplan.builtin.model_states")

    def nodes(t):
        yield t
        for c in t["children"]:
            yield from nodes(c)

    spec = next(n for n in nodes(tree) if n["name"] == "optimizer_spec")
    assert spec["value"] == "OptimizerSpec(lion)"
    assert spec["ruleset"].startswith(f"plugin {OPTIMIZERS_DIST}: Chen et al. 2023")


def test_zero_shards_a_third_party_optimizer_like_a_builtin(estimate_with, optimizers_extra):
    est = estimate_with(plugins=[OPTIMIZERS_DIST], model="llama-2-7b", optim="lion", precision="bf16-true",
                        zero_stage=1, num_gpus=8, stack="torch")
    # ZeRO-1 assigns whole tensors to ranks (torch's ZeroRedundancyOptimizer, what fitplan-torch validates):
    # rank 0 holds about an eighth of Lion's bf16 momentum, within one tensor (the 32000 x 4096 embedding)
    assert abs(est["optimizer_state_bytes"] - 6_738_415_616 * 2 // 8) <= 32000 * 4096 * 2
    assert_explains(est, "optimizer_state_bytes", applied=["zero"])


def test_blocking_the_optimizer_plugin(cli, optimizers_extra):
    proc = cli("estimate", "--params", "1B", "--optim", "lion", env={"FITPLAN_BLOCK_PLUGINS": OPTIMIZERS_DIST})
    assert proc.returncode == 2
    assert "unknown optimizer 'lion'" in proc.stderr


# --------------------------------------------------------------------------- the torch implementations


def _tiny_config(tmp_path: Path, **overrides) -> Path:
    cfg = json.loads((ROOT / "tests" / "data" / "configs" / "tiny-llama" / "config.json").read_text())
    cfg.update(overrides)
    path = tmp_path / "config.json"
    path.write_text(json.dumps(cfg))
    return path


def _torch_class(spec):
    """How `fitplan validate` finds it: the spec's dotted torch_class."""
    module, _, name = spec.torch_class.rpartition(".")
    return getattr(importlib.import_module(module), name)


TORCH_CASES = [
    # tiny-llama (h 64, vocab 1000: the embeddings are the largest tensors) and a variant whose hidden
    # matrices are the largest and wider than GaLore's rank 128 (k = 128 < min(m, n) for the MLP)
    pytest.param({}, id="tiny-llama"),
    pytest.param({"hidden_size": 160, "intermediate_size": 300, "vocab_size": 48, "num_attention_heads": 4,
                  "num_key_value_heads": 2}, id="wide-hidden"),
]


@pytest.mark.parametrize("overrides", TORCH_CASES)
@pytest.mark.parametrize("precision", ["32-true", "bf16-true"])
@pytest.mark.parametrize("optim", ["lion", "galore_adamw_r128", "adam_mini", "muon"])
def test_torch_implementation_allocates_what_the_estimate_says(tmp_path, estimate_with, fitplan_registry,
                                                               optimizers_extra, optim, precision, overrides):
    """States measured exactly (unique storages); step temporaries with a live-storage counter on the CPU,
    on a step where the states already exist (the first step for GaLore's SVD: update_proj_gap=1)."""
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    config = _tiny_config(tmp_path, **overrides)
    reg = fitplan_registry(OPTIMIZERS_DIST)
    est = estimate_with(registry=reg, model=str(config), optim=optim, precision=precision)
    spec = reg.resolve_optimizer(optim)
    torch.manual_seed(0)
    torch.set_num_threads(1)  # tiny matrices: threads only add contention
    cfg = json.loads(config.read_text())
    model = transformers.AutoModelForCausalLM.from_config(transformers.AutoConfig.for_model(**cfg))
    model.to(torch.float32 if precision == "32-true" else torch.bfloat16)
    assert sum(p.numel() for p in model.parameters()) == est["trainable_param_count"]
    kwargs = {**spec.torch_kwargs, **({"update_proj_gap": 1} if optim.startswith("galore") else {})}
    opt = _torch_class(spec)(list(model.named_parameters()), lr=1e-4, **kwargs)
    ids = torch.randint(0, cfg["vocab_size"], (2, 16), generator=torch.Generator().manual_seed(0))

    def backward():
        opt.zero_grad()
        model(input_ids=ids, labels=ids).loss.backward()

    backward()
    opt.step()
    states = {id(t.untyped_storage()): t.untyped_storage().nbytes()
              for s in opt.state.values() for t in s.values() if isinstance(t, torch.Tensor)}
    assert sum(states.values()) == est["optimizer_state_bytes"]

    backward()
    counter = _live_bytes(torch, [*model.parameters(), *(p.grad for p in model.parameters()),
                                  *(t for s in opt.state.values() for t in s.values() if isinstance(t, torch.Tensor))])
    with counter:
        opt.step()
    assert counter.peak - counter.base == est["optimizer_step_temp_bytes"]


# Fused MoE experts (transformers 5 stores them as one 3-D (E, out, in) parameter per layer), matrices,
# an embedding and a norm; names as HF writes them, counts as fitplan's tensor list has them (2 layers).
MOE_TENSORS = [
    ("model.layers.{i}.mlp.experts.gate_up_proj", (4, 24, 16), 2),
    ("model.layers.{i}.self_attn.q_proj.weight", (16, 16), 2),
    ("model.layers.{i}.mlp.down_proj.weight", (16, 40), 2),
    ("model.embed_tokens.weight", (40, 16), 1),
    ("model.norm.weight", (16,), 1),
]


@pytest.mark.parametrize("dtype_name,nbytes", [("float32", 4), ("bfloat16", 2)])
@pytest.mark.parametrize("optim", ["lion", "galore_adamw_r128", "adam_mini", "muon"])
def test_torch_implementation_on_3d_expert_weights(fitplan_registry, optimizers_extra, optim, dtype_name, nbytes):
    """The spec's byte functions (as fitplan calls them) against the torch implementation, on shapes that
    include a 3-D fused-experts tensor (Muon orthogonalises it as a batch; GaLore gives it AdamW)."""
    torch = pytest.importorskip("torch")
    from fitplan import OptimizerContext

    torch.manual_seed(0)
    torch.set_num_threads(1)
    dtype = getattr(torch, dtype_name)
    spec = fitplan_registry(OPTIMIZERS_DIST).resolve_optimizer(optim)
    named = [(name.format(i=i), torch.nn.Parameter(torch.randn(shape, dtype=dtype)))
             for name, shape, count in MOE_TENSORS for i in range(count)]
    ctx = OptimizerContext(tensors=tuple((shape, count) for _, shape, count in MOE_TENSORS), state_bytes=nbytes,
                           param_bytes=nbytes)
    kwargs = {**spec.torch_kwargs, **({"update_proj_gap": 1} if optim.startswith("galore") else {})}
    opt = _torch_class(spec)(named, lr=1e-3, **kwargs)
    params = [p for _, p in named]
    for p in params:
        p.grad = torch.randn_like(p)
    opt.step()
    state = [t for s in opt.state.values() for t in s.values() if isinstance(t, torch.Tensor)]
    assert sum(t.untyped_storage().nbytes() for t in state) == spec.state_bytes(ctx)
    for p in params:
        p.grad = torch.randn_like(p)
    counter = _live_bytes(torch, [*params, *(p.grad for p in params), *state])
    del state
    with counter:
        opt.step()
    assert counter.peak - counter.base == spec.step_temp_bytes(ctx)


def _live_bytes(torch, tensors):
    """A TorchDispatchMode that counts the bytes of storages created during the step that are alive at
    once (freed ones subtracted through weak references). ``existing`` (parameters, gradients, states)
    are held weakly, so a state the step replaces (GaLore's projector) is freed when it is dropped."""
    import weakref

    from torch.utils._python_dispatch import TorchDispatchMode
    from torch.utils._pytree import tree_flatten
    from torch.utils.weak import WeakIdKeyDictionary

    class Live(TorchDispatchMode):
        def __init__(self, existing):
            super().__init__()
            self.live = WeakIdKeyDictionary()
            self.current = 0
            for t in existing:
                self.add(t.untyped_storage())
            self.base = self.peak = self.current

        def add(self, st):
            if st in self.live:
                return
            entry = [st.nbytes(), None]

            def freed(_ref, entry=entry):
                self.current -= entry[0]

            entry[1] = weakref.ref(st, freed)
            self.live[st] = entry
            self.current += entry[0]

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            out = func(*args, **(kwargs or {}))
            for t in tree_flatten(out)[0]:
                if isinstance(t, torch.Tensor):
                    self.add(t.untyped_storage())
            self.peak = max(self.peak, self.current)
            return out

    return Live(tensors)


def test_torch_lion_follows_the_reference_update(fitplan_registry, optimizers_extra):
    torch = pytest.importorskip("torch")
    spec = fitplan_registry(OPTIMIZERS_DIST).resolve_optimizer("lion")
    p = torch.nn.Parameter(torch.tensor([1.0, -2.0, 3.0]))
    opt = _torch_class(spec)([p], lr=0.1, betas=(0.9, 0.99), weight_decay=0.5)
    for grad in ([0.5, 0.5, -1.0], [-2.0, 0.1, 0.0]):
        p.grad = torch.tensor(grad)
        opt.step()
    # by hand (Chen et al. 2023, Algorithm 2): step 1, m = 0: c = 0.1·g -> sign(g); p = p·(1 - 0.05) - 0.1·sign(c)
    p1 = [1.0 * 0.95 - 0.1, -2.0 * 0.95 - 0.1, 3.0 * 0.95 + 0.1]
    m1 = [0.01 * 0.5, 0.01 * 0.5, 0.01 * -1.0]
    # step 2: c = 0.9·m1 + 0.1·g2 = [0.0045 - 0.2, 0.0045 + 0.01, -0.009 + 0] -> signs [-1, +1, -1]
    p2 = [p1[0] * 0.95 + 0.1, p1[1] * 0.95 - 0.1, p1[2] * 0.95 + 0.1]
    m2 = [0.99 * m1[0] + 0.01 * -2.0, 0.99 * m1[1] + 0.01 * 0.1, 0.99 * m1[2]]
    assert torch.allclose(p.detach(), torch.tensor(p2))
    assert torch.allclose(opt.state[p]["exp_avg"], torch.tensor(m2))
    assert set(opt.state[p]) == {"exp_avg"}  # no step counter


def test_torch_adam_mini_block_update_by_hand(fitplan_registry, optimizers_extra):
    torch = pytest.importorskip("torch")
    spec = fitplan_registry(OPTIMIZERS_DIST).resolve_optimizer("adam_mini")
    w = torch.nn.Parameter(torch.zeros(2, 2))
    opt = _torch_class(spec)([("model.layers.0.mlp.up_proj.weight", w)], lr=0.1, betas=(0.9, 0.999), eps=0.0)
    w.grad = torch.tensor([[1.0, -1.0], [3.0, 1.0]])
    opt.step()
    # m = 0.1·g, vmean = 0.001·mean(g²) = 0.001·3; bias-corrected: m̂ = g, v̂ = 3: update = lr·g/√3
    assert torch.allclose(w.detach(), -0.1 * w.grad / 3 ** 0.5)
    assert opt.state[w]["vmean"].numel() == 1 and opt.state[w]["m"].dtype == torch.float32


def test_torch_muon_orthogonalises_hidden_matrices_and_uses_adamw_elsewhere(fitplan_registry, optimizers_extra):
    torch = pytest.importorskip("torch")
    spec = fitplan_registry(OPTIMIZERS_DIST).resolve_optimizer("muon")
    torch.manual_seed(0)
    hidden = torch.nn.Parameter(torch.zeros(32, 16))
    embed = torch.nn.Parameter(torch.zeros(10, 16))
    norm = torch.nn.Parameter(torch.ones(16))
    named = [("model.layers.0.mlp.up_proj.weight", hidden), ("model.embed_tokens.weight", embed),
             ("model.norm.weight", norm)]
    opt = _torch_class(spec)(named, lr=0.02, momentum=0.95)
    for p in (hidden, embed, norm):
        p.grad = torch.randn_like(p)
    opt.step()
    assert set(opt.state[hidden]) == {"momentum_buffer"}
    assert set(opt.state[embed]) == set(opt.state[norm]) == {"exp_avg", "exp_avg_sq", "step"}
    # Newton-Schulz returns ~U·S'·Vᵀ with S' in about [0.5, 1.5] (reference docstring), scaled by sqrt(32/16)
    s = torch.linalg.svdvals(hidden.detach().float() / (-0.02 * 2 ** 0.5))
    assert 0.3 < float(s.min()) and float(s.max()) < 1.6


def test_torch_galore_projects_onto_the_rank(fitplan_registry, optimizers_extra):
    torch = pytest.importorskip("torch")
    spec = fitplan_registry(OPTIMIZERS_DIST).resolve_optimizer("galore_adamw_r128")
    torch.manual_seed(0)
    w = torch.nn.Parameter(torch.zeros(48, 20))
    opt = _torch_class(spec)([("model.layers.0.self_attn.q_proj.weight", w)], lr=0.01, rank=4, scale=1.0)
    w.grad = torch.randn(48, 20)
    opt.step()
    st = opt.state[w]
    assert tuple(st["projector"].shape) == (4, 20) and tuple(st["exp_avg"].shape) == (48, 4)
    assert int(torch.linalg.matrix_rank(w.detach())) == 4  # the update lives in a rank-4 subspace


def test_plugin_module_does_not_import_torch(optimizers_extra, tmp_path):
    import subprocess
    import sys

    code = ("import sys, fitplan.pluginmgr.registry as p; reg = p.make_registry(entry_points=['fitplan-optimizers-extra'], "
            "blocked=()); assert not reg.errors, reg.errors; assert 'lion' in reg.optimizers; "
            "print('torch' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


# --------------------------------------------------------------------------- the organisation's rulesets

# By hand: 36,000,000 tokens at 2,000 tokens/s (the whole run's throughput) = 18,000 s = 5 h exactly.
TOKENS, TOKENS_PER_SECOND, HOURS = 36_000_000, 2_000, 5
ACME_NODE_RATE = 14.40  # USD per DGX H100 node-hour (acme-cluster.toml)
AWS_P5_LIST, ACME_DISCOUNT = 55.04, 0.35  # p5.48xlarge list price (bundled aws.toml); negotiated 35 % off


def _priced(cli, provider, *extra, env=None, tokens=TOKENS, num_nodes=1):
    proc = cli("estimate", "--model", "llama-2-7b", "--gpu", "h100-sxm", "--num-gpus", "8", "--num-nodes",
               str(num_nodes), "--precision", "bf16-mixed", "--total-tokens", str(tokens), "--tokens-per-second",
               str(TOKENS_PER_SECOND), "--provider", provider, *extra, "--format", "json", env=env)
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout)


def test_org_folder_prices_a_run_at_the_internal_rate(cli):
    """The plain-folder path: no plugin needed (blocked here, in case it is installed)."""
    out = _priced(cli, "acme-cluster", "--ruleset-dir", str(ACME_DIR), env={"FITPLAN_BLOCK_PLUGINS": RULES_DIST})
    assert out["time"]["hours"] == HOURS
    assert out["cost"]["instance"] == "dgx-h100" and out["cost"]["instance_count"] == 1
    assert out["cost"]["on_demand_usd"] == pytest.approx(HOURS * ACME_NODE_RATE)  # 72.00
    assert out["cost"]["spot_usd"] is None  # no spot market on the cluster


def test_org_cluster_bills_started_hours_and_whole_nodes(cli):
    env = {"FITPLAN_BLOCK_PLUGINS": RULES_DIST}
    # 37,000,000 / 2,000 = 18,500 s = 5.14 h: the cluster charges per started hour -> 6 h
    out = _priced(cli, "acme-cluster", "--ruleset-dir", str(ACME_DIR), env=env, tokens=37_000_000)
    assert out["cost"]["on_demand_usd"] == pytest.approx(6 * ACME_NODE_RATE)
    # 2 nodes × 8 GPUs: two DGX nodes for 5 h
    out = _priced(cli, "acme-cluster", "--ruleset-dir", str(ACME_DIR), env=env, num_nodes=2)
    assert out["cost"]["on_demand_usd"] == pytest.approx(2 * HOURS * ACME_NODE_RATE)


def test_installed_org_package_prices_through_its_entry_point(cli, acme):
    cluster = _priced(cli, "acme-cluster")
    assert cluster["cost"]["on_demand_usd"] == pytest.approx(HOURS * ACME_NODE_RATE)
    negotiated = _priced(cli, "acme-aws")
    public = _priced(cli, "aws")
    assert negotiated["cost"]["instance"] == public["cost"]["instance"] == "p5.48xlarge"
    # 55.04 × 0.65 = 35.776, written as 35.77 in acme-aws.toml (rounded to the cent below)
    assert negotiated["cost"]["on_demand_usd"] == pytest.approx(HOURS * 35.77)
    assert public["cost"]["on_demand_usd"] == pytest.approx(HOURS * AWS_P5_LIST)
    assert negotiated["cost"]["on_demand_usd"] == pytest.approx(public["cost"]["on_demand_usd"] * (1 - ACME_DISCOUNT), abs=0.05)
    assert negotiated["cost"]["spot_usd"] == pytest.approx(public["cost"]["spot_usd"])  # spot is not discounted


def test_plugins_lists_the_org_package_and_its_directory(cli, acme):
    proc = cli("plugins", "--format", "json")
    rows = {p["name"]: p for p in json.loads(proc.stdout)["plugins"]}
    assert rows[RULES_DIST]["hooks"] == ["fitplan_ruleset_dirs"]
    [d] = [Path(x) for x in rows[RULES_DIST]["ruleset_dirs"]]
    # the installed package's copy (make install-test puts example plugins in .test-plugins, not editable)
    assert d.parts[-2:] == ACME_DIR.parts[-2:]
    assert sorted(p.name for p in d.glob("*.toml")) == sorted(p.name for p in ACME_DIR.glob("*.toml"))


def test_without_the_package_the_provider_is_unknown(cli, acme):
    proc = cli("estimate", "--model", "llama-2-7b", "--gpu", "h100-sxm", "--total-tokens", "1000",
               "--tokens-per-second", "10", "--provider", "acme-cluster", env={"FITPLAN_BLOCK_PLUGINS": RULES_DIST})
    assert proc.returncode == 2
    assert "unknown provider 'acme-cluster'" in proc.stderr


def test_org_rulesets_are_valid_and_use_bundled_gpu_ids(cli, fitplan_registry):
    proc = cli("rulesets", "check", str(ACME_DIR))
    assert proc.returncode == 0, proc.stderr
    from fitplan.rulesets import loader as rulesets

    rules = rulesets.load([ACME_DIR])
    acme_instances = [i for i in rules.instances.values() if i.provider.startswith("acme-")]
    assert {i.provider for i in acme_instances} == {"acme-aws", "acme-cluster"}
    for inst in acme_instances:
        assert rules.gpu(inst.gpu).id == inst.gpu  # raises for an id the hardware ruleset lacks
        assert inst.provider in rules.providers
    assert not any(f.name == "policy.toml" for f in ACME_DIR.rglob("*.toml"))  # policies are opt-in (README)


ACME_POLICY = ACME_DIR.parent / "policies" / "policy.toml"


def test_org_policies_restrict_recommend(cli, acme):
    assert cli("rulesets", "check", str(ACME_POLICY)).returncode == 0
    proc = cli("recommend", "--model", "llama-2-7b", "--method", "lora", "--total-tokens", "100000000",
               "--gpus", "a100-80gb,h100-sxm", "--providers", "aws,acme-aws,acme-cluster", "--policy", str(ACME_POLICY),
               "--markets", "on_demand,spot", "--format", "json")  # spot asked for: a policy rule is about spot
    assert proc.returncode == 0, proc.stderr
    data = json.loads(proc.stdout)
    assert [p["id"] for p in data["policies"]] == ["acme-approved-providers", "acme-aws-spot-short-runs",
                                                   "acme-cluster-size", "acme-budget", "acme-prefer-cluster"]
    assert data["plans"]
    for plan in data["plans"]:
        provider = plan["plan"]["provider"]
        assert provider in ("acme-aws", "acme-cluster")
        assert not (provider == "acme-aws" and plan["market"] == "spot" and plan["train_seconds"] >= 4 * 3600)
        assert plan["cost_usd"] <= 2000
        penalised = [r["rule"] for r in plan.get("penalties", [])]  # the key is present only when a rule fired
        assert penalised == (["acme-prefer-cluster"] if provider == "acme-aws" else [])
    assert data["search"]["rejected_by"]["acme-approved-providers"] > 0  # every plain-aws plan


@pytest.mark.parametrize("optim", ["galore_adamw_r128", "muon", "adam_mini"])
def test_validate_measures_name_aware_plugin_optimizers_exactly(optim):
    """GaLore, Muon and Adam-mini treat embeddings and the LM head apart from hidden matrices by parameter name:
    the referee must hand them named parameters, and then torch measures exactly the bytes the plugin declares."""
    pytest.importorskip("torch")
    import json as _json
    import subprocess as _sp
    import sys as _sys

    from conftest import ROOT as _ROOT

    proc = _sp.run([_sys.executable, "-m", "fitplan", "validate", "--model", str(_ROOT / "tests/data/configs/tiny-llama/config.json"),
                    "--precision", "32-true", "--optim", optim, "--per-device-train-batch-size", "2", "--max-seq-length", "64",
                    "--no-memtracker", "--format", "json"], capture_output=True, text=True, cwd=_ROOT, timeout=300)
    assert proc.returncode == 0, proc.stderr
    states = _json.loads(proc.stdout)["components"]["optimizer_states"]
    assert states["predicted"] == states["measured"]
