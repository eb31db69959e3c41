"""The live policy path on recorded event files: jobs without a deadline, measured changeovers and
progress, what `spotctl policy fit` learns from the stack and how `resume` uses it, `validate` warnings."""

from __future__ import annotations

import json
import math
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from cli.app import app
from cli.lifecycle.capacity import measure, observation_for, policy_capacity, read_learned
from cli.lifecycle.events import Event
from cli.lifecycle.stackfile import job_fields
from cli.policy.planning import pooled_regime, spot_cost_per_progress
from cli.policy.policies import Observation, make_policy
from infra.basics import scripts_digest
from infra.config import Capacity, Job

T0 = datetime(2026, 11, 21, 10, 0, tzinfo=UTC)

STACK = """config:
  spotctl:cloud: aws
  spotctl:region: us-east-1
  spotctl:zones: [us-east-1a, us-east-1b]
  spotctl:jobs:
    # open-ended: no jobHours, no deadlineHours
    - id: {job}
      instanceType: p3.2xlarge
      zone: us-east-1a
      capacity: spot
      attempt: {attempt}
      state: preempted
      command: python train.py
    - id: neighbour
      instanceType: p3.2xlarge
      zone: us-east-1a
      capacity: spot
      attempt: 1
      state: running
      command: python train.py
"""


def attempts(job: str, runs: list[tuple[float, float, float | None, str]]) -> list[dict]:
    """Event documents for attempts given as (start min, first progress min or None, end min, how it ended)."""
    docs = []
    for n, (a, first, b, how) in enumerate(runs, start=1):
        at = lambda m: (T0 + timedelta(minutes=m)).isoformat().replace("+00:00", "Z")  # noqa: E731
        docs.append({"job": job, "attempt": n, "node": 0, "event": "started", "time": at(a), "details": {"capacity": "spot"}})
        if first is not None:
            docs.append({"job": job, "attempt": n, "node": 0, "event": "progress", "time": at(first), "details": {}})
        docs.append({"job": job, "attempt": n, "node": 0, "event": how, "time": at(b), "details": {}})
    return docs


def write_stack(tmp_path: Path, job: str, runs) -> tuple[Path, Path]:
    stack = tmp_path / "stacks" / "Pulumi.team.yaml"
    stack.parent.mkdir(parents=True, exist_ok=True)
    stack.write_text(STACK.format(job=job, attempt=len(runs)))
    events = tmp_path / "events"
    events.mkdir(exist_ok=True)
    (events / f"{job}.jsonl").write_text("\n".join(json.dumps(d) for d in attempts(job, runs)) + "\n")
    return stack, events


def resume(runner, stack: Path, events: Path, job: str) -> dict:
    result = runner.invoke(app, ["resume", job, "--stack-file", str(stack), "--events-dir", str(events), "--no-apply", "--json"])
    assert result.exit_code == 0, result.output
    return json.loads(result.stdout)


# Changeover 15 min (started -> first progress); spot windows 6-10 min: each launch ends before it progresses.
SHORT = [(0, 15, 8, "preempted"), (30, 45, 36, "preempted"), (60, 75, 70, "preempted"), (100, 115, 106, "preempted")]
# Windows of 3-5 hours.
LONG = [(0, 12, 300, "preempted"), (330, 342, 510, "preempted"), (540, 552, 780, "preempted")]


def test_no_deadline_and_windows_shorter_than_the_changeover_moves_to_on_demand(runner, tmp_path):
    stack, events = write_stack(tmp_path, "loop", SHORT)
    before = stack.read_text()
    out = resume(runner, stack, events, "loop")
    assert out["fields"] == {"attempt": 5, "state": "running", "capacity": "on-demand"}
    assert before.replace("capacity: spot\n      attempt: 4\n      state: preempted",
                          "capacity: on-demand\n      attempt: 5\n      state: running") == stack.read_text().replace(
                              f"\n      scriptsDigest: {scripts_digest()}", "")  # (the scripts attempt 5 starts with)


