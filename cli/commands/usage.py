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
                typer.echo(f"error: {usage_error(exc)}", err=True)
            sys.exit(exc.exit_code)
        except Abort:  # (a question answered with Ctrl-D or Ctrl-C)
            typer.echo("Aborted!", err=True)
            sys.exit(1)
        sys.exit(code if type(code) is int else 0)


def usage_error(exc: Exception) -> str:
    """One line for a usage error: pydantic's wording trimmed, a close choice suggested, and where the
    command's help is."""
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
        return message
    names = []
    while ctx.parent is not None:  # (the root's name is how it was started: `python -m cli` too)
        names.insert(0, ctx.info_name)
        ctx = ctx.parent
    return f"{message} See `{' '.join(['spotctl', *names])} -h`."
