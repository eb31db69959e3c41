"""What machine types exist, with which GPUs, where: the shipped catalog (``infra/catalog.json``, built by
``tools/refresh_catalog.py`` from the clouds' APIs and published exports; its ``sources`` say which, and
when) and the checks ``spotctl validate`` makes against it.

A check refuses only what the catalog states: an unknown size of a family it lists (the APIs list every
type of a family), a GPU a type does not come with, a region (or, where the zones are known, a zone) that
does not offer a type the catalog has read offerings for. A family the catalog does not list, a region it
has not read and zones it records as ``"unknown"`` are never refused: the catalog may be older than the
cloud. Pure Python, no cloud SDK: ``infra.config`` calls :func:`problems`.
"""

from __future__ import annotations

import difflib
import json
import re
from functools import cache
from pathlib import Path
from typing import Any

from infra.contract import gcp_zones

PATH = Path(__file__).with_name("catalog.json")
UNKNOWN = "unknown"


@cache
def load(path: Path = PATH) -> dict[str, Any]:
    """The catalog ({} when the file is missing: nothing is then refused)."""
    try:
        return json.loads(path.read_text())
    except FileNotFoundError:
        return {}


def family(cloud: str, machine: str) -> str:
    """``g5`` of ``g5.2xlarge``, ``n1`` of ``n1-standard-8``."""
    return machine.split("." if cloud == "aws" else "-", 1)[0]


def is_custom(machine: str) -> bool:
    """A GCE custom machine type (``custom-8-30720``, ``n1-custom-8-30720``, ``...-ext``): any size within the
    series' rules, never listed (https://cloud.google.com/compute/docs/instances/creating-instance-with-custom-machine-type);
    E2's shared-core ones put micro, small or medium where the vCPUs go (``e2-custom-medium-4096``:
    https://cloud.google.com/compute/docs/samples/compute-custom-machine-type-create-shared-with-helper)."""
    return re.fullmatch(r"([a-z0-9]+-)?custom-(\d+|micro|small|medium)-\d+(-ext)?", machine) is not None


# Compute Engine resource names, machine types among them, are lowercase letters, digits and '-', a letter
# first (https://cloud.google.com/compute/docs/naming-resources#resource-name-format); a machine type is
# SERIES-KIND-VCPUS[...] (g2-standard-8, a3-highgpu-8g, c3-standard-8-lssd), a shared core SERIES-micro|small|
# medium, or X4's SERIES-VCPUS-...-metal (https://cloud.google.com/compute/docs/machine-resource); custom types
# are is_custom's. EC2's are FAMILY.SIZE, the family "everything before the period" (the EC2 API's
# PerformanceFactorReference.InstanceFamily, citing "Amazon EC2 instance type naming conventions":
# https://docs.aws.amazon.com/ec2/latest/instancetypes/instance-type-names.html), lowercase as the API lists
# them (c6i.large, u-6tb1.metal, c7i.metal-48xl). Every name in the catalog has its cloud's shape (tests).
SHAPES = {"gcp": re.compile(r"[a-z][a-z0-9]*-(?:(?:[a-z]+-)?\d+[a-z0-9]*(?:-[a-z0-9]+)*|micro|small|medium)"),
          "aws": re.compile(r"[a-z][a-z0-9-]*\.[a-z0-9]+(?:-[a-z0-9]+)*")}
SHAPE_WORDS = {"gcp": "a Compute Engine machine type is SERIES-KIND-VCPUS, e.g. 'g2-standard-8', or custom-VCPUS-MB",
               "aws": "an EC2 instance type is FAMILY.SIZE, e.g. 'g5.2xlarge'"}


def did_you_mean(cloud: str, machine: str) -> str:
    """"did you mean 'a' or 'b'?" over the catalog's nearest names, or "" when none is near."""
    close = difflib.get_close_matches(machine, load().get(cloud, {}).get("types", []), n=3, cutoff=0.75)
    return f"did you mean {' or '.join(repr(c) for c in close)}?" if close else ""


