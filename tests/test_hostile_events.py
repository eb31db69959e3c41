"""One broken or hostile VM must not stop the watcher for every job (cli/lifecycle/events.py,
cli/watch/observe.py, cli/watch/lease.py, infra.basics.loads_bounded): generated hostile objects
(nested thousands deep, over the size cap, wrong types, times without a zone, far future and
ancient times, duplicated and reordered) in every source the watcher reads (an --events-dir, the
event bucket on moto S3, the interruption queue on moto SQS, the preemption subscription on the
local Pub/Sub, the watch lease), beside one honest preemption of another job: that job is still
resumed in the same cycle, and no command (watch, status, events, cost) shows a traceback."""

from __future__ import annotations

import itertools
import json
import shutil
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from cli.app import app
from infra.basics import BadJson, json_depth, loads_bounded
from infra.naming import owner_value
from tests import test_sync, test_watch
from tests.test_sync import STACK, cli

bucket, machines = test_sync.bucket, test_sync.machines  # moto S3 in server mode; a checkout sharing bucket evts

NOW = datetime.now(UTC)
FEW = settings(max_examples=8, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture,
                                                                      HealthCheck.too_slow, HealthCheck.data_too_large])

# ---- the hostile objects ------------------------------------------------------------------------------

scalars = st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=12)
values = st.recursive(scalars, lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=6), inner, max_size=3),
                      max_leaves=8)
times = st.sampled_from([
    "2026-11-21T10:05:00",  # no zone
    (NOW - timedelta(minutes=3)).replace(tzinfo=None).isoformat(),  # no zone, recent
    "0001-01-01T00:00:00+00:00", "1970-01-01T00:00:00Z", "9999-12-31T23:59:59+00:00",  # ancient, far future
    (NOW + timedelta(days=400)).isoformat(), "yesterday", "", "2026-13-45T99:99:99Z",
]) | values


def deep(depth: int, opener: str = "[") -> str:
    closer = {"[": "]", "{": "}"}[opener]
    inner = '"a":' if opener == "{" else ""
    return (opener + inner) * depth + "1" + closer * depth if opener == "{" else opener * depth + closer * depth


def event_like(**fields) -> st.SearchStrategy[str]:
    """An event document (as the scripts write one) with any of its fields replaced by anything."""
    base = {"stack": "team", "job": "gang", "attempt": 1, "node": 0, "event": "started", "time": "2026-11-21T10:00:00+00:00",
            "details": {}}
    base.update(fields)
    return st.fixed_dictionaries({}, optional={k: (times if k == "time" else values | st.just(v)) for k, v in base.items()}).map(
        lambda d: json.dumps({**base, **d}))


def hostile_text(**fields) -> st.SearchStrategy[str]:
    return st.one_of(
        st.integers(900, 4000).map(deep),
        st.integers(900, 4000).map(lambda d: json.dumps({"job": "gang", "attempt": 1, "event": "failed"})[:-1]
                                   + ', "details": ' + deep(d, "{") + "}"),
        st.integers(33, 200).map(lambda d: '{"job": "gang", "details": ' + deep(d) + "}"),
        event_like(**fields),
        st.integers(1, 5).map(lambda n: '{"job": "gang", "attempt": ' + "9" * (4300 * n) + "}"),
        st.binary(max_size=40).map(lambda b: b.decode("latin-1")),
        st.sampled_from(['{"job": "gang", "attempt": 1e400, "event": "failed", "time": "2026-11-21T10:00:00Z"}',
                         '{"job": "gang", "attempt": NaN}', "[" * 100_000, '"' + "[" * 5000, "\x1b[2J\x1b]0;pwned\x07"]),
    )


hostile_batch = st.lists(hostile_text(), min_size=1, max_size=4)


def no_traceback(result) -> None:
    assert result.exception is None or isinstance(result.exception, SystemExit), repr(result.exception)
    assert "Traceback" not in result.output


def train_resumed(result) -> None:
    no_traceback(result)
    lines = [json.loads(line) for line in result.stdout.splitlines() if line.startswith("{")]
    assert ("train", "resume") in [(x["job"], x["action"]) for x in lines], result.output


def reset(home: Path, text: str = STACK) -> None:
    """A fresh copy of the team stack, no state beside it (the watcher's journal, caches)."""
    shutil.rmtree(home / "stacks" / ".spotctl", ignore_errors=True)
    for kept in (home / "stacks").glob(".Pulumi.team.yaml.*"):
        if not kept.name.endswith(".lock"):
            kept.unlink()
    (home / "stacks" / "Pulumi.team.yaml").write_text(text)