def test_no_deadline_and_windows_of_hours_stays_on_spot(runner, tmp_path):
    stack, events = write_stack(tmp_path, "calm", LONG)
    out = resume(runner, stack, events, "calm")
    assert out["fields"] == {"attempt": 4, "state": "running"}  # capacity stays spot
    assert job_fields(stack, "calm", ["capacity", "state"]) == {"capacity": "spot", "state": "running"}


def test_n_preemptions_works_without_a_deadline():
    events = [Event.parse(d) for d in attempts("j", LONG)]
    job = Job.model_validate({"id": "j", "instanceType": "p3.2xlarge", "zone": "us-east-1a", "command": "x", "policy": "n-preemptions",
                              "state": "preempted", "attempt": 3})
    choose = policy_capacity(now=lambda: T0 + timedelta(hours=14))
    assert choose(job, events) is Capacity.ON_DEMAND  # 3 preemptions
    assert choose(job, events[:4]) is Capacity.SPOT  # 2 so far


def test_changeover_and_progress_are_measured_from_the_jobs_own_attempts():
    m = measure([Event.parse(d) for d in attempts("j", LONG)], T0 + timedelta(hours=14))
    assert m.changeover_h == pytest.approx(0.2) and m.measured_changeovers == 3
    assert m.progress_h == pytest.approx((300 + 180 + 240 - 3 * 12) / 60)
    assert m.windows_h == pytest.approx((5.0, 3.0, 4.0))
    # Without progress events: the default changeover is subtracted; a running spot attempt is an open window.
    docs = [d for d in attempts("j", [(0, None, 120, "preempted"), (150, None, 200, "stopped")]) if d["event"] != "stopped"]
    m = measure([Event.parse(d) for d in docs], T0 + timedelta(minutes=210))
    assert m.measured_changeovers == 0 and m.censored_h == pytest.approx((1.0,))
    assert m.progress_h == pytest.approx(2.0 - 0.2 + 1.0 - 0.2)
    obs, _ = observation_for(Job.model_validate({"id": "j", "instanceType": "p3.2xlarge", "zone": "us-east-1a", "command": "x",
                                                 "deadlineHours": 50}), [Event.parse(d) for d in docs], T0 + timedelta(minutes=210))
    assert math.isinf(obs.deadline_h) and math.isinf(obs.job_h)  # a deadline without jobHours cannot be weighed


def test_open_ended_cost_per_progress_overrides_the_prior_with_evidence():
    prior = pooled_regime()
    k = 3.0
    assert spot_cost_per_progress([], [], 0.2, prior) < k  # nothing seen yet: the prior says spot pays
    assert spot_cost_per_progress([0.1], [], 0.25, prior) < k  # one short window is not a pattern
    assert spot_cost_per_progress([0.1] * 5, [], 0.25, prior) > k  # five are
    assert spot_cost_per_progress([4.0, 5.0], [], 0.25, prior) < 1.2


@pytest.mark.parametrize("minutes,preemptions", [(0, 4), (1, 4), (2, 6), (1, 10)])
def test_no_deadline_and_windows_of_a_minute_or_two_move_to_on_demand(runner, tmp_path, minutes, preemptions):
    """The policy example with windows far shorter than the (default, unmeasured) 0.2 h changeover:
    launches that end at once make no progress and cost at least their changeover, never nothing."""
    runs = [(30 * i, None, 30 * i + minutes, "preempted") for i in range(preemptions)]
    stack, events = write_stack(tmp_path, "loop", runs)
    assert resume(runner, stack, events, "loop")["fields"] == {"attempt": preemptions + 1, "state": "running", "capacity": "on-demand"}


@settings(max_examples=300, deadline=None)
@given(st.lists(st.tuples(st.floats(0, 6), st.floats(0, 3)), min_size=1, max_size=8),
       st.floats(0.01, 0.5), st.sampled_from([math.inf, 5.0, 50.0]))
def test_open_ended_cost_per_progress_never_falls_as_windows_get_shorter(pairs, changeover, work):
    """Monotone: lengthening any window never makes spot dearer per hour of progress."""
    prior = pooled_regime()
    shorter = [w for w, _ in pairs]
    longer = [w + extra for w, extra in pairs]
    a = spot_cost_per_progress(shorter, [], changeover, prior, work_h=work)
    b = spot_cost_per_progress(longer, [], changeover, prior, work_h=work)
    assert a >= b * (1 - 1e-9), (shorter, longer, a, b)


