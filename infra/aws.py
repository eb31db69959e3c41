"""AWS components: the stack's shared pieces, GPU pools (ASG mixed-instances: on-demand base + spot)
and training jobs whose encrypted EBS volumes outlive every instance (see README, "What an AWS stack declares").

Every resource and invoke goes through one explicit ``aws.Provider`` built from ``spotctl:region``
(``aws:region`` is never read). The rules AWS enforces on these inputs are in ``infra/contract/aws.py``.
Longer than 420 lines because one cloud's whole declaration lives here, parallel to ``infra/gcp.py``:
the three components and the helpers only they use (image, subnets, egress, per-job identities).
"""

from __future__ import annotations

import base64
import gzip
import json
from dataclasses import dataclass

import pulumi
import pulumi_aws as aws

from agent.schema import AGENT_PREFIX
from infra import contract
from infra.agent_object import aws_agent_object, aws_read_statements
from infra.aws_scaling import demand_scaling, mixed_group, protect_policy
from infra.common import (
    BOOT_DISK_GB,
    MOVE_CREATE_TIMEOUT,
    JobPlan,
    StackArgs,
    declare_components,
    job_outputs,
    job_script_context,
    pool_parts,
    pool_script_context,
)
from infra.config import Job, Pool, StackConfig
from infra.naming import aws_tags, event_root, ssm_parameter_name
from infra.render import event_object_prefix, scripts_for

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


