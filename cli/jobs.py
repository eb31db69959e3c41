"""Job operations behind resume/failover/complete: observe (stack file + recorded events), decide
(``cli.lifecycle``), act (edit the stack file atomically under its lock, then a targeted update)."""

from __future__ import annotations

import contextlib
import json
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from cli import stackfile
from cli.apply import Applier, ApplyError, job_urns
from cli.lifecycle import Change, Event
from infra.config import Capacity, ConfigError, Job, StackConfig

DEFAULT_CHANGEOVER_H = 0.2
DEFAULT_PRICE_RATIO = 3.0
TICK_H = 1 / 6


def load_events(source: Path | None, job_id: str) -> list[Event]:
    """Recorded events of a job from a directory (the bucket synced locally, or a job disk's
    ``.spotctl/events.jsonl``): every ``*.json``/``*.jsonl`` below it, sorted by time."""
    if source is None:
        return []
    files = [source] if source.is_file() else sorted(p for p in source.rglob("*") if p.suffix in (".json", ".jsonl"))
    events = []
    for path in files:
        for line in path.read_bytes().decode(errors="replace").split("\n"):
            if not line.strip():
                continue
            try:
                doc = json.loads(line)
                if doc.get("job") == job_id:
                    events.append(Event.parse(doc))
            except (ValueError, KeyError, TypeError):
                continue  # not an event: skip, never fail a resume on a stray file
    return sorted(events, key=lambda e: (e.time, e.attempt, e.node))


def load_bucket_events(cloud: str, region: str, bucket: str, stack: str, job_id: str) -> list[Event]:
    """A job's events straight from the stack's event bucket (objects ``<stack>/<job>/...json``).

    AWS: boto3 (endpoint and credentials from the environment). GCP: the GCS JSON API with
    application-default credentials, or anonymously at SPOTCTL_GCS_ENDPOINT (private endpoints, tests).
    """
    import os
    import urllib.parse

    prefix = f"{stack}/{job_id}/"
    docs: list[Any] = []
    if cloud == "aws":
        import boto3

        s3 = boto3.client("s3", region_name=region)
        for page in s3.get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=prefix):
            for obj in page.get("Contents", []):
                docs.append(s3.get_object(Bucket=bucket, Key=obj["Key"])["Body"].read())
    else:
        endpoint = os.environ.get("SPOTCTL_GCS_ENDPOINT")
        if endpoint:
            import requests

            session: Any = requests.Session()
        else:
            import google.auth
            from google.auth.transport.requests import AuthorizedSession

            credentials, _ = google.auth.default(scopes=["https://www.googleapis.com/auth/devstorage.read_only"])
            session, endpoint = AuthorizedSession(credentials), "https://storage.googleapis.com"
        base = f"{endpoint}/storage/v1/b/{urllib.parse.quote(bucket, safe='')}/o"
        token = None
        while True:
            params = {"prefix": prefix, **({"pageToken": token} if token else {})}
            listing = session.get(base, params=params, timeout=30)
            listing.raise_for_status()
            body = listing.json()
            for item in body.get("items", []):
                got = session.get(f"{base}/{urllib.parse.quote(item['name'], safe='')}", params={"alt": "media"}, timeout=30)
                got.raise_for_status()
                docs.append(got.content)
            token = body.get("nextPageToken")
            if not token:
                break
    events = []
    for raw in docs:
        try:
            doc = json.loads(raw)
            if doc.get("job") == job_id:
                events.append(Event.parse(doc))
        except (ValueError, KeyError, TypeError):
            continue
    return sorted(events, key=lambda e: (e.time, e.attempt, e.node))


# ---- the live policy path ---------------------------------------------------------------------------


@dataclass(frozen=True)
class Timeline:
    """What a job's events say about its past: running intervals and the gaps between them."""

    first_start: datetime | None
    runs: list[tuple[datetime, datetime, str]]  # (start, end, how it ended)

    @classmethod
    def of(cls, events: Iterable[Event], now: datetime) -> Timeline:
        by_attempt: dict[int, list[Event]] = {}
        for e in events:
            by_attempt.setdefault(e.attempt, []).append(e)
        runs = []
        for attempt in sorted(by_attempt):
            evs = by_attempt[attempt]
            starts = [e.time for e in evs if e.event == "started"]
            if not starts:
                continue
            ends = [e for e in evs if e.event in ("preempted", "stopped", "failed", "completed")]
            end = min(ends, key=lambda e: e.time) if ends else None
            runs.append((min(starts), end.time if end else now, end.event if end else "running"))
        return cls(runs[0][0] if runs else None, runs)


