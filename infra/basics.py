"""The few config names the CLI needs before any stack file is read: the namespace, the job states,
the capacities and ConfigError. Kept apart from ``infra.config`` (pydantic models) so that
``spotctl --help`` and option parsing never pay for building the models."""

from __future__ import annotations

import enum
from collections.abc import Sequence

NAMESPACE = "spotctl"
MAX_JOB_NODES = 64  # nodes of one job (a gang); a `started` event claiming more is not believed either


class JobState(enum.StrEnum):
    """States of a training job; the legal moves between them live in ``cli/lifecycle/states.py``."""

    PENDING = "pending"
    RUNNING = "running"
    PREEMPTED = "preempted"
    STOPPED = "stopped"
    COMPLETED = "completed"
    FAILED = "failed"


class Capacity(enum.StrEnum):
    SPOT = "spot"
    ON_DEMAND = "on-demand"


class ConfigError(Exception):
    """A stack file that cannot be used. ``str()`` is the full, user-facing message."""

    def __init__(self, source: str, problems: Sequence[str]):
        self.source = source
        self.problems = list(problems)
        super().__init__("\n".join(f"{source}: {p}" for p in self.problems))
