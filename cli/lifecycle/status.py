"""``spotctl status``: a job as the stack file declares it and as its events tell it."""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

from cli.cost.ledger import job_ledger
from cli.lifecycle.events import Event, Timeline, cloud_events, event_json
from infra.basics import Capacity, JobState

if TYPE_CHECKING:  # the pydantic models: imported only where a stack file is validated (a short command never loads them)
    from cli.lifecycle.stackfile import StackRef
    from infra.config import Job, StackConfig


# ---- the jobs status shows, without validating a file validated before -----------------------------
# Importing the pydantic models and validating a stack file is most of a short `spotctl status`.
# What status reads of a job (JobView) is kept per job in .spotctl/<file>.status.json,
# with the sha256 of the job's lines (stackfile.job_digests): while the file is exactly one spotctl
# validated whole (its job index matches) and a job's lines are the ones cached, the cached view is
# that job's validated config. A job whose lines changed (an edit by resume) is validated alone;
# anything else reads and validates the whole file, as before. The cache is only a cache.

STATUS_CACHE_VERSION = 2
_FINGERPRINT: list[str] = []


class Record:
    """A validated model's fields as attributes (its names, its values' types), rebuilt from
    ``job_facts``: what status, the cost ledger and the watcher's view read of a job, without the
    pydantic model. Only ``Job``'s properties that status uses are provided (``active``)."""

    def __init__(self, fields: dict[str, Any]):
        self.__dict__.update(fields)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Record) and self.__dict__ == other.__dict__

    __hash__ = None  # type: ignore[assignment]


class JobView(Record):
    retired_after = 0  # (a cache written before spotctl:retiredJobs: none)

    @property
    def active(self) -> bool:
        return self.state in (JobState.PENDING, JobState.RUNNING)

    def mine(self, events: list[Any], attempt_of: Any = lambda e: e.attempt) -> list[Any]:
        from infra.basics import own_events

        return own_events(self.retired_after, events, attempt_of)


_ENUMS = {"JobState": JobState, "Capacity": Capacity}


def job_facts(job: Job) -> dict[str, Any]:
    """Every field of a validated job as JSON, tagged so ``job_view`` gives back the same values
    and types (datetimes, the config's enums, nested models, tuples); a value of another type is
    refused (ValueError), so it can never be read back as something else."""
    from pydantic import BaseModel

    def encode(value: Any) -> Any:
        if value is None or type(value) in (str, int, float, bool):
            return value
        if isinstance(value, BaseModel):
            return {"model": {name: encode(getattr(value, name)) for name in type(value).model_fields}}
        if isinstance(value, datetime):
            return {"datetime": value.isoformat()}
        if type(value).__name__ in _ENUMS and isinstance(value, _ENUMS[type(value).__name__]):
            return {"enum": type(value).__name__, "value": value.value}
        if type(value) in (list, tuple):
            return {type(value).__name__: [encode(v) for v in value]}
        if type(value) is dict:
            return {"dict": [[encode(k), encode(v)] for k, v in value.items()]}
        raise ValueError(f"cannot cache a {type(value).__name__}")

    facts = encode(job)
    if job.retired_after:  # (a private attribute: not a model field)
        facts["model"]["retired_after"] = job.retired_after
    return facts


def job_view(facts: Any, top: bool = True) -> Any:
    """The value ``job_facts`` encoded (a JobView for the job itself)."""
    if not isinstance(facts, dict):
        return facts
    if len(facts) == 2 and "enum" in facts:
        return _ENUMS[facts["enum"]](facts["value"])
    ((kind, value),) = facts.items()
    if kind == "model":
        fields = {name: job_view(v, False) if type(v) is dict else v for name, v in value.items()}  # (scalars: no call)
        return JobView(fields) if top else Record(fields)
    if kind == "datetime":
        return datetime.fromisoformat(value)
    if kind in ("list", "tuple"):
        items = [job_view(v, False) if type(v) is dict else v for v in value]
        return items if kind == "list" else tuple(items)
    if kind == "dict":
        return {job_view(k, False): job_view(v, False) for k, v in value}
    raise ValueError(f"not a cached value: {kind!r}")


