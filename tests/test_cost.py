"""spotctl cost: the ledger against hand-computed examples (to the cent), the price sources, the
cloud's price APIs (moto for EC2 spot price history, a Stubber for the Price List, which moto lacks),
the CLI (tables, --json without NaN, --plot), status's spot/on-demand split, and the refresh tool."""

from __future__ import annotations

import json
import math
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from cli.app import app
from cli.cost import price_ratio, report
from cli.cost.ledger import Price, cost_job, job_json, job_ledger, money
from cli.cost.prices import shipped_table, table_price
from cli.lifecycle.events import Event
from infra.config import ConfigError, validate

FIXTURES = Path(__file__).parent / "fixtures"

STACK = """\
# team-a's stack (comments stay)
config:
  spotctl:cloud: aws
  spotctl:region: us-east-1
  spotctl:zones: [us-east-1a, us-east-1b]
  spotctl:prices:
    g5.2xlarge: {spot: 0.4871, onDemand: 1.212}
    p4d.24xlarge: {spot: 9.83, onDemand: 32.7726}
  spotctl:jobs:
    - id: vit
      instanceType: g5.2xlarge
      zone: us-east-1a
      capacity: on-demand
      attempt: 2
      state: completed
      command: python finetune.py
    - id: llm
      instanceType: p4d.24xlarge
      nodes: 2
      zone: us-east-1a
      capacity: spot
      attempt: 3
      state: running
      command: torchrun train.py
    - id: sweep
      instanceType: g5.4xlarge
      zone: us-east-1b
      capacity: on-demand
      state: completed
      command: python sweep.py
"""
AS_OF = "2026-11-21T14:45:00Z"


def ev(job, attempt, node, name, hhmm, **details):
    return {"job": job, "attempt": attempt, "node": node, "event": name, "time": f"2026-11-21T{hhmm}:00Z", "details": details}


def started(job, attempt, node, hhmm, capacity, machine, nodes):
    return ev(job, attempt, node, "started", hhmm, capacity=capacity, machineType=machine, nodes=str(nodes))


EVENTS = [
    # vit, 1 node: spot 10:00-13:30 (3.5 h), preempted; changeover 0.25 h; on-demand 13:45-14:21 (0.6 h).
    started("vit", 1, 0, "10:00", "spot", "g5.2xlarge", 1), ev("vit", 1, 0, "preempted", "13:30"),
    started("vit", 2, 0, "13:45", "on-demand", "g5.2xlarge", 1), ev("vit", 2, 0, "completed", "14:21"),
    # llm, 2 nodes: spot 08:00-11:00 (the first node's preemption ends the attempt), changeover 0.5 h,
    # on-demand 11:30-12:00 (a failover; the stack file says spot again now), changeover 0.25 h,
    # spot from 12:15, still running at 14:45.
    started("llm", 1, 0, "08:00", "spot", "p4d.24xlarge", 2), started("llm", 1, 1, "08:01", "spot", "p4d.24xlarge", 2),
    ev("llm", 1, 1, "preempted", "11:00"), ev("llm", 1, 0, "preempted", "11:00"),
    started("llm", 2, 0, "11:30", "on-demand", "p4d.24xlarge", 2), started("llm", 2, 1, "11:30", "on-demand", "p4d.24xlarge", 2),
    ev("llm", 2, 0, "stopped", "12:00"),
    started("llm", 3, 0, "12:15", "spot", "p4d.24xlarge", 2), started("llm", 3, 1, "12:16", "spot", "p4d.24xlarge", 2),
    # sweep, on-demand 09:00-11:00, priced from the shipped table (g5.4xlarge us-east-1).
    started("sweep", 1, 0, "09:00", "on-demand", "g5.4xlarge", 1), ev("sweep", 1, 0, "completed", "11:00"),
    # an event after --as-of is not counted
    ev("llm", 3, 0, "preempted", "15:00"),
]


@pytest.fixture
def team(project: Path) -> Path:
    (project / "stacks" / "Pulumi.team-a.yaml").write_text(STACK)
    events = project / "events"
    events.mkdir()
    (events / "events.jsonl").write_text("\n".join(json.dumps(e) for e in EVENTS) + "\n")
    return project


def no_nan(text: str):
    def refuse(name):
        raise AssertionError(f"{name} in JSON")

    return json.loads(text, parse_constant=refuse)


def cost_json(runner, *args):
    result = runner.invoke(app, ["cost", *args, "--stack", "team-a", "--events-dir", "events", "--as-of", AS_OF, "--json"])
    assert result.exit_code == 0, result.output
    return no_nan(result.stdout)


# ---- hand-computed examples, to the cent ------------------------------------------------------


def test_one_node_job_with_a_preemption_and_a_capacity_switch(team, runner):
    (vit,) = cost_json(runner, "vit")["jobs"]
    # spot 3.5 h x $0.4871 = 1.70485; on-demand 0.6 h x $1.212 = 0.7272; paid 2.43205
    # all on-demand: 4.1 h x $1.212 = 4.9692; saved 2.53715 (51.06 %)
    assert (vit["spot_hours"], vit["on_demand_hours"], vit["changeover_hours"], vit["preemptions"]) == (3.5, 0.6, 0.25, 1)
    assert (vit["cost"], vit["on_demand_cost"], vit["savings"], vit["savings_pct"]) == (2.43, 4.97, 2.54, 51.1)
    assert [(a["attempt"], a["capacity"], a["outcome"], a["cost"]) for a in vit["attempts"]] == [
        (1, "spot", "preempted", 1.70), (2, "on-demand", "completed", 0.73)]
    assert vit["running"] is False and vit["work_lost_hours"] is None  # no checkpoint events: unknown, not 0
    assert vit["prices"]["g5.2xlarge"]["source"] == "stack file (spotctl:prices)"