class StackBase(pulumi.ComponentResource):
    """Per stack: event bucket (TLS only), the security group, the network's egress (S3 gateway
    endpoint; NAT when asked) and the SQS queue that the jobs' EventBridge rules feed."""

    def __init__(self, name: str, args: StackArgs, opts=None):
        super().__init__("spotctl:aws:StackBase", name, None, opts)
        cfg = args.cfg
        child = pulumi.ResourceOptions(parent=self)
        self.invoke = pulumi.InvokeOptions(parent=self)  # invokes inherit the provider only through parent
        tags = aws_tags(args.stack, cfg.labels)
        self.subnets = _subnets(cfg, self.invoke, name)
        vpc_id = next(iter(self.subnets.values())).vpc_id

        self.bucket = aws.s3.Bucket(f"{name}-events", bucket_prefix=f"spotctl-{args.slug}-events-", force_destroy=False, tags=tags, opts=child)
        self.agent = aws_agent_object(name, self.bucket, tags, self)
        self.boundary = aws.iam.Policy(
            f"{name}-boundary",
            name=boundary_name(args.slug),
            path="/spotctl/",
            description=f"spotctl {args.stack}: the most any job or pool role may do (permissions boundary)",
            policy=self.bucket.arn.apply(lambda arn: json.dumps(boundary_document(args.stack, args.slug, cfg.region, arn))),
            tags=tags,
            opts=child,
        )
        public_block = aws.s3.BucketPublicAccessBlock(
            f"{name}-events-public-access",
            bucket=self.bucket.id,
            block_public_acls=True,
            block_public_policy=True,
            ignore_public_acls=True,
            restrict_public_buckets=True,
            opts=child,
        )
        aws.s3.BucketPolicy(
            f"{name}-events-tls-only",
            bucket=self.bucket.id,
            policy=self.bucket.arn.apply(_tls_only_policy),
            opts=pulumi.ResourceOptions(parent=self, depends_on=[public_block]),
        )
        aws.s3.BucketOwnershipControls(
            f"{name}-events-ownership",
            bucket=self.bucket.id,
            rule=aws.s3.BucketOwnershipControlsRuleArgs(object_ownership="BucketOwnerEnforced"),
            opts=child,
        )
        aws.s3.BucketServerSideEncryptionConfiguration(
            f"{name}-events-encryption",
            bucket=self.bucket.id,
            rules=[
                aws.s3.BucketServerSideEncryptionConfigurationRuleArgs(
                    # SSE-S3. No bucket_key_enabled: S3 Bucket Keys exist only for SSE-KMS.
                    apply_server_side_encryption_by_default=aws.s3.BucketServerSideEncryptionConfigurationRuleApplyServerSideEncryptionByDefaultArgs(
                        sse_algorithm="AES256"
                    ),
                )
            ],
            opts=child,
        )
        aws.s3.BucketLifecycleConfiguration(
            f"{name}-events-lifecycle",
            bucket=self.bucket.id,
            rules=[
                aws.s3.BucketLifecycleConfigurationRuleArgs(
                    id="expire-events",
                    status="Enabled",
                    # Events and logs only (<stack>/...): the shared stack file beside them never expires
                    # (a rule's Filter.Prefix: docs.aws.amazon.com/AmazonS3/latest/userguide/intro-lifecycle-rules.html).
                    filter=aws.s3.BucketLifecycleConfigurationRuleFilterArgs(prefix=event_root(args.stack)),
                    expiration=aws.s3.BucketLifecycleConfigurationRuleExpirationArgs(days=cfg.event_retention_days),
                )
            ],
            opts=child,
        )

        # No inline rules: mixed with separate rule resources the provider keeps overwriting them.
        self.security_group = aws.ec2.SecurityGroup(
            f"{name}-nodes-sg",
            description=f"spotctl {args.stack}: egress, and node-to-node traffic of multi-node jobs",
            vpc_id=vpc_id,
            tags=tags,
            opts=child,
        )
        aws.vpc.SecurityGroupEgressRule(
            f"{name}-nodes-sg-egress",
            security_group_id=self.security_group.id,
            ip_protocol="-1",
            cidr_ipv4="0.0.0.0/0",
            description="outbound: event uploads, datasets, packages",
            tags=tags,
            opts=child,
        )
        aws.vpc.SecurityGroupIngressRule(
            f"{name}-nodes-sg-self",
            security_group_id=self.security_group.id,
            referenced_security_group_id=self.security_group.id,
            ip_protocol="-1",
            description="nodes of one stack talk to each other (NCCL, rendezvous)",
            tags=tags,
            opts=child,
        )
        self.egress = cfg.network.egress or "s3-endpoint"
        self.egress_routes: list[pulumi.Resource] = []  # what a VM needing the NAT waits for (the watcher)
        self.api_urls: dict[str, pulumi.Output[str]] = {}  # service -> its interface endpoint's URL (s3-endpoint)
        self._declare_egress(name, args, vpc_id, tags, child)

        self.queue = aws.sqs.Queue(
            f"{name}-interruptions",
            name_prefix=f"spotctl-{args.slug}-interruptions-"[:75],
            message_retention_seconds=4 * 24 * 3600,
            sqs_managed_sse_enabled=True,
            tags=tags,
            opts=child,
        )
        # Only this stack's job rules (named by rule_name) may send to the queue.
        rules_arn = f"arn:aws:events:{cfg.region}:*:rule/{rule_name(args.slug, '')}*"
        aws.sqs.QueuePolicy(
            f"{name}-interruptions-policy",
            queue_url=self.queue.url,
            policy=self.queue.arn.apply(
                lambda arn: json.dumps(
                    {
                        "Version": "2012-10-17",
                        "Statement": [
                            {
                                "Effect": "Allow",
                                "Principal": {"Service": "events.amazonaws.com"},
                                "Action": "sqs:SendMessage",
                                "Resource": arn,
                                "Condition": {"ArnLike": {"aws:SourceArn": rules_arn}},
                            }
                        ],
                    }
                )
            ),
            opts=child,
        )
        self.register_outputs({"eventBucket": self.bucket.bucket, "interruptionQueue": self.queue.url})

    def _declare_egress(self, name: str, args: StackArgs, vpc_id: str, tags, child) -> None:
        """The network's way out (config.AWS_EGRESS): a free S3 gateway endpoint on the route tables of
        the stack's subnets unless ``existing`` (or ``network.s3Endpoint`` 'existing'); for ``nat`` also a
        NAT gateway and a route table for the VMs' subnets, the only one the S3 endpoint goes on;
        for ``s3-endpoint`` with job secrets also an SSM interface endpoint, with pools an Auto Scaling one."""
        cfg = args.cfg
        if self.egress == "existing":
            return
        route_tables: list = []
        if self.egress == "nat":
            public = aws.ec2.get_subnet(id=cfg.network.nat_subnet, opts=self.invoke)
            contract.enforce("aws.subnets-one-vpc", f"{name} spotctl:network.natSubnet",
                             None if public.vpc_id == vpc_id else f"{public.id} is in {public.vpc_id}, the VMs' subnets in {vpc_id}")
            eip = aws.ec2.Eip(f"{name}-nat-ip", domain="vpc", tags=tags, opts=child)
            nat = aws.ec2.NatGateway(f"{name}-nat", subnet_id=public.id, allocation_id=eip.allocation_id, tags=tags, opts=child)
            private = aws.ec2.RouteTable(
                f"{name}-private-routes", vpc_id=vpc_id,
                routes=[aws.ec2.RouteTableRouteArgs(cidr_block="0.0.0.0/0", nat_gateway_id=nat.id)], tags=tags, opts=child,
            )
            for zone, subnet in self.subnets.items():
                self.egress_routes.append(aws.ec2.RouteTableAssociation(
                    f"{name}-private-routes-{zone}", subnet_id=subnet.id, route_table_id=private.id, opts=child))
            route_tables.append(private.id)  # the subnets' only table: their former one is left alone
        elif (cfg.network.s3_endpoint or "own") == "own":
            route_tables = self._subnet_route_tables(vpc_id)
        if route_tables:
            # Only the tables this stack's subnets use: a route table takes one gateway-endpoint route per
            # service, so CreateVpcEndpoint on a table another endpoint for S3 already routes fails
            # ("route table rtb-... already has a route with destination-prefix-list-id pl-...",
            # RouteAlreadyExists: eksctl-io/eksctl issues #2473, #2510, #4377, a second cluster or an
            # existing endpoint in the same VPC). Every table of the VPC, as before, also took in other
            # stacks' tables (and, on a later `up`, their NAT's new private one). A VPC whose tables
            # already route S3 sets network.s3Endpoint 'existing' (config.AWS_S3_ENDPOINT).
            aws.ec2.VpcEndpoint(
                f"{name}-s3-endpoint",
                vpc_id=vpc_id,
                service_name=f"com.amazonaws.{cfg.region}.s3",
                vpc_endpoint_type="Gateway",
                route_table_ids=route_tables,
                tags=tags,
                opts=child,
            )
        if self.egress != "s3-endpoint":
            return  # NAT and public-ip egress reach every AWS API as they are
        # The S3 gateway endpoint reaches S3 only. Jobs' secret env values are in SSM; pool VMs
        # protect themselves from scale-in through the Auto Scaling API (templates/common/lib.sh.j2
        # spotctl_protect; interface endpoint com.amazonaws.<region>.autoscaling:
        # https://docs.aws.amazon.com/autoscaling/ec2/userguide/ec2-auto-scaling-vpc-endpoints.html).
        services = [s for s, wanted in (("ssm", any(job.secret_keys for job in cfg.jobs)), ("autoscaling", bool(cfg.pools)))
                    if wanted]
        if not services:
            return
        # The scripts resolve the endpoints' own names (regional_dns_name) through the VPC's Amazon-provided
        # DNS server: configured subnets may be in a VPC without it (a default VPC has it), refused here.
        vpc = aws.ec2.get_vpc(id=vpc_id, opts=self.invoke)
        contract.enforce("aws.endpoint-names-need-vpc-dns", f"{name} spotctl:network.subnets",
                         None if vpc.enable_dns_support else f"{vpc_id} has enableDnsSupport off")
        for service in services:
            self._interface_endpoint(name, cfg, service, vpc_id, tags, child)

    def _subnet_route_tables(self, vpc_id: str) -> list[str]:
        """The route table each of this stack's subnets uses: the one explicitly associated with it, else
        the VPC's main table, which a subnet without an explicit association uses (Amazon VPC User Guide,
        "Route tables", main route table). DescribeRouteTables' ``association.subnet-id`` filter finds
        explicit associations only: the singular ``aws_route_table`` data source with ``subnet_id`` is that filter and fails on
        no match ("query returned no results"), while ``aws_route_tables`` lists what matches, possibly
        nothing (terraform-provider-aws internal/service/ec2/vpc_route_table_data_source.go,
        vpc_route_tables_data_source.go); hence the plural one, then ``association.main``."""
        def tables(filter_name: str, value: str) -> list[str]:
            return list(aws.ec2.get_route_tables(
                vpc_id=vpc_id, filters=[aws.ec2.GetRouteTablesFilterArgs(name=filter_name, values=[value])],
                opts=self.invoke).ids)

        found: set[str] = set()
        for subnet in self.subnets.values():
            found.update(tables("association.subnet-id", subnet.id) or tables("association.main", "true"))
        return sorted(found)

    def _interface_endpoint(self, name: str, cfg: StackConfig, service: str, vpc_id: str, tags, child) -> None:
        """An interface endpoint of an AWS API, in the VMs' subnets (one per zone) and the nodes' security
        group, whose self rule admits the VMs' HTTPS; its URL for the scripts in ``self.api_urls``.

        Private DNS off: with it on, AWS puts the API's public name (``autoscaling.<region>.amazonaws.com``)
        in a private hosted zone of the whole VPC, and a VPC takes one such zone per name, so a second
        stack's endpoint in the same VPC failed ("private-dns-enabled cannot be set because there is
        already a conflicting DNS domain for ... in the VPC", terraform-provider-aws issue #17535), and
        every other VM of the VPC (another stack's, the watcher, whose security group this endpoint's
        does not admit) had that API's public name taken over. Without it the endpoint keeps only its
        own names, "the public DNS names that are automatically generated by the VPC endpoint service"
        (botocore ec2 CreateVpcEndpointRequest.PrivateDnsEnabled), which the scripts call instead: the
        endpoint-specific DNS name "is publicly resolvable, but only routes traffic in your VPC"
        (https://docs.aws.amazon.com/appstream2/latest/developerguide/how-to-access-api-cli-through-interface-vpc-endpoint.html,
        the same PrivateLink mechanism for every AWS service; AWS's SDKs take it as ``endpoint_url`` and
        sign for the service and region as before). The requests are signed for the host they are sent
        to (templates/common/lib.sh.j2 spotctl_aws_request signs the URL's host, which curl sends)."""
        endpoint = aws.ec2.VpcEndpoint(
            f"{name}-{service}-endpoint",
            vpc_id=vpc_id,
            service_name=f"com.amazonaws.{cfg.region}.{service}",
            vpc_endpoint_type="Interface",
            subnet_ids=[subnet.id for subnet in self.subnets.values()],
            security_group_ids=[self.security_group.id],
            private_dns_enabled=False,
            tags=tags,
            opts=child,
        )
        self.api_urls[service] = pulumi.Output.all(endpoint.id, endpoint.dns_entries).apply(
            lambda v: "https://" + regional_dns_name(v[0], [_dns_name(e) for e in v[1] or []]))

    def api_url(self, service: str) -> pulumi.Output[str]:
        """The URL the scripts call ``service`` at: its interface endpoint's name under ``s3-endpoint``
        egress, else "" (infra.render.ScriptContext then uses the API's public regional name)."""
        return self.api_urls.get(service) or pulumi.Output.from_input("")


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


