"""What one job's recorded events may cost every reader (cli/lifecycle/events.py: ``EVENT_OBJECT_LIMIT``,
``implausible``, ``BucketEvents``): a job's VM writes its own events, so an oversized object, a time
no clock could have written, an event of an attempt the file has not reached, or a job named like the
bucket's layout must not take down the watcher (every job's) or a command. Moto S3 in server mode and
the drill's GCS emulator for the bucket; CliRunner on real stack files for the commands."""

from __future__ import annotations

import json
import random
import tracemalloc
from datetime import UTC, datetime, timedelta

from cli.app import app
from cli.lifecycle import stackfile
from cli.lifecycle.events import EVENT_OBJECT_LIMIT, Event, keyed_events, read_dir
from cli.watch import decide as d
from tests import test_sync
from tests.test_events_keys import acted, doc, put
from tests.test_policy_live import SHORT, T0, write_stack
from tests.test_sync import cli, jobs_of
from tests.test_watch import events_file, job

bucket, machines = test_sync.bucket, test_sync.machines  # the two-machine fixtures over moto S3

BIG = EVENT_OBJECT_LIMIT * 2


def put_raw(key: str, body: bytes) -> None:
    import boto3

    boto3.client("s3", region_name="us-east-1").put_object(Bucket="evts", Key=key, Body=body)


# ---- size: an event object over the cap is never downloaded ----------------------------------------


def test_an_oversized_event_object_is_skipped_unread_and_the_others_still_act(machines, runner):
    """The audit's repro (a job VM's 300 MB ``.json`` under its own prefix), at 2 MiB: one warning naming
    the key, the watcher goes on, the honest event beside it is acted on."""
    path = machines("watcher")
    big = "team/gang/attempt-1/node-0/2026-11-21T10:00:00.000Z-started.json"
    put_raw(big, b" " * BIG)
    put("team/train/attempt-3/node-0/2026-11-21T10:00:00.000Z-completed.json", doc())
    r = cli(runner, "watch", "--once", "--no-poll", "--no-apply", "--json", "--events-bucket", "evts")
    assert r.exit_code == 0, r.output
    assert acted(r) == [("train", "complete")] and jobs_of(path.read_text())["train"]["state"] == "completed"
    warned = [line for line in r.stderr.splitlines() if big in line]
    assert len(warned) == 1 and "skipped unread" in warned[0] and str(BIG) in warned[0]


def test_the_commands_skip_an_oversized_event_object_too(machines, runner):
    machines("laptop")
    big = "team/train/attempt-3/node-0/x-preempted.json"
    put_raw(big, json.dumps(doc(event="preempted")).encode() + b" " * BIG)
    r = cli(runner, "events", "train", "--events-bucket", "evts", "--json")
    assert r.exit_code == 0, r.output
    assert json.loads(r.stdout) == [] and f"event {big}: skipped unread" in r.stderr


def test_reading_a_listing_never_holds_more_than_the_cap(bucket):
    """S3: an object listed over the cap is not asked for; memory stays far below the object's size."""
    from cli.cloud.aws import s3_stored

    put_raw("team/gang/attempt-1/node-0/big.json", b" " * (16 * EVENT_OBJECT_LIMIT))
    put_raw("team/gang/attempt-1/node-0/ok.json", b"{}")
    put_raw("small/gang/attempt-1/node-0/ok.json", b"{}")

    def peak(prefix: str):
        tracemalloc.start()
        try:
            return s3_stored("us-east-1", "evts", prefix, ".json", {}, EVENT_OBJECT_LIMIT), tracemalloc.get_traced_memory()[1]
        finally:
            tracemalloc.stop()

    _, baseline = peak("small/")  # a client and one small object
    listed, with_big = peak("team/")
    assert with_big < baseline + 2 * EVENT_OBJECT_LIMIT, (baseline, with_big)
    by_key = {o.key.rsplit("/", 1)[1]: o for o in listed}
    assert by_key["big.json"].data is None and by_key["big.json"].size == 16 * EVENT_OBJECT_LIMIT
    assert by_key["ok.json"].data == b"{}" and by_key["ok.json"].generation
    # known generations are not read again
    again = s3_stored("us-east-1", "evts", "team/", ".json", {o.key: o.generation for o in listed}, EVENT_OBJECT_LIMIT)
    assert [o.data for o in again] == [None, None]


