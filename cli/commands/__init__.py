"""What every command shares: the Typer app, the common options, and turning the parts' errors
into one ``error:`` line with a non-zero exit. Commands live in the sibling modules, one per area;
each parses, calls one function of a part, and prints. The command modules evaluate their
annotations when they are defined (no ``from __future__ import annotations``): Typer would otherwise
evaluate every annotation string twice per command each time it builds the app, a short command's start-up."""

import enum
import sys
from pathlib import Path
from typing import Annotated, Optional

import typer

from cli.commands.usage import OneLineErrors
from cli.faster import faster_start
from infra.basics import ConfigError

faster_start()

app = typer.Typer(
    cls=OneLineErrors,
    name="spotctl",
    help="Spot/preemptible GPU training as code: validate and plan stacks offline, resume jobs after preemption.",
    no_args_is_help=True,
    add_completion=True,  # --install-completion / --show-completion (bash, zsh, fish, PowerShell)
    pretty_exceptions_enable=False,
    context_settings={"help_option_names": ["-h", "--help"]},
)


def _version(value: bool) -> None:
    if value:
        from importlib.metadata import PackageNotFoundError, version

        try:
            typer.echo(f"spotctl {version('spotctl')}")
        except PackageNotFoundError:
            typer.echo("spotctl (not installed as a package)")
        raise typer.Exit()


@app.callback()
def _main(
    show_version: Annotated[bool, typer.Option("--version", callback=_version, is_eager=True, help="Print spotctl's version and exit.")] = False,
    cwd: Annotated[Optional[Path], typer.Option("--cwd", "-C", metavar="DIR", help="Run as if started in DIR (like pulumi --cwd): the project is found from there.")] = None,
) -> None:
    """Spot/preemptible GPU training as code: validate and plan stacks offline, resume jobs after preemption."""
    global SHELL_CWD
    SHELL_CWD = Path.cwd() if cwd is not None else None  # (set at every command: one process may run several)
    if cwd is not None:
        import os

        try:
            os.chdir(cwd)
        except OSError as exc:
            raise fail(f"--cwd {cwd}: {exc.strerror}") from None

SHELL_CWD: Optional[Path] = None  # where the shell was, when -C moved spotctl (None: it did not)


def shell_cwd() -> Path:
    """Where the user's shell is: where spotctl was started, also under ``-C DIR`` (which moves only
    where the project is found from)."""
    return SHELL_CWD or Path.cwd()


def shell_path(path: Path) -> Path:
    """``path`` as the user's shell means it (relative to :func:`shell_cwd`; unchanged without -C)."""
    return path if SHELL_CWD is None or path.is_absolute() else SHELL_CWD / path


class CloudName(enum.StrEnum):
    """The clouds spotctl plays and targets (an enum so --help and completion show the choices)."""

    GCP = "gcp"
    AWS = "aws"


StackOpt = Annotated[
    Optional[str],
    typer.Option("--stack", "-s", metavar="NAME", help="Stack name or org/project/NAME (default: $PULUMI_STACK, else the "
                 "stack `pulumi stack select` chose); reads Pulumi.NAME.yaml in Pulumi.yaml's stackConfigDir."),
]
StackFileOpt = Annotated[
    Optional[Path], typer.Option("--stack-file", metavar="PATH", help="A Pulumi.<stack>.yaml file anywhere.")
]
JsonOpt = Annotated[bool, typer.Option("--json", help="Machine-readable output.")]
NoApplyOpt = Annotated[bool, typer.Option("--no-apply", help="Only edit the stack file; do not run pulumi.")]
YesOpt = Annotated[bool, typer.Option("--yes", "-y", help="Apply without the preview and the question (needed when stdin is not a terminal).")]
PreviewOnlyOpt = Annotated[bool, typer.Option("--preview-only", help="Show Pulumi's preview of the update, then stop: nothing changes.")]
BucketOpt = Annotated[
    Optional[str], typer.Option("--events-bucket", metavar="NAME", help="Read events from the stack's event bucket (the eventBucket output).")
]
ObserveOpt = Annotated[
    bool, typer.Option("--observe", help="Also ask the cloud (boto3 / google-cloud-compute) what the job's VMs are doing now.")
]
EventsOpt = Annotated[
    Optional[Path],
    typer.Option("--events-dir", metavar="DIR", help="Recorded events: the event bucket synced locally, or a job disk's .spotctl/."),
]


