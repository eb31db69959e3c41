"""A job's code keys (``code``, ``setup``, ``workdir``, ``container``) and what spotctl records of them
(``codeDigest``, ``codeCommit``): the models and rules, pure (docs/guides/code.md).

``code`` is one of: ``./PATH`` (a string), ``{dir: PATH}`` (a directory, relative to the project root:
the directory holding ``Pulumi.yaml`` at or above the stack file), or ``{git: URL, ref: REF,
tokenEnv: NAME}`` (a repository cloned on the VM; ``tokenEnv`` names a ``secure:`` env value).
"""

from __future__ import annotations

import re
import shlex
from typing import Annotated, Any, Self

from pydantic import BaseModel, ConfigDict, StringConstraints, model_validator
from pydantic.alias_generators import to_camel

SHA256_RE = re.compile(r"[0-9a-f]{64}")
COMMIT_RE = re.compile(r"[0-9a-f]{40}")
# https:// (credentials never in the URL: they would sit in the stack file and the VM's script) or
# ssh-free forms git clones anonymously; a token reaches the VM through the job's secret env.
GIT_URL_RE = re.compile(r"https://[A-Za-z0-9.-]+(?::[0-9]{1,5})?/[A-Za-z0-9._~/-]+|file:///[A-Za-z0-9._~/-]+")
GIT_REF_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9._/-]{0,199}")
# A relative path inside the unpacked code: plain segments, no "..", no leading "/".
WORKDIR_RE = re.compile(r"[A-Za-z0-9_.-]+(?:/[A-Za-z0-9_.-]+)*/?")
# A container image reference: [registry[:port]/]name[:tag][@sha256:digest], the docker grammar's alphabet
# (https://github.com/distribution/reference/blob/main/reference.go), one shell word.
IMAGE_RE = re.compile(r"[a-z0-9][a-z0-9._-]*(?::[0-9]{1,5})?(?:/[a-z0-9][a-z0-9._-]*)*(?::[A-Za-z0-9_][A-Za-z0-9_.-]{0,127})?"
                      r"(?:@sha256:[0-9a-f]{64})?")
CODE_SHAPES = "'./PATH', {dir: PATH} or {git: URL, ref: REF}"

Text = Annotated[str, StringConstraints(strict=True, min_length=1, max_length=1024, pattern=r"^[^\x00-\x1f]+$")]


class CodeSpec(BaseModel):
    """Where a job's code comes from: exactly one of ``dir`` and ``git``."""

    model_config = ConfigDict(extra="forbid", alias_generator=to_camel, populate_by_name=True, frozen=True)

    dir: Text | None = None
    git: Text | None = None
    ref: Text | None = None
    token_env: Text | None = None

    @model_validator(mode="before")
    @classmethod
    def _shape(cls, value: Any) -> Any:
        if isinstance(value, str):
            if re.match(r"[a-z+]+://|git@", value):
                raise ValueError(f"a string is a directory; a repository is written {{git: {value}, ref: REF}}")
            return {"dir": value}
        if value is None or not isinstance(value, dict):
            raise ValueError(f"expected {CODE_SHAPES}, got {_show(value)}")
        return value

    @model_validator(mode="after")
    def _one_source(self) -> Self:
        if (self.dir is None) == (self.git is None):
            raise ValueError(f"give exactly one of dir and git ({CODE_SHAPES})")
        if self.dir is not None:
            if self.ref is not None or self.token_env is not None:
                raise ValueError("ref and tokenEnv go with git, not dir")
            if "\\" in self.dir:
                raise ValueError(f"dir {self.dir!r}: write paths with '/'")
            return self
        if not GIT_URL_RE.fullmatch(self.git or ""):
            raise ValueError(f"git {self.git!r}: expected an https:// URL without credentials (a private repository's "
                             "token comes from tokenEnv, a secure: env value)")
        if self.ref is not None and (not GIT_REF_RE.fullmatch(self.ref) or ".." in self.ref):
            raise ValueError(f"ref {self.ref!r}: expected a git branch, tag or commit")
        if self.token_env is not None and not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", self.token_env):
            raise ValueError(f"tokenEnv {self.token_env!r}: expected the name of one of the job's env keys")
        return self

    @property
    def git_ref(self) -> str:
        return self.ref or "HEAD"


def _show(value: Any) -> str:
    return "a list" if isinstance(value, list) else repr(value)


