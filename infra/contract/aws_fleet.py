"""AWS rules for what runs beside the jobs: the publisher of pool demand, a multi-node gang's
placement and EFA, and the event bucket at ``pulumi destroy``."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from infra.contract.rulebook import dig, known, rule

# EFA-capable GPU types spotctl's catalog offers for multi-node jobs, and their EFA interfaces
# (DescribeInstanceTypes NetworkInfo.EfaInfo.MaximumEfaInterfaces, https://docs.aws.amazon.com/AWSEC2/
# latest/APIReference/API_EfaInfo.html; p5: "32 EFA devices", efa-acc-inst-types.html#efa-for-p5;
# p4d.24xlarge: 4 network cards, one EFA each, https://aws.amazon.com/ec2/instance-types/p4/).
EFA_INTERFACES = {"p4d.24xlarge": 4, "p5.48xlarge": 32, "p5e.48xlarge": 32}


def efa_interfaces(instance_type: str) -> int:
    """EFA interfaces of ``instance_type`` (0: no EFA, or not a type spotctl gangs over EFA)."""
    return EFA_INTERFACES.get(instance_type, 0)


def efa_layout(instance_type: str) -> list[tuple[int, int]]:
    """(network card index, device index) of each EFA interface a gang node gets beside its primary
    ENA interface (card 0, device 0): one per network card, device 1 on every card (on card 0 device
    0 is the primary). The EC2 User Guide's basic configuration
    (https://docs.aws.amazon.com/AWSEC2/latest/UserGuide/efa-acc-inst-types.html): primary ENA on card
    0 device 0, an EFA on card 0 device 1, one on each further card; device 1 on those cards as well,
    as AWS PCS's two-card template does (https://docs.aws.amazon.com/pcs/latest/userguide/
    working-with_networking_efa_create-lt.html). Type ``efa`` (EFA with ENA), not ``efa-only``: the
    provider's launch template accepts only ``efa`` and ``interface`` (terraform-provider-aws
    internal/service/ec2/ec2_launch_template.go, network_interfaces.interface_type
    StringInSlice{"efa", "interface"}); each such interface takes one private IP of the subnet."""
    return [(card, 1) for card in range(efa_interfaces(instance_type))]


rule("aws.watcher-publishes-pool-demand", [],
     says="A pool's alarm evaluates one-minute periods and, without a point, goes to INSUFFICIENT_DATA and the group keeps "
          "its size: the demand must be published every minute. The watcher publishes each pool's recorded demand "
          "(its event bucket's <stack>.spotctl/pools/<pool>.demand) every minute, so its role holds "
          "cloudwatch:PutMetricData in spotctl's namespace only; it reaches CloudWatch's public endpoint (config "
          "requires a public IP or a routed egress for it).",
     fix="declare spotctl:watcher, or publish `spotctl pool demand` every minute from elsewhere",
     source="https://docs.aws.amazon.com/AmazonCloudWatch/latest/monitoring/iam-cw-condition-keys-namespace.html "
            "(\"Allowing publishing in one namespace only\": cloudwatch:PutMetricData with StringEquals "
            "cloudwatch:namespace); https://docs.aws.amazon.com/AmazonCloudWatch/latest/monitoring/"
            "AlarmThatSendsEmail.html (\"Configuring how CloudWatch alarms treat missing data\")")(None)

rule("aws.efa-cluster-placement", [],
     says="A multi-node job on an EFA type (p4d, p5) runs NCCL over EFA: its nodes share a cluster placement group "
          "(one zone, the low-latency segment) and their gang security group admits all traffic from itself and "
          "sends all traffic to itself, as EFA's OS-bypass traffic needs.",
     fix="keep a multi-node EFA job in one zone (spotctl moves the whole gang)",
     source="https://docs.aws.amazon.com/AWSEC2/latest/UserGuide/placement-strategies.html (cluster: \"packs instances "
            "close together inside an Availability Zone ... low-latency network performance necessary for tightly-coupled "
            "node-to-node communication\"); https://docs.aws.amazon.com/AWSEC2/latest/UserGuide/efa-start.html "
            "(\"Prepare an EFA-enabled security group\": all inbound and all outbound traffic to and from the security "
            "group itself); https://docs.aws.amazon.com/pcs/latest/userguide/working-with_networking_efa_create-sg.html")(None)

rule("aws.event-bucket-kept-at-destroy", [],
     says="The event bucket is declared with force_destroy false: `pulumi destroy` fails with BucketNotEmpty while it "
          "holds events, the shared stack file or the watch lease, so a destroy never deletes a stack's record "
          "unasked. Empty it first (docs/guides/cloud-aws.md).",
     fix="empty the bucket (aws s3 rm s3://<eventBucket> --recursive), then `pulumi destroy` again",
     source="pulumi-aws sdk/python/pulumi_aws/s3/bucket.py force_destroy (\"all objects ... should be deleted from the "
            "bucket when the bucket is destroyed so that the bucket can be destroyed without error. These objects are "
            "not recoverable\"); terraform-provider-aws internal/service/s3/bucket.go resourceBucketDelete (BucketNotEmpty)")(None)


def cluster_placement_problem(instance_type: str, nodes: int) -> str | None:
    """What is wrong with a cluster placement group for this job (None: nothing); only a gang of an
    EFA type gets one (a single node gains nothing)."""
    if nodes < 2:
        return f"{nodes} node(s): a cluster placement group is for a gang"
    if not efa_interfaces(instance_type):
        return f"{instance_type} has no EFA"
    return None


rule("aws.stack-name-once-per-account", [],
     says="IAM names are account-wide: a stack name deployed twice in one account (another region, another backend) "
          "shares its permissions boundary's name spotctl-<slug>-boundary, and its Auto Scaling groups, alarms, rules "
          "and SSM parameters are named per region. The boundary carries its deployment's region "
          "(spotctl:region) and event bucket (spotctl:events, unique per deployment); `spotctl validate --cloud` "
          "refuses a stack whose boundary was made in another region, in this region with another event bucket, or "
          "by another stack with the same slug.",
     fix="give the second deployment another stack name",
     source="https://docs.aws.amazon.com/IAM/latest/APIReference/API_CreatePolicy.html (EntityAlreadyExists); "
            "https://docs.aws.amazon.com/autoscaling/ec2/APIReference/API_CreateAutoScalingGroup.html "
            "(AutoScalingGroupName: \"unique per Region per account\")",
     lookup="the account's IAM policy spotctl-<slug>-boundary and its tags (iam:ListPolicyTags)")(None)


@rule("aws.efa-interfaces", ["aws:ec2/launchTemplate:LaunchTemplate"],
      says="A launch template that gives a p4d/p5 node EFA interfaces has its primary interface on network card 0 "
           "device 0, one EFA per network card of the type (no more: one EFA per card), each EFA interface in a "
           "security group (the gang's, which admits and sends all traffic to itself), and no public IPv4 to "
           "assign: EC2 assigns one only to a launch with a single network interface.",
      fix="build the template with infra/aws_efa.py efa_template (egress nat or s3-endpoint for an EFA gang)",
      source="https://docs.aws.amazon.com/AWSEC2/latest/UserGuide/efa-acc-inst-types.html (one EFA per network card; "
             "primary on card 0, device 0); https://docs.aws.amazon.com/pcs/latest/userguide/"
             "working-with_networking_efa_create-lt.html (\"Every EFA needs the security group that enables EFA "
             "traffic\"; templates with interfaces take no SecurityGroupIds); InstanceNetworkInterfaceSpecification "
             "AssociatePublicIpAddress, EC2 API Reference (\"You cannot specify more than one network interface in "
             "the request\")")
def efa_template_interfaces(type_: str, props: Mapping[str, Any]) -> str | None:
    nics = props.get("network_interfaces")
    itype = props.get("instance_type")
    if not known(nics, itype) or not isinstance(nics, list):
        return None
    efa = [n for n in nics if dig(n, "interface_type") == "efa"]
    if not efa:
        return None
    want = efa_interfaces(itype or "")
    if not want:
        return f"{itype} is not an EFA type spotctl gangs ({', '.join(EFA_INTERFACES)})"
    cards = [dig(n, "network_card_index") or 0 for n in efa]
    if sorted(cards) != list(range(want)):
        return f"EFA interfaces on network cards {sorted(cards)}; {itype} takes one on each of cards 0..{want - 1}"
    places = [((dig(n, "network_card_index") or 0), (dig(n, "device_index") or 0)) for n in nics]
    if (0, 0) not in places or len(set(places)) != len(places):
        return f"interfaces at (card, device) {places}: one primary at (0, 0), no place twice"
    if any(not dig(n, "security_groups") for n in efa):
        return "an EFA interface without a security group (EFA's self-referencing group)"
    if len(nics) > 1 and any(dig(n, "associate_public_ip_address") in (True, "true") for n in nics):
        return f"a public IPv4 asked for on a launch with {len(nics)} network interfaces"
    return None
