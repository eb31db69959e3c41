"""The live policy path: a job about to be resumed, seen as the policy engine sees it (its progress
and the availability its events reveal), and the capacity its policy picks."""

from __future__ import annotations

from collections.abc import Callable
from datetime import UTC, datetime

from cli.lifecycle.events import Event, Timeline
from infra.config import Capacity, Job

DEFAULT_CHANGEOVER_H = 0.2
DEFAULT_PRICE_RATIO = 3.0
TICK_H = 1 / 6


def observation_for(job: Job, events: list[Event], now: datetime, changeover_h: float = DEFAULT_CHANGEOVER_H,
                    price_ratio: float = DEFAULT_PRICE_RATIO):
    """The policy's view of a job about to be resumed, and the availability history to replay."""
    from cli.policy.policies import IDLE, Observation

    tl = Timeline.of(events, now)
    start = tl.first_start or now
    hours = lambda a, b: max(0.0, (b - a).total_seconds() / 3600)  # noqa: E731
    progress = sum(hours(a, b) for a, b, _ in tl.runs)
    history: list[bool] = []
    cursor = start
    for a, b, _ in tl.runs:
        history += [False] * int(hours(cursor, a) / TICK_H)
        history += [True] * int(hours(a, b) / TICK_H)
        cursor = b
    history += [False] * int(hours(cursor, now) / TICK_H)
    obs = Observation(
        elapsed_h=hours(start, now), progress_h=progress, job_h=job.job_hours or 0.0,
        deadline_h=job.deadline_hours or 0.0, changeover_h=changeover_h, price_ratio=price_ratio, current=IDLE,
        spot_available=True, preemptions=sum(how == "preempted" for _, _, how in tl.runs), tick_h=TICK_H,
    )
    return obs, history


def policy_capacity(now: Callable[[], datetime] = lambda: datetime.now(UTC)):
    """A CapacityChooser that asks the job's policy (see cli/policy/policies.py), replaying its history."""
    from cli.policy.policies import ON_DEMAND, Observation, make_policy

    def choose(job: Job, events: list[Event]) -> Capacity:
        if not job.job_hours or not job.deadline_hours:
            return Capacity.SPOT  # without jobHours and deadlineHours no policy can weigh a deadline
        obs, history = observation_for(job, events, now())
        policy = make_policy(job.policy)
        for i, available in enumerate(history):
            t = i * TICK_H
            policy.decide(Observation(
                elapsed_h=t, progress_h=min(obs.progress_h, t), job_h=obs.job_h, deadline_h=obs.deadline_h,
                changeover_h=obs.changeover_h, price_ratio=obs.price_ratio, current="idle",
                spot_available=available, preemptions=0, tick_h=TICK_H,
            ))
        return Capacity.ON_DEMAND if policy.decide(obs) == ON_DEMAND else Capacity.SPOT

    return choose


