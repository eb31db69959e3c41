"""A drill's temp dir and its watchdog: what the drill started is stopped, and its temp dir removed,
however the drill ends (cli/drill/runner.py ``run_drill``)."""

from __future__ import annotations

import contextlib
import signal
import tempfile
from collections.abc import Iterator
from pathlib import Path

from cli.drill.localvm import PID_FILES

ENDING_SIGNALS = (signal.SIGTERM, signal.SIGHUP, signal.SIGQUIT, signal.SIGUSR1, signal.SIGUSR2, signal.SIGALRM,
                  signal.SIGVTALRM, signal.SIGPROF, signal.SIGXCPU, signal.SIGXFSZ)

# The watchdog: a process of its own session (Ctrl-C to the drill's process group does not reach it)
# that waits for its stdin to close. The drill closes it once it cleaned up; the kernel closes it
# when the drill is killed (SIGKILL, the OOM killer), and then the watchdog does what the drill could
# not: SIGKILL every process group the drill's VMs started (their pid files) and remove the temp dir.
WATCHDOG = """
import os, shutil, signal, sys
sys.stdin.buffer.read()
tmp, names = sys.argv[1], set(sys.argv[2:])
for root, _, files in os.walk(tmp):
    for name in names.intersection(files):
        try:
            pid = int(open(os.path.join(root, name)).read().strip())
        except (OSError, ValueError):
            continue
        for target in (-pid, pid):
            try:
                os.kill(target, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
shutil.rmtree(tmp, ignore_errors=True)
"""


@contextlib.contextmanager
def watched_tmp() -> Iterator[Path]:
    """A temp dir for the drill, removed afterwards, with a watchdog (``WATCHDOG``) for a drill killed
    without a chance to clean up."""
    import shutil
    import subprocess
    import sys

    tmp = Path(tempfile.mkdtemp(prefix="spotctl-drill-"))
    dog = subprocess.Popen([sys.executable, "-I", "-S", "-c", WATCHDOG, str(tmp), *PID_FILES], stdin=subprocess.PIPE,
                           stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    try:
        yield tmp
    finally:
        shutil.rmtree(tmp, ignore_errors=True)  # before the watchdog is let go: it finds no pid file to act on
        with contextlib.suppress(OSError):
            dog.stdin.close()
        with contextlib.suppress(subprocess.TimeoutExpired):
            dog.wait(timeout=10)
