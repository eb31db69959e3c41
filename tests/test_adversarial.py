"""What adversarial testing broke, one test per defect (each failed before its fix), and
the corpus of bad stacks, env keys and payloads in tests/adversarial/ that grows with every defect.

The lifecycle races are driven by threads on real temp stack files; the cloud is a recording
inventory and the Automation API adapter is replaced by a recording applier."""

from __future__ import annotations

import contextlib
import threading
import time
from datetime import UTC, datetime
from pathlib import Path

import pytest

from cli.cloud import CloudDisk
from cli.lifecycle import orphans, pipeline, stackfile
from cli.lifecycle.apply import ApplyError
from cli.lifecycle.states import LifecycleError, decide_complete, decide_failover, decide_resume
from infra.config import ConfigError
from infra.naming import disk_name, gcp_labels, stack_slug
from tests.conftest import STACKS_ONLY, gce_watcher_looked

STACK = "example-gcp"


class Inventory:
    """The stack's disks as the cloud lists them, with every delete recorded."""

    def __init__(self, disks: list[CloudDisk]):
        self.listed, self.deleted = disks, []

    def disks(self) -> list[CloudDisk]:
        return list(self.listed)

    def delete(self, disk: CloudDisk) -> None:
        self.deleted.append(disk.id)


def example_disks(stack: str = STACK, owner_stack: str | None = None) -> list[CloudDisk]:
    jobs = {"llm-pretrain": ("us-central1-a", 2), "vit-finetune": ("us-central1-b", 1), "bert-eval": ("us-central1-c", 1)}
    return [CloudDisk(disk_name(stack_slug(stack), job, n), zone, {**gcp_labels(owner_stack or stack, {}, job=job), "spotctl-node": str(n)},
                      created=MADE) for job, (zone, nodes) in jobs.items() for n in range(nodes)]


MADE, DONE = datetime(2026, 11, 1, tzinfo=UTC), datetime(2026, 11, 2, tzinfo=UTC)  # disks made, then jobs completed


class Applier:
    """Records unprotect/up; ``on_up`` runs inside ``up`` (a concurrent edit), ``fail`` makes up
    fail before it started (a stack locked by another update)."""

    def __init__(self, on_up=None, fail: bool = False, on_unprotect=None):
        self.unprotected: list[str] = []
        self.protected: list[str] = []  # protected again after a failed cleanup
        self.ups: list[list[str]] = []
        self.on_up, self.fail, self.on_unprotect = on_up, fail, on_unprotect
        self.steps: list[str] = []

    def step(self, text: str) -> None:
        """The real Applier tells a terminal's spinner each slow step; recorded here."""
        self.steps.append(text)

    def preflight(self) -> None:
        pass

    def exclusive(self, path: Path):
        import contextlib

        return contextlib.nullcontext()

    def unprotect(self, urns: list[str]) -> None:
        if self.on_unprotect:
            self.on_unprotect()
        self.unprotected += urns

    def protect(self, urns: list[str]) -> None:
        self.protected += urns

    def up(self, targets: list[str], out) -> None:
        if self.on_up:
            self.on_up()
        if self.fail:
            raise ApplyError("cannot apply: stack locked by another update")
        self.ups.append(targets)

    def held(self):
        from cli.lifecycle.apply import Held

        class Everything(dict):  # a state that holds every URN the plan names (none protected)
            def __contains__(self, urn: object) -> bool:
                return True

        return Held(frozenset(), frozenset(), Everything(), frozenset())


@pytest.fixture
def ref(project: Path) -> stackfile.StackRef:
    return stackfile.StackRef(STACK, project / "stacks" / f"Pulumi.{STACK}.yaml")


def set_state(ref: stackfile.StackRef, job: str, state: str) -> None:
    stackfile.update_job(ref.path, job, lambda current, written: {"state": state})


# ---- 1. cleanup decides and acts under the lock ------------------------------------------------------


