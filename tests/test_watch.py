"""`spotctl watch`: the pure decisions, then the whole watcher on real stack files against moto in
server mode (S3, SQS with EventBridge-shaped messages, EC2), a local Pub/Sub (gRPC) and the fake
pulumi: preemption via bucket, queue, subscription and poll; completion; failure; out-of-order,
replayed and stale events; two watchers; kill -9 mid-action; capacity refusals then success."""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from cli.app import app
from cli.lifecycle import stackfile
from cli.lifecycle.events import Event
from cli.watch import decide as d
from cli.watch.journal import Journal
from infra.config import Job
from infra.naming import owner_value
from tests.conftest import pulumi_calls

ROOT = Path(__file__).resolve().parent.parent
T0 = datetime(2026, 11, 21, 10, 0, tzinfo=UTC)

AWS_STACK = """config:
  aws:region: us-east-1
  spotctl:cloud: aws
  spotctl:region: us-east-1
  spotctl:zones: [us-east-1a, us-east-1b]
  spotctl:jobs:
    # the single-node job
    - id: train
      instanceType: p4d.24xlarge
      zone: us-east-1a
      command: python train.py
      attempt: 3
      state: running
    - id: gang
      instanceType: p4d.24xlarge
      zone: us-east-1a
      command: torchrun train.py
      nodes: 2
      attempt: 1
      state: running
"""
GCP_STACK = """config:
  spotctl:cloud: gcp
  spotctl:project: proj-1
  spotctl:region: us-central1
  spotctl:zones: [us-central1-a]
  spotctl:jobs:
    - id: train
      machineType: a2-highgpu-1g
      zone: us-central1-a
      command: python train.py
      attempt: 3
      state: running
"""


def job(**over) -> Job:
    base = {"id": "train", "instance_type": "p4d.24xlarge", "zone": "us-east-1a", "command": "t", "state": "running", "attempt": 3}
    return Job.model_validate(base | over)


def ev(event: str, attempt: int = 3, node: int = 0, minutes: float = 0, job_id: str = "train", **details) -> Event:
    return Event(job_id, attempt, node, event, T0 + timedelta(minutes=minutes), details)


def decide_one(j: Job, events: list[Event], memory=d.JobMemory(), handled=frozenset(), now=T0):
    return d.decide_job(j, [d.seen(e, "test") for e in events], memory, set(handled), now)


# ---- the pure core ------------------------------------------------------------------------------------


def test_a_preemption_of_the_current_attempt_resumes():
    action, _ = decide_one(job(), [ev("started"), ev("preempted", minutes=5)])
    assert (action.kind, action.attempt) == ("resume", 3) and "node 0 of attempt 3 preempted" in action.reason


def test_a_notice_alone_is_recorded_not_acted_on():
    action, notes = decide_one(job(), [ev("started"), ev("preemption-notice", minutes=5), ev("rebalance-recommendation", minutes=4)])
    assert action is None
    (note,) = notes
    assert note.kind == "notice" and note.look and "recorded, not acted on" in note.reason


def test_events_of_an_old_attempt_are_stale():
    action, notes = decide_one(job(), [ev("preempted", attempt=2), ev("failed", attempt=1)])
    assert action is None and [n.kind for n in notes] == ["stale"] and "not the current attempt 3" in notes[0].reason


def test_completed_on_every_node_completes_and_some_nodes_wait():
    gang = job(id="gang", nodes=2, attempt=1)
    action, _ = decide_one(gang, [ev("completed", 1, 0, job_id="gang"), ev("completed", 1, 1, job_id="gang")])
    assert action.kind == "complete"
    action, notes = decide_one(gang, [ev("completed", 1, 1, job_id="gang")])
    assert action is None and notes[0].kind == "waiting-for-nodes" and "[0]" in notes[0].reason


def test_a_preemption_after_a_nodes_completion_completes_and_never_resumes():
    """The VM went (a notice, then preempted) between the trainer's finish and the end of its run:
    the scripts record both. A resume would start a new attempt that only finds the work done."""
    action, _ = decide_one(job(), [ev("started"), ev("progress", minutes=1), ev("completed", minutes=60),
                                   ev("preemption-notice", minutes=60.1), ev("preempted", minutes=60.2)])
    assert action.kind == "complete", action
    gang = job(id="gang", nodes=2, attempt=1)
    # node 1's own preemption, mid-work, still resumes the gang
    action, _ = decide_one(gang, [ev("completed", 1, 0, job_id="gang"), ev("preempted", 1, 0, 0.1, job_id="gang"),
                                  ev("preempted", 1, 1, 0.2, job_id="gang")])
    assert (action.kind, action.reason) == ("resume", "node 1 of attempt 1 preempted (seen in test)")
    # a trainer that failed on its own, then its VM stopped: the failure counts (a resume would forget it)
    action, _ = decide_one(job(), [ev("started"), ev("stopped", minutes=30), ev("failed", minutes=30.1, exit_code="3")])
    assert action.kind == "mark-failed", action


def test_failure_is_final_unless_max_failures_allows_a_retry():
    action, _ = decide_one(job(), [ev("failed")])
    assert action.kind == "mark-failed" and "maxFailures 0" in action.reason
    action, _ = decide_one(job(max_failures=1), [ev("failed")])
    assert action.kind == "resume" and action.force
    action, _ = decide_one(job(max_failures=1), [ev("failed", attempt=2), ev("failed")])  # the second failure
    assert action.kind == "mark-failed"


def test_handled_events_do_nothing_again():
    e = ev("preempted")
    action, _ = decide_one(job(), [e], handled={d.event_id(e)})
    assert action is None


