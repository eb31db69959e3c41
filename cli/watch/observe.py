"""The watcher's observe step: every source read once per cycle, turned into events with ids.

Sources: the recorded events (the stack's event bucket, ``--events-dir``), the AWS interruption
queue (EventBridge messages naming an instance: the watcher asks EC2 whether that VM is really
gone; until it is, the message is only a notice and stays in the queue to be looked at again), the
GCP preemption subscription (the log sink's ``compute.instances.preempted`` entries: a fact once the
Compute API reports that VM gone; one it reports running is warned of and dropped), and
the cloud observer (every running job's VMs every ``poll`` cycle, and any job with a fresh notice).
A source that fails is one warning; the others still count.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path

from cli.cloud import CloudError, Message
from cli.lifecycle.bucketevents import BucketEvents
from cli.lifecycle.direvents import dir_events
from cli.lifecycle.events import CLOCK_SKEW, Event, cloud_events
from cli.watch.decide import FACTS, PAST_FACTS, Seen, merge, seen
from infra.basics import loads_bounded
from infra.config import JobState, StackConfig
from infra.naming import stack_slug

SYSTEM_EVENT_LOG = "/logs/cloudaudit.googleapis.com%2Fsystem_event"
NOTICE_REVISIT = timedelta(minutes=15)  # an AWS notice whose VM still runs is re-read until then
GONE = ("terminated", "stopped", "stopping", "shutting-down")
NOTICE_KINDS = {"EC2 Spot Instance Interruption Warning": "preemption-notice",
                "EC2 Instance Rebalance Recommendation": "rebalance-recommendation"}


@dataclass(frozen=True)
class Sources:
    events_dir: Path | None = None
    bucket: str | None = None
    queue_url: str | None = None
    subscription: str | None = None
    poll: bool = True


@dataclass(frozen=True)
class Ack:
    """A queue/subscription message to delete once every event it carried is handled."""

    channel: str  # queue | subscription
    ack: str
    ids: tuple[str, ...]
    keep: bool = False  # a notice whose VM still runs: let it come back


@dataclass
class Observed:
    events: dict[str, list[Seen]] = field(default_factory=dict)
    warnings: list[str] = field(default_factory=list)
    acks: list[Ack] = field(default_factory=list)
    # a job's whole recorded history (every attempt) from the sources' caches: what an action's
    # capacity choice reads, as `resume` does; a cycle itself reads only what decides (PAST_FACTS)
    recorded: Callable[[str], list[Event]] = lambda job: []

    def history(self, job: str) -> list[Event]:
        """Every event of ``job`` known: its recorded history and this cycle's, each fact once."""
        return [s.event for s in merge(self.events.get(job, []), [seen(e, "history") for e in self.recorded(job)]).get(job, [])]


# A queue or subscription message is parsed within bounds (``infra.basics.loads_bounded``): SQS
# bodies are at most 256 KiB, a Pub/Sub message at most 10 MB, the messages the rules deliver a few
# KiB; anything that can publish to them may send anything else.
# https://docs.aws.amazon.com/AWSSimpleQueueService/latest/SQSDeveloperGuide/quotas-messages.html
MESSAGE_LIMIT = 1 << 20
# EC2 instance ids: "i-" then 8 (older) or 17 hexadecimal characters.
# https://docs.aws.amazon.com/AWSEC2/latest/UserGuide/resource-ids.html
INSTANCE_ID = re.compile(r"i-(?:[0-9a-f]{8}|[0-9a-f]{17})")
FINISHED = (JobState.COMPLETED, JobState.FAILED)


def _when(value: object) -> datetime:
    """A message's ISO 8601 time; one without a zone is UTC (EventBridge and Cloud Logging write UTC).

    Raises:
        ValueError, TypeError: not a time.
    """
    t = datetime.fromisoformat(str(value).replace("Z", "+00:00"))
    return t if t.tzinfo is not None else t.replace(tzinfo=UTC)


