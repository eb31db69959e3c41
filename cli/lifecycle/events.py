"""A job's recorded events: the Event record, reading them from a directory, the cloud's view of a
job's VMs as events, and the timeline they tell (pure, apart from reading files)."""

from __future__ import annotations

import re
from collections.abc import Callable, Container, Iterable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import TYPE_CHECKING, Any

from agent.schema import EVENT_KEY, EVENT_LOG_LIMIT, EVENT_OBJECT_LIMIT, JOB_COPY_FILE
from infra.basics import BadJson, attempt_end, loads_bounded

if TYPE_CHECKING:  # the pydantic models: imported only where a stack file is validated (a short command never loads them)
    from infra.config import Job


@dataclass(frozen=True)
class Event:
    job: str
    attempt: int
    node: int
    event: str
    time: datetime
    details: Mapping[str, str] = field(default_factory=dict)
    # Where the VM that wrote it ran, as its metadata server said ("" when not written): a pool's VMs
    # share one attempt and node, so their zone and instance are the only things telling them apart.
    zone: str = field(default="", compare=False)
    instance: str = field(default="", compare=False)

    @classmethod
    def parse(cls, doc: Mapping[str, Any]) -> Event:
        """An event document as a VM wrote it; its text without control characters (``printable``)."""
        return cls(
            job=str(doc["job"]),
            attempt=int(doc["attempt"]),
            node=int(doc.get("node", 0)),
            event=printable(str(doc["event"])),
            time=_aware(datetime.fromisoformat(str(doc["time"]).replace("Z", "+00:00"))),
            details={printable(str(k)): printable(str(v)) for k, v in dict(doc.get("details") or {}).items()},
            zone=printable(str(doc.get("zone") or "")),
            instance=printable(str(doc.get("instance") or "")),
        )


# C0 and C1 control characters (ESC starts a terminal's escape sequences, CSI is C1's): a VM writes
# its events' text, and `events`, `status` and `watch` print it to a terminal.
CONTROL = re.compile(r"[\x00-\x1f\x7f-\x9f]")


def printable(text: str) -> str:
    """``text`` with each control character (newlines and tabs too) replaced by a space."""
    return CONTROL.sub(" ", text)


# A trainer's log is text for a terminal: colours (SGR, ``ESC [ ... m``), ``\r`` of progress bars, tabs
# and newlines are kept; every other escape sequence (cursor moves, titles, OSC 52's clipboard writes,
# ...) and control character goes. ECMA-48 5.4: CSI ``ESC [`` params, intermediates, a final byte;
# OSC ``ESC ]`` text ended by BEL or ST (``ESC \``); their 8-bit forms (CSI 0x9b, OSC 0x9d, ST 0x9c); any
# other ``ESC`` with its intermediates and final byte (``ESC c`` resets the terminal).
_ESCAPES = re.compile(r"(?:\x1b\[|\x9b)[0-?]*[ -/]*[@-~]|(?:\x1b\]|\x9d)[^\x07\x1b\x9c]*(?:\x07|\x1b\\|\x9c)?"
                      r"|\x1b[ -/]*[0-~]?|[\x00-\x08\x0b\x0c\x0e-\x1f\x7f-\x9f]")
_SGR = re.compile(r"\x1b\[[0-9;]*m")


def terminal_safe(text: str) -> str:
    """``text`` as a terminal may show it: its colours and line breaks, nothing that drives the terminal."""
    return _ESCAPES.sub(lambda m: m[0] if _SGR.fullmatch(m[0]) else "", text)


def _aware(t: datetime) -> datetime:
    """Times without a zone are UTC (the scripts always write UTC), so every event sorts with every other."""
    return t if t.tzinfo is not None else t.replace(tzinfo=UTC)


def of_stack(doc: dict, stack: str | None) -> bool:
    """An event document of ``stack`` (the scripts stamp every event with it; one without a stamp is
    kept). A directory or bucket may hold several stacks whose job ids coincide."""
    return stack is None or doc.get("stack") in (None, stack)


