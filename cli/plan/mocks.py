"""`spotctl plan`: run the real Pulumi program in-process under Pulumi's mocks and record what it declares.

No credentials, no CLI, no network: resources are "created" by :class:`PlanMocks`, which returns
deterministic ids and the computed outputs later resources depend on (self links, addresses, ARNs).

Invokes are answered the way the cloud would (:class:`MockAccount` holds the account's facts): a
subnet belongs to a VPC (subnet ids that agree but for their last 4 characters share one), an AMI has
a root snapshot size, a region may have no default VPC, and an AWS invoke that reaches the default
provider instead of the stack's explicit one is an error.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from cli.plan import runtime
from infra.config import NAMESPACE, SECRET_PLACEHOLDER, StackConfig

PROJECT = "spotctl"


def _h(*parts: str, n: int = 8) -> str:
    return hashlib.sha256("/".join(parts).encode()).hexdigest()[:n]


@dataclass
class Resource:
    urn: str
    type: str
    name: str
    parent: str | None
    custom: bool
    inputs: dict[str, Any]
    protect: bool = False
    delete_before_replace: bool = False
    dependencies: tuple[str, ...] = ()
    provider: str = ""  # the provider reference ("<urn>::<id>") of a cloud resource; "" for components
    ignore_changes: tuple[str, ...] = ()
    timeouts: dict[str, str] = field(default_factory=dict)  # customTimeouts (create/update/delete), those set
    retain_on_delete: bool = False

    def as_json(self) -> dict[str, Any]:
        return {
            "urn": self.urn,
            "type": self.type,
            "name": self.name,
            "parent": self.parent,
            "inputs": self.inputs,
            "options": {"protect": self.protect, "deleteBeforeReplace": self.delete_before_replace,
                        "dependsOn": list(self.dependencies), "provider": self.provider,
                        "ignoreChanges": list(self.ignore_changes)}
                       | ({"customTimeouts": self.timeouts} if self.timeouts else {}),
        }


@dataclass
class Plan:
    stack: str
    resources: list[Resource] = field(default_factory=list)
    outputs: dict[str, Any] = field(default_factory=dict)
    mocked: set[str] = field(default_factory=set)  # ids and computed values the mocks made up (not in --json)
    notes: list[str] = field(default_factory=list)  # contract rules left to the real engine (planned offline)

    def as_json(self) -> dict[str, Any]:
        return {
            "stack": self.stack,
            "resources": [r.as_json() for r in sorted(self.resources, key=lambda r: r.urn)],
            "outputs": self.outputs,
        }

    def to_json(self) -> str:
        return json.dumps(self.as_json(), indent=2, sort_keys=True) + "\n"

    def by_type(self, type_: str) -> list[Resource]:
        return sorted((r for r in self.resources if r.type == type_), key=lambda r: r.urn)

    def named(self, name: str) -> Resource:
        for r in self.resources:
            if r.name == name:
                return r
        raise KeyError(name)


ROOT_TYPE = "pulumi:pulumi:Stack"


def _qualified_type(urn: str) -> str:
    return urn.split("::")[2]


def engine_urn(stack: str, project: str, parent: str, type_: str, name: str) -> str:
    """The URN the Pulumi engine gives a resource: the parent's full type chain, minus the root stack.

    (The mock monitor keeps only the immediate parent type; `--target` needs the engine's form.)
    """
    if parent and _qualified_type(parent) != ROOT_TYPE:
        type_ = f"{_qualified_type(parent)}${type_}"
    return f"urn:pulumi:{stack}::{project}::{type_}::{name}"


def _mock_outputs(typ: str, name: str, inputs: dict[str, Any], project: str, region: str,
                  zones: tuple[str, ...] = (), stack: str = "") -> tuple[str, dict[str, Any]]:
    """Deterministic id and computed outputs of one mocked resource (``zones``: the stack's, where its
    subnets and so its interface endpoints are; ``stack`` tells apart two stacks' endpoints in one VPC)."""
    out = dict(inputs)
    physical = inputs.get("name") or (inputs.get("namePrefix", "") + _h(name, n=6) if "namePrefix" in inputs else name)
    if typ.startswith("gcp:"):
        out.setdefault("name", physical)
        zone = inputs.get("zone")
        # An InstanceTemplate is global even when its `region` pins the subnetwork's region.
        regional = "region" in inputs and typ != "gcp:compute/instanceTemplate:InstanceTemplate"
        scope = f"zones/{zone}" if zone else (f"regions/{inputs['region']}" if regional else "global")
        kind = typ.split("/")[1].split(":")[0] + "s"
        self_link = f"https://www.googleapis.com/compute/v1/projects/{project}/{scope}/{kind}/{physical}"
        out["selfLink"] = self_link
        out["selfLinkUnique"] = f"{self_link}?uniqueId={int(_h(name, n=10), 16)}"
        rid = f"projects/{project}/{scope}/{kind}/{physical}"
        if typ == "gcp:compute/address:Address":
            n = int(_h(name, n=4), 16)
            out["address"] = f"10.128.{n % 250 + 1}.{n // 250 % 250 + 2}"
        elif typ == "gcp:serviceaccount/account:Account":
            out["email"] = f"{inputs['accountId']}@{project}.iam.gserviceaccount.com"
            rid = out["email"]
        elif typ == "gcp:pubsub/topic:Topic":
            rid = f"projects/{project}/topics/{physical}"
        elif typ == "gcp:logging/projectSink:ProjectSink":
            out["writerIdentity"] = f"serviceAccount:service-{_h(name, n=6)}@gcp-sa-logging.iam.gserviceaccount.com"
        elif typ == "gcp:secretmanager/secret:Secret":
            rid = f"projects/{project}/secrets/{inputs['secretId']}"
        elif typ == "gcp:storage/bucket:Bucket":
            out["url"] = f"gs://{physical}"
            rid = physical
        elif typ == "gcp:projects/iAMCustomRole:IAMCustomRole":
            # "The name of the role in the format projects/{{project}}/roles/{{role_id}}"
            # (terraform-provider-google resource_google_project_iam_custom_role.go).
            rid = out["name"] = f"projects/{inputs.get('project') or project}/roles/{inputs['roleId']}"
        return rid, out
    if typ.startswith("aws:"):
        prefixes = {
            "aws:ebs/volume:Volume": "vol-",
            "aws:ec2/instance:Instance": "i-",
            "aws:ec2/networkInterface:NetworkInterface": "eni-",
            "aws:ec2/securityGroup:SecurityGroup": "sg-",
            "aws:ec2/launchTemplate:LaunchTemplate": "lt-",
        }
        rid = prefixes.get(typ, f"{name}-") + _h(name, n=17 if typ in prefixes else 8)
        if typ == "aws:s3/bucket:Bucket":
            rid = out["bucket"] = inputs.get("bucketPrefix", "") + _h(name, n=10)
        if typ == "aws:sqs/queue:Queue":
            qname = inputs.get("namePrefix", "") + _h(name, n=6)
            rid = out["url"] = f"https://sqs.{region}.amazonaws.com/123456789012/{qname}"
            out["name"] = qname
        if typ == "aws:ec2/vpcEndpoint:VpcEndpoint":
            rid = "vpce-0" + _h(stack, name, n=16)
        if typ == "aws:ec2/vpcEndpoint:VpcEndpoint" and inputs.get("vpcEndpointType") == "Interface":
            out["dnsEntries"] = _endpoint_dns_entries(rid, inputs["serviceName"], region, zones)
        if typ == "aws:ec2/eip:Eip":
            # The allocation id is the resource's id (ec2_eip.go resourceEIPCreate: d.SetId(AllocationId)).
            rid = out["allocationId"] = "eipalloc-0" + _h(stack, name, n=16)
            out["publicIp"] = f"203.0.113.{int(_h(stack, name, n=2), 16) % 250 + 1}"
            out["arn"] = f"arn:aws:ec2:{region}:123456789012:elastic-ip/{rid}"
        if typ == "aws:ec2/networkInterface:NetworkInterface":
            n = int(_h(name, n=4), 16)
            out["privateIp"] = f"172.31.{n % 250 + 1}.{n // 250 % 250 + 4}"
        if typ == "aws:autoscaling/group:Group":
            rid = inputs.get("name", rid)
            # The ARN as Auto Scaling returns it (https://docs.aws.amazon.com/autoscaling/ec2/userguide/
            # security_iam_id-based-policy-examples.html: autoScalingGroup:<uuid>:autoScalingGroupName/<name>).
            out["arn"] = (f"arn:aws:autoscaling:{region}:123456789012:autoScalingGroup:"
                          f"{_h(rid)}-0000-4000-8000-{_h(rid, 'uuid', n=12)}:autoScalingGroupName/{rid}")
        if typ == "aws:ssm/parameter:Parameter":  # the ARN of a name with a leading slash: parameter/<path>
            rid = inputs["name"]
            out["arn"] = f"arn:aws:ssm:{region}:123456789012:parameter/{rid.lstrip('/')}"
        if typ == "aws:iam/policy:Policy":  # IAM is global: no region in its ARNs; the path is part of it
            out["arn"] = f"arn:aws:iam::123456789012:policy{inputs.get('path', '/')}{inputs.get('name', rid)}"
        service = typ.split(":")[1].split("/")[0]
        out.setdefault("arn", f"arn:aws:{service}:{region}:123456789012:{typ.split(':')[-1].lower()}/{rid}")
        out.setdefault("name", rid if "namePrefix" in inputs else inputs.get("name", rid))
        return rid, out
    return f"{name}-id", out


def _endpoint_dns_entries(endpoint_id: str, service_name: str, region: str, zones: tuple[str, ...]) -> list[dict[str, str]]:
    """An interface endpoint's DNS entries as EC2 lists them: its Regional name, then one per zone
    (``vpce-<id>-<suffix>[-<zone>].<service>.<region>.vpce.amazonaws.com``, https://docs.aws.amazon.com/
    whitepapers/latest/aws-privatelink/creating-highly-available-endpoint-services.html); no private DNS name."""
    service = service_name.removeprefix(f"com.amazonaws.{region}.")
    label = f"{endpoint_id}-{_h(endpoint_id, n=8)}"
    return [{"dnsName": f"{first}.{service}.{region}.vpce.amazonaws.com", "hostedZoneId": "Z7HUB22UULQXV"}
            for first in (label, *(f"{label}-{zone}" for zone in zones))]


@dataclass(frozen=True)
class MockAccount:
    """What the mocked AWS account answers. Defaults: a default VPC exists; a configured subnet
    is in the zone it is configured for and in the VPC its id names (all but the last 4 characters);
    ``subnet_vpcs`` / ``subnet_zones`` override either per subnet id."""

    default_vpc: bool = True
    # Deliberately above infra.common.BOOT_DISK_GB, so sizing the root volume from the image shows.
    root_snapshot_gb: int = 120
    subnet_vpcs: dict[str, str] = field(default_factory=dict)
    subnet_zones: dict[str, str] = field(default_factory=dict)
    # VPC id -> (enableDnsSupport, enableDnsHostnames); both on otherwise, as in a default VPC
    # (https://docs.aws.amazon.com/vpc/latest/userguide/default-vpc.html).
    vpc_dns: dict[str, tuple[bool, bool]] = field(default_factory=dict)
    # Subnet id -> the route table explicitly associated with it; a subnet not listed uses its VPC's
    # main table (mock_main_route_table), as a default VPC's subnets do.
    subnet_route_tables: dict[str, str] = field(default_factory=dict)


class InvokeError(Exception):
    """An invoke the cloud would fail (the text is the provider's)."""


DEFAULT_VPC = "vpc-0default000000001"


MOCK_VPC = "vpc-0mock00000000001"


def _vpc_of(subnet_id: str, account: MockAccount) -> str:
    """A subnet's VPC as the mocks answer it: ``subnet_vpcs`` (a test's account), else one VPC for
    every subnet. Never derived from the id: real subnet ids of one VPC share nothing."""
    return account.subnet_vpcs.get(subnet_id) or MOCK_VPC


def mock_main_route_table(vpc_id: str) -> str:
    """The id the mocks give a VPC's main route table."""
    return "rtb-0" + _h(vpc_id, "main", n=16)


def _route_tables(args: dict[str, Any], account: MockAccount) -> list[str]:
    """DescribeRouteTables as aws_route_tables sends it (vpc-id, then the custom filters, all ANDed):
    ``association.subnet-id`` matches explicit associations only, ``association.main`` the main table;
    no filter lists the VPC's main table, one other table and the explicitly associated ones."""
    vpc = args.get("vpcId", "")
    explicit = {sid: rtb for sid, rtb in account.subnet_route_tables.items() if not vpc or _vpc_of(sid, account) == vpc}
    tables = [mock_main_route_table(vpc), "rtb-0" + _h(vpc, "b", n=16), *sorted(set(explicit.values()))]
    for f in args.get("filters") or []:
        if f["name"] == "association.subnet-id":
            tables = [t for t in tables if t in {explicit.get(sid) for sid in f["values"]}]
        elif f["name"] == "association.main":
            tables = [t for t in tables if (t == mock_main_route_table(vpc)) == ("true" in f["values"])]
        else:
            raise InvokeError(f"the plan mocks do not answer the route table filter {f['name']!r}")
    return tables


def _mock_call(token: str, args: dict[str, Any], cfg: StackConfig, account: MockAccount) -> dict[str, Any]:
    region = cfg.region
    if token == "aws:ec2/getAmi:getAmi":
        image = next((f["values"][0] for f in args.get("filters", []) if f["name"] == "image-id"), None)
        ami = image or "ami-0mock" + _h(json.dumps(args, sort_keys=True), n=12)
        snap = "snap-0" + _h(ami, n=16)
        root = {"deviceName": "/dev/sda1", "ebs": {"volume_size": str(account.root_snapshot_gb), "snapshot_id": snap,
                                                   "volume_type": "gp3", "encrypted": "false", "delete_on_termination": "true"}}
        return {"id": ami, "rootDeviceName": "/dev/sda1", "rootSnapshotId": snap, "architecture": "x86_64",
                "blockDeviceMappings": [root]}
    if token == "aws:ec2/getSubnet:getSubnet":
        if args.get("id"):
            sid = args["id"]
            zones = {s: z for z, s in cfg.network.subnets.items()}
            zone = account.subnet_zones.get(sid) or zones.get(sid) or f"{region}a"
            return {"id": sid, "vpcId": _vpc_of(sid, account), "availabilityZone": zone}
        zone = args.get("availabilityZone") or f"{region}a"
        if args.get("defaultForAz") and not account.default_vpc:
            raise InvokeError("no matching EC2 Subnet found")
        return {"id": "subnet-0mock" + _h(zone, n=9), "vpcId": DEFAULT_VPC, "availabilityZone": zone, "defaultForAz": True}
    if token == "aws:ec2/getVpc:getVpc":
        support, hostnames = account.vpc_dns.get(args["id"], (True, True))
        return {"id": args["id"], "enableDnsSupport": support, "enableDnsHostnames": hostnames}
    if token == "aws:ec2/getVpcs:getVpcs":
        return {"id": region, "ids": [DEFAULT_VPC] if account.default_vpc else []}
    if token == "aws:ec2/getRouteTables:getRouteTables":
        return {"id": region, "ids": _route_tables(args, account)}
    return {}


def _timeouts(request) -> dict[str, str]:
    """The customTimeouts a resource was registered with (only those set)."""
    ct = request.customTimeouts if request.HasField("customTimeouts") else None
    return {k: getattr(ct, k) for k in ("create", "update", "delete") if ct is not None and getattr(ct, k)}


def run(cfg: StackConfig, stack: str, account: MockAccount | None = None,
        decrypted: Mapping[tuple[int, str], str] | None = None) -> Plan:
    """Evaluate the Pulumi program for ``cfg`` under mocks; return everything it registered.

    Without ``account`` (spotctl's own plans: ``plan``, every lifecycle command's targets) the
    look-ups' answers are made up, so the contract rules built on them are noted in ``Plan.notes``,
    not enforced (``infra.contract.offline``); a test's ``account`` stands for a real account's answers.

    ``decrypted`` (tests): ``{(job index, env key): clear value}`` handed over as the engine hands a
    stack with secrets to the program (the clear values in ``spotctl:jobs``, that key listed as
    secret; the program then reads the stack file in the working directory's project to know which
    values were secrets). Without it the secrets stay ``{secure: ...}`` and become placeholders."""
    import pulumi
    from pulumi.runtime import mocks as pmocks

    project = cfg.project or "aws-account"
    region = cfg.region
    plan = Plan(stack=stack)

    class PlanMocks(pulumi.runtime.Mocks):
        inputs: dict[str, Any] = {}  # the inputs of the resource being registered (read by RecordingMonitor)

        def new_resource(self, args: pulumi.runtime.MockResourceArgs):
            self.inputs = args.inputs
            rid, out = _mock_outputs(args.typ, args.name, args.inputs, project, region, tuple(cfg.zones), stack)
            made_up = [v for k, v in out.items() if isinstance(v, str) and k not in args.inputs]
            plan.mocked.update(made_up + ([rid] if rid not in args.inputs.values() else []))
            return rid, out

        def call(self, args: pulumi.runtime.MockCallArgs):
            if args.token.startswith("aws:") and not args.provider:
                raise InvokeError(f"{args.token} went to the default provider: pass InvokeOptions(parent=...) or provider=")
            out = _mock_call(args.token, dict(args.args), cfg, account or MockAccount())
            plan.mocked.update(v for k, v in out.items() if isinstance(v, str) and "mock" in v)
            return out

    class RecordingMonitor(pmocks.MockMonitor):
        """Also records parent and resource options, which MockResourceArgs does not carry."""

        def make_urn(self, parent: str, type_: str, name: str) -> str:
            return engine_urn(stack, PROJECT, parent, type_, name)

        def RegisterResource(self, request):
            response = super().RegisterResource(request)
            if request.type != "pulumi:pulumi:Stack":
                # The inputs MockMonitor just deserialized for new_resource: not deserialized twice.
                inputs = _plain(mocks.inputs)
                parent = request.parent if request.parent and _qualified_type(request.parent) != ROOT_TYPE else None
                plan.resources.append(
                    Resource(
                        urn=response.urn,
                        type=request.type,
                        name=request.name,
                        parent=parent,
                        custom=bool(request.custom),
                        inputs=inputs,
                        protect=bool(request.protect),
                        delete_before_replace=bool(request.deleteBeforeReplace),
                        dependencies=tuple(sorted(request.dependencies)),
                        provider=request.provider,
                        ignore_changes=tuple(request.ignoreChanges),
                        timeouts=_timeouts(request),
                        retain_on_delete=bool(getattr(request, "retainOnDelete", False)),
                    )
                )
            return response

    mocks = PlanMocks()
    config = _config_map(cfg)
    secret_keys: list[str] = []  # always given: the SDK keeps the last list when given None
    if decrypted:
        jobs = json.loads(config[f"{NAMESPACE}:jobs"])
        for (i, key), value in decrypted.items():
            jobs[i]["env"][key] = value
        config[f"{NAMESPACE}:jobs"] = json.dumps(jobs)
        secret_keys = [f"{NAMESPACE}:jobs"]
    from infra.program import main

    @pulumi.runtime.test
    def evaluate():
        outputs = main()
        return pulumi.Output.from_input(outputs).apply(lambda resolved: plan.outputs.update(_plain(resolved)))

    with runtime.no_cyclic_gc(), runtime.no_source_positions(), runtime.no_debug_log(), runtime.own_event_loop():
        # A new root Stack on this run's loop: set_mocks keeps an existing one, whose futures
        # belong to the previous run's (closed) loop.
        pulumi.runtime.settings.set_root_resource(None)
        pulumi.runtime.set_mocks(mocks, project=PROJECT, stack=stack, preview=False, monitor=RecordingMonitor(mocks))
        pulumi.runtime.set_all_config(config, secret_keys)
        notes: set[str] = set()
        from infra import contract

        with contract.offline(notes) if account is None else contextlib.nullcontext():
            evaluate()
        plan.notes = sorted(notes)
    return plan


def _config_map(cfg: StackConfig) -> dict[str, str]:
    """The validated config as the engine would hand it over: one string (JSON for structures) per key."""
    dumped = cfg.model_dump(mode="json", by_alias=True, exclude_none=True)
    return {f"{NAMESPACE}:{k}": v if isinstance(v, str) else json.dumps(v) for k, v in dumped.items()}


SECRET = SECRET_PLACEHOLDER  # how plan shows a value Pulumi holds as a secret (never its clear text)


def _plain(value: Any) -> Any:
    """Mock inputs -> JSON-able values (unknowns as None, sorted maps, secrets as ``[secret]``)."""
    if isinstance(value, str | int | float | bool) or value is None:  # most values: first
        return value
    if isinstance(value, dict):
        if _is_rpc_secret(value):
            return SECRET
        return {str(k): _plain(v) for k, v in sorted(value.items())}
    if isinstance(value, list | tuple):
        return [_plain(v) for v in value]
    path = getattr(value, "path", None)
    if isinstance(path, str) and type(value).__name__ == "FileAsset":
        # A file named by its content's digest (infra/agent_object.py): the same in every process.
        return f"fileAsset:{path.rsplit('/', 1)[-1]}"
    return str(value)


def _is_rpc_secret(value: dict) -> bool:
    from pulumi.runtime.rpc import is_rpc_secret

    return is_rpc_secret(value)


def checked_run(cfg: StackConfig, stack: str, job_id: str | None = None, limits: bool = True) -> Plan:
    """``run`` of the whole stack, or of job ``job_id`` alone, after the limits its stack values can break
    (``infra.limits``: one error naming the key); a rule broken anyway is one line too (ConfigError).
    ``limits`` False: a config only read back for its URNs (nothing of it is applied): no rule refuses it."""
    import contextlib

    from infra.basics import ConfigError
    from infra.contract import ContractError, read_back
    from infra.stack_limits import stack_problems

    problems = stack_problems(cfg, stack, None if job_id is None else [job_id]) if limits else []
    if problems:
        raise ConfigError(f"stack {stack}", problems)
    alone = cfg if job_id is None else cfg.model_copy(update={"jobs": [cfg.job(job_id)], "pools": []})
    try:
        with contextlib.nullcontext() if limits else read_back():
            return run(alone, stack)
    except ContractError as exc:
        raise ConfigError(f"stack {stack}", [exc.one_line()]) from None
