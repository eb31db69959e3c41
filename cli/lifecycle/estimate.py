"""What a stack or a job will cost before anything is created: $/h of each job at its capacity (spot
and on-demand side by side), of the parts that run whatever the jobs do (pools' on-demand base, NAT,
interface endpoints, the watcher VM), and a job's expected cost under its policy with a range.

Prices are offline only: ``spotctl:prices``, else the shipped table (``cli/cost/prices.json``, its date
named), else "unpriced"; the network parts from ``cli/cost/always_on.json`` (its sources there).
The expected cost replays the job's policy with the ``simulate`` machinery (``cli.policy.simulate``) on
a trace: one sampled from the zone's fitted history (``spotctl policy fit``) when there is one, else one
sampled from the shipped regimes (``cli/policy/regimes.json``). Never a trace file found on the machine:
the preview is the same wherever spotctl is installed (``spotctl simulate --trace`` replays a trace you give).
"""

from __future__ import annotations

import json
import random
from dataclasses import asdict, dataclass
from functools import cache
from pathlib import Path
from typing import Any

from infra.config import Job, StackConfig

ALWAYS_ON = Path(__file__).resolve().parent.parent / "cost" / "always_on.json"
STARTS = 8  # random starts per replay: each is a whole run of the policy (~0.5 s for a 60 h job)
SEED = 0
SAMPLED_DAYS = 30
TICK_S = 600


@dataclass(frozen=True)
class Rate:
    """$/h of one part: ``spot`` and ``on_demand`` (None: unpriced), and what it runs on now."""

    part: str
    detail: str
    spot: float | None
    on_demand: float | None
    capacity: str  # spot | on-demand: what counts in the total
    source: str

    @property
    def per_h(self) -> float | None:
        return self.spot if self.capacity == "spot" else self.on_demand


@dataclass(frozen=True)
class Expected:
    """A job's policy replayed: USD (mean, cheapest, dearest over the starts) and what it was replayed on."""

    job: str
    policy: str
    basis: str
    mean: float
    low: float
    high: float
    starts: int
    job_hours: float
    deadline_hours: float | None
    changeover_hours: float
    price_ratio: float
    spot_per_h: float


@cache
def _always_on() -> dict:
    return json.loads(ALWAYS_ON.read_text())


def job_rate(cfg: StackConfig, job: Job) -> Rate:
    """The job's nodes at its machine type's prices; ``capacity`` the job's."""
    from cli.cost.prices import offline_price

    machine = job.machine_type or job.instance_type or "?"
    price = offline_price(cfg, machine)
    nodes = job.nodes
    detail = f"{nodes} x {machine}" if nodes > 1 else machine
    if price is None:
        return Rate(f"job {job.id}", detail, None, None, job.capacity.value, "unpriced")
    return Rate(f"job {job.id}", detail, round(price.spot * nodes, 4), round(price.on_demand * nodes, 4),
                job.capacity.value, price.source)


def always_on(cfg: StackConfig) -> list[Rate]:
    """What bills by the hour whatever the jobs do: each pool's on-demand base, the egress (AWS NAT
    gateway, GCP Cloud NAT per VM), AWS interface endpoints (one per zone) and the watcher VM."""
    from cli.cost.prices import offline_price

    out: list[Rate] = []
    for pool in cfg.pools:
        if not pool.on_demand:
            continue
        machine = pool.machine_type or (pool.instance_types or ["?"])[0]
        price = offline_price(cfg, machine)
        od = round(price.on_demand * pool.on_demand, 4) if price else None
        out.append(Rate(f"pool {pool.name}", f"{pool.on_demand} x {machine}", None, od, "on-demand",
                        price.source if price else "unpriced"))
    table = _always_on()[cfg.cloud]
    if cfg.cloud == "aws" and cfg.egress == "nat":
        nat = table["natGateway"]
        out.append(Rate("NAT gateway", "1 gateway", None, nat["perHour"], "on-demand", _source(nat, cfg.region)))
    if cfg.cloud == "aws" and cfg.egress == "s3-endpoint":
        # The interface endpoints infra/aws.py declares: SSM for secret env, Auto Scaling for pools.
        services = [s for s, wanted in (("ssm", any(j.secret_keys for j in cfg.jobs)), ("autoscaling", bool(cfg.pools))) if wanted]
        if services:
            ep = table["interfaceEndpoint"]
            n = len(services) * len(cfg.zones)
            out.append(Rate("endpoints", f"{'+'.join(services)} x {len(cfg.zones)} zones", None, round(ep["perHour"] * n, 4),
                            "on-demand", _source(ep, cfg.region)))
    if cfg.cloud == "gcp" and cfg.egress == "nat":
        nat = table["cloudNat"]
        vms = sum(j.nodes for j in cfg.jobs if j.active) + sum(p.on_demand for p in cfg.pools)
        per_h = round(min(nat["perVmHour"] * vms, nat["maxPerHour"]), 4)
        out.append(Rate("Cloud NAT", f"{vms} VM{'' if vms == 1 else 's'}", None, per_h, "on-demand", _source(nat, cfg.region)))
    if cfg.watcher is not None:
        machine = cfg.watcher.machine(cfg.cloud)
        price = offline_price(cfg, machine)
        out.append(Rate("watcher VM", machine, None, price.on_demand if price else None, "on-demand",
                        price.source if price else "unpriced"))
    return out