def test_gcs_reads_are_bounded_by_size_and_range(monkeypatch):
    """GCS: the listing's ``size`` decides; a read is ranged, so an object larger than listed (replaced
    meanwhile) still yields at most the cap plus one byte, and counts as over it."""
    from cli.cloud import gcp
    from cli.drill.emulator import Emulator

    with Emulator() as emu:
        monkeypatch.setenv("SPOTCTL_GCS_ENDPOINT", emu.url)
        emu.state.blobs[("gcs-evts", "team/gang/attempt-1/node-0/big.json")] = b" " * BIG
        emu.state.blobs[("gcs-evts", "team/gang/attempt-1/node-0/ok.json")] = b"{}"
        emu.state.generations[("gcs-evts", "team/gang/attempt-1/node-0/big.json")] = 7
        emu.state.generations[("gcs-evts", "team/gang/attempt-1/node-0/ok.json")] = 8
        listed = {o.key.rsplit("/", 1)[1]: o for o in gcp.gcs_stored("gcs-evts", "team/", ".json", {}, EVENT_OBJECT_LIMIT)}
        assert listed["big.json"].data is None and listed["big.json"].size == BIG
        assert (listed["ok.json"].data, listed["ok.json"].generation) == (b"{}", "8")
        # listed small, read large: the range cuts it
        real = gcp._gcs_list
        monkeypatch.setattr(gcp, "_gcs_list", lambda *a: [{**i, "size": "2"} for i in real(*a)])
        raced = {o.key.rsplit("/", 1)[1]: o for o in gcp.gcs_stored("gcs-evts", "team/", ".json", {}, EVENT_OBJECT_LIMIT)}
        assert raced["big.json"].data is None and raced["big.json"].size == EVENT_OBJECT_LIMIT + 1


def test_a_local_event_file_over_the_cap_is_skipped_with_a_warning(tmp_path):
    (tmp_path / "big.json").write_bytes(json.dumps(doc()).encode() + b" " * BIG)
    (tmp_path / "ok.jsonl").write_text(json.dumps(doc(event="started")) + "\n")
    warned: list[str] = []
    assert list(read_dir(tmp_path, warned.append)) == ["ok.jsonl"]
    assert len(warned) == 1 and "big.json" in warned[0]


# ---- time: an event no clock could have written is skipped, whoever reads it -----------------------


def far(job_id: str, attempt: int, event: str, when: str) -> str:
    return json.dumps({"job": job_id, "attempt": attempt, "node": 0, "event": event, "time": when, "details": {"capacity": "spot"}})


def test_resume_skips_a_far_future_preemption_instead_of_exhausting_memory(runner, tmp_path):
    """The audit's repro: a ``preempted`` at year 9999 made ``resume`` build one element per 10 minutes
    until then (MemoryError)."""
    stack, events = write_stack(tmp_path, "loop", SHORT[:1])
    with open(events / "loop.jsonl", "a") as f:
        f.write(far("loop", 2, "started", "2026-11-21T12:00:00Z") + "\n")
        f.write(far("loop", 2, "preempted", "9999-01-01T00:00:00Z") + "\n")
    stack.write_text(stack.read_text().replace("attempt: 1\n      state: preempted", "attempt: 2\n      state: preempted", 1))
    r = runner.invoke(app, ["resume", "loop", "--stack-file", str(stack), "--events-dir", str(events), "--no-apply", "--json"])
    assert r.exit_code == 0 and r.exception is None, r.output
    assert json.loads(r.stdout)["fields"]["attempt"] == 3
    warned = [line for line in r.stderr.splitlines() if "9999" in line]
    assert len(warned) == 1 and "loop.jsonl" in warned[0] and "'loop'" in warned[0]


