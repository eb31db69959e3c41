"""Job operations behind resume/failover/complete: observe (stack file + recorded events), decide
(``cli.lifecycle.states``), act (edit the stack file atomically under its lock, then a targeted update).
"""

from __future__ import annotations

import contextlib
import signal
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from cli.lifecycle import stackfile
from cli.lifecycle.apply import Applier, ApplyError, Held, change_targets, job_targets
from cli.lifecycle.states import PENDING_STAMP, Change, LifecycleError
from infra.basics import scripts_digest
from infra.config import ConfigError, Job, StackConfig

# ---- act ----------------------------------------------------------------------------------------------


@dataclass
class Outcome:
    change: Change
    config: StackConfig
    applied: bool
    declined: bool = False  # previewed, then not confirmed (or --preview-only): the file is as before


Confirm = Callable[[str], bool]
"""Asked after Pulumi's preview of the targeted update; False leaves everything as it was."""


@dataclass(frozen=True)
class Approved:
    """What a ``Release`` approved: URNs the update must also target because the edit drops them
    (so it deletes them), and the protected ones among them to unprotect right before that update."""

    drop: list[str]
    unprotect: list[str] = field(default_factory=list)
    recheck: Callable[[], None] | None = None
    """Raises (a ``LifecycleError``) when what approved no longer holds: called right before the
    unprotect, after the question (a hand edit meanwhile does not take the lock)."""


Release = Callable[[list[str]], Approved]
"""Given the URNs a targeted update would touch, under the lock after the edit and before the preview:
what it must also target and unprotect (``spotctl move`` releasing old disks); raises to refuse.
Nothing is unprotected before the edit is confirmed: a no (or an interrupt) leaves every disk protected."""


