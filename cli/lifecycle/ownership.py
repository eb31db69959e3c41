"""Whose a disk is: the ownership half of the one deletion rule (``states.may_delete_disks``), read
from the labels/tags the cloud holds, never from the stack file alone."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from cli.cloud import CloudDisk
from cli.lifecycle.apply import Held
from infra.config import StackConfig
from infra.naming import label_value, owner_value


def owned_by(disk: CloudDisk, cfg: StackConfig, stack: str) -> bool:
    """The disk carries this exact stack's ownership labels (owner value and managed)."""
    owner, _, managed = disk.owner(cfg.cloud)
    return managed and owner == owner_value(stack)


def physical_name(inputs: Mapping[str, Any], cloud: str) -> str:
    """A disk's name in the cloud as the program declares it (GCP ``name``, AWS the ``Name`` tag)."""
    return str(inputs.get("name") or "") if cloud == "gcp" else str((inputs.get("tags") or {}).get("Name", ""))


def _cloud_name(disk: CloudDisk, cloud: str) -> str:
    return disk.labels.get("Name", "") if cloud == "aws" else disk.id


def disks_owned(disks: Iterable[CloudDisk], cfg: StackConfig, stack: str, job_id: str,
                names: Mapping[str, str], held: Held) -> tuple[bool, str]:
    """The ownership half of the one deletion rule, on the real disks: every disk about to be
    deleted (``names``: URN -> its name in the cloud) exists in the cloud carrying this exact
    stack's ownership labels and the job's label, or is in neither the cloud nor Pulumi's state
    (an update that failed midway deleted it already). (False, why) naming the first that is not.
    ``cleanup`` and a move's release both decide through it."""
    by_name = {_cloud_name(d, cfg.cloud): d for d in disks}
    for urn, name in sorted(names.items()):
        disk = by_name.get(name)
        if disk is None:
            if urn in held.resources:
                return False, (f"its disk {name} is not among the disks labelled for stack {stack} in the cloud "
                               "(relabelled, or deleted by hand: then `pulumi refresh`), yet Pulumi's state holds it")
            continue
        _, labelled_job, _ = disk.owner(cfg.cloud)
        if not owned_by(disk, cfg, stack) or labelled_job != label_value(job_id):
            return False, f"its disk {disk.id} does not carry this stack's ownership labels"
    return True, "every disk carries this stack's ownership labels"


def is_data_disk(disk: CloudDisk, cloud: str) -> bool:
    """A job's data disk/volume (job and node labels, no pool label), not a pool's or a VM's boot disk."""
    sep = ":" if cloud == "aws" else "-"
    labels = disk.labels
    return f"spotctl{sep}job" in labels and f"spotctl{sep}node" in labels and f"spotctl{sep}pool" not in labels
