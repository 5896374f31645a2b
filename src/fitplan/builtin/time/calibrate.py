"""``fitplan calibrate``: a measured run of your own -> a ``[[time_calibration]]`` ruleset that later estimates use."""

from __future__ import annotations

import datetime
from pathlib import Path
from typing import Any

import click

from fitplan.app.options import estimate_from, scenario_options


def add(cli: click.Group) -> None:
    cli.add_command(calibrate)


@click.command()
@click.argument("run_log", type=click.Path(dir_okay=False))
@scenario_options
@click.option("--out", "out", type=click.Path(dir_okay=False), required=True,
              help="The calibration ruleset to write (a .toml file; load its directory with --ruleset-dir).")
@click.option("--date", "date", default=None, help="The date recorded in the row (default: today).")
def calibrate(run_log: str, out: str, date: str | None, **options: Any) -> None:
    """Calibrate the time model on a run you measured: RUN_LOG is the run's trainer_state.json or
    train_results.json (HF Trainer), a torchtune log_*.txt, or a litgpt metrics.csv; the flags (or a
    SCENARIO_FILE) describe the run as it ran (model, method, precision, GPU and count, micro-batch,
    sequence length, accumulation, checkpointing).

    Writes one [[time_calibration]] row: scale = the measured step time / the model's. Estimates on the
    same GPU (and model and method) with --ruleset-dir pointing at OUT's directory multiply their step
    time by it, and say so.
    """
    from fitplan.builtin.time.calibration import calibration_row, calibration_toml
    from fitplan.errors import FitplanError
    from fitplan.inputs.runlogs import read_run_log
    from fitplan.files import write_text
    from fitplan.rulesets.loader import check_text

    if not out.endswith(".toml"):
        raise FitplanError("the calibration file must end in .toml (fitplan reads *.toml from --ruleset-dir)",
                           field="--out", value=out)
    measurement = read_run_log(run_log)
    row = calibration_row(estimate_from(options), measurement, date or datetime.date.today().isoformat())
    text = calibration_toml(row)
    problems = check_text(text.encode("utf-8"), Path(out).name)
    if problems:  # never write a file that later commands refuse
        raise FitplanError("the measured run gives a calibration fitplan cannot use; nothing written", file=run_log,
                           field="RUN_LOG", details=problems, suggestion="check the log's runtime, steps and tokens")
    write_text(out, text)
    click.echo(f"measured {row['measured_tokens_per_second_per_gpu']:,.0f} tokens/s per GPU; the time model gave "
               f"{row['predicted_tokens_per_second_per_gpu']:,.0f}: scale {row['scale']:.3f} (step time × {row['scale']:.3f})")
    click.echo(f"wrote {out}: add --ruleset-dir {Path(out).parent} to later estimates on this GPU")