def forget() -> None:
    """Drop what was worked out from the catalog (after ``load`` gives another one: tests)."""
    for f in (_families, _types, _check):
        f.cache_clear()


@cache
def _families(cloud: str) -> frozenset[str]:
    return frozenset(family(cloud, t) for t in load().get(cloud, {}).get("types", ()))


@cache
def _types(cloud: str) -> frozenset[str]:
    return frozenset(load().get(cloud, {}).get("types", ()))


def unknown_type(cloud: str, machine: str) -> str | None:
    """Why ``machine`` is not a type of ``cloud``, or None (known, custom, or of a family the catalog lacks)."""
    part = load().get(cloud)
    if not part or machine in _types(cloud) or (cloud == "gcp" and is_custom(machine)):
        return None
    fam = family(cloud, machine)
    families = _families(cloud)
    # EC2 names are FAMILY.SIZE; Compute Engine's are lowercase words joined by '-', never a '.' (every
    # name in the catalog's exports, tools/refresh_catalog.py): either cloud's shape on the other is a mistake.
    malformed = "." not in machine if cloud == "aws" else "." in machine
    if cloud == "gcp" and malformed:
        other = "an EC2 instance type (AWS)" if machine in _types("aws") else "not a Compute Engine name (they have no '.')"
        return (f"unknown machine type {machine!r}: {other}; a GCP stack names a Compute Engine machine type, e.g. "
                "'g2-standard-8' (1 x L4); `spotctl catalog --cloud gcp` lists the GPU types")
    what = "instance type" if cloud == "aws" else "machine type"
    if not malformed and not SHAPES[cloud].fullmatch(machine):
        lower = machine.lower()
        if lower != machine and (lower in _types(cloud) or SHAPES[cloud].fullmatch(lower)):
            return (f"unknown {what} {machine!r}: {'EC2' if cloud == 'aws' else 'Compute Engine'}'s names are "
                    f"lowercase; did you mean {lower!r}?")
        hint = did_you_mean(cloud, machine)
        return f"unknown {what} {machine!r}: not the shape of one ({SHAPE_WORDS[cloud]}){'; ' + hint if hint else ''}"
    if fam not in families and not malformed:
        return None  # (well-formed, of a family newer than the catalog: ``unlisted`` says so, as a warning)
    sizes = sorted(t for t in part["types"] if family(cloud, t) == fam)
    hint = did_you_mean(cloud, machine) or (
        f"{fam} types: {', '.join(sizes[:8])}{', ...' if len(sizes) > 8 else ''}" if fam in families
        else SHAPE_WORDS["aws"])
    return f"unknown {what} {machine!r} ({hint}); `spotctl catalog` lists the GPU types"


def unlisted(cloud: str, machine: str) -> str | None:
    """Why a well-formed ``machine`` of a family the catalog does not list is not checked, or None:
    never refused (the catalog may be older than the cloud), never silent."""
    if not load().get(cloud) or machine in _types(cloud) or (cloud == "gcp" and is_custom(machine)) \
            or unknown_type(cloud, machine):
        return None
    hint = did_you_mean(cloud, machine)
    return (f"{machine!r} is not in spotctl's catalog: not checked (GPUs, regions) and not priced unless "
            f"spotctl:prices has it{'; ' + hint if hint else ''}")


def _gpu_key(name: str) -> tuple[str, int | None]:
    """('a10g', None) of 'nvidia-a10g' and of AWS 'A10G'; ('a100', 80) of 'nvidia-a100-80gb'."""
    key = name.lower().replace(" ", "-").removeprefix("nvidia-").removeprefix("tesla-")
    m = re.fullmatch(r"(.+?)-(\d+)gb", key)
    return (m.group(1), int(m.group(2))) if m else (key, None)


