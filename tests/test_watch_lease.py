"""One watcher per stack across machines: the lease in the event bucket (cli/watch/lease.py).

The pure decision, then the lease itself against moto in server mode (S3 If-Match/If-None-Match) and
the drill emulator's GCS (ifGenerationMatch) with an injected clock, then two watchers in two project
directories (a laptop and the watcher VM) on one bucket through the CLI and the watcher loop: the second
exits (or waits) naming the holder and until when; a holder killed with -9 is taken over once its lease
expired (at once by a restart on its own checkout); a watcher whose lease was taken acts no more."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import threading
import time
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from typer.testing import CliRunner

from cli.app import app
from cli.cloud import Cloud, CloudError, PreconditionFailed
from cli.watch import lease as leasing
from cli.watch.lease import BucketLease, Holder, LeaseHeld, LeaseLost, Predecessor
from infra.config import StackConfig
from tests import test_sync
from tests.test_sync import events

ROOT = Path(__file__).resolve().parent.parent
# test_sync's fixtures: bucket ``evts`` on moto in server mode; two checkouts of one project sharing it
bucket, machines = test_sync.bucket, test_sync.machines
T0 = datetime(2026, 11, 22, 9, 0, tzinfo=UTC)
TERM = timedelta(seconds=60)
KEY = "team.spotctl/Pulumi.team.yaml"
LEASE = "team.spotctl/watch.lease"



class Clock:
    """The injected clock; ``sleep`` advances it (no real waiting)."""

    def __init__(self, t: datetime = T0):
        self.t = t

    def __call__(self) -> datetime:
        return self.t

    def monotonic(self) -> float:
        """This machine's monotonic clock: the same passage of time, another origin."""
        return 1000.0 + (self.t - T0).total_seconds()

    def sleep(self, seconds: float) -> None:
        self.t += timedelta(seconds=seconds)


# ---- the decision (pure) ---------------------------------------------------------------------------------


def holder(ident: str = "a", host: str = "laptop", pid: int = 100, expires: datetime = T0 + TERM, **over) -> Holder:
    return Holder(ident, host, pid, T0, expires, **over)


@pytest.mark.parametrize(("current", "predecessor", "alive", "unchanged", "want"), [
    (None, None, True, 0, "take"),                                       # nobody holds it
    (holder(), None, True, 59, "held"),                                  # another watcher's, seen unchanged < a term
    (holder(), None, True, 60, "take"),                                  # ... a full term on my own clock
    (holder(term_s=90), None, True, 60, "held"),                         # the holder's longer term counts
    (holder(expires=T0), None, True, 0, "lapsing"),                      # its stamp says expired: watch it
    (holder(expires=T0 - timedelta(days=1)), None, True, 59, "lapsing"), # however long ago (my wall clock may be wrong)
    (holder(released=True), None, True, 0, "take"),                      # released by a watcher that stopped
    (holder("me", host="watcher"), None, True, 0, "renew"),              # my own
    (holder(host="watcher"), Predecessor("a", "watcher", 100), False, 0, "take"),  # this checkout's predecessor, dead
    (holder(host="watcher"), Predecessor("a", "watcher", 100), True, 0, "held"),   # ... still running (a pid reused)
    (holder(host="laptop"), Predecessor("a", "laptop", 100), False, 0, "held"),  # same id, another host
    (holder("b", host="watcher"), Predecessor("a", "watcher", 100), False, 0, "held"),  # not the predecessor's lease
])
def test_the_lease_is_taken_only_when_nobody_else_validly_holds_it(current, predecessor, alive, unchanged, want):
    me = Holder("me", "watcher", 200, T0, T0)
    assert leasing.decide(current, me, predecessor, unchanged, TERM, T0, lambda pid: alive) == want


def test_the_term_is_three_cycles_and_at_least_a_minute():
    assert leasing.term_for(5) == timedelta(seconds=60) and leasing.term_for(0) == timedelta(seconds=60)
    assert leasing.term_for(30) == timedelta(seconds=90)


def test_a_document_that_is_not_a_lease_counts_as_none():
    assert Holder.parse(b"not json") is None and Holder.parse(b'{"id": "x"}') is None
    doc = holder(pid=7)
    assert Holder.parse(doc.dump()) == doc
    assert json.loads(doc.dump())["holder"] == "spotctl watch 7@laptop"


