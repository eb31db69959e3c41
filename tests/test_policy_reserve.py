"""``default``'s single-zone rules (cli/policy/reserve.py): the exact deadline guarantee over open traces,
off spot within three preemptions of short windows, no loop without a deadline, and Uniform Progress
keeping its on-demand VM as the paper does."""

from __future__ import annotations

import math

from hypothesis import given, settings
from hypothesis import strategies as st

from cli.policy.policies import IDLE, ON_DEMAND, SPOT, Default, Observation, UniformProgress
from cli.policy.reserve import launch_leaves_room, reserve_h, round_trip_loses, short_windows, single_zone_rule
from cli.policy.simulate import Job, Trace, simulate


def quick_default() -> Default:
    """As shipped, on a coarse plan: the guarantee is the rules' and the net's, not the grid's."""
    return Default(budget=3_000)


def trace_from_runs(runs: list[int], gap_s: int, first_up: bool, n: int) -> Trace:
    data: list[bool] = []
    up = first_up
    while len(data) < n:
        for r in runs:
            data.extend([up] * r)
            up = not up
    return Trace("runs", gap_s, tuple(data[:n]))


@settings(max_examples=40, deadline=None)
@given(runs=st.lists(st.integers(1, 30), min_size=1, max_size=12), first_up=st.booleans(),
       gap_s=st.sampled_from([60, 195, 600]), d=st.sampled_from([0.02, 0.05, 0.1, 0.2]),
       job_h=st.sampled_from([2.0, 4.0, 6.0]), ratio=st.sampled_from([0.5, 0.8, 0.92, 0.97]))
def test_default_never_misses_a_deadline_on_any_trace(runs, first_up, gap_s, d, job_h, ratio):
    job = Job(job_h, round(job_h / ratio, 4), d)
    if job.deadline_h - job.job_h < d + gap_s / 3600:
        job = Job(job_h, job_h + d + gap_s / 3600, d)  # on-demand alone must be able to make it
    trace = trace_from_runs(runs, gap_s, first_up, math.ceil(job.deadline_h * 3600 / gap_s) + 2)
    run = simulate(quick_default(), trace, 0, job)
    assert not run.missed, (run.finish_h, job)


@settings(max_examples=200, deadline=None)
@given(current=st.sampled_from([SPOT, ON_DEMAND, IDLE]), available=st.booleans(), slack=st.floats(0.0, 30.0),
       work=st.floats(0.1, 60.0), d=st.sampled_from([0.02, 0.05, 0.1, 0.2]), tick=st.sampled_from([1 / 60, 195 / 3600, 1 / 6]),
       age=st.floats(0.0, 5.0), short=st.booleans())
def test_a_spot_launch_always_keeps_the_way_back(current, available, slack, work, d, tick, age, short):
    """Whenever the rules launch spot, a preemption seen a tick late (the ADRS evaluator even keeps a just
    preempted job idle for that tick) and a changeover onto on-demand still fit in the slack."""
    ruled = single_zone_rule(current, available, slack, work, d, tick, age if available else 0.0, short)
    if ruled and ruled[0] == SPOT and current != SPOT:
        assert slack - d - tick - d >= tick
    if ruled and ruled[0] == IDLE:
        raise AssertionError("the rules never choose to wait: above the reserve the plan decides")
    if not available and current != ON_DEMAND and not short and slack - tick - d <= reserve_h(work):
        assert ruled and ruled[0] == ON_DEMAND  # the reserve is never spent waiting


def test_launch_room_is_exact_at_the_edge():
    assert launch_leaves_room(2 * 0.1 + 2 * (1 / 6) + 1e-3, 0.1, 1 / 6)
    assert not launch_leaves_room(2 * 0.1 + 2 * (1 / 6), 0.1, 1 / 6)


def test_off_spot_within_three_preemptions_of_short_windows():
    """7.8-minute windows, 6-minute changeovers (1-minute ticks): each window bills 8 minutes for 2 of
    progress, 4x spot's price per hour of progress, more than on-demand's 3.14x."""
    trace = trace_from_runs([8, 2], 60, True, 60 * 40)
    job = Job(10.0, 30.0, 0.1)
    run = simulate(quick_default(), trace, 0, job, record=True)
    assert run.preemptions <= 3 and not run.missed
    last_spot = max(i for i, m in enumerate(run.modes) if m == SPOT)
    assert last_spot < 60  # off spot for good within the first hour
    assert short_windows([8 / 60, 8 / 60], 0.1, 3.14)
    assert not short_windows([8 / 60], 0.1, 3.14)  # one window is not a zone
    assert not short_windows([2.0, 8 / 60, 8 / 60], 1 / 60, 3.14)  # worth it with 1-minute changeovers


