"""What the AWS components and the watcher both use: the image and its root volume, the user data, the
metadata options (IMDSv2), subnets, endpoint names, and how job roles and their boundary are named."""

from __future__ import annotations

import base64
import gzip
import json
from dataclasses import dataclass

import pulumi
import pulumi_aws as aws

from agent.schema import AGENT_PREFIX
from infra import contract
from infra.config import Job, StackConfig
from infra.naming import boundary_name, code_root, ssm_parameter_name  # noqa: F401 - boundary_name: its users import it from here

# Deep Learning AMI (NVIDIA driver, PyTorch) on Ubuntu, newest first; `image: ami-...` overrides.
DEFAULT_AMI_NAME = "Deep Learning OSS Nvidia Driver AMI GPU PyTorch * (Ubuntu 22.04) *"
DATA_DEVICE = "/dev/sdf"
# Nitro exposes an EBS volume as NVMe with the volume id (no dash) in its by-id name ("EBS volumes
# are exposed as NVMe block devices on instances built on the Nitro System", nvme-ebs-volumes.html).
NVME_BY_ID = "/dev/disk/by-id/nvme-Amazon_Elastic_Block_Store_{}"
# Xen instance types (p2, p3, g3, ...) have no NVMe: the volume appears under the name it was
# attached as, or renamed by the kernel's driver ("Depending on the block device driver of the
# kernel, the device might be attached with a different name than what you specify. For example,
# if you specify a device name of /dev/sdh, your device could be renamed /dev/xvdh or /dev/hdh",
# docs.aws.amazon.com/AWSEC2/latest/UserGuide/device_naming.html). Only this volume is attached
# as DATA_DEVICE, so each name is it.
DATA_DEVICE_NAMES = (DATA_DEVICE, DATA_DEVICE.replace("/dev/sd", "/dev/xvd"))
SSM_STANDARD_MAX = 4096  # characters of a Standard-tier parameter value (contract aws.ssm-parameter-value)
INTERRUPTION_EVENTS = ["EC2 Spot Instance Interruption Warning", "EC2 Instance Rebalance Recommendation"]


@dataclass(frozen=True)
class Image:
    id: str
    root_device: str
    root_gb: int  # size of the root device's snapshot: the smallest root volume EC2 accepts


def _image(cfg_image: str | None, opts: pulumi.InvokeOptions) -> Image:
    if cfg_image:
        filters = [aws.ec2.GetAmiFilterArgs(name="image-id", values=[cfg_image])]
        owners = None
    else:
        filters = [
            aws.ec2.GetAmiFilterArgs(name="name", values=[DEFAULT_AMI_NAME]),
            aws.ec2.GetAmiFilterArgs(name="architecture", values=["x86_64"]),
        ]
        owners = ["amazon"]
    return image_of(aws.ec2.get_ami(most_recent=True, owners=owners, filters=filters, opts=opts))


def image_of(ami) -> Image:
    """An AMI lookup's id, root device and root snapshot size."""
    # block_device_mappings[].ebs values are strings (terraform-provider-aws ami.go flattenAMIBlockDeviceMappings).
    root = next((b for b in ami.block_device_mappings or [] if b.device_name == ami.root_device_name), None)
    root_gb = int((root.ebs or {}).get("volume_size") or 0) if root is not None else 0
    return Image(ami.id, ami.root_device_name, root_gb)


def root_volume_gb(wanted: int, image: Image, resource: str) -> int:
    """The root volume size: what was asked, grown to the image's root snapshot when smaller."""
    size = max(wanted, image.root_gb)
    contract.enforce(
        "aws.root-volume-covers-snapshot", resource,
        None if size >= image.root_gb else f"root volume {size} GiB < root snapshot of {image.id} ({image.root_gb} GiB)",
    )
    return size