class Store:
    """One object with generations, as S3 and GCS keep it (only for the property below; the real
    conditional writes are tested against moto and the emulator further down)."""

    def __init__(self):
        self.data: bytes | None = None
        self.generation = 0

    def read_object(self, bucket, key):
        return None if self.data is None else (self.data, str(self.generation))

    def write_object(self, bucket, key, data, expected):
        if expected != (None if self.data is None else str(self.generation)):
            raise PreconditionFailed("412")
        self.data, self.generation = data, self.generation + 1
        return str(self.generation)


@settings(max_examples=150, deadline=None)
@given(offsets=st.lists(st.integers(-3600, 3600), min_size=3, max_size=3),
       steps=st.lists(st.tuples(st.integers(0, 2), st.sampled_from(["take", "check", "release"]), st.integers(0, 40)),
                      max_size=40))
def test_at_most_one_watcher_may_act_at_any_time(offsets, steps):
    """Three watchers whose wall clocks differ by up to an hour (far beyond the skew margin) take, renew
    and release in any order while time passes: never do two of them consider themselves free to act at
    the same moment (each judges expiry on its own monotonic clock, whatever its origin)."""
    store, now = Store(), [T0]
    watchers = [BucketLease(store, "b", "team", "f", (lambda o=o: now[0] + timedelta(seconds=o)), TERM, "w",
                            host=f"h{i}", pid=i, monotonic=lambda o=o: 7 * o + (now[0] - T0).total_seconds())
                for i, o in enumerate(offsets)]
    for who, op, wait in steps:
        now[0] += timedelta(seconds=wait)
        w = watchers[who]
        if op == "take":
            w.try_take()
        elif op == "check":
            with contextlib.suppress(LeaseLost):
                w.check()
        else:
            w.release()
        assert sum(x.valid() for x in watchers) <= 1


def test_a_clock_15_s_fast_does_not_take_a_lease_its_holder_still_acts_on():
    """The audit's case: more skew than the margin. The taker's wall clock says the stamp expired; it
    watches that version for a full term on its own monotonic clock, and by then the holder, which
    stopped renewing, stopped acting (or renewed, and the taker starts watching again)."""
    store, t = Store(), [T0]
    mono = lambda: (t[0] - T0).total_seconds()  # noqa: E731
    a = BucketLease(store, "b", "team", "f", lambda: t[0], TERM, "w", host="vm", pid=1, monotonic=mono)
    b = BucketLease(store, "b", "team", "f", lambda: t[0] + timedelta(seconds=15), TERM, "w", host="laptop", pid=2,
                    monotonic=lambda: 500 + mono())
    assert a.try_take() is None
    t[0] += timedelta(seconds=46)  # a: 14 s left by its stamp; b's wall clock says it expired
    assert b.try_take() == a.me and b.lapsing and a.valid() and not b.valid()
    a.check()  # a renews: a new version ...
    assert b.try_take() == a.me and b.lapsing is False  # ... b starts watching it again
    t[0] += timedelta(seconds=59)
    assert b.try_take() == a.me and not a.valid()  # a stopped acting at 50 s after its renewal ...
    t[0] += timedelta(seconds=1)
    assert b.try_take() is None and b.valid() and not a.valid()  # ... and b takes only a full term after it saw it


# ---- the lease on S3 (moto server) and GCS (the drill emulator), clock injected ---------------------------


@pytest.fixture
def s3(bucket):
    cloud = Cloud(StackConfig.model_validate({"cloud": "aws", "region": "us-east-1", "zones": ["us-east-1a"]}), "team")
    return cloud, bucket


@pytest.fixture
def gcs(monkeypatch):
    from cli.drill.emulator import Emulator

    with Emulator() as emu:
        monkeypatch.setenv("SPOTCTL_GCS_ENDPOINT", emu.url)
        yield Cloud(StackConfig.model_validate({"cloud": "gcp", "project": "p", "region": "us-central1",
                                                "zones": ["us-central1-a"]}), "team"), "gcs-evts"


@pytest.fixture(params=["s3", "gcs"])
def store(request):
    return request.getfixturevalue(request.param)


def lease(store, clock, host: str, pid: int, **kw) -> BucketLease:
    cloud, name = store
    return BucketLease(cloud, name, "team", "Pulumi.team.yaml", clock, TERM, f"x://{name}/{LEASE}", host=host, pid=pid,
                       monotonic=clock.monotonic, **kw)


