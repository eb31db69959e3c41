"""The watcher's memory and its lease, both next to the stack file.

``.Pulumi.<stack>.yaml.watch.json`` (the journal): the ids of events already handled, what each job
is waiting for (capacity: the attempt, the next try) and the action in flight. It is rewritten
atomically (temp file + rename) before an action starts (its intent) and after it ends, so a
``kill -9`` at any point leaves a journal that says either "not started" or "started": the next
watcher re-applies a started action whose stack edit is in the file, and redoes nothing else.

``.Pulumi.<stack>.yaml.watch.lock`` (the local lease): an OS file lock held for the watcher's whole
life (the kernel releases it when the process dies, even by ``kill -9``), with the holder written beside
it so a second watcher can say who holds it. It keeps the watchers of this checkout apart; watchers on
other machines are kept apart by the lease in the event bucket (``cli.watch.lease``), whose id the
holder file also records (a restart on this checkout takes its dead predecessor's lease at once).
"""

from __future__ import annotations

import contextlib
import os
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from pathlib import Path
from typing import TYPE_CHECKING, Any

from cli.lifecycle import cachefile
from cli.lifecycle.states import moving_away

if TYPE_CHECKING:
    from cli.watch.decide import JobMemory

KEEP_HANDLED = timedelta(days=14)


def journal_path(stack_file: Path) -> Path:
    """Beside the real file, as its lease: one memory per stack file, whatever path names it."""
    from cli.lifecycle.stackfile import beside

    return beside(stack_file, ".watch.json")


@dataclass
class Journal:
    path: Path
    handled: dict[str, str] = field(default_factory=dict)  # event id -> when handled (ISO)
    jobs: dict[str, dict[str, Any]] = field(default_factory=dict)

    @classmethod
    def load(cls, stack_file: Path, set_aside: bool = True) -> Journal:
        """The journal this user's spotctl wrote here, sealed (``cli.lifecycle.cachefile``): a forged one
        (a commit can carry it) could hold a job in "waiting for capacity" for ever or mark real events
        handled. Anything else here is set aside (``set_aside``: the watcher; a reader such as `status`
        under another user's key leaves it) and the journal starts afresh (every action is idempotent)."""
        path = journal_path(stack_file)
        if not os.path.lexists(path):
            return cls(path)
        doc = cachefile.open_record(path, limit=1 << 26, unsealed_without_key=True)
        try:
            if doc is not None:
                return cls(path, dict(doc.get("handled", {})), dict(doc.get("jobs", {})))
        except (TypeError, ValueError):
            pass
        if set_aside:  # written atomically, so not a torn write: something else wrote here; kept for a look
            with contextlib.suppress(OSError):
                os.replace(path, path.with_suffix(".json.bad"))
        return cls(path)

    def save(self, now: datetime) -> None:
        cutoff = (now - KEEP_HANDLED).isoformat()
        self.handled = {k: v for k, v in self.handled.items() if v >= cutoff}
        cachefile.save_record(self.path, {"handled": self.handled, "jobs": self.jobs})

    def memory(self) -> dict[str, JobMemory]:
        from cli.watch.decide import JobMemory  # (not for `status`, which reads only the jobs' rows)

        out = {}
        for job, doc in self.jobs.items():
            nxt, since = doc.get("next_try"), doc.get("refused_since")
            out[job] = JobMemory(doc.get("waiting_attempt"), datetime.fromisoformat(nxt) if nxt else None,
                                 int(doc.get("tries", 0)), doc.get("intent"),
                                 datetime.fromisoformat(since) if since else None,
                                 {z: datetime.fromisoformat(t) for z, t in (doc.get("refused") or {}).items()},
                                 refusals_of(doc), bool(doc.get("retrying_apply", doc.get("status") == "retrying-apply")))
        return out

    def handle(self, ids, now: datetime) -> None:
        for i in ids:
            self.handled.setdefault(i, now.isoformat())

    def job(self, job_id: str) -> dict[str, Any]:
        return self.jobs.setdefault(job_id, {})


def refusals_of(memo: dict[str, Any]) -> int:
    """The capacity refusals a job's row counts (a row written before they were counted apart from
    other failed updates: its tries, when its last failure was a refusal)."""
    if "refusals" in memo:
        return int(memo["refusals"])
    return int(memo.get("tries", 0)) if memo.get("status") == "waiting-for-capacity" else 0


def capacity_refusals(jobs, memory: dict[str, JobMemory]) -> list[tuple[str, str, datetime]]:
    """(machine type, zone, when) of every job's last capacity refusal per zone (``memory``: the
    journal's): what the zone choice takes as spot down there for a while (``cli.lifecycle.zonechoice``)."""
    kinds = {j.id: j.machine_type or j.instance_type or "?" for j in jobs}
    return [(kinds[job_id], zone, when) for job_id, m in memory.items() if job_id in kinds for zone, when in m.refused.items()]


