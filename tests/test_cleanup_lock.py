"""``cleanup JOB`` decides under the stack file's lock and plans outside it, as every command does:
a resume of another job while the cleanup plans lands at once instead of waiting (or being refused
after 30 s), and the cleanup then acts only on the job as it decided on it."""

from __future__ import annotations

import threading

import pytest

from cli.lifecycle import pipeline, stackfile
from cli.lifecycle.states import LifecycleError, decide_resume
from cli.plan import mocks
from infra.config import ConfigError


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
            pipeline.change_job(ref, "llm-pretrain", lambda j: decide_resume(j, [], force=True), applier=None)

    seen = planning_hook(monkeypatch, resume_another)
    before = stackfile.load(ref).job("llm-pretrain").attempt
    done = pipeline.remove_job(ref, "bert-eval", force=False, applier=None)
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
        pipeline.remove_job(ref, "bert-eval", force=False, applier=None)
    assert "bert-eval" in [j.id for j in stackfile.load(ref).jobs]


# ---- the one deletion rule, decided under the lock, after the question ------------------------------


def test_the_disks_ownership_is_read_under_the_stack_files_lock(project):
    """The cloud's labels are read while the lock is held (another spotctl, here a thread, cannot
    take it then): ownership and the job's state are decided in one hold, right before the unprotect."""
    from tests.test_adversarial import Applier, Inventory, example_disks

    ref = stackfile.resolve("example-gcp", None)
    tried: list[BaseException | None] = []

    def inventory(cfg):
        def other() -> None:
            try:
                with stackfile.locked(ref.path, timeout=0.2):
                    tried.append(None)
            except ConfigError as exc:
                tried.append(exc)

        t = threading.Thread(target=other)
        t.start()
        t.join(10)
        return Inventory(example_disks())

    applier = Applier()
    done = pipeline.remove_job(ref, "bert-eval", force=False, applier=applier, inventory=inventory)
    assert done.done and applier.ups
    assert len(tried) == 1 and isinstance(tried[0], ConfigError), tried  # the lock was held while the labels were read


def test_a_resume_during_the_question_stops_the_cleanup(project):
    """Listed, then asked: a `resume --force` lands while the user reads the question (the lock is
    free then). The yes acts on nothing: the job is decided on again under the lock, nothing is
    unprotected or deleted, and the resumed job stays in the file."""
    from tests.test_adversarial import Applier, Inventory, example_disks

    ref = stackfile.resolve("example-gcp", None)
    stackfile.update_job(ref.path, "bert-eval", lambda current, written: {"state": "failed"})
    shown: list = []

    def confirm(question: str) -> bool:
        pipeline.change_job(ref, "bert-eval", lambda j: decide_resume(j, [], force=True), applier=None)
        return True

    applier = Applier()
    with pytest.raises(LifecycleError, match="job bert-eval changed while its disks were being deleted"):
        pipeline.remove_job(ref, "bert-eval", force=True, applier=applier, inventory=lambda cfg: Inventory(example_disks()),
                            confirm=confirm, show=shown.append)
    assert [s.job_id for s in shown] == ["bert-eval"] and shown[0].urns
    assert applier.unprotected == [] and applier.ups == []
    assert stackfile.load(ref).job("bert-eval").state.value == "running"


def test_a_cleanup_declined_at_the_question_changes_nothing(project):
    from tests.test_adversarial import Applier, Inventory, example_disks

    ref = stackfile.resolve("example-gcp", None)
    before = ref.path.read_bytes()
    applier = Applier()
    listed = pipeline.remove_job(ref, "bert-eval", force=False, applier=applier,
                                 inventory=lambda cfg: Inventory(example_disks()), confirm=lambda question: False)
    assert listed.declined and not listed.done and listed.urns
    assert applier.unprotected == [] and applier.ups == [] and ref.path.read_bytes() == before
