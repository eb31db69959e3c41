"""`spotctl drill`: run a training command under the same scripts the cloud runs, preempt it the way
GCP or AWS would, resume it on the same "disk", and judge whether training survives.

The judging is pure (``cli.drill.verdict``); :class:`Drill` drives attempts on a :class:`LocalVM` against
the metadata emulator, one shared directory playing the job disk.
"""

from __future__ import annotations

import math
import os
import shlex
import signal
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

from cli.drill.checkpoints import FileWatch, checkpoint_interval
from cli.drill.code import SETUP_MARKERS, DrillCode, command_began_ago, outputs, setup_ended_ago, staged
from cli.drill.emulator import Emulator
from cli.drill.localvm import LocalVM, local_context
from cli.drill.preempt import notice_ahead, preempt
from cli.drill.verdict import Attempt, Report, account_lost_work, judge, nothing_new_to_prove, parse_progress
from cli.drill.watchdog import ENDING_SIGNALS, watched_tmp
from infra.basics import loads_bounded, read_regular
from infra.config import SECRET_PLACEHOLDER
from infra.render import ScriptContext, secret_payload

FIRST_PREEMPTION_S = 2.0  # where --trace without --time-scale puts the trace's first preemption
VM_POLL_S = 1  # how often a drill's watcher asks the metadata server for a notice
LOG_TAIL_LINES = 15

TRACE_LIMIT = 64 << 20  # a spot-traces file: a year of 10-minute ticks is ~200 KB


def trace_doc(path: Path) -> dict:
    """A spot-traces JSON file's document, read within bounds (``infra.basics.read_regular``,
    ``loads_bounded``).

    Raises:
        OSError: not a readable regular file within the bound.
        ValueError: not a JSON object.
    """
    doc = loads_bounded(read_regular(path, TRACE_LIMIT), TRACE_LIMIT)
    if not isinstance(doc, dict):
        raise ValueError("not a JSON object")
    return doc


def availability_runs(path: Path) -> tuple[list[float], list[float]]:
    """(up durations, down durations) in seconds from a spot-traces JSON file (1 = available)."""
    doc = trace_doc(path)
    gap = float(doc.get("metadata", {}).get("gap_seconds", 600))
    ups, downs, run, value = [], [], 0, None
    for v in doc["data"]:
        available = int(v) > 0
        if value is None or available == value:
            run += 1
        else:
            (ups if value else downs).append(run * gap)
            run = 1
        value = available
    if value is not None:
        (ups if value else downs).append(run * gap)
    return ups, downs


# ---- the loop --------------------------------------------------------------------------------------


@dataclass
class DrillSpec:
    command: str
    cloud: Literal["gcp", "aws"] = "gcp"
    job_id: str = "drill"
    capacity: str = "spot"
    env: dict[str, str] = field(default_factory=dict)
    preempt_every: float | None = 2.0
    preempt_after: list[float] | None = None  # from a trace, already scaled
    time_scale: float = 1.0
    max_attempts: int = 10
    verify: bool = False
    attempt_timeout_s: float = 600.0
    cwd: str = field(default_factory=os.getcwd)
    # Env keys whose values are Pulumi secrets: the emulator serves them as the cloud's secret store
    # would, each with SECRET_PLACEHOLDER (a drill decrypts nothing), so the scripts' real fetch runs.
    secret_keys: tuple[str, ...] = ()
    # The job's code (``--code DIR`` or the job's ``code:``): put in the emulator's bucket, unpacked and
    # set up by the VM's scripts on the drill's disk; the command then runs in its workdir, not in ``cwd``.
    code: DrillCode | None = None

    @property
    def secret_ref(self) -> str:
        if not self.secret_keys:
            return ""
        return f"/spotctl/drill/{self.job_id}/env" if self.cloud == "aws" else f"projects/drill/secrets/drill-{self.job_id}-env"