def boundary_name(slug: str) -> str:
    """The stack's permissions-boundary policy (path ``/spotctl/``): one per stack, attached to every
    job and pool role (contract aws.role-permissions-boundary)."""
    return f"spotctl-{slug}-boundary"


def boundary_document(stack: str, slug: str, region: str, bucket_arn: str) -> dict:
    """The most any job or pool role of the stack may do, whatever inline policy it gets (pure).

    A permissions boundary caps identity-based policies: the effective permissions are the
    intersection (https://docs.aws.amazon.com/IAM/latest/UserGuide/access_policies_boundaries.html).
    So a job role widened by whoever controls the watcher (``iam:PutRolePolicy`` cannot be limited by
    content) still cannot leave this list: the union of what ``_instance_profile``, ``_env_secret``
    and ``protect_policy`` grant, at the stack's level instead of the job's."""
    return {"Version": "2012-10-17", "Statement": [
        {"Sid": "PutStackEvents", "Effect": "Allow", "Action": "s3:PutObject",
         "Resource": f"{bucket_arn}/{stack}/*"},  # every event_object_prefix(stack, name) of the stack
        {"Sid": "ReadAgentAndStackObjects", "Effect": "Allow", "Action": "s3:GetObject",
         "Resource": [f"{bucket_arn}/{AGENT_PREFIX}*", f"{bucket_arn}/{stack}/*"]},
        {"Sid": "ReadStackSecretEnv", "Effect": "Allow", "Action": "ssm:GetParameter",
         "Resource": f"arn:aws:ssm:{region}:*:parameter{ssm_parameter_name(slug, '*')}"},
        # SecureStrings use the account's aws/ssm key through SSM only; a cap, not a grant.
        {"Sid": "DecryptSecretEnvThroughSsm", "Effect": "Allow", "Action": "kms:Decrypt", "Resource": "*",
         "Condition": {"StringEquals": {"kms:ViaService": f"ssm.{region}.amazonaws.com"}}},
        {"Sid": "ProtectSelfInPool", "Effect": "Allow", "Action": "autoscaling:SetInstanceProtection",
         "Resource": f"arn:aws:autoscaling:{region}:*:autoScalingGroup:*:autoScalingGroupName/{slug}-*"},
        {"Sid": "FindOwnGroup", "Effect": "Allow", "Action": "autoscaling:DescribeAutoScalingInstances", "Resource": "*"},
    ]}