def stack_jobs(stack: Optional[str], stack_file: Optional[Path], job: Optional[str], for_status: bool = False,
               whole: bool = False):
    """(ref, config, jobs): the stack's jobs, or only ``job``; errors name the file (and the job).
    ``for_status``: the jobs as ``status`` reads them (``status_jobs``: config None unless ``whole``)."""
    from cli.lifecycle import stackfile

    ref = None
    try:
        ref = stackfile.resolve(stack, stack_file)
        if for_status:
            from cli.lifecycle.status import status_jobs

            return ref, *status_jobs(ref, job, whole)
        cfg = stackfile.load_job(ref, job) if job else stackfile.load(ref)  # one job: only its lines when indexed
        return ref, cfg, ([cfg.job(job)] if job else list(cfg.jobs))
    except ConfigError as exc:
        raise fail(str(exc)) from None
    except KeyError as exc:
        raise fail(f"{ref.path if ref else 'spotctl'}: job {job}: {exc.args[0]}") from None


def cloud_for(cfg, ref):
    from cli.cloud import Cloud

    return Cloud(cfg, ref.name)


def guard(fn):
    """Run a call into the parts; a cloud failure becomes one error line."""
    from cli.cloud import CloudError

    try:
        return fn()
    except CloudError as exc:
        raise fail(str(exc)) from None


def recorded_events(ref, cfg, job_id: str, events_dir, bucket):
    from cli.lifecycle import bucketevents, direvents

    if events_dir is not None and not events_dir.exists():
        raise fail(f"--events-dir {events_dir}: no such file or directory")
    if not bucket:  # what events.recorded reads without a bucket; no cloud object (status: cfg may be None)
        return direvents.dir_events(events_dir, {job_id}, ref.name, warn)

    return guard(lambda: bucketevents.recorded(cloud_for(cfg, ref), job_id, events_dir, bucket, warn))


def read_events(ref, cfg, job_id: str, events_dir, bucket, where: str) -> list:
    """A job's recorded events from what ``events_source`` found ([] from nowhere).

    Raises:
        Unread: a bucket found (``where``) could not be read; a given one's failure is one error line.
    """
    if not where:
        return recorded_events(ref, cfg, job_id, events_dir, bucket) if bucket or events_dir is not None else []
    from cli.cloud import CloudError
    from cli.commands.hints import Unread
    from cli.lifecycle import bucketevents

    try:
        return bucketevents.recorded(cloud_for(cfg, ref), job_id, None, bucket, warn)
    except CloudError as exc:
        raise Unread(f"the events in {where} could not be read: {exc}") from None


def read_jobs_events(ref, cfg, jobs: list, events_dir, bucket, where) -> dict[str, list]:
    """:func:`read_events` of every job of ``jobs`` at once (the events read once, not once per job)."""
    from cli.cloud import CloudError
    from cli.commands.hints import Unread
    from cli.lifecycle import bucketevents

    if not where and not bucket and events_dir is None:
        return {j.id: [] for j in jobs}
    if events_dir is not None and not events_dir.exists() and not where:
        raise fail(f"--events-dir {events_dir}: no such file or directory")
    attempts = {j.id: j.attempt for j in jobs}
    cloud = cloud_for(cfg, ref) if bucket else None
    try:
        return bucketevents.recorded_jobs(cloud, ref.name, attempts, None if where else events_dir, bucket, warn)
    except CloudError as exc:
        if where:
            raise Unread(f"the events in {where} could not be read: {exc}") from None
        raise fail(str(exc)) from None


def warn(line: str) -> None:
    typer.echo(f"warning: {line}", err=True)


def shared_copy(ref, cfg, bucket: Optional[str] = None, applier=None, *, always: bool = False, keep: Optional[str] = None,
                keep_unsynced: Optional[str] = None, bucket_option: bool = True):
    """The stack file's sync session (``cli.lifecycle.sync.Shared``), or None when this file is not
    shared: it is once this machine synced it (``spotctl sync``) or when the stack declares a watcher.
    The bucket: ``bucket`` (--events-bucket), else the one last synced with, else the stack's
    eventBucket output (only with an ``applier``); none of them is one warning, and the file is used alone
    (``bucket_option``: whether the command has --events-bucket to suggest)."""
    from cli.commands.hints import bucket_hint
    from cli.lifecycle import sync
    from cli.lifecycle.apply import ApplyError

    rec = sync.read_record(ref.path)
    if not (always or rec is not None or cfg.watcher is not None):
        return None
    bucket = bucket or (rec.bucket if rec else None)
    if bucket is None and applier is not None:
        try:
            bucket = applier.outputs().get("eventBucket")
        except ApplyError as exc:
            warn(f"{exc}: {ref.path} is used without its shared copy ({bucket_hint(ref, bucket_option)})")
            return None
    if bucket is None:
        warn(f"{ref.path}: no event bucket known for its shared copy ({bucket_hint(ref, bucket_option)}): "
             "the file is used without it")
        return None
    return sync.Shared(ref, cloud_for(cfg, ref), bucket, warn, keep=keep, keep_unsynced=keep_unsynced)


