"""The watcher's identity is exact to its stack (a stack named like an extension of this one, `team`
and `team-b`, gets nothing) and the job and pool roles it may create or change stay inside the
stack's permissions boundary. Policies are evaluated with tests/iam_eval.py (the IAM logic for one
identity policy); plans run the real program under Pulumi's mocks."""

from __future__ import annotations

import json
from functools import cache

import pytest

from cli.plan import mocks as planner
from infra import contract
from infra.config import validate
from infra.contract import ContractError
from infra.contract.gcp import logic_operators
from infra.naming import owner_value, ssm_parameter_name, stack_slug
from tests.conftest import AWS_BASE, GCP_BASE, N1_T4, aws_job, gcp_job, stack_config
from tests.iam_eval import allowed, condition_holds

AWS_WATCHER = {"backend": "s3://team-state/pulumi", "repo": "https://github.com/team/infra.git",
               "passphraseSecret": "/spotctl/team/passphrase"}
NAT = {"subnets": {"us-east-1a": "subnet-0aaa0001", "us-east-1b": "subnet-0aaa0002"}, "egress": "nat",
       "natSubnet": "subnet-0aaa0009"}
POOL = {"name": "g5", "instanceTypes": ["g5.2xlarge"], "accelerator": {"type": "nvidia-a10g", "count": 1},
        "onDemand": 1, "spotMin": 0, "spotMax": 4}
ACCOUNT = "123456789012"


def aws_raw(**over) -> dict:
    return {**stack_config(AWS_BASE, network=NAT, jobs=[aws_job(), aws_job(id="b-x")], pools=[POOL]),
            "watcher": AWS_WATCHER, **over}


@cache
def plan(stack: str) -> planner.Plan:
    return planner.run(validate(aws_raw(), "test"), stack)


def only(p: planner.Plan, type_: str, name: str):
    found = [r for r in p.by_type(type_) if r.name == name]
    assert len(found) == 1, [r.name for r in p.by_type(type_)]
    return found[0]


def watcher_policy(stack: str) -> dict:
    return json.loads(only(plan(stack), "aws:iam/rolePolicy:RolePolicy", "watcher-policy").inputs["policy"])


def boundary_arn(stack: str) -> str:
    return f"arn:aws:iam::{ACCOUNT}:policy/spotctl/spotctl-{stack_slug(stack)}-boundary"


def job_role(stack: str, job: str = "train") -> tuple[str, str]:
    """(role ARN, profile ARN) as IAM names a job's (a made-up suffix for the generated part)."""
    inputs = only(plan(stack), "aws:iam/role:Role", f"job-{job}-role").inputs
    profile = only(plan(stack), "aws:iam/instanceProfile:InstanceProfile", f"job-{job}-profile").inputs
    return (f"arn:aws:iam::{ACCOUNT}:role{inputs['path']}{inputs['namePrefix']}20260101000000000000000001",
            f"arn:aws:iam::{ACCOUNT}:instance-profile{profile['path']}{profile['namePrefix']}20260101000000000000000002")


# What a targeted update of a job does to its role and profile (terraform-provider-aws
# internal/service/iam/role.go and instance_profile.go create/read/update/delete).
ROLE_READS = ["iam:GetRole", "iam:ListRolePolicies", "iam:GetRolePolicy", "iam:ListAttachedRolePolicies",
              "iam:ListInstanceProfilesForRole"]
ROLE_CHANGES = ["iam:PutRolePolicy", "iam:DeleteRolePolicy"]
PROFILE_ACTIONS = ["iam:GetInstanceProfile", "iam:AddRoleToInstanceProfile", "iam:RemoveRoleFromInstanceProfile",
                   "iam:DeleteInstanceProfile"]


def test_the_watcher_manages_its_own_stacks_job_identities():
    policy, role, profile = watcher_policy("team"), *job_role("team")
    own = {"aws:ResourceTag/spotctl:owner": owner_value("team"), "iam:PermissionsBoundary": boundary_arn("team")}
    for action in ROLE_READS + ["iam:DeleteRole"]:
        assert allowed(policy, action, role, **{"aws:ResourceTag/spotctl:owner": owner_value("team")}), action
    for action in ROLE_CHANGES:
        assert allowed(policy, action, role, **own), action
    for action in PROFILE_ACTIONS:
        assert allowed(policy, action, profile, **{"aws:ResourceTag/spotctl:owner": owner_value("team")}), action
    assert allowed(policy, "iam:CreateRole", role, **{"aws:RequestTag/spotctl:owner": owner_value("team"),
                                                      "iam:PermissionsBoundary": boundary_arn("team")})
    assert allowed(policy, "iam:CreateInstanceProfile", profile, **{"aws:RequestTag/spotctl:owner": owner_value("team")})
    assert allowed(policy, "iam:PassRole", role, **{"iam:PassedToService": "ec2.amazonaws.com",
                                                    "aws:ResourceTag/spotctl:owner": owner_value("team")})


