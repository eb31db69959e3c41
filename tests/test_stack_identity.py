"""Exact stack identity on GCP: ``label_value`` maps ``team.a`` and ``team-a`` to one value, so
everything that decides (the observer's VM look-ups, the inventory of disks and snapshots, the pool
demand metrics) names the stack's owner value instead; and the preemption sink's filter has the same
size at 5,000 jobs as at one (Logging's 20,000-character limit)."""

from __future__ import annotations

import json
from datetime import UTC, datetime

import pytest

from cli.cloud.gcp import GcpInventory, GcpObserver
from cli.lifecycle.events import cloud_events
from cli.watch.observe import gcp_preemption
from infra import contract
from infra.config import Job, validate
from infra.contract import ContractError
from infra.naming import gcp_labels, label_value, owner_value, pool_metric_labels, stack_slug
from tests.conftest import GCP_BASE, gcp_job, stack_config
from tests.fixtures.fake_gce import FakeGce

NOW = datetime(2026, 11, 22, 4, 0, tzinfo=UTC)
OURS, THEIRS = "team-a", "team.a"


@pytest.fixture
def twins():
    """Two stacks whose label_value collides, each with a job ``train`` at attempt 1 on the fake Compute API;
    the other stack's VM was preempted, ours runs."""
    assert label_value(OURS) == label_value(THEIRS) and owner_value(OURS) != owner_value(THEIRS)
    gce = FakeGce()
    for stack, status in ((OURS, "RUNNING"), (THEIRS, "RUNNING")):
        name = f"{stack_slug(stack)}-train-a1-n0"
        gce.add_instance("us-central1-a", name, {**gcp_labels(stack, {}, job="train"), "spotctl-attempt": "1", "spotctl-node": "0"},
                         status=status)
        gce.add_disk("us-central1-a", f"{stack_slug(stack)}-train-n0-disk", {**gcp_labels(stack, {}, job="train"), "spotctl-node": "0"})
    gce.preempt("us-central1-a", f"{stack_slug(THEIRS)}-train-a1-n0")
    yield gce
    gce.stop()


def test_the_observer_sees_only_this_stacks_vms(twins):
    job = Job.model_validate({"id": "train", "machine_type": "a2-highgpu-1g", "zone": "us-central1-a", "command": "t",
                              "state": "running"})
    vms = GcpObserver("p", OURS, ["us-central1-a"], endpoint=twins.url).vms("train")
    assert [v.name for v in vms] == [f"{stack_slug(OURS)}-train-a1-n0"]
    assert not [e for e in cloud_events(vms, job, NOW) if e.event == "preempted"]  # the healthy job stays healthy


def test_the_inventory_lists_only_this_stacks_disks(twins):
    disks = GcpInventory("p", OURS, endpoint=twins.url).disks()
    assert [d.id for d in disks] == [f"{stack_slug(OURS)}-train-n0-disk"]


def test_a_preemption_entry_of_a_vm_sharing_the_name_prefix_is_not_this_stacks(twins):
    """Stack ``team`` (slug ``team``) shares the sink's prefix with ``team-a``'s VMs: the entry names a
    VM that parses as job ``a-train`` of ``team``, which Compute Engine does not list under team's owner."""
    entry = {"protoPayload": {"methodName": "compute.instances.preempted",
                              "resourceName": "projects/p/zones/us-central1-a/instances/team-a-train-a1-n0"},
             "logName": "projects/p/logs/cloudaudit.googleapis.com%2Fsystem_event", "timestamp": "2026-11-22T04:00:00Z"}
    e = gcp_preemption(json.dumps(entry).encode(), "team", {"a-train": None}, NOW)
    assert e is not None and e.details["instance"] == "team-a-train-a1-n0"  # the name alone would say it is team's
    assert GcpObserver("p", "team", ["us-central1-a"], endpoint=twins.url).vms("a-train") == []


def test_pool_demand_metrics_of_twin_stacks_are_apart():
    assert pool_metric_labels(OURS, "l4") != pool_metric_labels(THEIRS, "l4")
    assert pool_metric_labels(OURS, "l4")["stack"] == owner_value(OURS)


def _sink_filter(jobs: int) -> str:
    """The sink's filter as the program declares it (infra/gcp.py sink_filter) for a stack of ``jobs``
    jobs (the whole program under mocks takes minutes at 5,000; the filter is one function of them)."""
    from infra.common import StackArgs, job_plan
    from infra.gcp import sink_filter

    stack = "team-with-a-long-stack-name"
    cfg = validate(stack_config(GCP_BASE, jobs=[gcp_job(id=f"job-{i:04d}") for i in range(jobs)]), "t")
    return sink_filter(StackArgs(cfg, stack, stack_slug(stack)), [job_plan(stack, j) for j in cfg.jobs])


def test_the_sink_filter_does_not_grow_with_the_jobs():
    one, many = _sink_filter(1), _sink_filter(5000)
    assert one == many and len(many) < 1000
    contract.check("gcp:logging/projectSink:ProjectSink", "s", {"filter": many})


def test_the_sink_filter_size_rule():
    r = contract.get("gcp.sink-filter-size")
    assert "20,000" in r.source and r.source.startswith("https://cloud.google.com/logging/quotas")
    # The filter a name per job made: 700 jobs (the limit fell at ~470-640 of them).
    names = "|".join(f"team-job-{i:04d}-a[0-9]+-n[0-9]+" for i in range(700))
    grown = _sink_filter(1).replace("team-with-a-lo-", "").replace("[a-z0-9-]*[a-z0-9]$", f"({names})$")
    with pytest.raises(ContractError, match="gcp.sink-filter-size") as err:
        contract.check("gcp:logging/projectSink:ProjectSink", "s", {"filter": grown})
    assert "more than 20,000" in str(err.value)