def recorded_refusals(stack_file: Path, jobs) -> list[tuple[str, str, datetime]]:
    """``capacity_refusals`` as the watcher's journal beside ``stack_file`` records them, read only
    (a journal that is not this user's, or a row that does not parse, says nothing; nothing is set aside)."""
    if not os.path.lexists(journal_path(stack_file)):
        return []
    try:
        return capacity_refusals(jobs, Journal.load(stack_file, set_aside=False).memory())
    except (TypeError, ValueError, AttributeError):
        return []


def watcher_view(stack_file: Path, jobs) -> dict[str, dict[str, Any]]:
    """What the watcher sees of each job (for ``spotctl status``): ``status`` (needs-resume,
    stopped-by-user, waiting-for-capacity, retrying-apply, or how its last action ended), ``next_try``, ``last_action``."""
    memo = Journal.load(stack_file, set_aside=False).jobs if journal_path(stack_file).exists() else {}
    out = {}
    for job in jobs:
        entry = memo.get(job.id, {})
        row = {k: entry[k] for k in ("status", "next_try", "last_action", "last_error", "at") if k in entry}
        waiting = entry.get("waiting_attempt") == job.attempt and "next_try" in entry
        if not waiting:
            row.pop("next_try", None)
            if row.get("status") in ("waiting-for-capacity", "retrying-apply"):
                row["status"] = "ok"
        if moving_away(job):  # the watcher continues the move; nothing resumes it (states.moving_guard)
            row["status"] = "moving"
        elif job.state.value == "stopped" and job.stopped_by == "user":
            row["status"] = "stopped-by-user"  # the watcher leaves it: only `spotctl resume` starts it again
        elif job.state.value in ("preempted", "stopped"):
            row["status"] = "needs-resume"
        if row:
            out[job.id] = row
    return out


# ---- the lease -------------------------------------------------------------------------------------------


class LeaseHeld(Exception):
    """Another watcher holds the stack; ``str()`` names it."""


class LeaseLost(LeaseHeld):
    """This watcher's lease was taken or could not be renewed before it expired: it stopped acting."""


@dataclass(frozen=True)
class Predecessor:
    """The lease this checkout's previous watcher held (from the local holder file), and whether its
    process is gone; only then may its lease be taken before it expires."""

    id: str
    host: str
    pid: int


def lease_path(stack_file: Path) -> Path:
    """The watcher's lock: one per stack file, whatever path (a symbolic link) names it."""
    from cli.lifecycle.stackfile import beside

    return beside(stack_file, ".watch.lock")


def holder_path(stack_file: Path) -> Path:
    from cli.lifecycle.stackfile import beside

    return beside(stack_file, ".watch.holder")


def read_holder(stack_file: Path) -> dict[str, Any]:
    """The holder file this checkout's last watcher wrote ({} when there is none or it is not one)."""
    return cachefile.open_record(holder_path(stack_file), unsealed_without_key=True) or {}  # (sealed: a forged one names another's lease)


class Lease:
    """One watcher per stack. ``acquire(wait_s)`` waits up to ``wait_s`` (0: not at all)."""

    def __init__(self, stack_file: Path, now: Callable[[], datetime]):
        from filelock import FileLock

        self.stack_file, self.now = stack_file, now
        self.lock = FileLock(str(lease_path(stack_file)))
        self.previous: dict[str, Any] = {}  # the holder file as the previous watcher of this checkout left it

    def holder(self) -> str:
        doc = read_holder(self.stack_file)
        try:
            return f"{doc['holder']} (pid {doc['pid']} on {doc['host']}, since {doc['since']})"
        except KeyError:
            return "another spotctl watch"

    def acquire(self, wait_s: float = 0.0) -> None:
        from filelock import Timeout

        deadline = time.monotonic() + wait_s
        while True:
            try:
                self.lock.acquire(timeout=0)
                break
            except Timeout:
                if time.monotonic() >= deadline:
                    raise LeaseHeld(f"stack {self.stack_file.name}: watched by {self.holder()}") from None
                time.sleep(min(1.0, max(0.05, deadline - time.monotonic())))
        import socket

        self.previous = read_holder(self.stack_file)
        self.doc = {"holder": f"spotctl watch {os.getpid()}@{socket.gethostname()}", "pid": os.getpid(),
                    "host": socket.gethostname(), "since": self.now().isoformat()}
        cachefile.save_record(holder_path(self.stack_file), self.doc)

    def predecessor(self) -> Predecessor | None:
        """The bucket lease the previous watcher of this checkout held (it no longer holds this lock)."""

        p = self.previous
        try:
            return Predecessor(str(p["lease"]), str(p["host"]), int(p["pid"])) if p.get("lease") else None
        except (KeyError, TypeError, ValueError):
            return None

    def record(self, lease_id: str) -> None:
        """Note the bucket lease this watcher holds (read by the next watcher of this checkout)."""
        cachefile.save_record(holder_path(self.stack_file), {**self.doc, "lease": lease_id})

    def release(self) -> None:
        if self.lock.is_locked:
            self.lock.release()