def test_a_stack_whose_name_extends_this_one_gets_nothing():
    """`team`'s patterns (role/spotctl/spotctl-team-*) also match team-b's roles by name; the owner tag
    and the boundary refuse every action on them."""
    policy = watcher_policy("team")
    role, profile = job_role("team-b")
    theirs = {"aws:ResourceTag/spotctl:owner": owner_value("team-b"), "iam:PermissionsBoundary": boundary_arn("team-b"),
              "iam:PassedToService": "ec2.amazonaws.com"}
    assert role.startswith("arn:aws:iam::123456789012:role/spotctl/spotctl-team-b-")
    for action in ROLE_READS + ROLE_CHANGES + ["iam:DeleteRole", "iam:PassRole", "iam:TagRole", "iam:UntagRole",
                                                 "iam:PutRolePermissionsBoundary"]:
        assert not allowed(policy, action, role, **theirs), action
    for action in PROFILE_ACTIONS + ["iam:TagInstanceProfile"]:
        assert not allowed(policy, action, profile, **theirs), action
    # Nor may it create a role that would pass for team-b's, or hand one of its own roles to team-b.
    assert not allowed(policy, "iam:CreateRole", role, **{"aws:RequestTag/spotctl:owner": owner_value("team-b"),
                                                          "iam:PermissionsBoundary": boundary_arn("team-b")})
    own_role, _ = job_role("team")
    assert not allowed(policy, "iam:TagRole", own_role, **{"aws:ResourceTag/spotctl:owner": owner_value("team"),
                                                           "aws:RequestTag/spotctl:owner": owner_value("team-b")})


def test_roles_only_with_this_stacks_boundary_and_it_stays():
    policy, role = watcher_policy("team"), job_role("team")[0]
    tag = {"aws:ResourceTag/spotctl:owner": owner_value("team")}
    create = {"aws:RequestTag/spotctl:owner": owner_value("team")}
    assert not allowed(policy, "iam:CreateRole", role, **create)  # no boundary
    assert not allowed(policy, "iam:CreateRole", role, **create, **{"iam:PermissionsBoundary": boundary_arn("team-b")})
    assert not allowed(policy, "iam:PutRolePolicy", role, **tag)  # a role without the boundary: not widened
    assert allowed(policy, "iam:PutRolePermissionsBoundary", role, **tag, **{"iam:PermissionsBoundary": boundary_arn("team")})
    assert not allowed(policy, "iam:PutRolePermissionsBoundary", role, **tag,
                       **{"iam:PermissionsBoundary": "arn:aws:iam::aws:policy/AdministratorAccess"})
    assert not allowed(policy, "iam:DeleteRolePermissionsBoundary", role, **tag,
                       **{"iam:PermissionsBoundary": boundary_arn("team")})
    for action in ("iam:CreatePolicyVersion", "iam:SetDefaultPolicyVersion", "iam:DeletePolicy"):
        assert not allowed(policy, action, boundary_arn("team"))
    assert not allowed(policy, "iam:UntagRole", role, **tag, **{"aws:TagKeys": ["spotctl:owner"]})
    assert allowed(policy, "iam:UntagRole", role, **tag, **{"aws:TagKeys": ["spotctl:job"]})


def test_every_job_and_pool_role_carries_the_boundary_and_it_covers_their_policies():
    p = plan("team")
    boundary = only(p, "aws:iam/policy:Policy", "stack-boundary")
    assert boundary.inputs["name"] == "spotctl-team-boundary" and boundary.inputs["path"] == "/spotctl/"
    document = json.loads(boundary.inputs["policy"])
    roles = [r for r in p.by_type("aws:iam/role:Role") if r.name != "watcher-role"]
    assert sorted(r.name for r in roles) == ["job-b-x-role", "job-train-role", "pool-g5-role"]
    assert all(r.inputs["permissionsBoundary"] == boundary_arn("team") for r in roles)
    assert "permissionsBoundary" not in only(p, "aws:iam/role:Role", "watcher-role").inputs
    # Every permission a job or pool role is given lies inside the boundary (else the job breaks).
    bucket = json.loads(only(p, "aws:iam/rolePolicy:RolePolicy", "job-train-events-policy").inputs["policy"])
    granted = [s for r in p.by_type("aws:iam/rolePolicy:RolePolicy") if r.name != "watcher-policy"
               for s in json.loads(r.inputs["policy"])["Statement"]]
    secret = f"arn:aws:ssm:us-east-1:{ACCOUNT}:parameter{ssm_parameter_name('team', 'train')}"
    granted.append({"Action": "ssm:GetParameter", "Resource": secret})  # infra/aws.py _env_secret's statement
    assert {a for s in granted for a in ([s["Action"]] if isinstance(s["Action"], str) else s["Action"])} >= {
        "s3:PutObject", "autoscaling:SetInstanceProtection", "autoscaling:DescribeAutoScalingInstances", "ssm:GetParameter"}
    for s in granted:
        for action in [s["Action"]] if isinstance(s["Action"], str) else s["Action"]:
            for resource in [s["Resource"]] if isinstance(s["Resource"], str) else s["Resource"]:
                resource = resource.replace("*", "x") if resource != "*" else "*"
                assert allowed(document, action, resource), (action, resource)
    # ... and nothing of another stack's: its events, its secrets.
    events = bucket["Statement"][0]["Resource"].split("/")[0]
    assert not allowed(document, "s3:PutObject", f"{events}/team-b/train/attempt-1/started.json")
    assert not allowed(document, "ssm:GetParameter", f"arn:aws:ssm:us-east-1:{ACCOUNT}:parameter/spotctl/team-b/train/env")
    assert not allowed(document, "iam:PassRole", "*") and not allowed(document, "ec2:RunInstances", "*")


@pytest.mark.parametrize("props, problem", [
    ({"path": "/spotctl/", "name_prefix": "spotctl-team-"}, "no permissions_boundary"),
    ({"path": "/spotctl/", "name_prefix": "spotctl-team-", "permissions_boundary": "arn:aws:iam::aws:policy/PowerUserAccess"},
     "is not a spotctl stack boundary"),
    ({"path": "/spotctl/", "name_prefix": "spotctl-team-",
      "permissions_boundary": "arn:aws:iam::123456789012:policy/spotctl/spotctl-team-b-boundary"}, "another stack's"),
])
def test_boundary_rule(props, problem):
    with pytest.raises(ContractError, match="aws.role-permissions-boundary") as err:
        contract.check("aws:iam/role:Role", "r", props)
    assert problem in str(err.value)
    contract.check("aws:iam/role:Role", "r", {**props, "permissions_boundary": boundary_arn("team")})
    contract.check("aws:iam/role:Role", "r", {"path": "/spotctl-watcher/", "name_prefix": "spotctl-team-watcher-"})


