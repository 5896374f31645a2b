"""Lazy imports of torch, transformers and peft, with a fitplan error that says what to install."""

from __future__ import annotations

import importlib
from types import ModuleType

from fitplan.api import FitplanError

INSTALL = "pip install torch==2.13.0 transformers peft (CPU build: add --index-url https://download.pytorch.org/whl/cpu to the torch line)"


def need(module: str) -> ModuleType:
    """Import ``module`` or raise a :class:`fitplan.FitplanError` naming what to install."""
    try:
        return importlib.import_module(module)
    except ImportError as e:
        raise FitplanError(f"fitplan validate needs {module.split('.')[0]}, which is not installed ({e})",
                           field="validate", suggestion=INSTALL) from None


def torch() -> ModuleType:
    return need("torch")


def transformers() -> ModuleType:
    torch()
    return need("transformers")


def peft() -> ModuleType:
    torch()
    return need("peft")
