"""spotctl's caches and records beside a stack file (``stacks/.spotctl/``: the job index, status's
per-job cache, an edit's proposal, a cleanup's record, the sync record; the watcher's journal and
holder), sealed with a key only this user's spotctl knows.

Why: a cache there decides which lines of the stack file an edit touches and what ``status`` shows
without reading the whole file, and the folder is in the repository's tree: a commit can carry a file
there (``.gitignore`` does not stop a tracked file), and so can anyone who can write the checkout. A
forged job index made an edit change another job's lines and report success (found by an audit). So
each cache is written with a keyed BLAKE2b MAC (RFC 7693's keyed mode, a MAC by design) under a
random per-user key kept outside the checkout (``$XDG_CONFIG_HOME/spotctl/cache.key``, mode 0600);
a file that does not carry this key's MAC is not a cache of ours and is ignored (the whole stack file
is read). Reading is bounded: a regular file only (a FIFO or a link to a device never blocks or
floods a command), at most ``limit`` bytes. Without a usable key (no writable home) nothing is cached.
"""

from __future__ import annotations

import contextlib
import json
import os
from pathlib import Path
from typing import Any

KEY_BYTES = 32
_KEY: list[bytes | None] = []


def key_path() -> Path:
    """Where this user's cache key lives (outside any checkout)."""
    base = os.environ.get("XDG_CONFIG_HOME") or os.path.join(os.path.expanduser("~"), ".config")
    return Path(base) / "spotctl" / "cache.key"


def _read_key(path: Path) -> bytes | None:
    """The key in ``path`` when it is this user's own regular file, private (0600) and whole."""
    found = _bounded(path, KEY_BYTES)
    if found is None:
        return None
    data, info = found
    return data if len(data) == KEY_BYTES and info.st_uid == os.getuid() and not info.st_mode & 0o077 else None


def key() -> bytes | None:
    """This user's cache key, made on first use (published whole with a hard link, so two spotctl
    processes making it at once agree on one), or None when there is no usable one."""
    if _KEY:
        return _KEY[0]
    path = key_path()
    found = _read_key(path)
    if found is None and not os.path.lexists(path):  # (lexists: False too for a folder this user may not search)
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
    if found is None:  # read again: made above, or by a concurrent spotctl since the first read (a race a fresh
        found = _read_key(path)  # suite's five workers hit: the key appeared between the read and the check)
    if found is None:
        import sys

        print(f"spotctl: {path}: no usable key (it must be this user's own file, 0600, of {KEY_BYTES} bytes, in a "
              "folder spotctl may write): its caches are off, and an edit or cleanup interrupted midway is not "
              "recovered automatically", file=sys.stderr)
    _KEY[:] = [found]
    return found


def _mac(secret: bytes, data: bytes, person: bytes = b"spotctl-cache") -> bytes:
    from _blake2 import blake2b  # (built in: no OpenSSL load for a short command)

    return blake2b(data, key=secret, digest_size=32, person=person).hexdigest().encode()


def _record_mac(secret: bytes, target: Path, body: str) -> bytes:
    """A record's MAC, bound to its file's name (a record of one stack file copied beside another is not
    that file's) and apart from the caches' (another ``person``)."""
    return _mac(secret, target.name.encode() + b"\0" + body.encode(), person=b"spotctl-record")


def write(target: Path, data: bytes) -> None:
    """Write a sealed cache file whole or not at all, never failing (no key: nothing is written)."""
    import tempfile

    secret = key()
    if secret is None or os.path.islink(target.parent):  # (a linked folder: never written through)
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


def _bounded(target: Path, limit: int, follow: bool = False) -> tuple[bytes, os.stat_result] | None:
    """(the bytes, the stat) of ``target`` when it is a regular file (``open_regular``) of at most
    ``limit`` bytes, else None."""
    from cli.lifecycle.stackfile.writing import open_regular

    opened = open_regular(target, follow)
    if opened is None:
        return None
    fd, info = opened
    try:
        with os.fdopen(fd, "rb") as fh:
            raw = fh.read(limit + 1) if info.st_size <= limit else None
    except OSError:
        return None
    return (raw, info) if raw is not None and len(raw) <= limit else None


def read(target: Path, limit: int) -> bytes | None:
    """The data of a cache file this user's spotctl sealed, or None (missing, not a regular file,
    over ``limit`` bytes, or not carrying this key's MAC)."""
    from _operator import _compare_digest  # (hmac.compare_digest without hmac's hashlib import)

    secret = key()
    found = _bounded(target, limit) if secret is not None else None
    if found is None:
        return None
    mac, _, data = found[0].partition(b"\n")
    return data if _compare_digest(mac, _mac(secret, data)) else None


def seal_record(record: dict[str, Any], target: Path) -> str:
    """A record spotctl acts on later (an edit's proposal, undone if its process died), to be written to
    ``target``, as JSON sealed with this user's key when there is one (``open_record`` refuses it otherwise)."""
    body = json.dumps(record, default=str, sort_keys=True)
    secret = key()
    sealed = {} if secret is None else {"sealed": _record_mac(secret, target, body).decode()}
    return json.dumps({**sealed, "record": json.loads(body)}, sort_keys=True)


def open_record(target: Path, limit: int = 1 << 20, unsealed_without_key: bool = False) -> dict[str, Any] | None:
    """The record in ``target`` when this user's spotctl sealed it, else None (missing, damaged, not a
    regular file, or written by anyone else: a commit can carry such a file into the checkout). Without
    a key (no writable home) no record is taken from disk: a file a ``git pull`` wrote is this user's
    own, so nothing but the key tells spotctl's records from a commit's; except, with
    ``unsealed_without_key``, a record whose forgery costs no more than a delay (the watcher's own
    memory: its journal, its holder file), which a keyless watcher could not keep otherwise (stderr
    has said the key is missing)."""
    from _operator import _compare_digest

    secret = key()
    found = _bounded(target, limit) if secret is not None or unsealed_without_key else None
    if found is None:
        return None
    raw, _ = found
    try:
        outer = json.loads(raw)
        if secret is None:  # (unsealed_without_key: as this version writes it, with a key or without, or as earlier ones did)
            plain = outer.get("record", outer)
            return plain if isinstance(plain, dict) else None
        record = outer["record"]
        body = json.dumps(record, sort_keys=True)
    except (ValueError, KeyError, TypeError, AttributeError, RecursionError):
        return None
    mac = outer.get("sealed") if isinstance(record, dict) else None
    return record if isinstance(mac, str) and _compare_digest(mac.encode(), _record_mac(secret, target, body)) else None


def read_bounded(target: Path, limit: int = 1 << 26, follow: bool = False) -> bytes | None:
    """The bytes of ``target`` when it is a regular file of at most ``limit`` bytes (never a FIFO, a
    device or, unless ``follow``, a link: a committed link to /dev/zero read for ever), else None."""
    found = _bounded(target, limit, follow)
    return None if found is None else found[0]


def save_record(target: Path, record: dict[str, Any]) -> None:
    """Write ``record`` sealed for ``target`` to it, atomically and durably (``stackfile.atomic_write``)."""
    from cli.lifecycle.stackfile.writing import atomic_write

    atomic_write(target, seal_record(record, target) + "\n")


_SAID: list[Path] = []


def say_once(where: Path, what: str) -> None:
    """Tell the user, once per process, what is wrong with a file of spotctl's (``where``)."""
    if where in _SAID:
        return
    _SAID.append(where)
    import sys

    print(f"spotctl: {where}: {what}", file=sys.stderr)
