"""The GCP watcher (``spotctl:watcher``): a small on-demand VM that runs ``spotctl watch`` for the
stack, and the least-privilege service account it runs as (README "Watching a stack", way 4).

The account may pull the preemption subscription, read the event bucket, read and write the Pulumi
backend's prefix, read the stack's passphrase (or use its KMS key), and do what a targeted
``pulumi up --refresh`` of this stack's jobs does: ``roles/compute.instanceAdmin.v1`` limited by an
IAM condition to this stack's instance, disk and snapshot names (IAM conditions see resource names,
not labels: https://cloud.google.com/iam/docs/conditions-resource-attributes), and acting as each
job's own service account (a binding on that account, declared by the job: infra/gcp.py).
"""

from __future__ import annotations

from typing import Any

import pulumi
import pulumi_gcp as gcp

from infra import contract
from infra.common import StackArgs
from infra.naming import disk_name, gcp_labels, instance_name, short_hash, snapshot_name
from infra.render import WatcherContext, watcher_script

DEBIAN_IMAGE = "projects/debian-cloud/global/images/family/debian-12"  # Shielded VM capable (UEFI)
# Compute resource types whose names the condition limits to this stack's; the others the role
# covers that a targeted job update never needs (groups, templates) are left out altogether.
# A regional disk (diskReplicaZones) is a Disk named regions/R/disks/NAME, as its selfLink reads
# (https://cloud.google.com/compute/docs/reference/rest/v1/regionDisks): both paths are listed.
NAMED_TYPES = {"Instance": ("zones/{zone}/instances/",), "Disk": ("zones/{zone}/disks/", "regions/{region}/disks/"),
               "Snapshot": ("global/snapshots/",)}
EXCLUDED_TYPES = ("InstanceTemplate", "InstanceGroup", "InstanceGroupManager", "RegionInstanceGroupManager", "Image",
                  "Firewall", "Network", "Subnetwork", "Route", "Router")


def account_id(slug: str) -> str:
    """The watcher's service account id (6-30 characters: contract rule gcp.service-account-id)."""
    candidate = f"{slug}-watcher"
    return candidate if len(candidate) <= 30 else f"{candidate[:23].rstrip('-')}-{short_hash(candidate)}"


def name_prefixes(project: str, zones: list[str], slug: str) -> dict[str, list[str]]:
    """Resource-name prefixes (IAM's format ``projects/P/zones/Z/instances/NAME``) of this stack's
    instances, disks and snapshots, per resource type."""
    out: dict[str, list[str]] = {}
    for kind, paths in NAMED_TYPES.items():
        where = sorted({p.format(zone=z, region=z.rsplit("-", 1)[0]) for p in paths for z in zones})
        out[kind] = [f"projects/{project}/{p}{slug}-" for p in where]
    return out


def compute_condition(project: str, zones: list[str], slug: str, subnetwork: str) -> str:
    """The CEL expression on the watcher's compute role: this stack's names for named types, this
    stack's subnetwork, nothing of the excluded types, anything else the role covers (machine types,
    zone operations, addresses)."""
    clauses = []
    for kind, prefixes in name_prefixes(project, zones, slug).items():
        names = " || ".join(f'resource.name.startsWith("{p}")' for p in prefixes)
        clauses.append(f'(resource.type == "compute.googleapis.com/{kind}" && ({names}))')
    clauses.append(f'(resource.type == "compute.googleapis.com/Subnetwork" && resource.name == "{subnetwork}")')
    others = " && ".join(f'resource.type != "compute.googleapis.com/{t}"' for t in (*NAMED_TYPES, *EXCLUDED_TYPES))
    clauses.append(f"({others})")
    return " || ".join(clauses)