def change_job(ref: stackfile.StackRef, job_id: str, decide: Callable[[Job], Change], *,
               applier: Applier | None, out: Callable[[str], None] = print,
               confirm: Confirm | None = None, release: Release | None = None, stop_first: str = "") -> Outcome:
    """Decide on the job as the stack file has it *under the lock*, write the change, then apply.

    With ``applier`` None the file is only edited (--no-apply). With ``confirm`` (the commands pass
    one unless --yes; ``watch`` passes none: it is the automation) Pulumi first previews the
    targeted update with the edited file, and ``confirm`` decides; declined, the edit is undone.
    What the edit drops from the job is targeted too, so the update deletes it (``change_targets``);
    with ``release``, also what only ``release`` may approve (a move's old disks).
    ``stop_first`` (what comes after, e.g. "its disks are snapshotted"): the job's running VMs are
    deleted by an update of their own before the change is applied (as a gang's before a new attempt).
    If the update cannot start, the edit is undone (only the keys it set), so the file again
    matches what runs in the cloud.
    """
    guard = applier.exclusive(ref.path) if applier else contextlib.nullcontext()
    if applier:
        applier.preflight()
    with guard, contextlib.ExitStack() as proposal:
        if confirm is not None and applier is not None:
            proposal.enter_context(stackfile.proposing(ref.path))  # the edit stays on this machine until confirmed
        holder: dict[str, Any] = {}

        def fields(current: StackConfig, written: Any) -> dict[str, Any]:
            try:
                job = current.job(job_id)
            except KeyError as exc:
                raise ConfigError(str(ref.path), [f"job {job_id}: {exc.args[0]}"]) from None
            change = decide(job)
            wrote = dict(change.fields)
            if job.stop_reason and wrote.get("state", "stopped") != "stopped":
                wrote["stopReason"] = None  # the job leaves the stop it explained
            if job.stopped_by and wrote.get("state", "stopped") != "stopped":
                wrote["stoppedBy"] = None  # the user's stop ends with its next change of state (resume)
            if _starts_attempt(job, wrote):  # its VMs get this spotctl's scripts (infra.common.frozen_scripts)
                wrote["scriptsDigest"] = scripts_digest()
            if applier is not None and confirm is None and not change.noop:
                # No question (--yes, watch): the ``applying`` mark goes in with the edit, in one write, so
                # a kill -9 while the targets are planned (seconds) leaves a mark that the next command
                # (status, resume, watch) sees and applies, not a "running" attempt nothing started.
                # With a question the proposal record covers that stretch; the mark follows the yes.
                wrote["applying"] = _pending_text(change)
            holder["change"], holder["wrote"], holder["pending"] = change, wrote, job.applying
            holder["applying"] = written.get("applying", _MISSING)  # what ``_mark_pending`` replaces
            holder["before"] = {k: written.get(k, _MISSING) for k in wrote}
            if change.noop:
                return {}
            if confirm is not None and applier is not None:
                stackfile.note_proposal(ref.path, job_id, holder["before"], wrote)  # before the write
            return wrote

        old_cfg, new_cfg = stackfile.update_job(ref.path, job_id, fields)
        change: Change = holder["change"]
        if change.noop and applier is not None and holder["pending"]:
            return _finish_pending(ref, job_id, new_cfg, holder["pending"], applier, out, confirm, proposal)
        if change.noop or applier is None:
            return Outcome(change, new_cfg, applied=False)

        old_job = old_cfg.job(job_id)
        then = _stop_first(old_job, change, stop_first)
        # Until the update starts the edit is only a proposal: whatever ends this stretch (an error, a
        # no, Ctrl-C, SIGTERM/SIGHUP, the end of input at the question) puts the file back as it was.
        try:
            with _undone_unless_confirmed(ref.path, job_id, holder["before"], holder["wrote"]):
                applier.step(f"job {job_id}: planning its resources under mocks (the URNs to target)")
                declared = job_targets(new_cfg, ref.name, job_id)
                # What the edit drops is targeted too (so the update deletes it): the one rule, in
                # ``change_targets``. ``release`` adds what only a move's release may drop (old disks).
                approved = release(declared) if release is not None else Approved([])
                dropped = set(job_targets(old_cfg, ref.name, job_id, limits=False)) | set(approved.drop)
                lifting = set(approved.unprotect)

                def state() -> Held:  # as it will be once the approved disks are unprotected, right before the update
                    held = applier.held()
                    return replace(held, protected=held.protected - lifting) if lifting else held

                targets = change_targets(declared, dropped, state, job_id)
                if confirm is not None and not _previewed_and_confirmed(job_id, then, old_job, targets, applier, out, confirm):
                    raise _Declined
                if approved.recheck is not None and confirm is not None:
                    approved.recheck()  # its own words first (a move's release); again right before the unprotect
                _mark_pending(ref.path, job_id, new_cfg, holder, confirm is not None, change)
                stackfile.publish(ref.path)  # confirmed: the edit (and its mark) reach the shared copy before the update
        except _Declined:
            return Outcome(change, old_cfg, applied=False, declined=True)
        proposal.close()
        gang = bool(then)
        if gang:
            _stop_gang_first(ref, job_id, old_cfg, applier, holder["before"], out, then)
            # The stop deleted what the state held of the old VMs: a target gone from both the state
            # and the program would fail the update (``change_targets``).
            targets = change_targets(declared, dropped, state, job_id)
        try:
            if approved.recheck is not None:
                approved.recheck()
            if lifting:
                applier.unprotect(sorted(lifting))  # right before the update that deletes them
            applier.up(targets, out)
        except LifecycleError:  # the release's recheck refused: nothing unprotected, nothing applied
            _undo(ref.path, job_id, holder["before"], holder["wrote"])
            raise
        except ApplyError as exc:
            if not exc.started:
                if lifting:  # nothing was deleted: the disks are protected again, as the undone edit declares them
                    with contextlib.suppress(ApplyError):
                        applier.protect(sorted(lifting))
                _undo(ref.path, job_id, holder["before"], holder["wrote"])
                if gang:  # the old gang is gone: the file must not say it runs
                    why = (f"every node of attempt {old_job.attempt} was stopped, then {then.next_step} could not "
                           f"start: {exc}. {then.retry}")
                    stackfile.update_job(ref.path, job_id, lambda current, written: {"state": "stopped", "stopReason": why})
                    raise ApplyError(f"job {job_id}: left stopped at attempt {old_job.attempt}: {why}", detail=exc.detail) from None
            raise
        _applied(ref.path, job_id, new_cfg, holder["wrote"]["applying"])
        return Outcome(change, new_cfg, applied=True)


def _starts_attempt(job: Job, wrote: dict[str, Any]) -> bool:
    """The edit starts an attempt (a new attempt number, or a pending job's first): its VMs are
    created anew, with the scripts this spotctl renders."""
    return wrote.get("attempt", job.attempt) != job.attempt or (wrote.get("state") == "running" and job.state.value == "pending")