def status_cache_path(path: Path) -> Path:
    """The folder of status's per-job cache of the stack file ``path``: one sealed entry per job and
    version of its lines, so ``status JOB`` reads that job's entry alone, whatever the stack's size."""
    return path.parent / ".spotctl" / f"{path.name}.status"


def _entry_name(job_id: str, digest: str) -> str:
    """A job's entry for these lines under this code (job ids hold no dot: infra.config NAME_RULE)."""
    return f"{job_id}.{digest[:32]}.{_fingerprint_tag()}.json"


def _fingerprint_tag() -> str:
    from _blake2 import blake2b

    return blake2b(_fingerprint().encode(), digest_size=6).hexdigest()


def _fingerprint() -> str:
    """The validation rules (the job index's) and this module's code: a cache made by another
    spotctl version proves nothing."""
    if not _FINGERPRINT:
        from cli.lifecycle.stackfile import _rules, code_fingerprint

        _FINGERPRINT.append(f"{_rules()}+{code_fingerprint(STATUS_CACHE_VERSION, Path(__file__))}")
    return _FINGERPRINT[0]


def _read_cache(path: Path, wanted: list[tuple[str, str]]) -> dict[str, Any]:
    """{job: cached facts} of the ``(job, digest)`` entries this user's spotctl sealed (``cli.lifecycle.cachefile``)."""
    from cli.lifecycle import cachefile
    from cli.lifecycle.stackfile import CACHE_LIMIT

    folder, out = status_cache_path(path), {}
    for job_id, digest in wanted:
        try:
            data = cachefile.read(folder / _entry_name(job_id, digest), CACHE_LIMIT)
            entry = json.loads(data) if data is not None else None
            if isinstance(entry, dict) and entry.get("fingerprint") == _fingerprint() and entry.get("job") == job_id:
                out[job_id] = entry["facts"]
        except (ValueError, KeyError, TypeError, RecursionError):
            pass
    return out


# At most this many jobs whose lines changed are validated one by one; more: the whole file once.
ALONE_MAX = 8


def status_jobs(ref: StackRef, job_id: str | None = None, whole: bool = False) -> tuple[StackConfig | None, list[Any]]:
    """The jobs ``status`` shows (all, or ``job_id``) and the stack's validated config, or None when
    the jobs came from the cache (``whole``: the config is needed, so the whole file is read).

    Raises:
        ConfigError: the stack file is not valid (named as ``stackfile.load`` names it).
        KeyError: no job ``job_id`` ("did you mean").
    """
    from cli.lifecycle import stackfile

    text = stackfile.read_text(ref.path)  # every step below reads this one text
    whole = whole or stackfile.sync_record_path(ref.path).exists()  # a shared file: status asks about its shared copy
    digests = None if whole else stackfile.job_digests(ref, text, only=job_id)
    if digests:  # (none: not indexed, or no such job: the whole file below names the error)
        cache = _read_cache(ref.path, digests)
        changed = [i for i, _ in digests if i not in cache]
        if len(changed) <= ALONE_MAX:
            fresh = {i: job_facts(stackfile.load_job(ref, i, text).job(i)) for i in changed}
            try:
                views = [job_view(fresh[i] if i in fresh else cache[i]) for i, _ in digests]
            except (ValueError, KeyError, TypeError, IndexError, AttributeError):
                views = None  # a damaged cache entry: the whole file below
            if views is not None:
                _write_cache(ref.path, [(i, d, fresh[i]) for i, d in digests if i in fresh])
                return None, views
    cfg = stackfile.load(ref, text)
    jobs = [cfg.job(job_id)] if job_id else list(cfg.jobs)
    digests = stackfile.job_digests(ref, text)  # load indexed it (when the index handles the file)
    if digests is not None:
        known = {j.id: j for j in cfg.jobs}
        _write_cache(ref.path, [(i, d, known[i]) for i, d in digests if i in known], every=True)
    return cfg, jobs