def test_open_ended_default_leaves_on_demand_only_after_a_quiet_spell():
    tick = 0.05
    obs = lambda t, cur, up: Observation(t * tick, 0.0, math.inf, math.inf, 0.2, 3.0, cur, up, 8, tick)  # noqa: E731
    policy = make_policy("default", windows=[0.05] * 8)
    assert policy.decide(obs(0, "idle", True)) == "on-demand"
    # A flickering zone (up 15 min, down 3 min) never lures it back: no loop.
    flicker = [t % 6 != 5 for t in range(1, 200)]
    assert {policy.decide(obs(t, "on-demand", up)) for t, up in enumerate(flicker, start=1)} == {"on-demand"}
    # A zone that recovered (spot up for over an hour) does.
    calm = [policy.decide(obs(t, "on-demand", True)) for t in range(200, 240)]
    assert calm[:14] == ["on-demand"] * 14 and calm[-1] == "spot"


def test_policy_fit_learns_from_the_stack_and_resume_reads_it(runner, tmp_path):
    stack, events = write_stack(tmp_path, "loop", SHORT[:1])  # the job itself saw one short window only
    (events / "neighbour.jsonl").write_text("\n".join(json.dumps(d) for d in attempts("neighbour", [
        (r[0] + 200, r[1] + 200, r[2] + 200, r[3]) for r in SHORT])) + "\n")
    result = runner.invoke(app, ["policy", "fit", "--stack-file", str(stack), "--events-dir", str(events), "--json"])
    assert result.exit_code == 0, result.output
    doc = json.loads(result.stdout)
    path = tmp_path / "stacks" / ".spotctl" / "team.policy.json"
    assert doc["path"] == str(path) and read_learned(path)["pools"] == doc["pools"]
    pool = doc["pools"]["us-east-1a/p3.2xlarge"]
    assert pool["spot_windows"] == 5 and pool["changeover_h"] == pytest.approx(0.25)
    assert pool["up_rate"][0] > pooled_regime().up_rate[0]  # windows end fast here
    # What the neighbour saw in this zone moves this job to on-demand after its first short window.
    assert resume(runner, stack, events, "loop")["fields"]["capacity"] == "on-demand"
    path.unlink()
    assert "capacity" not in resume(runner, stack, events, "loop")["fields"]  # alone, one window is no pattern: spot


def test_policy_fit_needs_events_and_a_damaged_file_teaches_nothing(runner, tmp_path):
    stack, events = write_stack(tmp_path, "loop", SHORT[:1])
    result = runner.invoke(app, ["policy", "fit", "--stack-file", str(stack)])
    assert result.exit_code == 1 and "--events-dir" in result.output and not (tmp_path / "stacks" / ".spotctl" / "team.policy.json").exists()
    path = tmp_path / "stacks" / ".spotctl" / "team.policy.json"
    path.parent.mkdir(exist_ok=True)  # (the stack was read: its index is there)
    path.write_text('{"version": 1, "pools": {"us-east-1a/p3.2xlarge": {"up_rate": "x", "jobs": 3}}}')
    assert "capacity" not in resume(runner, stack, events, "loop")["fields"]  # spot, as without the file


def test_validate_warns_when_a_policy_has_nothing_to_weigh_and_still_passes(runner, tmp_path):
    stack, _ = write_stack(tmp_path, "loop", SHORT)
    text = stack.read_text()
    stack.write_text(text.replace("      command: python train.py\n    - id: neighbour",
                                  "      command: python train.py\n      policy: uniform-progress\n    - id: neighbour", 1)
                     .replace("      state: running\n", "      state: running\n      deadlineHours: 30\n"))
    result = runner.invoke(app, ["validate", "--stack-file", str(stack)])
    assert result.exit_code == 0, result.output
    assert result.stdout == f"{stack}: ok (aws, 0 pools, 2 jobs)\n"
    assert result.stderr.splitlines() == [
        f"warning: {stack}: spotctl:jobs[0].policy: 'uniform-progress' weighs a deadline, but job loop has no deadlineHours: "
        "it will stay on spot however often it is preempted (set jobHours and deadlineHours, or use 'default' or 'n-preemptions')",
        f"warning: {stack}: spotctl:jobs[1].deadlineHours: job neighbour has no jobHours, so its deadline cannot be weighed "
        "('default' decides without it)",
        *no_code_warnings(stack),
    ]
    stack.write_text(text)  # default without a deadline: cost per hour of progress, nothing to warn about
    result = runner.invoke(app, ["validate", "--stack-file", str(stack)])
    assert result.exit_code == 0 and result.stderr.splitlines() == no_code_warnings(stack)  # (only that they have no code:)


