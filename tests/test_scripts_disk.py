"""The job disk is formatted only when blank; a disk with data is never touched."""

from __future__ import annotations

import hashlib
import os
import subprocess
from pathlib import Path

import pytest

from cli.drill.emulator import Emulator
from cli.drill.localvm import LocalVM, local_context
from infra.render import ScriptContext

MOUNT_SHIM = """#!/bin/bash
printf '%s\\n' "$*" >>"$MOUNT_RECORD"
"""
MOUNTPOINT_SHIM = """#!/bin/bash
exit 1
"""
# resize2fs on the (shimmed, so not really) mounted filesystem: recorded, then run offline for real.
RESIZE_SHIM = """#!/bin/bash
printf 'resize2fs %s\\n' "$*" >>"$MOUNT_RECORD"
e2fsck -f -p "$1" >/dev/null 2>&1
exec /sbin/resize2fs "$@"
"""


@pytest.fixture
def shims(tmp_path) -> Path:
    d = tmp_path / "shims"
    d.mkdir()
    for name, body in (("mount", MOUNT_SHIM), ("mountpoint", MOUNTPOINT_SHIM), ("resize2fs", RESIZE_SHIM)):
        (d / name).write_text(body)
        (d / name).chmod(0o755)
    return d


def boot_with_device(tmp_path: Path, shims: Path, device: Path, tag: str, aliases: tuple[str, ...] = ()):
    with Emulator() as emu:
        ctx = ScriptContext(cloud="gcp", stack="s", kind="job", name="j", command="true", event_bucket="b", region="r")
        ctx = local_context(ctx, emu, tmp_path / f"mnt-{tag}", tmp_path / f"state-{tag}")
        from dataclasses import replace

        vm = LocalVM(replace(ctx, disk_device=str(device), disk_aliases=aliases), tmp_path / f"vm-{tag}")
        env = {"PATH": f"{shims}:{os.environ['PATH']}", "MOUNT_RECORD": str(tmp_path / "mounts"), "SPOTCTL_RECORD_BUDGET_S": "1"}
        done = vm.boot(env=env)
        vm.wait_exit("run.pid", 10)
        vm.kill_all()
        return done, vm


def fs_uuid(device: Path) -> str:
    return subprocess.run(["blkid", "-p", "-s", "UUID", "-o", "value", str(device)], capture_output=True, text=True).stdout.strip()


def test_blank_disk_is_formatted_once_then_reused(tmp_path, shims):
    device = tmp_path / "disk.img"
    device.write_bytes(b"\0" * 16 * 1024 * 1024)
    done, _ = boot_with_device(tmp_path, shims, device, "1")
    assert done.returncode == 0, done.stderr
    uuid = fs_uuid(device)
    assert uuid, "a blank disk gets a filesystem"
    assert (tmp_path / "mounts").read_text().splitlines() == [f"-o defaults,discard {device} {tmp_path / 'mnt-1'}"]
    done, _ = boot_with_device(tmp_path, shims, device, "2")
    assert done.returncode == 0
    assert fs_uuid(device) == uuid, "a disk with a filesystem is never formatted again"


def test_disk_with_unknown_data_is_never_formatted(tmp_path, shims):
    device = tmp_path / "disk.img"
    device.write_bytes(os.urandom(4096) + b"\0" * (4 * 1024 * 1024))
    before = hashlib.sha256(device.read_bytes()).hexdigest()
    done, vm = boot_with_device(tmp_path, shims, device, "1")
    assert done.returncode == 1
    assert hashlib.sha256(device.read_bytes()).hexdigest() == before
    assert not (tmp_path / "mounts").exists()
    assert "not blank: refusing to format it" in vm.debug_log()
    (event,) = vm.events()
    assert event["event"] == "failed" and "could not be mounted" in event["details"]["reason"]


def test_a_disk_under_another_name_is_found(tmp_path, shims):
    """AWS Xen instance types have no NVMe by-id name: the volume attached as /dev/sdf appears as
    /dev/sdf or /dev/xvdf (EC2 device_naming.html); the script takes the first name that exists."""
    device = tmp_path / "xvdf"
    device.write_bytes(b"\0" * 16 * 1024 * 1024)
    missing = tmp_path / "by-id" / "nvme-Amazon_Elastic_Block_Store_vol0"
    done, vm = boot_with_device(tmp_path, shims, missing, "1", aliases=(str(tmp_path / "sdf"), str(device)))
    assert done.returncode == 0, (done.stderr, vm.debug_log())
    assert fs_uuid(device)
    assert (tmp_path / "mounts").read_text().splitlines() == [f"-o defaults,discard {device} {tmp_path / 'mnt-1'}"]
    assert f"job disk found as {device}" in vm.debug_log()


def test_a_disk_alias_must_be_a_device_path():
    with pytest.raises(ValueError, match="not an absolute device path"):
        ScriptContext(cloud="aws", stack="s", kind="job", name="j", command="true", event_bucket="b", region="r",
                      disk_aliases=("/dev/sdf; reboot",))


@pytest.mark.parametrize("cloud,wait_s", [("aws", 600), ("gcp", 120)])
def test_the_disk_wait_fits_how_each_cloud_attaches_it(cloud, wait_s, tmp_path):
    """AWS attaches the volume after the instance exists (a VolumeAttachment) and runs user data once."""
    from agent.config import Config
    from agent.disk import find_device

    ctx = ScriptContext(cloud=cloud, stack="s", kind="job", name="j", command="true", event_bucket="b", region="r",
                        disk_device=str(tmp_path / "never"), state_dir=str(tmp_path / "state"))
    slept = []
    assert find_device(Config.from_dict(ctx.agent_config()), sleep=slept.append) == ""
    assert len(slept) == wait_s


def test_a_disk_grown_by_disk_gb_gets_its_filesystem_grown(tmp_path, shims):
    """The cloud grows the device, not the filesystem: at the next boot the agent grows it to the
    device; a boot with nothing grown leaves it alone."""
    device = tmp_path / "disk.img"
    device.write_bytes(b"\0" * 16 * 1024 * 1024)
    assert boot_with_device(tmp_path, shims, device, "1")[0].returncode == 0
    with open(device, "ab") as fh:
        fh.truncate(32 * 1024 * 1024)  # diskGb raised: the device is twice the filesystem
    done, vm = boot_with_device(tmp_path, shims, device, "2")
    assert done.returncode == 0, (done.stderr, vm.debug_log())
    assert (tmp_path / "mounts").read_text().splitlines()[-1] == f"resize2fs {device}"
    assert "job disk grew" in vm.debug_log()
    from agent.disk import sizes

    assert sizes(str(device)) == (32 << 20, 32 << 20)
    boot_with_device(tmp_path, shims, device, "3")
    assert sum(line.startswith("resize2fs") for line in (tmp_path / "mounts").read_text().splitlines()) == 1
