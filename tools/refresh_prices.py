"""Refresh spotctl's shipped price table (``cli/cost/prices.json``) from public, dated price data.

AWS: SkyPilot's public catalog. The catalog (github.com/skypilot-org/skypilot-catalog, ``catalogs/v7/aws/vms.csv``) is rebuilt by
its maintainers from the AWS Price List API (column ``Price``: the on-demand Linux list price) and
EC2 spot price history (column ``SpotPrice``: one price per availability zone). For each instance
type and region we keep the on-demand price and the mean of the zones' spot prices (zones without
a spot price are skipped) and write them with the catalog's name and the date read.

    uv run python tools/refresh_prices.py --catalog vms.csv --commit 001367d2 \
        --types g5.2xlarge g5.4xlarge --regions us-east-1 us-west-2

GCP (``--gcp-pricing``; without ``--catalog`` only GCP is refreshed and nothing else is fetched):
SkyPilot's GCP catalog prices a GPU machine type's GPUs in separate rows, so its machine row alone
is not the price. We read instead ``pricing.yml`` of
github.com/Cyclenerd/google-cloud-pricing-cost-calculator (Apache-2.0), which its build computes
from the Cloud Billing Catalog API SKUs per machine type and region: attached GPUs + predefined
vCPUs + memory + bundled Local SSD (``hour`` on-demand, ``hour_spot`` Spot; the same sum Google's
page states: "billed for their attached GPUs, predefined vCPU, memory, and bundled Local SSD",
cloud.google.com/compute/docs/accelerator-optimized-machines). The machine price is that sum as
the file gives it, rounded to 6 decimals; the date is the file's ``generated`` date.

    uv run python tools/refresh_prices.py --catalog vms.csv --commit 001367d2 \
        --gcp-pricing pricing.yml --gcp-commit fd66b26

Snapshot storage ($/GB-month, what a ``spotctl move`` leaves behind), under ``snapshotStorage``:
GCP from the same file (``compute.storage.snapshot``): a snapshot spotctl declares names no storage
location, so it lands in the project's default, the nearest multi-region (Compute Engine API
``SnapshotSettings.StorageLocationSettings``: NEAREST_MULTI_REGION; terraform-provider-google #6941),
hence the ``us-multi`` / ``europe-multi`` / ``asia-multi`` row for a region of that continent
(cloud.google.com/compute/pricing-announce: $0.065 per GB-month in the US multi-region since
2023-04-01). AWS: ``AWS_SNAPSHOT`` below, the EBS User Guide's standard rate.
"""

from __future__ import annotations

import argparse
import csv
import io
import json
import sys
import urllib.error
import urllib.request
from datetime import UTC, datetime
from pathlib import Path

from infra.basics import counted

ROOT = Path(__file__).resolve().parent.parent
TABLE = ROOT / "cli" / "cost" / "prices.json"
CATALOG_URL = "https://raw.githubusercontent.com/skypilot-org/skypilot-catalog/master/catalogs/v7/aws/vms.csv"
GCP_PRICING_URL = "https://raw.githubusercontent.com/Cyclenerd/google-cloud-pricing-cost-calculator/master/pricing.yml"
# docs.aws.amazon.com/ebs/latest/userguide/snapshot-archive-pricing.html: "the snapshot is billed at the
# standard rate for snapshots of $0.05 per GB-month" (read 2026-11-22). The guide names no region; its
# prices are US East (N. Virginia)'s, so only us-east-1 gets it (other regions: not sourced here).
AWS_SNAPSHOT = {"us-east-1": {
    "perGbMonth": 0.05, "location": "the volume's region (standard tier)", "date": "2026-11-22",
    "source": "docs.aws.amazon.com/ebs/latest/userguide/snapshot-archive-pricing.html (standard rate for snapshots)",
}}
MULTI_REGION = {"us": "us-multi", "northamerica": "us-multi", "europe": "europe-multi", "asia": "asia-multi"}


class SourceError(Exception):
    """A price source that cannot be read: one line naming it, for the user."""


def read_catalog(where: str) -> str:
    """The text of a local file or an https URL; SourceError (naming ``where``) when it cannot be read."""
    try:
        if where.startswith("https://"):
            with urllib.request.urlopen(where, timeout=60) as resp:  # noqa: S310 (a fixed https URL or the user's)
                return resp.read().decode()
        return Path(where).read_text()
    except UnicodeDecodeError:
        raise SourceError(f"{where}: not UTF-8 text (a price catalog is CSV or YAML text)") from None
    except urllib.error.URLError as exc:  # (before OSError, its base: the reason is in .reason)
        raise SourceError(f"{where}: cannot download: {exc.reason}") from None
    except OSError as exc:
        raise SourceError(f"{where}: cannot read: {exc.strerror or exc}") from None


