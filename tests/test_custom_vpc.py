"""Custom VPCs: real subnet ids of one VPC share nothing (random suffixes). The plan mocks used to
derive a subnet's VPC from its id, so three real subnets made every runtime command fail with a
made-up "subnets in several VPCs" (a traceback). Rules on look-ups' answers are now checked where
the answers are real (the engine's preview; a test's mock account) and noted offline."""

from __future__ import annotations

import random
import re

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from cli.app import app
from cli.plan import mocks as planner
from infra import contract
from infra.config import validate
from infra.contract import ContractError
from tests.conftest import AWS_BASE, aws_job, stack_config

HEX = "0123456789abcdef"
SUBNET = st.text(HEX, min_size=17, max_size=17).map(lambda h: f"subnet-{h}")


@settings(max_examples=5, deadline=None)
@given(ids=st.lists(SUBNET, min_size=2, max_size=2, unique=True))
def test_random_subnet_ids_plan_offline_with_a_note(ids):
    raw = stack_config(AWS_BASE, jobs=[aws_job()], network={"subnets": dict(zip(AWS_BASE["zones"], ids, strict=True))})
    plan = planner.run(validate(raw, "t"), "team")
    assert plan.by_type("aws:ec2/instance:Instance")
    assert any(n.startswith("aws.subnets-one-vpc not checked offline: it needs each subnet's VPC") for n in plan.notes)


def test_the_rule_still_holds_where_the_answers_are_real():
    """A test's account stands for the real one (as the engine's preview asks EC2): two VPCs refused."""
    raw = stack_config(AWS_BASE, jobs=[aws_job()],
                       network={"subnets": {"us-east-1a": "subnet-0a1b2c3d4e5f67890", "us-east-1b": "subnet-09f8e7d6c5b4a3210"}})
    account = planner.MockAccount(subnet_vpcs={"subnet-0a1b2c3d4e5f67890": "vpc-0aaa", "subnet-09f8e7d6c5b4a3210": "vpc-0bbb"})
    with pytest.raises(ContractError, match="aws.subnets-one-vpc"):
        planner.run(validate(raw, "t"), "team", account)
    assert not planner.run(validate(raw, "t"), "team", planner.MockAccount()).notes


def test_lookup_rules_are_marked_in_the_contract_table():
    looked = {r.id for r in contract.rules() if r.lookup}
    assert {"aws.subnets-one-vpc", "aws.subnet-in-its-zone", "aws.default-vpc-or-subnets",
            "aws.endpoint-names-need-vpc-dns", "aws.root-volume-covers-snapshot"} <= looked


def random_subnets(project, seed: int) -> list[str]:
    rng = random.Random(seed)
    ids = [f"subnet-0{''.join(rng.choice(HEX) for _ in range(16))}" for _ in range(3)]
    path = project / "stacks" / "Pulumi.example-aws.yaml"
    text = path.read_text()
    for n, sid in enumerate(ids, 1):
        text = re.sub(rf"subnet-0a1b2c3d4e5f6000{n}\b", sid, text)
    path.write_text(text)
    return ids


COMMANDS = [
    ["plan"],
    ["resume", "diffusion", "--yes", "--events-dir", "events"],
    ["failover", "llm-pretrain", "--to", "on-demand", "--yes"],
    ["complete", "llm-pretrain", "--yes"],
    ["move", "llm-pretrain", "--to-zone", "us-east-1b", "--yes", "--events-dir", "events"],
    ["cleanup", "llm-pretrain"],
    ["watch", "--once", "--no-poll", "--events-dir", "events"],
]


@pytest.mark.parametrize("cmd", COMMANDS, ids=lambda c: c[0])
def test_every_runtime_command_runs_on_a_custom_vpc(project, runner, fake_pulumi, cmd, monkeypatch):
    random_subnets(project, 42)
    (project / "events").mkdir()
    if cmd[0] == "cleanup":  # a completed job's cleanup plans what it deletes (a listing: no --yes)
        path = project / "stacks" / "Pulumi.example-aws.yaml"
        text = path.read_text()
        at = text.index("id: llm-pretrain")
        path.write_text(text[:at] + text[at:].replace("state: running", "state: completed", 1))
    result = runner.invoke(app, [*cmd, "--stack", "example-aws"])
    assert "several VPCs" not in result.output and result.exception is None or isinstance(result.exception, SystemExit)
    assert result.exit_code == 0, result.output
