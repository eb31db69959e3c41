"""GCP rules on who may do what and where things go: the event bucket and its writers, the audit-log
sink, Cloud NAT and firewalls, managed instance groups and autoscalers, secrets, IAM conditions."""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from infra.contract.gcp_machines import (
    BUCKET,
    BUCKET_IAM_MEMBER,
    FIREWALL,
    PROJECT_IAM_MEMBER,
    PROJECT_SINK,
    REGION_MIG,
    ROUTER_NAT,
)
from infra.contract.rulebook import UNKNOWN, dig, known, rule


@rule("gcp.bucket-ubla", (BUCKET,),
      says="IAM conditions on a bucket (the per-job event prefixes) need uniform bucket-level access.",
      fix="gcp.storage.Bucket(uniform_bucket_level_access=True)",
      source="https://docs.cloud.google.com/storage/docs/access-control/using-iam-permissions, \"Use IAM Conditions on "
             "buckets\": \"You must enable uniform bucket-level access on the bucket before adding conditions.\"")
def bucket_ubla(type_: str, props: Mapping[str, Any]) -> str | None:
    ubla = props.get("uniform_bucket_level_access")
    return None if not known(ubla) or ubla is True else f"uniform_bucket_level_access is {ubla!r}"


PREFIX_CONDITION = re.compile(r'^resource\.name\.startsWith\("projects/_/buckets/[^/"]+/objects/[^"]+/"\)$')


@rule("gcp.event-writer-prefix", (BUCKET_IAM_MEMBER,),
      says="A VM identity may create event objects only under its own <stack>/<job or pool>/ prefix: resume trusts them.",
      fix="grant roles/storage.objectCreator with condition resource.name.startsWith(\"projects/_/buckets/B/objects/"
          "<stack>/<name>/\") (trailing slash, so 'train' does not cover 'train2')",
      source="https://cloud.google.com/iam/docs/conditions-resource-attributes (Cloud Storage object resource names "
             "projects/_/buckets/BUCKET/objects/OBJECT)")
def event_writer_prefix(type_: str, props: Mapping[str, Any]) -> str | None:
    if props.get("role") != "roles/storage.objectCreator":
        return None
    expr = dig(props, "condition.expression")
    if not known(expr):
        return None
    if not isinstance(expr, str) or not PREFIX_CONDITION.match(expr):
        return f"objectCreator granted with condition {expr!r}"
    return None


@rule("gcp.sink-filter-exact", (PROJECT_SINK,),
      says="The preemption sink must match its stack's instance names exactly: ':' is Logging's substring (has) "
           "operator, so 'team-a' would also catch 'team-ab'; and only Compute Engine's System Event audit log, "
           "since a job's service account may write entries of any shape into logs of its own.",
      fix="filter protoPayload.resourceName with an anchored regular expression (=~ \"/instances/(...)$\")",
      source="https://cloud.google.com/logging/docs/view/logging-query-language (\":\" has operator: \"doesn't contain "
             "the string ... anywhere inside it\"; =~ regular expression match)")
def sink_filter_exact(type_: str, props: Mapping[str, Any]) -> str | None:
    f = props.get("filter")
    if not known(f) or not isinstance(f, str):
        return None
    if re.search(r"protoPayload\.resourceName\s*:", f):
        return "filter uses the substring operator on protoPayload.resourceName"
    m = re.search(r'protoPayload\.resourceName\s*=~\s*"([^"]*)"', f)
    if m and not m.group(1).endswith("$"):
        return f"regular expression {m.group(1)!r} is not anchored at the end"
    log = re.search(r'logName\s*=~\s*"([^"]*)"', f)
    if not log or not log.group(1).endswith("%2Fsystem_event$"):
        return "filter does not restrict logName to the anchored System Event audit log (any log a job writes would pass)"
    return None


SINK_FILTER_MAX = 20_000