def test_the_same_fact_from_two_sources_is_one_event():
    cloud = Event("train", 3, 0, "preempted", T0, {"source": "cloud", "reason": "x"})
    later = Event("train", 3, 0, "preempted", T0 + timedelta(minutes=3), {"source": "cloud", "reason": "x"})
    recorded = ev("preempted")
    merged = d.merge([d.seen(cloud, "subscription"), d.seen(recorded, "bucket")], [d.seen(later, "poll"), d.seen(recorded, "events-dir")])
    assert [(s.source, s.event.event) for s in merged["train"]] == [("subscription", "preempted"), ("bucket", "preempted")]


@settings(max_examples=60, deadline=None)
@given(order=st.permutations(list(range(6))))
def test_order_of_arrival_does_not_change_the_decision(order):
    events = [ev("started", 2), ev("preempted", 2, minutes=10), ev("started", 3, minutes=20),
              ev("preemption-notice", 3, minutes=29), ev("preempted", 3, minutes=30), ev("completed", 1, minutes=1)]
    shuffled = [events[i] for i in order]
    batches = [[d.seen(e, "a")] for e in shuffled]
    action, notes = d.decide_job(job(), d.merge(*batches)["train"], d.JobMemory(), set(), T0)
    assert (action.kind, action.attempt) == ("resume", 3)
    assert [n.kind for n in notes] == ["stale"]


def test_waiting_for_capacity_until_the_next_try():
    memory = d.JobMemory(waiting_attempt=3, next_try=T0 + timedelta(minutes=2), tries=1)
    action, notes = decide_one(job(), [], memory)
    assert action is None and notes[0].kind == "waiting-for-capacity"
    action, _ = decide_one(job(), [], memory, now=T0 + timedelta(minutes=2))
    assert action.kind == "retry-capacity" and "try 2" in action.reason


def test_a_failed_update_that_was_not_a_capacity_refusal_is_retried_as_decided():
    """Audit F6: pulumi failing otherwise (exit 255, a provider error) says nothing about capacity: the
    same update again after the backoff, never the policy, the zone failover or a refusal's wording."""
    def failover(*_):
        raise AssertionError("the zone failover is for capacity refusals only")

    memory = d.JobMemory(waiting_attempt=3, next_try=T0 + timedelta(minutes=2), tries=2, retrying_apply=True)
    action, notes = d.decide_job(job(), [], memory, set(), T0, failover)
    assert action is None and notes[0].kind == "retrying-apply" and "capacity" not in notes[0].reason.replace("not a capacity", "")
    action, _ = d.decide_job(job(), [], memory, set(), T0 + timedelta(minutes=2), failover)
    assert (action.kind, action.attempt, action.capacity, action.zone) == ("retry-apply", 3, None, None)
    assert "try 3 after a failed update (not a capacity refusal)" in action.reason
    moving = job(move={"from": "us-east-1a", "to": "us-east-1b", "step": "start"})
    action, _ = d.decide_job(moving, [], memory, set(), T0 + timedelta(minutes=2), failover)
    assert (action.kind, action.zone) == ("move", "us-east-1b") and "after a failed update" in action.reason
    # capacity refusals: the failover decides, with the refusals counted apart from the other failures
    seen: list[int] = []
    refused = d.JobMemory(waiting_attempt=3, next_try=T0, tries=3, refusals=2)
    action, _ = d.decide_job(job(), [], refused, set(), T0, lambda j, e, m, now: seen.append(m.refusals))
    assert action.kind == "retry-capacity" and "try 4 after a capacity refusal" in action.reason and seen == [2]


def test_a_retry_that_errs_before_its_update_keeps_what_kind_of_retry_it_is(tmp_path):
    """A retry whose update never started (an "error" row) leaves the wait as it was: a failed update
    stays one (not read as a capacity refusal), and old rows without the flag read it from their status."""
    nxt = (T0 + timedelta(minutes=1)).isoformat()
    rows = {"a": {"waiting_attempt": 3, "tries": 1, "next_try": nxt, "status": "error", "retrying_apply": True},
            "b": {"waiting_attempt": 3, "tries": 2, "next_try": nxt, "status": "retrying-apply"},
            "c": {"waiting_attempt": 3, "tries": 2, "next_try": nxt, "status": "waiting-for-capacity"}}
    memory = Journal(tmp_path / "j.json", {}, rows).memory()
    assert [(memory[k].retrying_apply, memory[k].refusals) for k in "abc"] == [(True, 0), (True, 0), (False, 2)]


def test_a_crash_after_the_edit_is_finished_not_repeated():
    memory = d.JobMemory(intent={"kind": "resume", "attempt": 4, "state": "running"})
    action, _ = decide_one(job(attempt=4), [ev("preempted")], memory)
    assert action.kind == "reapply"
    action, _ = decide_one(job(attempt=3), [ev("preempted")], memory)  # the edit never landed: decide afresh
    assert action.kind == "resume"


def test_backoff_grows_with_jitter_and_a_cap():
    rng = random.Random(3)
    spans = [d.backoff(n, rng).total_seconds() for n in range(1, 12)]
    for n, s in enumerate(spans, start=1):
        full = min(d.BACKOFF_CAP_S, d.BACKOFF_BASE_S * 2 ** (n - 1))
        assert full / 2 <= s < full
    assert len({round(d.backoff(1, rng).total_seconds(), 3) for _ in range(20)}) > 1  # jittered