def _now() -> datetime:
    return datetime.now(UTC)


def _pending_text(change: Change) -> str:
    """What the ``applying`` mark says: the change's plain fields, its reason, and when the update
    began (``(since <UTC time>)``: another machine's watcher leaves a mark that young alone,
    ``states.PENDING_GRACE``, as the update may still be under way there)."""
    parts = ", ".join(f"{k}={v}" for k, v in change.fields.items() if not isinstance(v, (dict, list)))
    since = _now().strftime(PENDING_STAMP)
    head = f"{parts}: {change.reason}" if parts else change.reason
    return f"{head[:460]} (since {since})"


def _mark_pending(path: Path, job_id: str, cfg: StackConfig, holder: dict[str, Any], asked: bool, change: Change) -> None:
    """Right before the update: check, under the lock, that the file still holds the edit as written
    (``cfg``) and, after a question, mark the job ``applying: <what>`` (cleared once applied:
    ``_applied``; without a question the mark came with the edit), so an update that never finishes
    (kill -9, a watcher replaced) is seen (``status``) and applied again (the same command, ``resume``,
    ``watch``); the mark is undone with the edit.

    Raises:
        LifecycleError: the job or the stack's settings changed since the edit (a hand edit at the
            question: an editor saving its older copy): ``pulumi up`` would apply what was never
            previewed and the command would report an attempt the file no longer holds.
    """
    before, wrote = holder["before"], holder["wrote"]
    if asked:
        before["applying"], wrote["applying"] = holder["applying"], _pending_text(change)
        stackfile.note_proposal(path, job_id, before, wrote)

    def fields(current: StackConfig, written: Any) -> dict[str, Any]:
        if _changed_since(current, cfg, job_id):
            raise LifecycleError(
                f"job {job_id}: the stack file changed while this command ran (a hand edit?): the job or the "
                f"stack's settings no longer hold what was {'previewed' if asked else 'written'}. Nothing was "
                f"applied; {path} keeps the change made meanwhile. Run the command again")
        return {"applying": wrote["applying"]} if asked else {}

    stackfile.update_job(path, job_id, fields)


def _changed_since(current: StackConfig, cfg: StackConfig, job_id: str) -> bool:
    """Whether ``current`` differs from ``cfg`` in the job or in anything but the other jobs (which a
    watcher may edit meanwhile, under the lock: their resources are not this update's targets)."""
    try:
        job = current.job(job_id)
    except KeyError:
        return True
    mine = cfg.job(job_id)
    if job.model_dump(exclude={"applying"}) != mine.model_dump(exclude={"applying"}):
        return True
    # Another job's cleanup (here, or pulled from the shared copy) retires that job's id: not this update's.
    return (current.model_dump(exclude={"jobs", "retired_jobs"}) != cfg.model_dump(exclude={"jobs", "retired_jobs"})
            or current.retired_jobs.get(job_id) != cfg.retired_jobs.get(job_id))


def _applied(path: Path, job_id: str, cfg: StackConfig, pending: str | None) -> None:
    """The update of the job finished: its ``applying`` mark goes (while it is still this one), and
    (GCP) the kind of disk it has run on is recorded, so adding or dropping ``diskReplicaZones`` by
    hand later is refused (``infra.config.checks._disk_kind_checks``)."""

    def fields(current: StackConfig, written: Any) -> dict[str, Any]:
        try:
            job = current.job(job_id)
        except KeyError:
            return {}
        # The mark's line goes (a ``null`` left behind is noise in the file and sent later edits of it
        # through the slower round trip).
        out: dict[str, Any] = {"applying": _MISSING} if pending is not None and written.get("applying") == pending else {}
        if cfg.cloud == "gcp" and job.disk_kind is None and job.state.value != "pending":
            out["diskKind"] = "regional" if job.disk_replica_zones else "zonal"
        return out

    stackfile.update_job(path, job_id, fields)


