"""Applying a stack edit with Pulumi: a targeted update of one job's resources (Automation API).

The one place spotctl runs the ``pulumi`` CLI. ``preflight`` fails before anything is edited when
the update could not start (no CLI, another spotctl applying the same stack past a wait).
"""

from __future__ import annotations

import contextlib
import os
import shutil
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from cli.lifecycle.stackfile import lock_path
from cli.plan.mocks import Plan
from infra.basics import counted

APPLY_WAIT_S = 120.0
NO_PULUMI = "no `pulumi` CLI found"


class ApplyError(Exception):
    """The update could not run (or failed); ``str()`` is the user-facing message."""

    def __init__(self, message: str, *, started: bool = False, detail: str = ""):
        super().__init__(message)
        self.started = started
        self.detail = detail  # pulumi's whole output (the cloud's own error code is often not on the last line)


def job_urns(plan: Plan, job_id: str) -> list[str]:
    """The job's component and everything under it: what a targeted update of the job touches."""
    root = next((r for r in plan.resources if not r.custom and r.type.endswith(":TrainingJob") and r.name == f"job-{job_id}"), None)
    if root is None:
        return []
    children: dict[str | None, list[str]] = {}
    for r in plan.resources:
        children.setdefault(r.parent, []).append(r.urn)
    out, todo = [], [root.urn]
    while todo:
        urn = todo.pop()
        out.append(urn)
        todo.extend(children.get(urn, []))
    return sorted(out)


def job_targets(cfg, stack: str, job_id: str, limits: bool = True) -> list[str]:
    """``job_urns`` of one job, planned with that job alone: a URN depends only on the stack, the
    project, the job and its parents, never on the other jobs or pools, so a 1,000-job stack plans
    in the time of one job (the whole stack under mocks takes minutes at that size)."""
    try:
        return job_urns(job_plan(cfg, stack, job_id, limits), job_id)
    except KeyError:
        return []  # a job the file no longer has declares nothing


def job_plan(cfg, stack: str, job_id: str, limits: bool = True) -> Plan:
    """The mock plan of one job of ``cfg`` alone (``job_targets``: its URNs and inputs are the same
    as in the whole stack's plan). Raises KeyError for a job ``cfg`` does not have; ConfigError (one
    line naming the key) for a limit the job's values break (``limits``: False for a config that is
    only read back, the file before an edit) or a contract rule."""
    from cli.plan import mocks as planner

    cfg.job(job_id)  # (KeyError for a job the file does not have)
    return planner.checked_run(cfg, stack, job_id, limits)


def change_targets(new: Iterable[str], dropped: Iterable[str], state: Callable[[], Held], job_id: str) -> list[str]:
    """The targets of a job change: the job's URNs in the new plan, plus those the change drops
    (``dropped``: the job's URNs in the old plan, or in the state, that the new plan lacks) which
    the stack's Pulumi state holds.

    Why both: a targeted update deletes only *targeted* resources the program no longer registers
    (pulumi/pulumi pkg/resource/deploy/step_generator.go, ``GenerateDeletes``: delete steps are
    filtered by ``determineAllowedResourcesToDeleteFromTargets``, the targets and their children and
    dependents in the old state; one of those not itself in ``--target`` fails the update with
    "will be destroyed but was not specified in --target list"). So a VM the edit drops (``complete``,
    a move's snapshot step, a gang stopped, a renamed node) must be targeted, or it keeps running and
    billing. Only those the state holds: a target neither in the state nor registered by the program
    fails the whole update ("Target '...' could not be found in the stack": pkg/resource/deploy/
    deployment_executor.go, ``checkTargets``), e.g. the old plan's VM of a job whose VM was never created.

    A dropped resource the state protects (a job disk) is refused here, before the update: disks go
    only through a move's release or ``cleanup``, which unprotect them first (the one deletion rule);
    Pulumi itself would fail the update midway ("cannot be deleted because it is protected").
    """
    new = sorted(set(new))
    dropped = sorted(set(dropped) - set(new))
    if not dropped:
        return new
    held = state()
    gone = [u for u in dropped if u in held.resources]
    kept = [u for u in gone if u in held.protected]
    if kept:
        from cli.lifecycle.states import LifecycleError

        raise LifecycleError(f"job {job_id}: this change would delete protected resource(s) "
                             f"{', '.join(u.rsplit('::', 1)[-1] for u in kept)}; refused (a disk goes only through "
                             f"`spotctl move`'s release or `spotctl cleanup {job_id}`)")
    return sorted(set(new) | set(gone))


def disk_urns(plan: Plan, job_id: str) -> list[str]:
    return [u for u in job_urns(plan, job_id) if u.endswith("-disk") or u.endswith("-volume")]


