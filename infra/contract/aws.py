"""AWS rules (see ``infra.contract``). One ``@rule`` per rule the AWS APIs enforce on what spotctl
declares, each citing its source; checks get the pulumi-aws constructor inputs as plain Python.
Context rules (no types) are checked by the component that has both sides, through ``enforce``."""

from __future__ import annotations

import base64
import binascii
import re
from collections.abc import Mapping
from typing import Any

from infra.contract.aws_tags import MAX_TAGS, tag_problems, tags_50  # noqa: F401  (registers the tag rules)
from infra.contract.rulebook import UNKNOWN, dig, known, move_timeout_problem, rule

INSTANCE = "aws:ec2/instance:Instance"
LAUNCH_TEMPLATE = "aws:ec2/launchTemplate:LaunchTemplate"
VOLUME = "aws:ebs/volume:Volume"
SNAPSHOT = "aws:ebs/snapshot:Snapshot"
ATTACHMENT = "aws:ec2/volumeAttachment:VolumeAttachment"
SECURITY_GROUP = "aws:ec2/securityGroup:SecurityGroup"
ASG = "aws:autoscaling/group:Group"
BUCKET_SSE = "aws:s3/bucketServerSideEncryptionConfiguration:BucketServerSideEncryptionConfiguration"
ROLE = "aws:iam/role:Role"
INSTANCE_PROFILE = "aws:iam/instanceProfile:InstanceProfile"
EVENT_RULE = "aws:cloudwatch/eventRule:EventRule"

USER_DATA_LIMIT = 16 * 1024


@rule("aws.imdsv2-required", [INSTANCE, LAUNCH_TEMPLATE],
      says="spotctl requires IMDSv2 on every VM: metadata_options.http_tokens = 'required' (EC2's default is 'optional').",
      fix="build metadata_options with http_tokens='required' (infra/aws.py _metadata_options)",
      source="https://docs.aws.amazon.com/AWSEC2/latest/UserGuide/configuring-IMDS-new-instances.html")
def imdsv2(type_: str, props: Mapping[str, Any]) -> str | None:
    tokens = dig(props, "metadata_options.http_tokens")
    if not known(tokens):
        return None
    return None if tokens == "required" else f"metadata_options.http_tokens is {tokens!r}"


def _raw_user_data(type_: str, props: Mapping[str, Any]) -> bytes | Any | None:
    """The user data's raw bytes: LaunchTemplate.user_data and Instance.user_data_base64 are base64,
    Instance.user_data is text (pulumi-aws docstrings)."""
    if type_ == INSTANCE and props.get("user_data_base64") is None:
        text = props.get("user_data")
        return text if text is None or text is UNKNOWN else str(text).encode()
    value = props.get("user_data_base64" if type_ == INSTANCE else "user_data")
    if value is None or value is UNKNOWN:
        return value
    try:
        return base64.b64decode(str(value), validate=True)
    except (binascii.Error, ValueError):
        return b"\x00" * (USER_DATA_LIMIT + 1)  # not base64 at all: EC2 refuses it too


@rule("aws.user-data-16k", [INSTANCE, LAUNCH_TEMPLATE],
      says="EC2 user data is limited to 16 KB (16,384 bytes) in raw form, before base64 encoding.",
      fix="the script already travels gzip-compressed (infra/aws.py user_data_gzip_b64): shrink the stack values in it "
          "(make large env values Pulumi secrets, which reach the VM through SSM; put a long command in a script on the "
          "job disk); `spotctl validate` names the key that grew it",
      source="https://docs.aws.amazon.com/AWSEC2/latest/UserGuide/instancedata-add-user-data.html "
             "(\"User data is limited to 16 KB, in raw form, before it is base64-encoded\")")
def user_data_size(type_: str, props: Mapping[str, Any]) -> str | None:
    raw = _raw_user_data(type_, props)
    if raw is None or raw is UNKNOWN:
        return None
    return f"user data is {len(raw):,} bytes raw (limit {USER_DATA_LIMIT:,})" if len(raw) > USER_DATA_LIMIT else None


