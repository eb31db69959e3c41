"""The AWS watcher (``spotctl:watcher``): a small on-demand instance that runs ``spotctl watch`` for
the stack, and the least-privilege role it runs as (README "Watching a stack", way 4).

The role may read the interruption queue and the event bucket, read and write the Pulumi backend's
prefix, decrypt the stack's secrets, and do what a targeted ``pulumi up --refresh`` of this stack's
jobs does. That last part is necessarily broad-ish (instances and volumes are created and deleted),
so it is scoped by the exact ownership tag ``spotctl:owner`` (``infra.naming.owner_value``) on EC2
resources and on the jobs' IAM roles and instance profiles, by the stack's permissions boundary on
what those roles may ever do, and by the unambiguous ``spotctl-<slug>_`` prefix for EventBridge rules.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

import pulumi
import pulumi_aws as aws

from infra import aws_common, contract
from infra.aws_efa import efa_gang
from infra.common import StackArgs
from infra.config import AWS_KMS_RE
from infra.contract.aws import WATCHER_ROLE_PATH
from infra.naming import CLOUDWATCH_NAMESPACE, aws_tags, owner_value, shared_stack_file, ssm_parameter_name, watch_lease
from infra.render import WatcherContext, watcher_script

# Debian 12 (bookworm) AMIs are published by the Debian cloud team's account 136693071363
# (https://wiki.debian.org/Cloud/AmazonEC2Image; the owner every Terraform/Pulumi program selects).
DEBIAN_OWNER = "136693071363"
DEBIAN_AMI_NAME = "debian-12-amd64-*"
# The watcher's own role lives under another path than the jobs' roles (/spotctl/), so the
# statements on `role/spotctl/spotctl-<slug>-*` can never reach the watcher's own role.
WATCHER_PATH = WATCHER_ROLE_PATH  # exempt from aws.role-permissions-boundary: only `pulumi up` creates it
# EC2 resources a targeted update creates for a job (tagged on create, so aws:RequestTag applies).
TAGGED_ON_CREATE = ("instance", "volume", "snapshot", "network-interface", "elastic-ip")


def _job_roles(slug: str) -> tuple[str, str]:
    """ARN patterns of this stack's job and pool roles and instance profiles (infra/aws.py
    ``_instance_profile``: path /spotctl/, name prefix spotctl-<slug>-)."""
    return (f"arn:aws:iam::*:role/spotctl/spotctl-{slug}-*", f"arn:aws:iam::*:instance-profile/spotctl/spotctl-{slug}-*")


def check_passrole_covers_job_roles(slug: str, resource: str) -> None:
    """The PassRole and job-identity statements must name the roles infra/aws.py gives jobs (path
    /spotctl/, name prefix spotctl-<slug>-), and never the watcher's own."""
    import fnmatch

    path, prefix = aws_common.job_role_naming(slug)
    job_role = f"arn:aws:iam::123456789012:role{path}{prefix}abc123"
    own = f"arn:aws:iam::123456789012:role{WATCHER_PATH}{prefix}watcher-abc123"
    pattern = _job_roles(slug)[0]
    problem = None
    if not fnmatch.fnmatchcase(job_role, pattern):
        problem = f"{pattern} does not match the job roles ({path}{prefix}...)"
    elif fnmatch.fnmatchcase(own, pattern):
        problem = f"{pattern} also matches the watcher's own role"
    contract.enforce("aws.passrole-covers-job-roles", resource, problem)


