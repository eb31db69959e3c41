"""Every shell block the docs mark `<!-- runnable -->` runs as written: the blocks of one page in order,
with bash -euo pipefail, in a temp copy of the project, offline (`uv run X` runs X from this
environment; `pulumi` is the project's fake; no cloud credentials). A stale command fails here.
The copy is a git checkout, as a fresh clone is: a page leaves `git status` clean (its last blocks
remove what it wrote, the project's .gitignore covers spotctl's caches), and the README's job does
not collide with the ML quickstart's when a newcomer runs one after the other."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
MARK = "<!-- runnable -->"
BLOCK = re.compile(re.escape(MARK) + r"\s*\n```(?:bash|sh)\n(.*?)\n```", re.S)
# `uv run X ...` runs X from this test's environment; any other uv command is refused (it would
# sync a new environment from the network).
UV_SHIM = """#!/bin/sh
if [ "$1" = run ]; then shift; exec "$@"; fi
echo "uv $1: not available to the docs' runnable blocks" >&2
exit 2
"""
# The README's second fresh-machine command runs this suite: it is not run from inside it.
NOT_RUN = ("uv run pytest",)


def runnable_blocks(page: Path) -> list[str]:
    return BLOCK.findall(page.read_text(encoding="utf-8"))


def is_cleanup(block: str) -> bool:
    """A block that only puts the checkout back (`rm`, `git checkout`): what a page ends with."""
    lines = [line for line in block.splitlines() if line.strip()]
    return bool(lines) and all(re.match(r"(rm |git checkout )", part.strip())
                               for line in lines for part in line.split("&&"))


def shown_rows(page: Path) -> list[list[str]]:
    """Per runnable block, the table rows (`│ ... │` lines) the page quotes from its output: the plain
    fenced blocks after it in its section, before the next runnable one."""
    parts = re.split(re.escape(MARK) + r"\s*\n```(?:bash|sh)\n.*?\n```", page.read_text(encoding="utf-8"), flags=re.S)
    sections = [re.split(r"\n#{1,6} ", part)[0] for part in parts[1:]]
    return [[line.strip() for block in re.findall(r"```[a-z]*\n(.*?)\n```", section, re.S) for line in block.splitlines()
             if line.startswith("│") and line.rstrip().endswith("│")] for section in sections]


PAGES = sorted(p for p in [ROOT / "README.md", *(ROOT / "docs").rglob("*.md")] if runnable_blocks(p))


def test_the_quickstarts_and_the_readme_have_runnable_blocks():
    names = {p.relative_to(ROOT).as_posix() for p in PAGES}
    assert {"README.md", "docs/getting-started/ml-quickstart.md", "docs/getting-started/platform-gcp.md",
            "docs/getting-started/platform-aws.md", "docs/getting-started/tour.md"} <= names, names


def test_a_block_without_the_mark_is_not_picked_up(tmp_path):
    page = tmp_path / "p.md"
    page.write_text(f"```bash\necho not me\n```\n\n{MARK}\n```bash\necho me\n```\n")
    assert runnable_blocks(page) == ["echo me"]


@pytest.fixture
def project_copy(tmp_path: Path) -> tuple[Path, dict[str, str]]:
    """A copy of what a fresh clone's commands touch, and the environment the blocks run in."""
    project = tmp_path / "project"
    project.mkdir()
    shutil.copy(ROOT / "Pulumi.yaml", project / "Pulumi.yaml")
    (project / "stacks").mkdir()
    for stack in (ROOT / "stacks").glob("Pulumi.*.yaml"):
        shutil.copy(stack, project / "stacks" / stack.name)
    shutil.copytree(ROOT / "examples", project / "examples")
    shutil.copy(ROOT / ".gitignore", project / ".gitignore")
    shims = tmp_path / "shims"
    shims.mkdir()
    (shims / "uv").write_text(UV_SHIM)
    (shims / "uv").chmod(0o755)
    pulumi = tmp_path / "pulumi-install" / "bin"
    pulumi.mkdir(parents=True)
    shutil.copy(ROOT / "tests" / "fixtures" / "fake_pulumi.py", pulumi / "pulumi")
    (pulumi / "pulumi").chmod(0o755)
    home = tmp_path / "home"
    home.mkdir()
    keep = {k: v for k, v in os.environ.items() if k in ("LANG", "LC_ALL", "TMPDIR", "SPOTCTL_TRACES")}
    env = {**keep, "HOME": str(home), "PATH": os.pathsep.join([str(shims), str(Path(sys.executable).parent), "/usr/bin", "/bin"]),
           "PULUMI_HOME": str(home / ".pulumi"), "SPOTCTL_PULUMI_ROOT": str(pulumi.parent),
           "FAKE_PULUMI_LOG": str(tmp_path / "pulumi-argv.jsonl"), "AWS_EC2_METADATA_DISABLED": "true",
           "AWS_SHARED_CREDENTIALS_FILE": str(home / "none"), "AWS_CONFIG_FILE": str(home / "none"),
           "PYTHONPATH": str(ROOT), "COLUMNS": "100", "NO_COLOR": "1",
           "GIT_CONFIG_GLOBAL": os.devnull, "GIT_CONFIG_NOSYSTEM": "1"}
    git = ["git", "-c", "user.name=docs", "-c", "user.email=docs@example.invalid", "-c", "init.defaultBranch=main"]
    for args in (["init", "-q"], ["add", "-A"], ["commit", "-qm", "a fresh clone"]):
        subprocess.run([*git, *args], cwd=project, env=env, check=True, capture_output=True)
    return project, env


