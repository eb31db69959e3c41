"""Reading a stack's event bucket by what is new: each node folder of an attempt
(``<stack>/<job>/attempt-N/node-K/``) is listed from a cursor, and what was parsed lives in the
durable cache (:mod:`cli.lifecycle.eventstore`), so a read costs what arrived since the last one.

The scripts name an event object ``<time>-<event>.json`` with the VM's UTC time
(``spotctl_record`` in templates/common/lib.sh.j2, ``agent/schema.py`` on the agent), so one node
folder's keys sort by time. A listing starts ``WINDOW`` before the newest key read there: an upload
retried for a while (``SPOTCTL_RECORD_BUDGET_S``) still lands inside it; keys already read are not
downloaded again. The folders are listed with the ``/`` delimiter, so the trainer's log chunks
(``node-K/logs/<offset>.log``) come back as one folder name and are never listed here."""

from __future__ import annotations

import re
from collections.abc import Callable, Container, Iterable, Mapping
from datetime import datetime, timedelta
from pathlib import Path

from cli.lifecycle.direvents import dir_events
from cli.lifecycle.events import EVENT_OBJECT_LIMIT, Event, _AnyJob, plausible, vouched
from cli.lifecycle.eventstore import EventStore

WINDOW = timedelta(minutes=10)
_KEY_TIME = re.compile(r"(\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d)")
_ATTEMPT = re.compile(r"attempt-(\d+)/")


def start_after(cursor: str | None, folder: str) -> str | None:
    """Where a node folder's next listing starts: ``WINDOW`` before the cursor key's time; a folder
    whose newest name carries no time is listed whole (the scripts never write one)."""
    m = _KEY_TIME.match(cursor[len(folder):]) if cursor else None
    if m is None:
        return None
    return folder + (datetime.fromisoformat(m[1]) - WINDOW).strftime("%Y-%m-%dT%H:%M:%S")


