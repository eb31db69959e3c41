"""The job's code on the job disk: an archive fetched with the job's own identity and checked against
its digest, or a git clone at a commit; unpacked once per digest (to a temp dir, then renamed), and
the job's ``setup`` run once per disk and code."""

from __future__ import annotations

import base64
import hashlib
import os
import shutil
import subprocess
import tarfile
import time
from typing import Optional

from agent import schema
from agent.config import Config
from agent.storage import Cloud
from agent.util import log


class CodeError(Exception):
    """The code cannot be put on the disk: the attempt ends `failed` with this reason."""


def code_dir(cfg: Config) -> str:
    return cfg.disk(os.path.join(schema.CODE_DIR, cfg.code_key()))


def workdir(cfg: Config) -> str:
    """Where the command runs: ``workdir`` inside the code; without code, ``cwd`` or the job disk."""
    if not cfg.has_code():
        return cfg.cwd or cfg.mount_point
    base = code_dir(cfg)
    path = os.path.normpath(os.path.join(base, cfg.workdir or "."))
    if path != base and not path.startswith(base + os.sep):
        raise CodeError(f"job {cfg.name}: code workdir {cfg.workdir!r} leaves the code directory")
    return path


def _safe_members(tar: tarfile.TarFile, dest: str) -> list[tarfile.TarInfo]:
    """Every member lands inside ``dest``: no absolute names, no ``..``, links only within it, no devices."""
    out = []
    for member in tar.getmembers():
        target = os.path.normpath(os.path.join(dest, member.name))
        if os.path.isabs(member.name) or not (target == dest or target.startswith(dest + os.sep)):
            raise CodeError(f"archive member {member.name!r} leaves the code directory")
        if member.issym() or member.islnk():
            link = member.linkname if member.islnk() else os.path.join(os.path.dirname(member.name), member.linkname)
            resolved = os.path.normpath(os.path.join(dest, link))
            if os.path.isabs(member.linkname) or not resolved.startswith(dest + os.sep):
                raise CodeError(f"archive link {member.name!r} points outside the code directory")
        elif not (member.isfile() or member.isdir()):
            continue
        member.mode &= 0o755 | 0o022
        out.append(member)
    return out


def unpack(cfg: Config, data: bytes) -> str:
    """Unpack a verified archive to ``code/<sha256>/`` atomically; an existing one is kept."""
    final = code_dir(cfg)
    if os.path.isdir(final):
        return final
    parent = os.path.dirname(final)
    os.makedirs(parent, exist_ok=True)
    tmp = os.path.join(parent, ".tmp-%s-%d" % (cfg.code_sha256[:12], os.getpid()))
    shutil.rmtree(tmp, ignore_errors=True)
    os.makedirs(tmp)
    archive = tmp + ".tar.gz"
    with open(archive, "wb") as fh:
        fh.write(data)
    try:
        with tarfile.open(archive, "r:gz") as tar:
            tar.extractall(tmp, members=_safe_members(tar, os.path.realpath(tmp)))
    except (tarfile.TarError, OSError, EOFError) as e:
        shutil.rmtree(tmp, ignore_errors=True)
        raise CodeError(f"job {cfg.name}: code archive cannot be unpacked: {e}") from e
    finally:
        if os.path.exists(archive):
            os.remove(archive)
    durable_rename(tmp, final)
    return final


def durable_rename(tmp: str, final: str) -> None:
    """``tmp`` becomes ``final`` on the disk, its files' contents first: ext4 allocates a new file's
    blocks up to 30 s after the write (delayed allocation), and a reset in between left the files the
    agent had just written empty under their final name (the units and fstab line, found by tests/boot/);
    code found in place is never fetched again."""
    os.sync()
    os.rename(tmp, final)
    os.sync()