class Drill:
    def __init__(self, spec: DrillSpec, workdir: Path, status: Callable[[str], None] = lambda s: None):
        self.spec = spec
        self.workdir = workdir
        self.status = status
        self.vm: LocalVM | None = None
        self.interrupted = False  # set by run_drill's signal handler, checked at every wait

    def _preempt_after(self, index: int) -> float:
        if self.spec.preempt_after is not None:
            return self.spec.preempt_after[index] if index < len(self.spec.preempt_after) else math.inf
        return self.spec.preempt_every if self.spec.preempt_every else math.inf

    def _context(self, emu: Emulator, attempt: int, disk: Path, state: Path) -> ScriptContext:
        ctx = ScriptContext(
            cloud=self.spec.cloud, stack="drill", kind="job", name=self.spec.job_id, command=self.spec.command,
            event_bucket="drill-events", region="local", attempt=attempt, env=dict(self.spec.env), poll_interval_s=VM_POLL_S, cwd=self.spec.cwd,
            secret_keys=self.spec.secret_keys, secret_ref=self.spec.secret_ref, capacity=self.spec.capacity,
        )
        return staged(local_context(ctx, emu, disk, state), self.spec.code, emu.put_object)

    def _log(self, disk: Path, attempt: int) -> str:
        path = disk / ".spotctl" / "logs" / f"attempt-{attempt}-node-0.log"
        return path.read_bytes().decode(errors="replace") if path.exists() else ""

    def run_attempts(self, emu: Emulator, disk: Path, *, preempt: bool) -> list[Attempt]:
        attempts: list[Attempt] = []
        for index in range(self.spec.max_attempts if preempt else 1):
            number = index + 1
            rec = Attempt(attempt=number, checkpoint_at_start=_has_files(disk / "checkpoints"))
            watch = FileWatch(disk / "checkpoints")  # ($SPOTCTL_CHECKPOINT_DIR: infra.render)
            attempts.append(rec)
            emu.reset(preempted=False, instance_action=None, maintenance_event="NONE")
            self.vm = vm = LocalVM(self._context(emu, number, disk, self.workdir / f"state-{id(attempts)}-{number}"),
                                   self.workdir / f"vm-{id(attempts)}-{number}")
            started = time.monotonic()
            boot = vm.boot()
            if boot.returncode != 0:
                # The startup script's own words say why (the trainer never started: its log is empty).
                rec.outcome = "failed"
                rec.seconds = round(time.monotonic() - started, 3)
                rec.log_tail = [f"startup script exited {boot.returncode}:",
                                *(boot.stderr or boot.stdout).splitlines()[-LOG_TAIL_LINES:]]
                break
            # The preemption clock starts when the command does (its trainer.pid's time on the disk),
            # not when the startup script returned: on a loaded machine the run unit's own start can
            # outlast a sub-second interval, and the attempt would run nothing. The job's setup runs
            # first, once per disk and code, and is never preempted (a setup longer than the interval
            # would otherwise be cut short at every attempt, and the command never run).
            booted = time.monotonic()
            setting_up = preempt and self._setup_pending(disk)
            deadline = None if preempt else booted + self.spec.attempt_timeout_s
            ahead = 0.0
            while True:
                self._observe(rec, disk, watch)
                ended = _terminal(vm, number)
                if ended or (not vm.alive("run.pid") and vm.pid("run.pid") is not None):
                    rec.outcome = ended or "failed"
                    break
                now = time.monotonic()
                if deadline is None:
                    began = None if self._setup_pending(disk) else command_began_ago(disk, vm.state)
                    if began is None and now - booted < self.spec.attempt_timeout_s:
                        self.status(f"attempt {number}: " + ("running the job's setup (the drill does not preempt it)"
                                                              if self._setup_pending(disk) else "starting the command"))
                        self._sleep(0.1)
                        continue
                    if setting_up:
                        rec.setup_s = round(max(booted, now - (setup_ended_ago(disk) or 0.0)) - booted, 3)
                    start = max(booted, now - (began or 0.0))
                    deadline = start + self._preempt_after(index)
                    ahead = notice_ahead(self.spec.cloud, VM_POLL_S, deadline - start)
                if now >= deadline - ahead:
                    rec.outcome = "preempted" if preempt else "timeout"
                    if preempt:
                        self.status(f"attempt {number}: preempting ({self.spec.cloud})")
                        self._preempt(emu, vm)
                    break
                self.status(_status_line(rec, deadline - ahead - now if preempt else None))
                self._sleep(0.1)
            vm.kill_all()
            # (files written during the shutdown were not watched: when they appeared is unknown)
            self._observe(rec, disk, None)
            # The events decide: work that finished as the preemption came is completed, not preempted.
            rec.outcome = _terminal(vm, number) or rec.outcome
            rec.seconds = round(time.monotonic() - started, 3)
            if rec.outcome in ("failed", "timeout"):
                rec.log_tail = self._log(disk, number).splitlines()[-LOG_TAIL_LINES:]
            if rec.outcome != "preempted" or nothing_new_to_prove(attempts):
                break  # (the report says why: ``verdict.stopped_early``)
        account_lost_work(attempts)
        return attempts

    def _setup_pending(self, disk: Path) -> bool:
        """The job has a setup that has not yet run to its end on this disk (its marker is not there)."""
        return bool(self.spec.code and self.spec.code.setup) and not any(disk.glob(SETUP_MARKERS))

    def _observe(self, rec: Attempt, disk: Path, watch: FileWatch | None) -> None:
        progress, checkpoints = parse_progress(self._log(disk, rec.attempt))
        if progress:
            rec.start_progress = progress[0][0]
            rec.end_progress = progress[-1][0]
            rec.total = progress[-1][1]
        rec.checkpoints = checkpoints
        # A script that prints no SPOTCTL_CHECKPOINT line still shows its interval by the files it writes.
        if watch is not None:
            rec.checkpoint_files += watch.marks(rec.end_progress, time.time_ns())

    def _preempt(self, emu: Emulator, vm: LocalVM) -> None:
        preempt(emu, vm, self.spec.time_scale, sleep=self._sleep)

    def _sleep(self, seconds: float) -> None:
        """A wait that ends the drill once a signal came, also when the KeyboardInterrupt its handler
        raised was lost: raised while a finalizer ran (a generator closed or an object freed by the
        garbage collector), Python prints "Exception ignored in ..." and goes on."""
        if self.interrupted:
            raise KeyboardInterrupt
        time.sleep(seconds)

    def run(self) -> Report:
        started = time.monotonic()
        with Emulator() as emu:
            placeholders = dict.fromkeys(self.spec.secret_keys, SECRET_PLACEHOLDER)
            if placeholders:
                emu.state.secrets[self.spec.secret_ref] = secret_payload(placeholders)
            disk = self.workdir / "disk"
            attempts = self.run_attempts(emu, disk, preempt=True)
            total = time.monotonic() - started
            uninterrupted = identical = found = None
            if self.spec.verify:
                self.status("verify: running once more without preemptions")
                clean_disk = self.workdir / "disk-uninterrupted"
                t0 = time.monotonic()
                self.run_attempts(emu, clean_disk, preempt=False)
                uninterrupted = round(time.monotonic() - t0, 3)
                mine, clean = outputs(disk, self.spec.code), outputs(clean_disk, self.spec.code)
                found = bool(mine or clean)
                identical = mine == clean if found else None  # nothing written: nothing to compare
        interval = checkpoint_interval(attempts)
        verdict, reason = judge(attempts, interval)
        if identical is False:
            reason += "; but the final outputs differ from an uninterrupted run"
        return Report(
            verdict=verdict, cloud=self.spec.cloud, command=self.spec.command, attempts=attempts,
            preemptions=sum(a.outcome == "preempted" for a in attempts), checkpoint_interval=interval,
            total_s=round(total, 3), uninterrupted_s=uninterrupted, outputs_identical=identical, outputs_found=found,
            reason=reason,
            time_scale=self.spec.time_scale if self.spec.preempt_after is not None else None,
            secret_env=placeholders, capacity=self.spec.capacity, max_attempts=self.spec.max_attempts,
        )

    def stop(self) -> None:
        if self.vm is not None:
            self.vm.kill_all()


