"""``spotctl catalog`` (alias ``show-gpus``): the GPU machine types that exist, where, at what list price."""

from typing import Annotated, Optional

import typer

from cli.commands import CloudName, JsonOpt, app, fail

GpuOpt = Annotated[Optional[str], typer.Option("--gpu", metavar="NAME", help="Only this GPU model (h100, a10g, nvidia-l4, a100-80gb).")]
RegionOpt = Annotated[Optional[str], typer.Option("--region", metavar="REGION", help="Only this region.")]
ZoneOpt = Annotated[Optional[str], typer.Option("--zone", metavar="ZONE", help="Only this zone (and where the catalog does not know the zones).")]
CloudOpt = Annotated[Optional[CloudName], typer.Option("--cloud", help="Only this cloud.")]
HELP = ("List GPU machine types from spotctl's shipped catalog: GPUs (model, count, memory), vCPUs, the regions and "
        "zones that offer them, and the list price per hour (spot and on-demand) from the shipped price table "
        "(\"-\": not priced there). Zones: letters of the region's zones, \"?\" where the catalog cannot tell (AWS "
        "zone names differ per account). `spotctl validate` checks stacks against the same catalog.\n\n"
        "Example: spotctl catalog --gpu h100 --region us-central1")


def catalog(cloud: CloudOpt = None, gpu: GpuOpt = None, region: RegionOpt = None, zone: ZoneOpt = None,
            json_out: JsonOpt = False) -> None:
    import json

    from cli.cost.prices import shipped_table
    from infra import catalog as cat

    rows = cat.offers(cloud.value if cloud else None, gpu, region, zone)
    prices = shipped_table()
    for row in rows:
        p = prices.get(row["cloud"], {}).get(row["region"], {}).get(row["type"])
        row["spot"], row["onDemand"] = (p["spot"], p["onDemand"]) if p else (None, None)
        row["priceDate"] = p["date"] if p else None
    if json_out:
        typer.echo(json.dumps({"sources": cat.load().get("sources", {}), "offers": rows}, indent=1, sort_keys=True))
        return
    if not rows:
        asked = ", ".join(f"{k} {v}" for k, v in (("cloud", cloud and cloud.value), ("GPU", gpu), ("region", region),
                                                  ("zone", zone)) if v)
        raise fail(f"the catalog lists no GPU machine type for {asked} (`spotctl catalog` lists them all)")
    _print(rows, cat.load().get("sources", {}))


def _print(rows: list[dict], sources: dict) -> None:
    from rich.console import Console
    from rich.table import Table

    console = Console(width=80, highlight=False, soft_wrap=False)
    table = Table(box=None, pad_edge=False, padding=(0, 1), header_style="bold")
    for name, justify in (("type", "left"), ("GPUs", "left"), ("vCPU", "right"), ("region", "left"), ("zones", "left"),
                          ("spot $/h", "right"), ("od $/h", "right")):
        table.add_column(name, justify=justify, overflow="fold", no_wrap=name in ("type", "region"),
                         min_width=18 if name == "GPUs" else None)
    for r in rows:
        unit = "GiB" if r["cloud"] == "aws" else "GB"
        memory = r.get(f"gpuMemory{unit}")
        table_gpus = "?" if r["count"] is None else f"{_count(r['count'])} x {_gpu_name(r['gpu'], memory, unit)}"
        zones = "?" if r["zones"] == "unknown" else " ".join(z.removeprefix(r["region"]).lstrip("-") for z in r["zones"])
        table.add_row(r["type"], table_gpus, str(r["vcpus"] or ""), r["region"], zones, _money(r["spot"]), _money(r["onDemand"]))
    console.print(table)
    for cloud in sorted({r["cloud"] for r in rows}):
        src = sources.get(cloud, {})
        console.print(f"{cloud}: catalog of {src.get('date')}, read {src.get('read')} (its sources: --json)")


def _count(count) -> str:
    """8, "1/2/4" (N1's choices), or "1/8" for a part of one GPU (G4's small types)."""
    return f"1/{round(1 / count)}" if isinstance(count, float) and count < 1 else str(count)


def _gpu_name(gpu: str, memory: float | None, unit: str) -> str:
    """'h100 80GB' of nvidia-h100-80gb, 'A10G 22GiB' of AWS's A10G."""
    import re

    name = re.sub(r"-\d+gb$", "", gpu.removeprefix("nvidia-").removeprefix("tesla-"))
    return f"{name} {memory:.0f}{unit}" if memory else name


def _money(value: float | None) -> str:
    return "-" if value is None else f"{value:,.2f}"


app.command(name="catalog", short_help="GPU machine types, where they are offered, list prices.  "
            "Example: spotctl catalog --gpu h100", help=HELP)(catalog)
app.command(name="show-gpus", short_help="The same as `catalog`.  Example: spotctl show-gpus --gpu l4",
            help=HELP.replace("Example: spotctl catalog", "Example: spotctl show-gpus"))(catalog)
