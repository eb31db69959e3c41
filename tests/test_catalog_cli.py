"""`spotctl catalog` / `show-gpus`: the shipped catalog listed, filtered, priced, within 80 columns."""

from __future__ import annotations

import json

from cli.app import app


def test_the_listing_fits_80_columns_and_prices_from_the_shipped_table(runner):
    result = runner.invoke(app, ["catalog", "--cloud", "aws", "--region", "us-east-1", "--gpu", "a10g"])
    assert result.exit_code == 0, result.output
    lines = result.output.splitlines()
    assert max(map(len, lines)) <= 80
    assert lines[0].split() == ["type", "GPUs", "vCPU", "region", "zones", "spot", "$/h", "od", "$/h"]
    row = next(line for line in lines if line.startswith("g5.2xlarge "))
    # cli/cost/prices.json: us-east-1 g5.2xlarge spot 0.51652, on-demand 1.212
    assert row.split() == ["g5.2xlarge", "1", "x", "A10G", "22GiB", "8", "us-east-1", "?", "0.52", "1.21"]
    assert next(line for line in lines if line.startswith("g5.48xlarge ")).split()[-2:] == ["-", "-"]
    assert lines[-1].startswith("aws: catalog of 2026-10, read 2026-11-28")
    assert not any(line.startswith("p5") for line in lines)


def test_every_listing_fits_80_columns(runner):
    result = runner.invoke(app, ["catalog"])
    assert result.exit_code == 0
    assert max(map(len, result.output.splitlines())) <= 80 and len(result.output.splitlines()) > 1000


def test_filters_zone_and_gpu_and_the_alias(runner):
    result = runner.invoke(app, ["show-gpus", "--zone", "us-east-1c", "--gpu", "h100", "--json"])
    assert result.exit_code == 0, result.output
    doc = json.loads(result.output)
    assert {o["type"] for o in doc["offers"]} == {"p5.48xlarge", "p5.4xlarge"}
    assert all(o["region"] == "us-east-1" and "us-east-1c" in o["zones"] for o in doc["offers"])
    assert set(doc["sources"]) == {"aws", "gcp"}
    result = runner.invoke(app, ["catalog", "--cloud", "gcp", "--zone", "us-central1-a", "--gpu", "a100-80gb", "--json"])
    offers = json.loads(result.output)["offers"]
    assert {o["type"] for o in offers} == {f"a2-ultragpu-{n}g" for n in (1, 2, 4, 8)}
    assert all(o["zones"] == "unknown" and o["gpuMemoryGB"] == 80 for o in offers)  # GCP export: per region
    result = runner.invoke(app, ["catalog", "--cloud", "gcp", "--region", "us-central1", "--gpu", "t4"])
    assert result.output.splitlines()[1].split()[:5] == ["n1-*", "1/2/4", "x", "t4", "16GB"]


def test_nothing_found_is_one_error_line(runner):
    result = runner.invoke(app, ["catalog", "--gpu", "h100", "--region", "af-south-1"])
    assert result.exit_code == 1
    assert result.output == ("error: the catalog lists no GPU machine type for GPU h100, region af-south-1 "
                             "(`spotctl catalog` lists them all)\n")
