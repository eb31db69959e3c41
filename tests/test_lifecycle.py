"""The job lifecycle: the state machine, resume/failover/complete decisions, stack-file edits and the
targeted apply through the Automation API (against a fake `pulumi` that records its arguments)."""

from __future__ import annotations

import contextlib
import difflib
import json
import os
import random
import re
import signal
import subprocess
import sys
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from cli.app import app
from cli.lifecycle import stackfile
from cli.lifecycle.apply import job_urns
from cli.lifecycle.states import (
    TRANSITIONS,
    Event,
    LifecycleError,
    check,
    decide_complete,
    decide_failover,
    decide_resume,
    may_delete_disks,
)
from cli.plan import mocks as planner
from infra.basics import scripts_digest
from infra.config import Capacity, Job, JobState
from tests.conftest import pulumi_calls

ROOT = Path(__file__).resolve().parent.parent
T0 = datetime(2026, 11, 21, 10, 0, tzinfo=UTC)


def job(**over) -> Job:
    base = {"id": "train", "machine_type": "a2-highgpu-1g", "zone": "us-central1-a", "command": "python t.py",
            "state": "preempted", "attempt": 2}
    base.update(over)
    return Job.model_validate(base)


def ev(event: str, attempt: int, minutes: float = 0) -> Event:
    return Event("train", attempt, 0, event, T0 + timedelta(minutes=minutes))


# ---- state machine ------------------------------------------------------------------------------------


def test_every_edge_is_explained_and_completed_is_terminal():
    assert all(reason.strip() for reason in TRANSITIONS.values())
    assert not [edge for edge in TRANSITIONS if edge[0] is JobState.COMPLETED]


@pytest.mark.parametrize("old", list(JobState))
@pytest.mark.parametrize("new", list(JobState))
def test_illegal_transitions_name_both_states(old, new):
    if (old, new) in TRANSITIONS:
        assert check("j", old, new)
    else:
        with pytest.raises(LifecycleError, match=f"job j: cannot go from {old.value} to {new.value}"):
            check("j", old, new)


def test_resume_preempted_job_makes_the_next_attempt():
    change = decide_resume(job(), [])
    assert change.fields == {"attempt": 3, "state": "running"} and not change.noop


def test_resume_is_idempotent():
    first = decide_resume(job(), [ev("started", 2), ev("preempted", 2, 30)])
    after = job(state="running", attempt=first.fields["attempt"])
    again = decide_resume(after, [ev("started", 2), ev("preempted", 2, 30)])  # the same events: an old attempt
    assert again.noop and "is running attempt 3" in again.reason


def test_running_job_with_a_preemption_of_its_current_attempt_resumes():
    change = decide_resume(job(state="running", attempt=4), [ev("started", 4), ev("preemption-notice", 4, 5), ev("preempted", 4, 6)])
    assert change.fields == {"attempt": 5, "state": "running"}


def test_a_notice_alone_does_not_resume_a_vm_that_may_still_be_checkpointing():
    """The VM is checkpointing until it is gone (2 min on AWS): a new attempt would replace it midway.
    As ``watch`` does, ``resume`` waits for the `preempted` event (or the cloud, --observe)."""
    events = [ev("started", 4), ev("preemption-notice", 4, 5)]
    change = decide_resume(job(state="running", attempt=4), events)
    assert change.noop and "got a preemption notice" in change.reason and "--observe" in change.reason
    assert decide_resume(job(state="running", attempt=4), events, force=True).fields == {"attempt": 5, "state": "running"}
    gone = decide_resume(job(state="running", attempt=4), [*events, ev("stopped", 4, 7)])  # the cloud: the VM is gone
    assert gone.fields == {"attempt": 5, "state": "running"}


def test_an_attempt_that_reported_progress_then_completed_is_completed():
    """A real attempt records its first ``progress`` (and may record a rebalance recommendation or a
    checkpoint timeout) before ``completed``: informational, they never hide the completion (resume
    said "nothing says it stopped" and --force started the finished job again)."""
    for extra in ("progress", "rebalance-recommendation", "checkpoint-timeout"):
        with pytest.raises(LifecycleError, match="attempt 4 completed; run `spotctl complete train`"):
            decide_resume(job(state="running", attempt=4), [ev("started", 4), ev(extra, 4, 1), ev("completed", 4, 60)])


