"""A newcomer's first commands on the shipped example stacks, on real temp files: a job without code
whose command names a relative file is warned of at launch and resume; the launch preview's total is
the whole stack's (as `plan` says); the AWS example is priced."""

from __future__ import annotations

import json
from pathlib import Path

from cli.app import app

UNCODED = "has no code: the command runs in the empty job disk"


def write(path: Path, text: str) -> Path:
    path.write_text(text)
    return path


def test_launch_and_resume_warn_of_a_relative_command_without_code(project, runner):
    job = write(project / "my-job.yaml", "id: my-first-job\nmachineType: g2-standard-8\n"
                "accelerator: {type: nvidia-l4, count: 1}\ncommand: python examples/reentrant_train.py\n")
    launched = runner.invoke(app, ["launch", str(job), "--stack", "example-gcp", "--no-apply"])
    assert launched.exit_code == 0, launched.output
    assert f"job my-first-job runs 'examples/reentrant_train.py', a relative file, but {UNCODED}" in launched.stderr
    resumed = runner.invoke(app, ["resume", "my-first-job", "--stack", "example-gcp", "--no-apply"])
    assert resumed.exit_code == 0, resumed.output
    assert UNCODED in resumed.stderr
    assert "state: running" in (project / "stacks" / "Pulumi.example-gcp.yaml").read_text().split("my-first-job")[1]


def test_the_readme_job_ships_its_code_and_is_not_warned(project, runner):
    job = write(project / "my-job.yaml", "id: my-first-job\nmachineType: g2-standard-8\n"
                "accelerator: {type: nvidia-l4, count: 1}\ncode: ./examples/quickstart\ncommand: python3 train.py --steps 600\n")
    launched = runner.invoke(app, ["launch", str(job), "--stack", "example-gcp", "--no-apply"])
    assert launched.exit_code == 0, launched.output
    assert UNCODED not in launched.stderr
    readme = (Path(__file__).resolve().parent.parent / "README.md").read_text()
    assert "code: ./examples/quickstart" in readme and "command: python examples/" not in readme


def test_launch_total_is_the_whole_stack_as_plan_says(project, runner):
    job = ["launch", "--id", "extra", "--machine", "g2-standard-8", "--gpus", "nvidia-l4:1", "--command", "python3 -V",
           "--stack", "example-gcp", "--no-apply"]
    launched = runner.invoke(app, [*job, "--json"])
    assert launched.exit_code == 0, launched.output
    cost = json.loads(launched.stdout)["cost"]
    plan = json.loads(runner.invoke(app, ["plan", "--stack", "example-gcp", "--json"]).stdout)["cost"]
    assert cost["total_per_h"] == plan["total_per_h"] > 100  # llm-pretrain's two a3 VMs are in both
    assert cost["other_jobs"]["jobs"] == ["llm-pretrain", "vit-finetune"]
    assert cost["other_jobs"]["per_h"] == round(101.2191 + 3.6734, 4)  # spot a3 x2, on-demand a2 (test_estimate)
    (project / "stacks" / "Pulumi.example-gcp.yaml").write_text(
        (project / "stacks" / "Pulumi.example-gcp.yaml").read_text().split("    - id: extra")[0])
    text = runner.invoke(app, job, env={"COLUMNS": "80"}).stdout
    assert "other jobs (llm-pretrain, vit-finetune): $104.89/h" in text
    assert f"total now: ${plan['total_per_h']:,.2f}/h (the whole stack)" in text


def test_the_aws_example_is_priced_and_an_unpriced_part_still_totals_the_known(project, runner):
    plan = runner.invoke(app, ["plan", "--stack", "example-aws", "--json"])
    cost = json.loads(plan.stdout)["cost"]
    assert cost["unpriced"] == [] and cost["total_per_h"] is not None
    llm = next(r for r in cost["jobs"] if r["part"] == "job llm-pretrain")
    # prices.json aws/us-east-1/p5.48xlarge: skypilot-catalog vms.csv @27f67dd4, on-demand 98.32, spot the mean of
    # the six zones' 30.6846, 28.2404, 23.1583, 28.9688, 25.9977, 25.5192 = 27.09483; two nodes
    assert (llm["spot"], llm["on_demand"]) == (54.1897, 196.64) and "27f67dd4" in llm["source"]
    path = project / "stacks" / "Pulumi.example-aws.yaml"
    text = path.read_text().replace("instanceType: p4d.24xlarge", "instanceType: p4de.24xlarge")
    path.write_text(text.replace("      state: preempted\n", "      state: running\n"))  # diffusion now runs, unpriced
    plain = runner.invoke(app, ["plan", "--stack", "example-aws"], env={"COLUMNS": "80"}).stdout.replace("\n    ", " ")
    known = json.loads(runner.invoke(app, ["plan", "--stack", "example-aws", "--json"]).stdout)["cost"]
    assert known["total_per_h"] is None and known["total_known_per_h"] == cost["total_per_h"]  # the rest still counted
    assert (f"total now: at least ${cost['total_per_h']:,.2f}/h (unpriced: p4de.24xlarge: neither spotctl:prices nor "
            "spotctl's shipped price table has it in us-east-1; add it to spotctl:prices)") in " ".join(plain.split())


