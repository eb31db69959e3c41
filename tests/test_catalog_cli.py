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


def test_the_whole_listing_keeps_every_price_at_80_and_uses_a_wider_terminal(runner):
    narrow = runner.invoke(app, ["catalog"], env={"COLUMNS": "80"}).output.splitlines()
    assert max(map(len, narrow)) <= 80
    assert narrow[0].split() == ["type", "GPUs", "region", "zones", "spot", "$/h", "od", "$/h"]  # vCPU gave way
    # (a row is never cut: the on-demand price column is there in full, right-aligned to the header's end)
    end = len(narrow[0])
    assert all(line[end - 1] != " " for line in narrow[1:] if line and not line.startswith(" ") and ":" not in line)
    a3 = next(line for line in narrow if line.startswith("a3-highgpu-8g ") and " us-central1 " in line)
    assert a3.split()[-2:] == ["50.61", "88.49"]  # prices.json gcp/us-central1
    wide = runner.invoke(app, ["catalog", "--cloud", "aws", "--region", "us-east-1"], env={"COLUMNS": "200"}).output.splitlines()
    assert wide[0].split()[:3] == ["type", "GPUs", "vCPU"] and wide[0].endswith("od $/h") and 80 < len(wide[0]) <= 200
    assert next(line for line in wide if line.startswith("g5.2xlarge ")).split()[-2:] == ["0.52", "1.21"]


def test_a_fractional_gpu_shows_its_part_from_the_gpu_memory_ec2_reports(runner):
    lines = runner.invoke(app, ["catalog", "--cloud", "aws", "--region", "us-east-1", "--gpu", "l4"],
                          env={"COLUMNS": "120"}).output.splitlines()
    # EC2 DescribeInstanceTypes: g6f.large GpuInfo Count 0 with 2.79 GiB, a whole L4 (g6.xlarge) 22.35 GiB
    assert next(line for line in lines if line.startswith("g6f.large ")).split()[1:5] == ["1/8", "x", "L4", "22GiB"]
    assert next(line for line in lines if line.startswith("g6f.4xlarge ")).split()[1:3] == ["1/2", "x"]
    assert not any(" 0 x " in line for line in lines)
