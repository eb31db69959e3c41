"""The stack file's shared copy (`spotctl sync`, cli/lifecycle/sync.py): the per-job three-way merge
on real texts, conditional writes against moto in server mode (S3) and the drill's emulator (GCS JSON
API), and two "machines" (two project directories on one shared bucket) through the CLI: the watcher
acted -> a laptop's resume pulls first; different jobs edited -> merged; the same job -> one error and
the file untouched; a lost race -> decided again; unreachable -> one warning, today's behaviour."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from cli.app import app
from cli.lifecycle import stackfile, sync
from infra.basics import scripts_digest
from infra.config import ConfigError

ROOT = Path(__file__).resolve().parent.parent

STACK = """# team stack: edited by people and by the watcher
config:
  aws:region: us-east-1
  spotctl:cloud: aws
  spotctl:region: us-east-1
  spotctl:zones: [us-east-1a, us-east-1b]
  spotctl:jobs:
    # the single-node job
    - id: train
      instanceType: p4d.24xlarge
      zone: us-east-1a
      command: python train.py   # keep this comment
      attempt: 3
      state: running

    # a gang
    - id: gang
      instanceType: p4d.24xlarge
      zone: us-east-1a
      command: torchrun train.py
      nodes: 2
      attempt: 1
      state: running
"""
KEY = "team.spotctl/Pulumi.team.yaml"
PATH = Path("stacks/Pulumi.team.yaml")


def set_field(text: str, job: str, name: str, value) -> str:
    """``text`` with one job's field changed, as a person or spotctl would edit it (line-preserving)."""
    out = stackfile._splice_job_fields(text, job, {name: value})
    assert out is not None
    return out


def jobs_of(text: str) -> dict[str, dict]:
    doc = stackfile.plain(stackfile._parse(PATH, text, shared=False).doc)
    return {j["id"]: j for j in doc["config"]["spotctl:jobs"]}


# ---- the merge (pure) -------------------------------------------------------------------------------------


def test_different_jobs_changed_on_each_side_are_merged_keeping_the_local_layout():
    ours = set_field(STACK, "train", "attempt", 4)
    theirs = set_field(STACK, "gang", "state", "completed")
    merged = sync.merge(PATH, STACK, ours, theirs)
    assert merged.text == set_field(ours, "gang", "state", "completed")  # every comment and blank line kept
    assert (merged.from_shared, merged.from_local) == (["gang"], ["train"])


def test_the_same_job_changed_on_both_sides_is_one_error_naming_it():
    ours = set_field(STACK, "train", "attempt", 4)
    theirs = set_field(STACK, "train", "capacity", "on-demand")
    with pytest.raises(sync.Conflict) as err:
        sync.merge(PATH, STACK, ours, theirs, where="the shared copy s3://b/k")
    assert str(err.value) == f"{PATH}: job train changed both here and in the shared copy s3://b/k: nothing was written"
    # the same change on both sides is no conflict; --keep picks a side for the fields in conflict
    # only (here none: each side changed another field, and both are kept)
    assert sync.merge(PATH, STACK, ours, ours).text == ours
    both = set_field(ours, "train", "capacity", "on-demand")
    assert sync.merge(PATH, STACK, ours, theirs, keep="shared").text == both
    assert sync.merge(PATH, STACK, ours, theirs, keep="local").text == both
    mine = set_field(ours, "train", "capacity", "spot")
    assert jobs_of(sync.merge(PATH, STACK, mine, theirs, keep="local").text)["train"] | {"attempt": 0} == \
        jobs_of(mine)["train"] | {"attempt": 0}


def test_jobs_added_and_removed_on_the_other_side_arrive_in_place():
    extra = "    - id: extra\n      instanceType: g5.xlarge\n      zone: us-east-1b\n      command: python x.py\n"
    theirs = STACK.replace("\n    # a gang\n", "\n" + extra + "\n    # a gang\n")
    merged = sync.merge(PATH, STACK, STACK, theirs)  # nothing changed here: the shared copy as it is
    assert merged.text == theirs and merged.from_shared == ["extra"]
    ours = set_field(STACK, "gang", "attempt", 2)
    merged = sync.merge(PATH, STACK, ours, theirs)
    assert list(jobs_of(merged.text)) == ["train", "extra", "gang"] and jobs_of(merged.text)["gang"]["attempt"] == 2
    removed = STACK[:STACK.index("\n    # a gang")] + "\n"
    assert list(jobs_of(sync.merge(PATH, STACK, set_field(STACK, "train", "attempt", 5), removed).text)) == ["train"]


def test_without_a_base_only_what_one_side_lacks_is_taken():
    extra = "    - id: extra\n      instanceType: g5.xlarge\n      zone: us-east-1b\n      command: python x.py\n"
    assert list(jobs_of(sync.merge(PATH, None, STACK, STACK + extra).text)) == ["train", "gang", "extra"]
    with pytest.raises(sync.Conflict, match="job train changed both here"):
        sync.merge(PATH, None, STACK, set_field(STACK, "train", "attempt", 9))
    # A job only this file has: without a base it may be one the team removed, so the shared copy stands.
    merged = sync.merge(PATH, None, STACK + extra, STACK)
    assert merged.text == STACK and merged.dropped == ["extra"]


def test_a_merge_that_is_not_a_valid_stack_file_is_refused_naming_where_it_came_from():
    theirs = set_field(STACK, "gang", "zone", "us-west-2a")  # not in the region
    with pytest.raises(ConfigError, match=r"^stacks/Pulumi.team.yaml \(merged with the shared copy\): spotctl:jobs\[1\].zone"):
        sync.merge(PATH, STACK, set_field(STACK, "train", "attempt", 4), theirs)
    with pytest.raises(ConfigError, match=r"^the shared copy: spotctl:jobs\[1\].zone"):
        sync.merge(PATH, STACK, STACK, theirs)  # nothing changed here: the shared copy alone is refused


ids = st.sampled_from(["train", "gang"])


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(ours_edits=st.dictionaries(ids, st.integers(3, 50), max_size=2), theirs_edits=st.dictionaries(ids, st.integers(3, 50), max_size=2))
def test_merge_takes_each_jobs_change_from_the_side_that_made_it(ours_edits, theirs_edits):
    """(Attempts from 3, train's: a merge that takes one back is refused, tests/test_sync_forward.py.)"""
    ours, theirs = STACK, STACK
    for job, attempt in ours_edits.items():
        ours = set_field(ours, job, "attempt", attempt)
    for job, attempt in theirs_edits.items():
        theirs = set_field(theirs, job, "attempt", attempt)
    base = jobs_of(STACK)
    clash = [j for j in ("train", "gang") if jobs_of(ours)[j] != base[j] and jobs_of(theirs)[j] != base[j]
             and jobs_of(ours)[j] != jobs_of(theirs)[j]]
    if clash:
        with pytest.raises(sync.Conflict, match=f"job {clash[0]}"):
            sync.merge(PATH, STACK, ours, theirs)
        return
    merged = jobs_of(sync.merge(PATH, STACK, ours, theirs).text)
    for job in ("train", "gang"):
        want = theirs_edits.get(job) if jobs_of(ours)[job] == base[job] else ours_edits.get(job)
        assert merged[job]["attempt"] == (want if want is not None else base[job]["attempt"])