# What one recorded event may cost whoever reads it (README "Watching a stack", the limits): a job's
# VM writes its own events, so a broken or hostile one must not exhaust the reader. The sizes are the
# agent's (agent/schema.py, shared with the VM). Time: an event is kept only between EARLIEST (before
# spotctl wrote any event: a year-1 ``started`` made one resume build 1.7 GB of availability ticks) and
# the reader's clock plus CLOCK_SKEW (the VMs and the reader keep NTP time; an hour covers a drifting
# laptop, nothing a job could gain from).
EARLIEST = datetime(2020, 1, 1, tzinfo=UTC)
CLOCK_SKEW = timedelta(hours=1)


def implausible(t: datetime, now: datetime) -> str | None:
    """Why an event's time cannot be true (None: it can): before ``EARLIEST`` or after ``now`` + ``CLOCK_SKEW``."""
    if t < EARLIEST:
        return f"is before {EARLIEST.date().isoformat()}"
    if t > now + CLOCK_SKEW:
        return f"is more than {CLOCK_SKEW} after now ({now.isoformat(timespec='seconds')})"
    return None


def load_events(source: Path | None, job_id: str, stack: str | None = None,
                warn: Callable[[str], None] | None = None, now: datetime | None = None) -> list[Event]:
    """Recorded events of a job from a directory (the bucket synced locally, or a job disk's
    ``.spotctl/events.jsonl``): every ``*.json``/``*.jsonl`` below it, sorted by time. A file in a
    folder counts only if the folders, read as the bucket's key from the root, name the body's
    stack, job, attempt and node (:func:`vouched_locally`)."""
    return keyed_events(read_dir(source, warn), {job_id}, stack, warn, now=now) if source is not None else []


def read_dir(source: Path, warn: Callable[[str], None] | None = None) -> dict[str, bytes]:
    """{path relative to ``source``: content} of every ``*.json``/``*.jsonl`` below ``source`` (or the
    file itself); an unreadable file (a broken link, no permission, not a regular file) is skipped: a
    stray file never fails a resume. A file over its limit (``EVENT_OBJECT_LIMIT``, ``EVENT_LOG_LIMIT``
    for ``.jsonl``) is skipped unread, with one warning naming it."""
    from cli.lifecycle.cachefile import read_bounded

    files = [source] if source.is_file() else sorted(p for p in source.rglob("*") if p.suffix in (".json", ".jsonl") and p.is_file())
    out = {}
    for path in files:
        name = path.name if path == source else path.relative_to(source).as_posix()
        limit = EVENT_LOG_LIMIT if path.suffix == ".jsonl" else EVENT_OBJECT_LIMIT
        data = read_bounded(path, limit, follow=True)
        if data is not None:
            out[name] = data
        elif warn is not None and (size := _size(path)) > limit:
            warn(f"event file {path}: skipped: {size} bytes, over the {limit >> 20} MiB an events file may be")
    return out


def _size(path: Path) -> int:
    try:
        return path.stat().st_size
    except OSError:
        return 0


# Where a VM writes an event object: ``<stack>/<job>/attempt-N/node-K/<time>-<event>.json``
# (agent/schema.py ``EVENT_KEY``). IAM lets a job's VM write only under its own ``<stack>/<job>/``
# (infra/aws.py ``_instance_profile``; the GCS grant in infra/gcp.py is conditioned on the same
# prefix), never what it puts in the body: so the key is the only claim a bucket event can prove, and a
# body must agree with it.


def trusted(key: str, doc: Mapping[str, Any], event: Event, stack: str) -> bool:
    """Whether a bucket event document agrees with its object key: a full key
    ``<stack>/<job>/attempt-N/node-K/...`` of ``stack`` naming the body's job, attempt and node."""
    m = EVENT_KEY.fullmatch(key)
    return (m is not None and (event.job, event.attempt, event.node) == (m["job"], int(m["attempt"]), int(m["node"]))
            and m["stack"] == stack and doc.get("stack", stack) == stack)


# A copy of ONE job's prefix (``<stack>/<job>/`` synced alone) holds the scripts' event files at
# ``attempt-N/node-K/<file>``. Every file in such a copy may be that job's VM's own writing, and no
# path in it names the job, so none of it can vouch for an event. The whole depth is matched: a job
# may be named ``attempt-2`` (a valid job id), and a stack's copy then holds
# ``attempt-2/attempt-N/node-K/<file>``, one folder deeper.


