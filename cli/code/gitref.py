"""A git ref pinned to a commit at launch (``git ls-remote``), so every attempt runs the same commit."""

from __future__ import annotations

import os
import re
import subprocess

from cli.code import CodeError

COMMIT = re.compile(r"[0-9a-f]{40}")


def pick(listing: str, ref: str) -> str | None:
    """The commit ``ref`` names in ``git ls-remote`` output: HEAD, a branch, a tag (peeled to its
    commit), or a full ref name; None when the remote has no such ref."""
    refs: dict[str, str] = {}
    for line in listing.splitlines():
        sha, _, name = line.partition("\t")
        if COMMIT.fullmatch(sha):
            refs[name] = sha
    for name in (ref, f"refs/heads/{ref}", f"refs/tags/{ref}^{{}}", f"refs/tags/{ref}", f"{ref}^{{}}"):
        if name in refs and not (name.startswith("refs/tags/") and not name.endswith("^{}") and f"{name}^{{}}" in refs):
            return refs[name]
    return None


def resolve(url: str, ref: str, what: str, timeout: float = 60) -> str:
    """The commit of ``ref`` in the repository at ``url`` (a 40-digit ``ref`` is taken as it is).

    Raises:
        CodeError: git could not list the repository, or it has no such ref (``what`` starts the message).
    """
    if COMMIT.fullmatch(ref):
        return ref
    env = {**os.environ, "GIT_TERMINAL_PROMPT": "0"}  # never wait for a password on a terminal
    try:
        run = subprocess.run(["git", "ls-remote", "--", url], capture_output=True, text=True, timeout=timeout, env=env)
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise CodeError(f"{what}: git ls-remote {url} did not answer: {exc}") from None
    if run.returncode != 0:
        # git's own words are its fatal:/error: lines; the advice after them ("Please make sure you
        # have the correct access rights and the repository exists.") says nothing of this case
        said = [ln.strip() for ln in run.stderr.splitlines() if ln.strip()]
        tail = "; ".join([ln for ln in said if ln.startswith(("fatal:", "error:", "remote:"))][:3]
                         or said[-1:] or [f"exit code {run.returncode}, no output"])
        raise CodeError(f"{what}: git ls-remote {url} failed ({tail}); this machine's git must be able to read "
                        "the repository (its credentials), the VM's uses the job's tokenEnv")
    commit = pick(run.stdout, ref)
    if commit is None:
        raise CodeError(f"{what}: ref {ref!r} does not exist in {url} (a branch, a tag, HEAD or a full commit)")
    return commit
