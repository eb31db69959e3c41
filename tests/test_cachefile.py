"""The per-user key that seals spotctl's caches and records (cli.lifecycle.cachefile): made once, private,
agreed on by processes that race to make it, and refused (caches and records off) when it is not private."""

from __future__ import annotations

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
def test_a_key_that_is_not_private_and_whole_turns_sealing_off(home, tmp_path, bad):
    home.parent.mkdir(parents=True)
    if bad == "link":
        (tmp_path / "k").write_bytes(b"k" * cachefile.KEY_BYTES)
        os.chmod(tmp_path / "k", 0o600)
        home.symlink_to(tmp_path / "k")
    else:
        home.write_bytes(b"k" * (cachefile.KEY_BYTES if bad == "shared" else 7))
        os.chmod(home, 0o644 if bad == "shared" else 0o600)
    assert cachefile.key() is None
    target = tmp_path / "cache"
    cachefile.write(target, b"data")
    assert not target.exists() and cachefile.read(target, 100) is None
    target.write_text(cachefile.seal_record({"pid": 1}))
    assert cachefile.open_record(target) is None
