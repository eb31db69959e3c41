"""The GCP watcher (``spotctl:watcher``): a small on-demand VM that runs ``spotctl watch`` for the
stack, and the least-privilege service account it runs as (README "Watching a stack", way 4).

The account may pull the preemption subscription, read the event bucket, read and write the Pulumi
backend's prefix, read the stack's passphrase (or use its KMS key), and do what a targeted
``pulumi up --refresh`` of this stack's jobs does (cli/lifecycle/apply.py ``job_targets``: a job's
component and its children, never pools), through two custom roles the stack declares
(:data:`NAMED_PERMISSIONS`, :data:`PROJECT_PERMISSIONS`), never ``roles/compute.instanceAdmin.v1``.

Why two, and why no predefined role. IAM conditions see a resource's type and name only for the
types listed in https://cloud.google.com/iam/docs/conditions-resource-attributes ("Other services
and resource types do not recognize resource attributes"; for Compute Engine: instances, disks
zonal and regional, snapshots, images, instance templates, firewalls, backend services, forwarding
rules, target proxies). Subnetworks, addresses, operations, autoscalers and the project itself are
not listed, and "If part of a condition uses an attribute that isn't available for a resource, then
that part of the condition is never interpreted as granting access" (conditions-attribute-reference,
"Support for inherited conditions"). The old grant (instanceAdmin.v1 with name clauses plus a
catch-all ``resource.type != ...`` binding for everything else) was therefore either too wide or
too narrow, and the docs do not say which: if IAM supplies a type for the project, autoscalers and
resource policies, the catch-all granted ``compute.projects.setCommonInstanceMetadata`` (every VM's
metadata, ssh keys included), autoscalers and resource policies project-wide (all in the role:
iann0036/iam-dataset gcp/roles/compute.instanceAdmin.v1.json); if not, it never granted the
operations and list permissions a job's update needs. Either way its subnetwork clause
(``resource.type == ".../Subnetwork" && resource.name == ...``) could never hold (a subnetwork
provides no name), and the catch-all excluded Subnetwork: ``compute.subnetworks.use``, which every
VM creation needs, was never granted. Now:

- ``spotctl_<slug>_watcher`` holds only permissions on instances, disks and snapshots (and the
  subnetwork's use), bound at the project with conditions naming this stack's resources (below)
  and, unconditioned, on the stack's subnetwork alone (verified: "compute.subnetworks.use on the
  project or on the chosen subnet", compute/docs/instances/create-start-instance; a custom role on a
  subnetwork: "custom roles must be of the format [projects|organizations]/{parent-name}/roles/...",
  terraform-provider-google website/docs/r/compute_subnetwork_iam.html.markdown @c056d71f);
- ``spotctl_<slug>_watcher_project`` holds what no condition can name and changes nothing: reads,
  lists, operations and the master address's use, bound unconditioned; and with a scaling pool the
  one write its minute needs, the pool demand it publishes again (:data:`POOL_DEMAND_PERMISSIONS`).

Exact to the stack: the names are ``<slug>-<job>-...`` and both slugs and job ids contain '-', so
stack ``team``'s prefix ``team-`` also starts stack ``team-b``'s names, and no prefix (nor endsWith)
can tell them apart; renaming is no way out (a renamed disk is a new, empty disk) and exact names
do not fit (an instance's name changes with every attempt the watcher starts, and a condition holds
at most 12 logic operators). So the condition excludes, by name, the project's other stacks whose
slug extends this one's (their stack files sit next to this one's; ``extending_slugs``), a job of
this stack named into such a stack's names is refused at plan (``check_condition_covers_names``),
and a stack created later is warned at its own plan that the older stack's grant covers it until
that stack's next ``pulumi up``.

A job's secret env values are refreshed by its targeted update: terraform-provider-google reads a
secret (secretmanager.secrets.get), its IAM members (secrets.getIamPolicy) and its version
(versions.get, then ``:access``: versions.access, resource_secret_manager_secret_version.go), so the
job binds the watcher to ``roles/secretmanager.viewer`` and ``roles/secretmanager.secretAccessor`` on
that one secret (infra/gcp.py); writing a new version is not granted (the watcher never changes a
secret). ``iam.serviceAccounts.actAs`` is granted by each job on its own service account only.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import pulumi
import pulumi_gcp as gcp

from infra import contract
from infra.common import StackArgs
from infra.contract.gcp import MAX_CONDITIONAL_BINDINGS, MAX_LOGIC_OPERATORS, iam_display, logic_operators
from infra.gcp_common import SCOPES, _account_id, _network, subnetwork_path
from infra.naming import boot_disk_name, gcp_labels, instance_name, shared_stack_file, stack_slug, watch_lease
from infra.render import WatcherContext, watcher_script

DEBIAN_IMAGE = "projects/debian-cloud/global/images/family/debian-12"  # Shielded VM capable (UEFI)
# Compute resource types whose names the condition limits to this stack's (the only ones of a job's
# update that IAM conditions can name: conditions-resource-attributes). A regional disk
# (diskReplicaZones) is a Disk named regions/R/disks/NAME ("Compute Engine regional persistent
# disks: projects/P/regions/R/disks/D", same page): both paths are listed.
NAMED_TYPES = {"Instance": ("zones/{zone}/instances/",), "Disk": ("zones/{zone}/disks/", "regions/{region}/disks/"),
               "Snapshot": ("global/snapshots/",)}

# ---- what a job's targeted `pulumi up --refresh` and the watcher's own reads call ----------------
# Per group: the Compute Engine docs' required permissions of the method, and the provider code that
# calls it (terraform-provider-google google/services/compute/...; pulumi-gcp wraps it).
NAMED_PERMISSIONS: dict[str, tuple[str, ...]] = {
    # Creating a VM: "compute.instances.create ... compute.instances.setMetadata ... setLabels ...
    # setServiceAccount on the VM; compute.disks.create (its boot disk); compute.disks.use on the disk
    # (the job disk, attached read-write)" (https://cloud.google.com/compute/docs/instances/create-start-instance,
    # "Required permissions"). resource_compute_instance.go: Read is instances.get (and disks.get of the
    # boot disk, named like the VM); Delete instances.delete; Update in place (allow_stopping_for_update)
    # stop/start around setMachineType, setMachineResources (guest accelerators), setServiceAccount,
    # setScheduling, setMetadata, setLabels, setDeletionProtection, updateShieldedInstanceConfig,
    # attachDisk/detachDisk (attached_disk changes).
    "instances": ("compute.instances.create", "compute.instances.get", "compute.instances.delete",
                  "compute.instances.setMetadata", "compute.instances.setLabels", "compute.instances.setServiceAccount",
                  "compute.instances.setScheduling", "compute.instances.setMachineType",
                  "compute.instances.setMachineResources", "compute.instances.setDeletionProtection",
                  "compute.instances.updateShieldedInstanceConfig", "compute.instances.attachDisk",
                  "compute.instances.detachDisk", "compute.instances.start", "compute.instances.stop"),
    # Job disks, kept boot disks, a move's restored disks, zonal and regional (regionDisks methods
    # take the compute.disks.* permissions): resource_compute_disk.go / resource_compute_region_disk.go
    # Create disks.insert (from a snapshot: compute.snapshots.useReadOnly, create-start-instance),
    # Read disks.get, Update setLabels and resize, Delete disks.delete after detaching the disk from
    # its users (instances.detachDisk, above); a move's snapshot of a disk needs
    # compute.disks.createSnapshot on the disk (https://cloud.google.com/compute/docs/disks/create-snapshots).
    "disks": ("compute.disks.create", "compute.disks.get", "compute.disks.delete", "compute.disks.use",
              "compute.disks.setLabels", "compute.disks.resize", "compute.disks.createSnapshot"),
    # A move's snapshots: resource_compute_snapshot.go Create (snapshots.create on the snapshot),
    # Read snapshots.get, Update setLabels; restoring reads it (useReadOnly); an expired one is deleted
    # by the watcher itself (cli/cloud/gcp.py GcpInventory.delete_snapshot).
    "snapshots": ("compute.snapshots.create", "compute.snapshots.get", "compute.snapshots.delete",
                  "compute.snapshots.setLabels", "compute.snapshots.useReadOnly"),
    # "To specify a subnet for your VM: compute.subnetworks.use on the project or on the chosen subnet;
    # To assign an external IP address ...: compute.subnetworks.useExternalIp" (create-start-instance).
    # Granted on the stack's subnetwork only (a subnetwork's own IAM policy); useExternalIp only when
    # a job asks for an external IP (:func:`named_permissions`).
    "subnetwork": ("compute.subnetworks.use",),
}
PROJECT_PERMISSIONS: dict[str, tuple[str, ...]] = {
    # Every Compute call returns an operation the provider polls (tpgresource ComputeOperationWaiter:
    # zoneOperations / regionOperations / globalOperations get) and the watcher's SDK waits on
    # (cli/cloud/gcp.py); the preemption poll lists a zone's operations (GcpObserver.vms).
    "operations": ("compute.zoneOperations.get", "compute.zoneOperations.list", "compute.regionOperations.get",
                   "compute.globalOperations.get"),
    # The watcher's own observation (cli/cloud/gcp.py): instances.list per zone, disks.aggregatedList
    # and snapshots.list filtered on the stack's label. A list is checked on the project or zone,
    # which no condition names.
    "lists": ("compute.instances.list", "compute.disks.list", "compute.snapshots.list"),
    # The refresh of a job's other children (a targeted update refreshes every target): its gang
    # firewall rule (resource_compute_firewall.go Read: firewalls.get), its service account and the
    # IAM members it holds (resource_google_service_account.go: serviceAccounts.get;
    # iam_service_account.go, iam_project.go, iam_storage_bucket.go: getIamPolicy of the account,
    # the project and the event bucket). Reads only.
    "refresh": ("compute.firewalls.get", "iam.serviceAccounts.get", "iam.serviceAccounts.getIamPolicy",
                "resourcemanager.projects.getIamPolicy", "storage.buckets.getIamPolicy"),
}
# A multi-node job's reserved internal master address (resource_compute_address.go Read:
# addresses.get); its master VM takes it: "To specify a static IP address for the VM: compute.addresses.use
# on the project" (verified, compute/docs/instances/create-start-instance; no internal/external split).
# useInternal too: whether an INTERNAL address also checks it is [UNVERIFIED] (no page names it for a VM).
MASTER_ADDRESS_PERMISSIONS = ("compute.addresses.get", "compute.addresses.use", "compute.addresses.useInternal")
# A custom image in this project: "To use a custom image to create the VM: compute.images.useReadOnly
# on the image" (create-start-instance). Public images (debian-cloud, deeplearning-platform-release)
# are readable by everyone already.
IMAGE_PERMISSIONS = ("compute.images.useReadOnly",)
# Pool demand, published again every minute by the watcher (cli/pools/record.py), as on AWS (contract
# gcp.watcher-publishes-pool-demand): a
# projects.timeSeries.create needs monitoring.timeSeries.create on the project (Cloud Monitoring's
# methods-to-permissions table, https://cloud.google.com/monitoring/access-control, "Permissions for
# the Cloud Monitoring API"); a metric type cannot be named in a grant, so this is the project's custom
# metrics, the narrowest Monitoring offers. The custom metric's descriptor exists from the first
# `spotctl pool demand` (its auto-creation: "If the associated metric's descriptor must be
# auto-created", TimeSeries.metric_kind, monitoring/api/ref_v3/rest/v3/TimeSeries), so the watcher
# creates none.
POOL_DEMAND_PERMISSIONS = ("monitoring.timeSeries.create",)
# With fallbackToOnDemand a publication also observes (cli/pools/demand.py publish, cli/cloud/gcp.py
# GcpPools.view): the shortage's history (projects.timeSeries.list: monitoring.timeSeries.list, same
# table) and the part's regional MIG (regionInstanceGroupManagers.get: compute.instanceGroupManagers.get,
# https://cloud.google.com/compute/docs/reference/rest/v1/regionInstanceGroupManagers/get); instances
# and zone operations are listed with the permissions above.
POOL_FALLBACK_PERMISSIONS = ("monitoring.timeSeries.list", "compute.instanceGroupManagers.get")


def named_permissions(jobs: list) -> list[str]:
    """The permissions of ``spotctl_<slug>_watcher`` (bound on this stack's names and subnetwork)."""
    extra = ["compute.subnetworks.useExternalIp"] if any(j.external_ip for j in jobs) else []
    return sorted({p for group in NAMED_PERMISSIONS.values() for p in group} | set(extra))


def project_permissions(project: str, jobs: list, pools: list = ()) -> list[str]:
    """The permissions of ``spotctl_<slug>_watcher_project`` (unconditioned: reads, lists, uses, and
    with a scaling pool the demand it publishes again)."""
    out = {p for group in PROJECT_PERMISSIONS.values() for p in group}
    scaling = [p for p in pools if p.spot_max > 0]
    if scaling:
        out |= set(POOL_DEMAND_PERMISSIONS)
    if any(p.fallback_to_on_demand is not None for p in scaling):
        out |= set(POOL_FALLBACK_PERMISSIONS)
    if any(j.nodes > 1 for j in jobs):
        out |= set(MASTER_ADDRESS_PERMISSIONS)
    if any(f"projects/{project}/" in (j.image or "") for j in jobs):
        out |= set(IMAGE_PERMISSIONS)
    return sorted(out)


def role_id(slug: str, suffix: str = "") -> str:
    """A custom role id of the stack: ``spotctl_<slug>_watcher[_suffix]`` ('-' is not allowed in a
    role id, '_' occurs in no slug: contract rule gcp.custom-role-id)."""
    return "_".join(["spotctl", slug.replace("-", "_"), "watcher", *([suffix] if suffix else [])])


def account_id(slug: str) -> str:
    """The watcher's service account id, named as every account of the stack (infra/gcp.py)."""
    return _account_id(slug, "watcher")


def name_locations(project: str, zones: list[str]) -> dict[str, list[str]]:
    """Where this stack's instances, disks and snapshots are named (IAM's format
    ``projects/P/zones/Z/instances/NAME``), per resource type: ``{kind: [location prefix, ...]}``."""
    out: dict[str, list[str]] = {}
    for kind, paths in NAMED_TYPES.items():
        where = sorted({p.format(zone=z, region=z.rsplit("-", 1)[0]) for p in paths for z in zones})
        out[kind] = [f"projects/{project}/{p}" for p in where]
    return out


def extending_slugs(slug: str, siblings: list[str]) -> list[str]:
    """The slugs of the project's other stacks whose names start with ``<slug>-``: stack ``team-b``'s
    ``team-b-x-a1-n0`` starts with stack ``team``'s prefix ``team-``. Slugs and job ids both contain
    '-', so no prefix of a name tells the two stacks apart, and renaming is no way out (a renamed disk
    is a new, empty disk): the condition excludes them by name instead."""
    return sorted({o for o in (stack_slug(s) for s in siblings) if o != slug and o.startswith(f"{slug}-")})


def shorter_slugs(slug: str, siblings: list[str]) -> list[str]:
    """The other way round: the project's stacks whose watcher's grant covered this stack's names
    until their next ``pulumi up`` (they were planned before this stack existed)."""
    return sorted({o for o in (stack_slug(s) for s in siblings) if o != slug and slug.startswith(f"{o}-")})


@dataclass(frozen=True)
class Clause:
    """Resources of ``kind`` named ``<location><slug>-...`` but not ``<location><other>-...``."""

    kind: str
    location: str
    slug: str
    excluded: tuple[str, ...] = ()

    def covers(self, name: str) -> bool:
        return name.startswith(f"{self.location}{self.slug}-") and not any(
            name.startswith(f"{self.location}{o}-") for o in self.excluded)

    @property
    def expression(self) -> str:
        parts = [f'resource.type == "compute.googleapis.com/{self.kind}"',
                 f'resource.name.startsWith("{self.location}{self.slug}-")']
        parts += [f'!resource.name.startsWith("{self.location}{o}-")' for o in self.excluded]
        return "(" + " && ".join(parts) + ")"


def compute_conditions(project: str, zones: list[str], slug: str, excluded: list[str]) -> list[str]:
    """The CEL expressions of the bindings of ``spotctl_<slug>_watcher`` at the project (one binding
    each; the role is granted where any of them holds): this stack's names for the named types, and
    nothing else (the role holds no permission on another type but the subnetwork's, granted on the
    subnetwork itself). Packed so that no expression has more than ``MAX_LOGIC_OPERATORS``."""
    clauses = [Clause(kind, where, slug, tuple(excluded))
               for kind, locations in name_locations(project, zones).items() for where in locations]
    out: list[str] = []
    for part in (c.expression for c in clauses):  # greedy: join with || while the binding stays within the limit
        joined = f"{out[-1]} || {part}" if out else part
        if out and logic_operators(joined) <= MAX_LOGIC_OPERATORS:
            out[-1] = joined
        else:
            out.append(part)
    return out


def job_names(project: str, stack: str, slug: str, jobs: list) -> dict[str, list[tuple[str, str]]]:
    """``{kind: [(job id, full resource name), ...]}`` of what the watcher must reach for each job: its
    disks and move snapshots as declared now, its boot disk, and its VMs' next attempt (a resume)."""
    from infra.common import job_plan

    out: dict[str, list[tuple[str, str]]] = {"Instance": [], "Disk": [], "Snapshot": []}
    for job in jobs:
        plan = job_plan(stack, job)
        for node in plan.nodes:
            vm = instance_name(slug, job.id, job.attempt + 1, node.rank)
            out["Instance"].append((job.id, f"projects/{project}/zones/{job.zone}/instances/{vm}"))
            out["Disk"].append((job.id, f"projects/{project}/zones/{job.zone}/disks/{vm}"))  # a boot disk is named so
            out["Disk"].append((job.id, f"projects/{project}/zones/{job.zone}/disks/{boot_disk_name(slug, job.id, node.rank)}"))
            for d in node.disks:
                where = f"regions/{d.zone.rsplit('-', 1)[0]}" if d.replica_zones else f"zones/{d.zone}"
                out["Disk"].append((job.id, f"projects/{project}/{where}/disks/{d.name}"))
            out["Snapshot"] += [(job.id, f"projects/{project}/global/snapshots/{s.name}") for s in node.snapshots]
    return out


def check_condition_covers_names(project: str, zones: list[str], slug: str, excluded: list[str], names: dict,
                                 resource: str) -> None:
    """Every name a job of this stack gets must be reached by the condition (else a resume is refused
    with PERMISSION_DENIED): in a zone of the stack, with this stack's prefix, and not taken for a
    stack excluded by name (this stack's job ``b-x`` is named like stack ``team-b``'s job ``x``)."""
    clauses = [Clause(kind, where, slug, tuple(excluded))
               for kind, locations in name_locations(project, zones).items() for where in locations]
    missing = [f"{name} (job {job})" for kind, found in names.items() for job, name in found
               if not any(c.kind == kind and c.covers(name) for c in clauses)]
    clash = [o for o in excluded if any(f"/{o}-" in n for _, found in names.items() for _, n in found)]
    problem = None
    if missing:
        problem = f"no condition reaches {', '.join(missing[:3])}"
        if clash:
            problem += f": the names are also stack {'/'.join(clash)}'s (slug {clash[0]}); rename the job"
    contract.enforce("gcp.watcher-condition-covers-names", resource, problem)


class Watcher(pulumi.ComponentResource):
    """An on-demand e2-small (by default) Shielded VM without an external IP (unless asked) on the
    stack's subnetwork, behind the stack's NAT, and its service account with the bindings above."""

    def __init__(self, name: str, args: StackArgs, base: Any, opts: pulumi.ResourceOptions | None = None):
        super().__init__("spotctl:gcp:Watcher", name, None, opts)
        cfg = args.cfg
        w = cfg.watcher
        assert w is not None and cfg.project
        project = cfg.project
        child = pulumi.ResourceOptions(parent=self)
        labels = gcp_labels(args.stack, cfg.labels, role="watcher")
        self.account = gcp.serviceaccount.Account(
            f"{name}-account", account_id=account_id(args.slug), display_name=iam_display(f"spotctl watcher of {args.stack}"),
            project=project, opts=child,
        )
        self.member = self.account.email.apply(lambda e: f"serviceAccount:{e}")
        bindings: list[pulumi.Resource] = [
            gcp.pubsub.SubscriptionIAMMember(f"{name}-subscriber", subscription=base.subscription.name, project=project,
                                             role="roles/pubsub.subscriber", member=self.member, opts=child),
            gcp.storage.BucketIAMMember(f"{name}-events-reader", bucket=base.bucket.name, role="roles/storage.objectViewer",
                                        member=self.member, opts=child),
            # The stack file's shared copy (cli/lifecycle/sync.py) and the watch lease (cli/watch/lease.py), only:
            # replacing an object needs storage.objects.create and .delete (cloud.google.com/storage/docs/
            # access-control/iam-permissions); the condition names each object (resource.name).
            gcp.storage.BucketIAMMember(
                f"{name}-stack-file", bucket=base.bucket.name, role="roles/storage.objectAdmin", member=self.member,
                condition=gcp.storage.BucketIAMMemberConditionArgs(
                    title="spotctl-shared-stack-file", description=f"the shared stack file and watch lease of {args.stack} only",
                    expression=base.bucket.name.apply(lambda b: " || ".join(
                        f'resource.name == "projects/_/buckets/{b}/objects/{k}"' for k in (shared_stack_file(args.stack), watch_lease(args.stack)))),
                ),
                opts=child),
        ]
        bindings += self._state(name, w, child)
        bindings += self._secrets(name, w, project, child)
        bindings += self._compute(name, args, project, child)
        machine = w.machine("gcp")
        context = WatcherContext(
            cloud="gcp", stack=args.stack, region=cfg.region, project=project, repo=w.repo, ref=w.ref, backend=w.backend,
            secrets_provider=w.secrets_provider, passphrase_secret=w.passphrase_secret or "",
            pulumi_version=w.pulumi_version, uv_version=w.uv_version,
        )
        script = watcher_script(context)
        self.instance = gcp.compute.Instance(
            f"{name}-vm",
            name=f"{args.slug}-watcher",
            project=project,
            zone=cfg.watcher_zone,
            machine_type=machine,
            # Persistent disks are encrypted at rest by default (Google-managed keys):
            # https://cloud.google.com/compute/docs/disks/disk-encryption
            boot_disk=gcp.compute.InstanceBootDiskArgs(
                auto_delete=True,
                initialize_params=gcp.compute.InstanceBootDiskInitializeParamsArgs(
                    image=DEBIAN_IMAGE, size=w.disk_gb, type="pd-balanced", labels=labels),
            ),
            network_interfaces=[_network(args, machine, external_ip=w.external_ip)],
            service_account=gcp.compute.InstanceServiceAccountArgs(email=self.account.email, scopes=SCOPES),
            shielded_instance_config=gcp.compute.InstanceShieldedInstanceConfigArgs(
                enable_secure_boot=True, enable_vtpm=True, enable_integrity_monitoring=True),
            scheduling=gcp.compute.InstanceSchedulingArgs(
                provisioning_model="STANDARD", preemptible=False, automatic_restart=True, on_host_maintenance="MIGRATE"),
            # metadata_startup_script, not metadata["startup-script"]: a changed script (ref, backend,
            # versions) replaces the VM (customdiff.ForceNewIf("metadata_startup_script"),
            # terraform-provider-google resource_compute_instance.go; moving an unchanged script over from
            # metadata["startup-script"] is a graceful switch, no replacement). Edited metadata would only
            # reach the VM at its next boot, and the checkout it made at its first boot would stay.
            # Stateless, as on AWS (infra/aws_watcher.py): the new VM takes the shared stack file.
            metadata_startup_script=script,
            metadata={"enable-oslogin": "TRUE", "block-project-ssh-keys": "TRUE"},
            labels=labels,
            # A new machine type is applied in place (stop, change, start).
            allow_stopping_for_update=True,
            deletion_protection=False,
            # Its name is fixed: the old VM goes first (its watcher releases the stack's lease in the
            # event bucket when stopped, cli/watch/lease.py).
            opts=pulumi.ResourceOptions(parent=self, delete_before_replace=True, depends_on=[*base.egress, *bindings]),
        )
        self.register_outputs({"instance": self.instance.name, "email": self.account.email})

    def _compute(self, name: str, args: StackArgs, project: str, child) -> list[pulumi.Resource]:
        """The stack's two custom roles and their bindings (module docstring): the named role on this
        stack's names (conditions) and on its subnetwork, the project role unconditioned."""
        cfg, jobs = args.cfg, list(args.cfg.jobs)
        excluded = extending_slugs(args.slug, list(args.siblings))
        check_condition_covers_names(project, list(cfg.zones), args.slug, excluded,
                                     job_names(project, args.stack, args.slug, jobs), f"{name}-compute")
        expressions = compute_conditions(project, list(cfg.zones), args.slug, excluded)
        contract.enforce("gcp.conditional-bindings-20", f"{name}-compute",
                         f"{len(expressions)} conditional bindings of one role and member" if len(expressions) > MAX_CONDITIONAL_BINDINGS else None)
        self.named_role = gcp.projects.IAMCustomRole(
            f"{name}-role", project=project, role_id=role_id(args.slug), title=iam_display(f"spotctl watcher of {args.stack}"),
            description=f"A targeted update of stack {args.stack}'s jobs: its instances, disks and snapshots (bound on "
                        "their names) and its subnetwork's use",
            permissions=named_permissions(jobs), opts=child)
        self.project_role = gcp.projects.IAMCustomRole(
            f"{name}-project-role", project=project, role_id=role_id(args.slug, "project"),
            title=iam_display(f"spotctl watcher of {args.stack}: reads"),
            description=f"What stack {args.stack}'s watcher reads, lists and uses where IAM conditions see no name, and its pools' demand",
            permissions=project_permissions(project, jobs, list(cfg.pools)), opts=child)
        out: list[pulumi.Resource] = [self.named_role, self.project_role]
        for i, expression in enumerate(expressions):
            out.append(gcp.projects.IAMMember(
                f"{name}-compute-{i}", project=project, role=self.named_role.name, member=self.member,
                condition=gcp.projects.IAMMemberConditionArgs(
                    title=f"spotctl-stack-resources-{i}", description=f"compute resources of stack {args.stack} only",
                    expression=expression,
                ),
                opts=child,
            ))
        region, subnetwork = subnetwork_path(cfg).split("/regions/", 1)[1].split("/subnetworks/")
        out.append(gcp.compute.SubnetworkIAMMember(
            f"{name}-subnetwork", project=project, region=region, subnetwork=subnetwork, role=self.named_role.name,
            member=self.member, opts=child))
        out.append(gcp.projects.IAMMember(
            f"{name}-project", project=project, role=self.project_role.name, member=self.member, opts=child))
        return out

    def _state(self, name: str, w, child) -> list[pulumi.Resource]:
        """Read and write the backend's prefix (a condition on object names; the bucket needs uniform
        bucket-level access, as for the event bucket), and list the bucket's object names (Pulumi lists
        its lock and history objects; listing is granted on the bucket, not on names)."""
        _, bucket, prefix = w.backend_parts()
        condition = None
        if prefix:
            condition = gcp.storage.BucketIAMMemberConditionArgs(
                title="spotctl-pulumi-state", description=f"Pulumi state under {prefix} only",
                expression=f'resource.name.startsWith("projects/_/buckets/{bucket}/objects/{prefix}")',
            )
        return [
            gcp.storage.BucketIAMMember(f"{name}-state", bucket=bucket, role="roles/storage.objectAdmin",
                                        member=self.member, condition=condition, opts=child),
            gcp.storage.BucketIAMMember(f"{name}-state-list", bucket=bucket, role="roles/storage.legacyBucketReader",
                                        member=self.member, opts=child),
        ]

    def _secrets(self, name: str, w, project: str, child) -> list[pulumi.Resource]:
        if w.secrets_provider == "passphrase":
            return [gcp.secretmanager.SecretIamMember(
                f"{name}-passphrase", project=project, secret_id=f"projects/{project}/secrets/{w.passphrase_secret}",
                role="roles/secretmanager.secretAccessor", member=self.member, opts=child)]
        return [gcp.kms.CryptoKeyIAMMember(
            f"{name}-secrets-key", crypto_key_id=w.secrets_provider.removeprefix("gcpkms://"),
            role="roles/cloudkms.cryptoKeyEncrypterDecrypter", member=self.member, opts=child)]