def pull_first(stack, stack_file, job: Optional[str], bucket: Optional[str], no_apply: bool, bucket_option: bool = True):
    """For a command that changes the stack file: its sync session (or None), attached, with the shared
    copy already pulled, so the command reads and decides on the merged file. Use as a context manager.
    ``bucket_option``: whether the command has --events-bucket (its warnings suggest only what it has)."""
    import contextlib

    from cli.lifecycle import stackfile

    @contextlib.contextmanager
    def attached():
        try:
            ref = stackfile.resolve(stack, stack_file)
            cfg = stackfile.load_job(ref, job) if job else stackfile.load(ref)
        except (ConfigError, KeyError):
            yield None  # the command itself names the problem
            return
        session = shared_copy(ref, cfg, bucket, applier_for(ref, no_apply), bucket_option=bucket_option)
        if session is None:
            yield None
            return
        with stackfile.sharing(ref.path, session):
            try:
                stackfile.pull_shared(ref.path)
            except ConfigError as exc:
                raise fail(str(exc)) from None
            yield session

    return attached()


def fail(message: str) -> typer.Exit:
    """Print one error (already naming file/key/job) and return the exit to raise."""
    for line in message.splitlines():
        typer.echo(f"error: {line}", err=True)
    return typer.Exit(1)


def applier_for(ref, no_apply: bool, step=None):
    """The stack's Applier (None with --no-apply); ``step`` hears each pulumi step it starts (a spinner's)."""
    import dataclasses
    import os

    from cli.lifecycle.apply import Applier
    from cli.lifecycle.stackfile import project_root

    if no_apply:
        return None
    root = os.environ.get("SPOTCTL_PULUMI_ROOT")  # a pulumi install outside PATH (dir with bin/pulumi)
    applier = Applier(project_root(ref.path.parent), ref.pulumi_name, Path(root) if root else None)
    return applier if step is None else dataclasses.replace(applier, step=step)


def interactive() -> bool:
    """Whether a person can answer a question (stdin is a terminal)."""

    return sys.stdin.isatty()


def confirmer(yes: bool, preview_only: bool, no_apply: bool = False):
    """The ``confirm`` callback a changing command passes to its part: None applies without a
    preview (--yes, --no-apply); --preview-only previews and declines; otherwise the question is
    asked on the terminal. Without a terminal and without --yes nothing is changed (like
    ``pulumi up`` in non-interactive mode)."""
    if preview_only:
        return lambda question: False
    if yes or no_apply:
        return None
    if not interactive():
        raise fail("stdin is not a terminal: pass --yes to apply without a question, or --preview-only to only see the preview")
    return _ask


def _ask(question: str) -> bool:
    """The question on the terminal; Ctrl-C or the end of input there (click's Abort) is a
    KeyboardInterrupt for the part, which undoes its edit (``interrupts.Interrupted``)."""
    if sys.stdin.isatty():
        return _tty_confirm(question)
    try:  # input from a pipe or CliRunner: click's question as it is
        return typer.confirm(question, default=False, err=True)
    except typer.Abort:
        raise KeyboardInterrupt from None


def _tty_confirm(question: str) -> bool:
    """``[y/N]`` on a terminal (as click asks it) whose wait always hears a signal.

    ``input()`` writes its prompt and then blocks in read(); CPython runs a Python signal handler
    only between bytecodes or when read() is interrupted, so a SIGTERM or Ctrl-C landing between
    the prompt and the read was lost and the process waited for Enter forever (found by a test that
    sends the signal as soon as the prompt shows). The wait is a select() with a timeout instead:
    bytecode runs at least every 0.2 s, and a pending handler with it.

    Ctrl-C typed at the question always answers it, also when SIGINT was inherited as ignored
    (a command started from a script's background job: bash ignores SIGINT there, and Python then
    installs no handler): the question is interactive, and the key is the user's answer."""
    import signal
    import threading

    inherited = signal.getsignal(signal.SIGINT)
    hear = inherited is signal.SIG_IGN and threading.current_thread() is threading.main_thread()
    if hear:
        signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        return _tty_answer(question)
    finally:
        if hear:
            signal.signal(signal.SIGINT, signal.SIG_IGN)


def _tty_answer(question: str) -> bool:
    while True:
        sys.stderr.write(f"{question} [y/N]: ")
        sys.stderr.flush()
        line = _tty_line()
        if line is None:  # the end of input (Ctrl-D): as click, an abort
            sys.stderr.write("\n")
            raise KeyboardInterrupt
        answer = line.strip().lower()
        if answer in ("y", "yes"):
            return True
        if answer in ("n", "no", ""):
            return False
        sys.stderr.write("Error: invalid input\n")


_TYPED = bytearray()  # typed past the last answer: a terminal out of line mode hands over several lines at once


