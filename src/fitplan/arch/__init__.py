"""Architecture files: a model type's learned file (``archfile``), the expressions in it (``archexpr``),
config.json -> parameter tensors through it (``architecture``), and the Llama-shaped typical models
(``typical``). Implements no hook; docs/architectures.md."""
