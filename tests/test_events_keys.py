"""A bucket event counts only as far as its object key vouches for it (cli/lifecycle/events.py
``keyed_events``): IAM lets a job's VM write only under ``<stack>/<job>/``, never what it puts in the
body, so a body claiming another job, attempt, node or stack is skipped with one warning naming the
key. Through the watcher (moto S3 in server mode, the drill's GCS emulator), the commands that read
recorded events (``events``, ``resume``), and a local ``--events-dir`` laid out like the bucket."""

from __future__ import annotations

import json
from datetime import UTC, datetime

import pytest
from hypothesis import given
from hypothesis import strategies as st

from cli.app import app
from cli.lifecycle.events import Event, keyed_events, trusted, vouched_locally
from tests import test_sync
from tests.conftest import pulumi_calls
from tests.test_sync import cli, jobs_of

bucket, machines = test_sync.bucket, test_sync.machines  # the two-machine fixtures over moto S3


def doc(job="train", attempt=3, node=0, event="completed", stack="team", **extra) -> dict:
    d = {"stack": stack, "job": job, "attempt": attempt, "node": node, "event": event,
         "time": "2026-11-21T10:00:00+00:00", "details": {}}
    return {**d, **extra}


def put(key: str, body: dict) -> None:
    import boto3

    boto3.client("s3", region_name="us-east-1").put_object(Bucket="evts", Key=key, Body=json.dumps(body).encode())


def acted(result) -> list[tuple[str, str]]:
    return [(a["job"], a["action"]) for a in map(json.loads, result.stdout.splitlines())]


def test_a_job_writing_another_jobs_completion_under_its_own_prefix_is_skipped_with_one_warning(machines, runner):
    """The audit's repro: gang's role may put only under team/gang/; that is enough to forge train's end."""
    path = machines("watcher")
    put("team/gang/attempt-1/node-0/evil.json", doc())
    r = cli(runner, "watch", "--once", "--no-poll", "--no-apply", "--json", "--events-bucket", "evts")
    assert r.exit_code == 0, r.output
    assert acted(r) == []
    assert jobs_of(path.read_text())["train"]["state"] == "running"
    warned = [line for line in r.stderr.splitlines() if "team/gang/attempt-1/node-0/evil.json" in line]
    assert len(warned) == 1 and "job 'train'" in warned[0]
    # the same completion under train's own key is train's: acted on
    put("team/train/attempt-3/node-0/2026-11-21T10:00:00.000Z-completed.json", doc())
    r = cli(runner, "watch", "--once", "--no-poll", "--no-apply", "--json", "--events-bucket", "evts")
    assert r.exit_code == 0, r.output
    assert acted(r) == [("train", "complete")]
    assert "evil.json" not in r.stderr or r.stderr.count("evil.json") == 1


@pytest.mark.parametrize("claim", [{"attempt": 2}, {"node": 1}, {"stack": "team-a"}, {"job": "gang"}])
def test_the_commands_skip_a_body_its_key_contradicts(machines, runner, claim):
    """``resume`` reads train's prefix only; a body there claiming another attempt/node/stack is not a fact."""
    machines("laptop")
    put("team/train/attempt-3/node-0/x-preempted.json", doc(event="preempted", **claim))
    r = cli(runner, "events", "train", "--events-bucket", "evts", "--json")
    assert r.exit_code == 0, r.output
    assert json.loads(r.stdout) == []
    skipped = "team/train/attempt-3/node-0/x-preempted.json" in r.stderr
    assert skipped or "job" in claim  # another job's body under train's prefix is not train's: not even read as one


def test_events_command_shows_an_honest_event(machines, runner):
    machines("laptop")
    put("team/train/attempt-3/node-0/x-preempted.json", doc(event="preempted"))
    r = cli(runner, "events", "train", "--events-bucket", "evts", "--json")
    assert r.exit_code == 0, r.output
    assert "preempted" in r.stdout and "warning" not in r.stderr


def gcs_put(url: str, key: str, body: dict) -> None:
    """An upload as a job's VM makes it (spotctl_upload_once, GCS JSON API with the VM's token)."""
    import urllib.parse
    import urllib.request

    from cli.drill.emulator import GCS_TOKEN

    req = urllib.request.Request(f"{url}/upload/storage/v1/b/gcs-evts/o?uploadType=media&name={urllib.parse.quote(key, safe='')}",
                                 data=json.dumps(body).encode(), method="POST",
                                 headers={"Authorization": f"Bearer {GCS_TOKEN}", "Content-Type": "application/json"})
    urllib.request.urlopen(req, timeout=10).close()


