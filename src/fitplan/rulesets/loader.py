"""TOML rulesets: hardware, pricing, models and framework overheads. Data only, never executed.

A ruleset directory holds any number of ``*.toml`` files (searched recursively). Each file may
contain any of the top-level arrays of tables ``[[gpu]]``, ``[[provider]]``, ``[[instance]]``,
``[[model]]``, ``[[mfu]]``, ``[[throughput]]``, ``[[mfu_calibration]]``, ``[[finetune_run]]``,
``[[time_efficiency]]``, ``[[time_calibration]]``, ``[[policy]]``, ``[[advice]]`` and the tables ``[framework]``
and ``[time_model]``; see ``docs/rulesets.md``, ``docs/time-and-cost.md`` and ``docs/policies.md``.

Time and cost tables (``docs/time-and-cost.md``):

* ``[[mfu]]``: a published model-FLOPs-utilisation measurement of pretraining (GPU, model size, method,
  sequence length, GPUs, MFU, source): reference data, kept apart from the fine-tuning time model.
* ``[[finetune_run]]``: a published, measured fine-tuning throughput with its setup as scenario fields (and an
  ``exclude`` reason when it cannot be modelled); ``bench/time_loo.py`` fits the time model on them.
* ``[[time_efficiency]]`` (per GPU generation) and ``[time_model]``: the time model's fitted efficiency factors,
  host times and leave-one-out band (``rulesets/throughput/fitted.toml``, written by ``bench/time_loo.py``).
* ``[[time_calibration]]``: a measured run's step time over the model's (``fitplan calibrate``): estimates on the
  same GPU (and model and method, when named) multiply their step time by its ``scale``.
* ``[[throughput]]``: measured tokens per second for a (GPU, model size, GPU count), grouped in named
  sets (``set = "seed"``) that ``--throughput-source NAME`` selects.
* ``[[mfu_calibration]]``: an MFU measured on a real GPU (``gpu``, ``mfu``; optionally the ``model``
  and ``method`` it was measured with, ``source``, ``date``). This is what the validation plugin writes
  (``fitplan validate --calibrate-out``): a row for the scenario's GPU overrides the fitted default; a row
  that also names the model and method wins over one that does not.

Precedence (later wins, entry by entry, keyed by ``id``):

1. the bundled ``rulesets/`` shipped inside the wheel;
2. directories returned by plugins' ``fitplan_ruleset_dirs`` hook, in plugin registration order;
3. each ``--ruleset-dir`` in the order given on the command line.

Within one directory, files are read in sorted path order; the same ``id`` twice within one
directory is an error (it is almost always a copy-paste mistake).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any, ClassVar

import attrs

from fitplan.errors import FitplanError, did_you_mean, unknown
from fitplan.rulesets.schema import (GPU, AdviceRule, FinetuneRun, Framework, Instance, MfuCalibration, MfuRow, ModelEntry,
                                     PolicyRule, Provider, RulesetFile, ThroughputRow, TimeCalibration, TimeEfficiency,
                                     TimeModel)


_PARSED: dict[tuple[str, int, int], tuple[RulesetFile | None, list[str]]] = {}
"""Files already read in this process, by (path, mtime, size): a ruleset directory is checked and then loaded."""


def parse_file(path: Path) -> tuple[RulesetFile | None, list[str]]:
    """Read one ruleset file. Returns the parsed file and every error as ``file: message @ $.path``."""
    try:
        st = path.stat()
    except OSError as e:
        return None, [f"{path}: cannot read: {e.strerror}"]
    key = (str(path), st.st_mtime_ns, st.st_size)
    if key not in _PARSED:
        _PARSED[key] = _parse(path)
    return _PARSED[key]


def _parse(path: Path) -> tuple[RulesetFile | None, list[str]]:
    """Parse and validate one file, or take it from its on-disk snapshot (:mod:`fitplan.rulesets.snapshot`:
    same bytes, same code) when one exists."""
    from fitplan.inputs.convert import CONVERTER, error_lines
    from fitplan.inputs.files import decode, loads_toml, read_bytes
    from fitplan.rulesets import snapshot

    try:
        raw = read_bytes(path)
        kept = snapshot.load(path, raw)
        if isinstance(kept, RulesetFile):
            return kept, []
        data = loads_toml(decode(raw, file=str(path)), file=str(path))
    except FitplanError as e:
        return None, [e.render()]
    try:
        parsed = CONVERTER.structure(data, RulesetFile)
    except Exception as e:  # noqa: BLE001 - cattrs error groups
        return None, [f"{path}: {line}" for line in error_lines(e)]
    problems = _cross_check(parsed, path)
    if problems:
        return None, problems
    snapshot.store(path, raw, parsed)
    return parsed, []


def ruleset_files(directory: Path) -> list[Path]:
    """The ``*.toml`` files of a directory, recursively, in sorted order; in the bundled directory, not
    those under ``examples/`` (example policies are used only when named: ``--policy FILE``)."""
    files = sorted(p for p in directory.rglob("*.toml") if p.is_file())
    if directory.resolve() == bundled_dir().resolve():
        files = [p for p in files if "examples" not in p.relative_to(directory).parts[:-1]]
    return files


def check_text(data: bytes, name: str = "ruleset.toml") -> list[str]:
    """The problems ``fitplan rulesets check`` finds in ruleset file bytes ``data`` (checked before a command
    writes them, so that fitplan never writes a file it would then refuse)."""
    import tempfile

    with tempfile.TemporaryDirectory() as d:
        probe = Path(d) / name
        probe.write_bytes(data)
        return [e.replace(str(probe), name) for e in check_paths([probe])]


def check_paths(paths: Iterable[str | Path]) -> list[str]:
    """Validate ruleset files or directories; return every error at once (empty when all is well)."""
    errors: list[str] = []
    for p in map(Path, paths):
        if p.is_dir():
            files = ruleset_files(p)
            if not files:
                errors.append(f"{p}: no *.toml files found")
        elif p.exists():
            files = [p]
        else:
            errors.append(f"{p}: no such file or directory")
            continue
        seen: dict[tuple[str, str], Path] = {}
        for f in files:
            parsed, errs = parse_file(f)
            errors.extend(errs)
            if parsed is not None:
                errors.extend(_duplicates(parsed, f, seen))
    return errors


def _duplicates(parsed: RulesetFile, f: Path, seen: dict[tuple[str, str], Path]) -> list[str]:
    out = []
    for kind in ("gpu", "provider", "model", "mfu", "throughput", "finetune_run", "policy", "advice"):
        for i, entry in enumerate(getattr(parsed, kind)):
            key = (kind, entry.id)
            if key in seen:
                out.append(f"{f}: duplicate {kind} id {entry.id!r} (also in {seen[key]}) @ $.{kind}[{i}].id")
            seen[key] = f
    for i, inst in enumerate(parsed.instance):
        key = ("instance", f"{inst.provider}/{inst.id}/{inst.region}")
        if key in seen:
            out.append(f"{f}: duplicate instance {inst.provider}/{inst.id} in region {inst.region!r} (also in {seen[key]}) @ $.instance[{i}].id")
        seen[key] = f
    for i, cal in enumerate(parsed.mfu_calibration):
        key = ("mfu_calibration", f"{cal.gpu}/{cal.model}/{cal.method}")
        if key in seen:
            out.append(f"{f}: duplicate mfu_calibration for gpu {cal.gpu!r}, model {cal.model!r}, method {cal.method!r} "
                       f"(also in {seen[key]}) @ $.mfu_calibration[{i}]")
        seen[key] = f
    for table, key_of in (("time_efficiency", lambda e: e.generation),
                          ("time_calibration", lambda e: f"{e.gpu}/{e.model}/{e.method}")):
        for i, entry in enumerate(getattr(parsed, table)):
            key = (table, key_of(entry))
            if key in seen:
                out.append(f"{f}: duplicate {table} {key[1]!r} (also in {seen[key]}) @ $.{table}[{i}]")
            seen[key] = f
    return out


def _cross_check(parsed: RulesetFile, f: Path) -> list[str]:
    """The model presets and published runs of a parsed file read as configs. A preset that the architecture
    files in force do not describe (:class:`~fitplan.arch.archfile.NotLearned`: a switch combination its learned
    file lacks, as a file learned from the class defaults lacks the bundled presets' ``norm_topk_prob``) is no
    mistake of the file: it is reported when that preset is used (:meth:`Rulesets.preset_spec`), and the rest of
    the directory loads."""
    from fitplan.arch.archfile import NotLearned

    out = []
    for i, entry in enumerate(parsed.model):
        from fitplan.arch.architecture import spec_from_config

        try:
            spec_from_config(entry.config, name=entry.id)
        except NotLearned:
            continue
        except FitplanError as e:
            out.append(f"{f}: model {entry.id!r}: {e.message} @ $.model[{i}].config{(e.field or '').removeprefix('$')}")
    for i, run in enumerate(parsed.finetune_run):
        out.extend(f"{f}: finetune_run {run.id!r}: {msg} @ $.finetune_run[{i}].{where}" for msg, where in _check_run(run))
    return out


def _check_run(run: FinetuneRun) -> list[tuple[str, str]]:
    """A published run's scenario must be a valid scenario naming its GPU, and its model (a catalog name, or
    an inline ``config``) must be readable; an excluded row may have no scenario."""
    from fitplan.arch.architecture import spec_from_config
    from fitplan.inputs.scenario import from_flat

    if run.exclude and not run.scenario:
        return []  # an excluded row need not be expressible as a scenario (FP8, pipeline parallelism, ...)
    problems = []
    try:
        from_flat(run.scenario)
    except FitplanError as e:
        problems.append((e.message, f"scenario.{e.field or ''}"))
    if not run.scenario.get("gpu"):
        problems.append(("the scenario names no gpu", "scenario"))
    if run.network_gbps is not None and (run.scenario.get("provider") or run.scenario.get("instance")):
        problems.append(("give either network_gbps or a bundled provider/instance, not both", "network_gbps"))
    if bool(run.config) == bool(run.scenario.get("model")):
        problems.append(("give either scenario.model (a catalog name) or an inline config", "scenario.model"))
    if run.config:
        from fitplan.arch.archfile import NotLearned

        try:
            spec_from_config(run.config, name=run.id)
        except NotLearned:
            pass  # the architecture files in force, not the run, decide this (as a preset's: _cross_check)
        except FitplanError as e:
            problems.append((e.message, f"config{(e.field or '').removeprefix('$')}"))
    return problems


def unavailable_presets(paths: Iterable[str | Path]) -> list[str]:
    """The model presets of ``paths`` (files or directories that parse) that the architecture files in force do
    not describe, each as :meth:`Rulesets.preset_spec` reports it (``fitplan rulesets check`` warns of them)."""
    from fitplan.arch.archfile import NotLearned

    out = []
    for p in map(Path, paths):
        for f in ruleset_files(p) if p.is_dir() else [p]:
            parsed, _ = parse_file(f)
            rs = Rulesets()
            if parsed is None:
                continue
            rs._merge(parsed, str(f))
            for entry in parsed.model:
                try:
                    rs.preset_spec(entry)
                except NotLearned as e:
                    out.append(e.render())
    return out


def bundled_dir() -> Path:
    """The bundled rulesets: inside the wheel, or the repository's top-level ``rulesets/``."""
    package = Path(__file__).resolve().parent.parent
    inside = package / "_rulesets"
    if inside.is_dir():
        return inside
    return package.parent.parent / "rulesets"