# ---- S3: moto in server mode --------------------------------------------------------------------------


@pytest.fixture
def bucket(moto_server):
    import boto3

    boto3.client("s3", region_name="us-east-1").create_bucket(Bucket="evts")
    return "evts"


def shared_text(bucket_name: str = "evts") -> str:
    import boto3

    return boto3.client("s3", region_name="us-east-1").get_object(Bucket=bucket_name, Key=KEY)["Body"].read().decode()


def cloud():
    from cli.cloud import Cloud
    from infra.config import StackConfig

    return Cloud(StackConfig.model_validate({"cloud": "aws", "region": "us-east-1", "zones": ["us-east-1a"]}), "team")


def test_s3_conditional_writes_never_overwrite_each_other(bucket):
    from cli.cloud import PreconditionFailed

    c = cloud()
    assert c.object_generation(bucket, KEY) is None and c.read_object(bucket, KEY) is None
    first = c.write_object(bucket, KEY, b"one", None)  # If-None-Match: *
    with pytest.raises(PreconditionFailed):
        c.write_object(bucket, KEY, b"two", None)  # it exists now
    second = c.write_object(bucket, KEY, b"two", first)  # If-Match: the ETag seen
    with pytest.raises(PreconditionFailed):
        c.write_object(bucket, KEY, b"three", first)  # a writer that saw "one": loses
    assert c.read_object(bucket, KEY) == (b"two", second) and c.object_generation(bucket, KEY) == second


@pytest.fixture
def machines(tmp_path, monkeypatch, bucket):
    """Two checkouts of one project (a laptop and the watcher VM) sharing the bucket; ``use(name)``
    makes one the working directory. Both start synced with the same file."""
    homes = {}
    for name in ("laptop", "watcher"):
        home = tmp_path / name
        (home / "stacks").mkdir(parents=True)
        shutil.copy(ROOT / "Pulumi.yaml", home / "Pulumi.yaml")
        (home / "stacks" / "Pulumi.team.yaml").write_text(STACK)
        homes[name] = home
    monkeypatch.delenv("PULUMI_STACK", raising=False)

    def use(name: str) -> Path:
        monkeypatch.chdir(homes[name])
        return homes[name] / "stacks" / "Pulumi.team.yaml"

    return use


def cli(runner, *args: str):
    return runner.invoke(app, [*args, "--stack", "team"])


def events(path: Path, *docs: tuple) -> Path:
    with path.open("a") as fh:
        for job, attempt, event, minute in docs:
            fh.write(json.dumps({"job": job, "attempt": attempt, "node": 0, "event": event,
                                 "time": f"2026-11-21T10:{minute:02d}:00+00:00", "details": {}}) + "\n")
    return path


def test_sync_creates_then_pulls_and_pushes(machines, runner):
    laptop = machines("laptop")
    first = cli(runner, "sync", "--events-bucket", "evts", "--json")
    assert first.exit_code == 0, first.output
    report = json.loads(first.stdout)
    assert (report["pushed"], report["pulled"], report["key"]) == (True, False, KEY)
    assert shared_text() == STACK == laptop.read_text()
    again = cli(runner, "sync")  # the bucket is remembered
    assert again.exit_code == 0 and again.stdout.startswith(f"{PATH}: in sync with the shared copy s3://evts/{KEY}")
    laptop.write_text(set_field(STACK, "gang", "capacity", "on-demand"))  # a hand edit
    pushed = cli(runner, "sync")
    assert pushed.exit_code == 0 and "written to the shared copy" in pushed.stdout
    assert jobs_of(shared_text())["gang"]["capacity"] == "on-demand"


def test_the_watcher_acted_then_a_laptop_resume_pulls_first_and_uses_the_new_attempt(machines, runner, tmp_path):
    machines("laptop")
    assert cli(runner, "sync", "--events-bucket", "evts").exit_code == 0
    watcher_file = machines("watcher")
    assert cli(runner, "sync", "--events-bucket", "evts").exit_code == 0
    seen = events(tmp_path / "ev.jsonl", ("train", 3, "preempted", 30))
    acted = cli(runner, "watch", "--once", "--no-poll", "--no-apply", "--json", "--events-dir", str(seen))
    assert acted.exit_code == 0, acted.output
    assert jobs_of(watcher_file.read_text())["train"]["attempt"] == 4
    assert jobs_of(shared_text())["train"]["attempt"] == 4  # pushed right after the edit

    laptop_file = machines("laptop")
    assert jobs_of(laptop_file.read_text())["train"]["attempt"] == 3  # stale until it pulls
    status = cli(runner, "status")
    assert status.exit_code == 0 and f"{PATH} is behind the shared copy s3://evts/{KEY}" in flat(status.stderr)
    # The laptop's resume sees the old attempt's preemption: after the pull that attempt is history.
    stale = cli(runner, "resume", "train", "--no-apply", "--events-dir", str(seen), "--json")
    assert stale.exit_code == 0, stale.output
    assert json.loads(stale.stdout)["changed"] is False
    assert jobs_of(laptop_file.read_text())["train"]["attempt"] == 4
    # comments and blank lines kept (and the scripts attempt 4 started with: infra.basics.scripts_digest)
    assert laptop_file.read_text() == set_field(set_field(STACK, "train", "attempt", 4), "train", "scriptsDigest", scripts_digest())
    events(seen, ("train", 4, "preempted", 50))
    fresh = cli(runner, "resume", "train", "--no-apply", "--events-dir", str(seen), "--json")
    assert json.loads(fresh.stdout)["fields"] == {"attempt": 5, "state": "running"}
    assert jobs_of(shared_text())["train"]["attempt"] == 5


def watcher_completed_gang(machines, runner) -> Path:
    """Both machines synced, the watcher completed `gang` and pushed; back on the laptop (its file)."""
    laptop_file = machines("laptop")
    assert cli(runner, "sync", "--events-bucket", "evts").exit_code == 0
    machines("watcher")
    assert cli(runner, "sync", "--events-bucket", "evts").exit_code == 0
    assert cli(runner, "complete", "gang", "--no-apply").exit_code == 0  # the watcher's edit, pushed
    machines("laptop")
    return laptop_file


def test_edits_of_different_jobs_on_two_machines_are_merged(machines, runner):
    laptop_file = watcher_completed_gang(machines, runner)
    laptop_file.write_text(set_field(STACK, "train", "capacity", "on-demand"))  # a hand edit, not pushed yet
    result = cli(runner, "sync", "--json")
    assert result.exit_code == 0, result.output
    report = json.loads(result.stdout)
    assert (report["from_shared"], report["from_local"], report["pushed"]) == (["gang"], ["train"], True)
    want = set_field(set_field(STACK, "train", "capacity", "on-demand"), "gang", "state", "completed")
    assert laptop_file.read_text() == want and shared_text() == want


