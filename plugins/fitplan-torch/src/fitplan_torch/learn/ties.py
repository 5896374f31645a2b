"""Which parameters are one tensor with another: what transformers ties, read from the model class.

The learner records with ``tie_word_embeddings`` off (distinct tensors, ``learner._base_config``); the learned file
says when they are one (its ``tied`` rows, and a ``not tie_word_embeddings`` condition on the tied parameter's
own row, so that it is counted once).
"""

from __future__ import annotations

from typing import Any


def tied_keys(model) -> dict[str, str] | None:
    """The parameters transformers makes one tensor with another when ``tie_word_embeddings`` holds, target ->
    source: every key of the class's ``_tied_weights_keys``, expanded (transformers 5.24 modeling_utils.py
    ``get_expanded_tied_weights_keys``, which returns none while the flag is off; ``tie_weights`` ties exactly
    those). Read with the flag on: BERT's LM head ties ``cls.predictions.decoder.bias`` to
    ``cls.predictions.bias`` as well as its weight to the word embedding (modeling_bert.py
    ``BertLMHeadModel._tied_weights_keys``). Empty: the class ties nothing, whatever the flag says (CPM-Ant's
    ``_tied_weights_keys = {}``: its head is a slice of the input embedding, modeling_cpmant.py); None where it
    cannot be read."""
    config = getattr(model, "config", None)
    if config is None or not hasattr(config, "tie_word_embeddings") or \
            not hasattr(model, "get_expanded_tied_weights_keys"):
        return None
    old = config.tie_word_embeddings
    try:
        config.tie_word_embeddings = True
        return dict(model.get_expanded_tied_weights_keys(all_submodels=False))
    except Exception:  # noqa: BLE001 - a mapping transformers itself cannot expand
        return None
    finally:
        config.tie_word_embeddings = old


def tied_rows(base: dict[str, Any], params: list[list[Any]], keys: dict[str, str] | None,
              template) -> list[list[str]]:
    """The file's ``tied`` rows ``[name, target, "tie_word_embeddings"]``: the output projection tied to the input
    embedding (the roles) unless :func:`tied_keys` says the class ties nothing, and every pair of :func:`tied_keys`
    whose two parameters the file has (``template``: a recorded name -> its row's name). Each tied parameter's row
    gets the condition ``not tie_word_embeddings`` (``params`` is changed in place), or it would be counted twice
    (BERT: 2048 B of a 512-token bias in fp32)."""
    if "tie_word_embeddings" not in base:
        return []
    rows: dict[str, str] = {}
    out_param = next((p[0] for p in params if p[2] == "output"), None)
    in_param = next((p[0] for p in params if p[2] == "embedding"), None)
    if out_param and in_param and keys != {}:
        rows[out_param] = in_param
    names = {p[0] for p in params}
    for target, source in (keys or {}).items():
        t, s = template(target), template(source)
        if t in names and s in names and t != s:
            rows.setdefault(t, s)
    for p in params:
        if p[0] in rows and p[4] is None:
            p[4] = "not tie_word_embeddings"
    return [[t, s, "tie_word_embeddings"] for t, s in rows.items()]
