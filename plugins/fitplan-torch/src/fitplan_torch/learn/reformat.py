"""Rewrite learned architecture files in format 2 (:mod:`fitplan.arch.archformat`), or check that they are.

    python -m fitplan_torch.learn.reformat                      # every pair in rulesets/architectures
    python -m fitplan_torch.learn.reformat llama.json x/phi.graphs.json DIR   # some pairs, or every pair in DIR
    python -m fitplan_torch.learn.reformat --check [FILES]      # exit 1 if a file is not format 2 as written

A pair is ``<model_type>.json`` with ``<model_type>.graphs.json``; naming either file names the pair. Each
pair is read (format 1 or 2), then written in format 2 by the learner's own writer
(:func:`fitplan_torch.learn.files.texts`); the in-memory data is compared before it is written, so a
rewrite can never change an estimate. Rerunning it is harmless: a file already in format 2 as the writer
lays it out is left untouched. Needs no torch: only fitplan.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from fitplan.api import FitplanError

from . import files

BUNDLED = Path(__file__).resolve().parents[5] / "rulesets" / "architectures"
SHARED = ("autograd", "peft", "sequence_classifiers", "liger")
"""Tables beside the architecture files that are no pair (:data:`fitplan.arch.archfile.SHARED_TABLES`)."""


def pairs(paths: list[str]) -> list[tuple[Path, str]]:
    """``(directory, model_type)`` of every pair the arguments name (no argument: the bundled folder)."""
    out: list[tuple[Path, str]] = []
    for arg in paths or [str(BUNDLED)]:
        p = Path(arg)
        if p.is_dir():
            out += [(p, f.name.removesuffix(".graphs.json")) for f in sorted(p.glob("*.graphs.json"))]
        elif p.name.endswith(".graphs.json"):
            out.append((p.parent, p.name.removesuffix(".graphs.json")))
        elif p.suffix == ".json" and p.stem not in SHARED:
            out.append((p.parent, p.stem))
        else:
            raise SystemExit(f"reformat: {arg}: not a learned architecture file or a folder of them")
    return list(dict.fromkeys(out))


def reformat(directory: Path, model_type: str, *, check: bool) -> str:
    """Rewrite (or with ``check`` only compare) one pair; returns what happened, in a word."""
    data = files.read(directory, model_type)
    header, graphs = files.texts(data)
    p1, p2 = directory / f"{model_type}.json", directory / f"{model_type}.graphs.json"
    if p1.read_text(encoding="utf-8") == header and p2.read_text(encoding="utf-8") == graphs:
        return "format 2 already"
    if check:
        return "NOT format 2 as written"
    again = files.read_texts(header, graphs, str(directory / model_type))
    if _comparable(again) != _comparable(data):
        raise SystemExit(f"reformat: {p2}: format 2 would not read back as the same data; nothing written")
    p1.write_text(header, encoding="utf-8")
    p2.write_text(graphs, encoding="utf-8")
    return "rewritten"


def _comparable(data: dict) -> dict:
    """The data less what says which format it came from."""
    return {k: v for k, v in data.items() if k != "format"}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("paths", nargs="*", help="files or folders (default: the bundled rulesets/architectures)")
    ap.add_argument("--check", action="store_true", help="write nothing; exit 1 if a pair is not format 2 as written")
    args = ap.parse_args(argv)
    bad = 0
    for directory, model_type in pairs(args.paths):
        try:
            what = reformat(directory, model_type, check=args.check)
        except (ValueError, KeyError, OSError, FitplanError) as e:  # a row format 2 has no field for, a broken file
            print(f"reformat: {directory / model_type}: {e}", file=sys.stderr)
            return 2
        bad += what.startswith("NOT")
        print(f"{directory / model_type}: {what}")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
