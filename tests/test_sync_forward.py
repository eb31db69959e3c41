"""A merge never moves a job backwards (cli/lifecycle/jobmerge.py, cli/lifecycle/sync.py): the pure
rules, a hand-edited shared copy, and a property over interleaved resume / complete / failover /
hand edits / offline commands / `sync --keep local|shared` on two checkouts sharing one moto S3
bucket: no attempt ever decreases and no job's state moves backwards, in either file or the shared
copy, and no command shows a traceback."""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from cli.lifecycle import sync
from cli.lifecycle.jobmerge import merge_fields, reachable
from infra.basics import JobState
from tests import test_sync
from tests.test_sync import KEY, PATH, STACK, cli, jobs_of, set_field, shared_text

bucket, machines = test_sync.bucket, test_sync.machines

P, R, PR, S, C, F = (JobState(s) for s in ("pending", "running", "preempted", "stopped", "completed", "failed"))


def test_reachable_follows_the_state_machine():
    assert reachable((3, R), (4, R)) and reachable((3, PR), (4, C)) and reachable((1, P), (1, R))
    assert reachable((3, R), (3, C)) and reachable((3, F), (5, F)) and reachable((1, P), (2, PR))
    assert not reachable((3, R), (2, R))  # attempts never decrease
    assert not reachable((3, C), (3, R)) and not reachable((3, C), (5, R))  # completed is final
    assert not reachable((3, PR), (3, R))  # running again needs a new attempt
    assert not reachable((3, R), (4, P))


def test_keep_resolves_only_the_fields_in_conflict():
    base = {"id": "t", "attempt": 3, "state": "running", "command": "a", "capacity": "spot"}
    ours = {**base, "command": "b", "capacity": "on-demand"}
    theirs = {**base, "attempt": 4, "capacity": "spot-x", "zone": "z"}
    assert merge_fields(base, ours, theirs, "local") == {**base, "command": "b", "capacity": "on-demand", "attempt": 4, "zone": "z"}
    assert merge_fields(base, ours, theirs, "shared") == {**base, "command": "b", "capacity": "spot-x", "attempt": 4, "zone": "z"}


def test_keep_local_never_writes_an_older_attempt_or_state_over_the_shared_copy():
    """--keep local over an attempt or a state the shared copy moved past is one error naming the job
    and both states: here an attempt taken back by a hand edit, then a resume here (attempt 4) while
    another machine completed attempt 3 (a merged "attempt 4 completed" never happened)."""
    ours = set_field(set_field(STACK, "train", "attempt", 2), "train", "command", "x")  # a hand edit took attempt back
    theirs = set_field(STACK, "train", "capacity", "on-demand")
    with pytest.raises(sync.Conflict, match=r"job train: cannot go from running \(attempt 3, in the shared copy\) to "
                                            r"running \(attempt 2\) by a merge: attempts never decrease"):
        sync.merge(PATH, STACK, ours, theirs, keep="local", where="the shared copy")
    done = set_field(STACK, "train", "state", "completed")
    running = set_field(set_field(STACK, "train", "attempt", 4), "train", "command", "y")
    with pytest.raises(sync.Conflict, match=r"job train: cannot go from completed \(attempt 3, in the shared copy\) "
                                            r"to completed \(attempt 4\) by a merge: completed is final"):
        sync.merge(PATH, STACK, running, set_field(done, "train", "command", "z"), keep="local", where="the shared copy")


def test_a_hand_edited_shared_copy_that_sets_a_completed_job_running_is_refused(machines, runner):
    laptop = machines("laptop")
    assert cli(runner, "sync", "--events-bucket", "evts").exit_code == 0
    assert cli(runner, "complete", "train", "--no-apply", "--yes").exit_code == 0
    import boto3

    back = set_field(set_field(shared_text(), "train", "state", "running"), "train", "attempt", 5)
    boto3.client("s3", region_name="us-east-1").put_object(Bucket="evts", Key=KEY, Body=back.encode())
    before = laptop.read_text()
    r = cli(runner, "sync")
    assert r.exit_code == 1 and "Traceback" not in r.output
    assert ("job train: cannot go from completed (attempt 3, in stacks/Pulumi.team.yaml) to running (attempt 5) by a merge: "
            "completed is final; nothing was written") in r.output, r.output
    assert laptop.read_text() == before
    r = cli(runner, "status")
    assert "Traceback" not in r.output


# ---- the property: two checkouts, interleaved -----------------------------------------------------------------

OFFLINE = {"AWS_ENDPOINT_URL": "http://127.0.0.1:9", "AWS_MAX_ATTEMPTS": "1"}
steps = st.lists(st.tuples(st.sampled_from(["laptop", "watcher"]),
                           st.sampled_from(["resume", "complete", "failover", "edit", "sync-local", "sync-shared", "sync"]),
                           st.sampled_from(["train", "gang"]), st.booleans()), min_size=2, max_size=7)


def progress_of(text: str) -> dict[str, tuple[int, JobState]]:
    return {j: (int(e.get("attempt", 1)), JobState(e.get("state", "pending"))) for j, e in jobs_of(text.replace("\r\n", "\n")).items()}


@settings(max_examples=10, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(plan=steps)
@example(plan=[("laptop", "edit", "train", False), ("watcher", "resume", "train", False), ("laptop", "sync-local", "train", False)])
@example(plan=[("laptop", "complete", "gang", True), ("watcher", "failover", "gang", False), ("laptop", "sync-shared", "gang", False),
               ("laptop", "sync-local", "gang", False)])
def test_interleaved_commands_on_two_checkouts_never_move_a_job_backwards(machines, runner, monkeypatch, tmp_path_factory, plan):
    import boto3

    s3 = boto3.client("s3", region_name="us-east-1")
    s3.delete_object(Bucket="evts", Key=KEY)
    files = {}
    for name in ("laptop", "watcher"):
        files[name] = machines(name)
        for kept in list(files[name].parent.glob(".spotctl/*")) + list(files[name].parent.glob(".Pulumi.team.yaml.*")):
            if kept.is_file() and not kept.name.endswith(".lock"):
                kept.unlink()
        files[name].write_text(STACK)
        assert cli(runner, "sync", "--events-bucket", "evts").exit_code == 0
    seen = {"laptop": progress_of(STACK), "watcher": progress_of(STACK), "shared": progress_of(STACK)}
    n = 0
    for who, op, job, offline in plan:
        machines(who)
        with monkeypatch.context() as m:
            for k, v in (OFFLINE.items() if offline and not op.startswith("sync") else ()):
                m.setenv(k, v)
            if op == "edit":
                n += 1
                files[who].write_text(set_field(files[who].read_text(), job, "command", f"python train.py --run {n}"))
                r = None
            elif op.startswith("sync"):
                r = cli(runner, "sync", *(["--keep", op.split("-")[1]] if "-" in op else []))
            else:
                r = cli(runner, op, job, "--no-apply", "--yes", *(["--force"] if op == "resume" else []))
        if r is not None:
            assert r.exception is None or isinstance(r.exception, SystemExit), (op, repr(r.exception))
            assert "Traceback" not in r.output
        now = {"laptop": progress_of(files["laptop"].read_text()), "watcher": progress_of(files["watcher"].read_text()),
               "shared": progress_of(shared_text())}
        for where in now:
            for j, after in now[where].items():
                before = seen[where].get(j)
                assert before is None or reachable(before, after), (where, j, before, after, who, op, r and r.output)
        seen = now
