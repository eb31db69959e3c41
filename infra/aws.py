"""AWS components: the stack's shared pieces, GPU pools (ASG mixed-instances: on-demand base + spot)
and training jobs whose encrypted EBS volumes outlive every instance (see README, "What an AWS stack declares").

Every resource and invoke goes through one explicit ``aws.Provider`` built from ``spotctl:region``
(``aws:region`` is never read). The rules AWS enforces on these inputs are in ``infra/contract/aws.py``;
the shared pieces are in ``infra/aws_base.py``, the helpers the watcher uses too in ``infra/aws_common.py``.
"""

from __future__ import annotations

import json

import pulumi
import pulumi_aws as aws

from infra import aws_common, contract
from infra.agent_object import aws_read_statements
from infra.aws_base import (  # noqa: F401
    StackBase,
)
from infra.aws_common import (  # noqa: F401
    DATA_DEVICE,
    DATA_DEVICE_NAMES,
    DEFAULT_AMI_NAME,
    INTERRUPTION_EVENTS,
    NVME_BY_ID,
    SSM_STANDARD_MAX,
    Image,
    Subnet,
    _dns_name,
    _image,
    _metadata_options,
    _subnets,
    _tls_only_policy,
    boundary_document,
    boundary_name,
    gp3_performance,
    image_of,
    job_role_naming,
    regional_dns_name,
    root_volume_gb,
    rule_name,
    user_data_gzip_b64,
)
from infra.aws_efa import efa_gang, efa_template, instance_networking
from infra.aws_scaling import demand_scaling, mixed_group, protect_policy
from infra.common import (
    BOOT_DISK_GB,
    MOVE_CREATE_TIMEOUT,
    JobPlan,
    StackArgs,
    declare_components,
    frozen_scripts,
    job_outputs,
    job_script_context,
    pool_parts,
    pool_script_context,
)
from infra.config import Pool
from infra.contract.aws_fleet import cluster_placement_problem, efa_interfaces
from infra.naming import aws_tags, code_prefix, ssm_parameter_name
from infra.render import event_object_prefix, scripts_for