def _write_cache(path: Path, entries: list[tuple[str, str, Any]], every: bool = False) -> None:
    """Write the entries ``(job, digest, facts or the validated job)`` not on disk yet and drop the
    entries they replace (``every``: these are all the stack's jobs, and any other entry goes too)."""
    import contextlib
    import os

    from cli.lifecycle import cachefile

    folder = status_cache_path(path)
    if not entries and not every:
        return
    try:
        if not folder.parent.is_symlink():
            folder.parent.mkdir(exist_ok=True)
        present = set(os.listdir(folder)) if folder.is_dir() and not folder.is_symlink() else set()
    except OSError:
        return
    names = {_entry_name(i, d): (i, facts) for i, d, facts in entries}
    jobs = {i for i, _, _ in entries}
    for name in present - set(names):
        if every or name.split(".", 1)[0] in jobs:
            with contextlib.suppress(OSError):
                os.unlink(folder / name)
    for name, (job_id, facts) in names.items():
        if name not in present or not every:
            facts = facts if isinstance(facts, dict) else job_facts(facts)
            cachefile.write(folder / name, json.dumps({"fingerprint": _fingerprint(), "job": job_id, "facts": facts},
                                                      separators=(",", ":")).encode())


def job_status(job: Job, events: list[Event], now: datetime | None = None) -> dict[str, Any]:
    """A job as the stack file declares it and as its events tell it."""
    now = now or datetime.now(UTC)
    tl = Timeline.of(events, now)
    run_h = sum(max(0.0, (b - a).total_seconds() / 3600) for a, b, _ in tl.runs)
    # VM-hours (nodes x hours) by the capacity each attempt really ran on (its `started` event)
    ledger = job_ledger(job, events, now)
    return {
        "job": job.id,
        "state": job.state.value,
        "capacity": job.capacity.value,
        "attempt": job.attempt,
        "zone": job.zone,
        "nodes": job.nodes,
        "preemptions": sum(how == "preempted" for _, _, how in tl.runs),
        "hours_running": round(run_h, 3),
        "spot_hours": round(ledger.vm_hours(Capacity.SPOT.value), 3),
        "on_demand_hours": round(ledger.vm_hours(Capacity.ON_DEMAND.value), 3),
        "last_event": event_json(events[-1]) if events else None,
        # `spotctl move`: the move in progress (its last step written) and the zones the job left.
        "move": ({"from": job.move.from_, "to": job.move.to, "step": job.move.step}
                 | ({"held": list(job.move.held)} if job.move.held else {})
                 | ({"replica_zones": list(job.move.replica_zones)} if job.move.replica_zones else {})) if job.move else None,
        "disk_kind": job.disk_kind,
        "zone_history": [{"zone": z.zone, "last_attempt": z.last_attempt, **({"same_disk": True} if z.same_disk else {})}
                         for z in job.zone_history],
    }


# The hint `status` and `cost` give when neither --events-bucket nor --events-dir is given: the figures
# events give (preemptions, VM-hours, costs) are unknown then, never 0 (README "The job lifecycle").
NO_EVENTS = ("give --events-bucket NAME (the stack's eventBucket output, `pulumi stack output "
             "eventBucket`) or --events-dir DIR (the bucket synced locally, or a job disk's .spotctl/)")


