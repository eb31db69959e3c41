"""Packing a job's code (cli/code): which files, the deterministic archive, the size limit, a git ref
pinned with ls-remote, and the upload once per digest to moto's S3 and the drill's GCS emulator."""

from __future__ import annotations

import io
import os
import subprocess
import tarfile
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from cli.code import CodeError
from cli.code.archive import pack
from cli.code.files import code_files, ignored
from cli.code.gitref import pick, resolve
from cli.code.prepare import StackContext, prepare_code
from infra.config import validate
from infra.naming import code_key
from tests.conftest import AWS_BASE, GCP_BASE, aws_job, gcp_job, stack_config


def git(cwd: Path, *args: str) -> str:
    env = {**os.environ, "GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@x", "GIT_COMMITTER_NAME": "t",
           "GIT_COMMITTER_EMAIL": "t@x", "GIT_CONFIG_GLOBAL": "/dev/null", "GIT_CONFIG_NOSYSTEM": "1"}
    return subprocess.run(["git", *args], cwd=cwd, check=True, capture_output=True, text=True, env=env).stdout


def write(root: Path, files: dict[str, str | bytes]) -> Path:
    for name, content in files.items():
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(content.encode() if isinstance(content, str) else content)
    return root


def members(data: bytes) -> dict[str, bytes]:
    with tarfile.open(fileobj=io.BytesIO(data), mode="r:gz") as tar:
        return {m.name: tar.extractfile(m).read() for m in tar.getmembers() if m.isfile()}


def test_a_git_work_tree_packs_what_git_would_commit(tmp_path):
    repo = write(tmp_path / "repo", {"src/train.py": "print(1)", "requirements.txt": "", ".gitignore": "data/\n*.ckpt\n",
                                     "data/big.bin": "x", "old.ckpt": "x", "README.md": "tracked"})
    git(repo, "init", "-q")
    git(repo, "add", "src/train.py", ".gitignore", "README.md")
    git(repo, "commit", "-qm", "one")
    write(repo, {"new.py": "untracked, not ignored"})
    (repo / "README.md").unlink()  # tracked, deleted in the work tree: not packed
    found = code_files(repo)
    assert found.how == "git"
    assert found.files == (".gitignore", "new.py", "requirements.txt", "src/train.py")
    # A subdirectory of the work tree packs its own part only, relative to itself.
    assert code_files(repo / "src").files == ("train.py",)


def test_without_git_every_file_minus_spotctlignore(tmp_path):
    root = write(tmp_path / "code", {"train.py": "", "logs/a.txt": "", "sub/logs/b.txt": "", "data/x.bin": "",
                                     "keep/data/y.py": "", "w.ckpt": "", "sub/w.ckpt": "", "keep.ckpt": "",
                                     ".spotctlignore": "# comment\nlogs/\n/data\n*.ckpt\n!keep.ckpt\n"})
    found = code_files(root)
    assert found.how == "all files"
    assert found.files == (".spotctlignore", "keep.ckpt", "keep/data/y.py", "train.py")


@pytest.mark.parametrize("name, patterns, out", [
    ("a/b/c.py", ["b/"], True), ("b", ["b/"], False), ("x/b", ["/b"], False), ("b/x", ["/b"], True),
    ("a/x/y/b.txt", ["a/**/b.txt"], True), ("a/b.txt", ["a/**/b.txt"], True), ("c.py", ["*.py", "!c.py"], False),
])
def test_ignore_patterns(name, patterns, out):
    assert ignored(name, patterns) is out


# Directories are [a-z]+ and files end in .py/.txt: no name is both a file and a directory.
NAMES = st.from_regex(r"[a-z]{1,6}(/[a-z]{1,6}){0,2}\.(py|txt)", fullmatch=True)


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(files=st.dictionaries(NAMES, st.binary(max_size=64), min_size=1, max_size=6), mode=st.booleans())
def test_the_same_tree_gives_the_same_digest_wherever_and_whenever_it_is(tmp_path_factory, files, mode):
    digests, datas = set(), []
    for i, when in enumerate((1_000_000, 1_700_000_000)):
        root = write(tmp_path_factory.mktemp("tree"), files)
        for name in files:
            os.utime(root / name, (when, when))
            os.chmod(root / name, 0o755 if mode else 0o600 + i * 0o40)
        archive = pack(root, list(reversed(list(files))))
        digests.add(archive.sha256)
        datas.append(archive.data)
    assert len(digests) == 1
    assert members(datas[0]) == files