def _source(entry: dict, region: str) -> str:
    where = "" if entry["region"] == region else f" (the {entry['region']} rate; {region} may differ)"
    return f"shipped table, {entry['date']}: {entry['source']}{where}"


# ---- the policy's expected cost ------------------------------------------------------------------------


def expected_cost(cfg: StackConfig, job: Job, learned: dict[str, Any], starts: int = STARTS) -> Expected | None:
    """The job's policy replayed on a trace (see the module docstring): None when the job gives no
    ``jobHours`` or its machine is unpriced. Without ``deadlineHours`` the range is all spot to all
    on-demand (no policy can be replayed without a deadline)."""
    from cli.lifecycle.capacity import DEFAULT_CHANGEOVER_H, DEFAULT_PRICE_RATIO, pool_key

    rate = job_rate(cfg, job)
    if job.job_hours is None or rate.spot is None or rate.on_demand is None:
        return None
    pool = (learned.get("pools") or {}).get(pool_key(job)) or {}
    changeover = float(pool.get("changeover_h") or DEFAULT_CHANGEOVER_H)
    ratio = rate.on_demand / rate.spot if rate.spot > 0 else DEFAULT_PRICE_RATIO
    if job.deadline_hours is None:
        low, high = job.job_hours * rate.spot, job.job_hours * rate.on_demand
        return Expected(job.id, job.policy, "no deadlineHours: between all spot and all on-demand", (low + high) / 2,
                        low, high, 0, job.job_hours, None, changeover, round(ratio, 6), rate.spot)
    from cli.policy import simulate as sim
    from cli.policy.policies import make_policy

    trace, basis = _trace(job, pool, job.deadline_hours)
    sjob = sim.Job(job.job_hours, job.deadline_hours, changeover, ratio)
    # The runs `spotctl simulate` makes of this policy (``sim.evaluate``: the same starts and seed), kept
    # whole for the range: the cheapest and the dearest start, not quartiles a skewed few runs fall outside.
    costs = [sim.simulate(make_policy(job.policy), trace, s, sjob).cost * rate.spot
             for s in sim.starts_for(trace, sjob, starts, SEED)]
    return Expected(job.id, job.policy, basis, sum(costs) / len(costs), min(costs), max(costs), starts,
                    job.job_hours, job.deadline_hours, changeover, ratio, rate.spot)


def _trace(job: Job, pool: dict[str, Any], deadline_h: float):
    from cli.policy.planning import Regime, pooled_regime

    if pool.get("spot_windows") and pool.get("up_rate") and pool.get("down_rate"):
        regime = Regime(f"{job.zone}/history", tuple(pool["up_rate"]), tuple(pool["down_rate"]))
        return sample_trace(regime, deadline_h), (f"a trace sampled from {job.zone}'s recorded history "
                                                  f"({pool['spot_windows']} spot windows, `spotctl policy fit`)")
    return sample_trace(pooled_regime(), deadline_h), f"a trace sampled from the shipped regimes (no history recorded in {job.zone})"


def sample_trace(regime, deadline_h: float, seed: int = SEED):
    """A spot availability trace drawn from a regime's hazards (10-minute ticks, at least 30 days)."""
    from cli.policy import simulate as sim
    from cli.policy.planning import bucket_of

    tick_h = TICK_S / 3600
    ticks = max(int(SAMPLED_DAYS * 24 / tick_h), int(2 * deadline_h / tick_h) + 2)
    rng = random.Random(f"{seed}/{regime.name}")
    available, age, out = True, 0.0, []
    for _ in range(ticks):
        out.append(available)
        age += tick_h
        if rng.random() < regime.flip_prob(available, bucket_of(age), tick_h):
            available, age = not available, 0.0
    return sim.Trace(regime.name, TICK_S, tuple(out))


# ---- the whole preview -----------------------------------------------------------------------------------