@rule("gcp.sink-filter-size", (PROJECT_SINK,),
      says=f"A sink's inclusion filter holds at most {SINK_FILTER_MAX:,} characters; one that grows with the stack's "
           "jobs (a name per job) is refused once the stack has a few hundred.",
      fix="match the stack's instance-name prefix, not each job's name (infra/gcp_base.py sink_filter)",
      source="https://cloud.google.com/logging/quotas (\"Length of a sink inclusion filter | 20,000 characters\")")
def sink_filter_size(type_: str, props: Mapping[str, Any]) -> str | None:
    f = props.get("filter")
    if not known(f) or not isinstance(f, str) or len(f) <= SINK_FILTER_MAX:
        return None
    return f"filter is {len(f):,} characters, more than {SINK_FILTER_MAX:,}"


@rule("gcp.nat-subnetworks", (ROUTER_NAT,),
      says="A Cloud NAT with LIST_OF_SUBNETWORKS must list its subnetworks; ALL_SUBNETWORKS_* would claim every "
           "subnetwork of the network in the region (no other NAT may exist there).",
      fix="LIST_OF_SUBNETWORKS with the stack's subnetwork (infra/gcp.py Egress)",
      source="pulumi_gcp/compute/router_nat.py RouterNat.source_subnetwork_ip_ranges_to_nat: \"if this field contains ALL_SUBNETWORKS_* then "
             "there should not be any other RouterNat section in any Router for this network in this region\"")
def nat_subnetworks(type_: str, props: Mapping[str, Any]) -> str | None:
    mode, subs = props.get("source_subnetwork_ip_ranges_to_nat"), props.get("subnetworks")
    if not known(mode, subs):
        return None
    if mode != "LIST_OF_SUBNETWORKS":
        return f"source_subnetwork_ip_ranges_to_nat is {mode!r}"
    return None if subs else "LIST_OF_SUBNETWORKS without subnetworks"


@rule("gcp.firewall-sources", (FIREWALL,),
      says="An INGRESS rule needs source_ranges, source_tags or source_service_accounts; service accounts cannot be "
           "mixed with tags.",
      fix="scope the gang rule by the job's service account on both sides (infra/gcp.py TrainingJob)",
      source="pulumi_gcp/compute/firewall.py Firewall.direction / source_service_accounts: \"For INGRESS traffic, one of source_ranges, "
             "source_tags or source_service_accounts is required\"; \"sourceServiceAccounts cannot be used at the same "
             "time as sourceTags or targetTags\"")
def firewall_sources(type_: str, props: Mapping[str, Any]) -> str | None:
    if props.get("direction", "INGRESS") != "INGRESS":
        return None
    keys = ("source_ranges", "source_tags", "source_service_accounts", "target_tags", "target_service_accounts")
    present = {k: props.get(k) for k in keys if props.get(k)}
    if not any(k in present for k in keys[:3]):
        return "INGRESS without a source"
    accounts = "source_service_accounts" in present or "target_service_accounts" in present
    if accounts and ("source_tags" in present or "target_tags" in present):
        return "service accounts mixed with tags"
    return None


rule("gcp.mig-no-wait-on-spot", (),
     says="wait_for_instances makes `pulumi up` wait until the group is stable and retry until timeout on failure: "
          "right for fixed on-demand groups (fail loudly), wrong for spot groups (a stockout would hang up).",
     fix="wait_for_instances=True only on the on-demand part of a pool (infra/gcp.py GpuPool)",
     source="pulumi_gcp/compute/region_instance_group_manager.py RegionInstanceGroupManager.wait_for_instances: \"if this is set to true and the operation "
            "does not succeed, the provider will continue trying until it times out\"")(None)