def test_a_different_byte_gives_a_different_digest(tmp_path):
    a = pack(write(tmp_path / "a", {"t.py": "1"}), ["t.py"])
    b = pack(write(tmp_path / "b", {"t.py": "2"}), ["t.py"])
    assert a.sha256 != b.sha256


def test_over_the_limit_names_the_biggest_files_before_reading_any(tmp_path):
    root = write(tmp_path / "c", {"train.py": "x" * 10, "model.bin": "x" * 3000, "data.csv": "x" * 2000})
    with pytest.raises(CodeError) as err:
        pack(root, ["train.py", "model.bin", "data.csv"], limit=4096, what="job train: code (./c)")
    message = str(err.value)
    assert message.startswith("job train: code (./c): ")
    assert message.index("model.bin") < message.index("data.csv") and ".spotctlignore" in message


# ---- git refs ---------------------------------------------------------------------------------------

LISTING = (f"{'1' * 40}\tHEAD\n{'2' * 40}\trefs/heads/main\n{'3' * 40}\trefs/tags/v1\n{'4' * 40}\trefs/tags/v1^{{}}\n"
           f"{'5' * 40}\trefs/tags/light\n")


@pytest.mark.parametrize("ref, commit", [("HEAD", "1"), ("main", "2"), ("v1", "4"), ("light", "5"),
                                         ("refs/heads/main", "2"), ("nope", None)])
def test_pick_a_ref_out_of_ls_remote(ref, commit):
    assert pick(LISTING, ref) == (commit * 40 if commit else None)


@pytest.fixture
def remote(tmp_path) -> tuple[str, str]:
    work = write(tmp_path / "work", {"train.py": "print(1)"})
    git(work, "init", "-q", "-b", "main")
    git(work, "add", ".")
    git(work, "commit", "-qm", "one")
    git(work, "tag", "-a", "v1", "-m", "v1")
    return f"file://{work}", git(work, "rev-parse", "HEAD").strip()


def test_a_ref_resolves_to_its_commit_and_a_missing_one_is_one_error(remote):
    url, head = remote
    assert resolve(url, "main", "job t") == head == resolve(url, "v1", "job t") == resolve(url, "HEAD", "job t")
    with pytest.raises(CodeError, match=r"job t: ref 'nope' does not exist in file://"):
        resolve(url, "nope", "job t")
    with pytest.raises(CodeError, match="job t: git ls-remote file:///nowhere failed"):
        resolve("file:///nowhere", "main", "job t")


def test_prepare_pins_a_git_jobs_commit(remote, tmp_path):
    url, head = remote
    cfg = validate(stack_config(GCP_BASE, jobs=[gcp_job(code={"git": url, "ref": "main"})]), "f")
    ref = prepare_code(cfg.jobs[0], StackContext("team", tmp_path))
    assert ref.fields() == {"codeCommit": head} and ref.changes(cfg.jobs[0])
    missing = validate(stack_config(GCP_BASE, jobs=[gcp_job(code={"git": url, "ref": "gone"})]), "f")
    with pytest.raises(CodeError, match=r"^job train: code.ref: ref 'gone' does not exist"):
        prepare_code(missing.jobs[0], StackContext("team", tmp_path))


# ---- the upload ---------------------------------------------------------------------------------------


def test_a_missing_directory_is_one_error_naming_the_job_and_key(tmp_path):
    cfg = validate(stack_config(AWS_BASE, jobs=[aws_job(id="a"), aws_job(id="b", code={"dir": "src/gone"})]), "f")
    with pytest.raises(CodeError) as err:
        prepare_code(cfg.jobs[1], StackContext("team", tmp_path), upload=False)
    assert str(err.value) == (f"job b: code (src/gone): {tmp_path / 'src/gone'} does not exist "
                              f"(a relative dir is relative to the project root {tmp_path})")


