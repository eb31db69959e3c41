"""The attempt's first event, `started`, outlives IAM propagation: its upload is retried in the
background for ``first_record_s`` (GCP: "typically 2 minutes, potentially 7 minutes or longer"),
backing off to one try every 15 s, and given up (kept in the local log) only after that."""

from __future__ import annotations

import ast
import inspect

from agent import events, run
from agent.config import Config
from agent.events import Recorder, backoff
from infra.render import ScriptContext


class Clock:
    def __init__(self):
        self.now = 0.0

    def monotonic(self) -> float:
        return self.now

    def sleep(self, s: float) -> None:
        self.now += s


class DeniedUntil:
    """The job's write permission goes live at ``live`` seconds: every upload before is refused."""

    def __init__(self, clock: Clock, live: float):
        self.clock, self.live, self.tries = clock, live, 0

    def put_once(self, bucket, name, body, timeout, ctype="application/json") -> bool:
        self.tries += 1
        return self.clock.now >= self.live


def recorder(tmp_path, monkeypatch, live: float) -> tuple[Recorder, DeniedUntil, Clock]:
    clock = Clock()
    monkeypatch.setattr(events, "time", clock)
    ctx = ScriptContext(cloud="gcp", stack="s", kind="job", name="j", command="true", event_bucket="b", region="r",
                        state_dir=str(tmp_path / "state"))
    cfg = Config.from_dict(ctx.agent_config())
    cloud = DeniedUntil(clock, live)
    return Recorder(cfg, None, cloud), cloud, clock


def test_a_permission_live_after_seven_minutes_still_gets_the_started_event(tmp_path, monkeypatch):
    rec, cloud, clock = recorder(tmp_path, monkeypatch, live=7 * 60)
    assert rec.cfg.first_record_s >= 7 * 60
    assert rec.publish("s/j/started.json", b"{}", rec.cfg.first_record_s) is True
    assert 7 * 60 <= clock.now <= 7 * 60 + 15  # met within one backoff step of going live
    assert cloud.tries < 60  # not a request a second for minutes


def test_the_retry_is_bounded(tmp_path, monkeypatch):
    rec, cloud, clock = recorder(tmp_path, monkeypatch, live=float("inf"))
    assert rec.publish("s/j/started.json", b"{}", rec.cfg.first_record_s) is False
    assert clock.now <= rec.cfg.first_record_s + 1
    # The stop path's short budgets keep their quick retries.
    assert [backoff(n) for n in (1, 4, 9)] == [0.2, 0.8, 0.9] and backoff(30) == 15.0


def test_run_gives_started_the_first_record_budget():
    calls = [node for node in ast.walk(ast.parse(inspect.getsource(run.run)))
             if isinstance(node, ast.Call) and getattr(node.func, "attr", "") == "record"
             and node.args and getattr(node.args[0], "value", None) == "started"]
    assert len(calls) == 1
    kwargs = {k.arg: ast.unparse(k.value) for k in calls[0].keywords}
    assert kwargs.get("budget") == "cfg.first_record_s" and kwargs.get("background") == "True"
