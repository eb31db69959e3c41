"""How a drill preempts one attempt, as its cloud would: GCP flips ``preempted`` and runs the shutdown
script at once; AWS posts the spot interruption notice, which the VM's watcher finds at its next poll,
and terminates the instance at the notice's time."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from cli.drill.emulator import Emulator
from cli.drill.localvm import LocalVM
from infra.render import NOTICE_S

# The events after which nothing more comes of a notice in this attempt: the agent recorded the
# preemption, or the attempt ended on its own. A command that finishes as the notice comes gets no
# `preempted` (agent/stop.py: "notice after the job completed", "the job completed as the notice
# came"): its `completed` follows instead.
SETTLING = ("preempted", "completed", "failed")
POLL_S = 0.05


def settled(events: Iterable[Mapping[str, Any]], attempt: int) -> str | None:
    """The event that ended ``attempt``'s notice (None while its agent is still at it). Only this
    attempt's: the job disk's event log holds every earlier attempt's `preempted` too."""
    for e in events:
        if e.get("attempt") == attempt and e.get("event") in SETTLING:
            return str(e["event"])
    return None


def notice_ahead(cloud: str, poll_interval_s: float, interval: float) -> float:
    """How long before the preemption time the drill posts the cloud's notice. AWS's watcher looks
    for it once per poll: posted one poll ahead, the trainer is signaled by that time, as GCE's
    shutdown script signals it at once (posted at the time itself it came up to a poll late, and a
    command that ended within that poll was never preempted). At most half the interval: the
    command gets to run before its notice."""
    return min(float(poll_interval_s), interval / 2) if cloud == "aws" else 0.0


def preempt(emu: Emulator, vm: LocalVM, time_scale: float = 1.0,
            clock: Callable[[], float] = time.monotonic, sleep: Callable[[float], None] = time.sleep) -> str | None:
    """Preempt ``vm``'s attempt; returns the event that settled it (None: none came in time)."""
    attempt = vm.ctx.attempt
    if vm.ctx.cloud == "gcp":
        emu.preempt_gcp()
        vm.shutdown(timeout=NOTICE_S["gcp"] + 5)  # GCE runs the shutdown script, then powers off
        return settled(vm.events(), attempt)
    lead = NOTICE_S["aws"] / time_scale
    emu.notice_aws(lead_s=lead)
    # The instance is terminated at the notice's time: the wait ends then at the latest, and as soon
    # as nothing more can come of the notice: its `preempted`, or the attempt's own end (waiting for
    # a `preempted` alone sat out the whole lead when the command completed as the notice came), or
    # no agent process left to record anything.
    end = clock() + lead
    while (ended := settled(vm.events(), attempt)) is None and clock() < end:
        if not vm.alive("run.pid") and not vm.alive("watch.pid"):
            break
        sleep(POLL_S)
    vm.shutdown(timeout=NOTICE_S["aws"] + 5)
    return ended or settled(vm.events(), attempt)


def capacity_note(cloud: str, capacity: str) -> str:
    """What the drill's preemption stands for when the job does not run on spot capacity ("" on spot).
    The cloud never preempts it: EC2's interruption notice is a Spot Instance's
    (https://docs.aws.amazon.com/AWSEC2/latest/UserGuide/spot-instance-termination-notices.html), and
    Compute Engine reclaims capacity by preempting Spot VMs
    (https://cloud.google.com/compute/docs/instances/create-use-spot). It is still stopped: a host
    maintenance (infra/gcp_common.py: on-demand GPU VMs TERMINATE; EC2's scheduled events), `spotctl
    stop`, a move. Each takes the path the drill plays: one SIGTERM, the trainer's budget, a resume
    on the same disk."""
    if capacity in ("", "spot"):
        return ""
    return (f"capacity {capacity}: {cloud.upper()} never preempts it; the drill preempted it all the same,\n"
            "as a host maintenance, `spotctl stop` or a move to spot stops it (one SIGTERM)")