@pytest.mark.parametrize("text,capacity", [
    ("api error InsufficientInstanceCapacity: We currently do not have sufficient p4d.24xlarge capacity", True),
    ("googleapi: Error 503: The zone 'projects/p/zones/us-central1-a' does not have enough resources available "
     "to fulfill the request. '(resource type:compute)'., ZONE_RESOURCE_POOL_EXHAUSTED_WITH_DETAILS", True),
    ("Error 403: Quota 'NVIDIA_A100_GPUS' exceeded. Limit: 0.0 in region us-central1., quotaExceeded", True),
    ("api error VcpuLimitExceeded: You have requested more vCPU capacity than your current vCPU limit", True),
    ("api error InvalidParameterValue: Value (x) for parameter iamInstanceProfile.name is invalid", False),
])
def test_capacity_refusals_are_recognised(text, capacity):
    assert d.is_capacity_refusal(text) is capacity


# ---- the watcher on real stack files --------------------------------------------------------------------


@pytest.fixture
def aws_stack(project: Path) -> Path:
    path = project / "stacks" / "Pulumi.team.yaml"
    path.write_text(AWS_STACK)
    return path


def events_file(path: Path, *docs: tuple) -> Path:
    with path.open("a") as fh:
        for job_id, attempt, node, event, minute in docs:
            fh.write(json.dumps({"job": job_id, "attempt": attempt, "node": node, "event": event,
                                 "time": (T0 + timedelta(minutes=minute)).isoformat(), "details": {}}) + "\n")
    return path


def watch(runner, *args: str):
    result = runner.invoke(app, ["watch", "--stack", "team", "--once", "--json", *args])
    lines = [json.loads(line) for line in result.stdout.splitlines() if line.startswith("{")]
    return result, lines


def the_job(job_id: str = "train", name: str = "team") -> Job:
    return stackfile.load(stackfile.resolve(name, None)).job(job_id)


def ups(log: Path) -> list[list[str]]:
    return [c for c in pulumi_calls(log) if "up" in c]


def test_events_dir_preemption_resumes_once_and_replays_do_nothing(aws_stack, runner, fake_pulumi, tmp_path):
    events = events_file(tmp_path / "ev.jsonl", ("train", 3, 0, "started", 0), ("train", 3, 0, "preempted", 30))
    result, lines = watch(runner, "--no-poll", "--events-dir", str(events))
    assert result.exit_code == 0, result.output
    (line,) = lines
    assert (line["job"], line["action"], line["result"], line["fields"]) == ("train", "resume", "applied", {"attempt": 4, "state": "running"})
    assert (the_job().attempt, the_job().state.value) == (4, "running")
    assert "# the single-node job" in aws_stack.read_text()  # comments kept
    (up,) = ups(fake_pulumi)
    assert any("job-train" in a for a in up) and not any("job-gang" in a for a in up)  # only that job's resources
    # Replayed (and an out-of-order straggler of an older attempt): nothing is done twice.
    events_file(events, ("train", 3, 0, "preempted", 30), ("train", 2, 0, "preempted", 1))
    result, lines = watch(runner, "--no-poll", "--events-dir", str(events))
    assert result.exit_code == 0, result.output
    assert [(x["action"], x["kind"], x["attempt"]) for x in lines] == [("record", "stale", 4)]
    assert set(lines[0]) == {"job", "action", "kind", "attempt", "reason", "time"}  # what README "Watching a stack" lists
    assert the_job().attempt == 4 and len(ups(fake_pulumi)) == 1
    result, lines = watch(runner, "--no-poll", "--events-dir", str(events))
    assert lines == [] and len(ups(fake_pulumi)) == 1


def test_completion_on_every_node_completes_and_a_failure_marks_failed(aws_stack, runner, fake_pulumi, tmp_path):
    events = events_file(tmp_path / "ev.jsonl", ("gang", 1, 0, "started", 0), ("gang", 1, 1, "started", 0),
                         ("gang", 1, 1, "completed", 50), ("train", 3, 0, "failed", 20))
    result, lines = watch(runner, "--no-poll", "--events-dir", str(events))
    assert result.exit_code == 0, result.output
    assert [(x["job"], x["action"], x["result"]) for x in lines] == [("train", "mark-failed", "applied")]
    assert the_job().state.value == "failed" and the_job("gang").state.value == "running"  # node 0 still works
    events_file(events, ("gang", 1, 0, "completed", 55))
    result, lines = watch(runner, "--no-poll", "--events-dir", str(events))
    assert [(x["job"], x["action"], x["fields"]) for x in lines] == [("gang", "complete", {"state": "completed"})]
    assert the_job("gang").state.value == "completed" and the_job("gang").attempt == 1
    assert len(ups(fake_pulumi)) == 2  # the failed job's VM and the completed job's VMs go; no retry loop
    result, lines = watch(runner, "--no-poll", "--events-dir", str(events))
    assert lines == [] and len(ups(fake_pulumi)) == 2


def test_max_failures_allows_that_many_retries(aws_stack, runner, tmp_path):
    aws_stack.write_text(AWS_STACK.replace("      attempt: 3\n", "      attempt: 3\n      maxFailures: 1\n"))
    events = events_file(tmp_path / "ev.jsonl", ("train", 3, 0, "failed", 20))
    result, lines = watch(runner, "--no-poll", "--no-apply", "--events-dir", str(events))
    assert [(x["action"], x["result"], x["fields"]) for x in lines] == [("resume", "written", {"attempt": 4, "state": "running"})]
    events_file(events, ("train", 4, 0, "failed", 40))
    result, lines = watch(runner, "--no-poll", "--no-apply", "--events-dir", str(events))
    assert [(x["action"], x["fields"]) for x in lines if x["action"] != "record"] == [("mark-failed", {"state": "failed"})]