def test_a_role_declared_without_the_boundary_is_refused_at_plan(monkeypatch):
    import pulumi_aws as aws

    real = aws.iam.Role

    def without_boundary(name, **kwargs):
        kwargs.pop("permissions_boundary", None)
        return real(name, **kwargs)

    monkeypatch.setattr(aws.iam, "Role", without_boundary)
    with pytest.raises(ContractError, match="aws.role-permissions-boundary"):
        planner.run(validate(stack_config(AWS_BASE, jobs=[aws_job()]), "x"), "other")


# ---- GCP: the compute role's conditions -------------------------------------------------------


GCP_WATCHER = {"backend": "gs://team-state/pulumi", "repo": "https://github.com/team/infra.git",
               "passphraseSecret": "pulumi-passphrase"}
COMPUTE = "compute.googleapis.com/"


def gcp_raw(jobs=None) -> dict:
    jobs = jobs or [gcp_job(), gcp_job(id="other", nodes=2, diskReplicaZones=["us-central1-a", "us-central1-b"], **N1_T4)]
    return {**stack_config(GCP_BASE, jobs=jobs), "watcher": GCP_WATCHER}


@pytest.fixture
def project_of_stacks(tmp_path, monkeypatch):
    """A project whose stacks/ holds `team` and `team-b` (and `teamx`, which `team-` does not cover)."""
    (tmp_path / "Pulumi.yaml").write_text("name: spotctl\nruntime: python\nstackConfigDir: stacks\n")
    (tmp_path / "stacks").mkdir()
    for stack in ("team", "team-b", "teamx"):
        (tmp_path / "stacks" / f"Pulumi.{stack}.yaml").write_text("config: {}\n")
    monkeypatch.chdir(tmp_path)
    return tmp_path


def compute_conditions_of(p: planner.Plan) -> list[str]:
    found = [r.inputs for r in p.by_type("gcp:projects/iAMMember:IAMMember") if r.name.startswith("watcher-compute-")]
    assert found and all(f["role"] == "projects/proj-1/roles/spotctl_team_watcher" for f in found)
    return [f["condition"]["expression"] for f in found]


def granted(conditions: list[str], kind: str, name: str) -> bool:
    return any(condition_holds(c, COMPUTE + kind, name) for c in conditions)


def test_gcp_grant_reaches_this_stack_and_not_the_stack_extending_its_name(project_of_stacks):
    conditions = compute_conditions_of(planner.run(validate(gcp_raw(), "x"), "team"))
    z, r = "projects/proj-1/zones/us-central1-a", "projects/proj-1/regions/us-central1"
    ours = [("Instance", f"{z}/instances/team-train-a2-n0"), ("Disk", f"{z}/disks/team-train-n0-disk"),
            ("Disk", f"{z}/disks/team-train-n0-m1-disk"), ("Disk", f"{r}/disks/team-other-n1-disk"),
            ("Disk", "projects/proj-1/zones/us-central1-b/disks/team-train-a3-n0"),
            ("Snapshot", "projects/proj-1/global/snapshots/team-train-n0-m1-snap")]
    for kind, name in ours:
        assert granted(conditions, kind, name), (kind, name)
    theirs = [("Instance", f"{z}/instances/team-b-train-a1-n0"), ("Disk", f"{z}/disks/team-b-train-n0-disk"),
              ("Disk", f"{r}/disks/team-b-x-n0-disk"), ("Snapshot", "projects/proj-1/global/snapshots/team-b-train-n0-m1-snap"),
              ("Instance", f"{z}/instances/teamx-train-a1-n0"), ("Instance", "projects/proj-1/zones/europe-west4-a/instances/team-train-a1-n0"),
              ("Subnetwork", "projects/proj-1/regions/us-central1/subnetworks/other"),
              ("InstanceTemplate", "projects/proj-1/global/instanceTemplates/team-pool"),
              ("Firewall", "projects/proj-1/global/firewalls/team-allow-all")]
    for kind, name in theirs:
        assert not granted(conditions, kind, name), (kind, name)


def test_gcp_every_condition_fits_the_iam_limits(project_of_stacks):
    conditions = compute_conditions_of(planner.run(validate(gcp_raw(), "x"), "team"))
    assert all(logic_operators(c) <= 12 for c in conditions) and len(conditions) <= 20
    four_zones = {**gcp_raw(), "zones": ["us-central1-a", "us-central1-b", "us-central1-c", "us-central1-f"]}
    conditions = compute_conditions_of(planner.run(validate(four_zones, "x"), "team"))
    assert all(logic_operators(c) <= 12 for c in conditions) and len(conditions) <= 20


def test_logic_operator_rule():
    too_many = " || ".join(f'resource.name.startsWith("projects/p/zones/z{i}/instances/t-")' for i in range(14))
    with pytest.raises(ContractError, match="gcp.condition-logic-operators-12") as err:
        contract.check("gcp:projects/iAMMember:IAMMember", "m", {"condition": {"expression": too_many}})
    assert "13 logic operators" in str(err.value)
    assert logic_operators('!resource.name.startsWith("a&&b||!c") && resource.type != "x"') == 2
    contract.check("gcp:projects/iAMMember:IAMMember", "m", {"condition": {"expression": too_many.rsplit(" || ", 1)[0]}})