def _aws_gpu_problem(machine: str, entry: dict | None, gpu: str | None, count: int | None) -> str | None:
    if gpu is None:
        return None
    if entry is None:
        return f"{machine} has no GPUs: leave accelerator out, or pick a GPU instance type (`spotctl catalog --cloud aws`)"
    g = entry["gpu"]
    want, size = _gpu_key(gpu)
    have_gb = g["memoryGiB"] * 1.073741824
    has = f"{g['count']} x {g['name']} ({g['memoryGiB']:g} GiB each)" if g["count"] else f"a part of one {g['name']}"
    same_name = want == _gpu_key(g["name"])[0]
    same_size = size is None or any(abs(size - v) <= 0.08 * v for v in (g["memoryGiB"], have_gb))
    if not (same_name and same_size):
        return f"{machine} comes with {has}, not {gpu!r}: set accelerator {{type: nvidia-{_gpu_key(g['name'])[0]}, count: {g['count']}}} or leave it out"
    if g["count"] and count != g["count"]:
        return f"{machine} comes with {has}, not {count}: set accelerator count {g['count']}"
    return None


def _where(cloud: str, machine: str, entry: dict, region: str, zones: list[str]) -> list[str]:
    """What is wrong with running ``machine`` (a catalog entry) in ``region``'s ``zones``."""
    offered = entry.get("regions", {})
    if region not in offered:
        if not _region_read(cloud, region):
            return []  # the catalog has read no offerings there: unknown
        others = sorted(offered)
        return [f"{machine} is not offered in region {region} ({_source(cloud)}); regions that offer it: "
                f"{', '.join(others) if others else 'none read'}"]
    there = offered[region]["zones"]
    if there == UNKNOWN:
        return []
    missing = [z for z in zones if z not in there]
    return [f"{machine} is not offered in zone {', '.join(missing)} ({_source(cloud)}); zones of {region} that offer it: "
            f"{', '.join(there)}"] if missing else []


def _region_read(cloud: str, region: str) -> bool:
    """Whether the catalog read offerings in ``region`` (AWS: the regions asked; GCP: the export names every
    region, so one it lists anything in)."""
    part = load()[cloud]
    if cloud == "aws":
        return region in (part.get("regions") or {})
    return region in part.get("n1Regions", ()) or any(
        region in e.get("regions", {}) for e in (*part.get("gpu", {}).values(), *part.get("attachable", {}).values()))


def _source(cloud: str) -> str:
    src = load().get("sources", {}).get(cloud, {})
    return f"catalog of {src.get('date', '?')}"


def _zone_exists(cloud: str, region: str, zone: str) -> str | None:
    """A zone name ``region`` does not have. AWS: the catalog lists every AZ name seen there; GCP: the zone
    table of infra/contract/gcp_zones.py. A region neither lists is never refused."""
    if cloud == "aws":
        known = ((load().get("aws") or {}).get("regions") or {}).get(region)
        zones, pattern = (known["zones"] if known else None), re.escape(region) + r"[a-z]"
    else:
        zones, pattern = gcp_zones.zones_of(region), re.escape(region) + r"-[a-z]"
    if not zones or not re.fullmatch(pattern, zone) or zone in zones:
        return None
    return f"zone {zone!r} does not exist in region {region} (its zones: {', '.join(zones)})"


def check(cloud: str, region: str, machine: str, gpu: str | None, count: int | None, zones: list[str]) -> list[str]:
    """What the catalog says is wrong with ``machine`` (+ accelerator) in ``zones`` of ``region``: messages
    for the machine key (the caller names it); empty when nothing, or when the catalog cannot tell."""
    return list(_check(cloud, region, machine, gpu, count, tuple(zones)))


@cache  # (a stack of thousands of jobs asks about a handful of shapes)
def _check(cloud: str, region: str, machine: str, gpu: str | None, count: int | None, zones: tuple[str, ...]) -> tuple[str, ...]:
    return tuple(_problems_of(cloud, region, machine, gpu, count, list(zones)))


