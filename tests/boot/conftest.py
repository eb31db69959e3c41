"""The boot tier's fixtures: the cached guest image (built on first use), and per cloud a story of
one job's VMs (first boot, reboot, preemption, a new attempt stopped normally) plus a job that
completes. Skipped, with the reason, where this machine cannot boot guests."""

from __future__ import annotations

import json
import os
import platform
import shutil
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from tests.boot import image as image_mod
from tests.boot.cloud import GuestCloud
from tests.boot.netns import Namespace, can_make_namespaces, remove_stale
from tests.boot.plan import VmPlan, plan_vm
from tests.boot.vm import Guest, accelerator, new_job_disk, read_disk_file

# The trainer's pace: a step every 0.2 s, a checkpoint every 10 steps, 2 s to checkpoint on SIGTERM.
TRAINER_ENV = {"STEP_S": "0.2", "CKPT_EVERY": "10", "CKPT_S": "2"}
BOOT_S = 420  # a boot under TCG on a loaded 2-core machine: ~60-120 s; the wait is generous
TIMES = Path(os.environ.get("SPOTCTL_BOOT_TIMES", "")) if os.environ.get("SPOTCTL_BOOT_TIMES") else None


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if "tests/boot/" in item.nodeid.replace("\\", "/"):
            item.add_marker(pytest.mark.boot)


def _cannot_boot() -> str:
    if platform.system() != "Linux" or platform.machine() not in ("x86_64", "AMD64"):
        return f"the boot tier needs Linux on x86_64 (this is {platform.system()} {platform.machine()})"
    if os.environ.get("SPOTCTL_BOOT") == "0":
        return "SPOTCTL_BOOT=0 in the environment"
    if image_mod.missing_tools():  # first: the namespace probe itself needs iproute2
        if shutil.which("apt-get") is None:
            return f"missing {', '.join(image_mod.missing_tools())} and no apt-get to install them"
        try:
            image_mod.install_host_tools()
        except RuntimeError as exc:
            return str(exc)
    reason = can_make_namespaces()
    if reason:
        return reason
    remove_stale()
    return ""


@dataclass
class Record:
    """Measured figures, printed at the end of the session and (SPOTCTL_BOOT_TIMES) kept as JSON."""

    figures: dict[str, float | str | None] = field(default_factory=dict)

    def __setitem__(self, key: str, value: float | str | None) -> None:
        self.figures[key] = round(value, 1) if isinstance(value, float) else value
        print(f"boot tier: {key} = {self.figures[key]}")
        if TIMES is not None:
            old = json.loads(TIMES.read_text()) if TIMES.exists() else {}
            TIMES.write_text(json.dumps({**old, key: self.figures[key]}, indent=1))


@pytest.fixture(scope="session")
def boot_record() -> Record:
    return Record()


@pytest.fixture(scope="session")
def boot_image(boot_record: Record, tmp_path_factory: pytest.TempPathFactory) -> image_mod.Image:
    reason = _cannot_boot()
    if reason:
        pytest.skip(f"boot tier skipped: {reason}")
    times = image_mod.BuildTimes()
    start = time.monotonic()
    built = image_mod.build(times=times)
    boot_record["image build total (s; ~0 when cached)"] = time.monotonic() - start
    boot_record["debootstrap + packages (s)"] = times.base_s
    boot_record["image from base (s)"] = times.image_s
    boot_record["accelerator"] = accelerator(built, tmp_path_factory.mktemp("accel"))
    return built


