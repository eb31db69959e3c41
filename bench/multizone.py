"""The zone choice (cli/policy/zones.py) on aligned multi-zone traces, against staying in one zone.

Two sets (../shared/traces/README.md):

- ``--set dev`` (the development set, tuned on): the time-aligned Oct-2022 us-west-2a/2b series of
  one GPU type (skypilot-spot-traces aws-10-26-2022, 600 s ticks), random starts, C = 48 h,
  R = 52 h, d = 0.2 h, the stack's recorded history = the week before each start.
- ``--set adrs`` (HELD OUT: measured, never tuned on): the ADRS multi-region protocol
  (UCB-ADRS/ADRS-Leaderboard problems/cant_be_late_multi/evaluator.py): the Feb-2023 windows of
  ``cant_be_late_multi_real_traces.tar.gz`` (195 s ticks), its six scenarios (2 to 9 zones, 2 to
  8 windows each), C = 48 h, R = 52 h, d = 0.2 h, p3.2xlarge prices ($3.06 on-demand, $0.9731
  spot), start in the scenario's first zone, no history before the window. Score =
  clip((OD - cost) / (OD - SPOT), 0, 1) x 100 with OD = 3.06 x 48 and SPOT = 0.9731 x 48, the
  cost being the mean over scenarios of the mean over windows (the evaluator's).

What a strategy may observe under the ADRS protocol (read in its simulator,
problems/cant_be_late_multi/resources/cant-be-late-simulator/sky_spot/env.py, ``MultiTraceEnv``):
``_step`` is handed only the current region's ``has_spot``, but the same ``self.env`` offers
``get_all_regions_spot_available()`` and ``spot_available_in_region(i)`` for every region at the
current tick, and ``switch_region(i)`` costs nothing until a VM starts there (the evaluator passes
no ``--region-switch-overhead-hours``: a move costs the restart overhead only). The published
entries use it: LEVI calls ``get_all_regions_spot_available()``, GEPA switches to each region and
reads ``spot_available()`` (solutions/cant_be_late_multi/*/resources/solution.py). So the
protocol's rule is every zone's spot state now, free: ``probe`` here, the headline figure.

Every setting runs the job's policy (``--policy``) three ways: ``probe`` (the protocol's rule;
also a stack with a job or pool in each zone), and as labeled extras ``own`` (only the zone the
job is in, while it is there: one job alone) and ``stay`` (placed in the first zone, never moves:
the one-zone baseline). ``--move-hours`` are the move costs: 0 is the ADRS protocol's "a move is
a restart" (the launch's changeover only); minutes to an hour are a disk's snapshot and restore.

Where our rules are stricter than the ADRS simulator's: a running spot VM never changes zone
for free (there, switching region while on spot costs nothing), and the last partial tick is billed
for the time used, not the whole tick (at most $0.17 per run).

Run: uv run python bench/multizone.py --set dev [--starts 256] [--policy uniform-progress-nh]
     uv run python bench/multizone.py --set adrs --policy default --move-hours 0,0.25,0.5,1 [--extras own,stay]
     uv run python bench/multizone.py --set latency   (the first zone decision's time and memory)
"""

from __future__ import annotations

import argparse
import io
import json
import sys
import tarfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from cli.policy.multizone import KNOWLEDGE, Move, Zones, aligned, load_zones, simulate_zones  # noqa: E402
from cli.policy.simulate import Job, Trace, starts_for  # noqa: E402

SHARED = ROOT.parent.parent / "shared" / "traces"
if not SHARED.exists():  # a worktree under /work/wt/NAME, or the main checkout next to shared/
    SHARED = ROOT.parent / "shared" / "traces"
DEV = SHARED / "skypilot-spot-traces" / "availability" / "1-node" / "aws-10-26-2022"
HELD_OUT = SHARED / "adrs-leaderboard" / "cant_be_late_multi_real_traces.tar.gz"

OD_PRICE, SPOT_PRICE = 3.06, 0.9731  # the ADRS simulator's sky_spot/utils.py COSTS (p3.2xlarge)
ADRS_JOB = Job(48.0, 52.0, 0.2, OD_PRICE / SPOT_PRICE)
OD_ANCHOR, SPOT_ANCHOR = OD_PRICE * 48, SPOT_PRICE * 48
# problems/cant_be_late_multi/evaluator.py FULL_TEST_SCENARIOS: (name, zones, windows 0..n-1)
SCENARIOS = [
    ("2_zones_same_region", ["us-east-1a", "us-east-1c"], 8),
    ("2_regions_east_west", ["us-east-2a", "us-west-2a"], 8),
    ("3_regions_diverse", ["us-east-1a", "us-east-2b", "us-west-2c"], 6),
    ("3_zones_same_region", ["us-east-1a", "us-east-1c", "us-east-1d"], 6),
    ("5_regions_high_diversity", ["us-east-1a", "us-east-1f", "us-west-2a", "us-west-2b", "us-east-2b"], 4),
    ("all_9_regions", ["us-east-2a", "us-west-2c", "us-east-1d", "us-east-2b", "us-west-2a", "us-east-1f",
                       "us-east-1a", "us-west-2b", "us-east-1c"], 2),
]


