"""The VM agent runs on the images' own Python (>= 3.8) with the standard library only: no 3.9+
syntax or API (vermin), no import outside the stdlib and the agent itself, and its zipapp is
reproducible (one digest per source)."""

from __future__ import annotations

import ast
import py_compile
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from infra.agent_artifact import AGENT_DIR, artifact, sources

FILES = sorted(AGENT_DIR.glob("*.py"))


@pytest.mark.parametrize("path", FILES, ids=[p.name for p in FILES])
def test_parses_as_python_38_and_compiles(path, tmp_path):
    ast.parse(path.read_text(), feature_version=(3, 8))
    py_compile.compile(str(path), cfile=str(tmp_path / "x.pyc"), doraise=True)


def test_vermin_finds_nothing_newer_than_38():
    vermin = shutil.which("vermin") or str(Path(sys.executable).parent / "vermin")
    done = subprocess.run([vermin, "--no-tips", "--violations", "-t=3.8-", str(AGENT_DIR)],
                          capture_output=True, text=True, check=False)
    assert done.returncode == 0, done.stdout + done.stderr


def test_vermin_catches_a_39_api(tmp_path):
    """(The check above can fail: str.removeprefix is 3.9.)"""
    bad = tmp_path / "bad.py"
    bad.write_text("x = 'ab'.removeprefix('a')\n")
    vermin = shutil.which("vermin") or str(Path(sys.executable).parent / "vermin")
    done = subprocess.run([vermin, "--no-tips", "--violations", "-t=3.8-", str(bad)], capture_output=True, text=True, check=False)
    assert done.returncode != 0


@pytest.mark.parametrize("path", FILES, ids=[p.name for p in FILES])
def test_imports_only_the_stdlib_and_itself(path):
    for node in ast.walk(ast.parse(path.read_text())):
        names = [a.name for a in node.names] if isinstance(node, ast.Import) else \
            [node.module or ""] if isinstance(node, ast.ImportFrom) and node.level == 0 else []
        for name in names:
            top = name.split(".")[0]
            assert top == "agent" or top in sys.stdlib_module_names, f"{path.name} imports {name}"


def test_the_zipapp_is_reproducible_and_runs(tmp_path):
    first = artifact()
    artifact.cache_clear()
    assert artifact() == first
    assert set(sources()) == {f"agent/{p.name}" for p in FILES}
    pyz = tmp_path / "agent.pyz"
    pyz.write_bytes(first.data)
    done = subprocess.run([sys.executable, str(pyz), "nonsense"], capture_output=True, text=True, check=False)
    assert done.returncode == 2 and "usage: agent [main|run|watch|shutdown|busy|idle]" in done.stderr


def test_the_guides_variable_table_is_generated_from_the_schema():
    from agent.schema import variables_table

    guide = (Path(__file__).resolve().parent.parent / "docs" / "guides" / "vm-agent.md").read_text()
    assert variables_table() in guide
