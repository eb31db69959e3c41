"""The zone choice (cli/policy/zones.py) and the multi-zone simulator (cli/policy/multizone.py):
never a move that costs more than it gains, a free first placement, the deadline kept."""

from __future__ import annotations

import math
import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from cli.policy.multizone import Move, aligned, simulate_zones
from cli.policy.simulate import Job, Trace
from cli.policy.zones import RunTracker, ZoneObservation, ZoneStats, choose_zone, horizon, zone_cost

K = 3.06 / 0.9731

runs = st.lists(st.floats(0.17, 20.0), max_size=12).map(tuple)
zones = st.builds(ZoneStats, zone=st.sampled_from(["a", "b", "c"]), up_h=runs, down_h=runs,
                  open_up_h=st.lists(st.floats(0.17, 30.0), max_size=2).map(tuple),
                  now=st.sampled_from([True, False, None]), age_h=st.floats(0.0, 30.0))


def unique(zs: list[ZoneStats]) -> tuple[ZoneStats, ...]:
    return tuple({z.zone: z for z in zs}.values())


observations = st.builds(
    ZoneObservation, here=st.sampled_from(["a", "b", "c"]), zones=st.lists(zones, min_size=1, max_size=3).map(unique),
    work_left_h=st.floats(0.5, 60.0), time_left_h=st.one_of(st.floats(0.5, 120.0), st.just(math.inf)),
    changeover_h=st.floats(0.0, 0.5), price_ratio=st.floats(1.2, 6.0), move_h=st.floats(0.0, 3.0),
    move_price=st.floats(0.0, 2.0), first_launch=st.booleans(), tick_h=st.sampled_from([195 / 3600, 1 / 6]),
    on_demand_while_down=st.booleans())


@settings(max_examples=400, deadline=None)
@given(observations)
def test_a_move_is_made_only_when_it_is_expected_to_cost_less_than_staying(obs):
    decision = choose_zone(obs)
    here = obs.here if obs.here in {z.zone for z in obs.zones} else None
    assert decision.zone in {z.zone for z in obs.zones}
    if here is None or not decision.move:
        return
    assert decision.zone != here
    # the move's time and price are in the target's cost: never more than staying's (a free move may
    # break a tie, costs equal to 6 digits, for where spot is up sooner)
    assert decision.costs[decision.zone] <= decision.costs[here] + 1e-6
    free = obs.first_launch or (obs.move_h <= 0 and obs.move_price <= 0)
    if not free:
        assert decision.costs[decision.zone] < decision.costs[here]


@settings(max_examples=400, deadline=None)
@given(observations)
def test_a_move_always_leaves_on_demand_time_to_finish_before_the_deadline(obs):
    decision = choose_zone(obs)
    if not decision.move or obs.here not in {z.zone for z in obs.zones} or obs.first_launch:
        return
    move_h = 0.0 if obs.move_h <= 0 and obs.move_price <= 0 else obs.move_h
    assert obs.time_left_h - move_h - obs.work_left_h >= obs.changeover_h + obs.tick_h


def test_never_moves_when_the_move_costs_more_than_it_can_gain():
    here = ZoneStats("a", up_h=(2.0,) * 5, down_h=(1.0,) * 5, now=False, age_h=0.1)
    there = ZoneStats("b", up_h=(8.0,) * 5, down_h=(0.5,) * 5, now=True, age_h=3.0)
    base = dict(here="a", zones=(here, there), work_left_h=20.0, time_left_h=30.0, changeover_h=0.2, price_ratio=K)
    cheap = choose_zone(ZoneObservation(**base, move_h=0.1))
    assert cheap.move and cheap.zone == "b", cheap.reason
    assert "moves to b (the move: 0.10 h)" in cheap.reason
    # the same move at a price above anything it could save on 20 h of work
    dear = choose_zone(ZoneObservation(**base, move_h=0.1, move_price=20 * K))
    assert not dear.move and dear.zone == "a", dear.reason
    # ... or taking longer than the slack the deadline leaves
    slow = choose_zone(ZoneObservation(**base, move_h=9.9))
    assert not slow.move and "stays in a" in slow.reason


def test_the_first_launch_of_an_empty_disk_moves_for_free():
    here = ZoneStats("a", up_h=(1.0,) * 5, down_h=(3.0,) * 5, now=False, age_h=0.5)
    there = ZoneStats("b", up_h=(6.0,) * 5, down_h=(0.5,) * 5, now=True, age_h=1.0)
    obs = ZoneObservation("a", (here, there), work_left_h=20.0, time_left_h=30.0, changeover_h=0.2, price_ratio=K,
                          move_h=50.0, move_price=100.0, first_launch=True)
    first = choose_zone(obs)
    assert first.move and first.zone == "b" and "free (the disk is empty)" in first.reason
    assert first.costs["b"] == pytest.approx(zone_cost(there, here, 20.0, 30.0, 0.0, horizon(50.0), 0.2, K))
    later = choose_zone(ZoneObservation("a", (here, there), 20.0, 30.0, 0.2, K, move_h=50.0, move_price=100.0))
    assert not later.move  # the same move once the disk has data: a 50 h move cannot make a 30 h deadline


