"""Writing a file atomically and durably (temp file, fsync, rename, folder fsync), keeping the old
file's line ends and byte-order mark, and never over a save made since it was read."""

from __future__ import annotations

import contextlib
import os
import stat
import time
from pathlib import Path

from cli.lifecycle.stackfile.reading import _LAST_WRITTEN, BOM, _file_state
from infra.basics import ConfigError


def refuse_linked_folder(target: Path) -> None:
    """Refuse to write a record into a ``.spotctl`` folder that is a symbolic link (a commit can carry
    one pointing anywhere the user may write).

    Raises:
        ConfigError: naming the folder.
    """
    folder = Path(os.path.abspath(target)).parent
    if folder.name == ".spotctl" and os.path.islink(folder):
        raise ConfigError(str(folder), ["a symbolic link: spotctl writes its records only into a real folder "
                                        "(remove the link; spotctl makes the folder)"])


CHANGED_MEANWHILE = "the file changed while this command edited it (saved from an editor?): nothing was written; run the command again"


def write_stack(path: Path, text: str, expect: str | None = None) -> str | None:
    """Write the stack file atomically; a symlinked stack file is written where it points.

    ``expect``: the file's state when the text this replaces was read (``_read_state``). When the file
    no longer has it right before the rename (an editor saved it meanwhile), nothing is written.

    Returns:
        The new file's state (``_file_state``), or None when the file system dropped spotctl's stamp.

    Raises:
        ConfigError: the file changed since it was read (``expect``).
    """
    try:
        return atomic_write(path, text, follow=True, expect=expect)
    except _Changed:
        raise ConfigError(str(path), [CHANGED_MEANWHILE]) from None


def _line_ends(path: Path) -> tuple[bool, bool, bool]:
    """(whether the file starts with a byte-order mark, has a CRLF line end, has an LF one without a
    CR), read in fixed chunks: a 2 MB stack file is not copied into memory once more for three facts."""
    chunk, bom, crlf, lf, previous = bytearray(1 << 16), False, False, False, b""
    opened = open_regular(path)  # (a link or a device is no old file)
    if opened is None:
        return bom, crlf, lf
    with open(opened[0], "rb", buffering=0) as fh:
        first = True
        while not (crlf and lf) and (size := fh.readinto(chunk)):
            view = bytes(chunk[:size]) if size < len(chunk) else chunk
            if first:
                bom, first = view.startswith(BOM.encode()), False
            pairs = view.count(b"\r\n") + (previous == b"\r" and view[:1] == b"\n")
            crlf = crlf or pairs > 0
            lf = lf or view.count(b"\n") > pairs
            previous = view[-1:]
    return bom, crlf, lf


def open_regular(target: Path, follow: bool = False) -> tuple[int, os.stat_result] | None:
    """(an open descriptor, its stat) of ``target`` when it is a regular file, not followed through a link
    (unless ``follow``), else None: a FIFO never blocks, a device or a committed link is no file of spotctl's."""
    try:
        fd = os.open(target, os.O_RDONLY | os.O_NONBLOCK | (0 if follow else os.O_NOFOLLOW))
    except OSError:
        return None
    info = os.fstat(fd)
    if not stat.S_ISREG(info.st_mode):
        os.close(fd)
        return None
    return fd, info


def _keep_line_ends(old: bytes, text: str) -> str:
    """``text`` (LF line ends) with each line's end as in the old file of mixed CRLF and LF ends: a line
    kept or changed in place keeps its own end, a new line takes the end of the line before it, so an
    edit does not rewrite the ends of lines it did not touch."""
    before = old.decode("utf-8", "replace").removeprefix(BOM).split("\n")
    crs, bare = [line.endswith("\r") for line in before], [line.removesuffix("\r") for line in before]
    lines = text.split("\n")
    ends, last = [], crs[0] if len(crs) > 1 else False
    for i in _kept_lines(bare[:-1], lines[:-1]):  # (the pieces after the last line end have none)
        last = crs[i] if i is not None else last
        ends.append(last)
    return "".join(line + ("\r\n" if cr else "\n") for line, cr in zip(lines, ends, strict=False)) + lines[-1]


def _kept_lines(old: list[str], new: list[str]) -> list[int | None]:
    """For each line of ``new``, the line of ``old`` it is (None: a new one), as a patience diff pairs
    them: the common lines at both ends of a stretch, then the lines found once in each side of it as
    anchors in order (their longest increasing run), the stretches between anchors alike; a stretch
    with no anchor pairs its lines by position (a line changed in place). Stack files repeat lines
    thousands of times (``state: running``): a general diff over them grows with the cube of the
    stretch, this with its size (an audit timed minutes for an edit of every tenth job of 2,000)."""
    from collections import Counter

    out: list[int | None] = [None] * len(new)
    todo = [(0, len(old), 0, len(new))]
    while todo:
        a0, a1, b0, b1 = todo.pop()
        while a0 < a1 and b0 < b1 and old[a0] == new[b0]:
            out[b0], a0, b0 = a0, a0 + 1, b0 + 1
        while a0 < a1 and b0 < b1 and old[a1 - 1] == new[b1 - 1]:
            a1, b1 = a1 - 1, b1 - 1
            out[b1] = a1
        if a0 == a1 or b0 == b1:
            continue
        seen_a, seen_b = Counter(old[a0:a1]), Counter(new[b0:b1])
        at = {line: i for i, line in enumerate(old[a0:a1], a0) if seen_a[line] == 1}
        anchors = [(at[line], j) for j, line in enumerate(new[b0:b1], b0) if seen_b[line] == 1 and line in at]
        run = _increasing(anchors)
        if not run:
            for k in range(min(a1 - a0, b1 - b0)):
                out[b0 + k] = a0 + k
            continue
        for i, j in run:
            out[j] = i
            todo.append((a0, i, b0, j))
            a0, b0 = i + 1, j + 1
        todo.append((a0, a1, b0, b1))
    return out


