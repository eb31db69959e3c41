"""What `spotctl --help` loads (a short command must start fast). The Rich help stays as Typer prints it; what it never needs
(the pydantic config models, Markdown and traceback rendering) is not imported for it."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

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


@pytest.mark.parametrize(("args", "line"), [
    (["resume"], "error: Missing argument 'job'. See `spotctl resume -h`."),
    (["resume", "x", "--capacity", "spto"],
     "error: Invalid value for '--capacity': 'spto' is not one of 'spot', 'on-demand' (did you mean 'spot'?). See `spotctl resume -h`."),
    (["drill", "--cloud", "GCP"],
     "error: Invalid value for '--cloud': 'GCP' is not one of 'gcp', 'aws' (did you mean 'gcp'?). See `spotctl drill -h`."),
    (["logs", "x", "--attempt", "0"], "error: Invalid value for '--attempt': should be greater than or equal to 1. See `spotctl logs -h`."),
    (["status", "--bogus"], "error: No such option: --bogus. See `spotctl status -h`."),
    (["bogus"], "error: No such command 'bogus'. Did you mean 'logs'? See `spotctl -h`."),
    (["pool", "bogus"], "error: No such command 'bogus'. See `spotctl pool -h`."),
    (["resume", "x", "--capacity"], "error: Option '--capacity' requires an argument. See `spotctl resume -h`."),
    (["pool", "demand", "--stack"], "error: Option '--stack' requires an argument. See `spotctl pool demand -h`."),
])
def test_a_usage_error_is_one_error_line_naming_the_option(args, line):
    result = subprocess.run([sys.executable, "-m", "cli", *args], cwd=ROOT, capture_output=True, text=True,
                            env={"COLUMNS": "100", "PATH": "/usr/bin:/bin"})
    assert (result.returncode, result.stdout, result.stderr) == (2, "", line + "\n")


def test_usage_errors_keep_typers_exit_codes_and_help_on_no_arguments():
    from typer.testing import CliRunner

    from cli.app import app

    runner = CliRunner()
    bare = runner.invoke(app, ["pool"])
    assert bare.exit_code == 2 and "Usage:" in bare.output and "error:" not in bare.output  # the help, as before
    assert runner.invoke(app, ["--version"]).exit_code == 0
    bad = runner.invoke(app, ["failover", "x", "--to", "ondemand"])
    assert bad.exit_code == 2 and bad.stderr.splitlines() == [
        "error: Invalid value for '--to': 'ondemand' is not one of 'spot', 'on-demand' (did you mean 'on-demand'?). "
        "See `spotctl failover -h`."]


def _params():
    """Every parameter of every spotctl command, with a context to convert its values in."""
    import typer.main

    from cli.app import app

    group = typer.main.get_command(app)
    out = []
    for cmd in [group, *group.commands.values()]:
        for sub in [cmd, *getattr(cmd, "commands", {}).values()]:
            out += [(sub, p) for p in sub.params]
    return out


def _convert(build, command, param, value):
    """(value, None) or (None, the error message) of converting ``value`` as ``build``'s RuntimeParam does."""
    import typer._click as click

    ctx = click.Context(command)
    try:
        result = build(param.type_descriptor)._coerce_value(value, param=param, ctx=ctx)
        return (type(result), repr(result)), None  # repr: nan == nan
    except click.exceptions.BadParameter as exc:
        return None, exc.format_message()


VALUES = ["0", "1", "-3", "007", "+4", " 5", "1.5", "-0.25", "1e3", "inf", "nan", "1_000", "99999999999999999999",
          "spot", "on-demand", "SPOT", "gcp", "x", "", "a/b", "/nonexistent/dir", ".", "ünïcode"]


