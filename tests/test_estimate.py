"""The cost preview: each $/h checked by hand against the shipped tables (cli/cost/prices.json,
cli/cost/always_on.json) for one stack per cloud, the expected cost against `spotctl simulate` on the
same trace, the zone's recorded history preferred, and a table that fits 80 columns without cutting money."""

from __future__ import annotations

import json
import re
from pathlib import Path

from cli.app import app
from cli.lifecycle import estimate, stackfile


def plan_cost(runner, stack: str) -> dict:
    result = runner.invoke(app, ["plan", "--stack", stack, "--json"])
    assert result.exit_code == 0, result.output
    return json.loads(result.output)["cost"]


def part(cost: dict, name: str) -> dict:
    return next(r for r in cost["jobs"] + cost["always_on"] if r["part"] == name)


def test_gcp_per_hour_by_hand(project, runner):
    cost = plan_cost(runner, "example-gcp")
    # prices.json gcp/us-central1: a2-highgpu-1g spot 1.92802, onDemand 3.673385 (vit-finetune: 1 node, on-demand)
    vit = part(cost, "job vit-finetune")
    assert (vit["spot"], vit["on_demand"], vit["capacity"], vit["per_h"]) == (1.928, 3.6734, "on-demand", 3.6734)
    # a3-highgpu-8g spot 50.609541, onDemand 88.49, two nodes, on spot
    llm = part(cost, "job llm-pretrain")
    assert (llm["spot"], llm["on_demand"], llm["per_h"]) == (101.2191, 176.98, 101.2191)
    # pool l4: onDemand 1 x g2-standard-8 (0.853624); Cloud NAT $0.0014 per VM-hour x (2 + 1 job nodes + 1 pool VM)
    assert part(cost, "pool l4")["per_h"] == 0.8536
    assert part(cost, "Cloud NAT")["per_h"] == 0.0056 and part(cost, "Cloud NAT")["detail"] == "4 VMs"
    assert part(cost, "job bert-eval")["runs"] is False  # completed: no VMs, not in the total
    assert cost["total_per_h"] == round(101.2191 + 3.6734 + 0.8536 + 0.0056, 4)
    assert cost["price_table_date"] == "2026-07-30" and cost["unpriced"] == []


def test_aws_per_hour_by_hand(project, runner):
    cost = plan_cost(runner, "example-aws")
    # prices.json aws/us-east-1/g5.2xlarge: spot 0.51652, onDemand 1.212 (sweep-07 runs on-demand)
    sweep = part(cost, "job sweep-07")
    assert (sweep["spot"], sweep["on_demand"], sweep["per_h"]) == (0.5165, 1.212, 1.212)
    assert part(cost, "pool g5")["per_h"] == 2.424  # onDemand: 2 x g5.2xlarge
    # always_on.json: interface endpoints $0.01 per endpoint-zone hour; Auto Scaling (the stack has a pool) x 3 zones
    assert part(cost, "endpoints")["per_h"] == 0.03 and part(cost, "endpoints")["detail"] == "autoscaling x 3 zones"
    # p5.48xlarge: on-demand 98.32, spot 27.09483 (the mean of its six us-east-1 zones), two nodes, on spot
    assert part(cost, "job llm-pretrain")["per_h"] == 54.1897
    assert cost["total_per_h"] == round(54.1897 + 1.212 + 2.424 + 0.03, 4) and cost["unpriced"] == []


def write_trace(root: Path) -> Path:
    """The development trace where an older spotctl looked for it (``$SPOTCTL_TRACES``): spot up 3 h,
    down 1 h, repeating. The preview must not use it."""
    path = root / "availability" / "1-node" / "aws-10-26-2022" / "us-west-2a_v100_1.json"
    path.parent.mkdir(parents=True)
    data = ([1] * 18 + [0] * 6) * 60
    path.write_text(json.dumps({"metadata": {"gap_seconds": 600}, "data": data}))
    return path


