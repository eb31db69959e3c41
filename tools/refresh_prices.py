"""Refresh spotctl's shipped price table (``cli/cost/prices.json``) from SkyPilot's public catalog.

The catalog (github.com/skypilot-org/skypilot-catalog, ``catalogs/v7/aws/vms.csv``) is rebuilt by
its maintainers from the AWS Price List API (column ``Price``: the on-demand Linux list price) and
EC2 spot price history (column ``SpotPrice``: one price per availability zone). For each instance
type and region we keep the on-demand price and the mean of the zones' spot prices (zones without
a spot price are skipped) and write them with the catalog's name and the date read.

    uv run python tools/refresh_prices.py --catalog vms.csv --commit 001367d2 \
        --types g5.2xlarge g5.4xlarge --regions us-east-1 us-west-2

GCP is not covered: the catalog prices a GPU machine type's GPUs in separate rows, so a machine
type's row alone is not its price (use ``spotctl:prices`` in the stack file, or the cloud's API).
"""

from __future__ import annotations

import argparse
import csv
import io
import json
import urllib.request
from datetime import UTC, datetime
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
TABLE = ROOT / "cli" / "cost" / "prices.json"
CATALOG_URL = "https://raw.githubusercontent.com/skypilot-org/skypilot-catalog/master/catalogs/v7/aws/vms.csv"


def read_catalog(where: str) -> str:
    if where.startswith("https://"):
        with urllib.request.urlopen(where, timeout=60) as resp:  # noqa: S310 (a fixed https URL or the user's)
            return resp.read().decode()
    return Path(where).read_text()


def aws_entries(text: str, types: set[str], regions: set[str], source: str, date: str) -> dict[str, dict[str, dict]]:
    """{region: {type: {onDemand, spot, zones, source, date}}} from a catalog's CSV text."""
    found: dict[tuple[str, str], tuple[float, list[float]]] = {}
    for row in csv.DictReader(io.StringIO(text)):
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


def example_types() -> tuple[set[str], set[str]]:
    """Instance types and regions of the AWS example stacks (what the table must cover)."""
    import yaml

    types, regions = set(), set()
    for path in sorted((ROOT / "stacks").glob("Pulumi.*.yaml")):
        config = (yaml.safe_load(path.read_text()) or {}).get("config", {})
        if config.get("spotctl:cloud") != "aws":
            continue
        regions.add(config["spotctl:region"])
        for job in config.get("spotctl:jobs", []):
            types.add(job.get("instanceType"))
        for pool in config.get("spotctl:pools", []):
            types.update(pool.get("instanceTypes") or [])
    return {t for t in types if t}, regions


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--catalog", default=CATALOG_URL, help="vms.csv path or URL (default: the catalog on GitHub)")
    ap.add_argument("--commit", default="master", help="the catalog commit read (named in each entry's source)")
    ap.add_argument("--date", default=datetime.now(UTC).date().isoformat(), help="date the catalog was read")
    ap.add_argument("--types", nargs="*", help="instance types (default: those of the AWS example stacks)")
    ap.add_argument("--regions", nargs="*", help="regions (default: those of the AWS example stacks)")
    ap.add_argument("--out", type=Path, default=TABLE)
    args = ap.parse_args(argv)
    types, regions = example_types()
    source = f"skypilot-org/skypilot-catalog catalogs/v7/aws/vms.csv @{args.commit} (AWS Price List on-demand; spot = mean over the region's zones)"
    entries = aws_entries(read_catalog(args.catalog), set(args.types or types), set(args.regions or regions), source, args.date)
    table = json.loads(args.out.read_text()) if args.out.exists() else {}
    for region, by_type in entries.items():
        table.setdefault("aws", {}).setdefault(region, {}).update(by_type)
    args.out.write_text(json.dumps(table, indent=2, sort_keys=True) + "\n")
    print(f"{sum(len(v) for v in entries.values())} prices written to {args.out}")
    missing = sorted(set(args.types or types) - {t for v in entries.values() for t in v})
    if missing:
        print(f"not in the catalog for {sorted(set(args.regions or regions))}: {', '.join(missing)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