def test_a_stop_seen_after_a_nodes_completion_ends_nothing():
    """The VM was preempted (or stopped) between the trainer's exit and the end of its run: the scripts
    record both; the work is done, and a new attempt would only find it done."""
    for late in ("preemption-notice", "preempted", "stopped"):
        with pytest.raises(LifecycleError, match="attempt 4 completed"):
            decide_resume(job(state="running", attempt=4), [ev("started", 4), ev("completed", 4, 60), ev(late, 4, 60.1)])
        # a trainer that failed on its own: failed, in either order with the stop (resume needs --force)
        with pytest.raises(LifecycleError, match="resume it anyway with --force"):
            decide_resume(job(state="running", attempt=4), [ev("started", 4), ev(late, 4, 59.9), ev("failed", 4, 60)])


def test_a_gang_completes_when_every_node_did_and_one_preempted_node_still_stops_it():
    def node(n: int, event: str, minutes: float = 0) -> Event:
        return Event("train", 4, n, event, T0 + timedelta(minutes=minutes))

    gang = job(state="running", attempt=4, nodes=2)
    half = decide_resume(gang, [node(0, "started"), node(1, "started"), node(0, "completed", 60)])
    assert half.noop and "nothing says it stopped" in half.reason
    with pytest.raises(LifecycleError, match="attempt 4 completed"):
        decide_resume(gang, [node(0, "completed", 60), node(1, "completed", 61), node(1, "preempted", 61.1)])
    # node 1 was preempted mid-work: its completion is not node 0's
    resumed = decide_resume(gang, [node(0, "completed", 60), node(1, "preempted", 61)])
    assert resumed.fields == {"attempt": 5, "state": "running"}


def test_resume_refuses_completed_and_needs_force_for_failed():
    with pytest.raises(LifecycleError, match="job train is completed; there is nothing to resume"):
        decide_resume(job(state="completed"), [])
    with pytest.raises(LifecycleError, match="resume it anyway with --force"):
        decide_resume(job(state="failed"), [])
    assert decide_resume(job(state="failed"), [], force=True).fields["attempt"] == 3


def test_resume_capacity_forced_or_from_the_chooser():
    assert decide_resume(job(), [], capacity=Capacity.ON_DEMAND).fields["capacity"] == "on-demand"
    picked = decide_resume(job(), [], choose=lambda j, e: Capacity.ON_DEMAND)
    assert picked.fields == {"attempt": 3, "state": "running", "capacity": "on-demand"}


def test_failover_and_complete():
    assert decide_failover(job(state="running", capacity="spot"), None).fields == {"capacity": "on-demand", "attempt": 3, "state": "running"}
    assert decide_failover(job(state="running", capacity="on-demand"), Capacity.ON_DEMAND).noop
    assert decide_complete(job()).fields == {"state": "completed"}
    assert decide_complete(job(state="completed")).noop


def test_a_manual_complete_says_the_user_declared_it_and_the_watchers_says_the_events_did(project, runner):
    """Audit S4: ``spotctl complete`` of a running job must not record "the command exited 0"."""
    path = project / "stacks" / "Pulumi.example-gcp.yaml"
    result = runner.invoke(app, ["complete", "llm-pretrain", "--stack", "example-gcp", "--no-apply", "--json"])
    assert result.exit_code == 0, result.output
    reason = json.loads(result.output)["reason"]
    assert "spotctl complete" in reason and "exited 0" not in reason
    assert "state: completed" in path.read_text()
    by_events = decide_complete(job(state="running"), by_events=True).reason
    assert "exited 0" in by_events and "completed" in by_events and "spotctl complete" not in by_events


