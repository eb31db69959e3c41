"""The few config names the CLI needs before any stack file is read: the namespace, the job states,
the capacities, ConfigError, and how an attempt's events end it. Kept apart from ``infra.config``
(pydantic models) so that ``spotctl --help`` and option parsing never pay for building the models."""

from __future__ import annotations

import enum
from collections.abc import Iterable, Sequence
from datetime import datetime
from functools import cache
from pathlib import Path
from typing import Any, Protocol, TypeVar

NAMESPACE = "spotctl"
MAX_JOB_NODES = 64  # nodes of one job (a gang); a `started` event claiming more is not believed either

# A node's trainer that ended on its own (exit 0: completed; otherwise: failed) ended its attempt
# there; a stop, preemption or notice its VM reports as well (in the seconds between the trainer's
# exit and the end of its run, in either order) ends nothing more.
ENDED_ON_ITS_OWN = frozenset({"completed", "failed"})
MOOT_AFTER_ITS_OWN_END = frozenset({"preempted", "preemption-notice", "maintenance-notice", "stopped"})


def counted(n: int, noun: str, plural: str | None = None) -> str:
    """``1 pool``, ``2 pools``: a count with its noun in the right number (``plural`` when not noun + s)."""
    return f"{n} {noun if n == 1 else plural or noun + 's'}"


class _Ends(Protocol):
    attempt: int
    node: int
    event: str


E = TypeVar("E", bound=_Ends)


def ended_nodes(events: Iterable[_Ends]) -> set[tuple[int, int]]:
    """(attempt, node) of every node whose trainer ended on its own."""
    return {(e.attempt, e.node) for e in events if e.event in ENDED_ON_ITS_OWN}


def is_moot(e: _Ends, ended: set[tuple[int, int]]) -> bool:
    return e.event in MOOT_AFTER_ITS_OWN_END and (e.attempt, e.node) in ended


def without_moot(events: Iterable[E]) -> list[E]:
    """``events`` but a node's stop, preemption or notice in an attempt in which it ended on its own."""
    events = list(events)
    ended = ended_nodes(events)
    return [e for e in events if not is_moot(e, ended)]


class JobState(enum.StrEnum):
    """States of a training job; the legal moves between them live in ``cli/lifecycle/states.py``."""

    PENDING = "pending"
    RUNNING = "running"
    PREEMPTED = "preempted"
    STOPPED = "stopped"
    COMPLETED = "completed"
    FAILED = "failed"


class Capacity(enum.StrEnum):
    SPOT = "spot"
    ON_DEMAND = "on-demand"


class ConfigError(Exception):
    """A stack file that cannot be used. ``str()`` is the full, user-facing message."""

    def __init__(self, source: str, problems: Sequence[str]):
        self.source = source
        self.problems = list(problems)
        super().__init__("\n".join(f"{source}: {p}" for p in self.problems))


class _Timed(_Ends, Protocol):
    time: datetime


T = TypeVar("T", bound=_Timed)


def attempt_end(events: Iterable[T], nodes: int | None = None) -> T | None:
    """The event that ended an attempt, from its events (moot ones dropped first): its first
    preemption, stop or failure (one node's ends the gang), else its last completion once every node
    (``nodes``; None: any one) completed; None while it runs."""
    evs = sorted(without_moot(events), key=lambda e: e.time)
    stops = [e for e in evs if e.event in ("preempted", "stopped", "failed")]
    if stops:
        return stops[0]
    done = [e for e in evs if e.event == "completed"]
    if done and (nodes is None or {e.node for e in done} >= set(range(nodes))):
        return done[-1]
    return None


def own_events(retired_after: int, events: Any, attempt_of: Any = lambda e: e.attempt) -> list[Any]:
    """The events of a job's own attempts: an earlier job's of the same id (its attempts up to
    ``retired_after``, spotctl:retiredJobs) left out, so its failures, preemptions and hours are not
    counted as the new one's."""
    return [e for e in events if attempt_of(e) > retired_after] if retired_after else list(events)


def templates_dir() -> Path:
    """``templates/`` in a checkout; ``infra/_templates`` in an installed wheel."""
    here = Path(__file__).resolve().parent
    for candidate in (here.parent / "templates", here / "_templates"):
        if candidate.is_dir():
            return candidate
    raise FileNotFoundError("spotctl templates directory not found")


@cache
def scripts_digest() -> str:
    """What identifies spotctl's own VM scripts (every file ``templates/`` holds, whatever they say):
    recorded per job with each new attempt (``scriptsDigest``), so a running attempt keeps the scripts
    it started with when spotctl is upgraded (``infra.common.frozen_scripts``)."""
    import hashlib

    root = templates_dir()
    h = hashlib.sha256()
    for path in sorted(p for p in root.rglob("*") if p.is_file() and "__pycache__" not in p.parts):
        h.update(path.relative_to(root).as_posix().encode() + b"\0" + path.read_bytes() + b"\0")
    return h.hexdigest()[:16]
