"""The watcher loop: hold the stack's lease, then every ``interval`` observe -> decide -> act, one job
at a time, and acknowledge queue/subscription messages only once what they said is handled."""

from __future__ import annotations

import contextlib
import random
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from cli.lifecycle import stackfile
from cli.lifecycle.apply import Applier
from cli.lifecycle.bucketevents import BucketEvents
from cli.lifecycle.events import Event
from cli.pools.record import Republisher
from cli.watch import act as acting
from cli.watch import decide as deciding
from cli.watch import lease as leasing
from cli.watch import observe as observing
from cli.watch.journal import Journal, Lease
from infra.config import ConfigError


@dataclass
class Settings:
    ref: stackfile.StackRef
    sources: observing.Sources
    applier: Applier | None
    interval_s: float = 5.0
    poll_every_s: float = 300.0
    once: bool = False
    lease_wait_s: float = 0.0
    shared: Any = None  # the stack file's sync session (cli.lifecycle.sync.Shared): its bucket holds the lease
    # The pools' side of the cloud (cli.cloud.pool_cloud): the recorded demand is published again every minute.
    pools_for: Callable[[Any], Any] | None = None


@dataclass
class Report:
    """What the watcher tells the user: one record per action or note (the command prints them)."""

    emit: Callable[[dict[str, Any]], None]
    warn: Callable[[str], None]
    out: Callable[[str], None]  # pulumi's output
    results: list[acting.Result] = field(default_factory=list)


def run(settings: Settings, report: Report, *, cloud_for: Callable[[Any], Any],
        now: Callable[[], datetime] = lambda: datetime.now(UTC), rng: random.Random | None = None,
        sleep: Callable[[float], None] = time.sleep, cycles: int | None = None,
        monotonic: Callable[[], float] = time.monotonic) -> bool:
    """Watch until interrupted (or one cycle with ``once``); True when every action succeeded.
    ``monotonic`` is the clock the bucket lease judges expiry by (``cli.watch.lease``).

    Raises:
        LeaseHeld: another watcher holds the stack (after ``lease_wait_s``), on this machine (the local
            lock) or, when the stack file is shared, anywhere (the lease in the event bucket).
        LeaseLost: the bucket lease was taken or could not be renewed in time; nothing more was done.
    """
    rng = rng or random.Random()
    if settings.shared is not None:
        settings.shared.strict = True  # never act on a file that may be stale: hold back instead (``cycle``)
    lease = Lease(settings.ref.path, now)
    lease.acquire(settings.lease_wait_s)
    fence: leasing.BucketLease | None = None
    ok = True
    last_poll: datetime | None = None
    bucket_cache = BucketEvents(settings.ref.name)
    republisher = Republisher()
    try:
        fence = bucket_lease(settings, lease, report, now, sleep, monotonic=monotonic)
        n = 0
        while True:
            if fence is not None:
                fence.check()  # renewed every cycle; a lost lease stops the watcher before it decides
            elif n and settings.shared is not None:  # the bucket could not be reached: take the lease once it can
                fence = bucket_lease(settings, lease, report, now, sleep, quiet=True, monotonic=monotonic)
            t = now()
            poll_due = last_poll is None or (t - last_poll).total_seconds() >= settings.poll_every_s
            ok = cycle(settings, report, cloud_for, t, rng, poll_due, None, bucket_cache, fence, republisher) and ok
            if settings.shared is not None:
                settings.shared.retry()  # unreachable for this cycle only: the next one asks again
            last_poll = t if poll_due else last_poll
            n += 1
            if settings.once or (cycles is not None and n >= cycles):
                return ok
            sleep(settings.interval_s)
    finally:
        if fence is not None:
            fence.release()
        lease.release()


def bucket_lease(settings: Settings, local: Lease, report: Report, now: Callable[[], datetime],
                 sleep: Callable[[float], None], quiet: bool = False,
                 monotonic: Callable[[], float] = time.monotonic) -> leasing.BucketLease | None:
    """Take the stack's lease in the shared copy's bucket (``cli.watch.lease``), or None when the stack
    file is not shared or the bucket cannot be reached (one warning unless ``quiet``; the shared copy
    counts as unreachable for this cycle, whose actions wait: ``cycle``)."""
    from cli.cloud import CloudError

    shared = settings.shared
    if shared is None or shared.offline is not None:
        return None
    where = shared.url(leasing.watch_lease(settings.ref.name))
    fence = leasing.BucketLease(shared.cloud, shared.bucket, settings.ref.name, settings.ref.path.name, now,
                                leasing.term_for(settings.interval_s), where, local.predecessor(), monotonic=monotonic)
    local.record(fence.me.id)  # before the bucket is written: a kill -9 right after still leaves the id here
    try:
        fence.acquire(settings.lease_wait_s, sleep, report.out)
    except CloudError as exc:
        shared.offline = str(exc)  # the shared copy is in the same bucket: one warning for both
        if not quiet:
            report.warn(f"{shared.where()} and the watch lease {where} cannot be reached ({exc}): no job is acted on "
                        f"until they can (tried again every cycle; only this machine's lock keeps watchers apart meanwhile)")
        return None
    return fence


