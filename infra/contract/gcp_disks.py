"""GCP rules on disks: a move's snapshots and restored disks wait long enough, and a job's regional
persistent disks (``diskReplicaZones``) are ones GCE accepts."""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from infra.contract.gcp_machines import DISK, REGION_DISK, SNAPSHOT, family
from infra.contract.rulebook import known, move_timeout_problem, rule

# ---- a move's snapshots and restored disks wait long enough ------------------------------------------------

TPG = "hashicorp/terraform-provider-google"


@rule("gcp.move-create-timeout", (SNAPSHOT, DISK, REGION_DISK),
      says="A move's snapshot, and a disk restored from one, must be given hours to be created: the provider waits "
           "20 minutes by default, then clears the resource's id while the operation keeps running in Compute Engine, "
           "so the next apply POSTs the same name again and fails with \"already exists\".",
      fix="declare it with pulumi.ResourceOptions(custom_timeouts=pulumi.CustomTimeouts(create=infra.common.MOVE_CREATE_TIMEOUT))",
      source=f"{TPG} google/services/compute/resource_compute_snapshot.go @0937ec5b (Timeouts Create: "
             "schema.DefaultTimeout(20 * time.Minute); on a failed ComputeOperationWaitTime: d.SetId(\"\") \"The resource "
             f"didn't actually create\"); {TPG} google/services/compute/resource_compute_disk.go @07fc8657 (Create 20 min); "
             "Pulumi customTimeouts: https://www.pulumi.com/docs/iac/concepts/options/customtimeouts/")
def _move_create_timeout(type_: str, props: Mapping[str, Any]) -> str | None:
    if type_ == SNAPSHOT:
        return move_timeout_problem(props, "a move's snapshot")
    if props.get("snapshot") is None:  # not restored from a declared snapshot: not a move's disk
        return None
    return move_timeout_problem(props, "a disk restored from a move's snapshot")


# ---- regional persistent disks (a job's `diskReplicaZones`) ------------------------------------------------

REGIONAL_SOURCE = ("https://cloud.google.com/compute/docs/disks/about-regional-persistent-disk (\"synchronously replicate "
                   "data between two zones in the same region\"; \"Primary zone is the same zone where the compute instance "
                   "that you attach the disk to is located. Secondary zone is an alternate zone of your choice within the "
                   "same region.\")")
# Regional Persistent Disk types: GKE's regional-pd guide names pd-standard (at least 200 GiB) and
# "pd-balanced or pd-ssd instead" for smaller volumes. Compute Engine's Persistent Disk page
# (docs.cloud.google.com/compute/docs/disks/persistent-disks, last updated 2026-04-09) lists durability
# for "Regional standard / balanced / SSD Persistent Disk" next to "Zonal extreme Persistent Disk",
# and no regional extreme. pd-extreme is left out; that no regional pd-extreme exists is still
# [UNVERIFIED]: no sentence says so, and third-party billing tables name a "Regional Extreme PD
# Capacity" SKU (Hyperdisk's replicated type is the separate hyperdisk-balanced-high-availability,
# which spotctl does not declare).
REGIONAL_DISK_TYPES = ("pd-balanced", "pd-ssd", "pd-standard")
REGIONAL_TYPES_SOURCE = ("https://cloud.google.com/kubernetes-engine/docs/how-to/persistent-volumes/regional-pd (\"To "
                         "utilize regional persistent disks of the pd-standard type, set ... a minimum of 200 GiB. If your "
                         "use case requires a smaller volume, consider using pd-balanced or pd-ssd instead.\")")


@rule("gcp.regional-disk-replica-zones", (REGION_DISK,),
      says="A regional persistent disk is replicated in exactly two different zones of its own region.",
      fix="diskReplicaZones: two different zones of spotctl:zones",
      source=REGIONAL_SOURCE + "; pulumi-gcp compute.RegionDisk replica_zones (\"URLs of the zones where the disk "
             "should be replicated to\")")
def _regional_replica_zones(type_: str, props: Mapping[str, Any]) -> str | None:
    zones, region = props.get("replica_zones"), props.get("region")
    if not known(zones) or not known(region) or zones is None:
        return None if zones is not None else "replica_zones is missing"
    names = [str(z).rsplit("/", 1)[-1] for z in zones]
    if len(names) != 2 or len(set(names)) != 2:
        return f"replica_zones {names}: needs exactly two different zones"
    outside = [z for z in names if not re.fullmatch(re.escape(str(region)) + r"-[a-z]", z)]
    return f"replica_zones {outside} are not in region {region}" if outside else None


@rule("gcp.regional-disk-type", (REGION_DISK,),
      says=f"Regional Persistent Disk comes in {', '.join(REGIONAL_DISK_TYPES)}.",
      fix="declare the regional disk as pd-balanced (spotctl's job disk type)",
      source=REGIONAL_TYPES_SOURCE)
