"""Cloud limits a stack's values can break, refused by `validate` (and `plan`, and the lifecycle commands)
before `pulumi up`, one error line naming the key; each rule is in the contract tables with its source."""

from __future__ import annotations

import random
import string

import pytest
import yaml

from cli.app import app
from infra import contract
from infra.config import ConfigError, validate
from tests.conftest import AWS_BASE, GCP_BASE, aws_job, gcp_job, stack_config

SRC = "stacks/Pulumi.t.yaml"


def errors_of(raw: dict) -> list[str]:
    with pytest.raises(ConfigError) as exc:
        validate(raw, SRC)
    return str(exc.value).splitlines()


def write(project, name: str, cfg: dict) -> None:
    (project / "stacks" / f"Pulumi.{name}.yaml").write_text(yaml.safe_dump({"config": {f"spotctl:{k}": v for k, v in cfg.items()}}))


def noise(n: int, seed: int) -> str:
    """Text gzip cannot shrink (a token, a key)."""
    rnd = random.Random(seed)
    return "".join(rnd.choice(string.ascii_letters + string.digits) for _ in range(n))


# ---- AWS: 50 tags per resource -------------------------------------------------------------------


def test_more_labels_than_a_resource_has_tags_for_is_refused_on_aws():
    labels = {f"k{i}": "v" for i in range(43)}
    validate(stack_config(AWS_BASE, labels=labels), SRC)  # 43 + spotctl's 7 = 50
    labels["k43"] = "v"
    assert errors_of(stack_config(AWS_BASE, labels=labels)) == [
        f"{SRC}: spotctl:labels: 44 labels: at most 43 on AWS (a resource takes 50 tags and spotctl puts up to 7 of its own "
        "on a job's VM; rule aws.tags-50): drop 1"]


def test_spotctls_own_tags_are_counted_right():
    from infra.naming import AWS_SPOTCTL_TAGS_MAX, aws_tags

    mine = {**aws_tags("s", {}, name="n", job="j", node="0"), "spotctl:attempt": "1"}  # a job VM's (infra/aws.py)
    assert len(mine) == AWS_SPOTCTL_TAGS_MAX


def test_the_tag_rule_checks_every_resource():
    rule = contract.get("aws.tags-50")
    assert rule.check("aws:ec2/instance:Instance", {"tags": {f"k{i}": "v" for i in range(51)}}) == "51 tags (limit 50)"
    assert rule.check("aws:ec2/instance:Instance", {"tags": {**{f"k{i}": "v" for i in range(50)}, "aws:x": "y"}}) is None
    assert "docs.aws.amazon.com" in rule.source


# ---- AWS: user data grown by stack values ----------------------------------------------------------


def big_env_stack() -> dict:
    env = {f"TOKEN_{i}": noise(3000 + 100 * i, i) for i in range(6)}
    return stack_config(AWS_BASE, jobs=[aws_job(env=env)])


def test_validate_names_the_env_value_that_grew_the_user_data(project, runner):
    write(project, "big", big_env_stack())
    result = runner.invoke(app, ["validate", "--stack", "big"])
    assert result.exit_code == 1
    lines = result.output.splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: stacks/Pulumi.big.yaml: spotctl:jobs[0].env.TOKEN_5: job train's "
                                                   "user data is ")
    assert "gzip-compressed, over EC2's 16,384 (aws.user-data-16k" in lines[0]
    assert "make it a Pulumi secret (`pulumi config set --secret --path 'spotctl:jobs[0].env.TOKEN_5'`" in lines[0]
    assert "gzip it" not in lines[0]


def test_a_long_command_is_named_when_it_is_what_grew_it(project, runner):
    # (The user data is a small bootstrap and the settings, the agent fetched: values must fill it.)
    cfg = stack_config(AWS_BASE, jobs=[aws_job(command="python t.py " + noise(8000, 1),
                                               env={"A": noise(4000, 2), "B": noise(3500, 3), "C": noise(3000, 4),
                                                    "D": noise(2500, 5)})])
    write(project, "cmd", cfg)
    result = runner.invoke(app, ["validate", "--stack", "cmd"])
    assert result.exit_code == 1
    assert "spotctl:jobs[0].command: job train's user data" in result.output
    assert "move the long command into a script on the job disk" in result.output


