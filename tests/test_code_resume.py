"""resume and failover deliver a job's code: pack, upload once to the stack's bucket (moto in server
mode, found through the stack's eventBucket output of a fake pulumi), record the digest or commit in
the job entry (comments kept) only with a new attempt; bad input is one error, the file unchanged."""

from __future__ import annotations

import io
import json
import os
import shutil
import subprocess
import tarfile
from pathlib import Path

import boto3
import pytest

from cli.app import app
from infra.naming import code_key

ROOT = Path(__file__).resolve().parent.parent

STACK = """\
config:
  spotctl:cloud: aws
  spotctl:region: us-east-1
  spotctl:zones: [us-east-1a]
  spotctl:jobs:
    # The trainer, packed from src/ at every new attempt.
    - id: train
      instanceType: g5.2xlarge
      zone: us-east-1a
      capacity: spot
      attempt: 1
      state: preempted
      code: ./src  # relative to the project root
      setup: pip install -r requirements.txt
      command: python train.py
"""


@pytest.fixture
def team(tmp_path, monkeypatch, moto_server, fake_pulumi):
    """A project with stack `team` whose job packs ./src; the stack's bucket `evts` in moto."""
    home = tmp_path / "home"
    (home / "stacks").mkdir(parents=True)
    shutil.copy(ROOT / "Pulumi.yaml", home / "Pulumi.yaml")
    (home / "stacks" / "Pulumi.team.yaml").write_text(STACK)
    (home / "src").mkdir()
    (home / "src" / "train.py").write_text("print('step')\n")
    (home / "src" / "requirements.txt").write_text("")
    monkeypatch.chdir(home)
    monkeypatch.delenv("PULUMI_STACK", raising=False)
    monkeypatch.setenv("FAKE_PULUMI_OUTPUTS", json.dumps({"eventBucket": "evts"}))
    boto3.client("s3", region_name="us-east-1").create_bucket(Bucket="evts")
    return home


def run(runner, *args: str):
    return runner.invoke(app, [*args, "--stack", "team"])


def stored() -> dict[str, bytes]:
    s3 = boto3.client("s3", region_name="us-east-1")
    keys = [o["Key"] for o in s3.list_objects_v2(Bucket="evts").get("Contents", [])]
    return {k: s3.get_object(Bucket="evts", Key=k)["Body"].read() for k in keys}


def files_of(archive: bytes) -> dict[str, bytes]:
    with tarfile.open(fileobj=io.BytesIO(archive), mode="r:gz") as tar:
        return {m.name: tar.extractfile(m).read() for m in tar.getmembers() if m.isfile()}


def digest_in(path: Path) -> str | None:
    line = next((ln for ln in path.read_text().splitlines() if "codeDigest:" in ln), None)
    return line.split(":", 1)[1].strip() if line else None


def test_resume_uploads_the_code_once_and_records_its_digest(team, runner):
    path = team / "stacks" / "Pulumi.team.yaml"
    result = run(runner, "resume", "train", "--yes", "--json")
    assert result.exit_code == 0, result.output
    fields = json.loads(result.stdout)["fields"]
    digest = fields["codeDigest"]
    assert fields["attempt"] == 2 and len(digest) == 64
    assert stored() == {code_key("team", "train", digest): stored()[code_key("team", "train", digest)]}
    assert files_of(stored()[code_key("team", "train", digest)]) == {"requirements.txt": b"", "train.py": b"print('step')\n"}
    text = path.read_text()
    assert digest_in(path) == digest and "# The trainer, packed from src/ at every new attempt." in text
    assert "code: ./src  # relative to the project root" in text
    # The same code at the next attempt: nothing uploaded again, nothing recorded anew.
    failover = run(runner, "failover", "train", "--yes", "--json")
    assert failover.exit_code == 0, failover.output
    assert "codeDigest" not in json.loads(failover.stdout)["fields"] and len(stored()) == 1


def test_a_changed_digest_shows_in_the_preview_and_reaches_only_a_new_attempt(team, runner):
    path = team / "stacks" / "Pulumi.team.yaml"
    assert run(runner, "resume", "train", "--yes").exit_code == 0
    first = digest_in(path)
    (team / "src" / "train.py").write_text("print('step 2')\n")
    # Running now (nothing says it stopped): no new attempt, so nothing recorded, the file unchanged.
    before = path.read_bytes()
    noop = run(runner, "resume", "train", "--yes")
    assert noop.exit_code == 0 and "nothing says it stopped" in noop.output
    assert path.read_bytes() == before
    # A new attempt takes the new code; its preview line says so.
    result = run(runner, "failover", "train", "--preview-only")
    assert result.exit_code == 0, result.output
    assert f"; code {first[:12]} -> " in result.stdout and "preview only: nothing changed" in result.stdout
    assert path.read_bytes() == before
    applied = run(runner, "failover", "train", "--yes", "--json")
    assert applied.exit_code == 0, applied.output
    second = json.loads(applied.stdout)["fields"]["codeDigest"]
    assert second != first and digest_in(path) == second
    assert set(stored()) == {code_key("team", "train", first), code_key("team", "train", second)}


