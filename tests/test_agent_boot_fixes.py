"""What the boot tier (tests/boot/) found on a real systemd, kept in the agent: what it writes at boot
reaches the disk before a reset can lose it; GCE's shutdown-script unit is ordered after the job
disk's mount without requiring it; the last `preempted` record gets what the notice leaves."""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import types
from pathlib import Path

import pytest

from agent import disk, units
from agent.config import Config
from agent.units import GCE_SHUTDOWN_UNIT, mount_unit, unit_files
from infra.render import NOTICE_S, TRAINER_STOP_BUDGET_S, ScriptContext


def config(cloud: str, tmp_path, **over) -> Config:
    ctx = ScriptContext(cloud=cloud, stack="s", kind="job", name="j", command="true", event_bucket="b", region="r",
                        disk_device="/dev/disk/by-id/x", **over)
    doc = dict(ctx.agent_config(), systemd_dir=str(tmp_path / "systemd"), fstab=str(tmp_path / "fstab"),
               state_dir=str(tmp_path / "state"))
    return Config.from_dict(doc)


@pytest.mark.parametrize("cloud", ["gcp", "aws"])
def test_the_units_and_enable_links_are_synced_before_they_start(cloud, tmp_path, monkeypatch):
    """A reset within ~30 s of boot (ext4's delayed allocation) left the unit files just written
    empty: everything systemctl will read at the next boot is synced before the units start."""
    calls: list[str] = []
    monkeypatch.setattr(units.subprocess, "run", lambda args, **kw: calls.append(" ".join(args[:2])) or
                        types.SimpleNamespace(returncode=0))
    monkeypatch.setattr(units.os, "sync", lambda: calls.append("sync"))
    units.start_systemd(config(cloud, tmp_path), "/usr/bin/python3", "/var/lib/spotctl/agent.pyz")
    links = "systemctl enable" if cloud == "aws" else "systemctl disable"
    assert calls.index(links) < calls.index("sync") < calls.index("systemctl start"), calls
    assert (tmp_path / "systemd" / "spotctl-job.service").read_text().startswith("[Unit]")


def test_the_fstab_line_is_synced_once_written(tmp_path, monkeypatch):
    synced: list[str] = []
    monkeypatch.setattr(disk, "_run", lambda args, **kw: types.SimpleNamespace(returncode=0, stdout=b"1234-abcd\n"))
    monkeypatch.setattr(disk.os, "sync", lambda: synced.append((tmp_path / "fstab").read_text()))
    disk.add_to_fstab(config("aws", tmp_path), "/dev/nvme1n1")
    assert len(synced) == 1 and synced[0].startswith("UUID=1234-abcd /mnt/spotctl "), synced


def test_gces_shutdown_unit_is_ordered_after_the_mount_without_requiring_it(tmp_path):
    """RequiresMountsFor= adds Requires=: on a boot without the job disk the guest agent's shutdown
    unit then failed with the mount. Ordering only (After= the mount unit)."""
    cfg = config("gcp", tmp_path, mount_point="/mnt/job disk")
    dropin = unit_files(cfg, "/usr/bin/python3", "/a.pyz")[f"{GCE_SHUTDOWN_UNIT}.d/spotctl.conf"]
    assert dropin == "[Unit]\nAfter=mnt-job\\x20disk.mount\n"


@pytest.mark.parametrize("path", ["/mnt/spotctl", "/mnt/job disk", "/", "/a/.b/c-d", "//x//y/", "/.hid", "/données"])
def test_the_mount_unit_name_is_systemds(path):
    assert mount_unit(path) == {"/mnt/spotctl": "mnt-spotctl.mount", "/mnt/job disk": "mnt-job\\x20disk.mount",
                                "/": "-.mount", "/a/.b/c-d": "a-.b-c\\x2dd.mount", "//x//y/": "x-y.mount",
                                "/.hid": "\\x2ehid.mount", "/données": "donn\\xc3\\xa9es.mount"}[path]
    if shutil.which("systemd-escape"):
        out = subprocess.run(["systemd-escape", "--path", "--suffix=mount", path], capture_output=True, text=True,
                             check=True).stdout.strip()
        assert mount_unit(path) == out


@pytest.mark.parametrize(("cloud", "budget", "last"), [("gcp", None, 2), ("aws", None, 10), ("aws", 115, 2),
                                                       ("gcp", 5, 10)])
def test_the_last_preempted_record_gets_what_the_notice_leaves(cloud, budget, last, tmp_path):
    """After the trainer's budget, the drain and the flush (4 s): the `preempted` record, and 4 s to
    power off, within the notice; at least one 2 s try, at most 10 s (AWS: one 2 s try missed)."""
    assert config(cloud, tmp_path, stop_budget_s=budget).last_record_s == last
    spent = (budget if budget is not None else TRAINER_STOP_BUDGET_S[cloud]) + 4 + last + 4
    assert spent <= NOTICE_S[cloud] or last == 2


class _Rec:
    """The recorder's side of the trainer's exit: upload answers as given, events and power-off noted."""

    def __init__(self, answers: list[bool]):
        self.answers, self.budgets, self.events = answers, [], []

    def upload_log(self, budget: float) -> bool:
        self.budgets.append(budget)
        return self.answers.pop(0)

    def record(self, event: str, details=None) -> None:
        self.events.append(event)

    def wait(self, timeout=None) -> None:
        pass