def test_a_hand_save_while_sync_merges_is_kept_and_nothing_written(machines, runner, monkeypatch):
    """sync's merge writes the stack file whole: an editor's save made meanwhile is kept (the file is
    checked right before the rename) and the command says to run it again."""
    from cli.lifecycle import stackfile

    laptop_file = watcher_completed_gang(machines, runner)
    saved = set_field(STACK, "train", "capacity", "on-demand")
    real, done = os.fsync, []

    def save_during_the_write(fd):
        if os.readlink(f"/proc/self/fd/{fd}").endswith(".tmp") and not done:
            done.append(laptop_file.write_text(saved))
        return real(fd)

    monkeypatch.setattr(stackfile.os, "fsync", save_during_the_write)
    result = cli(runner, "sync")
    assert done and result.exit_code == 1
    assert "the file changed while this command edited it" in result.stderr
    assert laptop_file.read_text() == saved


def test_the_same_job_edited_on_two_machines_is_an_error_and_nothing_is_written(machines, runner):
    laptop_file = machines("laptop")
    assert cli(runner, "sync", "--events-bucket", "evts").exit_code == 0
    machines("watcher")
    assert cli(runner, "sync", "--events-bucket", "evts").exit_code == 0
    assert cli(runner, "failover", "train", "--no-apply").exit_code == 0  # pushed: train on on-demand, attempt 4
    machines("laptop")
    mine = set_field(STACK, "train", "command", "python train.py --lr 3e-4").replace("\n", "\r\n")  # CRLF, as on Windows
    laptop_file.write_bytes(mine.encode())
    result = cli(runner, "complete", "gang", "--no-apply")
    assert result.exit_code == 1
    assert result.output == (f"error: {PATH}: job train changed both here and in the shared copy s3://evts/{KEY} "
                             f"(generation {json.loads(shared_etag())}): nothing was written (keep one side: "
                             "`spotctl sync --stack team --keep local` or `--keep shared`, or make the job the same in both)\n")
    assert laptop_file.read_bytes() == mine.encode()  # not even gang's completion
    kept = cli(runner, "sync", "--keep", "local")
    assert kept.exit_code == 0, kept.output
    # --keep local keeps this file's side of the fields in conflict (none here: only this file changed the
    # command); the failover made elsewhere (attempt, capacity) is taken, never written back over
    train = jobs_of(laptop_file.read_bytes().decode().replace("\r\n", "\n"))["train"]
    assert (train["command"], train["capacity"], train["attempt"]) == ("python train.py --lr 3e-4", "on-demand", 4)
    assert b"\r\n" in laptop_file.read_bytes() and b"\n" not in laptop_file.read_bytes().replace(b"\r\n", b"")  # line ends kept
    assert jobs_of(shared_text().replace("\r\n", "\n")) == jobs_of(laptop_file.read_bytes().decode().replace("\r\n", "\n"))


def shared_etag() -> str:
    import boto3

    return json.dumps(boto3.client("s3", region_name="us-east-1").head_object(Bucket="evts", Key=KEY)["ETag"])


def test_a_lost_race_rolls_back_pulls_and_decides_again(machines, runner):
    """Between this machine's pull and its push another writer wins: the conditional write fails, the
    local edit is undone, what won is merged, and the edit is decided again on it."""
    from cli.cloud import Cloud

    path = machines("laptop")
    assert cli(runner, "sync", "--events-bucket", "evts").exit_code == 0
    real = cloud()

    class Racing(Cloud):
        raced = False

        def write_object(self, bucket, key, data, expected):
            if not Racing.raced:  # the watcher pushes first
                Racing.raced = True
                real.write_object(bucket, key, set_field(STACK, "train", "capacity", "on-demand").encode(), expected)
            return real.write_object(bucket, key, data, expected)

    session = sync.Shared(stackfile.resolve("team", None), Racing(real.cfg, "team"), "evts", warn=pytest.fail)
    decided: list[str] = []

    def decide(current, written):
        decided.append(current.job("train").capacity.value)
        return {"attempt": written["attempt"] + 1}

    with stackfile.sharing(path, session):
        stackfile.update_job(path, "train", decide)
    assert decided == ["spot", "on-demand"]  # decided again, on the file with the watcher's edit
    want = set_field(set_field(STACK, "train", "capacity", "on-demand"), "train", "attempt", 4)
    assert path.read_text() == want and shared_text() == want


def test_unreachable_bucket_is_one_warning_and_the_command_works_as_today(machines, runner, monkeypatch):
    path = machines("laptop")
    assert cli(runner, "sync", "--events-bucket", "evts").exit_code == 0
    monkeypatch.setenv("AWS_ENDPOINT_URL", "http://127.0.0.1:9")  # nothing listens there
    monkeypatch.setenv("AWS_MAX_ATTEMPTS", "1")
    result = cli(runner, "complete", "gang", "--no-apply")
    assert result.exit_code == 0, result.output
    warnings = [line for line in result.stderr.splitlines() if line.startswith("warning:")]
    assert len(warnings) == 1 and f"the shared copy s3://evts/{KEY} cannot be reached" in warnings[0]
    assert result.stdout.startswith("job gang: state=completed (") and result.stdout.endswith(f"— written to {PATH}; nothing applied (pulumi was not run)\n")
    assert jobs_of(path.read_text())["gang"]["state"] == "completed"
    monkeypatch.undo()  # reachable again (the fixtures' environment is set up anew below)


def test_a_stack_file_never_synced_is_left_alone(project, runner, fake_pulumi):
    """No record and no watcher: no bucket is asked, no warning, nothing in stacks/.spotctl about sync."""
    result = runner.invoke(app, ["complete", "bert-eval", "--stack", "example-gcp", "--no-apply"])
    assert result.exit_code == 0 and "warning" not in result.output
    assert not sync.record_path(Path("stacks/Pulumi.example-gcp.yaml")).exists()


def test_the_watcher_sees_jobs_added_elsewhere(machines, runner, tmp_path):
    machines("watcher")
    assert cli(runner, "sync", "--events-bucket", "evts").exit_code == 0
    laptop_file = machines("laptop")
    assert cli(runner, "sync", "--events-bucket", "evts").exit_code == 0
    added = STACK + "    - id: extra\n      instanceType: g5.xlarge\n      zone: us-east-1b\n      command: python x.py\n" \
                    "      attempt: 1\n      state: running\n"
    laptop_file.write_text(added)
    assert cli(runner, "sync").exit_code == 0
    machines("watcher")
    seen = events(tmp_path / "ev.jsonl", ("extra", 1, "preempted", 10))
    result = cli(runner, "watch", "--once", "--no-poll", "--no-apply", "--json", "--events-dir", str(seen))
    assert result.exit_code == 0, result.output
    acted = [json.loads(line) for line in result.stdout.splitlines()]
    assert [(a["job"], a["action"], a["fields"]) for a in acted] == [("extra", "resume", {"attempt": 2, "state": "running"})]
    assert jobs_of(shared_text())["extra"]["attempt"] == 2


