"""spotctl logs: a job's trainer log per attempt and node, from a job disk copy or a synced bucket."""

from __future__ import annotations

import json
import re

import pytest
from hypothesis import given
from hypothesis import strategies as st

from cli.app import app


def disk_copy(root, logs: dict[str, str]):
    d = root / "disk" / ".spotctl" / "logs"
    d.mkdir(parents=True)
    for name, text in logs.items():
        (d / name).write_text(text)
    return root / "disk" / ".spotctl"


def test_latest_attempt_by_default_and_any_by_option(project, runner, tmp_path):
    src = disk_copy(tmp_path, {"attempt-1-node-0.log": "step 1\nstep 2\n", "attempt-2-node-0.log": "resumed at 2\nstep 3\n",
                               "attempt-2-node-1.log": "worker 1\n"})
    latest = runner.invoke(app, ["logs", "diffusion", "--stack", "example-aws", "--events-dir", str(src)])
    assert latest.exit_code == 0 and latest.stdout == "resumed at 2\nstep 3\n"
    first = runner.invoke(app, ["logs", "diffusion", "--stack", "example-aws", "--events-dir", str(src), "--attempt", "1", "--tail", "1"])
    assert first.exit_code == 0 and first.stdout == "step 2\n"
    worker = runner.invoke(app, ["logs", "diffusion", "--stack", "example-aws", "--events-dir", str(src), "--node", "1"])
    assert worker.stdout == "worker 1\n"
    missing = runner.invoke(app, ["logs", "diffusion", "--stack", "example-aws", "--events-dir", str(src), "--attempt", "3"])
    assert missing.exit_code == 1
    assert missing.output == (f"error: job diffusion: no log of attempt 3 node 0 (there are: attempt 1 node 0, "
                              f"attempt 2 node 0, attempt 2 node 1) in {src}\n")


def test_uploaded_chunks_are_joined_in_order_without_repeats(project, runner, tmp_path):
    base = tmp_path / "bucket" / "example-aws" / "diffusion" / "attempt-3" / "node-0" / "logs"
    base.mkdir(parents=True)
    (base / "000000000000.log").write_text("first line\n")       # 11 bytes
    (base / "000000000011.log").write_text("second line\nthird")  # then a retry that overlaps:
    (base / "000000000023.log").write_text("third line\n")
    result = runner.invoke(app, ["logs", "diffusion", "--stack", "example-aws", "--events-dir", str(tmp_path / "bucket")])
    assert result.exit_code == 0, result.output
    assert result.stdout == "first line\nsecond line\nthird line\n"


def test_a_chunk_that_never_arrived_is_said_where_it_is_missing(project, runner, tmp_path):
    base = tmp_path / "bucket" / "example-aws" / "diffusion" / "attempt-3" / "node-0" / "logs"
    base.mkdir(parents=True)
    (base / "000000000000.log").write_text("AAAAAAAAA\n")  # 10 bytes; bytes 10-19 never uploaded
    (base / "000000000020.log").write_text("CCCC\n")
    result = runner.invoke(app, ["logs", "diffusion", "--stack", "example-aws", "--events-dir", str(tmp_path / "bucket")])
    assert result.exit_code == 0, result.output
    assert result.stdout == "AAAAAAAAA\n\n[spotctl: 10 bytes of this log never reached the bucket]\nCCCC\n"


def test_follow_stops_when_the_attempt_ended(project, runner, tmp_path):
    src = disk_copy(tmp_path, {"attempt-2-node-0.log": "step 9\nTraceback: out of memory\n"})
    (src / "events.jsonl").write_text(json.dumps({"job": "diffusion", "attempt": 2, "node": 0, "event": "failed",
                                                  "time": "2026-11-21T10:00:00Z", "details": {"exit_code": "1"}}) + "\n")
    result = runner.invoke(app, ["logs", "diffusion", "--stack", "example-aws", "--events-dir", str(src), "--follow"])
    assert result.exit_code == 0 and result.stdout.endswith("Traceback: out of memory\n")