def test_gcs_watcher_skips_a_forged_completion(project, runner, monkeypatch):
    from cli.drill.emulator import Emulator

    path = project / "stacks" / "Pulumi.example-gcp.yaml"
    stack = "example-gcp"
    with Emulator() as emu:
        monkeypatch.setenv("SPOTCTL_GCS_ENDPOINT", emu.url)
        forged = doc(job="vit-finetune", attempt=3, stack=stack)
        gcs_put(emu.url, f"{stack}/bert-eval/attempt-1/node-0/evil.json", forged)
        args = ["watch", "--stack", stack, "--once", "--no-poll", "--no-apply", "--json", "--events-bucket", "gcs-evts"]
        r = runner.invoke(app, args)
        assert r.exit_code == 0, r.output
        assert acted(r) == [] and "bert-eval/attempt-1/node-0/evil.json" in r.stderr
        assert jobs_of(path.read_text())["vit-finetune"]["state"] == "running"
        gcs_put(emu.url, f"{stack}/vit-finetune/attempt-3/node-0/ok.json", forged)
        r = runner.invoke(app, args)
        assert r.exit_code == 0, r.output
        assert acted(r) == [("vit-finetune", "complete")]


def test_a_local_events_dir_laid_out_like_the_bucket_is_checked_the_same_way(machines, runner, tmp_path):
    """``aws s3 sync s3://evts dir``: the same forgery on disk; a flat JSON-lines file stays the user's own."""
    path = machines("watcher")
    d = tmp_path / "synced"
    forged = d / "team" / "gang" / "attempt-1" / "node-0" / "evil.json"
    forged.parent.mkdir(parents=True)
    forged.write_text(json.dumps(doc()))
    r = cli(runner, "watch", "--once", "--no-poll", "--no-apply", "--json", "--events-dir", str(d))
    assert r.exit_code == 0, r.output
    assert acted(r) == [] and "team/gang/attempt-1/node-0/evil.json" in r.stderr
    assert jobs_of(path.read_text())["train"]["state"] == "running"
    (d / "disk.jsonl").write_text(json.dumps(doc()) + "\n")  # a job disk's events.jsonl: no key to check
    r = cli(runner, "watch", "--once", "--no-poll", "--no-apply", "--json", "--events-dir", str(d))
    assert acted(r) == [("train", "complete")]


KEY = "team/train/attempt-3/node-1/t-preempted.json"


@given(field=st.sampled_from(["stack", "job", "attempt", "node"]),
       other=st.one_of(st.integers(min_value=0, max_value=9), st.text(st.characters(codec="ascii"), min_size=1, max_size=6)))
def test_a_body_agrees_with_its_key_in_every_field_or_is_not_trusted(field, other):
    body = doc(event="preempted", node=1)
    honest = Event.parse(body)
    assert trusted(KEY, body, honest, "team")
    forged = {**body, field: other}
    try:
        event = Event.parse(forged)
    except (ValueError, TypeError):
        return  # not an event at all
    same = (event.job, event.attempt, event.node) == (honest.job, honest.attempt, honest.node) and forged["stack"] == "team"
    assert trusted(KEY, forged, event, "team") is same
    assert keyed_events({KEY: json.dumps(forged)}, {event.job}, "team", bucket=True) == ([event] if same else [])


def test_keys_not_laid_out_like_an_event_object_are_refused_in_a_bucket():
    body = doc()
    event = Event.parse(body)
    for key in ("team/train/evil.json", "train/attempt-3/node-0/x.json", "team/x/train/attempt-3/node-0/x.json",
                "team-a/train/attempt-3/node-0/x.json"):
        assert not trusted(key, body, event, "team"), key
    assert trusted("team/train/attempt-3/node-0/x.json", {k: v for k, v in body.items() if k != "stack"}, event, "team")


def test_a_gcp_preemption_counts_only_from_the_system_event_audit_log():
    """A job's service account may write log entries (an AuditLog protoPayload included) to its own logs:
    only Compute Engine writes cloudaudit.googleapis.com%2Fsystem_event."""
    from datetime import UTC, datetime

    from cli.watch.observe import gcp_preemption

    def entry(log: str) -> bytes:
        return json.dumps({"timestamp": "2026-11-21T10:00:00Z", "logName": f"projects/p/logs/{log}",
                           "protoPayload": {"methodName": "compute.instances.preempted",
                                            "resourceName": "projects/p/zones/z/instances/team-train-a3-n0"}}).encode()

    now = datetime(2026, 11, 21, 11, tzinfo=UTC)
    assert gcp_preemption(entry("cloudaudit.googleapis.com%2Fsystem_event"), "team", {"train": None}, now).attempt == 3
    for log in ("spotctl", "cloudaudit.googleapis.com%2Fsystem_event-x", "cloudaudit.googleapis.com%2Factivity"):
        assert gcp_preemption(entry(log), "team", {"train": None}, now) is None