@given(state=st.sampled_from(list(JobState)), force=st.booleans(), owned=st.booleans(), declared=st.booleans())
def test_disks_are_deleted_only_for_completed_jobs_with_ownership(state, force, owned, declared):
    j = job(state=state.value) if declared else None
    allowed, why = may_delete_disks(j, force=force, owned=owned)
    if allowed:
        assert owned
        assert j is None or j.state is JobState.COMPLETED or (j.state is JobState.FAILED and force)
    else:
        assert why


# ---- through the CLI, on real stack files -----------------------------------------------------------


def diff_lines(before: str, after: str) -> list[str]:
    return [line for line in difflib.unified_diff(before.splitlines(), after.splitlines(), lineterm="", n=0)
            if line[:1] in "+-" and not line.startswith(("+++", "---"))]


def test_resume_no_apply_edits_only_the_jobs_keys(project, runner):
    path = project / "stacks" / "Pulumi.example-aws.yaml"
    before = path.read_text()
    result = runner.invoke(app, ["resume", "diffusion", "--stack", "example-aws", "--no-apply"])
    assert result.exit_code == 0, result.output
    assert result.output == ("job diffusion: attempt=3, state=running (resume: a new attempt on the same disks)"
                             " — written to stacks/Pulumi.example-aws.yaml; nothing applied (pulumi was not run)\n")
    after = path.read_text()
    assert diff_lines(before, after) == ["-      attempt: 2", "-      state: preempted", "+      attempt: 3", "+      state: running",
                                         f"+      scriptsDigest: {scripts_digest()}"]  # the scripts attempt 3 starts with
    assert "# One p4d (8x A100), waiting to be resumed after a spot interruption." in after
    again = runner.invoke(app, ["resume", "diffusion", "--stack", "example-aws", "--no-apply"])
    assert again.exit_code == 0 and "nothing says it stopped" in again.output
    assert path.read_text() == after  # not even rewritten


def test_resume_of_a_completed_job_is_refused_and_nothing_changes(project, runner):
    path = project / "stacks" / "Pulumi.example-gcp.yaml"
    before = path.read_text()
    result = runner.invoke(app, ["resume", "bert-eval", "--stack", "example-gcp", "--no-apply"])
    assert result.exit_code == 1
    assert result.output == "error: job bert-eval is completed; there is nothing to resume (spotctl cleanup bert-eval deletes its disks)\n"
    assert path.read_text() == before


def test_unknown_job_names_the_file_and_the_choices(project, runner):
    result = runner.invoke(app, ["failover", "nope", "--stack", "example-gcp", "--no-apply"])
    assert result.exit_code == 1
    assert result.output == ("error: stacks/Pulumi.example-gcp.yaml: job nope: expected one of 'llm-pretrain', "
                             "'vit-finetune', 'bert-eval', got 'nope'\n")


def test_resume_uses_recorded_events(project, runner, tmp_path):
    events = tmp_path / "events"
    events.mkdir()
    (events / "a.json").write_text(json.dumps({"job": "llm-pretrain", "attempt": 1, "node": 1, "event": "preempted",
                                               "time": "2026-11-21T10:00:00.000Z", "details": {}}))
    result = runner.invoke(app, ["resume", "llm-pretrain", "--stack", "example-gcp", "--no-apply", "--events-dir", str(events), "--json"])
    assert result.exit_code == 0, result.output
    assert json.loads(result.output)["fields"]["attempt"] == 2


def test_status_and_events(project, runner, tmp_path):
    log = tmp_path / "events.jsonl"
    log.write_text("\n".join(json.dumps({"job": "diffusion", "attempt": a, "node": 0, "event": e, "time": t, "details": {}})
                             for a, e, t in [(1, "started", "2026-11-21T10:00:00Z"), (1, "preempted", "2026-11-21T12:00:00Z"),
                                             (2, "started", "2026-11-21T12:30:00Z")]) + "\n")
    result = runner.invoke(app, ["status", "diffusion", "--stack", "example-aws", "--events-dir", str(log), "--json"])
    assert result.exit_code == 0, result.output
    (row,) = json.loads(result.output)
    assert row["preemptions"] == 1 and row["last_event"]["event"] == "started" and row["state"] == "preempted"
    result = runner.invoke(app, ["events", "diffusion", "--stack", "example-aws", "--events-dir", str(log)])
    assert result.output.splitlines()[1].endswith("attempt 1 node 0  preempted")


