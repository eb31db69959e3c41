"""How long the CLI takes to start, against `python -c "import typer"` (target, a short command
starts fast: `spotctl --help` and `spotctl status` <= 2 x import typer). Each figure is the median of --repeat fresh processes, all
measured in this one run, so the ratios hold whatever the machine's speed (wall and CPU time).

Run: uv run python bench/cli_startup.py [--repeat 7] [--jobs 100]
"""

from __future__ import annotations

import argparse
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench._stacks import write_stack  # noqa: E402


def median_seconds(argv: list[str], repeat: int, cwd: Path) -> tuple[float, float]:
    """(median wall seconds, median CPU seconds: user + system of the child, which a shared machine
    inflates far less than the wall time)."""
    times, cpu = [], []
    for _ in range(repeat):
        # (both sides without PYTHONDONTWRITEBYTECODE, which some hosts set: a module changed since the
        # last run would be compiled again at every start, never cached)
        r0 = resource.getrusage(resource.RUSAGE_CHILDREN)
        t0 = time.perf_counter()
        subprocess.run(argv, cwd=cwd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, check=True,
                       env={**{k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}, "COLUMNS": "120"})
        times.append(time.perf_counter() - t0)
        r1 = resource.getrusage(resource.RUSAGE_CHILDREN)
        cpu.append(r1.ru_utime - r0.ru_utime + r1.ru_stime - r0.ru_stime)
    return statistics.median(times), statistics.median(cpu)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=7)
    parser.add_argument("--jobs", type=int, default=100)
    args = parser.parse_args()
    spotctl = [sys.executable, "-m", "cli"]
    with tempfile.TemporaryDirectory() as tmp:
        stack = write_stack(Path(tmp), args.jobs)
        base = median_seconds([sys.executable, "-c", "import typer"], args.repeat, ROOT)
        rows = [
            ("spotctl --help", median_seconds(spotctl + ["--help"], args.repeat, ROOT)),
            (f"spotctl status ({args.jobs} jobs)", median_seconds(spotctl + ["status", "--stack-file", str(stack)], args.repeat, ROOT)),
        ]
    print(f"python -c 'import typer': {base[0]:.3f} s, CPU {base[1]:.3f} s (median of {args.repeat})")
    print(f"{'command':<28} {'seconds':>8} {'x typer':>8} {'CPU s':>8} {'x typer':>8}  target")
    for name, (secs, cpu) in rows:
        print(f"{name:<28} {secs:8.3f} {secs / base[0]:8.2f} {cpu:8.3f} {cpu / base[1]:8.2f}  <= 2.00")


if __name__ == "__main__":
    main()