def test_1_a_resume_landing_during_cleanup_never_loses_the_disk(ref, monkeypatch):
    """Before: cleanup read the file, a `resume --force` made the job running, cleanup still
    unprotected and deleted its disk. Now the resume waits for the lock (and then finds no job)."""
    set_state(ref, "bert-eval", "failed")
    resumed: list[object] = []
    threads: list[threading.Thread] = []

    def resume_meanwhile(*args, **kwargs):
        def resume() -> None:
            try:
                resumed.append(pipeline.change_job(ref, "bert-eval", lambda j: decide_resume(j, [], force=True), applier=None))
            except (ConfigError, LifecycleError) as exc:
                resumed.append(exc)

        t = threading.Thread(target=resume)
        threads.append(t)
        t.start()
        t.join(2)  # before the fix it lands here; after it, it waits for cleanup's lock
        return real_run(*args, **kwargs)

    from cli.plan import mocks as planner

    real_run = planner.run
    monkeypatch.setattr(planner, "run", resume_meanwhile)
    applier = Applier()
    with contextlib.suppress(LifecycleError):
        pipeline.remove_job(ref, "bert-eval", force=True, applier=applier, inventory=lambda cfg: Inventory(example_disks()))
    monkeypatch.setattr(planner, "run", real_run)
    for t in threads:
        t.join()
    deleted = bool(applier.unprotected)
    resume_won = any(not isinstance(r, Exception) for r in resumed)
    assert not (deleted and resume_won), "a job made running had its disk unprotected and deleted"
    assert resumed, "the resume ran"


def test_1_a_hand_edit_between_decision_and_unprotect_stops_the_delete(ref):
    """The state is read again right before `state unprotect` and before the delete."""
    def hand_edit() -> None:
        text = ref.path.read_text()
        ref.path.write_text(text.replace("      attempt: 2\n      state: completed", "      attempt: 3\n      state: running"))

    applier = Applier(on_unprotect=hand_edit)
    with pytest.raises(LifecycleError, match="job bert-eval changed while its disks were being deleted"):
        pipeline.remove_job(ref, "bert-eval", force=False, applier=applier, inventory=lambda cfg: Inventory(example_disks()))
    assert applier.ups == [] and stackfile.load(ref).job("bert-eval").state.value == "running"


# ---- 3. cleanup JOB checks ownership labels ------------------------------------------------------------


@pytest.mark.parametrize("disks", [
    pytest.param(lambda: example_disks(owner_stack="example.gcp"), id="another-stack-same-slug"),
    pytest.param(lambda: [CloudDisk(d.id, d.zone, {**d.labels, "spotctl-managed": "false"}) for d in example_disks()], id="unmanaged"),
    pytest.param(lambda: [d for d in example_disks() if "bert" not in d.id], id="missing"),
    pytest.param(lambda: [CloudDisk(d.id, d.zone, {**d.labels, "spotctl-job": "other"}) for d in example_disks()], id="other-job"),
])
def test_3_cleanup_job_refuses_disks_without_this_stacks_labels(ref, disks):
    before = ref.path.read_text()
    applier = Applier()
    with pytest.raises(LifecycleError, match="job bert-eval: its disks are kept because its disk"):
        pipeline.remove_job(ref, "bert-eval", force=False, applier=applier, inventory=lambda cfg: Inventory(disks()))
    assert applier.unprotected == [] and applier.ups == [] and ref.path.read_text() == before


# ---- 4. undo only what this command set ---------------------------------------------------------------


def test_4_failed_cleanup_keeps_a_concurrent_edit_of_another_job(ref):
    def failover_meanwhile() -> None:  # a hand edit / another tool: no lock
        ref.path.write_text(ref.path.read_text().replace("      capacity: on-demand\n      attempt: 3", "      capacity: spot\n      attempt: 4"))

    with pytest.raises(ApplyError):
        pipeline.remove_job(ref, "bert-eval", force=False, applier=Applier(on_up=failover_meanwhile, fail=True),
                            inventory=lambda cfg: Inventory(example_disks()))
    cfg = stackfile.load(ref)
    assert [j.id for j in cfg.jobs] == ["llm-pretrain", "vit-finetune", "bert-eval"]
    vit = cfg.job("vit-finetune")
    assert (vit.capacity.value, vit.attempt) == ("spot", 4)
    assert "# Finished: no VM any more" in ref.path.read_text()


