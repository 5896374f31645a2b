"""TRL 1.16's preference and online RL trainers (docs/trl.md)."""