def stored(store) -> Holder | None:
    cloud, name = store
    got = cloud.read_object(name, LEASE)
    return None if got is None else Holder.parse(got[0])


def test_a_second_watcher_is_refused_naming_the_holder_until_the_lease_expires(store):
    clock = Clock()
    vm, laptop = lease(store, clock, "watcher", 11), lease(store, clock, "laptop", 22)
    assert vm.try_take() is None and stored(store) == vm.me and vm.valid()
    with pytest.raises(LeaseHeld) as err:
        laptop.acquire(0, clock.sleep, pytest.fail)
    until = (T0 + TERM).isoformat()
    assert str(err.value) == (f"stack Pulumi.team.yaml: watched by spotctl watch 11@watcher (pid 11 on watcher, since {T0.isoformat()}) "
                              f"until {until} (lease x://{store[1]}/{LEASE})")
    clock.sleep(30)
    vm.check()  # renewed: now until T0 + 90 s
    clock.sleep(59)
    assert laptop.try_take() == vm.me  # still held: a version it had not seen (the renewal)
    clock.sleep(59)  # the holder died without renewing (or was cut off) ...
    assert laptop.try_take() == vm.me and not vm.valid()  # ... the laptop has seen that version for 59 s only
    clock.sleep(1)  # a full term on the laptop's own clock: it lapsed, whatever the clocks' stamps say
    assert laptop.try_take() is None and stored(store).host == "laptop"
    with pytest.raises(LeaseLost, match=r"lost \(watched by spotctl watch 22@laptop .*\): stopped acting"):
        vm.check()  # the old holder finds out at its next renewal, before it acts
    assert not vm.valid()
    vm.release()  # not its lease any more: nothing is written
    assert stored(store).host == "laptop"


def test_released_leases_are_taken_at_once_and_a_race_has_one_winner(store):
    clock = Clock()
    first, second, third = (lease(store, clock, "h", pid) for pid in (1, 2, 3))
    assert first.try_take() is None
    first.release()
    assert stored(store).released
    assert second.try_take() is None  # no waiting for the expiry
    clock.sleep(120)  # second's lease expired by its stamp: third watches it for a term, then takes it
    _, name = store
    seen = store[0].read_object(name, LEASE)
    third.acquire(0, clock.sleep, lambda line: None)
    assert stored(store).id == third.me.id
    with pytest.raises(PreconditionFailed):
        store[0].write_object(name, LEASE, b"{}", seen[1])  # the loser's write on the version it read
    assert first.try_take() == third.me


def test_waiting_says_who_holds_it_once_then_takes_it_when_it_lapses(store):
    clock = Clock()
    holder_ = lease(store, clock, "watcher", 11)
    assert holder_.try_take() is None
    said: list[str] = []
    waiter = lease(store, clock, "laptop", 22)
    waiter.acquire(600, clock.sleep, said.append)
    assert len(said) == 1 and said[0].startswith("stack Pulumi.team.yaml: watched by spotctl watch 11@watcher")
    assert said[0].endswith(": waiting up to 600 s")
    assert clock.t >= T0 + TERM and stored(store).host == "laptop"
    short = lease(store, clock, "ci", 33)
    with pytest.raises(LeaseHeld, match="watched by spotctl watch 22@laptop"):
        short.acquire(20, clock.sleep, said.append)  # gives up at its deadline


class Offline(Cloud):
    """The bucket cut off (after ``after`` calls)."""

    def __init__(self, inner: Cloud, after: int = 0):
        super().__init__(inner.cfg, inner.stack)
        self.inner, self.calls, self.after = inner, 0, after

    def _gate(self):
        self.calls += 1
        if self.calls > self.after:
            raise CloudError("cannot ask the cloud: EndpointConnectionError")

    def read_object(self, bucket, key):
        self._gate()
        return self.inner.read_object(bucket, key)

    def write_object(self, bucket, key, data, expected):
        self._gate()
        return self.inner.write_object(bucket, key, data, expected)


