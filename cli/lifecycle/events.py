"""A job's recorded events: the Event record, reading them from a directory, the cloud's view of a
job's VMs as events, and the timeline they tell (pure, apart from reading files)."""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # the pydantic models: imported only where a stack file is validated (issue 20)
    from infra.config import Job


@dataclass(frozen=True)
class Event:
    job: str
    attempt: int
    node: int
    event: str
    time: datetime
    details: Mapping[str, str] = field(default_factory=dict)

    @classmethod
    def parse(cls, doc: Mapping[str, Any]) -> Event:
        return cls(
            job=str(doc["job"]),
            attempt=int(doc["attempt"]),
            node=int(doc.get("node", 0)),
            event=str(doc["event"]),
            time=_aware(datetime.fromisoformat(str(doc["time"]).replace("Z", "+00:00"))),
            details={str(k): str(v) for k, v in dict(doc.get("details") or {}).items()},
        )


def _aware(t: datetime) -> datetime:
    """Times without a zone are UTC (the scripts always write UTC), so every event sorts with every other."""
    return t if t.tzinfo is not None else t.replace(tzinfo=UTC)


def of_stack(doc: dict, stack: str | None) -> bool:
    """An event document of ``stack`` (the scripts stamp every event with it; one without a stamp is
    kept). A directory or bucket may hold several stacks whose job ids coincide."""
    return stack is None or doc.get("stack") in (None, stack)


def parse_events(docs: Iterable[Any], job_id: str, stack: str | None = None) -> list[Event]:
    """The events of ``job_id`` (of ``stack``, when given) among raw JSON documents (bytes or str);
    anything else is skipped."""
    events = []
    for raw in docs:
        try:
            doc = json.loads(raw)
            if doc.get("job") == job_id and of_stack(doc, stack):
                events.append(Event.parse(doc))
        except (ValueError, KeyError, TypeError, AttributeError, OverflowError):
            continue
    return sorted(events, key=lambda e: (e.time, e.attempt, e.node))


def load_events(source: Path | None, job_id: str, stack: str | None = None) -> list[Event]:
    """Recorded events of a job from a directory (the bucket synced locally, or a job disk's
    ``.spotctl/events.jsonl``): every ``*.json``/``*.jsonl`` below it, sorted by time."""
    if source is None:
        return []
    files = [source] if source.is_file() else sorted(p for p in source.rglob("*") if p.suffix in (".json", ".jsonl") and p.is_file())
    lines = []
    for path in files:
        try:
            lines += path.read_bytes().decode(errors="replace").split("\n")
        except OSError:
            continue  # unreadable (a broken link, no permission): a stray file never fails a resume
    return parse_events(lines, job_id, stack)


@dataclass(frozen=True)
class Timeline:
    """What a job's events say about its past: running intervals and the gaps between them."""

    first_start: datetime | None
    runs: list[tuple[datetime, datetime, str]]  # (start, end, how it ended)

    @classmethod
    def of(cls, events: Iterable[Event], now: datetime) -> Timeline:
        by_attempt: dict[int, list[Event]] = {}
        for e in events:
            by_attempt.setdefault(e.attempt, []).append(e)
        runs = []
        for attempt in sorted(by_attempt):
            evs = by_attempt[attempt]
            starts = [e.time for e in evs if e.event == "started"]
            if not starts:
                continue
            ends = [e for e in evs if e.event in ("preempted", "stopped", "failed", "completed")]
            end = min(ends, key=lambda e: e.time) if ends else None
            runs.append((min(starts), end.time if end else now, end.event if end else "running"))
        return cls(runs[0][0] if runs else None, runs)


def event_json(e: Event) -> dict[str, Any]:
    return {"job": e.job, "attempt": e.attempt, "node": e.node, "event": e.event,
            "time": e.time.isoformat(), "details": dict(e.details)}


def cloud_events(vms, job: Job, now: datetime) -> list[Event]:
    """What the cloud says, as events: a preempted (or stopped) VM of the current attempt."""
    out = []
    for vm in vms:
        if vm.attempt != job.attempt:
            continue
        if vm.preempted:
            out.append(Event(job.id, vm.attempt, vm.node, "preempted", now, {"source": "cloud", "reason": vm.reason}))
        elif vm.status.lower() in ("terminated", "stopped", "stopping", "shutting-down"):
            out.append(Event(job.id, vm.attempt, vm.node, "stopped", now, {"source": "cloud", "reason": vm.reason}))
    return out


def recorded(cloud, job_id: str, events_dir: Path | None, bucket: str | None) -> list[Event]:
    """A job's events from ``events_dir`` and/or the stack's event bucket (objects ``<stack>/<job>/``),
    sorted by time. ``cloud`` is the stack's ``cli.cloud.Cloud``; its failures raise CloudError."""
    found = load_events(events_dir, job_id, cloud.stack)
    if bucket:
        found += parse_events(cloud.bucket_documents(bucket, f"{cloud.stack}/{job_id}/"), job_id, cloud.stack)
    return sorted(found, key=lambda e: (e.time, e.attempt, e.node))


def observed(cloud, job: Job, now: datetime) -> list[Event]:
    """What the cloud says about the job's current VMs, as events."""
    return cloud_events(cloud.vms(job.id), job, now)