def _unheard(step: str) -> None:
    """No one listens to the steps (no terminal, --json, the watcher)."""


@dataclass
class Applier:
    """Targeted updates of one stack through the Automation API."""

    work_dir: Path
    stack: str
    pulumi_root: Path | None = None  # a dir with bin/pulumi; None = `pulumi` on PATH
    wait_s: float = APPLY_WAIT_S
    step: Callable[[str], None] = _unheard  # told each slow step as it starts (a terminal's spinner)
    # One Automation API stack per Applier (never `pulumi stack select`: ``_select``), and one `pulumi stack export` per hold of the update lock
    # until this spotctl changes the state (up, refresh, unprotect): a job's change reads the state for
    # its targets, its preview and its update (3 exports of a state that can be large). Outside the lock
    # another spotctl may change the state, so nothing read there is kept.
    _selected: Any = field(default=None, init=False, repr=False)
    _state: Held | None = field(default=None, init=False, repr=False)
    _locked: bool = field(default=False, init=False, repr=False)

    def _binary(self) -> str | None:
        if self.pulumi_root is not None:
            path = self.pulumi_root / "bin" / "pulumi"
            return str(path) if os.access(path, os.X_OK) else None
        return shutil.which("pulumi")

    def preflight(self) -> None:
        """Every command that applies has --no-apply (the hint); reading outputs is ``outputs``'s."""
        if self._binary() is None:
            raise ApplyError(f"cannot apply: {NO_PULUMI} (install it from pulumi.com, or pass --no-apply to only edit the stack file)")

    @contextlib.contextmanager
    def exclusive(self, stack_file: Path, wait: bool = True) -> Iterator[None]:
        """One spotctl update per stack at a time; waits (unless not ``wait``), then gives up before
        anything is edited. The lock is a file lock: a spotctl killed holding it holds it no more."""
        from filelock import FileLock, Timeout

        lock = FileLock(str(lock_path(stack_file).with_suffix(".apply.lock")), timeout=self.wait_s)
        try:
            try:
                lock.acquire(timeout=0)
            except Timeout:
                if not wait:
                    raise ApplyError(f"cannot apply: stack {self.stack} is being updated by another spotctl") from None
                self.step(f"waiting up to {self.wait_s:.0f} s for another spotctl's update of stack {self.stack}")
                lock.acquire()
        except Timeout:
            raise ApplyError(f"cannot apply: stack {self.stack} is being updated by another spotctl for more than {self.wait_s:.0f} s") from None
        self._state, self._locked = None, True
        try:
            yield
        finally:
            self._state, self._locked = None, False
            lock.release()

    def _stack(self):
        if self._selected is None:
            self._selected = self._select()
        return self._selected

    def _select(self):
        """The stack as an Automation API ``Stack`` that names itself (``--stack``) on every command and
        never runs ``pulumi stack select``: selecting would rewrite the user's workspace file, so a later
        bare ``pulumi up`` or ``destroy`` would hit this stack. The SDK's own remote workspace skips the
        select for that reason ("which would modify global state": pulumi/pulumi
        sdk/python/lib/pulumi/automation/_local_workspace.py ``select_stack``). A stack that does not
        exist fails the first command that names it (``stack export``), before anything is applied."""
        from pulumi import automation as auto

        root = self._binary()
        if root is None:
            self.preflight()
        cmd = auto.PulumiCommand(root=str(self.pulumi_root) if self.pulumi_root else None)
        workspace = _NamingWorkspace(work_dir=str(self.work_dir), pulumi_command=cmd)
        return auto.Stack.select(self.stack, workspace)

    def up(self, targets: list[str], on_output: Callable[[str], None]) -> None:
        """``pulumi up`` of exactly ``targets``, refreshed first; streams the CLI's output.

        The refresh comes first so the state learns what the cloud did meanwhile: a VM that a spot
        interruption terminated is gone, and the update creates the new attempt's VM instead of
        trying to replace (or detach from) one that no longer exists.

        ``up --refresh`` refreshes before the program runs and requires every target to be in the
        state then (pulumi/pulumi pkg/resource/deploy/deployment_executor.go: ``refresh`` calls
        ``checkTargets`` before the step generator exists, so a URN the update is about to create is
        "could not be found in the stack"). When some target is new (a move's snapshots and disks, the
        VMs after a stop), the targets the state holds get a ``pulumi refresh`` of their own first and
        the update runs without ``--refresh``."""
        from pulumi import automation as auto

        if not targets:
            raise ApplyError("nothing to apply: no resources to target")
        stack = self._stack()
        held = self._export(stack)
        old = [t for t in targets if t in held.resources]
        together = len(old) == len(targets) or not held.resources  # an empty state: no refresh, no check
        if not together and old:
            self.step(f"pulumi refresh: {counted(len(old), 'resource')} of stack {self.stack} (the update creates {len(targets) - len(old)})")
            try:
                self._state = None  # the refresh rewrites the state, whatever its outcome
                stack.refresh(target=old, on_output=on_output, color="never")
            except auto.errors.ConcurrentUpdateError:
                raise ApplyError(f"cannot apply: stack {self.stack} is locked by another update (retry when it has finished)") from None
            except auto.errors.CommandError as exc:  # only Pulumi's state was read and rewritten: the update never started
                raise ApplyError(f"pulumi refresh failed: {_last_line(exc)}", detail=str(exc)) from None
        self.step(f"pulumi up: {'refreshing and ' if together else ''}updating {counted(len(targets), 'resource')} of stack {self.stack}")
        try:
            self._state = None
            stack.up(target=targets, refresh=together, on_output=on_output, color="never")
        except auto.errors.ConcurrentUpdateError:
            raise ApplyError(f"cannot apply: stack {self.stack} is locked by another update (retry when it has finished)") from None
        except auto.errors.CommandError as exc:
            raise ApplyError(f"pulumi up failed: {_last_line(exc)}", started=True, detail=str(exc)) from None

    def outputs(self) -> dict:
        """The stack's outputs (eventBucket, interruptionQueue, preemptionSubscription, ...)."""
        from pulumi import automation as auto

        if self._binary() is None:  # no --no-apply hint: the caller names what its command takes instead
            raise ApplyError(f"cannot read the outputs of stack {self.stack}: {NO_PULUMI} (install it from pulumi.com)")
        stack = self._stack()
        self.step(f"pulumi stack output: stack {self.stack}")
        try:
            return {k: v.value for k, v in stack.outputs().items()}
        except (auto.errors.CommandError, ValueError) as exc:
            raise ApplyError(f"cannot read the outputs of stack {self.stack}: {_last_line(exc)}") from None

    def preview(self, targets: list[str], on_output: Callable[[str], None]) -> str:
        """``pulumi preview`` of exactly ``targets``: what the targeted update would create, replace or
        delete, as Pulumi prints it (streamed to ``on_output`` and returned)."""
        from pulumi import automation as auto

        if not targets:
            raise ApplyError("nothing to preview: no resources to target")
        stack = self._stack()
        held = self._export(stack)
        # --refresh: preview against what the cloud has now, as the update will (see ``up``); not
        # possible when a target is new (the same target check), then against the state as recorded.
        fresh = not held.resources or all(t in held.resources for t in targets)
        self.step(f"pulumi preview: {'refreshing and ' if fresh else ''}previewing {counted(len(targets), 'resource')} of stack {self.stack}")
        args = ["preview", *(["--refresh"] if fresh else []), "--stack", self.stack, "--non-interactive", "--color", "never"]
        for urn in targets:
            args += ["--target", urn]
        try:
            result = stack.workspace.pulumi_command.run(args, str(self.work_dir), {}, on_output=on_output)
        except auto.errors.ConcurrentUpdateError:
            raise ApplyError(f"cannot preview: stack {self.stack} is locked by another update (retry when it has finished)") from None
        except auto.errors.CommandError as exc:
            raise ApplyError(f"pulumi preview failed: {_last_line(exc)}") from None
        return result.stdout

    def unprotect(self, urns: list[str]) -> None:
        """Lift `protect` from these resources in the stack's state (so they can be deleted)."""
        from pulumi import automation as auto

        stack = self._stack()
        self._state = None
        for urn in urns:
            self.step(f"pulumi state unprotect {urn.rsplit('::', 1)[-1]}")
            try:
                stack.workspace.pulumi_command.run(
                    ["state", "unprotect", urn, "--stack", self.stack, "--yes", "--non-interactive"],
                    str(self.work_dir), {},
                )
            except auto.errors.CommandError as exc:
                raise ApplyError(f"pulumi state unprotect {urn} failed: {_last_line(exc)}", started=True) from None

    def protect(self, urns: list[str]) -> None:
        """Set `protect` again on these resources in the stack's state (``pulumi state protect``,
        www.pulumi.com/docs/iac/cli/commands/pulumi_state_protect/): what an update that failed
        did not delete is protected as it was before spotctl lifted it."""
        from pulumi import automation as auto

        stack = self._stack()
        self._state = None
        for urn in urns:
            self.step(f"pulumi state protect {urn.rsplit('::', 1)[-1]}")
            try:
                stack.workspace.pulumi_command.run(
                    ["state", "protect", urn, "--stack", self.stack, "--yes", "--non-interactive"],
                    str(self.work_dir), {},
                )
            except auto.errors.CommandError as exc:
                raise ApplyError(f"pulumi state protect {urn} failed: {_last_line(exc)}", started=True) from None

    def held(self) -> Held:
        """The stack's Pulumi state (``pulumi stack export``, without decrypting secrets)."""
        return self._export(self._stack())

    def _export(self, stack) -> Held:
        import json

        from pulumi import automation as auto

        if self._state is not None:
            return self._state
        self.step(f"pulumi stack export: the state of stack {self.stack}")
        try:
            result = stack.workspace.pulumi_command.run(["stack", "export", "--stack", self.stack], str(self.work_dir), {})
            held = held_in(json.loads(result.stdout))
            if self._locked:
                self._state = held
            return held
        except auto.errors.CommandError as exc:
            raise ApplyError(f"cannot read the Pulumi state of stack {self.stack}: {_last_line(exc)}") from None
        except ValueError:
            raise ApplyError(f"cannot read the Pulumi state of stack {self.stack}: `pulumi stack export` printed no JSON") from None