# ---- GCS: the drill's emulator (JSON API, ifGenerationMatch) ---------------------------------------------


def test_gcs_path_pulls_merges_and_refuses_a_stale_generation(project, runner, monkeypatch):
    from cli.cloud import Cloud, PreconditionFailed
    from cli.drill.emulator import Emulator

    path = project / "stacks" / "Pulumi.example-gcp.yaml"
    key = "example-gcp.spotctl/Pulumi.example-gcp.yaml"
    with Emulator() as emu:
        monkeypatch.setenv("SPOTCTL_GCS_ENDPOINT", emu.url)
        first = runner.invoke(app, ["sync", "--stack", "example-gcp", "--events-bucket", "gcs-evts", "--json"])
        assert first.exit_code == 0, first.output
        generation = json.loads(first.stdout)["generation"]
        c = Cloud(stackfile.load(stackfile.resolve("example-gcp", None)), "example-gcp")
        assert c.read_object("gcs-evts", key) == (path.read_bytes(), generation)
        edited = stackfile._splice_job_fields(path.read_text(), "vit-finetune", {"attempt": 4})
        newer = c.write_object("gcs-evts", key, edited.encode(), generation)  # another machine
        with pytest.raises(PreconditionFailed):
            c.write_object("gcs-evts", key, b"stale", generation)
        with pytest.raises(PreconditionFailed):
            c.write_object("gcs-evts", key, b"exists", None)
        result = runner.invoke(app, ["sync", "--stack", "example-gcp", "--json"])
        assert result.exit_code == 0, result.output
        assert json.loads(result.stdout)["from_shared"] == ["vit-finetune"] and json.loads(result.stdout)["generation"] == newer
        assert path.read_text() == edited


# ---- the stacks: who may write the shared copy, and that it never expires ---------------------------------

WATCHER = {"repo": "https://github.com/team/infra.git"}


@pytest.fixture(scope="module")
def plans():
    from cli.plan import mocks as planner
    from infra.config import validate
    from tests.conftest import AWS_BASE, GCP_BASE, aws_job, gcp_job, stack_config

    nat = {"subnets": {"us-east-1a": "subnet-0aaa0001", "us-east-1b": "subnet-0aaa0002"}, "egress": "nat",
           "natSubnet": "subnet-0aaa0009"}
    aws_raw = {**stack_config(AWS_BASE, network=nat, jobs=[aws_job()]),
               "watcher": {**WATCHER, "backend": "s3://team-state/pulumi", "passphraseSecret": "/spotctl/team/passphrase"}}
    gcp_raw = {**stack_config(GCP_BASE, jobs=[gcp_job()]),
               "watcher": {**WATCHER, "backend": "gs://team-state/pulumi", "passphraseSecret": "pulumi-passphrase"}}
    return {"aws": planner.run(validate(aws_raw, "aws"), "team"), "gcp": planner.run(validate(gcp_raw, "gcp"), "team")}


def one(plan, type_: str, name: str):
    (found,) = [r for r in plan.by_type(type_) if r.name == name]
    return found


def test_aws_only_the_watcher_writes_the_shared_copy_and_only_it(plans):
    from tests.iam_eval import allowed

    plan = plans["aws"]
    watcher = json.loads(one(plan, "aws:iam/rolePolicy:RolePolicy", "watcher-policy").inputs["policy"])
    bucket = next(s["Resource"] for s in watcher["Statement"] if s["Sid"] == "ListEvents")  # the bucket's (mocked) ARN
    shared = f"{bucket}/team.spotctl/Pulumi.team.yaml"
    assert allowed(watcher, "s3:PutObject", shared) and allowed(watcher, "s3:GetObject", shared)
    for other in ("team.spotctl/Pulumi.other.yaml", "team/train/attempt-1/node-0/x.json", "team.spotctl/x"):
        assert not allowed(watcher, "s3:PutObject", f"{bucket}/{other}"), other
    job = json.loads(one(plan, "aws:iam/rolePolicy:RolePolicy", "job-train-events-policy").inputs["policy"])
    assert allowed(job, "s3:PutObject", f"{bucket}/team/train/attempt-1/node-0/x.json")
    assert not allowed(job, "s3:PutObject", shared)  # a job VM cannot rewrite the stack file
    rule = one(plan, "aws:s3/bucketLifecycleConfiguration:BucketLifecycleConfiguration", "stack-events-lifecycle").inputs["rules"][0]
    assert rule["filter"] == {"prefix": "team/"}  # events and logs expire; team.spotctl/... does not


def test_gcp_only_the_watcher_writes_the_shared_copy_and_it_never_expires(plans):
    plan = plans["gcp"]
    bucket = one(plan, "gcp:storage/bucket:Bucket", "stack-events").inputs
    grant = one(plan, "gcp:storage/bucketIAMMember:BucketIAMMember", "watcher-stack-file").inputs
    assert grant["role"] == "roles/storage.objectAdmin" and grant["bucket"] == bucket["name"]
    assert grant["condition"]["expression"] == (
        f'resource.name == "projects/_/buckets/{bucket["name"]}/objects/team.spotctl/Pulumi.team.yaml" || '
        f'resource.name == "projects/_/buckets/{bucket["name"]}/objects/team.spotctl/watch.lease"')  # and the watch lease
    job_writer = one(plan, "gcp:storage/bucketIAMMember:BucketIAMMember", "job-train-sa-events-writer").inputs
    assert job_writer["condition"]["expression"].endswith('/objects/team/train/")')  # not the shared copy
    assert bucket["lifecycleRules"][0]["condition"]["matchesPrefixes"] == ["team/"]


def test_a_watcher_that_never_synced_takes_the_shared_copy_of_a_job_both_changed(machines, runner, tmp_path):
    """The watcher VM's checkout is a fresh clone: where it and the team's live copy differ, the live copy wins."""
    declared = STACK.replace("  spotctl:jobs:\n", "  spotctl:network:\n    subnets: {us-east-1a: subnet-0aaa0001, us-east-1b: subnet-0aaa0002}\n"
                             "    egress: nat\n    natSubnet: subnet-0aaa0009\n  spotctl:watcher:\n"
                             "    backend: s3://team-state/pulumi\n    repo: https://github.com/team/infra.git\n"
                             "    passphraseSecret: /spotctl/team/passphrase\n  spotctl:jobs:\n")
    laptop_file = machines("laptop")
    laptop_file.write_text(set_field(declared, "train", "attempt", 7))  # resumed since the commit the VM cloned
    assert cli(runner, "sync", "--events-bucket", "evts").exit_code == 0
    watcher_file = machines("watcher")
    watcher_file.write_text(set_field(declared, "train", "attempt", 6))  # the clone: another version of train
    seen = events(tmp_path / "ev.jsonl", ("train", 7, "preempted", 30))
    result = cli(runner, "watch", "--once", "--no-poll", "--no-apply", "--json", "--events-dir", str(seen), "--events-bucket", "evts")
    assert result.exit_code == 0, result.output
    assert [(a["job"], a["fields"]) for a in map(json.loads, result.stdout.splitlines())] == [("train", {"attempt": 8, "state": "running"})]
    assert jobs_of(shared_text())["train"]["attempt"] == 8


