"""``fitplan learn-architecture``: architecture knowledge as data, learned from the model's own code.

The learner runs a Hugging Face model (random weights, a few tiny sizes) under a recorder that sees every
aten op below autograd (``TorchDispatchMode``), what autograd saves (``saved_tensors_hooks``), when Python
lets each storage go (weak references), which module every op runs in (forward hooks: decoder layers,
Linear / Conv1D call sites, the input embedding) and, in a second run, what each autograd node allocates
in the backward. From recordings at several sizes it writes one symbolic file per ``model_type`` that
fitplan's core replays without torch (docs/architectures.md), and refuses to write a file that does not
reproduce a fresh recording at sizes it was not derived from.

Modules: :mod:`.record` (the recorder), :mod:`.autograd_rules` (save rules from PyTorch's
derivatives.yaml), :mod:`.fit` (symbolic sizes), :mod:`.configrules` (reading config.json like the
config class), :mod:`.derive` (the file's parts), :mod:`.learner` (the phases: record, derive, fold, verify, write),
:mod:`.verify` (the check), :mod:`.command` (the CLI).
"""