def _problems_of(cloud: str, region: str, machine: str, gpu: str | None, count: int | None, zones: list[str]) -> list[str]:
    part = load().get(cloud)
    if not part:
        return []
    bad = unknown_type(cloud, machine)
    if bad:
        return [bad]
    if machine not in _types(cloud):
        return []
    if cloud == "aws":
        entry = part["gpu"].get(machine)
        gpu_bad = _aws_gpu_problem(machine, entry, gpu, count)
        return [gpu_bad] if gpu_bad else (_where(cloud, machine, entry, region, zones) if entry else [])
    entry = part["gpu"].get(machine)
    if entry is not None:
        return _where(cloud, machine, entry, region, zones)
    acc = part["attachable"].get(gpu or "")
    if acc is not None and family(cloud, machine) == "n1":
        return _where(cloud, f"{gpu} (attached to {machine})", acc, region, zones)
    return []


def _mixed_pool_gpu(types: list[str], acc: Any) -> str | None:
    """An AWS pool of several instance types names one accelerator (what its VMs offer): it must be what at
    least one of the types comes with; every type's own GPUs are shown when none does."""
    gpu_types = load().get("aws", {}).get("gpu", {})
    entries = [(t, gpu_types.get(t)) for t in types if t in load().get("aws", {}).get("types", ())]
    if acc is None or not entries or any(_aws_gpu_problem(t, e, acc.type, acc.count) is None for t, e in entries):
        return None
    has = "; ".join(f"{t}: {e['gpu']['count']} x {e['gpu']['name']}" if e else f"{t}: no GPU" for t, e in entries)
    return f"{acc.count} x {acc.type!r} is what none of the pool's instance types comes with ({has})"


def _machines(cfg: Any, bad_zones: set[str]) -> list[tuple[str, str, str | None, Any, list[str]]]:
    """(key, whose, machine, accelerator, zones) of every pool's and job's machine type."""
    gcp = cfg.cloud == "gcp"
    zones = [z for z in cfg.zones if z not in bad_zones]
    items = [(f"pools[{i}].machineType", f"pool {p.name}", p.machine_type, p.accelerator, zones)
             for i, p in enumerate(cfg.pools)] if gcp else [
        (f"pools[{i}].instanceTypes[{k}]", f"pool {p.name}", t, p.accelerator if len(p.instance_types or ()) == 1 else None, zones)
        for i, p in enumerate(cfg.pools) for k, t in enumerate(p.instance_types or [])]
    return items + [(f"jobs[{i}].{'machineType' if gcp else 'instanceType'}", f"job {j.id}",
                     j.machine_type if gcp else j.instance_type, j.accelerator, [j.zone] if j.zone not in bad_zones else [])
                    for i, j in enumerate(cfg.jobs)]


def problems(cfg: Any, out: list[tuple[str, str]]) -> None:
    """Append (key, message) for every zone, job and pool machine the catalog refuses (``infra.config``)."""
    bad_zones = set()
    for i, zone in enumerate(cfg.zones):
        if bad := _zone_exists(cfg.cloud, cfg.region, zone):
            out.append((f"zones[{i}]", bad))
            bad_zones.add(zone)
    if cfg.cloud != "gcp":
        out += [(f"pools[{i}].accelerator", bad) for i, p in enumerate(cfg.pools)
                if len(p.instance_types or ()) > 1 and (bad := _mixed_pool_gpu(p.instance_types, p.accelerator))]
    for key, _, machine, acc, where in _machines(cfg, bad_zones):
        if machine:
            out += [(key, m) for m in check(cfg.cloud, cfg.region, machine, acc.type if acc else None,
                                            acc.count if acc else None, where)]


def warnings(cfg: Any) -> list[str]:
    """What ``spotctl validate`` and ``launch`` warn of a valid stack's machine types: the well-formed ones
    the catalog does not list (``unlisted``), by key and job or pool."""
    return [f"spotctl:{key}: {whose}: {note}" for key, whose, machine, _, _ in _machines(cfg, set())
            if machine and (note := unlisted(cfg.cloud, machine))]


