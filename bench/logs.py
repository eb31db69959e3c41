"""`spotctl logs` against the number of uploaded chunks: the whole log, then a `--follow` poll.

A synced copy of the bucket holds N chunks of one log (64-byte chunks: the count, not the bytes, is
what grew quadratically); `show` prints the whole log from it (``DirLogs``), in process, output
discarded. Then one `--follow` poll after one new chunk arrived. Prints the seconds per size and the
ratio to the smallest size, beside the chunk ratio: linear work grows as the chunks do (8.64x from
1,000 to 8,640, three days of 30-second uploads), quadratic as their square (75x). No assertions:
numbers vary with the machine.

Run: uv run python bench/logs.py [--sizes 1000,4000,8640] [--repeat 3]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from cli.lifecycle import logs  # noqa: E402


def chunks(root: Path, n: int) -> Path:
    folder = root / "team" / "train" / "attempt-1" / "node-0" / "logs"
    folder.mkdir(parents=True)
    for i in range(n):
        (folder / f"{i * 64:012d}.log").write_bytes(f"step {i:09d} loss 0.1234 lr 3e-4 tokens/s 123456 ....\n"[:63].encode() + b"\n")
    return folder


def whole(root: Path) -> float:
    started = time.perf_counter()
    logs.show(logs.DirLogs(root, "train", "team"), None, 0, lambda text: None)
    return time.perf_counter() - started


def one_poll(root: Path, folder: Path, n: int) -> float:
    """The second poll of a `--follow` (the first reads everything), after one new chunk arrived."""
    source = logs.DirLogs(root, "train", "team")
    polls = [0]

    def events(key):
        polls[0] += 1
        return [] if polls[0] < 2 else [logs.Event("train", 1, 0, "completed", logs_time(), {})]

    def sleep(_):
        (folder / f"{n * 64:012d}.log").write_bytes(b"x" * 63 + b"\n")
        marks.append(time.perf_counter())

    marks: list[float] = []
    source.events = events
    logs.show(source, None, 0, lambda text: None, follow=True, sleep=sleep)
    return time.perf_counter() - marks[0]


def logs_time():
    from datetime import UTC, datetime

    return datetime(2026, 11, 21, tzinfo=UTC)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--sizes", default="1000,4000,8640")
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    sizes = [int(s) for s in args.sizes.split(",")]
    rows = []
    for n in sizes:
        with tempfile.TemporaryDirectory() as tmp:
            root = Path(tmp)
            folder = chunks(root, n)
            full = statistics.median(whole(root) for _ in range(args.repeat))
            poll = statistics.median(one_poll(root, folder, n) for _ in range(args.repeat))
            (folder / f"{n * 64:012d}.log").unlink(missing_ok=True)
        rows.append((n, full, poll))
    base_n, base_full, base_poll = rows[0]
    print(f"{'chunks':>7} {'whole s':>9} {'x':>6} {'chunks x':>9} {'poll s':>8} {'x':>6}")
    for n, full, poll in rows:
        print(f"{n:>7} {full:>9.3f} {full / base_full:>6.2f} {n / base_n:>9.2f} {poll:>8.4f} {poll / base_poll:>6.2f}")


if __name__ == "__main__":
    main()
