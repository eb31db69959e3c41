"""A drill judged from what its attempts reported: the attempts, the verdict, why the drill stopped
when it stopped before ``--max-attempts``, and the report a person reads. Pure: no process, no clock."""

from __future__ import annotations

import re
import textwrap
from dataclasses import asdict, dataclass, field
from typing import Any, Literal

from cli.drill.checkpoints import interval_words
from cli.drill.preempt import capacity_note
from infra.basics import counted

PROGRESS_RE = re.compile(r"^SPOTCTL_PROGRESS\s+(\d+)(?:\s*/\s*(\d+))?\s*$")
CHECKPOINT_RE = re.compile(r"^SPOTCTL_CHECKPOINT\s+(\d+)\s*$")

Verdict = Literal["reentrant", "not-exercised", "restarts-from-scratch", "lost-work", "did-not-finish"]
# Why a drill ends with a preempted attempt before --max-attempts: the verdict is certain by then.
NOTHING_NEW = "two restarts from zero; more attempts would prove nothing new"


@dataclass
class Attempt:
    """What one attempt did, as the script reported it."""

    attempt: int
    start_progress: int | None = None
    end_progress: int | None = None
    total: int | None = None
    outcome: str = "running"  # completed | failed | preempted | timeout
    seconds: float = 0.0
    checkpoint_at_start: bool = False
    checkpoints: list[int] = field(default_factory=list)
    checkpoint_files: list[int] = field(default_factory=list)  # the progress when checkpoint files appeared
    lost_work: int | None = None  # progress lost to the preemption that ended this attempt
    log_tail: list[str] = field(default_factory=list)  # the last lines of a failed attempt's log
    setup_s: float | None = None  # how long the job's setup ran in this attempt (None: it did not run)


@dataclass
class Report:
    verdict: Verdict
    cloud: str
    command: str
    attempts: list[Attempt]
    preemptions: int
    checkpoint_interval: int | None
    total_s: float
    uninterrupted_s: float | None = None
    outputs_identical: bool | None = None
    outputs_found: bool | None = None  # with --verify: whether either run wrote any output
    reason: str = ""
    time_scale: float | None = None  # with --trace: the scale used (picked when not given)
    # The job's secret env keys: the drill decrypts nothing; each gets SECRET_PLACEHOLDER.
    secret_env: dict[str, str] = field(default_factory=dict)
    capacity: str = "spot"  # the job's: on-demand is preempted all the same, and the report says why
    max_attempts: int | None = None  # the attempts asked for (--max-attempts)

    @property
    def ok(self) -> bool:
        return self.verdict == "reentrant" and self.outputs_identical is not False

    @property
    def stopped_early(self) -> str | None:
        return stopped_early(self.attempts, self.max_attempts)

    def as_json(self) -> dict[str, Any]:
        doc = asdict(self)
        doc["ok"] = self.ok
        why = self.stopped_early
        doc["stopped_early"] = None if why is None else {
            "after_attempt": len(self.attempts), "max_attempts": self.max_attempts, "reason": why}
        doc["lost_work"] = [a.lost_work for a in self.attempts if a.outcome == "preempted"]
        return doc


# ---- the judge -----------------------------------------------------------------------------------------


def parse_progress(text: str) -> tuple[list[tuple[int, int | None]], list[int]]:
    """(progress values with totals, checkpoint steps) reported by a log."""
    progress, checkpoints = [], []
    for line in text.split("\n"):
        line = line.strip()
        if m := PROGRESS_RE.match(line):
            progress.append((int(m[1]), int(m[2]) if m[2] else None))
        elif m := CHECKPOINT_RE.match(line):
            checkpoints.append(int(m[1]))
    return progress, checkpoints


def account_lost_work(attempts: list[Attempt]) -> None:
    """Fill ``lost_work`` of each preempted attempt: how far the next one went back."""
    for cur, nxt in zip(attempts, attempts[1:], strict=False):
        # An attempt that reported no progress (it had nothing left to do) tells us nothing.
        if cur.outcome == "preempted" and cur.end_progress is not None and nxt.start_progress is not None:
            resumed_at = nxt.start_progress - 1  # its first report is one step in
            cur.lost_work = max(0, cur.end_progress - resumed_at)


def restarts_from_zero(attempts: list[Attempt]) -> list[Attempt]:
    """The attempts that started again from zero after a preemption had ended real progress."""
    return [nxt for cur, nxt in zip(attempts, attempts[1:], strict=False)
            if cur.outcome == "preempted" and (cur.end_progress or 0) > 1
            and nxt.start_progress is not None and nxt.start_progress <= 1]


def nothing_new_to_prove(attempts: list[Attempt]) -> bool:
    """Two restarts from zero: the drill stops preempting, more attempts would prove nothing new."""
    return len(restarts_from_zero(attempts)) >= 2


def stopped_early(attempts: list[Attempt], max_attempts: int | None) -> str | None:
    """Why the drill ran fewer attempts than asked although its last one was preempted (None: it did
    not; a completed or failed attempt ends a drill as it ends a job)."""
    if (attempts and attempts[-1].outcome == "preempted" and nothing_new_to_prove(attempts)
            and (max_attempts is None or len(attempts) < max_attempts)):
        return NOTHING_NEW
    return None


def checkpoints_seen(attempts: list[Attempt]) -> bool:
    """Whether the script ever checkpointed: a SPOTCTL_CHECKPOINT line, or files in its checkpoint dir."""
    return any(a.checkpoints or a.checkpoint_files or a.checkpoint_at_start for a in attempts)