def gpu_matches(wanted: str, name: str, memory: float | None = None) -> bool:
    """``--gpu h100`` matches 'nvidia-h100-80gb' and AWS 'H100'; 'a100-80gb' only A100s known to have 80 GB
    (by the name, else by ``memory``)."""
    want, size = _gpu_key(wanted)
    have, have_size = _gpu_key(name)
    if want not in have:
        return False
    known = have_size if have_size is not None else memory
    return size is None or (known is not None and abs(known - size) <= 0.08 * size)


def offers(cloud: str | None = None, gpu: str | None = None, region: str | None = None, zone: str | None = None) -> list[dict]:
    """One row per GPU machine type and region it is offered in (N1's attachable GPUs as ``n1-*``),
    filtered; ``zones`` is a list or ``"unknown"``. Sorted by cloud, GPU, count, type, region."""
    rows = []
    if zone and not region:
        region = zone[:-1] if re.fullmatch(r".*[0-9][a-z]", zone) else zone.rsplit("-", 1)[0]
    data = load()
    for c in ("aws", "gcp"):
        if cloud not in (None, c) or c not in data:
            continue
        entries = [(name, e["gpu"] or {}, e) for name, e in data[c]["gpu"].items()]
        if c == "gcp":
            entries += [("n1-*", {"type": acc, "count": "/".join(map(str, e["counts"])), "memoryGB": e["memoryGB"]}, e)
                        for acc, e in data[c]["attachable"].items()]
        for name, g, e in entries:
            gpu_name = g.get("name") or g.get("type")  # None: a type spotctl's GPU table does not know
            if gpu and not (gpu_name and gpu_matches(gpu, gpu_name, g.get("memoryGiB") or g.get("memoryGB"))):
                continue
            for r, where in sorted(e["regions"].items()):
                zones = where["zones"]
                if (region and r != region) or (zone and zones != UNKNOWN and zone not in zones):
                    continue
                unit = "GiB" if c == "aws" else "GB"  # as each source states it (EC2: MiB; GCE: GB)
                rows.append({"cloud": c, "type": name, "gpu": gpu_name, "count": g.get("count"),
                             f"gpuMemory{unit}": g.get(f"memory{unit}"), "vcpus": e.get("vcpus"),
                             f"memory{unit}": e.get(f"memory{unit}"), "region": r, "zones": zones})
    return sorted(rows, key=lambda x: (x["cloud"], x["gpu"] or "", str(x["count"]), x["type"], x["region"]))


def machine_gpu(cloud: str, machine: str) -> tuple[str, int] | None:
    """The accelerator type and count ``machine`` comes with as a stack names it (GCP: the catalog's type;
    AWS: nvidia-NAME of EC2's GPU name), or None (no GPUs, unknown, or a part of one GPU)."""
    entry = (load().get(cloud, {}).get("gpu") or {}).get(machine)
    g = (entry or {}).get("gpu")
    if not g or not isinstance(g.get("count"), int) or g["count"] < 1:
        return None
    return (g["type"], g["count"]) if cloud == "gcp" else (f"nvidia-{_gpu_key(g['name'])[0]}", g["count"])


def gpu_type(cloud: str, machine: str | None, name: str) -> str:
    """A GPU as ``--gpus`` gives it, as a stack names it: 'l4' -> 'nvidia-l4', 'a100' on a2-highgpu-1g ->
    'nvidia-tesla-a100' (the machine's own GPU when the short name matches it, else the catalog's
    accelerator types); a name it cannot place is returned as given (validate then says what is wrong)."""
    if machine and (own := machine_gpu(cloud, machine)) and gpu_matches(name, own[0]):
        return own[0]
    part = load().get(cloud, {})
    known = {g["gpu"]["type"] for g in (part.get("gpu") or {}).values() if g.get("gpu") and g["gpu"].get("type")}
    known |= set(part.get("attachable") or {})
    if name in known:
        return name
    want = _gpu_key(name)
    exact = sorted(t for t in known if _gpu_key(t) == want or _gpu_key(t)[0] == want[0] and want[1] is None
                   and _gpu_key(t)[1] is None)
    return exact[0] if len(exact) == 1 else name
