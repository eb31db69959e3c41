"""The contract (infra/contract): one table of cloud rules with sources, checked on every resource at
registration by a stack transformation, under the mocks exactly as in the real program."""

from __future__ import annotations

import pytest
from typer.testing import CliRunner

from cli.app import app
from infra import contract
from infra.contract import UNKNOWN, ContractError

runner = CliRunner()


def test_every_rule_says_what_why_and_where_from():
    rules = contract.rules()
    assert len({r.id for r in rules}) == len(rules) >= 2
    for r in rules:
        assert r.id.split(".")[0] in ("aws", "gcp"), r.id
        assert r.says and r.fix, r.id
        assert "https://" in r.source or ".go" in r.source or ".py" in r.source, f"{r.id}: no citable source"
        assert r.types or r.check is None, r.id


def test_imdsv2_rule_names_resource_rule_and_fix():
    props = {"metadata_options": {"http_tokens": "optional"}}
    with pytest.raises(ContractError) as err:
        contract.check("aws:ec2/launchTemplate:LaunchTemplate", "pool-x", props)
    text = str(err.value)
    assert "pool-x" in text and "aws.imdsv2-required" in text and "fix:" in text and "source: https://" in text
    contract.check("aws:ec2/launchTemplate:LaunchTemplate", "pool-x", {"metadata_options": {"http_tokens": "required"}})
    # unknown at registration: not judged now (checked again when it resolves)
    contract.check("aws:ec2/launchTemplate:LaunchTemplate", "pool-x", {"metadata_options": {"http_tokens": UNKNOWN}})


def test_gcp_metadata_value_limit():
    ok = {"metadata": {"startup-script": "x" * 1000}}
    contract.check("gcp:compute/instance:Instance", "vm", ok)
    with pytest.raises(ContractError, match="gcp.metadata-value-256k"):
        contract.check("gcp:compute/instance:Instance", "vm", {"metadata": {"startup-script": "x" * (256 * 1024 + 1)}})


def test_a_violation_in_the_program_fails_plan_with_one_clear_error(monkeypatch):
    """The transformation runs inside the real program under mocks: a component that declares
    IMDSv1 is stopped at registration, and `spotctl plan` prints the rule instead of a traceback."""
    from infra import aws_common as aws

    def imdsv1(cls):
        return cls(http_endpoint="enabled", http_tokens="optional", http_put_response_hop_limit=2, instance_metadata_tags="disabled")

    monkeypatch.setattr(aws, "_metadata_options", imdsv1)
    result = runner.invoke(app, ["plan", "--stack", "example-aws"])
    assert result.exit_code == 1
    assert "error: aws:ec2/" in result.output and "rule aws.imdsv2-required" in result.output
    assert "Traceback" not in result.output


@pytest.mark.parametrize("stack", ["example-aws", "example-gcp"])
def test_example_stacks_obey_every_rule(stack):
    result = runner.invoke(app, ["plan", "--stack", stack, "--json"])
    assert result.exit_code == 0, result.output


def test_a_violation_known_only_after_registration_fails_plan(monkeypatch):
    """A value unknown at registration (here the event-writer condition, built from the bucket's name)
    is checked when it resolves: the rule still stops `spotctl plan` with one clear error."""
    from infra import gcp

    monkeypatch.setattr(gcp, "event_object_prefix", lambda stack, name: f"{stack}/{name}")  # no trailing slash
    result = runner.invoke(app, ["plan", "--stack", "example-gcp"])
    assert result.exit_code == 1
    assert "rule gcp.event-writer-prefix" in result.output and "Traceback" not in result.output


def test_a_single_unknown_value_is_checked_when_it_resolves(monkeypatch):
    """A resource whose only unknown input is one Output (a role's permissions boundary, the
    boundary policy's ARN) is judged when that value resolves: a wrong one stops `spotctl plan`."""
    from cli.plan import mocks

    real = mocks._mock_outputs

    def wrong_boundary(typ, name, inputs, project, region, *rest):
        rid, out = real(typ, name, inputs, project, region, *rest)
        if typ == "aws:iam/policy:Policy":
            out["arn"] = "arn:aws:iam::123456789012:policy/someone-else"
        return rid, out

    monkeypatch.setattr(mocks, "_mock_outputs", wrong_boundary)
    result = runner.invoke(app, ["plan", "--stack", "example-aws"])
    assert result.exit_code == 1
    assert "rule aws.role-permissions-boundary" in result.output and "someone-else" in result.output
    assert "Traceback" not in result.output