def test_two_node_job_still_running_keeps_each_attempts_own_capacity(team, runner):
    data = cost_json(runner, "llm")
    (llm,) = data["jobs"]
    # VM-hours: spot 2 x 3 h + 2 x 2.5 h (running, 12:15 -> 14:45) = 11; on-demand 2 x 0.5 h = 1
    # paid 11 x 9.83 + 1 x 32.7726 = 140.9026; all on-demand 12 x 32.7726 = 393.2712; saved 252.3686 (64.17 %)
    assert (llm["spot_hours"], llm["on_demand_hours"], llm["changeover_hours"], llm["preemptions"]) == (11.0, 1.0, 0.75, 1)
    assert (llm["cost"], llm["on_demand_cost"], llm["savings"], llm["savings_pct"]) == (140.90, 393.27, 252.37, 64.2)
    assert llm["running"] is True and data["total"]["running_cost"] == 140.90
    assert [(a["capacity"], a["nodes"], a["vm_hours"], a["outcome"]) for a in llm["attempts"]] == [
        ("spot", 2, 6.0, "preempted"), ("on-demand", 2, 1.0, "stopped"), ("spot", 2, 5.0, "running")]


def test_stack_total_and_the_shipped_table(team, runner):
    data = cost_json(runner)
    sweep = next(j for j in data["jobs"] if j["id"] == "sweep")
    # 2 h on-demand x $1.624 (g5.4xlarge us-east-1 in the shipped table)
    assert (sweep["cost"], sweep["on_demand_cost"], sweep["savings"], sweep["savings_pct"]) == (3.25, 3.25, 0.0, 0.0)
    assert sweep["prices"]["g5.4xlarge"]["source"].startswith("shipped table, 2026-11-22: skypilot-org/skypilot-catalog")
    # paid 2.43205 + 140.9026 + 3.248 = 146.58265; all on-demand 4.9692 + 393.2712 + 3.248 = 401.4884
    assert data["total"] == {
        "cost": 146.58, "on_demand_cost": 401.49, "savings": 254.91, "savings_pct": 63.5, "running_cost": 140.90,
        "spot_hours": 14.5, "on_demand_hours": 3.6, "changeover_hours": 1.0, "preemptions": 2, "unpriced_jobs": [],
        "moves": 0, "move_changeover_hours": 0.0, "snapshot_storage_cost": 0.0,
    }


def test_table_output_names_every_price_source(team, runner):
    result = runner.invoke(app, ["cost", "--stack", "team-a", "--events-dir", "events", "--as-of", AS_OF],
                           env={"COLUMNS": "150"})  # (its lines whole, whatever width another test left)
    assert result.exit_code == 0, result.output
    out = result.stdout
    assert "$146.58" in out and "$254.91 (63.5 %)" in out and "running (so far)" in out
    assert "price p4d.24xlarge: spot $9.8300/h, on-demand $32.7726/h — stack file (spotctl:prices)" in out
    assert "price g5.4xlarge: spot $0.6512/h, on-demand $1.6240/h — shipped table, 2026-11-22" in out
    assert "jobs still running have cost $140.90 so far" in out


def test_plot_is_written(team, runner, tmp_path):
    png = tmp_path / "out" / "cost.png"
    result = runner.invoke(app, ["cost", "--stack", "team-a", "--events-dir", "events", "--as-of", AS_OF, "--plot", str(png)])
    assert result.exit_code == 0, result.output
    data = png.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 20_000  # a drawn figure, not an empty canvas
    assert f"plot written to {png}" in " ".join(result.stdout.split())
    for bare in ("cost", "cost.pdf"):  # not a .png: a PNG beside it, and the message names that file
        result = runner.invoke(app, ["cost", "--stack", "team-a", "--events-dir", "events", "--as-of", AS_OF, "--plot",
                                     str(tmp_path / bare)])
        assert result.exit_code == 0, result.output
        real = tmp_path / f"{bare}.png"
        assert real.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and not (tmp_path / bare).exists()
        assert f"plot written to {real}" in "".join(result.stdout.split("\n")), result.stdout


def test_unpriced_type_is_named_never_guessed(team, runner, monkeypatch):
    # no credentials anywhere: the cloud's price API is tried for the unknown type and says why not
    for var in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN", "AWS_PROFILE"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(team / "none"))
    monkeypatch.setenv("AWS_CONFIG_FILE", str(team / "none"))
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")
    path = team / "stacks" / "Pulumi.team-a.yaml"
    path.write_text(path.read_text().replace("instanceType: g5.4xlarge", "instanceType: x9.mega"))
    (team / "events" / "events.jsonl").write_text((team / "events" / "events.jsonl").read_text().replace('"g5.4xlarge"', '"x9.mega"'))
    data = cost_json(runner)
    sweep = next(j for j in data["jobs"] if j["id"] == "sweep")
    assert sweep["cost"] is None and sweep["savings_pct"] is None and sweep["unpriced"] == ["x9.mega"]
    assert data["total"]["unpriced_jobs"] == ["sweep"] and data["total"]["cost"] == 143.33  # 2.43205 + 140.9026
    assert any(n.startswith("cloud price API not used: cannot ask the cloud: no AWS credentials") for n in data["notes"])
    assert any("no price for x9.mega: add them to spotctl:prices" in n for n in data["notes"])


def test_bad_as_of_and_unknown_job(team, runner):
    result = runner.invoke(app, ["cost", "--stack", "team-a", "--as-of", "yesterday"])
    assert result.exit_code == 1 and "--as-of: expected an ISO 8601 time" in result.output
    result = runner.invoke(app, ["cost", "vitt", "--stack", "team-a"])
    assert result.exit_code == 1 and "did you mean 'vit'" in result.output


# ---- the ledger's rules -----------------------------------------------------------------------


def cfg_with(**job):
    return validate({"cloud": "aws", "region": "us-east-1", "zones": ["us-east-1a"], "prices": {"g5.2xlarge": {"spot": 0.5, "onDemand": 1.25}},
                     "jobs": [{"id": "j", "instanceType": "g5.2xlarge", "zone": "us-east-1a", "command": "x", **job}]}, "f.yaml")


T0 = datetime(2026, 11, 21, 8, tzinfo=UTC)


def event(attempt, name, hours, node=0, **details):
    return Event("j", attempt, node, name, T0 + timedelta(hours=hours), {k: str(v) for k, v in details.items()})