def test_keep_code_runs_the_recorded_code_without_the_directory(team, runner):
    path = team / "stacks" / "Pulumi.team.yaml"
    assert run(runner, "resume", "train", "--yes").exit_code == 0
    recorded = digest_in(path)
    shutil.rmtree(team / "src")
    result = run(runner, "failover", "train", "--yes", "--keep-code", "--json")
    assert result.exit_code == 0, result.output
    assert "codeDigest" not in json.loads(result.stdout)["fields"] and digest_in(path) == recorded


def bad(team, runner, old: str, new: str, *args: str) -> str:
    path = team / "stacks" / "Pulumi.team.yaml"
    path.write_text(STACK.replace(old, new))
    before = path.read_bytes()
    result = run(runner, *args)
    assert result.exit_code == 1, result.output
    assert path.read_bytes() == before and stored() == {}
    return result.output


def test_a_missing_directory_is_one_error_naming_job_and_key(team, runner):
    out = bad(team, runner, "code: ./src", "code: ./gone", "resume", "train", "--yes")
    assert out == (f"error: job train: code (./gone): {team / 'gone'} does not exist (a relative dir is relative "
                   f"to the project root {team})\n")


def test_an_archive_over_the_limit_names_the_biggest_files(team, runner):
    with open(team / "src" / "weights.bin", "wb") as fh:
        fh.truncate(600 * 1024 * 1024)  # sparse: the limit is checked on sizes, before anything is read
    out = bad(team, runner, "state: preempted", "state: preempted", "failover", "train", "--yes")
    assert out.startswith("error: job train: code (./src): 600.0 MiB of files, more than the 512.0 MiB")
    assert "the biggest: weights.bin (600.0 MiB), train.py" in out


GIT_ENV = {**os.environ, "GIT_CONFIG_GLOBAL": "/dev/null", "GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@x",
           "GIT_COMMITTER_NAME": "t", "GIT_COMMITTER_EMAIL": "t@x"}


def git_repo(repo: Path) -> Path:
    """A repository at ``repo`` with one commit on ``main``."""
    repo.mkdir()
    for argv in (["init", "-q", "-b", "main"], ["commit", "-q", "--allow-empty", "-m", "one"]):
        subprocess.run(["git", *argv], cwd=repo, check=True, env=GIT_ENV, capture_output=True)
    return repo


def test_a_git_ref_that_does_not_exist(team, runner, tmp_path):
    repo = git_repo(tmp_path / "repo")
    out = bad(team, runner, "code: ./src  # relative to the project root", f"code: {{git: 'file://{repo}', ref: v9}}",
              "resume", "train", "--yes")
    assert out == f"error: job train: code.ref: ref 'v9' does not exist in file://{repo} (a branch, a tag, HEAD or a full commit)\n"
    head = subprocess.run(["git", "rev-parse", "HEAD"], cwd=repo, capture_output=True, text=True).stdout.strip()
    path = team / "stacks" / "Pulumi.team.yaml"
    path.write_text(STACK.replace("code: ./src  # relative to the project root", f"code: {{git: 'file://{repo}', ref: main}}"))
    good = run(runner, "resume", "train", "--yes", "--json")
    assert good.exit_code == 0, good.output
    assert json.loads(good.stdout)["fields"]["codeCommit"] == head and f"codeCommit: {head}" in path.read_text()


@pytest.mark.parametrize("shape, message", [
    ("code: 3", "spotctl:jobs[0].code: expected './PATH', {dir: PATH} or {git: URL, ref: REF}, got 3"),
    ("code: {dri: ./src}", "spotctl:jobs[0].code.dri: unknown key (did you mean 'dir'?)"),
    ("code: {dir: ./src, git: 'https://x.org/a/b'}", "spotctl:jobs[0].code: give exactly one of dir and git"),
])
def test_a_bad_code_shape_names_the_key(team, runner, shape, message):
    out = bad(team, runner, "code: ./src  # relative to the project root", shape, "resume", "train", "--yes")
    assert out.startswith("error: stacks/Pulumi.team.yaml: ") and message in out


def test_no_bucket_known_is_one_error_saying_how_to_name_it(team, runner):
    path = team / "stacks" / "Pulumi.team.yaml"
    before = path.read_bytes()
    result = run(runner, "resume", "train", "--no-apply")  # (no pulumi asked: nothing says where the bucket is)
    assert result.exit_code == 1
    assert result.output == ("error: job train: code: its archive goes to the stack's event bucket, and none is known here "
                             "(give --events-bucket NAME (the stack's eventBucket output), or run `spotctl sync --stack team "
                             "--events-bucket NAME` once (the stack's eventBucket output))\n")
    assert path.read_bytes() == before and stored() == {}
    given = run(runner, "resume", "train", "--no-apply", "--events-bucket", "evts", "--force")
    assert given.exit_code == 0, given.output
    assert digest_in(path) and len(stored()) == 1