def test_a_holder_that_cannot_renew_stops_acting_before_its_lease_expires(s3):
    clock = Clock()
    cloud, name = s3
    cut = Offline(cloud, after=2)  # the take's read and write reach it; nothing after
    fence = BucketLease(cut, name, "team", "Pulumi.team.yaml", clock, TERM, "w", host="watcher", pid=1, monotonic=clock.monotonic)
    assert fence.try_take() is None
    clock.sleep(40)
    fence.check()  # unreachable, but still 20 s to go (more than the skew margin): it may act
    clock.sleep(10)  # 10 s left: inside the margin another machine's clock may already call it expired
    with pytest.raises(LeaseLost, match="could not be renewed before"):
        fence.check()
    with pytest.raises(LeaseLost):
        fence.check()  # and it stays lost


def test_a_renewal_applied_though_its_reply_was_lost_keeps_the_lease(store):
    """The server applied the write, the reply timed out: the next renewal's precondition fails on the
    holder's own newer version. It re-reads, finds its own id, and carries on (nobody else touched it)."""

    class Lossy:
        drop = False

        def __init__(self, cloud):
            self.cloud = cloud

        def read_object(self, bucket, key):
            return self.cloud.read_object(bucket, key)

        def write_object(self, bucket, key, data, expected):
            gen = self.cloud.write_object(bucket, key, data, expected)
            if Lossy.drop:
                Lossy.drop = False
                raise CloudError("read timeout")  # applied by the server, the reply lost
            return gen

    cloud, name = store
    clock = Clock()
    mine = lease((Lossy(cloud), name), clock, "watcher", 1)
    assert mine.try_take() is None
    clock.sleep(5)
    Lossy.drop = True
    mine.check()  # tolerated: still valid
    clock.sleep(5)
    mine.check()  # precondition failed on its own version: re-read, still its own
    assert mine.valid() and stored(store).id == mine.me.id
    assert stored(store).expires == T0 + timedelta(seconds=10) + TERM  # renewed for real at the second check
    # someone else's write is still a loss
    other = lease(store, clock, "laptop", 2)
    cloud.write_object(name, LEASE, replace(other.me, expires=T0 + timedelta(hours=1)).dump(), mine.generation)
    with pytest.raises(LeaseLost, match="lost"):
        mine.check()


def test_the_keeper_renews_while_a_long_action_runs(s3):
    clock = Clock()
    fence = lease(s3, clock, "watcher", 1)
    assert fence.try_take() is None
    renewed = threading.Event()
    real = fence._write

    def spy(expected, doc):
        real(expected, doc)
        renewed.set()

    fence._write = spy
    clock.sleep(50)  # the action runs long (the clock has moved on when the keeper renews)
    with fence.kept(every_s=0.01):
        assert renewed.wait(30), "the keeper never renewed"
    assert stored(s3).expires == fence.me.expires >= T0 + timedelta(seconds=110)


# ---- two watchers, two checkouts, one bucket ---------------------------------------------------------------


def spawn_watch(home: Path, *args: str, bucket_name: str = "evts") -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "cli", "watch", "--stack", "team", "--no-poll", "--no-apply",
                             "--events-bucket", bucket_name, *args], cwd=home, env={**os.environ, "PYTHONPATH": str(ROOT)},
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, start_new_session=True)


def wait_for(predicate, what: str, timeout: float = 90.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.05)


def kill_9(proc: subprocess.Popen) -> None:
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()
    proc.stderr.close()


def the_lease() -> Holder | None:
    import boto3

    try:
        return Holder.parse(boto3.client("s3", region_name="us-east-1").get_object(Bucket="evts", Key=LEASE)["Body"].read())
    except Exception:
        return None


def attempt_of(home: Path) -> int:
    from cli.lifecycle import stackfile

    return stackfile.load(stackfile.StackRef("team", home / "stacks" / "Pulumi.team.yaml")).job("train").attempt


def synced(machines, name: str) -> Path:
    """Checkout ``name`` made the working directory and synced with bucket evts; its project directory."""
    home = machines(name).parent.parent
    assert CliRunner().invoke(app, ["sync", "--stack", "team", "--events-bucket", "evts"]).exit_code == 0
    return home