def test_a_job_named_like_the_extending_stacks_is_refused(project_of_stacks):
    """Stack team's job b-x and stack team-b's job x get the same names: the grant cannot be exact."""
    with pytest.raises(ContractError, match="gcp.watcher-condition-covers-names") as err:
        planner.run(validate(gcp_raw([gcp_job(), gcp_job(id="b-x")]), "x"), "team")
    assert "job b-x" in str(err.value) and "team-b" in str(err.value)
    # Without such a sibling stack in the project the same job is fine.
    (project_of_stacks / "stacks" / "Pulumi.team-b.yaml").unlink()
    planner.run(validate(gcp_raw([gcp_job(), gcp_job(id="b-x")]), "x"), "team")


def test_a_stack_created_later_is_warned_that_an_older_watcher_covers_it(project_of_stacks, monkeypatch):
    import pulumi

    warnings: list[str] = []
    monkeypatch.setattr(pulumi.log, "warn", lambda message, *a, **k: warnings.append(message))
    planner.run(validate(stack_config(GCP_BASE, jobs=[gcp_job()]), "x"), "team-b")
    assert any("start with team-, like stack team's" in w and "pulumi up" in w for w in warnings), warnings
    warnings.clear()
    planner.run(validate(stack_config(GCP_BASE, jobs=[gcp_job()]), "x"), "teamx")
    assert not [w for w in warnings if "like stack" in w]


def test_refreshing_a_jobs_secret_env_is_granted_on_this_stacks_parameters_only():
    """What a targeted update's refresh of an aws.ssm.Parameter calls (terraform-provider-aws
    internal/service/ssm/parameter.go read: GetParameter WithDecryption, DescribeParameters; tags)."""
    policy = watcher_policy("team")
    own = f"arn:aws:ssm:us-east-1:{ACCOUNT}:parameter{ssm_parameter_name('team', 'train')}"
    theirs = f"arn:aws:ssm:us-east-1:{ACCOUNT}:parameter{ssm_parameter_name('team-b', 'train')}"
    for action in ("ssm:GetParameter", "ssm:ListTagsForResource"):
        assert allowed(policy, action, own) and not allowed(policy, action, theirs), action
    assert allowed(policy, "ssm:DescribeParameters", "*")  # no resource-level permission for it


def test_refreshing_a_jobs_secret_is_granted_on_that_secret_only():
    """What a refresh of the job's secret reads (terraform-provider-google secretmanager: the secret,
    its IAM members, the version and its data through ``:access``): viewer and secretAccessor, bound
    on that one secret; nothing that adds or destroys versions."""
    secret_env = {"HF_TOKEN": {"secure": "v1:Zm9vYmFy"}, "PLAIN": "x"}
    p = planner.run(validate(gcp_raw([gcp_job(env=secret_env), gcp_job(id="plain")]), "x"), "team")
    member = f"serviceAccount:{p.outputs['watcher']['serviceAccount']}"
    bound = [r.inputs for r in p.by_type("gcp:secretmanager/secretIamMember:SecretIamMember") if r.inputs["member"] == member]
    on_jobs = sorted((b["secretId"], b["role"]) for b in bound if b["secretId"] != "projects/proj-1/secrets/pulumi-passphrase")
    assert on_jobs == [("spotctl-team-train-env", "roles/secretmanager.secretAccessor"),
                       ("spotctl-team-train-env", "roles/secretmanager.viewer")]
    assert not [r for r in p.resources if r.inputs.get("member") == member and "secretmanager" in str(r.inputs.get("role"))
                and r.type.startswith("gcp:projects/")]


def test_more_conditional_bindings_than_iam_takes_is_refused(tmp_path, monkeypatch):
    (tmp_path / "Pulumi.yaml").write_text("name: spotctl\nruntime: python\nstackConfigDir: stacks\n")
    (tmp_path / "stacks").mkdir()
    for stack in ("team", "team-a", "team-b", "team-c", "team-d", "team-e"):
        (tmp_path / "stacks" / f"Pulumi.{stack}.yaml").write_text("config: {}\n")
    monkeypatch.chdir(tmp_path)
    # No region has ten zones today (us-central1 has four): the binding limit is checked for a region as
    # large as the rule allows, the zone table widened for it.
    from infra.contract import gcp_zones

    monkeypatch.setitem(gcp_zones.ZONES, "us-central1", tuple(f"us-central1-{z}" for z in "abcdefghij"))
    raw = {**gcp_raw([gcp_job()]), "zones": [f"us-central1-{z}" for z in "abcdefghij"]}
    with pytest.raises(ContractError, match="gcp.conditional-bindings-20") as err:
        planner.run(validate(raw, "x"), "team")
    assert "22 conditional bindings" in str(err.value)
    raw["zones"] = ["us-central1-a", "us-central1-b", "us-central1-c", "us-central1-f"]  # (its zones today)
    assert len(compute_conditions_of(planner.run(validate(raw, "x"), "team"))) <= 20


# ---- GCP: the custom roles hold what a job's targeted update calls, and nothing project-wide ------

