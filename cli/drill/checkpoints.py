"""Where a drilled script checkpointed, and how often: its ``SPOTCTL_CHECKPOINT`` lines, or else the files
it wrote in ``$SPOTCTL_CHECKPOINT_DIR`` (marked at the progress it had reported when they appeared)."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

FILE_LIMIT = 10_000  # files looked at per poll: a checkpoint directory holds a few


def snapshot(directory: Path) -> dict[str, int]:
    """Path -> mtime (ns) of the files under ``directory`` ({} when there is none)."""
    seen: dict[str, int] = {}
    for root, _dirs, files in os.walk(directory):
        for name in files:
            path = os.path.join(root, name)
            try:
                seen[path] = os.stat(path).st_mtime_ns
            except OSError:  # (replaced or removed between the listing and the stat)
                continue
            if len(seen) >= FILE_LIMIT:
                return seen
    return seen


class FileWatch:
    """The checkpoint directory as an attempt found it, and the progress reported when files appeared in
    it since (what was there before the attempt never counts)."""

    def __init__(self, directory: Path):
        self.directory = directory
        self.seen = snapshot(directory)
        self.last: tuple[int, int] | None = None  # (time ns, progress) of the previous look

    def marks(self, progress: int | None, now_ns: int) -> list[int]:
        """The progress at each file written or rewritten since the last look, ``progress`` being the
        script's now: between the two looks' progress, in proportion to the file's mtime (the script
        keeps stepping while the drill polls)."""
        now = snapshot(self.directory)
        mtimes = sorted({m for path, m in now.items() if self.seen.get(path) != m})
        self.seen = now
        if progress is None:
            return []
        before, self.last = self.last, (now_ns, progress)
        return [progress_at(m, before, (now_ns, progress)) for m in mtimes]


def progress_at(mtime_ns: int, before: tuple[int, int] | None, after: tuple[int, int]) -> int:
    """The progress at ``mtime_ns`` from the (time, progress) of the looks around it."""
    t1, p1 = after
    if before is None or not before[0] < mtime_ns < t1:
        return p1
    t0, p0 = before
    return round(p0 + (p1 - p0) * (mtime_ns - t0) / (t1 - t0))


def checkpoint_interval(attempts: list[Any]) -> int | None:
    """The largest number of steps between consecutive checkpoints of any attempt (or None when none
    was seen): its ``SPOTCTL_CHECKPOINT`` steps, or else the progress when checkpoint files appeared
    (from their mtimes, between two looks at the progress: about). An attempt's first step is its first progress report,
    so the count starts one step before it (a script saving every 50 steps from step 1 saves at 50)."""
    gaps = []
    for a in attempts:
        marks = sorted(set(a.checkpoints or a.checkpoint_files))
        base = a.start_progress - 1 if a.start_progress else 0
        for m in marks:
            if m > base:
                gaps.append(m - base)
                base = m
    return max(gaps) if gaps else None


def interval_words(interval: int | None) -> str:
    return (f"checkpoint interval {interval}" if interval is not None else
            "checkpoint interval unknown: no SPOTCTL_CHECKPOINT line, no file written to $SPOTCTL_CHECKPOINT_DIR")
