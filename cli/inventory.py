"""What the cloud has: a stack's job disks/volumes as the cloud APIs list them, and deleting them.

The selection of what may be deleted is pure (:func:`deletable_orphans`) and goes through the one
rule in ``cli.lifecycle.may_delete_disks``; the cloud clients are thin and imported lazily.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Protocol

from cli.lifecycle import may_delete_disks
from infra.config import StackConfig
from infra.naming import label_value


@dataclass(frozen=True)
class CloudDisk:
    """A disk (GCP) or volume (AWS) with the labels/tags it carries."""

    id: str
    zone: str
    labels: dict[str, str] = field(default_factory=dict)
    in_use: bool = False

    def owner(self, cloud: str) -> tuple[str | None, str | None, bool]:
        """(stack, job, managed) from our ownership labels/tags."""
        if cloud == "aws":
            return self.labels.get("spotctl:stack"), self.labels.get("spotctl:job"), self.labels.get("spotctl:managed") == "true"
        return self.labels.get("spotctl-stack"), self.labels.get("spotctl-job"), self.labels.get("spotctl-managed") == "true"


class Inventory(Protocol):
    def disks(self) -> list[CloudDisk]: ...

    def delete(self, disk: CloudDisk) -> None: ...


def owned_by(disk: CloudDisk, cfg: StackConfig, stack: str) -> bool:
    owner, _, managed = disk.owner(cfg.cloud)
    expected = stack if cfg.cloud == "aws" else label_value(stack)
    return managed and owner == expected


def deletable_orphans(disks: Iterable[CloudDisk], cfg: StackConfig, stack: str) -> list[tuple[CloudDisk, bool, str]]:
    """Every disk of this stack that no job declares, with whether it may go and why.

    A disk is an orphan when its job label names no job of the stack file. It may be deleted only
    when it carries this stack's ownership labels and is not attached to a VM.
    """
    declared = {j.id for j in cfg.jobs}
    out = []
    for disk in disks:
        _, job_id, _ = disk.owner(cfg.cloud)
        if job_id in declared:
            continue
        owned = owned_by(disk, cfg, stack)
        ok, why = may_delete_disks(None, force=False, owned=owned)
        if ok and disk.in_use:
            ok, why = False, "it is attached to a VM"
        out.append((disk, ok, why))
    return out


class AwsInventory:
    """EBS volumes tagged with this stack (boto3; credentials and endpoint from the environment)."""

    def __init__(self, region: str, stack: str, client=None):
        import boto3

        self.stack = stack
        self.ec2 = client or boto3.client("ec2", region_name=region)

    def disks(self) -> list[CloudDisk]:
        pages = self.ec2.get_paginator("describe_volumes").paginate(Filters=[{"Name": "tag:spotctl:stack", "Values": [self.stack]}])
        out = []
        for page in pages:
            for v in page["Volumes"]:
                tags = {t["Key"]: t["Value"] for t in v.get("Tags", [])}
                out.append(CloudDisk(v["VolumeId"], v["AvailabilityZone"], tags, in_use=v["State"] != "available"))
        return out

    def delete(self, disk: CloudDisk) -> None:
        self.ec2.delete_volume(VolumeId=disk.id)


class GcpInventory:
    """Persistent disks labelled with this stack (google-cloud-compute; endpoint overridable)."""

    def __init__(self, project: str, stack: str, endpoint: str | None = None):
        from google.cloud import compute_v1

        self.project = project
        self.label = label_value(stack)
        kwargs = {}
        if endpoint:  # a local or private Compute endpoint (tests, air-gapped setups): no Google auth
            from google.api_core.client_options import ClientOptions
            from google.auth.credentials import AnonymousCredentials

            kwargs = {"credentials": AnonymousCredentials(), "transport": "rest", "client_options": ClientOptions(api_endpoint=endpoint)}
        self.client = compute_v1.DisksClient(**kwargs)
        self.operations = compute_v1.ZoneOperationsClient(**kwargs)

    def disks(self) -> list[CloudDisk]:
        request = {"project": self.project, "filter": f'labels.spotctl-stack="{self.label}"'}
        out = []
        for scope, scoped in self.client.aggregated_list(request=request):
            for d in scoped.disks:
                zone = d.zone.rsplit("/", 1)[-1] if d.zone else scope.rsplit("/", 1)[-1]
                out.append(CloudDisk(d.name, zone, dict(d.labels), in_use=bool(d.users)))
        return out

    def delete(self, disk: CloudDisk) -> None:
        op = self.client.delete(project=self.project, zone=disk.zone, disk=disk.id)
        # Wait with our own operations client: the LRO helper would poll the public endpoint.
        self.operations.wait(project=self.project, zone=disk.zone, operation=op.name)


def inventory_for(cfg: StackConfig, stack: str) -> Inventory:
    """The stack's cloud inventory. AWS endpoints follow boto3's environment (AWS_ENDPOINT_URL);
    SPOTCTL_GCE_ENDPOINT points the Compute client elsewhere (anonymous credentials)."""
    import os

    if cfg.cloud == "aws":
        return AwsInventory(cfg.region, stack)
    return GcpInventory(cfg.project or "", stack, endpoint=os.environ.get("SPOTCTL_GCE_ENDPOINT"))


# ---- what the cloud says about a job's VMs ----------------------------------------------------------

SPOT_TERMINATION_CODES = ("Server.SpotInstanceTermination", "Server.SpotInstanceShutdown")


@dataclass(frozen=True)
class VmState:
    """One VM of a job's attempt as the cloud reports it now."""

    name: str
    node: int
    attempt: int
    status: str  # the cloud's word: running, terminated, TERMINATED, RUNNING, ...
    preempted: bool
    reason: str = ""


