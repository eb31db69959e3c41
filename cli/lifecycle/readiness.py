"""``spotctl check``: is this machine ready to apply a stack? One finding per thing spotctl needs: the
pulumi CLI (and its version), the backend login, the stack and its file, each cloud's credentials, the
stack's event bucket. Observed at the edge (``observe``), judged here (``judge``: pure)."""

from __future__ import annotations

import json
import os
import re
import subprocess
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

# What spotctl runs: `pulumi state protect` (put back a disk's protection after a failed update), merged in
# pulumi/pulumi#19355 (2025-04-28); v3.170.0's state commands are the first release seen with it around
# (pulumi/pulumi#19507). The Automation API alone needs 3.1.0 (sdk/python/lib/pulumi/automation/_minimum_version.py).
MIN_PULUMI = (3, 170, 0)
PULUMI_TIMEOUT_S = 20.0
CLOUDS = ("gcp", "aws")


@dataclass(frozen=True)
class Finding:
    what: str  # "pulumi CLI", "backend login", "stack", "gcp credentials", ...
    ok: bool
    detail: str
    needed: bool = True  # a missing one that is needed makes `check` exit non-zero

    @property
    def mark(self) -> str:
        return "ok" if self.ok else ("missing" if self.needed else "-")


@dataclass(frozen=True)
class Seen:
    """What the edge found (strings: the exact facts, or why they could not be found)."""

    pulumi: str | None  # the binary's path
    version: str | None  # `pulumi version`'s output, or None
    version_error: str
    backend: str | None  # the backend URL this user is logged in to
    backend_source: str
    token: bool  # an access token for a Pulumi Cloud backend
    stack: str | None
    stack_file: str | None
    stack_cloud: str | None
    stack_error: str
    credentials: dict[str, str | None]  # cloud -> None (found) or why none
    bucket: str | None
    bucket_source: str


def parse_version(text: str | None) -> tuple[int, int, int] | None:
    m = re.search(r"v?(\d+)\.(\d+)\.(\d+)", text or "")
    return (int(m[1]), int(m[2]), int(m[3])) if m else None


def judge(seen: Seen) -> list[Finding]:
    """The findings, in the order `check` prints them (pure)."""
    minimum = ".".join(map(str, MIN_PULUMI))
    out: list[Finding] = []
    if seen.pulumi is None:
        out.append(Finding("pulumi CLI", False, f"no `pulumi` on PATH (or $SPOTCTL_PULUMI_ROOT/bin): install it from "
                                                f"pulumi.com, version >= {minimum}"))
    else:
        version = parse_version(seen.version)
        if version is None:
            out.append(Finding("pulumi CLI", False, f"{seen.pulumi}: `pulumi version` failed: {seen.version_error or seen.version}"))
        else:
            shown = ".".join(map(str, version))
            out.append(Finding("pulumi CLI", version >= MIN_PULUMI,
                               f"v{shown} at {seen.pulumi}" + ("" if version >= MIN_PULUMI else f": spotctl needs >= {minimum}")))
    if seen.backend is None:
        out.append(Finding("backend login", False, "not logged in: `pulumi login` (Pulumi Cloud, s3://, gs://, file://)"))
    elif seen.backend.startswith("https://") and not seen.token:
        out.append(Finding("backend login", False, f"{seen.backend} ({seen.backend_source}) has no access token: `pulumi login`"))
    else:
        out.append(Finding("backend login", True, f"{seen.backend} ({seen.backend_source})"))
    if seen.stack_cloud is None:
        out.append(Finding("stack", False, seen.stack_error or "no stack"))
    else:
        out.append(Finding("stack", True, f"{seen.stack} ({seen.stack_cloud}): {seen.stack_file}"))
    for cloud in CLOUDS:
        why = seen.credentials.get(cloud)
        needed = seen.stack_cloud in (None, cloud)
        note = "" if needed else f" (not needed by stack {seen.stack})"
        out.append(Finding(f"{cloud} credentials", why is None, ("found" if why is None else why) + note, needed))
    if seen.bucket:
        out.append(Finding("event bucket", True, f"{seen.bucket} ({seen.bucket_source})"))
    else:
        out.append(Finding("event bucket", False, f"not known: {seen.bucket_source} (status and resume then read no "
                                                  "events; `spotctl sync --events-bucket NAME` once)", needed=False))
    return out


def pulumi_version(binary: str, run: Callable[..., Any] = subprocess.run) -> tuple[str | None, str]:
    """(`pulumi version`'s output, why not)."""
    try:
        done = run([binary, "version"], capture_output=True, text=True, timeout=PULUMI_TIMEOUT_S)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return None, str(exc)
    if done.returncode != 0:
        lines = (done.stderr or done.stdout).strip().splitlines()
        return None, lines[-1] if lines else f"exit {done.returncode}"
    return done.stdout.strip(), ""


def backend(env: dict[str, str], home: Path) -> tuple[str | None, str, bool]:
    """(the backend URL this user is logged in to, where that was read, whether a Pulumi Cloud token is
    there): $PULUMI_BACKEND_URL, else ``current`` in ``$PULUMI_HOME/credentials.json`` with its
    ``accessTokens`` (pulumi/pulumi sdk/go/common/workspace/creds.go); $PULUMI_ACCESS_TOKEN counts."""
    token = bool(env.get("PULUMI_ACCESS_TOKEN"))
    try:
        creds = json.loads((home / "credentials.json").read_text())
    except (OSError, ValueError):
        creds = {}
    if env.get("PULUMI_BACKEND_URL"):
        url = env["PULUMI_BACKEND_URL"]
        return url, "$PULUMI_BACKEND_URL", token or bool((creds.get("accessTokens") or {}).get(url))
    current = creds.get("current") if isinstance(creds, dict) else None
    if not current:
        return None, "", token
    return str(current), f"{home / 'credentials.json'}", token or bool((creds.get("accessTokens") or {}).get(current))


def pulumi_home(env: dict[str, str]) -> Path:
    return Path(env.get("PULUMI_HOME") or Path.home() / ".pulumi")


def as_json(findings: list[Finding]) -> list[dict[str, Any]]:
    return [asdict(f) | {"status": f.mark} for f in findings]


def environment() -> dict[str, str]:
    return dict(os.environ)
