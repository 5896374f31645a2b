"""The staged evaluation of a search: the quantity graph evaluated loop-invariantly.

The search varies its inputs in nested loops (:data:`LEVELS`, outermost first). A quantity whose inputs are all
fixed at a loop level is not recomputed inside the deeper loops (:class:`fitplan.engine.staging.StagedGraph`).
Memory (up to the ``device_total`` role) and time and cost (up to the ``seconds`` and ``cost.*`` roles) are two
staged graphs on their own value dicts, so that memory is evaluated once for every GPU and provider, and time
once for every attention kernel; time and cost are memoised on the loop inputs they depend on.
"""

from __future__ import annotations

from typing import Any

import attrs

from fitplan.engine.staging import StagedGraph
from fitplan.errors import FitplanError, PluginError
from fitplan.inputs import settings
from fitplan.search.plans import Stats

# loop levels, outermost first: what varies at each
LEVELS: tuple[tuple[str, ...], ...] = (
    ("method",),
    ("precision",),
    ("optim", "optimizer_spec"),
    ("gradient_checkpointing",),
    ("num_gpus", "num_nodes"),
    ("zero_stage", "offload_optimizer"),  # and the plugin settings searched at the "shard" level: levels()
    ("per_device_train_batch_size", "gradient_accumulation_steps"),
    ("attn_implementation",),
    ("gpu", "gpu_spec"),
    ("provider", "instance"),
)
L_METHOD, L_PRECISION, L_OPTIM, L_CKPT, L_WORLD, L_SHARD, L_BATCH, L_ATTN, L_GPU, L_PROVIDER = range(len(LEVELS))
LEVEL_OF_SETTINGS = {"shard": L_SHARD}
"""Where the settings searched at a level (``inputs/settings.py`` ``SEARCH_LEVELS``) join :data:`LEVELS`."""


def levels() -> tuple[tuple[str, ...], ...]:
    """:data:`LEVELS` with each searched plugin setting (parameter offload) after its level's own inputs."""
    out = [list(names) for names in LEVELS]
    for s in settings.declared().values():
        if s.search is not None:
            out[LEVEL_OF_SETTINGS[s.search.level]].append(s.name)
    return tuple(tuple(names) for names in out)


def searched_fields() -> frozenset[str]:
    """The scenario fields the search loops set (the resolved ``optimizer_spec`` and ``gpu_spec`` left out)."""
    return frozenset(n for names in levels() for n in names if n not in ("optimizer_spec", "gpu_spec"))


class PlanValues:
    """The values a policy condition reads for the current candidate: the loop's scenario fields and
    fit numbers (``cur``), the memory snapshot and the time/cost snapshot. No allocation per candidate."""

    __slots__ = ("cur", "mem", "tc")

    def __init__(self, cur: dict[str, Any]) -> None:
        self.cur = cur
        self.mem: dict[str, Any] = {}
        self.tc: dict[str, Any] = {}

    def get(self, name: str, default: Any = None) -> Any:
        if name in self.tc:
            return self.tc[name]
        if name in self.mem:
            return self.mem[name]
        return self.cur.get(name, default)