# What a targeted `pulumi up --refresh` of a job calls per resource type, derived independently of
# the roles (infra/gcp_watcher.py): refresh (every target is read), create/replace/delete of what a
# resume, completion or move changes, and the operations the provider waits on
# (terraform-provider-google google/services/compute/resource_compute_{instance,disk,region_disk,
# snapshot,address,firewall}.go; iam_{service_account,project,storage_bucket}.go; required
# permissions of instances.insert: https://cloud.google.com/compute/docs/instances/create-start-instance).
# A type missing here fails the coverage test: add what it calls.
NEEDS = {
    "gcp:compute/instance:Instance": (
        "compute.instances.create", "compute.instances.get", "compute.instances.delete", "compute.instances.setMetadata",
        "compute.instances.setLabels", "compute.instances.setServiceAccount", "compute.disks.create",  # its boot disk
        "compute.disks.get", "compute.disks.use", "compute.subnetworks.use", "compute.zoneOperations.get"),
    "gcp:compute/disk:Disk": ("compute.disks.create", "compute.disks.get", "compute.disks.delete", "compute.disks.setLabels",
                              "compute.instances.detachDisk", "compute.snapshots.useReadOnly", "compute.zoneOperations.get"),
    "gcp:compute/regionDisk:RegionDisk": ("compute.disks.create", "compute.disks.get", "compute.disks.delete",
                                          "compute.disks.setLabels", "compute.snapshots.useReadOnly",
                                          "compute.regionOperations.get"),
    "gcp:compute/snapshot:Snapshot": ("compute.snapshots.create", "compute.snapshots.get", "compute.snapshots.setLabels",
                                      "compute.disks.createSnapshot", "compute.globalOperations.get"),
    "gcp:compute/address:Address": ("compute.addresses.get", "compute.addresses.useInternal"),
    "gcp:compute/firewall:Firewall": ("compute.firewalls.get",),
    "gcp:serviceaccount/account:Account": ("iam.serviceAccounts.get",),
    "gcp:serviceaccount/iAMMember:IAMMember": ("iam.serviceAccounts.getIamPolicy",),
    "gcp:storage/bucketIAMMember:BucketIAMMember": ("storage.buckets.getIamPolicy",),
    "gcp:projects/iAMMember:IAMMember": ("resourcemanager.projects.getIamPolicy",),
    # Granted on the job's own secret (roles/secretmanager.viewer and secretAccessor: the test above).
    "gcp:secretmanager/secret:Secret": ("secretmanager.secrets.get",),
    "gcp:secretmanager/secretVersion:SecretVersion": ("secretmanager.versions.get", "secretmanager.versions.access"),
    "gcp:secretmanager/secretIamMember:SecretIamMember": ("secretmanager.secrets.getIamPolicy",),
    "spotctl:gcp:TrainingJob": (), "spotctl:gcp:ServiceAccount": (),
}
# The watcher's own SDK calls (cli/cloud/gcp.py GcpObserver, GcpInventory).
OWN_CALLS = ("compute.instances.list", "compute.zoneOperations.list", "compute.disks.list", "compute.snapshots.list",
             "compute.snapshots.delete", "compute.globalOperations.get")
PER_SECRET = {"secretmanager.secrets.get", "secretmanager.secrets.getIamPolicy", "secretmanager.versions.get",
              "secretmanager.versions.access"}
NAMED_KINDS = ("compute.instances.", "compute.disks.", "compute.snapshots.")
MOVE = {"from": "us-central1-a", "to": "us-central1-b"}
HISTORY = [{"zone": "us-central1-a", "lastAttempt": 1}]


def example_plans() -> list[planner.Plan]:
    """Stacks exercising every kind of job resource: secrets, a gang with regional disks, a kept boot
    disk, an external IP, a gang on a custom network (its firewall rule), a move's snapshot and its
    restored disk."""
    secret_env = {"HF_TOKEN": {"secure": "v1:Zm9vYmFy"}}
    first = gcp_raw([gcp_job(env=secret_env), gcp_job(id="other", nodes=2, diskReplicaZones=["us-central1-a", "us-central1-b"], **N1_T4),
                     gcp_job(id="kb", bootDisk="keep"), gcp_job(id="pub", externalIp=True)])
    custom = {**gcp_raw([gcp_job(id="gang", nodes=2)]), "network": {"network": "vpc-1", "subnetwork": "sub-1"}}
    moving = gcp_raw([gcp_job(state="stopped", move=MOVE | {"step": "restore"})])
    released = gcp_raw([gcp_job(state="running", zone="us-central1-b", attempt=2, zoneHistory=HISTORY,
                                move=MOVE | {"step": "release"})])
    return [planner.run(validate(raw, "x"), "team") for raw in (first, custom, moving, released)]


def roles_of(p: planner.Plan) -> dict[str, set[str]]:
    return {f"projects/{r.inputs['project']}/roles/{r.inputs['roleId']}": set(r.inputs["permissions"])
            for r in p.by_type("gcp:projects/iAMCustomRole:IAMCustomRole")}


def missing(p: planner.Plan) -> list[str]:
    """Every permission the job targets (and the watcher's own calls) need that no grant gives."""
    from cli.lifecycle.apply import job_urns

    roles = roles_of(p)
    granted = set().union(*roles.values()) | PER_SECRET
    out = []
    for job in p.outputs["jobs"]:
        urns = set(job_urns(p, job))
        for r in (r for r in p.resources if r.urn in urns):
            assert r.type in NEEDS, f"{r.type} ({r.name}) is in a job's targets: add what its update calls to NEEDS"
            out += [f"{perm} ({r.type})" for perm in NEEDS[r.type] if perm not in granted]
    return sorted(set(out) | {f"{perm} (the watcher's own calls)" for perm in OWN_CALLS if perm not in granted})


@pytest.fixture(scope="module")
def plans() -> list[planner.Plan]:
    return example_plans()


def test_gcp_custom_roles_cover_every_call_of_a_jobs_targeted_update(plans):
    types = {r.type for p in plans for r in p.resources}
    assert {"gcp:compute/snapshot:Snapshot", "gcp:compute/firewall:Firewall", "gcp:compute/regionDisk:RegionDisk",
            "gcp:compute/address:Address", "gcp:secretmanager/secret:Secret"} <= types  # the examples reach every kind
    for p in plans:
        assert missing(p) == []
        assert not [r for r in p.resources if r.inputs.get("role") == "roles/compute.instanceAdmin.v1"]