def _instance_profile(name: str, args: StackArgs, owner: str, base: StackBase, tags, child):
    """(role, instance profile) per job (or pool) that may only put objects under its own prefix:
    EC2 instance tags are not principal tags, so one shared role could not tell jobs apart. Every
    role carries the stack's permissions boundary (contract aws.role-permissions-boundary)."""
    prefix = event_object_prefix(args.stack, owner)  # config refuses a pool named like a job
    path, name_prefix = job_role_naming(args.slug)
    bucket = base.bucket
    role = aws.iam.Role(
        f"{name}-role",
        name_prefix=name_prefix,
        path=path,
        permissions_boundary=base.boundary.arn,
        assume_role_policy=json.dumps(
            {
                "Version": "2012-10-17",
                "Statement": [{"Effect": "Allow", "Principal": {"Service": "ec2.amazonaws.com"}, "Action": "sts:AssumeRole"}],
            }
        ),
        tags=tags,
        opts=child,
    )
    aws.iam.RolePolicy(
        f"{name}-events-policy",
        role=role.id,
        policy=bucket.arn.apply(
            lambda arn: json.dumps(
                {
                    "Version": "2012-10-17",
                    "Statement": [{"Sid": "PutOwnEvents", "Effect": "Allow", "Action": "s3:PutObject", "Resource": f"{arn}/{prefix}*"},
                                  *aws_read_statements(arn, prefix)],
                }
            )
        ),
        opts=child,
    )
    return role, aws.iam.InstanceProfile(
        f"{name}-profile", name_prefix=name_prefix, path=path, role=role.name, tags=tags, opts=child
    )


