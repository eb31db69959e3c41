"""Rebuild spotctl's catalog of GPU machine types (``infra/catalog.json``) from the clouds' public APIs.

AWS (``--aws``, boto3, credentials as boto3 finds them; ``AWS_ENDPOINT_URL`` for a local stand-in):
EC2 ``DescribeInstanceTypes`` (every type's name; for GPU types vCPUs, memory and ``GpuInfo``) and
``DescribeInstanceTypeOfferings`` with ``LocationType=availability-zone-id`` and ``availability-zone`` per
region. An AZ *name* (``us-east-1a``) is mapped to a physical zone per account in the oldest regions
(docs.aws.amazon.com/global-infrastructure/latest/regions/az-ids.html: "the us-east-1a for your AWS
account might not be the same physical location as the us-east-1a for another AWS account"), so there
the catalog records names only where the type is offered in every AZ ID of the region (then every name
offers it), else ``"unknown"`` (spotctl does not refuse on it); the other regions map names uniformly.

GCP (``--gcp-project`` with the Compute Engine API, google-cloud-compute; ``--gcp-endpoint`` for a local
stand-in): ``machineTypes.aggregatedList`` and ``acceleratorTypes.aggregatedList`` give every machine
type and GPU per zone. Offline, ``--gcp-csv DIR`` reads the same lists as published by
github.com/Cyclenerd/google-cloud-pricing-cost-calculator (``tools/machinetyperegion.csv``,
``tools/acceleratortyperegion.csv``, exported with ``gcloud compute machine-types list`` /
``accelerator-types list``): per region, so zones are ``"unknown"`` there.

GPU models and counts of GCP's accelerator-optimized machine types come from spotctl's table
(``infra/contract/gcp.py``, itself sourced); N1's attachable GPUs likewise.

    uv run python tools/refresh_catalog.py --aws --regions us-east-1 us-west-2
    uv run python tools/refresh_catalog.py --gcp-csv google-cloud-pricing-cost-calculator/tools --gcp-commit 8bf3293
"""

from __future__ import annotations

import argparse
import csv
import io
import json
import sys
from datetime import UTC, datetime
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:  # run as a script from anywhere
    sys.path.insert(0, str(ROOT))

from infra.contract.gcp import ACCELERATOR_OPTIMIZED, N1_GPUS  # noqa: E402

CATALOG = ROOT / "infra" / "catalog.json"
AZ_IDS_DOC = "https://docs.aws.amazon.com/global-infrastructure/latest/regions/az-ids.html"
# The same page, "Regions with independently mapped Availability Zones": "In the following Regions, we
# independently map Availability Zones to codes for each AWS account. All other Regions use a uniform
# mapping." (US East (N. Virginia), US West (N. California), US West (Oregon), Asia Pacific (Singapore),
# Asia Pacific (Sydney), Asia Pacific (Tokyo), Europe (Ireland), South America (São Paulo), GovCloud (US-West)).
INDEPENDENT_AZ_REGIONS = frozenset({"us-east-1", "us-west-1", "us-west-2", "ap-southeast-1", "ap-southeast-2",
                                    "ap-northeast-1", "eu-west-1", "sa-east-1", "us-gov-west-1"})
# GPU memory per GPU (GB) of each GCE accelerator type: https://cloud.google.com/compute/docs/gpus, "General
# comparison chart" (page last updated 2026-04-14: "A4 (B200) 180 GB HBM3e", "N1 (P4) 8 GB GDDR5", ...).
GCP_GPU_MEMORY_GB = {
    "nvidia-gb300": 279, "nvidia-gb200": 186, "nvidia-b200": 180, "nvidia-h200-141gb": 141, "nvidia-h100-80gb": 80,
    "nvidia-h100-mega-80gb": 80, "nvidia-a100-80gb": 80, "nvidia-tesla-a100": 40, "nvidia-rtx-pro-6000": 96,
    "nvidia-l4": 24, "nvidia-tesla-t4": 16, "nvidia-tesla-p4": 8, "nvidia-tesla-v100": 16, "nvidia-tesla-p100": 16,
}
# Machine types the same page lists that spotctl's GPU table (infra/contract/gcp.py, what `plan` can build) does
# not: shown by `spotctl catalog`, still refused by `validate` until the table has them. G4's small types hold a
# part of one GPU ("g4-standard-6 ... GPU count 1/8").
GCP_MORE_GPUS = {
    "a3-edgegpu-8g": ("nvidia-h100-80gb", 8), "a3-edgegpu-8g-nolssd": ("nvidia-h100-80gb", 8),
    "a4x-maxgpu-4g-metal": ("nvidia-gb300", 4), "g4-standard-6": ("nvidia-rtx-pro-6000", 0.125),
    "g4-standard-12": ("nvidia-rtx-pro-6000", 0.25), "g4-standard-24": ("nvidia-rtx-pro-6000", 0.5),
}
GCP_GPU_MEMORY_SOURCE = "https://cloud.google.com/compute/docs/gpus (General comparison chart; page of 2026-04-14)"


