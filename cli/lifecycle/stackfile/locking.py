"""The stack file's lock: re-entrant per thread; taking it undoes a dead proposal and pulls the
shared copy first, so every decision under it sees the latest file."""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable, Iterator
from pathlib import Path

from cli.lifecycle.stackfile.refs import lock_path
from cli.lifecycle.stackfile.shared import _SHARED, _shared_name
from infra.basics import ConfigError

LOCK_TIMEOUT_S = 30.0


_held = threading.local()  # lock files this thread holds, with a count (locked() nests)
# Run first when the lock is taken: undoing a dead proposal (``proposals``) edits through this very
# lock, so it is handed in from above rather than imported from here.
ON_HOLD: list[Callable[[Path], None]] = []


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
    try:
        lock.acquire()
    except Timeout:
        raise ConfigError(str(path), [f"locked by another spotctl for more than {timeout:.0f} s"]) from None
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
        lock.release()
