"""AWS rules for what runs beside the jobs: the publisher of pool demand, a multi-node gang's
placement and EFA, and the event bucket at ``pulumi destroy``."""

from __future__ import annotations

from infra.contract.rulebook import rule

# EFA-capable GPU types spotctl's catalog offers for multi-node jobs, and their EFA interfaces
# (DescribeInstanceTypes NetworkInfo.EfaInfo.MaximumEfaInterfaces, https://docs.aws.amazon.com/AWSEC2/
# latest/APIReference/API_EfaInfo.html; p5: "32 EFA devices", efa-acc-inst-types.html#efa-for-p5;
# p4d.24xlarge: 4 network cards, one EFA each, https://aws.amazon.com/ec2/instance-types/p4/).
EFA_INTERFACES = {"p4d.24xlarge": 4, "p5.48xlarge": 32, "p5e.48xlarge": 32}


def efa_interfaces(instance_type: str) -> int:
    """EFA interfaces of ``instance_type`` (0: no EFA, or not a type spotctl gangs over EFA)."""
    return EFA_INTERFACES.get(instance_type, 0)


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
          "(spotctl:region); `spotctl validate --cloud` refuses a stack whose boundary was made in another region or "
          "by another stack with the same slug.",
     fix="give the second deployment another stack name",
     source="https://docs.aws.amazon.com/IAM/latest/APIReference/API_CreatePolicy.html (EntityAlreadyExists); "
            "https://docs.aws.amazon.com/autoscaling/ec2/APIReference/API_CreateAutoScalingGroup.html "
            "(AutoScalingGroupName: \"unique per Region per account\")",
     lookup="the account's IAM policy spotctl-<slug>-boundary and its tags (iam:ListPolicyTags)")(None)
