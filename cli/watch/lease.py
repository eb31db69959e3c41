"""The stack's watch lease in its event bucket: one watcher per stack across machines.

The local lease (``journal.Lease``, an OS lock beside the stack file) keeps two watchers of one checkout
apart; a laptop's ``spotctl watch`` and the watcher VM's have different checkouts. So when the stack
file is shared (``cli.lifecycle.sync``) the watcher also holds ``<stack>.spotctl/watch.lease``
(``infra.naming.watch_lease``) in the same bucket: beside the shared copy, never under the expiring
``<stack>/`` prefix. The object is a small JSON document naming the holder (a random id, host, pid,
since when) and until when it holds the stack (``expires``).

- **Taken** when there is none, or it expired, or it was released: a conditional write (S3 ``If-Match``
  / ``If-None-Match``, GCS ``ifGenerationMatch``, through ``cli.cloud.Cloud.write_object``) on the
  version read, so of two watchers racing for an expired lease exactly one wins.
- **Renewed** at every cycle, before every action and every ``term / 3`` while an action runs
  (``kept``), by a conditional write on the holder's own last version: it succeeds only if nobody took
  the lease since, so a successful renewal proves the lease is still this watcher's.
- **Expiry is judged on each watcher's own monotonic clock, never by comparing two machines' wall
  clocks** (which may be minutes apart): a taker takes another's lease only after seeing the same
  version of it unchanged for a full term (the longer of its own and the holder's ``term_s``) by its
  own monotonic clock; the holder stays valid only for ``term - SKEW`` after the start of its last
  successful renewal by its own monotonic clock. Any version the taker saw was written after that
  renewal started, so the holder stops before the taker may take, whatever the wall clocks say. The
  ``expires`` stamp is for people (and says when a taker should start watching: a lease whose stamp
  looks expired is watched for a term, even by ``--once``, instead of refused).
- **Fencing**: a holder acts only while its lease is valid as above; one that lost it or could not
  renew in time stops acting (``LeaseLost``). The action's stack-file push is a conditional write
  anyway (``sync.Shared.push``).
- **Term** (``term_for``): 3 x the cycle interval, at least 60 s. Renewed every cycle, so two missed
  renewals (a slow bucket, a slow cycle) are survived; 60 s keeps a crashed holder's lease short
  (takeover within a minute) while being far above a bucket round trip and typical clock skew.
- A watcher restarted on the same checkout and host after its predecessor died (the local OS lock
  proves no process of this checkout holds it any more; the predecessor's pid is gone) takes the lease
  at once instead of waiting for it to expire: the id is kept in the local holder file.
- Unreachable at the start (offline, no credentials): the caller warns once and the local lock alone
  keeps watchers apart, as without sharing.

The decision (``decide``) is pure; the I/O is ``cli.cloud.Cloud``'s; the clock is injected.
"""

from __future__ import annotations

import contextlib
import json
import os
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass, replace
from datetime import UTC, datetime, timedelta
from typing import Any

from cli.cloud import CloudError, PreconditionFailed
from cli.lifecycle.stackfile import pid_alive
from cli.watch.journal import LeaseHeld, LeaseLost, Predecessor, read_holder
from infra.basics import WATCH_INTERVAL_MAX_S, loads_bounded
from infra.naming import watch_lease

VERSION = 1
TERM_MIN = timedelta(seconds=60)
TERM_CYCLES = 3
# A holder stops acting this long before a term has passed since its last renewal began (its own
# monotonic clock): room for the action already under way to reach its conditional write, and for
# two monotonic clocks' rates to differ (parts per million).
SKEW = timedelta(seconds=10)
TAKE_TRIES = 3
# The longest term a spotctl lease claims (that of the longest `watch --interval`): a taker watches an
# unchanged lease for the holder's term, so a claim beyond this (no spotctl wrote it) would keep
# `watch --once` waiting for ever; such a document is not a lease.
TERM_MAX = timedelta(seconds=TERM_CYCLES * WATCH_INTERVAL_MAX_S)
LEASE_LIMIT = 64 << 10  # bytes of a lease document read (spotctl writes ~300)
PID_MAX = 1 << 22  # Linux's PID_MAX_LIMIT (proc(5), /proc/sys/kernel/pid_max); macOS's is lower


