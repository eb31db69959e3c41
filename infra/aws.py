"""AWS components: the stack's shared pieces, GPU pools (ASG mixed-instances: on-demand base + spot)
and training jobs whose encrypted EBS volumes outlive every instance (see README, "What an AWS stack declares")."""

from __future__ import annotations

import base64
import json
from dataclasses import dataclass

import pulumi
import pulumi_aws as aws

from infra.aws_scaling import demand_scaling, mixed_group, protect_policy
from infra.common import (
    BOOT_DISK_GB,
    JobPlan,
    StackArgs,
    declare_components,
    job_outputs,
    job_script_context,
    pool_parts,
    pool_script_context,
)
from infra.config import Pool, StackConfig
from infra.naming import aws_tags
from infra.render import scripts_for

# Deep Learning AMI (NVIDIA driver, PyTorch) on Ubuntu, newest first; `image: ami-...` overrides.
DEFAULT_AMI_NAME = "Deep Learning OSS Nvidia Driver AMI GPU PyTorch * (Ubuntu 22.04) *"
DATA_DEVICE = "/dev/sdf"
# Nitro exposes an EBS volume as NVMe with the volume id (no dash) in its by-id name.
NVME_BY_ID = "/dev/disk/by-id/nvme-Amazon_Elastic_Block_Store_{}"
INTERRUPTION_EVENTS = ["EC2 Spot Instance Interruption Warning", "EC2 Instance Rebalance Recommendation"]



@dataclass(frozen=True)
class Image:
    id: str
    root_device: str


def _image(cfg_image: str | None) -> Image:
    if cfg_image:
        filters = [aws.ec2.GetAmiFilterArgs(name="image-id", values=[cfg_image])]
        owners = None
    else:
        filters = [
            aws.ec2.GetAmiFilterArgs(name="name", values=[DEFAULT_AMI_NAME]),
            aws.ec2.GetAmiFilterArgs(name="architecture", values=["x86_64"]),
        ]
        owners = ["amazon"]
    ami = aws.ec2.get_ami(most_recent=True, owners=owners, filters=filters)
    return Image(ami.id, ami.root_device_name)


def _metadata_options(cls):
    # IMDSv2 only; hop limit 2 so containers on the VM reach it too.
    return cls(http_endpoint="enabled", http_tokens="required", http_put_response_hop_limit=2, instance_metadata_tags="disabled")


