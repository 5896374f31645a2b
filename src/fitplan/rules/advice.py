"""Advice: the seed chapter's optimisation checklist as declarative ``[[advice]]`` rules.

A rule (``rulesets/advice/checklist.toml``; schema: :class:`fitplan.rulesets.schema.AdviceRule`)::

    [[advice]]
    id = "gradient-checkpointing"
    checklist = "Activer le checkpointing des gradients"
    condition = { all = [ { eq = { gradient_checkpointing = false } }, { gt = { share_activation_bytes = 0.25 } } ] }
    variant = { gradient_checkpointing = true }
    message = "activations are {share_activation_bytes:pct} of the peak; gradient checkpointing would save {delta_peak_bytes:GB} ..."

When the condition holds, fitplan evaluates the *variant* scenario (the current one with the variant's
fields changed; a value written ``{ from = "name" }`` takes that name's current value), so that the
message carries the numbers the change would give: ``variant_X`` (X in the variant), ``delta_X``
(current − variant) and ``ratio_X`` (variant / current) for any quantity X. A condition may use those
names too; it is then tested after the variant is evaluated. Messages are templates
(:mod:`fitplan.rulesets.templates`). Advice is computed by the assess step (:mod:`fitplan.assess`), never
while rendering.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import attrs

from fitplan.errors import FitplanError
from fitplan.rulesets.conditions import (VARIANT_PREFIXES, All, Condition, Namespace, Vocabulary, compile_condition, names_in,
                                     vocabulary)
from fitplan.rulesets.templates import render_message, template_names


@attrs.frozen
class Advice:
    id: str
    message: str
    checklist: str
    variant: dict[str, Any]

    def to_dict(self) -> dict[str, Any]:
        return {"id": self.id, "checklist": self.checklist, "message": self.message, "variant": dict(self.variant)}


def name_problems(rule: Any, vocab: Vocabulary) -> list[str]:
    """``advice 'id': unknown name ...`` (or a type mismatch) for each bad name in the rule's condition,
    message and variant."""
    used = names_in(rule.condition) + [(n, "message") for n in template_names(rule.message)]
    out = [f"advice {rule.id!r}: {p}" for p in vocab.problems(used, variants=True) + vocab.type_problems(rule.condition)]
    for k, v in rule.variant.items():
        if isinstance(v, Mapping) and not vocab.known(v["from"]):
            out += [f"advice {rule.id!r}: {p}" for p in vocab.problems([(v["from"], f"variant.{k}.from")])]
    return out


class AdviceSet:
    """Compiled advice rules, their names checked against a registry's vocabulary.

    :raises FitplanError: unknown names or type mismatches in a condition or a message, each with a suggestion.
    """

    def __init__(self, rules: Sequence[Any], registry: Any, origin: dict[str, str] | None = None) -> None:
        self.rules = list(rules)
        self.vocabulary = vocabulary(registry)
        origin = origin or {}
        problems = []
        for r in self.rules:
            where = origin.get(r.id, "")
            problems += [f"{where + ': ' if where else ''}{p}" for p in name_problems(r, self.vocabulary)]
        if problems:
            raise FitplanError(f"{len(problems)} unknown name(s) in advice rules", details=problems)
        self.compiled: list[tuple[Any, Condition, bool, tuple[Condition, ...]]] = []
        for r in self.rules:
            cond = compile_condition(r.condition)
            needs_variant = _reads_variant(cond)
            self.compiled.append((r, cond, needs_variant, _plain_conjuncts(cond) if needs_variant else ()))

    def advise(self, est: Any, *, market: str | None = None) -> list[Advice]:
        """The advice for an :class:`~fitplan.estimation.Estimate`, in rule order (variants are evaluated here)."""
        from fitplan.estimation import evaluate

        out: list[Advice] = []
        ns = Namespace(est.values, market, None, self.vocabulary)
        for rule, cond, needs_variant, plain in self.compiled:
            if not needs_variant and not cond.test(ns):
                continue
            if needs_variant and _fails_before_the_variant(plain, ns):
                continue  # the condition cannot hold whatever the variant gives: not evaluated
            variant_values = None
            changes: dict[str, Any] = {}
            if rule.variant:
                changes = {k: (ns.get(v["from"]) if isinstance(v, Mapping) else v) for k, v in rule.variant.items()}
                try:
                    variant_values = evaluate(est.scenario.replace(**changes), est.registry, est.rulesets).values
                except FitplanError:
                    continue  # the change is not possible for this scenario (a LoRA rank on a bare model, ...)
            vns = Namespace(est.values, market, variant_values, self.vocabulary)
            if needs_variant and not cond.test(vns):
                continue
            out.append(Advice(rule.id, render_message(rule.message, vns), rule.checklist, changes))
        return out


def _reads_variant(cond: Condition) -> bool:
    return any(n.startswith(VARIANT_PREFIXES) for n in cond.names)


def _plain_conjuncts(cond: Condition) -> tuple[Condition, ...]:
    """The parts of an ``all`` condition that read no variant name: when one of them is false the condition is,
    whatever the variant gives, so the variant scenario need not be evaluated (each variant builds its own step
    traces, 10-20 ms each: the bundled checklist's precision and accumulation rules would otherwise evaluate
    theirs for every scenario, only to find ``precision = "32-true"`` or ``headroom_fraction < 0.05`` false)."""
    if not isinstance(cond, All):
        return ()
    return tuple(c for c in cond.children if not _reads_variant(c))


def _fails_before_the_variant(plain: Sequence[Condition], ns: Namespace) -> bool:
    """One of ``plain`` (:func:`_plain_conjuncts`) is false on the current values. A conjunct that cannot be
    tested here (a type mismatch) decides nothing: the rule then goes the whole way, as it did before."""
    try:
        return any(not c.test(ns) for c in plain)
    except FitplanError:
        return False


def advice_set(rulesets: Any, registry: Any) -> AdviceSet:
    """The ``[[advice]]`` rules of the loaded rulesets (the bundled checklist, plus any ruleset directory)."""
    rules = dict(getattr(rulesets, "advice", {}) or {})
    origin = {rid: rulesets.origin.get(f"advice:{rid}", "") for rid in rules}
    return AdviceSet(list(rules.values()), registry, origin)


def advise(est: Any) -> list[Advice]:
    """Advice for an estimate from the rulesets it was evaluated with (the rule set is compiled once per
    rulesets and registry)."""
    key = ("advice_set", id(est.registry))
    aset = est.rulesets.memo(key, lambda: advice_set(est.rulesets, est.registry))
    return aset.advise(est)
