"""`spotctl:watcher`: config validation, the declared VM and identity on both clouds (Pulumi mocks), the
identity's policy contents, the contract rules, and the rendered startup script."""

from __future__ import annotations

import base64
import fnmatch
import gzip
import json
import shutil
import subprocess
from functools import cache
from pathlib import Path

import pytest
import yaml

from cli.plan import mocks as planner
from infra import contract
from infra.config import ConfigError, validate
from infra.contract import ContractError
from infra.naming import owner_value
from tests.conftest import AWS_BASE, GCP_BASE, aws_job, gcp_job, stack_config

SNAPSHOTS = Path(__file__).parent / "snapshots"
AWS_WATCHER = {"backend": "s3://team-state/pulumi", "repo": "https://github.com/team/infra.git",
               "passphraseSecret": "/spotctl/team-a/passphrase"}
GCP_WATCHER = {"backend": "gs://team-state/pulumi", "repo": "https://github.com/team/infra.git",
               "passphraseSecret": "pulumi-passphrase"}
NAT = {"subnets": {"us-east-1a": "subnet-0aaa0001", "us-east-1b": "subnet-0aaa0002"}, "egress": "nat", "natSubnet": "subnet-0aaa0009"}


def aws_raw(watcher: dict | None = AWS_WATCHER, network: dict | None = None) -> dict:
    raw = stack_config(AWS_BASE, network=network or NAT, jobs=[aws_job()])
    return {**raw, "watcher": watcher} if watcher is not None else raw


def gcp_raw(watcher: dict | None = GCP_WATCHER) -> dict:
    raw = stack_config(GCP_BASE, jobs=[gcp_job(), gcp_job(id="other", nodes=2)])
    return {**raw, "watcher": watcher} if watcher is not None else raw


@cache
def _plan(key: str) -> planner.Plan:
    return planner.run(validate(json.loads(key), "test"), "team-a")


def plan_of(raw: dict) -> planner.Plan:
    return _plan(json.dumps(raw, sort_keys=True))


def only(plan, type_, name):
    found = [r for r in plan.by_type(type_) if r.name == name]
    assert len(found) == 1, [r.name for r in plan.by_type(type_)]
    return found[0]


def errors(raw: dict) -> str:
    with pytest.raises(ConfigError) as err:
        validate(raw, "stacks/Pulumi.team-a.yaml")
    return str(err.value)


# ---- config -----------------------------------------------------------------------------------


def test_a_valid_watcher_gets_the_clouds_defaults():
    aws = validate(aws_raw(), "x")
    assert aws.watcher.machine("aws") == "t3.small" and aws.watcher_zone == "us-east-1a"
    assert aws.watcher.backend_parts() == ("s3", "team-state", "pulumi/")
    gcp = validate(gcp_raw({**GCP_WATCHER, "zone": "us-central1-b", "machineType": "e2-medium"}), "x")
    assert gcp.watcher.machine("gcp") == "e2-medium" and gcp.watcher_zone == "us-central1-b"


@pytest.mark.parametrize("change, key, words", [
    ({"backend": "gs://team-state"}, "spotctl:watcher.backend", "gs:// backend on AWS"),
    ({"backend": "https://api.pulumi.com"}, "spotctl:watcher.backend", "DIY Pulumi backend"),
    ({"passphraseSecret": None}, "spotctl:watcher.passphraseSecret", "required with secretsProvider 'passphrase'"),
    ({"machineType": "e2-small"}, "spotctl:watcher.machineType", "not used on AWS; use instanceType"),
    ({"zone": "us-east-1c"}, "spotctl:watcher.zone", "expected one of 'us-east-1a', 'us-east-1b'"),
    ({"repo": "https://user:token@github.com/team/infra.git"}, "spotctl:watcher.repo", "without credentials"),
    ({"ref": "main;reboot"}, "spotctl:watcher.ref", "git branch, tag or commit"),
    ({"secretsProvider": "awskms://alias/pulumi", "passphraseSecret": None}, "spotctl:watcher.secretsProvider",
     "not an alias"),
    ({"secretsProvider": "awskms://1234abcd-12ab-34cd-56ef-1234567890ab"}, "spotctl:watcher.passphraseSecret",
     "only used with secretsProvider 'passphrase'"),
    ({"bakend": "x"}, "spotctl:watcher.bakend", "did you mean 'backend'"),
    ({"pulumiVersion": "latest"}, "spotctl:watcher.pulumiVersion", "a version such as"),
])
def test_bad_watcher_keys_are_named(change, key, words):
    watcher = {k: v for k, v in {**AWS_WATCHER, **change}.items() if v is not None}
    text = errors(aws_raw(watcher))
    assert f"{key}: " in text and words in text, text


