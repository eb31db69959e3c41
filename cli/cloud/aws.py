"""AWS side of the cloud boundary (boto3; credentials and endpoint from the environment)."""

from __future__ import annotations

import threading
from collections.abc import Mapping
from datetime import datetime, timedelta

from cli.cloud.types import METRICS_FRESH, CloudDisk, CloudSnapshot, Message, PoolView, PoolVm, Stored, VmState, bounded_reads
from infra.basics import counted
from infra.naming import CLOUDWATCH_NAMESPACE, POOL_METRICS, pool_metric_dimensions

SPOT_TERMINATION_CODES = ("Server.SpotInstanceTermination", "Server.SpotInstanceShutdown")




class AwsInventory:
    """EBS volumes tagged with this stack (boto3; credentials and endpoint from the environment)."""

    def __init__(self, region: str, stack: str, client=None):
        import boto3

        self.stack = stack
        self.ec2 = client or boto3.client("ec2", region_name=region)

    def disks(self) -> list[CloudDisk]:
        pages = self.ec2.get_paginator("describe_volumes").paginate(Filters=[{"Name": "tag:spotctl:stack", "Values": [self.stack]}])
        out = []
        for page in pages:
            for v in page["Volumes"]:
                tags = {t["Key"]: t["Value"] for t in v.get("Tags", [])}
                # CreateTime: "The time stamp when volume creation was initiated" (EC2 Volume; boto3: aware UTC)
                out.append(CloudDisk(v["VolumeId"], v["AvailabilityZone"], tags, in_use=v["State"] != "available",
                                     created=v.get("CreateTime")))
        return out

    def delete(self, disk: CloudDisk) -> None:
        self.ec2.delete_volume(VolumeId=disk.id)

    def snapshots(self) -> list[CloudSnapshot]:
        """This account's EBS snapshots tagged with this stack (a move's snapshots)."""
        pages = self.ec2.get_paginator("describe_snapshots").paginate(
            OwnerIds=["self"], Filters=[{"Name": "tag:spotctl:stack", "Values": [self.stack]}])
        out = []
        for page in pages:
            for s in page["Snapshots"]:
                tags = {t["Key"]: t["Value"] for t in s.get("Tags", [])}
                out.append(CloudSnapshot(s["SnapshotId"], "", tags, created=s.get("StartTime")))
        return out

    def delete_snapshot(self, snap: CloudSnapshot) -> None:
        self.ec2.delete_snapshot(SnapshotId=snap.id)


class AwsObserver:
    def __init__(self, region: str, stack: str, client=None):
        import boto3

        self.stack = stack
        self.ec2 = client or boto3.client("ec2", region_name=region)

    def vms(self, job_id: str) -> list[VmState]:
        filters = [{"Name": "tag:spotctl:stack", "Values": [self.stack]}, {"Name": "tag:spotctl:job", "Values": [job_id]}]
        out = []
        for page in self.ec2.get_paginator("describe_instances").paginate(Filters=filters):
            for reservation in page["Reservations"]:
                for i in reservation["Instances"]:
                    tags = {t["Key"]: t["Value"] for t in i.get("Tags", [])}
                    code = i.get("StateReason", {}).get("Code", "")
                    out.append(VmState(tags.get("Name", i["InstanceId"]), int(tags.get("spotctl:node", 0)),
                                       int(tags.get("spotctl:attempt", 0)), i["State"]["Name"],
                                       code in SPOT_TERMINATION_CODES, code))
        return out


def s3_objects(region: str, bucket: str, prefix: str, skip: frozenset[str] = frozenset(),
               suffix: str = "") -> dict[str, bytes | None]:
    """Every key under ``prefix`` ending in ``suffix`` -> its content, None for the keys in ``skip``
    (already read: event objects are written once and never change)."""
    import boto3

    s3 = boto3.client("s3", region_name=region)
    return {key: None if key in skip else s3.get_object(Bucket=bucket, Key=key)["Body"].read()
            for key in s3_names(region, bucket, prefix, s3) if key.endswith(suffix)}


def s3_names(region: str, bucket: str, prefix: str, s3=None) -> list[str]:
    """Every key under ``prefix`` (ListObjectsV2, every page), without reading any object."""
    return [obj["Key"] for obj in _s3_listing(region, bucket, prefix, s3)]


def _s3_listing(region: str, bucket: str, prefix: str, s3=None) -> list[dict]:
    """ListObjectsV2's ``Contents`` under ``prefix`` (every page): Key, Size, ETag of each object."""
    import boto3

    s3 = s3 or boto3.client("s3", region_name=region)
    return [obj for page in s3.get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=prefix)
            for obj in page.get("Contents", [])]


