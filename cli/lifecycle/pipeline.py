"""The change pipeline every applying command goes through, in order:
observe -> decide -> preview -> confirm -> write -> apply -> undo-on-failure.

``change_job`` (a job's keys change: resume, failover, complete, stop, launch, move, watch) and
``remove_job`` (the job leaves the stack with its disks: cleanup) read as those steps; each is a
function below them. A change is written to the stack file (under its lock) as a local proposal by
``decide``, so Pulumi can plan and preview the edited file; ``write`` makes it final (checked, marked
``applying``, published to the shared copy) only after ``confirm``. Whatever stops the change before
the update starts runs ``undo``.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from cli.cloud import Inventory
from cli.lifecycle import cleanup, gangstop, launch, stackfile
from cli.lifecycle.apply import Applier, ApplyError, Held, change_targets, disk_urns, job_plan, job_targets, job_urns
from cli.lifecycle.applying import changed_since, pending_targets, pending_text, record_applied
from cli.lifecycle.interrupts import STOPS, Interrupted, signal_of, signals_raise
from cli.lifecycle.states import Change, LifecycleError, may_delete_disks
from infra.basics import scripts_digest
from infra.config import ConfigError, Job, StackConfig

STEPS = ("observe", "decide", "preview", "confirm", "write", "apply", "undo")


def _unheard(step: str) -> None:
    """No one follows the steps (tests set ``on_step`` to record them)."""


on_step: Callable[[str], None] = _unheard
"""Told the name of each step (``STEPS``) as it starts."""


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


@dataclass
class _Edit:
    """One job's change as it goes through the steps."""

    ref: stackfile.StackRef
    job_id: str
    applier: Applier | None
    asked: bool  # a question follows the preview (a proposal until confirmed)
    change: Change | None = None
    wrote: dict[str, Any] = field(default_factory=dict)
    before: dict[str, Any] = field(default_factory=dict)  # what ``undo`` puts back
    pending: str | None = None  # the job's ``applying`` mark as observed
    applying: Any = None  # the mark's text as written before the edit (what ``write`` replaces)
    added: bool = False  # a new job's entry (``admit``): ``undo`` takes it out


@dataclass
class _Plan:
    """The targets of the update, and what a release approved."""

    declared: list[str]
    dropped: set[str]
    approved: Approved
    state: Callable[[], Held]
    targets: list[str]

    @property
    def lifting(self) -> set[str]:
        return set(self.approved.unprotect)


def change_job(ref: stackfile.StackRef, job_id: str, decide: Callable[[Job], Change], *,
               applier: Applier | None, out: Callable[[str], None] = print,
               confirm: Confirm | None = None, release: Release | None = None, stop_first: str = "",
               new: Mapping[str, Any] | None = None, pure: bool = False) -> Outcome:
    """Decide on the job as the stack file has it *under the lock*, write the change, then apply.

    With ``applier`` None the file is only edited (--no-apply). With ``confirm`` (the commands pass
    one unless --yes; ``watch`` passes none) Pulumi first previews the targeted update and ``confirm``
    decides; declined, the edit is undone. ``release``: what only a move's release may drop (old
    disks). ``stop_first``: the job's running VMs go by an update of their own before the change.
    ``new``: the entry of a job the stack does not have yet (``launch``; ``admit``). If the update
    cannot start, the edit is undone (only the keys it set; a new job's entry goes). ``pure``: ``decide``
    has no side effect, so it is tried first on the file as it is (no pulumi CLI needed to say no).
    """
    guard = applier.exclusive(ref.path) if applier else contextlib.nullcontext()
    if applier and not (pure and _nothing_to_apply(ref, job_id, decide)):
        applier.preflight()
    edit = _Edit(ref, job_id, applier, asked=confirm is not None and applier is not None)
    with guard, contextlib.ExitStack() as proposal:
        if edit.asked:
            proposal.enter_context(stackfile.proposing(ref.path))  # the edit stays on this machine until confirmed
        if new is not None:
            old_cfg, new_cfg = admit(edit, new, decide)
        else:
            old_cfg, new_cfg = stackfile.update_job(ref.path, job_id, lambda current, written: decide_step(
                edit, observe(ref, current, job_id), written, decide))
        change = edit.change
        if change.noop and applier is not None and edit.pending:
            return _finish_pending(ref, job_id, new_cfg, edit.pending, applier, out, confirm, proposal)
        if change.noop or applier is None:
            return Outcome(change, new_cfg, applied=False)
        then = gangstop.stop_first(old_cfg.job(job_id), change, stop_first)
        # Until the update starts the edit is only a proposal: whatever ends this stretch (an error, a
        # no, Ctrl-C, SIGTERM/SIGHUP, the end of input at the question) puts the file back as it was.
        try:
            with _undone_unless_confirmed(edit):
                plan = preview(edit, old_cfg, new_cfg, release, out, confirm)
                if confirm is not None and not confirm_step(edit, then, old_cfg.job(job_id), confirm):
                    raise _Declined
                write(edit, plan, new_cfg, change)
        except _Declined:
            return Outcome(change, old_cfg, applied=False, declined=True)
        proposal.close()
        apply(edit, plan, old_cfg, new_cfg, then, out)
        return Outcome(change, new_cfg, applied=True)