def _regional_type(type_: str, props: Mapping[str, Any]) -> str | None:
    kind = props.get("type")
    if not known(kind) or kind is None:
        return None
    name = str(kind).rsplit("/", 1)[-1]
    return None if name in REGIONAL_DISK_TYPES else f"type {name!r} has no regional persistent disk"


@rule("gcp.regional-pd-standard-size", (REGION_DISK,),
      says="A regional pd-standard disk is at least 200 GiB.",
      fix="diskGb >= 200, or a pd-balanced / pd-ssd regional disk",
      source=REGIONAL_TYPES_SOURCE + "; https://docs.cloud.google.com/compute/docs/disks/about-regional-persistent-disk "
             "(\"The minimum size of a regional standard Persistent Disk is 200 GiB.\")")
def _regional_standard_size(type_: str, props: Mapping[str, Any]) -> str | None:
    kind, size = props.get("type"), props.get("size")
    if not known(kind) or not known(size) or kind is None or size is None:
        return None
    return f"a regional pd-standard disk of {size} GiB" if str(kind).endswith("pd-standard") and int(size) < 200 else None


@rule("gcp.regional-disk-not-from-image", (REGION_DISK,),
      says="A regional Persistent Disk is never created from an OS image (nor from a disk created from one).",
      fix="declare the job's regional disk blank or from a snapshot of a blank job disk (infra/gcp.py _job_disks)",
      source="https://docs.cloud.google.com/compute/docs/disks/about-regional-persistent-disk (\"You can't create a "
             "regional Persistent Disk from an OS image, or from a disk that was created from an OS image.\")")
def _regional_not_from_image(type_: str, props: Mapping[str, Any]) -> str | None:
    image = props.get("image")
    return None if not known(image) or not image else f"image {image!r}"


# Which machine series take a Regional Persistent Disk (spotctl declares pd-balanced): Compute
# Engine's own limitation, verified (REGIONAL_PD_SOURCE). A2, G2, T2D, A3, A4, G4, C3 ... are not
# listed and are refused (they take Hyperdisk Balanced High Availability, which spotctl does not
# declare).
REGIONAL_PD_SERIES = ("e2", "n1", "n2", "n2d")
REGIONAL_PD_SOURCE = ("https://docs.cloud.google.com/compute/docs/disks/about-regional-persistent-disk, \"General limitations "
                      "for regional disks\" (last updated 2026-04-10): \"You can attach regional Persistent Disk only to VMs that "
                      "use E2, N1, N2, and N2D machine types.\"; the same sentence under \"Limitations for Regional Persistent "
                      "Disk\" in https://docs.cloud.google.com/compute/docs/disks/persistent-disks (last updated 2026-04-09)")


def regional_disk_problem(machine_type: str) -> str | None:
    """Why a job on ``machine_type`` cannot have a Regional Persistent Disk (pd-balanced), or None."""
    series = family(machine_type)
    if series in REGIONAL_PD_SERIES:
        return None
    return (f"machineType {machine_type}: Compute Engine attaches a Regional Persistent Disk only to "
            f"{', '.join(s.upper() for s in REGIONAL_PD_SERIES)} VMs, and {series.upper() or machine_type} is not one of them "
            "(newer series take Hyperdisk Balanced High Availability, which spotctl does not declare); "
            "without diskReplicaZones the job moves between zones by snapshot (`spotctl move`)")


rule("gcp.regional-disk-machine-series", (),
     says="A Regional Persistent Disk attaches only to E2, N1, N2 and N2D VMs (GPUs: N1 with attached T4/V100/P100/P4); "
          "A2, G2, A3, A4, G4, T2D, C3 ... are refused.",
     fix="drop diskReplicaZones (and --replica-zones) for this machine type: the job moves by snapshot",
     source=REGIONAL_PD_SOURCE)(None)

rule("gcp.regional-disk-attach-in-replica-zone", (),
     says="A regional disk attaches to a VM in one of its two replica zones (the VM's zone is the disk's primary zone).",
     fix="keep the job's zone one of its diskReplicaZones (spotctl move JOB --to-zone <the other replica zone>)",
     source=REGIONAL_SOURCE)(None)

rule("gcp.force-attach-regional-only", (),
     says="forceAttach attaches a regional disk still held by another VM (a zone failure); a zonal disk refuses it.",
     fix="forceAttach only on a regional disk's failover attempt",
     source="https://cloud.google.com/compute/docs/disks/repd-failover (\"you can fail over your regional persistent disk "
            "to a VM instance in another zone by using the --force-attach flag\"); pulumi-gcp compute.Instance "
            "attached_disk.force_attach (\"If you try to force attach a zonal disk to an instance, you will receive an "
            "error.\")")(None)
