"""The stack file's lock: re-entrant per thread; taking it undoes a dead proposal and pulls the
shared copy first, so every decision under it sees the latest file."""

from __future__ import annotations

import contextlib
import sys
import threading
from collections.abc import Callable, Iterator
from pathlib import Path

from cli.lifecycle.stackfile.refs import lock_path
from cli.lifecycle.stackfile.shared import _SHARED, _shared_name
from infra.basics import ConfigError

LOCK_TIMEOUT_S = 30.0
# A wait shorter than this passes unsaid; a longer one is said once (``ON_WAIT``) as it starts.
QUIET_WAIT_S = 1.0


_held = threading.local()  # lock files this thread holds, with a count (locked() nests)
# Run first when the lock is taken: undoing a dead proposal (``proposals``) edits through this very
# lock, so it is handed in from above rather than imported from here.
ON_HOLD: list[Callable[[Path], None]] = []


def _say(line: str) -> None:
    sys.stderr.write(line + "\n")  # stderr: never inside a --json answer on stdout
    sys.stderr.flush()


# Told one line when a wait for the lock outlasts QUIET_WAIT_S: a person sees why nothing happens.
ON_WAIT: list[Callable[[str], None]] = [_say]


@contextlib.contextmanager
def locked(path: Path, timeout: float = LOCK_TIMEOUT_S) -> Iterator[None]:
    """Hold the stack file's lock (another spotctl, or another thread, editing the same stack
    waits). Re-entrant in one thread, so a command can decide and act under one hold while the
    edits it makes take the lock again."""
    from filelock import FileLock, Timeout

    name = str(lock_path(path).resolve())
    counts = _held.__dict__.setdefault("counts", {})
    if counts.get(name):
        counts[name] += 1
        try:
            yield
        finally:
            counts[name] -= 1
        return
    lock = FileLock(name, timeout=timeout)
    quiet = QUIET_WAIT_S if timeout < 0 else min(timeout, QUIET_WAIT_S)  # (timeout < 0: wait for ever)
    try:
        try:
            lock.acquire(timeout=quiet)
        except Timeout:
            if 0 <= timeout <= quiet:
                raise
            who, limit = _holder(name), "" if timeout < 0 else f"up to {timeout:.0f} s "
            for tell in ON_WAIT:
                tell(f"waiting {limit}for the lock on {name}" + (f" held by {who}" if who else ""))
            lock.acquire(timeout=-1 if timeout < 0 else timeout - quiet)
    except Timeout:
        who = _holder(name)
        raise ConfigError(str(path), ["locked by another spotctl" + (f" ({who})" if who else "")
                                      + f" for more than {timeout:.0f} s"]) from None
    _record_holder(name, _holding())
    counts[name] = 1
    try:
        for hook in ON_HOLD:
            hook(path)
        session = _SHARED.get(_shared_name(path))
        if session is not None:
            session.pull()  # the shared copy's news first, so every decision under the lock sees them
        yield
    finally:
        counts.pop(name, None)
        _record_holder(name, "")  # (a waiter that wins next is not told of this process)
        lock.release()


def _holding() -> str:
    import os
    import socket
    from datetime import UTC, datetime

    return f"pid {os.getpid()} on {socket.gethostname()} since {datetime.now(UTC).strftime('%Y-%m-%dT%H:%M:%SZ')}\n"


def _record_holder(name: str, text: str) -> None:
    """Write who holds the lock into its file, under the lock (the flock is the lock; the text only
    tells a waiter who it waits for)."""
    import os

    with contextlib.suppress(OSError):  # (a lock file another account made: the lock holds, untold)
        fd = os.open(name, os.O_WRONLY | os.O_TRUNC | getattr(os, "O_NOFOLLOW", 0))
        try:
            os.write(fd, text.encode())
        finally:
            os.close(fd)


def _holder(name: str) -> str:
    """``pid N on HOST since T`` as the holder recorded it, or "" (none recorded, or unreadable)."""
    import re

    try:
        with open(name, encoding="utf-8", errors="replace") as fh:
            text = fh.read(200).strip()
    except OSError:
        return ""
    return text if re.fullmatch(r"pid \d+ on [\w.-]{1,64} since [\dT:Z-]{10,25}", text) else ""
