"""What ends a command from outside (Ctrl-C, SIGTERM, SIGHUP) while a change is under way: raised
as exceptions, so the change pipeline (``cli.lifecycle.pipeline``) can undo its edit."""

from __future__ import annotations

import contextlib
import signal
import threading
from collections.abc import Iterator
from typing import Any


class Interrupted(BaseException):  # noqa: N818 (like KeyboardInterrupt: not an error, never caught by ``except Exception``)
    """Ctrl-C, SIGTERM or SIGHUP (or the end of input at the question) before the update started: the
    edit was undone. ``str()`` says so; ``signum`` gives the exit code (128 + signum)."""

    def __init__(self, message: str, signum: int):
        super().__init__(message)
        self.signum = signum


class Signalled(BaseException):  # noqa: N818
    """SIGTERM or SIGHUP inside ``signals_raise``."""

    def __init__(self, signum: int):
        super().__init__(signum)
        self.signum = signum


STOPS = (KeyboardInterrupt, Signalled)
"""What ends a command from outside (Ctrl-C, SIGTERM, SIGHUP inside ``signals_raise``)."""


def signal_of(exc: BaseException) -> tuple[int, str]:
    """The signal number and name of a ``STOPS`` (or an end of input at the question: SIGINT, as Ctrl-C)."""
    signum = getattr(exc, "signum", signal.SIGINT)
    return signum, signal.Signals(signum).name


@contextlib.contextmanager
def signals_raise() -> Iterator[None]:
    """SIGTERM and SIGHUP raise (as Ctrl-C does) instead of ending the process on the spot, so the
    undo runs; the handlers before are put back after. Only the main thread can set handlers."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def raised(signum: int, frame: Any) -> None:
        raise Signalled(signum)

    old = {s: signal.signal(s, raised) for s in (signal.SIGTERM, signal.SIGHUP)}
    try:
        yield
    finally:
        for s, handler in old.items():
            signal.signal(s, handler)
