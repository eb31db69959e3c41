"""Stack config validation: one module, exact messages naming file and key path, nothing written."""

from __future__ import annotations

import json
import re

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from cli.app import app
from infra.config import NAME_RE, ConfigError, namespaced, validate
from tests.conftest import GCP_BASE, gcp_job, stack_config

SRC = "stacks/Pulumi.t.yaml"


def errors_of(raw: dict) -> list[str]:
    with pytest.raises(ConfigError) as exc:
        validate(raw, SRC)
    return str(exc.value).splitlines()


def test_unknown_key_suggests_the_real_one():
    raw = stack_config(GCP_BASE, jobs=[gcp_job(capacty="spot")])
    assert errors_of(raw) == [f"{SRC}: spotctl:jobs[0].capacty: unknown key (did you mean 'capacity'?)"]


def test_unknown_top_level_key_suggests_the_real_one():
    raw = stack_config(GCP_BASE, poolz=[])
    assert errors_of(raw) == [f"{SRC}: spotctl:poolz: unknown key (did you mean 'pools'?)"]


def test_unknown_key_without_close_match_lists_valid_keys():
    raw = stack_config(GCP_BASE, jobs=[gcp_job(accelerator={"type": "nvidia-l4", "zzz": 1})])
    assert errors_of(raw) == [f"{SRC}: spotctl:jobs[0].accelerator.zzz: unknown key; valid keys: type, count"]


def test_wrong_type_names_expected_type():
    raw = stack_config(GCP_BASE, jobs=[gcp_job(), gcp_job(id="two", nodes="two")])
    assert errors_of(raw) == [f"{SRC}: spotctl:jobs[1].nodes: expected an integer, got 'two'"]


def test_bad_enum_lists_choices_and_suggests():
    raw = stack_config(GCP_BASE, jobs=[gcp_job(), gcp_job(id="b"), gcp_job(id="c", capacity="spto")])
    assert errors_of(raw) == [
        f"{SRC}: spotctl:jobs[2].capacity: expected one of 'spot', 'on-demand', got 'spto' (did you mean 'spot'?)"
    ]


def test_bad_state_lists_the_state_machine_states():
    raw = stack_config(GCP_BASE, jobs=[gcp_job(state="runing")])
    assert errors_of(raw) == [
        f"{SRC}: spotctl:jobs[0].state: expected one of 'pending', 'running', 'preempted', 'stopped', "
        "'completed', 'failed', got 'runing' (did you mean 'running'?)"
    ]


def test_missing_required_key():
    job = gcp_job()
    del job["command"]
    assert errors_of(stack_config(GCP_BASE, jobs=[job])) == [f"{SRC}: spotctl:jobs[0].command: required key is missing"]


def test_duplicate_job_id():
    raw = stack_config(GCP_BASE, jobs=[gcp_job(), gcp_job(id="other"), gcp_job()])
    assert errors_of(raw) == [f"{SRC}: spotctl:jobs[2].id: duplicate id 'train' (also spotctl:jobs[0])"]


def test_job_id_must_be_a_cloud_resource_name():
    raw = stack_config(GCP_BASE, jobs=[gcp_job(id="Train_1")])
    assert errors_of(raw) == [
        f"{SRC}: spotctl:jobs[0].id: job id 'Train_1' is not a valid cloud resource name: use 1-30 characters: "
        "lowercase letters, digits and hyphens, starting with a letter and not ending with a hyphen"
    ]


def test_zone_must_be_one_of_the_stack_zones():
    raw = stack_config(GCP_BASE, jobs=[gcp_job(zone="us-centrl1-b")])
    assert errors_of(raw) == [
        f"{SRC}: spotctl:jobs[0].zone: expected one of 'us-central1-a', 'us-central1-b', got 'us-centrl1-b'"
        " (did you mean 'us-central1-b'?)"
    ]


def test_cloud_specific_keys():
    raw = stack_config(GCP_BASE, jobs=[gcp_job(instanceType="p5.48xlarge")])
    assert errors_of(raw) == [f"{SRC}: spotctl:jobs[0].instanceType: not used on GCP; use machineType"]
    raw = stack_config(GCP_BASE, cloud="aws", project=None, region="us-east-1", zones=["us-east-1a"])  # AWS zones: region + letter
    del raw["project"]
    assert validate(raw, SRC).cloud == "aws"


def test_gcp_needs_project_and_zones_in_region():
    raw = stack_config(GCP_BASE, zones=["us-central1-a", "europe-west4-a"])
    del raw["project"]
    assert errors_of(raw) == [
        f"{SRC}: spotctl:project: required when cloud is 'gcp' (the GCP project id)",
        f"{SRC}: spotctl:zones[1]: zone 'europe-west4-a' is not in region 'us-central1'",
    ]


def test_gcp_labels_leave_room_for_spotctls_own():
    """A GCP resource takes 64 labels, a job's VM carries 6 of spotctl's and pulumi-gcp adds
    goog-pulumi-provisioned: 57 of the stack's fit."""
    labels = {f"k{i}": "v" for i in range(57)}
    validate(stack_config(GCP_BASE, labels=labels, jobs=[gcp_job()]), SRC)
    assert errors_of(stack_config(GCP_BASE, labels={**labels, "k57": "v"}, jobs=[gcp_job()])) == [
        f"{SRC}: spotctl:labels: 58 labels: at most 57 (a GCP resource takes 64 labels, spotctl adds up to 6 "
        "of its own to a job's VM and pulumi-gcp 1 (goog-pulumi-provisioned))"
    ]


def test_unknown_policy_lists_the_registered_ones():
    raw = stack_config(GCP_BASE, jobs=[gcp_job(policy="greedyy")])
    (line,) = errors_of(raw)
    assert line.startswith(f"{SRC}: spotctl:jobs[0].policy: expected one of 'default', 'greedy'")
    assert line.endswith("got 'greedyy' (did you mean 'greedy'?)")