class StackBase(pulumi.ComponentResource):
    """Per stack: event bucket, the instance role that may only write under the stack's prefix,
    the security group, and EventBridge -> SQS for interruption warnings seen outside the VM."""

    def __init__(self, name: str, args: StackArgs, opts=None):
        super().__init__("spotctl:aws:StackBase", name, None, opts)
        cfg = args.cfg
        child = pulumi.ResourceOptions(parent=self)
        tags = aws_tags(args.stack, cfg.labels)
        self.subnets = {zone: _subnet(cfg, zone) for zone in cfg.zones}
        vpc_id = next(iter(self.subnets.values())).vpc_id

        self.bucket = aws.s3.Bucket(f"{name}-events", bucket_prefix=f"spotctl-{args.slug}-events-", force_destroy=False, tags=tags, opts=child)
        aws.s3.BucketPublicAccessBlock(
            f"{name}-events-public-access",
            bucket=self.bucket.id,
            block_public_acls=True,
            block_public_policy=True,
            ignore_public_acls=True,
            restrict_public_buckets=True,
            opts=child,
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
                    apply_server_side_encryption_by_default=aws.s3.BucketServerSideEncryptionConfigurationRuleApplyServerSideEncryptionByDefaultArgs(
                        sse_algorithm="AES256"
                    ),
                    bucket_key_enabled=True,
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
                    filter=aws.s3.BucketLifecycleConfigurationRuleFilterArgs(prefix=""),
                    expiration=aws.s3.BucketLifecycleConfigurationRuleExpirationArgs(days=cfg.event_retention_days),
                )
            ],
            opts=child,
        )

        self.role = aws.iam.Role(
            f"{name}-instance-role",
            name_prefix=f"spotctl-{args.slug}-"[:38],
            assume_role_policy=json.dumps(
                {
                    "Version": "2012-10-17",
                    "Statement": [
                        {"Effect": "Allow", "Principal": {"Service": "ec2.amazonaws.com"}, "Action": "sts:AssumeRole"}
                    ],
                }
            ),
            tags=tags,
            opts=child,
        )
        aws.iam.RolePolicy(
            f"{name}-instance-events-policy",
            role=self.role.id,
            policy=self.bucket.arn.apply(
                lambda arn: json.dumps(
                    {
                        "Version": "2012-10-17",
                        "Statement": [
                            {
                                "Sid": "PutOwnStackEvents",
                                "Effect": "Allow",
                                "Action": "s3:PutObject",
                                "Resource": f"{arn}/{args.stack}/*",
                            }
                        ],
                    }
                )
            ),
            opts=child,
        )
        self.profile = aws.iam.InstanceProfile(f"{name}-instance-profile", role=self.role.name, tags=tags, opts=child)

        self.security_group = aws.ec2.SecurityGroup(
            f"{name}-nodes-sg",
            description=f"spotctl {args.stack}: egress, and node-to-node traffic of multi-node jobs",
            vpc_id=vpc_id,
            egress=[aws.ec2.SecurityGroupEgressArgs(protocol="-1", from_port=0, to_port=0, cidr_blocks=["0.0.0.0/0"])],
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

        self.queue = aws.sqs.Queue(
            f"{name}-interruptions",
            name_prefix=f"spotctl-{args.slug}-interruptions-"[:75],
            message_retention_seconds=4 * 24 * 3600,
            sqs_managed_sse_enabled=True,
            tags=tags,
            opts=child,
        )
        self.rule = aws.cloudwatch.EventRule(
            f"{name}-interruptions-rule",
            description=f"spotctl {args.stack}: spot interruption warnings and rebalance recommendations",
            event_pattern=json.dumps({"source": ["aws.ec2"], "detail-type": INTERRUPTION_EVENTS}),
            tags=tags,
            opts=child,
        )
        aws.sqs.QueuePolicy(
            f"{name}-interruptions-policy",
            queue_url=self.queue.url,
            policy=pulumi.Output.all(self.queue.arn, self.rule.arn).apply(
                lambda v: json.dumps(
                    {
                        "Version": "2012-10-17",
                        "Statement": [
                            {
                                "Effect": "Allow",
                                "Principal": {"Service": "events.amazonaws.com"},
                                "Action": "sqs:SendMessage",
                                "Resource": v[0],
                                "Condition": {"ArnEquals": {"aws:SourceArn": v[1]}},
                            }
                        ],
                    }
                )
            ),
            opts=child,
        )
        aws.cloudwatch.EventTarget(f"{name}-interruptions-target", rule=self.rule.name, arn=self.queue.arn, opts=child)
        self.register_outputs({"eventBucket": self.bucket.bucket, "interruptionQueue": self.queue.url})


@dataclass(frozen=True)
class Subnet:
    id: str
    vpc_id: str


def _subnet(cfg: StackConfig, zone: str) -> Subnet:
    """The configured subnet of a zone, or the default VPC's default subnet there."""
    subnet_id = cfg.network.subnets.get(zone)
    found = aws.ec2.get_subnet(id=subnet_id) if subnet_id else aws.ec2.get_subnet(availability_zone=zone, default_for_az=True)
    return Subnet(found.id, found.vpc_id)


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
        image = _image(pool.image)
        user_data = base.bucket.bucket.apply(
            lambda bucket: base64.b64encode(
                scripts_for(pool_script_context(cfg, args.stack, pool, bucket=bucket)).user_data.encode()
            ).decode()
        )
        physical = f"{args.slug}-{pool.name}"
        template = aws.ec2.LaunchTemplate(
            f"{name}-template",
            name_prefix=f"{physical}-",
            image_id=image.id,
            iam_instance_profile=aws.ec2.LaunchTemplateIamInstanceProfileArgs(arn=base.profile.arn),
            metadata_options=_metadata_options(aws.ec2.LaunchTemplateMetadataOptionsArgs),
            block_device_mappings=[
                aws.ec2.LaunchTemplateBlockDeviceMappingArgs(
                    device_name=image.root_device,
                    ebs=aws.ec2.LaunchTemplateBlockDeviceMappingEbsArgs(
                        volume_size=pool.disk_gb, volume_type="gp3", encrypted="true", delete_on_termination="true"
                    ),
                )
            ],
            network_interfaces=[
                aws.ec2.LaunchTemplateNetworkInterfaceArgs(
                    device_index=0,
                    associate_public_ip_address="true" if pool.external_ip else "false",
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
        protect_policy(f"{name}-protect-policy", base.role, list(self.groups.values()), child)
        self.register_outputs({k: g.name for k, g in self.groups.items()})


class TrainingJob(pulumi.ComponentResource):
    """Per node an encrypted EBS volume (protected until the job completed) and the instance of the
    current attempt, spot via market options or on-demand, attached in the volume's zone."""

    def __init__(self, name: str, args: StackArgs, plan: JobPlan, base: StackBase, opts=None):
        super().__init__("spotctl:aws:TrainingJob", name, None, opts)
        cfg, job = args.cfg, plan.job
        child = pulumi.ResourceOptions(parent=self)
        tags = aws_tags(args.stack, cfg.labels, job=job.id)
        subnet = base.subnets[job.zone]
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
        image = _image(job.image) if any(n.declares_instance for n in plan.nodes) else None
        self.volumes: list[aws.ebs.Volume] = []
        self.instances: list[aws.ec2.Instance] = []
        for node in plan.nodes:
            volume = aws.ebs.Volume(
                f"{name}-n{node.rank}-volume",
                availability_zone=job.zone,
                size=job.disk_gb,
                type="gp3",
                encrypted=True,
                tags=aws_tags(args.stack, cfg.labels, name=node.disk_name, job=job.id, node=str(node.rank)),
                opts=pulumi.ResourceOptions(parent=self, protect=plan.protect_disks),
            )
            self.volumes.append(volume)
            if not node.declares_instance or image is None:
                continue
            addr = master_addr if master_addr is not None else pulumi.Output.from_input("127.0.0.1")
            user_data = pulumi.Output.all(base.bucket.bucket, addr, volume.id).apply(
                lambda v, node=node: scripts_for(
                    job_script_context(
                        cfg, args.stack, plan, node, bucket=v[0], master_addr=v[1],
                        disk_device=NVME_BY_ID.format(v[2].replace("-", "")),
                    )
                ).user_data
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
                associate_public_ip_address=None if uses_eni else job.external_ip,
                iam_instance_profile=base.profile.name,
                metadata_options=_metadata_options(aws.ec2.InstanceMetadataOptionsArgs),
                root_block_device=aws.ec2.InstanceRootBlockDeviceArgs(
                    volume_size=BOOT_DISK_GB, volume_type="gp3", encrypted=True, delete_on_termination=True, tags=tags
                ),
                instance_market_options=aws.ec2.InstanceInstanceMarketOptionsArgs(
                    market_type="spot",
                    spot_options=aws.ec2.InstanceInstanceMarketOptionsSpotOptionsArgs(
                        spot_instance_type="one-time", instance_interruption_behavior="terminate"
                    ),
                )
                if plan.spot
                else None,
                user_data=user_data,
                user_data_replace_on_change=True,
                tags={**aws_tags(args.stack, cfg.labels, name=node.instance_name, job=job.id, node=str(node.rank)), "spotctl:attempt": str(job.attempt)},
                # A new attempt changes the user data, which replaces the instance; the old one must
                # be gone (and the volume detached) before the new one attaches it. Workers wait for
                # the new master, so none of them meets a stale master at the rendezvous.
                opts=pulumi.ResourceOptions(parent=self, delete_before_replace=True, depends_on=self.instances[:1]),
            )
            aws.ec2.VolumeAttachment(
                f"{name}-n{node.rank}-attachment",
                device_name=DATA_DEVICE,
                volume_id=volume.id,
                instance_id=instance.id,
                stop_instance_before_detaching=True,
                opts=pulumi.ResourceOptions(parent=self, delete_before_replace=True),
            )
            self.instances.append(instance)
        self.outputs = job_outputs(
            plan, disks_key="volumes", disks=[v.id for v in self.volumes], instances=[i.id for i in self.instances],
            master_addr=master_addr,
        )
        self.register_outputs(self.outputs)


def declare(args: StackArgs, plans: list[JobPlan]) -> dict[str, object]:
    """Declare the whole AWS stack; returns the stack outputs."""
    base, pools, jobs = declare_components(args, plans, StackBase, GpuPool, TrainingJob)
    return {
        "eventBucket": base.bucket.bucket,
        "interruptionQueue": base.queue.url,
        "pools": {name: {k: g.name for k, g in p.groups.items()} for name, p in pools.items()},
        "jobs": {jid: j.outputs for jid, j in jobs.items()},
    }
