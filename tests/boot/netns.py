"""A network namespace of the test's own for one guest: a tap for QEMU, the gateway and the metadata
address on it, dnsmasq for DHCP and DNS (the clouds' names answered with the namespace's addresses).
Nothing in it reaches beyond it: no route out, no upstream DNS."""

from __future__ import annotations

import contextlib
import ctypes
import os
import socket
import subprocess
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

GATEWAY = "10.77.0.1"
GUEST_RANGE = ("10.77.0.10", "10.77.0.20")
METADATA_IP = "169.254.169.254"
TAP = "tap0"
CLONE_NEWNET = 0x40000000
T = TypeVar("T")


def _ip(*args: str, ns: str | None = None) -> None:
    cmd = ["ip", *(["-n", ns] if ns else []), *args]
    done = subprocess.run(cmd, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)}: {done.stderr.strip()}")


def in_namespace(name: str, make: Callable[[], T]) -> T:
    """``make()`` run in a thread that has entered the namespace: sockets it creates live there and
    serve from any thread afterwards (setns(2) moves only the calling thread)."""
    result: list = []

    def enter() -> None:
        try:
            libc = ctypes.CDLL(None, use_errno=True)
            fd = os.open(f"/var/run/netns/{name}", os.O_RDONLY)
            try:
                if libc.setns(fd, CLONE_NEWNET) != 0:
                    raise OSError(ctypes.get_errno(), "setns")
            finally:
                os.close(fd)
            result.append(make())
        except BaseException as exc:  # noqa: BLE001 - handed to the caller's thread
            result.append(exc)

    worker = threading.Thread(target=enter, name=f"netns-{name}")
    worker.start()
    worker.join()
    if isinstance(result[0], BaseException):
        raise result[0]
    return result[0]


class Namespace:
    """``with Namespace(workdir) as ns:``; ``ns.exec`` prefixes a command to run inside it."""

    def __init__(self, workdir: Path) -> None:
        self.name = f"spotctl-boot-{os.getpid()}-{int(time.monotonic() * 1000) % 100000}"
        self.workdir = workdir
        self.dnsmasq: subprocess.Popen | None = None

    @property
    def exec(self) -> list[str]:
        return ["ip", "netns", "exec", self.name]

    def __enter__(self) -> Namespace:
        _ip("netns", "add", self.name)
        try:
            _ip("link", "set", "lo", "up", ns=self.name)
            _ip("tuntap", "add", "dev", TAP, "mode", "tap", ns=self.name)
            _ip("addr", "add", f"{GATEWAY}/24", "dev", TAP, ns=self.name)
            _ip("addr", "add", f"{METADATA_IP}/32", "dev", TAP, ns=self.name)
            _ip("link", "set", TAP, "up", ns=self.name)
            self._start_dnsmasq()
        except BaseException:
            self.__exit__()
            raise
        return self

    def _start_dnsmasq(self) -> None:
        log = open(self.workdir / "dnsmasq.log", "w")  # noqa: SIM115 - the process's own
        self.dnsmasq = subprocess.Popen(
            [*self.exec, "dnsmasq", "--keep-in-foreground", "--no-resolv", "--no-hosts", "--user=root",
             "--bind-interfaces", f"--interface={TAP}", "--except-interface=lo", f"--listen-address={GATEWAY}",
             f"--dhcp-range={GUEST_RANGE[0]},{GUEST_RANGE[1]},255.255.255.0,12h",
             f"--dhcp-option=option:router,{GATEWAY}", f"--dhcp-option=option:dns-server,{GATEWAY}",
             f"--dhcp-leasefile={self.workdir / 'leases'}", "--pid-file=", "--log-facility=-", "--log-dhcp",
             # The clouds' names, as their DHCP/DNS would answer inside a VPC: the metadata server
             # (GCE's metadata.google.internal) and the public API names the scripts call.
             f"--address=/metadata.google.internal/{METADATA_IP}",
             f"--address=/googleapis.com/{GATEWAY}", f"--address=/amazonaws.com/{GATEWAY}"],
            stdout=log, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:  # up once it answers on port 53
            if self.dnsmasq.poll() is not None:
                raise RuntimeError(f"dnsmasq exited: {(self.workdir / 'dnsmasq.log').read_text()}")
            try:
                in_namespace(self.name, lambda: socket.create_connection((GATEWAY, 53), timeout=0.5).close())
                return
            except OSError:
                time.sleep(0.1)
        raise RuntimeError("dnsmasq did not come up")

    def __exit__(self, *exc: object) -> None:
        if self.dnsmasq is not None and self.dnsmasq.poll() is None:
            self.dnsmasq.terminate()
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.dnsmasq.wait(5)
        subprocess.run(["ip", "netns", "del", self.name], capture_output=True, check=False)


def remove_stale() -> None:
    """Namespaces an earlier run left (its process killed before its cleanup): named by its pid."""
    listed = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True, check=False).stdout
    for name in (line.split()[0] for line in listed.splitlines() if line.startswith("spotctl-boot-")):
        pid = name.split("-")[2]
        if pid.isdigit() and not os.path.exists(f"/proc/{pid}"):
            subprocess.run(["ip", "netns", "del", name], capture_output=True, check=False)


def can_make_namespaces() -> str:
    """"" when this machine lets the test make a namespace with a tap in it, else why not."""
    if os.geteuid() != 0:
        return "the boot tier needs root (network namespaces, a tap device, QEMU's disks)"
    if not os.path.exists("/dev/net/tun"):
        return "no /dev/net/tun: QEMU cannot get a tap device"
    name = f"spotctl-boot-probe-{os.getpid()}"
    try:
        _ip("netns", "add", name)
        try:
            _ip("tuntap", "add", "dev", TAP, "mode", "tap", ns=name)
        finally:
            subprocess.run(["ip", "netns", "del", name], capture_output=True, check=False)
    except (RuntimeError, FileNotFoundError) as exc:
        return f"cannot make a network namespace with a tap device here: {exc}"
    return ""