def gcp_preemption(body: bytes, slug: str, jobs: dict, now: datetime) -> Event | None:
    """The job VM a ``compute.instances.preempted`` log entry names (``<slug>-<job>-a<N>-n<M>``)."""
    try:
        entry = loads_bounded(body, MESSAGE_LIMIT)
        payload = entry.get("protoPayload") or {}
        # Only Compute Engine writes the System Event audit log; a job's service account may write log
        # entries (roles/logging.logWriter) and entries.write accepts an AuditLog protoPayload
        # (LogEntry.protoPayload: "type.googleapis.com/google.cloud.audit.AuditLog" is supported), so an
        # entry in any other log could name another job's VM.
        # https://cloud.google.com/logging/docs/audit/understanding-audit-logs (logName of System Event logs)
        if (payload.get("methodName") != "compute.instances.preempted"
                or not str(entry.get("logName", "")).endswith(SYSTEM_EVENT_LOG)):
            return None
        name = str(payload.get("resourceName", "")).rsplit("/", 1)[-1]
        when = _when(entry.get("timestamp") or now.isoformat())
    except (ValueError, TypeError, AttributeError, OverflowError):
        return None
    m = re.fullmatch(rf"{re.escape(slug)}-(?P<job>.+)-a(?P<attempt>\d+)-n(?P<node>\d+)", name)
    if not m or m["job"] not in jobs or len(m["attempt"]) > 9 or len(m["node"]) > 9:
        return None
    return Event(m["job"], int(m["attempt"]), int(m["node"]), "preempted", when,
                 {"source": "cloud", "reason": "compute.instances.preempted", "instance": name})


def aws_notice(body: bytes) -> tuple[str, str, datetime] | None:
    """(instance id, notice kind, time) of an EventBridge EC2 message, else None (also when its
    instance id is no EC2 instance id)."""
    try:
        doc = loads_bounded(body, MESSAGE_LIMIT)
        kind = NOTICE_KINDS.get(str(doc.get("detail-type")), "")
        instance = (doc.get("detail") or {}).get("instance-id")
        when = _when(doc["time"])
    except (ValueError, TypeError, KeyError, AttributeError, OverflowError):
        return None
    if not isinstance(instance, str) or not INSTANCE_ID.fullmatch(instance):
        return None
    return instance, kind or "notice", when


def moot(job, when: datetime, now: datetime) -> str | None:
    """Why a message about ``job`` needs nothing done and can be acknowledged: the job finished, or the
    message is dated after ``now`` plus the clock skew a VM may have (no notice comes from the future)."""
    if job.state in FINISHED:
        return f"job {job.id} is {job.state.value}"
    if when > now + CLOCK_SKEW:
        return f"dated {when.isoformat()}, after now ({now.isoformat(timespec='seconds')}) + {CLOCK_SKEW}"
    return None


