"""Import a SkyPilot catalog (``catalogs/v8/<cloud>/vms.csv``) as a pricing ruleset.

Columns are read by header name (their order differs per cloud): ``InstanceType``, ``AcceleratorName``,
``AcceleratorCount``, ``Price``, ``SpotPrice``, ``Region`` are required; ``vCPUs``, ``MemoryGiB``,
``AvailabilityZone`` and ``GpuInfo`` are read when present.

* AWS-style rows name the instance and its accelerators together: one row is one priced GPU instance.
* GCP lists VM rows and GPU rows separately. A GPU row has an ``AcceleratorName`` and an empty
  ``InstanceType``; its ``Price`` is for ``AcceleratorCount`` GPUs. A GPU VM (``a2-highgpu-1g``) is a VM
  row whose accelerators are implied by its machine type (:data:`GCP_MACHINE_GPUS`), and its price is
  the VM row + ``AcceleratorCount`` × the per-GPU price of the GPU row in the same region (spot alike).
* Availability zones of one region collapse into one instance per region (lowest price of its zones).

Accelerator names map to hardware-ruleset GPU ids (:data:`ACCELERATOR_GPU`, or a GPU id / alias of the
loaded hardware rulesets). Unknown accelerators are reported (name and row count), not silently dropped.
Malformed rows are reported all at once with their line numbers, and nothing is written.
"""

from __future__ import annotations

import csv
import math
import re
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import attrs

REQUIRED = ("InstanceType", "AcceleratorName", "AcceleratorCount", "Price", "SpotPrice", "Region")

ACCELERATOR_GPU = {
    "T4": "t4",
    "A10G": "a10g",
    "A10": "a10",
    "L4": "l4",
    "L40S": "l40s",
    "V100": "v100-16gb",
    "V100-32GB": "v100-32gb",
    "A100": "a100-40gb",
    "A100-80GB": "a100-80gb",
    "H100": "h100-sxm",
    "H100-MEGA": "h100-sxm",
    "H100-80GB": "h100-sxm",
    "H100-PCIE": "h100-pcie",
    "H200": "h200",
    "B200": "b200",
    "RTX4090": "rtx-4090",
    "RTX3090": "rtx-3090",
    "MI300X": "mi300x",
}
"""SkyPilot accelerator names -> fitplan GPU ids (SkyPilot's ``A100`` is the 40 GB part)."""

GCP_MACHINE_GPUS: tuple[tuple[str, str, int | None], ...] = (
    (r"a2-highgpu-(\d+)g", "A100", None),
    (r"a2-megagpu-(\d+)g", "A100", None),
    (r"a2-ultragpu-(\d+)g", "A100-80GB", None),
    (r"a3-(?:high|mega|edge)gpu-(\d+)g(?:-nolssd)?", "H100", None),
    (r"a3-ultragpu-(\d+)g", "H200", None),
    (r"a4-highgpu-(\d+)g", "B200", None),
    (r"g2-standard-(?:4|8|12|16|32)", "L4", 1),
    (r"g2-standard-24", "L4", 2),
    (r"g2-standard-48", "L4", 4),
    (r"g2-standard-96", "L4", 8),
)
"""GCP machine types whose GPUs are fixed by the type (Compute Engine "GPU machine types"): pattern,
accelerator, count (None: the number before ``g``)."""

KNOWN_BILLING = {
    "aws": ("second", 60, "EC2 Linux instances are billed per second with a 60-second minimum"),
    "gcp": ("second", 60, "Compute Engine bills per second with a 1-minute minimum"),
}


@attrs.frozen
class ImportResult:
    data: dict[str, Any]
    """The ruleset, ready for ``tomli_w``."""
    errors: list[str]
    """Malformed input: ``file:line: message``. Nothing is written when there is any."""
    unknown: dict[str, int]
    """Accelerator name -> rows skipped because it maps to no GPU."""
    warnings: list[str]


def _number(text: str, column: str, line: int, path: str, errors: list[str], *, required: bool) -> float | None:
    text = (text or "").strip()
    if not text:
        if required:
            errors.append(f"{path}:{line}: {column} is empty")
        return None
    try:
        value = float(text)
    except ValueError:
        errors.append(f"{path}:{line}: {column} is not a number: {text!r}")
        return None
    if not math.isfinite(value) or value < 0:
        errors.append(f"{path}:{line}: {column} must be a finite number >= 0, got {text!r}")
        return None
    return value


