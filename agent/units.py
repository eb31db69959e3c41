"""Starting the agent's long-running entry points: as systemd units on a VM, as background processes
in their own sessions without systemd (containers, ``spotctl drill``, SPOTCTL_NO_SYSTEMD=1).

At shutdown systemd stops units in the inverse of their start-up order (systemd.unit(5) Before=/After=)
and unmounts a file system only after every unit with ``RequiresMountsFor=`` on it has stopped
(https://www.freedesktop.org/software/systemd/man/latest/systemd.unit.html#RequiresMountsFor=). So the
job, the watcher, the AWS stop hook and GCE's shutdown-script unit all hold the job disk: the
checkpoint event the trainer's SIGTERM produced lands on it, never on a boot disk the next attempt
replaces."""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys

from agent.config import Config
from agent.util import log, pid_alive, pid_file, write_atomic

# GCE's guest agent runs the shutdown script as this unit's ExecStop
# (https://github.com/GoogleCloudPlatform/guest-agent/blob/main/google-shutdown-scripts.service).
GCE_SHUTDOWN_UNIT = "google-shutdown-scripts.service"


def _exec(python: str, agent: str, entry: str) -> str:
    return f"{python} -E -S {agent} {entry}"


def unit_files(cfg: Config, python: str, agent: str) -> dict[str, str]:
    """{path relative to the systemd dir: text} of every unit file (pure)."""
    safe = re.sub(r"[^A-Za-z0-9_.-]", "_", cfg.name)
    gcp_before = f"Before={GCE_SHUTDOWN_UNIT}\n" if cfg.cloud == "gcp" else ""
    env = "Environment=SPOTCTL_CONFIG={}\n".format(cfg.state("config.json"))
    files = {}
    # The run process flushes the trainer's last checkpoint event itself after the trainer's budget.
    files[cfg.unit + ".service"] = (
        "[Unit]\nDescription=spotctl %s %s (attempt %d, node %d)\nWants=network-online.target\n"
        "After=network-online.target\nRequiresMountsFor=%s\n%s\n"
        "[Service]\nType=simple\n%sExecStart=%s\nKillMode=mixed\nKillSignal=SIGTERM\nTimeoutStopSec=%d\nRestart=no\n\n"
        "[Install]\nWantedBy=multi-user.target\n"
    ) % (cfg.kind, safe, cfg.attempt, cfg.node_rank, cfg.mount_point, gcp_before, env, _exec(python, agent, "run"),
         cfg.stop_budget_s + 8)
    # Stopped after the stop path has run: it may be recording the preemption then.
    files["spotctl-watch.service"] = (
        "[Unit]\nDescription=spotctl preemption watcher\nAfter=network-online.target\nRequiresMountsFor={}\n{}\n"
        "[Service]\nType=simple\n{}ExecStart={}\nRestart=on-failure\nRestartSec=2\n\n[Install]\nWantedBy=multi-user.target\n"
    ).format(cfg.mount_point, gcp_before, env, _exec(python, agent, "watch"))
    if cfg.cloud == "aws":
        # AWS runs no shutdown script: this unit's ExecStop is ours. Ordered after the job and the
        # watcher, so at shutdown it runs before they are stopped.
        files["spotctl-stop.service"] = (
            "[Unit]\nDescription=spotctl stop hook\nWants=network-online.target\n"
            "After=network-online.target %s.service spotctl-watch.service\nRequiresMountsFor=%s\n\n"
            "[Service]\nType=oneshot\nRemainAfterExit=yes\n%sExecStart=/bin/true\nExecStop=%s\nTimeoutStopSec=%d\n\n"
            "[Install]\nWantedBy=multi-user.target\n"
        ) % (cfg.unit, cfg.mount_point, env, _exec(python, agent, "shutdown"), cfg.notice_s)
    else:
        # Ordering only, no RequiresMountsFor= (which adds Requires=): on a boot without the job disk
        # the guest agent's unit must still start and run the shutdown script, not fail with the
        # mount (systemd.unit(5): RequiresMountsFor= "adds dependencies of type Requires= and After=",
        # https://www.freedesktop.org/software/systemd/man/latest/systemd.unit.html#RequiresMountsFor=).
        files[GCE_SHUTDOWN_UNIT + ".d/spotctl.conf"] = "[Unit]\nAfter=%s\n" % mount_unit(cfg.mount_point)
    return files


