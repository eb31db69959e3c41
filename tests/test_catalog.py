"""The machine catalog (infra/catalog.json) behind `spotctl validate`: wrong machine, GPU and zone
combinations are refused with one line naming the key; what the catalog cannot tell is not refused."""

from __future__ import annotations

import pytest

from infra import catalog
from infra.config import ConfigError, validate
from infra.contract import gcp_zones
from tests.conftest import AWS_BASE, GCP_BASE, aws_job, gcp_job, stack_config

SRC = "stacks/Pulumi.t.yaml"


def errors_of(raw: dict) -> list[str]:
    with pytest.raises(ConfigError) as exc:
        validate(raw, SRC)
    return str(exc.value).splitlines()


def aws(job: dict | None = None, region: str = "us-east-1", zones: list[str] | None = None, pools=None) -> dict:
    zones = zones or [f"{region}a", f"{region}b"]
    return stack_config(AWS_BASE, region=region, zones=zones, jobs=[aws_job(zone=zones[0], **(job or {}))] if job is not None else [],
                        pools=pools or [])


def gcp(job: dict | None = None, region: str = "us-central1", pools=None) -> dict:
    zones = list((gcp_zones.zones_of(region) or (f"{region}-a", f"{region}-b"))[:2])  # us-east1 has no zone a
    return stack_config(GCP_BASE, region=region, zones=zones, jobs=[gcp_job(zone=zones[0], **(job or {}))] if job is not None else [],
                        pools=pools or [])


def acc(gpu: str, count: int = 1) -> dict:
    return {"accelerator": {"type": gpu, "count": count}}


def pool(**over) -> dict:
    return {"name": "p", "spotMax": 2, **over}


# (stack, the key named, a piece of the message)
AWS_WRONG = [
    (aws({"instanceType": "g5.2xlarg"}), "jobs[0].instanceType", "did you mean 'g5.2xlarge'"),
    (aws({"instanceType": "g5.2xlarge"}, region="eu-west-2", zones=["eu-west-2c", "eu-west-2a"]), "jobs[0].instanceType",
     "not offered in zone eu-west-2c (catalog of 2026-10); zones of eu-west-2 that offer it: eu-west-2a, eu-west-2b"),
    (aws({"instanceType": "g5.2xl"}), "jobs[0].instanceType", "unknown instance type 'g5.2xl'"),
    (aws({"instanceType": "p5.48xlarges"}), "jobs[0].instanceType", "did you mean 'p5.48xlarge'"),
    (aws(pools=[pool(instanceTypes=["g5.4xlarge"])], region="eu-west-2", zones=["eu-west-2a", "eu-west-2c"]),
     "pools[0].instanceTypes[0]", "g5.4xlarge is not offered in zone eu-west-2c"),
    (aws({"instanceType": "g4dn.xlargee"}), "jobs[0].instanceType", "did you mean 'g4dn.xlarge'"),
    (aws({"instanceType": "g52xlarge"}), "jobs[0].instanceType", "unknown instance type 'g52xlarge'"),
    (aws({"instanceType": "g5.2xlarge", **acc("nvidia-h100-80gb")}), "jobs[0].instanceType", "comes with 1 x A10G"),
    (aws({"instanceType": "g5.2xlarge", **acc("nvidia-a10g", 2)}), "jobs[0].instanceType", "not 2: set accelerator count 1"),
    (aws({"instanceType": "p4d.24xlarge", **acc("nvidia-a100-80gb", 8)}), "jobs[0].instanceType", "8 x A100 (40 GiB each)"),
    (aws({"instanceType": "p4d.24xlarge", **acc("nvidia-a100", 4)}), "jobs[0].instanceType", "not 4"),
    (aws({"instanceType": "p5.48xlarge", **acc("nvidia-a100", 8)}), "jobs[0].instanceType", "8 x H100"),
    (aws({"instanceType": "g6.xlarge", **acc("nvidia-a10g")}), "jobs[0].instanceType", "1 x L4"),
    (aws({"instanceType": "g4dn.xlarge", **acc("nvidia-tesla-v100")}), "jobs[0].instanceType", "1 x T4"),
    (aws({"instanceType": "m5.large", **acc("nvidia-tesla-t4")}), "jobs[0].instanceType", "m5.large has no GPUs"),
    (aws({"instanceType": "p3dn.24xlarge", **acc("nvidia-tesla-v100", 4)}), "jobs[0].instanceType", "8 x V100"),
    (aws({"instanceType": "g6e.xlarge", **acc("nvidia-l4")}), "jobs[0].instanceType", "1 x L40S"),
    (aws({"instanceType": "p5e.48xlarge", **acc("nvidia-h100-80gb", 8)}, region="us-east-2"), "jobs[0].instanceType", "8 x H200"),
    (aws({"instanceType": "g5.12xlarge", **acc("nvidia-a10g", 1)}), "jobs[0].instanceType", "4 x A10G"),
    (aws({"instanceType": "g5.2xlarge"}, zones=["us-east-1g", "us-east-1a"]), "zones[0]", "us-east-1a, us-east-1b, us-east-1c"),
    (aws({"instanceType": "g5.2xlarge"}, zones=["us-west-2e"], region="us-west-2"), "zones[0]", "does not exist in region us-west-2"),
    (aws({"instanceType": "p5e.48xlarge"}, region="us-west-1"), "jobs[0].instanceType", "not offered in region us-west-1"),
    (aws({"instanceType": "p5e.48xlarge"}), "jobs[0].instanceType", "regions that offer it: ap-southeast-2"),
    (aws({"instanceType": "p5.48xlarge"}, region="eu-west-1"), "jobs[0].instanceType", "not offered in region eu-west-1"),
    (aws({"instanceType": "p4de.24xlarge"}, region="eu-west-1"), "jobs[0].instanceType", "us-east-1, us-west-2"),
    (aws({"instanceType": "g5.2xlarge"}, region="us-west-1"), "jobs[0].instanceType", "not offered in region us-west-1"),
    (aws(pools=[pool(instanceTypes=["g5.2xlarge", "g5.4xlarg"])]), "pools[0].instanceTypes[1]", "did you mean 'g5.4xlarge'"),
    (aws(pools=[pool(instanceTypes=["g5.2xlarge", "g6.2xlarge"], **acc("nvidia-h100-80gb"))]), "pools[0].accelerator",
     "g5.2xlarge: 1 x A10G; g6.2xlarge: 1 x L4"),
    (aws(pools=[pool(instanceTypes=["g6.2xlarge"], **acc("nvidia-a10g"))]), "pools[0].instanceTypes[0]", "1 x L4"),
    (aws(pools=[pool(instanceTypes=["p5.48xlarge"])], region="af-south-1"), "pools[0].instanceTypes[0]", "not offered in region af-south-1"),
]

