"""Every job state and every status, one line each: the one text ``status -h`` and the docs show.

States are what the stack file says (``infra.basics.JobState``; their moves are ``cli.lifecycle.states``);
a status is what ``spotctl status`` makes of a state and the job's events (``cli.lifecycle.status``).
Pure data, no heavy import: the help is built from it when the command is defined.
"""

from __future__ import annotations

from infra.basics import JobState

STATES: dict[JobState, str] = {
    JobState.PENDING: "in the stack file, never applied: its first update creates its disks and VMs",
    JobState.RUNNING: "its current attempt's VMs are declared and should be running",
    JobState.PREEMPTED: "a spot VM of its attempt was preempted: `spotctl resume` starts the next attempt on the same disks",
    JobState.STOPPED: "no VMs, disks kept; `stoppedBy: user` (`spotctl stop`) waits for `spotctl resume`, "
                      "any other stop is resumed by `spotctl watch`",
    JobState.COMPLETED: "done: VMs gone, disks kept until `spotctl cleanup`",
    JobState.FAILED: "its command exited non-zero: `spotctl resume --force` retries it",
}

# Statuses beyond the states (a state is also its own status).
STATUSES: dict[str, str] = {
    "starting": "the file says running and no node of the current attempt has recorded `started` yet (VMs booting)",
    "needs-resume": "the file says running but the current attempt was preempted or stopped (events or --observe)",
    "preempting": "the current attempt got a preemption notice: checkpointing until its VM is gone",
    "completed?": "the events say the current attempt completed; the file still says running (`spotctl complete`)",
    "failed?": "the events say the current attempt failed; the file still says running",
    "moving": "a move to another zone is under way (`move:`): `spotctl move JOB --to-zone ZONE` or `spotctl watch` "
              "continues it; resume waits for it",
    "update-pending": "an update spotctl started never finished (`applying:`): the same command or `spotctl resume` applies it",
}


def help_text() -> str:
    """The states and statuses for ``status -h`` (one paragraph per line, as Typer keeps ``\\n\\n``)."""
    lines = [f"{s.value}: {STATES[s]}" for s in JobState] + [f"{name}: {why}" for name, why in STATUSES.items()]
    return "\n\n".join(lines)


def markdown() -> str:
    """The same as a Markdown table (docs/guides/launch-stop.md carries it; a test keeps them equal)."""
    rows = [f"| `{s.value}` | state | {STATES[s]} |" for s in JobState]
    rows += [f"| `{name}` | status | {why} |" for name, why in STATUSES.items()]
    return "\n".join(["| name | kind | meaning |", "| --- | --- | --- |", *rows]) + "\n"