# Which MIG an autoscaler sizes is known only to the component that declares both, so this one is a
# context rule (infra/gcp.py GpuPool enforces it on every autoscaled part).
AUTOSCALED_SHAPES = ("EVEN", "BALANCED")
rule("gcp.autoscaled-mig-shape", (),
     says="An autoscaled regional MIG's target distribution shape is EVEN or BALANCED (ANY and ANY_SINGLE_ZONE "
          "cannot be autoscaled). BALANCED is the capacity-aware one: the autoscaler creates VMs in zones that "
          "have resource availability.",
     fix="distribution_policy_target_shape=\"BALANCED\" (with instance_redistribution_type NONE) on the autoscaled "
         "parts of a pool (infra/gcp.py GpuPool)",
     source="https://cloud.google.com/compute/docs/release-notes (October 30, 2024: \"You can autoscale a regional MIG "
            "with a BALANCED target distribution shape. With the BALANCED shape, the autoscaler is aware of the capacity "
            "in each zone and creates VMs in zones that have resource availability\"); "
            "https://cloud.google.com/compute/docs/instance-groups/regional-mig-set-target-distribution-shape, "
            "Limitations (zh-CN edition, the English one was not in the corpus: \"如果您要自动扩缩区域级 MIG，则必须将实例组的"
            "目标分布形状设置为 BALANCED（预览版）或 EVEN\"; an earlier English edition, quoted in a 2022 Google Terraform "
            "module's autoscaler.tf: \"If you want to autoscale a regional MIG, the following limitations apply: You "
            "must set the group's target distribution shape to EVEN.\")")(None)


def autoscaled_shape_problem(shape: Any) -> str | None:
    """What is wrong with the target shape of an autoscaled regional MIG, or None."""
    if not known(shape):
        return None
    return None if (shape or "EVEN") in AUTOSCALED_SHAPES else f"autoscaled with distribution_policy_target_shape {shape!r}"


@rule("gcp.mig-shape-redistribution", (REGION_MIG,),
      says="A regional MIG with target shape BALANCED or ANY_SINGLE_ZONE must have proactive instance "
           "redistribution off (update_policy.instance_redistribution_type NONE; PROACTIVE is the default).",
      fix="update_policy=RegionInstanceGroupManagerUpdatePolicyArgs(instance_redistribution_type=\"NONE\", ...)",
      source="https://cloud.google.com/compute/docs/instance-groups/distributing-instances-with-regional-instance-groups "
             "(\"Proactive instance redistribution is enabled by default. If you need ... to set the MIG's target "
             "distribution shape to BALANCED or ANY_SINGLE_ZONE, you must disable proactive instance redistribution.\"); "
             "pulumi_gcp RegionInstanceGroupManagerUpdatePolicyArgs.instance_redistribution_type: \"If `PROACTIVE` "
             "(default)\"")
def mig_shape_redistribution(type_: str, props: Mapping[str, Any]) -> str | None:
    shape = props.get("distribution_policy_target_shape")
    redistribution = dig(props, "update_policy.instance_redistribution_type")
    if not known(shape, redistribution) or shape not in ("BALANCED", "ANY_SINGLE_ZONE"):
        return None
    if redistribution == "NONE":
        return None
    return f"target shape {shape} with instance_redistribution_type {redistribution or 'PROACTIVE (the default)'}"


AUTOSCALERS = ["gcp:compute/regionAutoscaler:RegionAutoscaler", "gcp:compute/autoscaler:Autoscaler"]
SCALING_DOC = "https://cloud.google.com/compute/docs/autoscaler/scaling-cloud-monitoring-metrics"
METRIC_FILTER_DOC = ("https://cloud.google.com/compute/docs/reference/rest/v1/autoscalers "
                     "(autoscalingPolicy.customMetricUtilizations[].filter)")


def _policy(props: Mapping[str, Any]) -> Mapping[str, Any]:
    policy = props.get("autoscaling_policy")
    return policy if isinstance(policy, Mapping) else {}


def _per_group(metric: Mapping[str, Any]) -> bool:
    flt = metric.get("filter") or ""
    return metric.get("single_instance_assignment") is not None and 'resource.type = "gce_instance"' not in str(flt) \
        and "resource.type" in str(flt)