GCP_WRONG = [
    (gcp({"machineType": "n1-standrad-8"}), "jobs[0].machineType", "did you mean 'n1-standard-8'"),
    (gcp({"machineType": "a2-highgpu-1"}), "jobs[0].machineType", "did you mean 'a2-highgpu-1g'"),
    (gcp({"machineType": "g2-standard-7"}), "jobs[0].machineType", "unknown machine type 'g2-standard-7'"),
    (gcp({"machineType": "a3-highgpu-3g"}), "jobs[0].machineType", "did you mean 'a3-highgpu-8g'"),
    (gcp({"machineType": "a2-ultragpu-16g"}), "jobs[0].machineType", "unknown machine type 'a2-ultragpu-16g'"),
    (gcp({"machineType": "n1-standard-7"}), "jobs[0].machineType", "unknown machine type 'n1-standard-7'"),
    (gcp({"machineType": "g2-standrd-8"}), "jobs[0].machineType", "did you mean 'g2-standard-8'"),
    (gcp({"machineType": "a3-megagpu-16g"}), "jobs[0].machineType", "or 'a3-megagpu-8g'?"),
    (gcp({"machineType": "n1-standard-8", **acc("nvidia-l4")}), "jobs[0].accelerator", "'nvidia-l4' cannot be attached to N1"),
    (gcp({"machineType": "n1-standard-8", **acc("nvidia-tesla-t4", 3)}), "jobs[0].accelerator", "counts 1, 2, 4, got 3"),
    (gcp({"machineType": "n1-standard-8", **acc("nvidia-h100-80gb")}), "jobs[0].accelerator", "cannot be attached to N1"),
    (gcp({"machineType": "a2-highgpu-1g", **acc("nvidia-tesla-a100", 2)}), "jobs[0].accelerator", "use a2-highgpu-2g"),
    (gcp({"machineType": "a2-highgpu-1g", **acc("nvidia-h100-80gb")}), "jobs[0].accelerator", "not 'nvidia-h100-80gb'"),
    (gcp({"machineType": "g2-standard-8", **acc("nvidia-tesla-t4")}), "jobs[0].accelerator", "1 x nvidia-l4"),
    (gcp({"machineType": "a3-highgpu-8g", **acc("nvidia-a100-80gb", 8)}), "jobs[0].accelerator", "8 x nvidia-h100-80gb"),
    (gcp({"machineType": "n2-standard-8", **acc("nvidia-tesla-t4")}), "jobs[0].accelerator", "cannot be attached to n2-standard-8"),
    (gcp({"machineType": "e2-standard-8", **acc("nvidia-l4")}), "jobs[0].accelerator", "cannot be attached to e2-standard-8"),
    (gcp({"machineType": "g2-standard-24", **acc("nvidia-l4", 1)}), "jobs[0].accelerator", "comes with 2 x nvidia-l4"),
    (gcp({"machineType": "a2-ultragpu-1g", **acc("nvidia-tesla-a100")}), "jobs[0].accelerator", "1 x nvidia-a100-80gb"),
    (gcp({"machineType": "n1-standard-8", **acc("nvidia-tesla-v100", 3)}), "jobs[0].accelerator", "counts 1, 2, 4, 8, got 3"),
    (gcp({"machineType": "a2-ultragpu-1g"}, region="europe-west2"), "jobs[0].machineType", "not offered in region europe-west2"),
    (gcp({"machineType": "n1-standard-8", **acc("nvidia-tesla-p4")}, region="us-east1"), "jobs[0].machineType",
     "nvidia-tesla-p4 (attached to n1-standard-8) is not offered in region us-east1"),
    (gcp({"machineType": "a2-highgpu-1g"}, region="europe-west2"), "jobs[0].machineType", "regions that offer it: asia-northeast1"),
    (gcp({"machineType": "g2-standard-8"}, region="us-west2"), "jobs[0].machineType", "not offered in region us-west2"),
    (gcp({"machineType": "a3-highgpu-8g"}, region="me-central2"), "jobs[0].machineType", "not offered in region me-central2"),
    (gcp(pools=[pool(machineType="g2-standrd-8")]), "pools[0].machineType", "did you mean 'g2-standard-8'"),
    (gcp(pools=[pool(machineType="a2-highgpu-1g", **acc("nvidia-tesla-a100", 4))]), "pools[0].accelerator", "use a2-highgpu-4g"),
    (gcp(pools=[pool(machineType="a2-ultragpu-1g")], region="southamerica-east1"), "pools[0].machineType",
     "not offered in region southamerica-east1"),
    (gcp({"machineType": "a3-megagpu-8g"}, region="asia-south1"), "jobs[0].machineType", "asia-east1, asia-northeast1"),
    (gcp({"machineType": "n1-standard-8", **acc("nvidia-tesla-k80")}), "jobs[0].accelerator", "cannot be attached to N1"),
]