def test_engine_form_strings_are_decoded():
    """The Pulumi engine hands every top-level value to the program as a string."""
    engine = {
        "spotctl:cloud": "gcp",
        "spotctl:project": "proj-1",
        "spotctl:region": "us-central1",
        "spotctl:zones": json.dumps(["us-central1-a"]),
        "spotctl:eventRetentionDays": "14",
        "spotctl:jobs": json.dumps([gcp_job()]),
        "gcp:project": "proj-1",
    }
    cfg = validate(namespaced(engine, SRC), SRC)
    assert cfg.event_retention_days == 14 and cfg.jobs[0].id == "train"


@settings(max_examples=200, deadline=None)
@given(st.text(min_size=0, max_size=40))
def test_any_job_id_is_accepted_exactly_when_it_is_a_valid_name(job_id):
    raw = stack_config(GCP_BASE, jobs=[gcp_job(id=job_id)])
    if NAME_RE.fullmatch(job_id):
        assert validate(raw, SRC).jobs[0].id == job_id
    else:
        lines = errors_of(raw)
        assert len(lines) == 1 and lines[0].startswith(f"{SRC}: spotctl:jobs[0].id: ")


# ---- through the CLI, on real files ---------------------------------------------------------------


def test_validate_ok(project, runner):
    result = runner.invoke(app, ["validate", "--stack", "example-gcp"])
    assert result.exit_code == 0, result.output
    # The example's A3 gang runs NCCL over one NIC (infra/config/gangs.py): a warning, not an error.
    assert result.output == ("warning: stacks/Pulumi.example-gcp.yaml: spotctl:jobs[0].machineType: job llm-pretrain's 2 "
                             "nodes have one NIC each, not GPUDirect-TCPX's four more, and no compact placement "
                             "policy: NCCL runs over TCP "
                             "(docs/guides/cloud-gcp.md, \"Multi-node A3 jobs\")\n"
                             "stacks/Pulumi.example-gcp.yaml: ok (gcp, 2 pools, 3 jobs)\n")


def test_validate_bad_file_names_file_and_key_and_leaves_it_alone(project, runner):
    path = project / "stacks" / "Pulumi.example-gcp.yaml"
    text = path.read_text().replace("capacity: on-demand", "capacity: ondemand")
    path.write_text(text)
    result = runner.invoke(app, ["validate", "--stack-file", str(path)])
    assert result.exit_code == 1
    assert result.output == (
        f"error: {path}: spotctl:jobs[1].capacity: expected one of 'spot', 'on-demand', got 'ondemand'"
        " (did you mean 'on-demand'?)\n"
    )
    assert "Traceback" not in result.output
    assert path.read_text() == text


@pytest.mark.parametrize(
    ("content", "message"),
    [
        ("config: [1, 2]\n", "config: expected a mapping of 'namespace:key' entries"),
        ("config:\n  spotctl:cloud: gcp\n   bad: indent\n", "line 3: not valid YAML"),
        ("- just\n- a list\n", "expected a YAML mapping with a 'config:' key"),
    ],
)
def test_validate_broken_yaml(project, runner, content, message):
    path = project / "stacks" / "Pulumi.broken.yaml"
    path.write_text(content)
    result = runner.invoke(app, ["validate", "--stack", "broken"])
    assert result.exit_code == 1
    assert result.output.startswith(f"error: stacks/Pulumi.broken.yaml: {message}")
    assert len(result.output.splitlines()) == 1


def test_validate_needs_exactly_one_stack_option(project, runner):
    result = runner.invoke(app, ["validate"])
    assert result.exit_code == 1
    assert result.output == ("error: spotctl: no stack: give --stack NAME (or --stack-file PATH), set PULUMI_STACK, "
                             "or select one with `pulumi stack select NAME`\n")


def test_stack_file_name_must_follow_pulumi_convention(project, runner, tmp_path):
    other = tmp_path / "team.yaml"
    other.write_text("config: {}\n")
    result = runner.invoke(app, ["validate", "--stack-file", str(other)])
    assert result.exit_code == 1
    assert re.match(r"error: .*team\.yaml: a stack file must be named Pulumi\.<stack>\.yaml\n", result.output)


def test_nul_in_a_command_is_refused():
    raw = stack_config(GCP_BASE, jobs=[gcp_job(command="python\x00train.py")])
    assert errors_of(raw) == [f"{SRC}: spotctl:jobs[0].command: must not contain a NUL character (no process can receive it)"]


def test_a_pool_lists_at_most_the_instance_types_an_auto_scaling_group_takes(project, runner):
    """botocore autoscaling 2011-01-01 service-2.json, LaunchTemplateOverrides.InstanceType: "You can
    specify up to 40 instance types per Auto Scaling group" (infra/aws_scaling.py: one override each)."""
    import yaml

    from tests.conftest import AWS_BASE

    def validate_with(count: int):
        pool = {"name": "g5", "instanceTypes": [f"zz{i}.xlarge" for i in range(count)], "spotMax": 3}
        config = {f"spotctl:{k}": v for k, v in stack_config(AWS_BASE, pools=[pool]).items()}
        (project / "stacks" / "Pulumi.t.yaml").write_text(yaml.safe_dump({"config": config}))
        return runner.invoke(app, ["validate", "--stack", "t"])

    result = validate_with(41)
    assert result.exit_code == 1
    assert result.output == ("error: stacks/Pulumi.t.yaml: spotctl:pools[0].instanceTypes: 41 instance types; an Auto "
                             "Scaling group takes at most 40\n")
    result = validate_with(40)
    assert result.exit_code == 0, result.output