class SourceError(Exception):
    """A source that cannot be read: one line naming it, for the user."""


def gpu_memory_gb(gpu: str) -> int | None:
    return GCP_GPU_MEMORY_GB.get(gpu)


# ---- AWS --------------------------------------------------------------------------------------------


def aws_catalog(ec2_for, regions: list[str]) -> dict:
    """The AWS part from EC2's answers; ``ec2_for(region)`` gives a boto3 EC2 client."""
    types: dict[str, dict] = {}
    for page in ec2_for(regions[0]).get_paginator("describe_instance_types").paginate():
        for it in page["InstanceTypes"]:
            types[it["InstanceType"]] = it
    if not types:
        raise SourceError("DescribeInstanceTypes returned no instance types")
    gpu: dict[str, dict] = {}
    for name, it in sorted(types.items()):
        gpus = (it.get("GpuInfo") or {}).get("Gpus") or []
        if not gpus:
            continue
        g = gpus[0]
        gpu[name] = {
            "vcpus": it["VCpuInfo"]["DefaultVCpus"], "memoryGiB": round(it["MemoryInfo"]["SizeInMiB"] / 1024, 2),
            "gpu": {"name": g["Name"], "maker": g.get("Manufacturer", ""), "count": sum(x["Count"] for x in gpus),
                    "memoryGiB": round(g["MemoryInfo"]["SizeInMiB"] / 1024, 2)},
            "regions": {},
        }
    zones_of: dict[str, dict] = {}
    for region in regions:
        ec2 = ec2_for(region)
        by_id = _offerings(ec2, "availability-zone-id", set(gpu))
        by_name = _offerings(ec2, "availability-zone", set(gpu))
        all_ids = sorted({z for zs in _offerings(ec2, "availability-zone-id", None).values() for z in zs})
        all_names = sorted({z for zs in _offerings(ec2, "availability-zone", None).values() for z in zs})
        if not all_ids:
            continue  # a region EC2 answers nothing for (not enabled, or not a region)
        zones_of[region] = {"zones": all_names, "zoneIds": all_ids}
        for name, ids in by_id.items():
            # A zone name is the same place in every account outside INDEPENDENT_AZ_REGIONS; inside, only a
            # type every AZ ID offers is known by name (every name then offers it).
            known = region not in INDEPENDENT_AZ_REGIONS or set(ids) == set(all_ids)
            gpu[name]["regions"][region] = {"zoneIds": sorted(ids),
                                            "zones": sorted(by_name.get(name, all_names)) if known else "unknown"}
    return {"types": sorted(types), "regions": zones_of, "gpu": gpu}


def _offerings(ec2, location_type: str, only: set[str] | None) -> dict[str, list[str]]:
    out: dict[str, list[str]] = {}
    for page in ec2.get_paginator("describe_instance_type_offerings").paginate(LocationType=location_type):
        for o in page["InstanceTypeOfferings"]:
            if only is None or o["InstanceType"] in only:
                out.setdefault(o["InstanceType"], []).append(o["Location"])
    return out


def aws_from_api(regions: list[str]) -> dict:
    import boto3
    import botocore.exceptions

    try:
        return aws_catalog(lambda region: boto3.client("ec2", region_name=region), regions)
    except (botocore.exceptions.BotoCoreError, botocore.exceptions.ClientError) as exc:
        raise SourceError(f"AWS EC2: {exc}") from None


# ---- GCP --------------------------------------------------------------------------------------------