def s3_stored(region: str, bucket: str, prefix: str, suffix: str, known: Mapping[str, str], limit: int) -> list[Stored]:
    """``Cloud.stored_objects`` on S3: the listing's Size and ETag decide what is read; a read asks for
    the first ``limit + 1`` bytes only (GetObject ``Range``: docs.aws.amazon.com/AmazonS3/latest/API/
    API_GetObject.html), so an object replaced by a larger one after the listing is still bounded."""
    s3 = _s3(region)

    listing = ((o["Key"], str(o.get("ETag", "")), int(o.get("Size", 0))) for o in _s3_listing(region, bucket, prefix, s3))
    return bounded_reads(listing, suffix, known, limit, _s3_fetcher(s3, bucket, limit))


def _s3_fetcher(s3, bucket: str, limit: int):
    """(key, generation) -> the first ``limit + 1`` bytes (GetObject ``Range``) and the ETag read."""

    def fetch(key: str, generation: str) -> tuple[bytes, str]:
        got = s3.get_object(Bucket=bucket, Key=key, Range=f"bytes=0-{limit}")
        return got["Body"].read(limit + 1), str(got.get("ETag", generation))

    return fetch


def s3_stored_since(region: str, bucket: str, prefix: str, after: str | None, suffix: str, known: Mapping[str, str],
                    limit: int) -> tuple[list[Stored], list[str]]:
    """``Cloud.stored_since`` on S3: ListObjectsV2 with ``Delimiter`` (sub-folders come back as
    CommonPrefixes, their objects unlisted) and ``StartAfter`` ("where you want Amazon S3 to start
    listing from ... after this specified key": docs.aws.amazon.com/AmazonS3/latest/API/API_ListObjectsV2.html)."""
    s3 = _s3(region)

    objects, folders = [], []
    for page in s3.get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=prefix, Delimiter="/",
                                                            **({"StartAfter": after} if after else {})):
        objects += [(o["Key"], str(o.get("ETag", "")), int(o.get("Size", 0))) for o in page.get("Contents", [])]
        folders += [p["Prefix"] for p in page.get("CommonPrefixes", [])]
    return bounded_reads(objects, suffix, known, limit, _s3_fetcher(s3, bucket, limit)), folders


# Filters of a Linux, shared-tenancy, no-preinstalled-software on-demand price (the same attributes
# the AWS provider documents for aws.pricing.getProduct: pulumi registry aws/api-docs/pricing/getproduct;
# regionCode is an attribute of every EC2 product in the Price List).
PRICE_FILTERS = {"operatingSystem": "Linux", "tenancy": "Shared", "preInstalledSw": "NA",
                 "licenseModel": "No License required", "capacitystatus": "Used"}


def aws_prices(region: str, instance_types: list[str], ec2=None, pricing=None) -> dict[str, tuple[float, float, str]]:
    """{type: (spot, on-demand, source)} from the account's view: the newest EC2 spot price of each
    zone of the region (DescribeSpotPriceHistory, Linux/UNIX), averaged over the zones, and the
    on-demand price from the AWS Price List (GetProducts; its endpoint is in us-east-1). Types
    without both are left out."""
    import json
    from datetime import UTC, datetime

    import boto3

    ec2 = ec2 or boto3.client("ec2", region_name=region)
    pricing = pricing or boto3.client("pricing", region_name="us-east-1")
    out = {}
    for itype in instance_types:
        newest: dict[str, tuple[datetime, float]] = {}
        pages = ec2.get_paginator("describe_spot_price_history").paginate(
            InstanceTypes=[itype], ProductDescriptions=["Linux/UNIX", "Linux/UNIX (Amazon VPC)"], StartTime=datetime.now(UTC))
        for page in pages:
            for h in page["SpotPriceHistory"]:
                when = h["Timestamp"]
                if h["AvailabilityZone"] not in newest or when > newest[h["AvailabilityZone"]][0]:
                    newest[h["AvailabilityZone"]] = (when, float(h["SpotPrice"]))
        filters = [{"Type": "TERM_MATCH", "Field": k, "Value": v}
                   for k, v in {"instanceType": itype, "regionCode": region, **PRICE_FILTERS}.items()]
        listed = []
        for doc in pricing.get_products(ServiceCode="AmazonEC2", Filters=filters, MaxResults=10)["PriceList"]:
            product = json.loads(doc) if isinstance(doc, str) else doc
            for term in product.get("terms", {}).get("OnDemand", {}).values():
                listed += [float(d["pricePerUnit"]["USD"]) for d in term.get("priceDimensions", {}).values()]
        od = next((p for p in listed if p > 0), None)  # $0 dimensions are reservations' placeholders
        if newest and od is not None:
            spot = sum(p for _, p in newest.values()) / len(newest)
            out[itype] = (spot, od, f"AWS APIs, {datetime.now(UTC).date()}: spot price history (mean of {counted(len(newest), 'zone')}), Price List on-demand")
    return out


