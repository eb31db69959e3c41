"""The job unit's process (entry ``run``): code, setup, the trainer, how it ended, and the self-stop."""

from __future__ import annotations

import json
import os
import signal
import subprocess

from agent import code, schema
from agent.config import Config
from agent.events import Recorder
from agent.imds import Metadata
from agent.stop import already_completed, signal_trainer, wait_trainer
from agent.storage import http
from agent.trainer import (
    Pump,
    argv_for,
    command_env,
    end_attempt_failed,
    has_progress,
    image_env,
    load_secrets,
    log_start,
    wait_driver,
)
from agent.util import exists, log, read, remove, touch, write_atomic


def completed_before(cfg: Config, rec: Recorder) -> bool:
    """The job already completed on this disk: say so, record it again (the watcher may not have seen
    it), and run nothing."""
    if not already_completed(cfg):
        return False
    log(cfg, "this job already completed on this disk; not running it again")
    rec.record("completed", {"reason": "already completed"})
    return True


def power_off(cfg: Config) -> None:
    """The job's work is over and its events and log are uploaded: stop paying for the VM.
    GCE: a guest shutdown stops the VM ("you are not billed for the compute resources of a stopped
    VM", https://cloud.google.com/compute/docs/instances/stop-start-instance); EC2: the instance's
    instance_initiated_shutdown_behavior (infra/aws.py) makes an OS shutdown stop or terminate it
    (https://docs.aws.amazon.com/AWSEC2/latest/UserGuide/terminating-instances.html#Using_ChangingInstanceInitiatedShutdownBehavior)."""
    if not cfg.is_job or not cfg.self_stop:
        return
    log(cfg, "the job's work on this VM is over: powering off")
    touch(cfg.state("powered-off"))  # the shutdown path this starts has nothing to stop or record
    if cfg.no_systemd:
        # Never the machine a drill runs on: the emulator records the call instead.
        url = os.environ.get("SPOTCTL_POWEROFF_URL")
        if url:
            body = json.dumps({"instance": read(cfg.state("instance")) or "", "argv": list(cfg.poweroff)}).encode()
            http("POST", url, {"Content-Type": "application/json"}, body, 5)
        return
    try:
        subprocess.run(list(cfg.poweroff), stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                       timeout=60, check=False)
    except (OSError, subprocess.SubprocessError) as e:
        log(cfg, f"could not power off ({e})")


def prepare_code(cfg: Config, rec: Recorder, cloud, secrets: dict[str, str]) -> str:
    """The code on the disk; raises code.CodeError."""
    if cfg.code_uri:
        code.fetch_archive(cfg, cloud, cfg.env_number("SPOTCTL_CODE_WAIT_S", 120))
    elif cfg.code_git_url:
        token = secrets.get(cfg.code_git_token_env, "") if cfg.code_git_token_env else ""
        with open(rec.trainer_log(), "ab") as out:
            code.clone(cfg, token, out)
    return code.workdir(cfg)


def cannot_run(cfg: Config, rec: Recorder, details: dict[str, str]) -> int:
    """The attempt ends `failed` before or instead of its command; once its log and event are
    uploaded the VM powers off, as after a command that failed."""
    rc = end_attempt_failed(cfg, rec, details)
    rec.wait(10)
    power_off(cfg)
    return rc