def no_code_warnings(stack) -> list[str]:
    """What validate warns of these jobs whatever their policy: no code:, and p3.2xlarge (a family the catalog lacks)."""
    jobs = list(enumerate(("loop", "neighbour")))
    return [*(f"warning: {stack}: spotctl:jobs[{i}].command: job {job} runs 'train.py', a relative file, but has no code: the "
              "command runs in the empty job disk. Add code: ./ (or {dir: PATH}, {git: URL, ref: REF}); docs/guides/code.md"
              for i, job in jobs),
            *(f"warning: {stack}: spotctl:jobs[{i}].instanceType: job {job}: 'p3.2xlarge' is not in spotctl's catalog: not "
              "checked (GPUs, regions) and not priced unless spotctl:prices has it; did you mean 't3.2xlarge' or 'r3.2xlarge' "
              "or 'm3.2xlarge'?" for i, job in jobs)]


def test_resume_weighs_the_stacks_prices(runner, tmp_path):
    """One short window: at the shipped ratio (3x) spot still pays; when on-demand costs only 1.3x spot, it does not."""
    stack, events = write_stack(tmp_path, "loop", SHORT[:1])
    assert "capacity" not in resume(runner, stack, events, "loop")["fields"]
    stack, events = write_stack(tmp_path, "loop", SHORT[:1])
    stack.write_text(stack.read_text().replace("  spotctl:jobs:", "  spotctl:prices:\n    p3.2xlarge: {spot: 1.0, onDemand: 1.3}\n  spotctl:jobs:"))
    assert resume(runner, stack, events, "loop")["fields"]["capacity"] == "on-demand"


# ---- `spotctl watch` chooses as `resume` does: the job's whole history, the stack's learning and prices ----


def watch_resume(runner, stack: Path, events: Path) -> dict:
    """`watch --once --no-apply` over a stack whose job still says running: its resume record."""
    stack.write_text(stack.read_text().replace("state: preempted", "state: running", 1))
    result = runner.invoke(app, ["watch", "--stack-file", str(stack), "--once", "--json", "--no-poll", "--no-apply",
                                 "--events-dir", str(events)])
    records = [json.loads(line) for line in result.stdout.splitlines() if line.startswith("{")]
    resumed = [r for r in records if r["action"] == "resume" and r["job"] == "loop"]
    assert len(resumed) == 1 and resumed[0]["result"] == "written", result.output
    return resumed[0]


@pytest.mark.parametrize("policy", ["default", "n-preemptions"])
def test_watch_chooses_the_capacity_resume_chooses_on_the_same_history(runner, tmp_path, policy):
    """Four short windows: `resume` goes on-demand (test above), and so does the watcher, which must
    see every attempt's events (not only the current attempt's end) and count the preemptions."""
    def stack_of(where: Path, runs) -> tuple[Path, Path]:
        stack, events = write_stack(where, "loop", runs)
        if policy != "default":
            stack.write_text(stack.read_text().replace("state: preempted", f"state: preempted\n      policy: {policy}", 1))
        return stack, events

    by_resume = resume(runner, *stack_of(tmp_path / "r", SHORT), "loop")["fields"]
    by_watch = watch_resume(runner, *stack_of(tmp_path / "w", SHORT))["fields"]
    assert by_resume == by_watch == {"attempt": 5, "state": "running", "capacity": "on-demand"}
    if policy != "default":  # (three preemptions of hours are on-demand for n-preemptions)
        return
    # The same holds where spot pays (windows of hours): both keep spot.
    assert resume(runner, *stack_of(tmp_path / "r2", LONG), "loop")["fields"] == {"attempt": 4, "state": "running"}
    assert watch_resume(runner, *stack_of(tmp_path / "w2", LONG))["fields"] == {"attempt": 4, "state": "running"}


