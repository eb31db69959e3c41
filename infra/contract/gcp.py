"""GCP rules (see ``infra.contract``). One ``@rule`` per rule the Compute Engine / GCS / Logging APIs
enforce on what spotctl declares (or that spotctl's promises depend on), each citing its source;
checks get the pulumi-gcp constructor inputs. This module holds the rules on VMs, labels and names;
``gcp_access``, ``gcp_disks`` and ``gcp_limits`` the others (importing this module registers them all), and
``gcp_machines`` the resource types and the GPU machine table. Every name stays importable from here.
Pure Python (no pulumi import): ``infra.config`` imports this module.

Sources marked [UNVERIFIED] were not confirmed from a primary document when the rule was written;
the rule says so instead of pretending (see README, "First real `pulumi up`").
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from infra.contract.gcp_access import (  # noqa: F401
    AUTOSCALED_SHAPES,
    AUTOSCALERS,
    CONDITIONED_IAM_MEMBERS,
    MAX_CONDITIONAL_BINDINGS,
    MAX_LOGIC_OPERATORS,
    METRIC_FILTER_DOC,
    PREFIX_CONDITION,
    SCALING_DOC,
    SECRET,
    SECRET_ID_RE,
    SECRET_VERSION,
    _per_group,
    _policy,
    autoscaled_shape_problem,
    bucket_ubla,
    condition_logic_operators,
    event_writer_prefix,
    firewall_sources,
    logic_operators,
    max_metrics,
    metric_filter,
    mig_shape_redistribution,
    nat_subnetworks,
    secret_id_rule,
    secret_payload_rule,
    sink_filter_exact,
    zero_needs_per_group,
)
from infra.contract.gcp_disks import (  # noqa: F401
    REGIONAL_DISK_TYPES,
    REGIONAL_PD_SERIES,
    REGIONAL_PD_SOURCE,
    REGIONAL_SOURCE,
    REGIONAL_TYPES_SOURCE,
    TPG,
    _move_create_timeout,
    _regional_not_from_image,
    _regional_replica_zones,
    _regional_standard_size,
    _regional_type,
    regional_disk_problem,
)
from infra.contract.gcp_limits import (  # noqa: F401
    HYPERDISK_ONLY,
    SPOT_ONLY,
    TOPIC,
    a3_high_spot_only,
    hyperdisk_only,
    hyperdisk_series,
    reserved_name,
    reserved_name_problem,
    reserved_names,
    spot_only,
)
from infra.contract.gcp_machines import (  # noqa: F401
    ACCELERATOR_FAMILIES,
    ACCELERATOR_OPTIMIZED,
    ACCOUNT,
    ADDRESS,
    BUCKET,
    BUCKET_IAM_MEMBER,
    CUSTOM_ROLE,
    DISK,
    DLVM_PROJECT,
    FIREWALL,
    GPU_TABLE_SOURCE,
    INSTANCE,
    INSTANCE_TEMPLATE,
    METADATA_VALUE_LIMIT,
    N1_GPUS,
    PROJECT_IAM_MEMBER,
    PROJECT_SINK,
    REGION_DISK,
    REGION_INSTANCE_TEMPLATE,
    REGION_MIG,
    ROUTER_NAT,
    SNAPSHOT,
    TEMPLATES,
    VMS,
    _accelerators,
    _counts_of,
    _machine,
    _series,
    _with_count,
    builtin_gpus,
    family,
    gpu_problem,
    has_gpus,
    is_dlvm,
    needs_gvnic,
)
from infra.contract.rulebook import UNKNOWN, dig, known, rule

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
