"""The ``spotctl`` command line: the Typer app with every command registered. Commands are thin
(parse, call one function of a part, print) and live in ``cli.commands``, one module per area;
domain errors are caught there only. Cloud SDKs and pulumi are imported inside the commands."""

from __future__ import annotations

from cli.commands.startup import COMMAND_MODULES, whole_app
from cli.commands.startup import main as run

app = whole_app()

__all__ = ["COMMAND_MODULES", "app", "main"]


def main() -> None:
    """``spotctl``: only the command that runs is imported and built (``cli.commands.startup.main``)."""
    run()
