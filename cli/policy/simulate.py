"""Replay spot availability traces against policies, and bound them with the omniscient optimum.

The timeline is integer: one unit is ``gcd(tick, changeover)`` seconds, so progress, changeover
and time are exact and the simulator and the optimum use the very same arithmetic.

The omniscient lower bound is an exact dynamic program over (tick, mode, changeover left, progress)
that knows the whole trace. Every run of every policy is one path through the same state graph
with the same costs, so the DP's minimum is <= the cost of every policy on every start: a bound by
construction, and tight (it is the offline optimum of the model).
"""

from __future__ import annotations

import json
import math
import random
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from cli.policy.policies import IDLE, ON_DEMAND, SPOT, Decision, Observation, Policy, make_policy

PAPER_PRICE_RATIO = 3.06 / 0.9731  # p3.2xlarge on-demand / spot, as in the paper


@dataclass(frozen=True)
class Trace:
    name: str
    gap_s: int
    available: tuple[bool, ...]

    @property
    def hours(self) -> float:
        return len(self.available) * self.gap_s / 3600


TRACE_LIMIT = 64 << 20  # a trace file: a year of 10-minute ticks is ~200 KB


def _read_regular(path: Path) -> bytes:
    """A trace file's bytes: a regular file (a FIFO or /dev/zero is never read for ever) of at most
    ``TRACE_LIMIT`` bytes, else OSError saying which. (As ``infra.basics.read_regular``: this part
    imports nothing of spotctl's.)"""
    import errno
    import os
    import stat

    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
    with open(fd, "rb", buffering=0) as fh:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise OSError(errno.EINVAL, "not a regular file")
        data = fh.read(TRACE_LIMIT + 1)
    if len(data) > TRACE_LIMIT:
        raise OSError(errno.EFBIG, f"larger than {TRACE_LIMIT >> 20} MiB")
    return data


def load_trace(path: Path, inverted: bool = False) -> Trace:
    """Read a spot-traces JSON (``{"metadata": {"gap_seconds"}, "data": [...]}``, value > 0 = available)
    or a probe CSV (``index,timestamp,fail`` with fail = 1 = unavailable).

    ``inverted`` reads JSON values as "1 = unavailable" (the ADRS copies).
    """
    text = _read_regular(path).decode()
    if path.suffix == ".json":
        doc = json.loads(text)
        gap = int(doc.get("metadata", {}).get("gap_seconds", 600))
        values = [int(v) for v in doc["data"]]
        available = tuple((v == 0) if inverted else (v > 0) for v in values)
    else:
        rows = [line.split(",") for line in text.splitlines() if line.strip()]
        gap = 600
        available = tuple(int(r[2]) == 0 for r in rows)
    if not available:
        raise ValueError(f"{path}: no ticks")
    return Trace(path.stem, gap, available)


@dataclass(frozen=True)
class Job:
    job_h: float
    deadline_h: float
    changeover_h: float
    price_ratio: float = PAPER_PRICE_RATIO