def test_s3_upload_once_per_digest(tmp_path, moto_server):
    import boto3

    from cli.cloud import Cloud

    boto3.client("s3", region_name="us-east-1").create_bucket(Bucket="evts")
    write(tmp_path / "code", {"train.py": "print(1)"})
    cfg = validate(stack_config(AWS_BASE, jobs=[aws_job(code="./code")]), "f")
    ctx = StackContext("team", tmp_path, bucket="evts", store=Cloud(cfg, "team"))
    first = prepare_code(cfg.jobs[0], ctx)
    assert first.uploaded and first.key == code_key("team", "train", first.digest)
    got = boto3.client("s3", region_name="us-east-1").get_object(Bucket="evts", Key=first.key)
    assert got["ContentType"] == "application/gzip"
    assert members(got["Body"].read()) == {"train.py": b"print(1)"}
    again = prepare_code(cfg.jobs[0], ctx)
    assert again.digest == first.digest and not again.uploaded  # there already: not written again
    write(tmp_path / "code", {"train.py": "print(2)"})
    changed = prepare_code(cfg.jobs[0], ctx)
    assert changed.uploaded and changed.digest != first.digest


def test_gcs_upload_once_per_digest(tmp_path, monkeypatch):
    from cli.cloud import Cloud
    from cli.drill.emulator import Emulator

    write(tmp_path / "code", {"train.py": "print(1)"})
    cfg = validate(stack_config(GCP_BASE, jobs=[gcp_job(code="./code")]), "f")
    with Emulator() as emu:
        monkeypatch.setenv("SPOTCTL_GCS_ENDPOINT", emu.url)
        cloud = Cloud(cfg, "team")
        ctx = StackContext("team", tmp_path, bucket="gcs-evts", store=cloud)
        first = prepare_code(cfg.jobs[0], ctx)
        assert first.uploaded and members(cloud.read_object("gcs-evts", first.key)[0]) == {"train.py": b"print(1)"}
        assert not prepare_code(cfg.jobs[0], ctx).uploaded


def test_no_bucket_known_is_one_error(tmp_path):
    write(tmp_path / "code", {"train.py": ""})
    cfg = validate(stack_config(AWS_BASE, jobs=[aws_job(code="./code")]), "f")
    with pytest.raises(CodeError, match=r"job train: code: its archive goes to the stack's event bucket"):
        prepare_code(cfg.jobs[0], StackContext("team", tmp_path))


def test_the_recorded_digest_needs_no_bucket(tmp_path):
    write(tmp_path / "code", {"train.py": "print(1)"})
    cfg = validate(stack_config(AWS_BASE, jobs=[aws_job(code="./code")]), "f")
    digest = prepare_code(cfg.jobs[0], StackContext("team", tmp_path), upload=False).digest
    recorded = validate(stack_config(AWS_BASE, jobs=[aws_job(code="./code", codeDigest=digest)]), "f")
    ref = prepare_code(recorded.jobs[0], StackContext("team", tmp_path))  # no bucket, no store: nothing to upload
    assert ref.digest == digest and not ref.uploaded and not ref.changes(recorded.jobs[0])


def test_a_link_inside_the_code_is_kept_one_leaving_it_is_one_error(tmp_path):
    root = write(tmp_path / "c", {"src/train.py": "print(1)"})
    (root / "train.py").symlink_to("src/train.py")
    archive = pack(root, ["src/train.py", "train.py"])
    with tarfile.open(fileobj=io.BytesIO(archive.data), mode="r:gz") as tar:
        assert tar.getmember("train.py").issym() and tar.getmember("train.py").linkname == "src/train.py"
    for name, target in (("data", "/mnt/datasets"), ("src/up", "../../etc")):
        (root / name).symlink_to(target)
        with pytest.raises(CodeError, match=rf"^job t: code \(\./c\): {name} is a link to {target}, outside the code"):
            pack(root, [name], what="job t: code (./c)")
