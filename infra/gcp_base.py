"""The GCP stack's shared pieces (``StackBase``): the event bucket, the audit-log sink and its
Pub/Sub topic that report preemptions, and the egress (Cloud NAT)."""

from __future__ import annotations

import pulumi
import pulumi_gcp as gcp

from infra.agent_object import gcp_agent_object
from infra.common import (
    JobPlan,
    StackArgs,
)
from infra.gcp_common import (
    subnetwork_path,
)
from infra.naming import event_root, gcp_labels, short_hash

SYSTEM_EVENT_LOG_RE = "/logs/cloudaudit[.]googleapis[.]com%2Fsystem_event$"


def sink_filter(args: StackArgs, plans: list[JobPlan]) -> str:
    """Preemptions of this stack's VMs: an anchored regular expression over the instance names its
    jobs and pools get (``<slug>-...``), the same size whatever the number of jobs (a sink's filter
    may hold 20,000 characters: contract rule gcp.sink-filter-size). Another stack whose slug starts
    with this one's and a dash shares the prefix: the watcher acts only on a VM Compute Engine lists
    under this stack's owner label (cli/watch/observe.py). ``:`` would be a substring match, so the
    expression is anchored at both ends (contract rule gcp.sink-filter-exact)."""
    declared = bool(plans) or bool(args.cfg.pools)
    # Instance names never end with "-": with nothing declared the expression matches nothing.
    pattern = f"/instances/{args.slug}-[a-z0-9-]*[a-z0-9]$" if declared else f"/instances/{args.slug}-$"
    # Only Compute Engine's own System Event audit log: a job's service account may write log entries
    # (roles/logging.logWriter), and entries.write accepts any protoPayload, so a forged "preempted"
    # entry in a log of its own must not reach the topic (cli/watch/observe.py checks logName too).
    # A log ID has its "/" URL-encoded (%2F), so the anchored suffix names exactly that log; "[.]", not
    # "\\.", keeps the expression free of escapes inside the quoted string.
    return (
        'resource.type="gce_instance" AND protoPayload.methodName="compute.instances.preempted" '
        f'AND logName=~"{SYSTEM_EVENT_LOG_RE}" AND protoPayload.resourceName=~"{pattern}"'
    )


class Egress(pulumi.ComponentResource):
    """A Cloud Router + NAT for the stack's subnetwork, so VMs without external IPs reach GCS (events),
    package indexes and datasets. Only this subnetwork (LIST_OF_SUBNETWORKS): other subnetworks of a
    shared network stay as they are (contract rule gcp.nat-subnetworks)."""

    def __init__(self, name: str, args: StackArgs, opts=None):
        super().__init__("spotctl:gcp:Egress", name, None, opts)
        cfg = args.cfg
        child = pulumi.ResourceOptions(parent=self)
        router = gcp.compute.Router(
            f"{name}-router", name=f"{args.slug}-router", project=cfg.project, region=cfg.region,
            network=cfg.network.network, opts=child,
        )
        self.nat = gcp.compute.RouterNat(
            f"{name}-nat",
            name=f"{args.slug}-nat",
            project=cfg.project,
            region=cfg.region,
            router=router.name,
            nat_ip_allocate_option="AUTO_ONLY",
            source_subnetwork_ip_ranges_to_nat="LIST_OF_SUBNETWORKS",
            subnetworks=[
                gcp.compute.RouterNatSubnetworkArgs(
                    name=f"https://www.googleapis.com/compute/v1/{subnetwork_path(cfg)}",
                    source_ip_ranges_to_nats=["ALL_IP_RANGES"],
                )
            ],
            log_config=gcp.compute.RouterNatLogConfigArgs(enable=True, filter="ERRORS_ONLY"),
            opts=child,
        )
        self.register_outputs({"nat": self.nat.name})


class StackBase(pulumi.ComponentResource):
    """Per stack: the event bucket the scripts write to, the preemption log sink and the egress."""

    def __init__(self, name: str, args: StackArgs, plans: list[JobPlan] | None = None, opts=None):
        super().__init__("spotctl:gcp:StackBase", name, None, opts)
        cfg = args.cfg
        child = pulumi.ResourceOptions(parent=self)
        labels = gcp_labels(args.stack, cfg.labels)
        self.bucket = gcp.storage.Bucket(
            f"{name}-events",
            name=f"{args.slug}-events-{short_hash(cfg.project or '', args.stack, n=8)}",
            project=cfg.project,
            location=cfg.region.upper(),
            uniform_bucket_level_access=True,  # IAM conditions (per-job prefixes) need it
            public_access_prevention="enforced",
            versioning=gcp.storage.BucketVersioningArgs(enabled=False),
            lifecycle_rules=[
                gcp.storage.BucketLifecycleRuleArgs(
                    action=gcp.storage.BucketLifecycleRuleActionArgs(type="Delete"),
                    # Events and logs only (<stack>/...): the shared stack file beside them never expires (an
                    # object must match every condition: cloud.google.com/storage/docs/lifecycle, matchesPrefix).
                    condition=gcp.storage.BucketLifecycleRuleConditionArgs(age=cfg.event_retention_days,
                                                                           matches_prefixes=[event_root(args.stack)]),
                )
            ],
            labels=labels,
            force_destroy=False,
            opts=child,
        )
        self.agent = gcp_agent_object(name, self.bucket, self)
        self.topic = gcp.pubsub.Topic(f"{name}-preemptions", name=f"{args.slug}-preemptions", project=cfg.project, labels=labels, opts=child)
        self.sink = gcp.logging.ProjectSink(
            f"{name}-preempted-sink",
            name=f"{args.slug}-preempted",
            project=cfg.project,
            destination=self.topic.id.apply(lambda t: f"pubsub.googleapis.com/{t}"),
            filter=sink_filter(args, plans or []),
            unique_writer_identity=True,
            opts=child,
        )
        gcp.pubsub.TopicIAMMember(
            f"{name}-sink-publisher",
            topic=self.topic.name,
            project=cfg.project,
            role="roles/pubsub.publisher",
            member=self.sink.writer_identity,
            opts=child,
        )
        # The watcher's pull subscription on the sink's topic (`spotctl watch` acknowledges what it
        # handled). ttl "" = never expires: a subscription nobody pulls for 31 days would otherwise be
        # deleted (google_pubsub_subscription `expiration_policy`, terraform-provider-google docs).
        self.subscription = gcp.pubsub.Subscription(
            f"{name}-preemptions-watch",
            name=f"{args.slug}-preemptions-watch",
            topic=self.topic.id,
            project=cfg.project,
            ack_deadline_seconds=60,
            expiration_policy=gcp.pubsub.SubscriptionExpirationPolicyArgs(ttl=""),
            labels=labels,
            opts=child,
        )
        # VMs wait for the NAT, so their first events and downloads have a way out.
        self.egress: list[pulumi.Resource] = []
        if cfg.egress == "nat":
            self.egress = [Egress(f"{name}-egress", args, opts=child).nat]
        self.register_outputs({"eventBucket": self.bucket.name, "preemptionTopic": self.topic.name,
                               "preemptionSubscription": self.subscription.name})
