"""GCP side of the cloud boundary (google-cloud-compute, the GCS JSON API; endpoints overridable).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from datetime import datetime
from typing import Any

from cli.cloud.types import (
    METRICS_FRESH,
    CloudDisk,
    CloudError,
    CloudSnapshot,
    Message,
    PoolView,
    PoolVm,
    Stored,
    VmState,
    bounded_reads,
)
from infra.naming import POOL_METRICS, label_value, owner_filter, pool_metric_labels, pool_metric_type, stack_slug

OPERATION_DEADLINE_S = 30 * 60.0
"""How long spotctl waits in all for one delete operation (a disk's, a snapshot's) to be DONE."""
OPERATION_POLL_S = 2.0
"""The pause between two ``wait`` calls that came back before DONE (it may return at once)."""


def wait_done(wait: Callable[[], Any], what: str, *, deadline_s: float = OPERATION_DEADLINE_S,
              clock: Callable[[], float] = time.monotonic, sleep: Callable[[float], None] = time.sleep) -> None:
    """Call an Operations client's ``wait`` until the operation is DONE; CloudError naming ``what``
    when it finished with an error or is still not DONE after ``deadline_s``.

    One ``wait`` is not enough: it "waits for no more than the 2 minutes and then returns the current
    state of the operation, which might be DONE or still in progress ... Be prepared to retry if the
    operation is not DONE", and a DONE operation may carry an error (google-cloud-compute
    ZoneOperationsClient.wait / GlobalOperationsClient.wait; compute_v1.Operation.error).
    """
    from google.cloud import compute_v1

    start = clock()
    while True:
        op = wait()
        if op.status == compute_v1.Operation.Status.DONE:
            break
        waited = clock() - start
        if waited >= deadline_s:
            raise CloudError(f"{what}: operation {op.name} is still {op.status.name} after {waited / 60:.0f} min; "
                             "it may still finish (gcloud compute operations describe shows it)")
        sleep(OPERATION_POLL_S)
    if "error" in op and op.error.errors:
        found = "; ".join(f"{e.code}: {e.message}" for e in op.error.errors)
        raise CloudError(f"{what} failed: {found}")
    if op.http_error_status_code and op.http_error_status_code >= 400:
        raise CloudError(f"{what} failed: HTTP {op.http_error_status_code} {op.http_error_message}")


class GcpInventory:
    """Persistent disks labelled with this stack (google-cloud-compute; endpoint overridable)."""

    def __init__(self, project: str, stack: str, endpoint: str | None = None):
        from google.cloud import compute_v1

        self.project = project
        self.stack_name = stack  # every filter that decides names the exact owner (owner_filter), not label_value
        kwargs = {}
        if endpoint:  # a local or private Compute endpoint (tests, air-gapped setups): no Google auth
            from google.api_core.client_options import ClientOptions
            from google.auth.credentials import AnonymousCredentials

            kwargs = {"credentials": AnonymousCredentials(), "transport": "rest", "client_options": ClientOptions(api_endpoint=endpoint)}
        self.client = compute_v1.DisksClient(**kwargs)
        self.operations = compute_v1.ZoneOperationsClient(**kwargs)
        self.region_client = compute_v1.RegionDisksClient(**kwargs)
        self.region_operations = compute_v1.RegionOperationsClient(**kwargs)
        self.snapshot_client = compute_v1.SnapshotsClient(**kwargs)
        self.global_operations = compute_v1.GlobalOperationsClient(**kwargs)
        self.waiting: dict[str, Any] = {}  # wait_done's deadline_s / clock / sleep (tests shorten them)

    def disks(self) -> list[CloudDisk]:
        request = {"project": self.project, "filter": owner_filter(self.stack_name)}
        out = []
        for scope, scoped in self.client.aggregated_list(request=request):
            for d in scoped.disks:
                zone = d.zone.rsplit("/", 1)[-1] if d.zone else scope.rsplit("/", 1)[-1]
                # Compute V1 Disk: a regional disk has `region`, no `zone`; creationTimestamp is RFC3339.
                region = d.region.rsplit("/", 1)[-1] if d.region and not d.zone else None
                out.append(CloudDisk(d.name, zone, dict(d.labels), in_use=bool(d.users), region=region,
                                     created=datetime.fromisoformat(d.creation_timestamp) if d.creation_timestamp else None))
        return out

    def delete(self, disk: CloudDisk) -> None:
        if disk.region:  # the zonal delete answers 404 for it (https://cloud.google.com/compute/docs/reference/rest/v1/regionDisks/delete)
            op = self.region_client.delete(project=self.project, region=disk.region, disk=disk.id)
            return wait_done(lambda: self.region_operations.wait(project=self.project, region=disk.region, operation=op.name),
                             f"deleting regional disk {disk.id} in {disk.region}", **self.waiting)
        op = self.client.delete(project=self.project, zone=disk.zone, disk=disk.id)
        # Wait with our own operations client: the LRO helper would poll the public endpoint.
        wait_done(lambda: self.operations.wait(project=self.project, zone=disk.zone, operation=op.name),
                  f"deleting disk {disk.id} in {disk.zone}", **self.waiting)

    def snapshots(self) -> list[CloudSnapshot]:
        """The project's snapshots labelled with this stack (a move's snapshots; global resources)."""
        request = {"project": self.project, "filter": owner_filter(self.stack_name)}
        return [CloudSnapshot(s.name, "", dict(s.labels),
                              created=datetime.fromisoformat(s.creation_timestamp) if s.creation_timestamp else None)
                for s in self.snapshot_client.list(request=request)]

    def delete_snapshot(self, snap: CloudSnapshot) -> None:
        op = self.snapshot_client.delete(project=self.project, snapshot=snap.id)
        wait_done(lambda: self.global_operations.wait(project=self.project, operation=op.name),
                  f"deleting snapshot {snap.id}", **self.waiting)


class GcpObserver:
    def __init__(self, project: str, stack: str, zones: list[str], endpoint: str | None = None):
        from google.cloud import compute_v1

        kwargs = {}
        if endpoint:
            from google.api_core.client_options import ClientOptions
            from google.auth.credentials import AnonymousCredentials

            kwargs = {"credentials": AnonymousCredentials(), "transport": "rest", "client_options": ClientOptions(api_endpoint=endpoint)}
        self.project, self.zones, self.stack_name = project, zones, stack
        self.instances = compute_v1.InstancesClient(**kwargs)
        self.operations = compute_v1.ZoneOperationsClient(**kwargs)

    def vms(self, job_id: str) -> list[VmState]:
        out = []
        flt = f'{owner_filter(self.stack_name)} AND labels.spotctl-job="{label_value(job_id)}"'
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


def gcs_objects(bucket: str, prefix: str, skip: frozenset[str] = frozenset(), suffix: str = "") -> dict[str, bytes | None]:
    """Objects under ``prefix`` ending in ``suffix`` (name -> content; None for names in ``skip``,
    already read) through the GCS JSON API with application-default credentials, or anonymously at
    SPOTCTL_GCS_ENDPOINT (private endpoints, tests)."""
    import urllib.parse

    session, base = _gcs(bucket)
    docs: dict[str, bytes | None] = {}
    for name in (item["name"] for item in _gcs_list(session, base, prefix)):
        if not name.endswith(suffix):
            continue
        if name in skip:
            docs[name] = None
            continue
        got = session.get(f"{base}/{urllib.parse.quote(name, safe='')}", params={"alt": "media"}, timeout=30)
        got.raise_for_status()
        docs[name] = got.content
    return docs


def gcs_names(bucket: str, prefix: str) -> list[str]:
    """Every object name under ``prefix``, without reading any object."""
    return [item["name"] for item in _gcs_list(*_gcs(bucket), prefix)]


def gcs_stored(bucket: str, prefix: str, suffix: str, known: Mapping[str, str], limit: int) -> list[Stored]:
    """``Cloud.stored_objects`` on GCS: the listing's ``size`` and ``generation`` (objects.list items are
    object resources) decide what is read; a read is of exactly the listed generation and asks for the
    first ``limit + 1`` bytes only (a ``Range`` header: cloud.google.com/storage/docs/downloads), streamed
    and cut there whatever the server sends."""
    session, base = _gcs(bucket)
    listing = ((i["name"], str(i.get("generation", "")), int(i.get("size", 0))) for i in _gcs_list(session, base, prefix))
    return bounded_reads(listing, suffix, known, limit, gcs_fetcher(session, base, limit))


def gcs_fetcher(session: Any, base: str, limit: int) -> Callable[[str, str], tuple[bytes, str]]:
    """(name, generation) -> the first ``limit + 1`` bytes of exactly that generation."""
    import urllib.parse

    def fetch(name: str, generation: str) -> tuple[bytes, str]:
        params = {"alt": "media", **({"generation": generation} if generation else {})}
        with session.get(f"{base}/{urllib.parse.quote(name, safe='')}", params=params, timeout=30, stream=True,
                         headers={"Range": f"bytes=0-{limit}"}) as got:
            got.raise_for_status()
            return got.raw.read(limit + 1, decode_content=True), generation

    return fetch


def _gcs(bucket: str, write: bool = False) -> tuple[Any, str]:
    """(an HTTP session, the bucket's objects URL): JSON API (google-cloud-storage is not a
    dependency; the auth library's transport signs the requests). ``write``: a read-write scope."""
    import os
    import urllib.parse

    endpoint = os.environ.get("SPOTCTL_GCS_ENDPOINT")
    if endpoint:
        import requests

        session: Any = requests.Session()
    else:
        import google.auth
        from google.auth.transport.requests import AuthorizedSession

        scope = "read_write" if write else "read_only"
        credentials, _ = google.auth.default(scopes=[f"https://www.googleapis.com/auth/devstorage.{scope}"])
        session, endpoint = AuthorizedSession(credentials), "https://storage.googleapis.com"
    return session, f"{endpoint}/storage/v1/b/{urllib.parse.quote(bucket, safe='')}/o"


def gcs_generation(bucket: str, name: str, gcs=None) -> str | None:
    """The object's generation (objects.get, metadata), or None when there is no such object
    (``gcs``: a session and base URL from ``_gcs`` to reuse)."""
    import urllib.parse

    session, base = gcs or _gcs(bucket)
    got = session.get(f"{base}/{urllib.parse.quote(name, safe='')}", params={"fields": "generation"}, timeout=30)
    if got.status_code == 404:
        return None
    got.raise_for_status()
    return str(got.json()["generation"])


def gcs_read(bucket: str, name: str) -> tuple[bytes, str] | None:
    """(content, generation): the generation first, then the content of exactly that generation
    (objects.get with ``generation``), so the two always belong together; None when there is none."""
    import urllib.parse

    gcs = _gcs(bucket)
    generation = gcs_generation(bucket, name, gcs)
    if generation is None:
        return None
    session, base = gcs
    got = session.get(f"{base}/{urllib.parse.quote(name, safe='')}", params={"alt": "media", "generation": generation}, timeout=30)
    if got.status_code == 404:
        return None  # replaced (without versioning the old generation is gone) or deleted meanwhile
    got.raise_for_status()
    return got.content, generation


def gcs_write_if(bucket: str, name: str, data: bytes, expected: str | None, content_type: str = "application/yaml") -> str:
    """Upload (objects.insert, uploadType=media) with ``ifGenerationMatch``: the expected generation,
    or 0 ("only if there are no live versions of the object") when ``expected`` is None; a lost
    precondition is HTTP 412 (cloud.google.com/storage/docs/request-preconditions; JSON API
    objects/insert). Replacing an object needs storage.objects.create and storage.objects.delete
    (cloud.google.com/storage/docs/access-control/iam-permissions). Returns the new generation."""
    session, base = _gcs(bucket, write=True)
    upload = base.replace("/storage/v1/b/", "/upload/storage/v1/b/", 1)
    got = session.post(upload, params={"uploadType": "media", "name": name, "ifGenerationMatch": expected or "0"},
                       data=data, headers={"Content-Type": content_type}, timeout=30)
    got.raise_for_status()
    return str(got.json()["generation"])


def _gcs_list(session: Any, base: str, prefix: str):
    """Objects under ``prefix``, every page (objects.list: items[] object resources, nextPageToken)."""
    token = None
    while True:
        listing = session.get(base, params={"prefix": prefix, **({"pageToken": token} if token else {})}, timeout=30)
        listing.raise_for_status()
        body = listing.json()
        yield from body.get("items", [])
        token = body.get("nextPageToken")
        if not token:
            return


# ---- prices: the Cloud Billing Catalog -----------------------------------------------------------
def _client_kwargs(endpoint: str | None) -> dict[str, Any]:
    """A local or private endpoint (tests, air-gapped setups): REST, anonymous; else Google's defaults."""
    if not endpoint:
        return {}
    from google.api_core.client_options import ClientOptions
    from google.auth.credentials import AnonymousCredentials

    return {"credentials": AnonymousCredentials(), "transport": "rest", "client_options": ClientOptions(api_endpoint=endpoint)}


def _metric_client(endpoint: str | None):
    """The Cloud Monitoring client. google-cloud-monitoring ships only gRPC transports, so a local
    or private endpoint (``host:port``, tests) gets a plaintext gRPC channel and no Google auth."""
    from google.cloud import monitoring_v3

    if not endpoint:
        return monitoring_v3.MetricServiceClient()
    import grpc
    from google.cloud.monitoring_v3.services.metric_service.transports import MetricServiceGrpcTransport

    target = endpoint.split("://", 1)[-1]
    return monitoring_v3.MetricServiceClient(transport=MetricServiceGrpcTransport(channel=grpc.insecure_channel(target)))


class GcpPools:
    """Pool demand as Cloud Monitoring custom metrics (per-group: resource type ``global``), the
    pool's MIGs and VMs (google-cloud-monitoring, google-cloud-compute)."""

    def __init__(self, project: str, region: str, zones: list[str], stack: str, monitoring: str | None = None,
                 compute: str | None = None):
        from google.cloud import compute_v1

        self.project, self.region, self.zones, self.stack = project, region, zones, stack
        self.slug, self.stack_name = stack_slug(stack), stack
        self.metrics = _metric_client(monitoring)
        self.migs = compute_v1.RegionInstanceGroupManagersClient(**_client_kwargs(compute))
        self.instances = compute_v1.InstancesClient(**_client_kwargs(compute))
        self.operations = compute_v1.ZoneOperationsClient(**_client_kwargs(compute))

    def publish(self, pool: str, values: dict[str, float], at: datetime) -> None:
        from google.api import metric_pb2
        from google.cloud import monitoring_v3

        series = []
        for name, value in values.items():
            ts = monitoring_v3.TimeSeries()
            ts.metric.type = pool_metric_type(name)
            ts.metric.labels.update(pool_metric_labels(self.stack, pool))
            # A per-group series (not gce_instance): defined with no VM at all, so the autoscaler can scale from zero.
            ts.resource.type = "global"
            ts.resource.labels["project_id"] = self.project
            ts.metric_kind = metric_pb2.MetricDescriptor.MetricKind.GAUGE
            ts.value_type = metric_pb2.MetricDescriptor.ValueType.DOUBLE
            ts.points = [monitoring_v3.Point({"interval": {"end_time": at}, "value": {"double_value": float(value)}})]
            series.append(ts)
        self.metrics.create_time_series(name=f"projects/{self.project}", time_series=series)

    def history(self, pool: str, metric: str, since: datetime, until: datetime) -> list[tuple[datetime, float]]:
        labels = " AND ".join(f'metric.labels.{k} = "{v}"' for k, v in pool_metric_labels(self.stack, pool).items())
        request = {
            "name": f"projects/{self.project}",
            "filter": f'metric.type = "{pool_metric_type(metric)}" AND {labels}',
            "interval": {"start_time": since, "end_time": until},
        }
        points = []
        for ts in self.metrics.list_time_series(request=request):
            points += [(p.interval.end_time, p.value.double_value) for p in ts.points]
        return sorted(points)

    def view(self, pool: str, groups: dict[str, str], since: datetime, until: datetime) -> PoolView:
        """``groups``: part name -> MIG name."""
        prefix = f"{self.slug}-{pool}-"
        parts = list(groups)
        targets = {}
        for part, mig_name in groups.items():
            mig = self.migs.get(project=self.project, region=self.region, instance_group_manager=mig_name)
            targets[part] = int(mig.target_size)
        vms, preemptions = [], []
        flt = f'{owner_filter(self.stack_name)} AND labels.spotctl-pool="{label_value(pool)}"'
        for zone in self.zones:
            for i in self.instances.list(request={"project": self.project, "zone": zone, "filter": flt}):
                part = next((p for p in parts if i.name.startswith(f"{prefix}{p}-")), "?")
                vms.append(PoolVm(i.name, part, zone, i.machine_type.rsplit("/", 1)[-1], i.status, None))
            ops = self.operations.list(request={
                "project": self.project, "zone": zone,
                "filter": f'operationType="compute.instances.preempted" AND targetLink:instances/{prefix}',
            })
            for op in ops:
                name = op.target_link.rsplit("/", 1)[-1]
                if name.startswith(prefix):  # `targetLink:` is a "contains" match
                    preemptions.append(f"{op.insert_time or op.start_time} {name}")
        metrics = {}
        for metric in POOL_METRICS:
            points = self.history(pool, metric, max(since, until - METRICS_FRESH), until)
            if points:
                metrics[metric] = points[-1][1]
        return PoolView(targets, vms, metrics, sorted(preemptions, reverse=True))


def _subscriber():
    """The Pub/Sub subscriber client; PUBSUB_EMULATOR_HOST (emulator, tests) makes it talk plain gRPC
    to that host without Google credentials (the client library's own switch)."""
    from google.pubsub_v1 import SubscriberClient

    return SubscriberClient()


def pubsub_pull(subscription: str, max_batches: int = 100) -> list[Message]:
    """Messages waiting on the subscription now (unary pulls, bounded), left unacknowledged."""
    client = _subscriber()
    out: dict[str, Message] = {}
    for _ in range(max_batches):
        got = client.pull(request={"subscription": subscription, "max_messages": 100}, timeout=10)
        if not got.received_messages:
            break
        fresh = 0
        for r in got.received_messages:
            if r.message.message_id not in out:
                fresh += 1
                out[r.message.message_id] = Message(r.message.message_id, r.ack_id, bytes(r.message.data))
        if not fresh:
            break
    return list(out.values())


def pubsub_ack(subscription: str, ack_ids: list[str]) -> None:
    client = _subscriber()
    for i in range(0, len(ack_ids), 1000):
        client.acknowledge(request={"subscription": subscription, "ack_ids": ack_ids[i:i + 1000]})
