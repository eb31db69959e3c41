"""The job itself: its environment (the image's PATH and HOME, the job's env and secrets, then
spotctl's own variables, which nothing overrides), the code and setup, the command exactly as written
in its own process group, its output to the job log with progress and checkpoint events, and how it
ended."""

from __future__ import annotations

import base64
import os
import shlex
import shutil
import subprocess
import sys
import threading
import time
from typing import Optional

from agent import code, schema
from agent.config import Config
from agent.events import Recorder
from agent.imds import Metadata
from agent.util import exists, log, touch, write_atomic

FALLBACK_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"


def image_env(cfg: Config, login_shell: str = "/bin/bash") -> dict[str, str]:
    """PATH and HOME as the image gives them to a login: systemd starts the agent with a bare PATH
    and no HOME, and e.g. AWS's deep learning AMIs put PyTorch's python outside it. Without systemd
    (``spotctl drill``), the caller's PATH and HOME: the command sees the same variables either way."""
    if cfg.no_systemd:
        return {"PATH": os.environ.get("PATH") or FALLBACK_PATH, "HOME": os.environ.get("HOME") or "/root"}
    home = os.path.expanduser("~root") if os.geteuid() == 0 else os.path.expanduser("~")
    try:
        done = subprocess.run([login_shell, "-l", "-c", 'printf "%s" "$PATH"'], env={"HOME": home, "USER": "root"},
                              stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, stdin=subprocess.DEVNULL, timeout=20,
                              check=False)
        path = done.stdout.decode("utf-8", "replace").strip() if done.returncode == 0 else ""
    except (OSError, subprocess.SubprocessError):
        path = ""
    return {"PATH": path or FALLBACK_PATH, "HOME": home}


def spotctl_vars(cfg: Config, workdir: str, resume: bool) -> dict[str, str]:
    """Every variable of ``schema.EXPORTED_VARIABLES`` this VM exports."""
    v = {
        "SPOTCTL_CLOUD": cfg.cloud, "SPOTCTL_REGION": cfg.region, "SPOTCTL_STACK": cfg.stack,
        "SPOTCTL_ATTEMPT": str(cfg.attempt), "SPOTCTL_MOUNT": cfg.mount_point, "SPOTCTL_WORKDIR": workdir if cfg.has_code() else cfg.mount_point,
        "SPOTCTL_CODE_DIR": code.code_dir(cfg) if cfg.has_code() else "",
        "SPOTCTL_CHECKPOINT_DIR": cfg.disk(schema.CHECKPOINTS),
        "MASTER_ADDR": cfg.master_addr, "MASTER_PORT": str(cfg.master_port),
        "NODE_RANK": str(cfg.node_rank), "WORLD_SIZE": str(cfg.world_size),
    }
    if cfg.is_job:
        v["SPOTCTL_JOB_ID"] = cfg.name
    else:
        v["SPOTCTL_POOL"] = cfg.name
        v["SPOTCTL_BUSY_FILE"] = cfg.state("busy")
    if resume:
        v["SPOTCTL_RESUME"] = "1"
    return v


def command_env(cfg: Config, base: dict[str, str], secrets: dict[str, str], workdir: str, resume: bool) -> dict[str, str]:
    """base < secrets < the job's env < spotctl's variables."""
    env = dict(base)
    env.update(secrets)
    env.update(cfg.env)
    env.pop("SPOTCTL_RESUME", None)
    env.update(spotctl_vars(cfg, workdir, resume))
    return env


def env_file_text(cfg: Config, workdir: str) -> str:
    """``<state>/env``: the job's env and spotctl's variables as shell exports (never a secret), for
    a person on the VM: ``. /var/lib/spotctl/env``."""
    values = dict(cfg.env)
    values.update(spotctl_vars(cfg, workdir, False))
    return "".join(f"export {k}={shlex.quote(v)}\n" for k, v in values.items())


def argv_for(cfg: Config, command: str, env: dict[str, str], cwd: str) -> list[str]:
    """The command handed verbatim to ``bash -c``; with ``container``, inside ``docker run``, the job
    disk at the same path, the job's env by name (values stay out of argv) and the GPUs."""
    if not cfg.container:
        bash = shutil.which("bash", path=env.get("PATH")) or "/bin/bash"
        return [bash, "-c", command]
    argv = ["docker", "run", "--rm", "--gpus", "all", "--network", "host", "--ipc", "host",
            "--name", "spotctl-%s-%d-%d" % (cfg.unit, cfg.attempt, cfg.node_rank),
            "-v", f"{cfg.mount_point}:{cfg.mount_point}", "-w", cwd]
    for key in sorted(env):
        if key not in ("PATH", "HOME"):  # the image's own
            argv += ["-e", key]
    return argv + [cfg.container, "bash", "-c", command]