def term_for(interval_s: float) -> timedelta:
    """How long one renewal holds the stack: ``TERM_CYCLES`` cycles, at least ``TERM_MIN``."""
    return min(TERM_MAX, max(TERM_MIN, timedelta(seconds=TERM_CYCLES * interval_s)))


@dataclass(frozen=True)
class Holder:
    """The lease document: who holds the stack and until when."""

    id: str
    host: str
    pid: int
    started: datetime
    expires: datetime
    released: bool = False
    term_s: float = 0.0  # the holder's term: a taker watches an unchanged version at least this long

    def dump(self) -> bytes:
        doc = {**asdict(self), "started": self.started.isoformat(), "expires": self.expires.isoformat(), "version": VERSION,
               "holder": f"spotctl watch {self.pid}@{self.host}"}
        return (json.dumps(doc, sort_keys=True) + "\n").encode()

    @classmethod
    def parse(cls, data: bytes) -> Holder | None:
        """The document, or None when it is not one (then it can be taken, as if there were none): also
        one whose term is not a number of seconds up to ``TERM_MAX`` or whose pid no system gives.
        A time without a zone is UTC (spotctl writes UTC with its zone)."""
        try:
            doc = loads_bounded(data, LEASE_LIMIT)
            held = cls(str(doc["id"]), str(doc["host"]), int(doc["pid"]), _aware(doc["started"]), _aware(doc["expires"]),
                       bool(doc.get("released", False)), float(doc.get("term_s", 0.0)))
        except (ValueError, KeyError, TypeError, AttributeError, OverflowError):
            return None
        if not (0 <= held.term_s <= TERM_MAX.total_seconds() and 0 <= held.pid <= PID_MAX):  # NaN fails too
            return None
        return held

    def describe(self) -> str:
        return f"spotctl watch {self.pid}@{self.host} (pid {self.pid} on {self.host}, since {self.started.isoformat()})"


def _aware(value: Any) -> datetime:
    t = datetime.fromisoformat(value)  # TypeError unless a str
    return t if t.tzinfo is not None else t.replace(tzinfo=UTC)


def decide(current: Holder | None, me: Holder, predecessor: Predecessor | None, unchanged_s: float,
           term: timedelta, now: datetime, alive: Callable[[int], bool]) -> str:
    """What to do with the lease as read: "renew" (it is mine), "take" (none, released, this checkout's
    dead predecessor's, or the same version seen unchanged for ``unchanged_s`` >= a full term by this
    watcher's own monotonic clock), "lapsing" (another's whose stamp looks expired by this machine's
    clock: worth watching for a term) or "held" (another watcher's)."""
    if current is None:
        return "take"
    if current.id == me.id:
        return "renew"
    if current.released:
        return "take"
    if (predecessor is not None and (current.id, current.host, current.pid) == (predecessor.id, predecessor.host, predecessor.pid)
            and current.host == me.host and not alive(current.pid)):
        return "take"
    if unchanged_s >= max(term.total_seconds(), current.term_s):
        return "take"
    return "lapsing" if current.expires <= now else "held"


