"""Lines fitted to the terminal (at most 100 columns, 80 by default): a person's output never runs
off the screen; --json output stays one line per record."""

import typer

from cli.commands import warn


def say_warning(text: str, json_out: bool) -> None:
    """A warning of ``status``: one line for scripts (--json), wrapped to the terminal for a person."""
    if json_out:
        warn(text)
    else:
        typer.echo(wrapped(f"warning: {text}"), err=True)


def urn_line(urn: str, note: str) -> str:
    """``  - delete TYPE NAME`` of a URN (``urn:pulumi:STACK::PROJECT::PARENTS$TYPE::NAME``), wrapped to the
    terminal (at most 100 columns): the type as ``pulumi preview`` shows it, never a 170-column URN."""
    from cli.plan.tree import short_type

    head, _, name = urn.rpartition("::")
    kind = short_type(head.rpartition("::")[2].rpartition("$")[2])
    return wrapped(f"- delete {kind} {name}{note}", "  ", "    ")


def columns() -> int:
    """The width a person's output fits: $COLUMNS, else the terminal's, else 80 (piped: a file or a pager
    is read at 80 too, as `status` prints)."""
    import shutil

    return shutil.get_terminal_size((80, 24)).columns


def width() -> int:
    """``columns()``, at most 100: lines a person reads, never wider even on a wide terminal."""
    return min(columns(), 100)


def wrapped(text: str, first: str = "", rest: str = "    ") -> str:
    import textwrap

    return "\n".join(textwrap.wrap(text, width(), initial_indent=first, subsequent_indent=rest, break_on_hyphens=False))
