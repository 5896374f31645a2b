"""The optional dependencies of the dataset reader (the ``data`` extra): imported on use, and a missing one is
a :class:`~fitplan.errors.FitplanError` naming the extra to install (exit 2), never an ImportError."""

from __future__ import annotations

import importlib
from types import ModuleType

from fitplan.errors import FitplanError

EXTRA = "fitplan[data]"
PACKAGES = {"tokenizers": "tokenizers", "jinja2": "jinja2", "pyarrow": "pyarrow", "numpy": "numpy"}
"""Module -> the distribution that provides it (all four are in the extra)."""


def need(module: str, purpose: str = "reading a dataset") -> ModuleType:
    """Import ``module`` (one of the extra's), or raise a FitplanError naming the extra."""
    try:
        return importlib.import_module(module)
    except ImportError:
        dist = PACKAGES.get(module.split(".")[0], module)
        raise FitplanError(f"{purpose} needs the optional dependency {dist!r}, which is not installed",
                           field="--dataset", value=dist,
                           suggestion=f"pip install '{EXTRA}' (tokenizers, jinja2, pyarrow, numpy)") from None