def aws_entries(text: str, types: set[str], regions: set[str], source: str, date: str) -> dict[str, dict[str, dict]]:
    """{region: {type: {onDemand, spot, zones, source, date}}} from a catalog's CSV text."""
    found: dict[tuple[str, str], tuple[float, list[float]]] = {}
    rows = csv.DictReader(io.StringIO(text))
    if not {"Region", "InstanceType", "Price", "SpotPrice"} <= set(rows.fieldnames or ()):
        raise SourceError("not a catalog vms.csv (no Region, InstanceType, Price and SpotPrice columns)")
    for row in rows:
        key = (row["Region"], row["InstanceType"])
        if key[1] not in types or key[0] not in regions or not row["Price"]:
            continue
        od, spots = found.setdefault(key, (float(row["Price"]), []))
        if row["SpotPrice"]:
            spots.append(float(row["SpotPrice"]))
    out: dict[str, dict[str, dict]] = {}
    for (region, itype), (od, spots) in sorted(found.items()):
        if not spots:
            continue  # no spot price anywhere in the region: nothing to compare
        out.setdefault(region, {})[itype] = {
            "onDemand": od, "spot": round(sum(spots) / len(spots), 5), "zones": len(spots), "source": source, "date": date,
        }
    return out


def gcp_entries(text: str, types: set[str], regions: set[str], source: str) -> tuple[dict[str, dict[str, dict]], dict[str, dict]]:
    """({region: {type: {onDemand, spot, source, date}}}, {region: snapshot storage}) from pricing.yml text.

    A type or region the file prices at 0 (its build's "a GPU SKU is missing here") is left out."""
    import yaml

    try:
        doc = yaml.load(text, Loader=getattr(yaml, "CSafeLoader", yaml.SafeLoader))
        date = datetime.strptime(" ".join(str(doc["about"]["generated"]).split()), "%a %b %d %H:%M:%S %Y").date().isoformat()
        instances, snap_costs = doc["compute"]["instance"], doc["compute"]["storage"]["snapshot"]["cost"]
    except (yaml.YAMLError, TypeError, KeyError, ValueError) as exc:
        raise SourceError(f"not a pricing.yml ({type(exc).__name__}: {exc})") from None
    out: dict[str, dict[str, dict]] = {}
    for itype in sorted(types & set(instances)):
        for region in sorted(regions):
            cost = instances[itype]["cost"].get(region) or {}
            od, spot = cost.get("hour"), cost.get("hour_spot")
            if not od or not spot:
                continue
            out.setdefault(region, {})[itype] = {
                "onDemand": round(float(od), 6), "spot": round(float(spot), 6), "date": date,
                "source": f"{source}: compute.instance.{itype}.cost.{region} hour / hour_spot "
                          "(Cloud Billing Catalog SKUs: GPUs + vCPUs + memory + bundled Local SSD)",
            }
    snapshots = {}
    for region in sorted(regions):
        multi = MULTI_REGION.get(region.split("-")[0])
        price = (snap_costs.get(multi) or {}).get("month") if multi else None
        if price:
            snapshots[region] = {"perGbMonth": float(price), "location": f"{multi} (the default: nearest multi-region)",
                                 "date": date, "source": f"{source}: compute.storage.snapshot.cost.{multi}.month"}
    return out, snapshots


# The other sizes of the GCP examples' GPU families (G2: L4, A2: A100, A3 high: H100), so a job that
# launches another size in the examples' region is priced too (`spotctl catalog --cloud gcp` lists them).
GCP_FAMILY_SIZES = {
    *(f"g2-standard-{n}" for n in (4, 8, 12, 16, 24, 32, 48, 96)),
    *(f"a2-highgpu-{n}g" for n in (1, 2, 4, 8)), "a2-megagpu-16g", *(f"a2-ultragpu-{n}g" for n in (1, 2, 4, 8)),
    *(f"a3-highgpu-{n}g" for n in (1, 2, 4, 8)),
}


