"""The AWS stack's shared pieces (``StackBase``): the event bucket, the interruption queue, the jobs'
security group, the network's egress (endpoints, NAT) and the permissions boundary of job roles."""

from __future__ import annotations

import json

import pulumi
import pulumi_aws as aws

from infra import contract
from infra.agent_object import aws_agent_object
from infra.aws_common import (
    _dns_name,
    _subnets,
    _tls_only_policy,
    boundary_document,
    boundary_name,
    regional_dns_name,
    rule_name,
)
from infra.common import (
    StackArgs,
)
from infra.config import StackConfig
from infra.naming import DEPLOYED_BUCKET_TAG, DEPLOYED_REGION_TAG, aws_tags, event_root


def queue_policy(queue_arn: str, region: str, slug: str) -> dict:
    """Only this stack's job rules (named by ``rule_name``) in this account may send to the queue.
    EventBridge delivers to SQS queues of other accounts too
    (https://docs.aws.amazon.com/eventbridge/latest/userguide/eb-service-cross-account.html), so a rule ARN
    with any account (``:*:``) let another account's rule of that name send: the ARN names the queue's own
    account (its ARN's fifth field), and ``aws:SourceAccount`` must be it, the confused-deputy guard for a
    service principal in a resource policy (https://docs.aws.amazon.com/IAM/latest/UserGuide/confused-deputy.html,
    https://docs.aws.amazon.com/IAM/latest/UserGuide/reference_policies_condition-keys.html#condition-keys-sourceaccount)."""
    account = queue_arn.split(":")[4]
    return {
        "Version": "2012-10-17",
        "Statement": [{
            "Effect": "Allow",
            "Principal": {"Service": "events.amazonaws.com"},
            "Action": "sqs:SendMessage",
            "Resource": queue_arn,
            "Condition": {"ArnLike": {"aws:SourceArn": f"arn:aws:events:{region}:{account}:rule/{rule_name(slug, '')}*"},
                          "StringEquals": {"aws:SourceAccount": account}},
        }],
    }


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
            # IAM names are account-wide: the region and the event bucket say which deployment of this
            # stack name owns the boundary, so `spotctl validate --cloud` can tell a second one, in another
            # region or in this one (cli/cloud/deployments.py).
            tags={**tags, DEPLOYED_REGION_TAG: cfg.region, DEPLOYED_BUCKET_TAG: self.bucket.bucket},
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
        # Egress only: node-to-node traffic is admitted per job, among its gang's members (TrainingJob's
        # gang group), as GCP's gang firewall does; pools' VMs and single-node jobs admit nothing.
        self.security_group = aws.ec2.SecurityGroup(
            f"{name}-nodes-sg",
            description=f"spotctl {args.stack}: egress of every job and pool VM",
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
        self.vpc_id, self._tags = vpc_id, tags
        self._endpoint_group: aws.ec2.SecurityGroup | None = None
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
        aws.sqs.QueuePolicy(
            f"{name}-interruptions-policy",
            queue_url=self.queue.url,
            policy=self.queue.arn.apply(lambda arn: json.dumps(queue_policy(arn, cfg.region, args.slug))),
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
        # protect themselves from scale-in through the Auto Scaling API (agent/storage.py
        # Cloud.protect; interface endpoint com.amazonaws.<region>.autoscaling:
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

    def _endpoints_group(self, name: str, child: pulumi.ResourceOptions) -> aws.ec2.SecurityGroup:
        """The interface endpoints' group: HTTPS (443) from the stack's VMs (the nodes group), nothing else."""
        if self._endpoint_group is None:
            self._endpoint_group = aws.ec2.SecurityGroup(
                f"{name}-endpoints-sg", description="spotctl: the stack's interface endpoints (HTTPS from its VMs)",
                vpc_id=self.vpc_id, tags=self._tags, opts=child)
            aws.vpc.SecurityGroupIngressRule(
                f"{name}-endpoints-sg-https", security_group_id=self._endpoint_group.id,
                referenced_security_group_id=self.security_group.id, ip_protocol="tcp", from_port=443, to_port=443,
                description="the stack's VMs call the AWS APIs through the endpoints", tags=self._tags, opts=child)
        return self._endpoint_group

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
        to (agent/storage.py aws_request signs the URL's host, which it sends)."""
        endpoint = aws.ec2.VpcEndpoint(
            f"{name}-{service}-endpoint",
            vpc_id=vpc_id,
            service_name=f"com.amazonaws.{cfg.region}.{service}",
            vpc_endpoint_type="Interface",
            subnet_ids=[subnet.id for subnet in self.subnets.values()],
            security_group_ids=[self._endpoints_group(name, child).id],
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