def ended_reason(job: Job, seen: list[Event], outcome: str) -> str:
    """Why the file's running job is over by its events: its VMs powered themselves off once the
    events and the log were uploaded (agent/run.py), so nothing bills while the file catches up."""
    failed = next((e for e in reversed(seen) if e.attempt == job.attempt and e.event == "failed"), None)
    why = ""
    if failed is not None:
        why = failed.details.get("reason") or (f"exit {failed.details['exit_code']}" if failed.details.get("exit_code") else "")
    if outcome == "completed":
        then = f"`spotctl complete {job.id}` (or `spotctl watch`) records it"
    else:
        then = f"`spotctl logs {job.id}` shows why; `spotctl watch` retries it while maxFailures allows"
    return (f"attempt {job.attempt} {outcome} (its events{': ' + why if why else ''}) and its VMs powered themselves off; "
            f"the stack file still says running: {then}")


# What only a job's events tell: unknown (None, named in the row's "unknown") when no events were read.
EVENT_FIGURES = ("preemptions", "hours_running", "spot_hours", "on_demand_hours", "last_event", "attempts")


def job_report(job: Job, events: list[Event] | None, vms: list[Any] | None = None, now: datetime | None = None) -> dict[str, Any]:
    """Status merged from the stack file, the recorded events and (``vms``: ``--observe``) the
    cloud: ``status`` is what should happen next when they disagree, e.g. ``needs-resume`` for a
    job the file says is running whose current attempt the events (or the cloud) say was preempted.
    ``events`` None: no events source was read, and ``EVENT_FIGURES`` are unknown rather than 0."""
    from cli.lifecycle.states import attempt_outcome, moving_away, noticed

    now = now or datetime.now(UTC)
    unknown = events is None
    events = job.mine(list(events or []))  # an earlier job of this id's events (spotctl:retiredJobs) are not this one's
    seen = list(events) + (cloud_events(vms, job, now) if vms is not None else [])
    row = job_status(job, events, now)
    outcome = attempt_outcome(seen, job.attempt, job.nodes)
    status, reason = job.state.value, ""
    row_tail: list[str] = []
    if job.state.value in ("running", "pending") and outcome is not None and outcome.value in ("preempted", "stopped"):
        source = "the cloud" if any(e.details.get("source") == "cloud" for e in seen if e.attempt == job.attempt) else "its events"
        status, reason = "needs-resume", f"attempt {job.attempt} was {outcome.value} ({source}); run `spotctl resume {job.id}`"
    elif job.state.value == "running" and outcome is not None and outcome.value in ("failed", "completed"):
        status = f"{outcome.value}?"
        reason = ended_reason(job, seen, outcome.value)
        tail = next((e.details.get("log_tail") for e in reversed(seen)
                     if e.attempt == job.attempt and e.event == "failed" and e.details.get("log_tail")), None)
        if tail:
            row_tail = str(tail).split("\n")
    elif job.state.value == "running" and outcome is None and noticed(seen, job.attempt):
        status = "preempting"
        reason = (f"attempt {job.attempt} got a preemption notice (its events): checkpointing until its VM is gone; "
                  f"needs-resume then")
    elif (job.state.value == "running" and not unknown and outcome is None and job.applying is None
          and not any(e.attempt == job.attempt and e.event in ("started", "completed") for e in seen)):
        status = "starting"
        reason = f"attempt {job.attempt} is applied and no node has recorded `started` yet (its VMs are booting)"
    if job.state.value == "stopped" and job.stopped_by == "user" and not reason:
        reason = f"stopped by the user (`spotctl stop`); `spotctl resume {job.id}` starts attempt {job.attempt + 1} on the same disks"
    elif job.state.value == "stopped" and job.stop_reason and not reason:
        reason = f"stopped by spotctl: {job.stop_reason}"
    if moving_away(job):  # a resume is refused now (``states.moving_guard``): only the move goes on
        move = job.move
        pending = f"; its step's update has not finished ({job.applying})" if job.applying is not None else ""
        status, reason = "moving", (f"moving to {move.to}, step {move.step}{pending}: `spotctl move {job.id} --to-zone "
                                    f"{move.to}` (or `spotctl watch`) continues it")
    elif job.applying is not None and status != "needs-resume":
        again = f"spotctl {'complete' if job.state.value == 'completed' else 'resume'} {job.id}"
        status, reason = "update-pending", (f"an update of the job was started and has not finished ({job.applying}); unless a "
                                            f"spotctl is applying it now, `{again}` (or `spotctl watch`) applies it")
    row["status"], row["status_reason"] = status, reason
    if row_tail:
        row["log_tail"] = row_tail
    row["attempts"] = sorted({e.attempt for e in events if e.event == "started"})
    if unknown:
        row.update(dict.fromkeys(EVENT_FIGURES), unknown=list(EVENT_FIGURES))
    if vms is not None:
        row["cloud"] = [dict(vm.__dict__) for vm in vms]
    return row