# ---- --events-dir: the folders are the bucket key's parts, read from the root (audit F3) ---------------

TRAIN = doc(event="preempted")  # stack team, job train, attempt 3, node 0


@pytest.mark.parametrize("path", ["x.jsonl", "x.json", ".spotctl/events.jsonl",  # no layout: taken as written
                                  "team/train/attempt-3/node-0/t-preempted.json",  # a copy of the bucket
                                  "train/attempt-3/node-0/t-preempted.json"])  # a copy of the stack's prefix
def test_an_events_dir_path_that_names_the_bodys_job_or_nothing_vouches_for_it(path):
    assert vouched_locally(path, TRAIN, Event.parse(TRAIN), "team")
    assert keyed_events({path: json.dumps(TRAIN)}, {"train"}, "team") == [Event.parse(TRAIN)]


@pytest.mark.parametrize("path", [
    "gang/forged.json", "team/gang/forged.json",  # the audit's repro: another job's folder
    "train/forged.json", "team/train/forged.json", "team/train/x/forged.json",  # not where the scripts write
    "team/gang/train/attempt-3/node-0/x.json", "gang/train/attempt-3/node-0/x.json",  # deeper under gang's prefix
    "team-a/train/attempt-3/node-0/x.json", "team/train/attempt-2/node-0/x.json", "team/train/attempt-3/node-1/x.json",
    "team/train/attempt-3/node-0/sub/x.json", "attempt-3/node-0/x.json", "x/.spotctl/events.jsonl",
    "ev/team/train/attempt-3/node-0/x.json"])  # rooted above the copy: the folders are read from the root
def test_an_events_dir_path_that_names_something_else_is_skipped_with_one_warning(path):
    assert not vouched_locally(path, TRAIN, Event.parse(TRAIN), "team")
    warned: list[str] = []
    assert keyed_events({path: json.dumps(TRAIN)}, {"train"}, "team", warned.append) == []
    assert len(warned) == 1 and path in warned[0] and "path does not grant" in warned[0]


def test_a_copy_of_one_jobs_prefix_vouches_for_nothing():
    """``aws s3 sync s3://b/team/gang/ dir``: gang's VM wrote every file there, none names its job."""
    objects = {"attempt-1/node-0/t-started.json": json.dumps(doc(job="gang", attempt=1, event="started")),
               "evil.json": json.dumps(TRAIN)}
    warned: list[str] = []
    assert keyed_events(objects, {"train", "gang"}, "team", warned.append) == []
    assert len(warned) == 2 and all("a copy of one job's prefix" in w for w in warned)


NAMES = st.sampled_from(["team", "train", "gang", "attempt-3", "node-0", ".spotctl", "x"])


@given(writer=st.sampled_from(["gang", "x", "node-0"]), rest=st.lists(NAMES, max_size=5),
       job=st.sampled_from(["train", "gang", "x"]), whole_bucket=st.booleans())
def test_a_jobs_vm_can_never_vouch_for_another_jobs_event_through_a_synced_copy(writer, rest, job, whole_bucket):
    """Whatever a job's VM writes under its own ``team/<writer>/`` prefix, synced whole or as the stack's
    prefix, claims no other job's event (a job named like the stack is the one ambiguity: not drawn)."""
    body = doc(job=job, attempt=3, node=0)
    path = "/".join([*(["team"] if whole_bucket else []), writer, *rest, "f.json"])
    if vouched_locally(path, body, Event.parse(body), "team"):
        assert job == writer


def write_event(path, **body) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"stack": "example-gcp", "time": "2026-11-22T04:00:00Z", "details": {}, **body}))


