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
        "zone names differ per account; GCP's source lists offers per region, not zone). "
        "`spotctl validate` checks stacks against the same catalog.\n\n"
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


COLUMNS = (("type", "left"), ("GPUs", "left"), ("vCPU", "right"), ("region", "left"), ("zones", "left"),
           ("spot $/h", "right"), ("od $/h", "right"))


def _print(rows: list[dict], sources: dict) -> None:
    import shutil

    # 80 columns by design (vCPU goes first, then the GPUs and zones wrap); wider when the terminal is.
    width = max(80, shutil.get_terminal_size((80, 24)).columns)
    full = _whole_gpu_memory(rows)
    cells = []
    for r in rows:
        unit = "GiB" if r["cloud"] == "aws" else "GB"
        memory = r.get(f"gpuMemory{unit}")
        whole = full.get((r["cloud"], r["gpu"])) if r["count"] == 0 else None
        count = _count(r["count"] if whole is None or not memory else memory / whole)
        gpus = "?" if r["count"] is None else f"{count} x {_gpu_name(r['gpu'], whole or memory, unit)}"
        zones = "?" if r["zones"] == "unknown" else " ".join(z.removeprefix(r["region"]).lstrip("-") for z in r["zones"])
        cells.append((r["type"], gpus, str(r["vcpus"] or ""), r["region"], zones, _money(r["spot"]), _money(r["onDemand"])))
    for line in table_lines(cells, width):
        typer.echo(line)
    for cloud in sorted({r["cloud"] for r in rows}):
        src = sources.get(cloud, {})
        typer.echo(f"{cloud}: catalog of {src.get('date')}, read {src.get('read')} (its sources: --json)")
    if any(r["cloud"] == "gcp" and r["zones"] == "unknown" for r in rows):
        typer.echo("gcp zones \"?\": some of the region's zones (the source lists regions, not zones);\n"
                   "  `spotctl validate` still refuses a zone the region does not have")


def table_lines(cells: list[tuple[str, ...]], width: int) -> list[str]:
    """The rows under COLUMNS in at most ``width`` columns: vCPU dropped when all do not fit, then the GPUs
    and zones cells wrap (at least 14 and 5 wide); a type, region or price is never cut."""
    import textwrap

    shown = list(range(len(COLUMNS)))
    natural = [max(len(COLUMNS[i][0]), *(len(c[i]) for c in cells)) for i in shown]
    if sum(natural) + 2 * (len(shown) - 1) > width:
        shown.remove(2)  # vCPU: the type names it; money and places are what the list is for
    widths = {i: natural[i] for i in shown}
    gap = 2
    for i, least in ((1, 14), (4, 5)):  # the GPUs give way first, then the zones
        over = sum(widths.values()) + gap * (len(shown) - 1) - width
        if over > 0:
            widths[i] = max(min(least, natural[i]), widths[i] - over)
    if sum(widths.values()) + gap * (len(shown) - 1) > width:
        gap = 1
        over = sum(widths.values()) + gap * (len(shown) - 1) - width
        widths[1] = max(min(8, natural[1]), widths[1] - max(over, 0))  # ("8 x A100" above "40GiB")
    out = []
    for row in [tuple(name for name, _ in COLUMNS), *cells]:
        parts = {i: textwrap.wrap(row[i], widths[i], break_on_hyphens=False) or [""] if i in (1, 4) else [row[i]] for i in shown}
        for n in range(max(len(p) for p in parts.values())):
            line = [(parts[i][n] if n < len(parts[i]) else "") for i in shown]
            out.append((" " * gap).join(v.rjust(widths[i]) if COLUMNS[i][1] == "right" else v.ljust(widths[i])
                                        for i, v in zip(shown, line, strict=True)).rstrip())
    return out


def _whole_gpu_memory(rows: list[dict]) -> dict[tuple[str, str], float]:
    """Per (cloud, GPU): the memory of one whole GPU, from the types with whole GPUs. EC2 reports a part of a
    GPU (g6f: "fractional GPU" L4) as count 0 with the part's memory (DescribeInstanceTypes GpuInfo), so
    that memory over a whole one's is the part (2.79 / 22.35 GiB: 1/8)."""
    out: dict[tuple[str, str], float] = {}
    for r in rows:
        unit = "GiB" if r["cloud"] == "aws" else "GB"
        memory = r.get(f"gpuMemory{unit}")
        if isinstance(r["count"], int) and r["count"] >= 1 and memory:
            out[(r["cloud"], r["gpu"])] = max(out.get((r["cloud"], r["gpu"]), 0.0), memory)
    return out


def _count(count) -> str:
    """8, "1/2/4" (N1's choices), or "1/8" for a part of one GPU (G4's and g6f's small types)."""
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