def test_watch_weighs_the_stacks_prices_and_learning_as_resume_does(runner, tmp_path):
    """One short window: spot at the shipped 3x; on-demand at the stack's 1.3x, or once `policy fit`
    learned the neighbour's short windows in this zone, in `watch` as in `resume`."""
    stack, events = write_stack(tmp_path / "p", "loop", SHORT[:1])
    stack.write_text(stack.read_text().replace("  spotctl:jobs:", "  spotctl:prices:\n    p3.2xlarge: {spot: 1.0, onDemand: 1.3}\n  spotctl:jobs:"))
    assert watch_resume(runner, stack, events)["fields"]["capacity"] == "on-demand"
    stack, events = write_stack(tmp_path / "l", "loop", SHORT[:1])
    (events / "neighbour.jsonl").write_text("\n".join(json.dumps(d) for d in attempts("neighbour", [
        (r[0] + 200, r[1] + 200, r[2] + 200, r[3]) for r in SHORT])) + "\n")
    result = runner.invoke(app, ["policy", "fit", "--stack-file", str(stack), "--events-dir", str(events)])
    assert result.exit_code == 0, result.output
    assert watch_resume(runner, stack, events)["fields"]["capacity"] == "on-demand"


def test_policy_fit_with_only_the_stack_finds_the_events_in_its_event_bucket_output(project, runner, fake_pulumi,
                                                                                  moto_server, monkeypatch):
    """`spotctl policy fit --stack NAME` refits from the stack's event history: given neither
    option, the events are in the stack's eventBucket output (asked of pulumi)."""
    import boto3

    s3 = boto3.client("s3", region_name="us-east-1")
    s3.create_bucket(Bucket="team-events")
    for k, doc in enumerate(attempts("loop", SHORT)):
        s3.put_object(Bucket="team-events", Key=f"team/loop/attempt-{doc['attempt']}/node-0/{k}-{doc['event']}.json",
                      Body=json.dumps({**doc, "stack": "team"}).encode())
    (project / "stacks" / "Pulumi.team.yaml").write_text(STACK.format(job="loop", attempt=len(SHORT)))
    monkeypatch.setenv("FAKE_PULUMI_OUTPUTS", json.dumps({"eventBucket": "team-events"}))
    result = runner.invoke(app, ["policy", "fit", "--stack", "team"])
    assert result.exit_code == 0, result.output
    assert result.stdout.splitlines()[:3] == [
        "events from bucket team-events (the stack's eventBucket output)", "wrote stacks/.spotctl/team.policy.json",
        "  us-east-1a/p3.2xlarge: 4 spot windows (0 open), expected window "
        + result.stdout.splitlines()[2].split("expected window ")[1]]
    monkeypatch.setenv("FAKE_PULUMI_OUTPUTS", "{}")  # not deployed: nothing to read, said so
    nothing = runner.invoke(app, ["policy", "fit", "--stack", "team"])
    assert nothing.exit_code == 1 and nothing.stderr.startswith("error: policy fit: no events source found for stack team")


# ---- windows are evidence about the zone and machine type they ran in ---------------------------------

MOVED = "zone: us-east-1b\n      zoneHistory: [{zone: us-east-1a, lastAttempt: 4}]\n      capacity: spot\n      attempt: {attempt}"


def moved(stack: Path, attempt: int) -> None:
    """The job's first four attempts ran in us-east-1a; it has moved to us-east-1b since."""
    text = stack.read_text()
    before = f"zone: us-east-1a\n      capacity: spot\n      attempt: {attempt}"
    assert before in text
    stack.write_text(text.replace(before, MOVED.replace("{attempt}", str(attempt)), 1))