def test_expected_cost_is_what_simulate_says_on_the_shipped_regimes_trace(project, runner, tmp_path, monkeypatch):
    from cli.policy.planning import pooled_regime

    write_trace(tmp_path / "traces")  # a trace file on this machine changes nothing
    monkeypatch.setenv("SPOTCTL_TRACES", str(tmp_path / "traces"))
    job_file = tmp_path / "job.yaml"
    job_file.write_text("id: sweep-09\nmachineType: g2-standard-8\naccelerator: {type: nvidia-l4, count: 1}\n"
                        "command: python train.py\njobHours: 6\ndeadlineHours: 12\npolicy: uniform-progress\n")
    result = runner.invoke(app, ["launch", str(job_file), "--stack", "example-gcp", "--no-apply", "--json"])
    assert result.exit_code == 0, result.output
    (exp,) = json.loads(result.stdout)["cost"]["expected"]
    assert exp["basis"] == "a trace sampled from the shipped regimes (no history recorded in us-central1-a)"
    text = runner.invoke(app, ["plan", "--stack", "example-gcp", "--expected"], env={"COLUMNS": "200"}).output
    assert "development trace" not in text and str(tmp_path / "traces") not in text
    # g2-standard-8: spot 0.479872 -> 0.4799, onDemand 0.853624 -> 0.8536 (rounded to 1/100 cent per hour)
    assert exp["spot_per_h"] == 0.4799 and exp["price_ratio"] == 0.8536 / 0.4799
    from cli.policy import simulate as sim

    # simulate's own replay (what `spotctl simulate --json` reports) on the trace the preview samples
    sampled = estimate.sample_trace(pooled_regime(), 12)
    (row,) = sim.evaluate([sampled], ["uniform-progress"], sim.Job(6, 12, 0.2, exp["price_ratio"]), exp["starts"], 0,
                          with_optimum=False)
    all_on_demand = (6 + 0.2) * exp["price_ratio"] * 0.4799  # USD: what the normalised cost is a fraction of
    assert abs(exp["mean"] - row.mean_norm_cost * all_on_demand) < 1e-9
    assert exp["low"] <= exp["mean"] <= exp["high"]


def test_the_zones_recorded_history_comes_first(project, runner, tmp_path, monkeypatch):
    write_trace(tmp_path / "traces")
    monkeypatch.setenv("SPOTCTL_TRACES", str(tmp_path / "traces"))
    learned = project / "stacks" / ".spotctl" / "example-gcp.policy.json"
    learned.parent.mkdir(exist_ok=True)
    learned.write_text(json.dumps({"version": 1, "pools": {"us-central1-a/g2-standard-8": {
        "spot_windows": 4, "changeover_h": 0.3, "up_rate": [0.5] * 7, "down_rate": [2.0] * 7}}}))
    cfg = stackfile.load(stackfile.resolve("example-gcp", None))
    job = cfg.jobs[0].model_copy(update={"id": "sweep-09", "machine_type": "g2-standard-8", "job_hours": 4.0,
                                         "deadline_hours": 10.0, "policy": "uniform-progress", "nodes": 1})
    from cli.lifecycle.capacity import read_learned

    found = estimate.expected_cost(cfg, job, dict(read_learned(learned)))
    assert found.basis.startswith("a trace sampled from us-central1-a's recorded history (4 spot windows")
    assert found.changeover_hours == 0.3
    again = estimate.expected_cost(cfg, job, dict(read_learned(learned)))
    assert again == found  # seeded: the same preview twice


def test_the_table_fits_80_columns_and_never_cuts_money(project):
    cfg = stackfile.load(stackfile.resolve("example-gcp", None))
    doc = estimate.preview(cfg, list(cfg.jobs))
    for width in (80, 60, 40):
        lines = estimate.render(doc, width)
        text = "\n".join(lines)
        assert all(len(line) <= width for line in text.splitlines()), width
        figures = {estimate.money(r[k]) for r in doc["jobs"] + doc["always_on"] for k in ("spot", "on_demand") if r[k] is not None}
        assert figures <= set(re.findall(r"\$[\d,.]+", text)), width