def _nothing_to_apply(ref: stackfile.StackRef, job_id: str, decide: Callable[[Job], Change]) -> bool:
    """Whether the job as the file has it now needs no update, or is refused (raised): no pulumi CLI is
    needed to say so. Decided again under the lock (a change meanwhile meets the applier's own check)."""
    try:
        job = stackfile.load(ref).job(job_id)
    except (KeyError, ConfigError):
        return False  # (said under the lock, as without this look)
    return job.applying is None and decide(job).noop


def observe(ref: stackfile.StackRef, current: StackConfig, job_id: str) -> Job:
    """The job as the stack file has it now, under the lock."""
    on_step("observe")
    try:
        return current.job(job_id)
    except KeyError as exc:
        raise ConfigError(str(ref.path), [f"job {job_id}: {exc.args[0]}"]) from None


def admit(edit: _Edit, new: Mapping[str, Any], decide: Callable[[Job], Change]) -> tuple[StackConfig, StackConfig]:
    """``observe`` and ``decide`` for a job the stack does not have yet, in one hold of the lock: an
    id the stack has is refused (naming its state); else the entry goes in (pending) and its first
    change is decided as any job's (none with --no-apply: ``resume`` applies it)."""
    ref, job_id = edit.ref, edit.job_id
    with stackfile.locked(ref.path):
        on_step("observe")
        jobs = list(stackfile.read_config(ref.path).get(stackfile.key("jobs")) or [])
        on_step("decide")
        launch.refuse_taken(ref, jobs, job_id)
        if not stackfile.put_back_job(ref.path, (launch.block(ref.path, new), len(jobs), dict(new))):
            launch.refuse_taken(ref, stackfile.read_config(ref.path).get(stackfile.key("jobs")) or [], job_id)  # a hand edit
        edit.added = True
        if edit.applier is None:
            edit.change = Change(job_id, {}, "written (state pending)", noop=True)
            cfg = stackfile.load(ref)
            return cfg, cfg
        return stackfile.update_job(ref.path, job_id, lambda current, written: _decided(
            edit, current.job(job_id), written, decide))


def decide_step(edit: _Edit, job: Job, written: Any, decide: Callable[[Job], Change]) -> dict[str, Any]:
    """The change and the keys it writes (staged in the file as a local proposal until ``write``)."""
    on_step("decide")
    return _decided(edit, job, written, decide)


def _decided(edit: _Edit, job: Job, written: Any, decide: Callable[[Job], Change]) -> dict[str, Any]:
    change = decide(job)
    wrote = dict(change.fields)
    if job.stop_reason and wrote.get("state", "stopped") != "stopped":
        wrote["stopReason"] = None  # the job leaves the stop it explained
    if job.stopped_by and wrote.get("state", "stopped") != "stopped":
        # The user's stop ends with its next change of state (resume). Applied, a ``null`` stays until
        # the update is done (``applying.record_applied``) so an undo can put ``user`` back; without
        # an update (--no-apply) nothing would remove it later, so the key goes now.
        wrote["stoppedBy"] = None if edit.applier is not None else _MISSING
    if _starts_attempt(job, wrote):  # its VMs get this spotctl's scripts (infra.common.frozen_scripts)
        wrote["scriptsDigest"] = scripts_digest()
    if edit.applier is not None and not edit.asked and not change.noop:
        # No question (--yes, watch): the ``applying`` mark goes in with the edit, in one write, so
        # a kill -9 while the targets are planned (seconds) leaves a mark that the next command
        # (status, resume, watch) sees and applies, not a "running" attempt nothing started.
        # With a question the proposal record covers that stretch; the mark follows the yes.
        wrote["applying"] = pending_text(change)
    edit.change, edit.wrote, edit.pending = change, wrote, job.applying
    edit.applying = written.get("applying", _MISSING)  # what ``write`` replaces
    edit.before = {k: written.get(k, _MISSING) for k in wrote}
    if change.noop:
        return {}
    if edit.asked:
        stackfile.note_proposal(edit.ref.path, edit.job_id, edit.before, wrote)  # before the write
    return wrote