def test_old_events_without_details_fall_back_to_the_stack_file():
    cfg = cfg_with(capacity="on-demand", nodes=2, attempt=1, state="completed")
    led = job_ledger(cfg.jobs[0], [event(1, "started", 0), event(1, "completed", 2)], T0)
    (a,) = led.attempts
    assert (a.capacity, a.nodes, a.machine_type, a.from_events, a.vm_hours) == ("on-demand", 2, "g5.2xlarge", False, 4.0)


def test_a_preemption_after_the_completion_is_not_a_preemption_nor_lost_work():
    """The VM went between the trainer's exit and the end of its run (the scripts recorded both,
    in either order): the attempt completed, nothing was lost (also in status's Timeline)."""
    from cli.lifecycle.events import Timeline

    cfg = cfg_with(attempt=1, state="completed")
    for late in (2.001, 1.999):  # preempted recorded just after, or (the race) just before `completed`
        events = [event(1, "started", 0), event(1, "completed", 2.0), event(1, "preempted", late, progress=600)]
        (a,) = job_ledger(cfg.jobs[0], events, T0 + timedelta(hours=3)).attempts
        assert (a.outcome, a.lost_hours, a.vm_hours) == ("completed", None, 2.0)
        assert [how for _, _, how in Timeline.of(events, T0).runs] == ["completed"]


def test_a_gang_ends_at_its_first_preemption_or_its_last_completion():
    """One node's preemption ends the gang (the watcher resumes it whole), also after another node
    completed; a gang completes when its last node does: every node's VM runs until then."""
    from cli.lifecycle.events import Timeline

    cfg = cfg_with(attempt=1, state="running", nodes=2)
    preempted = [event(1, "started", 0), event(1, "started", 0, node=1), event(1, "completed", 1.0),
                 event(1, "preempted", 2.0, node=1)]
    (a,) = job_ledger(cfg.jobs[0], preempted, T0 + timedelta(hours=3)).attempts
    assert (a.outcome, a.end, a.vm_hours) == ("preempted", T0 + timedelta(hours=2), 4.0)
    done = [event(1, "started", 0), event(1, "started", 0, node=1), event(1, "completed", 1.0), event(1, "completed", 1.5, node=1)]
    (a,) = job_ledger(cfg.jobs[0], done, T0 + timedelta(hours=3)).attempts
    assert (a.outcome, a.end, a.vm_hours) == ("completed", T0 + timedelta(hours=1.5), 3.0)
    assert [(end, how) for _, end, how in Timeline.of(preempted, T0).runs] == [(T0 + timedelta(hours=2), "preempted")]
    assert [(end, how) for _, end, how in Timeline.of(done, T0).runs] == [(T0 + timedelta(hours=1.5), "completed")]


def test_work_lost_where_the_events_say():
    cfg = cfg_with(attempt=2, state="running")
    events = [event(1, "started", 0), event(1, "checkpoint", 1.0, step=100), event(1, "checkpoint", 2.0, step=200),
              event(1, "preemption-notice", 2.75, progress=275), event(1, "preempted", 2.8), event(2, "started", 3.0)]
    led = job_ledger(cfg.jobs[0], events, T0 + timedelta(hours=4))
    first = led.attempts[0]
    assert first.lost_hours == pytest.approx(0.8) and first.lost_steps == 75
    costed = cost_job(led, {"g5.2xlarge": Price(0.5, 1.25, "t")}.get)
    assert money(costed.lost_cost) == 0.40  # 0.8 VM-h lost at the spot price


def test_work_lost_from_the_scripts_checkpoint_events():
    """The shapes the scripts record: a rate-limited checkpoint recorded late carries ``at`` (when it
    was written); ``preempted`` carries ``progress``; a checkpoint written on SIGTERM after the
    ``preempted`` event (GCP's shutdown path records the preemption first) means nothing was lost."""
    cfg = cfg_with(attempt=3, state="running", nodes=2)
    at = (T0 + timedelta(hours=1.5)).isoformat().replace("+00:00", "Z")
    events = [
        # attempt 1: its trainer ignored SIGTERM; the newest checkpoint (step 150, written at 1.5 h) was
        # held back by the rate limit and recorded at the stop, after the preemption at 2.0 h.
        event(1, "started", 0), event(1, "checkpoint", 0.5, step=50), event(1, "preempted", 2.0, progress=200),
        event(1, "checkpoint", 2.01, step=150, at=at),
        # attempt 2: saved on SIGTERM (step 260) after the preempted event (progress 260): nothing lost.
        event(2, "started", 2.5), event(2, "preempted", 3.0, progress=260), event(2, "checkpoint", 3.002, step=260),
        event(3, "started", 3.5),
    ]
    led = job_ledger(cfg.jobs[0], events, T0 + timedelta(hours=4))
    first, second, _ = led.attempts
    assert first.lost_hours == pytest.approx(0.5) and first.lost_steps == 50  # 2.0 h - 1.5 h; 200 - 150
    assert second.lost_hours == 0.0 and second.lost_steps == 0
    costed = cost_job(led, {"g5.2xlarge": Price(0.5, 1.25, "t")}.get)
    data = job_json(costed)
    # 0.5 h x 2 nodes = 1.0 VM-h lost, at the spot price $0.5: $0.50
    assert (data["work_lost_hours"], data["work_lost_steps"], data["work_lost_cost"]) == (1.0, 50, 0.50)


def test_a_preemption_before_any_checkpoint_of_the_attempt_loses_since_what_it_resumed_from():
    cfg = cfg_with(attempt=2, state="running")
    events = [event(1, "started", 0), event(1, "checkpoint", 1.0, step=100), event(1, "completed", 1.0),
              event(2, "started", 1.25), event(2, "preemption-notice", 1.75, progress=140), event(2, "preempted", 1.75)]
    (_, second) = job_ledger(cfg.jobs[0], events, T0 + timedelta(hours=2)).attempts
    assert second.lost_hours == pytest.approx(0.5) and second.lost_steps == 40  # since its start; 140 - 100


def test_an_attempt_replaced_without_an_end_event_ends_where_the_next_began():
    cfg = cfg_with(attempt=2, state="running")
    led = job_ledger(cfg.jobs[0], [event(1, "started", 0), event(2, "started", 1.5)], T0 + timedelta(hours=2))
    assert [(a.outcome, a.hours) for a in led.attempts] == [("replaced", 1.5), ("running", 0.5)]
    assert led.changeover_hours == 0


