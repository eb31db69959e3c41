"""The ``spotctl`` command line: the Typer app with every command registered. Commands are thin
(parse, call one function of a part, print) and live in ``cli.commands``, one module per area;
domain errors are caught there only. Cloud SDKs and pulumi are imported inside the commands."""

from __future__ import annotations

import importlib

from cli.commands import app
from cli.commands.startup import main as run

# Importing a module registers its commands; this order is the order of `spotctl --help`.
COMMAND_MODULES = ("stack", "drill", "policy", "launch", "jobs", "move", "logs", "pool", "cost", "watch", "check")
for _name in COMMAND_MODULES:
    importlib.import_module(f"cli.commands.{_name}")

__all__ = ["app", "main"]


def main() -> None:
    """``spotctl``: only the command that runs is imported and built (``cli.commands.startup.main``)."""
    run()
