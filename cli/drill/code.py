"""A drill's code, as a job's travels: packed the way ``resume`` packs it (cli/code), put in the
emulator's bucket where the VM's scripts fetch it with the job's identity, unpacked by them on the
drill's disk (``<disk>/code/<sha256>/``), never run in the caller's directory. And which files of a
run are its outputs, for ``--verify``."""

from __future__ import annotations

import hashlib
import time
from collections.abc import Iterable
from dataclasses import dataclass, replace
from pathlib import Path

from cli.code.archive import MTIME
from infra.naming import code_key
from infra.render import ScriptContext

CODE_DIR = "code"  # on the job disk: code/<sha256 or commit>/ (the VM side's layout)
SETUP_MARKERS = ".spotctl/setup-*.done"


@dataclass(frozen=True)
class DrillCode:
    """What the drill's VM is told of its code: an archive (and its sha256) or a repository at a commit."""

    archive: bytes = b""
    sha256: str = ""
    git_url: str = ""
    git_commit: str = ""
    setup: str = ""
    workdir: str = ""
    container: str = ""

    @property
    def key(self) -> str:
        return self.sha256 or self.git_commit


def staged(ctx: ScriptContext, code: DrillCode | None, put) -> ScriptContext:
    """``ctx`` told of ``code``, its archive put (``put(bucket, key, data)``) in the drill's bucket
    under the job's code prefix; the command then runs in the code's workdir on the drill's disk."""
    if code is None:
        return ctx
    fields = {"setup": code.setup, "workdir": code.workdir, "container": code.container, "cwd": ""}
    if code.sha256:
        key = code_key(ctx.stack, ctx.name, code.sha256)
        put(ctx.event_bucket, key, code.archive)
        scheme = "gs" if ctx.cloud == "gcp" else "s3"
        fields |= {"code_uri": f"{scheme}://{ctx.event_bucket}/{key}", "code_sha256": code.sha256}
    else:
        fields |= {"code_git_url": code.git_url, "code_git_commit": code.git_commit}
    return replace(ctx, **fields)


def written_ago(paths: Iterable[Path], now: float | None = None) -> float | None:
    """Seconds since the newest of ``paths`` was written, by its time on the disk (None: none is
    there): what the VM did then, not when the drill's loop next looked."""
    marks = [p.stat().st_mtime for p in paths if p.exists()]
    if not marks:
        return None
    return max(0.0, (time.time() if now is None else now) - max(marks))


def setup_ended_ago(disk: Path, now: float | None = None) -> float | None:
    """Seconds since the VM wrote its setup's marker (None: no marker yet)."""
    return written_ago(disk.glob(SETUP_MARKERS), now)


def command_began_ago(disk: Path, state: Path, now: float | None = None) -> float | None:
    """Seconds since the run unit started the command (its ``trainer.pid``; None: not yet). Setup's
    own ``trainer.pid``, older than setup's marker, is not the command's."""
    began, setup = written_ago([state / "trainer.pid"], now), setup_ended_ago(disk, now)
    return None if began is None or (setup is not None and began > setup) else began


def workdir_on(disk: Path, code: DrillCode) -> Path:
    return disk / CODE_DIR / code.key / (code.workdir or ".")


def outputs(disk: Path, code: DrillCode | None) -> dict[str, str]:
    """sha256 of every file the command wrote: without code, anything on the disk but checkpoints and
    spotctl's own files; with code, what appeared under the workdir after the code was unpacked and
    set up (not the code's own files, which keep the archive's time, nor what setup made, which is
    older than setup's marker, nor Python's byte-code caches)."""
    if code is None:
        return {str(p.relative_to(disk)): _sha(p) for p in sorted(disk.rglob("*"))
                if p.is_file() and p.relative_to(disk).parts[0] not in (".spotctl", "checkpoints")}
    root = workdir_on(disk, code)
    markers = [p.stat().st_mtime_ns for p in disk.glob(SETUP_MARKERS)]
    since = max(markers, default=0)
    out = {}
    for path in sorted(root.rglob("*")) if root.is_dir() else []:
        if not path.is_file() or path.is_symlink() or "__pycache__" in path.relative_to(root).parts:
            continue
        mtime = path.stat().st_mtime_ns
        if mtime // 1_000_000_000 != MTIME and mtime >= since:
            out[str(path.relative_to(root))] = _sha(path)
    return out


def _sha(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()