@rule("gcp.autoscaler-zero-needs-per-group-metric", AUTOSCALERS,
      says="A MIG scales below 1 VM only on per-group Monitoring metrics: \"When using per-instance metrics, the MIG "
           "cannot scale below a size of 1 VM\" (CPU and load balancing are per-instance signals).",
      fix="with min_replicas 0, scale only on a per-group metric: single_instance_assignment and a filter on a "
          "non-gce_instance resource type (infra/gcp.py _demand_policy)",
      source=SCALING_DOC + " (\"if you need to scale your MIG down to zero VMs from time to time, you can configure "
             "your MIG to scale using per-group metrics instead\")")
def zero_needs_per_group(type_: str, props: Mapping[str, Any]) -> str | None:
    policy = _policy(props)
    if policy.get("min_replicas") not in (0, 0.0):
        return None
    if policy.get("cpu_utilization") or policy.get("load_balancing_utilization"):
        return "min_replicas is 0 but the policy scales on CPU or load balancing (per-instance): it can never grow from zero"
    metrics = policy.get("metrics") or []
    if UNKNOWN in metrics or any(m is UNKNOWN for m in metrics):
        return None
    if not metrics:
        return "min_replicas is 0 but no metric is given (the default is CPU, per-instance)"
    bad = [m.get("name") for m in metrics if isinstance(m, Mapping) and not _per_group(m)]
    return f"min_replicas is 0 but metric(s) {bad} are per-instance" if bad else None


@rule("gcp.autoscaler-metric-filter", AUTOSCALERS,
      says="An autoscaler metric filter may only join selectors with AND and compare with = (no functions).",
      fix='write the filter as `a = "x" AND b = "y"` (infra/naming.py pool_metric_filter)',
      source=METRIC_FILTER_DOC + ": \"You can only use the AND operator for joining selectors. You can only use direct "
             "equality comparison operator (=) without any functions for each selector.\"")
def metric_filter(type_: str, props: Mapping[str, Any]) -> str | None:
    for m in _policy(props).get("metrics") or []:
        flt = m.get("filter") if isinstance(m, Mapping) else None
        if not isinstance(flt, str) or not flt:
            continue
        for selector in flt.split(" AND "):
            if not re.fullmatch(r'\s*[\w.]+ = "[^"]*"\s*', selector):
                return f"filter selector {selector.strip()!r} of metric {m.get('name')!r} is not `key = \"value\"`"
    return None


@rule("gcp.autoscaler-max-5-metrics", AUTOSCALERS,
      says="An autoscaler can use up to 5 Monitoring metrics per MIG.",
      fix="scale on fewer metrics (one demand metric per pool part is enough)",
      source=SCALING_DOC + " (limits: \"up to 5 Monitoring metrics per MIG\")")
def max_metrics(type_: str, props: Mapping[str, Any]) -> str | None:
    metrics = _policy(props).get("metrics") or []
    return f"{len(metrics)} metrics" if isinstance(metrics, list) and len(metrics) > 5 else None


rule("gcp.zonal-disk-same-zone", (),
     says="A zonal persistent disk attaches only to VMs in its zone; snapshots are global by default and restore "
          "into a new disk in any zone of the project, which is how a job's disk moves to another zone.",
     fix="spotctl move JOB --to-zone ZONE (snapshot, restore in the new zone, start there, release the old disk)",
     source="https://docs.cloud.google.com/compute/docs/disks/create-snapshots (\"Snapshots are, by default, global "
            "resources, so you can use them to restore data to a new disk or VM within the same project.\"); "
            "https://docs.cloud.google.com/compute/docs/instances/moving-instance-across-zones")(None)


SECRET = "gcp:secretmanager/secret:Secret"
SECRET_VERSION = "gcp:secretmanager/secretVersion:SecretVersion"
SECRET_ID_RE = re.compile(r"[A-Za-z0-9_-]{1,255}")


