"""The per-user key that seals spotctl's caches and records (cli.lifecycle.cachefile): made once, private,
agreed on by processes that race to make it, and refused (caches and records off) when it is not private."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from cli.lifecycle import cachefile

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture
def home(tmp_path, monkeypatch) -> Path:
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "config"))
    monkeypatch.setattr(cachefile, "_KEY", [])
    return tmp_path / "config" / "spotctl" / "cache.key"


def test_the_key_is_made_once_private_and_kept(home):
    made = cachefile.key()
    assert made is not None and len(made) == cachefile.KEY_BYTES
    assert home.read_bytes() == made and home.stat().st_mode & 0o777 == 0o600
    cachefile._KEY.clear()
    assert cachefile.key() == made


def test_processes_racing_to_make_the_key_agree_on_one(home):
    code = "from cli.lifecycle import cachefile; print(cachefile.key().hex())"
    env = {**os.environ, "XDG_CONFIG_HOME": str(home.parent.parent), "PYTHONPATH": str(ROOT)}
    procs = [subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True, env=env) for _ in range(6)]
    keys = {p.communicate(timeout=60)[0].strip() for p in procs}
    assert len(keys) == 1 and bytes.fromhex(keys.pop()) == home.read_bytes()


@pytest.mark.parametrize("bad", ["shared", "link", "short"])
def test_a_key_that_is_not_private_and_whole_turns_sealing_off(home, tmp_path, bad, capsys):
    home.parent.mkdir(parents=True)
    if bad == "link":
        (tmp_path / "k").write_bytes(b"k" * cachefile.KEY_BYTES)
        os.chmod(tmp_path / "k", 0o600)
        home.symlink_to(tmp_path / "k")
    else:
        home.write_bytes(b"k" * (cachefile.KEY_BYTES if bad == "shared" else 7))
        os.chmod(home, 0o644 if bad == "shared" else 0o600)
    assert cachefile.key() is None
    assert f"{home}: no usable key" in capsys.readouterr().err  # said, with where it must be
    target = tmp_path / "cache"
    cachefile.write(target, b"data")
    assert not target.exists() and cachefile.read(target, 100) is None
    target.write_text(cachefile.seal_record({"pid": 1}, target))
    assert cachefile.open_record(target) is None


@pytest.mark.parametrize("hostile", ["zero", "fifo", "deep"])
def test_files_beside_a_stack_file_are_read_bounded(tmp_path, hostile):
    """The sync record, the watcher's journal and holder and the learned policy file: a committed link to
    /dev/zero, a FIFO or deeply nested JSON reads as absent or damaged, never for ever or as a traceback."""
    from cli.lifecycle import capacity, sync
    from cli.watch import journal

    stack = tmp_path / "Pulumi.team.yaml"
    stack.write_text("config: {}\n")
    (tmp_path / ".spotctl").mkdir()
    paths = [sync.record_path(stack), journal.holder_path(stack), journal.journal_path(stack), tmp_path / "learned.json"]
    for path in paths:
        if hostile == "zero":
            path.symlink_to("/dev/zero")
        elif hostile == "fifo":
            os.mkfifo(path)
        else:
            path.write_text("[" * 100_000)
    assert sync.read_record(stack) is None
    assert journal.read_holder(stack) == {}
    assert capacity.read_learned(tmp_path / "learned.json") == {}
    loaded = journal.Journal.load(stack)
    assert (loaded.jobs, loaded.handled) == ({}, {})  # set aside, a fresh journal


def test_a_record_is_bound_to_its_file(home, tmp_path):
    """A record sealed for one stack file's proposal, copied beside another stack file, is not that file's;
    nor does a sealed cache pass for a record."""
    one, other = tmp_path / "Pulumi.a.yaml.proposal.json", tmp_path / "Pulumi.b.yaml.proposal.json"
    one.write_text(cachefile.seal_record({"pid": 1, "job": "train"}, one))
    assert cachefile.open_record(one) == {"pid": 1, "job": "train"}
    other.write_bytes(one.read_bytes())
    assert cachefile.open_record(other) is None
    cache = tmp_path / "cache"
    cachefile.write(cache, b'{"record": {"pid": 1}}')
    assert cachefile.open_record(cache) is None


def test_a_watcher_journal_or_holder_a_commit_carried_is_not_taken(tmp_path, capsys):
    """A forged journal could hold a job in "waiting for capacity" for ever or mark real events handled,
    a forged holder name another watcher's bucket lease: unsealed they are not taken (the watcher sets the
    journal aside, `status` leaves it); sealed (ours) they are; without a key the watcher keeps its own
    memory unsealed, as earlier versions wrote it (said on stderr)."""
    from cli.watch import journal

    stack = tmp_path / "Pulumi.team.yaml"
    waiting = {"jobs": {"llm": {"waiting_attempt": 3, "next_try": "9999-12-31T00:00:00+00:00"}},
               "handled": {"evt-1": "2026-11-22T00:00:00+00:00"}}
    path = journal.journal_path(stack)
    path.write_text(json.dumps(waiting))
    assert journal.watcher_view(stack, []) == {} and path.exists()  # a reader leaves it
    forged = journal.Journal.load(stack)
    assert (forged.jobs, forged.handled) == ({}, {}) and path.with_suffix(".json.bad").exists() and not path.exists()
    cachefile.save_record(path, waiting)
    ours = journal.Journal.load(stack)
    assert (ours.jobs, ours.handled) == (waiting["jobs"], waiting["handled"])
    journal.holder_path(stack).write_text(json.dumps({"holder": "x", "lease": "theirs"}))
    assert journal.read_holder(stack) == {}
    saved = cachefile._KEY[:]
    cachefile._KEY[:] = [None]  # no usable key
    try:
        path.write_text(json.dumps(waiting))  # as an earlier version wrote it
        assert journal.Journal.load(stack).jobs == waiting["jobs"]
        cachefile._KEY[:] = saved
        cachefile.save_record(path, waiting)  # sealed by a run that had the key
        cachefile._KEY[:] = [None]
        assert journal.Journal.load(stack).jobs == waiting["jobs"]  # not thrown away by a keyless one
        assert journal.read_holder(stack) == {"holder": "x", "lease": "theirs"}
    finally:
        cachefile._KEY[:] = saved


def test_a_sync_record_not_sealed_here_is_named_and_not_taken(tmp_path, capsys):
    """A forged sync record (a commit's) would name another bucket or, with its merge base, pick the side of
    every job's merge; an earlier version's or another user's is not this user's either: none is taken, and
    stderr names it and its bucket (a stack never stops being shared silently). Ours is read, its base bound
    by its hash (a base swapped beside it is not taken)."""
    from cli.lifecycle import sync

    stack = tmp_path / "stacks" / "Pulumi.team.yaml"
    stack.parent.mkdir()
    stack.write_text("config: {}\n")
    (stack.parent / ".spotctl").mkdir()
    legacy = {"version": sync.RECORD_VERSION, "bucket": "attacker-bucket", "key": "k", "generation": "7", "unpushed": True}
    sync.record_path(stack).write_text(json.dumps(legacy))
    sync.base_path(stack).write_text("config: {forged: true}\n")
    cachefile._SAID.clear()
    assert sync.read_record(stack) is None
    err = capsys.readouterr().err
    assert "did not seal" in err and "attacker-bucket" in err and "spotctl sync --events-bucket" in err
    sync.write_record(stack, sync.Record("team-bucket", "k", "8", "config: {}\n", False))
    assert sync.read_record(stack) == sync.Record("team-bucket", "k", "8", "config: {}\n", False)
    sync.base_path(stack).write_text("config: {forged: true}\n")  # the base swapped beside a sealed record
    assert sync.read_record(stack).base is None


def test_a_key_made_between_the_first_read_and_the_check_is_taken(home, monkeypatch):
    """The race a fresh suite's workers hit: another process published the key just after this one found
    none; this one must take that key (it took none: caches off, records refused, for its whole life)."""
    home.parent.mkdir(parents=True)
    home.write_bytes(b"k" * cachefile.KEY_BYTES)
    os.chmod(home, 0o600)
    real, calls = cachefile._read_key, []

    def first_misses(path):
        calls.append(path)
        return None if len(calls) == 1 else real(path)

    monkeypatch.setattr(cachefile, "_read_key", first_misses)
    assert cachefile.key() == b"k" * cachefile.KEY_BYTES