@rule("aws.instance-binary-user-data-base64", [INSTANCE],
      says="Instance.user_data is text: gzip-compressed user data must go through user_data_base64, or it is corrupted.",
      fix="pass base64(gzip(script)) as user_data_base64 (infra/aws.py user_data_gzip_b64)",
      source="pulumi_aws/ec2/instance.py user_data docstring (\"Do not pass gzip-compressed data via this argument; "
             "see user_data_base64 instead\")")
def binary_user_data(type_: str, props: Mapping[str, Any]) -> str | None:
    text = props.get("user_data")
    if text is None or text is UNKNOWN:
        return None
    return "user_data holds gzip data" if str(text).startswith("\x1f\x8b") else None


@rule("aws.no-stop-before-detach", [ATTACHMENT],
      says="Deleting a VolumeAttachment with stop_instance_before_detaching calls StopInstances first; EC2 refuses to "
           "stop a one-time spot instance (UnsupportedOperation), and an interrupted one is gone.",
      fix="skip_destroy=True: deleting the attachment only forgets it, terminating the instance detaches the volume",
      source="terraform-provider-aws internal/service/ec2/ebs_volume_attachment.go resourceVolumeAttachmentDelete; "
             "https://docs.aws.amazon.com/AWSEC2/latest/UserGuide/spot-requests.html#stopping-a-spot-instance "
             "(\"You can only stop a Spot Instance if the Spot Instance was launched from a persistent Spot Instance request\")")
def no_stop_before_detach(type_: str, props: Mapping[str, Any]) -> str | None:
    if props.get("stop_instance_before_detaching") is True:
        return "stop_instance_before_detaching is true"
    if props.get("force_detach") is True:
        return "force_detach is true (can lose data)"
    if props.get("skip_destroy") is not True and known(props.get("skip_destroy")):
        return "skip_destroy is not true (a real detach of a mounted volume hangs in 'busy')"
    return None


@rule("aws.spot-one-time-terminates", [INSTANCE],
      says="A one-time spot request can only be interrupted by termination: stop and hibernate need a persistent request.",
      fix="instance_interruption_behavior='terminate' with spot_instance_type='one-time'",
      source="https://docs.aws.amazon.com/AWSEC2/latest/UserGuide/interruption-behavior.html (\"The Spot Instance "
             "request type must be persistent\")")
def one_time_terminates(type_: str, props: Mapping[str, Any]) -> str | None:
    kind = dig(props, "instance_market_options.spot_options.spot_instance_type")
    behavior = dig(props, "instance_market_options.spot_options.instance_interruption_behavior")
    if kind in (None, "one-time") and behavior not in (None, "terminate", UNKNOWN) and dig(props, "instance_market_options.market_type") == "spot":
        return f"one-time spot with instance_interruption_behavior {behavior!r}"
    return None


@rule("aws.public-ip-only-on-new-interface", [INSTANCE],
      says="RunInstances assigns a public IPv4 address only to a new primary interface: on an existing one "
           "(primary_network_interface) associate_public_ip_address cannot apply, and the instance gets what the "
           "interface inherited from its subnet.",
      fix="leave associate_public_ip_address unset on an instance launched onto its own interface and give the "
          "interface an Elastic IP when a public address is asked for (infra/aws.py TrainingJob master_ip)",
      source="https://docs.aws.amazon.com/AWSEC2/latest/APIReference/API_InstanceNetworkInterfaceSpecification.html "
             "(AssociatePublicIpAddress: \"can only be assigned to a new network interface, not an existing one\"); "
             "https://docs.aws.amazon.com/AWSEC2/latest/UserGuide/using-eni.html (\"If you launch an instance and "
             "specify an existing network interface as the primary network interface, the public IPv4 address "
             "attribute is determined by this network interface\"); terraform-provider-aws internal/service/ec2/"
             "ec2_instance.go buildNetworkInterfaceOpts (associate_public_ip_address is sent only with subnet_id and "
             "dropped with a network interface, so the provider and a mock both accept it)")
def public_ip_only_on_new_interface(type_: str, props: Mapping[str, Any]) -> str | None:
    if dig(props, "primary_network_interface.network_interface_id") is None:
        return None
    asked = props.get("associate_public_ip_address")
    return None if asked is None or asked is UNKNOWN else f"associate_public_ip_address is {asked!r} on an existing interface"