def test_only_this_jobs_and_this_stacks_chunks(project, runner, tmp_path):
    """A synced bucket holds every stack: neither `xdiffusion` nor another stack's `diffusion` is this job."""
    def put(stack: str, job: str, text: str) -> None:
        d = tmp_path / "bucket" / stack / job / "attempt-7" / "node-0" / "logs"
        d.mkdir(parents=True)
        (d / "000000000000.log").write_text(text)

    put("example-aws", "xdiffusion", "LOG OF xdiffusion\n")
    put("other-stack", "diffusion", "LOG OF another stack\n")
    args = ["logs", "diffusion", "--stack", "example-aws", "--events-dir", str(tmp_path / "bucket")]
    result = runner.invoke(app, args)
    assert result.exit_code == 1 and result.output == f"error: job diffusion: no log found in {tmp_path / 'bucket'}\n"
    put("example-aws", "diffusion", "LOG OF diffusion\n")
    result = runner.invoke(app, [*args, "--attempt", "7"])
    assert result.exit_code == 0 and result.stdout == "LOG OF diffusion\n"


def test_follow_stops_when_a_later_attempt_started(project, runner, tmp_path):
    """An attempt replaced without an end event of its own (its VM never came back to record it)."""
    src = disk_copy(tmp_path, {"attempt-1-node-0.log": "step 4\n", "attempt-2-node-0.log": "resumed\n"})
    (src / "events.jsonl").write_text(json.dumps({"stack": "example-aws", "job": "diffusion", "attempt": 2, "node": 0,
                                                  "event": "started", "time": "2026-11-21T10:00:00Z", "details": {}}) + "\n")
    result = runner.invoke(app, ["logs", "diffusion", "--stack", "example-aws", "--events-dir", str(src), "--attempt", "1", "--follow"])
    assert result.exit_code == 0 and result.stdout == "step 4\n"


def test_logs_need_a_source_and_a_known_job(project, runner, tmp_path):
    none = runner.invoke(app, ["logs", "diffusion", "--stack", "example-aws"])  # no pulumi to ask for the eventBucket output
    assert none.exit_code == 1 and none.output.startswith("error: job diffusion: where is its log? cannot read the outputs")
    assert "give --events-bucket NAME" in none.output and "--no-apply" not in none.output  # logs has no --no-apply
    assert len(none.output.splitlines()) == 1
    empty = runner.invoke(app, ["logs", "diffusion", "--stack", "example-aws", "--events-dir", str(tmp_path)])
    assert empty.exit_code == 1 and empty.output == f"error: job diffusion: no log found in {tmp_path}\n"
    unknown = runner.invoke(app, ["logs", "nope", "--stack", "example-aws", "--events-dir", str(tmp_path)])
    assert unknown.exit_code == 1 and "job nope" in unknown.output


# ---- straight from the event bucket: S3 (moto in server mode) and GCS (the emulator's JSON API) ----------------


def s3_put(key: str, body: str | bytes) -> None:
    import boto3

    boto3.client("s3", region_name="us-east-1").put_object(Bucket="evts", Key=f"example-aws/llm-pretrain/{key}", Body=body)


def event(attempt: int, node: int, name: str, minute: int = 0) -> str:
    return json.dumps({"job": "llm-pretrain", "attempt": attempt, "node": node, "event": name,
                       "time": f"2026-11-21T10:{minute:02d}:00.000Z", "details": {}})


@pytest.fixture
def s3_bucket(project, moto_server):
    import boto3

    boto3.client("s3", region_name="us-east-1").create_bucket(Bucket="evts")
    s3_put("attempt-1/node-0/logs/000000000000.log", "a1 n0\n")
    s3_put("attempt-2/node-0/logs/000000000000.log", "step 1\n")
    s3_put("attempt-2/node-0/logs/000000000007.log", "step 2\ncaf\xc3\xa9\n".encode("latin-1"))
    s3_put("attempt-2/node-1/logs/000000000000.log", "worker 1\n")
    s3_put("attempt-2/node-0/2026-11-21T10:00:00.000Z-started.json", event(2, 0, "started"))
    return "evts"


