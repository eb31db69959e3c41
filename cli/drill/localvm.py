"""Run a VM's rendered bootstrap and its agent on this machine: a directory plays the job disk, the
emulator plays the metadata server and the bucket (it serves the agent the bootstrap fetches and
records the VM's self-stop), background processes play the systemd units.

Used by the script tests and by ``spotctl drill``.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from cli.drill.emulator import POWEROFF_PATH, Emulator
from infra.agent_artifact import artifact
from infra.render import ScriptContext, Scripts, scripts_for

PID_FILES = ("trainer.pid", "run.pid", "watch.pid")


def local_context(ctx: ScriptContext, emulator: Emulator, disk: Path, state: Path) -> ScriptContext:
    """``ctx`` pointed at the emulator, with ``disk`` as the job disk and ``state`` as the VM's state dir;
    the emulator's bucket gets the agent, as ``spotctl up`` uploads it to the stack's."""
    agent = artifact()
    emulator.put_object(ctx.event_bucket, agent.object_name, agent.data)
    return replace(
        ctx,
        disk_device="",
        mount_point=str(disk),
        state_dir=str(state),
        systemd_dir=str(state / "systemd"),
        metadata_url=emulator.metadata_url(ctx.cloud),
        storage_url=emulator.url,
        autoscaling_url=emulator.url,
        secrets_url=emulator.url,
    )


@dataclass
class LocalVM:
    """One attempt of one node, run locally."""

    ctx: ScriptContext
    workdir: Path

    def __post_init__(self) -> None:
        # The boot id the last boot() was given (SPOTCTL_BOOT_ID): the shutdown path runs in that boot.
        self.boot_id: str | None = None
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.scripts: Scripts = scripts_for(self.ctx)
        self.startup = self.workdir / "startup.sh"
        self.startup.write_text(self.scripts.startup)
        self.shutdown_script = self.workdir / "shutdown.sh"
        self.shutdown_script.write_text(self.scripts.shutdown or self.scripts.startup)

    def __enter__(self) -> LocalVM:
        return self

    def __exit__(self, *exc: object) -> None:
        self.kill_all()

    @property
    def state(self) -> Path:
        return Path(self.ctx.state_dir)

    @property
    def disk(self) -> Path:
        return Path(self.ctx.mount_point)

    def _env(self, extra: dict[str, str] | None = None) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if not k.startswith("SPOTCTL_")}
        env["SPOTCTL_NO_SYSTEMD"] = "1"
        env["SPOTCTL_POWEROFF_URL"] = self.ctx.storage_url + POWEROFF_PATH
        if self.boot_id is not None:
            env["SPOTCTL_BOOT_ID"] = self.boot_id
        env.update(extra or {})
        return env

    def boot(self, timeout: float = 60, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
        """Run the startup script (entry ``main``); returns once the units are started."""
        self.boot_id = (env or {}).get("SPOTCTL_BOOT_ID")
        return subprocess.run(
            ["bash", str(self.startup)], env=self._env(env), capture_output=True, text=True, timeout=timeout, check=False
        )

    def shutdown(self, timeout: float = 180, env: dict[str, str] | None = None) -> tuple[subprocess.CompletedProcess[str], float]:
        """Run the shutdown path (GCP: the shutdown script; AWS: the stop hook); returns it and its duration."""
        args = ["bash", str(self.shutdown_script)]
        if self.ctx.cloud == "aws":
            args.append("shutdown")
        start = time.monotonic()
        done = subprocess.run(args, env=self._env(env), capture_output=True, text=True, timeout=timeout, check=False)
        return done, time.monotonic() - start

    @property
    def agent(self) -> Path:
        """Where the bootstrap unpacked the agent it fetched and verified."""
        return self.state / f"agent-{artifact().sha256}" / "__main__.py"

    def unit(self, entry: str, env: dict[str, str] | None = None) -> subprocess.Popen[bytes]:
        """What systemd does with an enabled unit at boot: run the installed agent's entry point."""
        return subprocess.Popen([sys.executable, "-E", "-S", str(self.agent), entry],
                                env=self._env({"SPOTCTL_CONFIG": str(self.state / "config.json"), **(env or {})}),
                                stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)

    def pid(self, name: str) -> int | None:
        try:
            return int((self.state / name).read_text().strip())
        except (FileNotFoundError, ValueError):
            return None

    def alive(self, name: str) -> bool:
        pid = self.pid(name)
        if pid is None:
            return False
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return False
        # A zombie is not alive for our purposes.
        try:
            with open(f"/proc/{pid}/stat") as fh:
                return fh.read().split(")")[-1].split()[0] != "Z"
        except FileNotFoundError:
            return False

    def wait_for(self, predicate, timeout: float, interval: float = 0.05) -> bool:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if predicate():
                return True
            time.sleep(interval)
        return predicate()

    def wait_exit(self, name: str = "run.pid", timeout: float = 60) -> bool:
        return self.wait_for(lambda: not self.alive(name), timeout)

    def kill_all(self) -> None:
        """Power-off: SIGKILL every process group this VM started."""
        for name in PID_FILES:
            pid = self.pid(name)
            if pid is None:
                continue
            for target in (-pid, pid):
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.kill(target, signal.SIGKILL)

    def events(self) -> list[dict[str, Any]]:
        """The local event log (on the job disk when mounted, else in the state dir)."""
        for path in (self.disk / ".spotctl" / "events.jsonl", self.state / "events.jsonl"):
            if path.exists():
                return [json.loads(line) for line in path.read_bytes().decode().split("\n") if line.strip()]  # not splitlines: U+2028 is data
        return []

    def debug_log(self) -> str:
        path = self.state / "spotctl.log"
        return path.read_text() if path.exists() else ""
