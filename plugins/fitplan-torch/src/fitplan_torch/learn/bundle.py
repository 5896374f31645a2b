"""Regenerate fitplan's bundled architecture files (``rulesets/architectures``).

    python -m fitplan_torch.learn.bundle                 # every tiny config in tests/data/configs
    python -m fitplan_torch.learn.bundle llama gemma2    # some model types
    python -m fitplan_torch.learn.bundle --table         # only the shared tables (autograd, peft)

For each model type: learn its tiny config (``tests/data/configs/tiny-*``), then, for each catalog model of
that type (``rulesets/models``) whose graph switches differ from what is learned so far, learn a tiny
version of it and merge (``files.merge``); then each activation of ``ACTIVATIONS`` under every switch
combination learned so far (``--no-activations``: only the stated ones); then write ``autograd.json``
from every op the files use, and
``peft.json`` (peft's default LoRA target modules per model type). With
``--verify`` each learning is checked as ``fitplan learn-architecture`` checks it (slow). Several model types
are learned one per child process (memory: see ``_each_in_its_own_process``).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[5]
CONFIGS = ROOT / "tests" / "data" / "configs"
OUT = ROOT / "rulesets" / "architectures"
KERNEL_OPS = ("native_dropout", "empty_like", "bernoulli_.float", "div_.Scalar", "mul.Tensor", "_to_copy", "t", "view",
              "mm", "_unsafe_view", "add.Tensor", "add_.Tensor", "bmm", "baddbmm", "clone", "full", "_safe_softmax",
              "repeat_interleave.self_int", "_scaled_dot_product_flash_attention_for_cpu",
              "_scaled_dot_product_flash_attention", "_scaled_dot_product_efficient_attention")


def tiny_configs() -> dict[str, Path]:
    out = {}
    for d in sorted(CONFIGS.glob("tiny-*")):
        cfg = json.loads((d / "config.json").read_text())
        out.setdefault(cfg["model_type"], d / "config.json")
    return out


def catalog_configs(model_type: str) -> list[dict[str, Any]]:
    import tomllib

    out = []
    for f in sorted((ROOT / "rulesets" / "models").glob("*.toml")):
        for m in tomllib.loads(f.read_text()).get("model", []):
            if m["config"].get("model_type") == model_type:
                out.append(m["config"])
    return out


def learn_type(model_type: str, cfg_path: Path, *, verify: bool, log, activations: bool = True) -> dict[str, Any]:
    from . import derive

    cfg = json.loads(cfg_path.read_text())
    data, results, specs = derive.learn_full(cfg, log=log)
    data["learned"]["config"] = cfg
    if verify:
        from . import verify as V

        problems = V.check_graph(data, results, specs, log)
        if problems:
            raise RuntimeError(f"{model_type}: " + "; ".join(problems[:5]))
    first = data.get("flags", {}).get("values") or {}
    learned = [first]
    switches = dict(first)  # every switch seen so far, with the tiny config's value
    for other in catalog_configs(model_type):
        for _ in range(3):  # a learning can reveal more switches (Falcon-7B's multi_query): until none is new
            small = {**cfg, **{k: _catalog_value(k, v, other) for k, v in switches.items()}}
            want = _resolved({k: small.get(k, v) for k, v in switches.items()}, small, data, log)
            if not switches or any(all(derive.switch_state(want.get(k)) == derive.switch_state(v)
                                       for k, v in seen.items()) for seen in learned):
                break
            data, seen = _merge_catalog(data, cfg, small, other, want, log, switches)
            learned.append(seen)
            switches.update({k: v for k, v in seen.items() if k not in switches})
    if activations:
        data = _learn_activations(data, cfg, switches, learned, log)
    return data


ACTIVATIONS = ("silu", "gelu", "gelu_new", "gelu_pytorch_tanh", "gelu_fast", "relu")
"""The activation values every bundled type is learned with (keys of transformers 5.24 ``ACT2FN``,
transformers/activations.py): those the published configs of the catalog use (``silu``, ``gelu``,
``gelu_new``, ``gelu_pytorch_tanh``; litgpt runs Phi with ``gelu_pytorch_tanh``) and ``gelu_fast``, ``relu``.
Each records its own ops (``aten.silu``, ``aten.gelu`` exact or tanh, ``gelu_new``'s pow/tanh/mul chain ...),
so each is a learning of its own, merged under ``hidden_act == '...'``."""


def _learn_activations(data, cfg, switches, learned, log):
    """Learn each of :data:`ACTIVATIONS` for every switch combination learned so far (the tiny config's and
    the catalog's) and merge it: a categorical switch's values are learned, not held at the one the tiny
    config states. A value the config class rewrites to one already learned (GemmaConfig: ``gelu`` ->
    ``gelu_pytorch_tanh``) adds nothing; a value the model refuses is logged and skipped."""
    from transformers.activations import ACT2FN

    from . import derive

    acts = [k for k, v in switches.items() if isinstance(v, str) and v in ACT2FN]
    for k in acts:
        for seen in [x for x in learned if isinstance(x.get(k), str)]:
            for value in ACTIVATIONS:
                combo = {**seen, k: value}
                small = {**cfg, **combo}
                want = _resolved(combo, small, data, log)
                if any(all(derive.switch_state(want.get(n)) == derive.switch_state(v) for n, v in s.items())
                       for s in learned):
                    continue
                try:
                    data, got = _merge_catalog(data, cfg, small, small, want, log, switches, what=f"{k}={value!r}")
                except Exception as e:  # noqa: BLE001 - the model does not run with this activation
                    log(f"  {k}={value!r} not learned: {type(e).__name__}: {str(e).splitlines()[0][:120]}")
                    continue
                learned.append(got)
    return data


def _catalog_value(k: str, tiny: Any, other: dict[str, Any]) -> Any:
    """A switch's value in a catalog config: a number its config class leaves unset (``clip_qkv``) is
    unset where the catalog omits it (TOML has no null), any other switch keeps the tiny config's value."""
    if k in other:
        return other[k]
    return None if isinstance(tiny, (int, float)) and not isinstance(tiny, bool) else tiny


def _resolved(want: dict[str, Any], small: dict[str, Any], data: dict[str, Any], log) -> dict[str, Any]:
    """The switch values as the config class keeps them: a value it rewrites (GemmaConfig turns
    ``hidden_act="gelu"`` into ``"gelu_pytorch_tanh"``) is recorded in the file (``rewrite``), which the core
    applies when it reads a config."""
    from .derive import hf_config

    resolved = hf_config(small).to_dict()
    out = dict(want)
    for k, v in want.items():
        new = resolved.get(k)
        if isinstance(v, str) and isinstance(new, str) and new != v and k in data["config"]["fields"]:
            log(f"  the config class rewrites {k}={v!r} to {new!r}")
            data["config"]["fields"][k].setdefault("rewrite", {})[v] = new
            out[k] = new
    return out


def _merge_catalog(data, cfg, small, other, want, log, known=None, what="the switches of a catalog config"):
    """Learn ``small`` (the tiny config with a catalog config's switch values) and merge it into ``data``;
    returns the merged file and the switches the new learning was made under."""
    from . import derive, files
    from .command import shrink

    log(f"  merging {what}: {want}")
    try:
        extra, _, _ = derive.learn_full(small, log=log, known=known)
    except Exception as e:  # noqa: BLE001 - the switches contradict the tiny config's others: shrink the catalog's
        log(f"  the tiny config with these switches does not run ({str(e).splitlines()[0][:120]}); "
            "learning from the catalog config itself, shrunk")
        extra, _, _ = derive.learn_full(shrink(dict(other)), log=log, known=known)
    return files.merge(data, extra), extra.get("flags", {}).get("values") or {}


def write_table(directory: Path = OUT) -> int:
    from .autograd_rules import source, table

    from . import files

    ops = set(KERNEL_OPS)
    for f in directory.glob("*.graphs.json"):
        g = files.read(directory, f.name.removesuffix(".graphs.json"))
        for seg in g["segments"].values():
            for op in seg["ops"]:
                if not (len(op) > 3 and op[3].get("pseudo")):
                    ops.add(op[0])
    (directory / "autograd.json").write_text(json.dumps({"source": source(), "ops": table(ops)}, indent=0,
                                                        sort_keys=True) + "\n")
    return len(ops)


def peft_table() -> dict[str, Any]:
    """peft's default LoRA ``target_modules`` per model type: what ``LoraConfig()`` without ``target_modules``
    adapts (``peft/tuners/lora/model.py`` ``_prepare_adapter_config`` reads this mapping and raises "Please
    specify `target_modules` in `peft_config`" for a model type it does not list)."""
    import peft
    from peft.utils.constants import TRANSFORMERS_MODELS_TO_LORA_TARGET_MODULES_MAPPING as mapping

    return {"source": {"peft": peft.__version__, "file": "peft/utils/constants.py",
                       "name": "TRANSFORMERS_MODELS_TO_LORA_TARGET_MODULES_MAPPING"},
            "lora_default_targets": {k: list(v) for k, v in sorted(mapping.items())}}


def write_peft_table(directory: Path = OUT) -> int:
    data = peft_table()
    (directory / "peft.json").write_text(json.dumps(data, indent=1, sort_keys=True) + "\n")
    return len(data["lora_default_targets"])


def main(argv: list[str] | None = None) -> int:
    from . import files

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("types", nargs="*")
    ap.add_argument("--table", action="store_true", help="only regenerate the shared tables (autograd.json, peft.json)")
    ap.add_argument("--verify", action="store_true")
    ap.add_argument("--no-activations", action="store_true",
                    help="learn only the activation the tiny and catalog configs state, not every ACTIVATIONS value")
    ap.add_argument("--out", default=str(OUT))
    ap.add_argument("--no-tables", action="store_true", help=argparse.SUPPRESS)  # one type's child process
    args = ap.parse_args(argv)
    out = Path(args.out)
    if not args.table:
        configs = tiny_configs()
        types = args.types or list(configs)
        if len(types) > 1:
            return _each_in_its_own_process(types, args)
        t0 = time.time()
        data = learn_type(types[0], configs[types[0]], verify=args.verify, activations=not args.no_activations,
                          log=lambda m: print(m, file=sys.stderr, flush=True))
        files.write(data, out, log=lambda m: print(m, file=sys.stderr, flush=True))
        print(f"{types[0]}: {time.time() - t0:.0f} s", flush=True)
    if args.no_tables:
        return 0
    print(f"autograd.json: {write_table(out)} ops")
    print(f"peft.json: {write_peft_table(out)} model types")
    return 0


def _each_in_its_own_process(types: list[str], args) -> int:
    """One child process per model type: a process that learned every type in turn grew past 24 GB (measured:
    24.3 GB resident after 18 types, at Phi), while one type alone peaks near 1 GB (Phi: 1.05 GB). Then the tables."""
    import subprocess

    for mt in types:
        cmd = [sys.executable, "-m", "fitplan_torch.learn.bundle", mt, "--out", args.out, "--no-tables"]
        flags = (["--verify"] if args.verify else []) + (["--no-activations"] if args.no_activations else [])
        if subprocess.run(cmd + flags).returncode != 0:
            print(f"{mt}: failed (its log is above)", file=sys.stderr)
            return 1
    return main(["--table", "--out", args.out])


if __name__ == "__main__":
    sys.exit(main())