def test_a_job_that_never_started_costs_nothing():
    cfg = cfg_with()
    rep = report(cfg, "s", cfg.jobs, {}, T0)
    (job,) = rep.json()["jobs"]
    assert (job["cost"], job["on_demand_cost"], job["savings_pct"], job["attempts"]) == (0.0, 0.0, None, [])


NAMES = st.sampled_from(["started", "preempted", "stopped", "completed", "failed", "checkpoint", "preemption-notice"])


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.integers(1, 4), st.integers(0, 1), NAMES, st.floats(0, 50, allow_nan=False),
                          st.sampled_from(["spot", "on-demand", ""])), max_size=25),
       st.floats(0, 60, allow_nan=False))
def test_any_events_give_a_finite_report(raw, now_h):
    cfg = cfg_with(attempt=4, state="running", nodes=2)
    events = [event(a, name, h, node=n, **({"capacity": cap, "nodes": 2} if name == "started" and cap else {})) for a, n, name, h, cap in raw]
    data = report(cfg, "s", cfg.jobs, {"j": events}, T0 + timedelta(hours=now_h)).json()
    text = json.dumps(data, allow_nan=False)  # raises on NaN/inf
    (job,) = json.loads(text)["jobs"]
    assert all(v is None or math.isfinite(v) for v in (job["cost"], job["on_demand_cost"], job["savings"], job["savings_pct"]))
    assert job["spot_hours"] >= 0 and job["on_demand_hours"] >= 0 and job["changeover_hours"] >= 0
    assert job["cost"] <= job["on_demand_cost"] + 0.01  # spot is cheaper here, so never more than on-demand
    assert abs(job["on_demand_cost"] - job["cost"] - job["savings"]) <= 0.011


@settings(max_examples=40, deadline=None)
@given(st.lists(st.tuples(st.integers(1, 4), NAMES, st.floats(0, 50, allow_nan=False)), max_size=15),
       st.lists(st.tuples(st.integers(1, 3), st.one_of(st.none(), st.floats(-5, 60, allow_nan=False))), max_size=3),
       st.sampled_from([None, "snapshot", "restore", "start"]), st.floats(0, 60, allow_nan=False))
def test_any_moves_give_a_finite_report(raw, stays, step, now_h):
    """Whatever the zone history (moves with or without a recorded start, one in progress) and the events."""
    zones = ["us-east-1a", "us-east-1b"]
    history = [{"zone": zones[i % 2], "lastAttempt": a} | ({"moveBegan": (T0 + timedelta(hours=b)).isoformat()} if b is not None else {})
               for i, (a, b) in enumerate(stays)]
    job = {"id": "j", "instanceType": "g5.2xlarge", "zone": zones[len(history) % 2], "command": "x", "attempt": 4,
           "state": "stopped" if step in ("snapshot", "restore") else "running", "zoneHistory": history}
    if step and (step in ("snapshot", "restore") or history):
        job["move"] = {"from": zones[len(history) % 2] if step in ("snapshot", "restore") else zones[(len(history) - 1) % 2],
                       "to": zones[(len(history) + 1) % 2] if step in ("snapshot", "restore") else zones[len(history) % 2], "step": step}
    cfg = validate({"cloud": "aws", "region": "us-east-1", "zones": zones, "prices": {"g5.2xlarge": {"spot": 0.5, "onDemand": 1.25}},
                    "jobs": [job]}, "f.yaml")
    events = [event(a, name, h) for a, name, h in raw]
    data = json.loads(json.dumps(report(cfg, "s", cfg.jobs, {"j": events}, T0 + timedelta(hours=now_h)).json(), allow_nan=False))
    (j,) = data["jobs"]
    assert len(j["moves"]) == len(history) + (step in ("snapshot", "restore"))
    for m in j["moves"]:
        assert m["changeover_hours"] is None or m["changeover_hours"] >= 0
        assert m["snapshot_storage_cost"] is None or m["snapshot_storage_cost"] >= 0
    assert data["total"]["snapshot_storage_cost"] >= 0 and data["total"]["move_changeover_hours"] >= 0


# ---- prices -----------------------------------------------------------------------------------


def test_stack_prices_win_over_the_table_and_ratio():
    cfg = validate({"cloud": "aws", "region": "us-east-1", "zones": ["us-east-1a"],
                    "prices": {"g5.4xlarge": {"spot": 0.5, "onDemand": 2.0}}}, "f.yaml")
    assert price_ratio(cfg, "g5.4xlarge") == 0.25
    assert price_ratio(cfg, "g5.2xlarge") == pytest.approx(0.51652 / 1.212)  # from the shipped table
    assert price_ratio(cfg, "g5.2xlarge", "us-west-2") == pytest.approx(0.41397 / 1.212)
    assert price_ratio(cfg, "p9.huge") is None


def test_shipped_table_entries_have_source_and_date():
    table = shipped_table()
    entries = [e for cloud in ("aws", "gcp") for by_type in table[cloud].values() for e in by_type.values()]
    assert len(entries) == 33  # (p5.48xlarge and p4d.24xlarge in us-east-1: the AWS example; 21 GCP us-central1 sizes)
    for e in entries:
        assert e["source"] and datetime.fromisoformat(e["date"]) and 0 < e["spot"] < e["onDemand"]
    snapshots = [e for regions in table["snapshotStorage"].values() for e in regions.values()]
    assert snapshots and all(e["source"] and datetime.fromisoformat(e["date"]) and e["perGbMonth"] > 0 for e in snapshots)


def test_shipped_table_prices_every_gcp_example_machine_type():
    """GCP stacks need no spotctl:prices and no credentials for the example machine types."""
    from tools.refresh_prices import example_types

    types, regions = example_types()["gcp"]
    assert types == {"a2-highgpu-1g", "a3-highgpu-8g", "g2-standard-8"} and regions == {"us-central1"}
    a2 = table_price("gcp", "us-central1", "a2-highgpu-1g")
    assert (a2.spot, a2.on_demand) == (1.92802, 3.673385)
    assert a2.source.startswith("shipped table, 2026-07-30: Cyclenerd/google-cloud-pricing-cost-calculator pricing.yml @fd66b26")
    assert "GPUs + vCPUs + memory + bundled Local SSD" in a2.source
    h100 = table_price("gcp", "us-central1", "a3-highgpu-8g")
    assert (h100.spot, h100.on_demand) == (50.609541, 88.49)  # the file's 50.6095408219178 and 88.4899999025753, rounded
    cfg = validate({"cloud": "gcp", "project": "p", "region": "us-central1", "zones": ["us-central1-a"]}, "f.yaml")
    assert price_ratio(cfg, "g2-standard-8") == pytest.approx(0.479872 / 0.853624)