def preview(edit: _Edit, old_cfg: StackConfig, new_cfg: StackConfig, release: Release | None,
            out: Callable[[str], None], confirm: Confirm | None) -> _Plan:
    """The update's targets, planned under mocks; with a question, Pulumi's preview of them."""
    on_step("preview")
    applier, ref, job_id = edit.applier, edit.ref, edit.job_id
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

    plan = _Plan(declared, dropped, approved, state, change_targets(declared, dropped, state, job_id))
    if confirm is not None:
        applier.preview(plan.targets, out)
    return plan


def confirm_step(edit: _Edit, then: gangstop.Then | None, old_job: Job, confirm: Confirm) -> bool:
    """The question, after the preview: False leaves everything as it was."""
    on_step("confirm")
    gang = f" (every node of attempt {old_job.attempt} is stopped first)" if then else ""
    return confirm(f"Do you want to perform this update of job {edit.job_id}{gang}?")


def write(edit: _Edit, plan: _Plan, new_cfg: StackConfig, change: Change) -> None:
    """The edit made final: still as written, marked ``applying``, published to the shared copy."""
    on_step("write")
    if plan.approved.recheck is not None and edit.asked:
        plan.approved.recheck()  # its own words first (a move's release); again right before the unprotect
    _mark_pending(edit, new_cfg, change)
    stackfile.publish(edit.ref.path)  # the edit (and its mark) reach the shared copy before the update


def apply(edit: _Edit, plan: _Plan, old_cfg: StackConfig, new_cfg: StackConfig, then: gangstop.Then | None,
          out: Callable[[str], None]) -> None:
    """The targeted update (after the gang's stop when ``then``); its failure before it starts runs ``undo``."""
    on_step("apply")
    applier, ref, job_id = edit.applier, edit.ref, edit.job_id
    targets = plan.targets
    if then:
        gangstop.stop_gang_first(ref, job_id, applier, edit.before, lambda before, wrote: undo(edit, before, wrote), old_cfg, out, then)
        # The stop deleted what the state held of the old VMs: a target gone from both the state
        # and the program would fail the update (``change_targets``).
        targets = change_targets(plan.declared, plan.dropped, plan.state, job_id)
    lifting = plan.lifting
    try:
        if plan.approved.recheck is not None:
            plan.approved.recheck()
        if lifting:
            applier.unprotect(sorted(lifting))  # right before the update that deletes them
        applier.up(targets, out)
    except LifecycleError:  # the release's recheck refused: nothing unprotected, nothing applied
        undo(edit)
        raise
    except ApplyError as exc:
        if not exc.started:
            if lifting:  # nothing was deleted: the disks are protected again, as the undone edit declares them
                with contextlib.suppress(ApplyError):
                    applier.protect(sorted(lifting))
            undo(edit)
            if then:  # the old gang is gone: the file must not say it runs
                attempt = old_cfg.job(job_id).attempt
                why = (f"every node of attempt {attempt} was stopped, then {then.next_step} could not "
                       f"start: {exc}. {then.retry}")
                stackfile.update_job(ref.path, job_id, lambda current, written: {"state": "stopped", "stopReason": why})
                raise ApplyError(f"job {job_id}: left stopped at attempt {attempt}: {why}", detail=exc.detail) from None
        raise
    record_applied(ref.path, job_id, new_cfg, edit.wrote["applying"])


def undo(edit: _Edit, before: dict[str, Any] | None = None, wrote: dict[str, Any] | None = None) -> None:
    """Put back the keys this change set, each only while it still holds what the change wrote (a
    new job's entry goes)."""
    on_step("undo")
    if edit.added and before is None:
        with contextlib.suppress(KeyError):
            stackfile.take_job(edit.ref.path, edit.job_id)
        return
    # (``stackfile.restore_fields``: a concurrent complete, failover or hand edit wins)
    stackfile.restore_fields(edit.ref.path, edit.job_id, edit.before if before is None else before,
                             edit.wrote if wrote is None else wrote)


# ---- a job leaving the stack with its disks (``spotctl cleanup``) ---------------------------------------