LAUNCH = ["launch", "--id", "c1", "--machine", "g2-standard-8", "--command", "python3 train.py", "--stack", "example-gcp",
          "--no-apply"]


def sparse(path: Path, mib: int) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("wb") as f:
        f.truncate(mib * 1024 * 1024)  # (no disk used: the limit counts file sizes)


def test_launch_code_flag_is_checked_and_written_relative_to_the_project_root(project, runner, tmp_path, monkeypatch):
    path = project / "stacks" / "Pulumi.example-gcp.yaml"
    before = path.read_text()
    missing = runner.invoke(app, [*LAUNCH, "--code", "nowhere"])
    assert missing.exit_code == 1 and f"error: --code: nowhere: {project / 'nowhere'} does not exist" in missing.output
    sparse(project / "big" / "blob.bin", 600)
    big = runner.invoke(app, [*LAUNCH, "--code", "big"])
    assert big.exit_code == 1 and "job c1: code (./big): 600.0 MiB of files, more than the 512.0 MiB" in big.output
    outside = tmp_path.parent / f"{tmp_path.name}-elsewhere"
    outside.mkdir()
    away = runner.invoke(app, [*LAUNCH, "--code", str(outside)])
    assert away.exit_code == 1 and f"is outside the project root {project}" in away.output
    assert path.read_text() == before  # nothing written by any of them
    monkeypatch.chdir(project / "examples")  # a directory as the shell means it, written as the project root reads it
    ok = runner.invoke(app, [*LAUNCH, "--code", "quickstart"])
    assert ok.exit_code == 0, ok.output
    assert path.read_text() == before + ("    - id: c1\n      machineType: g2-standard-8\n      zone: us-central1-a\n"
                                         "      code: ./examples/quickstart\n      command: python3 train.py\n")


def test_oversized_code_names_no_event_bucket(project, runner):
    sparse(project / "examples" / "quickstart" / "data.bin", 600)
    result = runner.invoke(app, ["resume", "vit-finetune", "--stack", "example-gcp", "--no-apply", "--force"])
    assert result.exit_code == 1
    assert "more than the 512.0 MiB a code archive may hold" in result.output
    assert "events-bucket" not in result.output and "spotctl sync" not in result.output


def test_a_machine_type_of_the_other_cloud_is_refused(project, runner):
    path = project / "stacks" / "Pulumi.example-gcp.yaml"
    before = path.read_text()
    result = runner.invoke(app, ["launch", "--id", "x", "--machine", "g5.2xlarge", "--command", "python3 -V",
                                 "--stack", "example-gcp", "--no-apply"])
    assert result.exit_code == 1
    assert ("--machine: unknown machine type 'g5.2xlarge': an EC2 instance type (AWS); a GCP stack names a Compute "
            "Engine machine type, e.g. 'g2-standard-8'") in result.output
    assert path.read_text() == before
    path.write_text(before.replace("machineType: g2-standard-8", "machineType: g5.2xlarge", 1))
    assert runner.invoke(app, ["validate", "--stack", "example-gcp"]).exit_code == 1


def gpus_of(runner, project, *flags: str, stack: str = "example-gcp") -> dict:
    result = runner.invoke(app, ["launch", "--id", "g", "--command", "python3 -V", *flags, "--stack", stack, "--no-apply",
                                 "--json"])
    assert result.exit_code == 0, result.output
    path = project / "stacks" / f"Pulumi.{stack}.yaml"
    path.write_text(path.read_text().split("    - id: g\n")[0])
    return json.loads(result.stdout)["entry"]["accelerator"]


def test_gpus_flag_takes_a_count_or_a_short_name(project, runner):
    assert gpus_of(runner, project, "--machine", "g2-standard-8", "--gpus", "1") == {"type": "nvidia-l4", "count": 1}
    assert gpus_of(runner, project, "--machine", "g2-standard-8", "--gpus", "l4:1") == {"type": "nvidia-l4", "count": 1}
    assert gpus_of(runner, project, "--machine", "a2-highgpu-1g", "--gpus", "a100") == {"type": "nvidia-tesla-a100", "count": 1}
    assert gpus_of(runner, project, "--machine", "g5.2xlarge", "--gpus", "1", stack="example-aws") == \
        {"type": "nvidia-a10g", "count": 1}