def test_4_failed_resume_keeps_a_concurrent_complete(ref):
    set_state(ref, "vit-finetune", "preempted")

    def complete_meanwhile() -> None:
        pipeline.change_job(ref, "vit-finetune", decide_complete, applier=None)

    with pytest.raises(ApplyError):
        pipeline.change_job(ref, "vit-finetune", lambda j: decide_resume(j, []), applier=Applier(on_up=complete_meanwhile, fail=True))
    job = stackfile.load(ref).job("vit-finetune")
    assert job.state.value == "completed" and job.attempt == 3  # attempt 4 undone, complete kept


def test_4_undo_of_a_job_removed_meanwhile_does_not_crash(ref):
    def removed_meanwhile() -> None:
        stackfile.take_job(ref.path, "vit-finetune")

    with pytest.raises(ApplyError):
        pipeline.change_job(ref, "vit-finetune", lambda j: decide_failover(j, None), applier=Applier(on_up=removed_meanwhile, fail=True))
    assert [j.id for j in stackfile.load(ref).jobs] == ["llm-pretrain", "bert-eval"]


# ---- 5. env keys cannot override the runner's own variables ---------------------------------------------


def test_5_forged_env_changes_nothing_the_runner_does(tmp_path):
    """Before: the runner sourced the env file into its own shell, so SPOTCTL_COMMAND ran the env
    value, SPOTCTL_NAME/ATTEMPT/NODE_RANK forged events and SPOTCTL_STATE_DIR hid the trainer from
    the preemption SIGTERM. The env here skips validation (as a stack file edited after `validate`)."""
    import sys

    from cli.drill.emulator import Emulator
    from cli.drill.localvm import LocalVM, local_context
    from infra.render import ScriptContext

    trainer = Path(__file__).parent / "fixtures" / "trainer.py"
    pwned = tmp_path / "pwned"
    forged = {
        "SPOTCTL_COMMAND": f"touch {pwned}-command",
        "SPOTCTL_RECORD_BUDGET_S": f"a[$(touch {pwned}-budget)]",
        "SPOTCTL_NAME": "forged",
        "SPOTCTL_ATTEMPT": "7",
        "SPOTCTL_NODE_RANK": '0,"event":"completed"',
        "SPOTCTL_STATE_DIR": str(tmp_path / "elsewhere"),
        "SPOTCTL_CHECKPOINT_DIR": str(tmp_path / "elsewhere"),
    }
    with Emulator() as emu:
        ctx = ScriptContext(cloud="gcp", stack="team-a", kind="job", name="train", event_bucket="b", region="us-central1",
                            command=f"{sys.executable} {trainer}", env=forged, poll_interval_s=3600)
        with LocalVM(local_context(ctx, emu, tmp_path / "disk", tmp_path / "state"), tmp_path / "vm") as vm:
            assert vm.boot().returncode == 0
            assert vm.wait_for(lambda: vm.alive("trainer.pid"), 60), vm.debug_log()
            assert vm.wait_for(lambda: "start step" in vm.debug_log(), 60), vm.debug_log()
            assert vm.wait_for(lambda: gce_watcher_looked(emu), 60)  # only the shutdown script sees the flip
            emu.preempt_gcp()
            assert vm.shutdown()[0].returncode == 0
            events = vm.events()
    assert [e["event"] for e in events] == ["started", "preemption-notice", "preempted"], events
    assert {(e["job"], e["attempt"], e["node"]) for e in events} == {("train", 1, 0)}
    assert not list(tmp_path.glob("pwned*"))
    import json

    ckpt = json.loads((tmp_path / "disk" / "checkpoints" / "ckpt.json").read_text())
    assert "term_at" in ckpt  # the trainer got its SIGTERM and checkpointed where spotctl said