class GpuPool(pulumi.ComponentResource):
    """Launch template (no market options: the ASG decides) + ASG with a mixed-instances policy:
    ``onDemand`` on-demand instances as the base, everything above it spot, sized by the pool's
    published demand (``_demand_scaling``); with fallbackToOnDemand a second, all on-demand ASG
    that stands in for spot that stayed sold out. Busy instances protect themselves from scale-in."""

    def __init__(self, name: str, args: StackArgs, pool: Pool, base: StackBase, opts=None):
        super().__init__("spotctl:aws:GpuPool", name, None, opts)
        cfg = args.cfg
        child = pulumi.ResourceOptions(parent=self)
        tags = aws_tags(args.stack, cfg.labels, pool=pool.name)
        # A newer image only makes a new launch template version: running instances keep theirs.
        image = _image(pool.image, pulumi.InvokeOptions(parent=self))
        role, profile = _instance_profile(name, args, pool.name, base, tags, child)
        user_data = pulumi.Output.all(base.bucket.bucket, base.api_url("autoscaling")).apply(
            lambda v: user_data_gzip_b64(scripts_for(
                pool_script_context(cfg, args.stack, pool, bucket=v[0], autoscaling_url=v[1])).user_data)
        )
        physical = f"{args.slug}-{pool.name}"
        template = aws.ec2.LaunchTemplate(
            f"{name}-template",
            name_prefix=f"{physical}-",
            image_id=image.id,
            iam_instance_profile=aws.ec2.LaunchTemplateIamInstanceProfileArgs(arn=profile.arn),
            metadata_options=_metadata_options(aws.ec2.LaunchTemplateMetadataOptionsArgs),
            block_device_mappings=[
                aws.ec2.LaunchTemplateBlockDeviceMappingArgs(
                    device_name=image.root_device,
                    ebs=aws.ec2.LaunchTemplateBlockDeviceMappingEbsArgs(
                        volume_size=root_volume_gb(pool.disk_gb, image, f"{name}-template"),
                        volume_type="gp3", encrypted="true", delete_on_termination="true",
                    ),
                )
            ],
            network_interfaces=[
                aws.ec2.LaunchTemplateNetworkInterfaceArgs(
                    device_index=0,
                    associate_public_ip_address="true" if pool.external_ip or base.egress == "public-ip" else "false",
                    security_groups=[base.security_group.id],
                    delete_on_termination="true",
                )
            ],
            user_data=user_data,
            tag_specifications=[
                aws.ec2.LaunchTemplateTagSpecificationArgs(resource_type=kind, tags=tags)
                for kind in ("instance", "volume", "network-interface")
            ],
            update_default_version=True,
            tags=tags,
            opts=child,
        )
        parts = {p.name: p for p in pool_parts(pool)}
        group_args = dict(
            vpc_zone_identifiers=[base.subnets[z].id for z in cfg.zones],
            template_id=template.id,
            instance_types=pool.instance_types or [],
            tags=tags,
            opts=child,
        )
        self.group = mixed_group(
            f"{name}-asg", physical, pool.on_demand + pool.spot_min, pool.on_demand + pool.spot_max,
            on_demand_base=pool.on_demand, on_demand_above_base_pct=0, **group_args,
        )
        self.groups = {"asg": self.group}
        if "spot" in parts:
            demand_scaling(f"{name}-spot", f"{physical}-spot", args.stack, pool, self.group, parts["spot"], pool.on_demand, tags, child)
        if "fallback" in parts:
            fallback = parts["fallback"]
            self.fallback = mixed_group(
                f"{name}-fallback-asg", f"{physical}-fallback", fallback.min_size, fallback.max_size,
                on_demand_base=0, on_demand_above_base_pct=100, **group_args,
            )
            self.groups["fallbackAsg"] = self.fallback
            demand_scaling(f"{name}-fallback", f"{physical}-fallback", args.stack, pool, self.fallback, fallback, 0, tags, child)
        # A busy instance sets scale-in protection on itself (templates/common/lib.sh.j2).
        protect_policy(f"{name}-protect-policy", role, list(self.groups.values()), child)
        self.register_outputs({k: g.name for k, g in self.groups.items()})