def load_secrets(cfg: Config, cloud) -> Optional[dict[str, str]]:
    """The job's secret env values, in memory only. Retried for 2 minutes: a role or binding made in
    the same update can take that long to apply. Only the names this job declares are taken."""
    if not cfg.secret_keys:
        return {}
    deadline = time.monotonic() + cfg.env_number("SPOTCTL_SECRET_WAIT_S", 120)
    payload = None
    while not payload:
        payload = cloud.secret_payload(10)
        if payload:
            break
        if time.monotonic() >= deadline:
            log(cfg, f"could not read the job's secret env values from {cfg.secret_ref}: not starting the trainer")
            return None
        time.sleep(2)
    out = {}
    for item in payload.split():
        key, _, value = item.partition("=")
        if key not in cfg.secret_keys:
            continue  # never SPOTCTL_* or another reserved name
        try:
            out[key] = base64.urlsafe_b64decode(value.encode()).decode()
        except (ValueError, UnicodeDecodeError):
            log(cfg, f"the secret value of {key} in {cfg.secret_ref} is not base64")
            return None
    if len(out) != len(set(cfg.secret_keys)):
        log(cfg, "%s holds %d of the job's %d secret env values" % (cfg.secret_ref, len(out), len(set(cfg.secret_keys))))
        return None
    return out


def has_progress(cfg: Config) -> bool:
    """Training already ran on this disk: a checkpoint, or an earlier `started` (a later attempt, or a
    reboot). Never from the attempt number alone."""
    ckpt = cfg.disk(schema.CHECKPOINTS)
    if os.path.isdir(ckpt) and os.listdir(ckpt):
        return True
    try:
        with open(cfg.disk(schema.EVENT_LOG), encoding="utf-8", errors="replace") as fh:
            return any('"event":"started"' in line for line in fh)
    except OSError:
        return False


def driver_ready() -> bool:
    try:
        return subprocess.run(["nvidia-smi"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, check=False).returncode == 0
    except OSError:
        return False


def wait_driver(cfg: Config, meta: Metadata) -> None:
    """Deep Learning VM images install the NVIDIA driver at first boot when the VM's metadata asks for
    it (install-nvidia-driver=True, infra/gcp.py): the trainer starts once nvidia-smi answers, at most
    20 minutes later (then anyway, and its own error says why)."""
    want = meta.get("instance/attributes/install-nvidia-driver")
    if (want or "").strip().lower() != "true":
        return
    deadline = time.monotonic() + cfg.env_number("SPOTCTL_DRIVER_WAIT_S", 1200)
    while not driver_ready():
        if time.monotonic() >= deadline or exists(cfg.state("stopping")):
            log(cfg, "the NVIDIA driver is not ready (nvidia-smi fails): starting the trainer anyway")
            return
        time.sleep(2)


class Pump:
    """Copies the trainer's output to its log (and the agent's output) and turns its lines into
    events: the first progress line ends the changeover (`progress`, once); each checkpoint line is a
    `checkpoint`, at most one per ``checkpoint_event_s``, the newest skipped one kept for the flush."""

    def __init__(self, cfg: Config, rec: Recorder, stream, log_path: str):
        self.cfg, self.rec, self.stream, self.log_path = cfg, rec, stream, log_path
        self.progressed = False
        self.last_event = 0.0
        self.thread = threading.Thread(target=self._run, daemon=True)

    def start(self) -> Pump:
        self.thread.start()
        return self

    def _line(self, line: bytes) -> None:
        if not self.progressed and (schema.PROGRESS_LINE.match(line) or line.startswith(b"SPOTCTL_CHECKPOINT")):
            self.progressed = True
            self.rec.record("progress", background=True)
        m = schema.CHECKPOINT_LINE.match(line)
        if not m:
            return
        step = int(m.group(1))
        now = time.monotonic()
        if not self.last_event or now - self.last_event >= self.cfg.checkpoint_event_s:
            self.last_event = now
            self.rec.checkpoint_event(step, background=True)
        else:
            write_atomic(self.cfg.state("checkpoint-seen"), "%d %d %s" % (self.cfg.attempt, step, schema.event_time()))

    def _run(self) -> None:
        out = getattr(sys.stdout, "buffer", None)
        pending = b""
        with open(self.log_path, "ab") as logf:
            fd = self.stream.fileno()
            while True:
                data = os.read(fd, 65536)
                if not data:
                    break
                logf.write(data)
                logf.flush()
                if out is not None:
                    try:
                        out.write(data)
                        out.flush()
                    except (OSError, ValueError):
                        out = None
                pending += data
                *lines, pending = pending.split(b"\n")
                for line in lines:
                    self._line(line.rstrip(b"\r"))
        if pending:
            self._line(pending)
        touch(self.cfg.state("drained"))


def log_start(path: str) -> None:
    """A last line a power loss cut short is ended, so this run's lines start on lines of their own."""
    try:
        with open(path, "rb") as fh:
            fh.seek(-1, os.SEEK_END)
            cut = fh.read(1) != b"\n"
    except OSError:
        return
    if cut:
        with open(path, "ab") as fh:
            fh.write(b"\n")


def end_attempt_failed(cfg: Config, rec: Recorder, details: dict[str, str]) -> int:
    """The attempt cannot run: say why in the log and the event, upload both, then the VM may stop."""
    log(cfg, details.get("reason", "failed"))
    with open(rec.trainer_log(), "ab") as fh:
        fh.write(("spotctl: {}\n".format(details.get("reason", "failed"))).encode())
    rec.upload_log(5)
    rec.record("failed", details)
    return 1