class AwsObserver:
    def __init__(self, region: str, stack: str, client=None):
        import boto3

        self.stack = stack
        self.ec2 = client or boto3.client("ec2", region_name=region)

    def vms(self, job_id: str) -> list[VmState]:
        filters = [{"Name": "tag:spotctl:stack", "Values": [self.stack]}, {"Name": "tag:spotctl:job", "Values": [job_id]}]
        out = []
        for page in self.ec2.get_paginator("describe_instances").paginate(Filters=filters):
            for reservation in page["Reservations"]:
                for i in reservation["Instances"]:
                    tags = {t["Key"]: t["Value"] for t in i.get("Tags", [])}
                    code = i.get("StateReason", {}).get("Code", "")
                    out.append(VmState(tags.get("Name", i["InstanceId"]), int(tags.get("spotctl:node", 0)),
                                       int(tags.get("spotctl:attempt", 0)), i["State"]["Name"],
                                       code in SPOT_TERMINATION_CODES, code))
        return out


class GcpObserver:
    def __init__(self, project: str, stack: str, zones: list[str], endpoint: str | None = None):
        from google.cloud import compute_v1

        kwargs = {}
        if endpoint:
            from google.api_core.client_options import ClientOptions
            from google.auth.credentials import AnonymousCredentials

            kwargs = {"credentials": AnonymousCredentials(), "transport": "rest", "client_options": ClientOptions(api_endpoint=endpoint)}
        self.project, self.zones, self.label = project, zones, label_value(stack)
        self.instances = compute_v1.InstancesClient(**kwargs)
        self.operations = compute_v1.ZoneOperationsClient(**kwargs)

    def vms(self, job_id: str) -> list[VmState]:
        out = []
        flt = f'labels.spotctl-stack="{self.label}" AND labels.spotctl-job="{label_value(job_id)}"'
        for zone in self.zones:
            for i in self.instances.list(request={"project": self.project, "zone": zone, "filter": flt}):
                ops = self.operations.list(request={
                    "project": self.project, "zone": zone,
                    "filter": f'operationType="compute.instances.preempted" AND targetLink:instances/{i.name}',
                })
                # `targetLink:` is a "contains" match: check the name exactly.
                preempted = any(op.target_link.rsplit("/", 1)[-1] == i.name for op in ops)
                labels = dict(i.labels)
                out.append(VmState(i.name, int(labels.get("spotctl-node", 0)), int(labels.get("spotctl-attempt", 0)),
                                   i.status, preempted, "compute.instances.preempted" if preempted else i.status_message))
        return out


def observer_for(cfg: StackConfig, stack: str):
    import os

    if cfg.cloud == "aws":
        return AwsObserver(cfg.region, stack)
    return GcpObserver(cfg.project or "", stack, list(cfg.zones), endpoint=os.environ.get("SPOTCTL_GCE_ENDPOINT"))
