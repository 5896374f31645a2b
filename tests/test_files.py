"""The input boundary (fitplan.inputs.files): every malformed file is a FitplanError naming it, never a hang,
a traceback or a silent NaN. Expected messages are the boundary's own contract (docs/reliability.md)."""

from __future__ import annotations

import codecs
import math
import os

import pytest

from fitplan.errors import FitplanError
from fitplan.inputs import files


def test_utf8_bom_and_utf16_are_read(tmp_path):
    p = tmp_path / "c.json"
    p.write_bytes(codecs.BOM_UTF8 + b'{"a": 1}')
    assert files.read_json(p) == {"a": 1}
    p.write_bytes('{"a": "é"}'.encode("utf-16"))
    assert files.read_json(p) == {"a": "é"}


def test_invalid_utf8_names_offset_line_and_column(tmp_path):
    p = tmp_path / "s.toml"
    p.write_bytes(b'[model]\nmodel = "ab\xffc"\n')
    with pytest.raises(FitplanError) as e:
        files.read_toml(p)
    assert str(p) in e.value.render() and "offset 19 (line 2, column 12)" in e.value.render()


def test_not_a_regular_file_is_refused_without_reading(tmp_path):
    fifo = tmp_path / "fifo.json"
    os.mkfifo(fifo)
    with pytest.raises(FitplanError, match="not a regular file"):
        files.read_json(fifo)  # a FIFO would block a reader forever
    with pytest.raises(FitplanError, match="is a directory"):
        files.read_json(tmp_path)
    with pytest.raises(FitplanError, match="file not found"):
        files.read_json(tmp_path / "missing.json")


def test_size_limit(tmp_path):
    p = tmp_path / "big.json"
    p.write_bytes(b" " * 101)
    with pytest.raises(FitplanError, match="101 bytes, more than the 100"):
        files.read_text(p, limit=100)


@pytest.mark.parametrize("text", ['{"x": NaN}', '{"x": Infinity}', '{"x": -Infinity}', '{"x": 1e999}'])
def test_json_non_finite_numbers_are_refused(text):
    with pytest.raises(FitplanError, match="non-finite number"):
        files.loads_json(text, file="f.json")


@pytest.mark.parametrize("text, value", [('{"x": [0.0, Infinity]}', [0.0, math.inf]),
                                         ('{"x": -Infinity}', -math.inf), ('{"x": 1e999}', math.inf),
                                         ('{"x": {"__float__": "Infinity"}}', math.inf),
                                         ('{"x": {"__float__": "-Infinity"}}', -math.inf),
                                         ('{"x": {"__float__": "pi"}}', {"__float__": "pi"})])
def test_a_model_config_reads_non_finite_numbers_as_transformers_does(text, value):
    """``PreTrainedConfig._dict_from_json_file`` (transformers/configuration_utils.py, 5.24): ``json.loads``, which
    reads ``Infinity`` and ``1e999`` as inf, then ``_decode_special_floats`` for its own ``{"__float__": ...}``
    objects (an unknown tag stays an object). Mamba-2's class default ``time_step_limit`` is ``(0.0, inf)``."""
    assert files.loads_json(text, file="config.json", special_floats=True) == {"x": value}


def test_a_model_config_reads_nan():
    assert math.isnan(files.loads_json('{"x": NaN}', file="config.json", special_floats=True)["x"])


@pytest.mark.parametrize("text", ["x = nan", "x = inf", "x = -inf", "x = 1e999"])
def test_toml_non_finite_numbers_are_refused(text):
    with pytest.raises(FitplanError, match="non-finite number"):
        files.loads_toml(text, file="f.toml")


def test_huge_integers_are_refused():
    with pytest.raises(FitplanError, match="digits"):
        files.loads_json('{"x": ' + "9" * 5000 + "}", file="f.json")
    with pytest.raises(FitplanError, match="digits on line 1"):
        files.loads_toml("x = " + "9" * 5000, file="f.toml")
    with pytest.raises(FitplanError, match="more than 100 digits"):
        files.loads_toml("x = " + "9" * 150, file="f.toml")


def test_deep_nesting_is_refused():
    with pytest.raises(FitplanError, match="nested"):
        files.loads_json("[" * 100000 + "]" * 100000, file="f.json")
    with pytest.raises(FitplanError, match="nested more than 64 levels"):
        files.loads_json("[" * 70 + "]" * 70, file="f.json")
    with pytest.raises(FitplanError, match="nested"):
        files.loads_toml("x = " + "[" * 5000 + "]" * 5000, file="f.toml")


def test_malformed_names_line_and_column():
    with pytest.raises(FitplanError, match=r"malformed JSON: Expecting property name enclosed in double quotes \(line 2, column 6\)"):
        files.loads_json('{"a":\n  1, }', file="f.json")
