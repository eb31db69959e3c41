"""What one VM's agent knows: the JSON the bootstrap writes next to it (rendered from
infra/render.py ``ScriptContext``), plus the few knobs tests and drills set in the environment."""

from __future__ import annotations

import json
import os
from typing import Optional

REQUIRED = ("cloud", "stack", "kind", "name", "command", "event_bucket", "region")
# Every other setting and its default (infra/render.py ``ScriptContext.agent_config`` fills them all).
DEFAULTS = {
    "attempt": 1, "node_rank": 0, "world_size": 1, "master_addr": "127.0.0.1", "master_port": 29500,
    "env": {}, "secret_keys": (), "secret_ref": "", "secrets_url": "", "capacity": "", "machine_type": "",
    "disk_device": "", "disk_aliases": (), "disk_wait_s": 120, "mount_point": "/mnt/spotctl", "cwd": "",
    "metadata_url": "", "storage_url": "", "autoscaling_url": "", "event_prefix": "", "poll_interval_s": 5,
    "checkpoint_event_s": 60, "stop_budget_s": 20, "notice_s": 30, "systemd_dir": "/etc/systemd/system",
    "fstab": "/etc/fstab", "state_dir": "/var/lib/spotctl", "unit": "spotctl-job",
    # Code delivery: an archive (``s3://``/``gs://`` URI and its sha256) or a git URL at a commit.
    "code_uri": "", "code_sha256": "", "code_git_url": "", "code_git_commit": "", "code_git_token_env": "",
    "setup": "", "workdir": "", "container": "",
    # How the VM powers itself off once its work is done.
    "poweroff": ("shutdown", "-h", "now"), "self_stop": True,
}
_TUPLES = ("secret_keys", "disk_aliases", "poweroff")


class Config:
    """The settings as attributes, read-only. A plain class, not a dataclass: ``dataclasses`` costs
    the stop path's start more than everything else it imports (bench/agent_latency.py)."""

    def __init__(self, **values: object):
        missing = [k for k in REQUIRED if k not in values]
        unknown = [k for k in values if k not in DEFAULTS and k not in REQUIRED]
        if missing or unknown:
            raise TypeError("Config: missing %s, unknown %s" % (missing, unknown))
        merged = dict(DEFAULTS)
        merged["env"] = {}
        merged.update(values)
        for name in _TUPLES:
            merged[name] = tuple(merged[name])
        merged["env"] = dict(merged["env"])
        object.__setattr__(self, "_values", merged)

    def __getattr__(self, name: str):
        try:
            return self.__dict__["_values"][name]
        except KeyError:
            raise AttributeError(name) from None

    def __setattr__(self, name: str, value: object) -> None:
        raise AttributeError("Config is read-only")

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Config) and self._values == other._values

    def __repr__(self) -> str:
        return "Config(%s)" % ", ".join("%s=%r" % kv for kv in sorted(self._values.items()))

    @classmethod
    def from_dict(cls, doc: dict) -> Config:
        return cls(**{k: v for k, v in doc.items() if k in DEFAULTS or k in REQUIRED})

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
    def first_record_s(self) -> float:
        """Seconds the attempt's `started` keeps being retried: the job's write permission may not be
        live yet. GCP IAM: "Typically 2 minutes, potentially 7 minutes or longer"
        (https://cloud.google.com/iam/docs/access-change-propagation); AWS IAM is eventually consistent
        too (https://docs.aws.amazon.com/IAM/latest/UserGuide/troubleshoot_general.html, "Changes that I
        make are not always immediately visible"). Ten minutes, in the background: the job goes on."""
        return float(os.environ.get("SPOTCTL_FIRST_RECORD_S") or 600)

    @property
    def last_record_s(self) -> float:
        """Seconds for the `preempted` a notice's path records last, after the trainer's budget: what
        the notice leaves after that budget, the drain and flush (4 s) and 4 s to power off, between
        2 and 10 (GCP's 30 s notice: 2; AWS's 2 minutes: 10, as one 2 s try was seen to miss on a slow
        VM, the event then only on the disk)."""
        return float(max(2, min(10, self.notice_s - self.stop_budget_s - 8)))

    @property
    def maintenance_notice_s(self) -> float:
        """How long before a GCE host maintenance stops this VM its notice comes: "Compute Engine gives
        GPU VMs a 1-hour stopping notice, while normal VMs receive only a 60-second notice"
        (https://cloud.google.com/compute/docs/gpus/gpu-host-maintenance). A GPU VM is one whose NVIDIA
        driver is loaded (its control device); without one the short notice is assumed, so the trainer
        is stopped at once, never too late."""
        gpu = os.path.exists(os.environ.get("SPOTCTL_NVIDIA_DEVICE") or "/dev/nvidiactl")
        return self.env_number("SPOTCTL_MAINTENANCE_NOTICE_S", 3600.0 if gpu else 60.0)

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


def load_default() -> Config:
    """The config next to the agent (``SPOTCTL_CONFIG`` or ``<state_dir>/config.json``)."""
    path = os.environ.get("SPOTCTL_CONFIG") or "/var/lib/spotctl/config.json"
    return Config.load(path)