def cycle(settings: Settings, report: Report, cloud_for, now: datetime, rng: random.Random, poll_due: bool,
          choose=None, bucket_cache: BucketEvents | None = None, fence: leasing.BucketLease | None = None,
          republisher: Republisher | None = None) -> bool:
    """One observe -> decide -> act pass over the stack; True when every action succeeded. With a
    ``fence`` (the bucket lease) every action first checks the lease is still this watcher's, and it is
    kept renewed while the action runs. ``choose`` picks a resumed job's capacity; None: the stack's
    chooser, the one ``resume`` uses (``cli.lifecycle.capacity.stack_capacity``).

    Raises:
        LeaseLost: the lease is no longer this watcher's: the remaining actions are not taken.
    """
    ref = settings.ref
    stale = None  # why the shared copy could not be pulled: the file here may be stale, so no action
    try:
        try:
            stackfile.pull_shared(ref.path)  # jobs and edits made elsewhere (a laptop, CI) reach the watcher
        except stackfile.SharedCopyUnreachable as exc:
            stale = str(exc)
        # An edit awaiting its question's answer (here or in another spotctl on this machine) may be
        # undone: the events of the attempt it replaces would look stale and be marked handled for good.
        # Looked at before and after the load: an answer given in between leaves the load's copy stale.
        asking = {stackfile.proposed_job(ref.path)}
        cfg = stackfile.load(ref)
        asking = {job for job in asking | {stackfile.proposed_job(ref.path)} if job is not None}
    except ConfigError as exc:
        report.warn(str(exc))
        return False
    if choose is None:  # as `resume` chooses: the job's policy, what `policy fit` learned, the stack's prices
        from cli.lifecycle.capacity import stack_capacity

        choose = stack_capacity(ref.path, ref.name, cfg, now=lambda: now)
    journal = Journal.load(ref.path)
    cloud = cloud_for(cfg)
    # Both clouds' watcher identities may publish exactly this (infra/aws_watcher.py PublishPoolDemand,
    # infra/gcp_watcher.py POOL_DEMAND_PERMISSIONS).
    if republisher is not None and cfg.pools and settings.sources.bucket:
        from cli.cloud import pool_cloud

        pools = settings.pools_for(cfg) if settings.pools_for else pool_cloud(cfg, ref.name)
        for pool, demand in republisher.run(cfg, ref.name, cloud, pools, settings.sources.bucket, now, report.warn):
            report.emit({"pool": pool, "action": "publish", "metrics": demand.metrics(), "reason": demand.reason,
                         "time": now.isoformat()})
    seen = observing.observe(cloud, cfg, ref.name, settings.sources, now, poll_due=poll_due,
                             handled=set(journal.handled), warn=report.warn, bucket_cache=bucket_cache)
    jobs = [job for job in cfg.jobs if not asking or (job.id not in asking and "" not in asking)]
    for job in sorted(asking):
        report.emit({"job": job or "*", "action": "record", "kind": "held", "attempt": None, "time": now.isoformat(),
                     "reason": "an edit of the stack file awaits its question's answer: decided once it is answered"})
    decisions, ok = deciding.Decisions(), True
    memory, handled = journal.memory(), set(journal.handled)
    in_zone = zone_failover(list(cfg.zones), choose)

    def failover(job, _events, memo, at):  # the capacity is chosen on the job's whole history, as `resume` does
        return in_zone(job, seen.history(job.id), memo, at)

    where = zone_choice(ref, cfg, seen, choose, memory)
    for job in jobs:
        try:
            one = deciding.decide([job], seen.events, memory, handled, now, failover, where)
        except Exception as exc:  # noqa: BLE001 - one job's data must not stop the watcher for every job
            report.warn(f"job {job.id}: not decided this cycle ({_crash(exc)}); the other jobs go on")
            ok = False
            continue
        decisions.actions += one.actions
        decisions.notes += one.notes
    for note in decisions.notes:
        if note.kind in ("notice", "stale"):
            report.emit({"job": note.job, "action": "record", "kind": note.kind, "attempt": note.attempt, "reason": note.reason,
                         "time": now.isoformat()})
            journal.handle(note.ids, now)
    if decisions.notes:
        journal.save(now)
    if stale is not None and decisions.actions:  # observed and journaled notes, but nothing that changes the stack
        jobs = ", ".join(dict.fromkeys(a.job for a in decisions.actions))
        report.warn(f"{stale}: {len(decisions.actions)} action(s) held back ({jobs}) rather than taken on a stack file "
                    "that may be stale; tried again next cycle")
        decisions.actions.clear()
        ok = False
    for action in decisions.actions:
        events: list[Event] = seen.history(action.job)
        if fence is not None:
            fence.check()
        try:
            with fence.kept() if fence is not None else contextlib.nullcontext():
                result = acting.act(ref, action, events, journal, applier=settings.applier, choose=choose, now=now, rng=rng,
                                    out=report.out, inventory=lambda c: cloud.inventory())
        except leasing.LeaseHeld:
            raise
        except Exception as exc:  # noqa: BLE001 - as a crash of this job's action alone: its intent, if written, is reapplied
            report.warn(f"job {action.job}: {action.kind} stopped ({_crash(exc)}); the other jobs go on")
            ok = False
            continue
        report.results.append(result)
        ok = ok and result.ok
        record = {"job": action.job, "action": action.kind, "attempt": action.attempt, "reason": action.reason,
                  "result": result.status, "fields": result.fields, "time": now.isoformat()}
        if result.next_try:
            record["next_try"] = result.next_try.isoformat()
        if result.detail and result.detail != action.reason:
            record["detail"] = result.detail
        report.emit(record)
    _acknowledge(cloud, settings.sources, seen.acks, set(journal.handled), report.warn)
    return ok