def test_unplaced_job_is_placed_where_spot_is_up_when_costs_tie():
    a = ZoneStats("a", now=False, age_h=0.2)
    b = ZoneStats("b", now=True, age_h=0.2)
    d = choose_zone(ZoneObservation(None, (a, b), work_left_h=5.0, time_left_h=100.0, changeover_h=0.1,
                                    price_ratio=K, move_h=1.0))
    assert d.zone == "b" and d.reason.startswith("first placement in b")


def test_a_zone_not_seen_now_shares_the_outage_of_the_job_zone():
    here = ZoneStats("a", up_h=(3.0,) * 4, down_h=(1.0,) * 4, now=False, age_h=0.0)
    unknown = ZoneStats("b", up_h=(3.0,) * 4, down_h=(1.0,) * 4, now=None)
    d = choose_zone(ZoneObservation("a", (here, unknown), 20.0, 30.0, 0.2, K, move_h=0.3))
    assert not d.move  # a paid move goes only where spot is seen up


def test_no_deadline_ranks_zones_by_cost_per_hour_of_progress():
    short = ZoneStats("a", up_h=(0.3,) * 10, down_h=(0.5,) * 10, now=False, age_h=0.1)
    long = ZoneStats("b", up_h=(10.0,) * 10, down_h=(0.5,) * 10, now=True, age_h=0.1)
    d = choose_zone(ZoneObservation("a", (short, long), math.inf, math.inf, 0.2, K, move_h=0.5))
    assert d.move and d.zone == "b"


def test_run_tracker_counts_only_runs_whose_start_and_end_it_saw():
    tr = RunTracker("a", 0.5)
    for v in [True, True, False, False, False, True, None, True, False]:
        tr.add(v)
    s = tr.stats()
    assert s.up_h == () and s.down_h == (1.5,)  # the first up run's start was not seen
    assert s.open_up_h == (1.0, 0.5, 0.5)  # seen at least this long: before the run, before and after the gap
    assert s.now is False and s.age_h == 0.5


def alternating(seed: int, n: int, p_flip: float) -> Trace:
    rng = random.Random(seed)
    state, data = True, []
    for _ in range(n):
        if rng.random() < p_flip:
            state = not state
        data.append(state)
    return Trace(f"z{seed}", 600, tuple(data))


@settings(max_examples=25, deadline=None)
@given(st.integers(0, 10_000), st.floats(0.0, 2.0), st.sampled_from(["probe", "own"]),
       st.sampled_from(["uniform-progress-nh", "greedy", "uniform-progress"]))
def test_simulated_jobs_meet_their_deadline_whatever_the_move_costs(seed, move_h, knowledge, policy):
    zs = aligned([alternating(seed, 700, 0.2), alternating(seed + 1, 700, 0.1), alternating(seed + 2, 700, 0.3)])
    job = Job(24.0, 30.0, 0.2)
    run = simulate_zones(policy, zs, 50, job, Move(move_h), knowledge, history_ticks=50)
    assert not run.missed and run.finish_h <= 30.0
    assert run.spot_h + run.od_h == pytest.approx(24.0, abs=1 / 6)


def test_moving_to_where_spot_is_up_beats_waiting_in_a_dead_zone():
    dead = Trace("dead", 600, (True,) * 3 + (False,) * 500)
    alive = Trace("alive", 600, (True,) * 503)
    zs = aligned([dead, alive])
    job = Job(20.0, 30.0, 0.2)
    stay = simulate_zones("uniform-progress-nh", zs, 0, job, Move(0.5), "stay")
    probe = simulate_zones("uniform-progress-nh", zs, 0, job, Move(0.5), "probe")
    assert probe.moves == 1 and probe.zones[-1] == "alive" and probe.cost < stay.cost
    assert not probe.missed and not stay.missed
    # a move that takes longer than the deadline's slack is never made
    slow = simulate_zones("uniform-progress-nh", zs, 0, job, Move(9.0), "probe")
    assert slow.moves == 0 and not slow.missed


def test_aligned_refuses_traces_of_different_ticks():
    with pytest.raises(ValueError, match="b: a tick of 300 s, not 600 s"):
        aligned([Trace("a", 600, (True,)), Trace("b", 300, (True,))])


def test_blocked_zones_are_no_target_and_the_reason_says_why():
    here = ZoneStats("a", up_h=(2.0,) * 5, down_h=(1.0,) * 5, now=False, age_h=0.1)
    there = ZoneStats("b", up_h=(8.0,) * 5, down_h=(0.5,) * 5, now=True, age_h=3.0)
    d = choose_zone(ZoneObservation("a", (here, there), 20.0, 30.0, 0.2, K, move_h=0.1,
                                    blocked=("b: the move budget is spent (2 in 24 h)",)))
    assert not d.move and d.reason.endswith("no move now (b: the move budget is spent (2 in 24 h))"), d.reason
