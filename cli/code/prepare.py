"""One job's code made ready for its next attempt: a directory packed and uploaded once under the
job's own prefix of the stack's bucket (named by its sha256), or a git ref pinned to a commit. What
it returns is what the job entry records (``codeDigest`` / ``codeCommit``) and the VM is told."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from cli.code import CodeError
from cli.code.archive import MAX_CODE_BYTES, Archive, pack
from cli.code.files import code_files
from cli.code.gitref import COMMIT, resolve
from infra.naming import code_key

ARCHIVE_TYPE = "application/gzip"


class Store(Protocol):
    """The part of ``cli.cloud.Cloud`` the upload uses (tests: moto / the GCS fake behind a real Cloud)."""

    def object_generation(self, bucket: str, key: str) -> str | None: ...

    def write_object(self, bucket: str, key: str, data: bytes, expected: str | None, content_type: str = ...) -> str: ...


@dataclass(frozen=True)
class StackContext:
    """What preparing a job's code needs of its stack: its name, the project root ``code.dir`` is
    relative to, and where the archive goes."""

    stack: str
    root: Path
    bucket: str | None = None
    store: Store | None = None
    limit: int = MAX_CODE_BYTES
    locate: Callable[[], str | None] | None = None  # asked for the bucket only when an upload is needed


@dataclass(frozen=True)
class CodeRef:
    """A job's code as its next attempt runs it."""

    job: str
    digest: str = ""  # code: {dir: ...}: the archive's sha256
    commit: str = ""  # code: {git: ...}: the commit the ref named at launch
    key: str = ""  # the archive's object in the bucket
    uploaded: bool = False  # False: it was there already (or not asked to upload)
    files: int = 0
    size: int = 0

    def fields(self) -> dict[str, str]:
        """What the job entry records (camelCase keys, as in the stack file)."""
        return {"codeDigest": self.digest} if self.digest else {"codeCommit": self.commit}

    def changes(self, job: Any) -> bool:
        """Whether the job entry records other code than this."""
        return (job.code_digest or "") != self.digest or (job.code_commit or "") != self.commit


def code_dir(job: Any, root: Path) -> Path:
    """The directory ``code.dir`` names: relative to the project root, or absolute; ``~`` expanded."""
    return (root / Path(job.code.dir).expanduser()).resolve()


def pack_directory(directory: Path, what: str, limit: int = MAX_CODE_BYTES) -> Archive:
    """``directory``'s code archive (``what`` starts every error: the job and key, or the option).

    Raises:
        CodeError: no such directory, nothing to pack, over the size limit, an unreadable file.
    """
    if not directory.is_dir():
        raise CodeError(f"{what}: {directory} {'is not a directory' if directory.exists() else 'does not exist'}")
    found = code_files(directory)
    if not found.files:
        raise CodeError(f"{what}: {directory} holds no files to pack ({found.how})")
    return pack(directory, found.files, limit=limit, what=what)


def pack_dir(job: Any, ctx: StackContext) -> Archive:
    """The archive of the job's ``code.dir``; errors name the job and key."""
    directory = code_dir(job, ctx.root)
    what = f"job {job.id}: code ({job.code.dir})"
    if why := outside_root(job, ctx.root):
        raise CodeError(why)
    if not directory.is_dir():
        where = "is not a directory" if directory.exists() else "does not exist"
        raise CodeError(f"{what}: {directory} {where} (a relative dir is relative to the project root {ctx.root})")
    return pack_directory(directory, what, ctx.limit)


def prepare_code(job: Any, ctx: StackContext, *, upload: bool = True, repin: bool = False) -> CodeRef | None:
    """The job's code for its next attempt (None: the job has no ``code:``). A directory is packed and,
    with ``upload``, its archive written once to the stack's bucket (not when the job records this
    digest already, nor when the object is there); a git ref is resolved to its commit (``git ls-remote``)
    once: the commit the entry records runs at every attempt, unless ``repin`` (the user asks for the
    ref's commit now) or ``ref`` is itself another full commit.

    Raises:
        CodeError: one message naming the job and key (no directory, over the limit, no such ref, no
            bucket to upload to, the upload failed).
    """
    if job.code is None:
        return None
    if job.code.git is not None:
        what = f"job {job.id}: code.ref"
        if job.code_commit and not repin and not (COMMIT.fullmatch(job.code.git_ref) and job.code.git_ref != job.code_commit):
            return CodeRef(job.id, commit=job.code_commit)
        return CodeRef(job.id, commit=resolve(job.code.git, job.code.git_ref, what))
    archive = pack_dir(job, ctx)
    key = code_key(ctx.stack, job.id, archive.sha256)
    ref = CodeRef(job.id, digest=archive.sha256, key=key, files=archive.files, size=archive.size)
    if not upload or archive.sha256 == job.code_digest:
        return ref  # a recorded digest was uploaded before it was recorded: the object is there
    bucket = ctx.bucket or (ctx.locate() if ctx.locate is not None else None)
    if not bucket or ctx.store is None:
        raise CodeError(f"job {job.id}: code: its archive goes to the stack's event bucket, "
                        "and none is known here")
    return upload_archive(ref, archive.data, bucket, ctx.store)


def upload_archive(ref: CodeRef, data: bytes, bucket: str, store: Store) -> CodeRef:
    """Write the archive unless its object is there already (its name is its digest: same name, same bytes)."""
    from dataclasses import replace

    from cli.cloud import CloudError, PreconditionFailed

    try:
        if store.object_generation(bucket, ref.key) is not None:
            return ref
        store.write_object(bucket, ref.key, data, None, ARCHIVE_TYPE)
    except PreconditionFailed:
        return ref  # written meanwhile by another launch: the same bytes
    except CloudError as exc:
        raise CodeError(f"job {ref.job}: its code archive could not be uploaded to bucket {bucket} ({ref.key}): {exc}") from None
    return replace(ref, uploaded=True)


def outside_root(job: Any, root: Path) -> str:
    """Why the job's ``code.dir`` cannot be shared ("" when it can): a directory outside the project root
    is a path of one machine, and the stack file is read on every machine that resumes the job."""
    if job.code is None or job.code.dir is None:
        return ""
    directory = code_dir(job, root)
    try:
        directory.relative_to(root.resolve())
    except ValueError:
        return (f"job {job.id}'s code {job.code.dir} is outside the project root {root} (the directory holding "
                "Pulumi.yaml): another machine resuming the job would not find it. Move the code under it "
                "(code: ./PATH), or give code: {git: URL, ref: REF}")
    return ""


def dir_problems(cfg: Any, root: Path) -> list[str]:
    """``validate``'s errors for code directories no other machine could read (outside the project root)."""
    return [f"spotctl:jobs[{i}].code: {why}" for i, job in enumerate(cfg.jobs) if (why := outside_root(job, root))]


def dir_warnings(cfg: Any, root: Path) -> list[str]:
    """``validate``'s warnings for code directories that are not there (a warning: the file may be checked
    on a machine without the code, e.g. the watcher's, which never packs)."""
    out = []
    for i, job in enumerate(cfg.jobs):
        if job.code is not None and job.code.dir is not None and not code_dir(job, root).is_dir():
            out.append(f"spotctl:jobs[{i}].code: job {job.id}'s directory {code_dir(job, root)} is not there (relative to "
                       f"the project root {root}): launch, resume and failover refuse to pack it")
    return out