def test_a_watcher_on_another_machine_is_refused_then_takes_over_after_a_kill_9(machines, runner, tmp_path):
    laptop = synced(machines, "laptop")
    vm = synced(machines, "watcher")
    # --interval 20: a 60 s term (the minimum). The taker below watches the dead holder's lease for that
    # holder's whole term, one bucket read per 5 s of the injected clock (3600 made it a 3 h term: 2,160 reads).
    first = spawn_watch(vm, "--interval", "20")
    try:
        wait_for(lambda: (the_lease() or holder(pid=-1)).pid == first.pid, "the VM watcher's lease")
        machines("laptop")
        seen = events(tmp_path / "ev.jsonl", ("train", 3, "preempted", 30))
        result = runner.invoke(app, ["watch", "--stack", "team", "--once", "--no-poll", "--no-apply", "--json",
                                     "--events-bucket", "evts", "--events-dir", str(seen)])
        assert result.exit_code == 1, result.output
        taken = the_lease()
        assert result.stderr.endswith(
            f"error: stack Pulumi.team.yaml: watched by spotctl watch {first.pid}@{taken.host} (pid {first.pid} on "
            f"{taken.host}, since {taken.started.isoformat()}) until {taken.expires.isoformat()} (lease s3://evts/{LEASE})\n")
        assert result.stdout == "" and attempt_of(laptop) == 3  # refused before anything was decided
        shown = runner.invoke(app, ["status", "--stack", "team"])  # the laptop's status names the VM's watcher
        assert shown.exit_code == 0, shown.output
        # (status wraps the line at the terminal's width)
        assert flat(shown.stdout).endswith(f"watcher: {taken.describe()}, lease renewed until {taken.expires.isoformat()}")
    finally:
        kill_9(first)
    # Killed: its lease is still valid (another machine cannot know it died) ...
    again = runner.invoke(app, ["watch", "--stack", "team", "--once", "--no-poll", "--no-apply", "--events-bucket", "evts"])
    assert again.exit_code == 1 and f"watched by spotctl watch {first.pid}@" in again.stderr
    # ... until it expires: the laptop's watcher then takes it and acts.
    from cli.watch import observe, watcher

    later = Clock(the_lease().expires + timedelta(seconds=1))
    acted: list[dict] = []
    report = watcher.Report(emit=acted.append, warn=pytest.fail, out=lambda line: None)
    assert run_watcher(laptop, report, later, observe.Sources(seen, None, None, None, poll=False))
    assert [(a["job"], a["action"], a["result"]) for a in acted] == [("train", "resume", "written")]
    assert the_lease().released  # it stopped: the next watcher need not wait
    assert attempt_of(laptop) == 4
    shown = runner.invoke(app, ["status", "--stack", "team"])
    assert shown.exit_code == 0 and flat(shown.stdout).endswith(
        f"watcher: none (the last, {the_lease().describe()}, released the lease at {the_lease().expires.isoformat()})")


def run_watcher(home: Path, report, clock: Clock, sources, sleep=None, **kw) -> bool:
    """The laptop's watcher loop, in process with the injected clock (as ``spotctl watch --once``)."""
    from cli.commands import cloud_for
    from cli.lifecycle import stackfile, sync
    from cli.watch import watcher

    ref = stackfile.StackRef("team", home / "stacks" / "Pulumi.team.yaml")
    cfg = stackfile.load(ref)
    shared = sync.Shared(ref, cloud_for(cfg, ref), "evts", report.warn)
    settings = watcher.Settings(ref, sources, None, 5.0, 300.0, once=kw.pop("once", True), shared=shared)
    with stackfile.sharing(ref.path, shared):
        return watcher.run(settings, report, cloud_for=lambda c: cloud_for(c, ref), now=clock, sleep=sleep or clock.sleep,
                           monotonic=clock.monotonic, **kw)


def test_a_restart_on_the_same_checkout_takes_its_dead_predecessors_lease_at_once(machines, runner):
    vm = synced(machines, "watcher")
    first = spawn_watch(vm, "--interval", "3600")
    try:
        wait_for(lambda: (the_lease() or holder(pid=-1)).pid == first.pid, "the watcher's lease")
    finally:
        kill_9(first)
    result = runner.invoke(app, ["watch", "--stack", "team", "--once", "--no-poll", "--no-apply", "--events-bucket", "evts"])
    assert result.exit_code == 0, result.output  # no waiting for the killed watcher's lease to expire
    assert the_lease().released and the_lease().pid == os.getpid()