def test_an_unreachable_source_is_one_warning_and_the_others_act(aws_stack, runner, tmp_path, monkeypatch):
    monkeypatch.setenv("AWS_ENDPOINT_URL", "http://127.0.0.1:9")  # nothing listens there
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "x")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "x")
    monkeypatch.setenv("AWS_MAX_ATTEMPTS", "1")
    events = events_file(tmp_path / "ev.jsonl", ("train", 3, 0, "preempted", 30))
    result, lines = watch(runner, "--no-poll", "--no-apply", "--events-dir", str(events), "--events-bucket", "team-events")
    assert result.exit_code == 0, result.output
    warnings = [w for w in result.stderr.splitlines() if w.startswith("warning:")]
    assert len(warnings) == 1 and "event bucket team-events" in warnings[0]
    assert [x["action"] for x in lines] == ["resume"]


def test_status_shows_what_the_watcher_sees(aws_stack, runner, tmp_path):
    aws_stack.write_text(AWS_STACK.replace("attempt: 3\n      state: running", "attempt: 3\n      state: preempted"))
    result = runner.invoke(app, ["status", "--stack", "team", "--json"])
    rows = {r["job"]: r for r in json.loads(result.stdout)}
    assert rows["train"]["watcher"]["status"] == "needs-resume"
    watch(runner, "--no-poll", "--no-apply")
    result = runner.invoke(app, ["status", "--stack", "team"])
    assert "train: watcher: written; last action resume attempt=4, state=running (written)" in " ".join(result.stdout.split())


def test_status_says_the_watcher_leaves_a_job_the_user_stopped(aws_stack, runner):
    aws_stack.write_text(AWS_STACK.replace("attempt: 3\n      state: running", "attempt: 3\n      state: stopped\n      stoppedBy: user"))
    rows = {r["job"]: r for r in json.loads(runner.invoke(app, ["status", "--stack", "team", "--json"]).stdout)}
    assert rows["train"]["watcher"]["status"] == "stopped-by-user"
    lines = watch(runner, "--no-poll", "--no-apply")[1]
    assert all(x["job"] != "train" or x["action"] != "resume" for x in lines)
    text = " ".join(runner.invoke(app, ["status", "--stack", "team"]).stdout.split())
    assert "train: watcher: stopped-by-user" in text and "needs-resume" not in text


# ---- AWS: moto in server mode (S3, SQS, EC2) ------------------------------------------------------------


@pytest.fixture(autouse=True)
def _no_cached_aws_credentials():
    """boto3's default session caches the credentials it found: drop it, so later tests see theirs."""
    yield
    import boto3

    boto3.DEFAULT_SESSION = None


def aws(service: str):
    import boto3

    return boto3.client(service, region_name="us-east-1")


def run_vm(job_id: str, attempt: int, node: int = 0) -> str:
    tags = {"spotctl:stack": "team", "spotctl:job": job_id, "spotctl:node": str(node), "spotctl:attempt": str(attempt),
            "Name": f"team-{job_id}-a{attempt}-n{node}"}
    spec = [{"ResourceType": "instance", "Tags": [{"Key": k, "Value": v} for k, v in tags.items()]}]
    return aws("ec2").run_instances(ImageId="ami-12c6146b", MinCount=1, MaxCount=1, TagSpecifications=spec)["Instances"][0]["InstanceId"]


def test_preemption_via_the_event_bucket(aws_stack, runner, fake_pulumi, moto_server):
    s3 = aws("s3")
    s3.create_bucket(Bucket="team-events")
    for i, (event, minute) in enumerate([("started", 0), ("preempted", 40)]):
        s3.put_object(Bucket="team-events", Key=f"team/train/attempt-3/node-0/{i}-{event}.json", Body=json.dumps(
            {"job": "train", "attempt": 3, "node": 0, "event": event, "time": (T0 + timedelta(minutes=minute)).isoformat()}))
    s3.put_object(Bucket="team-events", Key="other-stack/train/attempt-3/node-0/x.json", Body=json.dumps(
        {"job": "train", "attempt": 3, "node": 0, "event": "completed", "time": T0.isoformat()}))
    result, lines = watch(runner, "--no-poll", "--events-bucket", "team-events")
    assert result.exit_code == 0, result.output
    assert [(x["job"], x["action"], x["result"]) for x in lines] == [("train", "resume", "applied")]
    assert the_job().attempt == 4


@pytest.mark.parametrize("source", ["bucket", "events-dir"])
def test_max_failures_counts_the_failures_of_earlier_attempts_whatever_the_source(aws_stack, runner, moto_server, tmp_path, source):
    """A cycle reads a job's current attempt and, of its earlier ones, what decides its future: the
    earlier attempt's failure counts against maxFailures (read from the bucket's cursors or the dir's cache)."""
    aws_stack.write_text(AWS_STACK.replace("      attempt: 3\n", "      attempt: 4\n      maxFailures: 1\n"))
    docs = [("train", 3, 0, "started", 0), ("train", 3, 0, "checkpoint", 5), ("train", 3, 0, "failed", 20),
            ("train", 4, 0, "started", 30), ("train", 4, 0, "failed", 40)]
    root = tmp_path / "events"
    if source == "bucket":
        aws("s3").create_bucket(Bucket="team-events")
    for job_id, attempt, node, event, minute in docs:
        key = f"team/{job_id}/attempt-{attempt}/node-{node}/{minute:04d}-{event}.json"
        body = json.dumps({"job": job_id, "attempt": attempt, "node": node, "event": event, "stack": "team",
                           "time": (T0 + timedelta(minutes=minute)).isoformat()})
        if source == "bucket":
            aws("s3").put_object(Bucket="team-events", Key=key, Body=body)
        else:
            (root / key).parent.mkdir(parents=True, exist_ok=True)
            (root / key).write_text(body)
    where = ["--events-bucket", "team-events"] if source == "bucket" else ["--events-dir", str(root)]
    result, lines = watch(runner, "--no-poll", "--no-apply", *where)
    assert result.exit_code == 0, result.output
    assert [(x["action"], x["fields"]) for x in lines if x["action"] != "record"] == [("mark-failed", {"state": "failed"})]


