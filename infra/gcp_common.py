"""What the GCP components and the watcher both use: the image and disk defaults, the network
interface (gVNIC where the machine needs it), accelerators, scheduling, metadata, service accounts."""

from __future__ import annotations

import pulumi
import pulumi_gcp as gcp

from infra.agent_object import gcp_read_condition
from infra.common import (
    StackArgs,
)
from infra.config import Accelerator, StackConfig
from infra.contract.gcp import (
    builtin_gpus,
    has_gpus,
    iam_display,
    is_dlvm,
    needs_gvnic,
)
from infra.naming import short_hash

# [UNVERIFIED] that this family still resolves (no primary list of Deep Learning VM families was
# found; README "First real `pulumi up`" says how to check, and `image:` overrides it).
DEFAULT_IMAGE = "projects/deeplearning-platform-release/global/images/family/common-cu124-debian-11-py310"
DISK_TYPE = "pd-balanced"
SCOPES = ["https://www.googleapis.com/auth/cloud-platform"]  # access is limited by IAM roles, not scopes
BOOT_DEVICE_NAME = "spotctl-boot"


def subnetwork_path(cfg: StackConfig) -> str:
    """The stack's subnetwork by its full path, so no resource ever infers project or region
    (a bare name is looked up in the provider's region: contract rule gcp.template-region)."""
    return f"projects/{cfg.project}/regions/{cfg.region}/subnetworks/{cfg.network.subnetwork or 'default'}"


def _network(args: StackArgs, machine_type: str, *, external_ip: bool, template: bool = False, network_ip=None):
    """One NIC on the stack's subnetwork; no access config (so no external IP) unless asked; gVNIC
    where the machine series supports nothing else (contract rule gcp.gvnic)."""
    nic, access = (
        (gcp.compute.InstanceTemplateNetworkInterfaceArgs, gcp.compute.InstanceTemplateNetworkInterfaceAccessConfigArgs)
        if template
        else (gcp.compute.InstanceNetworkInterfaceArgs, gcp.compute.InstanceNetworkInterfaceAccessConfigArgs)
    )
    extra = {} if template else {"network_ip": network_ip}
    return nic(
        network=args.cfg.network.network,
        subnetwork=subnetwork_path(args.cfg),
        nic_type="GVNIC" if needs_gvnic(machine_type) else None,
        access_configs=[access()] if external_ip else None,
        **extra,
    )


def _accelerators(machine_type: str, acc: Accelerator | None, cls):
    """guest_accelerators only for N1: accelerator-optimized types bring their own GPUs ("the
    specified GPU model automatically attaches", https://cloud.google.com/compute/docs/gpus)."""
    if acc is None or builtin_gpus(machine_type) is not None:
        return None
    return [cls(type=acc.type, count=acc.count)]


def _gpu_count(machine_type: str, acc: Accelerator | None) -> int:
    builtin = builtin_gpus(machine_type)
    return builtin[1] if builtin else (acc.count if acc else 0)


def _scheduling(spot: bool, cls, termination_action: str):
    """Spot: SPOT + preemptible, no automatic restart; GPUs need TERMINATE on host maintenance."""
    if spot:
        return cls(
            provisioning_model="SPOT",
            preemptible=True,
            automatic_restart=False,
            on_host_maintenance="TERMINATE",
            instance_termination_action=termination_action,
        )
    return cls(provisioning_model="STANDARD", preemptible=False, automatic_restart=True, on_host_maintenance="TERMINATE")


def _metadata(scripts, *, driver: bool) -> dict[str, str]:
    """Scripts, OS Login, and on Deep Learning VM images with GPUs the driver install flag
    (contract rule gcp.dlvm-driver; custom images must bring their own driver)."""
    meta = {"startup-script": scripts.startup, "shutdown-script": scripts.shutdown, "enable-oslogin": "TRUE"}
    if driver:
        meta["install-nvidia-driver"] = "True"
    return meta


def _wants_driver(machine_type: str, acc: Accelerator | None, image: str) -> bool:
    return is_dlvm(image) and has_gpus(machine_type, _gpu_count(machine_type, acc))


class ServiceAccount(pulumi.ComponentResource):
    """The identity of one job or pool: creates event objects only under its own ``<stack>/<name>/``
    (an IAM condition on the object name; contract rule gcp.event-writer-prefix) and writes logs.

    ``resume`` trusts the events, so no VM may write another job's: one account per job and pool.
    """

    def __init__(self, name: str, account_id: str, display: str, bucket: pulumi.Input[str], project: str, prefix: str,
                 opts=None, code_prefix: str = ""):
        super().__init__("spotctl:gcp:ServiceAccount", name, None, opts)
        child = pulumi.ResourceOptions(parent=self)
        self.account = gcp.serviceaccount.Account(
            f"{name}-account", account_id=account_id, display_name=iam_display(display), project=project, opts=child
        )
        member = self.account.email.apply(lambda e: f"serviceAccount:{e}")
        condition = gcp.storage.BucketIAMMemberConditionArgs(
            title="spotctl-event-prefix",
            description=f"create event objects under {prefix} only",
            expression=pulumi.Output.from_input(bucket).apply(
                lambda b: f'resource.name.startsWith("projects/_/buckets/{b}/objects/{prefix}")'
            ),
        )
        gcp.storage.BucketIAMMember(
            f"{name}-events-writer", bucket=bucket, role="roles/storage.objectCreator", member=member,
            condition=condition, opts=child,
        )
        gcp.storage.BucketIAMMember(
            f"{name}-reader", bucket=bucket, role="roles/storage.objectViewer", member=member,
            condition=gcp.storage.BucketIAMMemberConditionArgs(
                title="spotctl-agent-and-own-prefix", description=f"read the agent and objects under {prefix} only",
                expression=pulumi.Output.from_input(bucket).apply(lambda b: gcp_read_condition(b, prefix)),
            ),
            opts=child,
        )
        gcp.projects.IAMMember(f"{name}-log-writer", project=project, role="roles/logging.logWriter", member=member, opts=child)
        if code_prefix:
            # The job's code archives only: storage.objects.get is checked against the object's resource
            # name (projects/_/buckets/B/objects/NAME, https://cloud.google.com/iam/docs/conditions-resource-attributes
            # "Cloud Storage"), so a startsWith condition on the job's code prefix admits those objects
            # and no other; objects.list is checked against the bucket's name, which the condition never
            # matches, so the job cannot list the bucket either (roles/storage.objectViewer:
            # https://cloud.google.com/storage/docs/access-control/iam-roles). Uniform bucket-level access
            # is on (no object ACLs); a managed folder would need its own resource per job, this needs none.
            gcp.storage.BucketIAMMember(
                f"{name}-code-reader", bucket=bucket, role="roles/storage.objectViewer", member=member,
                condition=gcp.storage.BucketIAMMemberConditionArgs(
                    title="spotctl-code-prefix",
                    description=f"read the job's code under {code_prefix} only",
                    expression=pulumi.Output.from_input(bucket).apply(
                        lambda b: f'resource.name.startsWith("projects/_/buckets/{b}/objects/{code_prefix}")'),
                ),
                opts=child,
            )
        self.email = self.account.email
        self.register_outputs({"email": self.email})


def _account_id(slug: str, what: str) -> str:
    """GCP service account ids are 6-30 characters (contract rule gcp.service-account-id)."""
    candidate = f"{slug}-{what}"
    if len(candidate) <= 30:
        return candidate
    return f"{candidate[:23].rstrip('-')}-{short_hash(candidate)}"