@rule("gcp.secret-id", [SECRET],
      says="A Secret Manager secret ID is at most 255 characters of letters, digits, hyphens and underscores.",
      fix="name job secrets through infra/naming.py secret_id (spotctl-<stack slug>-<job id>-env)",
      source="https://cloud.google.com/secret-manager/docs/reference/rest/v1/projects.secrets/create (secretId: "
             "\"a string with a maximum length of 255 characters and can contain uppercase and lowercase letters, "
             "numerals, and the hyphen (-) and underscore (_) characters\")")
def secret_id_rule(type_: str, props: Mapping[str, Any]) -> str | None:
    value = props.get("secret_id")
    if not isinstance(value, str):
        return None
    return None if SECRET_ID_RE.fullmatch(value) else f"secret_id {value!r}"


@rule("gcp.secret-payload-64k", [SECRET_VERSION],
      says="A Secret Manager secret version's data must be no larger than 64 KiB.",
      fix="keep a job's secret env values under 48 KiB in all (base64 makes them 4/3 longer)",
      source="https://cloud.google.com/secret-manager/docs/reference/rest/v1/SecretPayload (data: \"Must be no larger "
             "than 64KiB\")")
def secret_payload_rule(type_: str, props: Mapping[str, Any]) -> str | None:
    data = props.get("secret_data")
    if not isinstance(data, str):
        return None
    size = len(data.encode())
    # Never the data itself in the message: it is a secret.
    return f"the data is {size} bytes; at most 65536" if size > 65536 else None


# https://cloud.google.com/iam/quotas ("Limits", "Policies and bindings").
MAX_LOGIC_OPERATORS = 12
MAX_CONDITIONAL_BINDINGS = 20
CONDITIONED_IAM_MEMBERS = (PROJECT_IAM_MEMBER, BUCKET_IAM_MEMBER)


def logic_operators(expression: str) -> int:
    """&&, || and ! (not !=) in a CEL expression, outside string literals: the operators IAM counts."""
    count, i, quoted = 0, 0, False
    while i < len(expression):
        c = expression[i]
        if c == '"':
            quoted = not quoted
        elif not quoted and expression[i:i + 2] in ("&&", "||"):
            count, i = count + 1, i + 1
        elif not quoted and c == "!" and expression[i + 1:i + 2] != "=":
            count += 1
        i += 1
    return count


@rule("gcp.condition-logic-operators-12", CONDITIONED_IAM_MEMBERS,
      says="A role binding's condition expression may hold at most 12 logic operators (&&, ||, !); IAM refuses "
           "the allow policy otherwise.",
      fix="split the condition over several bindings of the role (infra/gcp_watcher.py compute_conditions packs them)",
      source="https://cloud.google.com/iam/quotas (\"Logic operators in a binding's condition expression: 12\")")
def condition_logic_operators(type_: str, props: Mapping[str, Any]) -> str | None:
    expression = dig(props, "condition.expression")
    if not isinstance(expression, str):
        return None
    n = logic_operators(expression)
    return f"the condition has {n} logic operators" if n > MAX_LOGIC_OPERATORS else None


rule("gcp.conditional-bindings-20", (),
     says="An allow policy holds at most 20 role bindings with the same role and member but different conditions.",
     fix="fewer zones, or fewer stacks whose names extend this one's, per watcher",
     source="https://cloud.google.com/iam/quotas (\"Role bindings in a policy that include the same role and the same "
            "member, but different condition expressions: 20\")")(None)


rule("gcp.watcher-condition-covers-names", (),
     says="IAM conditions on Compute Engine see the resource name (projects/P/zones/Z/instances/NAME, "
          "projects/P/zones/Z/disks/NAME, projects/P/global/snapshots/NAME), never labels: the watcher's compute "
          "role must name every instance, disk and snapshot a job of the stack gets.",
     fix="keep infra/gcp_watcher.py name_locations in step with infra/naming.py; a job named like another stack's "
         "(job b-x of stack team and job x of stack team-b share their names) must be renamed",
     source="https://cloud.google.com/iam/docs/conditions-resource-attributes (resource service, type and "
            "\"the format for resource name strings\"; compute.googleapis.com/Instance, Disk listed)")(None)