def judge(attempts: list[Attempt], interval: int | None) -> tuple[Verdict, str]:
    """The verdict, most serious first: a restart from zero, then work lost beyond one checkpoint
    interval, then not finishing, then a run no preemption ever reached (it proves nothing);
    otherwise reentrant."""
    completed = any(a.outcome == "completed" for a in attempts)
    restarted = restarts_from_zero(attempts)
    if restarted:
        which = ", ".join(str(a.attempt) for a in restarted)
        had = any(a.checkpoint_at_start for a in restarted)
        return "restarts-from-scratch", (
            f"attempt{'s' if len(restarted) > 1 else ''} {which} started from zero "
            + ("although checkpoints existed" if had else "(no checkpoints seen: no SPOTCTL_CHECKPOINT line and "
               "nothing in $SPOTCTL_CHECKPOINT_DIR)"))
    allowance = interval if interval is not None else 0
    for a in attempts:
        if a.lost_work is not None and a.lost_work > max(allowance, 1):
            return "lost-work", f"attempt {a.attempt} lost {counted(a.lost_work, 'step')} ({interval_words(interval)})"
    if not completed:
        failed = [a for a in attempts if a.outcome == "failed"]
        why = f"attempt {failed[-1].attempt} failed" if failed else f"not finished after {counted(len(attempts), 'attempt')}"
        return "did-not-finish", why
    if not any(a.outcome == "preempted" for a in attempts):
        ran = attempts[0].seconds - (attempts[0].setup_s or 0)
        return "not-exercised", (f"no preemption happened: the command finished in {ran:.1f} s, before the "
                                 "first preemption (use a shorter --preempt-every or --time-scale)")
    lost = max((a.lost_work or 0 for a in attempts), default=0)
    if not lost:
        return "reentrant", "every attempt resumed where the last one stopped"
    # Work lost within the allowance is still reentrant, but the attempt did not resume where it stopped.
    within = f", within one checkpoint interval of {interval}" if interval is not None else ""
    return "reentrant", f"every attempt resumed from its last checkpoint (at most {counted(lost, 'step')} lost{within})"


# ---- in words -------------------------------------------------------------------------------------------


def render_report(report: Report) -> str:
    if report.checkpoint_interval is not None:
        checkpoints = f"checkpoint interval {report.checkpoint_interval}"
    else:
        checkpoints = "checkpoints seen, interval unknown" if checkpoints_seen(report.attempts) else "no checkpoints seen"
    scale = f", trace time scale {report.time_scale:g}x" if report.time_scale is not None else ""
    lines = [
        *_fit(f"verdict: {report.verdict}  ({report.reason})"),
        *_fit(f"cloud {report.cloud}, {counted(len(report.attempts), 'attempt')}, {counted(report.preemptions, 'preemption')}, {checkpoints}{scale}"),
        *capacity_note(report.cloud, report.capacity).splitlines(), *_stop_note(report).splitlines(),
        "",
        f"{'attempt':>7}  {'start':>7}  {'end':>7}  {'outcome':<10} {'lost':>6}  {'seconds':>8}",
    ]
    for a in report.attempts:
        lost = "" if a.lost_work is None else str(a.lost_work)
        lines.append(
            f"{a.attempt:>7}  {_n(a.start_progress):>7}  {_n(a.end_progress):>7}  {a.outcome:<10} {lost:>6}  {a.seconds:>8.2f}"
        )
    lines.append("")
    setups = [a for a in report.attempts if a.setup_s is not None]
    if setups:
        lines += _fit(f"setup ran once, in attempt {setups[0].attempt} ({setups[0].setup_s:.2f}s); preemptions come after it")
    lines.append(f"total {report.total_s:.2f}s")
    if report.uninterrupted_s is not None:
        ratio = f" ({report.total_s / report.uninterrupted_s:.2f}x)" if report.uninterrupted_s else ""
        lines[-1] += f" vs {report.uninterrupted_s:.2f}s uninterrupted{ratio}"
        lines += _fit("final outputs: " + ("no outputs found (neither run wrote a file under its workdir)"
                                           if not report.outputs_found
                                           else "identical to an uninterrupted run" if report.outputs_identical
                                           else "DIFFERENT from an uninterrupted run"))
    if report.secret_env:
        lines += _fit(f"secret env {', '.join(f'{k}={v}' for k, v in report.secret_env.items())}: placeholders (a "
                      "drill decrypts nothing; the emulator served them as the cloud's secret store would)")
    for a in report.attempts:
        if a.log_tail:
            lines += ["", f"attempt {a.attempt} {a.outcome}; the end of its log:", *(f"  | {line}" for line in a.log_tail)]
    return "\n".join(lines) + "\n"


def _fit(line: str) -> list[str]:
    """A sentence of the report on lines of at most 80 columns (continued indented); nothing for ""."""
    return textwrap.wrap(line, REPORT_COLUMNS, subsequent_indent="  ", break_long_words=False, break_on_hyphens=False)


REPORT_COLUMNS = 80


def _stop_note(report: Report) -> str:
    """Why the drill stopped before --max-attempts, on two lines within 80 columns ("": it did not)."""
    why = report.stopped_early
    if why is None:
        return ""
    of = f" of {report.max_attempts} (--max-attempts)" if report.max_attempts is not None else ""
    return f"stopped after attempt {len(report.attempts)}{of}: {why}".replace("; ", ";\n", 1)


def _n(value: int | None) -> str:
    return "-" if value is None else str(value)