def check_condition_covers_names(project: str, zones: list[str], slug: str, resource: str) -> None:
    """The condition's prefixes must cover the names infra/naming.py gives a job's VMs, disks and
    move snapshots in every zone of the stack (else a resume is refused with PERMISSION_DENIED)."""
    prefixes = name_prefixes(project, zones, slug)
    samples = {
        "Instance": [f"projects/{project}/zones/{z}/instances/{instance_name(slug, 'job', 2, 0)}" for z in zones],
        "Disk": [f"projects/{project}/{where}/disks/{disk_name(slug, 'job', 0, g)}"
                 for z in zones for where in (f"zones/{z}", f"regions/{z.rsplit('-', 1)[0]}") for g in (0, 1)],
        "Snapshot": [f"projects/{project}/global/snapshots/{snapshot_name(slug, 'job', 0, 1)}"],
    }
    missing = [s for kind, names in samples.items() for s in names if not any(s.startswith(p) for p in prefixes[kind])]
    contract.enforce("gcp.watcher-condition-covers-names", resource,
                     f"no condition prefix matches {', '.join(missing)}" if missing else None)


class Watcher(pulumi.ComponentResource):
    """An on-demand e2-small (by default) Shielded VM without an external IP (unless asked) on the
    stack's subnetwork, behind the stack's NAT, and its service account with the bindings above."""

    def __init__(self, name: str, args: StackArgs, base: Any, opts: pulumi.ResourceOptions | None = None):
        super().__init__("spotctl:gcp:Watcher", name, None, opts)
        from infra.gcp import SCOPES, _network, subnetwork_path

        cfg = args.cfg
        w = cfg.watcher
        assert w is not None and cfg.project
        project = cfg.project
        child = pulumi.ResourceOptions(parent=self)
        labels = gcp_labels(args.stack, cfg.labels, role="watcher")
        self.account = gcp.serviceaccount.Account(
            f"{name}-account", account_id=account_id(args.slug), display_name=f"spotctl watcher of {args.stack}",
            project=project, opts=child,
        )
        self.member = self.account.email.apply(lambda e: f"serviceAccount:{e}")
        bindings: list[pulumi.Resource] = [
            gcp.pubsub.SubscriptionIAMMember(f"{name}-subscriber", subscription=base.subscription.name, project=project,
                                             role="roles/pubsub.subscriber", member=self.member, opts=child),
            gcp.storage.BucketIAMMember(f"{name}-events-reader", bucket=base.bucket.name, role="roles/storage.objectViewer",
                                        member=self.member, opts=child),
        ]
        bindings += self._state(name, w, child)
        bindings += self._secrets(name, w, project, child)
        subnetwork = subnetwork_path(cfg)
        check_condition_covers_names(project, list(cfg.zones), args.slug, f"{name}-compute")
        bindings.append(gcp.projects.IAMMember(
            f"{name}-compute", project=project, role="roles/compute.instanceAdmin.v1", member=self.member,
            condition=gcp.projects.IAMMemberConditionArgs(
                title="spotctl-stack-resources", description=f"compute resources of stack {args.stack} only",
                expression=compute_condition(project, list(cfg.zones), args.slug, subnetwork),
            ),
            opts=child,
        ))
        machine = w.machine("gcp")
        script = watcher_script(WatcherContext(
            cloud="gcp", stack=args.stack, region=cfg.region, project=project, repo=w.repo, ref=w.ref, backend=w.backend,
            secrets_provider=w.secrets_provider, passphrase_secret=w.passphrase_secret or "",
            pulumi_version=w.pulumi_version, uv_version=w.uv_version,
        ))
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
            metadata={"startup-script": script, "enable-oslogin": "TRUE", "block-project-ssh-keys": "TRUE"},
            labels=labels,
            # A new script or machine type is applied in place: the checkout on the boot disk, with the
            # watcher's edits of the stack file, stays.
            allow_stopping_for_update=True,
            deletion_protection=False,
            opts=pulumi.ResourceOptions(parent=self, depends_on=[*base.egress, *bindings]),
        )
        self.register_outputs({"instance": self.instance.name, "email": self.account.email})

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
