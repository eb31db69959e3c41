"""GCP components: the stack's shared pieces, GPU pools (static on-demand + dynamic spot MIGs) and
training jobs whose persistent disks outlive every VM (see README, "What a GCP stack declares")."""

from __future__ import annotations

import pulumi
import pulumi_gcp as gcp

from infra.common import (
    BOOT_DISK_GB,
    JobPlan,
    StackArgs,
    declare_components,
    job_outputs,
    job_script_context,
    pool_parts,
    pool_script_context,
)
from infra.config import Accelerator, Pool
from infra.naming import gcp_labels, short_hash
from infra.render import DEVICE_NAME, scripts_for

DEFAULT_IMAGE = "projects/deeplearning-platform-release/global/images/family/common-cu124-debian-11-py310"
DISK_TYPE = "pd-balanced"
SCOPES = ["https://www.googleapis.com/auth/cloud-platform"]  # access is limited by IAM roles, not scopes



def _network(args: StackArgs, *, external_ip: bool, template: bool = False, network_ip=None):
    """One NIC on the stack's subnetwork; no access config (so no external IP) unless asked."""
    net = args.cfg.network
    nic, access = (
        (gcp.compute.InstanceTemplateNetworkInterfaceArgs, gcp.compute.InstanceTemplateNetworkInterfaceAccessConfigArgs)
        if template
        else (gcp.compute.InstanceNetworkInterfaceArgs, gcp.compute.InstanceNetworkInterfaceAccessConfigArgs)
    )
    extra = {} if template else {"network_ip": network_ip}
    return nic(
        network=net.network,
        subnetwork=net.subnetwork or "default",
        access_configs=[access()] if external_ip else None,
        **extra,
    )


def _accelerators(acc: Accelerator | None, cls):
    return [cls(type=acc.type, count=acc.count)] if acc else None


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


class ServiceAccount(pulumi.ComponentResource):
    """A VM identity that may only create objects in the event bucket and write logs."""

    def __init__(self, name: str, account_id: str, display: str, bucket: pulumi.Input[str], project: str, opts=None):
        super().__init__("spotctl:gcp:ServiceAccount", name, None, opts)
        child = pulumi.ResourceOptions(parent=self)
        self.account = gcp.serviceaccount.Account(
            f"{name}-account", account_id=account_id, display_name=display, project=project, opts=child
        )
        member = self.account.email.apply(lambda e: f"serviceAccount:{e}")
        gcp.storage.BucketIAMMember(
            f"{name}-events-writer", bucket=bucket, role="roles/storage.objectCreator", member=member, opts=child
        )
        gcp.projects.IAMMember(f"{name}-log-writer", project=project, role="roles/logging.logWriter", member=member, opts=child)
        self.email = self.account.email
        self.register_outputs({"email": self.email})


def _account_id(slug: str, what: str) -> str:
    """GCP service account ids are 6-30 characters."""
    candidate = f"{slug}-{what}"
    if len(candidate) <= 30:
        return candidate
    return f"{candidate[:23].rstrip('-')}-{short_hash(candidate)}"


class StackBase(pulumi.ComponentResource):
    """Per stack: the event bucket the scripts write to, the preemption log sink and the jobs' identity."""

    def __init__(self, name: str, args: StackArgs, opts=None):
        super().__init__("spotctl:gcp:StackBase", name, None, opts)
        cfg = args.cfg
        child = pulumi.ResourceOptions(parent=self)
        labels = gcp_labels(args.stack, cfg.labels)
        self.bucket = gcp.storage.Bucket(
            f"{name}-events",
            name=f"{args.slug}-events-{short_hash(cfg.project or '', args.stack, n=8)}",
            project=cfg.project,
            location=cfg.region.upper(),
            uniform_bucket_level_access=True,
            public_access_prevention="enforced",
            versioning=gcp.storage.BucketVersioningArgs(enabled=False),
            lifecycle_rules=[
                gcp.storage.BucketLifecycleRuleArgs(
                    action=gcp.storage.BucketLifecycleRuleActionArgs(type="Delete"),
                    condition=gcp.storage.BucketLifecycleRuleConditionArgs(age=cfg.event_retention_days),
                )
            ],
            labels=labels,
            force_destroy=False,
            opts=child,
        )
        self.topic = gcp.pubsub.Topic(f"{name}-preemptions", name=f"{args.slug}-preemptions", project=cfg.project, labels=labels, opts=child)
        # Preemptions as GCE logs them; instance names of this stack all start with its slug.
        log_filter = (
            'resource.type="gce_instance" AND protoPayload.methodName="compute.instances.preempted" '
            f'AND protoPayload.resourceName:"/instances/{args.slug}-"'
        )
        self.sink = gcp.logging.ProjectSink(
            f"{name}-preempted-sink",
            name=f"{args.slug}-preempted",
            project=cfg.project,
            destination=self.topic.id.apply(lambda t: f"pubsub.googleapis.com/{t}"),
            filter=log_filter,
            unique_writer_identity=True,
            opts=child,
        )
        gcp.pubsub.TopicIAMMember(
            f"{name}-sink-publisher",
            topic=self.topic.name,
            project=cfg.project,
            role="roles/pubsub.publisher",
            member=self.sink.writer_identity,
            opts=child,
        )
        self.jobs_account = ServiceAccount(
            f"{name}-jobs-sa", _account_id(args.slug, "jobs"), f"spotctl jobs of stack {args.stack}", self.bucket.name, cfg.project or "", opts=child
        )
        self.register_outputs({"eventBucket": self.bucket.name, "preemptionTopic": self.topic.name})