def logs_cmd(runner, *args: str):
    return runner.invoke(app, ["logs", "llm-pretrain", "--stack", "example-aws", *args])


def test_logs_from_s3_by_attempt_and_node(s3_bucket, runner):
    latest = logs_cmd(runner, "--events-bucket", s3_bucket)
    assert latest.exit_code == 0, latest.output
    assert latest.stdout == "step 1\nstep 2\ncafé\n"
    assert logs_cmd(runner, "--events-bucket", s3_bucket, "--attempt", "1").stdout == "a1 n0\n"
    assert logs_cmd(runner, "--events-bucket", s3_bucket, "--node", "1").stdout == "worker 1\n"
    assert logs_cmd(runner, "--events-bucket", s3_bucket, "--tail", "1").stdout == "café\n"


def test_logs_from_s3_name_what_is_missing(s3_bucket, runner):
    where = "bucket evts under example-aws/llm-pretrain/"
    no_attempt = logs_cmd(runner, "--events-bucket", s3_bucket, "--attempt", "5")
    assert no_attempt.exit_code == 1
    assert no_attempt.output == ("error: job llm-pretrain: no log of attempt 5 node 0 (there are: attempt 1 node 0, attempt 2 node 0, "
                                 f"attempt 2 node 1) in {where}\n")
    no_node = logs_cmd(runner, "--events-bucket", s3_bucket, "--node", "3")
    assert no_node.exit_code == 1 and no_node.output.startswith("error: job llm-pretrain: no log of node 3 (there are: ")
    no_job = runner.invoke(app, ["logs", "llm-pretrai", "--stack", "example-aws", "--events-bucket", s3_bucket])
    assert no_job.exit_code == 1 and "job llm-pretrai" in no_job.output and len(no_job.output.splitlines()) == 1
    other = runner.invoke(app, ["logs", "diffusion", "--stack", "example-aws", "--events-bucket", s3_bucket])
    assert other.exit_code == 1
    assert other.output == "error: job diffusion: no log found in bucket evts under example-aws/diffusion/\n"
    no_bucket = logs_cmd(runner, "--events-bucket", "nope")
    assert no_bucket.exit_code == 1 and no_bucket.output.startswith("error: cannot ask the cloud: ")
    assert len(no_bucket.output.splitlines()) == 1


def test_logs_bucket_from_the_stack_outputs(s3_bucket, runner, fake_pulumi, monkeypatch):
    monkeypatch.setenv("FAKE_PULUMI_OUTPUTS", json.dumps({"eventBucket": s3_bucket}))
    result = logs_cmd(runner, "--node", "1")
    assert result.exit_code == 0, result.output
    assert result.stdout == "worker 1\n"
    monkeypatch.setenv("FAKE_PULUMI_OUTPUTS", "{}")
    undeployed = logs_cmd(runner)
    assert undeployed.exit_code == 1
    assert undeployed.output.startswith("error: job llm-pretrain: stack example-aws has no eventBucket output (is it deployed?)")


def test_follow_polls_the_bucket_for_new_chunks_until_the_node_ended(s3_bucket, project):
    """The core's loop against moto: each poll sees what was uploaded meanwhile; another node's end
    does not stop it, this node's does, and the chunk uploaded just before the end is printed."""
    from cli.cloud import Cloud
    from cli.lifecycle import logs, stackfile

    cfg = stackfile.load(stackfile.resolve("example-aws", None))
    uploads = iter([
        lambda: s3_put("attempt-2/node-0/logs/000000000020.log", "step 3 \xe2\x82".encode("latin-1")),  # a split character
        lambda: s3_put("attempt-2/node-1/2026-11-21T10:05:00.000Z-failed.json", event(2, 1, "failed", 5)),
        lambda: (s3_put("attempt-2/node-0/logs/000000000029.log", b"\xac done\n"),
                 s3_put("attempt-2/node-0/2026-11-21T10:06:00.000Z-completed.json", event(2, 0, "completed", 6))),
    ])
    written: list[str] = []
    polls: list[float] = []

    def sleep(seconds: float) -> None:
        polls.append(seconds)
        next(uploads)()

    source = logs.BucketLogs(Cloud(cfg, "example-aws"), "evts", "llm-pretrain")
    key = logs.show(source, None, 0, written.append, follow=True, poll_s=0.5, sleep=sleep)
    assert key == logs.LogKey(2, 0)
    assert "".join(written) == "step 1\nstep 2\ncafé\nstep 3 € done\n"
    assert written[0] == "step 1\nstep 2\ncafé\n" and len(polls) == 3