def _gcp_machine(instance_type: str) -> tuple[str, int] | None:
    for pattern, acc, count in GCP_MACHINE_GPUS:
        m = re.fullmatch(pattern, instance_type)
        if m:
            return acc, count if count is not None else int(m.group(1))
    return None


def gpu_for(name: str, known_gpus: dict[str, str], extra: dict[str, str]) -> str | None:
    """The GPU id for a SkyPilot accelerator name: ``--map``, the built-in table, or a hardware id/alias."""
    if name in extra:
        return extra[name]
    if name in ACCELERATOR_GPU:
        return ACCELERATOR_GPU[name]
    return known_gpus.get(name.lower())


@attrs.define
class _Reading:
    """What one pass over the CSV rows found."""

    errors: list[str] = attrs.Factory(list)
    warnings: list[str] = attrs.Factory(list)
    unknown: dict[str, int] = attrs.Factory(dict)
    vm_rows: list[tuple[int, dict[str, str], float, float | None]] = attrs.Factory(list)
    gpu_price: dict[tuple[str, str], tuple[float, float | None]] = attrs.Factory(dict)
    """(accelerator, region) -> per-GPU on-demand and spot prices of GCP's separate GPU rows."""
    instances: dict[tuple[str, str], dict[str, Any]] = attrs.Factory(dict)

    def skip(self, accelerator: str) -> None:
        self.unknown[accelerator] = self.unknown.get(accelerator, 0) + 1


def import_catalog(path: str | Path, provider: str, *, known_gpus: dict[str, str] | None = None,
                   extra_map: dict[str, str] | None = None, date: str = "", billing: str | None = None,
                   minimum_seconds: int | None = None, spot_overhead: float = 0.1) -> ImportResult:
    """Read a SkyPilot ``vms.csv``; return the pricing ruleset and every problem.

    :param known_gpus: lowercase GPU id or alias of the hardware rulesets -> GPU id.
    :param extra_map: accelerator name -> GPU id, for names the built-in table does not know.
    """
    p = Path(path)
    known_gpus, extra_map = known_gpus or {}, extra_map or {}
    from fitplan.errors import FitplanError
    from fitplan.inputs.files import read_text

    try:
        text = read_text(p, field="CSV_FILE")
    except FitplanError as e:
        return ImportResult({}, [e.render()], {}, [])
    reader = csv.reader(text.splitlines())
    try:
        try:
            header = [h.strip() for h in next(reader)]
        except StopIteration:
            return ImportResult({}, [f"{p}:1: empty file: expected a header row with {', '.join(REQUIRED)}"], {}, [])
        missing = [c for c in REQUIRED if c not in header]
        if missing:
            return ImportResult({}, [f"{p}:1: header lacks column(s) {', '.join(missing)} (found: {', '.join(header)})"],
                                {}, [])
        found = _Reading()
        for line, raw in enumerate(reader, start=2):
            _read_row(found, p, line, raw, header, known_gpus, extra_map)
    except csv.Error as e:  # a field over csv's size limit, a NUL byte, an unterminated quote
        return ImportResult({}, [f"{p}:{reader.line_num}: malformed CSV: {e}"], {}, [])
    _price_gcp_vms(found, p, known_gpus, extra_map)
    return _ruleset(found, p, provider, date, billing, minimum_seconds, spot_overhead)


