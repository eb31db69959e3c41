"""Which command a spotctl run names, and the app it runs with: only that command's module imported,
in an app holding only that command; the whole app for help, ``--version`` and completion."""

from __future__ import annotations

import sys

GROUP_VALUE_OPTIONS = ("--cwd", "-C")  # the group's options that take a value

# The module of cli.commands that registers each command (and group): `spotctl CMD` imports only
# that one (tests/test_startup.py checks this table against what cli.app registers).
# Every module of cli.commands that registers commands, in the order of `spotctl --help`.
COMMAND_MODULES = ("stack", "drill", "policy", "launch", "jobs", "cleanup", "move", "logs", "pool", "cost", "catalog", "watch", "check")
COMMAND_MODULE = {
    "validate": "stack", "plan": "stack", "sync": "stack", "drill": "drill", "simulate": "policy", "policy": "policy",
    "resume": "jobs", "failover": "jobs", "complete": "jobs", "status": "jobs", "events": "jobs", "cleanup": "cleanup",
    "move": "move", "logs": "logs", "pool": "pool", "cost": "cost", "watch": "watch",
    "catalog": "catalog", "show-gpus": "catalog", "launch": "launch", "stop": "launch", "check": "check",
}


def main(args: list[str] | None = None) -> None:
    """``spotctl ARGS`` (``python -m cli``): a command named in ARGS is run from an app holding only
    it, with only its module imported; anything else (help, ``--version``, completion, a name that is
    not a command) by the whole app (``cli.app``)."""
    import importlib

    args = sys.argv[1:] if args is None else list(args)
    module = COMMAND_MODULE.get(command_named(args) or "")
    if module is None:
        app = whole_app()
    else:
        importlib.import_module(f"cli.commands.{module}")
        from cli.commands import app
    one_command(app, args)(args)


def whole_app():
    """The app with every command registered (importing a module registers its commands)."""
    import importlib

    from cli.commands import app

    for name in COMMAND_MODULES:
        importlib.import_module(f"cli.commands.{name}")
    return app


def command_named(args: list[str]) -> str | None:
    """The command ARGS name (after only ``--cwd DIR``), or None: help, ``--version``, completion."""
    import os

    if any(k.startswith("_") and k.endswith("_COMPLETE") for k in os.environ):
        return None  # shell completion asks the whole app
    rest = list(args)
    while rest and (rest[0] in GROUP_VALUE_OPTIONS or rest[0].startswith("--cwd=")):
        rest = rest[2:] if rest[0] in GROUP_VALUE_OPTIONS else rest[1:]
    return rest[0] if rest and not rest[0].startswith("-") else None


def one_command(app, args: list[str]):
    """The app to run ``spotctl ARGS`` with: when ARGS name one command, an app with only that
    command (the same callback, settings and command); otherwise the whole app. Typer builds every
    command's parameters before running one, ~15 ms of a short command."""
    import copy

    from typer.main import get_command_name

    name = command_named(args)
    if name is None:
        return app
    commands = [c for c in app.registered_commands if (c.name or get_command_name(c.callback.__name__)) == name]
    groups = [g for g in app.registered_groups if g.name == name]
    if len(commands) + len(groups) != 1:
        return app
    lean = copy.copy(app)
    lean.registered_commands, lean.registered_groups = commands, groups
    return lean
