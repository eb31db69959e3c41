"""Recording: every event is appended to the local event log first (in order, on the job disk when it
is mounted), then uploaded with retries until its budget runs out; the trainer's log is uploaded in
chunks named by byte offset. Background uploads are threads the caller waits for before it exits."""

from __future__ import annotations

import os
import threading
import time
from typing import Mapping, Optional

from agent import schema
from agent.config import Config
from agent.imds import Metadata, identity
from agent.storage import Cloud
from agent.util import locked, log, read, write_atomic


class Recorder:
    def __init__(self, cfg: Config, meta: Metadata, cloud: Cloud):
        self.cfg, self.meta, self.cloud = cfg, meta, cloud
        self._threads: list[threading.Thread] = []
        self._ident: Optional[tuple] = None

    @property
    def ident(self) -> tuple:
        if self._ident is None:
            self._ident = identity(self.cfg, self.meta)
        return self._ident

    def identify(self) -> None:
        """Ask the metadata server who this VM is now, while it answers (events carry it)."""
        _ = self.ident

    def node_dir(self) -> str:
        c = self.cfg
        prefix = c.event_prefix or c.stack + "/"
        return schema.node_prefix(prefix, c.name, c.attempt, c.node_rank, self.ident[0] if c.kind == "pool" else "")

    def event_log(self) -> str:
        if os.path.isdir(self.cfg.disk(schema.DISK_DIR)):
            return self.cfg.disk(schema.EVENT_LOG)
        return self.cfg.state("events.jsonl")

    def record(self, event: str, details: Optional[Mapping[str, object]] = None, budget: Optional[float] = None,
               background: bool = False) -> None:
        """Record ``event`` locally, then upload it within ``budget`` seconds (default: the record budget)."""
        c = self.cfg
        at = schema.event_time()
        instance, zone = self.ident
        line = schema.event_line(c.stack, c.kind, c.name, c.attempt, c.node_rank, event, at, instance, zone, details or {})
        path = self.event_log()
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(path, "a", encoding="utf-8") as fh:
            fh.write(line + "\n")
        log(c, "event " + event)
        name = schema.event_object(self.node_dir(), at, event)
        spend = c.record_budget_s if budget is None else budget
        if background:
            thread = threading.Thread(target=self.publish, args=(name, line.encode(), spend), daemon=True)
            thread.start()
            self._threads.append(thread)
        else:
            self.publish(name, line.encode(), spend)

    def publish(self, name: str, body: bytes, budget: float) -> bool:
        """Upload one object, retrying until ``budget`` seconds have passed (5 s a try at most)."""
        deadline = time.monotonic() + budget
        tries = 0
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                break
            if self.cloud.put_once(self.cfg.event_bucket, name, body, min(5.0, left)):
                return True
            tries += 1
            time.sleep(min(backoff(tries), max(0.0, deadline - time.monotonic())))
        log(self.cfg, "event {} not uploaded within {:g}s (kept in the local event log)".format(name.rsplit("-", 1)[-1], budget))
        return False

    def wait(self, timeout: Optional[float] = None) -> None:
        """Wait for the background uploads (each ends within its own budget)."""
        end = None if timeout is None else time.monotonic() + timeout
        for thread in self._threads:
            thread.join(None if end is None else max(0.0, end - time.monotonic()))
        self._threads = [t for t in self._threads if t.is_alive()]

    # ---- the trainer's log ---------------------------------------------------------------------
    def trainer_log(self) -> str:
        return self.cfg.disk(schema.disk_log(self.cfg.attempt, self.cfg.node_rank))

    def upload_log(self, budget: float = 5.0) -> bool:
        """Upload what the trainer wrote since the last call, one upload at a time; False when the
        log's end was not reached. ``budget`` counts from when this call holds the lock: waiting out
        another upload (the watcher's, as long as its own budget) must not spend the last call's time.
        A chunk not known to be stored is sent again with the same bytes (its length is kept beside
        the offset): on GCP an object already there is taken as that chunk, so what follows must
        start where it ended."""
        with locked(self.cfg.state("log-upload.lock"), budget + 10) as got:
            return got and self._upload_chunks(time.monotonic() + budget)

    def _upload_chunks(self, deadline: float) -> bool:
        c = self.cfg
        path = self.trainer_log()
        if not os.path.isfile(path):
            return True
        offset_file = c.state("log-offset-attempt-%d-node-%d" % (c.attempt, c.node_rank))
        pending = offset_file + ".pending"
        offset = int((read(offset_file) or "0").strip() or 0)
        size = os.path.getsize(path)
        while offset < size:
            length = schema.LOG_CHUNK
            held = (read(pending) or "").split()
            if len(held) == 2 and held[0] == str(offset) and held[1].isdigit() and int(held[1]) > 0:
                length = int(held[1])
            with open(path, "rb") as fh:
                fh.seek(offset)
                chunk = fh.read(length)
            if not chunk:
                return True
            write_atomic(pending, "%d %d\n" % (offset, len(chunk)))
            name = schema.log_object(self.node_dir(), offset)
            while not self.cloud.put_once(c.event_bucket, name, chunk, min(5.0, deadline - time.monotonic()), "text/plain"):
                if deadline - time.monotonic() <= 0:
                    return False
                time.sleep(0.5)
            offset += len(chunk)
            write_atomic(offset_file, str(offset))
        return True

    # ---- checkpoints ---------------------------------------------------------------------------
    def checkpoint_event(self, step: int, at: str = "", budget: Optional[float] = None, background: bool = False) -> None:
        """A `checkpoint` event for ``step`` unless this attempt already recorded that step. The lock
        covers only claiming the step, never the upload."""
        c = self.cfg
        mark = "%d %d" % (c.attempt, step)
        with locked(c.state("checkpoint.lock"), 2) as got:
            if not got or (read(c.state("checkpoint-recorded")) or "") == mark:
                return
            write_atomic(c.state("checkpoint-recorded"), mark)
        details = {"step": str(step)}
        if at:
            details["at"] = at
        self.record("checkpoint", details, budget, background)

    def checkpoint_flush(self, budget: float = 5.0) -> None:
        """The newest checkpoint in the trainer's log, recorded if the rate limit skipped it or the
        trainer wrote it while stopping: the last checkpoint before a preemption is always an event."""
        step = last_step(self.trainer_log(), schema.CHECKPOINT_LINE)
        if step is None:
            return
        seen = (read(self.cfg.state("checkpoint-seen")) or "").split()
        at = seen[2] if len(seen) == 3 and seen[:2] == [str(self.cfg.attempt), str(step)] else ""
        self.checkpoint_event(step, at, budget)


def backoff(tries: int) -> float:
    """Seconds before try ``tries + 1``: quick at first (a stop path's budget is seconds), then doubling
    up to 15 s, so a permission that goes live after minutes is met without a request every second."""
    if tries < 10:
        return min(0.2 * tries, 0.9)
    return min(0.9 * 2 ** (tries - 9), 15.0)


def last_step(path: str, pattern) -> Optional[int]:
    """The step of the newest matching line in the log (within its last MiB)."""
    try:
        with open(path, "rb") as fh:
            fh.seek(max(0, os.path.getsize(path) - (1 << 20)))
            data = fh.read()
    except OSError:
        return None
    found = None
    for line in data.split(b"\n"):
        m = pattern.match(line)
        if m:
            found = int(m.group(1))
    return found