def test_aws_watcher_needs_a_way_to_the_internet():
    raw = aws_raw(network={"egress": "s3-endpoint"})
    assert "spotctl:watcher.externalIp: the watcher needs the internet" in errors(raw)
    validate(aws_raw({**AWS_WATCHER, "externalIp": True}, network={"egress": "s3-endpoint"}), "x")
    validate(aws_raw(network={"egress": "public-ip"}), "x")


def test_gcp_kms_provider_is_checked():
    ok = {**GCP_WATCHER, "secretsProvider": "gcpkms://projects/proj-1/locations/global/keyRings/r/cryptoKeys/k"}
    ok.pop("passphraseSecret")
    validate(gcp_raw(ok), "x")
    bad = {**ok, "secretsProvider": "awskms://1234abcd-12ab-34cd-56ef-1234567890ab"}
    assert "spotctl:watcher.secretsProvider: expected 'passphrase' or 'gcpkms://" in errors(gcp_raw(bad))


def test_validate_command_names_the_key_and_exits_non_zero(project, runner):
    from cli.app import app

    path = project / "stacks" / "Pulumi.example-aws.yaml"
    doc = yaml.safe_load(path.read_text())
    doc["config"]["spotctl:watcher"] = {**AWS_WATCHER, "backend": "gs://team-state"}
    before = yaml.safe_dump(doc)
    path.write_text(before)
    result = runner.invoke(app, ["validate", "--stack", "example-aws"])
    assert result.exit_code != 0
    assert "spotctl:watcher.backend: a gs:// backend on AWS" in result.output
    assert path.read_text() == before


# ---- plans ------------------------------------------------------------------------------------


@pytest.mark.parametrize("raw", [aws_raw(None), gcp_raw(None)], ids=["aws", "gcp"])
def test_without_watcher_nothing_is_declared(raw):
    plan = plan_of(raw)
    assert not [r.urn for r in plan.resources if "Watcher" in r.type or "watcher" in r.name]
    assert "watcher" not in plan.outputs


def test_aws_watcher_vm_is_small_on_demand_imdsv2_encrypted_private():
    plan = plan_of(aws_raw())
    vm = only(plan, "aws:ec2/instance:Instance", "watcher-vm").inputs
    assert vm["instanceType"] == "t3.small" and "instanceMarketOptions" not in vm
    assert vm["metadataOptions"]["httpTokens"] == "required"
    assert vm["rootBlockDevice"]["encrypted"] is True and vm["rootBlockDevice"]["volumeSize"] >= 20  # grown to the image's snapshot
    assert vm["associatePublicIpAddress"] is False and vm["availabilityZone"] == "us-east-1a"
    assert vm["subnetId"] == "subnet-0aaa0001" and vm["userDataReplaceOnChange"] is True
    script = gzip.decompress(base64.b64decode(vm["userDataBase64"])).decode()
    assert "STACK=team-a" in script and "spotctl-watch@" in script
    assert len(vm["vpcSecurityGroupIds"]) == 1  # its own group: egress only, no ingress rule
    watcher = only(plan, "spotctl:aws:Watcher", "watcher").urn
    assert [r.type.rsplit(":", 1)[1] for r in plan.resources if r.parent == watcher and "SecurityGroup" in r.type] == [
        "SecurityGroup", "SecurityGroupEgressRule"]
    assert plan.outputs["watcher"]["zone"] == "us-east-1a"
    public = plan_of(aws_raw(network={"egress": "public-ip"}))
    assert only(public, "aws:ec2/instance:Instance", "watcher-vm").inputs["associatePublicIpAddress"] is True


def aws_policy(raw: dict) -> dict:
    return json.loads(only(plan_of(raw), "aws:iam/rolePolicy:RolePolicy", "watcher-policy").inputs["policy"])


