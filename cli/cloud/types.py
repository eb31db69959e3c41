"""The values both clouds hand back (disks, VMs, stored objects, messages, pool views) and the errors
their calls raise: what cli.cloud, aws.py and gcp.py share."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Protocol, TypeVar

T = TypeVar("T")


class CloudError(Exception):
    """A cloud API call failed (no credentials, denied, unreachable); ``str()`` is one line."""


class PreconditionFailed(CloudError):
    """A conditional write lost: the object is no longer at the generation the writer last saw."""


@dataclass(frozen=True)
class CloudDisk:
    """A disk (GCP) or volume (AWS) with the labels/tags it carries."""

    id: str
    zone: str
    labels: dict[str, str] = field(default_factory=dict)
    in_use: bool = False
    created: datetime | None = None  # when the cloud made it (a completion before it is not its job's)
    region: str | None = None  # GCP: a regional disk's region (then ``zone`` names the region too)

    def owner(self, cloud: str) -> tuple[str | None, str | None, bool]:
        """(owner, job, managed) from our ownership labels/tags; owner is ``naming.owner_value`` of
        the stack that created the disk (collision-free, unlike the ``stack`` label)."""
        if cloud == "aws":
            return self.labels.get("spotctl:owner"), self.labels.get("spotctl:job"), self.labels.get("spotctl:managed") == "true"
        return self.labels.get("spotctl-owner"), self.labels.get("spotctl-job"), self.labels.get("spotctl-managed") == "true"


@dataclass(frozen=True)
class CloudSnapshot(CloudDisk):
    """A snapshot (GCP: global; AWS: regional, ``zone`` empty) with its labels/tags and when it was made."""


@dataclass(frozen=True)
class VmState:
    """One VM of a job's attempt as the cloud reports it now."""

    name: str
    node: int
    attempt: int
    status: str  # the cloud's word: running, terminated, TERMINATED, RUNNING, ...
    preempted: bool
    reason: str = ""


@dataclass(frozen=True)
class Stored:
    """One object of a bucket listing: its generation (S3 ETag, GCS generation: equal means unchanged),
    its listed size, and its content when it was read (None: a generation the caller already knew, or
    larger than the caller's limit: then ``size`` is over it)."""

    key: str
    generation: str
    size: int
    data: bytes | None = None


def bounded_reads(listing: Iterable[tuple[str, str, int]], suffix: str, known: Mapping[str, str], limit: int,
                 fetch: Callable[[str, str], tuple[bytes, str]]) -> list[Stored]:
    """``Cloud.stored_objects`` over a listing of (key, generation, size): ``fetch(key, generation)`` ->
    (at most ``limit + 1`` bytes, generation) reads an object of a generation not ``known`` and listed
    within ``limit``; one that turns out longer (replaced since the listing) counts as over it. An empty
    object is not fetched (a byte range of a zero-byte object is unsatisfiable: 416)."""
    out = []
    for key, generation, size in listing:
        if not key.endswith(suffix):
            continue
        data = None
        if known.get(key) != generation and size <= limit:
            data, generation = (b"", generation) if size == 0 else fetch(key, generation)
            if len(data) > limit:
                data, size = None, len(data)
        out.append(Stored(key, generation, size, data))
    return out


@dataclass(frozen=True)
class Message:
    """One message of the interruption queue (SQS) or the preemption subscription (Pub/Sub):
    ``id`` stays the same when the message is delivered again, ``ack`` is what deletes it."""

    id: str
    ack: str
    body: bytes


class Inventory(Protocol):
    def disks(self) -> list[CloudDisk]: ...

    def delete(self, disk: CloudDisk) -> None: ...

    def snapshots(self) -> list[CloudSnapshot]: ...

    def delete_snapshot(self, snap: CloudSnapshot) -> None: ...


class Observer(Protocol):
    def vms(self, job_id: str) -> list[VmState]: ...


# ---- pools ------------------------------------------------------------------------------------

# Published values older than this are not "the demand now" (publishers run every minute or so).
METRICS_FRESH = timedelta(minutes=15)


@dataclass(frozen=True)
class PoolVm:
    """One VM of a pool as the cloud reports it."""

    name: str
    part: str  # ondemand | spot | fallback
    zone: str
    machine_type: str
    status: str  # the cloud's word: InService, Pending, RUNNING, STAGING, ...
    busy: bool | None  # None: the cloud does not say (GCP)


@dataclass(frozen=True)
class PoolView:
    """A pool as the cloud sees it now: each part's target size, its VMs, the demand last
    published, and the preemptions the cloud reports for the pool's VMs."""

    targets: dict[str, int]
    vms: list[PoolVm]
    metrics: dict[str, float]  # latest value of each published pool metric
    preemptions: list[str]  # "<time> <vm>" lines, newest first