def mount_unit(path: str) -> str:
    """The mount unit's name for ``path``, as ``systemd-escape --path --suffix=mount`` makes it: the
    path without its outer slashes, "/" as "-", every byte not in [A-Za-z0-9:_.] (and a leading ".")
    as ``\\xNN`` (systemd.unit(5) "String Escaping for Inclusion in Unit Names",
    https://www.freedesktop.org/software/systemd/man/latest/systemd.unit.html#String%20Escaping%20for%20Inclusion%20in%20Unit%20Names)."""
    parts = [p for p in path.split("/") if p]
    if not parts:
        return "-.mount"
    out = []
    for i, byte in enumerate("/".join(parts).encode()):
        ch = chr(byte)
        if ch == "/":
            out.append("-")
        elif (ch.isascii() and (ch.isalnum() or ch in ":_.")) and not (i == 0 and ch == "."):
            out.append(ch)
        else:
            out.append("\\x%02x" % byte)
    return "".join(out) + ".mount"


def unit_names(cfg: Config) -> list[str]:
    return (["spotctl-stop.service"] if cfg.cloud == "aws" else []) + ["spotctl-watch.service", cfg.unit + ".service"]


def start_systemd(cfg: Config, python: str, agent: str) -> None:
    for rel, text in unit_files(cfg, python, agent).items():
        path = os.path.join(cfg.systemd_dir, rel)
        os.makedirs(os.path.dirname(path), exist_ok=True)
        write_atomic(path, text)
    units = unit_names(cfg)
    subprocess.run(["systemctl", "daemon-reload"], check=False)
    if cfg.cloud == "aws":
        # Enabled, so a reboot or stop/start brings the job back: by default AWS runs user data only
        # at the first boot (https://repost.aws/knowledge-center/execute-user-data-ec2).
        if subprocess.run(["systemctl", "enable", *units], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                          check=False).returncode != 0:
            log(cfg, "could not enable " + " ".join(units))
    else:
        # Not enabled: GCE runs the startup script at every boot, after the guest agent; enabled units
        # would run the previous boot's agent before this one's is in place.
        subprocess.run(["systemctl", "disable", *units], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, check=False)
    # To the disk now (units, drop-in, enable links): ext4 allocates a new file's blocks up to 30 s
    # after the write (delayed allocation); a reset before that left the units just written empty,
    # and on AWS (user data runs once) the job never came back (found by tests/boot/).
    os.sync()
    subprocess.run(["systemctl", "start", "--no-block", *units], check=False)


def start_local(cfg: Config, python: str, agent: str) -> None:
    """Background processes in their own sessions; a second start in the same boot starts nothing twice."""
    for entry, pid_name in (("watch", "watch.pid"), ("run", "run.pid")):
        pid = pid_file(cfg, pid_name)
        if pid is not None and pid_alive(pid):
            continue
        with open(cfg.state("spotctl.log"), "ab") as out:
            proc = subprocess.Popen([python, "-E", "-S", agent, entry], stdin=subprocess.DEVNULL, stdout=out, stderr=out,
                                    start_new_session=True, env=dict(os.environ, SPOTCTL_CONFIG=cfg.state("config.json")))
        write_atomic(cfg.state(pid_name), str(proc.pid))


def entry_script(cfg: Config, python: str, agent: str) -> str:
    """``<state>/spotctl.sh``: the agent's entry points for a person or a pool's agent on the VM
    (``/var/lib/spotctl/spotctl.sh busy``), the same on every image and agent version."""
    return "#!/bin/sh\n# Runs this VM's spotctl agent: spotctl.sh busy|idle (pools), main|run|watch|shutdown.\n" \
        "SPOTCTL_CONFIG=%s exec %s -E -S %s \"$@\"\n" % (shlex.quote(cfg.state("config.json")), shlex.quote(python),
                                                        shlex.quote(agent))


def start(cfg: Config, agent: str) -> None:
    write_atomic(cfg.state("spotctl.sh"), entry_script(cfg, sys.executable, agent), 0o755)
    if cfg.no_systemd or not _has_systemctl():
        start_local(cfg, sys.executable, agent)
    else:
        start_systemd(cfg, sys.executable, agent)


def _has_systemctl() -> bool:
    return any(os.access(os.path.join(d, "systemctl"), os.X_OK) for d in os.environ.get("PATH", "/usr/bin:/bin").split(":"))
