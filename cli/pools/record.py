"""A pool's demand, kept in the stack's event bucket so it keeps arriving every minute.

The alarm that sizes an AWS pool (infra/aws_scaling.py) evaluates one-minute periods and goes to
INSUFFICIENT_DATA when no point arrives: the group then keeps its size. Demand is a level, not an
event, so ``spotctl pool demand`` writes it durably (``infra.naming.pool_demand_key``) besides
publishing it, and the watcher, which runs per stack anyway, publishes the last record again every
minute (``Republisher``) until the next ``pool demand`` changes it.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime, timedelta

from cli.pools.demand import Demand, PoolError, publish
from infra.config import StackConfig
from infra.naming import pool_demand_key

# CloudWatch alarms on a 60 s period see a missing minute as missing data (treat_missing_data
# "missing": the alarm keeps its state, then INSUFFICIENT_DATA), so one point per minute at least.
REPUBLISH_EVERY = timedelta(seconds=60)


@dataclass(frozen=True)
class Record:
    pool: str
    vms: int
    at: datetime

    def encode(self) -> bytes:
        return json.dumps({"pool": self.pool, "vms": self.vms, "at": self.at.isoformat()}, sort_keys=True).encode()

    @staticmethod
    def decode(data: bytes, pool: str) -> Record:
        """The record of ``pool``. Raises PoolError naming the pool when the object is not one."""
        try:
            raw = json.loads(data)
            record = Record(str(raw["pool"]), int(raw["vms"]), datetime.fromisoformat(raw["at"]))
        except (ValueError, KeyError, TypeError) as exc:
            raise PoolError(f"pool {pool}: its demand record is unreadable ({exc}); run `spotctl pool demand {pool} N` again") from None
        if record.pool != pool or record.vms < 0:
            raise PoolError(f"pool {pool}: its demand record names pool {record.pool!r} with {record.vms} VMs; "
                            f"run `spotctl pool demand {pool} N` again")
        return record


def write(cloud, bucket: str, stack: str, record: Record) -> None:
    """Replace the pool's record (a conditional write: of two writers racing, the later one retries
    once on the other's generation; its demand is the newer)."""
    from cli.cloud import PreconditionFailed

    key = pool_demand_key(stack, record.pool)
    for tries_left in (1, 0):
        found = cloud.read_object(bucket, key)
        try:
            cloud.write_object(bucket, key, record.encode(), found[1] if found else None)
            return
        except PreconditionFailed:
            if not tries_left:
                raise


def read(cloud, bucket: str, stack: str, pool: str) -> Record | None:
    found = cloud.read_object(bucket, pool_demand_key(stack, pool))
    return None if found is None else Record.decode(found[0], pool)


@dataclass
class Republisher:
    """The watcher's part: every ``REPUBLISH_EVERY`` publish each scaling pool's recorded demand."""

    last: dict[str, datetime] = field(default_factory=dict)

    def due(self, pool: str, now: datetime) -> bool:
        last = self.last.get(pool)
        return last is None or now - last >= REPUBLISH_EVERY or now < last

    def run(self, cfg: StackConfig, stack: str, cloud, pools, bucket: str, now: datetime,
            warn: Callable[[str], None]) -> list[tuple[str, Demand]]:
        """Publish what is due; a pool's failure is one warning and is tried again next cycle."""
        from cli.cloud import CloudError

        done: list[tuple[str, Demand]] = []
        for pool in cfg.pools:
            if pool.spot_max == 0 or not self.due(pool.name, now):
                continue
            try:
                record = read(cloud, bucket, stack, pool.name)
                if record is None:  # never published: the group keeps its size, as the alarm does
                    self.last[pool.name] = now
                    continue
                done.append((pool.name, publish(pools, cfg, stack, pool.name, record.vms, now)))
                self.last[pool.name] = now
            except (CloudError, PoolError) as exc:
                warn(f"pool {pool.name}: its demand was not published again this cycle ({exc})")
        return done
