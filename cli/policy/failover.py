"""When a resume keeps being refused for capacity in the job's zone: wait, on-demand in place, or
move to another zone of the stack (``spotctl move``, as ``watch`` acts on it).

Every choice is one registered class (``FAILOVERS``), named as users name it, returning a
``FailoverDecision`` with its reason; it never acts. The costs are the ones of the policy engine
(``cli.policy.policies``): spot costs 1 per hour, on-demand ``price_ratio``; a launch costs
``changeover_h`` billed hours without progress. A move adds ``move_h`` (snapshot + restore, measured
from the job's past moves) during which no VM runs: time without progress, not money.

``default``:

1. No other zone to go to at all (a one-zone stack), or the job's ``moveOnCapacity`` is off: the
   job's policy decides in place (``stay``).
1b. Moves are bounded, so a job whose every zone is short of capacity never shuffles between them:
   at most ``MOVE_BUDGET`` moves per ``MOVE_WINDOW_H`` (counted from the stack file's zone history),
   and no move back to a zone the job left until it has been quiet for ``LEFT_QUIET_H`` (no refusal
   there, and left that long ago); any other zone is no target for ``RECENT_REFUSAL_H`` after it
   refused. When the budget is spent or every other zone is excluded, the choice is made in place
   and said: on-demand when another wait would eat the deadline's slack or the job's policy pays
   on-demand rather than wait, else wait (retry spot with the backoff).
2. A deadline that cannot absorb the move (the slack left after ``move_h`` and a launch would not
   let on-demand still finish): on-demand in place, which loses no time.
3. The job's policy would take on-demand in place (it will not wait): move when finishing the
   work on spot in another zone costs less than on-demand here, the move's hours priced at the
   on-demand rate the policy chose to pay rather than wait (``move_saving``), else on-demand.
4. The job's policy would wait for spot: waiting and moving cost the same money, so the question
   is time. The rent-or-buy rule: keep waiting while the time already lost waiting plus the next
   backoff is shorter than the move's changeover; then move. At most twice the time of the better
   choice in hindsight, whatever the zone's capacity does.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import ClassVar, Literal

Choice = Literal["wait", "on-demand", "move", "stay"]

# The bounds on moving (module docstring, rule 1b). Two moves a day lets a job try each other zone
# of a typical three-zone region once; six quiet hours before going back to a zone the job left
# is longer than the one hour after which any refusing zone is tried again, so two zones that
# both lack capacity cannot pass the job back and forth (an hour each way) at every refusal.
RECENT_REFUSAL_H = 1.0
LEFT_QUIET_H = 6.0
MOVE_BUDGET = 2
MOVE_WINDOW_H = 24.0


@dataclass(frozen=True)
class FailoverObservation:
    """What the watcher knows when a retry after a capacity refusal is due (hours throughout)."""

    refusals: int  # capacity refusals of this attempt so far, in the job's zone
    waited_h: float  # since the first of them
    next_wait_h: float  # the backoff before the next try in place
    move_h: float  # a move's changeover: snapshot + restore (+ boot)
    changeover_h: float  # a launch's changeover (started -> first progress)
    price_ratio: float  # on-demand / spot
    work_left_h: float  # inf when unknown
    slack_h: float  # time left minus work left; inf without a deadline
    in_place: Literal["spot", "on-demand"]  # what the job's policy picks in its zone now
    candidates: tuple[str, ...]  # the stack's other zones that did not refuse recently
    allowed: bool = True  # the job's moveOnCapacity
    tick_h: float = 1 / 6  # the safety margin of the deadline check (one decision tick)
    blocked: tuple[str, ...] = ()  # the other zones that are no target now, each with why (``eligible_zones``)
    moves_in_window: int = 0  # the job's moves within ``window_h`` (its zone history)
    move_budget: int = MOVE_BUDGET
    window_h: float = MOVE_WINDOW_H


@dataclass(frozen=True)
class FailoverDecision:
    choice: Choice
    reason: str
    zone: str | None = None  # the target of a move


class Failover:
    """Base class: subclasses set ``name`` and implement ``decide``."""

    name: ClassVar[str]

    def decide(self, obs: FailoverObservation) -> FailoverDecision:
        raise NotImplementedError


FAILOVERS: dict[str, type[Failover]] = {}


def register(cls: type[Failover]) -> type[Failover]:
    FAILOVERS[cls.name] = cls
    return cls


def _h(x: float) -> str:
    return "unknown" if not math.isfinite(x) else f"{x:.2f} h"


@register
class MoveWhenCheaper(Failover):
    """The module docstring's rules 1-4."""

    name = "default"

    def decide(self, obs: FailoverObservation) -> FailoverDecision:
        if not obs.allowed:
            return FailoverDecision("stay", "moveOnCapacity is off: the job's policy decides in its zone")
        if not obs.candidates and not obs.blocked:
            return FailoverDecision("stay", "no other zone of the stack to move to")
        if obs.moves_in_window >= obs.move_budget:
            return in_place(obs, f"the move budget is spent ({obs.moves_in_window} move(s) in the last "
                            f"{obs.window_h:g} h, at most {obs.move_budget})")
        if not obs.candidates:
            return in_place(obs, "no other zone to move to now (" + "; ".join(obs.blocked) + ")")
        zone = obs.candidates[0]
        after_move = obs.slack_h - obs.move_h - obs.changeover_h
        if after_move <= obs.tick_h:
            return FailoverDecision("on-demand", f"a move takes {_h(obs.move_h)} but the deadline leaves {_h(obs.slack_h)} "
                                    "of slack: on-demand in place loses no time")
        if obs.in_place == "on-demand":
            saved = move_saving(obs)
            if saved > 0:
                return FailoverDecision("move", f"the policy would pay on-demand here; spot in {zone} after a "
                                        f"{_h(obs.move_h)} move saves {_spot_hours(saved)} over the work left "
                                        f"({_h(obs.work_left_h)}), the move's time priced at on-demand", zone)
            return FailoverDecision("on-demand", f"on-demand here: a {_h(obs.move_h)} move to {zone} would save nothing "
                                    f"over the work left ({_h(obs.work_left_h)}) once its time is priced at on-demand")
        if obs.waited_h + obs.next_wait_h < obs.move_h:
            return FailoverDecision("wait", f"{obs.refusals} refusal(s) over {_h(obs.waited_h)}: waiting another "
                                    f"{_h(obs.next_wait_h)} is still shorter than a move ({_h(obs.move_h)})")
        return FailoverDecision("move", f"{obs.refusals} refusal(s) over {_h(obs.waited_h)} in this zone: waiting has cost "
                                f"as much time as a move ({_h(obs.move_h)}); spot in {zone}", zone)


