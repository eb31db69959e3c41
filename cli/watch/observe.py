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

import json
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from pathlib import Path

from cli.cloud import CloudError, Message
from cli.lifecycle.events import BucketEvents, Event, cloud_events, keyed_events, read_dir
from cli.watch.decide import FACTS, Seen, merge, seen
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


def gcp_preemption(body: bytes, slug: str, jobs: dict, now: datetime) -> Event | None:
    """The job VM a ``compute.instances.preempted`` log entry names (``<slug>-<job>-a<N>-n<M>``)."""
    try:
        entry = json.loads(body)
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
        when = datetime.fromisoformat(str(entry.get("timestamp") or now.isoformat()).replace("Z", "+00:00"))
    except (ValueError, TypeError, AttributeError):
        return None
    m = re.fullmatch(rf"{re.escape(slug)}-(?P<job>.+)-a(?P<attempt>\d+)-n(?P<node>\d+)", name)
    if not m or m["job"] not in jobs:
        return None
    return Event(m["job"], int(m["attempt"]), int(m["node"]), "preempted", when,
                 {"source": "cloud", "reason": "compute.instances.preempted", "instance": name})


def aws_notice(body: bytes) -> tuple[str, str, datetime] | None:
    """(instance id, notice kind, time) of an EventBridge EC2 message, else None."""
    try:
        doc = json.loads(body)
        kind = NOTICE_KINDS.get(doc.get("detail-type"), "")
        instance = (doc.get("detail") or {}).get("instance-id")
        when = datetime.fromisoformat(str(doc["time"]).replace("Z", "+00:00"))
    except (ValueError, TypeError, KeyError, AttributeError):
        return None
    return (instance, kind or "notice", when) if instance else None


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

    if sources.events_dir is not None:
        attempt(f"events dir {sources.events_dir}", lambda: batches.append(
            [seen(e, "events-dir") for e in keyed_events(read_dir(sources.events_dir, warn), ids, stack, warn, now=now)]))
    if sources.bucket:
        cache = BucketEvents(stack) if bucket_cache is None else bucket_cache

        def bucket() -> None:
            cache.read(cloud, sources.bucket, f"{stack}/", warn)  # each new object warned of once
            batches.append([seen(e, "bucket") for e in cache.events(ids, now, warn)])

        attempt(f"event bucket {sources.bucket}", bucket)
    if sources.subscription:
        slug = stack_slug(stack)

        def pull() -> None:
            messages = [(m, gcp_preemption(m.body, slug, jobs, now)) for m in cloud.subscription_messages(sources.subscription)]
            # Confirmed by the Compute API before it counts: nothing found says Cloud Logging refuses a
            # caller's entries.write into a `cloudaudit.googleapis.com` log name, and a job's service
            # account may write log entries, so an entry could name another job's VM. Only a VM Compute
            # Engine reports gone (or no longer has) is a preemption; asked once per job, before any ack,
            # so an unanswered question leaves every message to be delivered again.
            vms = {j: cloud.vms(j) for j in sorted({e.job for _, e in messages if e and e.attempt == jobs[e.job].attempt})}
            got = []
            for m, e in messages:
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
            _queue(cloud, sources.queue_url, jobs, now, out.acks)))
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


def _queue(cloud, url: str, jobs: dict, now: datetime, acks: list[Ack]) -> list[Seen]:
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
        facts = [seen(e, "queue") for e in cloud_events([vm], jobs[job_id], now)] if vm.status.lower() in GONE else []
        if vm.status.lower() in GONE and not facts:  # a VM of an older attempt: stale, nothing to act on
            acks.append(Ack("queue", m.ack, ()))
            continue
        note = seen(Event(job_id, vm.attempt, vm.node, kind, when, {"source": "queue", "instance": instance}), "queue")
        got += [note, *facts]
        acks.append(Ack("queue", m.ack, tuple(s.id for s in facts) or (note.id,), keep=not facts and now - when < NOTICE_REVISIT))
    return got