def observation_for(job: Job, events: list[Event], now: datetime, changeover_h: float = DEFAULT_CHANGEOVER_H,
                    price_ratio: float = DEFAULT_PRICE_RATIO):
    """The policy's view of a job about to be resumed, and the availability history to replay."""
    from cli.policy import IDLE, Observation

    tl = Timeline.of(events, now)
    start = tl.first_start or now
    hours = lambda a, b: max(0.0, (b - a).total_seconds() / 3600)  # noqa: E731
    progress = sum(hours(a, b) for a, b, _ in tl.runs)
    history: list[bool] = []
    cursor = start
    for a, b, _ in tl.runs:
        history += [False] * int(hours(cursor, a) / TICK_H)
        history += [True] * int(hours(a, b) / TICK_H)
        cursor = b
    history += [False] * int(hours(cursor, now) / TICK_H)
    obs = Observation(
        elapsed_h=hours(start, now), progress_h=progress, job_h=job.job_hours or 0.0,
        deadline_h=job.deadline_hours or 0.0, changeover_h=changeover_h, price_ratio=price_ratio, current=IDLE,
        spot_available=True, preemptions=sum(how == "preempted" for _, _, how in tl.runs), tick_h=TICK_H,
    )
    return obs, history


def policy_capacity(now: Callable[[], datetime] = lambda: datetime.now(UTC)):
    """A CapacityChooser that asks the job's policy (see cli/policy.py), replaying its history."""
    from cli.policy import ON_DEMAND, Observation, make_policy

    def choose(job: Job, events: list[Event]) -> Capacity:
        if not job.job_hours or not job.deadline_hours:
            return Capacity.SPOT  # without jobHours and deadlineHours no policy can weigh a deadline
        obs, history = observation_for(job, events, now())
        policy = make_policy(job.policy)
        for i, available in enumerate(history):
            t = i * TICK_H
            policy.decide(Observation(
                elapsed_h=t, progress_h=min(obs.progress_h, t), job_h=obs.job_h, deadline_h=obs.deadline_h,
                changeover_h=obs.changeover_h, price_ratio=obs.price_ratio, current="idle",
                spot_available=available, preemptions=0, tick_h=TICK_H,
            ))
        return Capacity.ON_DEMAND if policy.decide(obs) == ON_DEMAND else Capacity.SPOT

    return choose


# ---- act ----------------------------------------------------------------------------------------------


@dataclass
class Outcome:
    change: Change
    config: StackConfig
    applied: bool


def change_job(ref: stackfile.StackRef, job_id: str, decide: Callable[[Job], Change], *,
               applier: Applier | None, out: Callable[[str], None] = print) -> Outcome:
    """Decide on the job as the stack file has it *under the lock*, write the change, then apply.

    With ``applier`` None the file is only edited (--no-apply). If the update cannot start, the
    edit is undone (only the keys it set), so the file again matches what runs in the cloud.
    """
    guard = applier.exclusive(ref.path) if applier else contextlib.nullcontext()
    if applier:
        applier.preflight()
    with guard:
        holder: dict[str, Any] = {}

        def fields(current: StackConfig, written: Any) -> dict[str, Any]:
            try:
                job = current.job(job_id)
            except KeyError as exc:
                raise ConfigError(str(ref.path), [f"job {job_id}: {exc.args[0]}"]) from None
            change = decide(job)
            holder["change"] = change
            holder["before"] = {k: written.get(k, _MISSING) for k in change.fields}
            return {} if change.noop else change.fields

        old_cfg, new_cfg = stackfile.update_job(ref.path, job_id, fields)
        change: Change = holder["change"]
        if change.noop or applier is None:
            return Outcome(change, new_cfg, applied=False)
        from cli import plan as planner

        old_job = old_cfg.job(job_id)
        if _gang_restart(old_job, change):
            _stop_gang_first(ref, job_id, old_cfg, applier, holder["before"], out)
        targets = job_urns(planner.run(new_cfg, ref.name), job_id)
        try:
            applier.up(targets, out)
        except ApplyError as exc:
            if not exc.started:
                _undo(ref.path, job_id, holder["before"])
            raise
        return Outcome(change, new_cfg, applied=True)


def _gang_restart(job: Job, change: Change) -> bool:
    """A new attempt of a multi-node job whose VMs may still run (some nodes survived a preemption)."""
    return job.nodes > 1 and "attempt" in change.fields and job.state.value in ("pending", "running")


def _stop_gang_first(ref: stackfile.StackRef, job_id: str, old_cfg: StackConfig, applier: Applier,
                     before: dict[str, Any], out: Callable[[str], None]) -> None:
    """Delete every VM of the current attempt before the new one starts, so no surviving node of
    the old gang is still running when the new rendezvous begins: the job is written as stopped
    (it then declares no VMs) and a targeted update of the old attempt's resources applies that."""
    from cli import plan as planner

    old_targets = job_urns(planner.run(old_cfg, ref.name), job_id)
    final = stackfile.job_fields(ref.path, job_id, list(before))
    stackfile.update_job(ref.path, job_id, lambda current, written: {k: before[k] for k in before if before[k] is not _MISSING}
                         | {"state": "stopped"})
    out(f"job {job_id}: stopping every node of attempt {old_cfg.job(job_id).attempt} before the new attempt starts")
    try:
        applier.up(old_targets, out)
    except ApplyError as exc:
        if not exc.started:
            _undo(ref.path, job_id, before)
        raise
    stackfile.update_job(ref.path, job_id, lambda current, written: final)