def remove_job(ref: stackfile.StackRef, job_id: str, *, force: bool, applier: Applier | None,
               inventory: Callable[[StackConfig], Inventory] | None = None, out: Callable[[str], None] = print,
               confirm: Confirm | None = None, show: Callable[[cleanup.Cleanup], None] | None = None) -> cleanup.Cleanup:
    """The job's disks and everything else of it deleted by one targeted update, and the job out of
    the stack file, through the same steps (``show`` is told what the update deletes before the
    question; ``inventory``: the cloud's disks, whose labels ``write`` checks). With ``applier`` None
    only the file is edited and the disks stay protected."""
    if applier is not None and confirm is None:
        applier.preflight()
    with applier.exclusive(ref.path) if applier else contextlib.nullcontext():
        with stackfile.locked(ref.path):
            cleanup.settle(ref, job_id, applier, out)
            cfg = stackfile.load(ref)
            job = observe(ref, cfg, job_id)
            decide_removal(job, force)
        listed, held, unread = preview_removal(ref, cfg, job_id, applier)
        if confirm is not None:
            if show is not None:
                show(listed)
            on_step("confirm")
            if not confirm(f"Delete job {job_id}'s disks and resources?"):
                return replace(listed, declined=True)
            if applier is not None:
                applier.preflight()
        if unread is not None:
            raise unread  # the state could not be read: nothing can be applied
        with signals_raise():  # SIGTERM/SIGHUP raise as Ctrl-C does, so what follows is put right
            taken = write_removal(ref, cfg, job, listed, held, applier, inventory, force, out)
            if taken is not None:  # (None: nothing of the job in the state, the file edit was all)
                apply_removal(ref, job, listed, taken, applier, out)
    return replace(listed, done=True)


def decide_removal(job: Job, force: bool) -> None:
    """The job may lose its disks (completed, or failed with ``force``); their ownership is
    checked on the cloud's disks by ``write``."""
    on_step("decide")
    allowed, why = may_delete_disks(job, force=force, owned=True)
    if not allowed:
        raise cleanup.kept(job.id, why)


def preview_removal(ref: stackfile.StackRef, cfg: StackConfig, job_id: str, applier: Applier | None
                    ) -> tuple[cleanup.Cleanup, Held | None, ApplyError | None]:
    """What the update deletes, planned outside the lock (as every command plans: seconds to minutes
    on a large stack, while other commands wait for the lock): the job's URNs plus everything
    Pulumi's state holds under it (VMs a completion never applied: left out, Pulumi would refuse to
    delete their parent). Without a readable state, what the plan names (and the error)."""
    on_step("preview")
    plan = job_plan(cfg, ref.name, job_id)
    urns, disks = job_urns(plan, job_id), disk_urns(plan, job_id)
    listed = cleanup.Cleanup(job_id, urns, disks, done=False, plan=plan)
    if applier is None:
        return listed, None, None
    try:
        held = applier.held()
    except ApplyError as exc:  # no `pulumi` here: the listing names what the plan does
        return listed, None, exc
    targets = cleanup.targets(urns, disks, held, job_id)
    return replace(listed, urns=targets, disks=[d for d in disks if d in targets],
                   leftovers=sorted(set(targets) - set(urns))), held, None


def write_removal(ref: stackfile.StackRef, cfg: StackConfig, job: Job, listed: cleanup.Cleanup, held: Held | None,
                  applier: Applier | None, inventory: Callable[[StackConfig], Inventory] | None, force: bool,
                  out: Callable[[str], None]) -> tuple | None:
    """Under the lock: the job is still the one decided on and its disks are this stack's; their
    protection lifted and the job out of the file (the taken entry; None when no update follows)."""
    on_step("write")
    with stackfile.locked(ref.path):
        cleanup.recheck(ref, job, force)
        if applier is not None:
            cleanup.check_owned(inventory, cfg, ref.name, job, listed.plan, listed.disks, held, force)
        if applier is None or not listed.urns:  # (no update: the disks stay protected, or nothing is left of them)
            cleanup.gone(ref, job)
            return None
        if listed.leftovers:
            out(f"job {job.id}: Pulumi's state still holds {', '.join(u.rsplit('::', 1)[-1] for u in listed.leftovers)} "
                "(its completion was never applied): deleted by the same update")
        lifted = [d for d in listed.disks if d in held.protected]
        try:
            return cleanup.take(ref, job, force, applier, lifted), lifted
        except BaseException:
            on_step("undo")  # (``take`` protected them again)
            raise