@pytest.mark.parametrize("cloud,cases", [("aws", AWS_WRONG), ("gcp", GCP_WRONG)])
def test_thirty_wrong_machine_gpu_zone_combinations_per_cloud_get_thirty_clear_refusals(cloud, cases):
    assert len(cases) == 30 and len({repr(c[0]) for c in cases}) == 30
    for raw, key, piece in cases:
        lines = errors_of(raw)
        assert len(lines) == 1, (key, lines)
        assert lines[0].startswith(f"{SRC}: spotctl:{key}: "), (key, lines)
        assert piece in lines[0], (piece, lines[0])


def test_the_cli_refuses_a_misspelled_machine_with_one_line_and_the_example_stacks_validate(project, runner):
    from cli.app import app

    for stack in ("example-aws", "example-gcp"):
        result = runner.invoke(app, ["validate", "--stack", stack])
        assert result.exit_code == 0, result.output
    path = project / "stacks" / "Pulumi.example-gcp.yaml"
    before = path.read_text().replace("machineType: a3-highgpu-8g", "machineType: a3-highgpu-8", 1)
    path.write_text(before)
    result = runner.invoke(app, ["validate", "--stack", "example-gcp"])
    assert result.exit_code == 1
    assert result.output == ("error: stacks/Pulumi.example-gcp.yaml: spotctl:jobs[0].machineType: unknown machine type "
                             "'a3-highgpu-8' (did you mean 'a3-highgpu-8g' or 'a4-highgpu-8g' or 'a3-highgpu-4g'?); "
                             "`spotctl catalog` lists the GPU types\n")
    assert path.read_text() == before