def test_a_log_line_shaped_like_an_event_is_not_an_event(s3_bucket, runner):
    """The trainer prints what it likes; only event objects (*.json) count as events."""
    s3_put("attempt-2/node-0/logs/000000000019.log", event(2, 0, "completed", 9) + "\n")
    result = runner.invoke(app, ["events", "llm-pretrain", "--stack", "example-aws", "--events-bucket", s3_bucket, "--json"])
    assert result.exit_code == 0, result.output
    assert [e["event"] for e in json.loads(result.output)] == ["started"]


def test_logs_from_gcs_as_the_scripts_uploaded_them(project, runner, monkeypatch, tmp_path):
    """The real GCP scripts run a trainer and upload its log to the emulator's bucket; `spotctl logs`
    reads it back through the GCS JSON API, byte for byte the job disk's copy."""
    import sys

    from cli.drill.emulator import Emulator
    from cli.drill.localvm import LocalVM, local_context
    from infra.render import ScriptContext

    trainer = "print('step 1'); print('caf\\u00e9'); import sys; print('to stderr', file=sys.stderr)"
    with Emulator() as emu:
        ctx = ScriptContext(cloud="gcp", stack="example-gcp", kind="job", name="vit-finetune", command=f"{sys.executable} -c \"{trainer}\"",
                            event_bucket="example-gcp-events", region="us-central1", attempt=3)
        with LocalVM(local_context(ctx, emu, tmp_path / "disk", tmp_path / "state"), tmp_path / "vm") as vm:
            vm.boot()
            assert vm.wait_for(lambda: len(emu.events()) == 2, 20)
        monkeypatch.setenv("SPOTCTL_GCS_ENDPOINT", emu.url)
        args = ["logs", "vit-finetune", "--stack", "example-gcp", "--events-bucket", "example-gcp-events"]
        result = runner.invoke(app, args)
        followed = runner.invoke(app, [*args, "--follow"])  # the attempt completed: prints all, then stops
        missing = runner.invoke(app, [*args, "--attempt", "2"])
    disk = (tmp_path / "disk" / ".spotctl" / "logs" / "attempt-3-node-0.log").read_text()
    assert result.exit_code == 0, result.output
    assert result.stdout == disk and sorted(disk.splitlines()) == ["café", "step 1", "to stderr"]
    assert followed.exit_code == 0 and followed.stdout == disk
    assert missing.exit_code == 1
    assert missing.output == ("error: job vit-finetune: no log of attempt 2 node 0 (there are: attempt 3 node 0) "
                              "in bucket example-gcp-events under example-gcp/vit-finetune/\n")


