"""GCP rules (see ``infra.contract``). One ``@rule`` per rule the Compute Engine / GCS / Logging APIs
enforce on what spotctl declares (or that spotctl's promises depend on), each citing its source;
checks get the pulumi-gcp constructor inputs.

Also the one table of GPU machine shapes (:data:`ACCELERATOR_OPTIMIZED`, :data:`N1_GPUS`): ``spotctl
validate`` (``infra.config``) and the ``gcp.gpu-machine-pair`` rule both ask :func:`gpu_problem`.
Pure Python (no pulumi import): ``infra.config`` imports this module. Longer than 400 lines because
every GCP rule and its source lives here and nowhere else.

Sources marked [UNVERIFIED] were not confirmed from a primary document when the rule was written;
the rule says so instead of pretending (see README, "First real `pulumi up`").
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from infra.contract import UNKNOWN, dig, known, move_timeout_problem, rule

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


# ---- rules -----------------------------------------------------------------------------------------


@rule("gcp.metadata-value-256k", VMS,
      says="A Compute Engine metadata value is limited to 256 KB.",
      fix="keep startup/shutdown scripts and user values small (a long command belongs in a file on the job disk)",
      source="https://cloud.google.com/compute/docs/reference/rest/v1/Metadata (items[].value: \"must be less than or "
             "equal to 262144 bytes (256 KiB)\")")
def metadata_value_size(type_: str, props: Mapping[str, Any]) -> str | None:
    metadata = props.get("metadata")
    if not isinstance(metadata, Mapping):
        return None
    for key, value in metadata.items():
        if value is not None and value is not UNKNOWN and len(str(value).encode()) > METADATA_VALUE_LIMIT:
            return f"metadata {key!r} is {len(str(value).encode()):,} bytes (limit {METADATA_VALUE_LIMIT:,})"
    return None


@rule("gcp.gpu-machine-pair", VMS,
      says="Accelerator-optimized machine types (A2, A3, A4, G2, G4) come with a fixed GPU model and count; GPUs "
           "attach only to N1, in the counts each model allows.",
      fix="pick the machine type from the table in infra/contract/gcp.py (spotctl validate names the allowed counts); "
          "emit guest_accelerators only for N1",
      source=GPU_TABLE_SOURCE)
def gpu_machine_pair(type_: str, props: Mapping[str, Any]) -> str | None:
    machine, accs = _machine(props), _accelerators(props)
    if not known(machine) or machine is None or accs is None:
        return None
    if len(accs) > 1:
        return f"guest_accelerators lists {len(accs)} GPU models; a VM has one"
    gpu, count = accs[0] if accs else (None, None)
    problem = gpu_problem(machine, gpu, count)
    return None if problem is None else problem[1]


@rule("gcp.gpu-terminate-on-maintenance", VMS,
      says="VMs with GPUs cannot live-migrate: scheduling.on_host_maintenance must be TERMINATE.",
      fix="build scheduling with on_host_maintenance='TERMINATE' (infra/gcp.py _scheduling)",
      source="pulumi_gcp/compute/instance.py Instance.guest_accelerators: \"GPU accelerators can only be used with on_host_maintenance "
             "option set to TERMINATE\"; https://cloud.google.com/compute/docs/gpus/gpu-host-maintenance")
def gpu_terminate(type_: str, props: Mapping[str, Any]) -> str | None:
    machine, accs = _machine(props), _accelerators(props)
    if not known(machine) or machine is None or accs is None:
        return None
    if not has_gpus(machine, sum(n for _, n in accs)):
        return None
    ohm = dig(props, "scheduling.on_host_maintenance")
    if not known(ohm) or ohm == "TERMINATE":
        return None
    return f"{machine} has GPUs but scheduling.on_host_maintenance is {ohm!r}"


@rule("gcp.spot-scheduling", VMS,
      says="provisioning_model SPOT needs preemptible = true and automatic_restart = false.",
      fix="build scheduling through infra/gcp.py _scheduling",
      source="pulumi_gcp/compute/_inputs.py InstanceSchedulingArgs.provisioning_model: \"If this is set to SPOT, preemptible should be "
             "true and automatic_restart should be false\"")
def spot_scheduling(type_: str, props: Mapping[str, Any]) -> str | None:
    s = props.get("scheduling")
    if not isinstance(s, Mapping) or s.get("provisioning_model") != "SPOT":
        return None
    if not known(s.get("preemptible"), s.get("automatic_restart")):
        return None
    if s.get("preemptible") is not True or s.get("automatic_restart") is not False:
        return f"SPOT with preemptible={s.get('preemptible')!r}, automatic_restart={s.get('automatic_restart')!r}"
    return None


@rule("gcp.template-region", TEMPLATES,
      says="An instance template's subnetwork is looked up in the template's region, which defaults to the "
           "provider's: set region explicitly (or name the subnetwork by its full path).",
      fix="pass region=cfg.region to the template (infra/gcp.py)",
      source="pulumi_gcp/compute/instance_template.py InstanceTemplate.region: \"Defaults to the region of the Provider if no value is given\"; "
             "terraform-provider-google google/tpgresource/field_helpers.go ParseRegionalFieldValue / GetRegionFromSchema")
def template_region(type_: str, props: Mapping[str, Any]) -> str | None:
    region = props.get("region")
    if region is UNKNOWN or region:
        return None
    for nic in props.get("network_interfaces") or []:
        sub = nic.get("subnetwork") if isinstance(nic, Mapping) else UNKNOWN
        if sub is UNKNOWN or (isinstance(sub, str) and "/regions/" in sub):
            continue
        return f"no region and subnetwork {sub!r} is not a full path"
    return None


@rule("gcp.custom-network-subnetwork", (*VMS, ADDRESS),
      says="On a custom-mode VPC a NIC must name its subnetwork (there is no subnetwork 'default').",
      fix="set spotctl:network.subnetwork (spotctl validate requires it when network is not 'default')",
      source="pulumi_gcp/compute/_inputs.py InstanceNetworkInterfaceArgs.subnetwork: \"If the network is in custom subnet mode, "
             "specifying the subnetwork is required.\"")
def custom_network_subnetwork(type_: str, props: Mapping[str, Any]) -> str | None:
    nics = props.get("network_interfaces") if type_ != ADDRESS else [props]
    for nic in nics or []:
        if not isinstance(nic, Mapping):
            continue
        net, sub = nic.get("network"), nic.get("subnetwork")
        if not known(net, sub) or net is None:
            continue
        custom = str(net).rsplit("/", 1)[-1] != "default"
        if custom and (not sub or str(sub).rsplit("/", 1)[-1] == "default"):
            return f"network {net!r} with subnetwork {sub!r}"
    return None


@rule("gcp.gvnic", VMS,
      says="Third-generation and later machine series (A3, A4, A4X, G4) support only the gVNIC network interface.",
      fix="set nic_type='GVNIC' on their NICs (infra/gcp.py _network); a custom image must carry the gVNIC driver",
      source="GKE feature notes quoting https://cloud.google.com/kubernetes-engine/docs/how-to/using-gvnic: \"gVNIC "
             "replaces VirtIO-Net as the only supported network interface in Compute Engine for all new machine types "
             "(Generation 3 and onwards)\" [third-party copy; the series digit as generation is GCE's naming]")
def gvnic(type_: str, props: Mapping[str, Any]) -> str | None:
    machine = _machine(props)
    if not known(machine) or not isinstance(machine, str) or not needs_gvnic(machine):
        return None
    for nic in props.get("network_interfaces") or []:
        kind = nic.get("nic_type") if isinstance(nic, Mapping) else UNKNOWN
        if known(kind) and kind != "GVNIC":
            return f"{machine} with nic_type {kind!r}"
    return None


def _boot_image(props: Mapping[str, Any]) -> Any:
    image = dig(props, "boot_disk.initialize_params.image")
    if image is None:
        for disk in props.get("disks") or []:
            if isinstance(disk, Mapping) and disk.get("boot"):
                image = disk.get("source_image")
    return image


@rule("gcp.dlvm-driver", VMS,
      says="Deep Learning VM images install the NVIDIA driver only when metadata install-nvidia-driver is 'True'.",
      fix="set metadata install-nvidia-driver='True' on GPU VMs booting a deeplearning-platform-release image "
          "(infra/gcp.py _metadata); custom images must bring their own driver",
      source="https://cloud.google.com/deep-learning-vm/docs/cli (--metadata=\"install-nvidia-driver=True\"; quoted by "
             "third-party scripts, page not in the search corpus)")
def dlvm_driver(type_: str, props: Mapping[str, Any]) -> str | None:
    machine, accs, image = _machine(props), _accelerators(props), _boot_image(props)
    if not known(machine, image) or machine is None or accs is None or not is_dlvm(image):
        return None
    if not has_gpus(machine, sum(n for _, n in accs)):
        return None
    flag = dig(props, "metadata.install-nvidia-driver")
    if not known(flag) or flag == "True":
        return None
    return f"{machine} boots {image} without metadata install-nvidia-driver=True (no GPU driver)"


@rule("gcp.kept-boot-disk", (INSTANCE,),
      says="A boot disk that must outlive the VM needs auto_delete = false (the default deletes it with the VM).",
      fix="InstanceBootDiskArgs(source=..., auto_delete=False) for bootDisk: keep",
      source="pulumi_gcp/compute/_inputs.py InstanceBootDiskArgs.auto_delete: \"Whether the disk will be auto-deleted when the instance "
             "is deleted. Defaults to true.\"")
def kept_boot_disk(type_: str, props: Mapping[str, Any]) -> str | None:
    source, auto = dig(props, "boot_disk.source"), dig(props, "boot_disk.auto_delete")
    if source is None or not known(auto) or auto is False:
        return None
    return "boot_disk.source is an existing disk but auto_delete is not False"


MAX_LABELS = 64
# pulumi-gcp (v8 on) adds one label of its own to every resource it creates, outside the program's
# inputs: "adds a new global default label, `goog-pulumi-provisioned`, to each resource" (pulumi/registry
# #5403, the v8 migration guide; the provider's `addPulumiAttributionLabel`, on by default). The inputs
# spotctl declares may therefore hold one label fewer than GCE's limit.
PROVIDER_LABELS = 1
LABELS_SOURCE = (
    "https://cloud.google.com/resource-manager/docs/labels-overview#requirements (\"Each resource can have multiple "
    "labels, up to a maximum of 64\"); pulumi_gcp labels docstrings: \"No more than 64 labels can be associated "
    "with a given resource\""
)
LABELLED = (*VMS, DISK, REGION_DISK, SNAPSHOT, ADDRESS, BUCKET, "gcp:pubsub/topic:Topic",
            "gcp:pubsub/subscription:Subscription", "gcp:secretmanager/secret:Secret")


def _label_maps(props: Mapping[str, Any]) -> list[tuple[str, Any]]:
    """(where, labels) of a resource: its own, and those it gives the disks it creates."""
    found = [("labels", props.get("labels")), ("boot_disk.initialize_params.labels", dig(props, "boot_disk.initialize_params.labels"))]
    disks = props.get("disks")
    if isinstance(disks, list):
        found += [(f"disks[{i}].labels", d.get("labels")) for i, d in enumerate(disks) if isinstance(d, Mapping)]
    return found


@rule("gcp.labels-64", LABELLED,
      says="A GCP resource carries at most 64 labels (the stack's spotctl:labels plus spotctl's own).",
      fix="fewer spotctl:labels (infra/config.py checks them against infra/naming.py GCP_SPOTCTL_LABELS_MAX)",
      source=LABELS_SOURCE)
def labels_64(type_: str, props: Mapping[str, Any]) -> str | None:
    for where, labels in _label_maps(props):
        if isinstance(labels, Mapping) and len(labels) + PROVIDER_LABELS > MAX_LABELS:
            return f"{where} has {len(labels)} labels (+ {PROVIDER_LABELS} the provider adds: goog-pulumi-provisioned)"
    return None


ACCOUNT_ID = re.compile(r"^[a-z]([-a-z0-9]*[a-z0-9])$")


@rule("gcp.service-account-id", (ACCOUNT,),
      says="A service account id is 6-30 characters, [a-z]([-a-z0-9]*[a-z0-9]) (RFC 1035).",
      fix="build ids with infra/gcp.py _account_id (hashes long names)",
      source="terraform-provider-google resource_google_service_account.go (ValidateRFC1035Name(6, 30))")
def service_account_id(type_: str, props: Mapping[str, Any]) -> str | None:
    aid = props.get("account_id")
    if not known(aid) or aid is None:
        return None
    if not (6 <= len(aid) <= 30 and ACCOUNT_ID.match(aid)):
        return f"account_id {aid!r}"
    return None


IAM_DISPLAY_BYTES = 100
IAM_DISPLAY_SOURCE = (
    "https://cloud.google.com/iam/docs/reference/rest/v1/projects.serviceAccounts (ServiceAccount.displayName: "
    "\"The maximum length is 100 UTF-8 bytes\"); https://cloud.google.com/iam/docs/reference/rest/v1/"
    "organizations.roles (Role.title: \"Typically this is limited to 100 UTF-8 bytes\")"
)


def iam_display(text: str) -> str:
    """``text`` cut to IAM's 100 UTF-8 bytes for a display name or role title, on a character boundary
    (a stack or job name makes it unbounded; a cut multi-byte character is dropped whole)."""
    return text.encode()[:IAM_DISPLAY_BYTES].decode(errors="ignore")


@rule("gcp.iam-display-100-bytes", (ACCOUNT, CUSTOM_ROLE),
      says="A service account's display name and a custom role's title are at most 100 UTF-8 bytes.",
      fix="build them with infra/contract/gcp.py iam_display (cuts on a character boundary)",
      source=IAM_DISPLAY_SOURCE)
def iam_display_bytes(type_: str, props: Mapping[str, Any]) -> str | None:
    key = "display_name" if type_ == ACCOUNT else "title"
    text = props.get(key)
    if not isinstance(text, str):
        return None
    size = len(text.encode())
    return f"{key} is {size} UTF-8 bytes" if size > IAM_DISPLAY_BYTES else None


CUSTOM_ROLE_ID = re.compile(r"^[a-zA-Z0-9_.]{3,64}$")


@rule("gcp.custom-role-id", (CUSTOM_ROLE,),
      says="A custom role id is 3-64 letters, digits, '_' and '.' (no '-'), and the role holds at least one permission.",
      fix="derive the id with infra/gcp_watcher.py role_id (spotctl_<slug with '_' for '-'>_watcher)",
      source="terraform-provider-google google/verify/validation.go IAMCustomRoleIDRegex \"^[a-zA-Z0-9_\\.]{3,64}$\" "
             "(https://cloud.google.com/iam/docs/understanding-custom-roles#naming_the_role); "
             "resource_google_project_iam_custom_role.go role_id \"Cannot contain - characters\", permissions MinItems 1")
def custom_role_id(type_: str, props: Mapping[str, Any]) -> str | None:
    rid, perms = props.get("role_id"), props.get("permissions")
    if known(rid) and isinstance(rid, str) and not CUSTOM_ROLE_ID.match(rid):
        return f"role_id {rid!r}"
    if known(perms) and isinstance(perms, list) and not perms:
        return "no permissions"
    return None


@rule("gcp.bucket-ubla", (BUCKET,),
      says="IAM conditions on a bucket (the per-job event prefixes) need uniform bucket-level access.",
      fix="gcp.storage.Bucket(uniform_bucket_level_access=True)",
      source="https://docs.cloud.google.com/storage/docs/access-control/using-iam-permissions, \"Use IAM Conditions on "
             "buckets\": \"You must enable uniform bucket-level access on the bucket before adding conditions.\"")
def bucket_ubla(type_: str, props: Mapping[str, Any]) -> str | None:
    ubla = props.get("uniform_bucket_level_access")
    return None if not known(ubla) or ubla is True else f"uniform_bucket_level_access is {ubla!r}"


PREFIX_CONDITION = re.compile(r'^resource\.name\.startsWith\("projects/_/buckets/[^/"]+/objects/[^"]+/"\)$')


@rule("gcp.event-writer-prefix", (BUCKET_IAM_MEMBER,),
      says="A VM identity may create event objects only under its own <stack>/<job or pool>/ prefix: resume trusts them.",
      fix="grant roles/storage.objectCreator with condition resource.name.startsWith(\"projects/_/buckets/B/objects/"
          "<stack>/<name>/\") (trailing slash, so 'train' does not cover 'train2')",
      source="https://cloud.google.com/iam/docs/conditions-resource-attributes (Cloud Storage object resource names "
             "projects/_/buckets/BUCKET/objects/OBJECT)")
def event_writer_prefix(type_: str, props: Mapping[str, Any]) -> str | None:
    if props.get("role") != "roles/storage.objectCreator":
        return None
    expr = dig(props, "condition.expression")
    if not known(expr):
        return None
    if not isinstance(expr, str) or not PREFIX_CONDITION.match(expr):
        return f"objectCreator granted with condition {expr!r}"
    return None


@rule("gcp.sink-filter-exact", (PROJECT_SINK,),
      says="The preemption sink must match its stack's instance names exactly: ':' is Logging's substring (has) "
           "operator, so 'team-a' would also catch 'team-ab'; and only Compute Engine's System Event audit log, "
           "since a job's service account may write entries of any shape into logs of its own.",
      fix="filter protoPayload.resourceName with an anchored regular expression (=~ \"/instances/(...)$\")",
      source="https://cloud.google.com/logging/docs/view/logging-query-language (\":\" has operator: \"doesn't contain "
             "the string ... anywhere inside it\"; =~ regular expression match)")
def sink_filter_exact(type_: str, props: Mapping[str, Any]) -> str | None:
    f = props.get("filter")
    if not known(f) or not isinstance(f, str):
        return None
    if re.search(r"protoPayload\.resourceName\s*:", f):
        return "filter uses the substring operator on protoPayload.resourceName"
    m = re.search(r'protoPayload\.resourceName\s*=~\s*"([^"]*)"', f)
    if m and not m.group(1).endswith("$"):
        return f"regular expression {m.group(1)!r} is not anchored at the end"
    log = re.search(r'logName\s*=~\s*"([^"]*)"', f)
    if not log or not log.group(1).endswith("%2Fsystem_event$"):
        return "filter does not restrict logName to the anchored System Event audit log (any log a job writes would pass)"
    return None


@rule("gcp.nat-subnetworks", (ROUTER_NAT,),
      says="A Cloud NAT with LIST_OF_SUBNETWORKS must list its subnetworks; ALL_SUBNETWORKS_* would claim every "
           "subnetwork of the network in the region (no other NAT may exist there).",
      fix="LIST_OF_SUBNETWORKS with the stack's subnetwork (infra/gcp.py Egress)",
      source="pulumi_gcp/compute/router_nat.py RouterNat.source_subnetwork_ip_ranges_to_nat: \"if this field contains ALL_SUBNETWORKS_* then "
             "there should not be any other RouterNat section in any Router for this network in this region\"")
def nat_subnetworks(type_: str, props: Mapping[str, Any]) -> str | None:
    mode, subs = props.get("source_subnetwork_ip_ranges_to_nat"), props.get("subnetworks")
    if not known(mode, subs):
        return None
    if mode != "LIST_OF_SUBNETWORKS":
        return f"source_subnetwork_ip_ranges_to_nat is {mode!r}"
    return None if subs else "LIST_OF_SUBNETWORKS without subnetworks"


@rule("gcp.firewall-sources", (FIREWALL,),
      says="An INGRESS rule needs source_ranges, source_tags or source_service_accounts; service accounts cannot be "
           "mixed with tags.",
      fix="scope the gang rule by the job's service account on both sides (infra/gcp.py TrainingJob)",
      source="pulumi_gcp/compute/firewall.py Firewall.direction / source_service_accounts: \"For INGRESS traffic, one of source_ranges, "
             "source_tags or source_service_accounts is required\"; \"sourceServiceAccounts cannot be used at the same "
             "time as sourceTags or targetTags\"")
def firewall_sources(type_: str, props: Mapping[str, Any]) -> str | None:
    if props.get("direction", "INGRESS") != "INGRESS":
        return None
    keys = ("source_ranges", "source_tags", "source_service_accounts", "target_tags", "target_service_accounts")
    present = {k: props.get(k) for k in keys if props.get(k)}
    if not any(k in present for k in keys[:3]):
        return "INGRESS without a source"
    accounts = "source_service_accounts" in present or "target_service_accounts" in present
    if accounts and ("source_tags" in present or "target_tags" in present):
        return "service accounts mixed with tags"
    return None


rule("gcp.mig-no-wait-on-spot", (),
     says="wait_for_instances makes `pulumi up` wait until the group is stable and retry until timeout on failure: "
          "right for fixed on-demand groups (fail loudly), wrong for spot groups (a stockout would hang up).",
     fix="wait_for_instances=True only on the on-demand part of a pool (infra/gcp.py GpuPool)",
     source="pulumi_gcp/compute/region_instance_group_manager.py RegionInstanceGroupManager.wait_for_instances: \"if this is set to true and the operation "
            "does not succeed, the provider will continue trying until it times out\"")(None)


# Which MIG an autoscaler sizes is known only to the component that declares both, so this one is a
# context rule (infra/gcp.py GpuPool enforces it on every autoscaled part).
AUTOSCALED_SHAPES = ("EVEN", "BALANCED")
rule("gcp.autoscaled-mig-shape", (),
     says="An autoscaled regional MIG's target distribution shape is EVEN or BALANCED (ANY and ANY_SINGLE_ZONE "
          "cannot be autoscaled). BALANCED is the capacity-aware one: the autoscaler creates VMs in zones that "
          "have resource availability.",
     fix="distribution_policy_target_shape=\"BALANCED\" (with instance_redistribution_type NONE) on the autoscaled "
         "parts of a pool (infra/gcp.py GpuPool)",
     source="https://cloud.google.com/compute/docs/release-notes (October 30, 2024: \"You can autoscale a regional MIG "
            "with a BALANCED target distribution shape. With the BALANCED shape, the autoscaler is aware of the capacity "
            "in each zone and creates VMs in zones that have resource availability\"); "
            "https://cloud.google.com/compute/docs/instance-groups/regional-mig-set-target-distribution-shape, "
            "Limitations (zh-CN edition, the English one was not in the corpus: \"如果您要自动扩缩区域级 MIG，则必须将实例组的"
            "目标分布形状设置为 BALANCED（预览版）或 EVEN\"; an earlier English edition, quoted in a 2022 Google Terraform "
            "module's autoscaler.tf: \"If you want to autoscale a regional MIG, the following limitations apply: You "
            "must set the group's target distribution shape to EVEN.\")")(None)


def autoscaled_shape_problem(shape: Any) -> str | None:
    """What is wrong with the target shape of an autoscaled regional MIG, or None."""
    if not known(shape):
        return None
    return None if (shape or "EVEN") in AUTOSCALED_SHAPES else f"autoscaled with distribution_policy_target_shape {shape!r}"


@rule("gcp.mig-shape-redistribution", (REGION_MIG,),
      says="A regional MIG with target shape BALANCED or ANY_SINGLE_ZONE must have proactive instance "
           "redistribution off (update_policy.instance_redistribution_type NONE; PROACTIVE is the default).",
      fix="update_policy=RegionInstanceGroupManagerUpdatePolicyArgs(instance_redistribution_type=\"NONE\", ...)",
      source="https://cloud.google.com/compute/docs/instance-groups/distributing-instances-with-regional-instance-groups "
             "(\"Proactive instance redistribution is enabled by default. If you need ... to set the MIG's target "
             "distribution shape to BALANCED or ANY_SINGLE_ZONE, you must disable proactive instance redistribution.\"); "
             "pulumi_gcp RegionInstanceGroupManagerUpdatePolicyArgs.instance_redistribution_type: \"If `PROACTIVE` "
             "(default)\"")
def mig_shape_redistribution(type_: str, props: Mapping[str, Any]) -> str | None:
    shape = props.get("distribution_policy_target_shape")
    redistribution = dig(props, "update_policy.instance_redistribution_type")
    if not known(shape, redistribution) or shape not in ("BALANCED", "ANY_SINGLE_ZONE"):
        return None
    if redistribution == "NONE":
        return None
    return f"target shape {shape} with instance_redistribution_type {redistribution or 'PROACTIVE (the default)'}"


AUTOSCALERS = ["gcp:compute/regionAutoscaler:RegionAutoscaler", "gcp:compute/autoscaler:Autoscaler"]
SCALING_DOC = "https://cloud.google.com/compute/docs/autoscaler/scaling-cloud-monitoring-metrics"
METRIC_FILTER_DOC = ("https://cloud.google.com/compute/docs/reference/rest/v1/autoscalers "
                     "(autoscalingPolicy.customMetricUtilizations[].filter)")


def _policy(props: Mapping[str, Any]) -> Mapping[str, Any]:
    policy = props.get("autoscaling_policy")
    return policy if isinstance(policy, Mapping) else {}


def _per_group(metric: Mapping[str, Any]) -> bool:
    flt = metric.get("filter") or ""
    return metric.get("single_instance_assignment") is not None and 'resource.type = "gce_instance"' not in str(flt) \
        and "resource.type" in str(flt)


@rule("gcp.autoscaler-zero-needs-per-group-metric", AUTOSCALERS,
      says="A MIG scales below 1 VM only on per-group Monitoring metrics: \"When using per-instance metrics, the MIG "
           "cannot scale below a size of 1 VM\" (CPU and load balancing are per-instance signals).",
      fix="with min_replicas 0, scale only on a per-group metric: single_instance_assignment and a filter on a "
          "non-gce_instance resource type (infra/gcp.py _demand_policy)",
      source=SCALING_DOC + " (\"if you need to scale your MIG down to zero VMs from time to time, you can configure "
             "your MIG to scale using per-group metrics instead\")")
def zero_needs_per_group(type_: str, props: Mapping[str, Any]) -> str | None:
    policy = _policy(props)
    if policy.get("min_replicas") not in (0, 0.0):
        return None
    if policy.get("cpu_utilization") or policy.get("load_balancing_utilization"):
        return "min_replicas is 0 but the policy scales on CPU or load balancing (per-instance): it can never grow from zero"
    metrics = policy.get("metrics") or []
    if UNKNOWN in metrics or any(m is UNKNOWN for m in metrics):
        return None
    if not metrics:
        return "min_replicas is 0 but no metric is given (the default is CPU, per-instance)"
    bad = [m.get("name") for m in metrics if isinstance(m, Mapping) and not _per_group(m)]
    return f"min_replicas is 0 but metric(s) {bad} are per-instance" if bad else None


@rule("gcp.autoscaler-metric-filter", AUTOSCALERS,
      says="An autoscaler metric filter may only join selectors with AND and compare with = (no functions).",
      fix='write the filter as `a = "x" AND b = "y"` (infra/naming.py pool_metric_filter)',
      source=METRIC_FILTER_DOC + ": \"You can only use the AND operator for joining selectors. You can only use direct "
             "equality comparison operator (=) without any functions for each selector.\"")
def metric_filter(type_: str, props: Mapping[str, Any]) -> str | None:
    for m in _policy(props).get("metrics") or []:
        flt = m.get("filter") if isinstance(m, Mapping) else None
        if not isinstance(flt, str) or not flt:
            continue
        for selector in flt.split(" AND "):
            if not re.fullmatch(r'\s*[\w.]+ = "[^"]*"\s*', selector):
                return f"filter selector {selector.strip()!r} of metric {m.get('name')!r} is not `key = \"value\"`"
    return None


@rule("gcp.autoscaler-max-5-metrics", AUTOSCALERS,
      says="An autoscaler can use up to 5 Monitoring metrics per MIG.",
      fix="scale on fewer metrics (one demand metric per pool part is enough)",
      source=SCALING_DOC + " (limits: \"up to 5 Monitoring metrics per MIG\")")
def max_metrics(type_: str, props: Mapping[str, Any]) -> str | None:
    metrics = _policy(props).get("metrics") or []
    return f"{len(metrics)} metrics" if isinstance(metrics, list) and len(metrics) > 5 else None


rule("gcp.zonal-disk-same-zone", (),
     says="A zonal persistent disk attaches only to VMs in its zone; snapshots are global by default and restore "
          "into a new disk in any zone of the project, which is how a job's disk moves to another zone.",
     fix="spotctl move JOB --to-zone ZONE (snapshot, restore in the new zone, start there, release the old disk)",
     source="https://docs.cloud.google.com/compute/docs/disks/create-snapshots (\"Snapshots are, by default, global "
            "resources, so you can use them to restore data to a new disk or VM within the same project.\"); "
            "https://docs.cloud.google.com/compute/docs/instances/moving-instance-across-zones")(None)


SECRET = "gcp:secretmanager/secret:Secret"
SECRET_VERSION = "gcp:secretmanager/secretVersion:SecretVersion"
SECRET_ID_RE = re.compile(r"[A-Za-z0-9_-]{1,255}")


@rule("gcp.secret-id", [SECRET],
      says="A Secret Manager secret ID is at most 255 characters of letters, digits, hyphens and underscores.",
      fix="name job secrets through infra/naming.py secret_id (spotctl-<stack slug>-<job id>-env)",
      source="https://cloud.google.com/secret-manager/docs/reference/rest/v1/projects.secrets/create (secretId: "
             "\"a string with a maximum length of 255 characters and can contain uppercase and lowercase letters, "
             "numerals, and the hyphen (-) and underscore (_) characters\")")
def secret_id_rule(type_: str, props: Mapping[str, Any]) -> str | None:
    value = props.get("secret_id")
    if not isinstance(value, str):
        return None
    return None if SECRET_ID_RE.fullmatch(value) else f"secret_id {value!r}"


@rule("gcp.secret-payload-64k", [SECRET_VERSION],
      says="A Secret Manager secret version's data must be no larger than 64 KiB.",
      fix="keep a job's secret env values under 48 KiB in all (base64 makes them 4/3 longer)",
      source="https://cloud.google.com/secret-manager/docs/reference/rest/v1/SecretPayload (data: \"Must be no larger "
             "than 64KiB\")")
def secret_payload_rule(type_: str, props: Mapping[str, Any]) -> str | None:
    data = props.get("secret_data")
    if not isinstance(data, str):
        return None
    size = len(data.encode())
    # Never the data itself in the message: it is a secret.
    return f"the data is {size} bytes; at most 65536" if size > 65536 else None


# https://cloud.google.com/iam/quotas ("Limits", "Policies and bindings").
MAX_LOGIC_OPERATORS = 12
MAX_CONDITIONAL_BINDINGS = 20
CONDITIONED_IAM_MEMBERS = (PROJECT_IAM_MEMBER, BUCKET_IAM_MEMBER)


def logic_operators(expression: str) -> int:
    """&&, || and ! (not !=) in a CEL expression, outside string literals: the operators IAM counts."""
    count, i, quoted = 0, 0, False
    while i < len(expression):
        c = expression[i]
        if c == '"':
            quoted = not quoted
        elif not quoted and expression[i:i + 2] in ("&&", "||"):
            count, i = count + 1, i + 1
        elif not quoted and c == "!" and expression[i + 1:i + 2] != "=":
            count += 1
        i += 1
    return count


@rule("gcp.condition-logic-operators-12", CONDITIONED_IAM_MEMBERS,
      says="A role binding's condition expression may hold at most 12 logic operators (&&, ||, !); IAM refuses "
           "the allow policy otherwise.",
      fix="split the condition over several bindings of the role (infra/gcp_watcher.py compute_conditions packs them)",
      source="https://cloud.google.com/iam/quotas (\"Logic operators in a binding's condition expression: 12\")")
def condition_logic_operators(type_: str, props: Mapping[str, Any]) -> str | None:
    expression = dig(props, "condition.expression")
    if not isinstance(expression, str):
        return None
    n = logic_operators(expression)
    return f"the condition has {n} logic operators" if n > MAX_LOGIC_OPERATORS else None


rule("gcp.conditional-bindings-20", (),
     says="An allow policy holds at most 20 role bindings with the same role and member but different conditions.",
     fix="fewer zones, or fewer stacks whose names extend this one's, per watcher",
     source="https://cloud.google.com/iam/quotas (\"Role bindings in a policy that include the same role and the same "
            "member, but different condition expressions: 20\")")(None)


rule("gcp.watcher-condition-covers-names", (),
     says="IAM conditions on Compute Engine see the resource name (projects/P/zones/Z/instances/NAME, "
          "projects/P/zones/Z/disks/NAME, projects/P/global/snapshots/NAME), never labels: the watcher's compute "
          "role must name every instance, disk and snapshot a job of the stack gets.",
     fix="keep infra/gcp_watcher.py name_locations in step with infra/naming.py; a job named like another stack's "
         "(job b-x of stack team and job x of stack team-b share their names) must be renamed",
     source="https://cloud.google.com/iam/docs/conditions-resource-attributes (resource service, type and "
            "\"the format for resource name strings\"; compute.googleapis.com/Instance, Disk listed)")(None)


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


# ---- limits a stack's own values can break (infra/limits.py reads them back onto stack keys) --------

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