# ---- the corpus: every bad stack, env key and payload found so far -----------------------------------------

CORPUS = Path(__file__).parent / "adversarial"


def corpus_stacks() -> list[Path]:
    return sorted((CORPUS / "stacks").glob("Pulumi.*.yaml*"))


@pytest.mark.parametrize("path", corpus_stacks(), ids=lambda p: p.name)
def test_corpus_bad_stacks_fail_with_one_clear_error(path, tmp_path, runner):
    """Each file's first line says what is wrong (`# expect: TEXT`); validate and plan both refuse
    it with an error naming the file and containing TEXT, exit 1, no traceback, file unchanged."""
    from cli.app import app

    data = path.read_bytes()
    expect = data.split(b"\n", 1)[0].decode("utf-8", "replace").removeprefix("\ufeff").removeprefix("# expect: ").strip()
    target = tmp_path / "Pulumi.corpus.yaml"
    target.write_bytes(data)
    for command in (["validate"], ["plan"]):
        result = runner.invoke(app, [*command, "--stack-file", str(target)])
        assert result.exit_code == 1, (command, result.output, result.exception)
        assert str(target) in result.output and expect in result.output, (command, result.output)
        assert "Traceback" not in result.output
    assert target.read_bytes() == data


def corpus_lines(name: str) -> list[str]:
    return [line for line in (CORPUS / name).read_text().splitlines() if line and not line.startswith("#")]


@pytest.mark.parametrize("key", corpus_lines("env-keys.txt"))
def test_corpus_reserved_env_keys_are_refused(key):
    from infra.config import validate
    from tests.conftest import GCP_BASE, gcp_job, stack_config

    with pytest.raises(ConfigError, match=f"env key '{key}' is reserved"):
        validate(stack_config(GCP_BASE, jobs=[gcp_job(env={key: "x"})]), "t")


@pytest.mark.parametrize("key", ["WANDB_PROJECT", "PYTHONPATH", "CUDA_VISIBLE_DEVICES", "NCCL_DEBUG", "HF_HOME", "path"])
def test_ordinary_env_keys_are_accepted(key):
    from infra.config import validate
    from tests.conftest import GCP_BASE, gcp_job, stack_config

    validate(stack_config(GCP_BASE, jobs=[gcp_job(env={key: "x"})]), "t")


# ---- 9, 10. one loader: duplicates, encodings, bombs ----------------------------------------------------


def test_9_duplicate_keys_are_refused_by_the_editor_and_the_reader_alike(ref):
    ref.path.write_text(ref.path.read_text().replace("      state: completed\n", "      state: completed\n      state: running\n"))
    messages = []
    for read in (lambda: stackfile.load(ref), lambda: pipeline.change_job(ref, "bert-eval", decide_complete, applier=None)):
        with pytest.raises(ConfigError) as err:
            read()
        messages.append(str(err.value))
    assert messages[0] == messages[1] and "duplicate key 'state' (first on line" in messages[0]


def test_10_a_file_with_a_bom_can_be_edited_and_keeps_it(ref):
    ref.path.write_bytes(b"\xef\xbb\xbf" + ref.path.read_bytes())
    set_state(ref, "vit-finetune", "preempted")
    pipeline.change_job(ref, "vit-finetune", lambda j: decide_resume(j, []), applier=None)
    assert ref.path.read_bytes().startswith(b"\xef\xbb\xbfconfig:") or ref.path.read_bytes().startswith(b"\xef\xbb\xbf#")
    assert stackfile.load(ref).job("vit-finetune").attempt == 4


# ---- 12. stray files in --events-dir ----------------------------------------------------------------------


