"""Issue 20: what `spotctl --help` loads. The Rich help stays as Typer prints it; what it never needs
(the pydantic config models, Markdown and traceback rendering) is not imported for it."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

PROBE = """
import sys
from typer.testing import CliRunner
from cli.app import app
result = CliRunner().invoke(app, ["--help"], terminal_width=100)
assert result.exit_code == 0, result.output
print(result.output)
print("LOADED", *sorted(m for m in ("infra.config", "markdown_it", "pygments", "rich.markdown", "rich.traceback") if m in sys.modules))
import rich.markdown, rich.traceback
print("REAL", rich.markdown.Markdown.__module__, hasattr(rich.markdown, "Heading"), hasattr(rich.traceback, "install"))
"""


def test_help_is_typers_rich_help_without_the_config_models_markdown_or_tracebacks():
    out = subprocess.run([sys.executable, "-c", PROBE], cwd=ROOT, capture_output=True, text=True, check=True).stdout
    assert "╭─ Commands" in out and "resume" in out and "Usage:" in out
    assert out.splitlines()[-2] == "LOADED"
    # afterwards the real modules import as usual
    assert out.splitlines()[-1] == "REAL rich.markdown True True"


def test_a_usage_error_still_prints_typers_rich_error_box():
    result = subprocess.run([sys.executable, "-m", "cli", "resume"], cwd=ROOT, capture_output=True, text=True,
                            env={"COLUMNS": "100", "PATH": "/usr/bin:/bin"})
    assert result.returncode == 2
    assert "Missing argument 'job'" in result.stderr and "╭─ Error" in result.stderr
