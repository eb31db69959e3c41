"""AWS side of the cloud boundary (boto3; credentials and endpoint from the environment)."""

from __future__ import annotations

from cli.cloud import CloudDisk, VmState

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
                out.append(CloudDisk(v["VolumeId"], v["AvailabilityZone"], tags, in_use=v["State"] != "available"))
        return out

    def delete(self, disk: CloudDisk) -> None:
        self.ec2.delete_volume(VolumeId=disk.id)


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


def s3_documents(region: str, bucket: str, prefix: str) -> list[bytes]:
    import boto3

    s3 = boto3.client("s3", region_name=region)
    docs = []
    for page in s3.get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=prefix):
        for obj in page.get("Contents", []):
            docs.append(s3.get_object(Bucket=bucket, Key=obj["Key"])["Body"].read())
    return docs