def watcher_policy(*, region: str, slug: str, owner: str, queue_arn: str, events_bucket_arn: str, backend_bucket: str,
                   backend_prefix: str, secrets_provider: str, passphrase_secret: str | None,
                   boundary_arn: str, subnet_ids: Sequence[str], stack_file_key: str | None = None,
                   lease_key: str | None = None, pools: bool = False, pool_fallback: bool = False,
                   efa_templates: bool = False) -> dict[str, Any]:
    """The watcher role's inline policy (pure, so tests read it whole).

    EC2 tag conditions: ``aws:RequestTag`` on the resources RunInstances/CreateVolume/CreateSnapshot
    create, ``ec2:CreateAction`` on the CreateTags that tagging on create implies, and
    ``ec2:ResourceTag`` on what already exists (https://docs.aws.amazon.com/AWSEC2/latest/UserGuide/
    supported-iam-actions-tagging.html; ExamplePolicies_EC2.html). What the provider cannot tag in the
    request (a launch's root volume and network interface, a spot request) is granted without a tag
    condition, and only for the action that creates or ends it; a launch's network interface, new or
    existing, is held to this stack's subnets (``subnet_ids``) instead. Describe* supports no
    resource-level permissions, so it is granted on ``*`` (ExamplePolicies_EC2.html, "Read-only access").
    """
    ec2 = f"arn:aws:ec2:{region}:*"
    own_subnets = [f"{ec2}:subnet/{sid}" for sid in subnet_ids]
    owned = {"StringEquals": {"aws:ResourceTag/spotctl:owner": owner}}
    roles, profiles = _job_roles(slug)
    rules = f"arn:aws:events:{region}:*:rule/spotctl-{slug}_*"  # infra/aws_common.py rule_name
    state = f"arn:aws:s3:::{backend_bucket}"
    statements: list[dict[str, Any]] = [
        {"Sid": "ReadInterruptionQueue", "Effect": "Allow",
         "Action": ["sqs:ReceiveMessage", "sqs:DeleteMessage", "sqs:ChangeMessageVisibility", "sqs:GetQueueAttributes"],
         "Resource": queue_arn},
        {"Sid": "ListEvents", "Effect": "Allow", "Action": "s3:ListBucket", "Resource": events_bucket_arn},
        {"Sid": "ReadEvents", "Effect": "Allow", "Action": "s3:GetObject", "Resource": f"{events_bucket_arn}/*"},
        # The stack file's shared copy (cli/lifecycle/sync.py) and the watch lease (cli/watch/lease.py),
        # and only those two objects: conditional PutObject (If-Match / If-None-Match) needs s3:PutObject
        # alone (docs.aws.amazon.com/AmazonS3/latest/userguide/conditional-writes.html); the lease is
        # released by a write, never deleted.
        *([{"Sid": "WriteSharedStackFile", "Effect": "Allow", "Action": "s3:PutObject",
            "Resource": [f"{events_bucket_arn}/{k}" for k in (stack_file_key, lease_key) if k]}] if stack_file_key or lease_key else []),
        # s3:prefix limits what ListObjects may name (https://docs.aws.amazon.com/AmazonS3/latest/userguide/
        # amazon-s3-policy-keys.html, walkthrough1.html); Pulumi's DIY backend keeps everything under <prefix>.pulumi/.
        {"Sid": "ListPulumiState", "Effect": "Allow", "Action": "s3:ListBucket", "Resource": state,
         "Condition": {"StringLike": {"s3:prefix": [f"{backend_prefix}*"]}}},
        {"Sid": "ReadWritePulumiState", "Effect": "Allow", "Action": ["s3:GetObject", "s3:PutObject", "s3:DeleteObject"],
         "Resource": f"{state}/{backend_prefix}*"},
        {"Sid": "Describe", "Effect": "Allow", "Action": ["ec2:Describe*", "ssm:DescribeParameters", "sts:GetCallerIdentity"],
         "Resource": "*"},
        # A multi-node master's network interface and Elastic IP (infra/aws.py TrainingJob) are created
        # tagged (terraform-provider-aws internal/service/ec2/vpc_network_interface.go, ec2_eip.go:
        # TagSpecifications on create), so a move can replace the one and re-associate the other
        # (ec2_eip_association.go: AssociateAddress / DisassociateAddress, granted in ManageOwned).
        {"Sid": "LaunchOwned", "Effect": "Allow", "Action": ["ec2:RunInstances", "ec2:CreateVolume", "ec2:CreateSnapshot",
                                                               "ec2:CreateNetworkInterface", "ec2:AllocateAddress"],
         "Resource": [f"{ec2}:{kind}/*" for kind in TAGGED_ON_CREATE],
         "Condition": {"StringEquals": {"aws:RequestTag/spotctl:owner": owner}}},
        # What a launch only uses (images, subnets, security groups, a job's existing volume restored
        # from a snapshot): not created, so no tag on the request. Subnets: only this stack's (the list
        # LaunchInOwnSubnets holds launches to), so CreateNetworkInterface, which needs the subnet the
        # interface is made in (its required SubnetId, API_CreateNetworkInterface; the subnet is among
        # its resource types in the Service Authorization Reference's EC2 table), cannot make an
        # interface in another stack's subnets either.
        {"Sid": "LaunchUsing", "Effect": "Allow", "Action": ["ec2:RunInstances", "ec2:CreateVolume", "ec2:CreateNetworkInterface"],
         "Resource": [f"arn:aws:ec2:{region}::image/*", *own_subnets, f"{ec2}:security-group/*", f"{ec2}:key-pair/*",
                      f"{ec2}:launch-template/*"]},
        {"Sid": "UseOwned", "Effect": "Allow", "Action": ["ec2:RunInstances", "ec2:CreateVolume", "ec2:CreateSnapshot"],
         "Resource": [f"{ec2}:volume/*", f"{ec2}:snapshot/*"], "Condition": owned},
        # What RunInstances creates beside the instance: its root volume and primary network interface.
        # The provider tags only the instance in the request (terraform-provider-aws
        # internal/service/ec2/ec2_instance.go resourceInstanceCreate: TagSpecifications for the
        # instance, and for volumes only from volume_tags, unset here), so LaunchOwned cannot match
        # them. RunInstances evaluates neither with aws:ResourceTag or ec2:ResourceTag (Service
        # Authorization Reference, EC2, RunInstances row: network-interface takes aws:RequestTag,
        # aws:TagKeys, ec2:AssociatePublicIpAddress, ec2:AuthorizedService, ec2:AvailabilityZone,
        # ec2:NetworkInterfaceID, ec2:Subnet, ec2:Vpc and launch-template keys; volume likewise takes
        # aws:RequestTag but no resource tag: https://docs.aws.amazon.com/service-authorization/latest/
        # reference/list_amazonec2.html).
        # Hence unconditioned, as in the EC2 User Guide's RunInstances examples (ExamplePolicies_EC2.html).
        # A volume here is always a new one: RunInstances' block device mappings take no volume id
        # (API_EbsBlockDevice.html). A network interface may be an existing one (a multi-node master's,
        # NetworkInterfaceId), and the same row applies to it: no tag can tell this stack's interface
        # from another stack's, so the grant cannot be owner-gated (a per-node interface would not help).
        # What does bound it is LaunchInOwnSubnets below. A spot request RunInstances makes untagged is
        # not evaluated at all (ExamplePolicies_EC2.html, "Work with Spot Instances").
        {"Sid": "LaunchCreates", "Effect": "Allow", "Action": "ec2:RunInstances",
         "Resource": [f"{ec2}:volume/*", f"{ec2}:network-interface/*"]},
        # Every interface a launch creates or uses must be in this stack's subnets (ec2:Subnet, the
        # User Guide's "Subnets" example for RunInstances, as a Deny so no Allow above can widen it): an
        # existing interface of a stack in other subnets stays out of reach. One in this stack's own
        # subnets (another stack's sharing them, e.g. a default VPC's) cannot be told apart by IAM.
        {"Sid": "LaunchInOwnSubnets", "Effect": "Deny", "Action": "ec2:RunInstances",
         "Resource": f"{ec2}:network-interface/*",
         "Condition": {"ArnNotLike": {"ec2:Subnet": own_subnets}}},
        {"Sid": "TagOnCreate", "Effect": "Allow", "Action": "ec2:CreateTags", "Resource": f"{ec2}:*/*",
         "Condition": {"StringEquals": {"ec2:CreateAction": ["RunInstances", "CreateVolume", "CreateSnapshot",
                                                             "CreateNetworkInterface", "AllocateAddress",
                                                             *(["CreateLaunchTemplate"] if efa_templates else [])]}}},
        {"Sid": "ManageOwned", "Effect": "Allow",
         "Action": ["ec2:TerminateInstances", "ec2:StopInstances", "ec2:StartInstances", "ec2:ModifyInstanceAttribute",
                    "ec2:AttachVolume", "ec2:DetachVolume", "ec2:DeleteVolume", "ec2:ModifyVolume", "ec2:DeleteSnapshot",
                    "ec2:DeleteNetworkInterface", "ec2:AssociateAddress", "ec2:DisassociateAddress", "ec2:ReleaseAddress",
                    "ec2:CreateTags", "ec2:DeleteTags"],
         "Resource": [f"{ec2}:{kind}/*" for kind in TAGGED_ON_CREATE], "Condition": owned},
        # Deleting a spot instance first cancels its spot request (ec2_instance.go resourceInstanceDelete:
        # CancelSpotInstanceRequests when instance_lifecycle is spot). That request is untagged (above),
        # so no owner tag can scope it; cancelling never ends an instance ("Canceling a Spot Instance
        # request does not terminate running Spot Instances", API_CancelSpotInstanceRequests.html).
        {"Sid": "CancelSpotRequests", "Effect": "Allow", "Action": "ec2:CancelSpotInstanceRequests",
         "Resource": f"{ec2}:spot-instances-request/*"},
        # A job's own role and profile come and go with its VMs (infra/aws.py TrainingJob). The name
        # patterns only narrow to spotctl's roles: `spotctl-team-*` also matches stack team-b's. What
        # makes each grant this stack's exactly is the `spotctl:owner` tag (a hash of the exact stack
        # name) and this stack's permissions boundary: the IAM role resource type takes
        # aws:ResourceTag, the instance-profile type too, CreateRole/CreateInstanceProfile/TagRole
        # aws:RequestTag, and CreateRole, PutRolePolicy, DeleteRolePolicy, PutRolePermissionsBoundary
        # iam:PermissionsBoundary (Service Authorization Reference, IAM: https://docs.aws.amazon.com/
        # service-authorization/latest/reference/list_awsidentityandaccessmanagementiam.html). The
        # provider creates roles and profiles with their tags (tag-on-create: terraform-provider-aws
        # internal/service/iam/role.go, instance_profile.go), so RequestTag holds on create.
        {"Sid": "CreateJobRoles", "Effect": "Allow", "Action": "iam:CreateRole", "Resource": roles,
         "Condition": {"StringEquals": {"iam:PermissionsBoundary": boundary_arn, "aws:RequestTag/spotctl:owner": owner}}},
        # iam:PutRolePolicy cannot be limited by the policy's content; the boundary caps what any
        # inline policy of a job role can grant (infra/aws_common.py boundary_document).
        {"Sid": "ChangeBoundedJobRoles", "Effect": "Allow",
         "Action": ["iam:PutRolePolicy", "iam:DeleteRolePolicy", "iam:PutRolePermissionsBoundary"], "Resource": roles,
         "Condition": {"StringEquals": {"iam:PermissionsBoundary": boundary_arn, "aws:ResourceTag/spotctl:owner": owner}}},
        {"Sid": "ManageOwnedJobRoles", "Effect": "Allow",
         "Action": ["iam:GetRole", "iam:GetRolePolicy", "iam:ListRolePolicies", "iam:ListAttachedRolePolicies",
                    "iam:ListInstanceProfilesForRole", "iam:ListRoleTags", "iam:DeleteRole", "iam:TagRole", "iam:UntagRole"],
         "Resource": roles,
         # A tag request may not hand a role to another stack (IfExists: reads carry no request tags).
         "Condition": {"StringEquals": {"aws:ResourceTag/spotctl:owner": owner},
                       "StringEqualsIfExists": {"aws:RequestTag/spotctl:owner": owner}}},
        {"Sid": "CreateJobProfiles", "Effect": "Allow", "Action": "iam:CreateInstanceProfile", "Resource": profiles,
         "Condition": {"StringEquals": {"aws:RequestTag/spotctl:owner": owner}}},
        {"Sid": "ManageOwnedJobProfiles", "Effect": "Allow",
         "Action": ["iam:GetInstanceProfile", "iam:DeleteInstanceProfile", "iam:AddRoleToInstanceProfile",
                    "iam:RemoveRoleFromInstanceProfile", "iam:ListInstanceProfileTags", "iam:TagInstanceProfile",
                    "iam:UntagInstanceProfile"],
         "Resource": profiles,
         "Condition": {"StringEquals": {"aws:ResourceTag/spotctl:owner": owner},
                       "StringEqualsIfExists": {"aws:RequestTag/spotctl:owner": owner}}},
        {"Sid": "PassJobRoles", "Effect": "Allow", "Action": "iam:PassRole", "Resource": roles,
         "Condition": {"StringEquals": {"iam:PassedToService": "ec2.amazonaws.com", "aws:ResourceTag/spotctl:owner": owner}}},
        # The boundary stays: never removed from a role (a role without it could do anything its
        # inline policy says), never edited, and the ownership tag is never taken off.
        {"Sid": "KeepBoundaries", "Effect": "Deny",
         "Action": ["iam:DeleteRolePermissionsBoundary", "iam:CreatePolicyVersion", "iam:DeletePolicyVersion",
                    "iam:SetDefaultPolicyVersion", "iam:DeletePolicy"],
         "Resource": "*"},
        {"Sid": "KeepOwnerTags", "Effect": "Deny", "Action": ["iam:UntagRole", "iam:UntagInstanceProfile"], "Resource": "*",
         "Condition": {"ForAnyValue:StringEquals": {"aws:TagKeys": ["spotctl:owner"]}}},
        {"Sid": "JobInterruptionRules", "Effect": "Allow",
         "Action": ["events:DescribeRule", "events:PutRule", "events:DeleteRule", "events:PutTargets", "events:RemoveTargets",
                    "events:ListTargetsByRule", "events:ListTagsForResource", "events:TagResource", "events:UntagResource"],
         "Resource": rules},
        # A job's secret env values (infra/aws.py TrainingJob._env_secret): refreshed and, when they
        # change, rewritten by its targeted update; SecureStrings use the account's aws/ssm key.
        {"Sid": "JobSecretEnv", "Effect": "Allow",
         "Action": ["ssm:GetParameter", "ssm:GetParameters", "ssm:PutParameter", "ssm:DeleteParameter",
                    "ssm:ListTagsForResource", "ssm:AddTagsToResource", "ssm:RemoveTagsFromResource"],
         "Resource": f"arn:aws:ssm:{region}:*:parameter{ssm_parameter_name(slug, '*')}"},
    ]
    if pools:
        # The watcher publishes each pool's recorded demand every minute (cli/pools/record.py). PutMetricData
        # takes no resource-level permission; the namespace condition key is how IAM narrows it
        # (https://docs.aws.amazon.com/AmazonCloudWatch/latest/monitoring/iam-cw-condition-keys-namespace.html,
        # "Allowing publishing in one namespace only"). Dimensions cannot be conditioned on.
        statements.append({"Sid": "PublishPoolDemand", "Effect": "Allow", "Action": "cloudwatch:PutMetricData",
                           "Resource": "*", "Condition": {"StringEquals": {"cloudwatch:namespace": CLOUDWATCH_NAMESPACE}}})
    if efa_templates:
        # A p4d/p5 gang node's EFA launch template (infra/aws_efa.py) is a child of its job: a targeted
        # update creates it, versions it (a move's new subnet) and deletes it. The provider creates it
        # tagged (terraform-provider-aws ec2_launch_template.go resourceLaunchTemplateCreate:
        # TagSpecifications of the launch-template), so aws:RequestTag holds on create and
        # aws:ResourceTag after (Service Authorization Reference, EC2: the launch-template resource type
        # takes aws:ResourceTag; CreateLaunchTemplate takes aws:RequestTag).
        statements.append({"Sid": "CreateJobEfaTemplates", "Effect": "Allow", "Action": "ec2:CreateLaunchTemplate",
                           "Resource": f"{ec2}:launch-template/*",
                           "Condition": {"StringEquals": {"aws:RequestTag/spotctl:owner": owner}}})
        statements.append({"Sid": "ManageOwnedEfaTemplates", "Effect": "Allow",
                           "Action": ["ec2:CreateLaunchTemplateVersion", "ec2:ModifyLaunchTemplate",
                                      "ec2:DeleteLaunchTemplate", "ec2:DeleteLaunchTemplateVersions"],
                           "Resource": f"{ec2}:launch-template/*", "Condition": owned})
    if pool_fallback:
        # With fallbackToOnDemand a publication reads the shortage's history and the groups' instances
        # (cli/pools/demand.py publish); both are reads without resource-level permissions.
        statements.append({"Sid": "ObservePools", "Effect": "Allow",
                           "Action": ["cloudwatch:GetMetricStatistics", "autoscaling:DescribeAutoScalingGroups"],
                           "Resource": "*"})
    if secrets_provider == "passphrase":
        name = (passphrase_secret or "").lstrip("/")
        statements.append({"Sid": "ReadPassphrase", "Effect": "Allow", "Action": "ssm:GetParameter",
                           "Resource": f"arn:aws:ssm:{region}:*:parameter/{name}"})
    else:
        statements.append({"Sid": "StackSecrets", "Effect": "Allow",
                           "Action": ["kms:Encrypt", "kms:Decrypt", "kms:GenerateDataKey"],
                           "Resource": kms_key_arn(secrets_provider, region)})
    return {"Version": "2012-10-17", "Statement": statements}


