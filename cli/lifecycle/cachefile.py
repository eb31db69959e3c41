"""spotctl's cache files beside a stack file (``stacks/.spotctl/``: the job index, status's per-job
cache), sealed with a key only this user's spotctl knows.

Why: a cache there decides which lines of the stack file an edit touches and what ``status`` shows
without reading the whole file, and the folder is in the repository's tree: a commit can carry a file
there (``.gitignore`` does not stop a tracked file), and so can anyone who can write the checkout. A
forged job index made an edit change another job's lines and report success (an audit, issue 20). So
each cache is written with a keyed BLAKE2b MAC (RFC 7693's keyed mode, a MAC by design) under a
random per-user key kept outside the checkout (``$XDG_CONFIG_HOME/spotctl/cache.key``, mode 0600);
a file that does not carry this key's MAC is not a cache of ours and is ignored (the whole stack file
is read). Reading is bounded: a regular file only (a FIFO or a link to a device never blocks or
floods a command), at most ``limit`` bytes. Without a usable key (no writable home) nothing is cached.
"""

from __future__ import annotations

import contextlib
import os
import stat
from pathlib import Path

KEY_BYTES = 32
_KEY: list[bytes | None] = []


def key_path() -> Path:
    """Where this user's cache key lives (outside any checkout)."""
    base = os.environ.get("XDG_CONFIG_HOME") or os.path.join(os.path.expanduser("~"), ".config")
    return Path(base) / "spotctl" / "cache.key"


def _read_key(path: Path) -> bytes | None:
    """The key in ``path`` when it is this user's own regular file, private (0600) and whole."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    except OSError:
        return None
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode) or info.st_uid != os.getuid() or info.st_mode & 0o077:
            return None
        data = os.read(fd, KEY_BYTES + 1)
    finally:
        os.close(fd)
    return data if len(data) == KEY_BYTES else None


def key() -> bytes | None:
    """This user's cache key, made on first use (published whole with a hard link, so two spotctl
    processes making it at once agree on one), or None when there is no usable one."""
    if _KEY:
        return _KEY[0]
    path = key_path()
    found = _read_key(path)
    if found is None and not path.exists():
        import secrets
        import tempfile

        tmp = None
        with contextlib.suppress(OSError):
            path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
            fd, tmp = tempfile.mkstemp(prefix=".cache.key.", dir=path.parent)  # (mode 0600)
            with os.fdopen(fd, "wb") as fh:
                fh.write(secrets.token_bytes(KEY_BYTES))
                fh.flush()
                os.fsync(fh.fileno())
            with contextlib.suppress(FileExistsError):
                os.link(tmp, path)  # whole or not at all; a concurrent maker's key wins as well
        if tmp is not None:
            with contextlib.suppress(OSError):
                os.unlink(tmp)
        found = _read_key(path)
    _KEY[:] = [found]
    return found


def _mac(secret: bytes, data: bytes) -> bytes:
    from _blake2 import blake2b  # (built in: no OpenSSL load for a short command)

    return blake2b(data, key=secret, digest_size=32, person=b"spotctl-cache").hexdigest().encode()


def write(target: Path, data: bytes) -> None:
    """Write a sealed cache file whole or not at all, never failing (no key: nothing is written)."""
    import tempfile

    secret = key()
    if secret is None:
        return
    tmp = None
    try:
        target.parent.mkdir(exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=f".{target.name}.", suffix=".tmp", dir=target.parent)
        with os.fdopen(fd, "wb") as fh:
            fh.write(_mac(secret, data) + b"\n" + data)
        os.replace(tmp, target)  # no fsync: a torn cache fails its MAC, and then the whole file is read
        tmp = None
    except OSError:
        pass
    finally:
        if tmp is not None:
            with contextlib.suppress(OSError):
                os.unlink(tmp)


def read(target: Path, limit: int) -> bytes | None:
    """The data of a cache file this user's spotctl sealed, or None (missing, not a regular file,
    over ``limit`` bytes, or not carrying this key's MAC)."""
    from _operator import _compare_digest  # (hmac.compare_digest without hmac's hashlib import)

    secret = key()
    if secret is None:
        return None
    try:
        fd = os.open(target, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    except OSError:
        return None
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode) or info.st_size > limit:
            return None
        with os.fdopen(os.dup(fd), "rb") as fh:
            raw = fh.read(limit + 1)
    except OSError:
        return None
    finally:
        os.close(fd)
    mac, _, data = raw.partition(b"\n")
    return data if len(raw) <= limit and _compare_digest(mac, _mac(secret, data)) else None