def is_job_copy(paths: Iterable[str]) -> bool:
    """Whether paths relative to an ``--events-dir`` are a copy of one job's prefix (``JOB_COPY_FILE``)."""
    return any(JOB_COPY_FILE.fullmatch(path) for path in paths)


def vouched_locally(path: str, doc: Mapping[str, Any], event: Event, stack: str | None, *,
                    job_copy: bool = False) -> bool:
    """Whether a file of an ``--events-dir`` (``path`` relative to it) vouches for its body. The
    directory is read as the root of a copy of the bucket (``aws s3 sync``, ``gcloud storage rsync``)
    or of one stack's prefix, so its folders are the object key's parts, anchored at the root:

    - a file directly in the directory, or in its ``.spotctl/`` (a job disk's ``events.jsonl``, files
      the user wrote) names nothing: taken as written, except in a copy of one job's prefix
      (``job_copy``), where no file is vouched for;
    - otherwise the path must be exactly ``<stack>/<job>/attempt-N/node-K/<file>`` (the bucket; the
      stack is ``stack``, else the body's own, and the body names no other) or
      ``<job>/attempt-N/node-K/<file>`` (one stack's prefix) with the body's job, attempt and node.
      Any other folder layout (``<job>/x.json``, ``<stack>/<job>/x.json``, deeper keys a job's VM
      may write under its own prefix) vouches for nothing.

    A job's VM writes only ``<stack>/<own job>/...``: under the bucket's copy that is this path's first
    two folders, under a stack's copy its first one, so it can name no other job. (The one reading this
    cannot tell apart: a job named like its own stack, in a stack's copy, writing a ``<stack>/<job>/``
    layout of its own. Job ids are lowercase names; stack names usually are not the same.)"""
    *dirs, _ = path.split("/")
    if not dirs or dirs == [".spotctl"]:  # no job id starts with a dot (infra.config NAME_RULE)
        return not job_copy
    if job_copy:
        return False
    claim = [event.job, f"attempt-{event.attempt}", f"node-{event.node}"]
    if dirs == claim:
        return stack is None or doc.get("stack", stack) == stack
    want = stack if stack is not None else doc.get("stack")
    return len(dirs) == 4 and dirs[1:] == claim and want is not None and dirs[0] == want and doc.get("stack", want) == want


def _documents(text: str, key: str, warn: Callable[[str], None] | None, *, single: bool = False) -> list[Any]:
    """The parsed documents: one JSON document (an event object, however formatted), else (unless
    ``single``) each JSON line that parses. Each is parsed within bounds (``loads_bounded``: a VM
    may write anything under its prefix); one nested too deeply, or a ``single`` object that is
    no JSON, is skipped with one warning naming ``key``."""
    try:
        return [loads_bounded(text, EVENT_LOG_LIMIT)]
    except BadJson as exc:
        refused = exc if single or exc.kind == "depth" else None
    docs, lines, bad = [], [] if single else text.split("\n"), 0
    for i, line in enumerate(lines):
        if not line.strip():
            continue
        try:
            docs.append(loads_bounded(line, EVENT_OBJECT_LIMIT))
        except BadJson as exc:
            if exc.kind == "depth":
                refused = refused or exc
            elif i < len(lines) - 1:  # (a last line with no newline yet may still be being written)
                bad += 1
    if refused is not None and warn is not None:
        warn(f"event {key}: skipped{' a line' if docs else ''}: {refused}")
    if bad and warn is not None:
        warn(f"event {key}: skipped {bad} line{'s' if bad > 1 else ''} that {'are' if bad > 1 else 'is'} not JSON")
    return docs