class TrainingJob(pulumi.ComponentResource):
    """Per node an encrypted gp3 EBS volume (protected: only `spotctl cleanup` of the completed job lifts it) and the instance of
    the current attempt, spot via market options or on-demand, attached in the volume's zone; the
    job's own role, and an EventBridge rule for its instances' interruption warnings."""

    def __init__(self, name: str, args: StackArgs, plan: JobPlan, base: StackBase, opts=None):
        super().__init__("spotctl:aws:TrainingJob", name, None, opts)
        cfg, job = args.cfg, plan.job
        child = pulumi.ResourceOptions(parent=self)
        tags = aws_tags(args.stack, cfg.labels, job=job.id)
        subnet = base.subnets[job.zone]
        runs = any(n.declares_instance for n in plan.nodes)
        master_eni = None
        master_addr: pulumi.Output[str] | None = None
        if plan.needs_master_address:
            # An ENI outlives instances: the master keeps its private IP across attempts.
            master_eni = aws.ec2.NetworkInterface(
                f"{name}-master-eni",
                subnet_id=subnet.id,
                security_groups=[base.security_group.id],
                description=f"spotctl {args.stack}/{job.id} master",
                tags=aws_tags(args.stack, cfg.labels, name=f"{plan.slug}-{job.id}-master", job=job.id),
                opts=child,
            )
            master_addr = master_eni.private_ip
        public_ip = job.external_ip or base.egress == "public-ip"
        master_ip = None
        if master_eni is not None and public_ip:
            # RunInstances assigns a public IPv4 only to a new interface (contract
            # aws.public-ip-only-on-new-interface): the master's own interface gets an Elastic IP instead,
            # which stays with the interface across attempts (allocated tagged on create:
            # terraform-provider-aws internal/service/ec2/ec2_eip.go resourceEIPCreate).
            eip = aws.ec2.Eip(
                f"{name}-master-ip",
                domain="vpc",
                tags=aws_tags(args.stack, cfg.labels, name=f"{plan.slug}-{job.id}-master", job=job.id),
                opts=child,
            )
            # Associated by its own resource, not Eip(network_interface=...): aws_eip's `instance` is
            # Optional+Computed and its Read stores the instance the interface is attached to, so when a
            # zone move replaces the interface, resourceEIPUpdate calls associateEIP with that prior
            # instance id and the new interface id (ec2_eip.go), and AssociateAddress takes "either the
            # instance ID or the network interface ID, but not both" (API_AssociateAddress). Every
            # argument of aws_eip_association is ForceNew and it has no Update (ec2_eip_association.go):
            # a new interface is a new association, made with the interface id alone (a replacement's
            # computed instance_id is unknown, so Create sends none). Deleted first: the address is on
            # one interface at a time (DisassociateAddress, then AssociateAddress; no reassociation).
            master_ip = aws.ec2.EipAssociation(
                f"{name}-master-ip-association",
                allocation_id=eip.allocation_id,
                network_interface_id=master_eni.id,
                opts=pulumi.ResourceOptions(parent=self, delete_before_replace=True),
            )
        image = _image(job.image, pulumi.InvokeOptions(parent=self)) if runs else None
        role, profile = _instance_profile(name, args, job.id, base, tags, child) if runs else (None, None)
        secret_deps = self._env_secret(name, args, plan, role, tags, child)
        self.volumes: list[aws.ebs.Volume] = []
        self.instances: list[aws.ec2.Instance] = []
        for node in plan.nodes:
            volume = self._job_volumes(name, args, job, node)
            if not node.declares_instance or image is None or profile is None:
                continue
            addr = master_addr if master_addr is not None else pulumi.Output.from_input("127.0.0.1")
            secrets_url = base.api_url("ssm") if job.secret_keys else pulumi.Output.from_input("")
            user_data = pulumi.Output.all(base.bucket.bucket, addr, volume.id, secrets_url).apply(
                lambda v, node=node: user_data_gzip_b64(scripts_for(
                    job_script_context(
                        cfg, args.stack, plan, node, bucket=v[0], master_addr=v[1],
                        disk_device=NVME_BY_ID.format(v[2].replace("-", "")), disk_aliases=DATA_DEVICE_NAMES,
                        secrets_url=v[3],
                    )
                ).user_data)
            )
            uses_eni = node.is_master and master_eni is not None
            instance = aws.ec2.Instance(
                f"{name}-n{node.rank}-vm",
                ami=image.id,
                instance_type=job.instance_type,
                availability_zone=job.zone,
                subnet_id=None if uses_eni else subnet.id,
                vpc_security_group_ids=None if uses_eni else [base.security_group.id],
                primary_network_interface=aws.ec2.InstancePrimaryNetworkInterfaceArgs(network_interface_id=master_eni.id)
                if uses_eni
                else None,
                associate_public_ip_address=None if uses_eni else public_ip,
                iam_instance_profile=profile.name,
                metadata_options=_metadata_options(aws.ec2.InstanceMetadataOptionsArgs),
                root_block_device=aws.ec2.InstanceRootBlockDeviceArgs(
                    volume_size=root_volume_gb(BOOT_DISK_GB, image, f"{name}-n{node.rank}-vm"),
                    # Untagged: the provider tags a root volume by a CreateTags after the launch
                    # (terraform-provider-aws ec2_instance.go resourceInstanceCreate, "tags in
                    # root_block_device"), on a volume with no tag yet; the watcher's role would need
                    # leave to tag any untagged volume as this stack's, and so to delete it
                    # (infra/aws_watcher.py). It lives and dies with its instance, which is tagged.
                    volume_type="gp3", encrypted=True, delete_on_termination=True,
                ),
                instance_market_options=aws.ec2.InstanceInstanceMarketOptionsArgs(
                    market_type="spot",
                    spot_options=aws.ec2.InstanceInstanceMarketOptionsSpotOptionsArgs(
                        spot_instance_type="one-time", instance_interruption_behavior="terminate"
                    ),
                )
                if plan.spot
                else None,
                # The agent powers the VM off when the job's work is done: an OS shutdown then ends the
                # instance's billing. A one-time spot instance cannot be stopped (only a persistent
                # request's can, docs.aws.amazon.com/AWSEC2/latest/UserGuide/interruption-behavior.html):
                # it terminates, as at a preemption; an on-demand one stops and keeps its state. The
                # default is stop: docs.aws.amazon.com/AWSEC2/latest/UserGuide/Using_ChangingInstanceInitiatedShutdownBehavior.html
                instance_initiated_shutdown_behavior="terminate" if plan.spot else "stop",
                user_data_base64=user_data,
                user_data_replace_on_change=True,
                tags={**aws_tags(args.stack, cfg.labels, name=node.instance_name, job=job.id, node=str(node.rank)), "spotctl:attempt": str(job.attempt)},
                # A new attempt changes the user data, which replaces the instance; the old one must
                # be gone (and the volume detached) before the new one attaches it. Workers wait for
                # the new master, so none of them meets a stale master at the rendezvous.
                # ignore_changes=["ami"]: the image is the one resolved when this VM was created (Pulumi
                # keeps the state's value, replacements included), so a newer DLAMI never replaces a
                # running VM; a new attempt after a preemption (the refresh drops the terminated VM)
                # is created fresh and gets the newest image. The stack output `images` records it.
                opts=pulumi.ResourceOptions(
                    # The master's public address is there before its first boot runs the user data.
                    parent=self, delete_before_replace=True,
                    depends_on=[*self.instances[:1], *secret_deps, *([master_ip] if uses_eni and master_ip else []), base.agent],
                    ignore_changes=["ami"],
                ),
            )
            aws.ec2.VolumeAttachment(
                f"{name}-n{node.rank}-attachment",
                device_name=DATA_DEVICE,
                volume_id=volume.id,
                instance_id=instance.id,
                # Deleting the attachment is state-only: terminating the instance detaches the volume
                # (it persists). A real detach of a one-time spot VM would first StopInstances,
                # which EC2 refuses for one-time spot instances.
                skip_destroy=True,
                opts=pulumi.ResourceOptions(parent=self, delete_before_replace=True),
            )
            self.instances.append(instance)
        if self.instances:
            self._interruption_rule(name, args, job.id, base, tags, child)
        self.outputs = job_outputs(
            plan, disks_key="volumes", disks=[v.id for v in self.volumes], instances=[i.id for i in self.instances],
            master_addr=master_addr,
        )
        self.outputs["images"] = [i.ami for i in self.instances]
        self.register_outputs(self.outputs)

    def _env_secret(self, name: str, args: StackArgs, plan: JobPlan, role, tags, child) -> list[pulumi.Resource]:
        """The job's secret env values (README "Secrets in env"): one SecureString SSM parameter
        (encrypted with the account's ``aws/ssm`` key), readable through ``ssm:GetParameter`` by this
        job's role only: no other spotctl role has any SSM permission. The payload is a secret Output,
        so Pulumi encrypts it in its state and masks it in its output."""
        job = plan.job
        if not job.secret_keys:
            return []
        payload = args.secrets[job.id]
        parameter = aws.ssm.Parameter(
            f"{name}-env-secret",
            name=ssm_parameter_name(plan.slug, job.id),
            type="SecureString",
            value=payload,
            # Standard holds up to 4096 characters (free), Advanced 8192 (contract aws.ssm-parameter-value).
            # Only the size class leaves the secret.
            tier=pulumi.Output.unsecret(payload.apply(lambda p: "Standard" if len(p) <= SSM_STANDARD_MAX else "Advanced")),
            description=f"spotctl: secret env values of job {job.id} of stack {args.stack}",
            tags=tags,
            opts=child,
        )
        if role is None:
            return [parameter]
        policy = aws.iam.RolePolicy(
            f"{name}-env-secret-policy",
            role=role.id,
            policy=parameter.arn.apply(
                lambda arn: json.dumps({"Version": "2012-10-17", "Statement": [
                    {"Sid": "ReadOwnSecretEnv", "Effect": "Allow", "Action": "ssm:GetParameter", "Resource": arn}]})
            ),
            opts=child,
        )
        return [parameter, policy]

    def _interruption_rule(self, name: str, args: StackArgs, job_id: str, base: StackBase, tags, child) -> None:
        """Interruption warnings of exactly this job's instances (EC2 events carry no tags, only the
        instance id), into the stack's queue. Inside the job, so a targeted update keeps it current."""
        pattern = pulumi.Output.all(*[i.id for i in self.instances]).apply(
            lambda ids: json.dumps({"source": ["aws.ec2"], "detail-type": INTERRUPTION_EVENTS, "detail": {"instance-id": sorted(ids)}})
        )
        rule = aws.cloudwatch.EventRule(
            f"{name}-interruptions-rule",
            name=rule_name(args.slug, job_id),
            description=f"spotctl {args.stack}: interruption warnings of {job_id}'s instances",
            event_pattern=pattern,
            tags=tags,
            opts=child,
        )
        aws.cloudwatch.EventTarget(f"{name}-interruptions-target", rule=rule.name, arn=base.queue.arn, opts=child)


    def _job_volumes(self, name: str, args: StackArgs, job, node) -> aws.ebs.Volume:
        """A node's EBS volumes and move snapshots (``infra.common.node_disks``); returns the attached one.

        A volume is bound to its Availability Zone, a snapshot is regional: a move restores a new
        volume in the target AZ from the snapshot (aws.volume-az-bound, aws.restored-volume-encrypted).
        The restored volume keeps its ``snapshot_id`` once the snapshot leaves the program
        (ignore_changes), so releasing a move never replaces it."""
        cfg = args.cfg
        throughput, iops = gp3_performance(job)
        by_gen: dict[int, aws.ebs.Volume] = {}
        snaps: dict[int, aws.ebs.Snapshot] = {}
        # A move's snapshot and the volumes restored from it may take hours (aws.move-create-timeout).
        move_timeouts = pulumi.CustomTimeouts(create=MOVE_CREATE_TIMEOUT)

        def snapshot(s) -> aws.ebs.Snapshot:
            # Kept in the cloud when the move is released (retain_on_delete), with the ownership tags.
            return aws.ebs.Snapshot(
                s.logical(name, node.rank),
                volume_id=by_gen[s.gen - 1].id,
                description=f"spotctl {args.stack}/{job.id} node {node.rank}: move to generation {s.gen}",
                tags=aws_tags(args.stack, cfg.labels, name=s.name, job=job.id, node=str(node.rank)),
                opts=pulumi.ResourceOptions(parent=self, retain_on_delete=True, custom_timeouts=move_timeouts),
            )

        for d in sorted(node.disks, key=lambda d: d.gen):
            snap = None
            if d.snapshot and d.gen - 1 in by_gen:
                snap = snaps[d.gen] = snapshot(next(s for s in node.snapshots if s.gen == d.gen))
            by_gen[d.gen] = aws.ebs.Volume(
                d.logical(name, node.rank, "volume"),
                availability_zone=d.zone,
                size=job.disk_gb,
                type="gp3",
                throughput=throughput,
                iops=iops,
                encrypted=True,
                snapshot_id=snap.id if snap is not None else None,
                tags=aws_tags(args.stack, cfg.labels, name=d.name, job=job.id, node=str(node.rank)),
                opts=pulumi.ResourceOptions(parent=self, protect=d.protect,
                                            ignore_changes=["snapshotId"] if d.restored else None,
                                            custom_timeouts=move_timeouts if d.restored else None),
            )
            self.volumes.append(by_gen[d.gen])
        for s in node.snapshots:
            if s.gen not in snaps:  # step snapshot: the restored volume is not declared yet
                snapshot(s)
        attached = node.attached_disk
        contract.enforce("aws.volume-az-bound", attached.logical(name, node.rank, "volume"),
                         f"attached in {job.zone} but in {attached.zone}" if attached.zone != job.zone else None)
        return by_gen[attached.gen]


def declare(args: StackArgs, plans: list[JobPlan]) -> dict[str, object]:
    """Declare the whole AWS stack through one explicit provider; returns the stack outputs."""
    provider = aws.Provider("aws", region=args.cfg.region)
    opts = pulumi.ResourceOptions(providers=[provider])
    from infra.aws_watcher import Watcher

    base, pools, jobs = declare_components(args, plans, StackBase, GpuPool, TrainingJob, opts=opts, watcher_cls=Watcher)
    outputs: dict[str, object] = {
        "eventBucket": base.bucket.bucket,
        "interruptionQueue": base.queue.url,
        "pools": {name: {k: g.name for k, g in p.groups.items()} for name, p in pools.items()},
        "jobs": {jid: j.outputs for jid, j in jobs.items()},
    }
    if base.watcher is not None:
        outputs["watcher"] = {"instance": base.watcher.instance.id, "zone": args.cfg.watcher_zone}
    return outputs
