"""Organisation policies: declarative ``[[policy]]`` rules that forbid or penalise plans.

A rule (docs/policies.md; schema: :class:`fitplan.rulesets.schema.PolicyRule`)::

    [[policy]]
    id = "no-long-spot"
    description = "Spot instances only for runs under 8 hours"
    action = "forbid"                       # or "penalise" (with penalty = 0.25: the objective × 1.25)
    condition = { all = [ { eq = { market = "spot" } }, { gt = { train_hours = 8 } } ] }

The condition says when the rule *fires*: a ``forbid`` rule rejects every plan its condition holds
for; a ``penalise`` rule multiplies the plan's ranking objective by ``1 + penalty`` (the plan's own
numbers do not change). Conditions are evaluated by :mod:`fitplan.rulesets.conditions`, never ``eval``.

Policies come from ruleset directories (``--ruleset-dir``, or a plugin's ``fitplan_ruleset_dirs``: an
organisation's package) and from ``--policy FILE``. The bundled rulesets hold none; an example lives
in ``rulesets/examples/policy-example.toml`` (not loaded unless named).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import attrs

if TYPE_CHECKING:  # pragma: no cover
    from fitplan.rulesets.schema import PolicyRule

from fitplan.errors import FitplanError
from fitplan.rulesets.conditions import Condition, Namespace, Vocabulary, compile_condition, names_in, vocabulary

@attrs.frozen
class Verdict:
    """A rule that fired for a plan: its id, action, and the comparisons that held."""

    rule: str
    action: str
    description: str
    reason: str
    penalty: float = 0.0

    def to_dict(self) -> dict[str, Any]:
        out = {"rule": self.rule, "action": self.action, "description": self.description, "reason": self.reason}
        if self.action == "penalise":
            out["penalty"] = self.penalty
        return out


class PolicySet:
    """Compiled rules, checked against the names a registry knows.

    :raises FitplanError: unknown names in a condition, each with a "did you mean" suggestion, and comparisons
        of a name with a literal of another type.
    """

    def __init__(self, rules: Sequence[PolicyRule], registry: Any, origin: dict[str, str] | None = None) -> None:
        self.rules = list(rules)
        self.origin = origin or {}
        self.vocabulary = vocabulary(registry)
        problems = []
        for r in self.rules:
            where = self.origin.get(r.id, "")
            for p in rule_problems(r, self.vocabulary):
                problems.append(f"{where + ': ' if where else ''}policy {r.id!r}: {p}")
        if problems:
            raise FitplanError(f"{len(problems)} unknown name(s) in policy conditions", details=problems)
        self.compiled: list[tuple[PolicyRule, Condition]] = [(r, compile_condition(r.condition)) for r in self.rules]
        self.names = frozenset().union(*(c.names for _, c in self.compiled)) if self.compiled else frozenset()

    def __bool__(self) -> bool:
        return bool(self.rules)

    def check(self, ns: Namespace) -> tuple[list[Verdict], float]:
        """Every rule that fires, and the penalty factor (1.0 when none)."""
        fired: list[Verdict] = []
        factor = 1.0
        for rule, cond in self.compiled:
            if cond.test(ns):
                fired.append(Verdict(rule.id, rule.action, rule.description, cond.explain(ns), rule.penalty))
                if rule.action == "penalise":
                    factor *= 1 + rule.penalty
        return fired, factor

    def first_forbidding(self, ns: Namespace) -> PolicyRule | None:
        """The first ``forbid`` rule that fires (the fast path of the search), or None."""
        for rule, cond in self.compiled:
            if rule.action == "forbid" and cond.test(ns):
                return rule
        return None

    def penalty_factor(self, ns: Namespace) -> float:
        factor = 1.0
        for rule, cond in self.compiled:
            if rule.action == "penalise" and cond.test(ns):
                factor *= 1 + rule.penalty
        return factor

    def describe(self) -> list[dict[str, Any]]:
        return [{"id": r.id, "action": r.action, "description": r.description,
                 **({"penalty": r.penalty} if r.action == "penalise" else {}),
                 **({"file": display_path(self.origin[r.id])} if r.id in self.origin else {})} for r in self.rules]


def display_path(path: str | Path) -> str:
    """``path`` relative to the working directory when it lies below it (reports stay the same wherever
    the project is checked out), else as given."""
    try:
        return Path(path).resolve().relative_to(Path.cwd().resolve()).as_posix()
    except ValueError:
        return str(path)


def load_policy_files(paths: Iterable[str | Path]) -> tuple[list[PolicyRule], dict[str, str]]:
    """``[[policy]]`` entries of ``--policy FILE`` files (ruleset files: every error at once, as
    ``file: message @ $.path``). A file without any ``[[policy]]`` is an error."""
    from fitplan.rulesets.loader import check_paths, parse_file

    rules: list[PolicyRule] = []
    origin: dict[str, str] = {}
    for p in map(Path, paths):
        if not p.exists() or p.is_dir():  # a FIFO or a device: refused by the input boundary, never read
            raise FitplanError("is a directory, not a policy file" if p.is_dir() else "policy file not found", file=str(p),
                               field="--policy", suggestion="for an example see rulesets/examples/policy-example.toml")
        errors = check_paths([p])
        if errors:
            raise FitplanError("invalid policy file", file=str(p), details=errors)
        parsed, _ = parse_file(p)
        found = list(getattr(parsed, "policy", []) or [])
        if not found:
            raise FitplanError("no [[policy]] rules in this file", file=str(p), field="--policy",
                               suggestion="a policy file holds [[policy]] tables (docs/policies.md)")
        for r in found:
            if r.id in origin:
                raise FitplanError(f"duplicate policy id {r.id!r} (also in {origin[r.id]})", file=str(p), field="$.policy",
                                   value=r.id)
            rules.append(r)
            origin[r.id] = str(p)
    return rules, origin


def policy_set(rulesets: Any, registry: Any, policy_files: Sequence[str | Path] = ()) -> PolicySet:
    """The rules in force: those of the loaded ruleset directories, then ``--policy`` files (same id: later wins)."""
    by_id: dict[str, PolicyRule] = dict(getattr(rulesets, "policies", {}) or {})
    origin = {rid: rulesets.origin.get(f"policy:{rid}", "") for rid in by_id}
    extra, extra_origin = load_policy_files(policy_files)
    for r in extra:
        by_id[r.id] = r
    origin.update(extra_origin)
    return PolicySet(list(by_id.values()), registry, origin)


def rule_problems(rule: PolicyRule, vocab: Vocabulary) -> list[str]:
    """Unknown names and type mismatches in one policy rule's condition."""
    return vocab.problems(names_in(rule.condition)) + vocab.type_problems(rule.condition)


