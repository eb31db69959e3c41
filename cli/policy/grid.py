"""The planning grid: a job on the simulator's integer timeline (units of ``gcd(tick, changeover)``
seconds), coarsened when a plan over the exact grid would not fit its state budget."""

from __future__ import annotations

import math
from dataclasses import dataclass

MAX_STATES = 400_000  # (steps + 1) * (work + 1) per plan: ~67 MB of float32 values, ~0.4 s to solve


@dataclass(frozen=True)
class Units:
    """A job on the integer timeline of the simulator: units of ``gcd(tick, changeover)`` seconds."""

    u_s: int
    tick: int
    change: int
    work: int
    deadline: int

    @classmethod
    def of(cls, tick_h: float, changeover_h: float, job_h: float, deadline_h: float) -> Units:
        tick_s = max(1, round(tick_h * 3600))
        d_s = round(changeover_h * 3600)
        u = math.gcd(tick_s, d_s) if d_s else tick_s
        return cls(u, tick_s // u, d_s // u, -(-round(job_h * 3600) // u), round(deadline_h * 3600) // u)

    @classmethod
    def fit(cls, tick_h: float, changeover_h: float, job_h: float, deadline_h: float,
            budget: int = MAX_STATES) -> tuple[Units, float]:
        """Units and planning tick for a job, coarsened until ``steps * work`` fits ``budget``.

        The exact units come first; then coarser units that divide the tick, the changeover rounded up
        by at most half of it and a quarter tick (every switch pays the excess: at d = 0.2 h on 320 s
        ticks a third more made tight deadlines shun spot, bench/policy.py cross-family); then
        planning ticks that are whole multiples of the decision tick.
        """
        tick_s = max(1, round(tick_h * 3600))
        d_s = round(changeover_h * 3600)
        exact = cls.of(tick_h, changeover_h, job_h, deadline_h)
        if exact.size <= budget:
            return exact, tick_h
        fallback = None
        for m in range(1, 1000):
            plan_s = tick_s * m
            for u in _divisors(plan_s, at_least=exact.u_s):
                units = cls(u, plan_s // u, -(-d_s // u), -(-round(job_h * 3600) // u), round(deadline_h * 3600) // u)
                if units.size <= budget:
                    if units.change * u - d_s <= min(0.5 * d_s, tick_s / 4) or not d_s:
                        return units, plan_s / 3600
                    fallback = fallback or (units, plan_s / 3600)
                    break
        if fallback is None:
            raise ValueError(f"a {deadline_h} h deadline is too long to plan")
        return fallback

    @property
    def size(self) -> int:
        return (self.steps + 1) * (self.max_work + 1)

    @property
    def steps(self) -> int:
        return -(-self.deadline // self.tick)

    @property
    def max_work(self) -> int:
        return self.work + 2 * self.change


def _divisors(n: int, at_least: int) -> list[int]:
    small = [x for x in range(1, math.isqrt(n) + 1) if n % x == 0]
    return sorted(x for x in {*small, *(n // x for x in small)} if x >= at_least)