@dataclass
class Story:
    """One cloud's job across its VMs: the namespace, the emulator, the job disk, the VM now."""

    cloud: str
    image: image_mod.Image
    workdir: Path
    ns: Namespace
    emu: GuestCloud
    disk: Path
    plan: VmPlan
    env: dict[str, str]
    guest: Guest | None = None
    filesystem: str | None = None  # the job disk's filesystem as first formatted (vm.filesystem_id)
    done: set[str] = field(default_factory=set)

    def boot(self, plan: VmPlan, name: str) -> Guest:
        """A new VM (a new boot disk) for ``plan``'s attempt, on this story's job disk."""
        self.plan = plan
        e = self.emu
        e.state.instance = f"{plan.job}-a{plan.attempt}" if plan.cloud == "gcp" else f"i-0b007{plan.attempt:012d}"
        e.state.zone = plan.zone
        e.state.attributes = dict(plan.metadata)
        e.user_data, e.region, e.instance_type = plan.user_data, plan.region, plan.instance_type
        e.reset(preempted=False, instance_action=None)
        e.serve_agent(plan.bucket)
        e.serve_code(plan.code_uri, plan.code)
        self.guest = Guest(self.image, self.workdir / name, self.ns, self.cloud, self.disk,
                           volume_serial=plan.volume_serial)
        self.guest.start()
        if self.cloud == "aws":
            # EC2 attaches the volume only once the instance runs (a VolumeAttachment after it):
            # plugged once cloud-init has read the user data, as the script starts waiting for it.
            self.wait(lambda: any("user-data" in path for _, path in e.state.requests), BOOT_S, "cloud-init read the user data")
            time.sleep(3)
            self.guest.plug_volume()
        return self.guest

    def requires(self, *stages: str) -> None:
        missing = [s for s in stages if s not in self.done]
        if missing:
            pytest.fail(f"this scenario continues {', '.join(missing)}, which did not pass")

    def events(self, name: str | None = None) -> list[dict]:
        found = [e for e in self.emu.events() if e.get("job") == self.plan.job]
        return [e for e in found if name is None or e["event"] == name]

    def disk_events(self) -> list[dict]:
        """The job disk's event log, as the next attempt reads it. A reset (a crash) can leave a run
        of NUL bytes where appended lines had not reached the disk (ext4 delayed allocation): they
        are skipped, as lost lines; any other unreadable line fails the test."""
        text = read_disk_file(self.disk, "/.spotctl/events.jsonl") or ""
        lines = [line.strip("\0") for line in text.split("\n")]
        return [json.loads(line) for line in lines if line.strip()]

    def checkpoint_on_disk(self) -> int | None:
        text = read_disk_file(self.disk, "/checkpoints/ckpt.json")
        return json.loads(text)["step"] if text else None

    def wait(self, predicate: Callable[[], object], timeout: float, what: str) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if predicate():
                return
            if self.guest is not None and self.guest.proc is not None and self.guest.proc.poll() is not None:
                break
            time.sleep(0.5)
        if predicate():
            return
        tail = self.guest.console_text()[-4000:] if self.guest else ""
        events = [(e["event"], e.get("details")) for e in self.emu.events()]
        chunks = self.emu.state.log_chunks
        log = b"".join(chunks[n] for n in sorted(chunks)).decode(errors="replace")[-3000:]
        raise AssertionError(f"{self.cloud}: timed out waiting for {what}; events {events}\n"
                             f"trainer log (as uploaded):\n{log}\nconsole tail:\n{tail}")


def _story(cloud: str, image: image_mod.Image, workdir: Path, job: str, env: dict[str, str]) -> Iterator[Story]:
    plan = plan_vm(cloud, job, env)
    with Namespace(workdir) as ns:
        emu = GuestCloud(cloud, project="my-ml-project").serve(ns, image.tls)
        story = Story(cloud, image, workdir, ns, emu, new_job_disk(workdir / "job.raw"), plan, env)
        try:
            yield story
        finally:
            if story.guest is not None:
                story.guest.hard_stop()
            emu.stop()


@pytest.fixture(scope="module", params=["gcp", "aws"])
def cloud(request: pytest.FixtureRequest) -> str:
    """The cloud of this pass over the scenarios (pytest runs every test of one before the other)."""
    return request.param


@pytest.fixture(scope="module")
def story(cloud: str, boot_image: image_mod.Image, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Story]:
    yield from _story(cloud, boot_image, tmp_path_factory.mktemp(f"boot-{cloud}"), "boot-train", TRAINER_ENV)


@pytest.fixture(scope="module")
def completing(cloud: str, boot_image: image_mod.Image, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Story]:
    """A second job of the same stack that finishes: 30 steps."""
    yield from _story(cloud, boot_image, tmp_path_factory.mktemp(f"boot-{cloud}-done"), "boot-done", {**TRAINER_ENV, "STEPS": "30"})