def test_a_job_added_on_another_machine_can_be_resumed_here_at_once(machines, runner, tmp_path):
    machines("watcher")
    assert cli(runner, "sync", "--events-bucket", "evts").exit_code == 0
    laptop_file = machines("laptop")
    assert cli(runner, "sync", "--events-bucket", "evts").exit_code == 0
    laptop_file.write_text(STACK + "    - id: extra\n      instanceType: g5.xlarge\n      zone: us-east-1b\n"
                                   "      command: python x.py\n      attempt: 1\n      state: preempted\n")
    assert cli(runner, "sync").exit_code == 0
    machines("watcher")  # its file has no job extra yet: the resume pulls it first
    result = cli(runner, "resume", "extra", "--no-apply", "--json")
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout)["fields"] == {"attempt": 2, "state": "running"}


def test_a_crlf_file_with_a_byte_order_mark_keeps_both_through_a_merge(machines, runner):
    laptop_file = machines("laptop")
    laptop_file.write_bytes(("\ufeff" + STACK.replace("\n", "\r\n")).encode())
    assert cli(runner, "sync", "--events-bucket", "evts").exit_code == 0
    machines("watcher")
    assert cli(runner, "sync", "--events-bucket", "evts", "--keep", "shared").exit_code == 0  # takes the laptop's copy
    assert cli(runner, "complete", "gang", "--no-apply").exit_code == 0  # LF here, pushed
    machines("laptop")
    mine = set_field(STACK, "train", "capacity", "on-demand")
    laptop_file.write_bytes(("\ufeff" + mine.replace("\n", "\r\n")).encode())
    result = cli(runner, "sync")
    assert result.exit_code == 0, result.output
    want = set_field(mine, "gang", "state", "completed")
    assert laptop_file.read_bytes() == ("\ufeff" + want.replace("\n", "\r\n")).encode()


# ---- faults: a push lost to the network, a kill -9 before the push, a blip, a broken shared copy ------------


def test_a_push_lost_to_the_network_fails_the_command_with_the_edit_undone(machines, runner, tmp_path, monkeypatch, fake_pulumi):
    """Else the command applies an edit the watcher never sees, and the watcher resumes the same job again."""
    from cli.cloud import Cloud, CloudError
    from tests.conftest import pulumi_calls

    machines("watcher")
    assert cli(runner, "sync", "--events-bucket", "evts").exit_code == 0
    laptop = machines("laptop")
    assert cli(runner, "sync", "--events-bucket", "evts").exit_code == 0
    seen = events(tmp_path / "ev.jsonl", ("train", 3, "preempted", 30))
    real_write = Cloud.write_object

    def reset(*args, **kw):
        raise CloudError("connection reset")

    monkeypatch.setattr(Cloud, "write_object", reset)
    lost = cli(runner, "resume", "train", "--yes", "--events-dir", str(seen))
    assert lost.exit_code == 1
    assert lost.output.endswith(f"error: {PATH}: the shared copy s3://evts/{KEY} cannot be written (connection reset): "
                           "the edit was undone here and nothing was applied; run the command again\n")
    assert laptop.read_text() == STACK and not [c for c in pulumi_calls(fake_pulumi) if "up" in c]
    assert sync.read_record(laptop).unpushed is False
    monkeypatch.setattr(Cloud, "write_object", real_write)
    machines("watcher")  # the watcher resumes train once, and the laptop sees it
    acted = cli(runner, "watch", "--once", "--no-poll", "--no-apply", "--json", "--events-dir", str(seen))
    assert [(a["job"], a["fields"]) for a in map(json.loads, acted.stdout.splitlines())] == [("train", {"attempt": 4, "state": "running"})]
    machines("laptop")
    again = cli(runner, "resume", "train", "--no-apply", "--events-dir", str(seen), "--json")
    assert again.exit_code == 0 and json.loads(again.stdout)["changed"] is False  # attempt 3's preemption is history
    assert jobs_of(laptop.read_text())["train"]["attempt"] == 4


def test_a_kill_before_the_push_leaves_a_mark_that_status_shows_and_the_next_lock_pushes(machines, runner, monkeypatch):
    path = machines("laptop")
    assert cli(runner, "sync", "--events-bucket", "evts").exit_code == 0

    def killed(self):
        raise KeyboardInterrupt  # stands for kill -9: nothing after the file's write runs

    real_push = sync.Shared.push
    monkeypatch.setattr(sync.Shared, "push", killed)
    cli(runner, "complete", "gang", "--no-apply")
    monkeypatch.setattr(sync.Shared, "push", real_push)
    assert jobs_of(path.read_text())["gang"]["state"] == "completed" and sync.read_record(path).unpushed
    assert jobs_of(shared_text())["gang"]["state"] == "running"
    status = cli(runner, "status")
    assert status.exit_code == 0
    assert f"warning: {PATH} has edits not pushed to the shared copy s3://evts/{KEY}" in flat(status.stderr)
    session = sync.Shared(stackfile.resolve("team", None), cloud(), "evts", warn=pytest.fail)
    with stackfile.sharing(path, session):
        stackfile.pull_shared(path)  # the next lock, before any decision: pushed first
    assert jobs_of(shared_text())["gang"]["state"] == "completed" and not sync.read_record(path).unpushed
    assert "not pushed" not in cli(runner, "status").stderr


def test_an_offline_edit_is_marked_unpushed_and_pushed_by_the_next_command(machines, runner, monkeypatch):
    path = machines("laptop")
    assert cli(runner, "sync", "--events-bucket", "evts").exit_code == 0
    endpoint = os.environ["AWS_ENDPOINT_URL"]
    monkeypatch.setenv("AWS_ENDPOINT_URL", "http://127.0.0.1:9")  # nothing listens there
    monkeypatch.setenv("AWS_MAX_ATTEMPTS", "1")
    assert cli(runner, "complete", "gang", "--no-apply").exit_code == 0  # today's offline behaviour
    assert sync.read_record(path).unpushed
    monkeypatch.setenv("AWS_ENDPOINT_URL", endpoint)  # reachable again
    resumed = cli(runner, "failover", "train", "--no-apply")
    assert resumed.exit_code == 0, resumed.output
    shared = jobs_of(shared_text())
    assert shared["gang"]["state"] == "completed" and shared["train"]["attempt"] == 4