# ---- applying: the Automation API against a fake pulumi -----------------------------------------------






def test_resume_applies_a_targeted_update_of_exactly_that_job(project, runner, fake_pulumi):
    result = runner.invoke(app, ["resume", "diffusion", "--stack", "example-aws", "--yes"])
    assert result.exit_code == 0, result.output
    assert result.stdout.endswith("— applied\n")
    (up,) = [c for c in pulumi_calls(fake_pulumi) if "up" in c]
    targets = [up[i + 1] for i, a in enumerate(up) if a == "--target"]
    cfg = stackfile.load(stackfile.resolve("example-aws", None))
    expected = job_urns(planner.run(cfg, "example-aws"), "diffusion")
    assert sorted(targets) == expected
    assert sorted(t.split("::")[2].split("$")[-1] for t in targets) == [
        "aws:cloudwatch/eventRule:EventRule", "aws:cloudwatch/eventTarget:EventTarget", "aws:ebs/volume:Volume",
        "aws:ec2/instance:Instance", "aws:ec2/volumeAttachment:VolumeAttachment", "aws:iam/instanceProfile:InstanceProfile",
        "aws:iam/role:Role", "aws:iam/rolePolicy:RolePolicy", "aws:iam/rolePolicy:RolePolicy",  # events, code
        "spotctl:aws:TrainingJob",
    ]
    assert up[-2:] == ["--stack", "example-aws"]


def test_a_multi_node_gang_is_stopped_before_its_new_attempt(project, runner, fake_pulumi, pulumi_state):
    pulumi_state.seed("example-gcp")  # the stack as a plain `pulumi up` left it: both VMs of attempt 1 run
    result = runner.invoke(app, ["resume", "llm-pretrain", "--stack", "example-gcp", "--force", "--yes"])
    assert result.exit_code == 0, result.output
    assert "stopping every node of attempt 1 before the new attempt starts" in result.output
    ups = [c for c in pulumi_calls(fake_pulumi) if "up" in c]
    assert len(ups) == 2
    files = [json.loads(line) for line in Path(str(fake_pulumi) + ".stackfiles").read_text().splitlines()]
    seen = []
    for text in files:
        path = project / "stacks" / "snapshot" / "Pulumi.snap.yaml"
        path.parent.mkdir(exist_ok=True)
        path.write_text(text)
        j = stackfile.load(stackfile.resolve(None, path)).job("llm-pretrain")
        seen.append((j.state.value, j.attempt))
    assert seen == [("stopped", 1), ("running", 2)]  # every old node goes before the new attempt starts
    first_targets = [a for i, a in enumerate(ups[0]) if ups[0][i - 1] == "--target"]
    assert any("compute/instance:Instance::job-llm-pretrain-n1-vm" in t for t in first_targets)
    final = stackfile.load(stackfile.resolve("example-gcp", None)).job("llm-pretrain")
    assert (final.state.value, final.attempt) == ("running", 2)
    # In Pulumi's state: the stop deleted both old VMs, the new attempt created one VM per node.
    stop, start = pulumi_state.ops()
    vm = "gcp:compute/instance:Instance::job-llm-pretrain-n"
    assert sorted(o.split("::")[-1] for o in stop if o.startswith("delete") and vm in o) == ["job-llm-pretrain-n0-vm", "job-llm-pretrain-n1-vm"]
    assert sorted(o.split("::")[-1] for o in start if o.startswith("create") and vm in o) == ["job-llm-pretrain-n0-vm", "job-llm-pretrain-n1-vm"]
    assert [n for n in pulumi_state.named("-vm") if "llm-pretrain" in n] == ["job-llm-pretrain-n0-vm", "job-llm-pretrain-n1-vm"]