class AwsPools:
    """Pool demand in CloudWatch, the pool's Auto Scaling groups and their instances (boto3)."""

    def __init__(self, region: str, stack: str):
        import boto3

        self.stack = stack
        self.cloudwatch = boto3.client("cloudwatch", region_name=region)
        self.autoscaling = boto3.client("autoscaling", region_name=region)
        self.ec2 = boto3.client("ec2", region_name=region)

    def _dimensions(self, pool: str) -> list[dict[str, str]]:
        return [{"Name": k, "Value": v} for k, v in pool_metric_dimensions(self.stack, pool).items()]

    def publish(self, pool: str, values: dict[str, float], at: datetime) -> None:
        data = [{"MetricName": name, "Dimensions": self._dimensions(pool), "Timestamp": at, "Value": float(value), "Unit": "Count"}
                for name, value in values.items()]
        self.cloudwatch.put_metric_data(Namespace=CLOUDWATCH_NAMESPACE, MetricData=data)

    def history(self, pool: str, metric: str, since: datetime, until: datetime) -> list[tuple[datetime, float]]:
        """The metric's per-minute maxima in [since, until], oldest first."""
        got = self.cloudwatch.get_metric_statistics(
            Namespace=CLOUDWATCH_NAMESPACE, MetricName=metric, Dimensions=self._dimensions(pool),
            StartTime=since, EndTime=until, Period=60, Statistics=["Maximum"],
        )
        return sorted((p["Timestamp"], float(p["Maximum"])) for p in got["Datapoints"])

    def view(self, pool: str, groups: dict[str, str], since: datetime, until: datetime) -> PoolView:
        """``groups``: part name of the group's first instances ("spot" for the mixed group) -> ASG name."""
        found = self.autoscaling.describe_auto_scaling_groups(AutoScalingGroupNames=list(groups.values()))["AutoScalingGroups"]
        by_name = {g["AutoScalingGroupName"]: g for g in found}
        ids = [i["InstanceId"] for g in found for i in g.get("Instances", [])]
        spot = set()
        for page in self.ec2.get_paginator("describe_instances").paginate(InstanceIds=ids) if ids else []:
            for reservation in page["Reservations"]:
                spot.update(i["InstanceId"] for i in reservation["Instances"] if i.get("InstanceLifecycle") == "spot")
        targets: dict[str, int] = {}
        vms: list[PoolVm] = []
        preemptions: list[str] = []
        for key, name in groups.items():
            group = by_name.get(name)
            if group is None:
                continue
            targets[key] = int(group["DesiredCapacity"])
            for i in group.get("Instances", []):
                part = "fallback" if key == "fallback" else ("spot" if i["InstanceId"] in spot else "ondemand")
                vms.append(PoolVm(i["InstanceId"], part, i["AvailabilityZone"], i.get("InstanceType", ""),
                                  i["LifecycleState"], bool(i.get("ProtectedFromScaleIn"))))
            for activity in self.autoscaling.describe_scaling_activities(AutoScalingGroupName=name).get("Activities", []):
                text = f"{activity.get('Cause', '')} {activity.get('StatusMessage', '')}"
                if "interruption" in text.lower() and activity["StartTime"] >= since:
                    preemptions.append(f"{activity['StartTime']:%Y-%m-%dT%H:%M:%SZ} {activity.get('Description', '')}")
        metrics = {}
        for metric in POOL_METRICS:
            # The end is exclusive (to the second): include what was published this very minute.
            points = self.history(pool, metric, max(since, until - METRICS_FRESH), until + timedelta(minutes=1))
            if points:
                metrics[metric] = points[-1][1]
        return PoolView(targets, vms, metrics, sorted(preemptions, reverse=True))


def _vm(i: dict) -> tuple[str, VmState]:
    tags = {t["Key"]: t["Value"] for t in i.get("Tags", [])}
    code = i.get("StateReason", {}).get("Code", "")
    return tags.get("spotctl:job", ""), VmState(tags.get("Name", i["InstanceId"]), int(tags.get("spotctl:node", 0)),
                                               int(tags.get("spotctl:attempt", 0)), i["State"]["Name"],
                                               code in SPOT_TERMINATION_CODES, code)