def test_status_and_policy_fit_skip_a_start_before_any_clock_could_write_it(runner, tmp_path):
    """A ``started`` at year 1: status showed 17 million hours running, ``policy fit`` a spot window of as many."""
    stack, events = write_stack(tmp_path, "loop", SHORT[:1])
    with open(events / "neighbour.jsonl", "w") as f:
        f.write(far("neighbour", 1, "started", "0001-01-01T00:00:00Z") + "\n")
        f.write(far("neighbour", 1, "preempted", "2026-11-21T11:00:00Z") + "\n")
    r = runner.invoke(app, ["status", "--stack-file", str(stack), "--events-dir", str(events), "--json"])
    assert r.exit_code == 0, r.output
    rows = {row["job"]: row for row in json.loads(r.stdout)}
    assert rows["neighbour"]["hours_running"] == 0 and rows["loop"]["hours_running"] < 1
    assert "0001-01-01" in r.stderr and "neighbour.jsonl" in r.stderr
    r = runner.invoke(app, ["policy", "fit", "--stack-file", str(stack), "--events-dir", str(events), "--json"])
    assert r.exit_code == 0, r.output
    pool = json.loads(r.stdout)["pools"]["us-east-1a/p3.2xlarge"]
    assert pool["spot_windows"] == 1  # loop's own: the neighbour's year-long one is not a window


def test_the_availability_replayed_is_bounded_however_far_apart_the_events_are():
    from cli.lifecycle.capacity import HISTORY_SPAN_H, TICK_H, observation_for
    from infra.config import Job

    loop = Job.model_validate({"id": "loop", "instance_type": "p3.2xlarge", "zone": "us-east-1a", "command": "t"})
    now = datetime(2026, 11, 22, tzinfo=UTC)
    events = [Event("loop", 1, 0, "started", datetime(2020, 1, 2, tzinfo=UTC)),
              Event("loop", 1, 0, "preempted", datetime(2020, 1, 3, tzinfo=UTC)),
              Event("loop", 2, 0, "started", now - timedelta(hours=5)),
              Event("loop", 2, 0, "preempted", now + timedelta(days=400))]  # ends after now: clipped to now
    obs, history = observation_for(loop, events, now)
    assert len(history) <= HISTORY_SPAN_H / TICK_H + 1
    assert history[-30:] == [True] * 30 and not any(history[: -31])
    assert obs.elapsed_h > 6 * 365 * 24  # the observation itself still knows how long the job has been around


def test_one_jobs_crash_does_not_stop_the_watch_cycle_for_the_others(project, fake_pulumi, monkeypatch, tmp_path):
    """A bad event reaching a job's policy (anything the act step does not expect) is that job's warning;
    the other jobs are decided and acted on in the same cycle."""
    from cli.commands import applier_for, cloud_for
    from cli.lifecycle import capacity
    from cli.watch import observe, watcher
    from infra.config import Capacity
    from tests.test_watch import AWS_STACK

    (project / "stacks" / "Pulumi.team.yaml").write_text(AWS_STACK)

    def policy(now, **_):
        def choose(j, events):
            if j.id == "train":
                raise MemoryError("a policy gone wrong on train's events")
            return Capacity.SPOT
        return choose

    monkeypatch.setattr(capacity, "policy_capacity", policy)
    ref = stackfile.resolve("team", None)
    records: list[dict] = []
    report = watcher.Report(emit=records.append, warn=lambda w: records.append({"warning": w}), out=lambda line: None)
    evs = events_file(tmp_path / "ev.jsonl", ("train", 3, 0, "preempted", 30), ("gang", 1, 1, "preempted", 31))
    settings_ = watcher.Settings(ref, observe.Sources(events_dir=evs, poll=False), applier_for(ref, False), once=True)
    ok = watcher.run(settings_, report, cloud_for=lambda c: cloud_for(c, ref), now=lambda: T0 + timedelta(hours=1),
                     rng=random.Random(1))
    assert ok is False
    warnings = [r["warning"] for r in records if "warning" in r]
    assert any(w.startswith("job train: resume stopped (MemoryError") for w in warnings), warnings
    assert [(r["job"], r["action"]) for r in records if "action" in r] == [("gang", "resume")]
    cfg = stackfile.load(ref)
    assert (cfg.job("gang").attempt, cfg.job("train").attempt) == (2, 3)


# ---- an event of a newer attempt than the file's waits --------------------------------------------------


NOW = datetime(2026, 11, 22, 12, tzinfo=UTC)