def apply_removal(ref: stackfile.StackRef, job: Job, listed: cleanup.Cleanup, taken: tuple, applier: Applier,
                  out: Callable[[str], None]) -> None:
    """The update, outside the lock (as every command's: the job is out of the file already); its
    failure or an interruption runs ``undo_removal``."""
    on_step("apply")
    entry, lifted = taken
    try:
        applier.up(listed.urns, out)
    except ApplyError as exc:
        raise undo_removal(ref, applier, entry, lifted, exc) from None
    except STOPS as exc:
        signum, name = signal_of(exc)
        err = undo_removal(ref, applier, entry, lifted, ApplyError(f"interrupted ({name})", started=True))
        raise Interrupted(str(err), signum) from None
    cleanup.retire_taken(ref, job, entry, lifted)


def undo_removal(ref: stackfile.StackRef, applier: Applier, entry: tuple, lifted: list[str], exc: ApplyError) -> ApplyError:
    """The job back in the file, and the disks the update did not delete protected again."""
    on_step("undo")
    return cleanup.put_back(ref, applier, entry, lifted, exc)


# ---- the steps' parts ----------------------------------------------------------------------------------


def _starts_attempt(job: Job, wrote: dict[str, Any]) -> bool:
    """The edit starts an attempt (a new attempt number, or a pending job's first): its VMs are
    created anew, with the scripts this spotctl renders."""
    return wrote.get("attempt", job.attempt) != job.attempt or (wrote.get("state") == "running" and job.state.value == "pending")


def _mark_pending(edit: _Edit, cfg: StackConfig, change: Change) -> None:
    """Check, under the lock, that the file still holds the edit as written (``cfg``) and, after a
    question, mark the job ``applying: <what>`` (cleared by ``record_applied``; without a question the mark
    came with the edit), so an update that never finishes is seen and applied again.

    Raises:
        LifecycleError: the job or the stack's settings changed since the edit (a hand edit at the
            question): ``pulumi up`` would apply what was never previewed.
    """
    path, job_id, asked = edit.ref.path, edit.job_id, edit.asked
    before, wrote = edit.before, edit.wrote
    if asked:
        before["applying"], wrote["applying"] = edit.applying, pending_text(change)
        stackfile.note_proposal(path, job_id, before, wrote)

    def fields(current: StackConfig, written: Any) -> dict[str, Any]:
        if changed_since(current, cfg, job_id):
            raise LifecycleError(
                f"job {job_id}: the stack file changed while this command ran (a hand edit?): the job or the "
                f"stack's settings no longer hold what was {'previewed' if asked else 'written'}. Nothing was "
                f"applied; {path} keeps the change made meanwhile. Run the command again")
        return {"applying": wrote["applying"]} if asked else {}

    stackfile.update_job(path, job_id, fields)


def _finish_pending(ref: stackfile.StackRef, job_id: str, cfg: StackConfig, pending: str, applier: Applier,
                    out: Callable[[str], None], confirm: Confirm | None, proposal: contextlib.ExitStack) -> Outcome:
    """The job's file says an update was started and never finished (``applying``): preview, confirm
    and apply the job as the file has it; the caller holds the update lock."""
    proposal.close()  # nothing new is proposed: the file already holds what is applied
    change = Change(job_id, {"applying": None}, f"finishing the update an earlier command started and did not finish ({pending})")
    targets = pending_targets(ref, job_id, cfg, applier)
    if confirm is not None:
        on_step("preview")
        applier.preview(targets, out)
        on_step("confirm")
        if not confirm(f"Do you want to finish this update of job {job_id}?"):
            return Outcome(change, cfg, applied=False, declined=True)
    on_step("apply")
    applier.up(targets, out)
    record_applied(ref.path, job_id, cfg, pending)
    return Outcome(change, cfg, applied=True)


class _Declined(Exception):
    """The question was answered no (or --preview-only)."""


@contextlib.contextmanager
def _undone_unless_confirmed(edit: _Edit) -> Iterator[None]:
    """``undo`` when the block does not finish: an error, a no, an interruption (a ``Confirm`` raises
    KeyboardInterrupt or EOFError when the question is interrupted or gets no answer)."""
    try:
        with signals_raise():
            yield
    except (*STOPS, EOFError) as exc:
        undo(edit)
        signum, name = signal_of(exc)
        raise Interrupted(f"job {edit.job_id}: interrupted ({name}) before the update started: "
                          f"the edit was undone, {edit.ref.path} is as it was and nothing was applied", signum) from None
    except BaseException:
        undo(edit)
        raise


_MISSING = stackfile.MISSING  # a key the job did not have
