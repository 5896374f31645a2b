"""Shared by the tests that run the torch referee (``plugins/fitplan-torch``) on a tiny model."""

from __future__ import annotations

import sys
import warnings
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def fitplan_torch_referee():
    """The ``fitplan_torch`` package (from ``plugins/fitplan-torch/src`` when it is not installed), after
    skipping the test unless torch, transformers and peft import; their warnings silenced. ``tests/conftest.py``
    marks a test that calls this ``referee`` and ``slow``, as it marks one that ``importorskip``s torch."""
    pytest.importorskip("torch")
    pytest.importorskip("transformers")
    pytest.importorskip("peft")
    try:
        import fitplan_torch  # noqa: F401
    except ImportError:
        sys.path.insert(0, str(ROOT / "plugins" / "fitplan-torch" / "src"))
    import fitplan_torch

    warnings.filterwarnings("ignore", module="transformers")
    warnings.filterwarnings("ignore", module="peft")
    return fitplan_torch