def test_watch_ignores_another_jobs_folder_forging_a_completion(project, runner, tmp_path):
    """Audit F3: vit-finetune's VM may write ``example-gcp/vit-finetune/*``; in a synced copy that
    completed llm-pretrain (and the watcher deleted its VMs)."""
    path = project / "stacks" / "Pulumi.example-gcp.yaml"
    ev = tmp_path / "ev"
    for node in (0, 1):
        claim = {"job": "llm-pretrain", "attempt": 1, "node": node, "event": "completed"}
        write_event(ev / "example-gcp" / "vit-finetune" / f"forged-{node}.json", **claim)
        write_event(ev / "example-gcp" / "vit-finetune" / "llm-pretrain" / "attempt-1" / f"node-{node}" / "x.json", **claim)
    args = ["watch", "--stack", "example-gcp", "--once", "--no-poll", "--no-apply", "--json", "--events-dir", str(ev)]
    r = runner.invoke(app, args)
    assert r.exit_code == 0, r.output
    assert ("llm-pretrain", "complete") not in acted(r)
    assert jobs_of(path.read_text())["llm-pretrain"]["state"] == "running"
    assert r.stderr.count("example-gcp/vit-finetune/forged-0.json: skipped") == 1
    for node in (0, 1):  # the same bodies where llm-pretrain's VMs write: its own
        write_event(ev / "example-gcp" / "llm-pretrain" / "attempt-1" / f"node-{node}" / "t-completed.json",
                    job="llm-pretrain", attempt=1, node=node, event="completed")
    r = runner.invoke(app, args)
    assert r.exit_code == 0, r.output
    assert ("llm-pretrain", "complete") in acted(r)
    assert jobs_of(path.read_text())["llm-pretrain"]["state"] == "completed"


def test_cleanup_orphans_ignores_a_completion_forged_in_another_jobs_folder(project, runner, monkeypatch, fake_pulumi):
    """Audit F3: a forged ``completed`` of the removed job ``old`` deleted its disk."""
    from tests.fixtures.fake_gce import FakeGce
    from tests.test_cleanup import gcp_owned

    gce = FakeGce()
    try:
        monkeypatch.setenv("SPOTCTL_GCE_ENDPOINT", gce.url)
        gce.add_disk("us-central1-a", "example-gcp-old-n0-disk", gcp_owned("old"))
        write_event(project / "ev" / "example-gcp" / "vit-finetune" / "forged.json",
                    job="old", attempt=1, node=0, event="completed")
        args = ["cleanup", "--orphans", "--stack", "example-gcp", "--yes", "--events-dir", "ev"]
        r = runner.invoke(app, args)
        assert r.exit_code == 0, r.output
        assert "keeping example-gcp-old-n0-disk (us-central1-a): job old recorded no `completed` event" in r.output
        assert "example-gcp/vit-finetune/forged.json: skipped" in r.output and gce.deleted == []
        # after the disk was made (the fake made it now): an earlier completion is an earlier job's (cleanup)
        write_event(project / "ev" / "example-gcp" / "old" / "attempt-1" / "node-0" / "t-completed.json",
                    job="old", attempt=1, node=0, event="completed", time=datetime.now(UTC).isoformat())
        r = runner.invoke(app, args)
        assert r.exit_code == 0, r.output
        assert gce.deleted == [("us-central1-a", "example-gcp-old-n0-disk")]
    finally:
        gce.stop()


def test_a_move_is_not_released_by_a_start_forged_in_another_jobs_folder(project, runner, fake_pulumi, pulumi_state, gce):
    """Audit F3: a forged ``started`` under bert-eval's prefix released a move's old disks."""
    from tests.test_move import MOVE_ARGS

    pulumi_state.seed("example-gcp")
    ev = project / "ev"
    ev.mkdir()
    r = runner.invoke(app, [*MOVE_ARGS, "--events-dir", str(ev)])
    assert r.exit_code == 0, r.output
    assert "waiting for attempt 2 to start in us-central1-b" in r.stdout
    for node in (0, 1):
        write_event(ev / "example-gcp" / "bert-eval" / f"forged-{node}.json", job="llm-pretrain", attempt=2, node=node, event="started")
    r = runner.invoke(app, [*MOVE_ARGS, "--events-dir", str(ev)])
    assert r.exit_code == 0, r.output
    assert "waiting for attempt 2 to start in us-central1-b" in r.stdout and "the move is finished" not in r.stdout
    assert not [c for c in pulumi_calls(fake_pulumi) if c[:2] == ["state", "unprotect"]]  # old disks still protected
    for node in (0, 1):
        write_event(ev / "example-gcp" / "llm-pretrain" / "attempt-2" / f"node-{node}" / "t-started.json",
                    job="llm-pretrain", attempt=2, node=node, event="started")
    r = runner.invoke(app, [*MOVE_ARGS, "--events-dir", str(ev)])
    assert r.exit_code == 0, r.output
    assert "the move is finished" in r.stdout
    assert len([c for c in pulumi_calls(fake_pulumi) if c[:2] == ["state", "unprotect"]]) == 2
