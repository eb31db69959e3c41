"""The cloud boundary: every boto3 / google-cloud call spotctl makes lives in this package.

Owns: one ``Cloud`` object per stack (``for_stack``) with the stack's disks (inventory), the cloud's
view of a job's VMs (observer) and the job events in the stack's bucket; ``CloudError`` for every
SDK failure. ``aws.py`` and ``gcp.py`` hold the SDK calls and import their SDKs lazily.

May import: ``infra.config`` / ``infra.naming`` (the config model and label rules). Never
``cli.lifecycle``, ``cli.app`` or any other part: decisions about what the cloud returns are the
core's. Tests swap the whole ``Cloud`` object (or point the SDK clients at moto / local endpoints).

The values both clouds return, and their errors, live in ``types.py``.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from datetime import datetime

from cli.cloud.types import (  # noqa: F401
    METRICS_FRESH,
    CloudDisk,
    CloudError,
    CloudSnapshot,
    Inventory,
    Message,
    Observer,
    PoolView,
    PoolVm,
    PreconditionFailed,
    Stored,
    T,
    VmState,
    bounded_reads,
)


def call(fn: Callable[[], T]) -> T:
    """Run a cloud API call; its failures (no credentials, denied, unreachable) become CloudError."""
    from botocore.exceptions import BotoCoreError, ClientError
    from google.api_core.exceptions import GoogleAPIError
    from google.auth.exceptions import GoogleAuthError
    from requests.exceptions import RequestException  # google-cloud-compute's REST transport

    try:
        return fn()
    except (BotoCoreError, ClientError, GoogleAPIError, GoogleAuthError, RequestException) as exc:
        raise CloudError(f"cannot ask the cloud: {type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}") from None


def _conditional(fn: Callable[[], T]) -> T:
    """``call`` for a conditional write: a lost precondition is PreconditionFailed. S3 answers 412
    PreconditionFailed, or 409 ConditionalRequestConflict for a concurrent conditional write, and
    404 NoSuchKey for If-Match on a key that is gone (docs.aws.amazon.com/AmazonS3/latest/userguide/
    conditional-writes.html); GCS answers 412 (cloud.google.com/storage/docs/request-preconditions)."""
    from botocore.exceptions import ClientError
    from requests.exceptions import HTTPError

    try:
        return call(fn)
    except CloudError as exc:
        cause = exc.__context__
        if isinstance(cause, ClientError) and (
                cause.response.get("Error", {}).get("Code") in ("PreconditionFailed", "ConditionalRequestConflict", "NoSuchKey")
                or cause.response.get("ResponseMetadata", {}).get("HTTPStatusCode") in (409, 412)):
            raise PreconditionFailed(str(exc)) from None
        if isinstance(cause, HTTPError) and cause.response is not None and cause.response.status_code == 412:
            raise PreconditionFailed(str(exc)) from None
        raise


def _refuse(missing: str | None) -> None:
    """The one error of every cloud call made without credentials (``credentials.missing``'s line)."""
    if missing:
        raise CloudError(f"cannot ask the cloud: {missing}")


class _Checked:
    """An inventory whose every call raises CloudError, never an SDK's exception."""

    def __init__(self, inner: Inventory):
        self.inner = inner

    def disks(self) -> list[CloudDisk]:
        return call(self.inner.disks)

    def delete(self, disk: CloudDisk) -> None:
        call(lambda: self.inner.delete(disk))

    def snapshots(self) -> list[CloudSnapshot]:
        return call(self.inner.snapshots)

    def delete_snapshot(self, snap: CloudSnapshot) -> None:
        call(lambda: self.inner.delete_snapshot(snap))


class Cloud:
    """One stack's cloud, as the rest of spotctl sees it: every call returns plain data or raises
    CloudError. Tests replace the whole object (or point the SDK clients at moto / local endpoints)."""

    def __init__(self, cfg, stack: str):
        self.cfg, self.stack = cfg, stack
        self._missing: str | None = None
        self._checked = False

    def _ready(self) -> None:
        """Fail fast, before the SDK's credential chain would probe the metadata server from a machine
        that is not a VM of this cloud (``cli.cloud.credentials``); checked once per object."""
        if not self._checked:
            from cli.cloud.credentials import missing

            self._missing, self._checked = missing(getattr(self.cfg, "cloud", "aws")), True
        _refuse(self._missing)

    def _call(self, fn: Callable[[], T]) -> T:
        self._ready()
        return call(fn)

    def _call_conditional(self, fn: Callable[[], T]) -> T:
        self._ready()
        return _conditional(fn)

    def inventory(self) -> Inventory:
        return _Checked(self._call(lambda: inventory_for(self.cfg, self.stack)))

    def observer(self) -> Observer:
        return self._call(lambda: observer_for(self.cfg, self.stack))

    def vms(self, job_id: str) -> list[VmState]:
        observer = self.observer()
        return self._call(lambda: observer.vms(job_id))

    def prices(self, machine_types: list[str]) -> dict[str, tuple[float, float, str]]:
        """{type: (spot $/h, on-demand $/h, source)} from the cloud's price APIs: EC2 spot price
        history and the AWS Price List; GCP's Cloud Billing Catalog with the Compute API's machine
        types (asked in the stack's first zone; SPOTCTL_GCE_ENDPOINT / SPOTCTL_BILLING_ENDPOINT
        point them elsewhere)."""
        import os

        if self.cfg.cloud == "aws":
            from cli.cloud.aws import aws_prices

            return self._call(lambda: aws_prices(self.cfg.region, machine_types))
        from cli.cloud.gcp_prices import gcp_prices

        return self._call(lambda: gcp_prices(self.cfg.project or "", self.cfg.region, self.cfg.zones[0], machine_types,
                                       endpoint=os.environ.get("SPOTCTL_GCE_ENDPOINT"),
                                       billing_endpoint=os.environ.get("SPOTCTL_BILLING_ENDPOINT")))


    def bucket_objects(self, bucket: str, prefix: str, skip: frozenset[str] = frozenset(),
                       suffix: str = "") -> dict[str, bytes | None]:
        """Every object name under ``prefix`` ending in ``suffix`` -> its content (None for names in ``skip``)."""
        if self.cfg.cloud == "aws":
            from cli.cloud.aws import s3_objects

            return self._call(lambda: s3_objects(self.cfg.region, bucket, prefix, skip, suffix))
        from cli.cloud.gcp import gcs_objects

        return self._call(lambda: gcs_objects(bucket, prefix, skip, suffix))

    def stored_objects(self, bucket: str, prefix: str, suffix: str, known: Mapping[str, str], limit: int) -> list[Stored]:
        """Every object under ``prefix`` ending in ``suffix``, with its generation and size; read only when
        its generation is not the one ``known`` (key -> generation) has, and never more than ``limit``
        bytes of it (a larger one is listed unread). For objects others may write (a job's VM writes
        its own events): one object can neither flood memory nor be downloaded again every call."""
        if self.cfg.cloud == "aws":
            from cli.cloud.aws import s3_stored

            return self._call(lambda: s3_stored(self.cfg.region, bucket, prefix, suffix, known, limit))
        from cli.cloud.gcp import gcs_stored

        return self._call(lambda: gcs_stored(bucket, prefix, suffix, known, limit))

    def stored_since(self, bucket: str, prefix: str, after: str | None, suffix: str, known: Mapping[str, str],
                     limit: int) -> tuple[list[Stored], list[str]]:
        """One folder of ``prefix`` (delimiter ``/``): its objects after key ``after`` (as
        :meth:`stored_objects` reads them) and its sub-folders (listed, never descended into)."""
        if self.cfg.cloud == "aws":
            from cli.cloud.aws import s3_stored_since

            return self._call(lambda: s3_stored_since(self.cfg.region, bucket, prefix, after, suffix, known, limit))
        from cli.cloud.gcs_since import gcs_stored_since

        return self._call(lambda: gcs_stored_since(bucket, prefix, after, suffix, known, limit))

    def bucket_names(self, bucket: str, prefix: str) -> list[str]:
        """Every object name under ``prefix``, without reading the objects."""
        if self.cfg.cloud == "aws":
            from cli.cloud.aws import s3_names

            return self._call(lambda: s3_names(self.cfg.region, bucket, prefix))
        from cli.cloud.gcp import gcs_names

        return self._call(lambda: gcs_names(bucket, prefix))

    # ---- one object written by several machines (the stack file's shared copy) ----------------------
    # A "generation" is the S3 ETag or the GCS generation number, as a string: equal means unchanged.

    def object_generation(self, bucket: str, key: str) -> str | None:
        """The object's current generation, or None when there is no such object."""
        if self.cfg.cloud == "aws":
            from cli.cloud.aws import s3_generation

            return self._call(lambda: s3_generation(self.cfg.region, bucket, key))
        from cli.cloud.gcp import gcs_generation

        return self._call(lambda: gcs_generation(bucket, key))

    def read_object(self, bucket: str, key: str) -> tuple[bytes, str] | None:
        """(content, generation) of one object, read as one version; None when there is none."""
        if self.cfg.cloud == "aws":
            from cli.cloud.aws import s3_read

            return self._call(lambda: s3_read(self.cfg.region, bucket, key))
        from cli.cloud.gcp import gcs_read

        return self._call(lambda: gcs_read(bucket, key))

    def write_object(self, bucket: str, key: str, data: bytes, expected: str | None,
                     content_type: str = "application/yaml") -> str:
        """Write ``data`` only if the object is still at generation ``expected`` (None: only if there
        is no such object); returns the new generation.

        Raises:
            PreconditionFailed: someone else wrote (or deleted) it since.
        """
        if self.cfg.cloud == "aws":
            from cli.cloud.aws import s3_write_if

            return self._call_conditional(lambda: s3_write_if(self.cfg.region, bucket, key, data, expected, content_type))
        from cli.cloud.gcp import gcs_write_if

        return self._call_conditional(lambda: gcs_write_if(bucket, key, data, expected, content_type))

    def queue_messages(self, queue_url: str) -> list[Message]:
        """Pending messages of the AWS interruption queue (not deleted until ``queue_delete``)."""
        from cli.cloud.aws import sqs_receive

        return self._call(lambda: sqs_receive(self.cfg.region, queue_url))

    def queue_delete(self, queue_url: str, acks: list[str]) -> None:
        from cli.cloud.aws import sqs_delete

        self._call(lambda: sqs_delete(self.cfg.region, queue_url, acks))

    def queue_release(self, queue_url: str, acks: list[str]) -> None:
        from cli.cloud.aws import sqs_release

        self._call(lambda: sqs_release(self.cfg.region, queue_url, acks))

    def instance_vms(self, instance_ids: list[str]) -> dict[str, tuple[str, VmState]]:
        """instance id -> (job id, VM) for AWS instances of this stack named in interruption messages."""
        from cli.cloud.aws import instance_vms

        return self._call(lambda: instance_vms(self.cfg.region, self.stack, instance_ids))

    def subscription_messages(self, subscription: str) -> list[Message]:
        """Pending messages of the GCP preemption subscription (not acknowledged until ``subscription_ack``)."""
        from cli.cloud.gcp import pubsub_pull

        return self._call(lambda: pubsub_pull(self._subscription_path(subscription)))

    def subscription_ack(self, subscription: str, acks: list[str]) -> None:
        from cli.cloud.gcp import pubsub_ack

        self._call(lambda: pubsub_ack(self._subscription_path(subscription), acks))

    def _subscription_path(self, subscription: str) -> str:
        return subscription if subscription.startswith("projects/") else f"projects/{self.cfg.project}/subscriptions/{subscription}"


def inventory_for(cfg, stack: str) -> Inventory:
    """The stack's cloud inventory. AWS endpoints follow boto3's environment (AWS_ENDPOINT_URL);
    SPOTCTL_GCE_ENDPOINT points the Compute client elsewhere (anonymous credentials)."""
    import os

    if cfg.cloud == "aws":
        from cli.cloud.aws import AwsInventory

        return AwsInventory(cfg.region, stack)
    from cli.cloud.gcp import GcpInventory

    return GcpInventory(cfg.project or "", stack, endpoint=os.environ.get("SPOTCTL_GCE_ENDPOINT"))


def observer_for(cfg, stack: str) -> Observer:
    import os

    if cfg.cloud == "aws":
        from cli.cloud.aws import AwsObserver

        return AwsObserver(cfg.region, stack)
    from cli.cloud.gcp import GcpObserver

    return GcpObserver(cfg.project or "", stack, list(cfg.zones), endpoint=os.environ.get("SPOTCTL_GCE_ENDPOINT"))


def pool_cloud(cfg, stack: str) -> PoolCloud:
    """The pool side of a stack's cloud: publish demand metrics, read them back, describe the pool."""
    return PoolCloud(cfg, stack)


class PoolCloud:
    """A stack's pools as the cloud sees them; every call raises CloudError, never an SDK's exception.
    Like ``Cloud``, nothing is asked (and no SDK client made) before the first call, and then only
    with credentials the SDK can find without probing a metadata server. AWS endpoints follow boto3's
    environment; GCP: SPOTCTL_MONITORING_ENDPOINT / SPOTCTL_GCE_ENDPOINT point the Cloud Monitoring and
    Compute clients at private endpoints (anonymous credentials)."""

    def __init__(self, cfg, stack: str):
        self.cfg, self.stack = cfg, stack
        self._inner = None

    def _clients(self):
        if self._inner is None:
            import os

            from cli.cloud.credentials import missing

            _refuse(missing(self.cfg.cloud))
            if self.cfg.cloud == "aws":
                from cli.cloud.aws import AwsPools

                self._inner = call(lambda: AwsPools(self.cfg.region, self.stack))
            else:
                from cli.cloud.gcp import GcpPools

                self._inner = call(lambda: GcpPools(self.cfg.project or "", self.cfg.region, list(self.cfg.zones), self.stack,
                                                    monitoring=os.environ.get("SPOTCTL_MONITORING_ENDPOINT"),
                                                    compute=os.environ.get("SPOTCTL_GCE_ENDPOINT")))
        return self._inner

    def publish(self, pool: str, values: dict[str, float], at: datetime) -> None:
        clients = self._clients()
        call(lambda: clients.publish(pool, values, at))

    def history(self, pool: str, metric: str, since: datetime, until: datetime) -> list[tuple[datetime, float]]:
        clients = self._clients()
        return call(lambda: clients.history(pool, metric, since, until))

    def view(self, pool: str, groups: dict[str, str], since: datetime, until: datetime) -> PoolView:
        clients = self._clients()
        return call(lambda: clients.view(pool, groups, since, until))