def in_place(obs: FailoverObservation, why: str) -> FailoverDecision:
    """No move: on-demand or wait in the job's zone, said with ``why`` no move (rule 1b)."""
    if obs.slack_h - obs.next_wait_h - obs.changeover_h <= obs.tick_h:
        return FailoverDecision("on-demand", f"{why}; waiting another {_h(obs.next_wait_h)} would eat the deadline's "
                                f"slack ({_h(obs.slack_h)}): on-demand here")
    if obs.in_place == "on-demand":
        return FailoverDecision("on-demand", f"{why}; the job's policy pays on-demand rather than wait: on-demand here")
    return FailoverDecision("wait", f"{why}; the job's policy waits for spot: retry here in {_h(obs.next_wait_h)}")


def eligible_zones(here: str, reachable: Iterable[str], refused_ago_h: Mapping[str, float],
                   left_ago_h: Mapping[str, float]) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """The zones a move may go to now, in order, and why each other one may not (rule 1b).

    ``refused_ago_h``: hours since each zone's last capacity refusal; ``left_ago_h``: hours since
    the job last left each zone (a move began there). A zone the job left needs ``LEFT_QUIET_H``
    of quiet (since it left and since it last refused); any other one ``RECENT_REFUSAL_H``.
    """
    ok, blocked = [], []
    for zone in dict.fromkeys(reachable):
        if zone == here:
            continue
        refused, left = refused_ago_h.get(zone, math.inf), left_ago_h.get(zone, math.inf)
        if math.isfinite(left) and min(refused, left) < LEFT_QUIET_H:
            said = f", refused {_ago(refused)}" if math.isfinite(refused) else ""
            blocked.append(f"{zone}: left {_ago(left)}{said}; back only after {LEFT_QUIET_H:g} h quiet")
        elif refused < RECENT_REFUSAL_H:
            blocked.append(f"{zone}: refused capacity {_ago(refused)}")
        else:
            ok.append(zone)
    return tuple(ok), tuple(blocked)


def _ago(h: float) -> str:
    return f"{h:.2f} h ago"


def move_saving(obs: FailoverObservation) -> float:
    """What a move saves over on-demand in place, in spot-hours: the work left (and its launch) at
    spot instead of on-demand, minus the move's hours priced at on-demand (the policy chose to pay
    that rate rather than wait, so that is what its time is worth). Unbounded for open-ended work.
    The snapshot's storage (cents) is left out; so is a preemption in the new zone, which the
    job's policy handles there as anywhere."""
    k = obs.price_ratio
    if not math.isfinite(obs.work_left_h):
        return math.inf if k > 1 else -math.inf
    return (k - 1) * (obs.work_left_h + obs.changeover_h) - k * obs.move_h


def _spot_hours(x: float) -> str:
    return "an unbounded amount" if not math.isfinite(x) else f"{x:.2f} spot-hours"


def make_failover(name: str = "default") -> Failover:
    try:
        return FAILOVERS[name]()
    except KeyError:
        raise KeyError(f"unknown zone failover {name!r}; valid: {', '.join(sorted(FAILOVERS))}") from None