def example_types() -> dict[str, tuple[set[str], set[str]]]:
    """{cloud: (machine or instance types, regions)} of the example stacks (what the table must cover)."""
    import yaml

    found: dict[str, tuple[set[str], set[str]]] = {"aws": (set(), set()), "gcp": (set(), set())}
    for path in sorted((ROOT / "stacks").glob("Pulumi.*.yaml")):
        config = (yaml.safe_load(path.read_text()) or {}).get("config", {})
        cloud = config.get("spotctl:cloud")
        if cloud not in found:
            continue
        types, regions = found[cloud]
        regions.add(config["spotctl:region"])
        key = "instanceType" if cloud == "aws" else "machineType"
        for job in config.get("spotctl:jobs", []):
            types.add(job.get(key))
        for pool in config.get("spotctl:pools", []):
            types.update(pool.get("instanceTypes") or [pool.get("machineType")])
    return {cloud: ({t for t in types if t}, regions) for cloud, (types, regions) in found.items()}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--catalog", help="AWS: vms.csv path or URL (default: the catalog on GitHub, unless only "
                    "--gcp-pricing is given: then AWS is not refreshed)")
    ap.add_argument("--commit", default="master", help="the catalog commit read (named in each entry's source)")
    ap.add_argument("--date", default=datetime.now(UTC).date().isoformat(), help="date the catalog was read")
    ap.add_argument("--types", nargs="*", help="instance types (default: those of the AWS example stacks)")
    ap.add_argument("--regions", nargs="*", help="regions (default: those of the AWS example stacks)")
    ap.add_argument("--gcp-pricing", metavar="PATH_OR_URL", help="GCP: Cyclenerd's pricing.yml (path or URL; "
                    f"the current one is {GCP_PRICING_URL}); without --catalog, only GCP is refreshed")
    ap.add_argument("--gcp-commit", default="master", help="the pricing.yml commit read (named in each entry's source)")
    ap.add_argument("--gcp-types", nargs="*", help="GCP machine types (default: those of the GCP example stacks and "
                    "the other sizes of their GPU families)")
    ap.add_argument("--gcp-regions", nargs="*", help="GCP regions (default: those of the GCP example stacks)")
    ap.add_argument("--out", type=Path, default=TABLE)
    args = ap.parse_args(argv)
    try:
        return refresh(args)
    except SourceError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1


def named(where: str, parse):
    """``parse`` of the source's text; a source that is not what it should be is named in the error."""
    text = read_catalog(where)
    try:
        return parse(text)
    except SourceError as exc:
        raise SourceError(f"{where}: {exc}") from None


def refresh(args: argparse.Namespace) -> int:
    """Read the sources asked for (AWS unless only --gcp-pricing was given), then write the table."""
    examples = example_types()
    types, regions = set(args.types or examples["aws"][0]), set(args.regions or examples["aws"][1])
    source = f"skypilot-org/skypilot-catalog catalogs/v7/aws/vms.csv @{args.commit} (AWS Price List on-demand; spot = mean over the region's zones)"
    aws = args.catalog is not None or not args.gcp_pricing
    entries = named(args.catalog or CATALOG_URL, lambda text: aws_entries(text, types, regions, source, args.date)) if aws else {}
    table = json.loads(args.out.read_text()) if args.out.exists() else {}
    for region, by_type in entries.items():
        table.setdefault("aws", {}).setdefault(region, {}).update(by_type)
    snapshots = table.setdefault("snapshotStorage", {})
    missing = {}
    if aws:
        snapshots.setdefault("aws", {}).update({r: e for r, e in AWS_SNAPSHOT.items() if r in regions})
        missing["AWS"] = types - {t for v in entries.values() for t in v}
    written = sum(len(v) for v in entries.values())
    if args.gcp_pricing:
        gtypes = set(args.gcp_types or examples["gcp"][0] | GCP_FAMILY_SIZES)
        gregions = set(args.gcp_regions or examples["gcp"][1])
        gsource = f"Cyclenerd/google-cloud-pricing-cost-calculator pricing.yml @{args.gcp_commit}"
        gcp, gsnap = named(args.gcp_pricing, lambda text: gcp_entries(text, gtypes, gregions, gsource))
        for region, by_type in gcp.items():
            table.setdefault("gcp", {}).setdefault(region, {}).update(by_type)
        snapshots.setdefault("gcp", {}).update(gsnap)
        written += sum(len(v) for v in gcp.values())
        missing["GCP"] = gtypes - {t for v in gcp.values() for t in v}
    args.out.write_text(json.dumps(table, indent=2, sort_keys=True) + "\n")
    print(f"{counted(written, 'price')} written to {args.out}")
    for cloud, names in missing.items():
        if names:
            print(f"{cloud}: not priced in the source for the regions asked: {', '.join(sorted(names))}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