def test_a_watcher_whose_lease_was_taken_acts_no_more(machines, runner, tmp_path):
    from cli.watch import observe, watcher

    laptop = synced(machines, "laptop")
    seen = tmp_path / "ev.jsonl"
    seen.write_text("")
    clock = Clock(datetime.now(UTC))
    acted: list[dict] = []
    report = watcher.Report(emit=acted.append, warn=pytest.fail, out=lambda line: None)

    def stalled(seconds: float) -> None:
        """Between two cycles the laptop stalls (suspended) past its lease; the VM takes the stack, and
        a preemption arrives that the VM, not the laptop, must handle."""
        clock.sleep(TERM.total_seconds() + 1)
        cloud = Cloud(StackConfig.model_validate({"cloud": "aws", "region": "us-east-1", "zones": ["us-east-1a"]}), "team")
        assert BucketLease(cloud, "evts", "team", "Pulumi.team.yaml", clock, TERM, "watcher", host="watcher", pid=9, monotonic=clock.monotonic).acquire(0, clock.sleep, lambda line: None) is None  # watched for a term, then taken
        events(seen, ("train", 3, "preempted", 30))

    with pytest.raises(LeaseLost) as err:
        run_watcher(laptop, report, clock, observe.Sources(seen, None, None, None, poll=False), once=False,
                    cycles=2, sleep=stalled)
    assert "lost (watched by spotctl watch 9@watcher" in str(err.value)
    assert acted == [] and attempt_of(laptop) == 3  # the laptop decided nothing on the new event
    assert the_lease().host == "watcher"  # and its release did not touch the VM's lease


def test_not_shared_or_unreachable_is_todays_local_lock(machines, runner, monkeypatch):
    machines("laptop")
    plain = runner.invoke(app, ["watch", "--stack", "team", "--once", "--no-poll", "--no-apply"])
    assert plain.exit_code == 0 and "warning" not in plain.output and the_lease() is None  # never synced: no bucket
    synced(machines, "laptop")
    monkeypatch.setenv("AWS_ENDPOINT_URL", "http://127.0.0.1:9")  # nothing listens there
    monkeypatch.setenv("AWS_MAX_ATTEMPTS", "1")
    cut = runner.invoke(app, ["watch", "--stack", "team", "--once", "--no-poll", "--no-apply"])  # the bucket is remembered
    assert cut.exit_code == 0, cut.output
    warnings = [line for line in cut.stderr.splitlines() if line.startswith("warning:")]
    assert len(warnings) == 1 and f"the watch lease s3://evts/{LEASE} cannot be reached" in warnings[0]
    assert "only this machine's lock keeps watchers apart" in warnings[0]


def test_a_lease_lost_after_deciding_stops_before_the_action(machines, tmp_path):
    """The check before each action: decided on a preemption, then the lease is gone: no edit, no push."""
    import random

    from cli.commands import cloud_for
    from cli.lifecycle import stackfile, sync
    from cli.lifecycle.capacity import policy_capacity
    from cli.watch import observe, watcher

    home = synced(machines, "laptop")
    ref = stackfile.StackRef("team", home / "stacks" / "Pulumi.team.yaml")
    before = ref.path.read_text()
    clock = Clock(datetime.now(UTC))
    cloud = Cloud(StackConfig.model_validate({"cloud": "aws", "region": "us-east-1", "zones": ["us-east-1a"]}), "team")
    mine = BucketLease(cloud, "evts", "team", "Pulumi.team.yaml", clock, TERM, "laptop", host="laptop", pid=1, monotonic=clock.monotonic)
    assert mine.try_take() is None
    clock.sleep(61)
    assert BucketLease(cloud, "evts", "team", "Pulumi.team.yaml", clock, TERM, "watcher", host="watcher", pid=9, monotonic=clock.monotonic).acquire(0, clock.sleep, lambda line: None) is None  # watched for a term, then taken
    seen = events(tmp_path / "ev.jsonl", ("train", 3, "preempted", 30))
    shared = sync.Shared(ref, cloud_for(stackfile.load(ref), ref), "evts", pytest.fail)
    settings = watcher.Settings(ref, observe.Sources(seen, None, None, None, poll=False), None, once=True, shared=shared)
    acted: list[dict] = []
    report = watcher.Report(emit=acted.append, warn=pytest.fail, out=lambda line: None)
    with stackfile.sharing(ref.path, shared), pytest.raises(LeaseLost):
        watcher.cycle(settings, report, lambda c: cloud_for(c, ref), clock(), random.Random(1), False,
                      policy_capacity(clock), {}, mine)
    assert acted == [] and ref.path.read_text() == before
    assert sync.read_record(ref.path).generation == cloud.object_generation("evts", KEY)  # nothing pushed


