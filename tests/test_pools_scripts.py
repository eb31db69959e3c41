"""The pool script's busy/idle contract, run with bash against the metadata emulator: the agent
creates $SPOTCTL_BUSY_FILE (or runs `/var/lib/spotctl/spotctl.sh busy|idle`); on AWS the instance then sets
scale-in protection on itself through the Auto Scaling Query API (SigV4-signed with the role's
IMDS credentials, checked by the emulator); both clouds record busy/idle events."""

from __future__ import annotations

import subprocess
from dataclasses import replace

import pytest

from cli.drill.emulator import Emulator, Fault
from cli.drill.localvm import LocalVM, local_context
from infra.render import ScriptContext


@pytest.fixture
def emu():
    with Emulator() as e:
        yield e


@pytest.fixture
def pool_vm(tmp_path, emu):
    vms: list[LocalVM] = []

    def make(cloud: str, command: str = "sleep 120", **over) -> LocalVM:
        ctx = ScriptContext(cloud=cloud, stack="team-a", kind="pool", name="g5", command=command, event_bucket="events-bkt",
                            region="us-east-1", poll_interval_s=1)
        local = replace(local_context(ctx, emu, tmp_path / "work", tmp_path / f"state-{len(vms)}"), **over)
        vm = LocalVM(local, tmp_path / f"vm-{len(vms)}")
        vms.append(vm)
        done = vm.boot()
        assert done.returncode == 0, done.stderr
        # The agent has started before the test's busy/idle (its `started` comes first in the event log).
        assert vm.wait_for(lambda: "started" in [e["event"] for e in vm.events()], 20), vm.debug_log()
        return vm

    yield make
    for vm in vms:
        vm.kill_all()


def entry(vm: LocalVM, name: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["bash", str(vm.startup), name], env=vm._env(), capture_output=True, text=True, timeout=60, check=False)


def test_aws_busy_and_idle_set_scale_in_protection_on_itself(pool_vm, emu):
    vm = pool_vm("aws")
    assert entry(vm, "busy").returncode == 0, vm.debug_log()
    assert emu.state.protection == [("spotctl-pool-asg", "vm-1", True)]
    assert entry(vm, "idle").returncode == 0, vm.debug_log()
    assert emu.state.protection[-1] == ("spotctl-pool-asg", "vm-1", False)
    assert not emu.state.rejected  # every call carried a valid SigV4 signature
    assert vm.wait_for(lambda: [e["event"] for e in emu.events()].count("idle") == 1, 20)
    assert [e["event"] for e in vm.events()][-2:] == ["busy", "idle"]


def test_aws_protection_through_an_endpoint_specific_name_is_signed_for_that_host(pool_vm, emu):
    """Under egress 's3-endpoint' the agent calls its interface endpoint's own name (infra/aws.py
    regional_dns_name), not autoscaling.<region>.amazonaws.com: it must sign the Host it sends (the
    emulator checks the signature against the Host it received), service and region unchanged. Here
    the other name is ``localhost`` (the bucket's is 127.0.0.1): the resolver of this machine sends no
    ``*.localhost`` name to the loopback, which only curl does by itself."""
    port = emu.url.rsplit(":", 1)[1]
    url = f"http://localhost:{port}"
    vm = pool_vm("aws", autoscaling_url=url)
    assert f'"autoscaling_url":"{url}"' in vm.startup.read_text()
    assert entry(vm, "busy").returncode == 0, vm.debug_log()
    assert emu.state.protection == [("spotctl-pool-asg", "vm-1", True)]
    assert not emu.state.rejected


def test_aws_agent_touching_the_busy_file_is_enough(pool_vm, emu):
    vm = pool_vm("aws", command='touch "$SPOTCTL_BUSY_FILE"; sleep 3; rm -f "$SPOTCTL_BUSY_FILE"; sleep 120')
    assert vm.wait_for(lambda: ("spotctl-pool-asg", "vm-1", True) in emu.state.protection, 30), vm.debug_log()
    assert vm.wait_for(lambda: ("spotctl-pool-asg", "vm-1", False) in emu.state.protection, 30), vm.debug_log()
    assert [p[2] for p in emu.state.protection] == [True, False]  # each change once, not every poll


def test_aws_protection_failure_is_retried_not_forgotten(pool_vm, emu):
    vm = pool_vm("aws")
    emu.state.sink_fault = Fault(status=503)  # Auto Scaling unavailable
    assert entry(vm, "busy").returncode != 0
    assert emu.state.protection == [] and not (vm.state / "reported").exists()
    assert "retrying at the next poll" in vm.debug_log()
    emu.state.sink_fault = Fault()
    assert vm.wait_for(lambda: emu.state.protection == [("spotctl-pool-asg", "vm-1", True)], 30), vm.debug_log()


def test_gcp_busy_is_recorded_without_any_autoscaling_call(pool_vm, emu):
    vm = pool_vm("gcp", command='touch "$SPOTCTL_BUSY_FILE"; sleep 120')
    assert vm.wait_for(lambda: "busy" in [e["event"] for e in vm.events()], 30), vm.debug_log()
    assert emu.state.protection == [] and not any(path == "/" for method, path in emu.state.requests if method == "POST")
    assert "SPOTCTL_AUTOSCALING_URL" not in vm.scripts.startup


def test_aws_slow_auto_scaling_never_delays_a_notice(pool_vm, emu):
    """The watcher applies busy/idle (two Auto Scaling calls, here 8 s each) in the background: a spot
    notice arriving meanwhile is handled at the next poll, before the protection call even answers."""
    emu.state.sink_fault = Fault(delay_s=8)
    vm = pool_vm("aws", command='touch "$SPOTCTL_BUSY_FILE"; sleep 120')
    assert vm.wait_for(lambda: any(m == "POST" and p == "/" for m, p in emu.state.requests), 30), vm.debug_log()
    emu.notice_aws()
    seen: dict[str, list] = {}

    def noticed() -> bool:
        if "preemption-notice" not in [e["event"] for e in vm.events()]:
            return False
        seen["protection"] = list(emu.state.protection)
        return True

    assert vm.wait_for(noticed, 40), vm.debug_log()
    assert seen["protection"] == []  # still waiting on Auto Scaling when the notice was recorded


def test_the_documented_entry_script_runs_the_agent(pool_vm, emu):
    """`/var/lib/spotctl/spotctl.sh busy` (README "Pools") runs this VM's agent."""
    vm = pool_vm("gcp")
    done = subprocess.run([str(vm.state / "spotctl.sh"), "busy"], env=vm._env(), capture_output=True, text=True, timeout=60,
                          check=False)
    assert done.returncode == 0, done.stderr + vm.debug_log()
    assert [e["event"] for e in vm.events()][-1] == "busy"
