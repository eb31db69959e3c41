"""Which stack a command means and the files that belong to its stack file."""

from __future__ import annotations

import contextlib
import os
import re
from dataclasses import dataclass
from pathlib import Path

from infra.basics import ConfigError

STACK_FILE_RE = re.compile(r"Pulumi\.(?P<stack>[A-Za-z0-9_.-]+)\.yaml")  # fullmatch: `$` would allow a trailing newline


@dataclass(frozen=True)
class StackRef:
    """A stack by name and the file that holds its config; ``qualified`` is the name Pulumi selects
    it by when it was given as ``org/project/stack`` (``name`` is always the short stack name)."""

    name: str
    path: Path
    qualified: str | None = None

    @property
    def pulumi_name(self) -> str:
        return self.qualified or self.name


def project_root(start: Path | None = None) -> Path:
    """The nearest directory at or above ``start`` holding ``Pulumi.yaml`` (else ``start``)."""
    here = (start or Path.cwd()).resolve()
    for d in (here, *here.parents):
        if (d / "Pulumi.yaml").is_file():
            return d
    return here


# Used with fullmatch: `$` would also match before a trailing newline.
STACK_NAME_RE = re.compile(r"(?:(?P<org>[A-Za-z0-9_.-]+)/(?:(?P<project>[A-Za-z0-9_.-]+)/)?)?(?P<stack>[A-Za-z0-9_.-]+)")


def resolve(stack: str | None, stack_file: Path | None) -> StackRef:
    """Turn ``--stack NAME`` or ``--stack-file PATH`` into a StackRef, as Pulumi picks a stack:
    the option, else ``$PULUMI_STACK``, else the stack selected in the workspace. ``NAME`` may be
    ``org/project/stack`` (or ``org/stack``); the file is ``Pulumi.<stack>.yaml`` in the project's
    ``stackConfigDir``.

    Raises:
        ConfigError: both given, none found, a name of another project, or a file not named
            ``Pulumi.<stack>.yaml``.
    """
    if stack is not None and stack_file is not None:
        raise ConfigError("spotctl", ["give one of --stack NAME or --stack-file PATH, not both"])
    if stack_file is not None:
        m = STACK_FILE_RE.fullmatch(stack_file.name)
        if not m:
            raise ConfigError(str(stack_file), ["a stack file must be named Pulumi.<stack>.yaml"])
        return StackRef(m["stack"], stack_file)
    from cli.lifecycle.workspace import project_settings, selected_stack, stack_config_dir

    root = project_root()
    source = "--stack"
    if stack is None and os.environ.get("PULUMI_STACK"):
        stack, source = os.environ["PULUMI_STACK"], "PULUMI_STACK"
    if stack is None:
        stack, source = selected_stack(root), "the selected stack"
    if stack is None:
        raise ConfigError("spotctl", ["no stack: give --stack NAME (or --stack-file PATH), set PULUMI_STACK, "
                                      "or select one with `pulumi stack select NAME`"])
    if source == "--stack" and re.search(r"\.ya?ml$", stack) and STACK_FILE_RE.fullmatch(Path(stack).name):
        return resolve(None, Path(stack))  # a stack file's path given as --stack: what --stack-file PATH takes
    m = STACK_NAME_RE.fullmatch(stack)
    if not m:
        raise ConfigError("spotctl", [f"{source} {stack!r}: expected NAME or org/project/NAME "
                                      "(letters, digits, '-', '_' and '.')"])
    project = project_settings(root).get("name")
    if m["project"] and project and m["project"] != project:
        raise ConfigError("spotctl", [f"{source} {stack!r}: stack of project {m['project']!r}, but this is project "
                                      f"{project!r} ({root / 'Pulumi.yaml'})"])
    path = stack_config_dir(root) / f"Pulumi.{m['stack']}.yaml"
    with contextlib.suppress(ValueError):
        path = path.relative_to(Path.cwd())
    return StackRef(m["stack"], path, stack if m["org"] else None)


def beside(path: Path, suffix: str) -> Path:
    """``.<name><suffix>`` beside the file a symbolic link points to: the stack file's lock, the
    watcher's lease, journal and holder, so every path to one file (the link, its target, another
    link) names the same ones; beside a link they were two locks, and two edits lost one another's."""
    real = Path(os.path.realpath(path))
    return real.with_name(f".{real.name}{suffix}")


def lock_path(path: Path) -> Path:
    """The stack file's lock (the apply lock is named after it), per real file (``beside``)."""
    return beside(path, ".lock")


def proposal_path(path: Path) -> Path:
    """Beside the real file, as its lock (``lock_path``): every path to one stack file (a link, its
    target) sees the same proposal, so none decides on or pushes an edit still awaiting its answer."""
    real = Path(os.path.realpath(path))
    return index_path(real).with_name(f"{real.name}.proposal.json")


def index_path(path: Path) -> Path:
    """Where a stack file's job index lives (beside ``spotctl policy fit``'s learned file)."""
    return path.parent / ".spotctl" / f"{path.name}.index"


def sync_record_path(path: Path) -> Path:
    """Where ``spotctl sync`` records the shared copy this file was last synced with (``cli.lifecycle.sync``)."""
    return index_path(path).with_name(f"{path.name}.sync.json")
