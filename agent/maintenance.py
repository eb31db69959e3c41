"""Host maintenance that stops the VM with notice: keep training through the notice, checkpoint just
before the stop, record ``stopped`` with reason ``host-maintenance`` (the CLI resumes the job; a gang's
failures then are the maintenance's, cli/lifecycle/states.py ``maintained``) and power off.

GCE: the metadata value ``instance/maintenance-event`` turns TERMINATE_ON_HOST_MAINTENANCE when the VM
is scheduled to stop, and "Compute Engine gives GPU VMs a 1-hour stopping notice, while normal VMs
receive only a 60-second notice" (https://cloud.google.com/compute/docs/gpus/gpu-host-maintenance).
EC2: scheduled events in the instance metadata (``events/maintenance/scheduled``: a JSON list of
{Code, NotBefore, NotAfter, State, ...}, times as "21 Jan 2019 09:00:43 GMT",
https://docs.aws.amazon.com/AWSEC2/latest/UserGuide/monitoring-instances-status-check_sched.html,
"View scheduled events", instance metadata); codes per API_InstanceStatusEvent. A rebalance
recommendation is not one: the instance may never be interrupted (agent/watch.py records it only).
Contract row gcp.gpu-maintenance-notice.
"""

from __future__ import annotations

import calendar
import json
import os
import time
from typing import Optional

from agent.config import Config
from agent.events import Recorder
from agent.stop import stop
from agent.util import log, touch

GCP_EVENTS = ("TERMINATE_ON_HOST_MAINTENANCE", "SHUTDOWN_ON_HOST_MAINTENANCE")
# The codes after which the instance is stopped or rebooted: the trainer goes either way.
# system-maintenance ("might be temporarily affected by network maintenance or power maintenance")
# may leave it running: not acted on.
AWS_STOPPING_CODES = ("instance-stop", "instance-retirement", "instance-reboot", "system-reboot")
AWS_TIME = "%d %b %Y %H:%M:%S GMT"
# What is recorded ahead of the checkpoint: the notice (so the CLI knows a gang's coming failures are
# the maintenance's) is recorded at most this long before the trainer is stopped: GCE's GPU notice.
ANNOUNCE_S = 3600.0
# After the trainer's budget: its last lines, the checkpoint's flush and the `stopped` record
# (agent/stop.py ``stop``), and one poll's uncertainty of when the notice appeared.
UPLOAD_LEAD_S = 30.0


class Notice:
    """A stop the cloud announced: what (``event``) and when the VM goes (``stop_at``, epoch s)."""

    def __init__(self, event: str, stop_at: float):
        self.event, self.stop_at = event, stop_at

    def signal_at(self, cfg: Config) -> float:
        """When the trainer gets its SIGTERM: its budget and the uploads before the stop."""
        return self.stop_at - (cfg.stop_budget_s + UPLOAD_LEAD_S + cfg.poll_interval_s)

    def details(self) -> dict:
        return {"maintenance_event": self.event, "stop_at": _iso(self.stop_at)}


def _iso(t: float) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(t))


def gcp_notice(value: Optional[str], seen_after: float, notice_s: float) -> Optional[Notice]:
    """The notice in ``maintenance-event`` (None: none). It appeared after ``seen_after`` (the last
    look that saw none), so the stop comes ``notice_s`` after that at the earliest."""
    event = (value or "").strip()
    return Notice(event, seen_after + notice_s) if event in GCP_EVENTS else None


def aws_notice(body: Optional[str]) -> Optional[Notice]:
    """The earliest active stopping event in ``events/maintenance/scheduled`` (None: none, or not
    readable: the next poll asks again)."""
    try:
        events = json.loads(body or "[]")
    except ValueError:
        return None
    found = []
    for e in events if isinstance(events, list) else []:
        if not isinstance(e, dict) or e.get("Code") not in AWS_STOPPING_CODES or e.get("State", "active") != "active":
            continue
        try:
            found.append(Notice(str(e["Code"]), float(calendar.timegm(time.strptime(str(e["NotBefore"]), AWS_TIME)))))
        except (KeyError, ValueError):
            continue
    return min(found, key=lambda n: n.stop_at) if found else None


class Plan:
    """The watcher's part: announce a notice once, stop the trainer at its time. ``step`` is called at
    every poll with what the metadata says now; it returns True once the VM's work is stopped."""

    def __init__(self, cfg: Config, rec: Recorder):
        self.cfg, self.rec = cfg, rec
        self.notice: Optional[Notice] = None
        self.announced = False

    def step(self, seen: Optional[Notice], now: float) -> bool:
        if seen is None:
            if self.notice is not None and not self.announced:
                log(self.cfg, "the scheduled %s is no longer announced" % self.notice.event)
                self.notice = None
            return False  # once announced, the plan holds (GCE's value may go back to NONE as the VM stops)
        if self.notice is None or not self.announced:
            self.notice = seen  # AWS: a rescheduled event moves the plan
        at = self.notice.signal_at(self.cfg)
        if not self.announced and now >= at - ANNOUNCE_S:
            self.announced = True
            touch(self.cfg.state("maintenance"))
            log(self.cfg, "host maintenance (%s): the trainer is stopped at %s" % (self.notice.event, _iso(at)))
            self.rec.record("maintenance-notice", dict(self.notice.details(), checkpoint_at=_iso(at)), 5,
                            background=True)
        if self.announced and now >= at:
            stop_for_maintenance(self.cfg, self.rec, self.notice.details())
            return True
        return False


def claim(cfg: Config) -> bool:
    """The first path to stop the trainer for the maintenance (this one, or the stop path if the VM
    goes first) records it; the other finds it claimed."""
    try:
        os.close(os.open(cfg.state("maintenance-stop"), os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644))
    except FileExistsError:
        return False
    return True


def stop_for_maintenance(cfg: Config, rec: Recorder, details: dict) -> None:
    """Checkpoint (SIGTERM within the trainer's budget), record `stopped`, and power the VM off: the
    GPUs are not paid for while the maintenance comes, and the CLI resumes the job elsewhere."""
    from agent.run import power_off

    if not claim(cfg):
        return
    stop(cfg, rec, "stopped", dict(details, reason="host-maintenance"))
    power_off(cfg)