def interruption(instance: str, kind: str = "EC2 Spot Instance Interruption Warning", minute: float = 0) -> str:
    """An EventBridge event as the rule delivers it to SQS (docs.aws.amazon.com/AWSEC2/latest/UserGuide/spot-instance-termination-notices.html)."""
    return json.dumps({"version": "0", "id": f"evt-{instance}-{kind[:8]}", "detail-type": kind, "source": "aws.ec2",
                       "account": "123456789012", "time": (datetime.now(UTC) + timedelta(minutes=minute)).isoformat(),
                       "region": "us-east-1", "resources": [f"arn:aws:ec2:us-east-1a:instance/{instance}"],
                       "detail": {"instance-id": instance, "instance-action": "terminate"}})


def test_preemption_via_the_interruption_queue_acts_only_when_the_vm_is_gone(aws_stack, runner, fake_pulumi, moto_server):
    sqs, ec2 = aws("sqs"), aws("ec2")
    url = sqs.create_queue(QueueName="spotctl-team-interruptions")["QueueUrl"]
    vm = run_vm("train", 3)
    old = run_vm("train", 2)
    ec2.terminate_instances(InstanceIds=[old])
    sqs.send_message(QueueUrl=url, MessageBody=interruption(vm))
    sqs.send_message(QueueUrl=url, MessageBody=interruption(old))  # an older attempt's VM: never acts
    result, lines = watch(runner, "--no-poll", "--queue-url", url)
    assert result.exit_code == 0, result.output
    assert [(x["action"], x["kind"], x["attempt"]) for x in lines] == [("record", "notice", 3)]  # the VM still runs
    assert the_job().attempt == 3 and not ups(fake_pulumi)
    ec2.terminate_instances(InstanceIds=[vm])
    result, lines = watch(runner, "--no-poll", "--queue-url", url)
    assert result.exit_code == 0, result.output
    assert [(x["job"], x["action"], x["result"]) for x in lines] == [("train", "resume", "applied")]
    assert the_job().attempt == 4 and len(ups(fake_pulumi)) == 1
    attrs = sqs.get_queue_attributes(QueueUrl=url, AttributeNames=["ApproximateNumberOfMessages", "ApproximateNumberOfMessagesNotVisible"])
    assert attrs["Attributes"] == {"ApproximateNumberOfMessages": "0", "ApproximateNumberOfMessagesNotVisible": "0"}


def test_preemption_via_the_poll_only(aws_stack, runner, fake_pulumi, moto_server):
    vm = run_vm("train", 3)
    run_vm("gang", 1, 0)
    run_vm("gang", 1, 1)
    result, lines = watch(runner)
    assert result.exit_code == 0, result.output
    assert lines == [] and the_job().attempt == 3
    aws("ec2").terminate_instances(InstanceIds=[vm])
    result, lines = watch(runner)
    assert [(x["job"], x["action"]) for x in lines] == [("train", "resume")]
    assert "seen in poll" in lines[0]["reason"] and the_job().attempt == 4


# ---- GCP: the preemption subscription through the real Pub/Sub client -------------------------------------


def preempted_log(name: str, at: datetime = T0) -> dict:
    return {"insertId": f"ins-{name}-{at.timestamp()}", "timestamp": at.isoformat().replace("+00:00", "Z"),
            "logName": "projects/proj-1/logs/cloudaudit.googleapis.com%2Fsystem_event",
            "resource": {"type": "gce_instance", "labels": {"zone": "us-central1-a", "project_id": "proj-1"}},
            "protoPayload": {"methodName": "compute.instances.preempted",
                             "resourceName": f"projects/proj-1/zones/us-central1-a/instances/{name}"}}


@pytest.fixture
def team_vm(monkeypatch):
    """The GCP team stack's running VM of job train, attempt 3, on a local Compute endpoint."""
    from tests.fixtures.fake_gce import FakeGce

    gce = FakeGce()
    monkeypatch.setenv("SPOTCTL_GCE_ENDPOINT", gce.url)
    gce.add_instance("us-central1-a", "team-train-a3-n0", {"spotctl-stack": "team", "spotctl-owner": owner_value("team"), "spotctl-job": "train",
                                                            "spotctl-attempt": "3", "spotctl-node": "0"})
    yield gce
    gce.stop()


def test_preemption_via_the_gcp_subscription(project, runner, fake_pulumi, monkeypatch, team_vm):
    from tests.fixtures.fake_pubsub import FakePubsub

    (project / "stacks" / "Pulumi.team.yaml").write_text(GCP_STACK)
    sub = "projects/proj-1/subscriptions/team-preemptions-watch"
    team_vm.preempt("us-central1-a", "team-train-a3-n0")
    with FakePubsub() as fake:
        monkeypatch.setenv("PUBSUB_EMULATOR_HOST", fake.host)
        fake.publish(sub, preempted_log("team-train-a3-n0"))
        fake.publish(sub, preempted_log("team-train-a3-n0"))  # delivered twice (at-least-once)
        fake.publish(sub, preempted_log("other-train-a3-n0"))  # not this stack's
        result, lines = watch(runner, "--no-poll", "--subscription", "team-preemptions-watch")
        assert result.exit_code == 0, result.output
        assert [(x["job"], x["action"], x["fields"]) for x in lines] == [("train", "resume", {"attempt": 4, "state": "running"})]
        assert fake.messages[sub] == [] and len(fake.acked) == 3
        fake.publish(sub, preempted_log("team-train-a3-n0"))  # a late redelivery: stale now
        result, lines = watch(runner, "--no-poll", "--subscription", "team-preemptions-watch")
        assert [(x["action"], x.get("kind")) for x in lines] == [] and fake.messages[sub] == []
        assert the_job().attempt == 4 and len(ups(fake_pulumi)) == 1