GP3_IOPS = (3000, 80000)
GP3_THROUGHPUT = (125, 2000)


@rule("aws.gp3-performance", [VOLUME],
      says="gp3: 3,000-80,000 IOPS and 125-2,000 MiB/s; at most 500 IOPS per GiB and 0.25 MiB/s per provisioned IOPS.",
      fix="lower spotctl:jobs[].diskIops/diskThroughput or raise diskGb (defaults: infra/aws.py gp3_performance)",
      source="botocore ec2 CreateVolume Iops/Throughput (\"gp3: 3,000 - 80,000 IOPS\", \"Valid Range: 125 - 2000 MiB/s\"); "
             "ratios: https://docs.aws.amazon.com/ebs/latest/userguide/general-purpose.html#gp3-ebs-volume-type "
             "(2023 text; not re-checked against the new maxima)")
def gp3_performance(type_: str, props: Mapping[str, Any]) -> str | None:
    iops, throughput, size = props.get("iops"), props.get("throughput"), props.get("size")
    if props.get("type") != "gp3" or not known(iops, throughput, size):
        return None
    if iops is not None and not GP3_IOPS[0] <= iops <= GP3_IOPS[1]:
        return f"iops {iops} outside {GP3_IOPS[0]:,}-{GP3_IOPS[1]:,}"
    if throughput is not None and not GP3_THROUGHPUT[0] <= throughput <= GP3_THROUGHPUT[1]:
        return f"throughput {throughput} MiB/s outside {GP3_THROUGHPUT[0]}-{GP3_THROUGHPUT[1]}"
    if iops is not None and size is not None and iops > 500 * size:
        return f"iops {iops} > 500 per GiB of a {size} GiB volume"
    if throughput is not None and throughput > 0.25 * (iops or GP3_IOPS[0]):
        return f"throughput {throughput} MiB/s > 0.25 MiB/s per IOPS ({iops or GP3_IOPS[0]} IOPS)"
    return None


@rule("aws.security-group-no-inline-rules", [SECURITY_GROUP],
      says="A security group with inline ingress/egress next to separate rule resources gets its rules overwritten.",
      fix="declare the group without ingress/egress and add vpc.SecurityGroupIngressRule/EgressRule resources",
      source="pulumi_aws/ec2/security_group.py docstring (\"You should not use the ec2.SecurityGroup resource with "
             "in-line rules ... in conjunction with the vpc.SecurityGroupEgressRule and vpc.SecurityGroupIngressRule\")")
def no_inline_rules(type_: str, props: Mapping[str, Any]) -> str | None:
    inline = [k for k in ("ingress", "egress") if props.get(k)]
    return f"inline {', '.join(inline)}" if inline else None


@rule("aws.bucket-key-needs-kms", [BUCKET_SSE],
      says="S3 Bucket Keys only apply to SSE-KMS; with SSE-S3 (AES256) bucket_key_enabled does nothing.",
      fix="drop bucket_key_enabled, or use sse_algorithm 'aws:kms'",
      source="https://docs.aws.amazon.com/AmazonS3/latest/userguide/bucket-key.html")
def bucket_key(type_: str, props: Mapping[str, Any]) -> str | None:
    for i, r in enumerate(props.get("rules") or []):
        if isinstance(r, Mapping) and r.get("bucket_key_enabled") is True and \
                dig(r, "apply_server_side_encryption_by_default.sse_algorithm") == "AES256":
            return f"rules[{i}]: bucket_key_enabled with AES256"
    return None


@rule("aws.asg-no-capacity-wait", [ASG],
      says="spotctl never lets `pulumi up` wait for ASG capacity: by default the provider waits 10 min for min_size "
           "healthy instances and fails when spot or GPU quota is short.",
      fix="wait_for_capacity_timeout='0' (watch capacity with spotctl status / the ASG activity history)",
      source="https://registry.terraform.io/providers/hashicorp/aws/latest/docs/resources/autoscaling_group#waiting-for-capacity "
             "(\"Setting wait_for_capacity_timeout to \\\"0\\\" disables ASG Capacity waiting\")")
