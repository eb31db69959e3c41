"""Policies and the simulator: invariants on synthetic traces (always) and on the real development
traces (read from ../shared/traces), and the paper's Table 3 for Uniform Progress."""

from __future__ import annotations

import dataclasses
import json
import math
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from cli.app import app
from cli.policy.policies import Observation, make_policy, policy_names
from cli.policy.simulate import Job, Trace, all_on_demand_cost, load_trace, omniscient, simulate, starts_for
from infra.config import POLICY_NAMES

ROOT = Path(__file__).resolve().parent.parent
TRACES = ROOT.parent / "shared" / "traces"
OCT22 = TRACES / "skypilot-spot-traces" / "availability" / "1-node" / "aws-10-26-2022"
SAFE = ["default", "greedy", "uniform-progress", "uniform-progress-nh", "n-preemptions", "on-demand"]


def dev_traces() -> list[Trace]:
    if not OCT22.is_dir():
        pytest.skip(f"development traces not found at {OCT22}")
    return [load_trace(p) for p in sorted(OCT22.glob("*.json"))]


def synthetic(seed: int, n: int = 600, p_up: float = 0.6) -> Trace:
    import random

    rng = random.Random(seed)
    state, data = True, []
    for _ in range(n):
        if rng.random() < (0.15 if state else 0.25):
            state = not state
        data.append(state if rng.random() < 0.97 else not state)
    return Trace(f"synthetic-{seed}", 600, tuple(data))


def test_registry_matches_config_names():
    assert sorted(POLICY_NAMES) == policy_names()


def test_unknown_policy_lists_the_valid_ones():
    with pytest.raises(KeyError) as err:
        make_policy("greedyy")
    assert "unknown policy 'greedyy'; valid: default, greedy, n-preemptions, on-demand" in str(err.value)


def test_observation_is_frozen_with_the_documented_fields():
    fields = {f.name for f in dataclasses.fields(Observation)}
    assert {"elapsed_h", "progress_h", "job_h", "deadline_h", "changeover_h", "price_ratio", "current",
            "spot_available", "preemptions"} <= fields
    obs = Observation(1, 0.5, 10, 20, 0.1, 3, "idle", True, 0)
    with pytest.raises(dataclasses.FrozenInstanceError):
        obs.progress_h = 2  # type: ignore[misc]


def test_all_on_demand_costs_exactly_c_k_plus_d_k():
    job = Job(12, 20, 0.2, 3.0)
    run = simulate(make_policy("on-demand"), synthetic(1), 0, job)
    assert math.isclose(run.cost, 12 * 3.0 + 0.2 * 3.0, rel_tol=1e-12)
    assert math.isclose(all_on_demand_cost(job), run.cost)
    assert run.od_h == 12 and run.spot_h == 0 and not run.missed


@settings(max_examples=25, deadline=None)
@given(seed=st.integers(0, 10_000), ratio=st.sampled_from([0.5, 0.8, 0.95]), d=st.sampled_from([0.05, 0.1, 0.2]))
def test_omniscient_bounds_every_policy_and_safe_policies_never_miss(seed, ratio, d):
    trace = synthetic(seed, n=200)
    job = Job(8 * ratio, 8, d)
    start = seed % 50
    best = omniscient(trace, start, job)
    assert math.isfinite(best)  # on-demand alone always makes these deadlines
    for name in SAFE:
        run = simulate(make_policy(name), trace, start, job)
        assert best <= run.cost + 1e-9, (name, best, run.cost)
        assert not run.missed, name


def test_decisions_never_depend_on_the_future():
    a = synthetic(3, n=400)
    b = Trace("b", 600, a.available[:150] + tuple(not v for v in a.available[150:]))
    job = Job(30, 60, 0.2)
    for name in SAFE:
        ra = simulate(make_policy(name), a, 0, job, record=True)
        rb = simulate(make_policy(name), b, 0, job, record=True)
        assert ra.modes[:150] == rb.modes[:150], name


