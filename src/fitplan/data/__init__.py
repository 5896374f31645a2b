"""Reading the user's dataset: how many tokens a fine-tune trains on, how long the examples are, and how many
tokens each padding or packing mode makes the GPUs compute (``fitplan dataset``, ``--dataset``; docs/dataset.md).

* :mod:`~fitplan.data.extra`: the optional dependencies (``pip install 'fitplan[data]'``);
* :mod:`~fitplan.data.source`: what ``--dataset`` names; :mod:`~fitplan.data.readers` and
  :mod:`~fitplan.data.columnar`: records streamed from JSONL, JSON, CSV, Parquet and Arrow files (a ``datasets``
  dataset saved to disk), each with its line or row;
* :mod:`~fitplan.data.tokenizer`: the model's fast tokenizer (``tokenizer.json``) and its chat template, from a
  directory or the Hugging Face cache;
* :mod:`~fitplan.data.chat`: chat templates rendered as transformers renders them (sandboxed jinja2);
* :mod:`~fitplan.data.examples`: a record into the text TRL's SFT trainer tokenizes;
* :mod:`~fitplan.data.scan`: the pass over the file (batches, worker processes, progress bar);
* :mod:`~fitplan.data.lengths` and :mod:`~fitplan.data.padding`: the length histogram and what each padding
  mode computes; :mod:`~fitplan.data.sampling`: ``--sample`` and its confidence intervals;
* :mod:`~fitplan.data.summary`: the summary (a TOML file) and its cache; :mod:`~fitplan.data.resolve`: the
  summary a scenario's ``--dataset`` names.

Nothing here imports torch, transformers or ``datasets``; the rest of fitplan imports this package only when a
dataset is given.
"""