def test_a_permission_missing_from_a_role_fails_coverage(monkeypatch):
    from infra import gcp_watcher

    monkeypatch.setitem(gcp_watcher.NAMED_PERMISSIONS, "snapshots",
                        tuple(x for x in gcp_watcher.NAMED_PERMISSIONS["snapshots"] if x != "compute.snapshots.useReadOnly"))
    p = example_plans()[2]
    assert missing(p) == ["compute.snapshots.useReadOnly (gcp:compute/disk:Disk)"]


def test_gcp_roles_hold_nothing_project_wide(plans):
    """Permissions on instances, disks and snapshots are in the named role only (bound on names), the
    project role only reads, lists and uses, and neither holds what instanceAdmin.v1 adds beyond a
    job's update (project metadata, autoscalers, groups, templates, resource policies, images)."""
    for p in plans:
        named = roles_of(p)["projects/proj-1/roles/spotctl_team_watcher"]
        project = roles_of(p)["projects/proj-1/roles/spotctl_team_watcher_project"]
        assert not {x for x in project if x.startswith(NAMED_KINDS) and not x.endswith(".list")}
        verbs = {x.rsplit(".", 1)[1] for x in project}
        assert verbs <= {"get", "list", "getIamPolicy", "use", "useInternal", "useReadOnly"}, verbs
        for perm in named | project:
            assert not perm.startswith(("compute.projects.", "compute.autoscalers.", "compute.instanceGroupManagers.",
                                        "compute.instanceTemplates.", "compute.resourcePolicies.", "compute.images.create",
                                        "compute.firewalls.create", "compute.networks.")), perm
            assert not perm.endswith(("setIamPolicy", "setCommonInstanceMetadata", "osAdminLogin", "osLogin")), perm
        # The project role is bound without a condition; the named role on names and on the stack's
        # subnetwork only (useExternalIp only because job `pub` asks for an external IP).
        bound = [r.inputs for r in p.by_type("gcp:projects/iAMMember:IAMMember")
                 if r.inputs["role"].startswith("projects/proj-1/roles/")]
        assert [b for b in bound if "condition" not in b] == [
            {"project": "proj-1", "role": "projects/proj-1/roles/spotctl_team_watcher_project",
             "member": bound[0]["member"]}]
        subnet = [r.inputs for r in p.by_type("gcp:compute/subnetworkIAMMember:SubnetworkIAMMember")]
        assert [(s["region"], s["subnetwork"], s["role"]) for s in subnet] == [
            ("us-central1", "sub-1" if "vpc-1" in str(p.resources) else "default", "projects/proj-1/roles/spotctl_team_watcher")]
    assert "compute.subnetworks.useExternalIp" in roles_of(plans[0])["projects/proj-1/roles/spotctl_team_watcher"]
    assert "compute.subnetworks.useExternalIp" not in roles_of(plans[1])["projects/proj-1/roles/spotctl_team_watcher"]


def test_act_as_stays_on_each_jobs_own_account(plans):
    for p in plans:
        member = f"serviceAccount:{p.outputs['watcher']['serviceAccount']}"
        acting = [r for r in p.resources if r.inputs.get("member") == member and "serviceAccountUser" in str(r.inputs.get("role"))]
        assert acting and all(r.type == "gcp:serviceaccount/iAMMember:IAMMember" for r in acting)
        # Bound on the jobs' accounts (their `name` output: the mock's is the logical name), one each.
        jobs = {r.name for r in p.by_type("gcp:serviceaccount/account:Account") if r.name.startswith("job-")}
        assert sorted(r.inputs["serviceAccountId"] for r in acting) == sorted(jobs)
        for perms in roles_of(p).values():
            assert not {x for x in perms if x.startswith("iam.serviceAccounts.") and x.rsplit(".", 1)[1] not in ("get", "getIamPolicy")}


@pytest.mark.parametrize("role_id, permissions, problem", [
    ("spotctl_team-b_watcher", ["compute.instances.get"], "role_id 'spotctl_team-b_watcher'"),
    ("ab", ["compute.instances.get"], "role_id 'ab'"),
    ("x" * 65, ["compute.instances.get"], "role_id"),
    ("spotctl_team_watcher", [], "no permissions"),
])
def test_custom_role_id_rule(role_id, permissions, problem):
    with pytest.raises(ContractError, match="gcp.custom-role-id") as err:
        contract.check("gcp:projects/iAMCustomRole:IAMCustomRole", "r", {"role_id": role_id, "permissions": permissions})
    assert problem in str(err.value)
    contract.check("gcp:projects/iAMCustomRole:IAMCustomRole", "r",
                   {"role_id": "spotctl_team_b.watcher_project", "permissions": ["compute.instances.get"]})


def test_role_ids_follow_the_slug_and_the_rule():
    from infra.gcp_watcher import role_id

    assert role_id("team-b") == "spotctl_team_b_watcher" and role_id("team", "project") == "spotctl_team_watcher_project"
    longest = role_id(stack_slug("a-very-long-stack-name-that-is-hashed"), "project")
    assert len(longest) <= 64
    contract.check("gcp:projects/iAMCustomRole:IAMCustomRole", "r", {"role_id": longest, "permissions": ["x.y.z"]})


# ---- EC2: what a targeted update of a job asks of EC2 --------------------------------------------
# Each request's context holds the keys EC2 gives that resource type: the Service Authorization
# Reference (Amazon EC2: RunInstances, CreateTags; https://docs.aws.amazon.com/service-authorization/
# latest/reference/list_amazonec2.html) lists aws:RequestTag but no aws:ResourceTag for the volume and
# network-interface RunInstances authorizes (new or existing), ec2:Subnet for that network-interface,
# and both tag keys for CreateTags on a volume.

