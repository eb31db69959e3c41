"""GCP resource type tokens and the one table of GPU machine shapes (:data:`ACCELERATOR_OPTIMIZED`,
:data:`N1_GPUS`): ``spotctl validate`` (``infra.config``) and the ``gcp.gpu-machine-pair`` rule both ask
:func:`gpu_problem`. Pure Python (no pulumi import)."""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from infra.contract.rulebook import UNKNOWN, known

INSTANCE = "gcp:compute/instance:Instance"
INSTANCE_TEMPLATE = "gcp:compute/instanceTemplate:InstanceTemplate"
REGION_INSTANCE_TEMPLATE = "gcp:compute/regionInstanceTemplate:RegionInstanceTemplate"
VMS = (INSTANCE, INSTANCE_TEMPLATE, REGION_INSTANCE_TEMPLATE)
TEMPLATES = (INSTANCE_TEMPLATE, REGION_INSTANCE_TEMPLATE)
ADDRESS = "gcp:compute/address:Address"
REGION_DISK = "gcp:compute/regionDisk:RegionDisk"
DISK = "gcp:compute/disk:Disk"
SNAPSHOT = "gcp:compute/snapshot:Snapshot"
ACCOUNT = "gcp:serviceaccount/account:Account"
BUCKET = "gcp:storage/bucket:Bucket"
CUSTOM_ROLE = "gcp:projects/iAMCustomRole:IAMCustomRole"
BUCKET_IAM_MEMBER = "gcp:storage/bucketIAMMember:BucketIAMMember"
PROJECT_IAM_MEMBER = "gcp:projects/iAMMember:IAMMember"
PROJECT_SINK = "gcp:logging/projectSink:ProjectSink"
ROUTER_NAT = "gcp:compute/routerNat:RouterNat"
FIREWALL = "gcp:compute/firewall:Firewall"
REGION_MIG = "gcp:compute/regionInstanceGroupManager:RegionInstanceGroupManager"

METADATA_VALUE_LIMIT = 256 * 1024

# ---- the GPU machine table -------------------------------------------------------------------------
# Accelerator-optimized machine types come with a fixed GPU model and count ("Each machine type
# within a series has a specific model and number of NVIDIA GPUs attached",
# https://cloud.google.com/compute/docs/accelerator-optimized-machines). The map is Google's own:
# GoogleCloudPlatform/cluster-toolkit modules/internal/gpu-definition/main.tf (`accelerator_machines`,
# @147e356d); accelerator type names as in https://cloud.google.com/compute/docs/gpus.
GPU_TABLE_SOURCE = (
    "https://cloud.google.com/compute/docs/gpus and https://cloud.google.com/compute/docs/accelerator-optimized-machines; "
    "machine -> (type, count) from GoogleCloudPlatform/cluster-toolkit modules/internal/gpu-definition/main.tf"
)


def _series(fmt: str, gpu: str, counts: Mapping[str, int]) -> dict[str, tuple[str, int]]:
    return {fmt.format(k): (gpu, n) for k, n in counts.items()}


ACCELERATOR_OPTIMIZED: dict[str, tuple[str, int]] = {
    **_series("a2-highgpu-{}", "nvidia-tesla-a100", {"1g": 1, "2g": 2, "4g": 4, "8g": 8}),
    "a2-megagpu-16g": ("nvidia-tesla-a100", 16),
    **_series("a2-ultragpu-{}", "nvidia-a100-80gb", {"1g": 1, "2g": 2, "4g": 4, "8g": 8}),
    **_series("a3-highgpu-{}", "nvidia-h100-80gb", {"1g": 1, "2g": 2, "4g": 4, "8g": 8}),
    "a3-megagpu-8g": ("nvidia-h100-mega-80gb", 8),
    "a3-ultragpu-8g": ("nvidia-h200-141gb", 8),
    "a4-highgpu-8g": ("nvidia-b200", 8),
    "a4-highgpu-8g-lowmem": ("nvidia-b200", 8),
    "a4x-highgpu-4g": ("nvidia-gb200", 4),
    "a4x-highgpu-4g-nolssd": ("nvidia-gb200", 4),
    **_series("g2-standard-{}", "nvidia-l4", {"4": 1, "8": 1, "12": 1, "16": 1, "32": 1, "24": 2, "48": 4, "96": 8}),
    **_series("g4-standard-{}", "nvidia-rtx-pro-6000", {"48": 1, "96": 2, "192": 4, "384": 8}),
}
ACCELERATOR_FAMILIES = ("a2", "a3", "a4", "a4x", "g2", "g4")
# N1 is the only general-purpose series GPUs attach to ("For the N1 general-purpose machine types,
# you can attach the GPU models specified", https://cloud.google.com/compute/docs/gpus). Counts per
# model from the same page as tabulated by skypilot (sky/catalog/gcp_catalog.py
# `_NUM_ACC_TO_MAX_CPU_AND_MEMORY`, "Refer to: https://cloud.google.com/compute/docs/gpus").
# Not checked: the per-count vCPU/memory ceilings of that table (e.g. 1 V100: <= 12 vCPUs).
N1_GPUS: dict[str, tuple[int, ...]] = {
    "nvidia-tesla-t4": (1, 2, 4),
    "nvidia-tesla-v100": (1, 2, 4, 8),
    "nvidia-tesla-p100": (1, 2, 4),
    "nvidia-tesla-p4": (1, 2, 4),
}