def test_aws_watcher_policy_is_scoped():
    statements = {s["Sid"]: s for s in aws_policy(aws_raw())["Statement"]}
    owner = owner_value("team-a")
    assert statements["ReadInterruptionQueue"]["Resource"].startswith("arn:aws:sqs:")
    assert statements["ReadEvents"]["Action"] == "s3:GetObject"
    assert statements["ListPulumiState"]["Condition"] == {"StringLike": {"s3:prefix": ["pulumi/*"]}}
    assert statements["ReadWritePulumiState"]["Resource"] == "arn:aws:s3:::team-state/pulumi/*"
    assert statements["ReadPassphrase"]["Resource"] == "arn:aws:ssm:us-east-1:*:parameter/spotctl/team-a/passphrase"
    for sid in ("LaunchOwned",):
        assert statements[sid]["Condition"] == {"StringEquals": {"aws:RequestTag/spotctl:owner": owner}}
    for sid in ("UseOwned", "ManageOwned"):
        assert statements[sid]["Condition"] == {"StringEquals": {"aws:ResourceTag/spotctl:owner": owner}}
    # Nothing that creates, changes or deletes EC2 resources is granted without an ownership condition,
    # except on resources a launch only references, what RunInstances creates untagged beside the
    # instance (its root volume and network interface: RunInstances only), and cancelling a spot
    # request (which never ends an instance).
    unconditioned = {}
    for s in statements.values():
        actions = [s["Action"]] if isinstance(s["Action"], str) else s["Action"]
        mutating = [a for a in actions if a.startswith("ec2:") and not a.startswith("ec2:Describe")]
        if mutating and "Condition" not in s:
            unconditioned[s["Sid"]] = s
    assert sorted(unconditioned) == ["CancelSpotRequests", "LaunchCreates", "LaunchUsing"]
    assert not any(r.endswith((":instance/*", ":volume/*", ":snapshot/*")) for r in unconditioned["LaunchUsing"]["Resource"])
    assert unconditioned["LaunchCreates"]["Action"] == "ec2:RunInstances"
    assert [r.rsplit(":", 1)[1] for r in unconditioned["LaunchCreates"]["Resource"]] == ["volume/*", "network-interface/*"]
    assert unconditioned["CancelSpotRequests"]["Resource"] == "arn:aws:ec2:us-east-1:*:spot-instances-request/*"
    assert "TagRootVolumes" not in statements  # root volumes go untagged (infra/aws.py): no volume is claimable
    for s in statements.values():
        actions = [s["Action"]] if isinstance(s["Action"], str) else s["Action"]
        assert s["Resource"] != "*" or s["Effect"] == "Deny" or actions == [
            "ec2:Describe*", "ssm:DescribeParameters", "sts:GetCallerIdentity"], s
    assert statements["JobSecretEnv"]["Resource"] == "arn:aws:ssm:us-east-1:*:parameter/spotctl/team-a/*/env"
    passrole = statements["PassJobRoles"]
    assert passrole["Resource"] == "arn:aws:iam::*:role/spotctl/spotctl-team-a-*"
    assert passrole["Condition"] == {"StringEquals": {"iam:PassedToService": "ec2.amazonaws.com",
                                                      "aws:ResourceTag/spotctl:owner": owner}}


def test_aws_watcher_cannot_pass_or_change_its_own_role():
    plan = plan_of(aws_raw())
    role = only(plan, "aws:iam/role:Role", "watcher-role").inputs
    own = f"arn:aws:iam::123456789012:role{role['path']}{role['namePrefix']}abc"
    job_role = only(plan, "aws:iam/role:Role", "job-train-role").inputs
    job = f"arn:aws:iam::123456789012:role{job_role['path']}{job_role['namePrefix']}abc"
    for s in aws_policy(aws_raw())["Statement"]:
        if s["Sid"] in ("CreateJobRoles", "ChangeBoundedJobRoles", "ManageOwnedJobRoles", "PassJobRoles"):
            resources = s["Resource"] if isinstance(s["Resource"], list) else [s["Resource"]]
            assert not any(fnmatch.fnmatchcase(own, r) for r in resources)
            assert any(fnmatch.fnmatchcase(job, r) for r in resources)


def test_aws_kms_secrets_provider_grants_the_key_only():
    watcher = {**AWS_WATCHER, "secretsProvider": "awskms://1234abcd-12ab-34cd-56ef-1234567890ab?region=us-east-1"}
    watcher.pop("passphraseSecret")
    statements = {s["Sid"]: s for s in aws_policy(aws_raw(watcher))["Statement"]}
    assert "ReadPassphrase" not in statements
    assert statements["StackSecrets"]["Resource"] == "arn:aws:kms:us-east-1:*:key/1234abcd-12ab-34cd-56ef-1234567890ab"