def gcp_catalog(machines: list[tuple[str, float, float, str]], accelerators: list[tuple[str, str]], per_zone: bool) -> dict:
    """The GCP part from (machine type, vCPUs, memory GB, zone or region) rows and (accelerator type,
    zone or region) rows; ``per_zone``: the locations are zones (else regions: zones unknown)."""
    def region_of(location: str) -> str:
        return location.rsplit("-", 1)[0] if per_zone else location

    names = sorted({m[0] for m in machines})
    gpu: dict[str, dict] = {}
    for name, cpus, mem, location in machines:
        shape = ACCELERATOR_OPTIMIZED.get(name) or GCP_MORE_GPUS.get(name)
        if shape is None and name.split("-", 1)[0] not in ("a2", "a3", "a4", "a4x", "g2", "g4"):
            continue
        entry = gpu.setdefault(name, {
            "vcpus": int(cpus), "memoryGB": mem,
            "gpu": ({"type": shape[0], "count": shape[1], "memoryGB": gpu_memory_gb(shape[0])} if shape else None),
            "regions": {}})
        where = entry["regions"].setdefault(region_of(location), {"zones": [] if per_zone else "unknown"})
        if per_zone:
            where["zones"].append(location)
    attachable: dict[str, dict] = {}
    for acc, location in accelerators:
        if acc not in N1_GPUS:
            continue
        entry = attachable.setdefault(acc, {"counts": list(N1_GPUS[acc]), "memoryGB": gpu_memory_gb(acc), "regions": {}})
        where = entry["regions"].setdefault(region_of(location), {"zones": [] if per_zone else "unknown"})
        if per_zone:
            where["zones"].append(location)
    for entry in (*gpu.values(), *attachable.values()):
        for where in entry["regions"].values():
            if isinstance(where["zones"], list):
                where["zones"].sort()
    n1_regions = sorted({region_of(loc) for name, _, _, loc in machines if name.startswith("n1-")})
    return {"types": names, "gpu": dict(sorted(gpu.items())), "attachable": dict(sorted(attachable.items())),
            "n1Regions": n1_regions}


def gcp_from_csv(folder: Path) -> dict:
    """Cyclenerd's ``machinetyperegion.csv`` and ``acceleratortyperegion.csv`` (``;``-separated)."""
    machines = [(r["NAME"], float(r["CPUS"]), float(r["MEMORY_GB"]), r["ZONE"])
                for r in _csv(folder / "machinetyperegion.csv", {"NAME", "CPUS", "MEMORY_GB", "DEPRECATED", "ZONE"})
                if not r["DEPRECATED"]]
    accelerators = [(r["NAME"], r["ZONE"]) for r in _csv(folder / "acceleratortyperegion.csv", {"NAME", "ZONE"})]
    if not machines:
        raise SourceError(f"{folder / 'machinetyperegion.csv'}: no machine types")
    return gcp_catalog(machines, accelerators, per_zone=False)


def _csv(path: Path, columns: set[str]) -> list[dict]:
    try:
        text = path.read_text()
    except OSError as exc:
        raise SourceError(f"{path}: cannot read: {exc.strerror or exc}") from None
    rows = csv.DictReader(io.StringIO(text), delimiter=";")
    if not columns <= set(rows.fieldnames or ()):
        raise SourceError(f"{path}: not a gcloud export (columns {', '.join(sorted(columns))} expected)")
    return list(rows)


def gcp_from_api(project: str, endpoint: str | None) -> dict:
    """machineTypes.aggregatedList and acceleratorTypes.aggregatedList of ``project`` (per zone)."""
    from google.api_core import exceptions as gexc
    from google.cloud import compute_v1

    kwargs: dict = {}
    if endpoint:
        from google.api_core.client_options import ClientOptions
        from google.auth.credentials import AnonymousCredentials

        kwargs = {"credentials": AnonymousCredentials(), "transport": "rest", "client_options": ClientOptions(api_endpoint=endpoint)}
    try:
        machines = []
        for zone, scoped in compute_v1.MachineTypesClient(**kwargs).aggregated_list(project=project):
            for mt in scoped.machine_types:
                if not (mt.deprecated and mt.deprecated.state):
                    machines.append((mt.name, float(mt.guest_cpus), round(mt.memory_mb / 1024, 2), zone.removeprefix("zones/")))
        accelerators = []
        for zone, scoped in compute_v1.AcceleratorTypesClient(**kwargs).aggregated_list(project=project):
            accelerators += [(a.name, zone.removeprefix("zones/")) for a in scoped.accelerator_types]
    except gexc.GoogleAPICallError as exc:
        raise SourceError(f"GCP Compute Engine API: {exc.message or exc}") from None
    except Exception as exc:  # transport errors (refused, DNS) come as requests/urllib3 exceptions
        raise SourceError(f"GCP Compute Engine API at {endpoint or 'compute.googleapis.com'}: {type(exc).__name__}: "
                          f"{str(exc).splitlines()[0] if str(exc) else ''}") from None
    if not machines:
        raise SourceError(f"GCP Compute Engine API: project {project} lists no machine types")
    return gcp_catalog(machines, accelerators, per_zone=True)


