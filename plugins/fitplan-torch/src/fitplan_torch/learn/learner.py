"""Learn, check, write: what ``fitplan learn-architecture`` runs (and the bundled files were made with)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from fitplan.api import FitplanError


def learn_and_check(cfg: dict[str, Any], target: Path, *, verify: bool = True, tolerance: float = 0.01,
                    log=print, memory: bool = True) -> list[Path]:
    from . import derive, files
    from . import verify as V
    from .patterns import PatternError

    try:
        data, results, specs = derive.learn_full(cfg, log=log)
    except (derive.LearnError, PatternError) as e:
        raise FitplanError(f"cannot learn {cfg.get('model_type')!r}: {e}", field="model_type",
                           value=cfg.get("model_type")) from None
    if verify:
        problems = V.check_graph(data, results, specs, log)
        rows: list[dict[str, Any]] = []
        if memory and not problems:
            heldout, b, s = V.heldout(cfg, [], derive.Regime("as given", None), 2, 16)
            mem, rows = V.check_memory(data, heldout, log, tolerance=tolerance)
            problems += mem
        if problems:
            raise FitplanError(f"the learned file for {cfg['model_type']!r} does not reproduce a fresh run, so it "
                               "was not written", details=problems[:20],
                               suggestion="report it with the config; --no-verify writes it anyway, marked unverified "
                                          "(its figures are then approximate, not exact)")
        data["verified"] = {"tolerance": tolerance, "cases": len(rows)}
    else:
        data["verified"] = False  # fitplan's figures from it are approximate (builtin/confidence.py)
        log("  not verified (--no-verify): the file is marked so, and estimates with it say so")
    return files.write(data, target, log=log)  # the per-op diff against the files it replaces