def family(machine_type: str) -> str:
    return machine_type.split("-", 1)[0]


def _counts_of(gpu: str) -> str:
    """'g2-standard-4: 1, ..., g2-standard-24: 2, ...' for one GPU model (by count, then size)."""
    shapes = sorted((n, int(re.findall(r"\d+", m)[-1]), m) for m, (g, n) in ACCELERATOR_OPTIMIZED.items() if g == gpu)
    return ", ".join(f"{m}: {n}" for n, _, m in shapes)


def _with_count(gpu: str, count: int | None) -> list[str]:
    return sorted(m for m, shape in ACCELERATOR_OPTIMIZED.items() if shape == (gpu, count))


def builtin_gpus(machine_type: str) -> tuple[str, int] | None:
    """(type, count) of an accelerator-optimized machine type's own GPUs, None for others."""
    return ACCELERATOR_OPTIMIZED.get(machine_type)


def gpu_problem(machine_type: str, gpu: str | None, count: int | None) -> tuple[str, str] | None:
    """What is wrong with machine type + accelerator, as (which key, message); None when GCE sells it.

    ``gpu`` None: no accelerator asked for (accelerator-optimized types bring theirs; others have none).
    The key is ``"machineType"`` or ``"accelerator"``.
    """
    fam = family(machine_type)
    builtin = ACCELERATOR_OPTIMIZED.get(machine_type)
    if builtin is None and fam in ACCELERATOR_FAMILIES:
        known_types = sorted(m for m in ACCELERATOR_OPTIMIZED if family(m) == fam)
        return "machineType", (
            f"{machine_type!r} is not an {fam.upper()} machine type spotctl knows ({', '.join(known_types)}); "
            "its GPUs are fixed per machine type, so it must be in the table in infra/contract/gcp.py"
        )
    if builtin is not None:
        want_gpu, want_count = builtin
        if gpu is None or (gpu, count) == builtin:
            return None
        if gpu != want_gpu:
            return "accelerator", (
                f"{machine_type} comes with {want_count} x {want_gpu}, not {gpu!r}: "
                f"leave accelerator out or set {{type: {want_gpu}, count: {want_count}}}"
            )
        other = _with_count(gpu, count)
        hint = f"for {count} x {gpu} use {' or '.join(other)}" if other else "change machineType"
        return "accelerator", (
            f"{machine_type} comes with {want_count} x {want_gpu}, not {count}: {hint}, or leave accelerator out "
            f"(allowed counts per machine type: {_counts_of(want_gpu)})"
        )
    if gpu is None:
        return None
    if fam != "n1":
        return "accelerator", (
            f"GPUs cannot be attached to {machine_type}: only N1 machine types take attached GPUs "
            f"({', '.join(N1_GPUS)}); A2/A3/A4/G2/G4 machine types come with their own"
        )
    allowed = N1_GPUS.get(gpu)
    if allowed is None:
        return "accelerator", f"{gpu!r} cannot be attached to N1; N1 takes {', '.join(N1_GPUS)}"
    if count not in allowed:
        return "accelerator", (
            f"{gpu} on N1 comes in counts {', '.join(map(str, allowed))}, got {count}"
        )
    return None


def has_gpus(machine_type: str, attached: int = 0) -> bool:
    return machine_type in ACCELERATOR_OPTIMIZED or attached > 0


def needs_gvnic(machine_type: str) -> bool:
    """Third-generation and later machine series (A3, A4, A4X, G4) support only gVNIC.

    The digit of a series name is its generation (a3 = third). See rule ``gcp.gvnic``.
    """
    m = re.match(r"^[a-z]+(\d+)[a-z]*$", family(machine_type))
    return bool(m) and int(m.group(1)) >= 3


DLVM_PROJECT = "deeplearning-platform-release"


def is_dlvm(image: str | None) -> bool:
    return bool(image) and f"projects/{DLVM_PROJECT}/" in str(image)


def _machine(props: Mapping[str, Any]) -> Any:
    mt = props.get("machine_type")
    return mt.rsplit("/", 1)[-1] if isinstance(mt, str) else mt


def _accelerators(props: Mapping[str, Any]) -> list[tuple[Any, Any]] | None:
    accs = props.get("guest_accelerators")
    if accs is UNKNOWN:
        return None
    out = []
    for a in accs or []:
        if a is UNKNOWN or not known(a.get("type"), a.get("count")):
            return None
        if a.get("count"):
            out.append((str(a["type"]).rsplit("/", 1)[-1], int(a["count"])))
    return out
