"""GCP rules on what a stack's own values decide (see ``infra.contract``): the machine types GCE runs only
as Spot VMs, the series that take only Hyperdisk, and the names GCS and Pub/Sub reserve. ``infra.limits``
reads them back onto the stack keys; importing ``infra.contract.gcp`` registers them."""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from infra.contract.gcp_machines import BUCKET, VMS, _machine, family
from infra.contract.rulebook import dig, known, rule

# https://cloud.google.com/compute/docs/gpus, "A3 High" (page of 2026-04-14): "When provisioning a3-highgpu-1g,
# a3-highgpu-2g, or a3-highgpu-4g machine types, you must create instances by using Spot VMs or Flex-start VMs."
SPOT_ONLY = ("a3-highgpu-1g", "a3-highgpu-2g", "a3-highgpu-4g")


def spot_only(machine_type: str) -> bool:
    return machine_type in SPOT_ONLY


@rule("gcp.a3-high-spot-only", VMS,
      says="a3-highgpu-1g, -2g and -4g VMs must be Spot (or Flex-start) VMs: GCE creates no on-demand (STANDARD) ones.",
      fix="capacity: spot for jobs on them (`spotctl failover --to on-demand` cannot apply); a3-highgpu-8g runs on-demand",
      source="https://cloud.google.com/compute/docs/gpus (A3 High: \"When provisioning a3-highgpu-1g, a3-highgpu-2g, or "
             "a3-highgpu-4g machine types, you must create instances by using Spot VMs or Flex-start VMs\")")
def a3_high_spot_only(type_: str, props: Mapping[str, Any]) -> str | None:
    machine, model = _machine(props), dig(props, "scheduling.provisioning_model")
    if not known(machine, model) or not isinstance(machine, str) or not spot_only(machine):
        return None
    return None if model in ("SPOT", "FLEX_START") else f"{machine} with provisioning_model {model or 'STANDARD'!r}"


# Series whose VMs take only Hyperdisk. spotctl declares pd-balanced disks (infra/gcp.py DISK_TYPE), so
# `validate` refuses them rather than declaring disks GCE would refuse at `pulumi up`.
HYPERDISK_ONLY = ("a4", "a4x", "g4")
HYPERDISK_SOURCE = (
    "https://cloud.google.com/compute/docs/disks/persistent-disks (\"Persistent Disk isn't available with the latest "
    "machine series\", as transcribed 2026-08-20 in public provider code) and "
    "https://cloud.google.com/compute/docs/disks/hd-types/hyperdisk-balanced (machine series support) [UNVERIFIED: the "
    "per-series lists naming A4, A4X and G4 were not read from the primary pages]"
)


def hyperdisk_only(machine_type: str) -> str | None:
    """Why spotctl cannot run ``machine_type`` (a series that takes only Hyperdisk), or None."""
    fam = family(machine_type)
    if fam not in HYPERDISK_ONLY:
        return None
    return (f"{machine_type}: {fam.upper()} VMs take only Hyperdisk volumes and spotctl declares pd-balanced boot and job "
            f"disks (rule gcp.hyperdisk-only-series), so GCE would refuse them at `pulumi up`: use an A3 or A2 machine type")


@rule("gcp.hyperdisk-only-series", VMS,
      says="A4, A4X and G4 VMs attach only Hyperdisk volumes (no pd-balanced, pd-ssd or pd-standard disks).",
      fix="use another machine series (spotctl declares pd-balanced disks; `spotctl validate` refuses these types)",
      source=HYPERDISK_SOURCE)
def hyperdisk_series(type_: str, props: Mapping[str, Any]) -> str | None:
    machine = _machine(props)
    if not known(machine) or not isinstance(machine, str) or family(machine) not in HYPERDISK_ONLY:
        return None
    kinds = [dig(props, "boot_disk.initialize_params.type")]
    kinds += [d.get("disk_type") for d in props.get("disks") or [] if isinstance(d, Mapping)]
    bad = [k for k in kinds if isinstance(k, str) and k.rsplit("/", 1)[-1].startswith("pd-")]
    return f"{machine} with {bad[0]} disks" if bad else None


TOPIC = "gcp:pubsub/topic:Topic"
NAMES_SOURCE = (
    "https://cloud.google.com/storage/docs/buckets#naming (\"Bucket names cannot begin with the goog prefix\" and "
    "\"cannot contain google or close misspellings\"); Pub/Sub Topic.name (google/pubsub/v1/pubsub.proto, "
    "googleapis/python-pubsub types): \"{topic} ... must not start with \\\"goog\\\"\""
)


def reserved_name(name: str, kind: str) -> str | None:
    """What GCS (kind 'bucket') or Pub/Sub (kind 'topic') refuses in ``name``, or None."""
    low = name.lower()
    if low.startswith("goog"):
        return f"{kind} name {name!r} begins with 'goog'"
    if kind == "bucket" and re.search(r"g[o0]{2}g[l1]e", low):
        return f"bucket name {name!r} contains 'google'"
    return None


def reserved_name_problem(stack: str) -> str | None:
    """Why the stack's event bucket or preemption topic (infra/gcp.py, named from the stack's slug) is refused."""
    from infra.naming import stack_slug

    slug = stack_slug(stack)
    why = reserved_name(f"{slug}-events-x", "bucket") or reserved_name(f"{slug}-preemptions", "topic")
    if why is None:
        return None
    return (f"its event bucket and preemption topic are named from it ({slug}-events-..., {slug}-preemptions) and "
            f"{why.split(' name ')[0]} names may not begin with 'goog' or contain 'google' (rule gcp.reserved-names): "
            "give the stack another name (a stack file Pulumi.<name>.yaml under that name)")


@rule("gcp.reserved-names", (BUCKET, TOPIC),
      says="A GCS bucket name may not begin with 'goog' or contain 'google'; a Pub/Sub topic name may not begin with 'goog'.",
      fix="name the stack without a goog prefix or 'google' (names are built from the stack's slug)",
      source=NAMES_SOURCE)
def reserved_names(type_: str, props: Mapping[str, Any]) -> str | None:
    name = props.get("name")
    if not isinstance(name, str):
        return None
    return reserved_name(name, "bucket" if type_ == BUCKET else "topic")
