"""GCP components: the stack's shared pieces, GPU pools (static on-demand + dynamic spot MIGs) and
training jobs whose persistent disks outlive every VM (see README, "What a GCP stack declares").

Every resource goes through one explicit ``gcp.Provider`` built from ``spotctl:project`` and
``spotctl:region`` (never the ambient ``gcp:*`` config), and every rule GCE enforces on these inputs
is in ``infra/contract/gcp.py``. The shared pieces are in ``infra/gcp_base.py``, what the watcher
uses too in ``infra/gcp_common.py``.
"""

from __future__ import annotations

import pulumi
import pulumi_gcp as gcp

from infra import contract
from infra.common import (
    BOOT_DISK_GB,
    MOVE_CREATE_TIMEOUT,
    JobPlan,
    StackArgs,
    declare_components,
    frozen_scripts,
    job_outputs,
    job_script_context,
    pool_parts,
    pool_script_context,
)
from infra.config import Pool as PoolConfig
from infra.config import StackConfig
from infra.contract.gcp import (
    autoscaled_shape_problem,
    regional_disk_problem,
)
from infra.gcp_base import (  # noqa: F401
    SYSTEM_EVENT_LOG_RE,
    Egress,
    StackBase,
    sink_filter,
)
from infra.gcp_common import (  # noqa: F401
    BOOT_DEVICE_NAME,
    DEFAULT_IMAGE,
    DISK_TYPE,
    SCOPES,
    ServiceAccount,
    _accelerators,
    _account_id,
    _gpu_count,
    _metadata,
    _network,
    _scheduling,
    _wants_driver,
    subnetwork_path,
)
from infra.naming import boot_disk_name, code_prefix, gcp_labels, pool_metric_filter, pool_metric_type, secret_id
from infra.render import DEVICE_NAME, event_object_prefix, scripts_for


class GpuPool(pulumi.ComponentResource):
    """Static on-demand MIG (fixed size) + dynamic spot MIG over every zone, autoscaled spotMin..spotMax
    on the pool's published demand (and with fallbackToOnDemand an on-demand MIG that stands in for
    spot that stayed sold out); see ``_demand_policy``."""

    def __init__(self, name: str, args: StackArgs, pool: PoolConfig, base: StackBase, opts=None):
        super().__init__("spotctl:gcp:GpuPool", name, None, opts)
        cfg = args.cfg
        child = pulumi.ResourceOptions(parent=self)
        machine = pool.machine_type or ""
        account = ServiceAccount(
            f"{name}-sa", _account_id(args.slug, f"pool-{pool.name}"), f"spotctl pool {pool.name} of {args.stack}",
            base.bucket.name, cfg.project or "", event_object_prefix(args.stack, pool.name), opts=child,
        )
        labels = gcp_labels(args.stack, cfg.labels, pool=pool.name)
        image = pool.image or DEFAULT_IMAGE
        driver = _wants_driver(machine, pool.accelerator, image)
        metadata = base.bucket.name.apply(
            lambda bucket: _metadata(scripts_for(pool_script_context(cfg, args.stack, pool, bucket=bucket)), driver=driver)
        )
        self.mig_names: dict[str, pulumi.Output[str]] = {}
        for pool_part in pool_parts(pool):
            part, spot, scaled = pool_part.name, pool_part.spot, pool_part.metric is not None
            physical = f"{args.slug}-{pool.name}-{part}"
            template = gcp.compute.InstanceTemplate(
                f"{name}-{part}-template",
                name_prefix=f"{physical[:36]}-",
                project=cfg.project,
                region=cfg.region,  # the subnetwork's region, never the provider's guess (gcp.template-region)
                machine_type=machine,
                disks=[
                    gcp.compute.InstanceTemplateDiskArgs(
                        boot=True,
                        auto_delete=True,
                        source_image=image,
                        disk_size_gb=pool.disk_gb,
                        disk_type=DISK_TYPE,
                        labels=labels,
                    )
                ],
                guest_accelerators=_accelerators(machine, pool.accelerator, gcp.compute.InstanceTemplateGuestAcceleratorArgs),
                scheduling=_scheduling(spot, gcp.compute.InstanceTemplateSchedulingArgs, "DELETE"),
                metadata=metadata,
                network_interfaces=[_network(args, machine, external_ip=pool.external_ip, template=True)],
                service_account=gcp.compute.InstanceTemplateServiceAccountArgs(email=account.email, scopes=SCOPES),
                shielded_instance_config=gcp.compute.InstanceTemplateShieldedInstanceConfigArgs(
                    enable_secure_boot=False, enable_vtpm=True, enable_integrity_monitoring=True
                ),
                labels=labels,
                opts=pulumi.ResourceOptions(parent=self, depends_on=base.egress),
            )
            # The fixed on-demand part must come up or `up` fails loudly; the autoscaled parts (spot,
            # fallback) never wait (a stockout would hang `up` until the provider's timeout).
            wait = not scaled
            contract.enforce(
                "gcp.mig-no-wait-on-spot", f"{name}-{part}-mig",
                "wait_for_instances on a spot group" if (spot and wait) else None,
            )
            # Autoscaled parts go where capacity is: BALANCED is the capacity-aware shape an
            # autoscaler accepts (ANY is not: rule gcp.autoscaled-mig-shape); it needs proactive
            # redistribution off, which every part has (gcp.mig-shape-redistribution). The static
            # part spreads evenly.
            shape = "BALANCED" if scaled else "EVEN"
            if scaled:
                contract.enforce("gcp.autoscaled-mig-shape", f"{name}-{part}-mig", autoscaled_shape_problem(shape))
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
                distribution_policy_target_shape=shape,
                target_size=None if scaled else pool_part.min_size,
                update_policy=gcp.compute.RegionInstanceGroupManagerUpdatePolicyArgs(
                    type="OPPORTUNISTIC",
                    minimal_action="REPLACE",
                    instance_redistribution_type="NONE",
                    max_surge_fixed=0,
                    max_unavailable_fixed=len(cfg.zones),
                ),
                wait_for_instances=wait,
                wait_for_instances_status="STABLE" if wait else None,
                opts=child,
            )
            if scaled:
                gcp.compute.RegionAutoscaler(
                    f"{name}-{part}-autoscaler",
                    name=physical,
                    project=cfg.project,
                    region=cfg.region,
                    target=mig.id,
                    autoscaling_policy=_demand_policy(args.stack, pool, pool_part),
                    opts=child,
                )
            self.mig_names[part] = mig.name
        self.register_outputs({"migs": self.mig_names})