def sqs_receive(region: str, queue_url: str, max_batches: int = 100) -> list[Message]:
    """Every message waiting in the queue now (short polls of 10, bounded), left in the queue
    until deleted: a watcher that dies before handling them gets them again."""
    import boto3

    sqs = boto3.client("sqs", region_name=region)
    out: dict[str, Message] = {}
    for _ in range(max_batches):
        got = sqs.receive_message(QueueUrl=queue_url, MaxNumberOfMessages=10, WaitTimeSeconds=0, VisibilityTimeout=60)
        batch = [m for m in got.get("Messages", []) if m["MessageId"] not in out]
        if not batch:
            break
        for m in batch:
            out[m["MessageId"]] = Message(m["MessageId"], m["ReceiptHandle"], m["Body"].encode())
    return list(out.values())


def sqs_delete(region: str, queue_url: str, receipts: list[str]) -> None:
    import boto3

    sqs = boto3.client("sqs", region_name=region)
    for i in range(0, len(receipts), 10):  # DeleteMessageBatch takes at most 10 entries
        entries = [{"Id": str(n), "ReceiptHandle": r} for n, r in enumerate(receipts[i:i + 10])]
        sqs.delete_message_batch(QueueUrl=queue_url, Entries=entries)


def sqs_release(region: str, queue_url: str, receipts: list[str]) -> None:
    """Make messages visible again now (a notice to look at again next cycle)."""
    import boto3

    sqs = boto3.client("sqs", region_name=region)
    for i in range(0, len(receipts), 10):
        entries = [{"Id": str(n), "ReceiptHandle": r, "VisibilityTimeout": 0} for n, r in enumerate(receipts[i:i + 10])]
        sqs.change_message_visibility_batch(QueueUrl=queue_url, Entries=entries)


def instance_vms(region: str, stack: str, instance_ids: list[str]) -> dict[str, tuple[str, VmState]]:
    """instance id -> (job, VM) for those of ``instance_ids`` that carry this stack's tag; others are skipped."""
    import boto3

    ec2 = boto3.client("ec2", region_name=region)
    filters = [{"Name": "instance-id", "Values": instance_ids}, {"Name": "tag:spotctl:stack", "Values": [stack]}]
    out = {}
    for page in ec2.get_paginator("describe_instances").paginate(Filters=filters):
        for reservation in page["Reservations"]:
            out.update({i["InstanceId"]: _vm(i) for i in reservation["Instances"]})
    return out


def _missing(exc) -> bool:
    return exc.response.get("Error", {}).get("Code") in ("404", "NoSuchKey", "NotFound")


_THREAD = threading.local()


def _s3(region: str):
    """An S3 client for this thread: the default session's on the main thread, else a session of the
    thread's own. Sessions (the default one too, behind ``boto3.client``) are not thread safe and
    should not be shared across threads (boto3 user guide, "Session": multithreading); the watcher's
    lease keeper (cli/watch/lease.py) renews from a thread while the main thread pushes the stack file."""
    import boto3

    if threading.current_thread() is threading.main_thread():
        return boto3.client("s3", region_name=region)
    if getattr(_THREAD, "session", None) is None:
        _THREAD.session = boto3.session.Session()
    return _THREAD.session.client("s3", region_name=region)


def s3_generation(region: str, bucket: str, key: str) -> str | None:
    """The object's ETag (HeadObject), or None when there is no such key."""
    from botocore.exceptions import ClientError

    try:
        return _s3(region).head_object(Bucket=bucket, Key=key)["ETag"]
    except ClientError as exc:
        if _missing(exc):
            return None
        raise


def s3_read(region: str, bucket: str, key: str) -> tuple[bytes, str] | None:
    """(content, ETag) of one GetObject (the ETag of exactly the bytes returned), or None."""
    from botocore.exceptions import ClientError

    try:
        got = _s3(region).get_object(Bucket=bucket, Key=key)
    except ClientError as exc:
        if _missing(exc):
            return None
        raise
    return got["Body"].read(), got["ETag"]


def s3_write_if(region: str, bucket: str, key: str, data: bytes, expected: str | None,
                content_type: str = "application/yaml") -> str:
    """PutObject with ``If-Match: <expected ETag>``, or ``If-None-Match: *`` when ``expected`` is None
    (S3 conditional writes: docs.aws.amazon.com/AmazonS3/latest/userguide/conditional-writes.html,
    API_PutObject.html; both need only s3:PutObject). Returns the new ETag."""
    condition = {"IfMatch": expected} if expected is not None else {"IfNoneMatch": "*"}
    put = _s3(region).put_object(Bucket=bucket, Key=key, Body=data, ContentType=content_type, **condition)
    return put["ETag"]