@pytest.mark.parametrize("raw", [
    aws({"instanceType": "x9.mega"}),  # a family the catalog does not list: may be newer than it
    aws({"instanceType": "p3.2xlarge", **acc("nvidia-tesla-v100")}),  # not in the recorded listing: not refused
    aws({"instanceType": "g5.2xlarge"}, region="us-gov-west-1", zones=["us-gov-west-1a"]),  # a region not read
    aws({"instanceType": "g5.2xlarge", **acc("nvidia-a10g-24gb")}),  # 22.35 GiB is 24 GB
    gcp({"machineType": "n1-custom-8-30720", **acc("nvidia-tesla-t4")}),  # custom types are never listed
    gcp({"machineType": "custom-8-30720"}),
    gcp({"machineType": "e2-custom-medium-4096"}),  # E2 shared-core custom: micro/small/medium for the vCPUs
    gcp({"machineType": "a2-highgpu-1g"}, region="mars-north1"),  # a region the export does not name
])
def test_what_the_catalog_cannot_tell_is_not_refused(raw):
    validate(raw, SRC)


def test_zones_the_catalog_records_as_unknown_are_not_refused_and_known_ones_are(monkeypatch):
    # g5.2xlarge is in 5 of us-east-1's 6 AZ IDs: which AZ *names* those are differs per account there
    # (us-east-1 maps names per account); eu-west-2 maps them uniformly: its names are known
    assert catalog.load()["aws"]["gpu"]["g5.2xlarge"]["regions"]["eu-west-2"]["zones"] == ["eu-west-2a", "eu-west-2b"]
    entry = catalog.load()["aws"]["gpu"]["g5.2xlarge"]["regions"]["us-east-1"]
    assert entry["zones"] == "unknown" and len(entry["zoneIds"]) == 5
    for zone in ("us-east-1a", "us-east-1b", "us-east-1c", "us-east-1d", "us-east-1e", "us-east-1f"):
        assert catalog.check("aws", "us-east-1", "g5.2xlarge", None, None, [zone]) == []
    # zones read from the Compute Engine API (tools/refresh_catalog.py --gcp-project) are known per zone
    per_zone = {"types": ["a2-highgpu-1g"], "gpu": {"a2-highgpu-1g": {"regions": {"us-central1": {"zones": ["us-central1-a"]}}}},
                "attachable": {}, "n1Regions": []}
    patched = {**catalog.load(), "gcp": per_zone}
    monkeypatch.setattr(catalog, "load", lambda path=catalog.PATH: patched)
    catalog.forget()
    try:
        assert catalog.check("gcp", "us-central1", "a2-highgpu-1g", None, None, ["us-central1-a"]) == []
        assert catalog.check("gcp", "us-central1", "a2-highgpu-1g", None, None, ["us-central1-b"]) == [
            "a2-highgpu-1g is not offered in zone us-central1-b (catalog of 2026-08-17); zones of us-central1 that offer it: "
            "us-central1-a"]
    finally:
        monkeypatch.undo()
        catalog.forget()


def test_the_catalog_names_its_sources_and_dates():
    sources = catalog.load()["sources"]
    assert set(sources) == {"aws", "gcp"}
    for src in sources.values():
        assert src["date"] and src["read"] and src["source"]
    assert "DescribeInstanceTypeOfferings" in sources["aws"]["source"]
    assert "machinetyperegion.csv" in sources["gcp"]["source"]


def test_plan_refuses_what_validate_refuses(project, runner):
    from cli.app import app

    path = project / "stacks" / "Pulumi.example-aws.yaml"
    path.write_text(path.read_text().replace("instanceType: g5.2xlarge", "instanceType: g5.2xlarg", 1))
    result = runner.invoke(app, ["plan", "--stack", "example-aws"])
    assert result.exit_code == 1
    assert result.output == ("error: stacks/Pulumi.example-aws.yaml: spotctl:jobs[2].instanceType: unknown instance type "
                             "'g5.2xlarg' (did you mean 'g5.2xlarge' or 'g5g.2xlarge' or 'g5.24xlarge'?); `spotctl catalog` "
                             "lists the GPU types\n")
