"""The watcher unit (entry ``watch``): polls the metadata server for a preemption or maintenance
notice (a maintenance's timing: agent/maintenance.py), uploads the trainer's log every ~30 s, and
applies a pool's busy/idle state; and the stop path (entry ``shutdown``: GCE's shutdown script,
AWS's stop hook), which tells a preemption from a normal stop. Every `preempted` goes through ``stop.preempted_once``."""

from __future__ import annotations

import threading
import time

from agent import maintenance
from agent.config import Config
from agent.events import Recorder
from agent.imds import Metadata
from agent.maintenance import Plan, aws_notice, gcp_notice
from agent.stop import finished, notice, notice_details, preempted_once, stop, wait_trainer
from agent.util import exists, locked, log, read, touch, write_atomic

# How often EC2's scheduled events are asked for: they are announced days ahead.
SCHEDULED_EVERY_S = 60.0


def busy_apply(cfg: Config, rec: Recorder, cloud) -> bool:
    """Record (and on AWS, protect from scale-in) a change of the pool agent's busy file."""
    want = "busy" if exists(cfg.state("busy")) else "idle"
    have = (read(cfg.state("reported")) or "idle").strip()
    if want == have:
        return True
    if cfg.cloud == "aws" and not cloud.protect(rec.ident[0], want == "busy"):
        log(cfg, f"scale-in protection for {want} not set; retrying at the next poll")
        return False
    write_atomic(cfg.state("reported"), want)
    rec.record(want, budget=5)
    return True


def busy_sync(cfg: Config, rec: Recorder, cloud) -> bool:
    with locked(cfg.state("busy.lock"), 60) as got:
        return got and busy_apply(cfg, rec, cloud)


def _busy_poll(cfg: Config, rec: Recorder, cloud) -> None:
    with locked(cfg.state("busy.lock"), 0, blocking=False) as got:
        if got:
            busy_apply(cfg, rec, cloud)


def _background(target, *args) -> None:
    threading.Thread(target=target, args=args, daemon=True).start()


def watch(cfg: Config, meta: Metadata, rec: Recorder, cloud, clock=time.time, sleep=time.sleep) -> None:
    """Poll until a notice (then handle it) or until the stop path takes over."""
    rec.identify()
    last_asked = clock()
    polls = 0
    rebalance_seen = False
    busy = None
    plan = Plan(cfg, rec)  # a pool VM's agent too: SIGTERMed at the planned time
    scheduled_asked, scheduled = None, None
    while True:
        # The stop path classifies this stop itself (this unit outlives its start).
        if exists(cfg.state("shutdown")):
            return
        asked = clock()  # a notice seen now came after the last look
        if cfg.kind == "pool" and (busy is None or not busy.is_alive()):
            # Never delays this loop's look for a notice (Auto Scaling calls take up to 2 x 10 s).
            busy = threading.Thread(target=_busy_poll, args=(cfg, rec, cloud), daemon=True)
            busy.start()
        if cfg.cloud == "gcp":
            if (meta.get("instance/preempted") or "").strip() == "TRUE":
                notice(cfg, rec, ["source=metadata", "preempted=TRUE"], since=last_asked)
                return
            seen = gcp_notice(meta.get("instance/maintenance-event"), last_asked, cfg.maintenance_notice_s)
            if plan.step(seen, clock()):
                return
        else:
            action = meta.get("spot/instance-action")
            if action is not None:
                notice(cfg, rec, ["source=imds", "instance_action=" + action], since=last_asked)
                return
            if not rebalance_seen:
                recommendation = meta.get("events/recommendations/rebalance")
                if recommendation is not None:
                    rebalance_seen = True
                    rec.record("rebalance-recommendation", {"recommendation": recommendation}, 5, background=True)
            if scheduled_asked is None or asked - scheduled_asked >= SCHEDULED_EVERY_S:
                scheduled_asked, scheduled = asked, aws_notice(meta.get("events/maintenance/scheduled"))
            if plan.step(scheduled, clock()):
                return
        polls += 1
        last_asked = asked
        # The trainer's log reaches the bucket about every 30 s (in the background: never delays a notice).
        if (polls * cfg.poll_interval_s) % 30 < cfg.poll_interval_s:
            _background(rec.upload_log, 5)
        sleep(cfg.poll_interval_s)


def shutdown(cfg: Config, meta: Metadata, rec: Recorder) -> None:
    """A stop of the VM: GCE runs this as the shutdown script (~30 s before power-off on Spot); on AWS
    it is the stop hook unit's ExecStop."""
    rec.identify()
    if exists(cfg.state("notice")):
        # The watcher saw the notice and records the preemption once the trainer has stopped; if it
        # was stopped before it could, this path records it, with the notice's details.
        wait_trainer(cfg, cfg.stop_budget_s)
        preempted_once(cfg, rec, notice_details(cfg))
        return
    touch(cfg.state("shutdown"))
    if finished(cfg) or exists(cfg.state("powered-off")):
        log(cfg, "stop after the command ended on its own (the VM powers itself off): nothing to record")
        return
    if cfg.cloud == "gcp":
        value = (meta.get("instance/preempted") or "unknown").strip()
        if value == "TRUE":
            # Through the watcher's notice path (one claim): `preemption-notice`, the trainer's
            # budget, then `preempted` once, whichever path claimed the notice.
            notice(cfg, rec, ["source=shutdown-script", "preempted=TRUE"])
            if not exists(cfg.state("preempted-recorded")):  # the watcher claimed it first: wait for its record
                wait_trainer(cfg, cfg.stop_budget_s)
                preempted_once(cfg, rec, notice_details(cfg))
        elif exists(cfg.state("maintenance")):
            _maintenance_stop(cfg, rec, {"preempted": value})
        else:
            stop(cfg, rec, "stopped", {"preempted": value})
        return
    action = meta.get("spot/instance-action")
    if action is not None:
        notice(cfg, rec, ["source=stop-hook", "instance_action=" + action])
        if not exists(cfg.state("preempted-recorded")):  # the watcher claimed it first: wait for its record
            wait_trainer(cfg, cfg.stop_budget_s)
            preempted_once(cfg, rec, notice_details(cfg))
    elif exists(cfg.state("maintenance")):
        _maintenance_stop(cfg, rec, {"source": "stop-hook"})
    else:
        stop(cfg, rec, "stopped", {"source": "stop-hook"})


def _maintenance_stop(cfg: Config, rec: Recorder, details: dict) -> None:
    """The VM stops after a maintenance notice: recorded once, by the watcher (at its planned time)
    or here (the VM went first)."""
    if maintenance.claim(cfg):
        stop(cfg, rec, "stopped", dict(details, reason="host-maintenance"))
    else:
        log(cfg, "stopped for the host maintenance already (recorded)")
        wait_trainer(cfg, cfg.stop_budget_s)
        rec.wait()
