"""``cleanup JOB`` decides under the stack file's lock and plans outside it, as every command does:
a resume of another job while the cleanup plans lands at once instead of waiting (or being refused
after 30 s), and the cleanup then acts only on the job as it decided on it."""

from __future__ import annotations

import threading

import pytest

from cli.lifecycle import operations, stackfile
from cli.lifecycle.cleanup import cleanup_job
from cli.lifecycle.states import LifecycleError, decide_resume
from cli.plan import mocks


def planning_hook(monkeypatch, during):
    """Run ``during()`` in another thread while the cleanup plans; return what it raised (or None)."""
    real, seen = mocks.run, []

    def run(cfg, stack, *args, **kwargs):
        if not seen:
            box: list[BaseException | None] = [None]

            def other():
                try:
                    during()
                except BaseException as exc:  # noqa: BLE001 - reported to the test
                    box[0] = exc

            t = threading.Thread(target=other)
            t.start()
            t.join(30)
            seen.append(box[0])
        return real(cfg, stack, *args, **kwargs)

    monkeypatch.setattr(mocks, "run", run)
    return seen


def test_a_resume_while_cleanup_plans_is_not_refused(project, monkeypatch):
    ref = stackfile.resolve("example-gcp", None)

    def resume_another():
        with stackfile.locked(ref.path, timeout=2):  # another spotctl's resume: it needs the lock now
            operations.change_job(ref, "llm-pretrain", lambda j: decide_resume(j, [], force=True), applier=None)

    seen = planning_hook(monkeypatch, resume_another)
    before = stackfile.load(ref).job("llm-pretrain").attempt
    done = cleanup_job(ref, "bert-eval", force=False, yes=True, applier=None)
    assert seen == [None], seen  # the lock was free while the cleanup planned
    assert done.done and "bert-eval" not in [j.id for j in stackfile.load(ref).jobs]
    assert stackfile.load(ref).job("llm-pretrain").attempt == before + 1  # the concurrent resume landed


def test_a_change_to_the_job_while_cleanup_plans_stops_the_cleanup(project, monkeypatch):
    """Planned outside the lock, the cleanup acts only on the job it decided on: a hand edit of that
    job meanwhile (here its disk grew) is found under the lock again, and nothing is deleted."""
    ref = stackfile.resolve("example-gcp", None)
    path = ref.path

    def edit():
        text = path.read_text()
        at = text.index("id: bert-eval")
        path.write_text(text[:at] + text[at:].replace("diskGb: 200", "diskGb: 900", 1))

    planning_hook(monkeypatch, edit)
    with pytest.raises(LifecycleError, match="job bert-eval changed while its disks were being deleted"):
        cleanup_job(ref, "bert-eval", force=False, yes=True, applier=None)
    assert "bert-eval" in [j.id for j in stackfile.load(ref).jobs]