def _demand_policy(stack: str, pool: PoolConfig, part) -> gcp.compute.RegionAutoscalerAutoscalingPolicyArgs:
    """Size a part by the pool's demand metric, never by CPU (a GPU VM's CPUs idle while it trains).

    A per-group metric (resource type ``global``) with ``single_instance_assignment = 1``: the group
    gets one VM per unit of published demand, and it is defined at 0 VMs, so a part with min 0
    grows from zero (with per-instance metrics a MIG "cannot scale below a size of 1 VM"; see the
    rule gcp.autoscaler-zero-needs-per-group-metric). Demand counts running work, so the target
    never drops below the VMs that are busy; scale-in control removes at most one VM per 10
    minutes, so a dip in the published demand does not drain the pool.
    """
    policy = gcp.compute.RegionAutoscalerAutoscalingPolicyArgs
    return policy(
        min_replicas=part.min_size,
        max_replicas=part.max_size,
        cooldown_period=120,
        mode="ON",
        metrics=[
            gcp.compute.RegionAutoscalerAutoscalingPolicyMetricArgs(
                name=pool_metric_type(part.metric),
                filter=pool_metric_filter(stack, pool.name),
                single_instance_assignment=1,
            )
        ],
        scale_in_control=gcp.compute.RegionAutoscalerAutoscalingPolicyScaleInControlArgs(
            max_scaled_in_replicas=gcp.compute.RegionAutoscalerAutoscalingPolicyScaleInControlMaxScaledInReplicasArgs(fixed=1),
            time_window_sec=600,
        ),
    )