EC2 = f"arn:aws:ec2:us-east-1:{ACCOUNT}"
OWN_SUBNET = {"ec2:Subnet": f"{EC2}:subnet/subnet-0aaa0001"}  # NAT's us-east-1a subnet
OTHER_SUBNET = {"ec2:Subnet": f"{EC2}:subnet/subnet-0bbb0001"}  # another team's


def owner_tag(stack: str, kind: str = "Request") -> dict[str, str]:
    return {f"aws:{kind}Tag/spotctl:owner": owner_value(stack)}


def test_the_watcher_launches_a_job_instance_as_the_provider_asks():
    """One RunInstances of a job's instance (infra/aws.py TrainingJob) as terraform-provider-aws makes
    it: TagSpecifications for the instance only (ec2_instance.go resourceInstanceCreate; volume_tags
    unset), so the new root volume and primary network interface carry no tag (spotctl declares no
    root_block_device.tags: no CreateTags follows); deleting a spot instance cancels its request."""
    policy = watcher_policy("team")
    launch = {
        f"{EC2}:instance/*": owner_tag("team"),
        f"{EC2}:volume/*": {},  # the root volume, created by the launch
        f"{EC2}:network-interface/*": OWN_SUBNET,  # the primary interface, created by the launch
        f"{EC2}:network-interface/eni-0master000000001": OWN_SUBNET,  # a multi-node job's master interface
        "arn:aws:ec2:us-east-1::image/ami-0abc": {},
        f"{EC2}:subnet/subnet-0aaa0001": {},
        f"{EC2}:security-group/sg-0aaa0001": {},
        f"{EC2}:key-pair/team": {},
    }
    for resource, context in launch.items():
        assert allowed(policy, "ec2:RunInstances", resource, **context), resource
    # The instance itself stays gated by this stack's tag.
    assert not allowed(policy, "ec2:RunInstances", f"{EC2}:instance/*")
    assert not allowed(policy, "ec2:RunInstances", f"{EC2}:instance/*", **owner_tag("team-b"))
    # No volume without the owner tag can be tagged as this stack's (and then deleted through ManageOwned).
    root = f"{EC2}:volume/vol-0root00000000001"
    assert not allowed(policy, "ec2:CreateTags", root, **owner_tag("team"))
    assert allowed(policy, "ec2:CreateTags", root, **owner_tag("team", "Resource"), **{"aws:RequestTag/team": "a"})
    # A spot instance's delete: CancelSpotInstanceRequests first (the request RunInstances made is untagged).
    assert allowed(policy, "ec2:CancelSpotInstanceRequests", f"{EC2}:spot-instances-request/sir-0abc")
    assert allowed(policy, "ec2:TerminateInstances", f"{EC2}:instance/i-0abc", **owner_tag("team", "Resource"))


def test_a_launch_never_lands_on_an_interface_outside_this_stacks_subnets():
    """RunInstances evaluates a network interface, new or passed in by NetworkInterfaceId, with no
    resource tag: another stack's free interface cannot be told apart by its owner tag. Its subnet can:
    a launch onto an interface (or into a subnet) other than this stack's is refused, whatever the
    request's tags say, and no other grant widens that."""
    policy = watcher_policy("team")
    theirs = f"{EC2}:network-interface/eni-0theirs000000001"
    for resource in (f"{EC2}:network-interface/*", theirs):
        assert not allowed(policy, "ec2:RunInstances", resource, **OTHER_SUBNET), resource
        assert not allowed(policy, "ec2:RunInstances", resource, **OTHER_SUBNET, **owner_tag("team")), resource
        assert not allowed(policy, "ec2:RunInstances", resource, **OTHER_SUBNET, **owner_tag("team-b", "Resource"))
        assert not allowed(policy, "ec2:RunInstances", resource), resource  # no subnet said: refused too
    # Nor is another stack's subnet usable at all: not for a launch, not to make an interface in
    # (CreateNetworkInterface has no Deny of its own: LaunchUsing names only this stack's subnets).
    for action in ("ec2:RunInstances", "ec2:CreateNetworkInterface"):
        assert allowed(policy, action, f"{EC2}:subnet/subnet-0aaa0002"), action
        assert not allowed(policy, action, f"{EC2}:subnet/subnet-0bbb0001"), action
        assert not allowed(policy, action, f"{EC2}:subnet/subnet-0aaa0009"), action  # the NAT's public subnet
    # team-b's watcher, in its own subnets, gets nothing in this stack's.
    other = json.loads(only(planner.run(validate(aws_raw(network={**NAT, "natSubnet": "subnet-0bbb0009",
        "subnets": {"us-east-1a": "subnet-0bbb0001", "us-east-1b": "subnet-0bbb0002"}}), "test"), "team-b"),
        "aws:iam/rolePolicy:RolePolicy", "watcher-policy").inputs["policy"])
    assert allowed(other, "ec2:RunInstances", theirs, **OTHER_SUBNET)
    assert not allowed(other, "ec2:RunInstances", f"{EC2}:network-interface/eni-0master000000001", **OWN_SUBNET)