def test_a_preemption_entry_counts_only_once_compute_engine_reports_the_vm_gone(project, runner, fake_pulumi, monkeypatch, team_vm):
    """Nothing found says Cloud Logging refuses entries written into a system_event log name by a
    caller, and a job's service account may write log entries: an entry naming another job's running
    VM must not resume it. A fresh one is left to be delivered again (the API may lag); one whose VM
    still runs 15 min later is warned of and dropped."""
    from tests.fixtures.fake_pubsub import FakePubsub

    (project / "stacks" / "Pulumi.team.yaml").write_text(GCP_STACK)
    sub = "projects/proj-1/subscriptions/team-preemptions-watch"
    with FakePubsub() as fake:
        monkeypatch.setenv("PUBSUB_EMULATOR_HOST", fake.host)
        fake.publish(sub, preempted_log("team-train-a3-n0", datetime.now(UTC)))  # forged, or ahead of the API
        fake.publish(sub, preempted_log("team-train-a3-n0", datetime.now(UTC) - timedelta(hours=1)))  # forged, old
        result, lines = watch(runner, "--no-poll", "--subscription", "team-preemptions-watch")
        assert result.exit_code == 0, result.output
        assert lines == [] and the_job().attempt == 3 and not ups(fake_pulumi)
        (warning,) = [line for line in result.stderr.splitlines() if line.startswith("warning:")]
        assert warning == ("warning: preemption subscription team-preemptions-watch: an entry says team-train-a3-n0 was "
                           "preempted, but Compute Engine still reports it RUNNING: not acted on")
        assert len(fake.messages[sub]) == 1 and len(fake.acked) == 1  # the fresh one comes back
        team_vm.preempt("us-central1-a", "team-train-a3-n0")  # the real preemption
        result, lines = watch(runner, "--no-poll", "--subscription", "team-preemptions-watch")
        assert [(x["job"], x["action"]) for x in lines] == [("train", "resume")] and the_job().attempt == 4
        assert fake.messages[sub] == []


# ---- faults: two watchers, kill -9, capacity refusals -------------------------------------------------------


def spawn_watch(project: Path, *args: str, env: dict | None = None) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "cli", "watch", "--stack", "team", "--no-poll", *args], cwd=project,
                            env={**os.environ, "PYTHONPATH": str(ROOT), **(env or {})}, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, start_new_session=True)


def wait_for(predicate, what: str, timeout: float = 90.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.05)


def test_a_second_watcher_says_who_holds_the_stack(aws_stack, project, runner):
    first = spawn_watch(project, "--interval", "3600", "--no-apply")
    try:
        holder = project / "stacks" / ".Pulumi.team.yaml.watch.holder"
        wait_for(lambda: holder.exists() and str(first.pid) in holder.read_text(), "the first watcher's lease")
        result = runner.invoke(app, ["watch", "--stack", "team", "--once", "--no-poll", "--no-apply"])
        assert result.exit_code == 1
        assert f"error: stack Pulumi.team.yaml: watched by spotctl watch {first.pid}@" in result.stderr
    finally:
        os.killpg(first.pid, signal.SIGKILL)
        first.wait()
        first.stdout.close()
        first.stderr.close()
    result = runner.invoke(app, ["watch", "--stack", "team", "--once", "--no-poll", "--no-apply"])
    assert result.exit_code == 0, result.output  # kill -9 released the lease


def test_kill_9_mid_update_then_restart_finishes_it_once(aws_stack, project, runner, fake_pulumi, tmp_path):
    events = events_file(tmp_path / "ev.jsonl", ("train", 3, 0, "preempted", 30))
    proc = spawn_watch(project, "--once", "--events-dir", str(events), env={"FAKE_PULUMI_UP_SLEEP": "60"})
    try:
        wait_for(lambda: len(ups(fake_pulumi)) == 1, "the update to start")
    finally:
        os.killpg(proc.pid, signal.SIGKILL)  # the watcher and the pulumi it started
        proc.wait()
        proc.stdout.close()
        proc.stderr.close()
    assert the_job().attempt == 4  # the edit landed; its update did not finish
    result, lines = watch(runner, "--no-poll", "--events-dir", str(events))
    assert result.exit_code == 0, result.output
    assert [(x["action"], x["result"]) for x in lines] == [("reapply", "applied")]
    assert the_job().attempt == 4 and len(ups(fake_pulumi)) == 2  # finished, not a second new attempt
    result, lines = watch(runner, "--no-poll", "--events-dir", str(events))
    assert lines == [] and len(ups(fake_pulumi)) == 2


def test_kill_9_anywhere_never_makes_two_attempts(aws_stack, project, fake_pulumi, tmp_path):
    events = events_file(tmp_path / "ev.jsonl", ("train", 3, 0, "preempted", 30))
    rng = random.Random(11)
    for _ in range(4):
        proc = spawn_watch(project, "--once", "--events-dir", str(events))
        time.sleep(rng.random() * 1.5)
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
        proc.stdout.close()
        proc.stderr.close()
        assert the_job().attempt in (3, 4)
    done = spawn_watch(project, "--once", "--events-dir", str(events))
    out, err = done.communicate(timeout=120)
    assert done.returncode == 0, err
    assert the_job().attempt == 4 and Journal.load(project / "stacks" / "Pulumi.team.yaml").jobs["train"].get("intent") is None