def test_12_stray_and_mixed_timezone_event_files_are_read_or_skipped(tmp_path):
    from cli.lifecycle.events import load_events

    d = tmp_path / "events"
    (d / "dir.json").mkdir(parents=True)  # a directory named like a file
    (d / "list.json").write_text("[1, 2]")
    (d / "binary.jsonl").write_bytes(b"\xff\xfe\x00garbage")
    (d / "broken.json").symlink_to(d / "nowhere")
    (d / "a.jsonl").write_text('{"job": "train", "attempt": 1, "event": "started", "time": "2026-11-21T10:00:00"}\n'
                               '{"job": "train", "attempt": 1, "event": "preempted", "time": "2026-11-21T11:00:00Z"}\n'
                               '{"job": "train", "attempt": 1, "event": "x", "time": "9999-12-31T23:59:59-23:59"}\n')
    events = load_events(d, "train")
    assert [e.event for e in events][:2] == ["started", "preempted"]


# ---- 14. file hygiene -----------------------------------------------------------------------------------


def test_14_a_symlinked_stack_file_stays_a_link_and_its_target_is_updated(ref, tmp_path):
    target = tmp_path / "real" / "Pulumi.example-gcp.yaml"
    target.parent.mkdir()
    target.write_text(ref.path.read_text())
    ref.path.unlink()
    ref.path.symlink_to(target)
    pipeline.change_job(ref, "bert-eval", decide_complete, applier=None)  # a no-op: already completed
    set_state(ref, "vit-finetune", "preempted")
    assert ref.path.is_symlink() and "state: preempted" in target.read_text()


def test_14_crlf_files_stay_crlf(ref):
    ref.path.write_bytes(ref.path.read_bytes().replace(b"\n", b"\r\n"))
    set_state(ref, "vit-finetune", "preempted")
    stackfile.take_job(ref.path, "bert-eval")
    data = ref.path.read_bytes()
    assert b"state: preempted\r\n" in data and data.count(b"\n") == data.count(b"\r\n")


def test_14_cleanup_keeps_the_comments_of_the_jobs_around_it(ref):
    before = ref.path.read_text()
    pipeline.remove_job(ref, "bert-eval", force=False, applier=Applier(),
                        inventory=lambda cfg: Inventory(example_disks()))
    after = ref.path.read_text()
    assert "# Two-node H100 pretraining" in after and "# Single A100 run that was preempted twice" in after
    assert "# Finished: no VM any more" not in after  # bert-eval's own comment went with it
    # Removing the middle job keeps the last job's comment (ruamel attached it to the removed one).
    ref.path.write_text(before)
    stackfile.take_job(ref.path, "vit-finetune")
    assert "# Finished: no VM any more" in ref.path.read_text()
    assert "# Single A100 run" not in ref.path.read_text()


def test_14_take_and_put_back_restore_the_file_byte_for_byte(ref):
    before = ref.path.read_text()
    for job in ("llm-pretrain", "vit-finetune", "bert-eval"):
        taken = stackfile.take_job(ref.path, job)
        assert stackfile.put_back_job(ref.path, taken)
        assert ref.path.read_text() == before


# ---- 15. retries are idempotent ----------------------------------------------------------------------------


@pytest.mark.parametrize("decide", [
    pytest.param(lambda seen: (lambda j: decide_resume(j, [], force=True, from_attempt=seen)), id="resume-force"),
    pytest.param(lambda seen: (lambda j: decide_failover(j, None, seen)), id="failover"),
])
def test_15_twenty_retries_of_one_intent_make_one_attempt(ref, decide):
    seen = stackfile.load(ref).job("vit-finetune").attempt
    for _ in range(20):
        pipeline.change_job(ref, "vit-finetune", decide(seen), applier=None)
    assert stackfile.load(ref).job("vit-finetune").attempt == seen + 1


def test_15_from_attempt_ahead_of_the_job_is_refused(ref):
    with pytest.raises(LifecycleError, match="is at attempt 3, not 9"):
        pipeline.change_job(ref, "vit-finetune", lambda j: decide_failover(j, None, 9), applier=None)


