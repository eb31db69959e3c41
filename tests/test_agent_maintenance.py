"""Host maintenance on the VM: the notice is announced once, the trainer is stopped at the planned
time (the cloud's stop less the trainer's budget and the uploads), never at the notice; EC2's
scheduled events are read from the instance metadata (earliest active stopping event)."""

from __future__ import annotations

import json

import pytest

from agent import maintenance, watch
from agent.config import Config
from agent.maintenance import ANNOUNCE_S, Plan, aws_notice, gcp_notice
from infra.render import ScriptContext

NOW = 1_795_000_000.0  # epoch seconds


def config(tmp_path, cloud="gcp") -> Config:
    ctx = ScriptContext(cloud=cloud, stack="s", kind="job", name="j", command="true", event_bucket="b", region="r",
                        state_dir=str(tmp_path), stop_budget_s=20)
    return Config.from_dict(ctx.agent_config())


class Rec:
    def __init__(self):
        self.records: list[tuple[str, dict]] = []
        self.ident = ("vm", "zone")

    def record(self, event, details=None, budget=0, background=False):
        self.records.append((event, dict(details or {})))

    def identify(self):
        pass

    def upload_log(self, budget):
        return True


@pytest.fixture
def stops(monkeypatch):
    calls: list[dict] = []
    monkeypatch.setattr(maintenance, "stop_for_maintenance", lambda cfg, rec, details: calls.append(details))
    return calls


def test_gcp_gpu_notice_keeps_training_until_the_planned_time(tmp_path, stops):
    cfg, rec = config(tmp_path), Rec()
    plan = Plan(cfg, rec)
    seen = gcp_notice("TERMINATE_ON_HOST_MAINTENANCE\n", NOW, 3600)
    at = seen.signal_at(cfg)
    assert at == NOW + 3600 - (20 + maintenance.UPLOAD_LEAD_S + cfg.poll_interval_s)
    assert plan.step(seen, NOW + 1) is False
    assert [e for e, _ in rec.records] == ["maintenance-notice"] and stops == []  # announced, not stopped
    assert (tmp_path / "maintenance").exists()
    for t in (NOW + 600, at - 1):
        assert plan.step(gcp_notice("TERMINATE_ON_HOST_MAINTENANCE", t, 3600), t) is False  # the first notice's clock
    assert stops == [] and len(rec.records) == 1
    assert plan.step(gcp_notice("NONE", at, 3600), at) is False  # the value may go back as the VM stops
    assert plan.step(gcp_notice("TERMINATE_ON_HOST_MAINTENANCE", at, 3600), at) is True
    assert stops == [{"maintenance_event": "TERMINATE_ON_HOST_MAINTENANCE", "stop_at": rec.records[0][1]["stop_at"]}]


def test_no_notice_values():
    assert gcp_notice("NONE", NOW, 3600) is None
    assert gcp_notice(None, NOW, 3600) is None
    assert gcp_notice("MIGRATE_ON_HOST_MAINTENANCE", NOW, 3600) is None  # a live migration stops nothing


def scheduled(*events) -> str:
    return json.dumps([{"EventId": f"instance-event-{i}", "Description": "d", "NotAfter": "21 Jan 2027 10:17:23 GMT",
                        **e} for i, e in enumerate(events)])


def test_aws_scheduled_events_the_earliest_active_stop():
    body = scheduled({"Code": "system-maintenance", "NotBefore": "20 Jan 2027 09:00:00 GMT", "State": "active"},
                     {"Code": "instance-stop", "NotBefore": "21 Jan 2027 09:00:43 GMT", "State": "active"},
                     {"Code": "system-reboot", "NotBefore": "19 Jan 2027 09:00:00 GMT", "State": "canceled"},
                     {"Code": "instance-retirement", "NotBefore": "22 Jan 2027 09:00:00 GMT", "State": "active"})
    notice = aws_notice(body)
    assert notice.event == "instance-stop" and notice.details()["stop_at"] == "2027-01-21T09:00:43Z"
    assert aws_notice(None) is None and aws_notice("[]") is None and aws_notice("not json") is None
    assert aws_notice(scheduled({"Code": "instance-stop", "NotBefore": "tomorrow", "State": "active"})) is None


def test_aws_a_far_event_is_announced_within_the_hour_and_a_cancelled_one_never(tmp_path, stops):
    cfg, rec = config(tmp_path, "aws"), Rec()
    plan = Plan(cfg, rec)
    far = maintenance.Notice("instance-stop", NOW + 3 * 86400)
    assert plan.step(far, NOW) is False and rec.records == []  # days ahead: nothing yet
    assert plan.step(None, NOW + 60) is False and plan.notice is None  # cancelled before it was announced
    soon = maintenance.Notice("system-reboot", NOW + 7200)
    at = soon.signal_at(cfg)
    assert plan.step(soon, at - ANNOUNCE_S - 1) is False and rec.records == []
    assert plan.step(soon, at - ANNOUNCE_S) is False and [e for e, _ in rec.records] == ["maintenance-notice"]
    assert plan.step(soon, at) is True and len(stops) == 1


class Meta:
    def __init__(self, answers: dict):
        self.answers, self.asked = answers, []

    def get(self, path, timeout=2.0):
        self.asked.append(path)
        return self.answers.get(path)


def test_the_aws_watch_loop_stops_at_the_scheduled_time(tmp_path, stops, monkeypatch):
    """The loop with its clock injected: a reboot scheduled 2 h ahead; the loop polls every 5 s, asks
    for scheduled events once a minute, announces at the hour before the checkpoint, stops at it."""
    cfg, rec = config(tmp_path, "aws"), Rec()
    clock = [NOW]
    when = NOW + 7200
    import time as _time

    body = scheduled({"Code": "system-reboot", "NotBefore": _time.strftime(maintenance.AWS_TIME, _time.gmtime(when)),
                      "State": "active"})
    meta = Meta({"events/maintenance/scheduled": body})
    monkeypatch.setattr(watch, "_background", lambda *a: None)
    watch.watch(cfg, meta, rec, None, clock=lambda: clock[0], sleep=lambda s: clock.__setitem__(0, clock[0] + s))
    at = maintenance.Notice("system-reboot", when).signal_at(cfg)
    assert at <= clock[0] < at + cfg.poll_interval_s and len(stops) == 1
    assert [e for e, _ in rec.records] == ["maintenance-notice"]
    assert meta.asked.count("events/maintenance/scheduled") == pytest.approx((clock[0] - NOW) / 60, abs=2)


def test_the_stop_path_after_the_watchers_maintenance_stop_records_nothing(tmp_path, monkeypatch):
    cfg, rec = config(tmp_path), Rec()
    (tmp_path / "maintenance").touch()
    assert maintenance.claim(cfg) is True  # the watcher's planned stop took it
    monkeypatch.setattr(watch, "stop", lambda *a: rec.records.append(("stopped", {})))
    rec.wait = lambda *a: None
    watch.shutdown(cfg, Meta({"instance/preempted": "FALSE"}), rec)
    assert rec.records == []
    (tmp_path / "maintenance-stop").unlink()  # the VM went before the planned time: the stop path records it
    watch.shutdown(cfg, Meta({"instance/preempted": "FALSE"}), rec)
    assert rec.records == [("stopped", {})]
