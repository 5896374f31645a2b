"""A setting declared by a plugin, in one place (docs/hooks.md, ``fitplan_register_settings``).

A (fictional) shared cluster runs a GPU monitoring agent on every GPU. Its operators state what each mode holds:
``full`` (the default: per-kernel traces, 512 MiB of device memory) and ``light`` (counters only, 128 MiB); ``off``
is for nodes of one's own. A job may ask for the light mode when that is what makes it fit, so the recommender
searches both modes, preferring ``full``.

The one :data:`MONITOR_AGENT` declaration gives fitplan a scenario field (``[hardware] monitor_agent`` in a
scenario TOML, ``s.hardware.monitor_agent``), a flag (``--monitor-agent light``) with its help, a field of
``fitplan serve``'s form, a dimension of ``fitplan recommend`` and a key of the scenario TOML export; the reducer
:func:`agent_reserve` adds the agent's memory to the framework overhead. The numbers are this example's, not
measurements of a real agent.
"""

from __future__ import annotations

from fitplan.api import Search, Setting, hookimpl, reducer

AGENT_MIB = {"full": 512, "light": 128, "off": 0}
"""Device memory the agent holds on every GPU in each mode (MiB), as the cluster's operators state it."""

MONITOR_AGENT = Setting(
    "monitor_agent", "hardware", type="text", default="full", choices=tuple(AGENT_MIB),
    help="The cluster's GPU monitoring agent: full (default, 512 MiB on every GPU), light (128 MiB, counters "
         "only) or off (own nodes only).",
    search=Search(values=("full", "light"), level="shard", weight=1), plan_label="light monitoring agent",
    keys={"training_args": "monitor_agent"})
"""The setting, declared once."""


@reducer("framework_overhead_bytes", when=lambda monitor_agent: monitor_agent != "off", name="monitor_agent",
         before=("seed",))
def agent_reserve(value, monitor_agent):
    """+ the agent's memory on every GPU (:data:`AGENT_MIB`); before the seed view, which sets the overhead to 0."""
    return value + AGENT_MIB[monitor_agent] * 2**20


@hookimpl
def fitplan_register_settings(register):
    register(MONITOR_AGENT)


@hookimpl
def fitplan_register_reducers(register):
    register(agent_reserve)