@pytest.mark.parametrize(("answers", "budgets", "said"), [([True], [5], False), ([False, True], [5, 20], False),
                                                         ([False, False], [5, 20], True)])
def test_the_trainers_exit_tries_the_log_once_more_and_says_when_its_end_was_not_sent(answers, budgets, said, tmp_path,
                                                                                      monkeypatch):
    from agent import run

    monkeypatch.setattr(run, "power_off", lambda cfg: None)
    cfg = config("gcp", tmp_path)
    (tmp_path / "state").mkdir()
    rec = _Rec(list(answers))
    assert run.finish(cfg, rec, 0, False) == 0
    assert rec.budgets == budgets and rec.events == ["completed"]
    debug = (tmp_path / "state" / "spotctl.log")
    assert (debug.exists() and "not uploaded" in debug.read_text()) == said


def test_unpacked_code_reaches_the_disk_before_its_rename_makes_it_the_code(tmp_path, monkeypatch):
    """Code found in place is never fetched again: its files are synced before the rename, and the
    rename after it (a reset within ~30 s of the write left new files empty)."""
    from agent import code
    from tests.test_agent_code import archive

    data = archive({"train.py": "print(1)\n"})
    cfg = config("gcp", tmp_path, mount_point=str(tmp_path / "disk"), code_uri="gs://b/k",
                 code_sha256=hashlib.sha256(data).hexdigest())
    calls: list[str] = []
    rename = os.rename
    monkeypatch.setattr(code.os, "sync", lambda: calls.append("sync"))
    monkeypatch.setattr(code.os, "rename", lambda a, b: calls.append("rename") or rename(a, b))
    final = code.unpack(cfg, data)
    assert calls == ["sync", "rename", "sync"]
    assert Path(final, "train.py").read_text() == "print(1)\n"


def test_setups_work_reaches_the_disk_before_its_marker_and_the_marker_before_the_command(tmp_path, monkeypatch):
    from agent import code

    cfg = config("gcp", tmp_path, mount_point=str(tmp_path / "disk"), code_uri="gs://b/k", code_sha256="a" * 64,
                 setup="installs")
    (tmp_path / "disk" / ".spotctl").mkdir(parents=True)
    out, marker = tmp_path / "installed", code.setup_marker(cfg)
    seen: list[tuple[bool, bool]] = []
    monkeypatch.setattr(code.os, "sync", lambda: seen.append((out.exists(), os.path.exists(marker))))
    rc = code.run_setup(cfg, ["sh", "-c", f"echo done > '{out}'"], dict(os.environ), str(tmp_path), str(tmp_path / "log"),
                        lambda: False, lambda pid: None)
    assert rc is None and seen == [(True, False), (True, True)]


def test_a_trainer_that_exited_before_the_stop_is_not_claimed_by_it(tmp_path):
    """On a busy VM the run may reap its trainer after a notice arrives: a trainer that has exited (a
    zombie not yet reaped) ended on its own, so the stop does not mark it signaled (a finished job
    stays completed); a live one is signaled once."""
    import signal
    import time

    from agent.stop import signal_trainer

    cfg = config("aws", tmp_path)
    os.makedirs(cfg.state_dir)
    done = subprocess.Popen(["true"], start_new_session=True)  # not waited for: a zombie once it exits
    deadline = time.monotonic() + 30
    while (Path(f"/proc/{done.pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
           and time.monotonic() < deadline):
        time.sleep(0.01)
    Path(cfg.state("trainer.pid")).write_text(str(done.pid))
    signal_trainer(cfg)
    assert not os.path.exists(cfg.state("signaled"))
    done.wait()
    live = subprocess.Popen(["sleep", "30"], start_new_session=True)
    try:
        Path(cfg.state("trainer.pid")).write_text(str(live.pid))
        signal_trainer(cfg)
        assert os.path.exists(cfg.state("signaled")) and live.wait(10) == -signal.SIGTERM
    finally:
        live.kill()
        live.wait()


def test_gces_shutdown_bootstrap_does_not_claim_a_trainer_that_has_exited(tmp_path):
    """The same rule in the bash that SIGTERMs the trainer before Python starts (GCE's shutdown script)."""
    import time

    script = (Path(__file__).parent / "snapshots" / "gcp-job-1node.shutdown.sh").read_text()
    start = script.index('if pid=$(cat "$SPOTCTL_STATE_DIR/trainer.pid"')
    snippet = script[start:script.index("\nfi\n", start) + 4]
    state = tmp_path / "state"
    state.mkdir()
    env = {**os.environ, "SPOTCTL_STATE_DIR": str(state)}
    done = subprocess.Popen(["true"], start_new_session=True)  # not waited for: a zombie once it exits
    deadline = time.monotonic() + 30
    while (Path(f"/proc/{done.pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
           and time.monotonic() < deadline):
        time.sleep(0.01)
    (state / "trainer.pid").write_text(str(done.pid))
    subprocess.run(["bash", "-c", snippet], env=env, check=True)
    assert (state / "stopping").exists() and not (state / "signaled").exists()
    done.wait()
    live = subprocess.Popen(["sleep", "30"], start_new_session=True)
    try:
        (state / "trainer.pid").write_text(str(live.pid))
        subprocess.run(["bash", "-c", snippet], env=env, check=True)
        assert (state / "signaled").exists() and live.wait(10) == -15
    finally:
        live.kill()
        live.wait()
