"""A drill without --code runs in a fresh copy of the current directory on its scratch disk: the
checkout is never written, a second drill starts from nothing, and --verify sees what it wrote."""

from __future__ import annotations

import json
import sys
from pathlib import Path

from cli.app import app

# Checkpoints to ./ckpt.txt and writes ./out.txt, both relative to where it runs.
SCRIPT = """\
import os, signal, time
stop = {"now": False}
signal.signal(signal.SIGTERM, lambda *_: stop.update(now=True))
step = int(open("ckpt.txt").read()) if os.path.exists("ckpt.txt") else 0
while step < 60:
    if stop["now"]:
        open("ckpt.txt", "w").write(str(step))
        raise SystemExit(143)
    step += 1
    time.sleep(0.05)
    print(f"SPOTCTL_PROGRESS {step}/60", flush=True)
    if step % 5 == 0:
        open("ckpt.txt", "w").write(str(step))
        print(f"SPOTCTL_CHECKPOINT {step}", flush=True)
open("out.txt", "w").write(f"done {step}\\n")
"""


def _checkout(tmp_path: Path) -> Path:
    here = tmp_path / "checkout"
    here.mkdir()
    (here / "t.py").write_text(SCRIPT)
    return here


def test_two_drills_in_a_row_both_preempt_and_the_checkout_is_untouched(runner, tmp_path, monkeypatch):
    here = _checkout(tmp_path)
    monkeypatch.chdir(here)
    for _ in range(2):
        result = runner.invoke(app, ["drill", "--json", "--preempt-every", "1", "--", sys.executable, "t.py"])
        report = json.loads(result.stdout)
        assert result.exit_code == 0, report["reason"]
        assert report["verdict"] == "reentrant" and report["preemptions"] >= 1
        assert report["attempts"][0]["start_progress"] == 1  # not the last drill's checkpoint
        assert sorted(p.name for p in here.iterdir()) == ["t.py"]
        assert f"drill: running in a copy of {here} on a scratch disk" in result.stderr
    assert (here / "t.py").read_text() == SCRIPT


def test_verify_sees_the_outputs_written_in_the_copy(runner, tmp_path, monkeypatch):
    here = _checkout(tmp_path)
    monkeypatch.chdir(here)
    result = runner.invoke(app, ["drill", "--preempt-every", "1", "--verify", "--", sys.executable, "t.py"])
    assert result.exit_code == 0, result.output
    assert "final outputs: identical to an uninterrupted run" in result.stdout
    assert sorted(p.name for p in here.iterdir()) == ["t.py"]


def test_an_empty_current_directory_is_one_clear_error(runner, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    result = runner.invoke(app, ["drill", "--", "true"])
    assert result.exit_code == 1
    assert result.output.startswith("error: the current directory (a drill runs in a copy of it; --code DIR picks another): ")
    assert result.output.count("\n") == 1
