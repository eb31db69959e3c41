"""A job's code keys in the stack file: the shapes of code:, setup/workdir/container and what spotctl
records, each refusal naming its key path; any value for code: is a config or one clear error."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from infra.basics import ConfigError
from infra.codespec import relative_file
from infra.config import validate
from tests.conftest import GCP_BASE, gcp_job, stack_config


def check(**job):
    return validate(stack_config(GCP_BASE, jobs=[gcp_job(**job)]), "f").jobs[0]


def refused(**job) -> str:
    with pytest.raises(ConfigError) as err:
        check(**job)
    return str(err.value)


def test_the_three_shapes():
    assert check(code="./").code.dir == "./"
    assert check(code={"dir": "src"}).code.dir == "src"
    git = check(code={"git": "https://github.com/team/train.git", "ref": "v1.2"}).code
    assert (git.git, git.git_ref) == ("https://github.com/team/train.git", "v1.2")
    assert check(code={"git": "https://github.com/team/train.git"}).code.git_ref == "HEAD"


@pytest.mark.parametrize("job, key, words", [
    ({"code": {"dri": "."}}, "spotctl:jobs[0].code.dri", "unknown key (did you mean 'dir'?)"),
    ({"code": {"git": "git@github.com:a/b.git"}}, "spotctl:jobs[0].code", "expected an https:// URL without credentials"),
    ({"code": {"git": "https://user:pw@github.com/a/b"}}, "spotctl:jobs[0].code", "expected an https:// URL"),
    ({"code": {"git": "https://github.com/a/b", "ref": "a..b"}}, "spotctl:jobs[0].code", "expected a git branch, tag or commit"),
    ({"code": {"dir": ".", "ref": "main"}}, "spotctl:jobs[0].code", "ref and tokenEnv go with git"),
    ({"code": "https://github.com/a/b"}, "spotctl:jobs[0].code", "a repository is written {git: https://github.com/a/b"),
    ({"setup": "make"}, "spotctl:jobs[0].setup", "job train: needs code:"),
    ({"code": ".", "workdir": "../up"}, "spotctl:jobs[0].workdir", "expected a relative path inside the code"),
    ({"code": ".", "workdir": "/abs"}, "spotctl:jobs[0].workdir", "expected a relative path inside the code"),
    ({"code": ".", "codeDigest": "abc"}, "spotctl:jobs[0].codeDigest", "expected the archive's sha256"),
    ({"code": ".", "codeCommit": "a" * 40}, "spotctl:jobs[0].codeCommit", "recorded for code: {git: ...} only"),
    ({"code": ".", "container": "Bad Image!"}, "spotctl:jobs[0].container", "expected an image reference"),
    ({"code": {"git": "https://github.com/a/b", "tokenEnv": "TOKEN"}, "env": {"TOKEN": "plain"}},
     "spotctl:jobs[0].code.tokenEnv", "is a plain env value: the token must be a secure: env value"),
])
def test_each_refusal_names_its_key(job, key, words):
    message = refused(**job)
    assert f"{key}: " in message and words in message, message


def test_a_token_from_a_secure_env_value():
    job = check(code={"git": "https://github.com/a/b", "tokenEnv": "TOKEN"}, env={"TOKEN": {"secure": "v1:x"}})
    assert job.secret_keys == ("TOKEN",)


JSONISH = st.recursive(st.none() | st.booleans() | st.integers() | st.text(max_size=20),
                       lambda inner: st.lists(inner, max_size=3) | st.dictionaries(
                           st.sampled_from(["dir", "git", "ref", "tokenEnv", "dri", "x"]), inner, max_size=3), max_leaves=8)


@given(value=JSONISH)
def test_any_code_value_is_a_config_or_one_error_naming_the_key(value):
    try:
        check(code=value)
    except ConfigError as exc:
        assert "spotctl:jobs[0].code" in str(exc)


@pytest.mark.parametrize("command, file", [
    ("python train.py", "train.py"), ("python3 -u src/train.py --lr 3", "src/train.py"), ("bash run.sh", "run.sh"),
    ('torchrun --nnodes "$WORLD_SIZE" train.py', "train.py"), ("python -m pkg.train", ""), ("/opt/x/train.py", ""),
    ("echo done", ""), ("python 'unterminated", ""),
])
def test_the_relative_file_a_command_names(command, file):
    assert relative_file(command) == file
