"""The single-zone rules in front of ``default``'s plan: a slack reserve, spot at every return, no idling off on-demand.

On the public ADRS single-region runs (bench/adrs.py) the plan alone lost in the same few ways, run by run:
it waited out a long outage with all its slack, then sat on on-demand through hours of available spot; it
dropped from on-demand to idle and paid two changeovers to come back; it stayed on spot through one short
window after another. The rules, decided before any plan is consulted:

1. Reserve: slack of ``RESERVE_PER_WORK_H`` per hour of work left is never spent waiting. Below it an
   outage is covered on on-demand at once, so the net (``policies.must_go_on_demand``) is met with slack
   to spare and spot can still be used to the end.
2. Spot at every return from idle while a launch leaves that slack (``launch_leaves_room``).
   2a. Not from on-demand while slack is below a pace (``LAUNCH_PACE_PER_WORK_H`` per hour of work left,
   after the round trip's two changeovers), nor, while the recent windows are too short for a round trip
   to pay (``round_trip_loses``), before a window has seen ``FLICKER_AGE_TICKS`` ticks.
   2b. From on-demand, with that room, the plan weighs the return: the round trip costs two changeovers of
   slack, and slack spent on the flickering windows early in a job is what later locks it on on-demand
   through hours of spot (bench/adrs.py, 0.1 h changeovers). Without a plan: spot, as from idle.
3. On on-demand while spot is down: stay (the paper's Uniform Progress keeps the VM; dropping to idle
   costs a changeover to come back).
4. Short windows: once the recent windows (at least two, the last ``RECENT_WINDOWS``) make spot cost more
   per hour of progress than on-demand, changeovers included, the
   job stays off spot (off within the second or third preemption) until a window outlasts
   ``RETURN_AFTER_CHANGEOVERS`` changeovers (and at least a tick): that window then counts as evidence.

Above the reserve with spot down, the plan (or, without one, waiting) decides; so does the return from on-demand (2b).
"""

from __future__ import annotations

from collections.abc import Sequence

RESERVE_PER_WORK_H = 0.15  # slack hours kept per hour of work left; bench/adrs.py: 0.1-0.3 within 0.5 points
RECENT_WINDOWS = 3  # the windows short-window detection judges (the newest)
MIN_WINDOWS = 2  # one short window is not a zone
LAUNCH_PACE_PER_WORK_H = 0.05  # from on-demand, a round trip must leave this much slack per hour of work left
FLICKER_AGE_TICKS = 2  # flickering windows: from on-demand, spot only once its window has seen this many ticks
RETURN_AFTER_CHANGEOVERS = 4.0  # short windows: back on spot once its window has lasted this many changeovers
EPS_H = 1e-6


def reserve_h(work_left_h: float) -> float:
    return RESERVE_PER_WORK_H * work_left_h


def launch_leaves_room(slack_h: float, changeover_h: float, tick_h: float) -> bool:
    """A spot launch keeps the way back: after its changeover, a preemption seen up to a tick late
    and a changeover onto on-demand still fit, with a tick to spare (a decision each tick).

    Why the extra tick: a preemption is seen at the next decision, and a harness may keep a job on a
    VM that was just preempted for one more tick (the ADRS evaluator's own guarantee does); the plain
    ``unsafe_moves`` check would then miss by up to a tick (bench/adrs.py found such runs)."""
    return slack_h - 2 * changeover_h > 2 * tick_h + EPS_H


def short_windows(windows_h: Sequence[float], changeover_h: float, price_ratio: float) -> bool:
    """The recent spot windows cost more per hour of progress than on-demand (changeovers included).

    As ``planning.spot_cost_per_progress`` without a prior (a launch bills at least its changeover),
    computed here because it is asked every tick and the prior's expectation is the costly part."""
    recent = list(windows_h)[-RECENT_WINDOWS:]
    if len(recent) < MIN_WINDOWS:
        return False
    billed = sum(max(w, changeover_h) for w in recent)
    progress = sum(max(0.0, w - changeover_h) for w in recent)
    return progress <= 1e-9 or billed / progress > price_ratio


def round_trip_loses(windows_h: Sequence[float], changeover_h: float, price_ratio: float) -> bool:
    """The recent windows are too short for a round trip from on-demand to pay.

    Taking a window of ``w`` hours from on-demand saves ``w`` x (on-demand - spot) and spends two
    changeovers of slack, each worth up to an hour of on-demand once the deadline binds: it pays when
    ``w > 2 d k / (k - 1)`` (``k`` the price ratio). Judged on the mean of the recent windows."""
    recent = list(windows_h)[-RECENT_WINDOWS:]
    if len(recent) < MIN_WINDOWS or price_ratio <= 1:
        return False
    return sum(recent) / len(recent) < 2 * changeover_h * price_ratio / (price_ratio - 1)


def single_zone_rule(current: str, available: bool, slack_h: float, work_left_h: float, changeover_h: float,
                     tick_h: float, window_age_h: float, short: bool,
                     hysteresis: bool = True, plan_return: bool = False,
                     flicker: bool = False) -> tuple[str, str] | None:
    """(decision, reason) by the rules above, or None: the plan decides.

    ``current`` and the decision are "spot", "on-demand" or "idle"; ``window_age_h`` is how long spot has
    been up (0 when down); ``hysteresis``: from on-demand, spot only once its window has outlasted a
    changeover (a window that flickers faster than that costs two changeovers for no progress);
    ``plan_return``: from on-demand with spot back and room for a launch, the plan decides (rule 2b);
    ``flicker``: ``round_trip_loses`` on the recent windows (rule 2a).
    The deadline net is the caller's, before this.
    """
    d = changeover_h
    room = launch_leaves_room(slack_h, d, tick_h)
    if available:
        if current == "spot":
            return "spot", "on spot and spot is up"
        if short and window_age_h < max(RETURN_AFTER_CHANGEOVERS * d, tick_h) - EPS_H:
            return "on-demand", "short spot windows: each costs more per hour of progress than on-demand"
        if hysteresis and current == "on-demand" and window_age_h < d - EPS_H:
            return "on-demand", (f"hysteresis: spot is back but its window ({window_age_h:.2f} h) is younger "
                                 f"than a changeover ({d:g} h): staying on on-demand")
        if current == "on-demand" and flicker and window_age_h < FLICKER_AGE_TICKS * tick_h - EPS_H:
            return "on-demand", "flickering spot windows: a round trip from on-demand costs more than it saves"
        if current == "on-demand" and slack_h - 2 * d < LAUNCH_PACE_PER_WORK_H * work_left_h:
            return "on-demand", (f"slack {slack_h:.2f} h: a round trip to spot would leave less than "
                                 f"{LAUNCH_PACE_PER_WORK_H:g} h per hour of work left")
        if room and plan_return and current == "on-demand":
            return None
        if room:
            return "spot", "spot is back and a launch leaves room for the way back"
        return "on-demand", "too little slack for a spot launch and the way back"
    if current == "on-demand":
        return "on-demand", "spot is down: keeping the on-demand VM"
    if short:
        return "on-demand", "short spot windows: waiting for the next is not worth it"
    if slack_h - tick_h - d <= reserve_h(work_left_h):
        return "on-demand", f"slack {slack_h:.2f} h is within the reserve ({reserve_h(work_left_h):.2f} h)"
    return None