def rule_name_problems(paths: Iterable[str | Path], registry: Any) -> list[str]:
    """Unknown names (each with a "did you mean") and type mismatches in the ``[[policy]]`` and ``[[advice]]``
    rules of ruleset files or directories, as ``file: policy 'id': unknown name ... @ location``
    (``fitplan rulesets check``)."""
    from fitplan.rules import advice
    from fitplan.rulesets.loader import parse_file, ruleset_files

    vocab = vocabulary(registry)
    out: list[str] = []
    for p in map(Path, paths):
        files = ruleset_files(p) if p.is_dir() else [p] if p.is_file() else []
        for f in files:
            parsed, _ = parse_file(f)
            if parsed is None:
                continue
            for r in parsed.policy:
                out += [f"{f}: policy {r.id!r}: {x}" for x in rule_problems(r, vocab)]
            for a in parsed.advice:
                out += [f"{f}: {x}" for x in advice.name_problems(a, vocab)]
    return out


def estimate_verdicts(est: Any, policy_files: Sequence[str | Path]) -> list[dict[str, Any]] | None:
    """The rules that fire for an estimate, in each market it has a price for (none: no market), or None
    when no policy is in force (neither in the rulesets nor given)."""
    ps = policy_set(est.rulesets, est.registry, policy_files)
    if not ps:
        return None
    v = est.values
    out = []
    for market in priced_markets(est) or [None]:
        fired, _ = ps.check(Namespace(v, market, None, ps.vocabulary))
        out += [{**f.to_dict(), "market": market} for f in fired]
    return out


POLICY_VIOLATION_EXIT = 3
"""Exit status of ``fitplan estimate`` when the policies forbid the scenario (docs/policies.md): distinct from
2 (bad input) so that CI can tell "the config is wrong" from "the config is not allowed"."""


def priced_markets(est: Any) -> list[str]:
    """The markets (``on_demand``, ``spot``) the estimate has a cost in."""
    v = est.values
    compiled = est.registry.compiled()
    return [m for m in ("on_demand", "spot")
            if compiled.role(f"cost.{m}") is not None and v.get(compiled.role(f"cost.{m}")) is not None]


def forbidding_rules(est: Any, verdicts: Sequence[dict[str, Any]] | None) -> list[str]:
    """The ``forbid`` rules that reject the scenario when they reject it in every market it was checked in
    (each priced market, or the unpriced scenario), else an empty list: a scenario forbidden only on spot
    may still run on demand."""
    if not verdicts:
        return []
    markets = priced_markets(est) or [None]
    forbidden = {m: sorted({x["rule"] for x in verdicts if x["action"] == "forbid" and x["market"] == m}) for m in markets}
    if not all(forbidden.values()):
        return []
    return sorted({r for rules in forbidden.values() for r in rules})