def test_the_last_lines_are_uploaded_even_when_tee_writes_them_late(project, runner, monkeypatch, tmp_path):
    """The trainer's output reaches its log through tee; the log's final upload waits for tee to write
    it (a loaded VM: tee a second late), or the bucket would miss the attempt's last lines."""
    import shutil
    import sys

    from cli.drill.emulator import Emulator
    from cli.drill.localvm import LocalVM, local_context
    from infra.render import ScriptContext

    slow = tmp_path / "bin"
    slow.mkdir()
    (slow / "tee").write_text(f"#!/bin/sh\nsleep 1\nexec {shutil.which('tee')} \"$@\"\n")
    (slow / "tee").chmod(0o755)
    with Emulator() as emu:
        ctx = ScriptContext(cloud="gcp", stack="example-gcp", kind="job", name="vit-finetune",
                            command=f"{sys.executable} -c \"print('last words')\"",
                            event_bucket="example-gcp-events", region="us-central1", attempt=1)
        with LocalVM(local_context(ctx, emu, tmp_path / "disk", tmp_path / "state"), tmp_path / "vm") as vm:
            import os
            vm.boot(env={"PATH": f"{slow}:{os.environ['PATH']}"})
            assert vm.wait_for(lambda: any(e.get("event") == "completed" for e in emu.events()), 30)
        monkeypatch.setenv("SPOTCTL_GCS_ENDPOINT", emu.url)
        result = runner.invoke(app, ["logs", "vit-finetune", "--stack", "example-gcp", "--events-bucket", "example-gcp-events"])
    assert result.exit_code == 0, result.output
    assert result.stdout == "last words\n"


def test_follow_after_a_late_chunk_repeats_and_garbles_nothing():
    """A chunk said missing that arrives later: the terminal keeps what it showed, the rest follows."""
    from datetime import UTC, datetime

    from cli.lifecycle import logs as joblogs
    from cli.lifecycle.events import Event

    key = joblogs.LogKey(1, 0)
    late = [(0, b"AAAA\n"), (5, b"BBBBB"), (10, b"CCCC\n")]
    views = iter([[(0, b"AAAA\n"), (10, b"CCCC\n")], late, [*late, (15, b"DD\n")]])

    class Source:
        where = "test"
        polls = 0

        def keys(self):
            return [key]

        def chunks(self, k, since=0):
            return [(offset, data) for offset, data in next(views) if offset + len(data) > since]

        def events(self, k):
            self.polls += 1
            return [Event("j", 1, 0, "completed", datetime(2026, 11, 21, tzinfo=UTC), {})] if self.polls > 1 else []

    out: list[str] = []
    joblogs.show(Source(), None, 0, out.append, follow=True, sleep=lambda s: None)
    assert "".join(out) == "AAAA\n\n[spotctl: 5 bytes of this log never reached the bucket]\nCCCC\nDD\n"


def test_a_terminal_gets_the_logs_colours_but_nothing_that_drives_it(project, runner, tmp_path, monkeypatch):
    text = ("\x1b[32mok\x1b[0m step 1\r step 2\tdone\n"  # colours, a progress bar's \r, a tab: kept
            "\x1b]52;c;ZXZpbA==\x07\x1b]0;title\x1b\\\x1b[2J\x1b[10;1H\x1bc\x07\x9b2J\x1b(Bend\n")  # clipboard, title, clear, bell
    src = disk_copy(tmp_path, {"attempt-1-node-0.log": text})
    argv = ["logs", "diffusion", "--stack", "example-aws", "--events-dir", str(src)]
    piped = runner.invoke(app, argv)
    assert piped.exit_code == 0 and piped.stdout == text  # a pipe or a file: as the VM wrote it
    monkeypatch.setattr("cli.commands.logs._to_terminal", lambda: True)
    shown = runner.invoke(app, argv)
    assert shown.exit_code == 0 and shown.stdout == "\x1b[32mok\x1b[0m step 1\r step 2\tdone\nend\n"


@given(st.text(alphabet=st.characters(max_codepoint=0xFF)) | st.lists(st.sampled_from(
    ["\x1b", "[", "]", "m", "3", ";", "\x07", "\\", "\x9b", "\x9d", "\x9c", "a", "\n", "(", "B"])).map("".join))
def test_what_a_terminal_is_given_holds_no_control_but_colours_and_line_breaks(text):
    from cli.lifecycle.events import terminal_safe

    shown = terminal_safe(text)
    left = re.sub(r"\x1b\[[0-9;]*m", "", shown)  # the colours kept
    assert not re.search(r"[\x00-\x08\x0b-\x0c\x0e-\x1f\x7f-\x9f]", left), repr(shown)