def run(cfg: Config, meta: Metadata, cloud, rec: Recorder) -> int:
    if not cfg.command:
        log(cfg, "no command to run")
        return 0
    # AWS starts the enabled units at a later boot without main (a stop/start of a finished job).
    if completed_before(cfg, rec):
        return 0
    os.makedirs(cfg.disk(schema.DISK_DIR + "/logs"), exist_ok=True)
    resume = has_progress(cfg)
    # The attempt's first write: its role or binding may still be propagating (Config.first_record_s).
    rec.record("started", {"capacity": cfg.capacity, "machineType": cfg.machine_type, "nodes": str(cfg.world_size)},
               budget=cfg.first_record_s, background=True)
    if cfg.cloud == "gcp":
        wait_driver(cfg, meta)  # after `started`: the driver's install is part of the changeover
        if exists(cfg.state("stopping")):
            log(cfg, "stopped before the trainer started; the stop path records the event")
            return 0
    # systemd stopping the unit is a stop, not a failure of the job.
    def on_term(signum, frame):
        touch(cfg.state("stopping"))
        signal_trainer(cfg)
    signal.signal(signal.SIGTERM, on_term)
    signal.signal(signal.SIGINT, on_term)
    secrets = load_secrets(cfg, cloud)
    log_path = rec.trainer_log()
    if secrets is None:
        return cannot_run(cfg, rec, {"reason": "could not read the job's secret env values from %s" % cfg.secret_ref,
                                     "key": "env", "exit_code": "1"})
    try:
        workdir = prepare_code(cfg, rec, cloud, secrets)
    except code.CodeError as e:
        return cannot_run(cfg, rec, {"reason": str(e), "key": "code"})
    os.makedirs(workdir, exist_ok=True)
    env = command_env(cfg, image_env(cfg), secrets, workdir, resume)
    log_start(log_path)
    if cfg.setup:
        rc = code.run_setup(cfg, argv_for(cfg, cfg.setup, env, workdir), env, workdir, log_path,
                            lambda: exists(cfg.state("stopping")),
                            lambda pid: write_atomic(cfg.state("trainer.pid"), str(pid)))
        remove(cfg.state("trainer.pid"))
        if exists(cfg.state("stopping")):
            log(cfg, "stopped during setup; the stop path records the event")
            return 0
        if rc is not None:
            details = {"reason": "job %s: setup failed (exit %d)" % (cfg.name, rc), "key": "setup",
                       "exit_code": str(rc), "log_tail": code.tail(log_path)}
            return cannot_run(cfg, rec, details)
    remove(cfg.state("drained"))
    proc = subprocess.Popen(argv_for(cfg, cfg.command, env, workdir), stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, env=env, cwd=workdir, start_new_session=True)
    write_atomic(cfg.state("trainer.pid"), str(proc.pid))
    pump = Pump(cfg, rec, proc.stdout, log_path).start()
    if exists(cfg.state("stopping")):  # a stop that came while the trainer started
        signal_trainer(cfg)
    rc = proc.wait()
    # Whether a stop had signaled the trainer when it exited, taken now: a stop that begins in the
    # waits and uploads below must not make a finished job a stopped one.
    signaled = exists(cfg.state("signaled"))
    if cfg.is_job and rc == 0 and not signaled:
        write_atomic(cfg.disk(schema.COMPLETED_MARKER), str(cfg.attempt))
    # The leader may be gone while the rest of its group still checkpoints.
    if exists(cfg.state("stopping")) and not wait_trainer(cfg, cfg.stop_budget_s):
        log(cfg, "trainer's processes still running after %ds" % cfg.stop_budget_s)
    # From here on a stop lets this run record how the trainer ended.
    signal.signal(signal.SIGTERM, lambda s, f: touch(cfg.state("stopping")))
    remove(cfg.state("trainer.pid"))
    # A process the trainer left running may keep the pipe open: at most 5 s for its last lines.
    pump.thread.join(5)
    # This process flushes the newest checkpoint itself before it exits: once the unit's main
    # process exits, systemd kills whatever else is left in it (KillMode=mixed, systemd.kill(5)).
    # (5 s: the trainer has stopped; the unit's stop timeout is its budget + 8 s.)
    rec.checkpoint_flush(5)
    return finish(cfg, rec, rc, signaled)


def finish(cfg: Config, rec: Recorder, rc: int, signaled: bool) -> int:
    """Record how the trainer ended; a job whose command ended on its own powers the VM off after
    its log and events are uploaded."""
    stopping = exists(cfg.state("stopping"))
    # A slow bucket gets one more, longer try: after this the VM may be gone.
    if not stopping and not rec.upload_log(5) and not exists(cfg.state("stopping")) and not rec.upload_log(20):
        log(cfg, "the log's last lines were not uploaded (they stay on the job disk)")
    if signaled:
        log(cfg, "trainer exited with %d during a stop; the stop path records the event" % rc)
        rec.wait(10)
        return rc
    if rc == 0:
        rec.record("completed")
    else:
        rec.record("failed", {"exit_code": str(rc)})
    rec.wait(10)
    if not stopping:
        power_off(cfg)
    return rc