class TrainingJob(pulumi.ComponentResource):
    """Per node a persistent job disk (protected: only `spotctl cleanup` of the completed job lifts it), optionally a kept boot
    disk (``bootDisk: keep``), and the VM of the current attempt; the job's own identity; for a
    multi-node job on a custom network the firewall rule its gang talks through."""

    def __init__(self, name: str, args: StackArgs, plan: JobPlan, base: StackBase, opts=None):
        super().__init__("spotctl:gcp:TrainingJob", name, None, opts)
        cfg, job = args.cfg, plan.job
        child = pulumi.ResourceOptions(parent=self)
        machine = job.machine_type or ""
        image = job.image or DEFAULT_IMAGE
        labels = gcp_labels(args.stack, cfg.labels, job=job.id)
        account = ServiceAccount(
            f"{name}-sa", _account_id(plan.slug, f"job-{job.id}"), f"spotctl job {job.id} of {args.stack}",
            base.bucket.name, cfg.project or "", event_object_prefix(args.stack, job.id), opts=child,
            code_prefix=code_prefix(args.stack, job.id) if job.code is not None and job.code.dir is not None else "",
        )
        secret_deps = self._env_secret(name, args, plan, account, labels, child, getattr(base, "watcher", None))
        if getattr(base, "watcher", None) is not None:
            # The watcher creates this job's VMs, which run as this account: it needs actAs on it
            # (https://cloud.google.com/compute/docs/access/iam#the_serviceaccountuser_role), on
            # this account only, never project-wide. Inside the job, so `cleanup` removes it with it.
            gcp.serviceaccount.IAMMember(
                f"{name}-sa-watcher-user", service_account_id=account.account.name, role="roles/iam.serviceAccountUser",
                member=base.watcher.member, opts=child,
            )
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
                subnetwork=subnetwork_path(cfg),
                labels=labels,
                opts=child,
            )
            master_addr = address.address
            if cfg.network.network != "default":
                # A custom network has no rule letting VMs talk to each other (the default network's
                # default-allow-internal): NCCL and the rendezvous need one, scoped to this job's identity.
                gcp.compute.Firewall(
                    f"{name}-gang-fw",
                    name=f"{plan.slug}-{job.id}-gang",
                    project=cfg.project,
                    network=cfg.network.network,
                    direction="INGRESS",
                    allows=[gcp.compute.FirewallAllowArgs(protocol="all")],
                    source_service_accounts=[account.email],
                    target_service_accounts=[account.email],
                    description=f"spotctl: nodes of job {job.id} of stack {args.stack} reach each other",
                    opts=child,
                )
        driver = _wants_driver(machine, job.accelerator, image)
        self.disks: list[gcp.compute.Disk | gcp.compute.RegionDisk] = []
        self.instances: list[gcp.compute.Instance] = []
        for node in plan.nodes:
            disk = self._job_disks(name, cfg, job, node, labels)
            boot = None
            if job.boot_disk == "keep":
                # Every attempt boots from this disk: the driver and whatever the first boot installed
                # survive preemption. Protected like the job disk; the logical name ends in "-disk" so
                # `spotctl cleanup` unprotects it with the others.
                boot = gcp.compute.Disk(
                    f"{name}-n{node.rank}-boot-disk",
                    name=boot_disk_name(plan.slug, job.id, node.rank),
                    project=cfg.project,
                    zone=job.zone,
                    image=image,
                    size=BOOT_DISK_GB,
                    type=DISK_TYPE,
                    labels={**labels, "spotctl-node": str(node.rank), "spotctl-disk": "boot"},
                    opts=pulumi.ResourceOptions(parent=self, protect=plan.protect_disks),
                )
                self.disks.append(boot)
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
                    ),
                    driver=driver,
                )
            )
            if boot is not None:
                boot_disk = gcp.compute.InstanceBootDiskArgs(
                    source=boot.self_link, auto_delete=False, device_name=BOOT_DEVICE_NAME  # gcp.kept-boot-disk
                )
            else:
                boot_disk = gcp.compute.InstanceBootDiskArgs(
                    auto_delete=True,  # the boot disk is per attempt; the job's data lives on the job disk
                    initialize_params=gcp.compute.InstanceBootDiskInitializeParamsArgs(
                        image=image, size=BOOT_DISK_GB, type=DISK_TYPE, labels=labels
                    ),
                )
            instance = gcp.compute.Instance(
                f"{name}-n{node.rank}-vm",
                name=node.instance_name,
                project=cfg.project,
                zone=job.zone,
                machine_type=machine,
                boot_disk=boot_disk,
                # An attached existing disk is never auto-deleted with the VM (the API's autoDelete is
                # false for it): the job disk survives preemption, deletion and every new attempt.
                attached_disks=[
                    gcp.compute.InstanceAttachedDiskArgs(source=disk.self_link, device_name=DEVICE_NAME, mode="READ_WRITE",
                                                         force_attach=_force_attach(job, node, name))
                ],
                guest_accelerators=_accelerators(machine, job.accelerator, gcp.compute.InstanceGuestAcceleratorArgs),
                # STOP keeps a preempted VM around (TERMINATED) so status can see what happened;
                # the next attempt deletes it before creating its own.
                scheduling=_scheduling(plan.spot, gcp.compute.InstanceSchedulingArgs, "STOP"),
                metadata=metadata,
                network_interfaces=[
                    _network(args, machine, external_ip=job.external_ip, network_ip=master_addr if node.is_master else None)
                ],
                service_account=gcp.compute.InstanceServiceAccountArgs(email=account.email, scopes=SCOPES),
                shielded_instance_config=gcp.compute.InstanceShieldedInstanceConfigArgs(
                    enable_secure_boot=False, enable_vtpm=True, enable_integrity_monitoring=True
                ),
                labels={**labels, "spotctl-node": str(node.rank), "spotctl-attempt": str(job.attempt)},
                allow_stopping_for_update=True,
                deletion_protection=False,
                # One logical VM per node: a new attempt renames it, which replaces it, and the old VM
                # must release the job disk before the new one can attach it read-write.
                # Workers wait for the new master: none of them ever meets a stale master at the rendezvous.
                opts=pulumi.ResourceOptions(
                    parent=self, delete_before_replace=True,
                    depends_on=[disk, *([boot] if boot else []), *self.instances[:1], *base.egress, *secret_deps],
                    ignore_changes=frozen_scripts(job, "gcp") or None,  # an upgrade's scripts: the next attempt
                ),
            )
            self.instances.append(instance)
        self.outputs = job_outputs(
            plan, disks_key="disks", disks=[d.name for d in self.disks], instances=[i.name for i in self.instances],
            master_addr=master_addr,
        )
        self.register_outputs(self.outputs)


    def _env_secret(self, name: str, args: StackArgs, plan: JobPlan, account: ServiceAccount, labels, child,
                    watcher=None) -> list[pulumi.Resource]:
        """The job's secret env values (README "Secrets in env"): a Secret Manager secret and its
        version, readable (``roles/secretmanager.secretAccessor`` on this one secret) by the job's
        own service account only. The payload is a secret Output: Pulumi encrypts it in its state."""
        job = plan.job
        if not job.secret_keys:
            return []
        cfg = args.cfg
        secret = gcp.secretmanager.Secret(
            f"{name}-env-secret",
            secret_id=secret_id(plan.slug, job.id),
            project=cfg.project,
            replication=gcp.secretmanager.SecretReplicationArgs(auto=gcp.secretmanager.SecretReplicationAutoArgs()),
            labels=labels,
            opts=child,
        )
        version = gcp.secretmanager.SecretVersion(
            f"{name}-env-secret-version", secret=secret.id, secret_data=args.secrets[job.id], opts=child
        )
        reader = gcp.secretmanager.SecretIamMember(
            f"{name}-env-secret-reader",
            project=cfg.project,
            secret_id=secret.secret_id,
            role="roles/secretmanager.secretAccessor",
            member=account.email.apply(lambda e: f"serviceAccount:{e}"),
            opts=child,
        )
        if watcher is not None:
            # The watcher refreshes this secret with the job's targeted updates: read it and its IAM
            # policy (viewer), on this one secret only.
            for role in ("secretAccessor", "viewer"):
                gcp.secretmanager.SecretIamMember(
                    f"{name}-env-secret-watcher-{role.lower()}", project=cfg.project, secret_id=secret.secret_id,
                    role=f"roles/secretmanager.{role}", member=watcher.member, opts=child,
                )
        return [version, reader]

    def _job_disks(self, name: str, cfg: StackConfig, job, node, labels: dict[str, str]) -> gcp.compute.Disk | gcp.compute.RegionDisk:
        """A node's job disks and move snapshots (``infra.common.node_disks``); returns the attached one.

        A snapshot is global and restores into any zone (gcp.snapshot-restore-any-zone) or into a
        regional disk (a conversion: RegionDisk's ``snapshot`` input, "The source snapshot used to
        create this disk", terraform-provider-google google/services/compute/resource_compute_region_disk.go
        @0597a694); the restored disk keeps its ``snapshot`` input once the snapshot leaves the
        program (ignore_changes: it is ForceNew), so releasing a move never replaces it. A regional
        persistent disk is one disk replicated in two zones of the region; the VM of either zone
        attaches it (gcp.regional-disk-attach-in-replica-zone), no snapshot moves it."""
        by_gen: dict[int, gcp.compute.Disk | gcp.compute.RegionDisk] = {}
        snaps: dict[int, gcp.compute.Snapshot] = {}
        for d in sorted(node.disks, key=lambda d: d.gen):
            snap = None
            if d.snapshot and d.gen - 1 in by_gen:
                s = next(s for s in node.snapshots if s.gen == d.gen)
                snap = snaps[d.gen] = self._snapshot(name, cfg, node, s, by_gen[d.gen - 1], labels)
            where = ({"region": cfg.region, "replica_zones": list(d.replica_zones)} if d.replica_zones else {"zone": d.zone})
            kind = gcp.compute.RegionDisk if d.replica_zones else gcp.compute.Disk
            by_gen[d.gen] = kind(
                d.logical(name, node.rank),
                name=d.name,
                project=cfg.project,
                size=job.disk_gb,
                type=DISK_TYPE,
                snapshot=snap.self_link if snap is not None else None,
                labels={**labels, "spotctl-node": str(node.rank)},
                opts=pulumi.ResourceOptions(parent=self, protect=d.protect,
                                            ignore_changes=["snapshot"] if d.restored else None,
                                            custom_timeouts=_MOVE_TIMEOUTS if d.restored else None),
                **where,
            )
            self.disks.append(by_gen[d.gen])
        for s in node.snapshots:
            if s.gen not in snaps:  # step snapshot: the restored disk is not declared yet
                self._snapshot(name, cfg, node, s, by_gen[s.gen - 1], labels)
        attached = node.attached_disk
        if any(d.replica_zones for d in node.disks):  # the job's own or the one a conversion restores
            contract.enforce("gcp.regional-disk-machine-series", attached.logical(name, node.rank),
                             regional_disk_problem(job.machine_type))
        if attached.replica_zones:
            contract.enforce("gcp.regional-disk-attach-in-replica-zone", attached.logical(name, node.rank),
                             f"attached in {job.zone} but replicated in {list(attached.replica_zones)}"
                             if job.zone not in attached.replica_zones else None)
        else:
            contract.enforce("gcp.zonal-disk-same-zone", attached.logical(name, node.rank),
                             f"attached in {job.zone} but in {attached.zone}" if attached.zone != job.zone else None)
        return by_gen[attached.gen]

    def _snapshot(self, name: str, cfg: StackConfig, node, s, source: gcp.compute.Disk,
                  labels: dict[str, str]) -> gcp.compute.Snapshot:
        # Kept in the cloud when the move is released (retain_on_delete): it is the job's data at
        # the move; it carries the stack's ownership labels.
        return gcp.compute.Snapshot(
            s.logical(name, node.rank),
            name=s.name,
            project=cfg.project,
            zone=s.zone,
            source_disk=source.name,
            labels={**labels, "spotctl-node": str(node.rank)},
            opts=pulumi.ResourceOptions(parent=self, retain_on_delete=True, custom_timeouts=_MOVE_TIMEOUTS),
        )