def test_policy_fit_pools_each_window_under_the_zone_and_machine_type_it_ran_in(runner, tmp_path):
    stack, events = write_stack(tmp_path, "loop", SHORT)
    moved(stack, 4)
    docs = attempts("neighbour", [(r[0] + 200, r[1] + 200, r[2] + 200, r[3]) for r in SHORT[:2]])
    for d in docs:  # the neighbour's VMs were p3.8xlarge then (its `started` events say so)
        if d["event"] == "started":
            d["details"]["machineType"] = "p3.8xlarge"
    (events / "neighbour.jsonl").write_text("\n".join(json.dumps(d) for d in docs) + "\n")
    result = runner.invoke(app, ["policy", "fit", "--stack-file", str(stack), "--events-dir", str(events), "--json"])
    assert result.exit_code == 0, result.output
    pools = json.loads(result.stdout)["pools"]
    assert {k: (v["spot_windows"], sorted(v["jobs"])) for k, v in pools.items()} == {
        "us-east-1a/p3.2xlarge": (4, ["loop", "neighbour"]),  # where loop's windows ran, not where it is now
        "us-east-1b/p3.2xlarge": (0, ["loop"]),
        "us-east-1a/p3.8xlarge": (2, ["neighbour"]),  # the machine type its VMs ran on
    }


def test_resume_weighs_only_the_windows_seen_in_the_jobs_zone_now(runner, tmp_path):
    """Four short windows in us-east-1a, then one of 30 minutes in us-east-1b, where the job is now:
    us-east-1a's windows say nothing about us-east-1b, so spot (the same history in one zone: on-demand)."""
    runs = [*SHORT, (130, 145, 160, "preempted")]
    stack, events = write_stack(tmp_path / "one", "loop", runs)
    assert resume(runner, stack, events, "loop")["fields"]["capacity"] == "on-demand"
    stack, events = write_stack(tmp_path / "moved", "loop", runs)
    moved(stack, 5)
    assert resume(runner, stack, events, "loop")["fields"] == {"attempt": 6, "state": "running"}


def test_the_availability_replayed_with_a_deadline_is_the_zones_the_job_is_in():
    """With a deadline the policy replays the availability the job saw: in its zone now, not before its move."""
    docs = attempts("j", [(0, 10, 120, "preempted"), (150, 160, 270, "preempted"), (400, 410, 460, "preempted")])
    job = Job.model_validate({"id": "j", "instanceType": "p3.2xlarge", "zone": "us-east-1b", "command": "x", "jobHours": 20,
                              "deadlineHours": 40, "state": "preempted", "attempt": 3,
                              "zoneHistory": [{"zone": "us-east-1a", "lastAttempt": 2}]})
    obs, replay = observation_for(job, [Event.parse(d) for d in docs], T0 + timedelta(minutes=520))
    assert obs.elapsed_h == pytest.approx(520 / 60) and obs.preemptions == 3  # the job's whole history
    assert replay == [True] * 6 + [False] * 6  # us-east-1b: up 400-460, down since (10-minute ticks)


def test_an_earlier_job_of_the_same_id_is_not_this_ones_history(runner, tmp_path):
    """spotctl:retiredJobs: the four short windows of the retired `loop` (attempts 1-4) are not the new
    job's: it saw one window of hours, so it stays on spot (in resume as in watch and policy fit)."""
    stack, events = write_stack(tmp_path, "loop", SHORT)
    text = stack.read_text().replace("attempt: 4", "attempt: 5").replace("  spotctl:jobs:", "  spotctl:retiredJobs: {loop: 4}\n  spotctl:jobs:")
    stack.write_text(text)
    new = attempts("loop", [(500, 512, 700, "preempted")])
    with (events / "loop.jsonl").open("a") as fh:
        fh.write("\n".join(json.dumps({**d, "attempt": 5}) for d in new) + "\n")
    assert "capacity" not in resume(runner, stack, events, "loop")["fields"]
    fitted = runner.invoke(app, ["policy", "fit", "--stack-file", str(stack), "--events-dir", str(events), "--json"])
    assert fitted.exit_code == 0, fitted.output
    assert json.loads(fitted.stdout)["pools"]["us-east-1a/p3.2xlarge"]["spot_windows"] == 1  # the new job's one