def test_no_pulumi_is_reported_before_anything_changes(project, runner, monkeypatch):
    monkeypatch.setenv("PATH", "/nonexistent")
    monkeypatch.delenv("SPOTCTL_PULUMI_ROOT", raising=False)
    path = project / "stacks" / "Pulumi.example-aws.yaml"
    before = path.read_text()
    result = runner.invoke(app, ["resume", "diffusion", "--stack", "example-aws", "--yes"])
    assert result.exit_code == 1
    assert result.output.startswith("error: cannot apply: no `pulumi` CLI found")
    assert path.read_text() == before


def test_locked_stack_undoes_the_edit(project, runner, fake_pulumi, monkeypatch):
    monkeypatch.setenv("FAKE_PULUMI_LOCKED", "1")
    path = project / "stacks" / "Pulumi.example-aws.yaml"
    before = path.read_text()
    result = runner.invoke(app, ["failover", "sweep-07", "--stack", "example-aws", "--yes"])
    assert result.exit_code == 1
    assert "error: cannot apply: stack example-aws is locked by another update" in result.output
    assert path.read_text() == before


def test_failed_update_keeps_the_edit_and_says_so(project, runner, fake_pulumi, monkeypatch):
    monkeypatch.setenv("FAKE_PULUMI_UP_EXIT", "1")
    path = project / "stacks" / "Pulumi.example-aws.yaml"
    result = runner.invoke(app, ["resume", "diffusion", "--stack", "example-aws", "--yes"])
    assert result.exit_code == 1 and "error: pulumi up failed" in result.output
    assert "attempt: 3" in path.read_text()  # the file says what should run; rerunning applies it


# ---- reliability ------------------------------------------------------------------------------------

# One interpreter imports stackfile once, then forks an editor per line it reads: each editor is a
# process of its own that the test SIGKILLs mid-edit, without paying interpreter start-up and imports
# a hundred times (forking from this single-threaded process, not from pytest's, is safe).
EDITORS = """
import os, sys
from pathlib import Path
from cli.lifecycle import stackfile
path = Path(sys.argv[1])
stackfile.edit(path, lambda c, cur: None)  # warm up (lazy imports); changes nothing, writes nothing
for _ in sys.stdin:
    pid = os.fork()
    if pid == 0:
        print("ready", os.getpid(), flush=True)
        i = 0
        while True:
            i += 1
            stackfile.edit(path, lambda c, cur: stackfile.set_job_fields(c, "diffusion", {"attempt": 2 + i % 2}))
            os.write(1, b"edited\\n")  # one write: a kill can never cut the line in two
    os.waitpid(pid, 0)
    print("reaped", flush=True)
"""


def test_kill_9_during_edits_never_leaves_a_broken_file(project):
    path = project / "stacks" / "Pulumi.example-aws.yaml"
    valid = {path.read_text()}
    valid.add(path.read_text().replace("attempt: 2\n      state: preempted", "attempt: 3\n      state: preempted"))
    rng = random.Random(7)
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    seen, pid = set(), None
    editors = subprocess.Popen([sys.executable, "-c", EDITORS, str(path)], env=env, cwd=ROOT, stdin=subprocess.PIPE,
                               stdout=subprocess.PIPE, text=True)
    try:
        for _ in range(100):
            editors.stdin.write("go\n")
            editors.stdin.flush()
            word, pid = editors.stdout.readline().split()
            assert word == "ready"  # forked: the edits start now
            for _ in range(rng.randrange(3)):  # let 0, 1 or 2 edits land (either version is left behind) ...
                assert editors.stdout.readline() == "edited\n"
            time.sleep(rng.random() * 0.03)  # ... then kill anywhere in the next edit (~20 ms idle) or just before it
            os.kill(int(pid), signal.SIGKILL)
            while (line := editors.stdout.readline()) == "edited\n":
                pass
            assert line == "reaped\n"
            pid = None
            text = path.read_text()
            assert text in valid
            seen.add(text)
            stackfile.load(stackfile.resolve(None, path))
    finally:
        if pid is not None:  # the test failed early: the editor may still run
            with contextlib.suppress(ProcessLookupError):
                os.kill(int(pid), signal.SIGKILL)
        editors.stdin.close()
        editors.wait(timeout=60)
        editors.stdout.close()
    assert seen == valid  # the kills did land among the edits (both versions were left behind)