def asg_no_wait(type_: str, props: Mapping[str, Any]) -> str | None:
    timeout = props.get("wait_for_capacity_timeout")
    if not known(timeout):
        return None
    return None if timeout == "0" else f"wait_for_capacity_timeout is {timeout!r} (default '10m')"


IAM_NAME_PREFIX = {ROLE: 38, INSTANCE_PROFILE: 102}


@rule("aws.iam-name-prefix-length", [ROLE, INSTANCE_PROFILE],
      says="IAM role names are <= 64 characters and instance profile names <= 128; the provider appends a 26-character "
           "suffix to name_prefix, so prefixes are <= 38 (role) and <= 102 (profile).",
      fix="shorten the name_prefix (infra/aws.py _instance_profile)",
      source="terraform-provider-aws internal/service/iam/role.go roleNamePrefixMaxLen; instance_profile.go; "
             "https://docs.aws.amazon.com/IAM/latest/UserGuide/reference_iam-quotas.html")
def iam_prefix(type_: str, props: Mapping[str, Any]) -> str | None:
    prefix = props.get("name_prefix")
    if not isinstance(prefix, str):
        return None
    limit = IAM_NAME_PREFIX[type_]
    return f"name_prefix {prefix!r} is {len(prefix)} characters (limit {limit})" if len(prefix) > limit else None


@rule("aws.event-pattern-4096", [EVENT_RULE],
      says="An EventBridge event pattern is at most 4,096 characters.",
      fix="match fewer instance ids per rule",
      source="https://docs.aws.amazon.com/eventbridge/latest/APIReference/API_PutRule.html (EventPattern: "
             "\"Maximum length of 4096\"; botocore events PutRule max 4096)")
def event_pattern(type_: str, props: Mapping[str, Any]) -> str | None:
    pattern = props.get("event_pattern")
    if not isinstance(pattern, str):
        return None
    return f"event_pattern is {len(pattern):,} characters" if len(pattern) > 4096 else None


SCALING_POLICY = "aws:autoscaling/policy:Policy"
STEP_DOC = "https://docs.aws.amazon.com/autoscaling/ec2/APIReference/API_StepAdjustment.html"
MAX_STEP_ADJUSTMENTS = 20


def _bound(value: Any) -> float | None:
    return None if value in (None, "") else float(value)


@rule("aws.step-adjustments", [SCALING_POLICY],
      says="Step adjustments must not overlap or leave a gap; at most one has no lower and at most one no upper "
           "bound, never both in one step; with ExactCapacity every adjustment is non-negative.",
      fix="build the steps with infra.common.demand_steps (contiguous from 0, one open-ended last step)",
      source=STEP_DOC + " (\"The ranges of your step adjustments can't overlap or have a gap.\" ... \"For exact "
             "capacity, you must specify a non-negative value.\")")
def step_adjustments(type_: str, props: Mapping[str, Any]) -> str | None:
    steps = props.get("step_adjustments")
    if props.get("policy_type") != "StepScaling" or not isinstance(steps, list) or not known(*steps):
        return None
    spans = []
    for s in steps:
        lower, upper = dig(s, "metric_interval_lower_bound"), dig(s, "metric_interval_upper_bound")
        adjustment = dig(s, "scaling_adjustment")
        if not known(lower, upper, adjustment):
            return None
        lower, upper = _bound(lower), _bound(upper)
        if lower is None and upper is None:
            return "a step has neither a lower nor an upper bound"
        if props.get("adjustment_type") == "ExactCapacity" and adjustment is not None and adjustment < 0:
            return f"ExactCapacity step with a negative adjustment {adjustment}"
        spans.append((float("-inf") if lower is None else lower, float("inf") if upper is None else upper))
    if sum(1 for lo, _ in spans if lo == float("-inf")) > 1 or sum(1 for _, hi in spans if hi == float("inf")) > 1:
        return "more than one step without a lower (or upper) bound"
    spans.sort()
    for (_, hi1), (lo2, _) in zip(spans, spans[1:], strict=False):
        if hi1 != lo2:
            return f"steps {'overlap' if hi1 > lo2 else 'leave a gap'} between {hi1:g} and {lo2:g}"
    if any(lo >= hi for lo, hi in spans):
        return "a step's upper bound is not above its lower bound"
    return None