def preview(cfg: StackConfig, jobs: list[Job], expected: list[Expected] | None = None) -> dict[str, Any]:
    """The numbers (``--json``): each of ``jobs``' rate, the stack's other jobs that have VMs (one sum:
    the total is always the whole stack's, as ``plan`` shows it), the always-on parts, the hourly total
    at the jobs' capacities (None when anything counted is unpriced; ``total_known_per_h`` the priced
    part) and the expected costs."""
    rates = [job_rate(cfg, j) for j in jobs]
    runs = [j.active for j in jobs]  # (pending or running: it has VMs, so it counts in the total)
    shown_ids = {j.id for j in jobs}
    others = [job_rate(cfg, j) for j in cfg.jobs if j.active and j.id not in shown_ids]
    fixed = always_on(cfg)
    counted = [r for r, active in zip(rates, runs, strict=True) if active] + others + fixed
    known = round(sum(r.per_h or 0.0 for r in counted), 4)
    from cli.cost.prices import shipped_table

    return {
        "currency": "USD",
        "jobs": [asdict(r) | {"per_h": r.per_h, "runs": active} for r, active in zip(rates, runs, strict=True)],
        "other_jobs": {"jobs": [r.part.removeprefix("job ") for r in others],
                       "per_h": None if any(r.per_h is None for r in others) else round(sum(r.per_h or 0.0 for r in others), 4),
                       "known_per_h": round(sum(r.per_h or 0.0 for r in others), 4)},
        "always_on": [asdict(r) | {"per_h": r.per_h} for r in fixed],
        "total_per_h": None if any(r.per_h is None for r in counted) else known,
        "total_known_per_h": known,
        "unpriced": sorted({r.detail for r in rates + others + fixed if r.per_h is None}),
        "region": cfg.region,
        "price_table_date": max((e["date"] for e in shipped_table().get(cfg.cloud, {}).get(cfg.region, {}).values()), default=None),
        "expected": [asdict(e) for e in expected or []],
    }


def money(value: float | None) -> str:
    return "unpriced" if value is None else f"${value:,.2f}"


def render(doc: dict[str, Any], width: int = 80) -> list[str]:
    """The preview as lines of at most ``width`` columns: a table of $/h (a column that does not fit is
    dropped, never a figure cut), then the expected costs."""
    header = ("part", "what", "spot $/h", "on-demand $/h", "runs on")
    rows = [(r["part"], r["detail"], money(r["spot"]) if r["spot"] is not None or r["part"].startswith("job") else "-",
             money(r["on_demand"]), r["capacity"] if r.get("runs", True) else "no VMs") for r in doc["jobs"] + doc["always_on"]]
    cols = list(range(len(header)))
    while True:
        widths = [max(len(header[i]), *(len(row[i]) for row in rows)) if rows else len(header[i]) for i in cols]
        if sum(widths) + 2 * (len(cols) - 1) <= width or len(cols) <= 3:
            break
        cols.remove(1 if 1 in cols else 4)  # the description first, then the capacity: never a price

    def line(values) -> str:
        cells = [values[i].rjust(w) if "$" in header[i] else values[i].ljust(w) for i, w in zip(cols, widths, strict=True)]
        return "  ".join(cells).rstrip()

    out = [line(header), *(line(r) for r in rows)]
    others = doc.get("other_jobs") or {}
    if others.get("jobs"):
        sum_ = money(others["per_h"]) if others["per_h"] is not None else f"at least {money(others['known_per_h'])}"
        out.append(f"other jobs ({', '.join(others['jobs'])}): {sum_}/h")
    total = doc["total_per_h"]
    notes = ["the whole stack"] if others.get("jobs") else []
    if total is None:
        notes.append(f"unpriced: {', '.join(doc['unpriced'])}: neither spotctl:prices nor spotctl's shipped price table "
                     f"has {'it' if len(doc['unpriced']) == 1 else 'them'} in {doc.get('region', 'this region')}; add "
                     f"{'it' if len(doc['unpriced']) == 1 else 'them'} to spotctl:prices")
    figure = money(total) if total is not None else f"at least {money(doc.get('total_known_per_h', 0.0))}"
    out.append(f"total now: {figure}/h" + (f" ({'; '.join(notes)})" if notes else ""))
    if doc.get("price_table_date"):
        out.append(f"prices: shipped table of {doc['price_table_date']} (spotctl:prices in the stack file wins)")
    for e in doc["expected"]:
        hours = f"{e['job_hours']:g} h of work" + (f" by {e['deadline_hours']:g} h" if e["deadline_hours"] else "")
        out.append(f"job {e['job']}, policy {e['policy']}: expected {money(e['mean'])} ({money(e['low'])} to {money(e['high'])})")
        out.append(f"  {hours}; " + (e["basis"] if not e["starts"] else f"{e['starts']} runs on {e['basis']}"))
    return [_fit(x, width) for x in out]


def _fit(text: str, width: int) -> str:
    import textwrap

    return "\n".join(textwrap.wrap(text, width, subsequent_indent="    ", break_on_hyphens=False,
                                   break_long_words=False))  # (a path or a name stays whole, copyable) if len(text) > width else text