@dataclass
class Timeline:
    """Integer units for one (trace, job)."""

    q_s: int  # seconds per unit
    tick: int  # units per tick
    work: int  # units of compute the job needs
    change: int  # units per changeover
    deadline: int  # units until the deadline

    @classmethod
    def of(cls, trace: Trace, job: Job) -> Timeline:
        """Units of gcd(tick, changeover) seconds. Work rounds up and the deadline down to whole units
        (at most one unit of caution), the same for the simulator and the optimum."""
        d_s = round(job.changeover_h * 3600)
        q = math.gcd(trace.gap_s, d_s) if d_s else trace.gap_s
        work = -(-round(job.job_h * 3600) // q)
        deadline = round(job.deadline_h * 3600) // q
        return cls(q, trace.gap_s // q, work, d_s // q, deadline)

    def h(self, units: float) -> float:
        return units * self.q_s / 3600


@dataclass
class Run:
    cost: float  # in spot-hours (spot = 1)
    spot_h: float
    od_h: float
    finish_h: float
    missed: bool
    preemptions: int
    launches: int
    modes: list[str] = field(default_factory=list)  # per tick, for plots
    progress: list[float] = field(default_factory=list)


@dataclass
class Meter:
    """One job's running account in a simulation (integer units): where it runs, what it paid, how far it got."""

    tl: Timeline
    price_ratio: float
    mode: Decision = IDLE
    over: int = 0  # changeover left
    progress: int = 0
    cost_units: float = 0.0
    spot_u: int = 0
    od_u: int = 0
    launches: int = 0

    def step(self, decision: Decision) -> int | None:
        """One tick of ``decision`` (a new mode is a launch); the units spent in this tick when the job finished in it."""
        tl = self.tl
        if decision == IDLE:
            self.mode, self.over = IDLE, 0
            return None
        if decision != self.mode:
            self.mode, self.over, self.launches = decision, tl.change, self.launches + 1
        use = min(self.over, tl.tick)
        gain = tl.tick - use
        price = 1.0 if self.mode == SPOT else self.price_ratio
        spent = use + (tl.work - self.progress) if self.progress + gain >= tl.work else None
        self.cost_units += price * (tl.tick if spent is None else spent)
        made = gain if spent is None else spent - use
        if self.mode == SPOT:
            self.spot_u += made
        else:
            self.od_u += made
        self.progress += made
        self.over -= use
        return spent


def simulate(policy: Policy, trace: Trace, start: int, job: Job, record: bool = False) -> Run:
    """Run one job from tick ``start`` of ``trace``. After the deadline a missed job finishes on
    on-demand (so its cost stays comparable) and is flagged."""
    tl = Timeline.of(trace, job)
    m = Meter(tl, job.price_ratio)
    preemptions = 0
    modes: list[str] = []
    prog: list[float] = []
    i = 0
    while True:
        t = i * tl.tick
        idx = start + i
        available = trace.available[idx] if idx < len(trace.available) else False
        if m.mode == SPOT and not available:
            m.mode, m.over, preemptions = IDLE, 0, preemptions + 1
        if t >= tl.deadline:
            decision: Decision = ON_DEMAND  # missed: finish on on-demand
        else:
            obs = Observation(
                elapsed_h=tl.h(t), progress_h=tl.h(m.progress), job_h=job.job_h, deadline_h=job.deadline_h,
                changeover_h=job.changeover_h, price_ratio=job.price_ratio, current=m.mode, spot_available=available,
                preemptions=preemptions, tick_h=tl.h(tl.tick),
            )
            decision = policy.decide(obs)
            if decision == SPOT and not available:
                decision = IDLE
        spent = m.step(decision)
        if record:
            modes.append(m.mode)
            prog.append(tl.h(m.progress))
        if spent is not None:
            finish = t + spent
            return Run(
                cost=tl.h(m.cost_units), spot_h=tl.h(m.spot_u), od_h=tl.h(m.od_u), finish_h=tl.h(finish),
                missed=finish > tl.deadline, preemptions=preemptions, launches=m.launches, modes=modes, progress=prog,
            )
        i += 1


def omniscient(trace: Trace, start: int, job: Job) -> float:
    """Exact minimum cost (spot-hours) to finish by the deadline knowing the whole trace; inf if
    even that is impossible. Same model and arithmetic as :func:`simulate`."""
    tl = Timeline.of(trace, job)
    k = job.price_ratio
    P, D = tl.work, tl.change
    INF = math.inf
    # cost[m][o] is a vector over progress 0..P-1; m: 0 idle, 1 spot, 2 on-demand; o: changeover left.
    cost = np.full((3, D + 1, P), INF)
    cost[0, 0, 0] = 0.0
    best = INF
    n_ticks = -(-tl.deadline // tl.tick)
    for i in range(n_ticks):
        idx = start + i
        available = trace.available[idx] if idx < len(trace.available) else False
        t = i * tl.tick
        new = np.full_like(cost, INF)
        for m in range(3):
            for o in range(D + 1):
                src = cost[m, o]
                if not np.isfinite(src).any():
                    continue
                if m == 1 and not available:
                    continue  # preempted: handled as idle below
                new[0, 0] = np.minimum(new[0, 0], src)  # wait
                for m2, price in ((1, 1.0), (2, k)):
                    if m2 == 1 and not available:
                        continue
                    o0 = o if m2 == m else D
                    use = min(o0, tl.tick)
                    gain = tl.tick - use
                    o_next = o0 - use
                    # finishing within this tick
                    first = max(P - gain, 0)
                    if first < P:
                        p = np.arange(first, P)
                        spent = use + (P - p)
                        ok = t + spent <= tl.deadline
                        if ok.any():
                            best = min(best, float(np.min((src[first:] + price * spent)[ok])))
                    if gain == 0:
                        new[m2, o_next] = np.minimum(new[m2, o_next], src + price * tl.tick)
                    elif P - gain > 0:
                        new[m2, o_next, gain:] = np.minimum(new[m2, o_next, gain:], src[: P - gain] + price * tl.tick)
        # A spot state whose spot vanishes at the next tick is a preemption: it becomes idle.
        cost = new
        nxt = start + i + 1
        if not (trace.available[nxt] if nxt < len(trace.available) else False):
            cost[0, 0] = np.minimum(cost[0, 0], cost[1].min(axis=0))
            cost[1] = INF
    return tl.h(best) if best < INF else INF


def all_on_demand_cost(job: Job) -> float:
    return (job.job_h + job.changeover_h) * job.price_ratio


@dataclass
class Summary:
    policy: str
    trace: str
    runs: int
    mean_norm_cost: float
    p25: float
    p75: float
    misses: int
    spot_h: float
    od_h: float
    gap_to_opt: float | None


def starts_for(trace: Trace, job: Job, n: int, seed: int) -> list[int]:
    window = math.ceil(job.deadline_h * 3600 / trace.gap_s) + 1
    last = len(trace.available) - window
    if last < 0:
        raise ValueError(f"{trace.name}: {trace.hours:.1f} h of trace is shorter than the {job.deadline_h} h deadline")
    rng = random.Random(f"{seed}/{trace.name}")
    return [rng.randint(0, last) for _ in range(n)]


def evaluate(traces: Sequence[Trace], policies: Sequence[str], job: Job, n_starts: int, seed: int,
             with_optimum: bool = True, params: dict[str, dict] | None = None) -> list[Summary]:
    """Every policy (and the omniscient bound) on the same random starts of every trace."""
    out: list[Summary] = []
    base = all_on_demand_cost(job)
    for trace in traces:
        starts = starts_for(trace, job, n_starts, seed)
        opt = [omniscient(trace, s, job) for s in starts] if with_optimum else None
        names = list(policies) + (["omniscient"] if with_optimum else [])
        for name in names:
            if name == "omniscient":
                costs = [c for c in opt if math.isfinite(c)]
                runs = None
            else:
                runs = [simulate(make_policy(name, **(params or {}).get(name, {})), trace, s, job) for s in starts]
                costs = [r.cost for r in runs]
            norm = np.array(costs) / base
            mean_cost = float(np.mean(costs))
            gap = None
            if opt is not None and name != "omniscient":
                feasible = [c for c in opt if math.isfinite(c)]
                gap = mean_cost / float(np.mean(feasible)) - 1 if feasible else None
            out.append(Summary(
                policy=name, trace=trace.name, runs=len(costs), mean_norm_cost=float(np.mean(norm)),
                p25=float(np.percentile(norm, 25)), p75=float(np.percentile(norm, 75)),
                misses=sum(r.missed for r in runs) if runs else 0,
                spot_h=float(np.mean([r.spot_h for r in runs])) if runs else math.nan,
                od_h=float(np.mean([r.od_h for r in runs])) if runs else math.nan,
                gap_to_opt=gap if name != "omniscient" else 0.0,
            ))
    return out


def render_table(rows: Sequence[Summary]) -> str:
    """One block per trace (its name a line of its own), a row per policy: within 80 columns."""
    width = max([len("policy"), *(len(r.policy) for r in rows)])
    header = f"{'policy':<{width}} {'runs':>4} {'cost':>6} {'p25':>6} {'p75':>6} {'miss':>4} {'spot h':>7} {'od h':>6} {'gap':>7}"
    lines = [header, "-" * len(header)]
    trace = None
    for r in rows:
        if r.trace != trace:
            trace = r.trace
            lines.append(f"{trace}:")
        gap = "" if r.gap_to_opt is None else f"{100 * r.gap_to_opt:+.1f}%"
        spot = "" if math.isnan(r.spot_h) else f"{r.spot_h:.1f}"
        od = "" if math.isnan(r.od_h) else f"{r.od_h:.1f}"
        lines.append(f"{r.policy:<{width}} {r.runs:>4} {r.mean_norm_cost:>6.3f} {r.p25:>6.3f} {r.p75:>6.3f} "
                     f"{r.misses:>4} {spot:>7} {od:>6} {gap:>7}".rstrip())
    lines.append("cost: mean cost / all-on-demand cost; gap: mean cost vs the omniscient optimum")
    return "\n".join(lines) + "\n"


def overall(rows: Sequence[Summary]) -> list[Summary]:
    """One row per policy over all traces (means of the per-trace means)."""
    out = []
    for name in dict.fromkeys(r.policy for r in rows):
        mine = [r for r in rows if r.policy == name]
        gaps = [r.gap_to_opt for r in mine if r.gap_to_opt is not None]
        out.append(Summary(
            policy=name, trace="(all)", runs=sum(r.runs for r in mine),
            mean_norm_cost=float(np.mean([r.mean_norm_cost for r in mine])),
            p25=float(np.mean([r.p25 for r in mine])), p75=float(np.mean([r.p75 for r in mine])),
            misses=sum(r.misses for r in mine), spot_h=float(np.mean([r.spot_h for r in mine])),
            od_h=float(np.mean([r.od_h for r in mine])), gap_to_opt=float(np.mean(gaps)) if gaps else None,
        ))
    return out


def plot(path: Path, trace: Trace, start: int, job: Job, policies: Sequence[str], rows: Sequence[Summary]) -> None:
    """Timeline of one run per policy (availability, mode, progress vs deadline) and a cost bar chart."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    tl = Timeline.of(trace, job)
    fig, (ax, bars) = plt.subplots(2, 1, figsize=(12, 8.5), gridspec_kw={"height_ratios": [3, 2]})
    ticks = -(-tl.deadline // tl.tick) + 1
    hours = [tl.h(i * tl.tick) for i in range(ticks)]
    avail = [1 if (start + i < len(trace.available) and trace.available[start + i]) else 0 for i in range(ticks)]
    ax.fill_between(hours, 0, [a * job.job_h for a in avail], step="post", color="#cfe8cf", label="spot available")
    modes = {"spot": "#2a9d4b", "on-demand": "#d1495b", "idle": "#bbbbbb"}
    palette = plt.get_cmap("tab10")
    colour = {name: palette(i % 10) for i, name in enumerate(dict.fromkeys([*policies, "omniscient"]))}  # one per policy
    lane = job.job_h / 18  # height of one policy's mode bar, below the progress curves
    for k, name in enumerate(policies):
        run = simulate(make_policy(name), trace, start, job, record=True)
        x = [tl.h(i * tl.tick) for i in range(len(run.progress))]
        ax.step(x, run.progress, where="post", color=colour[name], label=f"{name} progress")
        y = -(k + 1) * 1.5 * lane
        for xi, mode in zip(x, run.modes, strict=True):
            ax.plot([xi, xi + tl.h(tl.tick)], [y, y], color=modes[mode], lw=5, solid_capstyle="butt")
        ax.text(-0.01 * job.deadline_h, y, name, ha="right", va="center", fontsize=8, color=colour[name])
    for mode, c in modes.items():  # legend entries for the bars' colours
        ax.plot([], [], color=c, lw=5, label=f"mode bar: {mode}")
    ax.axvline(job.deadline_h, color="black", ls="--", label="deadline")
    ax.plot([0, job.deadline_h], [0, job.job_h], color="gray", ls=":", label="uniform progress")
    ax.set_xlabel("hours since start")
    ax.set_ylabel("progress (h of compute)")
    ax.set_title(f"{trace.name}, start tick {start}: C={job.job_h} h, R={job.deadline_h} h, d={job.changeover_h} h")
    ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize=8, borderaxespad=0)  # off the data
    summary = overall(rows)
    means = [r.mean_norm_cost for r in summary]
    spread = [[m - r.p25 for m, r in zip(means, summary, strict=True)], [r.p75 - m for m, r in zip(means, summary, strict=True)]]
    bars.bar([r.policy for r in summary], means, yerr=spread, capsize=4,
             color=[colour.get(r.policy, "#457b9d") for r in summary])
    bars.set_ylabel("mean cost / all-on-demand")
    bars.set_title("cost over all traces and starts (whiskers: p25-p75 over starts)")
    for i, r in enumerate(summary):
        bars.text(i, r.p75, f"{r.mean_norm_cost:.3f}", ha="center", va="bottom", fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110, format="png")
    plt.close(fig)