@attrs.define
class Rulesets:
    """Every ruleset entry in force, with the file each came from."""

    gpus: dict[str, GPU] = attrs.Factory(dict)
    providers: dict[str, Provider] = attrs.Factory(dict)
    instances: dict[tuple[str, str, str], Instance] = attrs.Factory(dict)
    models: dict[str, ModelEntry] = attrs.Factory(dict)
    framework: Framework = attrs.Factory(Framework)
    mfu_rows: dict[str, MfuRow] = attrs.Factory(dict)
    throughput_rows: dict[str, ThroughputRow] = attrs.Factory(dict)
    mfu_calibrations: dict[tuple[str, str, str], MfuCalibration] = attrs.Factory(dict)
    """``(gpu, model, method)`` -> calibration ("" = any model / method)."""
    finetune_runs: dict[str, FinetuneRun] = attrs.Factory(dict)
    time_efficiencies: dict[str, TimeEfficiency] = attrs.Factory(dict)
    """GPU generation -> fitted efficiency factors."""
    time_model: TimeModel | None = None
    time_calibrations: dict[tuple[str, str, str], TimeCalibration] = attrs.Factory(dict)
    """``(gpu, model, method)`` -> a measured run's time scale ("" = any model / method)."""
    policies: dict[str, PolicyRule] = attrs.Factory(dict)
    advice: dict[str, AdviceRule] = attrs.Factory(dict)
    origin: dict[str, str] = attrs.Factory(dict)
    """``kind:id`` -> the file that set it (for ``explain``)."""
    dirs: list[str] = attrs.Factory(list)
    cache: dict[Any, Any] = attrs.Factory(dict)
    """Derived lookups (instance choices, fitted MFU defaults), computed once per key: see :meth:`memo`."""

    def add_dir(self, directory: Path) -> None:
        errors = check_paths([directory])
        if errors:
            raise FitplanError(f"invalid ruleset directory {directory}", details=errors)
        for f in ruleset_files(directory):
            parsed, _ = parse_file(f)
            assert parsed is not None
            self._merge(parsed, str(f))
        self.dirs.append(str(directory))

    # table in a ruleset file -> (attribute of Rulesets, key of an entry, how `origin` names it)
    _TABLES: ClassVar[tuple[tuple[str, str, Any, Any], ...]] = (
        ("gpu", "gpus", lambda e: e.id, lambda e: e.id),
        ("provider", "providers", lambda e: e.id, lambda e: e.id),
        ("instance", "instances", lambda e: (e.provider, e.id, e.region), lambda e: f"{e.provider}/{e.id}/{e.region}"),
        ("model", "models", lambda e: e.id, lambda e: e.id),
        ("mfu", "mfu_rows", lambda e: e.id, lambda e: e.id),
        ("throughput", "throughput_rows", lambda e: e.id, lambda e: e.id),
        ("mfu_calibration", "mfu_calibrations", lambda e: (e.gpu, e.model, e.method), lambda e: f"{e.gpu}/{e.model}/{e.method}"),
        ("finetune_run", "finetune_runs", lambda e: e.id, lambda e: e.id),
        ("time_efficiency", "time_efficiencies", lambda e: e.generation, lambda e: e.generation),
        ("time_calibration", "time_calibrations", lambda e: (e.gpu, e.model, e.method), lambda e: f"{e.gpu}/{e.model}/{e.method}"),
        ("policy", "policies", lambda e: e.id, lambda e: e.id),
        ("advice", "advice", lambda e: e.id, lambda e: e.id),
    )

    def _merge(self, parsed: RulesetFile, f: str) -> None:
        for table, attr, key, label in self._TABLES:
            target = getattr(self, attr)
            for entry in getattr(parsed, table):
                target[key(entry)] = entry
                self.origin[f"{table}:{label(entry)}"] = f
        if parsed.framework is not None:
            self.framework = parsed.framework
            self.origin["framework"] = f
        if parsed.time_model is not None:
            self.time_model = parsed.time_model
            self.origin["time_model"] = f
        self.cache.clear()

    def memo(self, key: Any, compute: Any) -> Any:
        """``compute()`` once per ``key`` for these rulesets (cleared when a directory is added).

        Lookups that scan a catalog (instances of a provider, MFU rows) go through here so that one
        graph evaluation stays O(1) in the catalog size."""
        try:
            return self.cache[key]
        except KeyError:
            value = self.cache[key] = compute()
            return value

    # ---------------------------------------------------------------- lookups with suggestions

    def gpu(self, name: str) -> GPU:
        key = name.lower()
        if key in self.gpus:
            return self.gpus[key]
        for g in self.gpus.values():
            if key in (a.lower() for a in g.aliases):
                return g
        names = list(self.gpus) + [a for g in self.gpus.values() for a in g.aliases]
        raise unknown("GPU", name, names, field="--gpu")

    def model_entry(self, name: str) -> ModelEntry:
        key = name.lower()
        if key in self.models:
            return self.models[key]
        for m in self.models.values():
            if key in (a.lower() for a in m.aliases) or key == m.hf_id.lower():
                return m
        raise unknown("model", name, list(self.models), field="--model")

    def preset_spec(self, entry: ModelEntry) -> Any:
        """The :class:`~fitplan.arch.architecture.ModelSpec` of a model preset, through the architecture file in
        force for its ``model_type``.

        :raises NotLearned: naming the preset, its ruleset file and the architecture file that does not describe
            it (a learned file in the user's cache wins over the bundled one: ``fitplan learn-architecture
            --install`` from a config with other switches replaces the combinations the bundled file learned)."""
        from fitplan.arch.archfile import NotLearned, find
        from fitplan.arch.architecture import spec_from_config

        origin = self.origin.get(f"model:{entry.id}")
        try:
            return spec_from_config(entry.config, name=entry.id, file=origin, source=entry.source)
        except NotLearned as e:
            arch = find(str(entry.config.get("model_type")))
            where = (e.field or "").removeprefix("$") if (e.field or "").startswith("$.") else ""
            raise NotLearned(f"model preset {entry.id!r} is unavailable: {e.message}"
                             + (f" (the architecture file in force: {arch})" if arch else ""), file=origin,
                             field=f"$.model.config{where}", value=e.value if where else entry.id,
                             suggestion=e.suggestion if arch is None else "that file was learned from other "
                             "switches: remove it to use the bundled file again, or learn from this preset's "
                             "config.json") from None

    def provider(self, name: str) -> Provider:
        if name in self.providers:
            return self.providers[name]
        raise unknown("provider", name, list(self.providers), field="--provider")