def gp3_performance(job: Job) -> tuple[int, int]:
    """(throughput MiB/s, IOPS) of a job disk: the job's values, else scaled with its GPUs so a
    checkpoint fits the preemption notice (250 MiB/s per GPU up to 2,000; 4 IOPS per MiB/s, at
    least the 3,000 baseline), within gp3's 500 IOPS per GiB and 0.25 MiB/s per IOPS."""
    gpus = job.accelerator.count if job.accelerator else 0
    throughput = job.disk_throughput or min(2000, max(125, 250 * gpus))
    iops = job.disk_iops or max(3000, min(80000, 500 * job.disk_gb, 4 * throughput))
    if not job.disk_throughput:
        throughput = max(125, min(throughput, iops // 4))
    return throughput, iops


def user_data_gzip_b64(script: str) -> str:
    """The script gzip-compressed (cloud-init inflates it) and base64-encoded: EC2 takes 16 KB of
    raw user data. mtime=0 keeps the bytes deterministic, so an unchanged script is no diff."""
    return base64.b64encode(gzip.compress(script.encode(), mtime=0)).decode()


def _metadata_options(cls):
    # IMDSv2 only; hop limit 2 so containers on the VM reach it too.
    return cls(http_endpoint="enabled", http_tokens="required", http_put_response_hop_limit=2, instance_metadata_tags="disabled")


@dataclass(frozen=True)
class Subnet:
    id: str
    vpc_id: str


def _subnets(cfg: StackConfig, invoke: pulumi.InvokeOptions, resource: str) -> dict[str, Subnet]:
    """Each zone's subnet: the configured ones (config refuses a partial list), else the default
    VPC's default subnet of the zone. All must be in one VPC, with the security group."""
    if cfg.network.subnets:
        found = {z: aws.ec2.get_subnet(id=cfg.network.subnets[z], opts=invoke) for z in cfg.zones}
    else:
        default = aws.ec2.get_vpcs(filters=[aws.ec2.GetVpcsFilterArgs(name="is-default", values=["true"])], opts=invoke)
        contract.enforce("aws.default-vpc-or-subnets", f"{resource} spotctl:network.subnets",
                         None if default.ids else f"region {cfg.region} has no default VPC and no subnets are configured")
        found = {z: aws.ec2.get_subnet(availability_zone=z, default_for_az=True, opts=invoke) for z in cfg.zones}
    for zone, f in found.items():
        contract.enforce("aws.subnet-in-its-zone", f"{resource} spotctl:network.subnets.{zone}",
                         None if f.availability_zone == zone else f"{f.id} is in {f.availability_zone}, not {zone}")
    subnets = {z: Subnet(f.id, f.vpc_id) for z, f in found.items()}
    vpcs = {s.vpc_id for s in subnets.values()}
    contract.enforce("aws.subnets-one-vpc", f"{resource} spotctl:network.subnets",
                     None if len(vpcs) == 1 else "subnets in several VPCs: " + ", ".join(
                         f"{z}: {s.id} ({s.vpc_id})" for z, s in subnets.items()))
    return subnets


def rule_name(slug: str, owner: str) -> str:
    """EventBridge rule name of a job. "_" never occurs in slugs or job ids, so one stack's prefix
    ``spotctl-<slug>_`` never matches another stack's rules (<= 55 of the 64 characters allowed)."""
    return f"spotctl-{slug}_{owner}"


def _tls_only_policy(bucket_arn: str) -> str:
    # https://docs.aws.amazon.com/AmazonS3/latest/userguide/example-bucket-policies.html (RestrictToTLSRequestsOnly)
    return json.dumps({
        "Version": "2012-10-17",
        "Statement": [{
            "Sid": "RestrictToTLSRequestsOnly", "Effect": "Deny", "Principal": "*", "Action": "s3:*",
            "Resource": [bucket_arn, f"{bucket_arn}/*"],
            "Condition": {"Bool": {"aws:SecureTransport": "false"}},
        }],
    })


def _dns_name(entry) -> str:
    # A VpcEndpointDnsEntry output type (a dict subclass) or, from an engine without types, a plain dict.
    return getattr(entry, "dns_name", None) or entry.get("dnsName") or entry.get("dns_name") or ""


def regional_dns_name(endpoint_id: str, names: list[str]) -> str:
    """The endpoint-specific Regional DNS name among an interface endpoint's DNS entries (pure).

    An interface endpoint has one Regional name and one zonal name per Availability Zone:
    ``vpce-0fe5b17a0707d6abc-29p5708s.ec2.us-east-1.vpce.amazonaws.com`` and
    ``vpce-0fe5b17a0707d6abc-29p5708s-us-east-1a.ec2.us-east-1.vpce.amazonaws.com``
    (https://docs.aws.amazon.com/whitepapers/latest/aws-privatelink/creating-highly-available-endpoint-services.html);
    the Regional one resolves to the endpoint's addresses in every zone. Neither the EC2 API
    (``DnsEntrySet``, botocore ec2 service-2.json) nor the provider (``dns_entry``, a list copied from it:
    terraform-provider-aws internal/service/ec2/vpc_endpoint.go flattenDNSEntries) documents an order,
    so it is chosen by form, not position: of the names whose first label starts with the endpoint's
    id, the one whose first label every other one extends by ``-<zone>``."""
    labels = {n.rstrip(".").split(".", 1)[0]: n.rstrip(".") for n in names if n.startswith(f"{endpoint_id}-")}
    regional = [label for label in labels if all(other == label or other.startswith(f"{label}-") for other in labels)]
    if len(regional) != 1:
        raise ValueError(f"interface endpoint {endpoint_id}: no single Regional DNS name among {sorted(names)}")
    return labels[regional[0]]


def job_role_naming(slug: str) -> tuple[str, str]:
    """(path, name prefix) of every job and pool role and instance profile of a stack (the watcher's
    role may pass exactly these: infra/aws_watcher.py).

    Not a per-stack path (``/spotctl/<slug>/``, which would tell ``team`` from ``team-b`` by name):
    a role's ``path`` is ForceNew (terraform-provider-aws internal/service/iam/role.go), so every job
    and pool role and profile would be replaced, and a running pool instance keeps the deleted
    profile ("Deleting a role or instance profile that is associated with a running instance will
    break any applications that are running on the instance",
    https://docs.aws.amazon.com/IAM/latest/UserGuide/id_roles_manage_delete.html); a job instance's
    would be swapped under it (ReplaceIamInstanceProfileAssociation, ec2_instance.go). The watcher's
    grants are made exact by the ``spotctl:owner`` tag and this stack's boundary instead."""
    return "/spotctl/", f"spotctl-{slug}-"[:38]




def boundary_document(stack: str, slug: str, region: str, bucket_arn: str) -> dict:
    """The most any job or pool role of the stack may do, whatever inline policy it gets (pure).

    A permissions boundary caps identity-based policies: the effective permissions are the
    intersection (https://docs.aws.amazon.com/IAM/latest/UserGuide/access_policies_boundaries.html).
    So a job role widened by whoever controls the watcher (``iam:PutRolePolicy`` cannot be limited by
    content) still cannot leave this list: the union of what ``_instance_profile``, ``_env_secret``
    and ``protect_policy`` grant, at the stack's level instead of the job's."""
    return {"Version": "2012-10-17", "Statement": [
        {"Sid": "ReadAgentAndStackObjects", "Effect": "Allow", "Action": "s3:GetObject",
         "Resource": [f"{bucket_arn}/{AGENT_PREFIX}*", f"{bucket_arn}/{stack}/*"]},
        {"Sid": "PutStackEvents", "Effect": "Allow", "Action": "s3:PutObject",
         "Resource": f"{bucket_arn}/{stack}/*"},  # every event_object_prefix(stack, name) of the stack
        {"Sid": "ReadStackCode", "Effect": "Allow", "Action": "s3:GetObject",
         "Resource": f"{bucket_arn}/{code_root(stack)}*"},  # every job's code_prefix(stack, job)
        {"Sid": "ReadStackSecretEnv", "Effect": "Allow", "Action": "ssm:GetParameter",
         "Resource": f"arn:aws:ssm:{region}:*:parameter{ssm_parameter_name(slug, '*')}"},
        # SecureStrings use the account's aws/ssm key through SSM only; a cap, not a grant.
        {"Sid": "DecryptSecretEnvThroughSsm", "Effect": "Allow", "Action": "kms:Decrypt", "Resource": "*",
         "Condition": {"StringEquals": {"kms:ViaService": f"ssm.{region}.amazonaws.com"}}},
        {"Sid": "ProtectSelfInPool", "Effect": "Allow", "Action": "autoscaling:SetInstanceProtection",
         "Resource": f"arn:aws:autoscaling:{region}:*:autoScalingGroup:*:autoScalingGroupName/{slug}-*"},
        {"Sid": "FindOwnGroup", "Effect": "Allow", "Action": "autoscaling:DescribeAutoScalingInstances", "Resource": "*"},
    ]}