@rule("aws.step-adjustments-max-20", [SCALING_POLICY],
      says=f"A step scaling policy has at most {MAX_STEP_ADJUSTMENTS} step adjustments (a fixed Auto Scaling quota).",
      fix="let infra.common.demand_steps coarsen the steps (it never gives more than 20)",
      source="https://docs.aws.amazon.com/autoscaling/ec2/userguide/ec2-auto-scaling-quotas.html "
             "(\"Step adjustments per step scaling policy 20\")")
def step_count(type_: str, props: Mapping[str, Any]) -> str | None:
    steps = props.get("step_adjustments")
    if isinstance(steps, list) and len(steps) > MAX_STEP_ADJUSTMENTS:
        return f"{len(steps)} step adjustments"
    return None


@rule("aws.step-scaling-needs-adjustment-type", [SCALING_POLICY],
      says="AdjustmentType and StepAdjustments are required when the policy type is StepScaling.",
      fix="give adjustment_type (ExactCapacity) and step_adjustments",
      source="botocore autoscaling service-2.json PutScalingPolicyType.AdjustmentType / .StepAdjustments (\"Required if "
             "the policy type is StepScaling\"); https://docs.aws.amazon.com/autoscaling/ec2/APIReference/API_PutScalingPolicy.html")
def step_needs_type(type_: str, props: Mapping[str, Any]) -> str | None:
    if props.get("policy_type") != "StepScaling":
        return None
    missing = [k for k in ("adjustment_type", "step_adjustments") if not props.get(k)]
    return f"StepScaling without {', '.join(missing)}" if missing else None


# ---- context rules: checked by the component that has both sides (infra/aws.py) -------------------

rule("aws.root-volume-covers-snapshot", [],
     says="A root volume must be at least as large as the AMI's root snapshot (InvalidBlockDeviceMapping otherwise).",
     fix="size the root volume from the image (infra/aws.py root_volume_gb) or raise diskGb",
     source="https://docs.aws.amazon.com/AWSEC2/latest/APIReference/API_EbsBlockDevice.html VolumeSize (\"You can specify a volume size that is equal to or larger than "
            "the snapshot size\")",
     lookup="the image's root snapshot size (ec2:DescribeImages)")(None)

rule("aws.subnets-one-vpc", [],
     says="A security group can be associated only with resources in its own VPC: every subnet (and the NAT subnet) "
          "must be in one VPC.",
     fix="set spotctl:network.subnets to subnets of one VPC, one per zone",
     source="https://docs.aws.amazon.com/vpc/latest/userguide/vpc-security-groups.html (\"You can associate a "
            "security group only with resources in the VPC for which it is created\")",
     lookup="each subnet's VPC (ec2:DescribeSubnets)")(None)

rule("aws.subnet-in-its-zone", [],
     says="An instance's subnet must be in the instance's availability zone (a subnet lives in one zone).",
     fix="map each zone of spotctl:zones to a subnet of that zone",
     source="https://docs.aws.amazon.com/autoscaling/ec2/APIReference/API_CreateAutoScalingGroup.html VPCZoneIdentifier (\"the subnets ... must reside in those "
            "Availability Zones\")",
     lookup="each subnet's zone (ec2:DescribeSubnets)")(None)

rule("aws.default-vpc-or-subnets", [],
     says="Without configured subnets spotctl uses the default VPC's default subnets, which a region may not have "
          "(get_subnet default_for_az finds none).",
     fix="set spotctl:network.subnets (one subnet per zone of one VPC)",
     source="terraform-provider-aws internal/service/ec2 subnet data source (\"no matching EC2 Subnet found\"); "
            "https://docs.aws.amazon.com/vpc/latest/userguide/default-vpc.html",
     lookup="whether the region has a default VPC (ec2:DescribeVpcs)")(None)

