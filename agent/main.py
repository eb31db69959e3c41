"""Entry points: ``main`` at boot (disk, environment file, units), ``run`` (the job unit), ``watch``
(the watcher unit), ``shutdown`` (GCE's shutdown script, AWS's stop hook), ``busy``/``idle`` (pools).
Every entry point first settles which boot this is."""

from __future__ import annotations

import os
import sys

from agent.config import Config, load_default
from agent.events import Recorder
from agent.imds import Metadata
from agent.storage import Cloud
from agent.util import locked, log, read, remove, touch, write_atomic

# Each entry point imports what it uses, when it runs: the stop path's way from a notice to the
# trainer's SIGTERM pays for no module it does not need (bench/agent_latency.py).

# State of one boot, forgotten by the first entry point of the next.
BOOT_STATE = ("stopping", "notice", "signaled", "maintenance", "maintenance-stop", "instance", "zone", "run.pid",
              "watch.pid", "trainer.pid", "drained", "preempted-recorded", "shutdown", "busy", "reported",
              "powered-off")
ENTRIES = ("main", "run", "watch", "shutdown", "busy", "idle")


def boot(cfg: Config) -> None:
    """The first entry point to run in a boot forgets the previous boot's markers, pid files and
    identity; the others (and a second ``main``) find this boot recorded and keep what it wrote."""
    os.makedirs(cfg.state_dir, exist_ok=True)
    current = os.environ.get("SPOTCTL_BOOT_ID") or (read("/proc/sys/kernel/random/boot_id") or "unknown").strip()
    with locked(cfg.state("boot.lock"), 10):
        if (read(cfg.state("boot")) or "") == current:
            return
        for name in BOOT_STATE:
            remove(cfg.state(name))
        write_atomic(cfg.state("boot"), current)


def main_entry(cfg: Config, rec: Recorder, agent: str) -> int:
    from agent import disk, units
    from agent.code import CodeError
    from agent.code import workdir as code_workdir
    from agent.run import completed_before
    from agent.trainer import env_file_text

    rec.identify()
    try:
        device = disk.prepare(cfg)
    except RuntimeError as e:
        log(cfg, str(e))
        rec.record("failed", {"reason": f"job disk {cfg.disk_device} could not be mounted"})
        return 1
    if completed_before(cfg, rec):
        return 0
    try:
        where = code_workdir(cfg)
    except CodeError:
        where = cfg.mount_point  # run() records the error
    write_atomic(cfg.state("env"), env_file_text(cfg, where))
    os.makedirs(cfg.disk("checkpoints"), exist_ok=True)
    if not cfg.no_systemd:
        try:
            disk.add_to_fstab(cfg, device)
        except OSError:
            log(cfg, "could not add the job disk to " + cfg.fstab)
    units.start(cfg, agent)
    return 0


def main(argv: list[str]) -> int:
    entry = argv[0] if argv else "main"
    if entry not in ENTRIES:
        sys.stderr.write("usage: agent [{}]\n".format("|".join(ENTRIES)))
        return 2
    cfg = load_default()
    if cfg.kind != "pool" and entry in ("busy", "idle"):
        sys.stderr.write("busy/idle are for pools\n")
        return 2
    boot(cfg)
    meta = Metadata(cfg)
    cloud = Cloud(cfg, meta)
    rec = Recorder(cfg, meta, cloud)
    agent = os.path.realpath(sys.argv[0])
    if entry == "main":
        return main_entry(cfg, rec, agent)
    if entry == "run":
        from agent.run import run
        return run(cfg, meta, cloud, rec)
    if entry == "watch":
        from agent.watch import watch
        watch(cfg, meta, rec, cloud)
        rec.wait()
        return 0
    if entry == "shutdown":
        from agent.watch import shutdown
        shutdown(cfg, meta, rec)
        rec.wait()
        return 0
    from agent.watch import busy_sync
    if entry == "busy":
        touch(cfg.state("busy"))
    else:
        remove(cfg.state("busy"))
    return 0 if busy_sync(cfg, rec, cloud) else 1