def _naming_workspace():
    from pulumi import automation as auto

    class NamingWorkspace(auto.LocalWorkspace):
        """A LocalWorkspace whose ``select_stack`` selects nothing: every command of ``Stack`` passes
        ``--stack`` itself (``Stack._run_pulumi_cmd_sync``), and so does every command spotctl runs."""

        def select_stack(self, stack_name: str) -> None:
            pass

    return NamingWorkspace


def _NamingWorkspace(**kwargs):  # noqa: N802 (a class, made on first use: pulumi is imported lazily)
    global _NAMING
    if _NAMING is None:
        _NAMING = _naming_workspace()
    return _NAMING(**kwargs)


_NAMING = None


@dataclass(frozen=True)
class Held:
    """What the stack's Pulumi state holds: job ids (their TrainingJob components), the cloud
    ids/names of its disks and volumes, every URN with its parent, and the protected URNs."""

    jobs: frozenset[str]
    disks: frozenset[str]
    resources: Mapping[str, str | None] = field(default_factory=dict)  # URN -> parent URN
    protected: frozenset[str] = frozenset()

    def under(self, root: str) -> set[str]:
        """``root`` and every resource under it in the state (its children, theirs, ...)."""
        children: dict[str | None, list[str]] = {}
        for urn, parent in self.resources.items():
            children.setdefault(parent, []).append(urn)
        out, todo = set(), [root] if root in self.resources else []
        while todo:
            urn = todo.pop()
            out.add(urn)
            todo.extend(children.get(urn, []))
        return out

    def under_job(self, urns: Iterable[str], job_id: str) -> set[str]:
        """Everything the state holds under the job's component (``job-<id>``, found among ``urns``:
        a plan's URNs of the job), the component included; empty when ``urns`` has none."""
        root = next((u for u in urns if u.endswith(f"::job-{job_id}")), None)
        return self.under(root) if root else set()