@attrs.define
class Staged:
    """The staged evaluations of one search: memory (``M``) and time/cost (``T``) on their own value dicts,
    the candidate's current fields (``cur``), and the time/cost memo keyed by the loop inputs time depends on."""

    M: StagedGraph
    T: StagedGraph | None
    vm: dict[str, Any]
    vt: dict[str, Any]
    cur: dict[str, Any]
    mem_names: set[str]
    roles: dict[str, str | None]
    stats: Stats
    t_key_names: list[str] = attrs.Factory(list)
    tmemo: dict[tuple, list[Any]] = attrs.Factory(dict)

    def set(self, changes: dict[str, Any], level: int) -> None:
        """Set loop inputs at ``level`` and recompute what depends on them."""
        for k, v in changes.items():
            self.vm[k] = self.vt[k] = self.cur[k] = v
        self.M.run(self.vm, level)
        if self.T is not None:
            self.T.run(self.vt, level)

    def time_cost(self, g: Any, plist: list[Any]) -> list[Any]:
        """Time and cost for GPU ``g`` and each offer (provider, instance) of ``plist`` (memoised): per offer
        ``(snapshot, seconds, on-demand cost, spot cost)``, or the user error its evaluation raised."""
        key = (*[self.cur[n] for n in self.t_key_names], g.id)
        found = self.tmemo.get(key)
        if found is None:
            found = self.tmemo[key] = self._time_cost(g, plist)
        return found

    def _time_cost(self, g: Any, plist: list[Any]) -> list[Any]:
        T, vt = self.T, self.vt
        if T is None:
            return [({}, None, None, None) for _ in plist]
        vt["gpu"], vt["gpu_spec"] = g.id, g
        try:
            T.run(vt, L_GPU)
        except FitplanError as e:
            return [e for _ in plist]
        self.stats.time_evaluations += 1
        out: list[Any] = []
        seconds, od, spot = self.roles["seconds"], self.roles["cost.on_demand"], self.roles["cost.spot"]
        for p, inst, *_ in plist:
            vt["provider"], vt["instance"] = p, inst
            try:
                T.run(vt, L_PROVIDER)
            except FitplanError as e:
                out.append(e)
                continue
            snap = {name: vt[name] for name in T.targets}
            out.append((snap, snap.get(seconds), snap.get(od), snap.get(spot)))
        return out


def staged(compiled, inputs: dict[str, Any], policies: Any, roles: dict[str, str | None], stats: Stats) -> Staged:
    """The memory and time/cost staged graphs: memory up to the device total (and every memory quantity and
    what the policies read at that level), time and cost up to the roles the ranking needs."""
    set_by_search = {roles[r] for r in ("usable", "headroom", "fit")}  # set in the candidate's values per GPU
    policy_quantities = {n for name in policies.names for n in policies.vocabulary.quantities_for(name)
                         if n in compiled.quantities and n not in set_by_search}
    mem_targets = [roles["device_total"], roles["peak"], roles.get("cpu_offload"), *compiled.memory]
    mem_targets = list(dict.fromkeys(t for t in mem_targets if t is not None))
    M = StagedGraph(compiled, mem_targets, levels())
    if M.depends_on("provider") or M.depends_on("gpu_spec") or M.depends_on("gpu"):
        raise PluginError("a memory quantity depends on the GPU model or the provider; the recommender assumes it does "
                          "not (one memory evaluation serves every GPU)", field=roles["device_total"],
                          suggestion="report this plugin interaction")
    mem_names = set(mem_targets) | {n for n in policy_quantities if n in M.level_of}
    tc_targets = [t for t in (roles["seconds"], roles["cost.on_demand"], roles["cost.spot"]) if t is not None]
    tc_targets += sorted(n for n in policy_quantities if n not in mem_names and n not in tc_targets)
    T = StagedGraph(compiled, tc_targets, levels()) if tc_targets else None
    st = Staged(M, T, dict(inputs), dict(inputs), dict(inputs), mem_names, roles, stats)
    # time and cost are memoised on the loop inputs they depend on (not the optimizer, not the kernel, ...)
    st.t_key_names = [n for names in levels()[:L_GPU] for n in names
                      if T is not None and T.depends_on(n) and n != "optimizer_spec"]
    if T is not None and T.depends_on("optimizer_spec") and "optim" not in st.t_key_names:
        st.t_key_names.append("optim")
    M.run(st.vm, -1)
    if T is not None:
        T.run(st.vt, -1)
    return st


def usable_memory(compiled, inputs: dict[str, Any], hardware: dict, usable_name: str | None) -> dict[str, int]:
    """Each GPU's usable memory (the quantity holding the ``usable`` role)."""
    graph = StagedGraph(compiled, [usable_name], levels())
    vu: dict[str, Any] = dict(inputs)
    out: dict[str, int] = {}
    for opts in hardware.values():
        for g, _ in opts:
            if g.id not in out:
                vu["gpu"], vu["gpu_spec"] = g.id, g
                for lvl in range(-1, len(LEVELS)):
                    graph.run(vu, lvl)
                out[g.id] = vu[usable_name]
    return out