# Twenty `spotctl resume` processes at once: forked from one interpreter that imported the CLI (the
# interpreter start-up and imports of twenty would take a minute on 2 cores). Each child runs the CLI's
# main with its argv, its output in files; the parent prints one "exit JOB CODE" line per child.
RESUMERS = """
import os, sys
from cli.app import main
import cli.commands.jobs, cli.lifecycle.pipeline  # what `resume` imports lazily
jobs, errs = sys.argv[1:-1], sys.argv[-1]
pids = {}
for job in jobs:
    pid = os.fork()
    if pid == 0:
        for stream, name in ((1, job + ".out"), (2, job)):
            os.dup2(os.open(os.path.join(errs, name), os.O_WRONLY | os.O_CREAT), stream)
        sys.argv = ["spotctl", "resume", job, "--stack", "example-aws", "--no-apply"]
        try:
            main()
            code = 0
        except SystemExit as exc:
            code = exc.code if isinstance(exc.code, int) else 1
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)
    pids[pid] = job
for _ in jobs:
    pid, status = os.wait()
    print("exit", pids[pid], os.waitstatus_to_exitcode(status), flush=True)
"""


def test_twenty_concurrent_resumes_lose_no_update(project, tmp_path):
    path = project / "stacks" / "Pulumi.example-aws.yaml"
    text = path.read_text()
    template = text[text.index("    - id: diffusion"): text.index("    # Small sweep worker")]
    extra = "".join(template.replace("id: diffusion", f"id: job-{i:02d}") for i in range(20))
    path.write_text(text.replace("    # Small sweep worker", extra + "    # Small sweep worker"))
    errs = tmp_path / "stderr"
    errs.mkdir()
    jobs = [f"job-{i:02d}" for i in range(20)]
    done = subprocess.run([sys.executable, "-c", RESUMERS, *jobs, str(errs)], cwd=project, env={**os.environ, "PYTHONPATH": str(ROOT)},
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    codes = dict(line.split()[1:] for line in done.stdout.splitlines())
    assert sorted(codes) == jobs
    for job, code in codes.items():
        assert code == "0", (errs / job).read_text()
    cfg = stackfile.load(stackfile.resolve("example-aws", None))
    resumed = [j for j in cfg.jobs if j.id.startswith("job-")]
    assert len(resumed) == 20
    assert all(j.attempt == 3 and j.state is JobState.RUNNING for j in resumed)


# ---- the live policy path: resume asks the job's policy with what its events reveal ------------------


def history(*runs: tuple[float, float, str], attempt0: int = 1) -> list[Event]:
    """Events for runs given as (start minute, end minute, how it ended)."""
    out = []
    for n, (a, b, how) in enumerate(runs, start=attempt0):
        out += [ev("started", n, a), ev(how, n, b)]
    return out


def test_resume_asks_the_jobs_policy():
    from cli.lifecycle.capacity import observation_for, policy_capacity

    now = T0 + timedelta(hours=10)
    # 4 h of work done in 10 h, 4 preemptions; 20 h of work left before a 24 h deadline: on-demand.
    events = history((0, 60, "preempted"), (120, 180, "preempted"), (300, 360, "preempted"), (480, 540, "preempted"))
    tight = job(state="preempted", attempt=4, job_hours=24.0, deadline_hours=24.0, policy="default")
    obs, replay = observation_for(tight, events, now)
    # 4 h running minus four changeovers (0.2 h each until the job records a progress event).
    assert (round(obs.elapsed_h, 3), round(obs.progress_h, 3), obs.preemptions) == (10.0, 3.2, 4)
    assert replay.count(True) == 24 and len(replay) == 60  # 4 h available, 10 h seen (10-minute ticks)
    choose = policy_capacity(now=lambda: now)
    assert choose(tight, events) is Capacity.ON_DEMAND
    # Plenty of slack: back to spot.
    loose = job(state="preempted", attempt=4, job_hours=10.0, deadline_hours=100.0, policy="default")
    assert choose(loose, events) is Capacity.SPOT
    # The industry baseline: after 3 preemptions, on-demand for good, slack or not.
    assert choose(job(state="preempted", attempt=4, job_hours=10.0, deadline_hours=100.0, policy="n-preemptions"), events) is Capacity.ON_DEMAND
    # Without jobHours/deadlineHours: cost per hour of progress; 1 h windows pay for a 0.2 h changeover: spot.
    assert choose(job(state="preempted", attempt=4), events) is Capacity.SPOT
    change = decide_resume(tight, events, choose=choose)
    assert change.fields == {"attempt": 5, "state": "running", "capacity": "on-demand"}


def test_a_gang_stop_that_fails_midway_leaves_the_job_stopped_and_says_why(project, runner, fake_pulumi, monkeypatch):
    monkeypatch.setenv("FAKE_PULUMI_UP_FAIL_AT", "1")  # the old gang's stop fails after it began
    result = runner.invoke(app, ["resume", "llm-pretrain", "--stack", "example-gcp", "--force", "--yes"])
    assert result.exit_code == 1
    said = " ".join(result.output.split())
    assert "error: job llm-pretrain: left stopped at attempt 1: the stop of every node of attempt 1 (before attempt 2) " \
           "failed midway: pulumi up failed" in said, said
    assert "`spotctl resume llm-pretrain` starts attempt 2" in said
    job = stackfile.load(stackfile.resolve("example-gcp", None)).job("llm-pretrain")
    assert (job.state.value, job.attempt) == ("stopped", 1) and "failed midway" in job.stop_reason
    result = runner.invoke(app, ["status", "llm-pretrain", "--stack", "example-gcp", "--json"])
    (row,) = json.loads(result.stdout)
    assert row["status"] == "stopped" and row["status_reason"].startswith("stopped by spotctl: the stop of every node of attempt 1")
    result = runner.invoke(app, ["status", "llm-pretrain", "--stack", "example-gcp"])
    assert "llm-pretrain: stopped by spotctl: the stop of every node" in " ".join(result.stdout.split())

    monkeypatch.delenv("FAKE_PULUMI_UP_FAIL_AT")
    result = runner.invoke(app, ["resume", "llm-pretrain", "--stack", "example-gcp", "--yes"])
    assert result.exit_code == 0, result.output
    job = stackfile.load(stackfile.resolve("example-gcp", None)).job("llm-pretrain")
    assert (job.state.value, job.attempt, job.stop_reason) == ("running", 2, None)  # the reason went with the stop
    assert re.search(r"\n      stopReason:( null)?\n", (project / "stacks" / "Pulumi.example-gcp.yaml").read_text())


def test_a_gang_stopped_whose_new_attempt_cannot_start_is_left_stopped_not_running(project, runner, fake_pulumi, monkeypatch):
    monkeypatch.setenv("FAKE_PULUMI_LOCKED_AT", "2")  # the old gang stopped; then another update holds the stack
    result = runner.invoke(app, ["resume", "llm-pretrain", "--stack", "example-gcp", "--force", "--yes"])
    assert result.exit_code == 1
    said = " ".join(result.output.split())
    assert "job llm-pretrain: left stopped at attempt 1: every node of attempt 1 was stopped, then attempt 2 could not start" in said
    job = stackfile.load(stackfile.resolve("example-gcp", None)).job("llm-pretrain")
    assert (job.state.value, job.attempt) == ("stopped", 1) and "could not start" in job.stop_reason  # not `running`: no VM runs
    monkeypatch.delenv("FAKE_PULUMI_LOCKED_AT")
    result = runner.invoke(app, ["resume", "llm-pretrain", "--stack", "example-gcp", "--yes"])
    assert result.exit_code == 0, result.output
    job = stackfile.load(stackfile.resolve("example-gcp", None)).job("llm-pretrain")
    assert (job.state.value, job.attempt, job.stop_reason) == ("running", 2, None)