def test_refresh_tool_reproduces_the_shipped_table(tmp_path):
    from tools.refresh_prices import main

    out = tmp_path / "prices.json"
    assert main(["--catalog", str(FIXTURES / "skypilot-aws-vms-excerpt.csv"), "--commit", "001367d2", "--date", "2026-11-22",
                 "--types", "g5.xlarge", "g5.2xlarge", "g5.4xlarge", "g5.8xlarge", "g6.2xlarge",
                 "--regions", "us-east-1", "us-east-2", "us-west-2", "--out", str(out),
                 "--gcp-pricing", str(FIXTURES / "gcp-pricing-excerpt.yml"), "--gcp-commit", "fd66b26"]) == 0
    # The AWS example's p5/p4d: us-east-1 rows of the catalog at a later commit (GpuInfo column left empty)
    assert main(["--catalog", str(FIXTURES / "skypilot-aws-vms-p-excerpt.csv"), "--commit", "27f67dd4", "--date", "2026-11-28",
                 "--types", "p4d.24xlarge", "p5.48xlarge", "--regions", "us-east-1", "--out", str(out)]) == 0
    assert json.loads(out.read_text()) == shipped_table()
    assert table_price("aws", "us-west-2", "g6.2xlarge").spot == 0.4541  # the zone without a spot price is skipped


def test_refresh_tool_with_only_a_gcp_file_fetches_nothing(tmp_path, monkeypatch, capsys):
    import urllib.request

    from tools.refresh_prices import main

    def no_network(*args, **kwargs):
        raise AssertionError(f"fetched {args[0]}")

    monkeypatch.setattr(urllib.request, "urlopen", no_network)
    out = tmp_path / "prices.json"
    out.write_text(json.dumps({"aws": {"us-east-1": {"g5.xlarge": {"kept": True}}}}))
    assert main(["--gcp-pricing", str(FIXTURES / "gcp-pricing-excerpt.yml"), "--gcp-commit", "fd66b26", "--out", str(out)]) == 0
    table = json.loads(out.read_text())
    assert table["gcp"] == shipped_table()["gcp"] and table["snapshotStorage"] == {"gcp": shipped_table()["snapshotStorage"]["gcp"]}
    assert table["aws"] == {"us-east-1": {"g5.xlarge": {"kept": True}}}  # AWS rows untouched
    assert capsys.readouterr().out.startswith(f"21 prices written to {out}\n")  # (the examples' families' sizes)


def test_refresh_tool_source_unreadable_is_one_error_line(tmp_path, capsys):
    """Offline (a refused connection on 127.0.0.1) or a missing file: one error: line, the table not written."""
    import socket

    from tools.refresh_prices import main

    with socket.socket() as sock:  # a port nothing listens on
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    out = tmp_path / "prices.json"
    url = f"https://127.0.0.1:{port}/vms.csv"
    assert main(["--catalog", url, "--out", str(out)]) == 1
    err = capsys.readouterr().err
    assert err.startswith(f"error: {url}: cannot download: ") and err.count("\n") == 1 and "Traceback" not in err
    assert main(["--gcp-pricing", str(tmp_path / "nope.yml"), "--out", str(out)]) == 1
    assert capsys.readouterr().err == f"error: {tmp_path / 'nope.yml'}: cannot read: No such file or directory\n"
    binary, text = tmp_path / "binary", tmp_path / "hostname"
    binary.write_bytes(b"\x7fELF\x02\xff\xfe")
    text.write_text("build-host\n")
    for flag, source, says in [("--catalog", binary, "not UTF-8 text"), ("--gcp-pricing", binary, "not UTF-8 text"),
                               ("--catalog", text, "not a catalog vms.csv"), ("--gcp-pricing", text, "not a pricing.yml")]:
        assert main([flag, str(source), "--out", str(out)]) == 1, (flag, source)
        err = capsys.readouterr().err
        assert err.startswith(f"error: {source}: {says}") and err.count("\n") == 1, err
    assert not out.exists()


def test_price_config_errors_name_the_key():
    from infra.config import ConfigError

    base = {"cloud": "aws", "region": "us-east-1", "zones": ["us-east-1a"]}
    for prices, message in [({"g5.2xlarge": {"spot": 1, "ondemand": 2}}, "spotctl:prices.g5.2xlarge.ondemand: unknown key (did you mean 'onDemand'?)"),
                            ({"g5.2xlarge": {"spot": "cheap", "onDemand": 2}}, "spotctl:prices.g5.2xlarge.spot: expected a price in USD per hour"),
                            ({"g5.2xlarge": {"spot": -1, "onDemand": 2}}, "spotctl:prices.g5.2xlarge.spot: expected a number >= 0"),
                            ({"g5.2xlarge": {"spot": 1}}, "spotctl:prices.g5.2xlarge.onDemand: required key is missing")]:
        with pytest.raises(ConfigError) as err:
            validate({**base, "prices": prices}, "f.yaml")
        assert message in str(err.value)


