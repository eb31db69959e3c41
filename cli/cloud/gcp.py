"""GCP side of the cloud boundary (google-cloud-compute, the GCS JSON API; endpoints overridable)."""

from __future__ import annotations

from typing import Any

from cli.cloud import CloudDisk, VmState
from infra.naming import label_value


class GcpInventory:
    """Persistent disks labelled with this stack (google-cloud-compute; endpoint overridable)."""

    def __init__(self, project: str, stack: str, endpoint: str | None = None):
        from google.cloud import compute_v1

        self.project = project
        self.label = label_value(stack)
        kwargs = {}
        if endpoint:  # a local or private Compute endpoint (tests, air-gapped setups): no Google auth
            from google.api_core.client_options import ClientOptions
            from google.auth.credentials import AnonymousCredentials

            kwargs = {"credentials": AnonymousCredentials(), "transport": "rest", "client_options": ClientOptions(api_endpoint=endpoint)}
        self.client = compute_v1.DisksClient(**kwargs)
        self.operations = compute_v1.ZoneOperationsClient(**kwargs)

    def disks(self) -> list[CloudDisk]:
        request = {"project": self.project, "filter": f'labels.spotctl-stack="{self.label}"'}
        out = []
        for scope, scoped in self.client.aggregated_list(request=request):
            for d in scoped.disks:
                zone = d.zone.rsplit("/", 1)[-1] if d.zone else scope.rsplit("/", 1)[-1]
                out.append(CloudDisk(d.name, zone, dict(d.labels), in_use=bool(d.users)))
        return out

    def delete(self, disk: CloudDisk) -> None:
        op = self.client.delete(project=self.project, zone=disk.zone, disk=disk.id)
        # Wait with our own operations client: the LRO helper would poll the public endpoint.
        self.operations.wait(project=self.project, zone=disk.zone, operation=op.name)


class GcpObserver:
    def __init__(self, project: str, stack: str, zones: list[str], endpoint: str | None = None):
        from google.cloud import compute_v1

        kwargs = {}
        if endpoint:
            from google.api_core.client_options import ClientOptions
            from google.auth.credentials import AnonymousCredentials

            kwargs = {"credentials": AnonymousCredentials(), "transport": "rest", "client_options": ClientOptions(api_endpoint=endpoint)}
        self.project, self.zones, self.label = project, zones, label_value(stack)
        self.instances = compute_v1.InstancesClient(**kwargs)
        self.operations = compute_v1.ZoneOperationsClient(**kwargs)

    def vms(self, job_id: str) -> list[VmState]:
        out = []
        flt = f'labels.spotctl-stack="{self.label}" AND labels.spotctl-job="{label_value(job_id)}"'
        for zone in self.zones:
            for i in self.instances.list(request={"project": self.project, "zone": zone, "filter": flt}):
                ops = self.operations.list(request={
                    "project": self.project, "zone": zone,
                    "filter": f'operationType="compute.instances.preempted" AND targetLink:instances/{i.name}',
                })
                # `targetLink:` is a "contains" match: check the name exactly.
                preempted = any(op.target_link.rsplit("/", 1)[-1] == i.name for op in ops)
                labels = dict(i.labels)
                out.append(VmState(i.name, int(labels.get("spotctl-node", 0)), int(labels.get("spotctl-attempt", 0)),
                                   i.status, preempted, "compute.instances.preempted" if preempted else i.status_message))
        return out


def gcs_documents(bucket: str, prefix: str) -> list[bytes]:
    """Objects under ``prefix`` through the GCS JSON API with application-default credentials, or
    anonymously at SPOTCTL_GCS_ENDPOINT (private endpoints, tests)."""
    import os
    import urllib.parse

    docs: list[bytes] = []
    endpoint = os.environ.get("SPOTCTL_GCS_ENDPOINT")
    if endpoint:
        import requests

        session: Any = requests.Session()
    else:
        import google.auth
        from google.auth.transport.requests import AuthorizedSession

        credentials, _ = google.auth.default(scopes=["https://www.googleapis.com/auth/devstorage.read_only"])
        session, endpoint = AuthorizedSession(credentials), "https://storage.googleapis.com"
    base = f"{endpoint}/storage/v1/b/{urllib.parse.quote(bucket, safe='')}/o"
    token = None
    while True:
        params = {"prefix": prefix, **({"pageToken": token} if token else {})}
        listing = session.get(base, params=params, timeout=30)
        listing.raise_for_status()
        body = listing.json()
        for item in body.get("items", []):
            got = session.get(f"{base}/{urllib.parse.quote(item['name'], safe='')}", params={"alt": "media"}, timeout=30)
            got.raise_for_status()
            docs.append(got.content)
        token = body.get("nextPageToken")
        if not token:
            break
    return docs
