"""No user value is ever executed by the bootstrap or the agent: the job command runs exactly as
written (handed verbatim to `bash -c`), and nothing else does."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from cli.drill.emulator import Emulator
from cli.drill.localvm import LocalVM, local_context
from infra.render import ScriptContext

PAYLOADS = [
    "$(touch {s})",
    "`touch {s}`",
    "; touch {s}",
    "\ntouch {s}\n",
    "' ; touch {s}; '",
    '" ; touch {s}; "',
    "${{IFS}}touch${{IFS}}{s}",
    "&& touch {s} ||",
    "| touch {s}",
    "$((1+1)) %s %q \\ \\\\n",
    "EOF\ntouch {s}\nEOF",
    "'\"'\"'$(touch {s})",
    "\x1b[31mred\u2028 ünïcødé",
    # tests/adversarial/payloads.json: the corpus found by adversarial testing, growing
    *json.loads((Path(__file__).parent / "adversarial" / "payloads.json").read_text())["payloads"],
]

BASH_SHIM = """#!/bin/sh
# Records the command the agent hands to `bash -c`, without running it; anything else is real bash.
if [ "$1" = -c ] && [ -n "$INJECTION_RECORD" ]; then
  printf '%s' "$2" >"$INJECTION_RECORD"
  exit 0
fi
exec /bin/bash "$@"
"""

text = st.text(alphabet=st.characters(blacklist_categories=("Cs",), blacklist_characters="\x00"), max_size=60)


@pytest.fixture(scope="module")
def emu():
    with Emulator() as e:
        yield e


@pytest.fixture(scope="module")
def shim_dir(tmp_path_factory) -> Path:
    d = tmp_path_factory.mktemp("shims")
    (d / "bash").write_text(BASH_SHIM)
    (d / "bash").chmod(0o755)
    return d


def run_vm(emu, shim_dir, work: Path, **spec) -> tuple[LocalVM, Path]:
    """One VM booted, its command run to the end, then stopped; (the VM, where the shim recorded the command)."""
    return run_vms(emu, shim_dir, [(work, spec)])[0]


def run_vms(emu, shim_dir, vms: list[tuple[Path, dict]]) -> list[tuple[LocalVM, Path]]:
    """``run_vm`` of several VMs at once: each step for all of them before the next (they wait on
    the clock, not the CPU: a hypothesis example's two VMs take the time of one)."""
    started = []
    try:
        for work, spec in vms:
            kind, cloud, name = spec.get("kind", "job"), spec.get("cloud", "gcp"), spec.get("name", "train")
            record = work / "recorded-command"
            # The command's environment is the job's (and the image's PATH): the shim finds its record there.
            ctx = ScriptContext(cloud=cloud, stack=spec.get("stack", "team-a"), kind=kind, name=name, command=spec.get("command", "true"),
                                event_bucket="bkt", region="us-central1", env={**(spec.get("env") or {}), "INJECTION_RECORD": str(record)})
            vm = LocalVM(local_context(ctx, emu, work / "disk", work / "state"), work / "vm")
            envs = {"PATH": f"{shim_dir}:{os.environ['PATH']}"}
            started.append((vm, record, envs))
            done = vm.boot(env=envs)
            assert done.returncode == 0, done.stderr
        for vm, _, _ in started:
            assert vm.wait_exit("run.pid", 20), vm.debug_log()
        for vm, _, envs in started:
            shut, _ = vm.shutdown(env={**envs, "SPOTCTL_RECORD_BUDGET_S": "1"})
            assert shut.returncode == 0
    finally:
        for vm, _, _ in started:
            vm.kill_all()
    return [(vm, record) for vm, record, _ in started]


def sourced_env(vm: LocalVM, key: str) -> str:
    out = subprocess.run(["bash", "-c", f'. "$1"; printf %s "${key}"', "_", str(vm.state / "env")],
                         capture_output=True, check=True)
    return out.stdout.decode()  # bytes: text mode would turn \r into \n


@pytest.mark.parametrize("cloud", ["gcp", "aws"])
@pytest.mark.parametrize("payload", PAYLOADS)
def test_classic_payloads_in_every_field(emu, shim_dir, tmp_path, payload, cloud):
    sentinel = tmp_path / "pwned"
    value = payload.format(s=sentinel)
    vm, record = run_vm(emu, shim_dir, tmp_path, cloud=cloud, name=value, stack=value, command=value, env={"USER_VALUE": value})
    assert not sentinel.exists(), "a script executed a user value"
    assert record.read_bytes().decode() == value  # the command reaches bash -c exactly as written
    assert sourced_env(vm, "USER_VALUE") == value
    assert sourced_env(vm, "SPOTCTL_JOB_ID") == value
    clean = "".join(c for c in value if c in "\n\r\t" or ord(c) >= 32)
    events = vm.events()
    assert [e["event"] for e in events] == ["started", "completed"]  # a stop after completion adds nothing
    assert all(e["job"] == clean and e["stack"] == clean for e in events)


def test_agent_command_payload(emu, shim_dir, tmp_path):
    sentinel = tmp_path / "pwned"
    value = f"agent --pool x; touch {sentinel}"
    _, record = run_vm(emu, shim_dir, tmp_path, kind="pool", command=value)
    assert not sentinel.exists() and record.read_bytes().decode() == value


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(command=text, name=text, env_value=text, agent=text)
def test_generated_values_pass_through_verbatim(emu, shim_dir, tmp_path_factory, command, name, env_value, agent):
    work = tmp_path_factory.mktemp("gen")
    command = command or "true"
    (vm, record), (_, pool_record) = run_vms(emu, shim_dir, [(work / "job", {"name": name or "j", "command": command, "env": {"V": env_value}}),
                                                             (work / "pool", {"kind": "pool", "command": agent or "true"})])
    assert record.read_bytes().decode() == command
    assert sourced_env(vm, "V") == env_value
    assert pool_record.read_bytes().decode() == (agent or "true")


def test_the_command_really_runs_as_written(tmp_path):
    """Without the shim: a command with quotes, pipes and expansions behaves as in a shell."""
    out = tmp_path / "out"
    command = f"printf '%s|' \"$SPOTCTL_JOB_ID\" 'a b' | tr '|' ',' > {out}; echo $((6*7)) >> {out}"
    with Emulator() as emu:
        ctx = ScriptContext(cloud="gcp", stack="s", kind="job", name="j1", command=command, event_bucket="b", region="r")
        with LocalVM(local_context(ctx, emu, tmp_path / "disk", tmp_path / "state"), tmp_path / "vm") as vm:
            vm.boot()
            assert vm.wait_exit("run.pid", 20)
    assert out.read_text() == "j1,a b,42\n"
