"""Rules over an estimate: the whitelisted condition language, organisation policies and the advice
checklist (docs/policies.md)."""
