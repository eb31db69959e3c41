"""``resume``'s zone: where the zone choice (``cli.lifecycle.zonechoice``) would run the job next,
from every job's and pool's events, the stack's recorded history and the capacity refusals the
watcher recorded, and why."""

from __future__ import annotations


def zone_decision(ref, cfg, job_id: str, events: list, events_dir, bucket, where: str, choose):
    """The zone choice for ``job_id`` (a ``ZoneDecision``), or None when it has no zone to choose."""
    from datetime import UTC, datetime

    from cli.commands import read_jobs_events, warn
    from cli.commands.hints import Unread
    from cli.lifecycle.capacity import job_price_ratio, learned_path, read_learned
    from cli.lifecycle.zonechoice import decide_zone
    from cli.watch.journal import recorded_refusals

    job = cfg.job(job_id)
    if len({job.zone, *(job.disk_replica_zones or cfg.zones)}) < 2 or not (events_dir is not None or bucket or where):
        return None  # one zone, or no events to tell zones apart
    if [j.id for j in cfg.jobs] == [job_id]:  # (a file spotctl indexed: only this job's lines were read)
        from cli.lifecycle import stackfile

        cfg = stackfile.load(ref)  # every job's zone history: where their windows were seen
    others = [j for j in cfg.jobs if j.id != job_id]
    pools = [_PoolRef(p.name) for p in getattr(cfg, "pools", None) or ()]
    try:
        # (the other jobs and the pools only: this job's events were read, and warned of, once already)
        everyone = read_jobs_events(ref, cfg, [*others, *pools], events_dir, bucket, where)
    except Unread as exc:
        warn(f"{exc}: the zone choice sees job {job_id}'s events only")
        everyone = {}
    everyone[job_id] = events  # (with what --observe added)
    # The watcher's capacity refusals per zone, read only: resume never writes the journal nor takes the lease.
    refused = recorded_refusals(ref.path, cfg.jobs)
    return decide_zone(cfg, job, everyone, datetime.now(UTC), job_price_ratio(cfg, job),
                       in_place=lambda: choose(job, events), learned=read_learned(learned_path(ref.path, ref.name)),
                       refused=refused)


class _PoolRef:
    """A pool as the event readers take a job: its events are ``<stack>/<pool>/attempt-0/...``."""

    def __init__(self, name: str):
        self.id, self.attempt = name, 0
