"""Usage errors (an unknown option or command, a bad or missing value) as one ``error:`` line, as
every other problem is: the root group of the Typer app (``cli.commands``)."""

import sys

import typer


class OneLineErrors(typer.core.TyperGroup):
    """The root group, whose usage errors (an unknown option or command, a bad or missing value) are
    one ``error:`` line naming the option, as every other problem is, instead of Typer's framed box."""

    def main(self, args=None, prog_name=None, complete_var=None, standalone_mode=True, **extra):
        if not standalone_mode:
            return super().main(args, prog_name, complete_var, standalone_mode, **extra)
        from typer._click.exceptions import ClickException
        from typer.exceptions import Abort

        try:
            # (not standalone: Typer hands back the errors, and the exit code of a typer.Exit, itself)
            code = super().main(args, prog_name, complete_var, False, **extra)
        except ClickException as exc:
            if type(exc).__name__ != "NoArgsIsHelpError":  # (its message is the help, printed already)
                words = sys.argv[1:] if args is None else list(args)
                typer.echo(f"error: {usage_error(exc, self.command_path(words))}", err=True)
            sys.exit(exc.exit_code)
        except Abort:  # (a question answered with Ctrl-D or Ctrl-C)
            typer.echo("Aborted!", err=True)
            sys.exit(1)
        sys.exit(code if type(code) is int else 0)


    def command_path(self, words: list[str]) -> list[str]:
        """The (sub)command names the leading words select: for an error raised where no context names
        its command (click's parser: "Option '--to' requires an argument.")."""
        names, group = [], self
        for word in words:
            command = getattr(group, "commands", {}).get(word)
            if command is None:
                break
            names.append(word)
            group = command
        return names


def usage_error(exc: Exception, names: list[str] | None = None) -> str:
    """One line for a usage error: pydantic's wording trimmed, a close choice suggested, and where the
    command's help is (``names``: the command's, when the error carries no context)."""
    import difflib
    import re

    message = " ".join(exc.format_message().split()).replace("Value error, ", "").replace("Input should be", "should be")
    bad = re.search(r"'([^']*)' is not one of ((?:'[^']*'(?:, )?)+)", message)
    if bad:
        choices = {c.lower(): c for c in re.findall(r"'([^']*)'", bad[2])}  # (GCP -> gcp too)
        close = difflib.get_close_matches(bad[1].lower(), list(choices), n=1, cutoff=0.5)
        if close:
            message = f"{message.rstrip('.')} (did you mean '{choices[close[0]]}'?)."
    message += "" if message.endswith((".", "?")) else "."
    ctx = getattr(exc, "ctx", None)
    if ctx is None:
        return message if names is None else f"{message} See `{' '.join(['spotctl', *names])} -h`."
    names = []
    while ctx.parent is not None:  # (the root's name is how it was started: `python -m cli` too)
        names.insert(0, ctx.info_name)
        ctx = ctx.parent
    return f"{message} See `{' '.join(['spotctl', *names])} -h`."


def flags_as_flags() -> None:
    """Typer shows a boolean flag's type in the help's type column (``<bool>``, typer/core.py
    ``TyperOption.display_type_rich``), as if it took a value: a flag takes none, so that column stays empty."""
    from typer.core import TyperOption

    shown = TyperOption.display_type_rich
    if getattr(shown, "spotctl_flags", False):
        return

    def display_type_rich(self, ctx):
        return None if self.is_flag and self.metavar is None else shown(self, ctx)

    display_type_rich.spotctl_flags = True
    TyperOption.display_type_rich = display_type_rich


flags_as_flags()  # (on import: every app spotctl builds takes its OneLineErrors from here)