class _Missing:
    pass


_MISSING = _Missing()


def _undo(path: Path, job_id: str, before: dict[str, Any]) -> None:
    if all(v is not _MISSING for v in before.values()):
        stackfile.update_job(path, job_id, lambda current, written: before)
        return

    def restore(config_map: Any, current: StackConfig) -> None:
        entry = stackfile.job_entry(config_map, job_id)
        for name, value in before.items():
            if value is _MISSING:
                entry.pop(name, None)
            else:
                entry[name] = value

    stackfile.edit(path, restore)


def event_json(e: Event) -> dict[str, Any]:
    return {"job": e.job, "attempt": e.attempt, "node": e.node, "event": e.event,
            "time": e.time.isoformat(), "details": dict(e.details)}


def job_status(job: Job, events: list[Event], now: datetime | None = None) -> dict[str, Any]:
    """A job as the stack file declares it and as its events tell it."""
    now = now or datetime.now(UTC)
    tl = Timeline.of(events, now)
    run_h = sum(max(0.0, (b - a).total_seconds() / 3600) for a, b, _ in tl.runs)
    return {
        "job": job.id,
        "state": job.state.value,
        "capacity": job.capacity.value,
        "attempt": job.attempt,
        "zone": job.zone,
        "nodes": job.nodes,
        "preemptions": sum(how == "preempted" for _, _, how in tl.runs),
        "hours_running": round(run_h, 3),
        "last_event": event_json(events[-1]) if events else None,
    }


# ---- cleanup ----------------------------------------------------------------------------------------


@dataclass
class Cleanup:
    job_id: str
    urns: list[str]
    disks: list[str]
    done: bool


def cleanup_job(ref: stackfile.StackRef, job_id: str, *, force: bool, yes: bool, applier: Applier | None,
                out: Callable[[str], None] = print) -> Cleanup:
    """Delete a completed job's disks (and drop the job from the stack): ``pulumi state unprotect``
    on its disks, remove its entry, then a targeted update deletes exactly its resources.

    Without ``yes`` nothing changes (a dry run). With ``applier`` None only the file is edited and
    the disks stay protected in Pulumi's state (the next ``pulumi up`` refuses to delete them).
    """
    from cli import plan as planner
    from cli.apply import disk_urns
    from cli.lifecycle import LifecycleError, may_delete_disks

    cfg = stackfile.load(ref)
    try:
        job = cfg.job(job_id)
    except KeyError as exc:
        raise ConfigError(str(ref.path), [f"job {job_id}: {exc.args[0]}"]) from None
    allowed, why = may_delete_disks(job, force=force, owned=True)
    if not allowed:
        raise LifecycleError(f"job {job_id}: its disks are kept because {why}")
    plan = planner.run(cfg, ref.name)
    urns, disks = job_urns(plan, job_id), disk_urns(plan, job_id)
    if not yes:
        return Cleanup(job_id, urns, disks, done=False)
    if applier:
        applier.preflight()
    guard = applier.exclusive(ref.path) if applier else contextlib.nullcontext()
    with guard:
        original = ref.path.read_text()
        stackfile.edit(ref.path, lambda config, current: stackfile.remove_job(config, job_id))
        if applier is None:
            return Cleanup(job_id, urns, disks, done=True)
        try:
            applier.unprotect(disks)
            applier.up(urns, out)
        except ApplyError as exc:
            if not exc.started:
                _restore_if_unchanged(ref.path, original, job_id)
            raise
    return Cleanup(job_id, urns, disks, done=True)


def _restore_if_unchanged(path: Path, original: str, job_id: str) -> None:
    """Put the removed job back (the whole original file, when nothing else changed it since)."""
    with stackfile.locked(path):
        current = stackfile.read_config(path)
        if not any(isinstance(j, dict) and j.get("id") == job_id for j in current.get(stackfile.key("jobs")) or []):
            stackfile.atomic_write(path, original)


def cloud_events(vms, job: Job, now: datetime) -> list[Event]:
    """What the cloud says, as events: a preempted (or stopped) VM of the current attempt."""
    out = []
    for vm in vms:
        if vm.attempt != job.attempt:
            continue
        if vm.preempted:
            out.append(Event(job.id, vm.attempt, vm.node, "preempted", now, {"source": "cloud", "reason": vm.reason}))
        elif vm.status.lower() in ("terminated", "stopped", "stopping", "shutting-down"):
            out.append(Event(job.id, vm.attempt, vm.node, "stopped", now, {"source": "cloud", "reason": vm.reason}))
    return out