def preempted_train_watcher(tmp_path: Path):
    """A watcher of stack ``team`` whose events dir says train's attempt 3 was preempted: the records
    it emits, its clock (``clock[0]``, starting at T0) and ``once()``, one cycle (its return: all ok)."""
    from cli.commands import applier_for, cloud_for
    from cli.watch import observe, watcher

    clock = [T0]
    ref = stackfile.resolve("team", None)
    records: list[dict] = []
    report = watcher.Report(emit=records.append, warn=lambda w: records.append({"warning": w}), out=lambda line: None)
    settings_ = watcher.Settings(ref, observe.Sources(events_dir=events_file(tmp_path / "ev.jsonl", ("train", 3, 0, "preempted", 30)),
                                                      poll=False), applier_for(ref, False), once=True)

    def once() -> bool:
        return watcher.run(settings_, report, cloud_for=lambda c: cloud_for(c, ref), now=lambda: clock[0], rng=random.Random(1))

    return records, clock, once


def test_capacity_refusals_back_off_ask_the_policy_each_try_then_succeed(aws_stack, project, runner, fake_pulumi, monkeypatch, tmp_path):
    from cli.lifecycle import capacity
    from infra.config import Capacity

    monkeypatch.setenv("FAKE_PULUMI_CAPACITY_FAILS", "2")
    # The policy's answers in place are the subject here, not a move to us-east-1b (tests/test_failover.py).
    aws_stack.write_text(AWS_STACK.replace("      attempt: 3\n", "      attempt: 3\n      moveOnCapacity: false\n", 1))
    asked = []

    def policy(now, **_):
        def choose(j, events):
            asked.append(j.attempt)
            return Capacity.ON_DEMAND if len(asked) >= 3 else Capacity.SPOT  # the policy changes its mind
        return choose

    monkeypatch.setattr(capacity, "policy_capacity", policy)
    records, clock, once = preempted_train_watcher(tmp_path)

    assert once() is False
    first = records[-1]
    assert (first["action"], first["result"]) == ("resume", "waiting-for-capacity")
    next_try = datetime.fromisoformat(first["next_try"])
    assert T0 + timedelta(seconds=15) <= next_try < T0 + timedelta(seconds=30)
    assert (the_job().attempt, the_job().state.value) == (4, "running")
    status = runner.invoke(app, ["status", "train", "--stack", "team", "--json"])
    (row,) = json.loads(status.stdout)
    assert row["watcher"]["status"] == "waiting-for-capacity" and row["watcher"]["next_try"] == first["next_try"]
    n = len(records)
    clock[0] = next_try - timedelta(seconds=1)
    assert once() is True and len(records) == n and len(ups(fake_pulumi)) == 1  # not yet
    clock[0] = next_try
    assert once() is False
    second = records[-1]
    assert (second["action"], second["result"]) == ("retry-capacity", "waiting-for-capacity")
    assert datetime.fromisoformat(second["next_try"]) - next_try >= timedelta(seconds=30)  # doubled
    clock[0] = datetime.fromisoformat(second["next_try"])
    assert once() is True
    assert (records[-1]["action"], records[-1]["result"], records[-1]["fields"]) == ("retry-capacity", "applied", {"capacity": "on-demand"})
    assert len(asked) == 3 and len(ups(fake_pulumi)) == 3
    job_now = the_job()
    assert (job_now.attempt, job_now.capacity.value) == (4, "on-demand")  # one new attempt in all
    status = runner.invoke(app, ["status", "train", "--stack", "team", "--json"])
    assert json.loads(status.stdout)[0]["watcher"]["status"] == "applied"


def test_the_gcp_stack_declares_the_watchers_pull_subscription():
    from cli.plan import mocks as planner
    from infra.config import validate
    from tests.conftest import GCP_BASE, gcp_job, stack_config

    plan = planner.run(validate(stack_config(GCP_BASE, jobs=[gcp_job()]), "test"), "team-a")
    (sub,) = plan.by_type("gcp:pubsub/subscription:Subscription")
    (topic,) = plan.by_type("gcp:pubsub/topic:Topic")
    assert sub.inputs["topic"] == "projects/proj-1/topics/team-a-preemptions" and topic.inputs["name"] == "team-a-preemptions"
    assert sub.inputs["expirationPolicy"] == {"ttl": ""} and sub.inputs["ackDeadlineSeconds"] == 60
    assert "pushConfig" not in sub.inputs  # a pull subscription
    assert sub.inputs["labels"]["spotctl-stack"] == "team-a"
    assert plan.outputs["preemptionSubscription"] == "team-a-preemptions-watch"


def test_the_shipped_systemd_unit_runs_a_real_watch_command(runner):
    unit = (ROOT / "examples" / "spotctl-watch@.service").read_text()
    sections = {line.strip("[]") for line in unit.splitlines() if line.startswith("[")}
    assert sections == {"Unit", "Service", "Install"}
    (exec_start,) = [line.split("=", 1)[1] for line in unit.splitlines() if line.startswith("ExecStart=")]
    words = exec_start.split()
    assert words[words.index("spotctl") + 1] == "watch" and "--once" not in words
    assert "Restart=always" in unit
    help_text = runner.invoke(app, ["watch", "--help"]).output
    for option in (w for w in words if w.startswith("--") and w != "--frozen"):
        assert option in help_text, option


