"""The ``fitplan`` command line (click + rich).

Every user-caused error is a :class:`~fitplan.errors.FitplanError`: printed without a traceback,
exit status 2. Plugins add sub-commands through the ``fitplan_register_commands`` hook.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import attrs
import click

from fitplan import __version__
from fitplan.inputs import scenario as sc
from fitplan.errors import FitplanError

OPTION_NAMES = {"zero_stage": "--zero"}
"""Flags whose name differs from their field (``--zero`` sets ``zero_stage``)."""
HELP = {
    "model": "Catalog name (fitplan models list) or path to an HF config.json.",
    "params": "A bare parameter count instead of a model, e.g. 7B.",
    "method": "full | lora | qlora.",
    "assumptions": "realistic (default) | seed (the tutorial chapter's simplifications).",
    "precision": "32-true | bf16-mixed | 16-mixed | bf16-true | 16-true | bf16-master | 16-master.",
    "optim": "HF optim name: adamw_torch, adamw_torch_fused, adamw_8bit, paged_adamw_8bit, adafactor, sgd, ... (fitplan plugins).",
    "attn_implementation": "eager | sdpa | flash_attention_2.",
    "lora_target_modules": "Comma-separated module names, e.g. q_proj,v_proj (or all-linear).",
    "zero_stage": "DeepSpeed ZeRO stage 0-3.",
    "fsdp": "full_shard | shard_grad_op | hybrid_shard.",
    "gpu": "GPU id or alias from the hardware ruleset (e.g. a100-80gb, h100-sxm).",
    "num_examples": "Dataset examples (with --tokens-per-example; or give --total-tokens).",
    "tokens_per_example": "Mean tokens per example.",
    "total_tokens": "Tokens in the dataset (one epoch).",
    "padding": "pack (default: sequences concatenated) | pad (every example padded to --max-seq-length).",
    "num_train_epochs": "Passes over the dataset (default 1).",
    "tf32": "HF tf32: fp32 matmuls on TF32 tensor cores (off by default in PyTorch and the HF Trainer).",
    "provider": "Pricing provider id (aws, gcp, lambda, runpod, seed, ...) to price the run.",
    "instance": "Force an instance type of the provider (default: the cheapest shape covering the GPUs).",
    "region": "Only consider instances in this region (default: the cheapest region).",
    "runs": "Number of runs to pay for (experiments; the seed counts 5).",
    "tokens_per_second": "Measured throughput of the whole run, overriding the FLOPs model.",
    "mfu": "Model FLOPs utilisation (0.4 = 40 %), overriding the ruleset default and calibration.",
    "throughput_source": "Use a [[throughput]] ruleset table of measured tokens/s (e.g. seed).",
}


def _click_type(field: attrs.Attribute) -> Any:
    t = field.type
    text = str(t)
    if "bool" in text:
        return bool
    if "int" in text and "float" not in text:
        return int
    if "float" in text:
        return float
    return str


def scenario_options(func: Callable) -> Callable:
    """Add one option per scenario field (default None, so only given flags override a scenario file)."""
    for section, cls in reversed(list(sc.SECTIONS.items())):
        for f in reversed(attrs.fields(attrs.resolve_types(cls))):
            flag = OPTION_NAMES.get(f.name, "--" + f.name.replace("_", "-"))
            typ = _click_type(f)
            help_text = HELP.get(f.name, f"{section}.{f.name} (default: {f.default!r})")
            if typ is bool:
                opt = click.option(f"{flag}/--no-{flag[2:]}", f.name, default=None, help=help_text)
            else:
                opt = click.option(flag, f.name, type=typ, default=None, help=help_text)
            func = opt(func)
    func = click.option("--bf16", "bf16", is_flag=True, default=False, help="HF TrainingArguments bf16=True: autocast with fp32 weights (= --precision bf16-mixed).")(func)
    func = click.option("--fp16", "fp16", is_flag=True, default=False, help="HF TrainingArguments fp16=True (= --precision 16-mixed).")(func)
    func = click.option("--deepspeed", "deepspeed", type=click.Path(dir_okay=False), default=None, help="A DeepSpeed config JSON (ZeRO stage, offload, bf16/fp16, micro-batch).")(func)
    func = click.option("--training-args", "training_args", type=click.Path(dir_okay=False), default=None,
                        help="An HF TrainingArguments JSON (batch, accumulation, checkpointing, optim, bf16/fp16, epochs, deepspeed, fsdp).")(func)
    func = click.option("--ruleset-dir", "ruleset_dirs", multiple=True, type=click.Path(file_okay=False),
                        help="Extra ruleset directory (repeatable; later ones override earlier ones and the bundled rulesets).")(func)
    func = click.argument("scenario_file", required=False, type=click.Path(dir_okay=False))(func)
    return func


def build_scenario(kwargs: dict[str, Any]) -> tuple[sc.Scenario, list[str]]:
    """Scenario file, then TrainingArguments JSON, then DeepSpeed JSON, then flags (flags win).
    Returns (scenario, ruleset dirs)."""
    s, dirs, _ = build_scenario_fixed(kwargs)
    return s, dirs


def build_scenario_fixed(kwargs: dict[str, Any]) -> tuple[sc.Scenario, list[str], set[str]]:
    """:func:`build_scenario`, plus the flat names of the fields the user set (in the scenario file, an
    imported JSON or a flag): ``fitplan recommend`` searches only the others."""
    from fitplan.context import load_scenario_file, merge, scenario_from_dict
    from fitplan.inputs.importers import deepspeed_fields, training_args_fields

    scenario_file = kwargs.pop("scenario_file", None)
    ruleset_dirs = list(kwargs.pop("ruleset_dirs", ()) or ())
    bf16, fp16 = kwargs.pop("bf16", False), kwargs.pop("fp16", False)
    ds = kwargs.pop("deepspeed", None)
    ta = kwargs.pop("training_args", None)
    base: dict[str, Any] = load_scenario_file(scenario_file) if scenario_file else {}
    flags = {k: v for k, v in kwargs.items() if v is not None and k in sc.FIELD_SECTION}
    if bf16 and fp16:
        raise FitplanError("--bf16 and --fp16 are mutually exclusive", field="--bf16/--fp16")
    if (bf16 or fp16) and "precision" not in flags:
        flags["precision"] = "bf16-mixed" if bf16 else "16-mixed"
    overrides: dict[str, Any] = {}
    if ta:
        from fitplan.pluginmgr.registry import default_registry

        reg = default_registry()
        fields, warnings = training_args_fields(ta, known_optimizers=[*reg.optimizers, *reg.optimizer_aliases])
        for w in warnings:
            _console(err=True).print(f"[yellow]warning:[/] {w}", markup=True, highlight=False)
        overrides.update(fields)
    if ds:
        overrides.update(deepspeed_fields(ds))
    overrides.update(flags)
    fixed = set(overrides)
    for key, value in base.items():
        fixed |= set(value) if key in sc.SECTIONS and isinstance(value, dict) else {key}
    return scenario_from_dict(merge(base, overrides), file=scenario_file), ruleset_dirs, fixed


def _estimate(kwargs: dict[str, Any]):
    from fitplan.context import get_context
    from fitplan.estimation import evaluate

    s, dirs = build_scenario(kwargs)
    ctx = get_context(dirs)
    return evaluate(s, ctx.registry, ctx.rulesets)


def _console(err: bool = False):
    from rich.console import Console

    stream = sys.stderr if err else sys.stdout
    # not a terminal (a pipe, a file, a test): wide enough that trees and tables are never cropped
    width = None if stream.isatty() else 200
    return Console(stderr=err, highlight=False, width=width)


def _dump_json(data: Any) -> None:
    click.echo(json.dumps(data, indent=2, sort_keys=False, default=str))


@click.group(context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 110})
@click.version_option(__version__, prog_name="fitplan")
def cli() -> None:
    """Will a fine-tuning run fit, how long will it take, and what will it cost?"""


@cli.command()
@scenario_options
@click.option("--format", "fmt", type=click.Choice(["table", "json", "markdown"]), default="table")
@click.option("--units", type=click.Choice(["GB", "GiB"]), default="GB", help="GB = 10^9 bytes (default), GiB = 2^30.")
@click.option("--policy", "policy_files", multiple=True, type=click.Path(dir_okay=False),
              help="Check the scenario against a policy file of [[policy]] rules (repeatable; docs/policies.md).")
def estimate(fmt: str, units: str, policy_files: tuple[str, ...], **kwargs: Any) -> None:
    """Estimate memory per GPU (and time and cost, given a dataset and a GPU).

    SCENARIO_FILE is an optional TOML file with [model], [training], [lora], [parallel], [hardware],
    [dataset] and [cost] sections; flags override it.
    """
    from fitplan.output import estimate_report as render
    from fitplan.rules.policy import estimate_verdicts

    est = _estimate(kwargs)
    verdicts = estimate_verdicts(est, policy_files)
    if fmt == "json":
        data = render.to_json(est)
        if verdicts is not None:
            data["policy"] = verdicts
        _dump_json(data)
    elif fmt == "markdown":
        click.echo(render.to_markdown(est, units))
        for v in verdicts or []:
            click.echo(f"- **policy {v['rule']}** ({v['action']}{', ' + v['market'] if v['market'] else ''}): {v['reason']}")
    else:
        render.print_table(est, _console(), units)
        for v in verdicts or []:
            _console().print(f"[red]policy {v['rule']}[/] ({v['action']}{', ' + v['market'] if v['market'] else ''}): "
                             f"{v['reason']}", markup=True, highlight=False)


@cli.command()
@click.argument("quantity")
@scenario_options
@click.option("--depth", type=int, default=3, show_default=True, help="How many levels of dependencies to show.")
@click.option("--format", "fmt", type=click.Choice(["tree", "json"]), default="tree")
def explain(quantity: str, depth: int, fmt: str, **kwargs: Any) -> None:
    """Show how QUANTITY was derived: its rule, inputs, values and sources.

    Without a model, explains the documented example (llama-2-7b, bf16-mixed, batch 4, seq 2048).
    """
    from fitplan.output import estimate_report as render
    from fitplan.context import get_context
    from fitplan.estimation import evaluate

    if not any(kwargs.get(k) for k in ("model", "params", "scenario_file")):
        kwargs.update(model="llama-2-7b", precision=kwargs.get("precision") or "bf16-mixed",
                      per_device_train_batch_size=kwargs.get("per_device_train_batch_size") or 4)
    est = _estimate(kwargs)
    name = _quantity_name(quantity, est)
    tree = render.explain_tree(est, name, depth=depth)
    seed_est = None
    if est.scenario.model.assumptions != "seed" and est.scenario.model.method == "full":
        ctx = get_context()
        try:
            seed_est = evaluate(est.scenario.replace(assumptions="seed"), ctx.registry, est.rulesets)
        except FitplanError:
            seed_est = None
    diffs = render.seed_differences(est, seed_est, [name] if name not in ("peak_bytes",) else
                                    [name, "optimizer_state_bytes", "activation_bytes", "framework_overhead_bytes"])
    if fmt == "json":
        _dump_json({"tree": tree, "seed_differences": diffs})
        return
    console = _console()
    render.print_tree(tree, console)
    if diffs:
        console.print("\n[bold]Where the seed chapter's assumptions differ[/] (fitplan estimate --assumptions seed):")
        for d in diffs:
            console.print(f"  - {d}")


_SHORT = {"time": "train_seconds", "cost": "on_demand_cost_usd", "spot_cost": "spot_cost_usd", "tokens": "train_tokens",
          "flops": "train_flops", "mfu": "train_mfu", "throughput": "train_tokens_per_second",
          "peak": "peak_bytes", "weights": "weight_bytes", "gradients": "gradient_bytes", "activations": "activation_bytes",
          "optimizer_states": "optimizer_state_bytes", "device_total": "device_total_bytes", "logits": "logits_bytes",
          "master_weights": "master_weight_bytes"}


def _quantity_name(name: str, est) -> str:
    name = _SHORT.get(name, name)
    graph = est.registry.compiled()
    if name in graph.nodes:
        return name
    from fitplan.errors import unknown

    raise unknown("quantity", name, [n for n in graph.nodes if graph.nodes[n].kind != "input"] + list(_SHORT))


@cli.command()
@click.option("--format", "fmt", type=click.Choice(["dot", "mermaid"]), default="dot", show_default=True)
@click.option("--out", "out_dir", type=click.Path(file_okay=False), default=None,
              help="Write both fitplan-graph.dot and fitplan-graph.mmd into this directory.")
def graph(fmt: str, out_dir: str | None) -> None:
    """Print the quantity graph as Graphviz DOT or Mermaid."""
    from fitplan.context import get_context

    compiled = get_context().registry.compiled()
    if out_dir:
        d = Path(out_dir)
        d.mkdir(parents=True, exist_ok=True)
        (d / "fitplan-graph.dot").write_text(compiled.to_dot(), encoding="utf-8")
        (d / "fitplan-graph.mmd").write_text(compiled.to_mermaid(), encoding="utf-8")
        click.echo(f"wrote {d / 'fitplan-graph.dot'} and {d / 'fitplan-graph.mmd'}")
        return
    click.echo(compiled.to_dot() if fmt == "dot" else compiled.to_mermaid(), nl=False)


@cli.command()
@click.option("--check", is_flag=True, help="Load every plugin and report every problem at once (exit 2 if any).")
@click.option("--format", "fmt", type=click.Choice(["table", "json"]), default="table")
def plugins(check: bool, fmt: str) -> None:
    """List plugins and what each registers (quantities, reducers, optimizers, ruleset dirs)."""
    from fitplan.pluginmgr.registry import make_registry

    reg = make_registry()
    dirs_by_plugin: dict[str, list[str]] = {}
    for name, result in reg._call_each("fitplan_ruleset_dirs", {}):
        if isinstance(result, (list, tuple)):
            dirs_by_plugin[name] = [str(d) for d in result]
    try:
        reg.compiled()
    except FitplanError as e:
        from fitplan.errors import PluginError

        reg.errors.append(PluginError(e.message, details=e.details))
    rows = []
    for name in reg.plugin_names():
        hooks = sorted({h.name for h in reg.pm.get_hookcallers(reg.pm.get_plugin(name)) or []})
        rows.append({
            "name": name,
            "builtin": name.startswith("fitplan.builtin."),
            "hooks": hooks,
            "quantities": sorted(q.name for q in reg.quantities if q.plugin == name),
            "reducers": sorted(f"{r.target}.{r.name}" for r in reg.reducers if r.plugin == name),
            "optimizers": sorted(o.name for o in reg.optimizers.values() if o.plugin == name),
            "ruleset_dirs": dirs_by_plugin.get(name, []),
        })
    problems = [e.render() for e in reg.errors]
    if fmt == "json":
        _dump_json({"plugins": rows, "blocked": sorted(reg.blocked), "problems": problems})
    else:
        console = _console()
        for r in rows:
            kind = "built-in" if r["builtin"] else "third-party"
            console.print(f"[bold]{r['name']}[/] [dim]({kind})[/]")
            for key in ("quantities", "reducers", "optimizers", "ruleset_dirs"):
                if r[key]:
                    console.print(f"    {key}: {', '.join(r[key])}")
        if reg.blocked:
            console.print(f"[yellow]blocked[/] (FITPLAN_BLOCK_PLUGINS): {', '.join(sorted(reg.blocked))}")
        for p in problems:
            _console(err=True).print(f"[red]problem:[/] {p}", markup=True)
        if check and not problems:
            console.print("[green]no problems found[/]")
    if check and problems:
        sys.exit(2)


@cli.group()
def rulesets() -> None:
    """Check and import rulesets."""


@rulesets.command("check")
@click.argument("paths", nargs=-1, required=True)
def rulesets_check(paths: tuple[str, ...]) -> None:
    """Validate ruleset files or directories; report every error at once as `file: message @ $.path`."""
    from fitplan.rulesets.loader import check_paths

    errors = check_paths(paths)
    if not errors:
        from fitplan.pluginmgr.registry import default_registry
        from fitplan.rules.policy import rule_name_problems

        errors = rule_name_problems(paths, default_registry())
    for e in errors:
        click.echo(e, err=True)
    if errors:
        click.echo(f"{len(errors)} error(s)", err=True)
        sys.exit(2)
    click.echo(f"ok: {', '.join(paths)}")


def _provider_from_path(path: Path) -> str | None:
    """``catalogs/v8/aws/vms.csv`` -> aws; ``aws_vms.csv`` -> aws."""
    if path.name == "vms.csv":
        return path.parent.name or None
    stem = path.stem
    for suffix in ("_vms", "-vms", ".vms"):
        if stem.endswith(suffix):
            return stem[: -len(suffix)] or None
    return None


@rulesets.command("import-skypilot")
@click.argument("csv_file", type=click.Path(dir_okay=False))
@click.option("--out", "out", required=True, type=click.Path(dir_okay=False), help="The pricing ruleset TOML to write.")
@click.option("--provider", default=None, help="Provider id to write (default: the cloud, from catalogs/v8/<cloud>/vms.csv or <cloud>_vms.csv).")
@click.option("--map", "mappings", multiple=True, metavar="NAME=GPU",
              help="Map a SkyPilot accelerator name to a GPU id of the hardware ruleset (repeatable).")
@click.option("--date", default="", help="The catalog's date, written on every instance (e.g. 2025-11).")
@click.option("--billing", type=click.Choice(["second", "minute", "hour"]), default=None,
              help="Billing unit (default: known per cloud, else second).")
@click.option("--minimum-seconds", type=int, default=None, help="Minimum billed seconds (default: known per cloud, else 60).")
@click.option("--spot-overhead", type=float, default=0.1, show_default=True,
              help="Extra fraction of run time lost to spot interruptions.")
@click.option("--ruleset-dir", "ruleset_dirs", multiple=True, type=click.Path(file_okay=False),
              help="Extra ruleset directory whose GPU ids and aliases accelerator names may match.")
def rulesets_import_skypilot(csv_file: str, out: str, provider: str | None, mappings: tuple[str, ...], date: str,
                             billing: str | None, minimum_seconds: int | None, spot_overhead: float,
                             ruleset_dirs: tuple[str, ...]) -> None:
    """Convert a SkyPilot catalog CSV (catalogs/v8/<cloud>/vms.csv) into a pricing ruleset.

    Columns are found by header name. GCP's separate VM and GPU rows are combined (VM + count × GPU
    price, same region). Malformed rows are all reported with their line numbers (exit 2) and nothing
    is written; accelerators that map to no GPU are reported and skipped.
    """
    import os
    import tempfile

    import tomli_w

    from fitplan.context import get_context
    from fitplan.inputs.convert import CONVERTER, error_lines
    from fitplan.rulesets.loader import RulesetFile, check_paths
    from fitplan.rulesets.skypilot import import_catalog, known_gpu_names

    path = Path(csv_file)
    if not path.exists():
        raise FitplanError("file not found", file=str(path), field="CSV_FILE")
    provider = provider or _provider_from_path(path)
    if not provider:
        raise FitplanError("cannot tell the provider from the file name", file=str(path), field="--provider",
                           suggestion="pass --provider NAME (e.g. aws, gcp)")
    extra: dict[str, str] = {}
    for m in mappings:
        name, sep, gpu = m.partition("=")
        if not sep or not name.strip() or not gpu.strip():
            raise FitplanError(f"--map expects NAME=GPU, got {m!r}", field="--map", value=m, suggestion="e.g. --map A100=a100-40gb")
        extra[name.strip()] = gpu.strip()
    rules = get_context(ruleset_dirs).rulesets
    result = import_catalog(path, provider, known_gpus=known_gpu_names(rules.gpus.values()), extra_map=extra, date=date,
                            billing=billing, minimum_seconds=minimum_seconds, spot_overhead=spot_overhead)
    if result.errors:
        raise FitplanError(f"{len(result.errors)} malformed row(s); nothing written", file=str(path), field="CSV_FILE",
                           details=result.errors, suggestion="fix or remove these rows")
    try:
        CONVERTER.structure(result.data, RulesetFile)
    except Exception as e:  # noqa: BLE001 - cattrs error groups
        raise FitplanError("the converted ruleset is invalid; nothing written", file=str(path),
                           details=error_lines(e)) from None
    for w in result.warnings:
        click.echo(f"warning: {w}", err=True)
    if result.unknown:
        names = ", ".join(f"{k} ({n} row{'s' if n > 1 else ''})" for k, n in sorted(result.unknown.items()))
        click.echo(f"skipped accelerators that map to no GPU: {names}; map one with --map NAME=gpu-id", err=True)
    unmapped = sorted({i["gpu"] for i in result.data["instance"]} - set(rules.gpus))
    if unmapped:
        click.echo(f"warning: GPU id(s) not in the hardware rulesets: {', '.join(unmapped)} "
                   "(estimates with them need a [[gpu]] entry)", err=True)
    target = Path(out)
    target.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=target.parent, prefix=f".{target.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as fh:
            fh.write(f"# Pricing ruleset imported from the SkyPilot catalog {path.name} by `fitplan rulesets import-skypilot`.\n"
                     .encode())
            tomli_w.dump(result.data, fh)
        problems = check_paths([tmp])
        if problems:
            raise FitplanError("the converted ruleset does not pass `fitplan rulesets check`; nothing written",
                               details=problems)
        os.replace(tmp, target)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
    click.echo(f"wrote {target}: provider {provider!r}, {len(result.data['instance'])} instance(s)")


@cli.group()
def models() -> None:
    """The bundled model catalog."""


@models.command("list")
@click.option("--format", "fmt", type=click.Choice(["table", "json"]), default="table")
@click.option("--ruleset-dir", "ruleset_dirs", multiple=True, type=click.Path(file_okay=False))
def models_list(fmt: str, ruleset_dirs: tuple[str, ...]) -> None:
    """List catalog models with their parameter counts."""
    from fitplan.inputs.architecture import spec_from_config
    from fitplan.context import get_context

    rules = get_context(ruleset_dirs).rulesets
    rows = []
    for mid in sorted(rules.models):
        e = rules.models[mid]
        spec = spec_from_config(e.config, name=mid)
        rows.append({"id": mid, "hf_id": e.hf_id, "model_type": spec.model_type, "param_count": spec.param_count,
                     "active_param_count": spec.active_param_count, "source": e.source})
    if fmt == "json":
        _dump_json(rows)
        return
    from rich.table import Table

    from fitplan.units import format_count

    t = Table(show_edge=False)
    for c in ("id", "HF id", "type", "params"):
        t.add_column(c, justify="right" if c == "params" else "left")
    for r in rows:
        t.add_row(r["id"], r["hf_id"], r["model_type"], format_count(r["param_count"]))
    _console().print(t)


@models.command("show")
@click.argument("name")
@click.option("--ruleset-dir", "ruleset_dirs", multiple=True, type=click.Path(file_okay=False))
def models_show(name: str, ruleset_dirs: tuple[str, ...]) -> None:
    """Show a catalog model (or a config.json): its fields and exact parameter count."""
    from fitplan.inputs.architecture import load_config_json, spec_from_config, spec_to_dict
    from fitplan.context import get_context

    if name.endswith(".json"):
        spec = load_config_json(name)
        origin = name
    else:
        rules = get_context(ruleset_dirs).rulesets
        e = rules.model_entry(name)
        spec = spec_from_config(e.config, name=e.id, source=e.source)
        origin = rules.origin.get(f"model:{e.id}", "")
    data = spec_to_dict(spec)
    data.update(param_count=spec.param_count, active_param_count=spec.active_param_count, ruleset=origin)
    data.pop("bare_param_count", None)
    _dump_json(data)


@cli.command()
@scenario_options
@click.option("--mode", type=click.Choice(["auto", "cpu", "fake", "cuda"]), default="auto", show_default=True,
              help="auto: cuda if present, real CPU tensors for small models, FakeTensorMode for large ones.")
@click.option("--steps", type=int, default=1, show_default=True, help="Measured steps after one warm-up step.")
@click.option("--calibrate-out", type=click.Path(dir_okay=False), default=None,
              help="Write measured framework overheads (CUDA only) as a ruleset TOML file.")
@click.option("--random-seed", type=int, default=0, show_default=True, help="Seed for the random weights and tokens.")
@click.option("--memtracker/--no-memtracker", default=True, show_default=True,
              help="Also measure the peak with torch's MemTracker (per-category breakdown).")
@click.option("--max-cpu-memory", default=None, help="Refuse real CPU runs whose peak exceeds this (e.g. 16G; "
              "default: a fraction of the available RAM).")
@click.option("--format", "fmt", type=click.Choice(["table", "json"]), default="table")
def validate(mode: str, steps: int, calibrate_out: str | None, random_seed: int, memtracker: bool,
             max_cpu_memory: str | None, fmt: str, **kwargs: Any) -> None:
    """Run the scenario for real with PyTorch and compare with the estimate (needs the fitplan-torch plugin)."""
    est = _estimate(kwargs)
    hook = est.registry.pm.hook.fitplan_validate
    if not hook.get_hookimpls():
        raise FitplanError("no validation plugin is installed", field="validate",
                           suggestion="pip install torch==2.13.0 transformers peft && pip install -e plugins/fitplan-torch")
    if steps < 1:
        raise FitplanError(f"--steps must be >= 1, got {steps}", field="--steps", value=steps)
    try:
        options: dict[str, Any] = {"mode": mode, "steps": steps, "calibrate_out": calibrate_out, "seed": random_seed,
                                   "memtracker": memtracker}
        if max_cpu_memory is not None:
            from fitplan.units import parse_count

            options["max_cpu_bytes"] = parse_count(max_cpu_memory, field="--max-cpu-memory")
        report = hook(scenario=est.scenario, estimate=est, options=options)
    except FitplanError:
        raise
    except Exception as e:  # noqa: BLE001 - a plugin bug is reported, not a traceback
        from fitplan.errors import PluginError

        names = ", ".join(est.registry.pm.get_name(i.plugin) or "?" for i in hook.get_hookimpls())
        raise PluginError(f"the validation plugin ({names}) failed: {type(e).__name__}: {e}", field="fitplan_validate",
                          suggestion="run with a smaller scenario or report the bug to the plugin") from None
    if report is None:
        raise FitplanError("the validation plugin returned nothing for this scenario", field="validate")
    if fmt == "json":
        _dump_json(report)
        return
    from rich.table import Table

    from fitplan.units import format_bytes_auto as format_bytes

    t = Table(title=f"predicted vs measured ({report.get('mode', mode)}, {report.get('device', '')})", show_edge=False)
    for c in ("component", "predicted", "measured", "error"):
        t.add_column(c, justify="left" if c == "component" else "right")
    for name, c in report.get("components", {}).items():
        err = c.get("relative_error")
        t.add_row(name, format_bytes(c.get("predicted")), format_bytes(c.get("measured")),
                  "-" if err is None else f"{100 * err:+.2f} %")
    _console().print(t)


def _register_plugin_commands() -> None:
    try:
        from fitplan.pluginmgr.registry import default_registry

        reg = default_registry()
        reg.pm.hook.fitplan_register_commands(cli=cli)
    except FitplanError:
        pass  # reported by the command that needs the plugins
    except Exception as e:  # noqa: BLE001 - a plugin's command must not break the CLI
        click.echo(f"warning: a plugin failed to add its commands: {e}", err=True)


from fitplan.cli.commands import register as _register_commands  # noqa: E402 - recommend, capacity

_register_commands(cli)


def main(argv: list[str] | None = None) -> None:
    _register_plugin_commands()
    try:
        cli.main(args=argv, prog_name="fitplan", standalone_mode=False)
    except FitplanError as e:
        _console(err=True).print(f"[bold red]error:[/] {e.render()}", markup=True, highlight=False)
        sys.exit(e.exit_code)
    except click.exceptions.Abort:
        click.echo("aborted", err=True)
        sys.exit(1)
    except click.ClickException as e:
        e.show()
        sys.exit(2 if e.exit_code == 2 else e.exit_code)
    except click.exceptions.Exit as e:
        sys.exit(e.exit_code)
    except BrokenPipeError:
        sys.exit(0)
