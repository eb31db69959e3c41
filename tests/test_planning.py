"""The planner behind the ``default`` policy: hazard fitting, the regime posterior, the plan's
costs against exact answers, coarsening for long jobs, and the shipped regimes' provenance."""

from __future__ import annotations

import json
import math
import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from cli.policy import planning
from cli.policy.grid import MAX_STATES, Units
from cli.policy.planning import OD_M, SPOT_M, Plan, Regime, bucket_of, fit_regime, runs
from cli.policy.policies import Default, Observation
from cli.policy.simulate import Job, Trace, all_on_demand_cost, omniscient, simulate
from tests.test_policy import OCT22, dev_traces

TICK = 1 / 6


def test_runs_split_complete_runs_from_the_censored_last_one():
    ups, downs, last = runs([True, True, False, True, True, True, False, False])
    assert (ups, downs, last) == ([2, 3], [1], (False, 2))


def test_hazards_are_ends_per_hour_of_exposure_in_each_age_bucket():
    # up runs of exactly 3 ticks, down runs of 1: every up run survives ages 1 and 2 and ends at 3
    seq = ([True] * 3 + [False]) * 50
    r = fit_regime("t", seq, TICK)
    assert r.up_rate[bucket_of(1 * TICK)] == 0.0
    assert r.up_rate[bucket_of(2 * TICK)] == 0.0
    assert bucket_of(3 * TICK) == bucket_of(4 * TICK)
    assert r.up_rate[bucket_of(3 * TICK)] == pytest.approx(1 / TICK)  # all end at the only age seen there
    # the last down run is cut off by the end of the series: exposure without an end (censored)
    assert r.down_rate[bucket_of(TICK)] == pytest.approx(49 / 50 / TICK)
    assert 0 < r.flip_prob(True, bucket_of(3 * TICK), TICK) < 1  # clipped: never certain


def test_a_prior_shrinks_sparse_buckets_towards_it():
    prior = Regime("p", (0.5,) * planning.B, (2.0,) * planning.B)
    r = fit_regime("t", [True] * 3 + [False], TICK, prior=prior, prior_h=10.0)
    assert all(0 < x < 1.5 for x in r.up_rate)
    assert r.up_rate[-1] == pytest.approx(0.5)  # no exposure there: the prior's rate


def sample(regime: Regime, n: int, rng: random.Random) -> list[bool]:
    state, age, out = True, 0, []
    for _ in range(n):
        age += 1
        out.append(state)
        if rng.random() < regime.flip_prob(state, bucket_of(age * TICK), TICK):
            state, age = not state, 0
    return out


def test_the_posterior_finds_the_regime_that_generated_the_availability():
    calm = Regime("calm", (0.05,) * planning.B, (3.0,) * planning.B)
    choppy = Regime("choppy", (3.0,) * planning.B, (0.3,) * planning.B)
    for truth in (calm, choppy):
        policy = Default(regimes=[calm, choppy], online=False)
        for t, available in enumerate(sample(truth, 150, random.Random(truth.name))):
            policy.decide(Observation(t * TICK, 0.0, 10.0, 100.0, 0.1, 3.0, "idle", available, 0, TICK))
        assert policy.regimes[int(policy.posterior().argmax())] is truth
        assert policy.posterior().max() > 0.99


def test_the_online_regime_takes_over_where_no_prior_regime_fits():
    """Prequentially scored, the regime learned from the job's own ticks wins when the truth is new."""
    calm = Regime("calm", (0.05,) * planning.B, (3.0,) * planning.B)
    choppy = Regime("choppy", (3.0,) * planning.B, (0.3,) * planning.B)
    unseen = Regime("unseen", (0.6,) * planning.B, (0.02,) * planning.B)  # rare, long outages
    policy = Default(regimes=[calm, choppy])
    for available in sample(unseen, 2000, random.Random(7)):
        policy.observe(available, TICK)
    post = policy.posterior()
    assert post[-1] > 0.99, post
    learned = policy.online.regime()
    assert 0.3 < learned.up_rate[0] < 1.2 and learned.down_rate[-1] < 0.2