def _terminal(vm: LocalVM, attempt: int) -> str | None:
    """completed/failed when this attempt's events say so (also: the disk says the job is done)."""
    events = {e["event"] for e in vm.events() if e["attempt"] == attempt}
    return "completed" if "completed" in events else ("failed" if "failed" in events else None)


def _has_files(path: Path) -> bool:
    return path.is_dir() and any(p.is_file() for p in path.rglob("*"))


def _status_line(rec: Attempt, preempt_in: float | None) -> str:
    progress = "starting" if rec.end_progress is None else f"step {rec.end_progress}" + (f"/{rec.total}" if rec.total else "")
    when = f", preempting in {preempt_in:4.1f}s" if preempt_in is not None and preempt_in != math.inf else ""
    return f"attempt {rec.attempt}: {progress}{when}"


def make_spec(*, command: str, cloud: str, job_id: str = "drill", capacity: str = "spot", env: dict[str, str] | None = None,
              secret_keys: tuple[str, ...] = (), code: DrillCode | None = None,
              preempt_every: float | None = None, trace: Path | None = None, time_scale: float | None = None,
              max_attempts: int = 10, verify: bool = False) -> DrillSpec:
    """The drill of ``command``: preempted every ``preempt_every`` seconds (2 s unless a trace is
    given), or whenever ``trace`` says spot went away. Without ``time_scale`` a trace is sped up so
    its first preemption comes ``FIRST_PREEMPTION_S`` into the run. A bad trace, or one in which spot
    never goes away, raises ValueError naming it."""
    preempt_after = None
    if trace is not None:
        try:
            ups, downs = availability_runs(trace)
        except OSError as exc:
            raise ValueError(f"{trace}: cannot read: {exc.strerror}") from None
        except (ValueError, KeyError, TypeError, AttributeError, OverflowError) as exc:
            raise ValueError(f"{trace}: not a spot-traces availability file ({exc})") from None
        preemptions = trace_preemptions(ups, downs, trace)
        if time_scale is None:
            time_scale = max(1.0, preemptions[0] / FIRST_PREEMPTION_S)
        preempt_after = [u / time_scale for u in preemptions]
    time_scale = 1.0 if time_scale is None else time_scale
    return DrillSpec(
        command=command, cloud=cloud, job_id=job_id, capacity=capacity, env=dict(env or {}), secret_keys=tuple(secret_keys),
        preempt_every=preempt_every if preempt_every is not None else (None if trace else 2.0),
        preempt_after=preempt_after, time_scale=time_scale, max_attempts=max_attempts, verify=verify, code=code,
    )