def _read_row(found: _Reading, p: Path, line: int, raw: list[str], header: list[str], known_gpus: dict[str, str],
              extra_map: dict[str, str]) -> None:
    """One CSV row: a priced GPU instance, a GCP GPU row (its per-GPU price) or a VM row (kept for later)."""
    errors = found.errors
    if not raw or all(not c.strip() for c in raw):
        return
    if len(raw) != len(header):
        errors.append(f"{p}:{line}: {len(raw)} fields, expected {len(header)} (header: {', '.join(header)})")
        return
    row = {name: raw[i].strip() for i, name in enumerate(header)}
    itype, acc, region = row["InstanceType"], row["AcceleratorName"], row["Region"]
    if not region:
        errors.append(f"{p}:{line}: Region is empty")
    count = _number(row["AcceleratorCount"], "AcceleratorCount", line, str(p), errors, required=bool(acc))
    price = _number(row["Price"], "Price", line, str(p), errors, required=True)
    spot = _number(row["SpotPrice"], "SpotPrice", line, str(p), errors, required=False)
    if count is not None and acc and (count <= 0 or not float(count).is_integer()):
        errors.append(f"{p}:{line}: AcceleratorCount must be a whole number >= 1 for {acc}, got {row['AcceleratorCount']!r}")
        return
    if price is None or not region or (acc and count is None):
        return
    if not itype:
        if not acc:
            errors.append(f"{p}:{line}: both InstanceType and AcceleratorName are empty")
        elif gpu_for(acc, known_gpus, extra_map) is None:
            found.skip(acc)
        else:  # a GCP GPU row: the price of `count` accelerators, to be added to a VM row
            per_gpu = (price / count, None if spot is None else spot / count)
            old = found.gpu_price.get((acc, region))
            if old is None or per_gpu[0] < old[0]:
                found.gpu_price[(acc, region)] = per_gpu
        return
    if not acc:
        found.vm_rows.append((line, row, price, spot))  # a CPU VM, or a GCP VM with fixed GPUs
        return
    gpu = gpu_for(acc, known_gpus, extra_map)
    if gpu is None:
        found.skip(acc)
        return
    _add(found.instances, itype, region, gpu, int(count), price, spot, f"{p.name} line {line}")


def _price_gcp_vms(found: _Reading, p: Path, known_gpus: dict[str, str], extra_map: dict[str, str]) -> None:
    """GCP VMs whose machine type fixes their GPUs: the VM row + n × the GPU row of the same region."""
    used: set[str] = set()
    for line, row, price, spot in found.vm_rows:
        fixed = _gcp_machine(row["InstanceType"])
        if fixed is None:
            continue  # a CPU-only VM: nothing to price for fitplan
        acc, n = fixed
        gpu = gpu_for(acc, known_gpus, extra_map)
        if gpu is None:
            found.skip(acc)
            continue
        per = found.gpu_price.get((acc, row["Region"]))
        if per is None:
            found.warnings.append(f"{p}:{line}: {row['InstanceType']} in {row['Region']}: no {acc} GPU row in that region; skipped")
            continue
        used.add(acc)
        total_spot = None if spot is None or per[1] is None else spot + n * per[1]
        _add(found.instances, row["InstanceType"], row["Region"], gpu, n, price + n * per[0], total_spot,
             f"{p.name} line {line} (VM) + {n} × {acc} GPU row")
    for acc in sorted({a for a, _ in found.gpu_price} - used):
        found.warnings.append(f"{p}: {acc} GPU rows have no GPU machine type to attach to (e.g. an n1 VM + {acc}); not priced")


def _ruleset(found: _Reading, p: Path, provider: str, date: str, billing: str | None, minimum_seconds: int | None,
             spot_overhead: float) -> ImportResult:
    bill, minimum, why = KNOWN_BILLING.get(provider, ("second", 60, "assumed: per-second billing, 60-second minimum"))
    provider_table = {
        "id": provider,
        "name": provider,
        "billing": billing or bill,
        "minimum_seconds": minimum if minimum_seconds is None else minimum_seconds,
        "currency": "USD",
        "spot_overhead": spot_overhead,
        "source": f"SkyPilot catalog {p.name} (imported by fitplan rulesets import-skypilot); billing: {why}",
    }
    rows = []
    for (itype, region), inst in sorted(found.instances.items()):
        entry = {"provider": provider, "id": itype, "gpu": inst["gpu"], "gpus": inst["gpus"],
                 "on_demand_per_hour": round(inst["price"], 6)}
        if inst["spot"] is not None:
            entry["spot_per_hour"] = round(inst["spot"], 6)
        entry.update(region=region, source=f"SkyPilot catalog {inst['source']}")
        if date:
            entry["date"] = date
        rows.append(entry)
    if not rows and not found.errors:
        found.warnings.append(f"{p}: no GPU instance found")
    return ImportResult({"provider": [provider_table], "instance": rows}, found.errors, found.unknown, found.warnings)


def _add(instances: dict, itype: str, region: str, gpu: str, gpus: int, price: float, spot: float | None, source: str) -> None:
    key = (itype, region)
    old = instances.get(key)
    if old is None:
        instances[key] = {"gpu": gpu, "gpus": gpus, "price": price, "spot": spot, "source": source}
        return
    old["price"] = min(old["price"], price)
    if spot is not None:
        old["spot"] = spot if old["spot"] is None else min(old["spot"], spot)