# A move's snapshot and the disks restored from it may take hours (gcp.move-create-timeout).
_MOVE_TIMEOUTS = pulumi.CustomTimeouts(create=MOVE_CREATE_TIMEOUT)


def _force_attach(job, node, name: str) -> bool | None:
    """The first attempt after a move between a regional disk's zones attaches it with
    ``forceAttach``: the old zone's VM may be unreachable and still hold it (repd-failover)."""
    regional = bool(node.attached_disk.replica_zones)
    failover = bool(job.zone_history) and job.zone_history[-1].same_disk and job.zone_history[-1].last_attempt == job.attempt - 1
    contract.enforce("gcp.force-attach-regional-only", f"{name}-n{node.rank}-vm",
                     "the job failed over with its regional disk but now declares a zonal one (diskReplicaZones removed?)"
                     if failover and not regional else None)
    return True if failover else None


def declare(args: StackArgs, plans: list[JobPlan]) -> dict[str, object]:
    """Declare the whole GCP stack through one explicit provider; returns the stack outputs."""
    provider = gcp.Provider("gcp", project=args.cfg.project, region=args.cfg.region)
    opts = pulumi.ResourceOptions(providers=[provider])

    def base_cls(name: str, args: StackArgs, opts=None) -> StackBase:
        return StackBase(name, args, plans, opts=opts)

    from infra.gcp_watcher import Watcher, shorter_slugs

    base, pools, jobs = declare_components(args, plans, base_cls, GpuPool, TrainingJob, opts=opts, watcher_cls=Watcher)
    for other in shorter_slugs(args.slug, list(args.siblings)):
        pulumi.log.warn(f"this stack's names start with {other}-, like stack {other}'s: if {other} declares "
                        f"spotctl:watcher, run `pulumi up` on it once so its watcher's grant leaves this stack out")
    outputs: dict[str, object] = {
        "eventBucket": base.bucket.name,
        "preemptionTopic": base.topic.name,
        "preemptionSubscription": base.subscription.name,
        "pools": {name: {"migs": p.mig_names} for name, p in pools.items()},
        "jobs": {jid: j.outputs for jid, j in jobs.items()},
    }
    if base.watcher is not None:
        outputs["watcher"] = {"instance": base.watcher.instance.name, "zone": args.cfg.watcher_zone,
                              "serviceAccount": base.watcher.account.email}
    return outputs
