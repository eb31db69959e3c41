"""The shared copy's sessions (``cli.lifecycle.sync``) by stack file, and how a push or pull fails."""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from infra.basics import ConfigError

# ---- the shared copy (cli.lifecycle.sync): pulled when the lock is taken, pushed after each write ----

SYNC_TRIES = 3
_SHARED: dict[str, Any] = {}  # the stack file's real path -> its session (``pull()``, ``push()``)


class SharedCopyMoved(Exception):
    """Another machine wrote the shared copy between this one's pull and its push."""


class SharedCopyUnreachable(ConfigError):
    """The shared copy could not be read or written (the network, the credentials): not a lost race."""

    def __init__(self, source: str, problems: list[str], reason: str = ""):
        super().__init__(source, problems)
        self.reason = reason  # the cloud's own words


def _shared_name(path: Path) -> str:
    return os.path.realpath(path)


@contextlib.contextmanager
def sharing(path: Path, session: Any) -> Iterator[None]:
    """While inside, every lock of ``path`` pulls through ``session`` and every write pushes."""
    name = _shared_name(path)
    _SHARED[name] = session
    try:
        yield
    finally:
        _SHARED.pop(name, None)