def _instance_profile(name: str, args: StackArgs, owner: str, base: StackBase, tags, child, code: bool = False):
    """(role, instance profile) per job (or pool) that may only put objects under its own prefix (and,
    with ``code``, read the job's own code archives):
    EC2 instance tags are not principal tags, so one shared role could not tell jobs apart. Every
    role carries the stack's permissions boundary (contract aws.role-permissions-boundary)."""
    prefix = event_object_prefix(args.stack, owner)  # config refuses a pool named like a job
    path, name_prefix = aws_common.job_role_naming(args.slug)
    bucket = base.bucket
    role = aws.iam.Role(
        f"{name}-role",
        name_prefix=name_prefix,
        path=path,
        permissions_boundary=base.boundary.arn,
        assume_role_policy=json.dumps(  # no aws:SourceAccount: why, at the watcher's role (infra/aws_watcher.py)
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
    if code:
        # The job's code archives (uploaded by spotctl, named by their digest) and nothing else of the
        # bucket: GetObject on the job's own code prefix only. Without s3:ListBucket a missing object
        # answers 403, not 404 (https://docs.aws.amazon.com/AmazonS3/latest/API/API_GetObject.html,
        # "Permissions"): the VM reports either as the archive not found.
        code_dir = code_prefix(args.stack, owner)
        aws.iam.RolePolicy(
            f"{name}-code-policy",
            role=role.id,
            policy=bucket.arn.apply(lambda arn: json.dumps({"Version": "2012-10-17", "Statement": [
                {"Sid": "ReadOwnCode", "Effect": "Allow", "Action": "s3:GetObject", "Resource": f"{arn}/{code_dir}*"}]})),
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
            metadata_options=aws_common._metadata_options(aws.ec2.LaunchTemplateMetadataOptionsArgs),
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
        # A busy instance sets scale-in protection on itself (agent/watch.py busy_apply).
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
        groups = [base.security_group.id]
        gang = None
        if job.nodes > 1:
            # Only this job's nodes reach each other, on every protocol NCCL and the rendezvous use: a rule
            # whose source is a group admits the resources associated with that group (security group
            # referencing, https://docs.aws.amazon.com/vpc/latest/userguide/security-group-rules.html), so a
            # group of the gang alone, referencing itself; GCP's gang firewall scopes it to the job's identity.
            gang = aws.ec2.SecurityGroup(f"{name}-gang-sg", description=f"spotctl {args.stack}: the nodes of job {job.id}",
                                         vpc_id=base.vpc_id, tags=tags, opts=child)
            aws.vpc.SecurityGroupIngressRule(f"{name}-gang-sg-self", security_group_id=gang.id,
                                             referenced_security_group_id=gang.id, ip_protocol="-1",
                                             description=f"the nodes of job {job.id} talk to each other (NCCL, rendezvous)",
                                             tags=tags, opts=child)
            if efa_interfaces(job.instance_type):
                aws.vpc.SecurityGroupEgressRule(f"{name}-gang-sg-self-out", security_group_id=gang.id,
                                                referenced_security_group_id=gang.id, ip_protocol="-1",
                                                description=f"EFA: the nodes of job {job.id} send to each other",
                                                tags=tags, opts=child)
            groups.append(gang.id)
        placement = None
        if job.nodes > 1 and efa_interfaces(job.instance_type):
            # NCCL over EFA wants the gang's nodes close: a cluster placement group packs them in one
            # zone's low-latency segment (contract aws.efa-cluster-placement).
            placement = aws.ec2.PlacementGroup(f"{name}-placement", strategy="cluster", tags=tags, opts=child)
            contract.enforce("aws.efa-cluster-placement", f"{name}-placement",
                             cluster_placement_problem(job.instance_type, job.nodes))
        if plan.needs_master_address:
            # An ENI outlives instances: the master keeps its private IP across attempts.
            master_eni = aws.ec2.NetworkInterface(
                f"{name}-master-eni",
                subnet_id=subnet.id,
                security_groups=groups,
                description=f"spotctl {args.stack}/{job.id} master",
                tags=aws_tags(args.stack, cfg.labels, name=f"{plan.slug}-{job.id}-master", job=job.id),
                opts=child,
            )
            master_addr = master_eni.private_ip
        public_ip = job.external_ip or base.egress == "public-ip"
        efa = gang is not None and efa_gang(job, base.egress)
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
        reads_code = job.code is not None and job.code.dir is not None
        role, profile = _instance_profile(name, args, job.id, base, tags, child, reads_code) if runs else (None, None)
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
            # p4d/p5 gang nodes: every interface, EFA included, comes from the node's launch template
            # (infra/aws_efa.py), so the instance names no subnet, group or primary interface itself.
            template = efa_template(
                f"{name}-n{node.rank}", f"{plan.slug}-{job.id}-n{node.rank}", job.instance_type, subnet_id=subnet.id,
                groups=groups, gang_group=gang.id, master_eni=master_eni if uses_eni else None, tags=tags, opts=child,
            ) if efa and gang is not None else None
            instance = aws.ec2.Instance(
                f"{name}-n{node.rank}-vm",
                ami=image.id,
                instance_type=job.instance_type,
                availability_zone=job.zone,
                **instance_networking(template, subnet.id, groups, master_eni if uses_eni else None, public_ip),
                iam_instance_profile=profile.name,
                placement_group=placement.name if placement is not None else None,
                metadata_options=aws_common._metadata_options(aws.ec2.InstanceMetadataOptionsArgs),
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
                    # A placement group is ForceNew (ec2_instance.go: placement_group): one added by an upgrade
                    # reaches the next attempt's VMs, like a newer image, never a running one.
                    # Likewise the EFA template (launch_template is ForceNew): a running attempt of an older
                    # spotctl keeps its interfaces, the next attempt gets EFA.
                    ignore_changes=["ami", "placementGroup", *frozen_scripts(job, "aws"),  # an upgrade's scripts: the next attempt
                                    *(["launchTemplate"] if frozen_scripts(job, "aws") else [])],
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