def test_plan_costs_match_the_exact_answers_when_the_future_is_certain():
    """Spot (almost) always there: C + d on spot. Spot never there: (C + d) * k on on-demand."""
    units = Units.of(TICK, 0.2, 5.0, 8.0)
    always = Plan(Regime("up", (1e-9,) * planning.B, (50.0,) * planning.B), units, 3.0, TICK)
    q = always.q_values(0, planning.IDLE_M, True, 0, units.work)
    assert q[SPOT_M] <= min(q.values()) * (1 + 1e-4)  # waiting is as good (there is slack): a tie
    assert q[SPOT_M] * units.u_s / 3600 == pytest.approx(5.2, rel=1e-3)
    never = Plan(Regime("down", (50.0,) * planning.B, (1e-9,) * planning.B), units, 3.0, TICK)
    q = never.q_values(0, planning.IDLE_M, False, 0, units.work)
    assert q[OD_M] * units.u_s / 3600 == pytest.approx(5.2 * 3.0, rel=1e-3)
    # ...and the policy breaks that tie towards progress
    obs = Observation(0.0, 0.0, 5.0, 8.0, 0.2, 3.0, "idle", True, 0, TICK)
    assert Default(regimes=[always.regime]).decide(obs) == "spot"


@settings(max_examples=15, deadline=None)
@given(st.integers(0, 10_000), st.sampled_from([0.6, 0.8, 0.95]), st.sampled_from([0.05, 0.2]))
def test_default_is_safe_and_bounded_on_random_regime_traces(seed, ratio, d):
    rng = random.Random(seed)
    regime = Regime("r", tuple(rng.uniform(0.05, 3) for _ in range(planning.B)),
                    tuple(rng.uniform(0.05, 3) for _ in range(planning.B)))
    trace = Trace("r", 600, tuple(sample(regime, 200, rng)))
    job = Job(8.0, round(8.0 / ratio, 3), d)
    run = simulate(Default(regimes=[regime]), trace, 0, job)
    assert not run.missed
    assert omniscient(trace, 0, job) <= run.cost + 1e-9
    assert run.cost <= all_on_demand_cost(job) * 1.5  # never pays for more than a few wasted changeovers


def test_long_jobs_are_planned_on_a_coarser_grid_that_never_understates_a_changeover():
    exact, tick = Units.fit(TICK, 0.05, 12, 15)
    assert (exact, tick) == (Units.of(TICK, 0.05, 12, 15), TICK)
    units, plan_tick = Units.fit(TICK, 0.05, 400, 600, budget=200_000)
    assert units.size <= 200_000
    assert round(plan_tick * 3600) % 600 == 0 and round(plan_tick * 3600) == units.tick * units.u_s
    assert units.change * units.u_s >= 0.05 * 3600
    policy = Default()
    obs = Observation(0.0, 0.0, 400.0, 600.0, 0.05, 3.0, "idle", True, 0, TICK)
    assert policy.decide(obs) in ("spot", "on-demand", "idle")


def test_default_is_deterministic_and_does_not_share_state_between_runs():
    trace = Trace("t", 600, tuple(sample(planning.shipped_regimes()[0], 300, random.Random(3))))
    job = Job(20.0, 26.0, 0.1)
    a = simulate(Default(), trace, 0, job)
    simulate(Default(), trace, 50, job)
    assert simulate(Default(), trace, 0, job) == a


def test_shipped_regimes_are_the_fit_of_the_development_traces():
    """cli/policy/regimes.json is reproducible: bench/fit_regimes.py on the development set gives it back."""
    traces = dev_traces()
    doc = json.loads(planning.REGIMES_FILE.read_text())
    assert doc["age_edges_h"] == [round(x, 5) for x in planning.AGE_EDGES_H]
    assert [r["name"] for r in doc["regimes"]] == [t.name for t in traces]
    for shipped, trace in zip(doc["regimes"], traces, strict=True):
        fitted = fit_regime(trace.name, trace.available, trace.gap_s / 3600)
        assert shipped["up_rate"] == [round(x, 5) for x in fitted.up_rate]
        assert shipped["down_rate"] == [round(x, 5) for x in fitted.down_rate]
    assert OCT22.name in doc["source"]
    # the model's premise: on these traces a spot window that has lasted hours ends far less often
    for r in planning.shipped_regimes():
        if r.up_rate[0] > 0:
            assert r.up_rate[-1] < r.up_rate[0], r.name
    assert not math.isnan(sum(sum(r.up_rate) for r in planning.shipped_regimes()))