def known_gpu_names(gpus: Iterable[Any]) -> dict[str, str]:
    """Lowercase GPU id and aliases -> GPU id, from the hardware rulesets."""
    out: dict[str, str] = {}
    for g in gpus:
        out[g.id.lower()] = g.id
        for a in g.aliases:
            out[a.lower()] = g.id
    return out


def provider_from_path(path: Path) -> str | None:
    """``catalogs/v8/aws/vms.csv`` -> aws; ``aws_vms.csv`` -> aws."""
    if path.name == "vms.csv":
        return path.parent.name or None
    stem = path.stem
    for suffix in ("_vms", "-vms", ".vms"):
        if stem.endswith(suffix):
            return stem[: -len(suffix)] or None
    return None


def parse_mappings(mappings: Iterable[str]) -> dict[str, str]:
    """``--map NAME=GPU`` options as a dict. :raises FitplanError: a malformed one."""
    from fitplan.errors import FitplanError

    out: dict[str, str] = {}
    for m in mappings:
        name, sep, gpu = m.partition("=")
        if not sep or not name.strip() or not gpu.strip():
            raise FitplanError(f"--map expects NAME=GPU, got {m!r}", field="--map", value=m, suggestion="e.g. --map A100=a100-40gb")
        out[name.strip()] = gpu.strip()
    return out


def import_to_file(csv_file: str | Path, out: str | Path, *, provider: str | None, rules: Any, extra_map: dict[str, str],
                   date: str = "", billing: str | None = None, minimum_seconds: int | None = None,
                   spot_overhead: float = 0.1) -> tuple[ImportResult, list[str]]:
    """Convert ``csv_file`` and write the pricing ruleset ``out`` (atomically, only when every row is valid and
    the result passes ``fitplan rulesets check``). Returns the import result and the messages to show (warnings
    and skipped accelerators).

    :raises FitplanError: the file is missing, the provider cannot be told, rows are malformed, or the
        converted ruleset is invalid; nothing is written then.
    """
    import tomli_w

    from fitplan.errors import FitplanError
    from fitplan.inputs.convert import CONVERTER, error_lines
    from fitplan.files import write_bytes
    from fitplan.rulesets.loader import check_text
    from fitplan.rulesets.schema import RulesetFile

    path = Path(csv_file)
    if not path.exists():
        raise FitplanError("file not found", file=str(path), field="CSV_FILE")
    provider = provider or provider_from_path(path)
    if not provider:
        raise FitplanError("cannot tell the provider from the file name", file=str(path), field="--provider",
                           suggestion="pass --provider NAME (e.g. aws, gcp)")
    result = import_catalog(path, provider, known_gpus=known_gpu_names(rules.gpus.values()), extra_map=extra_map,
                            date=date, billing=billing, minimum_seconds=minimum_seconds, spot_overhead=spot_overhead)
    if result.errors:
        raise FitplanError(f"{len(result.errors)} malformed row(s); nothing written", file=str(path), field="CSV_FILE",
                           details=result.errors, suggestion="fix or remove these rows")
    try:
        CONVERTER.structure(result.data, RulesetFile)
    except Exception as e:  # noqa: BLE001 - cattrs error groups
        raise FitplanError("the converted ruleset is invalid; nothing written", file=str(path),
                           details=error_lines(e)) from None
    text = (f"# Pricing ruleset imported from the SkyPilot catalog {path.name} by `fitplan rulesets import-skypilot`.\n"
            .encode() + tomli_w.dumps(result.data).encode())
    problems = check_text(text)  # the exact bytes, before they replace anything
    if problems:
        raise FitplanError("the converted ruleset does not pass `fitplan rulesets check`; nothing written",
                           details=problems)
    write_bytes(out, text)
    messages = [f"warning: {w}" for w in result.warnings]
    if result.unknown:
        names = ", ".join(f"{k} ({n} row{'s' if n > 1 else ''})" for k, n in sorted(result.unknown.items()))
        messages.append(f"skipped accelerators that map to no GPU: {names}; map one with --map NAME=gpu-id")
    unmapped = sorted({i["gpu"] for i in result.data["instance"]} - set(rules.gpus))
    if unmapped:
        messages.append(f"warning: GPU id(s) not in the hardware rulesets: {', '.join(unmapped)} "
                        "(estimates with them need a [[gpu]] entry)")
    return result, messages