def load(extra_dirs: Sequence[str | Path] = (), plugin_dirs: Sequence[str | Path] = ()) -> Rulesets:
    """Load bundled rulesets, then plugin directories, then ``extra_dirs`` (later wins); every reference
    between entries must resolve (:func:`reference_problems`)."""
    rs = Rulesets()
    rs.add_dir(bundled_dir())
    for d in [*plugin_dirs, *extra_dirs]:
        p = Path(d)
        if not p.is_dir():
            raise FitplanError("ruleset directory not found", file=str(p), field="--ruleset-dir", value=str(d))
        rs.add_dir(p)
    problems = reference_problems(rs)
    if problems:
        raise FitplanError("invalid rulesets: an entry names one that no ruleset defines", details=problems)
    return rs


def _names_gpu(rs: Rulesets, name: str) -> bool:
    """Whether ``name`` is a GPU id or alias of the rulesets in force (``Rulesets.gpu``'s lookup)."""
    try:
        rs.gpu(name)
    except FitplanError:
        return False
    return True


def reference_problems(rs: Rulesets) -> list[str]:
    """Entries naming a GPU or a provider no ruleset in force defines: an instance on an unknown GPU or of an
    unknown provider could never be chosen or priced, a calibration for an unknown GPU never applies."""
    out = []
    for (provider, iid, region), inst in rs.instances.items():
        f = rs.origin.get(f"instance:{provider}/{iid}/{region}", "?")
        for what, ref, known in (("gpu", inst.gpu, rs.gpus), ("provider", inst.provider, rs.providers)):
            if ref not in known:
                hint = did_you_mean(ref, list(known)) or f"define [[{what}]] id = {ref!r}"
                out.append(f"{f}: instance {iid!r} names {what} {ref!r}, which no ruleset defines ({hint}) @ $.instance.{what}")
    for table, attr in (("mfu_calibration", "mfu_calibrations"), ("time_calibration", "time_calibrations")):
        for key, entry in getattr(rs, attr).items():
            if not _names_gpu(rs, entry.gpu):  # an id or an alias: calibrations keep the user's --gpu
                f = rs.origin.get(f"{table}:{'/'.join(key)}", "?")
                hint = did_you_mean(entry.gpu, list(rs.gpus)) or "see `fitplan gpus`"
                out.append(f"{f}: {table} names gpu {entry.gpu!r}, which no ruleset defines ({hint}) @ $.{table}.gpu")
    return out


def check_references(paths: Iterable[str | Path]) -> list[str]:
    """:func:`reference_problems` of the bundled rulesets with ``paths`` (files or directories) added, for
    ``fitplan rulesets check`` (run once every file parsed)."""
    rs = Rulesets()
    rs.add_dir(bundled_dir())
    for p in map(Path, paths):
        for f in ruleset_files(p) if p.is_dir() else [p]:
            parsed, _ = parse_file(f)
            if parsed is not None:
                rs._merge(parsed, str(f))
    return reference_problems(rs)