def observe(cloud, cfg: StackConfig, stack: str, sources: Sources, now: datetime, *, poll_due: bool,
            handled: set[str], warn: Callable[[str], None], bucket_cache: BucketEvents | None = None) -> Observed:
    """Read every source once; events by job, each fact once, plus the messages to ack later.
    ``bucket_cache`` (kept by the loop across cycles) holds the events of the objects already read,
    so a cycle downloads and parses only new or changed ones."""
    jobs = {j.id: j for j in cfg.jobs}
    ids = set(jobs)
    out = Observed()
    batches: list[list[Seen]] = []

    def attempt(name: str, fn: Callable[[], None]) -> None:
        try:
            fn()
        except (CloudError, OSError) as exc:
            warn(f"{name}: {exc}")

    current = {j.id: j.attempt for j in cfg.jobs}
    # what is new since the caches' last reads: the current attempts' events, of the older ones what decides
    if sources.events_dir is not None:
        attempt(f"events dir {sources.events_dir}", lambda: batches.append(
            [seen(e, "events-dir") for e in dir_events(sources.events_dir, ids, stack, warn, now, current, PAST_FACTS)]))
    cache = (BucketEvents(stack) if bucket_cache is None else bucket_cache) if sources.bucket else None
    if cache is not None:
        def bucket() -> None:
            # (the pools' prefixes too: their VMs' preemptions are the zone choice's evidence of their zones)
            pools = {p.name: 1 for p in cfg.pools if p.name not in current}
            cache.read(cloud, sources.bucket, f"{stack}/", warn, attempts=current | pools)  # each new object warned of once
            batches.append([seen(e, "bucket") for e in cache.events(ids, now, warn, bucket=sources.bucket, attempts=current,
                                                                   older=PAST_FACTS)])

        attempt(f"event bucket {sources.bucket}", bucket)

    def recorded(job: str) -> list[Event]:
        found = dir_events(sources.events_dir, {job}, stack, None, now) if sources.events_dir is not None else []
        return found + (cache.events({job}, now, None, bucket=sources.bucket) if cache is not None else [])

    out.recorded = recorded
    if sources.subscription:
        slug = stack_slug(stack)

        def pull() -> None:
            messages = [(m, gcp_preemption(m.body, slug, jobs, now)) for m in cloud.subscription_messages(sources.subscription)]
            # Confirmed by the Compute API before it counts: nothing found says Cloud Logging refuses a
            # caller's entries.write into a `cloudaudit.googleapis.com` log name, and a job's service
            # account may write log entries, so an entry could name another job's VM. Only a VM Compute
            # Engine reports gone (or no longer has) is a preemption; asked once per job, before any ack,
            # so an unanswered question leaves every message to be delivered again.
            vms = {j: cloud.vms(j) for j in sorted({e.job for _, e in messages if e and e.attempt == jobs[e.job].attempt
                                                     and moot(jobs[e.job], e.time, now) is None})}
            got = []
            for m, e in messages:
                if e is not None and (why := moot(jobs[e.job], e.time, now)) is not None:
                    warn(f"preemption subscription {sources.subscription}: message {m.id}: {why}: acknowledged, nothing done")
                    out.acks.append(Ack("subscription", m.ack, ()))
                    continue
                vm = next((v for v in vms.get(e.job, []) if (v.name, v.attempt, v.node) == (e.details.get("instance"),
                                                                                           e.attempt, e.node)), None) if e else None
                if e and vm is None:
                    # Not a VM Compute Engine lists under this stack's owner label: the sink matches the
                    # stack's name prefix only (its size may not grow with the jobs), which another stack's
                    # VMs may share (``team`` and ``team-a``); this stack's own gone VMs the poll sees.
                    e = None
                if e and vm is not None and vm.status.lower() not in GONE:
                    if now - e.time < NOTICE_REVISIT:  # not acknowledged: Pub/Sub delivers it again, asked again then
                        out.acks.append(Ack("subscription", m.ack, (), keep=True))
                        continue
                    warn(f"preemption subscription {sources.subscription}: an entry says {vm.name} was preempted, but "
                         f"Compute Engine still reports it {vm.status}: not acted on")
                    e = None
                s = seen(e, "subscription") if e else None
                got += [s] if s else []
                out.acks.append(Ack("subscription", m.ack, (s.id,) if s else ()))
            batches.append(got)

        attempt(f"preemption subscription {sources.subscription}", pull)
    if sources.queue_url:
        attempt(f"interruption queue {sources.queue_url}", lambda: batches.append(
            _queue(cloud, sources.queue_url, jobs, now, out.acks, warn)))
    merged = merge(*batches)
    look = {j for j, evs in merged.items() for s in evs
            if s.id not in handled and s.event.event not in FACTS and s.event.attempt == jobs[j].attempt}
    polled = [j for j in jobs.values() if j.state is JobState.RUNNING and (poll_due or j.id in look)]
    if sources.poll and polled:
        def poll() -> None:
            found = []
            for j in polled:
                found += [seen(e, "poll") for e in cloud_events(cloud.vms(j.id), j, now)]
            batches.append(found)

        attempt("cloud observer", poll)
        merged = merge(*batches)
    out.events = merged
    return out


def _queue(cloud, url: str, jobs: dict, now: datetime, acks: list[Ack], warn: Callable[[str], None]) -> list[Seen]:
    messages: list[tuple[Message, tuple[str, str, datetime] | None]] = [(m, aws_notice(m.body)) for m in cloud.queue_messages(url)]
    instances = sorted({n[0] for _, n in messages if n})
    by_instance = cloud.instance_vms(instances) if instances else {}
    got: list[Seen] = []
    for m, notice in messages:
        if notice is None:
            acks.append(Ack("queue", m.ack, ()))  # not an EC2 interruption message: nothing to do
            continue
        instance, kind, when = notice
        owner = by_instance.get(instance)
        if owner is None or owner[0] not in jobs:
            acks.append(Ack("queue", m.ack, ()))  # not a VM of this stack (or long gone)
            continue
        job_id, vm = owner
        if (why := moot(jobs[job_id], when, now)) is not None:
            warn(f"interruption queue {url}: message {m.id} ({instance}): {why}: acknowledged, nothing done")
            acks.append(Ack("queue", m.ack, ()))
            continue
        facts = [seen(e, "queue") for e in cloud_events([vm], jobs[job_id], now)] if vm.status.lower() in GONE else []
        if vm.status.lower() in GONE and not facts:  # a VM of an older attempt: stale, nothing to act on
            acks.append(Ack("queue", m.ack, ()))
            continue
        note = seen(Event(job_id, vm.attempt, vm.node, kind, when, {"source": "queue", "instance": instance}), "queue")
        got += [note, *facts]
        acks.append(Ack("queue", m.ack, tuple(s.id for s in facts) or (note.id,), keep=not facts and now - when < NOTICE_REVISIT))
    return got

