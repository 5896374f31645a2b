"""Format 2 of the learned architecture files (src/fitplan/arch/archformat.py, docs/architectures.md): named
rows one per line, read through the cattrs converter into the in-memory lists; format 1 refused with the command
that rewrites it; the converter (fitplan_torch.learn.reformat) and the learner's per-op diff."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from fitplan.arch import archformat
from fitplan.arch.archfile import SHARED_TABLES, ArchFile
from fitplan.errors import FitplanError

ROOT = Path(__file__).resolve().parents[1]
BUNDLED = ROOT / "rulesets" / "architectures"

# A tiny learned pair in the in-memory layout (format 1's rows), written by hand: GPT-2's Conv1D c_fc in one layer.
PARAM = ["h.{i}.mlp.c_fc.weight", ["hidden_size", "4*hidden_size"], "linear:c_fc", ["k0"], None, "bf16", "conv1d"]
OP = ["addmm", [["self", "p:h.{i}.mlp.c_fc.bias"], ["mat1", "t0"], ["mat2", "p:h.{i}.mlp.c_fc.weight"]], ["t1"], {"g": "nnn"}]
VIEW = ["view", [["self", "a0"]], ["t0"]]
HEADER = {
    "format": 1, "model_type": "tinyformat",
    "config": {"class": "TinyConfig", "aliases": {}, "fields": {"hidden_size": {"type": "int", "default": 8, "size": True}},
               "checks": [["hidden_size % 2 == 0", "hidden_size", "must be even"]]},
    "spec": {"hidden_size": "hidden_size"},
    "params": [PARAM],
    "tied": [["lm_head.weight", "wte.weight", "tie_word_embeddings"]],
    "buffers": [["rotary.inv_freq", ["hidden_size//2"], "f32", False]],
    "layers": {"kind": None, "kinds": ["k0"], "prefix": "h"},
}
SEGMENT = {"t": [[["b*s", "hidden_size"], "bf16", "a0"], [["b*s", "4*hidden_size"], "bf16", None]],
           "ops": [VIEW, OP], "args": ["0"], "die": {"t0": 1, "t1": "F"}, "out": "t1"}
GRAPHS = {"format": 1, "model_type": "tinyformat", "variants": [], "segments": {"abc": SEGMENT}, "autograd": {}}


def test_rows_are_named_objects_one_per_line():
    header = archformat.dumps(archformat.encode_header(HEADER)).splitlines()
    graphs = archformat.dumps(archformat.encode_graphs(GRAPHS)).splitlines()
    assert '  {"name":"h.{i}.mlp.c_fc.weight","shape":["hidden_size","4*hidden_size"],"role":"linear:c_fc",' \
           '"layer_kinds":["k0"],"when":null,"dtype":"bf16","linear":"conv1d"}' in header
    assert '  {"name":"rotary.inv_freq","shape":["hidden_size//2"],"dtype":"f32","per_layer":false}' in header
    assert '  {"name":"lm_head.weight","target":"wte.weight","when":"tie_word_embeddings"}' in header
    assert '   {"expr":"hidden_size % 2 == 0","field":"hidden_size","message":"must be even"}' in header
    assert '    {"id":"t0","shape":["b*s","hidden_size"],"dtype":"bf16","base":"a0"},' in graphs
    assert '    {"op":"view","in":{"self":"a0"},"out":["t0"]},' in graphs
    assert '    {"op":"addmm","in":{"self":"p:h.{i}.mlp.c_fc.bias","mat1":"t0","mat2":"p:h.{i}.mlp.c_fc.weight"},' \
           '"out":["t1"],"g":"nnn"}' in graphs
    assert '    "t1": "F"' in graphs  # each storage's death on its own line too
    assert graphs[1] == ' "format": 2,'


def test_format_2_reads_back_as_the_in_memory_lists():
    header = archformat.decode_header(json.loads(archformat.dumps(archformat.encode_header(HEADER))), "h.json")
    graphs = archformat.decode_graphs(json.loads(archformat.dumps(archformat.encode_graphs(GRAPHS))), "g.json")
    assert header["params"] == [PARAM] and header["tied"] == HEADER["tied"] and header["buffers"] == HEADER["buffers"]
    assert header["config"]["checks"] == HEADER["config"]["checks"]
    assert graphs["segments"] == {"abc": SEGMENT}  # an op without extras stays three long
    assert header["format"] == graphs["format"] == 2


@pytest.mark.parametrize(("row", "message"), [
    ({"op": "view", "in": {"self": "a0"}}, "required field missing: out @ $.segments.abc.ops[0]"),
    ({"op": "view", "in": [["self", "a0"]], "out": ["t0"]}, "an op's op is a name, in an object, out a list"),
])
def test_a_bad_op_row_names_the_file_and_the_row(row, message):
    graphs = archformat.encode_graphs(GRAPHS)
    graphs["segments"]["abc"]["ops"][0] = row
    with pytest.raises(FitplanError) as e:
        archformat.decode_graphs(graphs, "x.graphs.json")
    assert e.value.file == "x.graphs.json"
    assert message in f"{e.value.message} @ {e.value.field}"


def test_an_unknown_key_in_a_tensor_row_is_refused():
    graphs = archformat.encode_graphs(GRAPHS)
    graphs["segments"]["abc"]["tensors"][1]["bsae"] = None
    with pytest.raises(FitplanError, match=r"unknown key\(s\) bsae in a tensor"):
        archformat.decode_graphs(graphs, "x.graphs.json")


def test_a_format_1_file_is_refused_with_the_converter_command(tmp_path):
    path = tmp_path / "tinyformat.json"
    path.write_text(json.dumps(HEADER), encoding="utf-8")
    with pytest.raises(FitplanError) as e:
        ArchFile(path)
    assert e.value.file == str(path) and e.value.field == "$.format" and e.value.value == 1
    assert f"python -m fitplan_torch.learn.reformat {path}" in e.value.message


def _format_1_pair(d: Path) -> None:
    d.mkdir()
    (d / "tinyformat.json").write_text(json.dumps({**HEADER, "layer_sites": []}, indent=1), encoding="utf-8")
    (d / "tinyformat.graphs.json").write_text(json.dumps(GRAPHS, separators=(",", ":")), encoding="utf-8")


def test_the_converter_rewrites_format_1_and_a_rerun_changes_nothing(tmp_path, capsys):
    reformat = pytest.importorskip("fitplan_torch.learn.reformat")
    from fitplan_torch.learn import files

    d = tmp_path / "arch"
    _format_1_pair(d)
    assert reformat.main(["--check", str(d)]) == 1
    assert reformat.main([str(d / "tinyformat.graphs.json")]) == 0
    data = files.read(d, "tinyformat")
    assert data["params"] == [PARAM] and data["segments"] == {"abc": SEGMENT}
    assert json.loads((d / "tinyformat.graphs.json").read_text())["format"] == 2
    before = {p.name: p.read_bytes() for p in d.iterdir()}
    assert reformat.main([str(d)]) == 0 and reformat.main(["--check", str(d)]) == 0
    assert {p.name: p.read_bytes() for p in d.iterdir()} == before
    assert capsys.readouterr().out.splitlines()[-1].endswith("tinyformat: format 2 already")


def test_every_bundled_file_says_format_2_on_its_second_line():
    # the fast suite's look at the bundled files; the slow test below lays each one out again
    for path in sorted(BUNDLED.glob("*.json")):
        if path.stem in SHARED_TABLES:
            continue
        with path.open(encoding="utf-8") as f:
            assert [f.readline(), f.readline()] == ["{\n", ' "format": 2,\n'], path


def test_every_bundled_file_is_format_2_as_the_writer_lays_it_out():
    # a file relearned by an older learner, or edited by hand, fails here: rerun the converter on it
    reformat = pytest.importorskip("fitplan_torch.learn.reformat")
    bad = [str(d / mt) for d, mt in reformat.pairs([str(BUNDLED)]) if reformat.reformat(d, mt, check=True) != "format 2 already"]
    assert bad == []
    assert len(reformat.pairs([str(BUNDLED)])) >= 30


def test_the_learner_prints_the_changed_ops(tmp_path):
    pytest.importorskip("fitplan_torch")
    from fitplan_torch.learn import files

    d = tmp_path / "arch"
    _format_1_pair(d)
    changed = json.loads(json.dumps({**HEADER, **GRAPHS, "format": 2}))
    changed["segments"]["abc"]["ops"][1][3] = {"g": "nyn"}  # the weight requires grad now
    lines = files.op_diff(d, "tinyformat", *files.texts(changed))
    assert "  tinyformat.json: unchanged" in lines
    assert "  tinyformat.graphs.json: 1 line(s) removed, 1 added (one row a line)" in lines
    assert [x for x in lines if x[:1] in "+-" and x[:3] not in ("+++", "---")] == [
        '-    {"op":"addmm","in":{"self":"p:h.{i}.mlp.c_fc.bias","mat1":"t0","mat2":"p:h.{i}.mlp.c_fc.weight"},'
        '"out":["t1"],"g":"nnn"}',
        '+    {"op":"addmm","in":{"self":"p:h.{i}.mlp.c_fc.bias","mat1":"t0","mat2":"p:h.{i}.mlp.c_fc.weight"},'
        '"out":["t1"],"g":"nyn"}']


def test_a_row_format_2_has_no_field_for_is_refused_naming_the_class_to_extend():
    # a learner that grows a row (another field on a tensor) must grow format 2 too, not lose the field
    grown = {**GRAPHS, "segments": {"abc": {**SEGMENT, "t": [[["b"], "bf16", None, 7]]}}}
    with pytest.raises(ValueError, match="a tensor of 4 fields.*add the new one to TensorRow"):
        archformat.encode_graphs(grown)
    with pytest.raises(ValueError, match="format 2 has no field for repeat: add it to SegmentRows"):
        archformat.encode_graphs({**GRAPHS, "segments": {"abc": {**SEGMENT, "repeat": 2}}})


# --------------------------------------------------------------------------- a buffer of some layer kinds only


@pytest.mark.parametrize("kinds, layers", [(None, 2), (["k0"], 2), (["k1"], 0)])
def test_a_layer_buffer_counts_in_the_layers_of_its_kinds_only(tiny_llama_with, kinds, layers):
    """MiniMax's lightning-attention decay tables (transformers 5.24 modeling_minimax.py
    ``MiniMaxLightningAttention``: ``diagonal_decay`` is ``heads × block_size × block_size``) are buffers of its
    linear-attention layers only; the file counted them in every layer (the memory check: 32-true sdpa full, peak
    15 % high, the 1056784 B of the one linear layer's tables counted twice). A buffer row's ``layer_kinds`` now
    says which kinds hold it; a row without it (files written before) counts in every layer. tiny-llama (2 layers,
    one kind ``k0``, fp32 ``hidden_size`` = 64): a 64-element fp32 buffer per layer adds 2 × 256 B, or nothing when
    its kind is none of the model's; the file round-trips through the format's rows with the field kept."""
    row = {"name": "model.layers.{i}.self_attn.decay", "shape": ["hidden_size"], "dtype": "f32", "per_layer": True,
           **({"layer_kinds": kinds} if kinds is not None else {})}
    from fitplan.api import clear_arch_caches
    from fitplan.trace import reuse

    def buffer_bytes(header):
        clear_arch_caches()  # (the traces built from the other file: the fixture clears the files only)
        reuse.clear()
        return tiny_llama_with(header)["buffer_bytes"]

    bundled = json.loads((BUNDLED / "llama.json").read_text())["buffers"]
    base = buffer_bytes({})
    assert buffer_bytes({"buffers": [*bundled, row]}) - base == layers * 64 * 4
    header = archformat.decode_header({"params": [], "buffers": [row]}, "x.json")
    assert archformat.encode_header({**header, "config": {}})["buffers"] == [row]


def test_two_learnings_merge_a_buffers_layer_kinds():
    """Two learnings of one type with different switches (``learn.files.merge``): a layer buffer both have is held by
    the layer kinds of either; one that a side lists without kinds (a file before the field) is in every layer."""
    from fitplan_torch.learn.files import merge

    def learning(kinds, *buffers):
        return {"model_type": "t", "layers": {"kind": None, "kinds": kinds}, "variants": [], "segments": {},
                "params": [], "config": {"fields": {}, "checks": []}, "tied": [], "buffers": list(buffers)}

    d = ["m.layers.{i}.decay", ["h"], "f32", True]
    a = learning(["k0"], [*d, ["k0"]], ["m.layers.{i}.other", ["h"], "f32", True, ["k0"]])
    b = learning(["k1"], [*d, ["k1"]], ["m.layers.{i}.other", ["h"], "f32", True])
    out = merge(a, b)
    assert out["buffers"] == [[*d, ["k0", "k1"]], ["m.layers.{i}.other", ["h"], "f32", True]]
    assert a["buffers"][0] == [*d, ["k0"]]  # (the learnings themselves unchanged)


def test_a_repeated_block_with_a_carry_reads_back_and_a_bad_carry_is_refused():
    """A loop over the sequence (``rep[].carry``, docs/architectures.md "Repeated blocks") round-trips; a block
    without one stays without; a carry that is not an object of strings names the row."""
    seg = {**SEGMENT, "rep": [{"n": "s - 1", "first": 1, "len": 1, "each": ["t1"], "carry": {"t0": "t1"}}]}
    graphs = {**GRAPHS, "segments": {"abc": seg, "def": {**SEGMENT, "rep": [{"n": "s", "first": 1, "len": 1,
                                                                            "each": ["t1"]}]}}}
    back = archformat.decode_graphs(json.loads(archformat.dumps(archformat.encode_graphs(graphs))), "g.json")
    assert back["segments"]["abc"]["rep"] == seg["rep"]
    assert "carry" not in back["segments"]["def"]["rep"][0]
    bad = archformat.encode_graphs(graphs)
    bad["segments"]["abc"]["rep"][0]["carry"] = {"t0": 1}
    with pytest.raises(FitplanError, match="carry must be an object of strings"):
        archformat.decode_graphs(bad, "x.graphs.json")