def test_failover_of_a_job_whose_user_data_is_too_big_is_one_error_line_and_nothing_changes(project, runner, fake_pulumi):
    cfg = big_env_stack()
    cfg["jobs"][0].update(state="preempted", attempt=2)
    write(project, "big", cfg)
    path = project / "stacks" / "Pulumi.big.yaml"
    before = path.read_text()
    result = runner.invoke(app, ["failover", "train", "--stack", "big", "--to", "on-demand", "--yes"])
    assert result.exit_code == 1
    assert isinstance(result.exception, SystemExit)  # a handled error, no traceback
    lines = result.output.splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: stack big: spotctl:jobs[0].env.TOKEN_5: job train's user data is")
    assert path.read_text() == before


def test_a_change_that_ends_a_job_is_never_refused_for_its_user_data(project, runner, fake_pulumi):
    cfg = big_env_stack()
    cfg["jobs"][0].update(state="running", attempt=2)
    write(project, "big", cfg)
    result = runner.invoke(app, ["complete", "train", "--stack", "big", "--yes"])
    assert result.exit_code == 0, result.output
    assert "state: completed" in (project / "stacks" / "Pulumi.big.yaml").read_text()
    assert runner.invoke(app, ["validate", "--stack", "big"]).exit_code == 0  # a completed job runs no VM again


def test_a_contract_error_on_a_lifecycle_command_is_one_line():
    from cli.plan.mocks import checked_run
    from infra.config import validate as load

    cfg = load(stack_config(AWS_BASE, jobs=[aws_job(diskThroughput=2000, diskIops=3000)]), SRC)
    with pytest.raises(ConfigError) as exc:
        checked_run(cfg, "t", "train")
    assert str(exc.value).count("\n") == 0
    assert str(exc.value).startswith("stack t: aws:ebs/volume:Volume 'job-train-n0-volume': ")
    assert "(rule aws.gp3-performance: " in str(exc.value)


# ---- GCP: names, Hyperdisk-only series, spot-only A3 High -------------------------------------------


@pytest.mark.parametrize("stack", ["google-ml", "goog", "team-google", "Googlers"])
def test_stack_names_gcs_and_pubsub_refuse_are_refused(project, runner, stack):
    write(project, stack, stack_config(GCP_BASE, jobs=[gcp_job()]))
    result = runner.invoke(app, ["validate", "--stack", stack])
    assert result.exit_code == 1
    lines = result.output.splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"error: stacks/Pulumi.{stack}.yaml: stack name {stack!r}: its event bucket "
                                                   "and preemption topic are named from it")
    assert "(rule gcp.reserved-names)" in lines[0]


def test_an_aws_stack_may_be_named_google(project, runner):
    write(project, "google-ml", stack_config(AWS_BASE, jobs=[aws_job()]))
    assert runner.invoke(app, ["validate", "--stack", "google-ml"]).exit_code == 0


def test_the_name_rule_checks_buckets_and_topics():
    rule = contract.get("gcp.reserved-names")
    assert rule.check("gcp:storage/bucket:Bucket", {"name": "goog-events-1"}) == "bucket name 'goog-events-1' begins with 'goog'"
    assert rule.check("gcp:storage/bucket:Bucket", {"name": "my-g00gle-x"}) == "bucket name 'my-g00gle-x' contains 'google'"
    assert rule.check("gcp:pubsub/topic:Topic", {"name": "my-google-x"}) is None
    assert rule.check("gcp:pubsub/topic:Topic", {"name": "googx"}) == "topic name 'googx' begins with 'goog'"


@pytest.mark.parametrize("machine", ["a4-highgpu-8g", "a4x-highgpu-4g", "g4-standard-48"])
def test_hyperdisk_only_series_are_refused_with_the_reason(machine):
    lines = errors_of(stack_config(GCP_BASE, jobs=[gcp_job(machineType=machine)]))
    assert len(lines) == 1
    assert lines[0].startswith(f"{SRC}: spotctl:jobs[0].machineType: {machine}: ")
    assert "take only Hyperdisk volumes and spotctl declares pd-balanced" in lines[0]


def test_the_hyperdisk_rule_checks_vms():
    rule = contract.get("gcp.hyperdisk-only-series")
    vm = {"machine_type": "a4-highgpu-8g", "boot_disk": {"initialize_params": {"type": "pd-balanced"}}}
    assert rule.check("gcp:compute/instance:Instance", vm) == "a4-highgpu-8g with pd-balanced disks"
    vm["boot_disk"]["initialize_params"]["type"] = "hyperdisk-balanced"
    assert rule.check("gcp:compute/instance:Instance", vm) is None


