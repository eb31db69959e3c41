"""Proposing an edit (held back from the shared copy until confirmed) and undoing one: a proposal
whose process died is undone by the next spotctl to take the lock."""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from infra.basics import ConfigError

if TYPE_CHECKING:
    from infra.config import StackConfig

from cli.lifecycle.stackfile.commit import pull_shared
from cli.lifecycle.stackfile.editing import update_job
from cli.lifecycle.stackfile.locking import ON_HOLD
from cli.lifecycle.stackfile.proposal import _local_only, _proposal, _proposer_alive, process_started, write_proposal
from cli.lifecycle.stackfile.refs import proposal_path
from cli.lifecycle.stackfile.shared import _SHARED, _shared_name
from cli.lifecycle.stackfile.splicing import MISSING


@contextlib.contextmanager
def proposing(path: Path) -> Iterator[None]:
    """While inside, this process's edits of ``path`` stay local (``held_back``) until ``publish``; on
    leaving, the record goes, and what is still unpushed (edits other spotctls made meanwhile) is pushed."""
    record = proposal_path(path)
    write_proposal(path, {"pid": os.getpid(), "started": process_started(os.getpid())})
    try:
        yield
    finally:
        with contextlib.suppress(FileNotFoundError):
            record.unlink()
        if _SHARED.get(_shared_name(path)) is not None:
            with contextlib.suppress(ConfigError):
                pull_shared(path)  # pushes what was held back meanwhile; an error here is the next command's


def restore_fields(path: Path, job_id: str, before: Mapping[str, Any], wrote: Mapping[str, Any]) -> None:
    """Put back the keys an edit set, under the lock, each only while it still holds what the edit
    wrote (a concurrent complete, failover or hand edit wins); a job removed meanwhile stays removed."""

    def keys(current: StackConfig, written: Any) -> dict[str, Any]:
        return {k: v for k, v in before.items() if k in wrote and written.get(k, MISSING) == wrote[k]} if written else {}

    update_job(path, job_id, keys)  # (a key the job did not have is removed: ``MISSING``)


def _drop_dead_proposal(path: Path) -> None:
    """Undo the proposal of a spotctl that died at its question (under the lock, before the pull)."""
    doc = _proposal(path)
    if doc is None and os.path.lexists(proposal_path(path)):
        from cli.lifecycle import cachefile

        cachefile.say_once(proposal_path(path), "not a record this user's spotctl sealed (an earlier version's, or carried "
                                                "by a commit): ignored; remove it once you have checked the stack file")
    if doc is None or _proposer_alive(doc):
        return
    if isinstance(doc.get("job"), str) and isinstance(doc.get("wrote"), dict):
        before = {**doc.get("before", {}), **{k: MISSING for k in doc.get("missing", [])}}
        _local_only.on = True
        try:
            restore_fields(path, doc["job"], before, doc["wrote"])
        except (ConfigError, KeyError, StopIteration):
            pass  # the file changed by hand meanwhile: what it says now stands
        finally:
            _local_only.on = False
    with contextlib.suppress(FileNotFoundError):
        proposal_path(path).unlink()


ON_HOLD.append(_drop_dead_proposal)