def run_block(page: Path, i: int, block: str, project: Path, env: dict[str, str]) -> str:
    script = "\n".join(line for line in block.splitlines() if not line.startswith(NOT_RUN))
    result = subprocess.run(["bash", "-euo", "pipefail", "-c", script], cwd=project, env=env,
                            capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, (f"{page.relative_to(ROOT)} block {i + 1} exited {result.returncode}:\n{block}\n"
                                    f"--- stdout\n{result.stdout[-3000:]}\n--- stderr\n{result.stderr[-3000:]}")
    assert "Traceback" not in result.stderr, result.stderr
    return result.stdout


def git_status(project: Path, env: dict[str, str]) -> str:
    return subprocess.run(["git", "status", "--porcelain", "--untracked-files=all"], cwd=project, env=env,
                          capture_output=True, text=True, check=True).stdout


@pytest.mark.parametrize("page", PAGES, ids=[p.relative_to(ROOT).as_posix() for p in PAGES])
def test_the_runnable_blocks_run_as_written(page, project_copy):
    project, env = project_copy
    before = {p.name: p.read_bytes() for p in (ROOT / "stacks").glob("Pulumi.*.yaml")}
    for i, (block, rows) in enumerate(zip(runnable_blocks(page), shown_rows(page), strict=True)):
        out = run_block(page, i, block, project, env)
        for row in rows:  # (a row the page shows is what the command prints, at the blocks' 100 columns)
            assert row in out, f"{page.relative_to(ROOT)} block {i + 1} shows\n{row}\nbut prints\n{out}"
    assert git_status(project, env) == "", f"{page.relative_to(ROOT)} leaves the checkout changed (end it with a block that puts it back)"
    assert {p.name: p.read_bytes() for p in (ROOT / "stacks").glob("Pulumi.*.yaml")} == before  # the checkout untouched


def test_a_page_that_leaves_a_file_behind_is_caught(tmp_path, project_copy):
    project, env = project_copy
    page = tmp_path / "p.md"
    page.write_text(f"{MARK}\n```bash\nuv run spotctl status --stack example-gcp > /dev/null\necho x > left.txt\n```\n")
    for i, block in enumerate(runnable_blocks(page)):
        run_block(page, i, block, project, env)
    assert git_status(project, env) == "?? left.txt\n"  # spotctl's own caches are ignored, the page's file is not


def test_the_readme_job_then_the_ml_quickstart_run_in_one_checkout(project_copy):
    """A newcomer tries the README's job, keeps it, then follows the ML quickstart in the same clone."""
    project, env = project_copy
    readme = ROOT / "README.md"
    kept = [b for b in runnable_blocks(readme) if not is_cleanup(b)]
    assert len(kept) < len(runnable_blocks(readme))  # the README says how to put the stack back
    for i, block in enumerate(kept):
        run_block(readme, i, block, project, env)
    quickstart = ROOT / "docs" / "getting-started" / "ml-quickstart.md"
    for i, block in enumerate(runnable_blocks(quickstart)):
        run_block(quickstart, i, block, project, env)


def test_only_blocks_that_put_the_checkout_back_count_as_cleanup():
    assert is_cleanup("git checkout stacks/Pulumi.example-gcp.yaml && rm hello-l4.yaml")
    assert is_cleanup("rm -f finetune.yaml stacks/Pulumi.ml-team-gcp.yaml")
    assert not is_cleanup("rm x && uv run spotctl status --stack example-gcp")
    assert not is_cleanup("")
