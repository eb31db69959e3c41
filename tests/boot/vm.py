"""One guest under QEMU in the test's namespace: direct kernel boot of the cached image, a qcow2
boot disk over it (a new one per attempt, kept across a reboot), the job disk as a raw file (GCE: a
SCSI persistent disk named by its device name; AWS: an NVMe volume plugged in late through QMP),
QMP for the power button, a reset and the hard stop, and a second serial port on which the trainer
tells the host what it does (each line stamped by the host as it arrives)."""

from __future__ import annotations

import contextlib
import json
import os
import socket
import subprocess
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

from tests.boot.image import Image
from tests.boot.netns import TAP, Namespace

GCE_DEVICE_NAME = "spotctl-data"
_ACCEL: dict[str, str] = {}


def accelerator(image: Image, workdir: Path) -> str:
    """``SPOTCTL_BOOT_ACCEL`` (kvm|tcg), else KVM if /dev/kvm boots the kernel to its first console
    line within 10 s, else TCG. A nested KVM without hardware paging can be slower than TCG (one
    host here took over 40 s to decompress the kernel under KVM; TCG reached a login in ~60 s)."""
    chosen = os.environ.get("SPOTCTL_BOOT_ACCEL", "")
    if chosen in ("kvm", "tcg"):
        return chosen
    if "auto" not in _ACCEL:
        _ACCEL["auto"] = "tcg"
        if os.access("/dev/kvm", os.R_OK | os.W_OK):
            log = workdir / "kvm-probe.log"
            probe = subprocess.Popen(
                ["qemu-system-x86_64", "-accel", "kvm", "-m", "512", "-smp", "1", "-nodefaults", "-no-user-config",
                 "-display", "none", "-kernel", str(image.kernel), "-append", "console=ttyS0 panic=-1",
                 "-serial", f"file:{log}", "-no-reboot"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            deadline = time.monotonic() + 10
            while time.monotonic() < deadline and probe.poll() is None:
                if log.exists() and log.stat().st_size > 0:
                    _ACCEL["auto"] = "kvm"
                    break
                time.sleep(0.2)
            probe.kill()
            probe.wait()
    return _ACCEL["auto"]


class Qmp:
    """QMP over a unix socket: commands answered in order; events kept with the host's clock."""

    def __init__(self, path: Path) -> None:
        self.sock = socket.socket(socket.AF_UNIX)
        deadline = time.monotonic() + 30
        while True:
            try:
                self.sock.connect(str(path))
                break
            except OSError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.1)
        self.file = self.sock.makefile("rwb", buffering=0)
        self.events: list[tuple[float, str]] = []
        self._answers: list[dict] = []
        self._cond = threading.Condition()
        threading.Thread(target=self._read, daemon=True, name="qmp").start()
        self.command("qmp_capabilities")

    def _read(self) -> None:
        with contextlib.suppress(OSError, ValueError):  # QEMU gone (a power-off, the hard stop)
            for raw in self.file:
                msg = json.loads(raw)
                with self._cond:
                    if "event" in msg:
                        self.events.append((time.monotonic(), msg["event"]))
                    elif "return" in msg or "error" in msg:
                        self._answers.append(msg)
                    self._cond.notify_all()
        with self._cond:
            self._answers.append({"error": {"desc": "QMP closed"}})
            self._cond.notify_all()

    def command(self, name: str, **arguments: object) -> object:
        with self._cond:
            start = len(self._answers)
            self.file.write(json.dumps({"execute": name, **({"arguments": arguments} if arguments else {})}).encode() + b"\n")
            if not self._cond.wait_for(lambda: len(self._answers) > start, timeout=30):
                raise TimeoutError(f"QMP {name}: no answer")
            answer = self._answers[start]
        if "error" in answer:
            raise RuntimeError(f"QMP {name}: {answer['error'].get('desc')}")
        return answer["return"]

    def close(self) -> None:
        with contextlib.suppress(OSError):
            self.sock.close()


@dataclass
class Probe:
    """The trainer's lines on the second serial port, as (host monotonic time, line)."""

    path: Path
    lines: list[tuple[float, str]] = field(default_factory=list)

    def start(self) -> None:
        threading.Thread(target=self._read, daemon=True, name="probe").start()

    def _read(self) -> None:
        sock = socket.socket(socket.AF_UNIX)
        for _ in range(300):
            try:
                sock.connect(str(self.path))
                break
            except OSError:
                time.sleep(0.1)
        else:
            return
        buf = b""
        while True:
            try:
                chunk = sock.recv(4096)
            except OSError:
                return
            if not chunk:
                return
            buf += chunk
            while b"\n" in buf:
                line, buf = buf.split(b"\n", 1)
                text = line.decode(errors="replace").strip()
                if text:
                    self.lines.append((time.monotonic(), text))

    def first(self, prefix: str, after: float = 0.0) -> tuple[float, str] | None:
        return next(((t, line) for t, line in list(self.lines) if t >= after and line.startswith(prefix)), None)


class Guest:
    """One VM (one attempt's boot disk) of ``cloud`` with the job disk ``job_disk``."""

    def __init__(self, image: Image, workdir: Path, ns: Namespace, cloud: str, job_disk: Path, *,
                 volume_serial: str = "", memory_mb: int = 768) -> None:
        self.image, self.workdir, self.ns, self.cloud = image, workdir, ns, cloud
        self.job_disk, self.volume_serial, self.memory_mb = job_disk, volume_serial, memory_mb
        workdir.mkdir(parents=True, exist_ok=True)
        self.boot_disk = workdir / "boot.qcow2"
        subprocess.run(["qemu-img", "create", "-q", "-f", "qcow2", "-b", str(image.rootfs), "-F", "raw",
                        str(self.boot_disk)], check=True)
        self.console = workdir / "console.log"
        self.proc: subprocess.Popen | None = None
        self.qmp: Qmp | None = None
        self.probe: Probe | None = None
        self.exited_at: float | None = None
        self.boots = 0

    def _args(self) -> list[str]:
        accel = accelerator(self.image, self.workdir)
        append = ["root=/dev/vda", "rw", "console=ttyS0", "panic=-1"]
        args = ["qemu-system-x86_64", "-accel", accel, "-m", str(self.memory_mb), "-smp", "1", "-nodefaults",
                "-no-user-config", "-display", "none", "-machine", "pc",
                "-kernel", str(self.image.kernel), "-initrd", str(self.image.initrd),
                "-drive", f"file={self.boot_disk},if=virtio,format=qcow2,cache=writeback",
                "-netdev", f"tap,id=net0,ifname={TAP},script=no,downscript=no",
                "-device", "virtio-net-pci,netdev=net0,mac=42:01:0a:4d:00:0a",
                "-serial", f"file:{self.console}", "-serial", f"unix:{self.workdir / 'probe.sock'},server=on,wait=off",
                "-qmp", f"unix:{self.workdir / 'qmp.sock'},server=on,wait=off", "-rtc", "base=utc"]
        if self.cloud == "gcp":
            # Debian's GCE images run the guest agent, not cloud-init.
            append.append("cloud-init=disabled")
            args += ["-smbios", "type=1,manufacturer=Google,product=Google Compute Engine",
                     "-device", "virtio-scsi-pci,id=scsi0",
                     "-drive", f"file={self.job_disk},if=none,id=job,format=raw,cache=writeback",
                     "-device", f"scsi-hd,drive=job,bus=scsi0.0,serial={GCE_DEVICE_NAME}"]
        else:
            # cloud-init tells EC2 by its DMI (uuid starting ec2 and equal to the serial: cloud-init
            # 22.4.2 DataSourceEc2.identify_aws); the guest agent is off.
            append += [f"systemd.mask={u}" for u in ("google-guest-agent.service", "google-startup-scripts.service",
                                                      "google-shutdown-scripts.service")]
            uuid = "ec2e1a57-0000-4000-8000-000000000001"
            args += ["-smbios", f"type=1,manufacturer=Amazon EC2,product=t3.medium,serial={uuid},uuid={uuid}"]
        return [*args, "-append", " ".join(append)]

    def start(self) -> None:
        with open(self.console, "ab") as fh:
            fh.write(f"\n==== boot {self.boots + 1} ====\n".encode())
        for name in ("qmp.sock", "probe.sock"):
            with contextlib.suppress(FileNotFoundError):
                (self.workdir / name).unlink()
        self.exited_at = None
        # SPOTCTL_BOOT_NICE: the guest's CPU priority (e.g. -5 on a busy machine: an emulated
        # guest that gets a fraction of a core no longer runs in real time, and the clouds' budgets
        # are real time).
        nice = ["nice", "-n", os.environ["SPOTCTL_BOOT_NICE"]] if os.environ.get("SPOTCTL_BOOT_NICE") else []
        self.proc = subprocess.Popen([*self.ns.exec, *nice, *self._args()], stdout=open(self.workdir / "qemu.log", "ab"),  # noqa: SIM115
                                     stderr=subprocess.STDOUT)
        self.boots += 1
        self.qmp = Qmp(self.workdir / "qmp.sock")
        self.probe = Probe(self.workdir / "probe.sock")
        self.probe.start()
        threading.Thread(target=self._watch_exit, args=(self.proc,), daemon=True).start()

    def _watch_exit(self, proc: subprocess.Popen) -> None:
        proc.wait()
        if proc is self.proc:
            self.exited_at = time.monotonic()

    def plug_volume(self) -> None:
        """AWS: the EBS volume attached after the instance runs (a VolumeAttachment), as NVMe."""
        assert self.qmp is not None
        self.qmp.command("blockdev-add", driver="raw", **{"node-name": "job"},
                         file={"driver": "file", "filename": str(self.job_disk)})
        self.qmp.command("device_add", driver="nvme", id="ebs1", serial=self.volume_serial, drive="job")

    def power_button(self) -> float:
        assert self.qmp is not None
        self.qmp.command("system_powerdown")
        return time.monotonic()

    def reset(self) -> None:
        assert self.qmp is not None
        self.qmp.command("system_reset")

    def wait_off(self, timeout: float) -> bool:
        assert self.proc is not None
        try:
            self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            return False
        deadline = time.monotonic() + 2
        while self.exited_at is None and time.monotonic() < deadline:
            time.sleep(0.01)
        return True

    def hard_stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            with contextlib.suppress(Exception):
                assert self.qmp is not None
                self.qmp.command("quit")
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        if self.qmp is not None:
            self.qmp.close()

    def read_file(self, path: str) -> str | None:
        """A file of this VM's boot disk, the VM off (a raw copy, its journal replayed)."""
        raw = self.workdir / "boot.raw"
        subprocess.run(["qemu-img", "convert", "-U", "-O", "raw", str(self.boot_disk), str(raw)], check=True)
        try:
            return read_disk_file(raw, path)
        finally:
            raw.unlink(missing_ok=True)

    def console_text(self) -> str:
        return self.console.read_text(errors="replace") if self.console.exists() else ""


def read_disk_file(disk: Path, path: str) -> str | None:
    """A file from the job disk's ext4 filesystem, the VM off (debugfs: no mount needed), as the
    next boot would see it: after a hard stop, from a copy whose journal e2fsck has replayed."""
    done = subprocess.run(["debugfs", "-R", f"cat {path}", str(disk)], capture_output=True, text=True, check=False)
    if "Filesystem not open" in done.stderr or "checksum does not match" in done.stderr:
        copy = disk.with_suffix(".replayed")
        subprocess.run(["cp", "--sparse=always", str(disk), str(copy)], check=True)
        subprocess.run(["e2fsck", "-fy", str(copy)], capture_output=True, check=False)
        done = subprocess.run(["debugfs", "-R", f"cat {path}", str(copy)], capture_output=True, text=True, check=False)
        copy.unlink()
    if done.returncode != 0 or "File not found" in done.stderr or "not open" in done.stderr:
        return None
    return done.stdout


def filesystem_id(disk: Path) -> str | None:
    """The job disk's filesystem UUID and creation time (a new format changes both), read from its
    superblock on the host (mkfs writes it through; the guest may be running)."""
    done = subprocess.run(["dumpe2fs", "-h", str(disk)], capture_output=True, text=True, check=False)
    fields = dict(line.split(":", 1) for line in done.stdout.splitlines() if ":" in line)
    if done.returncode != 0 or "Filesystem UUID" not in fields:
        return None
    return f"{fields['Filesystem UUID'].strip()} {fields.get('Filesystem created', '').strip()}"


def new_job_disk(path: Path, size: str = "1G") -> Path:
    """A new, blank disk (reads as zeros: the scripts format only such a disk)."""
    path.unlink(missing_ok=True)
    subprocess.run(["truncate", "-s", size, str(path)], check=True)
    return path
