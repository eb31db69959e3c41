"""One job's entry in a merge of the stack file with its shared copy (``cli.lifecycle.sync.merge``):
field by field, and never backwards.

- ``--keep local|shared`` resolves only the fields both sides changed (differently); a field one side
  changed is that side's, so a command's edit here never writes an older attempt over a resume made
  elsewhere.
- Whatever a merge takes, the job's (attempt, state) it ends with must be reachable through the state
  machine (``cli.lifecycle.states.TRANSITIONS``) from each side's: attempts never decrease, a completed
  job never runs again, a job's state never goes back within an attempt. Otherwise the merge stops
  with one error naming the job and both states. A hand-edited shared copy that sets a completed
  job back to running is refused the same way.

Pure: plain entries (the parsed YAML of one job) in, an entry or an error out.
"""

from __future__ import annotations

from functools import cache
from typing import Any

from cli.lifecycle.states import TRANSITIONS, LifecycleError
from infra.basics import JobState

_MISSING = object()
R = JobState.RUNNING


def merge_fields(base: dict[str, Any], ours: dict[str, Any], theirs: dict[str, Any], keep: str) -> dict[str, Any]:
    """A job changed on both sides, merged field by field against ``base``: a field changed on one
    side is that side's; one changed on both (differently) is ``keep``'s ("local" or "shared")."""
    out = {}
    for name in dict.fromkeys([*ours, *theirs]):  # this file's key order, the shared copy's new keys after
        b, o, t = (side.get(name, _MISSING) for side in (base, ours, theirs))
        value = o if o == t or t == b else t if o == b else o if keep == "local" else t
        if value is not _MISSING:
            out[name] = value
    return out


def _same_attempt() -> dict[JobState, set[JobState]]:
    """The transitions that keep the attempt number (all but a new attempt into running; the first
    attempt's pending -> running keeps attempt 1)."""
    edges: dict[JobState, set[JobState]] = {s: set() for s in JobState}
    for old, new in TRANSITIONS:
        if new is not R or old is JobState.PENDING:
            edges[old].add(new)
    return edges


@cache
def _closure(state: JobState) -> frozenset[JobState]:
    """The states reachable from ``state`` without a new attempt (``state`` itself included)."""
    edges, seen, todo = _same_attempt(), {state}, [state]
    while todo:
        for nxt in edges[todo.pop()] - seen:
            seen.add(nxt)
            todo.append(nxt)
    return frozenset(seen)


NEW_ATTEMPT_FROM = frozenset(old for old, new in TRANSITIONS if new is R and old is not JobState.PENDING)


def reachable(before: tuple[int, JobState], after: tuple[int, JobState]) -> bool:
    """Whether a job at (attempt, state) ``before`` can come to ``after`` through legal transitions."""
    (a0, s0), (a1, s1) = before, after
    if a1 < a0:
        return False
    if a1 == a0:
        return s1 in _closure(s0)
    return bool(_closure(s0) & NEW_ATTEMPT_FROM) and s1 in _closure(R)


def progress(entry: dict[str, Any]) -> tuple[int, JobState] | None:
    """(attempt, state) of a job entry, or None when they are not valid (validation names them)."""
    try:
        attempt = entry.get("attempt", 1)
        if isinstance(attempt, bool) or not isinstance(attempt, int):
            return None
        return attempt, JobState(entry.get("state", JobState.PENDING.value))
    except (ValueError, TypeError):
        return None


def check_forward(ident: str, merged: dict[str, Any] | None, sides: dict[str, dict[str, Any] | None]) -> None:
    """Refuse a merged job entry its sides (``{"this file": entry, "<the shared copy>": entry}``) could
    not have come to through the state machine.

    Raises:
        LifecycleError: names the job, the side, both states and attempts.
    """
    after = progress(merged) if merged is not None else None
    if after is None:
        return
    for where, entry in sides.items():
        before = progress(entry) if entry is not None else None
        if before is None or before == after or reachable(before, after):
            continue
        why = ("attempts never decrease" if after[0] < before[0] else
               f"no move from {before[1].value} to {after[1].value}" if after[0] == before[0] else
               f"{before[1].value} is final" if not _closure(before[1]) & NEW_ATTEMPT_FROM else
               f"a new attempt starts {R.value}")
        raise LifecycleError(
            f"job {ident}: cannot go from {before[1].value} (attempt {before[0]}, in {where}) to {after[1].value} "
            f"(attempt {after[0]}) by a merge: {why}; nothing was written")