def held_in(deployment: dict) -> Held:
    """Read ``pulumi stack export``'s JSON (pure)."""
    jobs, disks, resources, protected = set(), set(), {}, set()
    for r in (deployment.get("deployment") or {}).get("resources") or []:
        urn, kind = str(r.get("urn", "")), str(r.get("type", ""))
        resources[urn] = r.get("parent") or None
        if r.get("protect"):
            protected.add(urn)
        if kind.endswith(":TrainingJob") and "::job-" in urn:
            jobs.add(urn.rsplit("::job-", 1)[1])
        if kind in ("gcp:compute/disk:Disk", "aws:ebs/volume:Volume"):
            outputs = r.get("outputs") or {}
            disks.update(str(v) for v in (r.get("id"), outputs.get("name"), outputs.get("id")) if v)
            disks.update(str(r.get("id", "")).rsplit("/", 1)[-1:])  # GCP ids are projects/.../disks/NAME
    return Held(frozenset(jobs), frozenset(d for d in disks if d), resources, frozenset(protected))


def _last_line(exc: Exception) -> str:
    """What a failed pulumi command said: its stderr's last line, else its exit code and the last
    ``error:`` line of its output. The Automation API's CommandError is only text,
    ``"\\n code: N\\n stdout: ...\\n stderr: ..."`` (pulumi/automation/_cmd.py CommandResult.__str__),
    whose last line is a bare "stderr:" when pulumi wrote nothing there."""
    text = str(exc)
    head, sep, stderr = text.rpartition("\n stderr: ")
    if not sep:
        lines = text.strip().splitlines()
        return lines[-1] if lines else repr(exc)
    code, _, stdout = head.partition("\n stdout: ")
    said = [ln.strip() for ln in stderr.splitlines() if ln.strip()]
    if said:
        return said[-1]
    errors = [ln.strip() for ln in stdout.splitlines() if ln.strip().startswith("error:")]
    return f"exit code {code.replace('code:', '').strip()}, nothing on stderr" + (f"; its output: {errors[-1]}" if errors else "")
