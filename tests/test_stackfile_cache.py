"""The parsed-stack-file cache (cli/lifecycle/stackfile/reading.py): reused only for the very same text."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from cli.lifecycle import stackfile
from infra.config import ConfigError

TEXT = """config:
  spotctl:cloud: aws
  spotctl:region: us-east-1
  spotctl:zones: [us-east-1a]
  spotctl:jobs:
    - id: job-a
      instanceType: p4d.24xlarge
      zone: us-east-1a
      command: python train.py
      attempt: 2
"""


@pytest.fixture
def ref(tmp_path: Path) -> stackfile.StackRef:
    path = tmp_path / "Pulumi.s.yaml"
    path.write_text(TEXT)
    return stackfile.StackRef("s", path)


def test_an_edit_of_the_same_size_and_mtime_is_seen(ref):
    assert stackfile.load(ref).job("job-a").attempt == 2
    stat = ref.path.stat()
    ref.path.write_text(TEXT.replace("attempt: 2", "attempt: 3"))
    os.utime(ref.path, ns=(stat.st_atime_ns, stat.st_mtime_ns))  # what an mtime+size guard would miss
    assert ref.path.stat().st_size == stat.st_size
    assert stackfile.load(ref).job("job-a").attempt == 3


def test_a_broken_file_is_reported_every_time_and_the_fixed_one_reused(ref):
    good = stackfile.load(ref)
    ref.path.write_text(TEXT.replace("attempt: 2", "attempt: two"))
    for _ in range(2):
        with pytest.raises(ConfigError, match=r"spotctl:jobs\[0\]\.attempt"):
            stackfile.load(ref)
    ref.path.write_text(TEXT)
    assert stackfile.load(ref) is good


def test_callers_changing_what_they_read_do_not_change_the_next_read(ref):
    first = stackfile.read_config(ref.path)
    first["spotctl:jobs"][0]["attempt"] = 99
    assert stackfile.read_config(ref.path)["spotctl:jobs"][0]["attempt"] == 2
    assert stackfile.load(ref).job("job-a").attempt == 2


def test_an_edit_is_read_back_as_written(ref):
    stackfile.load(ref)
    stackfile.update_job(ref.path, "job-a", lambda current, written: {"attempt": 3, "state": "running"})
    assert "attempt: 3" in ref.path.read_text() and "state: running" in ref.path.read_text()
    job = stackfile.load(ref).job("job-a")
    assert (job.attempt, job.state.value) == (3, "running")