def _crash(exc: BaseException) -> str:
    """One line for an unexpected exception: its type and first line."""
    text = str(exc).splitlines()[0] if str(exc) else ""
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


def zone_failover(zones: list[str], choose) -> deciding.Failover:
    """The decide step's zone failover: the lifecycle's measured view of the job, its policy's
    choice in place, and the journal's refusals (``cli.lifecycle.capacity.decide_zone_failover``)."""
    from cli.lifecycle.capacity import decide_zone_failover

    def failover(job, events: list[Event], memory: deciding.JobMemory, now: datetime):
        return decide_zone_failover(
            job, events, zones=zones, refused=memory.refused, refusals=memory.refusals, refused_since=memory.refused_since,
            next_wait_h=deciding.mean_backoff(memory.tries + 1).total_seconds() / 3600, in_place=lambda: choose(job, events), now=now)

    return failover


def zone_choice(ref, cfg, seen, choose, memory: dict | None = None) -> deciding.ZoneChoice:
    """The decide step's zone choice after a preemption (``cli.lifecycle.zonechoice.decide_zone``):
    every job's whole history and the pools' events with the stack's learned history, as ``resume``
    reads them (a cycle itself reads only current attempts), the job's policy's choice in place, and
    every job's capacity refusals per zone (``memory``: the journal's)."""
    from cli.lifecycle.capacity import job_price_ratio, learned_path, read_learned
    from cli.lifecycle.zonechoice import decide_zone
    from cli.watch.journal import capacity_refusals

    learned = read_learned(learned_path(ref.path, ref.name))
    refused = capacity_refusals(cfg.jobs, memory or {})

    def where(job, now: datetime):
        events = {p.name: seen.recorded(p.name) for p in cfg.pools} | {j.id: seen.history(j.id) for j in cfg.jobs}
        return decide_zone(cfg, job, events, now, job_price_ratio(cfg, job),
                           in_place=lambda: choose(job, events.get(job.id, [])), learned=learned,
                           refused=refused)

    return where


def _acknowledge(cloud, sources: observing.Sources, acks: list[observing.Ack], handled: set[str], warn) -> None:
    """Delete the messages whose every event is handled (a crash before this only means they come
    back, and their ids are already in the journal)."""
    done = [a for a in acks if not a.keep and all(i in handled for i in a.ids)]
    from cli.cloud import CloudError

    for channel, url, fn in (("queue", sources.queue_url, "queue_delete"), ("subscription", sources.subscription, "subscription_ack")):
        ids = [a.ack for a in done if a.channel == channel]
        if ids and url:
            try:
                getattr(cloud, fn)(url, ids)
            except CloudError as exc:
                warn(f"{channel} {url}: acknowledging {len(ids)} message(s): {exc}")
    kept = [a.ack for a in acks if a.keep and a.channel == "queue"]
    if kept and sources.queue_url:
        try:  # a notice whose VM still runs: read it again next cycle
            cloud.queue_release(sources.queue_url, kept)
        except CloudError as exc:
            warn(f"queue {sources.queue_url}: {exc}")