def test_an_event_of_a_newer_attempt_is_not_stale_and_acts_once_the_file_reaches_it():
    """The audit's repro: a watcher whose file lags at attempt 4 sees attempt 5's preemption (the GCP
    subscription); it must not be handled for good, or the job is never resumed once the file catches up."""
    handled: set[str] = set()
    pre = d.seen(Event("train", 5, 0, "preempted", NOW, {"source": "cloud", "reason": "x"}), "subscription")
    action, notes = d.decide_job(job(attempt=4, state="running"), [pre], d.JobMemory(), handled, NOW)
    assert action is None and notes == []  # nothing noted, so nothing handled (nor acknowledged)
    action, notes = d.decide_job(job(attempt=5, state="running"), [pre], d.JobMemory(), handled, NOW)
    assert action is not None and (action.kind, action.attempt, action.consumes) == ("resume", 5, (pre.id,))
    # an older attempt's end is still stale, as the README says
    action, notes = d.decide_job(job(attempt=6, state="running"), [pre], d.JobMemory(), handled, NOW)
    assert action is None and [(n.kind, n.ids) for n in notes] == [("stale", (pre.id,))]


def test_a_watch_cycle_leaves_a_newer_attempts_event_pending_until_the_file_reaches_it(project, runner, fake_pulumi, tmp_path):
    from cli.watch.journal import Journal
    from tests.test_watch import AWS_STACK, watch

    path = project / "stacks" / "Pulumi.team.yaml"
    path.write_text(AWS_STACK)
    events = events_file(tmp_path / "ev.jsonl", ("train", 4, 0, "preempted", 30))
    result, lines = watch(runner, "--no-poll", "--no-apply", "--events-dir", str(events))
    assert result.exit_code == 0, result.output
    assert lines == [] and Journal.load(path).handled == {}
    path.write_text(AWS_STACK.replace("      attempt: 3\n", "      attempt: 4\n", 1))  # the file catches up
    result, lines = watch(runner, "--no-poll", "--no-apply", "--events-dir", str(events))
    assert result.exit_code == 0, result.output
    assert [(x["job"], x["action"], x["attempt"]) for x in lines] == [("train", "resume", 4)]


# ---- a job named like the layout -----------------------------------------------------------------------


def test_a_job_named_like_an_attempt_folder_does_not_make_a_stack_copy_look_like_one_jobs():
    """``attempt-2`` is a valid job id: in a copy of the stack's prefix its events sit at
    ``attempt-2/attempt-N/node-K/``, which must not make every job's events count as a job copy's."""
    files = {"attempt-2/attempt-1/node-0/a-started.json": json.dumps(doc(job="attempt-2", attempt=1, event="started")),
             "train/attempt-3/node-0/b-completed.json": json.dumps(doc())}
    warned: list[str] = []
    got = keyed_events(files, {"train", "attempt-2"}, "team", warned.append)
    assert sorted(e.job for e in got) == ["attempt-2", "train"] and warned == []
    # a real copy of one job's prefix is still recognised: nothing in it vouches for another job
    copy = {"attempt-1/node-0/a-started.json": json.dumps(doc(job="gang", attempt=1, event="started")),
            "train/attempt-3/node-0/b-completed.json": json.dumps(doc())}
    assert keyed_events(copy, {"train", "gang"}, "team", warned.append) == []
    assert any("a copy of one job's prefix" in w for w in warned)


def test_the_events_command_reads_a_stack_copy_holding_a_job_named_attempt_2(runner, tmp_path):
    stack = tmp_path / "stacks" / "Pulumi.team.yaml"
    stack.parent.mkdir(parents=True)
    stack.write_text(test_sync.STACK.replace("id: gang", "id: attempt-2"))
    copy = tmp_path / "copy"
    for rel, body in {"attempt-2/attempt-1/node-0/a.json": doc(job="attempt-2", attempt=1, event="started"),
                      "train/attempt-3/node-0/b.json": doc()}.items():
        (copy / rel).parent.mkdir(parents=True, exist_ok=True)
        (copy / rel).write_text(json.dumps(body))
    r = runner.invoke(app, ["events", "train", "--stack-file", str(stack), "--events-dir", str(copy), "--json"])
    assert r.exit_code == 0, r.output
    assert [e["event"] for e in json.loads(r.stdout)] == ["completed"] and "skipped" not in r.stderr