def test_omniscient_is_exact_on_a_tiny_case():
    # 1 h job, deadline 2 h, ticks of 30 min, changeover 30 min; spot only in the 2nd hour.
    # All on-demand: (0.5 + 1) h * 3 = 4.5. Better: on-demand for the 1st hour (0.5 changeover + 0.5 work:
    # 3.0), then spot for the 2nd (0.5 changeover + 0.5 work: 1.0) = 4.0, finishing exactly at 2 h.
    trace = Trace("tiny", 1800, (False, False, True, True, True))
    job = Job(1.0, 2.0, 0.5, 3.0)
    assert omniscient(trace, 0, job) == pytest.approx(4.0)
    assert omniscient(trace, 0, dataclasses.replace(job, deadline_h=1.0)) == math.inf  # 1.5 h needed
    cheap = Trace("cheap", 1800, (True, True, True, True, True))
    assert omniscient(cheap, 0, job) == pytest.approx(1.5)  # spot from 0: changeover + work at price 1


# ---- real development traces -------------------------------------------------------------------------


def test_invariants_on_the_development_traces():
    job = Job(48, 60, 0.2)
    for trace in dev_traces():
        for start in starts_for(trace, job, 3, seed=7):
            best = omniscient(trace, start, job)
            for name in SAFE:
                run = simulate(make_policy(name), trace, start, job)
                assert best <= run.cost + 1e-9
                assert not run.missed, (trace.name, start, name)


def test_uniform_progress_keeps_the_on_demand_vm_as_the_authors_simulator_does():
    """C=48, R=60, d=0.2, the first 1,781 ticks of us-west-2b_v100_1 (the p3.2xlarge trace), every 4th start.
    The paper's Table 3 says 25.1 h on-demand / 22.9 h spot; a UP that dropped from on-demand to idle got
    24.4 / 23.6 here. The authors' own simulator (sky_spot rc_cr_threshold, ported in bench/adrs.py)
    keeps the on-demand VM while spot is down, and so does ours now: 22.0 / 26.0 here, and in the ADRS
    harness both bill 23.0-23.1 h on on-demand (changeovers included) on these starts."""
    dev_traces()
    full = load_trace(OCT22 / "us-west-2b_v100_1.json")
    trace = Trace(full.name, full.gap_s, full.available[:1781])
    job = Job(48, 60, 0.2)
    runs = [simulate(make_policy("uniform-progress"), trace, s, job) for s in range(0, 1781 - 361, 4)]
    od = sum(r.od_h for r in runs) / len(runs)
    spot = sum(r.spot_h for r in runs) / len(runs)
    assert od == pytest.approx(22.0, abs=0.5) and spot == pytest.approx(26.0, abs=0.5)
    assert od + spot == pytest.approx(48)
    assert not any(r.missed for r in runs)


# ---- the command ---------------------------------------------------------------------------------------


def test_simulate_command_json_and_plot(runner, tmp_path):
    trace = tmp_path / "t.json"
    trace.write_text(json.dumps({"metadata": {"gap_seconds": 600}, "data": [int(v) for v in synthetic(5, 400).available]}))
    png = tmp_path / "run.png"
    result = runner.invoke(app, ["simulate", "--trace", str(trace), "--job-hours", "20", "--deadline-hours", "30",
                                 "--starts", "4", "--json", "--plot", str(png)])
    assert result.exit_code == 0, result.output
    doc = json.loads(result.stdout)
    rows = {r["policy"]: r for r in doc["results"]}
    assert set(rows) == {"default", "uniform-progress", "uniform-progress-nh", "greedy", "n-preemptions", "on-demand", "omniscient"}
    assert rows["on-demand"]["mean_norm_cost"] == pytest.approx(1.0)
    assert all(rows["omniscient"]["mean_norm_cost"] <= r["mean_norm_cost"] + 1e-9 for r in rows.values())
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_simulate_rejects_bad_input(runner, tmp_path):
    result = runner.invoke(app, ["simulate", "--trace", str(tmp_path / "missing.json")])
    assert result.exit_code == 1 and result.output == f"error: {tmp_path / 'missing.json'}: trace file not found\n"
    trace = tmp_path / "t.json"
    trace.write_text(json.dumps({"metadata": {"gap_seconds": 600}, "data": [1] * 50}))
    result = runner.invoke(app, ["simulate", "--trace", str(trace), "--policy", "nope"])
    assert result.exit_code == 1 and "--policy nope: unknown; valid: default" in result.output
    result = runner.invoke(app, ["simulate", "--trace", str(trace)])
    assert result.exit_code == 1 and "shorter than the 60.0 h deadline" in result.output