# ---- main -------------------------------------------------------------------------------------------


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--aws", action="store_true", help="rebuild the AWS part from EC2 (boto3)")
    ap.add_argument("--regions", nargs="+", help="AWS regions to read offerings in (default: those already in the catalog)")
    ap.add_argument("--aws-source", help="what to name as the AWS source (default: the EC2 API and the date)")
    ap.add_argument("--gcp-project", help="rebuild the GCP part from the Compute Engine API of this project")
    ap.add_argument("--gcp-endpoint", help="the Compute Engine API's address (a local stand-in)")
    ap.add_argument("--gcp-csv", type=Path, metavar="DIR", help="rebuild the GCP part from gcloud's CSV exports in DIR")
    ap.add_argument("--gcp-commit", default="master", help="the commit of the CSV exports read (named in the source)")
    ap.add_argument("--date", help="how current the data read is (default: today, right for the APIs; for a published "
                    "export its own date)")
    ap.add_argument("--out", type=Path, default=CATALOG)
    args = ap.parse_args(argv)
    if not (args.aws or args.gcp_project or args.gcp_csv):
        ap.error("nothing to read: give --aws, --gcp-project or --gcp-csv")
    try:
        return refresh(args)
    except SourceError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1


def refresh(args: argparse.Namespace) -> int:
    try:
        table = json.loads(args.out.read_text()) if args.out.exists() else {}
    except (OSError, ValueError) as exc:
        raise SourceError(f"{args.out}: not a catalog ({exc})") from None
    sources = table.setdefault("sources", {})
    today = datetime.now(UTC).date().isoformat()
    if args.aws:
        regions = args.regions or sorted(table.get("aws", {}).get("regions", {})) or ["us-east-1"]
        table["aws"] = aws_from_api(regions)
        sources["aws"] = {"date": args.date or today, "read": today, "source": args.aws_source or
                          "AWS EC2 API DescribeInstanceTypes + DescribeInstanceTypeOfferings (availability-zone-id, "
                          f"availability-zone); in regions that map AZ names per account, zone names only where every AZ ID offers the "
                          f"type ({AZ_IDS_DOC})"}
    if args.gcp_project or args.gcp_csv:
        if args.gcp_csv:
            table["gcp"] = gcp_from_csv(args.gcp_csv)
            where = (f"github.com/Cyclenerd/google-cloud-pricing-cost-calculator @{args.gcp_commit} tools/machinetyperegion.csv "
                     "and tools/acceleratortyperegion.csv (gcloud compute machine-types / accelerator-types list, per region)")
        else:
            table["gcp"] = gcp_from_api(args.gcp_project, args.gcp_endpoint)
            where = "GCP Compute Engine API machineTypes.aggregatedList + acceleratorTypes.aggregatedList (per zone)"
        sources["gcp"] = {"date": args.date or today, "read": today, "source": f"{where}; GPU model and count per machine type: infra/contract/gcp.py "
                          f"(GPU_TABLE_SOURCE); GPU memory: {GCP_GPU_MEMORY_SOURCE}"}
    tmp = args.out.with_suffix(".tmp")
    tmp.write_text(json.dumps(table, indent=1, sort_keys=True) + "\n")
    tmp.replace(args.out)
    counts = {c: len(table[c]["gpu"]) for c in ("aws", "gcp") if c in table}
    print(f"{args.out}: " + ", ".join(f"{c}: {n} GPU machine types" for c, n in counts.items()))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