@dataclass(frozen=True)
class Column:
    """One column of the status table: the row key it shows, its header, how a value is written."""

    key: str
    header: str
    fmt: Callable[[Any], str] = str
    justify: str = "left"

    def text(self, row: dict[str, Any]) -> str:
        if row.get(self.key) is None:
            return "?" if self.key in row.get("unknown", ()) else "-"
        return self.fmt(row[self.key])

    def width(self, rows: list[dict[str, Any]]) -> int:
        return max([len(self.header), *(len(self.text(r)) for r in rows)])


def plain(value: Any) -> str:
    """A value as a person reads it: never ``None``/``True``, a record by its main field."""
    if value is None or value == "" or value == []:
        return "-"
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, dict):
        main = value.get("action") or value.get("event") or value.get("reason")
        return str(main) if main else ", ".join(f"{k}={plain(v)}" for k, v in value.items())
    if isinstance(value, (list, tuple)):
        return ", ".join(plain(v) for v in value)
    return str(value)


def _hours(value: Any) -> str:
    return f"{value:.1f}"


def _last(value: Any) -> str:
    return f"{value['event']} (attempt {value['attempt']}, {value['time'][5:16].replace('T', ' ')})" if value else "-"


# Other parts add keys to the rows (cost: spot/on-demand hours; watch: what it waits for, its last
# action); a key listed here gets its header and format, any other plain value is shown as it is.
STATUS_COLUMNS: list[Column] = [
    Column("job", "job"),
    Column("status", "status"),
    Column("capacity", "capacity"),
    Column("attempt", "attempt", justify="right"),
    Column("zone", "zone"),
    Column("preemptions", "preempt", justify="right"),
    Column("hours_running", "hours", _hours, "right"),
    Column("spot_hours", "spot VM-h", _hours, "right"),
    Column("on_demand_hours", "on-demand VM-h", _hours, "right"),
    Column("waiting_for_capacity", "waiting", lambda v: plain(v)),
    Column("last_action", "last action", lambda v: plain(v)),
    Column("last_event", "last event", _last),
]
HIDDEN = {"state", "nodes", "status_reason", "log_tail", "attempts", "cloud", "disk_kind", "unknown"}  # shown elsewhere (or only in --json)


def table_columns(rows: list[dict[str, Any]]) -> list[Column]:
    """The columns these rows have: the known ones in order, then any other plain value."""
    keys = [k for r in rows for k in r]
    known = [c for c in STATUS_COLUMNS if c.key in keys]
    listed = {c.key for c in STATUS_COLUMNS} | HIDDEN
    extra = [Column(k, k.replace("_", " "), plain) for k in dict.fromkeys(keys)
             if k not in listed and all(isinstance(r.get(k), (str, int, float, bool, type(None))) for r in rows)]
    return known + extra


def fit_columns(rows: list[dict[str, Any]], width: int, gap: int = 2) -> tuple[list[Column], list[Column]]:
    """(columns that fit whole in ``width``, in order; the others). The job column always fits."""
    shown, rest, used = [], [], 0
    for col in table_columns(rows):
        need = col.width(rows) + (gap if shown else 0)
        if not shown or (not rest and used + need <= width):
            shown.append(col)
            used += need
        else:
            rest.append(col)
    return shown, rest