def test_the_watcher_moves_a_masters_elastic_ip_and_nobody_elses():
    """A multi-node master's Elastic IP (public-ip egress) follows its interface when a move replaces
    it: terraform-provider-aws ec2_eip.go allocates it tagged and releases it, ec2_eip_association.go
    associates it by allocation and interface and disassociates it (infra/aws.py master_ip). The Service Authorization Reference gives
    AllocateAddress aws:RequestTag, and Associate/Disassociate/ReleaseAddress the resource tags of
    the elastic-ip and network-interface they name."""
    policy = watcher_policy("team")
    eip, eni = f"{EC2}:elastic-ip/eipalloc-0abc", f"{EC2}:network-interface/eni-0master000000001"
    assert allowed(policy, "ec2:AllocateAddress", f"{EC2}:elastic-ip/*", **owner_tag("team"))
    assert allowed(policy, "ec2:CreateTags", f"{EC2}:elastic-ip/*", **{"ec2:CreateAction": "AllocateAddress"})
    assert not allowed(policy, "ec2:AllocateAddress", f"{EC2}:elastic-ip/*")
    assert not allowed(policy, "ec2:AllocateAddress", f"{EC2}:elastic-ip/*", **owner_tag("team-b"))
    mine, theirs = owner_tag("team", "Resource"), owner_tag("team-b", "Resource")
    for action in ("ec2:AssociateAddress", "ec2:DisassociateAddress"):
        assert allowed(policy, action, eip, **mine) and allowed(policy, action, eni, **mine), action
        assert not allowed(policy, action, eip, **theirs) and not allowed(policy, action, eni, **theirs), action
        assert not allowed(policy, action, eip) and not allowed(policy, action, eni), action
    assert allowed(policy, "ec2:ReleaseAddress", eip, **mine)
    assert not allowed(policy, "ec2:ReleaseAddress", eip, **theirs) and not allowed(policy, "ec2:ReleaseAddress", eip)


def test_another_stacks_volumes_stay_out_of_reach():
    """Tagging a root volume after the launch must not become a way to take another stack's volume
    (tag it as this stack's, then attach, snapshot or delete it)."""
    policy = watcher_policy("team")
    theirs, vol = owner_tag("team-b", "Resource"), f"{EC2}:volume/vol-0theirs000000001"
    assert not allowed(policy, "ec2:CreateTags", vol, **theirs, **owner_tag("team"))
    assert not allowed(policy, "ec2:CreateTags", vol, **theirs, **owner_tag("team-b"))
    assert not allowed(policy, "ec2:CreateTags", vol, **theirs, **{"aws:RequestTag/Name": "x"})
    for action in ("ec2:AttachVolume", "ec2:DetachVolume", "ec2:DeleteVolume", "ec2:ModifyVolume", "ec2:DeleteTags",
                   "ec2:CreateSnapshot"):
        assert not allowed(policy, action, vol, **theirs), action
    # A volume without the owner tag is neither used nor tagged for another stack.
    untagged = f"{EC2}:volume/vol-0untagged0000001"
    assert not allowed(policy, "ec2:CreateTags", untagged, **owner_tag("team-b"))
    assert not allowed(policy, "ec2:CreateTags", untagged, **{"aws:RequestTag/Name": "x"})
    for action in ("ec2:AttachVolume", "ec2:DeleteVolume", "ec2:CreateSnapshot"):
        assert not allowed(policy, action, untagged), action
    # Nor does another stack's instance or snapshot become reachable.
    assert not allowed(policy, "ec2:TerminateInstances", f"{EC2}:instance/i-0theirs", **theirs)
    assert not allowed(policy, "ec2:CreateVolume", "arn:aws:ec2:us-east-1::snapshot/snap-0theirs", **theirs)


# ---- the objects several machines write: the shared stack file and the watch lease ----------------------

SHARED_OBJECTS = ("team.spotctl/Pulumi.team.yaml", "team.spotctl/watch.lease")  # cli/lifecycle/sync.py, cli/watch/lease.py
NOT_THEIRS = ("team.spotctl/watch.lease.tmp", "team.spotctl/x", "team-b.spotctl/watch.lease", "team/watch.lease",
              "team/train/attempt-1/node-0/x.json", "team.spotctl/Pulumi.team-b.yaml")


def test_aws_the_watcher_writes_the_lease_and_the_shared_copy_and_nothing_else_there():
    policy = watcher_policy("team")
    bucket = next(s["Resource"] for s in policy["Statement"] if s["Sid"] == "ListEvents")
    for key in SHARED_OBJECTS:
        assert allowed(policy, "s3:PutObject", f"{bucket}/{key}") and allowed(policy, "s3:GetObject", f"{bucket}/{key}"), key
        assert not allowed(policy, "s3:DeleteObject", f"{bucket}/{key}"), key  # a lease is released by a write
    for key in NOT_THEIRS:
        assert not allowed(policy, "s3:PutObject", f"{bucket}/{key}"), key
    job = json.loads(only(plan("team"), "aws:iam/rolePolicy:RolePolicy", "job-train-events-policy").inputs["policy"])
    assert not any(allowed(job, "s3:PutObject", f"{bucket}/{key}") for key in SHARED_OBJECTS)  # no job VM takes the lease


def test_gcp_the_watcher_writes_the_lease_and_the_shared_copy_and_nothing_else_there(project_of_stacks):
    p = planner.run(validate(gcp_raw([gcp_job()]), "x"), "team")
    (grant,) = [r.inputs for r in p.by_type("gcp:storage/bucketIAMMember:BucketIAMMember") if r.name == "watcher-stack-file"]
    bucket = grant["bucket"]
    expression = grant["condition"]["expression"]

    def may_write(key: str) -> bool:
        return condition_holds(expression, "storage.googleapis.com/Object", f"projects/_/buckets/{bucket}/objects/{key}")

    assert grant["role"] == "roles/storage.objectAdmin" and logic_operators(expression) <= 12
    assert all(may_write(k) for k in SHARED_OBJECTS)
    assert not any(may_write(k) for k in NOT_THEIRS)
    assert not condition_holds(expression, "storage.googleapis.com/Object",
                               f"projects/_/buckets/other-bucket/objects/{SHARED_OBJECTS[1]}")
    (rule,) = p.by_type("gcp:storage/bucket:Bucket")[0].inputs["lifecycleRules"]
    assert rule["condition"]["matchesPrefixes"] == ["team/"]  # the lease never expires by the bucket's rule