def code_problems(job: Any) -> list[tuple[str, str]]:
    """(key, message) of a job's code keys taken together (``Job``'s own check; keys relative to the job)."""
    out: list[tuple[str, str]] = []
    code = job.code
    if code is None:
        for key, value in (("setup", job.setup), ("workdir", job.workdir), ("codeDigest", job.code_digest),
                           ("codeCommit", job.code_commit)):
            if value is not None:
                out.append((key, f"needs code: (where the code that {key} refers to comes from: {CODE_SHAPES})"))
        return out
    if job.workdir is not None and (not WORKDIR_RE.fullmatch(job.workdir) or ".." in job.workdir.split("/")):
        out.append(("workdir", f"{job.workdir!r}: expected a relative path inside the code (no '..', no leading '/')"))
    if job.code_digest is not None and not SHA256_RE.fullmatch(job.code_digest):
        out.append(("codeDigest", "expected the archive's sha256 (64 lowercase hex digits; spotctl records it)"))
    if job.code_commit is not None:
        if not COMMIT_RE.fullmatch(job.code_commit):
            out.append(("codeCommit", "expected a 40-digit git commit (spotctl records it)"))
        if code.git is None:
            out.append(("codeCommit", "recorded for code: {git: ...} only: remove it (the next launch or resume records "
                        "what the directory's code is)"))
    if code.git is not None and job.code_digest is not None:
        out.append(("codeDigest", "recorded for code: {dir: ...} only: remove it (the next launch or resume pins the "
                        "repository's commit as codeCommit)"))
    if code.token_env is not None:
        value = job.env.get(code.token_env)
        if value is None or isinstance(value, str):
            what = "is not one of its env keys" if value is None else "is a plain env value"
            out.append(("code.tokenEnv", f"{code.token_env!r} {what}: the token must be a secure: env value "
                        "(`pulumi config set --secret --path 'spotctl:jobs[N].env.NAME'`)"))
    if job.container is not None and not IMAGE_RE.fullmatch(job.container):
        out.append(("container", f"{job.container!r}: expected an image reference such as 'nvcr.io/nvidia/pytorch:24.05-py3'"))
    return out


def relative_file(command: str) -> str:
    """The relative script file a command names (``python train.py`` -> ``train.py``), "" when none."""
    try:
        words = shlex.split(command, comments=True)
    except ValueError:
        return ""
    for word in words:
        if re.fullmatch(r"[\w.-]+(?:/[\w.-]+)*\.(?:py|sh)", word) and not word.startswith("/"):
            return word
    return ""


def uncoded_warning(job: Any) -> str:
    """Why a job without code whose command names a relative file will not find it ("" otherwise)."""
    script = relative_file(job.command)
    if job.code is not None or not script:
        return ""
    return (f"job {job.id} runs {script!r}, a relative file, but has no code: the command runs in the empty job "
            f"disk. Add code: ./ (or {{dir: PATH}}, {{git: URL, ref: REF}}); docs/guides/code.md")


def code_warnings(cfg: Any) -> list[str]:
    """What ``spotctl validate`` warns of a stack's code keys (valid config, so warnings, never errors)."""
    out = []
    for i, job in enumerate(cfg.jobs):
        key = f"spotctl:jobs[{i}]"
        uncoded = uncoded_warning(job)
        if uncoded:
            out.append(f"{key}.command: {uncoded}")
        if job.container is not None:
            why = _container_host(cfg.cloud, job.image)
            if why:
                out.append(f"{key}.container: job {job.id} runs in {job.container!r} with `docker run --gpus all`: {why}")
        if job.code is not None and job.active and not (job.code_digest or job.code_commit):
            out.append(f"{key}.code: job {job.id}'s code was never packed: `spotctl resume {job.id}` (or launch) packs "
                       "and uploads it and records it; a plain `pulumi up` would start it without its code")
    return out


def _container_host(cloud: str, image: str | None) -> str:
    """Why the job's VM image may lack docker and the NVIDIA Container Toolkit ("" when documented)."""
    if image:
        return f"its image {image!r} must have docker and the NVIDIA Container Toolkit"
    if cloud == "aws":
        # The default AMI family (Deep Learning OSS Nvidia Driver AMI GPU PyTorch, infra/aws.py DEFAULT_AMI_NAME):
        # its release notes list "nvidia_container_toolkit_version" among the major packages and update the
        # docker-ce packages (e.g. https://docs.amazonaws.cn/dlami/latest/devguide/aws-deep-learning-ami-gpupt29oss-ul2404-2026-01-08.md;
        # read for the Ubuntu 24.04 build; the 22.04 one spotctl picks is of the same family).
        return ""
    return ("the default Deep Learning VM image is not documented to ship docker and the NVIDIA Container Toolkit: "
            "give the job an image: that has both")