class BucketEvents:
    """A stack's event objects, each downloaded and parsed once per generation and kept in the
    durable cache (shared by every spotctl process on this machine). An expired object stays in the
    cache: a job's history never shrinks. One over ``EVENT_OBJECT_LIMIT`` is never downloaded."""

    def __init__(self, stack: str, store_path=None):
        self.stack = stack
        self.store_path = store_path
        self.stores: dict[str, EventStore] = {}
        self.told: set[str] = set()  # keys warned of (too large, an implausible time): once each per process
        self.requests = 0  # listings made (what the bench and the tests count)
        self.fresh: set[str] = set()  # keys parsed by this reader (a straggler of an ended attempt is seen once)

    def store(self, bucket: str) -> EventStore:
        if bucket not in self.stores:
            self.stores[bucket] = EventStore(f"bucket:{bucket}", self.store_path)
        return self.stores[bucket]

    def read(self, cloud, bucket: str, prefix: str, warn: Callable[[str], None] | None = None,
             attempts: Mapping[str, int] | None = None) -> None:
        """Read what is new under ``prefix`` (``<stack>/``, ``<stack>/<job>/`` or an attempt's folder)
        through ``cloud`` (a ``cli.cloud.Cloud``: CloudError). ``attempts`` (job -> current attempt):
        only these jobs, and of their older attempts only those never read before."""
        store = self.store(bucket)
        pending = [prefix]
        while pending:
            folder = pending.pop()
            depth = folder.count("/")  # 1: the stack, 2: a job, 3: an attempt, 4: a node
            node_level = depth == 4  # <stack>/<job>/attempt-N/node-K/
            cursor = store.cursor(folder) if node_level else None
            after = start_after(cursor, folder)
            known = store.generations(folder, after or folder) if node_level else {}
            self.requests += 1
            listed, folders = cloud.stored_since(bucket, folder, after, ".json", known, EVENT_OBJECT_LIMIT)
            if node_level:
                self._take(store, folder, listed, cursor, warn)
                continue  # deeper folders (the log chunks) are not events
            for sub in folders:
                name = sub[len(folder):-1]
                if depth == 1 and attempts is not None and name not in attempts:
                    continue
                if depth == 2 and attempts is not None and (m := _ATTEMPT.fullmatch(name + "/")) \
                        and int(m[1]) < attempts.get(sub.split("/")[1], 0) and store.cursor(f"{sub}node-0/") is not None:
                    continue  # an older attempt already read: its VMs are gone
                pending.append(sub)

    def _take(self, store: EventStore, folder: str, listed, cursor: str | None, warn) -> None:
        rows = []
        for o in listed:
            if o.data is not None:
                found = vouched({o.key: o.data}, _AnyJob(), self.stack, warn, bucket=True)
                rows.append((o.key, o.generation, found[0][1] if found else None))
            elif o.size > EVENT_OBJECT_LIMIT and store.generations(o.key).get(o.key) != o.generation:
                rows.append((o.key, o.generation, None))
                if warn is not None:
                    warn(f"event {o.key}: skipped unread: {o.size} bytes, over the {EVENT_OBJECT_LIMIT >> 20} MiB "
                         "an event object may be (the scripts write a few hundred)")
        self.fresh.update(k for k, _, e in rows if e is not None)
        newest = max([o.key for o in listed] + ([cursor] if cursor else []), default=None)
        # what is keyed before the next listing's start is folded as the folder grows (eventstore._fold)
        before = start_after(newest, folder) if rows else None
        store.put(rows, {folder: newest} if newest and newest != cursor else None, {folder: before} if before else None)

    def events(self, job_ids: Container[str], now: datetime | None, warn: Callable[[str], None] | None = None,
               prefix: str = "", bucket: str | None = None, attempts: Mapping[str, int] | None = None,
               older: Iterable[str] = ()) -> list[Event]:
        """The events of ``job_ids`` (an iterable of ids) read under ``prefix``, sorted by time, each with
        a time that can be true (:func:`plausible`); with ``attempts``, only from each job's current attempt
        (and of its earlier ones the kinds in ``older``)."""
        pairs = []
        for name, store in self.stores.items():
            if bucket is None or name == bucket:
                pairs += store.events(job_ids, dict(attempts) if attempts else None, prefix, older)
                if attempts:
                    pairs += [(k, e) for k, _, e in store.rows_in((k, k + "\0") for k in sorted(self.fresh) if k.startswith(prefix))
                              if e.job in job_ids and e.attempt < attempts.get(e.job, 0) and e.event not in older]
        self.fresh.clear()  # (a long-running watcher's reader: each once)
        return plausible(pairs, now, warn, self.told)


def recorded(cloud, job_id: str, events_dir: Path | None, bucket: str | None,
             warn: Callable[[str], None] | None = None, now: datetime | None = None) -> list[Event]:
    """A job's events from ``events_dir`` and/or the stack's event bucket (objects ``<stack>/<job>/``),
    sorted by time, each only if its key vouches for it and its time can be true (:func:`keyed_events`,
    :class:`cli.lifecycle.bucketevents.BucketEvents`; ``warn`` hears of the others). ``cloud`` is the stack's ``cli.cloud.Cloud``;
    its failures raise CloudError."""
    found = dir_events(events_dir, {job_id}, cloud.stack, warn, now)
    if bucket:
        parsed = BucketEvents(cloud.stack)
        parsed.read(cloud, bucket, f"{cloud.stack}/{job_id}/", warn)
        found += parsed.events({job_id}, now, warn)
    return sorted(found, key=lambda e: (e.time, e.attempt, e.node))


def recorded_jobs(cloud, stack: str, attempts: Mapping[str, int], events_dir: Path | None, bucket: str | None,
                  warn: Callable[[str], None] | None = None, now: datetime | None = None) -> dict[str, list[Event]]:
    """:func:`recorded` of every job of ``attempts`` (job -> current attempt) at once: the directory
    read and the bucket listed once for all of them, not once per job."""
    found: dict[str, list[Event]] = {j: [] for j in attempts}
    for e in dir_events(events_dir, set(attempts), stack, warn, now):
        found[e.job].append(e)
    if bucket:
        parsed = BucketEvents(stack)
        parsed.read(cloud, bucket, f"{stack}/", warn, attempts=attempts)
        for e in parsed.events(set(attempts), now, warn, bucket=bucket):
            found[e.job].append(e)
    return {j: sorted(evs, key=lambda e: (e.time, e.attempt, e.node)) for j, evs in found.items()}
