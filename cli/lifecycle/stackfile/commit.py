"""Writing an edit under the lock, then pushing it to the shared copy (a lost race decides again)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from cli.lifecycle.stackfile.locking import locked
from cli.lifecycle.stackfile.proposal import held_back
from cli.lifecycle.stackfile.reading import _read_state
from cli.lifecycle.stackfile.shared import _SHARED, SYNC_TRIES, SharedCopyMoved, SharedCopyUnreachable, _shared_name
from cli.lifecycle.stackfile.writing import write_stack
from infra.basics import ConfigError


def _commit(path: Path, old_text: str, new_text: str) -> None:
    """Write the stack file (under the lock), then push it; a lost race puts the old text back,
    pulls what won, and raises SharedCopyMoved so the edit is decided again (``_synced``). A push that
    fails otherwise puts the old text back too and fails the command: nothing may be applied on an edit
    the other machines (the watcher) cannot see, or they act on the same event again."""
    session = _SHARED.get(_shared_name(path))
    expect = _read_state(old_text)  # a hand edit saved since the read is kept, never overwritten
    if session is None:
        write_stack(path, new_text, expect)
        return
    was = session.mark_unpushed()  # before the write: a kill -9 before the push leaves the mark
    try:
        written = write_stack(path, new_text, expect)  # (None: the file system dropped the stamp)
    except ConfigError:
        session.mark_unpushed(was)  # nothing written: a hand edit is not this command's to push
        raise
    if held_back(path):
        return  # an edit awaiting its confirmation (or its undo) stays here: pushed once confirmed (``publish``)
    try:
        session.push()
    except (SharedCopyMoved, SharedCopyUnreachable) as exc:
        try:
            write_stack(path, old_text, written)  # (a save made during the push is kept, not undone)
        except ConfigError:
            session.mark_unpushed(was)
            why = "the shared copy changed" if isinstance(exc, SharedCopyMoved) else f"{exc.source} {exc.problems[0]}"
            raise ConfigError(str(path), [f"{why}, and the file changed here while the edit was pushed (saved from an "
                                          "editor?): it is left as saved, nothing was pushed or applied; check it and run "
                                          "the command again"]) from None
        session.mark_unpushed(was)
        if isinstance(exc, SharedCopyMoved):
            session.pull()
            raise
        raise ConfigError(str(path), [f"{exc.source} {exc.problems[0]}: the edit was undone here and nothing was applied; "
                                      "run the command again"]) from None


def pull_shared(path: Path) -> None:
    """Pull the shared copy now (when the file is shared): a reader outside the lock sees its news too."""
    if _SHARED.get(_shared_name(path)) is not None:
        with locked(path):
            pass


def _synced(path: Path, edit: Callable[[], Any]) -> Any:
    """Run one locked edit; when its push lost a race, decide and write it again on what won."""
    with locked(path):
        for _ in range(SYNC_TRIES):
            try:
                return edit()
            except SharedCopyMoved:
                continue
    raise ConfigError(str(path), [f"the shared copy kept changing while this edit was written ({SYNC_TRIES} tries): "
                                  "run the command again"])


def publish(path: Path) -> None:
    """Push the confirmed edit now (a proposal is never pushed by ``_commit``): merged first with what
    the shared copy got meanwhile (the same job changed there too is a conflict: an error, nothing applied)."""
    session = _SHARED.get(_shared_name(path))
    if session is None:
        return
    for _ in range(SYNC_TRIES):
        try:
            with locked(path):  # pulls (merges) first
                session.push(force=True)
                return
        except SharedCopyMoved:
            continue
        except SharedCopyUnreachable as exc:
            raise ConfigError(str(path), [f"{exc.source} {exc.problems[0]}: nothing was applied"]) from None
    raise ConfigError(str(path), [f"the shared copy kept changing while this edit was pushed ({SYNC_TRIES} tries): "
                                  "run the command again"])
