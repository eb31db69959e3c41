"""GCP pool demand keeps arriving every minute, as on AWS: the watcher publishes the recorded demand
again (to Cloud Monitoring, here a local fake of its gRPC API), and its project role holds exactly the
Monitoring write that takes (and, with a fallback, the reads a publication makes), nothing without a
scaling pool."""

from __future__ import annotations

import random
from datetime import UTC, datetime, timedelta

import pytest

from cli.cloud import pool_cloud
from cli.lifecycle import stackfile
from cli.plan import mocks as planner
from cli.pools import record
from cli.watch import observe, watcher
from infra.config import validate
from infra.naming import owner_value, pool_demand_key
from tests.fixtures.fake_gce import FakeGce
from tests.fixtures.fake_monitoring import FakeMonitoring
from tests.test_watcher_iam import gcp_raw, roles_of

T0 = datetime(2026, 11, 28, 12, 0, tzinfo=UTC)
BUCKET = "example-gcp-events"
POOL = {"name": "l4", "machineType": "g2-standard-8", "accelerator": {"type": "nvidia-l4", "count": 1},
        "onDemand": 1, "spotMin": 0, "spotMax": 4}
MONITORING = {"monitoring.timeSeries.create", "monitoring.timeSeries.list", "compute.instanceGroupManagers.get"}


class BucketOnly:
    """The stack's event bucket holding one object, and nothing new to observe."""

    def __init__(self, objects: dict[str, bytes]):
        self.objects = objects

    def read_object(self, bucket, key):
        return (self.objects[key], "1") if key in self.objects else None

    def stored_since(self, *args, **kwargs):
        return [], []  # (objects, sub-folders)

    def __getattr__(self, name):  # any other observation finds nothing
        return lambda *a, **k: []


def _project_role(raw: dict) -> set[str]:
    p = planner.run(validate(raw, "x"), "team")
    return roles_of(p)["projects/proj-1/roles/spotctl_team_watcher_project"]


def test_the_gcp_watcher_may_publish_pool_demand_only_with_a_scaling_pool():
    assert _project_role({**gcp_raw(), "pools": [POOL]}) & MONITORING == {"monitoring.timeSeries.create"}
    fallback = _project_role({**gcp_raw(), "pools": [{**POOL, "fallbackToOnDemand": 10}]})
    assert fallback & MONITORING == MONITORING
    assert not _project_role(gcp_raw()) & MONITORING
    assert not _project_role({**gcp_raw(), "pools": [{**POOL, "spotMax": 0}]}) & MONITORING


@pytest.fixture
def monitoring(monkeypatch):
    mon, gce = FakeMonitoring(), FakeGce()
    monkeypatch.setenv("SPOTCTL_MONITORING_ENDPOINT", mon.url)
    monkeypatch.setenv("SPOTCTL_GCE_ENDPOINT", gce.url)
    yield mon
    mon.stop()
    gce.stop()


def test_the_gcp_watcher_publishes_the_recorded_demand_every_minute(project, monitoring):
    """Cycles every 20 s for 3 minutes from one `pool demand l4 5`: one publication per minute (5
    wanted: 4 above the on-demand base of 1), as the autoscaler's filter selects it."""
    ref = stackfile.resolve("example-gcp", None)
    kept = record.Record("l4", 5, T0 - timedelta(hours=3)).encode()
    cloud = BucketOnly({pool_demand_key(ref.name, "l4"): kept})
    clock = [T0]
    records: list[dict] = []
    report = watcher.Report(emit=records.append, warn=lambda w: records.append({"warning": w}), out=lambda line: None)
    settings = watcher.Settings(ref, observe.Sources(bucket=BUCKET, poll=False), None, interval_s=20,
                                pools_for=lambda c: pool_cloud(c, ref.name))
    watcher.run(settings, report, cloud_for=lambda c: cloud, now=lambda: clock[0], rng=random.Random(1),
                sleep=lambda s: clock.__setitem__(0, clock[0] + timedelta(seconds=s)), cycles=9)
    published = [r for r in records if r.get("action") == "publish"]
    assert [(r["pool"], r["time"]) for r in published] == [("l4", (T0 + timedelta(minutes=m)).isoformat()) for m in range(3)], records
    spot = [ts for ts in monitoring.series if ts["metric"]["type"] == "custom.googleapis.com/spotctl/pool/spot_demand"]
    assert [ts["points"][0]["value"] for ts in spot] == [{"doubleValue": 4.0}] * 3
    assert all(ts["metric"]["labels"] == {"stack": owner_value("example-gcp"), "pool": "l4"} for ts in spot)
