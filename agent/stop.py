"""Stopping the trainer: its process group, signaled once per boot, waited for within the budget;
how far it got; and the record-once `preempted` every stop path goes through."""

from __future__ import annotations

import contextlib
import os
import signal
import time
from typing import Optional

from agent import schema
from agent.config import Config
from agent.events import Recorder, last_step
from agent.util import exists, group_alive, locked, log, pid_alive, pid_file, read, touch


def trainer_pid(cfg: Config) -> Optional[int]:
    """The trainer's process group (its leader's pid), while any of its processes is alive: not the
    leader alone, since ``bash -c 'a; b'`` keeps bash as the leader, which dies at once on SIGTERM
    while its child goes on writing the checkpoint."""
    pid = pid_file(cfg, "trainer.pid")
    if pid is None:
        return None
    return pid if group_alive(pid) or pid_alive(pid) else None


def already_completed(cfg: Config) -> bool:
    """This node's work is done on its disk: its trainer exited 0 unsignaled. A job of one node never
    runs again (its command may not be reentrant); a gang's node only within the attempt that
    completed (a later attempt needs every rank back for its rendezvous). A pool never completes."""
    if not cfg.is_job:
        return False
    marker = cfg.disk(schema.COMPLETED_MARKER)
    if not os.path.exists(marker):
        return False
    if cfg.world_size <= 1 or (read(marker) or "").strip() == str(cfg.attempt):
        return True
    # (a marker a power loss left empty, or an older spotctl's: this node's own event says it)
    needle = '"attempt":%d,"node":%d,"event":"completed"' % (cfg.attempt, cfg.node_rank)
    return needle in (read(cfg.disk(schema.EVENT_LOG)) or "")


def finished(cfg: Config) -> bool:
    """The job completed here and no trainer process is left: a stop has nothing to stop or record."""
    return already_completed(cfg) and trainer_pid(cfg) is None


def signal_trainer(cfg: Config, sig: int = signal.SIGTERM) -> None:
    """SIGTERM the trainer's whole group (torchrun and its workers) so it checkpoints. At most once per
    boot: a second SIGTERM makes many trainers abandon the checkpoint they are writing."""
    pid = trainer_pid(cfg)
    if pid is None:
        return
    if not pid_alive(pid):
        # The command has already ended (its leader a zombie its run has not reaped yet, on a busy VM):
        # its exit status is its own, so this stop must not claim it (a finished job is not preempted).
        log(cfg, "trainer process %d has already exited; not signaled" % pid)
        return
    try:  # claimed exclusively: GCE's shutdown bootstrap takes the same marker (set -C)
        os.close(os.open(cfg.state("signaled"), os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644))
    except FileExistsError:
        return
    log(cfg, "sending SIG%s to trainer process group %d" % (signal.Signals(sig).name[3:], pid))
    try:
        os.killpg(pid, sig)
    except OSError:
        with contextlib.suppress(OSError):
            os.kill(pid, sig)


def wait_trainer(cfg: Config, budget: float) -> bool:
    """Wait up to ``budget`` seconds for the trainer's group to exit; True if it did."""
    deadline = time.monotonic() + budget
    while trainer_pid(cfg) is not None:
        if time.monotonic() >= deadline:
            return False
        time.sleep(0.1)
    return True


def wait_drained(cfg: Config, budget: float) -> None:
    """Wait (at most ``budget`` s) for the run process to have written the trainer's last lines to its
    log: the stop path reads the checkpoint the trainer wrote on SIGTERM from there."""
    if pid_file(cfg, "run.pid") is None and not exists(cfg.state("trainer.pid")):
        return
    deadline = time.monotonic() + budget
    while not exists(cfg.state("drained")) and time.monotonic() < deadline:
        run = pid_file(cfg, "run.pid")
        if run is not None and not pid_alive(run):
            return
        time.sleep(0.05)


def progress(rec: Recorder) -> dict:
    step = last_step(rec.trainer_log(), schema.PROGRESS_LINE)
    return {} if step is None else {"progress": str(step)}


def claim_notice(cfg: Config, details: list[str]) -> bool:
    """The first stop path to see a preemption claims it (the notice's details, one per line); the
    others find it claimed and only wait for its record."""
    try:
        fd = os.open(cfg.state("notice"), os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
    except FileExistsError:
        return False
    with os.fdopen(fd, "w") as fh:
        fh.write("".join(d + "\n" for d in details))
    return True


def notice_details(cfg: Config) -> list[str]:
    return [line for line in (read(cfg.state("notice")) or "").split("\n") if line]


def as_details(items: list[str]) -> dict:
    return dict(item.split("=", 1) for item in items if "=" in item)


def preempted_once(cfg: Config, rec: Recorder, details: list[str]) -> None:
    """After a notice and the trainer's stop: the checkpoint it wrote on SIGTERM, then `preempted`
    with how far it got, once per boot whichever path gets here first. The lock is held through the
    upload, so a second path waits for the first one's record instead of recording it twice."""
    with locked(cfg.state("preempted.lock"), 15):
        if exists(cfg.state("preempted-recorded")):
            return
        # The trainer finished on its own as the notice came: the work is done, and a `preempted`
        # would only start an attempt that finds it done.
        if finished(cfg):
            log(cfg, "the job completed as the notice came: no preempted event")
            return
        wait_drained(cfg, 2)
        rec.checkpoint_flush(2)
        # In the foreground and last, after the trainer's whole budget: only what is left of the notice.
        rec.record("preempted", dict(as_details(details), **progress(rec)), cfg.last_record_s)
        touch(cfg.state("preempted-recorded"))


def notice(cfg: Config, rec: Recorder, details: list[str], since: Optional[float] = None) -> None:
    """A preemption notice: SIGTERM the trainer, record the notice, give the trainer what is left of
    its budget (the cloud's clock started at ``since``, the last look that saw none, not at this
    poll), then record `preempted` once."""
    now = time.time()
    budget = max(0.0, cfg.stop_budget_s - (now - (since if since is not None else now)))
    if finished(cfg):
        log(cfg, "notice after the job completed: nothing to record ({})".format(" ".join(details)))
        return
    if not claim_notice(cfg, details):
        return
    touch(cfg.state("stopping"))
    signal_trainer(cfg)
    rec.record("preemption-notice", dict(as_details(details), **progress(rec)), 5, background=True)
    if not wait_trainer(cfg, budget):
        rec.record("checkpoint-timeout", {"budget_s": "%d" % budget}, 2, background=True)
    preempted_once(cfg, rec, details)
    rec.wait()


def stop(cfg: Config, rec: Recorder, event: str, details: dict) -> None:
    """A stop that is not a preemption: signal the trainer, record ``event``, give it its budget."""
    touch(cfg.state("stopping"))
    signal_trainer(cfg)
    budget = float(os.environ.get("SPOTCTL_RECORD_BUDGET_S") or 8)
    rec.record(event, dict(details, **progress(rec)), budget, background=True)
    if wait_trainer(cfg, cfg.stop_budget_s):
        log(cfg, "trainer stopped")
    else:
        log(cfg, "trainer still running after %ds" % cfg.stop_budget_s)
        rec.record("checkpoint-timeout", {"budget_s": str(cfg.stop_budget_s)}, 2, background=True)
    wait_drained(cfg, 2)
    rec.checkpoint_flush(2)
    rec.wait()  # for the uploads: the VM may power off when this returns