def test_one_blip_makes_a_session_offline_only_until_it_retries(machines, runner):
    from cli.cloud import Cloud, CloudError

    path = machines("watcher")
    assert cli(runner, "sync", "--events-bucket", "evts").exit_code == 0
    real = cloud()

    class Blip(Cloud):
        n = 0

        def object_generation(self, b, k):
            Blip.n += 1
            if Blip.n == 1:
                raise CloudError("read timeout")
            return real.object_generation(b, k)

    warned: list[str] = []
    s = sync.Shared(stackfile.resolve("team", None), Blip(real.cfg, "team"), "evts", warn=warned.append)
    assert s.pull() is None and len(warned) == 1 and "read timeout" in warned[0]
    real.write_object("evts", KEY, set_field(STACK, "gang", "state", "completed").encode(), real.object_generation("evts", KEY))
    s.retry()
    assert s.pull().from_shared == ["gang"] and jobs_of(path.read_text())["gang"]["state"] == "completed"
    s.strict = True  # the watcher's session: unreachable is an error, never the local file alone
    Blip.n = 0
    with pytest.raises(stackfile.SharedCopyUnreachable, match=f"s3://evts/{KEY}: cannot be reached \\(read timeout\\)"):
        s.pull()


def watcher_cycles(vm: Path, sources, sleep, cycles: int = 2):
    from datetime import UTC, datetime

    from cli.watch import watcher
    from tests.test_watch_lease import Clock, run_watcher

    acted, warned = [], []
    report = watcher.Report(emit=acted.append, warn=warned.append, out=lambda line: None)
    run_watcher(vm.parent.parent, report, Clock(datetime.now(UTC)), sources, once=False, cycles=cycles, sleep=sleep)
    return acted, warned


def test_after_a_blip_the_watcher_pulls_again_and_never_resumes_a_job_completed_elsewhere(machines, runner, tmp_path, monkeypatch):
    from cli.cloud import Cloud, CloudError
    from cli.watch import observe

    machines("laptop")
    assert cli(runner, "sync", "--events-bucket", "evts").exit_code == 0
    vm = machines("watcher")
    assert cli(runner, "sync", "--events-bucket", "evts").exit_code == 0
    seen = tmp_path / "ev.jsonl"
    seen.write_text("")
    real_gen = Cloud.object_generation
    calls = {"n": 0}

    def gen(self, b, k):
        if k == KEY:
            calls["n"] += 1
            if calls["n"] == 1:
                raise CloudError("read timeout")  # one blip at the first cycle's pull
        return real_gen(self, b, k)

    monkeypatch.setattr(Cloud, "object_generation", gen)

    def between(seconds):
        monkeypatch.chdir(vm.parent.parent.parent / "laptop")
        assert cli(runner, "complete", "train", "--no-apply").exit_code == 0  # the user finished train
        monkeypatch.chdir(vm.parent.parent)
        events(seen, ("train", 3, "preempted", 30))  # a late preemption notice of the finished job's VM

    acted, warned = watcher_cycles(vm, observe.Sources(seen, None, None, None, poll=False), between)
    assert [a for a in acted if a["action"] != "record"] == []
    assert jobs_of(vm.read_text())["train"]["state"] == "completed" and jobs_of(shared_text())["train"]["state"] == "completed"


def test_while_the_shared_copy_cannot_be_reached_the_watcher_holds_back_and_acts_once_it_can(machines, runner, tmp_path, monkeypatch):
    from cli.cloud import Cloud, CloudError
    from cli.watch import observe

    vm = machines("watcher")
    assert cli(runner, "sync", "--events-bucket", "evts").exit_code == 0
    seen = events(tmp_path / "ev.jsonl", ("train", 3, "preempted", 30))
    real_gen = Cloud.object_generation
    cut = {"on": True}

    def gen(self, b, k):
        if k == KEY and cut["on"]:
            raise CloudError("read timeout")
        return real_gen(self, b, k)

    monkeypatch.setattr(Cloud, "object_generation", gen)
    acted, warned = watcher_cycles(vm, observe.Sources(seen, None, None, None, poll=False), lambda s: cut.update(on=False))
    held = [w for w in warned if "held back" in w]
    assert held == [f"the shared copy s3://evts/{KEY}: cannot be reached (read timeout): 1 action(s) held back (train) "
                    "rather than taken on a stack file that may be stale; tried again next cycle"]
    assert [(a["job"], a["action"], a["fields"]) for a in acted] == [("train", "resume", {"attempt": 4, "state": "running"})]
    assert jobs_of(shared_text())["train"]["attempt"] == 4


def test_a_fresh_watcher_clone_does_not_bring_back_a_job_the_team_removed(machines, runner):
    declared = STACK.replace("  spotctl:jobs:\n", "  spotctl:network:\n    subnets: {us-east-1a: subnet-0aaa0001, us-east-1b: subnet-0aaa0002}\n"
                             "    egress: nat\n    natSubnet: subnet-0aaa0009\n  spotctl:watcher:\n"
                             "    backend: s3://team-state/pulumi\n    repo: https://github.com/team/infra.git\n"
                             "    passphraseSecret: /spotctl/team/passphrase\n  spotctl:jobs:\n")
    removed = declared[:declared.index("\n    # a gang")] + "\n"  # the team removed gang after the commit
    laptop = machines("laptop")
    laptop.write_text(removed)
    assert cli(runner, "sync", "--events-bucket", "evts").exit_code == 0
    vm = machines("watcher")
    vm.write_text(declared)  # the VM's fresh clone of the commit that still has gang
    result = cli(runner, "watch", "--once", "--no-poll", "--no-apply", "--json", "--events-bucket", "evts")
    assert result.exit_code == 0, result.output
    assert jobs_of(vm.read_text()) == jobs_of(removed)  # gang stays removed
    saved = vm.parent / ".spotctl" / "Pulumi.team.yaml.unsynced"
    assert saved.read_text() == declared  # nothing lost: the clone as it was
    assert (f"warning: {PATH} was never synced with the shared copy s3://evts/{KEY} (generation" in result.stderr
            and "job(s) gang only in this file were not merged in" in result.stderr)
    assert cli(runner, "complete", "train", "--no-apply").exit_code == 0  # the VM's next edit
    assert "gang" not in jobs_of(shared_text()) and jobs_of(shared_text())["train"]["state"] == "completed"