def test_15_from_attempt_through_the_cli(project, runner):
    from cli.app import app

    args = ["failover", "vit-finetune", "--stack", STACK, "--no-apply", "--from-attempt", "3"]
    first, second = runner.invoke(app, args), runner.invoke(app, args)
    assert first.exit_code == 0 and second.exit_code == 0, second.output
    assert "past --from-attempt 3" in second.output
    assert stackfile.load(stackfile.resolve(STACK, None)).job("vit-finetune").attempt == 4


# ---- the property: no interleaving loses a disk --------------------------------------------------------------

import re  # noqa: E402
import shutil  # noqa: E402
import tempfile  # noqa: E402

from hypothesis import HealthCheck, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

from infra.naming import owner_value  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
JOBS = ("llm-pretrain", "vit-finetune", "bert-eval")
STATES = ("pending", "running", "preempted", "stopped", "completed", "failed")
COMMANDS = st.tuples(st.sampled_from(["resume", "resume-force", "failover", "complete", "cleanup", "cleanup-force",
                                      "orphans", "fail-up"]), st.sampled_from(JOBS))


class Guarded(Applier):
    """Checks, at the moment a disk is unprotected, what the stack file says about its job then."""

    def __init__(self, ref: stackfile.StackRef, inventory: Inventory, violations: list[str], fail: bool = False):
        super().__init__(fail=fail)
        self.ref, self.inventory, self.violations = ref, inventory, violations

    def unprotect(self, urns: list[str]) -> None:
        cfg = stackfile.load(self.ref)
        for urn in urns:
            job_id = re.search(r"::job-(.+)-n\d+-disk$", urn)[1]
            state = next((j.state.value for j in cfg.jobs if j.id == job_id), "absent")
            if state not in ("completed", "failed"):
                self.violations.append(f"unprotected {urn} while its job is {state}")
            for disk in self.inventory.listed:
                if disk.labels.get("spotctl-job") == job_id and disk.labels.get("spotctl-owner") != owner_value(self.ref.name):
                    self.violations.append(f"unprotected {urn}, a disk of another stack")
        super().unprotect(urns)


class Watched(Inventory):
    def __init__(self, disks, ref, completed, violations):
        super().__init__(disks)
        self.ref, self.completed, self.violations = ref, completed, violations

    def delete(self, disk: CloudDisk) -> None:
        cfg = stackfile.load(self.ref)
        job_id = disk.labels.get("spotctl-job")
        if any(j.id == job_id for j in cfg.jobs) or job_id not in self.completed:
            self.violations.append(f"deleted {disk.id} of job {job_id} (in the file or not completed)")
        if disk.labels.get("spotctl-owner") != owner_value(self.ref.name):
            self.violations.append(f"deleted {disk.id}, a disk of another stack")
        super().delete(disk)


def run_command(ref, name: str, job: str, inventory, violations, completed) -> None:
    applier = Guarded(ref, inventory, violations, fail=name == "fail-up")
    decide = {"resume": lambda j: decide_resume(j, []), "resume-force": lambda j: decide_resume(j, [], force=True),
              "failover": lambda j: decide_failover(j, None), "complete": decide_complete,
              "fail-up": lambda j: decide_resume(j, [], force=True)}
    try:
        if name in decide:
            pipeline.change_job(ref, job, decide[name], applier=applier)
        elif name.startswith("cleanup"):
            pipeline.remove_job(ref, job, force=name.endswith("force"), applier=applier, inventory=lambda cfg: inventory)
        else:
            orphans.cleanup_orphans(ref, lambda cfg: inventory, applier, lambda cfg, j: DONE if j in completed else None, delete=None)
    except (ConfigError, LifecycleError, ApplyError):
        pass  # refused: that is allowed; losing a disk is not
    except Exception as exc:  # noqa: BLE001 - a crash is a finding too, reported by the test
        violations.append(f"{name} {job} crashed: {type(exc).__name__}: {exc}")


_PLAN_LOCK = threading.Lock()


