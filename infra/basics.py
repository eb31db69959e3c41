"""The few config names the CLI needs before any stack file is read: the namespace, the job states,
the capacities, ConfigError, and how an attempt's events end it. Kept apart from ``infra.config``
(pydantic models) so that ``spotctl --help`` and option parsing never pay for building the models."""

from __future__ import annotations

import enum
import itertools
import json
import re
from collections.abc import Iterable, Sequence
from datetime import datetime
from functools import cache
from pathlib import Path
from typing import Any, Protocol, TypeVar

NAMESPACE = "spotctl"
# The longest `spotctl watch --interval`: the watch lease's term is 3 cycles, and a taker waits out
# a whole term (cli/watch/lease.py), so the interval bounds how long that can be.
WATCH_INTERVAL_MAX_S = 3600.0
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


# A document a VM, a queue or a shared bucket hands over is parsed only within bounds: the stdlib
# parser recurses once per nesting level, so ~1,000 levels end in RecursionError (in the caller's
# stack, after it has started reading), and a number of a million digits costs seconds. spotctl's
# own documents (events, leases, messages, records) nest a few levels deep.
JSON_DEPTH = 32
_JSON_STRING = re.compile(r'"[^"\\]*(?:\\.[^"\\]*)*"', re.S)


def json_depth(text: str) -> int:
    """How deeply ``text``'s arrays and objects nest, brackets inside strings not counted (an
    unterminated string's brackets are: that text is no JSON anyway). Linear, without recursion."""
    brackets = re.sub(r"[^\[\]{}]+", "", _JSON_STRING.sub("", text))
    steps = (1 if c in "[{" else -1 for c in brackets)
    return max(itertools.accumulate(steps, initial=0))


class BadJson(ValueError):
    """A document refused before or while it was parsed; ``str()`` says why, ``kind`` is one of
    size, depth, encoding, syntax."""

    def __init__(self, kind: str, why: str):
        super().__init__(why)
        self.kind = kind


def loads_bounded(data: bytes | str, limit: int, depth: int = JSON_DEPTH) -> Any:
    """``json.loads`` of at most ``limit`` bytes nesting at most ``depth`` levels.

    Raises:
        BadJson: too large, too deep, not UTF-8 or not JSON (a ValueError).
    """
    if len(data) > limit:
        raise BadJson("size", f"{len(data)} bytes, over the {limit} a document may be")
    try:
        text = data.decode() if isinstance(data, bytes) else data
    except UnicodeDecodeError as exc:
        raise BadJson("encoding", f"not UTF-8 ({exc.reason} at byte {exc.start})") from None
    if (d := json_depth(text)) > depth:
        raise BadJson("depth", f"nested {d} levels deep, over the {depth} a document may be")
    try:
        return json.loads(text)
    except (ValueError, RecursionError) as exc:  # ValueError also: a number of over 4,300 digits
        raise BadJson("syntax", f"not JSON ({str(exc).splitlines()[0][:120]})") from None


def read_regular(path: Any, limit: int) -> bytes:
    """The bytes of ``path`` (links followed) when it is a regular file of at most ``limit`` bytes.

    Raises:
        OSError: it cannot be opened, or it is not a regular file (a FIFO, /dev/zero: never read for
            ever), or it is larger than ``limit`` (``strerror`` says which).
    """
    import errno
    import os
    import stat

    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)  # a FIFO opens at once, and is refused below
    with open(fd, "rb", buffering=0, closefd=True) as fh:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise OSError(errno.EINVAL, "not a regular file")
        data = fh.read(limit + 1)
    if len(data) > limit:
        raise OSError(errno.EFBIG, f"larger than {limit >> 20} MiB")
    return data


def templates_dir() -> Path:
    """``templates/`` in a checkout; ``infra/_templates`` in an installed wheel."""
    here = Path(__file__).resolve().parent
    for candidate in (here.parent / "templates", here / "_templates"):
        if candidate.is_dir():
            return candidate
    raise FileNotFoundError("spotctl templates directory not found")


@cache
def scripts_digest() -> str:
    """What identifies spotctl's own VM scripts (every file ``templates/`` holds, whatever they say,
    and the VM agent's modules, which the bootstrap pins by digest): recorded per job with each new
    attempt (``scriptsDigest``), so a running attempt keeps the scripts it started with when spotctl
    is upgraded (``infra.common.frozen_scripts``; the agent it pinned stays in the bucket)."""
    import hashlib

    import agent

    h = hashlib.sha256()
    for root, prefix in ((templates_dir(), ""), (Path(agent.__file__).resolve().parent, "agent/")):
        for path in sorted(p for p in root.rglob("*") if p.is_file() and "__pycache__" not in p.parts):
            h.update((prefix + path.relative_to(root).as_posix()).encode() + b"\0" + path.read_bytes() + b"\0")
    return h.hexdigest()[:16]