def _tty_line() -> str | None:
    """The next line typed at the terminal (None at the end of input), read from the descriptor
    itself, so nothing typed ahead waits in a buffer select() cannot see."""
    import os
    import select

    fd = sys.stdin.fileno()
    while b"\n" not in _TYPED:
        while not select.select([fd], [], [], 0.2)[0]:
            pass
        chunk = os.read(fd, 4096)
        if not chunk:
            if not _TYPED:
                return None
            break  # a last line without its newline
        _TYPED.extend(chunk)
    line, _, rest = bytes(_TYPED).partition(b"\n")
    _TYPED[:] = rest
    return line.decode("utf-8", errors="replace")


def interrupted(exc) -> typer.Exit:
    """An ``interrupts.Interrupted``: its message, and the exit code of the signal (130 for Ctrl-C)."""
    typer.echo(f"error: {exc}", err=True)
    return typer.Exit(128 + exc.signum)


def run_change(stack, stack_file, job_id: str, decide, no_apply: bool, json_out: bool,
               yes: bool = False, preview_only: bool = False, applier=None, costs=None) -> None:
    """Decide and make one job's change under the lock (``applier``: one the command already used; ``costs``: a JobCost)."""
    import json

    from cli.lifecycle import pipeline, stackfile
    from cli.lifecycle.apply import ApplyError
    from cli.lifecycle.states import LifecycleError

    if preview_only and no_apply:
        raise fail("--preview-only needs pulumi: it cannot be combined with --no-apply")
    confirm = confirmer(yes, preview_only, no_apply)
    if costs is not None and confirm is not None:
        confirm = costs.before(confirm)
    try:
        ref = stackfile.resolve(stack, stack_file)
        with progress(f"job {job_id}: deciding under the lock of {ref.path.name}", enabled=not json_out) as spinner:
            if applier is not None:  # (the same one: its stack is selected once)
                applier.step = spinner.step
            outcome = pipeline.change_job(ref, job_id, decide, applier=applier or applier_for(ref, no_apply, spinner.step), out=spinner.echo,
                                            confirm=spinner.paused(confirm) if confirm else None, pure=True)
    except (ConfigError, LifecycleError, ApplyError) as exc:
        raise fail(str(exc)) from None
    except pipeline.Interrupted as exc:
        raise interrupted(exc) from None
    change = outcome.change
    if json_out:
        cost = {"cost": costs.figures()} if costs is not None else {}
        typer.echo(json.dumps({"job": change.job_id, "changed": not change.noop and not outcome.declined, "fields": change.fields,
                               "reason": change.reason, "applied": outcome.applied, "declined": outcome.declined, **cost}, sort_keys=True))
    elif outcome.declined:
        typer.echo(change.describe() + (" — preview only: nothing changed" if preview_only else " — not confirmed: nothing changed"))
    else:
        typer.echo(change.describe() + ("" if change.noop else (" — applied" if outcome.applied else
                                                           f" — written to {ref.path}; nothing applied (pulumi was not run)")))


class Spinner:
    """A spinner on stderr naming the current step while slow work runs. Only when stderr is a
    terminal and never with --json (``enabled`` False): output read by scripts, tests and pipes
    stays plain. Lines printed with ``echo`` go above it; ``ask`` stops it for a question."""

    def __init__(self, step: str, enabled: bool = True):

        self.base, self.status, self.console = step, None, None
        if enabled and sys.stderr.isatty():
            from rich.console import Console

            self.console = Console(stderr=True)
            self.status = self.console.status(self._text(step))

    @staticmethod
    def _text(text: str):
        from rich.text import Text  # plain text: pulumi's lines hold [brackets], never markup

        return Text(text, no_wrap=True, overflow="ellipsis")

    def __enter__(self) -> "Spinner":
        if self.status is not None:
            self.status.start()
        return self

    def __exit__(self, *exc: object) -> None:
        if self.status is not None:
            self.status.stop()

    def step(self, text: str) -> None:
        """The step now under way (shown next to the spinner)."""
        self.base = text
        if self.status is not None:
            self.status.update(self._text(text))

    def echo(self, line: str) -> None:
        """Print one line of a tool's output on stderr (above the spinner; it also shows as the step's detail)."""
        line = line.rstrip("\n")
        if self.console is None or self.status is None:
            typer.echo(line, err=True)
            return
        self.console.out(line, highlight=False)
        if line.strip():
            self.status.update(self._text(f"{self.base}: {line.strip()}"))

    def paused(self, ask):
        """``ask`` (a question on the terminal) with the spinner stopped while it waits for the answer."""
        def run(question: str) -> bool:
            if self.status is not None:
                self.status.stop()
            try:
                return ask(question)
            finally:
                if self.status is not None:
                    self.status.start()

        return run


def progress(step: str, enabled: bool = True) -> Spinner:
    """``with progress("step"):`` a spinner with the current step on stderr while a slow call runs
    (only on a terminal, and not when ``enabled`` is False: --json)."""
    return Spinner(step, enabled)
