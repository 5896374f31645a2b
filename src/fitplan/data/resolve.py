"""The summary a ``--dataset PATH`` names: read from a summary file, found in the cache, or made by reading
the data (all of it, or ``--sample N`` records drawn uniformly without replacement with a seeded generator).

The cache key hashes the data files' content, the tokenizer files' content (and ``--chat-template``'s), the
text field, the split and the sample; a second run with the same inputs reads the summary back instead of
tokenizing again. Within one process, a summary is also kept by path, size and modification time, so that the
variant scenarios an estimate evaluates (advice, the seed's comparison, the recommender) do not hash the file
again.
"""

from __future__ import annotations

import os
import random
from pathlib import Path
from typing import Any

import attrs

from fitplan.data import summary as sm
from fitplan.data.source import Source, open_source
from fitplan.errors import FitplanError

SEED = 0
"""The seed of the sample and of the simulated shuffles (``--seed`` changes it for ``fitplan dataset``)."""


@attrs.frozen
class Request:
    """How to read a dataset: the options of ``fitplan dataset`` and the ``[dataset]`` scenario fields."""

    path: str
    text_field: str = "text"
    tokenizer: str | None = None
    model: str | None = None
    chat_template_path: str | None = None
    split: str | None = None
    sample: int | None = None
    seed: int = SEED
    jobs: int = 1
    use_cache: bool = True


def is_summary(path: str | Path) -> bool:
    return Path(path).suffix.lower() == ".toml"


def _tokenizer_files(req: Request, rules: Any):
    from fitplan.data.tokenizer import locate, tokenizer_spec

    return locate(tokenizer_spec(req.tokenizer, req.model, rules))


def _select(source: Source, n: int, seed: int) -> tuple[int, set[int] | None, list[int]]:
    """``(examples, selected indices, first index of each file)``: a uniform sample of ``n`` indices."""
    counts = [source.file_count(f) for f in source.files]
    total = sum(counts)
    offsets = [sum(counts[:i]) for i in range(len(counts))]
    if n >= total:
        return total, None, offsets
    return total, set(random.Random(seed).sample(range(total), n)), offsets


def make(req: Request, rules: Any = None) -> sm.DatasetSummary:
    """Read (or find in the cache) the summary of ``req``'s dataset."""
    if is_summary(req.path):
        return sm.read_summary(req.path)
    if req.sample is not None and req.sample < 1:
        raise FitplanError("--sample must be at least 1", field="--sample", value=req.sample)
    source = open_source(req.path, req.split)
    name, files = _tokenizer_files(req, rules)
    from fitplan.data.tokenizer import file_fingerprint

    tok_print = file_fingerprint(files, req.chat_template_path)
    data_sha = sm.file_sha256(list(source.files))
    key = sm.cache_key(data_sha, sorted(tok_print.items()), req.text_field, source.split, req.sample, req.seed)
    if req.use_cache:
        hit = sm.cached(key)
        if hit is not None:
            return attrs.evolve(hit, source={**hit.source, "path": str(req.path)})
    from fitplan.data.lengths import Lengths
    from fitplan.data.scan import scan
    from fitplan.data.tokenizer import load

    tokenizer = load(name, files, req.chat_template_path)
    examples, select, offsets = _select(source, req.sample, req.seed) if req.sample else (None, None, None)
    kind, tally = scan(source, tokenizer, req.text_field, select=select, offsets=offsets, jobs=req.jobs)
    read = sum(tally.lengths.values())
    summary = sm.DatasetSummary(
        kind, req.text_field, examples if examples is not None else read, Lengths.from_counts(tally.lengths),
        Lengths.from_counts(tally.prompts) if tally.prompts else None, req.seed,
        {"path": str(req.path), "format": source.format, "bytes": source.size, "sha256": data_sha,
         "split": source.split, "files": len(source.files)},
        {"name": name, "sha256": tok_print}, key)
    if req.use_cache:
        sm.store(summary)
    return summary


def default_jobs() -> int:
    """Worker processes for a large file: the cores this process may use."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        return os.cpu_count() or 1


def scenario_summary(s: Any, rules: Any = None) -> sm.DatasetSummary | None:
    """The summary of a scenario's ``dataset_path`` (None without one). :raises FitplanError: the token flags
    given as well, or anything reading the dataset raises."""
    d = s.dataset
    if not d.dataset_path:
        return None
    given = [flag for flag, v in (("--num-examples", d.num_examples), ("--tokens-per-example", d.tokens_per_example),
                                  ("--total-tokens", d.total_tokens)) if v is not None]
    if given:
        raise FitplanError(f"--dataset counts the tokens itself: {', '.join(given)} cannot be given with it",
                           field=given[0].lstrip("-").replace("-", "_"), suggestion="drop " + " and ".join(given))
    req = Request(d.dataset_path, d.dataset_text_field, d.tokenizer, s.model.model, d.chat_template_path,
                  d.dataset_split, d.dataset_sample, jobs=default_jobs())
    return summary_for(req, rules)


def scenario_inputs(s: Any, rules: Any = None) -> dict[str, Any]:
    """The graph's inputs from a scenario's dataset: its summary, and its examples and (real, untruncated)
    tokens in place of ``num_examples`` and ``total_tokens`` (the time model's padding modes start from them)."""
    summary = scenario_summary(s, rules)
    return {"dataset_summary": summary, "num_examples": summary.examples,
            "total_tokens": round(summary.lengths.total * summary.examples / summary.read)}


_MEMO: dict[tuple, sm.DatasetSummary] = {}


def summary_for(req: Request, rules: Any = None) -> sm.DatasetSummary:
    """:func:`make`, kept per process by the path's size and modification time."""
    p = Path(req.path)
    try:
        st = os.stat(p)
        stamp = (st.st_size, st.st_mtime_ns)
    except OSError:
        stamp = None
    key = (attrs.astuple(req), stamp, id(rules))
    if stamp is None or key not in _MEMO:
        _MEMO[key] = make(req, rules)
    return _MEMO[key]