def test_a_broken_shared_copy_is_named_and_keep_local_replaces_it(machines, runner):
    path = machines("laptop")
    assert cli(runner, "sync", "--events-bucket", "evts").exit_code == 0
    c = cloud()
    gen = c.write_object("evts", KEY, b"config: [\n", c.object_generation("evts", KEY))  # a bad upload by any bucket writer
    r = cli(runner, "complete", "gang", "--no-apply")
    where = f"the shared copy s3://evts/{KEY} (generation {gen})"
    assert r.exit_code == 1
    assert r.output.startswith(f"error: {where}: line 2: not valid YAML")
    assert r.output.endswith(f"error: {where}: not a valid stack file: replace it with {PATH} by "
                             "`spotctl sync --stack team --keep local`\n")
    assert path.read_text() == STACK  # the local file is untouched
    k = cli(runner, "sync", "--keep", "local")
    assert k.exit_code == 0, k.output
    assert f"{where} is not a valid stack file (line 2: not valid YAML" in k.stderr
    assert shared_text() == STACK == path.read_text()
    done = cli(runner, "complete", "gang", "--no-apply")
    assert done.exit_code == 0 and jobs_of(shared_text())["gang"]["state"] == "completed"


def test_a_broken_local_file_is_replaced_by_keep_shared_and_saved_aside(machines, runner):
    """Audit S3: the other way round from ``--keep local``: a hand edit broke this file; the good shared
    copy replaces it and the broken file is kept (its bytes as they were) beside the index."""
    path = machines("laptop")
    assert cli(runner, "sync", "--events-bucket", "evts").exit_code == 0
    broken = STACK.replace("spotctl:jobs:", "spotctl:jobs: [", 1).replace("\n", "\r\n")
    path.write_bytes(broken.encode())
    plain = cli(runner, "sync")
    assert plain.exit_code == 1 and "not valid YAML" in plain.output
    assert "`spotctl sync --stack team --keep shared` replaces it with the shared copy" in plain.output
    assert path.read_bytes() == broken.encode() and shared_text() == STACK  # nothing pushed, nothing lost
    k = cli(runner, "sync", "--keep", "shared")
    assert k.exit_code == 0, k.output
    saved = path.parent / ".spotctl" / "Pulumi.team.yaml.broken"
    assert f"{PATH} is not a valid stack file (" in k.stderr and f"the file as it was is in {saved.relative_to(path.parent.parent)}" in k.stderr
    assert saved.read_bytes() == broken.encode()
    assert path.read_text() == STACK and shared_text() == STACK  # (its CRLF line ends kept)
    assert cli(runner, "complete", "gang", "--no-apply").exit_code == 0  # the file works again, and syncs
    assert jobs_of(shared_text())["gang"]["state"] == "completed"
    path.write_text("config: {")  # broken again: a second copy aside, the first kept
    assert cli(runner, "sync", "--keep", "shared").exit_code == 0
    assert saved.read_bytes() == broken.encode() and saved.with_name(saved.name + ".1").read_text() == "config: {"
    assert jobs_of(path.read_text())["gang"]["state"] == "completed"


def test_keep_shared_of_a_broken_file_never_synced_here_names_why_and_changes_nothing(machines, runner):
    path = machines("laptop")
    path.write_text("config: {")
    r = cli(runner, "sync", "--events-bucket", "evts", "--keep", "shared")
    assert r.exit_code == 1 and "there is none: fix the file by hand" in r.output
    assert path.read_text() == "config: {"


def test_a_watcher_that_started_cut_off_takes_the_lease_and_acts_once_the_bucket_is_back(machines, runner, tmp_path, monkeypatch):
    from cli.cloud import Cloud, CloudError
    from cli.watch import observe
    from tests.test_watch_lease import the_lease

    vm = machines("watcher")
    assert cli(runner, "sync", "--events-bucket", "evts").exit_code == 0
    seen = events(tmp_path / "ev.jsonl", ("train", 3, "preempted", 30))
    cut = {"on": True}
    for name in ("object_generation", "read_object", "write_object"):
        real = getattr(Cloud, name)

        def blocked(self, *args, _real=real, **kw):
            if cut["on"]:
                raise CloudError("no route to host")
            return _real(self, *args, **kw)

        monkeypatch.setattr(Cloud, name, blocked)
    acted, warned = watcher_cycles(vm, observe.Sources(seen, None, None, None, poll=False), lambda s: cut.update(on=False))
    assert len(warned) == 2 and "the watch lease s3://evts/team.spotctl/watch.lease cannot be reached" in warned[0]
    assert "1 action(s) held back (train)" in warned[1]  # cycle 1: nothing acted on the file that may be stale
    assert [(a["job"], a["fields"]) for a in acted] == [("train", {"attempt": 4, "state": "running"})]  # cycle 2
    assert the_lease() is not None and jobs_of(shared_text())["train"]["attempt"] == 4


def test_a_watcher_whose_push_is_lost_undoes_the_edit_and_resumes_once_next_cycle(machines, runner, tmp_path, monkeypatch):
    from cli.cloud import Cloud, CloudError
    from cli.watch import observe

    vm = machines("watcher")
    assert cli(runner, "sync", "--events-bucket", "evts").exit_code == 0
    seen = events(tmp_path / "ev.jsonl", ("train", 3, "preempted", 30))
    real_write = Cloud.write_object
    cut = {"on": True}

    def write(self, b, k, data, expected):
        if k == KEY and cut["on"]:
            raise CloudError("connection reset")  # the stack file's push only; the lease is renewed
        return real_write(self, b, k, data, expected)

    monkeypatch.setattr(Cloud, "write_object", write)
    seen_after: list[int] = []

    def between(seconds):
        seen_after.append(jobs_of(vm.read_text())["train"]["attempt"])
        cut["on"] = False

    acted, warned = watcher_cycles(vm, observe.Sources(seen, None, None, None, poll=False), between)
    assert seen_after == [3]  # cycle 1: the edit undone, nothing applied
    assert [(a["action"], a["result"]) for a in acted] == [("resume", "error"), ("resume", "written")]
    assert "cannot be written (connection reset): the edit was undone here and nothing was applied" in acted[0]["detail"]
    assert jobs_of(vm.read_text())["train"]["attempt"] == 4 == jobs_of(shared_text())["train"]["attempt"]


# ---- a synced stack's bucket is where its events are -----------------------------------------------------


def put_event(job: str, attempt: int, event: str, minute: int, **details) -> None:
    import boto3

    boto3.client("s3", region_name="us-east-1").put_object(
        Bucket="evts", Key=f"team/{job}/attempt-{attempt}/node-0/{minute}-{event}.json",
        Body=json.dumps({"job": job, "stack": "team", "attempt": attempt, "node": 0, "event": event,
                         "time": f"2026-11-21T10:{minute:02d}:00+00:00", "details": details}).encode())