def test_plain_conversion_is_typers_for_every_option_and_value():
    """The pydantic-free conversion of plain options (cli/commands/startup.py plain_coercion) gives what Typer's
    adapter gives, value or error, for every parameter spotctl has."""
    from typer import _coercion, core

    import cli.commands  # noqa: F401  (installs it)

    assert core.build_runtime_param is not _coercion.build_runtime_param
    checked = 0
    for command, param in _params():
        for value in VALUES:
            mine = _convert(core.build_runtime_param, command, param, value)
            typers = _convert(_coercion.build_runtime_param, command, param, value)
            assert mine == typers, (command.name, param.name, value)
            checked += 1
    assert checked > 1000


@settings(max_examples=50, deadline=None)
@given(st.text(max_size=12) | st.from_regex(r"-?[0-9]{1,20}(\.[0-9]{0,17})?", fullmatch=True))
def test_plain_conversion_is_typers_for_any_text(value):
    from typer import _coercion, core

    import cli.commands  # noqa: F401

    for command, param in _params():
        if param.type_descriptor.annotation in (int, float, str):
            assert _convert(core.build_runtime_param, command, param, value) == \
                _convert(_coercion.build_runtime_param, command, param, value), (param.name, value)


@pytest.mark.parametrize("args", [["status", "--help"], ["resume"], ["-C", ".", "resume", "--capacity", "x", "j"],
                                  ["policy", "--help"], ["policy", "show", "--help"], ["statu"], ["--help"], ["--version"]])
def test_the_app_for_one_command_says_what_the_whole_app_says(args):
    """`spotctl CMD ...` builds only CMD (one_command); its help, errors and exit codes are the whole app's."""
    from typer.testing import CliRunner

    from cli.app import app
    from cli.commands.startup import one_command

    lean = one_command(app, args)
    if args[0] in ("--help", "--version", "statu"):
        assert lean is app  # the group's own help and errors list every command
    else:
        assert [c.callback.__name__ for c in lean.registered_commands] + [g.name for g in lean.registered_groups] == \
            [args[2] if args[0] == "-C" else args[0]]
    mine, whole = CliRunner().invoke(lean, args, terminal_width=100), CliRunner().invoke(app, args, terminal_width=100)
    assert (mine.exit_code, mine.output) == (whole.exit_code, whole.output)


def test_each_command_is_run_from_the_module_that_registers_it():
    """`spotctl CMD` imports only COMMAND_MODULE[CMD] (cli/commands/startup.py): the table must name
    every command and group cli.app registers, each with its module."""
    from typer.main import get_command_name

    from cli.app import COMMAND_MODULES, app
    from cli.commands.startup import COMMAND_MODULE

    registered = {}
    for info in app.registered_commands:
        registered[info.name or get_command_name(info.callback.__name__)] = info.callback.__module__
    for info in app.registered_groups:
        registered[info.name] = next(c.callback.__module__ for c in info.typer_instance.registered_commands)
    assert {name: f"cli.commands.{m}" for name, m in COMMAND_MODULE.items()} == registered
    assert set(COMMAND_MODULE.values()) == set(COMMAND_MODULES)


def test_spotctl_status_imports_only_its_commands_module(project):
    out = subprocess.run([sys.executable, "-c", "import sys; from cli.commands.startup import main; main(['status', '--help']);"],
                         cwd=project, capture_output=True, text=True, env={"PYTHONPATH": str(ROOT), "COLUMNS": "100"})
    assert out.returncode == 0 and "Usage:" in out.stdout
    probe = ("import sys\nfrom cli.commands.startup import main\ntry:\n    main(['status', '--stack', 'example-gcp'])\n"
             "except SystemExit:\n    pass\nprint('MODULES', *sorted(m for m in sys.modules if m.startswith('cli.commands.')))")
    out = subprocess.run([sys.executable, "-c", probe], cwd=project, capture_output=True, text=True,
                         env={"PYTHONPATH": str(ROOT), "COLUMNS": "100", "PATH": "/usr/bin:/bin"})
    assert "llm-pretrain" in out.stdout, out.stderr
    assert out.stdout.splitlines()[-1] == "MODULES cli.commands.hints cli.commands.jobs cli.commands.startup cli.commands.textfit cli.commands.usage"  # (helpers, no commands)
