"""The trace engine: one training step op by op, replayed from a model type's learned graph (``step_trace``,
``learned_graph``, ``learned_segment``), its kernels, loss heads and LoRA sites, and each op's work for the
time model (``op_work``). Implements no hook: ``builtin.activations`` declares the quantities over it."""
