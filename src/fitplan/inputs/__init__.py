"""What the user states and how it becomes the graph's inputs: the scenario, its sources (flags, TOML,
HF TrainingArguments and DeepSpeed JSON), precision presets, model architectures, optimizers."""