class BucketLease:
    """This watcher's hold on ``<stack>.spotctl/watch.lease`` in ``bucket`` (see the module docstring)."""

    def __init__(self, cloud: Any, bucket: str, stack: str, stack_file: str, now: Callable[[], datetime], term: timedelta,
                 where: str, predecessor: Predecessor | None = None, host: str | None = None, pid: int | None = None,
                 alive: Callable[[int], bool] = pid_alive, monotonic: Callable[[], float] = time.monotonic):
        self.cloud, self.bucket, self.key = cloud, bucket, watch_lease(stack)
        self.stack_file, self.now, self.term, self.where = stack_file, now, term, where
        self.predecessor, self.alive, self.mono = predecessor, alive, monotonic
        import secrets
        import socket

        t = now()
        self.me = Holder(secrets.token_hex(8), host or socket.gethostname(), os.getpid() if pid is None else pid, t, t)
        self.generation: str | None = None
        self.held = False
        self.renewed_at = 0.0  # monotonic: when the last successful write (take or renewal) began
        self.watching: tuple[str | None, float] | None = None  # (version, first seen at) of another's lease
        self.lapsing = False  # the last try_take saw another's lease whose stamp looks expired
        self._mutex = threading.Lock()

    def _read(self) -> tuple[Holder | None, str | None]:
        got = self.cloud.read_object(self.bucket, self.key)
        return (None, None) if got is None else (Holder.parse(got[0]), got[1])

    def _write(self, expected: str | None, doc: Holder) -> None:
        began = self.mono()  # before the write: any version a taker sees was written after this
        self.generation = self.cloud.write_object(self.bucket, self.key, doc.dump(), expected)
        self.me, self.held, self.renewed_at = doc, not doc.released, began

    def _unchanged_for(self, generation: str | None) -> float:
        """How long this watcher has seen another's lease at ``generation``, by its own monotonic clock."""
        if self.watching is None or self.watching[0] != generation:
            self.watching = (generation, self.mono())
        return self.mono() - self.watching[1]

    def _left(self) -> float:
        """Seconds this holder may still act, by its own monotonic clock."""
        return self.renewed_at + (self.term - SKEW).total_seconds() - self.mono()

    def message(self, other: Holder) -> str:
        return (f"stack {self.stack_file}: watched by {other.describe()} until {other.expires.isoformat()} "
                f"(lease {self.where})")

    def try_take(self) -> Holder | None:
        """Take (or renew) the lease; None when it is now this watcher's, else the holder.

        Raises:
            CloudError: the bucket cannot be reached.
            LeaseHeld: every try lost a race to other writers.
        """
        with self._mutex:
            for _ in range(TAKE_TRIES):
                current, generation = self._read()
                now = self.now()
                verdict = decide(current, self.me, self.predecessor, self._unchanged_for(generation), self.term, now, self.alive)
                self.lapsing = verdict == "lapsing"
                if verdict in ("held", "lapsing"):
                    assert current is not None
                    return current
                try:
                    self._write(generation, replace(self.me, expires=now + self.term, released=False,
                                                    term_s=self.term.total_seconds()))
                    return None
                except PreconditionFailed:
                    continue  # another watcher wrote it meanwhile: read again
            current, _ = self._read()
            if current is None:  # written and gone again every time: contention, not an unreachable bucket
                raise LeaseHeld(f"stack {self.stack_file}: lease {self.where} kept changing ({TAKE_TRIES} tries): run it again")
            return current

    def acquire(self, wait_s: float, sleep: Callable[[float], None], say: Callable[[str], None]) -> None:
        """Take the lease, waiting up to ``wait_s`` (0: not at all) for its holder to stop or lapse.

        Raises:
            LeaseHeld: another watcher still holds it (the message names it and until when).
            CloudError: the bucket cannot be reached.
        """
        deadline = self.mono() + wait_s
        told = None
        while True:
            other = self.try_take()
            if other is None:
                return
            now = self.mono()
            assert self.watching is not None
            if self.lapsing:  # its stamp looks expired: watch it for a full term, even without --wait
                deadline = max(deadline, self.watching[1] + max(self.term.total_seconds(), other.term_s) + 0.05)
            if now >= deadline:
                raise LeaseHeld(self.message(other))
            if told != other.id:
                say(f"{self.message(other)}: waiting up to {deadline - now:.0f} s")
                told = other.id
            # Look again soon (it may be released or renewed), never past the deadline.
            sleep(max(0.05, min(deadline - now, 5.0)))

    def valid(self) -> bool:
        """Whether this watcher may act now: it holds the lease and it is not about to expire."""
        return self.held and self._left() > 0

    def renew(self) -> None:
        """Renew the lease (a conditional write on this watcher's last version); an unreachable bucket is
        tolerated while the lease is still valid.

        Raises:
            LeaseLost: another watcher took it, or it could not be renewed before it (nearly) expired.
        """
        with self._mutex:
            if not self.held:
                raise LeaseLost(f"stack {self.stack_file}: this watcher no longer holds {self.where}: stopped acting")
            for _ in range(2):
                try:
                    self._write(self.generation, replace(self.me, expires=self.now() + self.term,
                                                         term_s=self.term.total_seconds()))
                    return
                except PreconditionFailed:
                    other, generation = None, None
                    with contextlib.suppress(CloudError):
                        other, generation = self._read()
                    if (other is not None and other.id == self.me.id and not other.released
                            and generation != self.generation):
                        # Our own earlier renewal, applied though its reply was lost (a timeout): nobody
                        # else writes our id, so the lease is still ours at this newer version.
                        self.generation = generation
                        continue
                    self.held = False
                    who = f"watched by {other.describe()} until {other.expires.isoformat()}" if other else "taken or removed"
                    raise LeaseLost(f"stack {self.stack_file}: lease {self.where} lost ({who}): stopped acting") from None
                except CloudError as exc:
                    if self._left() > 0:
                        return  # the next renewal may reach it; until then the lease is still this watcher's
                    self.held = False
                    raise LeaseLost(f"stack {self.stack_file}: lease {self.where} could not be renewed before "
                                    f"{self.me.expires.isoformat()} ({exc}): stopped acting") from None
            self.held = False
            raise LeaseLost(f"stack {self.stack_file}: lease {self.where} kept changing under this watcher: stopped acting")

    def check(self) -> None:
        """Before an action: renew, and refuse to act on a lease that is not (still) valid.

        Raises:
            LeaseLost: see ``renew``.
        """
        self.renew()
        if not self.valid():
            self.held = False
            raise LeaseLost(f"stack {self.stack_file}: lease {self.where} expired at {self.me.expires.isoformat()} "
                            "before it could be renewed: stopped acting")

    @contextlib.contextmanager
    def kept(self, every_s: float | None = None) -> Iterator[None]:
        """Renew every ``every_s`` (default: a third of the term) while the block runs (a pulumi update
        can outlast the term); a failed renewal is left for the next ``check`` to report."""
        every = self.term.total_seconds() / 3 if every_s is None else every_s
        stop = threading.Event()

        def loop() -> None:
            while not stop.wait(every):
                with contextlib.suppress(LeaseLost):
                    self.renew()

        keeper = threading.Thread(target=loop, name="spotctl-lease-keeper", daemon=True)
        keeper.start()
        try:
            yield
        finally:
            stop.set()
            keeper.join()

    def release(self) -> None:
        """Mark the lease released (so the next watcher takes it at once), only if it is still this
        watcher's; nothing is deleted (the watcher's identity may only write the object)."""
        with self._mutex:
            if not self.held:
                return
            with contextlib.suppress(CloudError):  # a lost race or no bucket: it expires on its own
                self._write(self.generation, replace(self.me, expires=self.now(), released=True))
            self.held = False