def test_failover_shows_the_jobs_new_cost_before_the_question(project, runner, fake_pulumi, tmp_path, monkeypatch):
    from cli import commands

    monkeypatch.setattr(commands, "interactive", lambda: True)
    write_trace(tmp_path / "traces")
    monkeypatch.setenv("SPOTCTL_TRACES", str(tmp_path / "traces"))
    result = runner.invoke(app, ["failover", "vit-finetune", "--to", "spot", "--stack", "example-gcp"], input="n\n",
                           env={"COLUMNS": "80"})
    assert result.exit_code == 0, result.output
    out = result.output
    row = next(line for line in out.splitlines() if line.startswith("job vit-finetune"))
    assert row.split()[-3:] == ["$1.93", "$3.67", "spot"]  # its new capacity, as the edited file has it
    assert out.index("job vit-finetune, policy uniform-progress: expected $") < out.index("Do you want to perform this update")
    assert result.stdout.endswith("not confirmed: nothing changed\n")
    data = json.loads(runner.invoke(app, ["failover", "vit-finetune", "--to", "spot", "--stack", "example-gcp", "--no-apply",
                                          "--json"]).stdout)
    (vit,) = data["cost"]["jobs"]
    assert (vit["capacity"], vit["per_h"]) == ("spot", 1.928) and data["cost"]["expected"] == []


def test_plan_expected_replays_each_running_job_with_hours(project, runner, tmp_path, monkeypatch):
    write_trace(tmp_path / "traces")
    monkeypatch.setenv("SPOTCTL_TRACES", str(tmp_path / "traces"))
    path = project / "stacks" / "Pulumi.example-aws.yaml"
    path.write_text(path.read_text().replace("    - id: sweep-07\n", "    - id: sweep-07\n      jobHours: 2\n      deadlineHours: 6\n"
                                             "      policy: uniform-progress\n"))
    assert plan_cost(runner, "example-aws")["expected"] == []  # plain plan: $/h only
    result = runner.invoke(app, ["plan", "--stack", "example-aws", "--expected", "--json"])
    assert result.exit_code == 0, result.output
    found = {e["job"]: e for e in json.loads(result.output)["cost"]["expected"]}
    assert sorted(found) == ["llm-pretrain", "sweep-07"]  # diffusion has no VMs (preempted)
    exp = found["sweep-07"]
    assert (exp["job"], exp["policy"], exp["job_hours"], exp["deadline_hours"]) == ("sweep-07", "uniform-progress", 2, 6)
    assert exp["spot_per_h"] == 0.5165 and exp["low"] <= exp["mean"] <= exp["high"]
    text = runner.invoke(app, ["plan", "--stack", "example-aws", "--expected"], env={"COLUMNS": "80"}).output
    assert "job sweep-07, policy uniform-progress: expected $" in text


def test_the_watcher_vm_and_an_aws_nat_gateway_are_always_on():
    from infra.config import validate

    gcp = validate({"cloud": "gcp", "project": "p-1", "region": "us-central1", "zones": ["us-central1-a"],
                    "prices": {"e2-small": {"spot": 0.005, "onDemand": 0.0168}},
                    "watcher": {"backend": "gs://team-state", "repo": "https://github.com/acme/spotctl.git",
                                "passphraseSecret": "pulumi-passphrase"}}, "test")
    (watcher,) = [r for r in estimate.always_on(gcp) if r.part == "watcher VM"]
    assert (watcher.detail, watcher.per_h, watcher.source) == ("e2-small", 0.0168, "stack file (spotctl:prices)")
    aws = validate({"cloud": "aws", "region": "us-east-1", "zones": ["us-east-1a"],
                    "network": {"egress": "nat", "natSubnet": "subnet-0a1b2c3d4e5f60009", "subnets": {"us-east-1a": "subnet-0a1b2c3d4e5f60001"}},
                    "watcher": {"backend": "s3://team-state", "repo": "https://github.com/acme/spotctl.git",
                                "passphraseSecret": "/team/pulumi-passphrase"}}, "test")
    parts = {r.part: r for r in estimate.always_on(aws)}
    assert parts["NAT gateway"].per_h == 0.045  # always_on.json: $0.045 per NAT gateway hour (us-east-1)
    assert "endpoints" not in parts  # NAT egress reaches the AWS APIs without interface endpoints
    assert (parts["watcher VM"].detail, parts["watcher VM"].per_h) == ("t3.small", None)  # not in the shipped table: unpriced
    doc = estimate.preview(aws, [])
    assert doc["total_per_h"] is None and doc["unpriced"] == ["t3.small"] and doc["total_known_per_h"] == 0.045