def test_aws_price_apis_moto_spot_history_and_price_list(monkeypatch):
    import boto3
    from botocore.stub import Stubber
    from moto import mock_aws

    from cli.cloud.aws import aws_prices

    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "testing")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "testing")
    product = {"product": {"attributes": {"instanceType": "g5.2xlarge"}},
               "terms": {"OnDemand": {"X.JRTCKXETXF": {"priceDimensions": {"X.JRTCKXETXF.6YS6EN2CT7": {"pricePerUnit": {"USD": "1.2120000000"}}}}}}}
    with mock_aws():
        pricing = boto3.client("pricing", region_name="us-east-1")
        stub = Stubber(pricing)
        stub.add_response("get_products", {"PriceList": [json.dumps(product)], "FormatVersion": "aws_v1"},
                          {"ServiceCode": "AmazonEC2", "MaxResults": 10, "Filters": [
                              {"Type": "TERM_MATCH", "Field": k, "Value": v} for k, v in [
                                  ("instanceType", "g5.2xlarge"), ("regionCode", "us-east-1"), ("operatingSystem", "Linux"),
                                  ("tenancy", "Shared"), ("preInstalledSw", "NA"), ("licenseModel", "No License required"),
                                  ("capacitystatus", "Used")]]})
        with stub:
            found = aws_prices("us-east-1", ["g5.2xlarge"], ec2=boto3.client("ec2", region_name="us-east-1"), pricing=pricing)
        stub.assert_no_pending_responses()
    spot, od, source = found["g5.2xlarge"]
    assert spot == pytest.approx(0.00001) and od == 1.212  # moto's spot history says 0.00001 in every zone
    assert "spot price history (mean of" in source and "Price List" in source


# ---- status gains the split --------------------------------------------------------------------


def test_status_shows_spot_and_on_demand_vm_hours(team, runner):
    result = runner.invoke(app, ["status", "vit", "--stack", "team-a", "--events-dir", "events", "--json"])
    assert result.exit_code == 0, result.output
    (row,) = json.loads(result.stdout)
    assert (row["spot_hours"], row["on_demand_hours"]) == (3.5, 0.6)
    result = runner.invoke(app, ["status", "vit", "--stack", "team-a", "--events-dir", "events"], env={"COLUMNS": "200"})
    header, row = result.stdout.splitlines()[:2]
    assert "spot VM-h" in header and "on-demand VM-h" in header
    assert " 3.5 " in row and " 0.6 " in row


# ---- GCP: Compute API machine types + the Cloud Billing Catalog, on a local endpoint ------------


def sku(desc, group, usage, price, regions=("us-central1",), family="Compute"):
    units, nanos = int(price), round((price - int(price)) * 1e9)
    return {"description": desc, "serviceRegions": list(regions),
            "category": {"resourceFamily": family, "resourceGroup": group, "usageType": usage},
            "pricingInfo": [{"pricingExpression": {"usageUnit": "h", "tieredRates": [
                {"startUsageAmount": 0, "unitPrice": {"currencyCode": "USD", "units": str(units), "nanos": nanos}}]}}]}


# A fixture in the catalog's documented shape (prices chosen for the test), with decoys that must not match.
SKUS_PAGE_1 = [
    sku("Commitment v1: A2 Cpu in Americas for 1 Year", "CPU", "Commit1Yr", 0.01),
    sku("A2 Instance Core running in EMEA", "CPU", "OnDemand", 0.9, regions=("europe-west4",)),
    sku("A2 Instance Core running in Americas", "CPU", "OnDemand", 0.031611),
    sku("A2 Instance Ram running in Americas", "RAM", "OnDemand", 0.004237),
    sku("Nvidia Tesla A100 80GB GPU running in Americas", "GPU", "OnDemand", 3.9),
    sku("Storage PD Capacity", "SSD", "OnDemand", 0.1, family="Storage"),
]
SKUS_PAGE_2 = [
    sku("Spot Preemptible A2 Instance Core running in Americas", "CPU", "Preemptible", 0.01264),
    sku("Spot Preemptible A2 Instance Ram running in Americas", "RAM", "Preemptible", 0.001695),
    sku("Nvidia Tesla A100 GPU running in Americas", "GPU", "OnDemand", 2.933908),
    sku("Nvidia Tesla A100 GPU attached to Spot Preemptible VMs running in Americas", "GPU", "Preemptible", 1.17356),
]


@pytest.fixture
def gcp_endpoint(monkeypatch):
    import threading
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

    seen = []

    class Handler(BaseHTTPRequestHandler):
        def log_message(self, *a):
            pass

        def do_GET(self):
            seen.append(self.path)
            if self.path.startswith("/compute/v1/projects/proj-1/zones/us-central1-a/machineTypes/a2-highgpu-2g"):
                doc = {"name": "a2-highgpu-2g", "guestCpus": 24, "memoryMb": 174080,
                       "accelerators": [{"guestAcceleratorType": "nvidia-tesla-a100", "guestAcceleratorCount": 2}]}
            elif self.path.startswith("/v1/services/6F81-5844-456A/skus"):
                doc = {"skus": SKUS_PAGE_2} if "pageToken=p2" in self.path else {"skus": SKUS_PAGE_1, "nextPageToken": "p2"}
            else:
                self.send_response(404)
                self.end_headers()
                return
            body = json.dumps(doc).encode()
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    url = f"http://127.0.0.1:{server.server_address[1]}"
    monkeypatch.setenv("SPOTCTL_GCE_ENDPOINT", url)
    monkeypatch.setenv("SPOTCTL_BILLING_ENDPOINT", url)
    yield seen
    server.shutdown()


def test_gcp_prices_from_the_billing_catalog(project, runner, gcp_endpoint, monkeypatch):
    import copy

    from cli.cost import prices

    table = copy.deepcopy(prices.shipped_table())
    del table["gcp"]["us-central1"]["a2-highgpu-2g"]  # (a type the shipped table lacks: the API prices it)
    monkeypatch.setattr(prices, "shipped_table", lambda: table)
    (project / "stacks" / "Pulumi.gteam.yaml").write_text("""\
config:
  spotctl:cloud: gcp
  spotctl:project: proj-1
  spotctl:region: us-central1
  spotctl:zones: [us-central1-a]
  spotctl:jobs:
    - {id: bert, machineType: a2-highgpu-2g, zone: us-central1-a, state: completed, command: python eval.py}
""")
    (project / "ev.jsonl").write_text("\n".join(json.dumps(e) for e in [
        started("bert", 1, 0, "10:00", "spot", "a2-highgpu-2g", 1), ev("bert", 1, 0, "completed", "12:00")]))
    result = runner.invoke(app, ["cost", "--stack", "gteam", "--events-dir", "ev.jsonl", "--json"])
    assert result.exit_code == 0, result.output
    (bert,) = no_nan(result.stdout)["jobs"]
    price = bert["prices"]["a2-highgpu-2g"]  # not in the shipped table (taken out above): the API is asked
    # on-demand 24 x 0.031611 + 170 GiB x 0.004237 + 2 x 2.933908; spot 24 x 0.01264 + 170 x 0.001695 + 2 x 1.17356
    assert price["on_demand"] == pytest.approx(7.34677) and price["spot"] == pytest.approx(2.93863)
    assert price["source"].startswith("GCP Cloud Billing Catalog")
    assert (bert["cost"], bert["on_demand_cost"], bert["savings"]) == (5.88, 14.69, 8.82)  # 2 h: 5.87726, 14.69354
    assert any("pageToken=p2" in p for p in gcp_endpoint)  # every page was read