def kms_key_arn(provider: str, region: str) -> str:
    """The key of an ``awskms://`` secrets provider as an IAM resource (config allows a key id or ARN)."""
    assert AWS_KMS_RE.fullmatch(provider), provider
    key = provider.removeprefix("awskms://").split("?")[0]
    return key if key.startswith("arn:") else f"arn:aws:kms:{region}:*:key/{key}"


class Watcher(pulumi.ComponentResource):
    """An on-demand instance (IMDSv2 only, encrypted gp3 root volume, no public IP unless the stack's
    egress needs one) in the watcher's zone, its own egress-only security group, and its role."""

    def __init__(self, name: str, args: StackArgs, base: Any, opts: pulumi.ResourceOptions | None = None):
        super().__init__("spotctl:aws:Watcher", name, None, opts)
        cfg = args.cfg
        w = cfg.watcher
        assert w is not None
        child = pulumi.ResourceOptions(parent=self)
        invoke = pulumi.InvokeOptions(parent=self)
        zone = cfg.watcher_zone
        physical = f"{args.slug}-watcher"
        tags = aws_tags(args.stack, cfg.labels, role="watcher")
        _, backend_bucket, backend_prefix = w.backend_parts()
        check_passrole_covers_job_roles(args.slug, f"{name}-policy")
        role = aws.iam.Role(
            f"{name}-role",
            name_prefix=f"spotctl-{args.slug}-watcher-"[:38],
            path=WATCHER_PATH,
            # No aws:SourceAccount condition (unlike the queue policy, infra/aws_base.py): EC2 assumes an
            # instance profile's role only for an instance of this account, launched by a principal that
            # passed the role (iam:PassRole, which cannot hand a role to another account's service:
            # https://docs.aws.amazon.com/IAM/latest/UserGuide/id_roles_use_passrole.html), and no AWS page
            # says EC2 sets aws:SourceAccount when it assumes it ("There is no public documentation which
            # lists all the services which supports the aws:SourceAccount", AWS Support quoted in
            # prowler-cloud/prowler#2810; such a condition broke roles of services that do not set it,
            # prowler#4714): a condition EC2 may not meet would make every VM's role unusable.
            assume_role_policy=json.dumps({"Version": "2012-10-17", "Statement": [
                {"Effect": "Allow", "Principal": {"Service": "ec2.amazonaws.com"}, "Action": "sts:AssumeRole"}]}),
            tags=tags,
            opts=child,
        )
        self.policy = aws.iam.RolePolicy(
            f"{name}-policy",
            role=role.id,
            policy=pulumi.Output.all(base.queue.arn, base.bucket.arn, base.boundary.arn).apply(lambda v: json.dumps(watcher_policy(
                region=cfg.region, slug=args.slug, owner=owner_value(args.stack), queue_arn=v[0], events_bucket_arn=v[1],
                backend_bucket=backend_bucket, backend_prefix=backend_prefix, secrets_provider=w.secrets_provider,
                passphrase_secret=w.passphrase_secret, boundary_arn=v[2],
                subnet_ids=sorted(s.id for s in base.subnets.values()), stack_file_key=shared_stack_file(args.stack),
                lease_key=watch_lease(args.stack), pools=any(p.spot_max > 0 for p in cfg.pools),
                pool_fallback=any(p.spot_max > 0 and p.fallback_to_on_demand is not None for p in cfg.pools),
                efa_templates=any(efa_gang(j, cfg.network.egress or "s3-endpoint") for j in cfg.jobs)))),
            opts=child,
        )
        profile = aws.iam.InstanceProfile(f"{name}-profile", name_prefix=f"spotctl-{args.slug}-watcher-"[:38],
                                          path=WATCHER_PATH, role=role.name, tags=tags, opts=child)
        subnet = base.subnets[zone]
        # Nothing connects to the watcher: egress only (the stack's node group also admits its nodes).
        group = aws.ec2.SecurityGroup(f"{name}-sg", description=f"spotctl {args.stack}: the watcher (egress only)",
                                      vpc_id=subnet.vpc_id, tags=tags, opts=child)
        aws.vpc.SecurityGroupEgressRule(f"{name}-sg-egress", security_group_id=group.id, ip_protocol="-1",
                                        cidr_ipv4="0.0.0.0/0", description="outbound: APIs, git, packages", tags=tags,
                                        opts=child)
        image = aws_common.image_of(aws.ec2.get_ami(most_recent=True, owners=[DEBIAN_OWNER], filters=[
            aws.ec2.GetAmiFilterArgs(name="name", values=[DEBIAN_AMI_NAME]),
            aws.ec2.GetAmiFilterArgs(name="architecture", values=["x86_64"])], opts=invoke))
        context = WatcherContext(
            cloud="aws", stack=args.stack, region=cfg.region, repo=w.repo, ref=w.ref, backend=w.backend,
            secrets_provider=w.secrets_provider, passphrase_secret=w.passphrase_secret or "",
            pulumi_version=w.pulumi_version, uv_version=w.uv_version,
        )
        user_data = aws_common.user_data_gzip_b64(watcher_script(context))
        # Under egress 's3-endpoint' the watcher has a public IP (config refuses it otherwise), so its boto3
        # calls (SSM for the passphrase and the jobs' secret env, Auto Scaling, EC2, SQS) go to the public
        # regional names, not to the stack's interface endpoints: those admit only the nodes' security group
        # and, without private DNS (infra/aws_base.py _interface_endpoint), no longer take over those names in the VPC.
        public = w.external_ip or base.egress == "public-ip"
        self.instance = aws.ec2.Instance(
            f"{name}-vm",
            ami=image.id,
            instance_type=w.machine("aws"),
            availability_zone=zone,
            subnet_id=subnet.id,
            vpc_security_group_ids=[group.id],
            associate_public_ip_address=public,
            iam_instance_profile=profile.name,
            metadata_options=aws_common._metadata_options(aws.ec2.InstanceMetadataOptionsArgs),
            root_block_device=aws.ec2.InstanceRootBlockDeviceArgs(
                volume_size=aws_common.root_volume_gb(w.disk_gb, image, f"{name}-vm"), volume_type="gp3", encrypted=True,
                delete_on_termination=True, tags=tags,
            ),
            user_data_base64=user_data,
            # User data runs once, at an instance's first boot (cloud-init), so a changed ref, backend or
            # version would never reach an instance updated in place: a change of the script replaces
            # the instance (ForceNewIf user_data_base64 when user_data_replace_on_change:
            # terraform-provider-aws internal/service/ec2/ec2_instance.go). Nothing is lost: the stack
            # file's live state is its shared copy in the event bucket, which the new VM's watcher takes
            # (never synced: cli/lifecycle/sync.py), and the journal only de-duplicates events that the
            # stack file's attempts already make stale. Delete before replace: the old watcher stops
            # (and releases the stack's lease in the event bucket, cli/watch/lease.py) before the new one
            # starts; one killed outright holds it until it expires, while the new VM still boots.
            user_data_replace_on_change=True,
            tags={**tags, "Name": physical},
            # User data runs at first boot: the NAT route must be there by then. A newer image alone
            # never replaces the VM.
            opts=pulumi.ResourceOptions(parent=self, ignore_changes=["ami"], delete_before_replace=True,
                                        depends_on=[self.policy, *base.egress_routes]),
        )
        self.register_outputs({"instance": self.instance.id, "role": role.arn})