def keyed_events(objects: Mapping[str, Any], job_ids: Container[str], stack: str | None,
                 warn: Callable[[str], None] | None = None, *, bucket: bool = False,
                 now: datetime | None = None) -> list[Event]:
    """The events of any of ``job_ids`` (of ``stack``, when given) among ``{key: JSON or JSON lines}``,
    sorted by time, each only if its key vouches for it: ``bucket`` keys must be full
    ``<stack>/<job>/attempt-N/node-K/`` object keys (:func:`trusted`), otherwise the keys are paths
    relative to an ``--events-dir`` (:func:`vouched_locally`). A document its key contradicts (a job's
    VM writing another job's events under its own prefix) is skipped with one warning naming the key;
    so is an event whose time cannot be true (:func:`implausible` against ``now``, the clock's when None)."""
    return plausible(vouched(objects, job_ids, stack, warn, bucket=bucket), now, warn)


def plausible(keyed: Iterable[tuple[str, Event]], now: datetime | None, warn: Callable[[str], None] | None = None,
              told: set[str] | None = None) -> list[Event]:
    """The events of ``(key, event)`` pairs whose time can be true (:func:`implausible`), sorted by time;
    one warning per key of the others (none for the keys in ``told``, to which they are added)."""
    now = now or datetime.now(UTC)
    told = set() if told is None else told
    events = []
    for key, event in keyed:
        why = implausible(event.time, now)
        if why is None:
            events.append(event)
        elif key not in told:  # one warning per object (a job disk's events.jsonl holds many)
            told.add(key)
            if warn is not None:
                warn(f"event {key}: skipped: job {event.job!r} attempt {event.attempt} {event.event!r} at "
                     f"{event.time.isoformat()}: that time {why}")
    return sorted(events, key=lambda e: (e.time, e.attempt, e.node))


def vouched(objects: Mapping[str, Any], job_ids: Container[str], stack: str | None,
            warn: Callable[[str], None] | None = None, *, bucket: bool = False) -> list[tuple[str, Event]]:
    """``(key, event)`` of every event ``keyed_events`` reads, before their times are weighed. A bucket
    object is one JSON document (the scripts write one event per object)."""
    out = []
    job_copy = not bucket and is_job_copy(objects)
    for key, raw in objects.items():
        for event, refusal in claims(key, raw, stack, warn, bucket=bucket, job_copy=job_copy):
            if event.job not in job_ids:
                continue
            if refusal is None:
                out.append((key, event))
                continue
            if warn is not None:
                warn(refusal)
            break  # one warning per object
    return out


def claims(key: str, raw: Any, stack: str | None, warn: Callable[[str], None] | None = None, *,
           bucket: bool = False, job_copy: bool = False) -> list[tuple[Event, str | None]]:
    """Each event document of one object or file, in order: ``(event, None)`` when its key vouches for
    it, else ``(event, why not)`` (:func:`vouched` keeps a job's events up to its first refused one)."""
    out: list[tuple[Event, str | None]] = []
    text = raw.decode(errors="replace") if isinstance(raw, bytes) else str(raw)
    for doc in _documents(text, key, warn, single=bucket):
        try:
            # a local directory may hold several stacks; under this stack's bucket prefix, another
            # stack's claim is a forgery (refused below)
            if not (isinstance(doc, dict) and isinstance(doc.get("job"), str) and (bucket or of_stack(doc, stack))):
                continue
            event = Event.parse(doc)
        except (ValueError, KeyError, TypeError, AttributeError, OverflowError):
            continue
        if trusted(key, doc, event, stack) if bucket else vouched_locally(key, doc, event, stack, job_copy=job_copy):
            out.append((event, None))
        else:
            out.append((event, f"event {key}: skipped: its body claims job {event.job!r} attempt {event.attempt} node "
                               f"{event.node}{' of stack ' + repr(doc.get('stack')) if 'stack' in doc else ''}, "
                               f"which its {'key' if bucket else 'path'} does not grant"
                               + (" (a copy of one job's prefix: sync the bucket or a stack's prefix)" if job_copy else "")))
    return out


class _AnyJob:
    """Every job id (a parsed object's events are kept for whichever job reads them later): any
    string, as a set of ids holds (a body's ``"job": 7`` is no job's)."""

    def __contains__(self, item: object) -> bool:
        return isinstance(item, str)


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
            end = attempt_end(evs)
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


def observed(cloud, job: Job, now: datetime) -> list[Event]:
    """What the cloud says about the job's current VMs, as events."""
    return cloud_events(cloud.vms(job.id), job, now)