def trace_preemptions(ups: list[float], downs: list[float], trace: Path) -> list[float]:
    """The spot runs of a trace that end in a loss of capacity (a run still up at the trace's end
    ends in no preemption); ValueError when there is none: the trace cannot preempt anything."""
    data = trace_doc(trace)["data"]
    ending = ups[:-1] if data and int(data[-1]) > 0 else ups
    if not downs or not ending:
        raise ValueError(f"{trace}: spot capacity is never lost in this trace, so it cannot preempt the run "
                         "(use --preempt-every SECONDS)")
    return ending


def run_drill(spec: DrillSpec, status: Callable[[str], None] = lambda s: None) -> Report:
    """Run a drill in a temp dir that is removed afterwards; every process is killed, also on Ctrl-C."""
    with watched_tmp() as tmp:
        drill = Drill(spec, tmp, status)
        # Ctrl-C, SIGTERM and SIGHUP (the terminal closed) all stop the drill and everything it
        # started, and so does every other signal whose default is to end the process (SIGQUIT,
        # SIGUSR1/2, SIGALRM, ...: without a handler they end it at once, its VMs' loops polling on).
        # SIGINT is caught even when it was inherited as ignored (a drill started in the background
        # of a non-interactive shell: bash sets SIGINT to SIG_IGN there, and Python then never
        # raises KeyboardInterrupt); the others stay ignored when they were (SIGHUP under nohup).
        # SIGKILL cannot be caught: the watchdog (``cli.drill.watchdog``) cleans up after it.
        signals = [signal.SIGINT] + [sig for sig in ENDING_SIGNALS if signal.getsignal(sig) is not signal.SIG_IGN]

        def interrupt(signum, frame):
            drill.interrupted = True
            raise KeyboardInterrupt

        previous = {sig: signal.signal(sig, interrupt) for sig in signals}
        try:
            return drill.run()
        finally:
            drill.stop()
            for sig, handler in previous.items():
                signal.signal(sig, handler)


def command_string(argv: list[str]) -> str:
    """The words after `--`, as one shell command (each word quoted, as the shell had them)."""
    return argv[0] if len(argv) == 1 else " ".join(shlex.quote(a) for a in argv)

