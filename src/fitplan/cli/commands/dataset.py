"""``fitplan dataset``: read a dataset as TRL's SFT trainer would, and report its tokens, lengths, truncation
and what each padding mode computes (docs/dataset.md)."""

from __future__ import annotations

import click

from fitplan.app.options import emit, format_option
from fitplan.inputs.field_checks import LIMITS
from fitplan.inputs.scenario import Training


def add(cli: click.Group) -> None:
    cli.add_command(dataset)


def _check_out(ctx: click.Context, param: click.Parameter, value: str | None) -> str | None:
    """``--out`` is checked before the dataset is read."""
    if value is not None:
        from fitplan.files import check_target

        check_target(value)
    return value


@click.command()
@click.argument("path", type=click.Path())
@click.option("--model", default=None, help="Whose tokenizer: a catalog model (its Hugging Face id), a Hugging Face id, "
                                            "or a directory with config.json and tokenizer.json.")
@click.option("--tokenizer", default=None, help="A tokenizer directory (tokenizer.json, tokenizer_config.json) or a "
                                                "Hugging Face id (ORG/NAME[@revision]), instead of --model's.")
@click.option("--text-field", "text_field", default="text", show_default=True,
              help="The column of plain-text examples (TRL's dataset_text_field).")
@click.option("--chat-template", "chat_template_path", type=click.Path(dir_okay=False), default=None,
              help="A .jinja chat template replacing the tokenizer's (TRL's chat_template_path).")
@click.option("--split", default=None, help="The split of a saved DatasetDict (default train).")
@click.option("--max-seq-length", "max_length", type=click.IntRange(1, int(LIMITS["max_seq_length"])), default=Training().max_seq_length,
              show_default=True, help="Truncation length (TRL's max_length) and the packed row length.")
@click.option("--per-device-train-batch-size", "batch", type=click.IntRange(1, int(LIMITS["per_device_train_batch_size"])), default=8, show_default=True,
              help="Micro-batch whose padding is counted (8: the TrainingArguments default).")
@click.option("--gradient-accumulation-steps", "accumulation",
              type=click.IntRange(1, int(LIMITS["gradient_accumulation_steps"])), default=1, show_default=True,
              help="Accumulation steps (group_by_length sorts megabatches of micro-batch × steps).")
@click.option("--sample", type=click.IntRange(1, int(LIMITS["dataset_sample"])), default=None,
              help="Tokenize a random sample of N examples; totals are scaled, with a 95 % confidence interval.")
@click.option("--seed", type=int, default=0, show_default=True, help="Seed of the sample and of the simulated shuffles.")
@click.option("--jobs", type=click.IntRange(min=1), default=None,
              help="Worker processes for a large JSON Lines file (default: every core).")
@click.option("--no-cache", "no_cache", is_flag=True, default=False,
              help="Tokenize again even when the cache holds this dataset's summary (and do not write it).")
@click.option("--ruleset-dir", "ruleset_dirs", multiple=True, type=click.Path(file_okay=False),
              help="Extra ruleset directory (for --model names of a custom catalog).")
@format_option("dataset")
@click.option("--out", "out", type=click.Path(dir_okay=False), default=None, callback=_check_out,
              help="Write the summary (token lengths, no text) to this TOML file; --dataset accepts it.")
def dataset(path: str, model: str | None, tokenizer: str | None, text_field: str, chat_template_path: str | None,
            split: str | None, max_length: int, batch: int, accumulation: int, sample: int | None, seed: int,
            jobs: int | None, no_cache: bool, ruleset_dirs: tuple[str, ...], fmt: str, out: str | None) -> None:
    """Count the tokens of the dataset at PATH as TRL's SFT trainer tokenizes it.

    PATH is a JSON Lines, JSON, CSV or Parquet file, a directory of such files, a directory written by
    `datasets`' save_to_disk, or a summary TOML written by --out. Text comes from --text-field, chat
    `messages` / `conversations` are rendered with the model's chat template, prompt/completion pairs are
    joined. Reports tokens per example, truncation at --max-seq-length, and the tokens computed per epoch
    when padding to the longest in each micro-batch, grouping by length, padding to --max-seq-length,
    packing, or padding-free.
    """
    from fitplan.data.figures import figures
    from fitplan.data.resolve import Request, default_jobs, is_summary, summary_for

    rules = None
    if model and not tokenizer and not is_summary(path):
        from fitplan.context import get_context

        rules = get_context(ruleset_dirs).rulesets
    req = Request(path, text_field, tokenizer, model, chat_template_path, split, sample, seed,
                  jobs or default_jobs(), not no_cache)
    summary = summary_for(req, rules)
    if out:
        from fitplan.files import write_text

        write_text(out, summary.to_toml())
        click.echo(f"wrote {out}", err=True)
    emit("dataset", figures(summary, max_length, batch, accumulation), fmt)
