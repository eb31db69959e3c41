"""GCP delete operations (cli/cloud/gcp.py wait_done): an Operations client's ``wait`` returns after
at most 2 minutes with the operation possibly still RUNNING, and a DONE operation may carry an error;
spotctl waits until DONE (within a deadline) and names the disk or snapshot when it failed. Against
the local Compute stand-in (tests/fixtures/fake_gce.py), through google-cloud-compute's REST clients."""

from __future__ import annotations

import pytest

from cli.cloud import CloudDisk, CloudError, CloudSnapshot
from cli.cloud.gcp import GcpInventory
from infra.naming import owner_value
from tests.fixtures.fake_gce import FakeGce

ZONE = "us-central1-a"
RUNNING = {"status": "RUNNING"}
IN_USE = {"status": "DONE", "error": {"errors": [
    {"code": "RESOURCE_IN_USE_BY_ANOTHER_RESOURCE", "message": "The disk resource is already being used by vm-1"}]}}


@pytest.fixture
def gce():
    fake = FakeGce()
    yield fake
    fake.stop()


def inventory(gce: FakeGce, clock=None) -> GcpInventory:
    inv = GcpInventory("p", "team-a", endpoint=gce.url)
    # Every wait returned before DONE is followed by a pause: none here.
    inv.waiting = {"sleep": lambda s: None, **({"clock": clock} if clock else {})}
    return inv


def waits(gce: FakeGce, op: str) -> int:
    return sum(1 for method, path in gce.requests if method == "POST" and path.endswith(f"/operations/{op}/wait"))


def test_disk_delete_waits_again_while_the_operation_is_still_running(gce):
    gce.add_disk(ZONE, "d1", {})
    gce.op_answers["op-delete-d1"] = [RUNNING, RUNNING, {"status": "DONE"}]
    inventory(gce).delete(CloudDisk("d1", ZONE))
    assert waits(gce, "op-delete-d1") == 3 and gce.deleted == [(ZONE, "d1")]


def test_disk_delete_that_finished_with_an_error_names_the_disk(gce):
    gce.add_disk(ZONE, "d1", {})
    gce.op_answers["op-delete-d1"] = [RUNNING, IN_USE]
    with pytest.raises(CloudError, match=r"deleting disk d1 in us-central1-a failed: RESOURCE_IN_USE_BY_ANOTHER_RESOURCE: "
                                         r"The disk resource is already being used by vm-1"):
        inventory(gce).delete(CloudDisk("d1", ZONE))
    assert waits(gce, "op-delete-d1") == 2


def test_disk_delete_gives_up_after_the_deadline(gce):
    gce.add_disk(ZONE, "d1", {})
    gce.op_answers["op-delete-d1"] = [RUNNING]
    now = [0.0]

    def clock() -> float:
        now[0] += 600.0  # every wait takes 10 minutes
        return now[0]

    with pytest.raises(CloudError, match=r"deleting disk d1 in us-central1-a: operation op-delete-d1 is still RUNNING after 30 min"):
        inventory(gce, clock).delete(CloudDisk("d1", ZONE))
    assert waits(gce, "op-delete-d1") == 3


def test_snapshot_delete_waits_until_done_and_reports_its_error(gce):
    gce.snapshots |= {"s1", "s2"}
    gce.op_answers["op-delete-s1"] = [RUNNING, {"status": "DONE"}]
    inv = inventory(gce)
    inv.delete_snapshot(CloudSnapshot("s1", ""))
    assert waits(gce, "op-delete-s1") == 2
    gce.op_answers["op-delete-s2"] = [{"status": "DONE", "httpErrorStatusCode": 403, "httpErrorMessage": "FORBIDDEN"}]
    with pytest.raises(CloudError, match=r"deleting snapshot s2 failed: HTTP 403 FORBIDDEN"):
        inv.delete_snapshot(CloudSnapshot("s2", ""))


def test_a_regional_disk_is_listed_with_its_region_and_deleted_through_regiondisks(gce):
    """A regional disk (a job's diskReplicaZones) lives under regions/<region>: the zonal delete answers
    404 for it; spotctl calls regionDisks.delete and waits on the region's operation."""
    owner = {"spotctl-owner": owner_value("team-a")}
    gce.add_regional_disk("us-central1", "rd1", owner, ["us-central1-a", "us-central1-b"])
    inv = inventory(gce)
    [disk] = inv.disks()
    assert (disk.id, disk.region) == ("rd1", "us-central1")
    gce.op_answers["op-delete-rd1"] = [RUNNING, {"status": "DONE"}]
    inv.delete(disk)
    assert gce.deleted == [("us-central1", "rd1")] and waits(gce, "op-delete-rd1") == 2
    assert ("DELETE", "/compute/v1/projects/p/regions/us-central1/disks/rd1") in gce.requests