def test_short_windows_are_left_behind_when_a_long_one_comes():
    """Off spot is not for ever: a window that outlasts four changeovers is taken, and it counts."""
    policy = quick_default()
    tick = 1 / 60
    decisions = []
    pattern = [True] * 8 + [False] * 2
    avail = pattern * 3 + [True] * 120
    mode = IDLE
    progress = 0.0
    for i, up in enumerate(avail):
        if mode == SPOT and not up:
            mode = IDLE
        obs = Observation(i * tick, progress, 10.0, 30.0, 0.1, 3.14, mode, up, 0, tick)
        mode = policy.decide(obs)
        if mode == SPOT and not up:
            mode = IDLE
        decisions.append(mode)
        progress += tick if mode != IDLE else 0.0
    assert decisions[-1] == SPOT
    first_long = 30 + int(4 * 0.1 / tick)  # the long window, once it has lasted four changeovers
    assert all(m != SPOT for m in decisions[30:first_long - 1])


def test_no_deadline_never_loops_in_a_flickering_zone():
    """Open-ended: up 15 minutes, down 3, for 200 hours: a handful of launches, then on-demand."""
    policy = quick_default()
    tick = 1 / 60
    pattern = [True] * 15 + [False] * 3
    mode, launches, progress = IDLE, 0, 0.0
    for i in range(200 * 60):
        up = pattern[i % len(pattern)]
        if mode == SPOT and not up:
            mode = IDLE
        obs = Observation(i * tick, progress, math.inf, math.inf, 0.2, 3.0, mode, up, 0, tick)
        new = policy.decide(obs)
        if new == SPOT and not up:
            new = IDLE
        launches += new != mode and new != IDLE
        mode = new
        progress += tick if mode != IDLE else 0.0
    assert launches <= 6 and mode == ON_DEMAND


def test_uniform_progress_keeps_its_on_demand_vm_while_spot_is_down():
    """The paper's UP (and sky_spot's rc_cr_threshold): on on-demand and ahead of schedule, spot down:
    keep the VM; dropping to idle pays a changeover to come back."""
    for hysteresis in (True, False):
        up = UniformProgress(hysteresis=hysteresis)
        obs = Observation(10.0, 9.0, 20.0, 40.0, 0.1, 3.14, ON_DEMAND, False, 1, 1 / 6)
        assert up.decide(obs) == ON_DEMAND


def test_the_return_from_on_demand_is_the_plans_when_there_is_one():
    """From on-demand with spot back and room to launch, the round trip (two changeovers of slack) is weighed
    by the plan; without a plan, or from idle, the rule takes spot as before."""
    args = (True, 5.0, 10.0, 0.1, 1 / 6, 1.0, False)
    assert single_zone_rule(ON_DEMAND, *args, plan_return=True) is None
    assert single_zone_rule(ON_DEMAND, *args)[0] == SPOT
    assert single_zone_rule(IDLE, *args, plan_return=True)[0] == SPOT
    # no room for the way back: on-demand whatever the plan would say
    assert single_zone_rule(ON_DEMAND, True, 0.5, 10.0, 0.1, 1 / 6, 1.0, False, plan_return=True)[0] == ON_DEMAND
    rules_only = Default(plan=False)
    obs = Observation(10.0, 9.0, 20.0, 40.0, 0.1, 3.14, ON_DEMAND, True, 1, 1 / 6)
    assert rules_only.decide(obs) == SPOT


def test_from_on_demand_slack_is_paced_and_flickering_windows_are_let_go():
    """A round trip from on-demand spends two changeovers of slack: not below the pace (0.05 h per hour of
    work left), and, after windows too short to repay it (10-minute windows, 0.1 h changeovers, k = 3.14:
    a window must last 0.29 h), not before the window has seen two ticks. From idle neither applies."""
    tick = 1 / 6
    assert round_trip_loses([tick, tick, tick], 0.1, 3.14)
    assert not round_trip_loses([tick, tick, 2.0], 0.1, 3.14)
    assert not round_trip_loses([tick], 0.1, 3.14)  # one window is not a pattern
    assert not round_trip_loses([tick, tick], 0.02, 3.14)  # 0.02 h changeovers: a tick repays them
    assert single_zone_rule(ON_DEMAND, True, 5.0, 40.0, 0.1, tick, tick, False, flicker=True)[0] == ON_DEMAND
    assert single_zone_rule(ON_DEMAND, True, 5.0, 40.0, 0.1, tick, 2 * tick, False, flicker=True)[0] == SPOT
    assert single_zone_rule(IDLE, True, 5.0, 40.0, 0.1, tick, tick, False, flicker=True)[0] == SPOT
    # 40 h of work left: the pace keeps 2 h; 2.1 h of slack leaves 1.9 after the round trip
    assert single_zone_rule(ON_DEMAND, True, 2.1, 40.0, 0.1, tick, 1.0, False)[0] == ON_DEMAND
    assert single_zone_rule(ON_DEMAND, True, 2.3, 40.0, 0.1, tick, 1.0, False)[0] == SPOT
    assert single_zone_rule(IDLE, True, 2.1, 40.0, 0.1, tick, 1.0, False)[0] == SPOT
