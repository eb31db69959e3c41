"""Every shell block the docs mark `<!-- runnable -->` runs as written: the blocks of one page in order,
with bash -euo pipefail, in a temp copy of the project, offline (`uv run X` runs X from this
environment; `pulumi` is the project's fake; no cloud credentials). A stale command fails here."""

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
           "PYTHONPATH": str(ROOT), "COLUMNS": "100", "NO_COLOR": "1"}
    return project, env


@pytest.mark.parametrize("page", PAGES, ids=[p.relative_to(ROOT).as_posix() for p in PAGES])
def test_the_runnable_blocks_run_as_written(page, project_copy):
    project, env = project_copy
    before = {p.name: p.read_bytes() for p in (ROOT / "stacks").glob("Pulumi.*.yaml")}
    for i, block in enumerate(runnable_blocks(page)):
        script = "\n".join(line for line in block.splitlines() if not line.startswith(NOT_RUN))
        result = subprocess.run(["bash", "-euo", "pipefail", "-c", script], cwd=project, env=env,
                                capture_output=True, text=True, timeout=300)
        assert result.returncode == 0, (f"{page.relative_to(ROOT)} block {i + 1} exited {result.returncode}:\n{block}\n"
                                        f"--- stdout\n{result.stdout[-3000:]}\n--- stderr\n{result.stderr[-3000:]}")
        assert "Traceback" not in result.stderr, result.stderr
    assert {p.name: p.read_bytes() for p in (ROOT / "stacks").glob("Pulumi.*.yaml")} == before  # the checkout untouched
