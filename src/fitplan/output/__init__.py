"""Every renderer and exporter: pure functions of an assessment or a recommend result (terminal, JSON,
Markdown, HTML; DeepSpeed, accelerate, TrainingArguments and scenario exports)."""