def test_the_bucket_is_read_incrementally_across_cycles(aws_stack):
    """An object is downloaded and parsed once per generation: an unchanged one is neither read nor
    decoded again, a replaced one (a job's VM may overwrite its own) is, an expired one is kept (the
    job's history never shrinks). Each node folder is listed from its cursor, one folder at a time."""
    from cli.cloud import Stored
    from cli.lifecycle.bucketevents import BucketEvents
    from cli.watch import observe

    def doc(event, minutes=0):
        return json.dumps({"job": "train", "attempt": 3, "node": 0, "event": event,
                           "time": (T0 + timedelta(minutes=minutes)).isoformat()}).encode()

    docs = {"team/train/attempt-3/node-0/1.json": ("g1", doc("started"))}

    class Bucket:  # the Cloud object's bucket call, as the tests swap whole Cloud objects
        read: list = []

        def stored_since(self, bucket, prefix, after, suffix, known, limit):
            out, folders = [], set()
            for k, (g, data) in sorted(docs.items()):
                rest = k[len(prefix):]
                if not k.startswith(prefix) or (after and k <= after):
                    continue
                if "/" in rest:
                    folders.add(prefix + rest.split("/")[0] + "/")
                elif k.endswith(suffix):
                    fresh = known.get(k) != g
                    self.read += [k] if fresh else []
                    out.append(Stored(k, g, len(data), data if fresh else None))
            return out, sorted(folders)

    cloud, cache = Bucket(), BucketEvents("team")
    cfg = stackfile.load(stackfile.resolve("team", None))

    def kinds():
        got = observe.observe(cloud, cfg, "team", observe.Sources(bucket="b", poll=False), T0, poll_due=False,
                              handled=set(), warn=print, bucket_cache=cache)
        return [s.event.event for s in got.events.get("train", [])]

    assert kinds() == ["started"]
    assert kinds() == ["started"] and cloud.read == ["team/train/attempt-3/node-0/1.json"]  # not downloaded again
    docs["team/train/attempt-3/node-0/2.json"] = ("g2", doc("preempted", 1))
    assert kinds() == ["started", "preempted"]
    docs["team/train/attempt-3/node-0/2.json"] = ("g3", doc("stopped", 1))  # replaced: a new generation
    assert kinds() == ["started", "stopped"] and cloud.read.count("team/train/attempt-3/node-0/2.json") == 2
    del docs["team/train/attempt-3/node-0/1.json"]  # expired by the bucket's lifecycle rule
    assert kinds() == ["started", "stopped"]


@pytest.mark.parametrize("name", ["example-aws", "example-gcp"])
def test_one_jobs_targets_are_planned_with_that_job_alone(project, name):
    from cli.lifecycle.apply import job_targets, job_urns
    from cli.plan import mocks as planner

    cfg = stackfile.load(stackfile.resolve(name, None))
    full = planner.run(cfg, name)
    for j in cfg.jobs:
        assert job_targets(cfg, name, j.id) == job_urns(full, j.id) != []


GENERIC_FAILURE = "error: 1 error occurred:\n    * creating EC2 Instance: operation error EC2: RunInstances: InvalidParameterValue\n"


def test_a_non_capacity_failure_retries_the_same_update_and_never_asks_the_policy(aws_stack, project, runner, fake_pulumi,
                                                                                   monkeypatch, tmp_path):
    """Audit F6 end to end: the first two updates fail with a provider error (not capacity); the watcher
    retries the attempt it wrote with the backoff, spot as decided; the policy (which would pick
    on-demand) and the zone failover are never asked. A capacity refusal after that counts as the first."""
    from cli.lifecycle import capacity
    from infra.config import Capacity

    monkeypatch.setenv("FAKE_PULUMI_CAPACITY_FAILS", "3")
    monkeypatch.setenv("FAKE_PULUMI_CAPACITY_MESSAGE", GENERIC_FAILURE)
    asked: list[int] = []
    failovers: list[int] = []
    real = capacity.decide_zone_failover

    def policy(now, **_):
        def choose(j, events):
            asked.append(j.attempt)
            return Capacity.SPOT if len(asked) == 1 else Capacity.ON_DEMAND  # the resume's own ask: spot
        return choose

    def recorded_failover(*args, **kwargs):
        failovers.append(kwargs["refusals"])
        return real(*args, **kwargs)

    monkeypatch.setattr(capacity, "policy_capacity", policy)
    monkeypatch.setattr(capacity, "decide_zone_failover", recorded_failover)
    records, clock, once = preempted_train_watcher(tmp_path)

    def row() -> dict:
        return Journal.load(aws_stack).jobs["train"]

    assert once() is False
    assert (records[-1]["action"], records[-1]["result"]) == ("resume", "retrying-apply")
    assert (the_job().attempt, the_job().capacity.value) == (4, "spot") and row()["refusals"] == 0 and row()["retrying_apply"]
    status = runner.invoke(app, ["status", "train", "--stack", "team", "--json"])
    assert json.loads(status.stdout)[0]["watcher"]["status"] == "retrying-apply"
    clock[0] = datetime.fromisoformat(records[-1]["next_try"])
    assert once() is False
    second = records[-1]
    assert (second["action"], second["result"]) == ("retry-apply", "retrying-apply")
    assert "capacity refusal" not in second["reason"].replace("not a capacity refusal", "")
    assert datetime.fromisoformat(second["next_try"]) - clock[0] >= timedelta(seconds=30)  # the backoff still doubles
    assert (the_job().attempt, the_job().capacity.value) == (4, "spot") and asked == [3] and failovers == []  # asked once, by the resume
    # now the cloud refuses for capacity: the first refusal, whatever failed before it
    monkeypatch.delenv("FAKE_PULUMI_CAPACITY_MESSAGE")
    clock[0] = datetime.fromisoformat(second["next_try"])
    assert once() is False
    assert (records[-1]["action"], records[-1]["result"]) == ("retry-apply", "waiting-for-capacity")
    assert row()["refusals"] == 1 and row()["tries"] == 3 and row()["retrying_apply"] is False
    clock[0] = datetime.fromisoformat(records[-1]["next_try"])
    once()
    assert failovers == [1] and "try 4 after a capacity refusal" in records[-1]["reason"]  # (it may move the job)
