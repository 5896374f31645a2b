"""``fitplan validate``: run the scenario for real with the validation plugin (fitplan-torch) and compare."""

from __future__ import annotations

from typing import Any

import click

from fitplan.app.options import emit, estimate_from, format_option, scenario_options
from fitplan.errors import FitplanError


def add(cli: click.Group) -> None:
    cli.add_command(validate)


@click.command()
@scenario_options
@click.option("--mode", type=click.Choice(["auto", "cpu", "fake", "cuda"]), default="auto", show_default=True,
              help="auto: cuda if present, real CPU tensors for small models, FakeTensorMode for large ones.")
@click.option("--steps", type=int, default=1, show_default=True, help="Measured steps after one warm-up step.")
@click.option("--calibrate-out", type=click.Path(dir_okay=False), default=None,
              help="Write measured framework overheads (CUDA only) as a ruleset TOML file.")
@click.option("--random-seed", type=int, default=0, show_default=True, help="Seed for the random weights and tokens.")
@click.option("--memtracker/--no-memtracker", default=True, show_default=True,
              help="Also measure the peak with torch's MemTracker (per-category breakdown).")
@click.option("--driver", type=click.Choice(["accelerate", "trainer"]), default="accelerate", show_default=True,
              help="accelerate FSDP: Accelerator.prepare and a bare step, or the real HF Trainer.train(); DeepSpeed: "
              "deepspeed.initialize driven directly, or Trainer.train() with the --deepspeed config as given.")
@click.option("--max-cpu-memory", default=None, help="Refuse real CPU runs whose peak exceeds this (e.g. 16G; "
              "default: a fraction of the available RAM).")
@format_option("validate")
def validate(mode: str, steps: int, calibrate_out: str | None, random_seed: int, memtracker: bool, driver: str,
             max_cpu_memory: str | None, fmt: str, **options: Any) -> None:
    """Run the scenario for real with PyTorch and compare with the estimate (needs the fitplan-torch plugin)."""
    est = estimate_from(options)
    hook = est.registry.pm.hook.fitplan_validate
    if not hook.get_hookimpls():
        raise FitplanError("no validation plugin is installed", field="validate",
                           suggestion="pip install torch==2.13.0 transformers peft && pip install -e plugins/fitplan-torch")
    if steps < 1:
        raise FitplanError(f"--steps must be >= 1, got {steps}", field="--steps", value=steps)
    run: dict[str, Any] = {"mode": mode, "steps": steps, "calibrate_out": calibrate_out, "seed": random_seed,
                           "memtracker": memtracker, "driver": driver}
    if driver == "trainer":
        ds = user_ds_config(options)
        if ds:
            run["ds_config"] = ds  # "auto" values and all: TrainingArguments(deepspeed=...) fills them
    if max_cpu_memory is not None:
        from fitplan.units import parse_count

        run["max_cpu_bytes"] = parse_count(max_cpu_memory, field="--max-cpu-memory")
    seen = len(est.registry.errors)
    report = hook(scenario=est.scenario, estimate=est, options=run)  # a plugin's failure is recorded, naming it
    failed = [e for e in est.registry.errors[seen:] if e.field == "fitplan_validate"]
    if report is None and failed:
        raise failed[0]
    if report is None:
        raise FitplanError("the validation plugin returned nothing for this scenario", field="validate")
    emit("validate", report, fmt)


def user_ds_config(options: dict[str, Any]) -> dict[str, Any] | None:
    """The ds_config as the user wrote it: ``--deepspeed FILE``, else the ``deepspeed`` key of ``--training-args``
    (an inline object or a path relative to that file); None without one."""
    from pathlib import Path

    from fitplan.inputs.files import read_json

    if options.get("deepspeed"):
        return read_json(Path(options["deepspeed"]))
    if not options.get("training_args"):
        return None
    ta_path = Path(options["training_args"])
    ds = read_json(ta_path).get("deepspeed")
    if isinstance(ds, str):
        p = Path(ds)
        return read_json(p if p.is_absolute() else ta_path.parent / p)
    return ds if isinstance(ds, dict) else None
