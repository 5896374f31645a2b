"""Advice: the seed chapter's optimisation checklist as declarative ``[[advice]]`` rules.

A rule (``rulesets/advice/checklist.toml``)::

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
names too; it is then tested after the variant is evaluated.

Messages are ``str.format`` templates filled from a whitelisted mapping of computed values: only
plain names (no attribute or index access, no conversions, no nested fields), each rendered with a
fixed format. Format specs: ``GB`` / ``GiB`` (bytes), ``pct`` (a fraction as "62 %"), ``usd`` (money),
``h`` (seconds as hours), ``x`` (a ratio as "1.33×"), or any Python number format (``.1f``).
"""

from __future__ import annotations

import string
from collections.abc import Mapping, Sequence
from typing import Any

import attrs
from attrs import field, frozen

from fitplan.rules.conditions import (Condition, Namespace, compile_condition, getter, is_known, known_names, names_in,
                         unknown_name_problems, VARIANT_PREFIXES)
from fitplan.errors import FitplanError

CUSTOM_SPECS = ("GB", "GiB", "pct", "usd", "h", "x")


def template_names(template: str, where: str = "message") -> list[str]:
    """The names a message template uses. :raises FitplanError: attribute or index access, conversions,
    nested fields or malformed braces."""
    names = []
    try:
        parsed = list(string.Formatter().parse(template))
    except ValueError as e:
        raise FitplanError(f"malformed message template: {e}", field=where, value=template,
                           suggestion="write {name} or {name:spec}; a literal brace is {{ or }}") from None
    for _, name, spec, conversion in parsed:
        if name is None:
            continue
        if not name or not name.replace("_", "").replace(".", "").isalnum():
            raise FitplanError(f"message template field {{{name}}} is not a plain name", field=where, value=name,
                               suggestion="fields are names such as {peak_bytes:GB}; positional {} is not allowed")
        if "." in name or "[" in name:
            raise FitplanError(f"message template field {{{name}}} uses attribute or index access, which is not allowed",
                               field=where, value=name, suggestion="use a plain name such as {delta_peak_bytes:GB}")
        if conversion:
            raise FitplanError(f"message template field {{{name}!{conversion}}} uses a conversion, which is not allowed",
                               field=where, value=name)
        if spec and "{" in spec:
            raise FitplanError(f"message template field {{{name}:{spec}}} has a nested field in its format spec",
                               field=where, value=spec)
        if name[0].isdigit():
            raise FitplanError(f"message template field {{{name}}} is positional", field=where, value=name)
        names.append(name)
    return names


def _valid_condition(inst: Any, att: attrs.Attribute, value: Any) -> None:
    compile_condition(value)


def _valid_message(inst: Any, att: attrs.Attribute, value: str) -> None:
    template_names(value)


def _valid_variant(inst: Any, att: attrs.Attribute, value: dict[str, Any]) -> None:
    from fitplan.inputs.scenario import FIELD_SECTION

    for k, v in value.items():
        if k not in FIELD_SECTION:
            from fitplan.errors import unknown

            e = unknown("scenario field", k, FIELD_SECTION)
            raise FitplanError(e.message, field=f"variant.{k}", value=k, suggestion=e.suggestion)
        if isinstance(v, Mapping) and (set(v) != {"from"} or not isinstance(v["from"], str)):
            raise FitplanError(f"variant.{k} must be a value or {{ from = \"name\" }}, got {v!r:.60}", field=f"variant.{k}",
                               value=v)


@frozen
class AdviceRule:
    """One ``[[advice]]`` entry."""

    id: str
    condition: dict[str, Any] = field(validator=_valid_condition)
    message: str = field(validator=_valid_message)
    checklist: str = ""
    """The seed checklist item the rule implements (the chapter's own words)."""
    variant: dict[str, Any] = field(factory=dict, validator=_valid_variant)
    """Scenario fields to change to compute ``variant_*`` / ``delta_*`` / ``ratio_*`` names."""
    source: str = ""


class _Value:
    """A number (or text) with fixed, deterministic formatting for the message specs."""

    __slots__ = ("v",)

    def __init__(self, v: Any) -> None:
        self.v = v

    def __format__(self, spec: str) -> str:
        v = self.v
        if v is None:
            return "n/a"
        if isinstance(v, bool):
            return "yes" if v else "no"
        if isinstance(v, str) or not isinstance(v, (int, float)):
            return format(str(v), spec if spec not in CUSTOM_SPECS else "")
        if spec == "GB":
            return f"{v / 1e9:,.1f} GB"
        if spec == "GiB":
            return f"{v / 2**30:,.1f} GiB"
        if spec == "pct":
            return f"{100 * v:.0f} %"
        if spec == "usd":
            return f"${v:,.2f}"
        if spec == "h":
            return f"{v / 3600:,.1f} h"
        if spec == "x":
            return f"{v:.2f}×"
        if not spec:
            return f"{v:,}" if isinstance(v, int) else f"{v:,.4g}"
        return format(v, spec)