def fetch_archive(cfg: Config, cloud: Cloud, wait_s: float = 120) -> str:
    """Download ``code_uri`` with the job's identity (retried for ``wait_s``: a grant made in the same
    update can take that long to apply), check its sha256 and unpack it."""
    final = code_dir(cfg)
    if os.path.isdir(final):
        return final
    deadline = time.monotonic() + wait_s
    while True:
        answer = cloud.get(cfg.code_uri, min(60.0, max(1.0, deadline - time.monotonic())))
        if answer is not None and answer.ok:
            break
        if time.monotonic() >= deadline:
            status = "no answer" if answer is None else "HTTP %d" % answer.status
            raise CodeError(f"job {cfg.name}: code {cfg.code_uri} could not be downloaded ({status})")
        time.sleep(2)
    digest = hashlib.sha256(answer.body).hexdigest()
    if digest != cfg.code_sha256:
        raise CodeError(f"job {cfg.name}: code {cfg.code_uri} has sha256 {digest}, not the recorded {cfg.code_sha256}: not running it")
    return unpack(cfg, answer.body)


def git_env(token: str) -> dict[str, str]:
    """The token as an HTTP header through git's environment config (git >= 2.31), never in argv."""
    if not token:
        return {}
    basic = base64.b64encode(("x-access-token:" + token).encode()).decode()
    return {"GIT_CONFIG_COUNT": "1", "GIT_CONFIG_KEY_0": "http.extraHeader",
            "GIT_CONFIG_VALUE_0": "Authorization: Basic " + basic, "GIT_TERMINAL_PROMPT": "0"}


def clone(cfg: Config, token: str, out) -> str:
    """Clone ``code_git_url`` at ``code_git_commit`` to ``code/<commit>/`` (temp dir, then renamed)."""
    final = code_dir(cfg)
    if os.path.isdir(final):
        return final
    tmp = "%s.tmp-%d" % (final, os.getpid())
    shutil.rmtree(tmp, ignore_errors=True)
    env = dict(os.environ)
    env.update(git_env(token))
    for args in (["git", "init", "-q", tmp],
                 ["git", "-C", tmp, "fetch", "-q", "--depth", "1", cfg.code_git_url, cfg.code_git_commit],
                 ["git", "-C", tmp, "-c", "advice.detachedHead=false", "checkout", "-q", "FETCH_HEAD"]):
        done = subprocess.run(args, stdout=out, stderr=subprocess.STDOUT, env=env, check=False)
        if done.returncode != 0:
            shutil.rmtree(tmp, ignore_errors=True)
            raise CodeError("job %s: code git %s at %s: `%s` failed (exit %d)"
                            % (cfg.name, cfg.code_git_url, cfg.code_git_commit, " ".join(args[:4]), done.returncode))
    durable_rename(tmp, final)
    return final


def setup_marker(cfg: Config) -> str:
    """Setup ran on this disk for this code and this setup command."""
    key = hashlib.sha256((f"{cfg.code_key()}\0{cfg.setup}\0{cfg.container}").encode()).hexdigest()[:32]
    return cfg.disk(f"{schema.DISK_DIR}/setup-{key}.done")


def tail(path: str, lines: int = 20, limit: int = 2000) -> str:
    try:
        with open(path, "rb") as fh:
            fh.seek(max(0, os.path.getsize(path) - 16384))
            data = fh.read().decode("utf-8", "replace")
    except OSError:
        return ""
    return "\n".join(data.rstrip("\n").split("\n")[-lines:])[-limit:]


def run_setup(cfg: Config, argv: list[str], env: dict[str, str], cwd: str, log_path: str,
              stopping, started) -> Optional[int]:
    """Run ``setup`` once per disk and code: None when done (now or before), else its exit code.
    Its output goes to the job's log."""
    marker = setup_marker(cfg)
    if not cfg.setup or os.path.exists(marker):
        return None
    log(cfg, "running the job's setup")
    with open(log_path, "ab") as out:
        out.write(b"spotctl: setup\n")
        out.flush()
        proc = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=env, cwd=cwd,
                                start_new_session=True)
        started(proc.pid)
        rc = proc.wait()
    if rc == 0 and not stopping():
        # What setup wrote reaches the disk before the marker says it ran, and the marker before the
        # command starts: a reset soon after must neither skip an unfinished setup nor run it twice.
        os.sync()
        with open(marker, "w") as fh:
            fh.write(cfg.code_key())
        os.sync()
        return None
    return rc