class GpuPool(pulumi.ComponentResource):
    """Static on-demand MIG (fixed size) + dynamic spot MIG over every zone, autoscaled spotMin..spotMax."""

    def __init__(self, name: str, args: StackArgs, pool: Pool, base: StackBase, opts=None):
        super().__init__("spotctl:gcp:GpuPool", name, None, opts)
        cfg = args.cfg
        child = pulumi.ResourceOptions(parent=self)
        account = ServiceAccount(
            f"{name}-sa", _account_id(args.slug, f"pool-{pool.name}"), f"spotctl pool {pool.name} of {args.stack}", base.bucket.name, cfg.project or "", opts=child
        )
        labels = gcp_labels(args.stack, cfg.labels, pool=pool.name)
        metadata = base.bucket.name.apply(
            lambda bucket: _metadata(scripts_for(pool_script_context(cfg, args.stack, pool, bucket=bucket)))
        )
        self.mig_names: dict[str, pulumi.Output[str]] = {}
        for part, spot in pool_parts(pool):
            physical = f"{args.slug}-{pool.name}-{part}"
            template = gcp.compute.InstanceTemplate(
                f"{name}-{part}-template",
                name_prefix=f"{physical[:36]}-",
                project=cfg.project,
                machine_type=pool.machine_type,
                disks=[
                    gcp.compute.InstanceTemplateDiskArgs(
                        boot=True,
                        auto_delete=True,
                        source_image=pool.image or DEFAULT_IMAGE,
                        disk_size_gb=pool.disk_gb,
                        disk_type=DISK_TYPE,
                        labels=labels,
                    )
                ],
                guest_accelerators=_accelerators(pool.accelerator, gcp.compute.InstanceTemplateGuestAcceleratorArgs),
                scheduling=_scheduling(spot, gcp.compute.InstanceTemplateSchedulingArgs, "DELETE"),
                metadata=metadata,
                network_interfaces=[_network(args, external_ip=pool.external_ip, template=True)],
                service_account=gcp.compute.InstanceTemplateServiceAccountArgs(email=account.email, scopes=SCOPES),
                shielded_instance_config=gcp.compute.InstanceTemplateShieldedInstanceConfigArgs(
                    enable_secure_boot=False, enable_vtpm=True, enable_integrity_monitoring=True
                ),
                labels=labels,
                opts=child,
            )
            mig = gcp.compute.RegionInstanceGroupManager(
                f"{name}-{part}-mig",
                name=physical,
                project=cfg.project,
                region=cfg.region,
                base_instance_name=physical,
                versions=[
                    gcp.compute.RegionInstanceGroupManagerVersionArgs(
                        name="primary", instance_template=template.self_link_unique
                    )
                ],
                distribution_policy_zones=list(cfg.zones),
                # Spot: take capacity in whichever zone has it (GCP's AZ shuffle); on-demand: spread evenly.
                distribution_policy_target_shape="ANY" if spot else "EVEN",
                target_size=None if spot else pool.on_demand,
                update_policy=gcp.compute.RegionInstanceGroupManagerUpdatePolicyArgs(
                    type="OPPORTUNISTIC",
                    minimal_action="REPLACE",
                    instance_redistribution_type="NONE",
                    max_surge_fixed=0,
                    max_unavailable_fixed=len(cfg.zones),
                ),
                wait_for_instances=False,
                opts=child,
            )
            if spot:
                gcp.compute.RegionAutoscaler(
                    f"{name}-{part}-autoscaler",
                    name=physical,
                    project=cfg.project,
                    region=cfg.region,
                    target=mig.id,
                    autoscaling_policy=gcp.compute.RegionAutoscalerAutoscalingPolicyArgs(
                        min_replicas=pool.spot_min,
                        max_replicas=pool.spot_max,
                        cooldown_period=120,
                        mode="ON",
                        cpu_utilization=gcp.compute.RegionAutoscalerAutoscalingPolicyCpuUtilizationArgs(target=0.6),
                    ),
                    opts=child,
                )
            self.mig_names[part] = mig.name
        self.register_outputs({"migs": self.mig_names})


def _metadata(scripts) -> dict[str, str]:
    return {"startup-script": scripts.startup, "shutdown-script": scripts.shutdown, "enable-oslogin": "TRUE"}