def test_flag_users_read_flags_in_errors(project, runner):
    def error(*flags: str) -> str:
        result = runner.invoke(app, ["launch", "--id", "d1", *flags, "--stack", "example-gcp", "--no-apply"])
        assert result.exit_code == 1
        return result.output

    assert error() == "error: launch of job d1: --command: required\n"
    assert error("--command", "x") == "error: launch of job d1: --machine: required (the GCP machine type)\n"
    assert error("--command", "x", "--machine", "g2-standard-8", "--gpus", "2").startswith(
        "error: launch of job d1: --gpus: g2-standard-8 comes with 1 x nvidia-l4, not 2:")
    wrong = error("--command", "x", "--machine", "g2-standard-8", "--gpus", "a100")
    assert wrong.endswith("leave --gpus out or give --gpus nvidia-l4:1\n") and "job d1: job d1" not in wrong
    job = write(project / "j.yaml", "id: d1\nmachineType: g2-standard-8\ncommand: x\nzone: nowhere\n")
    assert "j.yaml: zone: expected a zone name" in runner.invoke(app, ["launch", str(job), "--stack", "example-gcp",
                                                                        "--no-apply"]).output  # (its keys, not flags)


def test_one_vm_is_not_vms(project, runner):
    path = project / "stacks" / "Pulumi.example-gcp.yaml"
    text = path.read_text().replace("state: running", "state: preempted")
    path.write_text(text.replace("onDemand: 1", "onDemand: 0"))
    cost = json.loads(runner.invoke(app, ["launch", "--id", "one", "--machine", "g2-standard-8", "--command", "python3 -V",
                                          "--stack", "example-gcp", "--no-apply", "--json"]).stdout)["cost"]
    assert next(r for r in cost["always_on"] if r["part"] == "Cloud NAT")["detail"] == "1 VM"


def widest(text: str) -> int:
    return max(len(line) for line in text.splitlines())


def test_plan_simulate_cleanup_and_status_fit_80_columns(project, runner, tmp_path):
    narrow = {"COLUMNS": "80"}
    plan = runner.invoke(app, ["plan", "--stack", "example-gcp"], env=narrow)
    assert plan.exit_code == 0 and widest(plan.stdout) <= 80 and "\nType " in plan.stdout
    for name in ("us-west-2a_v100_1", "us-west-2b_v100_1"):
        (tmp_path / f"{name}.json").write_text(json.dumps({"metadata": {"gap_seconds": 600}, "data": ([1] * 18 + [0] * 6) * 20}))
    sim = runner.invoke(app, ["simulate", "--trace", str(tmp_path / "us-west-2a_v100_1.json"), "--trace",
                              str(tmp_path / "us-west-2b_v100_1.json"), "--job-hours", "4", "--deadline-hours", "8",
                              "--starts", "2"], env=narrow)
    assert sim.exit_code == 0, sim.output
    assert widest(sim.stdout) <= 80 and "\nus-west-2b_v100_1:\ndefault " in sim.stdout and "\n(all):\n" in sim.stdout
    cleanup = runner.invoke(app, ["cleanup", "bert-eval", "--stack", "example-gcp", "--no-apply"], env=narrow)
    assert cleanup.exit_code == 0 and widest(cleanup.stdout) <= 80
    assert "  - delete gcp:compute:Disk job-bert-eval-n0-disk\n" in cleanup.stdout
    status = runner.invoke(app, ["status", "--stack", "example-gcp"], env=narrow)
    assert status.exit_code == 0 and widest(status.stdout) <= 80 and widest(status.stderr) <= 80
    assert "warning: no events source:" in status.stderr
    scripted = runner.invoke(app, ["status", "--stack", "example-gcp", "--json"], env=narrow)
    assert len(scripted.stderr.splitlines()) == 1  # (one line for a script)


def test_cleanup_without_pulumi_hints_what_edits_the_file(project, runner, tmp_path, monkeypatch):
    monkeypatch.setenv("SPOTCTL_PULUMI_ROOT", str(tmp_path / "no-pulumi"))
    monkeypatch.setenv("PATH", str(tmp_path / "empty-path"))
    path = project / "stacks" / "Pulumi.example-gcp.yaml"
    result = runner.invoke(app, ["cleanup", "bert-eval", "--stack", "example-gcp", "--yes"])
    assert result.exit_code == 1 and "re-run with --no-apply --yes to only drop the job from the stack file" in result.output
    edited = runner.invoke(app, ["cleanup", "bert-eval", "--stack", "example-gcp", "--no-apply", "--yes"])
    assert edited.exit_code == 0, edited.output
    assert "id: bert-eval" not in path.read_text()