@settings(max_examples=30, deadline=None)
@given(st.integers(0, 10_000), st.sampled_from([0.8, 0.92, 0.97]), st.sampled_from([0.05, 0.2]),
       st.sampled_from([320, 340, 600]))
def test_default_never_misses_when_it_plans_on_a_grid_coarser_than_its_decisions(seed, ratio, d, gap_s):
    """A plan coarser than the decision tick (long jobs, odd ticks) cannot see the slack one move
    spends: the moves themselves are checked (``unsafe_moves``); bench/policy.py once found a miss."""
    rng = random.Random(seed)
    regime = Regime("r", tuple(rng.uniform(0.05, 3) for _ in range(planning.B)),
                    tuple(rng.uniform(0.05, 3) for _ in range(planning.B)))
    trace = Trace("r", gap_s, tuple(sample(regime, 300, rng)))
    job = Job(10.0, round(10.0 / ratio, 3), d)
    policy = Default(regimes=[regime], online=False, fit_z=None, budget=3_000)
    assert not simulate(policy, trace, 0, job).missed


def test_a_move_that_could_leave_on_demand_too_little_slack_is_never_taken():
    reliable = Regime("reliable", (1e-3,) * planning.B, (5.0,) * planning.B)
    # on on-demand with 0.3 h of slack, ticks of 10 min, changeovers of 0.2 h: spot would cost 0.2 h
    # now and 0.2 h more to come back; waiting would cost the tick and a changeover
    obs = Observation(20.0, 17.0, 20.0, 23.3, 0.2, 3.0, "on-demand", True, 0, TICK)
    assert planning_unsafe(obs) == {"spot", "idle"}
    assert Default(regimes=[reliable], online=False, fit_z=None, budget=3_000).decide(obs) == "on-demand"
    roomy = Observation(20.0, 17.0, 20.0, 23.7, 0.2, 3.0, "on-demand", True, 0, TICK)
    assert planning_unsafe(roomy) == set()


def planning_unsafe(obs: Observation) -> set[str]:
    from cli.policy.policies import unsafe_moves

    return set(unsafe_moves(obs))


@pytest.mark.parametrize("tick_s", [320, 340, 600])
@pytest.mark.parametrize("d", [0.05, 0.2])
@pytest.mark.parametrize("deadline_h", [52.17, 60.0, 80.0])
def test_a_coarse_grid_overstates_a_changeover_by_at_most_a_quarter_tick(tick_s, d, deadline_h):
    units, plan_tick = Units.fit(tick_s / 3600, d, 48.0, deadline_h)
    assert units.size <= MAX_STATES
    assert round(plan_tick * 3600) % tick_s == 0
    assert 0 <= units.change * units.u_s - d * 3600 <= min(0.5 * d * 3600, tick_s / 4)


@pytest.mark.parametrize("hysteresis", [True, False])
def test_from_on_demand_spot_is_taken_only_once_its_window_has_outlasted_a_changeover(hysteresis):
    """A window younger than a changeover may end before the launch pays (and then on-demand is paid
    again): the plan would leave on-demand at once in a reliable zone, the hysteresis waits."""
    reliable = Regime("reliable", (1e-3,) * planning.B, (5.0,) * planning.B)
    policy = Default(regimes=[reliable], online=False, fit_z=None, budget=3_000, hysteresis=hysteresis)
    at = lambda t, current, available: Observation(t * TICK, t * TICK, 20.0, 30.0, 0.2, 3.0, current, available, 0, TICK)  # noqa: E731
    assert policy.decide(at(0, "idle", False)) in ("on-demand", "idle")
    first = policy.decide(at(1, "on-demand", True))  # spot back for one 10-min tick < 0.2 h
    assert first == ("on-demand" if hysteresis else "spot")
    assert ("hysteresis" in policy.reason) == hysteresis
    assert policy.decide(at(2, "on-demand", True)) == "spot"  # 20 min > 0.2 h: it outlasted a changeover