# ---- zone moves (spotctl move), GCP prices from the shipped table -----------------------------

GCP_STACK = """\
config:
  spotctl:cloud: gcp
  spotctl:project: proj-1
  spotctl:region: us-central1
  spotctl:zones: [us-central1-a, us-central1-b, us-central1-c]
  spotctl:jobs:
    - id: llm
      machineType: a2-highgpu-1g
      nodes: 2
      diskGb: 500
      zone: us-central1-b
      attempt: 2
      state: running
      command: torchrun train.py
      zoneHistory: [{zone: us-central1-a, lastAttempt: 1}]
    - id: vit
      machineType: a2-highgpu-1g
      zone: us-central1-a
      state: stopped
      command: python finetune.py
      move: {from: us-central1-a, to: us-central1-c, step: restore, began: "2026-11-21T13:30:00Z"}
"""
GCP_EVENTS = [
    # llm, 2 nodes: spot in zone a 10:00-12:00, preempted; moved to b; spot again from 12:30, running at 14:30.
    started("llm", 1, 0, "10:00", "spot", "a2-highgpu-1g", 2), started("llm", 1, 1, "10:00", "spot", "a2-highgpu-1g", 2),
    ev("llm", 1, 0, "preempted", "12:00"),
    started("llm", 2, 0, "12:30", "spot", "a2-highgpu-1g", 2), started("llm", 2, 1, "12:30", "spot", "a2-highgpu-1g", 2),
    # vit, 1 node: spot 11:00-13:00, preempted; its move to zone c is at step restore at 14:30.
    started("vit", 1, 0, "11:00", "spot", "a2-highgpu-1g", 1), ev("vit", 1, 0, "preempted", "13:00"),
]