class TrainingJob(pulumi.ComponentResource):
    """Per node a persistent job disk (protected until the job completed) and the VM of the current attempt."""

    def __init__(self, name: str, args: StackArgs, plan: JobPlan, base: StackBase, opts=None):
        super().__init__("spotctl:gcp:TrainingJob", name, None, opts)
        cfg, job = args.cfg, plan.job
        child = pulumi.ResourceOptions(parent=self)
        labels = gcp_labels(args.stack, cfg.labels, job=job.id)
        master_addr: pulumi.Output[str] | None = None
        if plan.needs_master_address:
            # Reserved so MASTER_ADDR is the same for every attempt: workers never chase a new master.
            address = gcp.compute.Address(
                f"{name}-master-ip",
                name=f"{plan.slug}-{job.id}-master",
                project=cfg.project,
                region=cfg.region,
                address_type="INTERNAL",
                purpose="GCE_ENDPOINT",
                subnetwork=cfg.network.subnetwork or "default",
                labels=labels,
                opts=child,
            )
            master_addr = address.address
        self.disks: list[gcp.compute.Disk] = []
        self.instances: list[gcp.compute.Instance] = []
        for node in plan.nodes:
            disk = gcp.compute.Disk(
                f"{name}-n{node.rank}-disk",
                name=node.disk_name,
                project=cfg.project,
                zone=job.zone,
                size=job.disk_gb,
                type=DISK_TYPE,
                labels={**labels, "spotctl-node": str(node.rank)},
                opts=pulumi.ResourceOptions(parent=self, protect=plan.protect_disks),
            )
            self.disks.append(disk)
            if not node.declares_instance:
                continue
            addr = master_addr if master_addr is not None else pulumi.Output.from_input("127.0.0.1")
            metadata = pulumi.Output.all(base.bucket.name, addr).apply(
                lambda v, node=node: _metadata(
                    scripts_for(
                        job_script_context(
                            cfg, args.stack, plan, node, bucket=v[0], master_addr=v[1],
                            disk_device=f"/dev/disk/by-id/google-{DEVICE_NAME}",
                        )
                    )
                )
            )
            instance = gcp.compute.Instance(
                f"{name}-n{node.rank}-vm",
                name=node.instance_name,
                project=cfg.project,
                zone=job.zone,
                machine_type=job.machine_type,
                boot_disk=gcp.compute.InstanceBootDiskArgs(
                    auto_delete=True,  # the boot disk is per attempt; the job's data lives on the job disk
                    initialize_params=gcp.compute.InstanceBootDiskInitializeParamsArgs(
                        image=job.image or DEFAULT_IMAGE, size=BOOT_DISK_GB, type=DISK_TYPE, labels=labels
                    ),
                ),
                # An attached existing disk is never auto-deleted with the VM (the API's autoDelete is
                # false for it): the job disk survives preemption, deletion and every new attempt.
                attached_disks=[
                    gcp.compute.InstanceAttachedDiskArgs(source=disk.self_link, device_name=DEVICE_NAME, mode="READ_WRITE")
                ],
                guest_accelerators=_accelerators(job.accelerator, gcp.compute.InstanceGuestAcceleratorArgs),
                # STOP keeps a preempted VM around (TERMINATED) so status can see what happened;
                # the next attempt deletes it before creating its own.
                scheduling=_scheduling(plan.spot, gcp.compute.InstanceSchedulingArgs, "STOP"),
                metadata=metadata,
                network_interfaces=[
                    _network(args, external_ip=job.external_ip, network_ip=master_addr if node.is_master else None)
                ],
                service_account=gcp.compute.InstanceServiceAccountArgs(email=base.jobs_account.email, scopes=SCOPES),
                shielded_instance_config=gcp.compute.InstanceShieldedInstanceConfigArgs(
                    enable_secure_boot=False, enable_vtpm=True, enable_integrity_monitoring=True
                ),
                labels={**labels, "spotctl-node": str(node.rank), "spotctl-attempt": str(job.attempt)},
                allow_stopping_for_update=True,
                deletion_protection=False,
                # One logical VM per node: a new attempt renames it, which replaces it, and the old VM
                # must release the job disk before the new one can attach it read-write.
                # Workers wait for the new master: none of them ever meets a stale master at the rendezvous.
                opts=pulumi.ResourceOptions(parent=self, delete_before_replace=True, depends_on=[disk, *self.instances[:1]]),
            )
            self.instances.append(instance)
        self.outputs = job_outputs(
            plan, disks_key="disks", disks=[d.name for d in self.disks], instances=[i.name for i in self.instances],
            master_addr=master_addr,
        )
        self.register_outputs(self.outputs)


def declare(args: StackArgs, plans: list[JobPlan]) -> dict[str, object]:
    """Declare the whole GCP stack; returns the stack outputs."""
    base, pools, jobs = declare_components(args, plans, StackBase, GpuPool, TrainingJob)
    return {
        "eventBucket": base.bucket.name,
        "preemptionTopic": base.topic.name,
        "pools": {name: {"migs": p.mig_names} for name, p in pools.items()},
        "jobs": {jid: j.outputs for jid, j in jobs.items()},
    }