rule("aws.endpoint-names-need-vpc-dns", [],
     says="spotctl's SSM and Auto Scaling interface endpoints (egress 's3-endpoint') are called by their own "
          "DNS names, which the VMs, without a way to the internet, resolve through the VPC's Amazon-provided DNS "
          "server: the VPC needs enableDnsSupport on. Not enableDnsHostnames: the endpoints have no private DNS "
          "(that alone needs both: CreateVpcEndpointRequest.PrivateDnsEnabled).",
     fix="turn it on for the subnets' VPC (aws ec2 modify-vpc-attribute --enable-dns-support), or set "
         "spotctl:network.egress to 'nat', 'public-ip' or 'existing'",
     source="botocore ec2 service-2.json ModifyVpcAttributeRequest.EnableDnsSupport (\"If enabled, queries to the "
            "Amazon provided DNS server at the 169.254.169.253 IP address ... succeed. If disabled, the Amazon provided "
            "DNS service in the VPC that resolves public DNS hostnames to IP addresses is not enabled\"); "
            "CreateVpcEndpointRequest.PrivateDnsEnabled (\"To use a private hosted zone, you must set the following VPC "
            "attributes to true: enableDnsHostnames and enableDnsSupport\"); "
            "https://docs.aws.amazon.com/AWSEC2/latest/APIReference/API_ModifyVpcAttribute.html",
     lookup="the VPC's enableDnsSupport (ec2:DescribeVpcAttribute)")(None)

VPC_ENDPOINT = "aws:ec2/vpcEndpoint:VpcEndpoint"


@rule("aws.interface-endpoint-private-dns-per-vpc", [VPC_ENDPOINT],
      says="A VPC takes one interface endpoint with private DNS per AWS service: a second one (another stack's "
           "in the same VPC) fails, and the first takes over that API's public name for every VM of the VPC.",
      fix="private_dns_enabled=False, and call the endpoint by its own DNS name (infra/aws.py regional_dns_name)",
      source="https://github.com/hashicorp/terraform-provider-aws/issues/17535 (\"InvalidParameter: private-dns-enabled cannot be set because "
             "there is already a conflicting DNS domain for elasticloadbalancing.us-east-1.amazonaws.com in the VPC\"); "
             "botocore ec2 CreateVpcEndpointRequest.PrivateDnsEnabled (\"associate a private hosted zone with the "
             "specified VPC\")")
def interface_endpoint_private_dns(type_: str, props: Mapping[str, Any]) -> str | None:
    # Explicitly False: left out, pulumi-aws documents false ("Defaults to `false`"), but terraform-provider-aws
    # issue #37783 reports v5.52 "setting the attribute private_dns_enabled to true during creation".
    dns = props.get("private_dns_enabled")
    if props.get("vpc_endpoint_type") != "Interface" or dns is False or not known(dns):
        return None
    return f"interface endpoint of {props.get('service_name')} has private_dns_enabled {dns!r}"


CREATE_VOLUME_DOC = ("botocore ec2 service-2.json CreateVolume / CreateVolumeRequest.Encrypted "
                     "(https://docs.aws.amazon.com/AWSEC2/latest/APIReference/API_CreateVolume.html)")


rule("aws.volume-az-bound", (),
     says="An EBS volume attaches only to an instance in its own Availability Zone; a snapshot is regional, so "
          "moving a job's data to another AZ means a snapshot and a new volume restored from it in that AZ.",
     fix="spotctl move JOB --to-zone AZ (snapshot, restore in the new AZ, start there, release the old volume)",
     source=CREATE_VOLUME_DOC + ": \"Creates an EBS volume that can be attached to an instance in the same "
            "Availability Zone.\" ... \"You can create a new empty volume or restore a volume from an EBS snapshot.\"")(None)


@rule("aws.move-create-timeout", [SNAPSHOT, VOLUME],
      says="A move's EBS snapshot, and a volume restored from one, must be given hours to be created: the provider "
           "waits 10 minutes for the snapshot to be `completed` (5 for a volume to be `available`) by default, then "
           "fails the update while the snapshot keeps being made.",
      fix="declare it with pulumi.ResourceOptions(custom_timeouts=pulumi.CustomTimeouts(create=infra.common.MOVE_CREATE_TIMEOUT))",
      source="hashicorp/terraform-provider-aws internal/service/ec2/ebs_snapshot.go @011a8eed (Timeouts Create: "
             "schema.DefaultTimeout(10 * time.Minute); ec2.NewSnapshotCompletedWaiter ... d.Timeout(schema.TimeoutCreate)); "
             "internal/service/ec2/ebs_volume.go @0073593e (Create 5 min, waitVolumeCreated); Pulumi customTimeouts: "
             "https://www.pulumi.com/docs/iac/concepts/options/customtimeouts/")