def the_commands_show_no_traceback(runner, *source: str) -> None:
    for args in (["status", "--json"], ["events", "train", *source], ["events", "gang", *source, "--json"],
                 ["cost", *source], ["cost", *source, "--json"]):
        no_traceback(cli(runner, *args))


# ---- the bounded parse itself ----------------------------------------------------------------------------


@settings(max_examples=60, deadline=None)
@given(text=hostile_text())
def test_a_bounded_parse_refuses_cleanly_or_parses(text):
    try:
        loads_bounded(text, 1 << 20)
    except BadJson as exc:
        assert exc.kind in ("size", "depth", "encoding", "syntax")


def test_depth_ignores_brackets_in_strings_and_is_linear():
    assert json_depth('{"a": ["]]]", "[[[", {}]}') == 3
    assert json_depth('["\\"]]]]"]') == 1
    with pytest.raises(BadJson, match="nested 5000 levels deep"):
        loads_bounded(deep(5000), 1 << 20)
    with pytest.raises(BadJson, match="over the 10"):
        loads_bounded("[" + "1," * 10 + "1]", 10)


# ---- every source ---------------------------------------------------------------------------------------


def preempted_train(stack: str = "team") -> dict:
    return {"stack": stack, "job": "train", "attempt": 3, "node": 0, "event": "preempted", "time": "2026-11-21T10:30:00+00:00",
            "details": {}}


@FEW
@given(batch=hostile_batch, copies=st.integers(1, 3), first=st.booleans())
def test_hostile_files_in_an_events_dir(machines, runner, tmp_path_factory, batch, copies, first):
    home = machines("laptop").parent.parent
    reset(home)
    root = tmp_path_factory.mktemp("events")
    prefix = root / "team" / "gang" / "attempt-1" / "node-0"  # gang's VM writes only under its own prefix
    prefix.mkdir(parents=True)
    honest = root / "team" / "train" / "attempt-3" / "node-0"
    honest.mkdir(parents=True)
    for i, text in enumerate(batch * copies):  # duplicates; the honest one before or after them all
        (prefix / f"{'z' if first else 'a'}{i}.json").write_text(text)
    (root / ".spotctl").mkdir()
    (root / ".spotctl" / "events.jsonl").write_text("\n".join([*batch, json.dumps(preempted_train()), *batch]) + "\n")
    (honest / "m-preempted.json").write_text(json.dumps(preempted_train()))
    r = cli(runner, "watch", "--once", "--no-poll", "--no-apply", "--json", "--events-dir", str(root))
    train_resumed(r)
    reset(home)
    the_commands_show_no_traceback(runner, "--events-dir", str(root))


def s3_put(key: str, body: bytes) -> None:
    import boto3

    boto3.client("s3", region_name="us-east-1").put_object(Bucket="evts", Key=key, Body=body)


def s3_clear() -> None:
    import boto3

    s3 = boto3.client("s3", region_name="us-east-1")
    for o in s3.list_objects_v2(Bucket="evts").get("Contents", []):
        s3.delete_object(Bucket="evts", Key=o["Key"])


@FEW
@given(batch=hostile_batch, copies=st.integers(1, 2))
def test_hostile_objects_in_the_event_bucket(machines, runner, batch, copies):
    home = machines("laptop").parent.parent
    reset(home)
    s3_clear()
    for i, text in enumerate(batch * copies):
        s3_put(f"team/gang/attempt-1/node-0/{i}-x.json", text.encode("utf-8", "surrogatepass"))
    s3_put("team/train/attempt-3/node-0/2026-11-21T10:30:00.000Z-preempted.json", json.dumps(preempted_train()).encode())
    r = cli(runner, "watch", "--once", "--no-poll", "--no-apply", "--json", "--events-bucket", "evts")
    train_resumed(r)
    reset(home)
    the_commands_show_no_traceback(runner, "--events-bucket", "evts")


@FEW
@given(batch=hostile_batch)
def test_a_hostile_watch_lease(machines, runner, batch):
    """The lease beside the shared copy, replaced by anything: not a lease, so taken; never a crash or a hang."""
    home = machines("laptop").parent.parent
    reset(home)
    s3_clear()
    assert cli(runner, "sync", "--events-bucket", "evts").exit_code == 0
    lease = json.loads(json.dumps({"id": "x", "host": "h", "pid": 1, "started": "2026-11-21T10:00:00",
                                   "expires": "2026-11-21T10:01:00", "term_s": 1e300}))
    s3_put("team.spotctl/watch.lease", (batch[0] if len(batch) > 1 else json.dumps(lease)).encode("utf-8", "surrogatepass"))
    s3_put("team/train/attempt-3/node-0/2026-11-21T10:30:00.000Z-preempted.json", json.dumps(preempted_train()).encode())
    no_traceback(cli(runner, "status"))
    r = cli(runner, "watch", "--once", "--no-poll", "--no-apply", "--json", "--events-bucket", "evts")
    train_resumed(r)
    no_traceback(cli(runner, "status", "--json"))