def test_zone_moves_and_gcp_prices_without_credentials(project, runner):
    (project / "stacks" / "Pulumi.gteam.yaml").write_text(GCP_STACK)
    (project / "ev.jsonl").write_text("\n".join(json.dumps(e) for e in GCP_EVENTS))
    args = ["cost", "--stack", "gteam", "--events-dir", "ev.jsonl", "--as-of", "2026-11-21T14:30:00Z"]
    result = runner.invoke(app, [*args, "--json"])
    assert result.exit_code == 0, result.output
    data = no_nan(result.stdout)
    llm, vit = data["jobs"]
    # a2-highgpu-1g us-central1 from the shipped table: spot $1.92802, on-demand $3.673385.
    # llm: 2 nodes x (2 h + 2 h) = 8 spot VM-h: 15.42416; all on-demand 29.38708; saved 13.96292 (47.5 %)
    assert (llm["cost"], llm["on_demand_cost"], llm["savings"], llm["savings_pct"]) == (15.42, 29.39, 13.96, 47.5)
    assert llm["prices"]["a2-highgpu-1g"]["source"].startswith("shipped table, 2026-07-30: Cyclenerd")
    # The move a -> b: changeover 12:00 -> 12:30; snapshots of 2 x 500 GB kept 12:00 -> 14:30 (2.5 h)
    # at $0.065/GB-month (730 h): 1000 x 0.065 x 2.5 / 730 = 0.2226027
    (move,) = llm["moves"]
    assert (move["from"], move["to"], move["after_attempt"], move["in_progress"]) == ("us-central1-a", "us-central1-b", 1, False)
    assert (move["changeover_hours"], move["snapshot_gb"], move["snapshot_hours"], move["snapshot_storage_cost"]) == (0.5, 1000, 2.5, 0.22)
    assert (llm["move_changeover_hours"], llm["snapshot_storage_cost"]) == (0.5, 0.22)
    # vit's move (began 13:30, recorded) is at step restore: its changeover runs until now (1.0 h);
    # 200 GB kept 1.0 h: 200 x 0.065 x 1.0 / 730 = 0.0178082
    (moving,) = vit["moves"]
    assert (moving["to"], moving["in_progress"], moving["end"], moving["changeover_hours"]) == ("us-central1-c", True, None, 1.0)
    assert (moving["start"], moving["snapshot_storage_cost"]) == ("2026-11-21T13:30:00+00:00", 0.02)
    # total: 2 moves, 1.5 h of changeovers, 0.2226027 + 0.0178082 = 0.2404109 -> $0.24 (not in cost)
    t = data["total"]
    assert (t["moves"], t["move_changeover_hours"], t["snapshot_storage_cost"]) == (2, 1.5, 0.24)
    assert t["cost"] == 19.28  # 15.42416 + vit's 2 h x 1.92802 = 3.85604: the snapshots are not in cost
    assert data["snapshot_price"]["per_gb_month"] == 0.065 and "us-multi" in data["snapshot_price"]["source"]
    result = runner.invoke(app, args, env={"COLUMNS": "150"})
    assert result.exit_code == 0, result.output
    assert ("move llm: us-central1-a -> us-central1-b after attempt 1: changeover 0.50 h; snapshots <= 1000 GB, "
            "kept 2.50 h: <= $0.22") in result.stdout
    assert "move vit: us-central1-a -> us-central1-c after attempt 1 (in progress): changeover 1.00 h" in result.stdout
    assert "moves: 1.50 h of changeovers; snapshot storage so far at most $0.24 (not in cost)" in result.stdout
    assert "price snapshot storage: $0.0650/GB-month — shipped table, 2026-07-30" in result.stdout
    result = runner.invoke(app, [*args, "--plot", "moves.png"])
    assert result.exit_code == 0, result.output
    assert (project / "moves.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_a_finished_move_measured_from_its_recorded_start():
    cfg = validate({"cloud": "aws", "region": "us-east-1", "zones": ["us-east-1a", "us-east-1b"],
                    "jobs": [{"id": "j", "instanceType": "g5.2xlarge", "zone": "us-east-1b", "attempt": 2, "state": "running",
                              "nodes": 2, "diskGb": 300, "command": "x",
                              "zoneHistory": [{"zone": "us-east-1a", "lastAttempt": 1, "moveBegan": "2026-11-21T09:30:00Z"}]}]}, "f.yaml")
    events = [event(1, "started", 0), event(1, "preempted", 1), event(2, "started", 2.25)]
    data = report(cfg, "s", cfg.jobs, {"j": events}, T0 + timedelta(hours=4.5)).json()
    (move,) = data["jobs"][0]["moves"]
    # began 09:30 (1.5 h after T0), the new attempt started 10:15: 0.75 h; snapshots 2 x 300 GB kept
    # 09:30 -> 12:30 (3 h) at EBS's $0.05/GB-month: 600 x 0.05 x 3 / 730 = 0.1232877
    assert (move["changeover_hours"], move["snapshot_hours"], move["snapshot_storage_cost"]) == (0.75, 3.0, 0.12)
    assert data["jobs"][0]["changeover_hours"] == 1.25  # the whole gap between the attempts, as before
    assert "docs.aws.amazon.com/ebs" in data["snapshot_price"]["source"]


def test_a_move_without_a_snapshot_price_is_named_not_guessed():
    cfg = validate({"cloud": "aws", "region": "us-west-2", "zones": ["us-west-2a", "us-west-2b"],
                    "jobs": [{"id": "j", "instanceType": "g5.2xlarge", "zone": "us-west-2b", "attempt": 2, "state": "running",
                              "command": "x", "zoneHistory": [{"zone": "us-west-2a", "lastAttempt": 1}]}]}, "f.yaml")
    events = [event(1, "started", 0), event(1, "preempted", 1), event(2, "started", 1.25)]
    data = report(cfg, "s", cfg.jobs, {"j": events}, T0 + timedelta(hours=2)).json()
    (job,) = data["jobs"]
    assert job["moves"][0]["changeover_hours"] == 0.25 and job["moves"][0]["snapshot_storage_cost"] is None
    assert job["snapshot_storage_cost"] is None and data["snapshot_price"] is None
    assert any(n.startswith("no snapshot storage price for aws us-west-2") for n in data["notes"])
    json.dumps(data, allow_nan=False)


def test_a_regional_disk_move_stores_no_snapshot():
    # A move between a regional disk's replica zones (sameDisk) reattaches the same disk: its
    # changeover counts, its snapshot storage is zero, not nodes x disk size.
    cfg = validate({"cloud": "gcp", "project": "p", "region": "us-central1",
                    "zones": ["us-central1-a", "us-central1-b"],
                    "jobs": [{"id": "j", "machineType": "n1-standard-8", "accelerator": {"type": "nvidia-tesla-t4", "count": 1},
                              "zone": "us-central1-b", "attempt": 2,
                              "state": "running", "diskGb": 300, "command": "x",
                              "diskReplicaZones": ["us-central1-a", "us-central1-b"],
                              "zoneHistory": [{"zone": "us-central1-a", "lastAttempt": 1, "sameDisk": True,
                                               "moveBegan": "2026-11-21T09:00:00Z"}]}]}, "f.yaml")
    events = [event(1, "started", 0), event(1, "preempted", 1), event(2, "started", 1.5)]
    data = report(cfg, "s", cfg.jobs, {"j": events}, T0 + timedelta(hours=3)).json()
    (move,) = data["jobs"][0]["moves"]
    assert move["changeover_hours"] == 0.5 and move["snapshot_gb"] == 0
    assert move["snapshot_storage_cost"] == 0.0 and data["total"]["snapshot_storage_cost"] == 0.0


def test_event_details_are_data_not_trusted():
    """A `started` event's nodes and capacity come from a VM: out-of-range values fall back to the stack file."""
    cfg = validate({"cloud": "aws", "region": "us-east-1", "zones": ["us-east-1a"],
                    "jobs": [{"id": "j", "instanceType": "g5.2xlarge", "zone": "us-east-1a", "state": "completed",
                              "nodes": 2, "command": "x"}]}, "f.yaml")
    events = [event(1, "started", 0, capacity="cheap", nodes="-4"), event(1, "completed", 3)]
    (job,) = report(cfg, "s", cfg.jobs, {"j": events}, T0 + timedelta(hours=4)).json()["jobs"]
    assert (job["spot_hours"], job["on_demand_hours"]) == (6.0, 0.0)  # 2 nodes (the file) x 3 h, on spot (the file)
    assert job["cost"] > 0


@pytest.mark.parametrize("price", [1.0e308, 10_000.01, -1])
def test_prices_are_bounded(price):
    with pytest.raises(ConfigError, match=r"spotctl:prices"):
        validate({"cloud": "aws", "region": "us-east-1", "zones": ["us-east-1a"], "jobs": [],
                  "prices": {"g5.2xlarge": {"spot": price, "onDemand": 1.0}}}, "f.yaml")


def test_cost_and_status_fold_a_jobs_state_alike(team, runner):
    """llm's file says running; its events say attempt 3 was preempted at 15:00: both commands say
    needs-resume after it, and running before it (--as-of)."""
    now = runner.invoke(app, ["cost", "llm", "--stack", "team-a", "--events-dir", "events", "--json"])
    assert now.exit_code == 0, now.output
    (llm,) = json.loads(now.stdout)["jobs"]
    (status,) = json.loads(runner.invoke(app, ["status", "llm", "--stack", "team-a", "--events-dir", "events", "--json"]).stdout)
    assert llm["state"] == status["status"] == "needs-resume" and llm["fileState"] == "running"
    text = runner.invoke(app, ["cost", "llm", "--stack", "team-a", "--events-dir", "events"], env={"COLUMNS": "150"}).stdout
    assert "needs-resume" in text and "│ running" not in text
    (before,) = cost_json(runner, "llm")["jobs"]
    assert before["state"] == "running"