def move_create_timeout(type_: str, props: Mapping[str, Any]) -> str | None:
    if type_ == SNAPSHOT:
        return move_timeout_problem(props, "a move's snapshot")
    if props.get("snapshot_id") is None:  # an empty volume: not a move's
        return None
    return move_timeout_problem(props, "a volume restored from a move's snapshot")


@rule("aws.restored-volume-encrypted", [VOLUME],
      says="A volume restored from a snapshot of an encrypted volume is encrypted: there is no way to create an "
           "unencrypted volume from an encrypted snapshot (spotctl's job volumes are all encrypted).",
      fix="declare the restored volume with encrypted=True (infra/aws.py TrainingJob._job_volumes)",
      source=CREATE_VOLUME_DOC + ": \"Volumes that are created from encrypted snapshots are automatically encrypted. "
             "There is no way to create an encrypted volume from an unencrypted snapshot or vice versa.\"")
def restored_volume_encrypted(type_: str, props: Mapping[str, Any]) -> str | None:
    snapshot, encrypted = props.get("snapshot_id"), props.get("encrypted")
    if not snapshot or not known(encrypted):
        return None
    return None if encrypted is True else f"restored from {snapshot} with encrypted={encrypted!r}"


SSM_PARAMETER = "aws:ssm/parameter:Parameter"
SSM_PUT_PARAMETER_DOC = "https://docs.aws.amazon.com/systems-manager/latest/APIReference/API_PutParameter.html"
SSM_NAME_RE = re.compile(r"[a-zA-Z0-9_.\-/]+")
# "The maximum length for a parameter name that you create is 1011 characters", counting the ARN
# part before the name (arn:aws:ssm:<region>:<12-digit account>:parameter); region at most ~20.
SSM_ARN_PREFIX_MAX = len("arn:aws:ssm:ap-southeast-5:123456789012:parameter")


@rule("aws.ssm-parameter-name", [SSM_PARAMETER],
      says="An SSM parameter name uses only a-zA-Z0-9_.- and / (hierarchy), at most 15 levels, does not begin "
           "with 'aws' or 'ssm' (case-insensitive), and is at most 1011 characters including the ARN before it.",
      fix="name job secrets through infra/naming.py ssm_parameter_name (/spotctl/<stack slug>/<job id>/env)",
      source=SSM_PUT_PARAMETER_DOC + " (Name: \"Naming Constraints\"; \"The maximum length for a parameter name "
             "that you create is 1011 characters\")")
def ssm_name_rule(type_: str, props: Mapping[str, Any]) -> str | None:
    name = props.get("name")
    if not isinstance(name, str):
        return None
    if not SSM_NAME_RE.fullmatch(name):
        return f"name {name!r} has characters other than a-zA-Z0-9_.-/"
    if name.lstrip("/").lower().startswith(("aws", "ssm")):
        return f"name {name!r} begins with 'aws' or 'ssm'"
    if name.strip("/").count("/") + 1 > 15:
        return f"name {name!r} is deeper than 15 levels"
    if len(name) + SSM_ARN_PREFIX_MAX > 1011:
        return f"name is {len(name)} characters: too long with its ARN"
    return None


@rule("aws.ssm-parameter-value", [SSM_PARAMETER],
      says="A Standard-tier SSM parameter value holds at most 4096 characters, an Advanced one 8192.",
      fix="keep a job's secret env values under 8 KB in all (base64 makes them 4/3 longer); spotctl picks Advanced "
          "above 4096 characters (infra/aws.py TrainingJob._env_secret)",
      source="https://docs.aws.amazon.com/systems-manager/latest/userguide/parameter-store-advanced-parameters.html; "
             "the API's ValidationException: \"Standard tier parameters support a maximum parameter value of 4096 "
             "characters\"")