# results/cant_be_late_multi/<entry>/results.json at UCB-ADRS/ADRS-Leaderboard f856497d: score, avg cost
PUBLISHED = (("GEPA", 68.74, 78.03), ("ShinkaEvolve", 67.74, 79.02), ("OpenEvolve", 66.70, 80.06),
             ("baseline (greedy)", 64.58, 82.19))
EXTRAS = {"own": "only the job's own zone seen", "stay": "never moves (the one-zone baseline)"}


def held_out_windows() -> dict[tuple[str, int], Trace]:
    """Every (zone, window) of the held-out tarball, read in memory (its macOS ``._`` entries skipped)."""
    out = {}
    with tarfile.open(HELD_OUT) as tar:
        for member in tar.getmembers():
            parts = Path(member.name).parts
            if not member.isfile() or len(parts) != 3 or parts[-1].startswith("._") or not parts[-1].endswith(".json"):
                continue
            doc = json.load(io.TextIOWrapper(tar.extractfile(member)))
            zone = parts[1].removesuffix("_v100_1")
            out[zone, int(Path(parts[2]).stem)] = Trace(zone, int(doc["metadata"]["gap_seconds"]),
                                                         tuple(v == 0 for v in doc["data"]))  # inverted: 1 = unavailable
    return out


def score_of(cost: float) -> float:
    """The evaluator's normalised score of a mean cost."""
    return max(0.0, min(1.0, (OD_ANCHOR - cost) / (OD_ANCHOR - SPOT_ANCHOR))) * 100


def adrs_run(windows, policy: str, move_h: float, knowledge: str) -> tuple[float, int, list[float]]:
    """(mean cost over the scenarios, late runs, each scenario's mean cost) of one setting."""
    costs, late = [], 0
    for _name, zones, n in SCENARIOS:
        runs = [simulate_zones(policy, aligned([windows[z, i] for z in zones]), 0, ADRS_JOB, Move(move_h), knowledge)
                for i in range(n)]
        costs.append(float(np.mean([r.cost for r in runs])) * SPOT_PRICE)
        late += sum(r.missed for r in runs)
    return float(np.mean(costs)), late, costs


def adrs(policy: str, moves: list[float], extras: list[str]) -> None:
    windows = held_out_windows()
    print(f"ADRS multi-region protocol (held out: Feb-2023 windows), policy {policy}")
    print("observation rule: every zone's spot state at the current tick, free (the simulator's env)\n")
    for move_h in moves:
        began = time.time()
        cost, late, per = adrs_run(windows, policy, move_h, "probe")
        what = "a move = a restart (the protocol)" if move_h == 0 else f"a move takes {move_h:g} h more"
        print(f"{what}: score {score_of(cost):.1f} ({late} late), mean cost ${cost:.2f}   "
              + " ".join(f"{n.split('_')[0]}:{c:.0f}" for (n, _z, _k), c in zip(SCENARIOS, per, strict=True))
              + f"  ({time.time() - began:.0f} s)", flush=True)
        for knowledge in extras:
            if knowledge == "stay" and move_h != moves[0]:
                continue  # (never moves: the same at every move cost)
            cost, late, _ = adrs_run(windows, policy, move_h, knowledge)
            print(f"    extra, {knowledge} ({EXTRAS[knowledge]}): score {score_of(cost):.1f} ({late} late), "
                  f"${cost:.2f}", flush=True)
    print("\npublished (the evaluator does not count late runs): "
          + ", ".join(f"{n} {s:.2f} (${c:.2f})" for n, s, c in PUBLISHED))
    print("score: clip((OD - cost)/(OD - SPOT)) x 100, OD = $146.88, SPOT = $46.71; cost: mean over the 6 scenarios")


def dev(policy: str, moves: list[float], starts: int, gpu: str, seed: int) -> None:
    zones: Zones = load_zones([DEV / f"us-west-2a_{gpu}.json", DEV / f"us-west-2b_{gpu}.json"])
    job = Job(48.0, 52.0, 0.2)
    first = starts_for(zones.traces[0], job, starts, seed)
    base = (job.job_h + job.changeover_h) * job.price_ratio
    print(f"development: Oct-2022 us-west-2a/2b {gpu}, {starts} starts, C=48 R=52 d=0.2, policy {policy}, "
          "history: the week before\n")
    print(f"{'move h':>6}  " + "  ".join(f"{k:>22}" for k in KNOWLEDGE) + "   (cost / all on-demand, misses, moves)")
    for move_h in moves:
        cells = []
        for knowledge in KNOWLEDGE:
            runs = [simulate_zones(policy, zones, s, job, Move(move_h), knowledge, history_ticks=7 * 144) for s in first]
            cost = float(np.mean([r.cost for r in runs])) / base
            cells.append(f"{cost:>8.3f} {sum(r.missed for r in runs):>3} {np.mean([r.moves for r in runs]):>5.2f} mv")
        print(f"{move_h:>6g}  " + "  ".join(cells), flush=True)


