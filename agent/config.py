"""What one VM's agent knows: the JSON the bootstrap writes next to it (rendered from
infra/render.py ``ScriptContext``), plus the few knobs tests and drills set in the environment."""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field, fields
from typing import Optional


@dataclass(frozen=True)
class Config:
    cloud: str
    stack: str
    kind: str
    name: str
    command: str
    event_bucket: str
    region: str
    attempt: int = 1
    node_rank: int = 0
    world_size: int = 1
    master_addr: str = "127.0.0.1"
    master_port: int = 29500
    env: dict[str, str] = field(default_factory=dict)
    secret_keys: tuple[str, ...] = ()
    secret_ref: str = ""
    secrets_url: str = ""
    capacity: str = ""
    machine_type: str = ""
    disk_device: str = ""
    disk_aliases: tuple[str, ...] = ()
    disk_wait_s: int = 120
    mount_point: str = "/mnt/spotctl"
    cwd: str = ""
    metadata_url: str = ""
    storage_url: str = ""
    autoscaling_url: str = ""
    event_prefix: str = ""
    poll_interval_s: int = 5
    checkpoint_event_s: int = 60
    stop_budget_s: int = 20
    notice_s: int = 30
    systemd_dir: str = "/etc/systemd/system"
    fstab: str = "/etc/fstab"
    state_dir: str = "/var/lib/spotctl"
    unit: str = "spotctl-job"
    # Code delivery: an archive (``s3://``/``gs://`` URI and its sha256) or a git URL at a commit.
    code_uri: str = ""
    code_sha256: str = ""
    code_git_url: str = ""
    code_git_commit: str = ""
    code_git_token_env: str = ""
    setup: str = ""
    workdir: str = ""
    container: str = ""
    # How the VM powers itself off once its work is done (tests: a recording stand-in on PATH).
    poweroff: tuple[str, ...] = ("shutdown", "-h", "now")
    self_stop: bool = True

    @classmethod
    def from_dict(cls, doc: dict) -> Config:
        known = {f.name for f in fields(cls)}
        values = {k: v for k, v in doc.items() if k in known}
        for name in ("secret_keys", "disk_aliases", "poweroff"):
            if name in values:
                values[name] = tuple(values[name])
        return cls(**values)

    @classmethod
    def load(cls, path: str) -> Config:
        with open(path, encoding="utf-8") as fh:
            return cls.from_dict(json.load(fh))

    # ---- derived -----------------------------------------------------------------------------
    @property
    def is_job(self) -> bool:
        return self.kind == "job"

    @property
    def record_budget_s(self) -> float:
        return float(os.environ.get("SPOTCTL_RECORD_BUDGET_S") or 10)

    @property
    def last_record_s(self) -> float:
        """Seconds for the `preempted` a notice's path records last, after the trainer's budget."""
        return 2.0

    @property
    def no_systemd(self) -> bool:
        return bool(os.environ.get("SPOTCTL_NO_SYSTEMD")) or not os.path.isdir("/run/systemd/system")

    def state(self, name: str) -> str:
        return os.path.join(self.state_dir, name)

    def disk(self, rel: str) -> str:
        return os.path.join(self.mount_point, rel)

    def has_code(self) -> bool:
        return bool(self.code_uri or self.code_git_url)

    def code_key(self) -> str:
        """The code's identity on disk: the archive's digest or the git commit."""
        return self.code_sha256 or self.code_git_commit

    def env_number(self, name: str, default: float) -> float:
        value: Optional[str] = os.environ.get(name)
        try:
            return float(value) if value else default
        except ValueError:
            return default


def load_default(argv: list[str]) -> Config:
    """The config next to the agent (``SPOTCTL_CONFIG`` or ``<state_dir>/config.json``)."""
    path = os.environ.get("SPOTCTL_CONFIG") or "/var/lib/spotctl/config.json"
    return Config.load(path)