def test_launch_packs_and_uploads_the_code_and_records_its_digest(team, runner):
    """`launch --code DIR` applied: the archive is in the bucket under the job's code prefix and the new
    entry records its digest; with --no-apply nothing is packed (the entry keeps only `code:`)."""
    path = team / "stacks" / "Pulumi.team.yaml"
    dry = run(runner, "launch", "--id", "dry", "--machine", "g5.2xlarge", "--zone", "us-east-1a",
              "--command", "python train.py", "--code", "./src", "--no-apply")
    assert dry.exit_code == 0, dry.output
    assert stored() == {} and "codeDigest" not in path.read_text().split("id: dry", 1)[1]
    result = run(runner, "launch", "--id", "fresh", "--machine", "g5.2xlarge", "--zone", "us-east-1a",
                 "--command", "python train.py", "--code", "./src", "--yes")
    assert result.exit_code == 0, result.output
    entry = path.read_text().split("id: fresh", 1)[1]
    digest = entry.split("codeDigest:", 1)[1].split()[0].strip("'\",}")
    (key,) = [k for k in stored() if k.endswith(".tar.gz")]
    assert key == code_key("team", "fresh", digest)
    assert set(files_of(stored()[key])) == {"train.py", "requirements.txt"}


def test_a_git_job_runs_its_recorded_commit_at_every_attempt_until_asked_to_update(team, runner, tmp_path):
    """The ref is resolved once: a branch that moves on does not change what a new attempt runs, until
    `--update-code` (or a `ref:` naming another commit)."""
    repo = git_repo(tmp_path / "repo")

    def git(*argv: str) -> str:
        return subprocess.run(["git", *argv], cwd=repo, check=True, env=GIT_ENV, capture_output=True, text=True).stdout.strip()

    first = git("rev-parse", "HEAD")
    path = team / "stacks" / "Pulumi.team.yaml"
    path.write_text(STACK.replace("code: ./src  # relative to the project root", f"code: {{git: 'file://{repo}', ref: main}}"))
    assert run(runner, "resume", "train", "--yes").exit_code == 0
    assert f"codeCommit: {first}" in path.read_text()
    git("commit", "-q", "--allow-empty", "-m", "two")  # main moves on
    second = git("rev-parse", "HEAD")
    again = run(runner, "resume", "train", "--yes", "--force", "--json")
    assert again.exit_code == 0, again.output
    assert "codeCommit" not in json.loads(again.stdout)["fields"] and f"codeCommit: {first}" in path.read_text()
    both = run(runner, "resume", "train", "--yes", "--force", "--keep-code", "--update-code")
    assert both.exit_code == 1 and both.output == "error: give --keep-code or --update-code, not both\n"
    moved = run(runner, "resume", "train", "--yes", "--force", "--update-code", "--json")
    assert moved.exit_code == 0, moved.output
    assert json.loads(moved.stdout)["fields"]["codeCommit"] == second and f"codeCommit: {second}" in path.read_text()
    path.write_text(path.read_text().replace("ref: main", f"ref: {first}"))  # naming a commit is saying so too
    back = run(runner, "resume", "train", "--yes", "--force", "--json")
    assert back.exit_code == 0 and json.loads(back.stdout)["fields"]["codeCommit"] == first


def test_launch_without_apply_pins_a_git_ref_or_refuses_one_that_does_not_exist(team, runner, tmp_path):
    repo = git_repo(tmp_path / "repo")
    head = subprocess.run(["git", "rev-parse", "HEAD"], cwd=repo, capture_output=True, text=True).stdout.strip()
    path = team / "stacks" / "Pulumi.team.yaml"
    before = path.read_bytes()
    job = tmp_path / "job.yaml"
    body = "id: gitjob\ninstanceType: g5.2xlarge\nzone: us-east-1a\ncommand: python train.py\n"
    job.write_text(body + f"code: {{git: 'file://{repo}', ref: no-such-branch}}\n")
    refused = run(runner, "launch", str(job), "--no-apply")
    assert refused.exit_code == 1
    assert refused.output == (f"error: job gitjob: code.ref: ref 'no-such-branch' does not exist in file://{repo} "
                              "(a branch, a tag, HEAD or a full commit)\n")
    assert path.read_bytes() == before
    job.write_text(body + f"code: {{git: 'file://{repo}', ref: main}}\n")
    launched = run(runner, "launch", str(job), "--no-apply")
    assert launched.exit_code == 0, launched.output
    assert f"codeCommit: {head}" in path.read_text().split("id: gitjob", 1)[1]