def latency(jobs: int, attempts: int, pool_vms: int, repeat: int = 5) -> None:
    """The first zone decision of a resume (``cli.lifecycle.zonechoice.decide_zone``) on a stack of
    ``jobs`` jobs of ``attempts`` spot attempts each and a pool of ``pool_vms`` preempted VMs: wall
    and CPU time after the imports, then ``repeat - 1`` more of the same decision (their least CPU time
    says how much of the first one was a busy machine), and one more for its peak allocation (tracemalloc)."""
    import tracemalloc
    from datetime import UTC, datetime, timedelta

    import cli.policy.failover  # noqa: F401  (decide_zone's lazy imports: "after the imports", as for every size)
    import cli.policy.zones  # noqa: F401
    from cli.lifecycle.events import Event
    from cli.lifecycle.zonechoice import decide_zone
    from infra.config import validate

    now = datetime(2026, 11, 28, tzinfo=UTC)
    zones = ["us-east-1a", "us-east-1b", "us-east-1c"]
    spec = [{"id": f"j{i}", "instanceType": "p3.2xlarge", "zone": zones[i % 3], "command": "x", "capacity": "spot",
             "attempt": attempts, "state": "preempted" if i == 0 else "running", "jobHours": 400, "deadlineHours": 600}
            for i in range(jobs)]
    cfg = validate({"cloud": "aws", "region": "us-east-1", "zones": zones, "jobs": spec,
                    "pools": [{"name": "gpus", "instanceTypes": ["p3.2xlarge"], "spotMax": 8}]}, "bench")
    events = {}
    for i in range(jobs):
        evs = []
        for a in range(1, attempts + 1):
            begun = now - timedelta(hours=3 * (attempts - a) + 3)
            evs += [Event(f"j{i}", a, 0, "started", begun, {"capacity": "spot"}),
                    Event(f"j{i}", a, 0, "preempted", begun + timedelta(hours=2.5), {})]
        events[f"j{i}"] = evs[:-1] if i else evs
    events["gpus"] = [Event("gpus", 1, 0, kind, now - timedelta(hours=h), {}, zones[v % 3], f"i-{v}")
                      for v in range(pool_vms) for kind, h in (("busy", 5 + v % 7), ("preempted", 1 + v % 5))]
    job = cfg.job("j0")
    cpus = []
    for _ in range(repeat):  # the first run is the first decision; the others tell the machine's noise from it
        wall, cpu = time.perf_counter(), time.process_time()
        decision = decide_zone(cfg, job, events, now)
        cpus.append((time.process_time() - cpu, time.perf_counter() - wall))
    tracemalloc.start()  # (apart: tracing every allocation slows the decision down several times)
    decide_zone(cfg, job, events, now)
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    (first_cpu, first_wall), rest = cpus[0], [c for c, _ in cpus[1:]] or [cpus[0][0]]
    n = sum(len(v) for v in events.values())
    print(f"first zone decision: {jobs} jobs x {attempts} attempts + {pool_vms} pool VMs ({n} events): wall {first_wall * 1000:.1f} ms, "
          f"CPU {first_cpu * 1000:.1f} ms = {first_cpu / 0.1:.2f} of the goal (the next {repeat - 1}: min {min(rest) * 1000:.1f} ms), "
          f"peak {peak / 2**20:.2f} MB (goal <= 100 ms, <= 2 MB); "
          f"{'moves to ' + decision.zone if decision and decision.move else 'stays'}; "
          f"{first_cpu * 1e6 / n:.1f} us CPU per event")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--set", choices=("dev", "adrs", "latency"), default="dev")
    parser.add_argument("--policy", default="uniform-progress-nh", help="the job's spot/on-demand policy in each zone")
    parser.add_argument("--move-hours", default="0,0.25,0.5,1", help="move costs (hours), comma-separated")
    parser.add_argument("--starts", type=int, default=256)
    parser.add_argument("--gpu", default="v100_1")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--extras", default="", help="adrs: also own,stay (labeled, not the protocol's rule)")
    args = parser.parse_args()
    moves = [float(x) for x in args.move_hours.split(",") if x]
    if args.set == "latency":
        for jobs, attempts, vms in ((2, 5, 0), (20, 20, 100), (50, 50, 500), (100, 200, 5000)):
            latency(jobs, attempts, vms)
    elif args.set == "adrs":
        if not HELD_OUT.exists():
            sys.exit(f"held-out traces not found: {HELD_OUT}")
        extras = [x for x in args.extras.split(",") if x]
        if unknown := [x for x in extras if x not in EXTRAS]:
            sys.exit(f"--extras: {', '.join(unknown)}: one of {', '.join(EXTRAS)}")
        adrs(args.policy, moves, extras)
    else:
        if not DEV.exists():
            sys.exit(f"development traces not found under {DEV}")
        dev(args.policy, moves, args.starts, args.gpu, args.seed)


if __name__ == "__main__":
    main()
