"""`spotctl plan` runs the real program under mocks: deterministic, complete, offline; `--help` everywhere."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from cli.app import app
from tests.conftest import ROOT


def plan_json(runner, stack: str) -> str:
    result = runner.invoke(app, ["plan", "--stack", stack, "--json"])
    assert result.exit_code == 0, result.output
    return result.output


@pytest.mark.parametrize("stack", ["example-gcp", "example-aws"])
def test_plan_json_is_deterministic_across_processes(project, runner, stack):
    first = plan_json(runner, stack)
    env = {**os.environ, "PYTHONHASHSEED": "12345"}
    second = subprocess.run(
        [sys.executable, "-m", "cli", "plan", "--stack", stack, "--json"],
        cwd=project, env=env, capture_output=True, text=True, check=True,
    ).stdout
    assert first == second
    doc = json.loads(first)
    assert set(doc) == {"stack", "resources", "outputs", "cost"}
    assert doc["stack"] == stack
    for r in doc["resources"]:
        assert {"urn", "type", "name", "parent", "inputs"} <= set(r)
        assert r["urn"].startswith(f"urn:pulumi:{stack}::spotctl::")


def test_plan_lists_the_gcp_program_resources(project, runner):
    doc = json.loads(plan_json(runner, "example-gcp"))
    types = {r["type"] for r in doc["resources"]}
    assert {
        "spotctl:gcp:StackBase", "spotctl:gcp:GpuPool", "spotctl:gcp:TrainingJob",
        "gcp:compute/instanceTemplate:InstanceTemplate", "gcp:compute/regionInstanceGroupManager:RegionInstanceGroupManager",
        "gcp:compute/regionAutoscaler:RegionAutoscaler", "gcp:compute/disk:Disk", "gcp:compute/instance:Instance",
        "gcp:compute/address:Address", "gcp:storage/bucket:Bucket", "gcp:logging/projectSink:ProjectSink",
        "gcp:pubsub/topic:Topic",
    } <= types
    # Wire form: camelCase keys, numbers as the engine receives them.
    disk = next(r for r in doc["resources"] if r["name"] == "job-llm-pretrain-n0-disk")
    assert disk["inputs"]["size"] == 2000.0 and disk["inputs"]["zone"] == "us-central1-a"
    assert disk["parent"] == "urn:pulumi:example-gcp::spotctl::spotctl:gcp:TrainingJob::job-llm-pretrain"
    assert doc["outputs"]["jobs"]["llm-pretrain"]["instances"] == [
        "example-gcp-llm-pretrain-a1-n0", "example-gcp-llm-pretrain-a1-n1",
    ]


def test_plan_lists_the_aws_program_resources(project, runner):
    doc = json.loads(plan_json(runner, "example-aws"))
    types = {r["type"] for r in doc["resources"]}
    assert {
        "spotctl:aws:StackBase", "spotctl:aws:GpuPool", "spotctl:aws:TrainingJob",
        "aws:ec2/launchTemplate:LaunchTemplate", "aws:autoscaling/group:Group", "aws:ebs/volume:Volume",
        "aws:ec2/instance:Instance", "aws:ec2/volumeAttachment:VolumeAttachment", "aws:s3/bucket:Bucket",
        "aws:cloudwatch/eventRule:EventRule", "aws:sqs/queue:Queue",
    } <= types


def test_plan_tree_text(project, runner):
    result = runner.invoke(app, ["plan", "--stack", "example-gcp"], env={"COLUMNS": "100"})
    assert result.exit_code == 0, result.output
    lines = result.output.splitlines()
    assert lines[0].startswith("stack example-gcp: ") and lines[0].endswith(" cloud resources), under mocks")
    assert lines[2].split() == ["Type", "Name", "Info"]
    assert all(len(line) <= 100 for line in lines)
    assert any(line.startswith("├─ spotctl:gcp:TrainingJob") and line.endswith("job-llm-pretrain") for line in lines)
    vm = next(i for i, line in enumerate(lines) if "gcp:compute:Instance" in line and "job-vit-finetune-n0-vm" in line)
    words = [w.strip(" │") for w in lines[vm + 1].split("  ") if w.strip(" │")]
    assert words == ["a2-highgpu-1g", "us-central1-b", "on-demand", "attempt 3", "boot 100 GB"]  # integers as integers
    disk = next(i for i, line in enumerate(lines) if "gcp:compute:Disk" in line and "job-llm-pretrain-n0-disk" in line)
    assert [w.strip(" │") for w in lines[disk + 1].split("  ")[-4:]] == ["2000 GB", "pd-balanced", "us-central1-a", "protected"]
    assert "            masterAddress: 10.128.96.31 (mocked)" in lines  # an address the mocks made up
    assert "    eventBucket: example-gcp-events-4d8689f7" in lines  # a name the program chose
    assert ".0 " not in result.output and "=" not in result.output


@pytest.mark.parametrize("width", [60, 80, 120])
def test_plan_lines_fit_the_terminal(project, runner, width):
    result = runner.invoke(app, ["plan", "--stack", "example-aws"], env={"COLUMNS": str(width)})
    assert result.exit_code == 0, result.output
    assert max(len(line) for line in result.output.splitlines()) <= width
    assert "job-llm-pretrain-n0-vm" in result.output and "p5.48xlarge" in result.output


def test_plan_refuses_an_invalid_stack_before_running_anything(project, runner):
    path = project / "stacks" / "Pulumi.example-aws.yaml"
    path.write_text(path.read_text().replace("instanceType: p4d.24xlarge", "instanceTyp: p4d.24xlarge"))
    result = runner.invoke(app, ["plan", "--stack", "example-aws"])
    assert result.exit_code == 1
    assert result.output == (
        "error: stacks/Pulumi.example-aws.yaml: spotctl:jobs[1].instanceTyp: unknown key (did you mean 'instanceType'?)\n"
    )


def registered_commands() -> list[str]:
    return sorted(c.name or c.callback.__name__ for c in app.registered_commands)


def test_top_level_help_lists_every_command_with_an_example(runner):
    result = runner.invoke(app, ["--help"], env={"COLUMNS": "200"})
    assert result.exit_code == 0
    for name in registered_commands():
        line = next(line for line in result.output.splitlines() if line.lstrip("│ ").startswith(f"{name} "))
        assert "Example: spotctl " + name in line


@pytest.mark.parametrize("command", registered_commands())
def test_every_command_help_has_an_example(runner, command):
    result = runner.invoke(app, [command, "--help"], env={"COLUMNS": "200"})
    assert result.exit_code == 0
    assert f"Example: spotctl {command}" in result.output


def test_cli_startup_does_not_import_cloud_sdks():
    code = (
        "import sys; from cli.app import app\n"
        "from typer.testing import CliRunner\n"
        "CliRunner().invoke(app, ['--help'])\n"
        "heavy = sorted({m.split('.')[0] for m in sys.modules if m.split('.')[0] in "
        "('pulumi', 'pulumi_aws', 'pulumi_gcp', 'boto3', 'botocore', 'google', 'moto')})\n"
        "print(','.join(heavy))"
    )
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True).stdout
    assert out.strip() == ""


def test_plan_ends_its_event_loop_and_threads(project, monkeypatch):
    """The program runs on a loop of its own with one executor thread; when the
    plan returns nothing is left for the interpreter to tear down at exit (no executor thread, no
    pending task, every loop closed), and a second plan in the same process still works."""
    import asyncio
    import gc
    import threading

    from cli.lifecycle import stackfile
    from cli.plan import mocks as planner

    monkeypatch.setattr(planner, "PROJECT", planner.PROJECT)  # any patch: conftest's plan cache is bypassed, the runs are real
    cfg = stackfile.load(stackfile.resolve("example-gcp", None))

    def loops() -> list[asyncio.AbstractEventLoop]:
        return [o for o in gc.get_objects() if isinstance(o, asyncio.AbstractEventLoop)]

    before, old_loops = set(threading.enumerate()), {id(loop) for loop in loops()}  # other tests' are not ours
    first = planner.run(cfg, "example-gcp")
    assert [t.name for t in threading.enumerate() if t not in before] == []
    new = [loop for loop in loops() if id(loop) not in old_loops]
    assert new and all(loop.is_closed() for loop in new)
    second = planner.run(cfg, "example-gcp")
    assert second.to_json() == first.to_json() and len(first.resources) > 10


def test_plan_restores_the_garbage_collector(project, monkeypatch):
    """The cyclic GC is paused only while the program runs (cli.plan.runtime.no_cyclic_gc): it is on
    again after a plan and after a plan that failed, stays off for a caller that had it off, and no
    object is left frozen out of its reach."""
    import gc

    from cli.lifecycle import stackfile
    from cli.plan import mocks as planner
    from infra import aws_common as aws
    from infra.contract import ContractError

    monkeypatch.setattr(planner, "PROJECT", planner.PROJECT)  # conftest's plan cache is bypassed: the runs are real
    cfg = stackfile.load(stackfile.resolve("example-aws", None))
    seen: list[bool] = []
    real = aws._metadata_options
    monkeypatch.setattr(aws, "_metadata_options", lambda cls: (seen.append(gc.isenabled()), real(cls))[1])
    assert gc.isenabled()
    planner.run(cfg, "example-aws")
    assert seen and not any(seen) and gc.isenabled()
    assert gc.get_freeze_count() == 0  # the plan's objects were moved to the oldest generation, not frozen for good

    monkeypatch.setattr(aws, "_metadata_options", lambda cls: cls(http_tokens="optional"))  # breaks aws.imdsv2-required
    with pytest.raises(ContractError):
        planner.run(cfg, "example-aws")
    assert gc.isenabled()

    monkeypatch.setattr(aws, "_metadata_options", real)
    gc.disable()
    try:
        planner.run(cfg, "example-aws")
        assert not gc.isenabled()
    finally:
        gc.enable()


def test_plan_skips_the_sdks_source_positions_and_nothing_else(project, monkeypatch):
    """Under the mocks the SDK's per-resource stack walk (pulumi.runtime.resource._get_stack_trace) is
    skipped while the program runs (cli.plan.runtime.no_source_positions), and put back after. Fails when
    an SDK upgrade moves or changes it, so the shortcut never silently stops applying; with the guard
    refusing, the SDK runs as it is and the plan is the same."""
    from pulumi.runtime import resource as rt

    from cli.lifecycle import stackfile
    from cli.plan import mocks as planner
    from cli.plan import runtime as plan_runtime

    assert plan_runtime.source_positions_skippable(rt), "pulumi SDK internals changed: see cli.plan.runtime.no_source_positions"
    walks: list[int] = []
    real = rt._get_stack_trace

    def counting():
        walks.append(1)
        return real()

    monkeypatch.setattr(rt, "_get_stack_trace", counting)  # also: conftest's plan cache is bypassed
    cfg = stackfile.load(stackfile.resolve("example-gcp", None))
    skipped = planner.run(cfg, "example-gcp")
    assert walks == [] and rt._get_stack_trace is counting and len(skipped.resources) > 10

    monkeypatch.setattr(plan_runtime, "source_positions_skippable", lambda rt: False)
    walked = planner.run(cfg, "example-gcp")
    assert len(walks) == len(walked.resources) + 1  # one walk per registration, the root stack's included
    assert walked.to_json() == skipped.to_json()


def test_source_positions_guard_refuses_other_sdk_internals():
    """The guard leaves an SDK alone whose stack capture is missing, takes arguments, or is no longer
    what register_resource calls."""
    import types

    from pulumi.runtime import resource as rt

    from cli.plan import runtime as plan_runtime

    def sdk(**changes):
        fake = types.SimpleNamespace(**{k: getattr(rt, k) for k in (
            "_get_stack_trace", "_get_source_position", "source_pb2", "register_resource", "read_resource")})
        for key, value in changes.items():
            setattr(fake, key, value)
        return fake

    def register_resource(*args):
        return args

    assert plan_runtime.source_positions_skippable(sdk())
    assert not plan_runtime.source_positions_skippable(sdk(_get_stack_trace=None))
    assert not plan_runtime.source_positions_skippable(sdk(_get_stack_trace=lambda depth: None))
    assert not plan_runtime.source_positions_skippable(sdk(register_resource=register_resource))
    assert not plan_runtime.source_positions_skippable(sdk(_get_source_position=lambda stack: "file:///x.py"))


def test_plan_drops_the_sdks_debug_messages_only_when_nothing_would_show_them(project, monkeypatch, caplog):
    """The mock engine hands SDK debug messages to the root logger: while it would discard them
    (not at DEBUG) plan drops them at the source (cli.plan.runtime.no_debug_log), and puts
    ``pulumi.log.debug`` back after; with the root logger at DEBUG they reach it as before."""
    import logging

    import pulumi.log as plog

    from cli.lifecycle import stackfile
    from cli.plan import mocks as planner

    sent: list[str] = []
    real = plog.debug

    def counting(msg, *args, **kwargs):
        sent.append(msg)
        return real(msg, *args, **kwargs)

    monkeypatch.setattr(plog, "debug", counting)  # also: conftest's plan cache is bypassed
    cfg = stackfile.load(stackfile.resolve("example-gcp", None))
    caplog.set_level(logging.WARNING, logger="")
    quiet = planner.run(cfg, "example-gcp")
    assert sent == [] and plog.debug is counting

    caplog.set_level(logging.DEBUG, logger="")
    loud = planner.run(cfg, "example-gcp")
    assert len(sent) > len(loud.resources)
    assert any(r.levelno == logging.DEBUG and "registering resource" in r.getMessage() for r in caplog.records)
    assert loud.to_json() == quiet.to_json()