def _finish_pending(ref: stackfile.StackRef, job_id: str, cfg: StackConfig, pending: str, applier: Applier,
                    out: Callable[[str], None], confirm: Confirm | None, proposal: contextlib.ExitStack) -> Outcome:
    """The job's file says an update was started and never finished (``applying``): apply the job as the
    file has it (previewed and asked first when ``confirm``); the caller holds the update lock."""
    proposal.close()  # nothing new is proposed: the file already holds what is applied
    change = Change(job_id, {"applying": None}, f"the update started earlier and never finished is applied ({pending})")
    targets = pending_targets(ref, job_id, cfg, applier)
    if confirm is not None:
        applier.preview(targets, out)
        if not confirm(f"Do you want to finish this update of job {job_id}?"):
            return Outcome(change, cfg, applied=False, declined=True)
    applier.up(targets, out)
    _applied(ref.path, job_id, cfg, pending)
    return Outcome(change, cfg, applied=True)


def pending_targets(ref: stackfile.StackRef, job_id: str, cfg: StackConfig, applier: Applier) -> list[str]:
    """The targets of an update of the job as the file has it when the file before the edit is unknown
    (an interrupted update): what the state holds under the job and the file no longer declares is
    what the edit dropped (``change_targets``)."""
    new = job_targets(cfg, ref.name, job_id)
    held = applier.held()
    return change_targets(new, held.under_job(new, job_id), lambda: held, job_id)


def reapply(ref: stackfile.StackRef, job_id: str, applier: Applier, out: Callable[[str], None], only_pending: bool = False) -> str:
    """Apply the job as the file has it (``watch``: an update another spotctl started and never
    finished, or its own before a crash): "applied", or "busy" when a live spotctl holds the stack's
    update lock now (it is applying it: nothing to do), or "noop" when the job is gone or, with
    ``only_pending``, its ``applying`` mark went meanwhile (the update finished)."""
    applier.preflight()
    with contextlib.ExitStack() as held:
        try:
            held.enter_context(applier.exclusive(ref.path, wait=False))
        except ApplyError:
            return "busy"
        cfg = stackfile.load(ref)
        try:
            job = cfg.job(job_id)
        except KeyError:
            return "noop"
        if only_pending and job.applying is None:
            return "noop"
        applier.up(pending_targets(ref, job_id, cfg, applier), out)
        _applied(ref.path, job_id, cfg, job.applying)
        return "applied"


def _previewed_and_confirmed(job_id: str, then: _Then | None, old_job: Job, targets: list[str], applier: Applier,
                             out: Callable[[str], None], confirm: Confirm) -> bool:
    """Pulumi's preview of the targeted update (the file already edited), then the question."""
    applier.preview(targets, out)
    gang = f" (every node of attempt {old_job.attempt} is stopped first)" if then else ""
    return confirm(f"Do you want to perform this update of job {job_id}{gang}?")


class _Declined(Exception):
    """The question was answered no (or --preview-only)."""


class Interrupted(BaseException):  # noqa: N818 (like KeyboardInterrupt: not an error, never caught by ``except Exception``)
    """Ctrl-C, SIGTERM or SIGHUP (or the end of input at the question) before the update started: the
    edit was undone. ``str()`` says so; ``signum`` gives the exit code (128 + signum)."""

    def __init__(self, message: str, signum: int):
        super().__init__(message)
        self.signum = signum


class Signalled(BaseException):  # noqa: N818
    """SIGTERM or SIGHUP inside ``signals_raise``."""

    def __init__(self, signum: int):
        super().__init__(signum)
        self.signum = signum


STOPS = (KeyboardInterrupt, Signalled)
"""What ends a command from outside (Ctrl-C, SIGTERM, SIGHUP inside ``signals_raise``)."""


def signal_of(exc: BaseException) -> tuple[int, str]:
    """The signal number and name of a ``STOPS`` (or an end of input at the question: SIGINT, as Ctrl-C)."""
    signum = getattr(exc, "signum", signal.SIGINT)
    return signum, signal.Signals(signum).name