def test_gcs_a_second_checkout_is_refused_and_a_restart_takes_over_at_once(tmp_path, monkeypatch, runner):
    """The same through GCS generations (the drill's emulator), two processes on two checkouts."""
    from cli.drill.emulator import Emulator
    from tests.test_watch import GCP_STACK

    homes = {}
    for name in ("watcher", "laptop"):
        homes[name] = tmp_path / name
        (homes[name] / "stacks").mkdir(parents=True)
        (homes[name] / "Pulumi.yaml").write_bytes((ROOT / "Pulumi.yaml").read_bytes())
        (homes[name] / "stacks" / "Pulumi.team.yaml").write_text(GCP_STACK)
    monkeypatch.delenv("PULUMI_STACK", raising=False)
    with Emulator() as emu:
        monkeypatch.setenv("SPOTCTL_GCS_ENDPOINT", emu.url)
        cloud = Cloud(StackConfig.model_validate({"cloud": "gcp", "project": "proj-1", "region": "us-central1",
                                                  "zones": ["us-central1-a"]}), "team")

        def gcs_lease() -> Holder | None:
            got = cloud.read_object("gcs-evts", LEASE)
            return None if got is None else Holder.parse(got[0])

        for name in homes:
            monkeypatch.chdir(homes[name])
            assert runner.invoke(app, ["sync", "--stack", "team", "--events-bucket", "gcs-evts"]).exit_code == 0
        first = spawn_watch(homes["watcher"], "--interval", "3600", bucket_name="gcs-evts")
        try:
            wait_for(lambda: (gcs_lease() or holder(pid=-1)).pid == first.pid, "the watcher's lease")
            refused = runner.invoke(app, ["watch", "--stack", "team", "--once", "--no-poll", "--no-apply"])  # in laptop/
            assert refused.exit_code == 1, refused.output
            assert f"error: stack Pulumi.team.yaml: watched by spotctl watch {first.pid}@" in refused.stderr
            assert refused.stderr.endswith(f"until {gcs_lease().expires.isoformat()} (lease gs://gcs-evts/{LEASE})\n")
        finally:
            kill_9(first)
        monkeypatch.chdir(homes["watcher"])
        restarted = runner.invoke(app, ["watch", "--stack", "team", "--once", "--no-poll", "--no-apply"])
        assert restarted.exit_code == 0, restarted.output
        assert gcs_lease().released and gcs_lease().pid == os.getpid()


def test_status_names_this_checkouts_watcher_from_its_holder_file_without_taking_the_lock(tmp_path):
    """Not shared: the holder file the watcher wrote, judged by its pid on this host; status never
    tries the OS lock (a try would turn away a watcher starting at that moment)."""
    from cli.watch.journal import holder_path

    stack_file = tmp_path / "Pulumi.team.yaml"
    assert leasing.watcher_line(stack_file, T0) is None  # no watcher ever ran here: nothing to say
    from cli.lifecycle import cachefile

    doc = {"holder": "spotctl watch 41@vm", "pid": 41, "host": "vm", "since": "2026-11-22T08:00:00+00:00"}
    holder_path(stack_file).write_text(json.dumps(doc) + "\n")  # not sealed: a commit's, say: not this checkout's watcher
    assert leasing.watcher_line(stack_file, T0, host="vm", alive=lambda pid: pid == 41) is None
    cachefile.save_record(holder_path(stack_file), doc)
    who = "spotctl watch 41@vm (since 2026-11-22T08:00:00+00:00)"
    assert leasing.watcher_line(stack_file, T0, host="vm", alive=lambda pid: pid == 41) == f"watcher: {who}"
    assert leasing.watcher_line(stack_file, T0, host="vm", alive=lambda pid: False) == (
        f"watcher: none running on this checkout (the last, {who}, exited)")
    assert leasing.watcher_line(stack_file, T0, host="laptop", alive=lambda pid: True) == (
        f"watcher: {who} last ran on this checkout from another host")
    holder_path(stack_file).write_text("{not json")
    assert leasing.watcher_line(stack_file, T0) is None


def flat(text: str) -> str:
    """``text`` with its wrapping undone (runs of white space as one space)."""
    return " ".join(text.split())