def _increasing(pairs: list[tuple[int, int]]) -> list[tuple[int, int]]:
    """The longest run of ``pairs`` (in order) whose first items increase (patience sorting)."""
    import bisect

    tops: list[int] = []  # the smallest last first item of a run of each length
    ends: list[int] = []  # its index in pairs
    back = [-1] * len(pairs)
    for k, (i, _) in enumerate(pairs):
        n = bisect.bisect_left(tops, i)
        back[k] = ends[n - 1] if n else -1
        if n == len(tops):
            tops.append(i)
            ends.append(k)
        else:
            tops[n], ends[n] = i, k
    run, k = [], ends[-1] if ends else -1
    while k >= 0:
        run.append(pairs[k])
        k = back[k]
    return run[::-1]


def atomic_write(path: Path, text: str, follow: bool = False, expect: str | None = None) -> str | None:
    """Write ``text`` to ``path`` so readers only ever see the old or the new content.

    ``follow``: a symlinked file is written where it points (the link stays a link): for the stack
    file only (``write_stack``). spotctl's own records are never written through a link: a link is
    replaced by the file, and a ``.spotctl`` folder that is a link is refused (a commit can carry a
    link there to any file of the user's: an audit made one overwrite the cache key). The old file's
    line ends (CRLF; in a file of both, each line's) and byte-order mark are kept, since ``_read_text``
    hands out LF text without one.

    ``expect``: the state (``_file_state``) the file must still have right before the rename.

    Returns:
        With ``follow``, the new file's state while it has spotctl's stamp (else None).

    Raises:
        ConfigError: the record's folder is a symbolic link.
        _Changed: the file no longer has the state ``expect`` (nothing written).
    """
    if follow:
        target = Path(os.path.realpath(path))
    else:
        target = Path(os.path.abspath(path))
        refuse_linked_folder(target)
    bom, crlf, lf = _line_ends(target)
    if crlf and lf:
        text = _keep_line_ends(target.read_bytes(), text.replace("\r\n", "\n"))
    elif crlf:
        text = text.replace("\r\n", "\n").replace("\n", "\r\n")
    if bom:
        text = BOM + text
    data = text.encode("utf-8")  # (one C encode, not a text layer's chunks)
    import tempfile

    mode = target.stat().st_mode & 0o777 if target.exists() and not target.is_symlink() else 0o644
    fd, tmp = tempfile.mkstemp(prefix=f".{target.name}.", suffix=".tmp", dir=target.parent)
    stamp = time.time_ns()  # the stack file's mtime to the nanosecond: see the job index's comment
    try:
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)
            fh.flush()
            if follow:
                os.utime(fh.fileno(), ns=(stamp, stamp))
            os.fsync(fh.fileno())
        os.chmod(tmp, mode)
        if expect is not None:
            _still(target, expect)
        os.replace(tmp, target)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise
    _sync_folder(target)
    if not follow:
        return None
    state = _stamped_state(target, stamp, len(data)) or None
    _LAST_WRITTEN[:] = [(text, data, state)]
    return state


def _still(target: Path, state: str) -> None:
    """The last check before a rename over ``target``: a save made meanwhile (in place, over it, or a
    removal) is kept, since the file no longer has ``state``.

    Raises:
        _Changed: it has not (nothing may be written).
    """
    try:
        if _file_state(os.stat(target)) == state:
            return
    except FileNotFoundError:
        pass
    raise _Changed


def _sync_folder(target: Path) -> None:
    """Make a rename into ``target``'s folder durable."""
    dir_fd = os.open(target.parent, os.O_RDONLY)
    try:
        os.fsync(dir_fd)
    finally:
        os.close(dir_fd)


def _stamped_state(target: Path, stamp: int, size: int) -> str:
    """The file's state while it still has spotctl's ``stamp`` and ``size``, else "" (another wrote
    since, or the file system dropped the stamp's nanoseconds)."""
    st = os.stat(target)
    return _file_state(st) if (st.st_mtime_ns, st.st_size) == (stamp, size) else ""


def _write_all(fd: int, data: bytes) -> None:
    """Write all of ``data``: a short write (a full disk) is continued, and a refused one raises."""
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view):]


class _Changed(Exception):
    """The stack file changed since its pieces were read."""


def _copy(src: int, dst: int, offset: int, count: int) -> None:
    """Append ``count`` bytes of ``src`` from ``offset`` to ``dst``: in the kernel where the file system
    can (copy_file_range), else through a small buffer."""
    kernel = hasattr(os, "copy_file_range")  # (Linux only)
    while count > 0:
        done = 0
        if kernel:
            try:
                done = os.copy_file_range(src, dst, count, offset)
            except OSError:  # (EXDEV, EINVAL, ENOSYS on some file systems)
                kernel = False
        if not kernel:
            chunk = os.pread(src, min(count, 1 << 20), offset)
            _write_all(dst, chunk)
            done = len(chunk)
        if done <= 0:
            raise _Changed  # the file ended early: it changed
        offset, count = offset + done, count - done