class _SafeFormatter(string.Formatter):
    """``str.format`` restricted to the names of a mapping: no attribute or index access."""

    def get_field(self, field_name: str, args: Sequence[Any], kwargs: Mapping[str, Any]) -> tuple[Any, str]:
        if "." in field_name or "[" in field_name or field_name not in kwargs:
            raise KeyError(field_name)
        return kwargs[field_name], field_name

    def convert_field(self, value: Any, conversion: str | None) -> Any:
        if conversion:
            raise ValueError("conversions are not allowed")
        return value


_FORMATTER = _SafeFormatter()


def render_message(template: str, ns: Namespace) -> str:
    names = template_names(template)
    mapping = {n: _Value(getter(n)(ns)) for n in names}
    return _FORMATTER.vformat(template, (), mapping)


@attrs.frozen
class Advice:
    id: str
    message: str
    checklist: str
    variant: dict[str, Any]

    def to_dict(self) -> dict[str, Any]:
        return {"id": self.id, "checklist": self.checklist, "message": self.message, "variant": dict(self.variant)}


def name_problems(rule: AdviceRule, known: set[str]) -> list[str]:
    """``advice 'id': unknown name ...`` for each unknown name in the rule's condition, message and variant."""
    used = names_in(rule.condition) + [(n, "message") for n in template_names(rule.message)]
    out = [f"advice {rule.id!r}: {p}" for p in unknown_name_problems(used, known, variants=True)]
    for k, v in rule.variant.items():
        if isinstance(v, Mapping) and not is_known(v["from"], known):
            out += [f"advice {rule.id!r}: {p}" for p in unknown_name_problems([(v["from"], f"variant.{k}.from")], known)]
    return out


class AdviceSet:
    """Compiled advice rules, their names checked against a registry's graph.

    :raises FitplanError: unknown names in a condition or a message, each with a suggestion.
    """

    def __init__(self, rules: Sequence[AdviceRule], registry: Any = None, origin: dict[str, str] | None = None) -> None:
        self.rules = list(rules)
        origin = origin or {}
        known = known_names(registry)
        problems = []
        for r in self.rules:
            where = origin.get(r.id, "")
            problems += [f"{where + ': ' if where else ''}{p}" for p in name_problems(r, known)]
        if problems:
            raise FitplanError(f"{len(problems)} unknown name(s) in advice rules", details=problems)
        self.compiled: list[tuple[AdviceRule, Condition, bool]] = []
        for r in self.rules:
            cond = compile_condition(r.condition)
            needs_variant = any(n.startswith(VARIANT_PREFIXES) for n in cond.names)
            self.compiled.append((r, cond, needs_variant))

    def advise(self, est: Any, *, market: str | None = None) -> list[Advice]:
        """The advice for an :class:`~fitplan.estimation.Estimate`, in rule order."""
        from fitplan.estimation import evaluate

        out: list[Advice] = []
        ns = Namespace(est.values, market)
        for rule, cond, needs_variant in self.compiled:
            if not needs_variant and not cond.test(ns):
                continue
            variant_values = None
            changes: dict[str, Any] = {}
            if rule.variant:
                changes = {k: (ns.get(v["from"]) if isinstance(v, Mapping) else v) for k, v in rule.variant.items()}
                try:
                    variant_values = evaluate(est.scenario.replace(**changes), est.registry, est.rulesets).values
                except FitplanError:
                    continue  # the change is not possible for this scenario (a LoRA rank on a bare model, ...)
            vns = Namespace(est.values, market, variant_values)
            if needs_variant and not cond.test(vns):
                continue
            out.append(Advice(rule.id, render_message(rule.message, vns), rule.checklist, changes))
        return out


def advice_set(rulesets: Any, registry: Any) -> AdviceSet:
    """The ``[[advice]]`` rules of the loaded rulesets (the bundled checklist, plus any ruleset directory)."""
    rules = dict(getattr(rulesets, "advice", {}) or {})
    origin = {rid: rulesets.origin.get(f"advice:{rid}", "") for rid in rules}
    return AdviceSet(list(rules.values()), registry, origin)


def advise(est: Any) -> list[Advice]:
    """Advice for an estimate from the rulesets it was evaluated with (cached per rulesets and registry)."""
    key = ("advice_set", id(est.registry))
    aset = est.rulesets.memo(key, lambda: advice_set(est.rulesets, est.registry))
    return aset.advise(est)


def advice_json(est: Any) -> dict[str, Any]:
    """The estimate JSON's ``advice`` list (a render section)."""
    return {"advice": [a.to_dict() for a in advise(est)]}


def advice_lines(est: Any, units: str) -> list[tuple[str, str]]:
    """``("advice", message)`` summary lines for the table and Markdown reports."""
    return [("advice", a.message) for a in advise(est)]