def ssm_value_rule(type_: str, props: Mapping[str, Any]) -> str | None:
    value, tier = props.get("value"), props.get("tier") or "Standard"
    if not isinstance(value, str) or not known(tier):
        return None
    limit = 8192 if tier == "Advanced" else 4096
    # Never the value itself in the message: it is a secret.
    return f"the value is {len(value)} characters; tier {tier} holds {limit}" if len(value) > limit else None


ROLE_POLICY = "aws:iam/rolePolicy:RolePolicy"
ROLE_POLICY_LIMIT = 10_240


@rule("aws.role-inline-policy-10240", [ROLE_POLICY],
      says="The inline policies of one IAM role total at most 10,240 characters (white space not counted).",
      fix="split the statements over a managed policy, or shorten the resource lists (infra/aws_watcher.py watcher_policy)",
      source="https://docs.aws.amazon.com/IAM/latest/UserGuide/reference_iam-quotas.html (\"Role policy size cannot "
             "exceed 10,240 characters.\" ... \"IAM does not count white space when calculating the size of a policy\")")
def role_policy_size(type_: str, props: Mapping[str, Any]) -> str | None:
    policy = props.get("policy")
    if not isinstance(policy, str):
        return None
    size = sum(1 for c in policy if not c.isspace())
    return f"the policy is {size:,} characters without white space" if size > ROLE_POLICY_LIMIT else None


rule("aws.passrole-covers-job-roles", [],
     says="Launching an instance with an instance profile needs iam:PassRole on the profile's role: the watcher's "
          "PassRole statement must match every job role of the stack (and not its own role).",
     fix="keep infra/aws_common.py job_role_naming and infra/aws_watcher.py _job_roles in step",
     source="https://docs.aws.amazon.com/AWSEC2/latest/UserGuide/permission-to-pass-iam-roles.html (\"must have "
            "specific permissions to launch an Amazon EC2 instance with an IAM role\": iam:PassRole; \"specify the ARNs "
            "of specific IAM roles with iam:PassRole\")")(None)


BOUNDARY_ARN = re.compile(r"^arn:aws[a-z-]*:iam::\d{12}:policy/spotctl/spotctl-(?P<slug>[a-z0-9-]+)-boundary$")
JOB_ROLE_PREFIX = re.compile(r"^spotctl-(?P<slug>[a-z0-9-]+)-$")
WATCHER_ROLE_PATH = "/spotctl-watcher/"  # infra/aws_watcher.py WATCHER_PATH: created by `pulumi up` only


@rule("aws.role-permissions-boundary", [ROLE],
      says="Every job and pool role carries its stack's permissions boundary (policy /spotctl/spotctl-<slug>-boundary): "
           "the watcher may create a role, or put or delete its inline policies, only when iam:PermissionsBoundary "
           "names that policy, so a role without it is refused to the watcher's targeted updates and could "
           "carry more than the boundary allows.",
      fix="create job and pool roles through infra/aws.py _instance_profile (permissions_boundary=base.boundary.arn)",
      source="https://docs.aws.amazon.com/service-authorization/latest/reference/list_awsidentityandaccessmanagementiam.html "
             "(iam:PermissionsBoundary on CreateRole, PutRolePolicy, DeleteRolePolicy, PutRolePermissionsBoundary); "
             "https://docs.aws.amazon.com/IAM/latest/UserGuide/access_policies_boundaries.html (\"CreateOrChangeOnlyWithBoundary\")")
def role_permissions_boundary(type_: str, props: Mapping[str, Any]) -> str | None:
    path, prefix, boundary = props.get("path"), props.get("name_prefix"), props.get("permissions_boundary")
    if not known(path, prefix, boundary) or path == WATCHER_ROLE_PATH:
        return None
    if not boundary:
        return "no permissions_boundary"
    m, own = BOUNDARY_ARN.match(str(boundary)), JOB_ROLE_PREFIX.match(str(prefix or ""))
    if m is None:
        return f"permissions_boundary {boundary!r} is not a spotctl stack boundary (policy/spotctl/spotctl-<slug>-boundary)"
    if own is not None and own["slug"] != m["slug"]:
        return f"permissions_boundary {boundary!r} is another stack's (role prefix {prefix!r})"
    return None