def test_a_synced_stack_reads_its_events_from_the_bucket_it_was_synced_with(machines, runner):
    """status, cost, events and resume without --events-bucket: the bucket this machine synced the file
    with is the stack's event bucket (the shared copy lives there), so its figures are known."""
    path = machines("laptop")
    assert cli(runner, "sync", "--events-bucket", "evts").exit_code == 0
    put_event("train", 3, "started", 0, capacity="spot")
    put_event("train", 3, "preempted", 30)
    status = cli(runner, "status", "--json")
    assert status.exit_code == 0, status.output
    row = next(r for r in json.loads(status.stdout) if r["job"] == "train")
    assert row["preemptions"] == 1 and row["status"] == "needs-resume" and "unknown" not in row
    assert "no events source" not in status.stderr
    shown = cli(runner, "events", "train", "--json")
    assert shown.exit_code == 0 and [e["event"] for e in json.loads(shown.stdout)] == ["started", "preempted"]
    priced = cli(runner, "cost", "train", "--json")
    assert priced.exit_code == 0, priced.output
    resumed = cli(runner, "resume", "train", "--no-apply", "--json")
    assert resumed.exit_code == 0 and json.loads(resumed.stdout)["fields"]["attempt"] == 4, resumed.output
    assert jobs_of(path.read_text())["train"]["attempt"] == 4


def test_a_synced_bucket_that_cannot_be_read_leaves_status_to_the_file_and_names_it(machines, runner, monkeypatch):
    machines("laptop")
    assert cli(runner, "sync", "--events-bucket", "evts").exit_code == 0
    monkeypatch.setenv("AWS_ENDPOINT_URL", "http://127.0.0.1:9")  # nothing listens there
    monkeypatch.setenv("AWS_MAX_ATTEMPTS", "1")
    cost = cli(runner, "cost")  # (no shared copy's check first: the read itself fails, one error)
    assert cost.exit_code == 1 and cost.stderr.startswith("error: the events in bucket evts (the one this stack file")
    read = []
    real = sync.Shared.behind
    monkeypatch.setattr(sync.Shared, "behind", lambda self: (read.append(1), real(self))[1])
    import cli.commands.jobs as job_commands

    monkeypatch.setattr(job_commands, "read_events", lambda *a: pytest.fail("a bucket the shared copy's check found unreachable is read"))
    status = cli(runner, "status", "--json")
    assert status.exit_code == 0, status.output
    assert all(row["preemptions"] is None for row in json.loads(status.stdout)) and read == [1]
    warnings = [line for line in status.stderr.splitlines() if line.startswith("warning:")]
    assert len(warnings) == 2 and "the shared copy s3://evts/" in warnings[0] and "cannot be reached" in warnings[0]
    assert warnings[1].startswith("warning: no events source: ") and (
        "bucket evts (the stack file's shared copy's) cannot be reached" in warnings[1])
    resumed = cli(runner, "resume", "train", "--no-apply")  # decided on the file as before, saying why
    assert resumed.exit_code == 0 and "is decided without its events" in resumed.stderr
    monkeypatch.undo()


def test_resume_without_a_source_says_where_its_events_would_be(project, runner):
    result = runner.invoke(app, ["resume", "vit-finetune", "--stack", "example-gcp", "--no-apply"])
    assert result.exit_code == 0
    assert result.stdout == (
        "job vit-finetune: is running attempt 3; nothing says it stopped (use --force to start a new attempt anyway); "
        "no events source was found: give --events-bucket NAME (the stack's eventBucket output, `pulumi stack output "
        "eventBucket`) or --events-dir DIR (the bucket synced locally, or a job disk's .spotctl/), or run `spotctl sync "
        "--stack example-gcp --events-bucket NAME` once (the stack's eventBucket output)\n")


def test_cleanup_of_orphans_reads_completions_from_the_synced_bucket(machines, runner, fake_pulumi):
    from datetime import UTC, datetime

    import boto3

    from tests.conftest import data_labels

    machines("laptop")
    assert cli(runner, "sync", "--events-bucket", "evts").exit_code == 0
    ec2 = boto3.client("ec2", region_name="us-east-1")
    tags = [{"Key": k, "Value": v} for k, v in data_labels("team", "gone", "aws").items()]
    vol = ec2.create_volume(AvailabilityZone="us-east-1a", Size=10,
                            TagSpecifications=[{"ResourceType": "volume", "Tags": tags}])["VolumeId"]
    boto3.client("s3", region_name="us-east-1").put_object(
        Bucket="evts", Key="team/gone/attempt-1/node-0/1-completed.json",
        Body=json.dumps({"job": "gone", "stack": "team", "attempt": 1, "node": 0, "event": "completed",
                         "time": datetime.now(UTC).isoformat(), "details": {}}).encode())
    dry = cli(runner, "cleanup", "--orphans")
    assert dry.exit_code == 0, dry.output
    assert f"{vol} (us-east-1a): job gone completed and is in neither the stack file nor the Pulumi state" in dry.output


def test_without_a_usable_key_a_record_never_picks_where_events_are_read(machines, runner, monkeypatch):
    """Without this user's key records are read unsealed, so a commit could carry one naming another
    bucket: it may still say where the file is pushed, never which events decide (status, cleanup)."""
    from cli.lifecycle import cachefile

    machines("laptop")
    assert cli(runner, "sync", "--events-bucket", "evts").exit_code == 0
    put_event("train", 3, "started", 0, capacity="spot")
    put_event("train", 3, "preempted", 30)
    monkeypatch.setattr(cachefile, "_KEY", [None])  # no usable key from here on
    status = cli(runner, "status", "--json")
    assert status.exit_code == 0, status.output
    assert all(row["preemptions"] is None for row in json.loads(status.stdout)) and "no events source" in status.stderr


def test_cleanup_of_orphans_with_an_unreadable_synced_bucket_is_one_error_and_deletes_nothing(machines, runner, fake_pulumi,
                                                                                            monkeypatch):
    import boto3

    from tests.conftest import data_labels

    machines("laptop")
    assert cli(runner, "sync", "--events-bucket", "evts").exit_code == 0
    ec2 = boto3.client("ec2", region_name="us-east-1")
    for job in ("gone", "old", "older"):
        tags = [{"Key": k, "Value": v} for k, v in data_labels("team", job, "aws").items()]
        ec2.create_volume(AvailabilityZone="us-east-1a", Size=10, TagSpecifications=[{"ResourceType": "volume", "Tags": tags}])
    before = len(ec2.describe_volumes()["Volumes"])
    from cli.cloud import Cloud, CloudError

    def unreachable(self, *a, **k):
        raise CloudError("cannot ask the cloud: the bucket did not answer")

    monkeypatch.setattr(Cloud, "stored_objects", unreachable)
    monkeypatch.setattr(Cloud, "stored_since", unreachable)  # (the events are listed from a cursor)
    wet = cli(runner, "cleanup", "--orphans", "--yes")
    assert wet.exit_code == 1, wet.output
    errors = [line for line in wet.stderr.splitlines() if line.startswith("error:")]
    assert errors == ["error: the events in bucket evts (the one this stack file was synced with) could not be read: cannot ask the cloud: "
                      "the bucket did not answer: nothing deleted; give --events-bucket NAME or --events-dir DIR"], wet.stderr
    assert len(ec2.describe_volumes()["Volumes"]) == before


def flat(text: str) -> str:
    """``text`` with its wrapping undone (runs of white space as one space)."""
    return " ".join(text.split())