def test_a_lease_with_a_huge_term_or_a_naive_time_is_no_lease():
    from cli.watch.lease import TERM_MAX, Holder

    good = {"id": "x", "host": "h", "pid": 7, "started": "2026-11-21T10:00:00+00:00", "expires": "2026-11-21T10:01:00+00:00",
            "term_s": 60}
    assert Holder.parse(json.dumps(good).encode()).term_s == 60
    for bad in ({"term_s": 1e300}, {"term_s": TERM_MAX.total_seconds() + 1}, {"term_s": float("nan")}, {"pid": 1e300},
                {"pid": -4}, {"started": 5}):
        assert Holder.parse(json.dumps({**good, **bad}).encode()) is None, bad
    naive = Holder.parse(json.dumps({**good, "expires": "2026-11-21T10:01:00"}).encode())
    assert naive.expires.tzinfo is not None
    assert Holder.parse(deep(3000).encode()) is None


# ---- the AWS interruption queue (moto SQS + EC2) -------------------------------------------------------------


def aws(service: str):
    import boto3

    return boto3.client(service, region_name="us-east-1")


def run_vm(job_id: str, attempt: int, node: int = 0) -> str:
    tags = {"spotctl:stack": "team", "spotctl:job": job_id, "spotctl:node": str(node), "spotctl:attempt": str(attempt)}
    spec = [{"ResourceType": "instance", "Tags": [{"Key": k, "Value": v} for k, v in tags.items()]}]
    return aws("ec2").run_instances(ImageId="ami-12c6146b", MinCount=1, MaxCount=1, TagSpecifications=spec)["Instances"][0]["InstanceId"]


def interruption(instance, when: str | None = None, **over) -> dict:
    return {"version": "0", "id": "e", "detail-type": "EC2 Spot Instance Interruption Warning", "source": "aws.ec2",
            "time": when or NOW.isoformat(), "region": "us-east-1", "detail": {"instance-id": instance, "instance-action": "terminate"},
            **over}


QUEUES = itertools.count()
message_times = times | st.sampled_from([(NOW + timedelta(days=2)).isoformat(), NOW.replace(tzinfo=None).isoformat()])


@FEW
@given(batch=hostile_batch, ids=st.lists(values | st.sampled_from(["gang-vm", "i-123", "i-" + "f" * 17]), max_size=3),
       when=message_times, copies=st.integers(1, 2))
def test_hostile_messages_in_the_interruption_queue(machines, runner, batch, ids, when, copies):
    home = machines("laptop").parent.parent
    reset(home)
    sqs, ec2 = aws("sqs"), aws("ec2")
    url = sqs.create_queue(QueueName=f"spotctl-team-{next(QUEUES)}")["QueueUrl"]  # a fresh queue per example
    train, gang = run_vm("train", 3), run_vm("gang", 1)
    ec2.terminate_instances(InstanceIds=[train])
    bodies = [*batch, *(json.dumps(interruption(gang if i == "gang-vm" else i, when if isinstance(when, str) else None))
                        for i in ids), json.dumps(interruption(gang, when)) if isinstance(when, str) else batch[0]]
    for body in bodies * copies:
        if body:
            sqs.send_message(QueueUrl=url, MessageBody=body.encode("utf-8", "replace").decode())
    sqs.send_message(QueueUrl=url, MessageBody=json.dumps(interruption(train)))
    r = cli(runner, "watch", "--once", "--no-poll", "--no-apply", "--json", "--queue-url", url)
    train_resumed(r)
    ec2.terminate_instances(InstanceIds=[gang])


def test_queue_messages_about_a_finished_job_or_from_the_future_are_acknowledged(machines, runner):
    machines("laptop")
    sqs, ec2 = aws("sqs"), aws("ec2")
    url = sqs.create_queue(QueueName="spotctl-team-interruptions")["QueueUrl"]
    gang = run_vm("gang", 1)
    train = run_vm("train", 3)
    ec2.terminate_instances(InstanceIds=[train])
    path = Path("stacks/Pulumi.team.yaml")
    path.write_text(test_sync.set_field(STACK, "train", "state", "completed"))
    sqs.send_message(QueueUrl=url, MessageBody=json.dumps(interruption(train)))  # about a completed job
    sqs.send_message(QueueUrl=url, MessageBody=json.dumps(interruption(gang, (NOW + timedelta(days=3)).isoformat())))
    r = cli(runner, "watch", "--once", "--no-poll", "--no-apply", "--json", "--queue-url", url)
    assert r.exit_code == 0, r.output
    assert r.stdout == ""
    warned = [line for line in r.stderr.splitlines() if "acknowledged, nothing done" in line]
    assert len(warned) == 2 and any("job train is completed" in w for w in warned) and any("dated " in w for w in warned)
    attrs = sqs.get_queue_attributes(QueueUrl=url, AttributeNames=["ApproximateNumberOfMessages", "ApproximateNumberOfMessagesNotVisible"])
    assert attrs["Attributes"] == {"ApproximateNumberOfMessages": "0", "ApproximateNumberOfMessagesNotVisible": "0"}