def threadsafe(run):
    """The plan (Pulumi's mocks) in a thread: one at a time, each thread with its own event loop.
    Each spotctl command is its own process in real use; here threads play the processes."""
    import asyncio

    def plan(*args, **kwargs):
        with _PLAN_LOCK:
            try:
                asyncio.get_event_loop()
            except RuntimeError:
                asyncio.set_event_loop(asyncio.new_event_loop())
            done = run(*args, **kwargs)
        # A plan the suite already made for this config comes back at once (tests/conftest.py): still
        # leave the other threads the gap a real plan leaves them to edit the file meanwhile.
        time.sleep(0.05)
        return done

    return plan


@settings(max_examples=15, deadline=None, suppress_health_check=list(HealthCheck))
@given(states=st.tuples(*[st.sampled_from(STATES)] * 3), foreign=st.sets(st.sampled_from(JOBS)),
       completed=st.sets(st.sampled_from([*JOBS, "gone"])),
       threads=st.lists(st.lists(COMMANDS, min_size=1, max_size=4), min_size=2, max_size=3))
def test_no_interleaving_deletes_a_live_or_foreign_disk(states, foreign, completed, threads):
    from cli.plan import mocks as planner

    real = planner.run
    planner.run = threadsafe(real)
    try:
        interleave(states, foreign, completed, threads)
    finally:
        planner.run = real


def interleave(states, foreign, completed, threads) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        shutil.copy(ROOT / "Pulumi.yaml", root / "Pulumi.yaml")
        shutil.copytree(ROOT / "stacks", root / "stacks", ignore=STACKS_ONLY)
        ref = stackfile.StackRef(STACK, root / "stacks" / f"Pulumi.{STACK}.yaml")
        for job, state in zip(JOBS, states, strict=True):
            set_state(ref, job, state)
        disks = [d if d.labels["spotctl-job"] not in foreign else
                 CloudDisk(d.id, d.zone, {**d.labels, "spotctl-owner": owner_value("example.gcp")}, created=MADE) for d in example_disks()]
        disks.append(CloudDisk("example-gcp-gone-n0-disk", "us-central1-a", {**gcp_labels(STACK, {}, job="gone"), "spotctl-node": "0"},
                               created=MADE))
        violations: list[str] = []
        inventory = Watched(disks, ref, completed, violations)
        workers = [threading.Thread(target=lambda cmds=cmds: [run_command(ref, n, j, inventory, violations, completed) for n, j in cmds])
                   for cmds in threads]
        for w in workers:
            w.start()
        for w in workers:
            w.join()
        assert violations == []
        stackfile.load(ref)  # and the file is still valid


# ---- 7. `$` matched before a trailing newline --------------------------------------------------------------


@pytest.mark.parametrize("value", ["train\n", "a\n"])
def test_7_names_with_a_trailing_newline_are_refused(value):
    from infra.config import validate
    from tests.conftest import GCP_BASE, gcp_job, stack_config

    for raw in (stack_config(GCP_BASE, jobs=[gcp_job(id=value)]), stack_config(GCP_BASE, jobs=[gcp_job(env={value: "x"})]),
                stack_config(GCP_BASE, labels={value: "x"}), stack_config(GCP_BASE, labels={"team": value})):
        with pytest.raises(ConfigError):
            validate(raw, "t")
    with pytest.raises(ConfigError):
        stackfile.resolve(value, None)
    with pytest.raises(ConfigError):
        stackfile.resolve(None, Path(f"Pulumi.{value}.yaml\n"))


def test_a_job_removed_while_a_command_ran_is_one_clear_error(ref):
    """An edit of a job that is no longer in the file (a hand edit or `cleanup --no-apply` removed it
    between two of a command's steps) names the job and the file, and writes nothing."""
    stackfile.take_job(ref.path, "bert-eval")
    before = ref.path.read_text()
    with pytest.raises(ConfigError) as err:
        stackfile.update_job(ref.path, "bert-eval", lambda current, written: {"applying": "attempt=3: resume"})
    assert err.value.source == str(ref.path) and err.value.problems == [
        "job bert-eval: no longer in the stack file (removed while this command ran)"]
    assert ref.path.read_text() == before