def test_stack_takes_a_stack_files_path_and_outside_the_project_names_minus_c(project, runner, tmp_path, monkeypatch):
    result = runner.invoke(app, ["validate", "--stack", "stacks/Pulumi.example-gcp.yaml"])
    assert result.exit_code == 0, result.output
    assert result.stdout.startswith("stacks/Pulumi.example-gcp.yaml: ok (gcp")
    elsewhere = tmp_path.parent / f"{tmp_path.name}-elsewhere"  # (the project fixture is tmp_path itself)
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)
    lost = runner.invoke(app, ["status", "--stack", "example-gcp"])
    assert lost.exit_code == 1 and "no Pulumi.yaml is at or above it" in lost.output and "`spotctl -C DIR`" in lost.output
    found = runner.invoke(app, ["-C", str(project), "validate", "--stack", "example-gcp"])
    assert found.exit_code == 0, found.output


def test_cost_of_jobs_that_ran_without_events_is_unknown_not_zero(project, runner):
    (project / "events").mkdir()
    result = runner.invoke(app, ["cost", "--stack", "example-gcp", "--events-dir", "events"], env={"COLUMNS": "120"})
    assert result.exit_code == 0, result.output
    row = next(line for line in result.stdout.splitlines() if "llm-pretrain" in line)
    assert "$0.00" not in row and row.count("?") >= 5
    assert "?: no event of llm-pretrain, vit-finetune, bert-eval was read" in " ".join(result.stdout.split())
    doc = json.loads(runner.invoke(app, ["cost", "--stack", "example-gcp", "--events-dir", "events", "--json"]).stdout)
    assert all(j["no_events"] for j in doc["jobs"])


def test_the_tours_plan_sample_is_what_plan_prints(project, runner):
    tour = (Path(__file__).resolve().parent.parent / "docs" / "getting-started" / "tour.md").read_text()
    sample = tour.split("It prints the resource tree that `pulumi preview` would show:")[1].split("```")[1]
    printed = runner.invoke(app, ["plan", "--stack", "example-gcp"], env={"COLUMNS": "100"}).stdout
    lines = sample.strip("\n").splitlines()
    assert sum("…" in line for line in lines) <= 1  # an elided subtree says so; everything else is printed as shown
    for line in lines:
        if "…" not in line:
            assert line.rstrip() in printed, line


def test_a_launch_no_apply_is_undone_offline_and_the_exists_hint_says_how(project, runner):
    path = project / "stacks" / "Pulumi.example-gcp.yaml"
    before = path.read_text()
    new = ["launch", "--id", "u1", "--machine", "g2-standard-8", "--command", "python3 -V", "--stack", "example-gcp", "--no-apply"]
    assert runner.invoke(app, new).exit_code == 0
    again = runner.invoke(app, new)
    assert again.exit_code == 1 and "`spotctl cleanup u1 --no-apply --yes` (never applied: only its entry goes)" in again.output
    undone = runner.invoke(app, ["cleanup", "u1", "--stack", "example-gcp", "--no-apply", "--yes"])
    assert undone.exit_code == 0, undone.output
    assert undone.stdout == "job u1: never applied: removed from stacks/Pulumi.example-gcp.yaml\n"
    assert path.read_text() == before  # byte for byte, comments kept
    running = runner.invoke(app, ["cleanup", "vit-finetune", "--stack", "example-gcp", "--no-apply", "--yes"])
    assert running.exit_code == 1 and "its disks are kept because its job is running" in running.output
    assert "already exists" in runner.invoke(app, ["launch", "--id", "vit-finetune", "--machine", "a2-highgpu-1g", "--command",
                                                   "x", "--stack", "example-gcp", "--no-apply"]).output
    assert path.read_text() == before


def test_resume_without_apply_ends_the_users_stop_without_a_null_left(project, runner):
    job = write(project / "my-job.yaml", "id: my-first-job\nmachineType: g2-standard-8\n"
                "accelerator: {type: nvidia-l4, count: 1}\ncommand: nvidia-smi\n")
    stack = project / "stacks" / "Pulumi.example-gcp.yaml"
    assert runner.invoke(app, ["launch", str(job), "--stack", "example-gcp", "--no-apply"]).exit_code == 0
    first = runner.invoke(app, ["resume", "my-first-job", "--stack", "example-gcp", "--no-apply"])
    assert first.exit_code == 0, first.output
    stopped = runner.invoke(app, ["stop", "my-first-job", "--stack", "example-gcp", "--no-apply", "--yes"])
    assert stopped.exit_code == 0, stopped.output
    assert "stoppedBy: user" in stack.read_text().split("my-first-job")[1]
    resumed = runner.invoke(app, ["resume", "my-first-job", "--stack", "example-gcp", "--no-apply"])
    assert resumed.exit_code == 0, resumed.output
    entry = stack.read_text().split("my-first-job")[1]
    assert "state: running" in entry and "stoppedBy" not in entry
