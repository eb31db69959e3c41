"""Small helpers of every agent module: the debug log, state files, locks and processes."""

from __future__ import annotations

import contextlib
import fcntl
import os
import sys
import time
from typing import Iterator, Optional

from agent.config import Config


def log(cfg: Config, message: str) -> None:
    """A line in the VM's debug log (and stderr, which systemd keeps in the journal)."""
    line = "%s spotctl[%d]: %s\n" % (time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), os.getpid(), message)
    with contextlib.suppress(OSError):
        os.makedirs(cfg.state_dir, exist_ok=True)
        with open(cfg.state("spotctl.log"), "a", encoding="utf-8") as fh:
            fh.write(line)
    # Under systemd stderr is the journal; without it (a drill) the unit's output is this same log.
    if not cfg.no_systemd or sys.stderr.isatty():
        with contextlib.suppress(OSError, ValueError):
            sys.stderr.write(f"spotctl: {message}\n")
            sys.stderr.flush()


def read(path: str, default: Optional[str] = None) -> Optional[str]:
    try:
        with open(path, encoding="utf-8", errors="replace") as fh:
            return fh.read()
    except OSError:
        return default


def write_atomic(path: str, text: str, mode: int = 0o644) -> None:
    """Write through a temp file and a rename: a reader sees the old or the new content, whole."""
    tmp = "%s.tmp.%d" % (path, os.getpid())
    with open(tmp, "w", encoding="utf-8") as fh:
        fh.write(text)
    os.chmod(tmp, mode)
    os.replace(tmp, path)


def touch(path: str) -> None:
    with open(path, "a"):
        pass


def exists(path: str) -> bool:
    return os.path.exists(path)


def remove(path: str) -> None:
    with contextlib.suppress(FileNotFoundError):
        os.remove(path)


@contextlib.contextmanager
def locked(path: str, timeout: float, blocking: bool = True) -> Iterator[bool]:
    """An exclusive flock on ``path`` for the block; yields whether it was taken within ``timeout``."""
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    got = False
    try:
        deadline = time.monotonic() + timeout
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                got = True
                break
            except BlockingIOError:
                if not blocking or time.monotonic() >= deadline:
                    break
                time.sleep(0.05)
        yield got
    finally:
        os.close(fd)


def pid_alive(pid: int) -> bool:
    """``pid`` runs (a zombie does not)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    stat = read("/proc/%d/stat" % pid)
    return stat is None or stat.rsplit(")", 1)[-1].split()[0] != "Z"


def group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
        return True
    except ProcessLookupError:
        return pid_alive(pgid)
    except PermissionError:
        return True


def pid_file(cfg: Config, name: str) -> Optional[int]:
    text = (read(cfg.state(name)) or "").strip()
    return int(text) if text.isdigit() else None