def watcher_line(stack_file: Any, now: datetime, shared: Any = None, host: str | None = None,
                 alive: Callable[[int], bool] = pid_alive) -> str | None:
    """Who watches the stack, for ``spotctl status``: the bucket lease when the file is shared
    (``shared``: its ``cli.lifecycle.sync.Shared`` session), else this checkout's holder file; None
    when no watcher ever ran here. Only reads: taking the OS lock to test it could turn away a
    watcher starting at that moment."""
    import socket


    if shared is not None:
        key = watch_lease(shared.ref.name)
        try:
            got = shared.cloud.read_object(shared.bucket, key)
        except CloudError as exc:
            return f"watcher: unknown ({shared.url(key)} could not be read: {exc})"
        lease = Holder.parse(got[0]) if got else None
        if lease is not None:
            who = lease.describe()
            if lease.released:
                return f"watcher: none (the last, {who}, released the lease at {lease.expires.isoformat()})"
            if lease.expires > now:
                return f"watcher: {who}, lease renewed until {lease.expires.isoformat()}"
            return (f"watcher: none renewing ({who} last held the lease until {lease.expires.isoformat()}; "
                    "the next `spotctl watch` takes it once it has seen it unchanged for a term)")
        if got is not None:
            return f"watcher: unknown ({shared.url(key)} is not a lease document: the next `spotctl watch` replaces it)"
    doc = read_holder(stack_file)
    try:
        pid, where, since = int(doc["pid"]), str(doc["host"]), str(doc["since"])
    except (ValueError, KeyError, TypeError):
        return None if shared is None else "watcher: none has held the lease"
    who = f"spotctl watch {pid}@{where} (since {since})"
    if where != (host or socket.gethostname()):
        return f"watcher: {who} last ran on this checkout from another host"
    return f"watcher: {who}" if alive(pid) else f"watcher: none running on this checkout (the last, {who}, exited)"