def test_gcp_watcher_vm_and_identity():
    plan = plan_of(gcp_raw())
    vm = only(plan, "gcp:compute/instance:Instance", "watcher-vm").inputs
    assert vm["machineType"] == "e2-small" and vm["zone"] == "us-central1-a" and vm["name"] == "team-a-watcher"
    assert vm["scheduling"]["provisioningModel"] == "STANDARD" and vm["scheduling"]["preemptible"] is False
    assert vm["shieldedInstanceConfig"] == {"enableIntegrityMonitoring": True, "enableSecureBoot": True, "enableVtpm": True}
    assert not vm["networkInterfaces"][0].get("accessConfigs")
    assert vm["metadata"] == {"enable-oslogin": "TRUE", "block-project-ssh-keys": "TRUE"}
    assert "spotctl-watch@" in vm["metadataStartupScript"]
    email = plan.outputs["watcher"]["serviceAccount"]
    member = f"serviceAccount:{email}"
    assert vm["serviceAccount"]["email"] == email
    sub = only(plan, "gcp:pubsub/subscriptionIAMMember:SubscriptionIAMMember", "watcher-subscriber").inputs
    assert (sub["role"], sub["member"], sub["subscription"]) == ("roles/pubsub.subscriber", member, "team-a-preemptions-watch")
    events = only(plan, "gcp:storage/bucketIAMMember:BucketIAMMember", "watcher-events-reader").inputs
    assert events["role"] == "roles/storage.objectViewer" and events["bucket"].startswith("team-a-events-")
    state = only(plan, "gcp:storage/bucketIAMMember:BucketIAMMember", "watcher-state").inputs
    assert state["bucket"] == "team-state" and state["role"] == "roles/storage.objectAdmin"
    assert state["condition"]["expression"] == 'resource.name.startsWith("projects/_/buckets/team-state/objects/pulumi/")'
    secret = only(plan, "gcp:secretmanager/secretIamMember:SecretIamMember", "watcher-passphrase").inputs
    assert secret["secretId"] == "projects/proj-1/secrets/pulumi-passphrase"
    assert secret["role"] == "roles/secretmanager.secretAccessor"
    computes = [r.inputs for r in plan.by_type("gcp:projects/iAMMember:IAMMember") if r.name.startswith("watcher-compute-")]
    assert all(c["role"] == "projects/proj-1/roles/spotctl_team_a_watcher" and c["member"] == member for c in computes)
    expr = " || ".join(c["condition"]["expression"] for c in computes)
    assert 'resource.name.startsWith("projects/proj-1/zones/us-central1-a/instances/team-a-")' in expr
    # a regional job disk (diskReplicaZones) is named under its region, not a zone
    assert 'resource.name.startsWith("projects/proj-1/regions/us-central1/disks/team-a-")' in expr
    assert "resource.type !=" not in expr  # no catch-all: the role holds nothing on other types (test_watcher_iam)
    # actAs on exactly the jobs' own accounts, declared inside each job (cleanup removes it with the job)
    users = plan.by_type("gcp:serviceaccount/iAMMember:IAMMember")
    assert sorted(u.name for u in users) == ["job-other-sa-watcher-user", "job-train-sa-watcher-user"]
    assert all(u.inputs["role"] == "roles/iam.serviceAccountUser" and u.inputs["member"] == member for u in users)
    assert all(u.parent.endswith(u.name.removesuffix("-sa-watcher-user")) for u in users)

    assert not [r for r in plan.by_type("gcp:projects/iAMMember:IAMMember")
                if r.inputs["member"] == member and "iam.serviceAccountUser" in r.inputs["role"]]


# ---- contract ---------------------------------------------------------------------------------


def test_role_policy_size_rule():
    contract.check("aws:iam/rolePolicy:RolePolicy", "p", {"policy": json.dumps(aws_policy(aws_raw()))})
    with pytest.raises(ContractError, match="aws.role-inline-policy-10240"):
        contract.check("aws:iam/rolePolicy:RolePolicy", "p", {"policy": "x" * 10_241})
    contract.check("aws:iam/rolePolicy:RolePolicy", "p", {"policy": "x" * 10_240 + " " * 100})