@contextlib.contextmanager
def signals_raise() -> Iterator[None]:
    """SIGTERM and SIGHUP raise (as Ctrl-C does) instead of ending the process on the spot, so the
    undo runs; the handlers before are put back after. Only the main thread can set handlers."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def raised(signum: int, frame: Any) -> None:
        raise Signalled(signum)

    old = {s: signal.signal(s, raised) for s in (signal.SIGTERM, signal.SIGHUP)}
    try:
        yield
    finally:
        for s, handler in old.items():
            signal.signal(s, handler)


@contextlib.contextmanager
def _undone_unless_confirmed(path: Path, job_id: str, before: dict[str, Any], wrote: dict[str, Any]) -> Iterator[None]:
    """Undo the edit (``_undo``) when the block does not finish: an error, a no, an interruption (a
    ``Confirm`` raises KeyboardInterrupt or EOFError when the question is interrupted or gets no answer)."""
    try:
        with signals_raise():
            yield
    except (*STOPS, EOFError) as exc:
        _undo(path, job_id, before, wrote)
        signum, name = signal_of(exc)
        raise Interrupted(f"job {job_id}: interrupted ({name}) before the update started: "
                          f"the edit was undone, {path} is as it was and nothing was applied", signum) from None
    except BaseException:
        _undo(path, job_id, before, wrote)
        raise


@dataclass(frozen=True)
class _Then:
    """What waits for the job's VMs to be stopped, in the words of the messages."""

    what: str  # "the new attempt starts"
    next_step: str  # "attempt 3"
    retry: str  # what the user runs when it could not


def _stop_first(job: Job, change: Change, stop_first: str) -> _Then | None:
    """The job's VMs go by an update of their own before the change: a new attempt of a multi-node
    job whose VMs may still run (some nodes survived a preemption), or ``stop_first``."""
    if job.state.value not in ("pending", "running"):
        return None  # no VM declared
    if job.nodes > 1 and "attempt" in change.fields:
        return _Then("the new attempt starts", f"attempt {job.attempt + 1}", f"`spotctl resume {job.id}` starts attempt {job.attempt + 1}")
    if stop_first:
        return _Then(stop_first, change.reason.split(":")[0], f"Run the same command again to continue ({change.reason})")
    return None


def _stop_gang_first(ref: stackfile.StackRef, job_id: str, old_cfg: StackConfig, applier: Applier,
                     before: dict[str, Any], out: Callable[[str], None], then: _Then) -> None:
    """Delete every VM of the current attempt before the new one starts, so no surviving node of
    the old gang is still running when the new rendezvous begins: the job is written as stopped
    (it then declares no VMs) and a targeted update of the old attempt's resources applies that."""

    mark_before = before.get("applying", _MISSING)
    before = {k: v for k, v in before.items() if k != "applying"}  # the mark stays through the stop
    final = stackfile.job_fields(ref.path, job_id, [*before, "applying"])
    mark = final.pop("applying", _MISSING)
    stopped = {"state": "stopped"}
    _undo(ref.path, job_id, before, final)  # the job as it was (keys the change added removed), then stopped
    _, stopped_cfg = stackfile.update_job(ref.path, job_id, lambda current, written: stopped)
    try:
        old_targets = change_targets(job_targets(stopped_cfg, ref.name, job_id),
                                     job_targets(old_cfg, ref.name, job_id, limits=False),
                                     applier.held, job_id)
    except Exception:
        _undo(ref.path, job_id, before, final | stopped)
        raise
    attempt = old_cfg.job(job_id).attempt
    out(f"job {job_id}: stopping every node of attempt {attempt} before {then.what}")
    try:
        applier.up(old_targets, out)
    except ApplyError as exc:
        if not exc.started:  # nothing changed in the cloud: the edit goes, and its mark with it
            _undo(ref.path, job_id, before | {"applying": mark_before}, final | stopped | {"applying": mark})
            raise
        # The stop began: some old nodes may be gone, so the file stays stopped. Say so, there and here.
        why = (f"the stop of every node of attempt {attempt} (before {then.next_step}) failed midway: {exc}; "
               f"some of its VMs may still run. {then.retry} (its update replaces or deletes what is left of attempt {attempt})")
        # stopReason says what is left to do (the mark's update never began): one explanation, not two.
        stackfile.update_job(ref.path, job_id, lambda current, written: {"stopReason": why, "applying": _MISSING})
        raise ApplyError(f"job {job_id}: left stopped at attempt {attempt}: {why}", started=True, detail=exc.detail) from None
    stackfile.update_job(ref.path, job_id, lambda current, written: final)


_MISSING = stackfile.MISSING  # a key the job did not have


def _undo(path: Path, job_id: str, before: dict[str, Any], wrote: dict[str, Any]) -> None:
    """Put back the keys this command set (``stackfile.restore_fields``): each only while it still
    holds what the command wrote, so a concurrent complete, failover or hand edit wins."""
    stackfile.restore_fields(path, job_id, before, wrote)
