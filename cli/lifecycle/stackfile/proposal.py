"""The record of an edit awaiting its confirmation: who proposed it (a live process?), which job,
what it set and what was there before."""

from __future__ import annotations

import os
import threading
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from cli.lifecycle.stackfile.reading import plain
from cli.lifecycle.stackfile.refs import proposal_path
from cli.lifecycle.stackfile.splicing import MISSING

# ``operations.change_job`` writes the edit, previews it and asks. Until the answer, the edit is a
# proposal: recorded in ``proposal_path`` (this process's pid, the job, the keys it set and what they
# were), written to the local file only (``_commit`` marks it unpushed, and no push of any spotctl on
# this machine sends the file while a live process holds a proposal), pushed once confirmed
# (``publish``), undone otherwise. A proposal whose process died (kill -9 at the question) is undone
# by the next spotctl that takes the stack file's lock, before it pulls: it was never confirmed.

_local_only = threading.local()  # set while a dead proposal is undone (its writes are not pushed either)


def pid_alive(pid: int) -> bool:
    """A process with this pid runs on this machine (another user's included)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's process
        return True
    return True


def process_started(pid: int) -> int | None:
    """When process ``pid`` started (clock ticks since boot: field 22 of ``/proc/PID/stat``, proc(5)),
    or None where there is no /proc (or no such process). With the pid it names one process: a pid
    is reused once its process is gone, the pair is not."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_bytes()  # the command name may be any bytes
        return int(stat.rsplit(b")", 1)[1].split()[19])  # after the command name, which may hold spaces
    except (OSError, ValueError, IndexError):
        return None


def _proposer_alive(doc: dict[str, Any]) -> bool:
    """The process that wrote a proposal record still runs (its pid, and its start time when recorded)."""
    if not pid_alive(doc["pid"]):
        return False
    started = doc.get("started")
    return started is None or process_started(doc["pid"]) in (None, started)


def _proposal(path: Path) -> dict[str, Any] | None:
    """The proposal record when this user's spotctl wrote it (sealed: a forged record, say one a commit
    carried, would otherwise have its "before" values written into the job when it is undone)."""
    from cli.lifecycle import cachefile

    doc = cachefile.open_record(proposal_path(path))
    return doc if doc is not None and isinstance(doc.get("pid"), int) else None


def write_proposal(path: Path, doc: Mapping[str, Any]) -> None:
    """Write the proposal record of ``path``, sealed (``_proposal``), durably (it outlives a kill -9)."""
    from cli.lifecycle import cachefile

    proposal_path(path).parent.mkdir(parents=True, exist_ok=True)
    cachefile.save_record(proposal_path(path), dict(doc))


def held_back(path: Path) -> bool:
    """Whether the stack file holds an edit awaiting its confirmation (this or another live process's)."""
    return getattr(_local_only, "on", False) or proposed_job(path) is not None


def proposed_job(path: Path) -> str | None:
    """The job an edit of ``path`` awaiting its confirmation is about (a live process's proposal), ``""``
    while its record names no job yet, or None when no edit awaits one. The file then holds an attempt
    that may yet be undone: ``watch`` decides nothing on that job meanwhile (its events would look stale)."""
    doc = _proposal(path)
    if doc is None or not _proposer_alive(doc):
        return None
    job = doc.get("job")
    return job if isinstance(job, str) else ""


def note_proposal(path: Path, job_id: str, before: Mapping[str, Any], wrote: Mapping[str, Any]) -> None:
    """Record, before it is written, what the proposed edit sets (so a dead proposal can be undone)."""
    doc = {"pid": os.getpid(), "started": process_started(os.getpid()), "job": job_id, "wrote": plain(dict(wrote)),
           "before": {k: plain(v) for k, v in before.items() if v is not MISSING},
           "missing": [k for k, v in before.items() if v is MISSING]}
    write_proposal(path, doc)