def test_passrole_rule_catches_a_renamed_job_role(monkeypatch):
    from infra import aws_common as aws

    monkeypatch.setattr(aws, "job_role_naming", lambda slug: ("/jobs/", f"spotctl-{slug}-"))
    with pytest.raises(ContractError, match="aws.passrole-covers-job-roles"):
        planner.run(validate(aws_raw(), "x"), "team-b")


def test_gcp_condition_rule_catches_a_renamed_instance(monkeypatch):
    from infra import gcp_watcher

    monkeypatch.setattr(gcp_watcher, "instance_name", lambda slug, job, attempt, rank: f"vm-{slug}-{job}")
    with pytest.raises(ContractError, match="gcp.watcher-condition-covers-names"):
        planner.run(validate(gcp_raw(), "x"), "team-b")


# ---- the script -------------------------------------------------------------------------------


def scripts() -> dict[str, str]:
    aws = plan_of(aws_raw())
    gcp = plan_of(gcp_raw())
    return {
        "watcher-aws.user-data.sh": gzip.decompress(base64.b64decode(
            only(aws, "aws:ec2/instance:Instance", "watcher-vm").inputs["userDataBase64"])).decode(),
        "watcher-gcp.startup.sh": only(gcp, "gcp:compute/instance:Instance", "watcher-vm").inputs["metadataStartupScript"],
    }


def test_scripts_are_shellcheck_clean_and_match_their_snapshots(tmp_path):
    import os

    shellcheck = shutil.which("shellcheck")
    assert shellcheck
    for name, text in scripts().items():
        path = tmp_path / name
        path.write_text(text)
        result = subprocess.run([shellcheck, "-s", "bash", str(path)], capture_output=True, text=True)
        assert result.returncode == 0, result.stdout
        golden = SNAPSHOTS / name
        if os.environ.get("UPDATE_SNAPSHOT"):
            golden.write_text(text)
        assert golden.read_text() == text, f"{name} changed: UPDATE_SNAPSHOT=1 to accept"


def test_template_refuses_a_missing_variable():
    import jinja2

    from infra.render import environment

    with pytest.raises(jinja2.UndefinedError):
        environment().get_template("watcher/startup.sh.j2").render(cloud="aws")


# ---- what the watcher runs reaches it -----------------------------------------------------------
# The providers' rules on the VMs' scripts: AWS replaces an instance whose user_data_base64 changes
# when user_data_replace_on_change is set (ForceNewIf, terraform-provider-aws
# internal/service/ec2/ec2_instance.go), else updates it in place, and user data runs only at an
# instance's first boot; GCP replaces an instance whose metadata_startup_script changes (ForceNewIf,
# terraform-provider-google resource_compute_instance.go), while metadata["startup-script"] is
# updated in place and runs only at the next boot.


def replaced(before: planner.Resource, after: planner.Resource) -> bool:
    if before.type == "aws:ec2/instance:Instance":
        return after.inputs["userDataReplaceOnChange"] is True and before.inputs["userDataBase64"] != after.inputs["userDataBase64"]
    return before.inputs.get("metadataStartupScript") != after.inputs.get("metadataStartupScript")


@pytest.mark.parametrize("cloud, change", [
    ("aws", {"ref": "v2"}), ("aws", {"backend": "s3://team-state/other"}), ("aws", {"pulumiVersion": "3.230.0"}),
    ("gcp", {"ref": "v2"}), ("gcp", {"backend": "gs://team-state/other"}), ("gcp", {"uvVersion": "0.14.0"}),
])
def test_a_changed_ref_backend_or_version_replaces_the_watcher_vm(cloud, change):
    raw, watcher, vm_type = ((aws_raw, AWS_WATCHER, "aws:ec2/instance:Instance") if cloud == "aws"
                             else (gcp_raw, GCP_WATCHER, "gcp:compute/instance:Instance"))
    before = only(plan_of(raw(watcher)), vm_type, "watcher-vm")
    after = only(plan_of(raw({**watcher, **change})), vm_type, "watcher-vm")
    again = only(plan_of(raw(dict(watcher))), vm_type, "watcher-vm")
    assert replaced(before, after) and not replaced(before, again)  # the same config: no replacement
    # The old VM goes first (the lease is a lock on its own disk), and an unchanged script keeps the VM.
    assert after.delete_before_replace is True
    assert before.inputs == again.inputs

