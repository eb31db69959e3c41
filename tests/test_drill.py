"""`spotctl drill`: the example is reentrant with identical outputs; broken variants are caught;
both clouds' scripts run; nothing is left running, also after Ctrl-C."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest

from cli.app import app
from cli.drill.runner import Attempt, account_lost_work, checkpoint_interval, judge, parse_progress

ROOT = Path(__file__).resolve().parent.parent
EXAMPLE = f"{sys.executable} {ROOT / 'examples' / 'reentrant_train.py'}"
VARIANT = f"{sys.executable} {ROOT / 'tests' / 'fixtures' / 'variant_train.py'}"


TAG_KEY = "DRILL_TEST_TAG"  # not SPOTCTL_*: the local VM drops those from the units' environment


def new_tag() -> str:
    return uuid.uuid4().hex


def tagged(tag: str, marker: str | None = None) -> list[str]:
    """The processes (pid and argv) whose environment carries ``tag`` (or whose argv has ``marker``:
    the command gets the VM's environment, not the drill's): only what this test started, never
    another checkout's or session's drill on the same machine."""
    want = f"{TAG_KEY}={tag}".encode()
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            env = (entry / "environ").read_bytes().split(b"\0")
            argv = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace").strip()
        except OSError:
            continue
        if want in env or (marker is not None and marker in argv):
            found.append(f"{entry.name} {argv}")
    return found


def running(tag: str, argv: str) -> bool:
    """One of our processes has exactly ``argv`` as its command line (the drill's own only mentions it)."""
    return any(line.split(" ", 1)[-1] == argv for line in tagged(tag, argv))


def brief(report: dict) -> str:
    """A failed drill in a few lines (pytest cuts a long dict's repr before the verdict)."""
    lines = [f"verdict {report['verdict']}: {report['reason']}; outputs identical: {report['outputs_identical']}"]
    for a in report["attempts"]:
        lines.append(f"  attempt {a['attempt']} {a['outcome']} after {a['seconds']} s: steps {a['start_progress']}-"
                     f"{a['end_progress']}, checkpoints {a['checkpoints']} (files {a.get('checkpoint_files')}), lost {a['lost_work']}")
        lines += [f"    | {line}" for line in a["log_tail"]]
    return "\n".join(lines)


def drill_json(runner, *args: str) -> tuple[int, dict]:
    result = runner.invoke(app, ["drill", "--json", *args])
    return result.exit_code, json.loads(result.stdout)


# AWS: the notice goes out half the interval ahead (cli/drill/preempt.py) and the VM's watcher polls
# every 1 s, so an attempt trains for 0.4 to 1.4 s (and the instance goes 2 s, 120 s / --time-scale,
# after the notice); more steps make at least two preemptions certain. GCP's shutdown comes at once:
# ~150 steps an attempt, within --max-attempts.
STEPS = {"gcp": 600, "aws": 1300}


@pytest.mark.parametrize("cloud", ["gcp", "aws"])
def test_example_is_reentrant_with_identical_outputs(runner, cloud, monkeypatch):
    tag = new_tag()
    monkeypatch.setenv(TAG_KEY, tag)
    steps = STEPS[cloud]
    code, report = drill_json(runner, "--cloud", cloud, "--time-scale", "60", "--preempt-every", "0.8", "--max-attempts", "20",
                              "--verify", "--", f"{EXAMPLE} --steps {steps}")
    assert code == 0, brief(report)
    assert report["verdict"] == "reentrant" and report["ok"] is True
    assert report["preemptions"] >= 2, brief(report)
    assert report["outputs_identical"] is True
    attempts = report["attempts"]
    # An attempt started after the trainer's SIGTERM checkpoint of its last step finds nothing left
    # to do and prints no progress: the attempts that trained are the ones with progress.
    trained = [a for a in attempts if a["end_progress"] is not None]
    assert attempts[-1]["outcome"] == "completed" and trained[-1]["end_progress"] == steps
    for cur, nxt in zip(trained, trained[1:], strict=False):
        assert nxt["start_progress"] == cur["end_progress"] + 1  # SIGTERM checkpoint: nothing lost
    # Nothing lost at any preemption. An attempt preempted before its trainer printed progress (on a
    # loaded machine it may not start within the 0.8 s), or followed by one with nothing left to do,
    # tells the drill nothing (runner.account_lost_work): its loss is None, never a guess.
    preempted = [a for a in attempts if a["outcome"] == "preempted"]
    assert len(report["lost_work"]) == report["preemptions"] == len(preempted)
    following = {a["attempt"]: b for a, b in zip(attempts, attempts[1:], strict=False)}
    for cur, lost in zip(preempted, report["lost_work"], strict=True):
        known = cur["end_progress"] is not None and following[cur["attempt"]]["start_progress"] is not None
        assert lost == (0 if known else None), (cur, lost)
    assert 0 in report["lost_work"]  # at least one preemption interrupted real training
    assert report["checkpoint_interval"] == 50
    assert not tagged(tag)


def test_variant_that_ignores_checkpoints_restarts_from_scratch(runner):
    result = runner.invoke(app, ["drill", "--json", "--preempt-every", "1", "--max-attempts", "3", "--", f"MODE=ignore {VARIANT}"])
    report = json.loads(result.stdout)
    assert result.exit_code == 1
    assert report["verdict"] == "restarts-from-scratch"
    assert report["attempts"][1]["start_progress"] == 1 and report["attempts"][1]["checkpoint_at_start"] is True


def test_variant_that_checkpoints_only_at_the_end_loses_work(runner):
    result = runner.invoke(app, ["drill", "--json", "--preempt-every", "1", "--max-attempts", "3", "--", f"MODE=end {VARIANT}"])
    report = json.loads(result.stdout)
    assert result.exit_code == 1
    assert report["verdict"] == "restarts-from-scratch"  # it never saves before the end: every attempt starts at 1
    # All it did is lost. How far it got in its 1 s depends on the machine's load; on a loaded host the
    # first attempt can be preempted before its first step, so the first attempt that made progress counts.
    first = next(a for a in report["attempts"] if a["end_progress"] is not None)
    assert first["lost_work"] == first["end_progress"] > 1


def test_failing_command_did_not_finish(runner):
    code, report = drill_json(runner, "--", "echo 'SPOTCTL_PROGRESS 1/10'; exit 3")
    assert code == 1
    assert report["verdict"] == "did-not-finish" and report["attempts"][0]["outcome"] == "failed"


def test_a_failed_startup_script_says_why(runner, monkeypatch):
    """The trainer never started, so its log is empty: the report carries the startup script's own words."""
    import cli.drill.runner as drill_runner

    class BrokenBoot(drill_runner.LocalVM):
        def __post_init__(self) -> None:
            super().__post_init__()
            self.startup.write_text("echo 'mount: /mnt/job: special device /dev/sdb does not exist' >&2; exit 32\n")

    monkeypatch.setattr(drill_runner, "LocalVM", BrokenBoot)
    code, report = drill_json(runner, "--", "echo never")
    assert code == 1
    assert report["verdict"] == "did-not-finish" and report["reason"] == "attempt 1 failed"
    assert report["attempts"][0]["log_tail"] == ["startup script exited 32:",
                                                 "mount: /mnt/job: special device /dev/sdb does not exist"]


def test_drill_a_stack_job(project, runner, monkeypatch):
    path = project / "stacks" / "Pulumi.example-gcp.yaml"
    text = path.read_text()  # bert-eval without its code: (the drill of a job's code: tests/test_code_drill.py)
    start = text.index("      code:", text.index("id: bert-eval"))
    end = text.index("\n", text.index("codeDigest:", start)) + 1
    path.write_text(text[:start] + f"      command: {EXAMPLE} --steps 200\n" + text[end:])
    monkeypatch.setenv("PULUMI_STACK", "example-gcp")  # --job alone: the stack as every command finds it
    code, report = drill_json(runner, "--job", "bert-eval", "--preempt-every", "0.6")
    monkeypatch.delenv("PULUMI_STACK")
    assert code == 0, brief(report)
    assert report["command"] == f"{EXAMPLE} --steps 200"
    result = runner.invoke(app, ["drill", "--stack", "example-gcp", "--job", "nope"])
    assert result.exit_code == 1
    assert result.output.startswith("error: stacks/Pulumi.example-gcp.yaml: job nope: expected one of 'llm-pretrain', 'vit-finetune', 'bert-eval'")


def interrupt_drill(tmp_path, sig: int, *, ignore_int: bool = False) -> tuple[subprocess.Popen, str, str, Path]:
    """Start a drill whose command sleeps (only this test's processes carry its tag), send ``sig``
    once the command runs; returns the finished process, its stderr, the tag and its temp dir."""
    tag = new_tag()
    marker = f"sleep 300.{int(tag[:8], 16)}"  # a number sleep accepts, unique to this test
    own_tmp = tmp_path / "drill-tmp"  # the drill's temp dirs live here
    own_tmp.mkdir()
    argv = [sys.executable, "-m", "cli", "drill", "--preempt-every", "100", "--", f"{marker}; true"]
    if ignore_int:  # as a background job of a non-interactive shell starts it: SIGINT ignored
        argv = ["bash", "-c", 'trap "" INT; exec "$@"', "bash", *argv]
    proc = subprocess.Popen(argv, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env={**os.environ, "TMPDIR": str(own_tmp), TAG_KEY: tag})
    try:
        deadline = time.monotonic() + 60
        while not running(tag, marker) and time.monotonic() < deadline and proc.poll() is None:
            time.sleep(0.1)
        assert running(tag, marker), "the drill never started the command"
        proc.send_signal(sig)
        _, err = proc.communicate(timeout=90)  # a loaded CI machine: slow is fine, hanging is not
    finally:
        if proc.poll() is None:  # the test failed early: still stop it, so it cleans up
            proc.send_signal(signal.SIGTERM)
            proc.communicate(timeout=90)
    deadline = time.monotonic() + 10  # SIGKILLed processes vanish from /proc once reaped
    while tagged(tag, marker) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert tagged(tag, marker) == []
    return proc, err, tag, own_tmp


def test_ctrl_c_leaves_nothing_running(tmp_path):
    proc, err, tag, own_tmp = interrupt_drill(tmp_path, signal.SIGINT)
    assert proc.returncode == 130, err
    assert "interrupted" in err
    assert tagged(tag) == []
    assert list(own_tmp.iterdir()) == []


def test_ctrl_c_stops_a_drill_started_with_sigint_ignored(tmp_path):
    """Started in the background of a non-interactive shell (`uv run pytest &`),
    SIGINT arrives ignored, and the drill used to run on past Ctrl-C."""
    proc, err, tag, own_tmp = interrupt_drill(tmp_path, signal.SIGINT, ignore_int=True)
    assert proc.returncode == 130, err
    assert tagged(tag) == [] and list(own_tmp.iterdir()) == []


def test_sighup_leaves_nothing_running(tmp_path):
    """A closed terminal (SIGHUP) used to kill the drill without cleanup, leaving
    its trainer, watcher and runner running and its temp dir behind."""
    proc, err, tag, own_tmp = interrupt_drill(tmp_path, signal.SIGHUP)
    assert proc.returncode == 130, err
    assert tagged(tag) == [] and list(own_tmp.iterdir()) == []


# ---- the pure judge ----------------------------------------------------------------------------------


def test_parse_progress_and_checkpoints():
    progress, ckpts = parse_progress("x\nSPOTCTL_PROGRESS 3/10\nSPOTCTL_CHECKPOINT 3\nSPOTCTL_PROGRESS 4\n")
    assert progress == [(3, 10), (4, None)] and ckpts == [3]


def attempt(n, start, end, outcome, ckpt=False, marks=()):
    return Attempt(attempt=n, start_progress=start, end_progress=end, outcome=outcome, checkpoint_at_start=ckpt,
                   checkpoints=list(marks))


def test_judge_lost_work_beyond_one_interval():
    attempts = [attempt(1, 1, 180, "preempted", marks=[50, 100, 150]), attempt(2, 51, 300, "completed", ckpt=True)]
    account_lost_work(attempts)
    assert attempts[0].lost_work == 130
    assert judge(attempts, checkpoint_interval(attempts))[0] == "lost-work"


def test_judge_within_one_interval_is_reentrant():
    attempts = [attempt(1, 1, 180, "preempted", marks=[50, 100, 150]), attempt(2, 151, 300, "completed", ckpt=True)]
    account_lost_work(attempts)
    assert attempts[0].lost_work == 30
    # 30 steps went back: the sentence must not say it resumed where it stopped
    assert judge(attempts, checkpoint_interval(attempts)) == (
        "reentrant", "every attempt resumed from its last checkpoint (at most 30 steps lost, within one checkpoint interval of 50)")
    attempts = [attempt(1, 1, 150, "preempted", marks=[50, 100, 150]), attempt(2, 151, 300, "completed", ckpt=True)]
    account_lost_work(attempts)
    assert judge(attempts, checkpoint_interval(attempts)) == ("reentrant", "every attempt resumed where the last one stopped")


def test_trace_driven_preemptions(runner, tmp_path):
    trace = tmp_path / "trace.json"
    # 1 = spot available. Runs of 2 ticks x 30 s at time-scale 60 -> preempted after 1 s each time.
    trace.write_text(json.dumps({"metadata": {"gap_seconds": 30}, "data": [1, 1, 0, 0, 1, 1, 0, 1, 1, 0] + [1] * 50}))
    code, report = drill_json(runner, "--trace", str(trace), "--time-scale", "60", "--", f"{EXAMPLE} --step-seconds 0.01")
    assert code == 0, brief(report)
    assert report["preemptions"] == 3
    assert [a["outcome"] for a in report["attempts"]] == ["preempted"] * 3 + ["completed"]
    assert all(0.9 < a["seconds"] < 6 for a in report["attempts"][:3])  # 1 s of spot, then the shutdown path


def test_trace_is_found_as_simulate_finds_it(runner, tmp_path, monkeypatch):
    """A relative --trace under $SPOTCTL_TRACES's skypilot-spot-traces/ (the layout of ../shared/traces)."""
    trace = tmp_path / "traces" / "skypilot-spot-traces" / "availability" / "1-node" / "aws-x" / "zone_v100_1.json"
    trace.parent.mkdir(parents=True)
    trace.write_text(json.dumps({"metadata": {"gap_seconds": 30}, "data": [1, 1, 0] + [1] * 50}))
    monkeypatch.setenv("SPOTCTL_TRACES", str(tmp_path / "traces"))
    monkeypatch.chdir(tmp_path)
    relative = "availability/1-node/aws-x/zone_v100_1.json"
    simulated = runner.invoke(app, ["simulate", "--trace", relative, "--policy", "greedy", "--job-hours", "0.1",
                                    "--deadline-hours", "0.4", "--changeover-hours", "0", "--starts", "1", "--json"])
    assert simulated.exit_code == 0, simulated.output
    code, report = drill_json(runner, "--trace", relative, "--time-scale", "60", "--", f"{EXAMPLE} --step-seconds 0.01")
    assert code == 0, brief(report)
    assert report["preemptions"] == 1
    missing = runner.invoke(app, ["drill", "--trace", "availability/nope.json", "--", "true"])
    assert missing.exit_code == 1 and missing.output.count("\n") == 1
    assert missing.output.startswith(f"error: availability/nope.json: trace file not found here, nor under {tmp_path / 'traces'}, ")


def test_bad_trace_file_is_one_clear_error(runner, tmp_path):
    trace = tmp_path / "trace.json"
    trace.write_text("{}")
    result = runner.invoke(app, ["drill", "--trace", str(trace), "--", "true"])
    assert result.exit_code == 1
    assert result.output.startswith(f"error: {trace}: not a spot-traces availability file")


def test_an_attempt_with_nothing_left_to_do_is_not_a_restart():
    """Preempted at the very end: the next attempt finds the work done and reports no progress."""
    attempts = [attempt(1, 1, 83, "preempted", marks=[50]), attempt(2, 84, 200, "preempted", ckpt=True, marks=[100, 150, 200]),
                attempt(3, None, None, "completed", ckpt=True)]
    account_lost_work(attempts)
    assert attempts[1].lost_work is None
    assert judge(attempts, checkpoint_interval(attempts))[0] == "reentrant"


@pytest.mark.parametrize("sig", [signal.SIGQUIT, signal.SIGUSR1, signal.SIGALRM])
def test_any_ending_signal_leaves_nothing_running(tmp_path, sig):
    """Signals whose default action ends the process used to end the drill without its cleanup: the
    emulated VM's watch loop went on polling and the temp dir stayed."""
    proc, err, tag, own_tmp = interrupt_drill(tmp_path, sig)
    assert proc.returncode == 130, err
    assert tagged(tag) == [] and list(own_tmp.iterdir()) == []


def test_a_drill_killed_with_sigkill_is_cleaned_up_by_its_watchdog(tmp_path):
    """SIGKILL cannot be caught: the drill's watchdog sees it gone and stops what it started."""
    proc, err, tag, own_tmp = interrupt_drill(tmp_path, signal.SIGKILL)
    assert proc.returncode == -signal.SIGKILL
    deadline = time.monotonic() + 30
    while (tagged(tag) or list(own_tmp.iterdir())) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert tagged(tag) == [] and list(own_tmp.iterdir()) == []


def test_one_checkpoint_per_attempt_is_counted_from_the_step_before_the_first():
    """A script saving every 50 steps has an interval of 50, also when each attempt saved once."""
    attempts = [attempt(1, 1, 73, "preempted", marks=[50]), attempt(2, 51, 120, "preempted", ckpt=True, marks=[100]),
                attempt(3, 101, 200, "completed", ckpt=True)]
    assert checkpoint_interval(attempts) == 50
    files = [Attempt(attempt=1, start_progress=1, end_progress=73, outcome="preempted", checkpoint_files=[50])]
    assert checkpoint_interval(files) == 50  # (the progress when its checkpoint file appeared)


def test_lost_work_with_an_unknown_interval_says_so_in_words():
    attempts = [attempt(1, 1, 80, "preempted"), attempt(2, 40, 300, "completed", ckpt=True)]
    account_lost_work(attempts)
    verdict, reason = judge(attempts, checkpoint_interval(attempts))
    assert verdict == "lost-work" and "None" not in reason
    assert reason == ("attempt 1 lost 41 steps (checkpoint interval unknown: no SPOTCTL_CHECKPOINT line, no file written "
                      "to $SPOTCTL_CHECKPOINT_DIR)")


@pytest.mark.parametrize("mode", ["files", "lines"])
def test_checkpoint_files_without_lines_show_the_interval(runner, mode):
    """A script that saves every 50 steps and ignores SIGTERM loses under 50 steps a preemption: reentrant
    within one interval, whether it prints SPOTCTL_CHECKPOINT lines or only writes its files."""
    code, report = drill_json(runner, "--preempt-every", "1", "--max-attempts", "8", "--", f"MODE={mode} STEPS=800 {VARIANT}")
    assert code == 0, brief(report)
    assert report["verdict"] == "reentrant", brief(report)
    interval = report["checkpoint_interval"]
    assert interval == 50 if mode == "lines" else 45 <= interval <= 60, brief(report)
    assert "None" not in report["reason"]
    assert all(lost is None or lost < 50 for lost in report["lost_work"]), brief(report)


@pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning")  # (the lost interrupt, as expected)
def test_a_signal_whose_interrupt_is_lost_in_a_finalizer_still_ends_the_drill(monkeypatch):
    """The handler's KeyboardInterrupt is lost when it is raised while a finalizer runs (Python prints
    "Exception ignored in ..." and goes on): the drill then went on polling its VM. Its waits end it."""
    from cli.drill import runner as drills

    class Finalized:
        def __del__(self):
            os.kill(os.getpid(), signal.SIGUSR1)  # the handler runs at the next bytecode: still in here
            sum(range(1000))

    waited = []

    def run(self):
        obj = Finalized()
        del obj  # (the interrupt is raised inside __del__, and ignored)
        for _ in range(100):
            waited.append(1)
            self._sleep(0.01)
        return "went on as if nothing had come"

    monkeypatch.setattr(drills.Drill, "run", run)
    before = signal.getsignal(signal.SIGUSR1)
    with pytest.raises(KeyboardInterrupt):
        drills.run_drill(drills.make_spec(command="true", cloud="gcp"))
    assert len(waited) == 1  # (ended at its first wait)
    assert signal.getsignal(signal.SIGUSR1) == before  # (the handler it replaced is back)