@pytest.mark.parametrize("machine", ["a3-highgpu-1g", "a3-highgpu-2g", "a3-highgpu-4g"])
def test_a3_high_small_types_are_spot_only(machine):
    n = int(machine[-2])
    acc = {"type": "nvidia-h100-80gb", "count": n}
    lines = errors_of(stack_config(GCP_BASE, jobs=[gcp_job(machineType=machine, accelerator=acc, capacity="on-demand")]))
    assert len(lines) == 1 and lines[0].startswith(f"{SRC}: spotctl:jobs[0].capacity: {machine} runs only as a Spot")
    assert "cloud.google.com/compute/docs/gpus" in lines[0]
    pool = {"name": "h", "machineType": machine, "onDemand": 1, "spotMax": 2}
    assert errors_of(stack_config(GCP_BASE, pools=[pool]))[0].startswith(f"{SRC}: spotctl:pools[0].onDemand: {machine} runs only")
    validate(stack_config(GCP_BASE, jobs=[gcp_job(machineType=machine, accelerator=acc)]), SRC)  # spot is fine


def test_failover_to_on_demand_of_a_spot_only_job_is_refused(project, runner):
    write(project, "h", stack_config(GCP_BASE, jobs=[gcp_job(machineType="a3-highgpu-1g", state="preempted", attempt=2)]))
    path = project / "stacks" / "Pulumi.h.yaml"
    before = path.read_text()
    result = runner.invoke(app, ["failover", "train", "--stack", "h", "--to", "on-demand", "--no-apply"])
    assert result.exit_code == 1
    lines = result.output.splitlines()
    assert len(lines) == 1 and "spotctl:jobs[0].capacity: a3-highgpu-1g runs only as a Spot (or Flex-start) VM" in lines[0]
    assert path.read_text() == before


def test_the_spot_only_rule_checks_vms():
    rule = contract.get("gcp.a3-high-spot-only")
    vm = {"machine_type": "a3-highgpu-2g", "scheduling": {"provisioning_model": "STANDARD"}}
    assert rule.check("gcp:compute/instance:Instance", vm) == "a3-highgpu-2g with provisioning_model 'STANDARD'"
    vm["scheduling"]["provisioning_model"] = "SPOT"
    assert rule.check("gcp:compute/instance:Instance", vm) is None


def test_gcp_label_rules_cite_their_source():
    lines = errors_of(stack_config(GCP_BASE, labels={"Team": "a"}))
    assert lines == [f"{SRC}: spotctl:labels.Team: labels must be lowercase letters, digits, '-' or '_', keys starting with a "
                     "letter, at most 63 characters (GCP label rules, which spotctl applies on both clouds: "
                     "https://cloud.google.com/resource-manager/docs/labels-overview#requirements)"]


@pytest.mark.parametrize("stack", ["example-aws", "example-gcp"])
def test_the_example_stacks_pass_the_limits(stack):
    from pathlib import Path

    from infra.config import namespaced
    from infra.stack_limits import stack_problems

    path = Path(__file__).resolve().parent.parent / "stacks" / f"Pulumi.{stack}.yaml"
    cfg = validate(namespaced(yaml.safe_load(path.read_text())["config"], str(path)), str(path))
    assert stack_problems(cfg, stack) == []


def test_no_policy_picks_on_demand_for_a_spot_only_machine_type():
    from datetime import UTC, datetime, timedelta

    from cli.lifecycle.capacity import policy_capacity
    from cli.lifecycle.events import Event
    from infra.basics import Capacity
    from infra.config import Job

    t0 = datetime(2026, 1, 1, tzinfo=UTC)
    runs = [(1, 0, 30), (2, 40, 70), (3, 80, 110)]  # three attempts, each preempted
    events = [Event.parse({"event": kind, "job": "j", "attempt": n, "node": 0, "time": (t0 + timedelta(minutes=m)).isoformat()})
              for n, a, b in runs for kind, m in (("started", a), ("preempted", b))]
    choose = policy_capacity(now=lambda: t0 + timedelta(hours=3))

    def job(machine: str) -> Job:
        return Job.model_validate({"id": "j", "machineType": machine, "zone": "us-central1-a", "command": "x",
                                   "policy": "n-preemptions", "state": "preempted", "attempt": 4})

    assert choose(job("a3-highgpu-8g"), events) is Capacity.ON_DEMAND  # 3 preemptions: on-demand for good
    assert choose(job("a3-highgpu-1g"), events) is Capacity.SPOT  # ... except where GCE has none


def test_plan_refuses_a_goog_stack_name_before_evaluating_the_program(project, runner):
    write(project, "goog-ml", stack_config(GCP_BASE, jobs=[gcp_job()]))
    result = runner.invoke(app, ["plan", "--stack", "goog-ml"])
    assert result.exit_code == 1
    assert result.output.startswith("error: stacks/Pulumi.goog-ml.yaml: stack name 'goog-ml': ") and result.output.count("\n") == 1