# ---- the GCP preemption subscription (local Pub/Sub + Compute) ----------------------------------------------

GCP_STACK = test_watch.GCP_STACK + """    - id: gang
      machineType: a2-highgpu-1g
      zone: us-central1-a
      command: python train.py
      attempt: 1
      state: running
"""
SUB = "projects/proj-1/subscriptions/team-preemptions-watch"


def preempted_log(name: str, at) -> dict:
    return {"insertId": f"ins-{name}", "timestamp": at, "logName": "projects/proj-1/logs/cloudaudit.googleapis.com%2Fsystem_event",
            "protoPayload": {"methodName": "compute.instances.preempted",
                             "resourceName": f"projects/proj-1/zones/us-central1-a/instances/{name}"}}


@pytest.fixture
def gcp_team(project, monkeypatch):
    from tests.fixtures.fake_gce import FakeGce
    from tests.fixtures.fake_pubsub import FakePubsub

    (project / "stacks" / "Pulumi.team.yaml").write_text(GCP_STACK)
    gce = FakeGce()
    monkeypatch.setenv("SPOTCTL_GCE_ENDPOINT", gce.url)
    for job, attempt in (("train", 3), ("gang", 1)):
        gce.add_instance("us-central1-a", f"team-{job}-a{attempt}-n0", {"spotctl-stack": "team", "spotctl-owner": owner_value("team"),
                                                                        "spotctl-job": job, "spotctl-attempt": str(attempt),
                                                                        "spotctl-node": "0"})
    gce.preempt("us-central1-a", "team-train-a3-n0")
    with FakePubsub() as fake:
        monkeypatch.setenv("PUBSUB_EMULATOR_HOST", fake.host)
        yield project, fake
    gce.stop()


@FEW
@given(batch=hostile_batch, names=st.lists(st.sampled_from(["team-gang-a1-n0", "team-gang-a" + "9" * 40 + "-n0", "x"]) | st.text(max_size=8),
                                           max_size=3), when=message_times)
def test_hostile_messages_in_the_preemption_subscription(gcp_team, runner, batch, names, when):
    project, fake = gcp_team
    reset(project, GCP_STACK)
    fake.messages[SUB] = [(f"h{i}", text.encode("utf-8", "replace")) for i, text in enumerate(batch)]
    for name in names:
        fake.publish(SUB, preempted_log(name, when))
    fake.publish(SUB, preempted_log("team-train-a3-n0", NOW.isoformat()))
    r = runner.invoke(app, ["watch", "--stack", "team", "--once", "--no-poll", "--no-apply", "--json", "--subscription", SUB])
    train_resumed(r)
    assert not [mid for mid, _ in fake.messages[SUB] if mid.startswith("h")]  # the unreadable ones are acknowledged


def test_events_and_status_print_no_control_characters_from_event_text(machines, runner, tmp_path):
    """A VM's event text reaches the terminal: escape sequences (clear the screen, retitle it, a
    hyperlink) are printed as spaces, by `events` and `status` alike."""
    home = machines("laptop").parent.parent
    reset(home)
    root = tmp_path / "events"
    folder = root / "team" / "train" / "attempt-3" / "node-0"
    folder.mkdir(parents=True)
    evil = "\x1b[2J\x1b]0;pwned\x07\x9b31m"
    (folder / "x.json").write_text(json.dumps({**preempted_train(), "event": f"progress{evil}",
                                               "details": {f"k{evil}": f"v{evil}\nnext"}}))
    for args in (["events", "train", "--events-dir", str(root)], ["status", "--events-dir", str(root)],
                 ["events", "train", "--events-dir", str(root), "--json"]):
        r = cli(runner, *args)
        assert r.exit_code == 0, r.output
        assert not any(c in r.output for c in "\x1b\x07\x9b"), (args, r.output)
    assert "progress" in cli(runner, "events", "train", "--events-dir", str(root)).output
