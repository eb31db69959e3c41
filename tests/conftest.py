"""Shared fixtures: real stack files in temp dirs, a CLI runner, and config builders."""

from __future__ import annotations

import copy
import json
import os
import shutil
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

ROOT = Path(__file__).resolve().parent.parent
EXAMPLES = ROOT / "stacks"
# The example stack files only: not what spotctl keeps beside them (its index, caches, records, locks and
# temp files), which another test's spotctl may be writing while this copy is made
STACKS_ONLY = shutil.ignore_patterns(".spotctl", ".*.lock", ".*.tmp", ".*.json", ".*.holder")

# The suite starts dozens of Python processes (`python -m cli ...`, drills, watchers, editors). Where
# PYTHONDONTWRITEBYTECODE is set (some CI images and sandboxes set it) each of them recompiles
# everything it imports from source: ~3.5 s more per process that imports the Pulumi SDKs. Let this
# process and its children write the bytecode cache (gitignored, and what Python does by default), so
# each module is compiled once. xdist workers are started after this runs, so they inherit it.
os.environ.pop("PYTHONDONTWRITEBYTECODE", None)
sys.dont_write_bytecode = False

# spotctl seals its caches and records with a per-user key in $XDG_CONFIG_HOME/spotctl (cli.lifecycle.cachefile):
# the suite uses a key of its own, never the developer's; one folder for the controller, its workers and every
# spotctl they start (set once, inherited)
if "SPOTCTL_TEST_CONFIG_HOME" not in os.environ:
    import tempfile

    os.environ["SPOTCTL_TEST_CONFIG_HOME"] = tempfile.mkdtemp(prefix="spotctl-test-config-")
    _MADE_CONFIG_HOME = os.environ["SPOTCTL_TEST_CONFIG_HOME"]  # removed when this process's session ends
os.environ["XDG_CONFIG_HOME"] = os.environ["SPOTCTL_TEST_CONFIG_HOME"]


def _share_botocore_models() -> None:
    """One cache of botocore's parsed data files (service models, endpoints, paginators) for every
    botocore session in this process.

    botocore parses each JSON model once per session (``Loader``'s instance cache: ec2's alone is
    ~0.1 s), and the suite starts a fresh session for nearly every test that reaches AWS (moto's
    backends, ``boto3.DEFAULT_SESSION = None`` so no test sees another's credentials): ~150 parses
    in test_sync.py alone. The files are botocore's own, read-only; within one session botocore
    already hands the same parsed objects to every client, so sharing them between sessions (with the
    same search paths and extras) shares nothing a session owns: credentials, config, handlers stay
    per session."""
    from botocore import loaders

    shared: dict[tuple, dict] = {}
    init = loaders.Loader.__init__

    def __init__(self, *args, **kwargs):
        init(self, *args, **kwargs)
        self._cache = shared.setdefault((tuple(self.search_paths), tuple(self.extras_types), type(self.file_loader)), {})

    loaders.Loader.__init__ = __init__


_share_botocore_models()


def _imported_by_tests() -> list[str]:
    """The absolute imports of the test files and their fixtures (modules, by name), in file order."""
    import ast

    names: dict[str, None] = {}
    for source in sorted((ROOT / "tests").rglob("*.py")):
        try:
            tree = ast.parse(source.read_text(encoding="utf-8"))
        except (OSError, SyntaxError, ValueError):
            continue
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                names.update(dict.fromkeys(alias.name for alias in node.names))
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                names[node.module] = None
                names.update(dict.fromkeys(f"{node.module}.{alias.name}" for alias in node.names))  # (maybe a submodule)
    return [name for name in names if not name.startswith("tests")]


def _bytecode_cold() -> bool:
    """Whether this environment's libraries have no bytecode cache yet (a fresh ``uv sync``)."""
    import importlib.util

    spec = importlib.util.find_spec("pulumi")
    return spec is not None and spec.origin is not None and not os.path.exists(importlib.util.cache_from_source(spec.origin))


@pytest.hookimpl(tryfirst=True)
def pytest_configure(config: pytest.Config) -> None:
    """In a fresh checkout (no bytecode cache yet), the xdist controller imports what the tests import
    once, before it starts its workers: otherwise every worker compiles the same Pulumi SDKs, moto and
    the rest at once (a cold collection is ~3x a warm one: ~1 min of a 2-core run). A warm
    environment skips it (one stat).

    An xdist worker skips pytest's full garbage collections after its session (unraisableexception's
    ``pytest_unconfigure`` and cleanup: 0.5-1.5 s each of a heap holding the Pulumi SDKs and moto, five
    workers): they come after the worker has sent its results, so what they could find is shown
    nowhere; every test still has its own check for unraisable exceptions (setup, call, teardown)."""
    if os.environ.get("PYTEST_XDIST_WORKER"):
        from _pytest.unraisableexception import gc_collect_iterations_key

        config.stash[gc_collect_iterations_key] = 0
        return
    if not config.pluginmanager.hasplugin("xdist") \
            or not config.getvalue("numprocesses") or not _bytecode_cold():
        return
    import importlib

    for name in _imported_by_tests():
        try:
            importlib.import_module(name)
        except Exception:  # noqa: BLE001 - a warm-up only (a name that is no module; the worker that imports it reports its error)
            continue


BOOT_DIR = Path(__file__).resolve().parent / "boot"


def pytest_ignore_collect(collection_path: Path, config: pytest.Config) -> bool | None:
    """The boot tier (tests/boot/) is collected only when named (`pytest tests/boot`): the README's
    test command runs it after the unit suite, not beside it, since its guests' clocks are real time
    and the suite's load beside them broke their timings."""
    if collection_path.resolve() != BOOT_DIR:
        return None
    here = config.invocation_params.dir
    named = [(here / arg.split("::", 1)[0]).resolve() for arg in config.args]
    return None if any(p == BOOT_DIR or BOOT_DIR in p.parents for p in named) else True


@pytest.hookimpl(trylast=True)
def pytest_unconfigure(config: pytest.Config) -> None:
    """An xdist worker that has run its last test exits without a full garbage collection of its heap
    (the Pulumi SDKs, moto's backends, hypothesis): the controller waits for the last worker to exit
    before it reports, and that collection was seconds of the suite's tail on a loaded machine. Only
    the interpreter's teardown after the session changes (atexit: after every test and fixture)."""
    if os.environ.get("PYTEST_XDIST_WORKER"):
        import atexit
        import gc

        atexit.register(gc.freeze)
    elif "_MADE_CONFIG_HOME" in globals():
        shutil.rmtree(_MADE_CONFIG_HOME, ignore_errors=True)


@pytest.fixture
def runner() -> CliRunner:
    return CliRunner()


def copy_example_code(project: Path) -> None:
    """examples/quickstart into ``project``: the code: of the example stacks' jobs (relative to the project root)."""
    shutil.copytree(ROOT / "examples" / "quickstart", project / "examples" / "quickstart",
                    ignore=shutil.ignore_patterns(".venv", "__pycache__", "checkpoints", "output"))


@pytest.fixture
def project(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A temp project (Pulumi.yaml + stacks/ with both examples, and examples/quickstart: their jobs'
    code) as the working directory."""
    shutil.copy(ROOT / "Pulumi.yaml", tmp_path / "Pulumi.yaml")
    shutil.copytree(EXAMPLES, tmp_path / "stacks", ignore=STACKS_ONLY)
    copy_example_code(tmp_path)
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("PULUMI_STACK", raising=False)  # no stack selected but the one a test selects
    monkeypatch.setenv("PULUMI_HOME", str(tmp_path / "pulumi-home"))
    return tmp_path


@pytest.fixture
def no_credentials(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A laptop with no AWS or GCP credentials configured anywhere (and not a VM of either cloud)."""
    import boto3

    from cli.cloud import credentials

    for k in (*credentials.AWS_ENV, *credentials.GCP_ENV, "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN", "CLOUDSDK_CONFIG"):
        monkeypatch.delenv(k, raising=False)
    monkeypatch.setenv("HOME", str(tmp_path / "empty-home"))
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(tmp_path / "none"))
    monkeypatch.setenv("AWS_CONFIG_FILE", str(tmp_path / "none"))
    (tmp_path / "dmi").mkdir()
    (tmp_path / "dmi" / "sys_vendor").write_text("LENOVO\n")
    monkeypatch.setattr(credentials, "DMI", tmp_path / "dmi")
    monkeypatch.setattr(boto3, "DEFAULT_SESSION", None)  # a fresh process: no credentials resolved before


GCP_BASE = {
    "cloud": "gcp",
    "project": "proj-1",
    "region": "us-central1",
    "zones": ["us-central1-a", "us-central1-b"],
}
AWS_BASE = {"cloud": "aws", "region": "us-east-1", "zones": ["us-east-1a", "us-east-1b"]}


# The GPU shape that takes a Regional Persistent Disk: N1 with an attached T4 (only E2, N1, N2 and
# N2D attach one: contract rule gcp.regional-disk-machine-series).
N1_T4 = {"machineType": "n1-standard-8", "accelerator": {"type": "nvidia-tesla-t4", "count": 1}}


def gcp_job(**over) -> dict:
    job = {"id": "train", "machineType": "a2-highgpu-1g", "zone": "us-central1-a", "command": "python train.py"}
    job.update(over)
    return job


def aws_job(**over) -> dict:
    job = {"id": "train", "instanceType": "p4d.24xlarge", "zone": "us-east-1a", "command": "python train.py"}
    job.update(over)
    return job


def stack_config(base: dict, **over) -> dict:
    cfg = copy.deepcopy(base)
    cfg.update(over)
    return cfg


@pytest.fixture
def fake_pulumi(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A fake `pulumi` install (tests/fixtures/fake_pulumi.py) that spotctl will use; returns the
    file where it records every argv as a JSON line."""
    root = tmp_path / "pulumi-install"
    (root / "bin").mkdir(parents=True)
    shutil.copy(ROOT / "tests" / "fixtures" / "fake_pulumi.py", root / "bin" / "pulumi")
    (root / "bin" / "pulumi").chmod(0o755)
    log = tmp_path / "pulumi-argv.jsonl"
    monkeypatch.setenv("SPOTCTL_PULUMI_ROOT", str(root))
    monkeypatch.setenv("FAKE_PULUMI_LOG", str(log))
    return log


class PulumiState:
    """The stateful fake pulumi's state (tests/fixtures/fake_pulumi.py, $FAKE_PULUMI_STATEFUL)."""

    def __init__(self, path: Path, log: Path):
        self.path, self.log = path, log

    def seed(self, stack: str) -> None:
        """The state a plain `pulumi up` of the whole stack file leaves: everything it declares."""
        from cli.lifecycle import stackfile
        from cli.plan import mocks

        plan = mocks.run(stackfile.load(stackfile.resolve(stack, None)), stack)
        resources = [{"urn": r.urn, "type": r.type, "parent": r.parent, "protect": r.protect} for r in plan.resources]
        self.path.write_text(json.dumps({"version": 3, "deployment": {"resources": resources}}))

    def resources(self) -> dict[str, dict]:
        return {r["urn"]: r for r in json.loads(self.path.read_text())["deployment"]["resources"]}

    def named(self, suffix: str) -> list[str]:
        """The names (the URNs' last part) in the state ending with ``suffix``."""
        return sorted(u.rsplit("::", 1)[-1] for u in self.resources() if u.endswith(suffix))

    def ops(self) -> list[list[str]]:
        """Per `up`, the operations it did in order ("create URN", "update URN", "delete URN")."""
        path = Path(str(self.log) + ".ops")
        return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


@pytest.fixture(scope="session")
def _fake_pulumi_planner(_plans_dir: Path):
    """A warm planner for the stateful fake pulumi's `up`s (tests/fixtures/fake_pulumi_planner.py),
    one per worker, started on first use; yields its socket's path. It ends with the session (its
    stdin closes: it also ends if this worker dies)."""
    import socket
    import subprocess
    import tempfile

    where = Path(tempfile.mkdtemp(prefix="spotctl-planner-"))  # short: a Unix socket's path is <= 107 bytes
    address = where / "socket"
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as listener:  # bound here: no `up` can come too early
        listener.bind(str(address))
        listener.listen(16)
        proc = subprocess.Popen([sys.executable, "-m", "tests.fixtures.fake_pulumi_planner", str(listener.fileno())],
                                cwd=ROOT, stdin=subprocess.PIPE, pass_fds=[listener.fileno()],
                                env={**os.environ, "FAKE_PULUMI_PLANS": str(_plans_dir)})  # the run's plans, shared
    try:
        yield str(address)
    finally:
        proc.stdin.close()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        shutil.rmtree(where, ignore_errors=True)


@pytest.fixture
def pulumi_state(fake_pulumi: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, _fake_pulumi_planner: str) -> PulumiState:
    """The fake pulumi with a state: targeted updates create, update and delete as Pulumi's engine
    does (opt-in: each `up` plans the targeted jobs under mocks, in the worker's warm planner)."""
    exe = Path(os.environ["SPOTCTL_PULUMI_ROOT"]) / "bin" / "pulumi"
    text = exe.read_text()
    exe.write_text(f"#!{sys.executable}\n" + text.split("\n", 1)[1])  # the venv's Python: it imports spotctl
    state = tmp_path / "pulumi-state.json"
    monkeypatch.setenv("FAKE_PULUMI_STATEFUL", "1")
    monkeypatch.setenv("FAKE_PULUMI_STATE", str(state))
    monkeypatch.setenv("FAKE_PULUMI_SPOTCTL", str(ROOT))
    monkeypatch.setenv("FAKE_PULUMI_PLANNER", _fake_pulumi_planner)
    return PulumiState(state, fake_pulumi)


def pulumi_calls(log: Path) -> list[list[str]]:
    import json

    return [json.loads(line) for line in log.read_text().splitlines()] if log.exists() else []


def gce_watcher_looked(emu) -> bool:
    """A GCP watcher's first look for a notice is over (it asks for the maintenance event once
    `preempted` was answered). With an hour's poll, a preemption flipped after it is seen by the
    shutdown script alone, however late a loaded machine started the watcher."""
    return any(path.endswith("/instance/maintenance-event") for _, path in list(emu.state.requests))


def data_labels(stack: str, job: str, cloud: str = "gcp", node: int = 0) -> dict[str, str]:
    """What the components put on a job's data disk (gcp labels / aws tags)."""
    from infra.naming import aws_tags, gcp_labels

    if cloud == "aws":
        return {**aws_tags(stack, {}, job=job), "spotctl:node": str(node)}
    return {**gcp_labels(stack, {}, job=job), "spotctl-node": str(node)}


@pytest.fixture
def gce(monkeypatch):
    """A local Compute endpoint holding the example-gcp stack's data disks, correctly labelled."""
    from tests.fixtures.fake_gce import FakeGce

    fake = FakeGce()
    monkeypatch.setenv("SPOTCTL_GCE_ENDPOINT", fake.url)
    for zone, job, nodes in (("us-central1-a", "llm-pretrain", 2), ("us-central1-b", "vit-finetune", 1), ("us-central1-c", "bert-eval", 1)):
        for n in range(nodes):
            fake.add_disk(zone, f"example-gcp-{job}-n{n}-disk", data_labels("example-gcp", job, node=n))
    yield fake
    fake.stop()


@pytest.fixture
def moto_server(monkeypatch: pytest.MonkeyPatch):
    """moto in server mode on 127.0.0.1 (S3, SQS, EC2, ...): boto3 reaches it over HTTP through
    AWS_ENDPOINT_URL, as spotctl's own clients would reach AWS. Yields its URL."""
    import boto3
    import requests
    from moto.server import ThreadedMotoServer

    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0)
    server.start()
    host, port = server.get_host_and_port()
    requests.post(f"http://{host}:{port}/moto-api/reset", timeout=10)  # moto's backends outlive a server
    for k, v in {"AWS_ENDPOINT_URL": f"http://{host}:{port}", "AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing",
                 "AWS_DEFAULT_REGION": "us-east-1"}.items():
        monkeypatch.setenv(k, v)
    yield f"http://{host}:{port}"
    server.stop()
    boto3.DEFAULT_SESSION = None  # it cached these credentials: later tests see theirs


_PLANS: dict[str, object] = {}


@pytest.fixture(scope="session")
def _plans_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Where this run's workers leave the plans they made for each other (xdist: the run's base temp)."""
    base = tmp_path_factory.getbasetemp()
    path = (base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base) / "plans"
    path.mkdir(exist_ok=True)
    return path


# Where a patch cannot reach the Pulumi program `cli.plan.mocks.run` evaluates: the program is infra/*
# (which never imports cli: tests/test_layout.py), cli.plan and the libraries they call; the rest of
# cli (the lifecycle, the watcher, the commands, the cloud adapters) runs around it, never inside it.
_OUTSIDE_THE_PROGRAM = ("cli.", "boto3.", "botocore.", "tests.")


def _outside_the_program(obj: object) -> bool:
    """Whether a monkeypatched ``obj`` (a module, a class, or an instance: what ``setattr`` changed)
    is code the program never runs, so the patch cannot change a plan."""
    import types

    home = obj.__name__ if isinstance(obj, types.ModuleType) else getattr(obj if isinstance(obj, type) else type(obj), "__module__", "")
    home = f"{home}."
    return home.startswith(_OUTSIDE_THE_PROGRAM) and not home.startswith("cli.plan.")


@pytest.fixture(autouse=True)
def _plans_by_content(monkeypatch: pytest.MonkeyPatch, _plans_dir: Path):
    """Reuse a Pulumi mock run (`cli.plan.mocks.run`, 1-5 s each) for a config the program has already
    been run on in this test run (by this worker, another, or a worker's fake-pulumi planner): the plan is a function of the config map
    the program reads, the stack name and the mock account (`test_plan_json_is_deterministic_across_processes`
    holds it to that). Each caller gets its own copy. A test that patched through ``monkeypatch`` anything
    the program may run (a component, an invoke, the planner, the SDK, the standard library) always runs
    it afresh; a patch of the code around it (``_outside_the_program``: the lifecycle, the watcher's
    policy, a cloud adapter) keeps the cache (a move test re-planned the same stack ~60 times)."""
    from cli.plan import mocks as planner
    from infra.contract import reading_back
    from tests.fixtures.fake_pulumi_planner import plan_key, shared_plan

    real = planner.run

    def run(cfg, stack, account=None, decrypted=None):
        # Ours is the first patch; a later one may change the program. Decrypted secrets make the
        # program read the stack file in the working directory: not a function of the config alone.
        if decrypted or not all(_outside_the_program(obj) for obj, _, _ in monkeypatch._setattr[1:]):
            return real(cfg, stack, account, decrypted=decrypted)
        key = plan_key(cfg, stack, account)
        if key not in _PLANS and reading_back():  # rules unenforced: a plan a normal run might refuse, not kept
            return real(cfg, stack, account)
        if key not in _PLANS:
            _PLANS[key] = shared_plan(_plans_dir, key, lambda: real(cfg, stack, account))
        return copy.deepcopy(_PLANS[key])

    monkeypatch.setattr(planner, "run", run)
    yield


# Tests whose scripts, trainers and drills run against the clock (preemption every 0.8 s, shutdown
# budgets). They mostly wait (test_scripts_run.py alone: ~3 min wall for ~18 s CPU), so under `-n auto --dist
# loadgroup` they run as units of their own, each on one worker, never two tests of one unit at once,
# while more workers than cores run the CPU-bound rest (see pytest_xdist_auto_num_workers).
TIMED_GROUPS = {"test_scripts_run.py": "timed-scripts",
                **dict.fromkeys(("test_drill.py", "test_drill_verdicts.py", "test_scripts_reboot.py",
                                 "test_pools_scripts.py", "test_terminal_session.py",
                                 "test_docs_runnable.py"), "timed-rest")}
# test_scripts_run.py's budget tests (~100 s of its ~3 min, waiting out real budgets) are a unit of their own.
TIMED_BUDGETS = ("test_shutdown_path_finishes_in_budget_under_faults", "test_gcp_worst_case_at_real_budgets_fits_the_30s_notice",
                 "test_a_stop_waits_for_the_trainers_group_not_its_leader")
# The boot tier (tests/boot/: Debian guests under QEMU, one story of VMs per cloud) runs when named,
# after the unit suite (pytest_ignore_collect); under xdist it is one unit: its module-scoped guests
# and its one image build stay on one worker, in file order.
BOOT_UNIT = "boot-tier"
# + the budget tests' own unit + one (the boot tier's when named; otherwise one more worker for the
# CPU-bound rest, as the suite's wall time was measured with).
TIMED_UNITS = len(set(TIMED_GROUPS.values())) + 2


def timed_unit(nodeid: str) -> str | None:
    """The timed unit a test belongs to (by its file, and for test_scripts_run.py its function), or None."""
    path, _, name = nodeid.partition("::")
    if path.replace("\\", "/").startswith("tests/boot/"):
        return BOOT_UNIT
    group = TIMED_GROUPS.get(path.rsplit("/", 1)[-1])
    if group == "timed-scripts" and name.split("[", 1)[0] in TIMED_BUDGETS:
        return "timed-scripts-budgets"
    return group


@pytest.hookimpl(optionalhook=True)  # a hook of xdist's: plain `pytest -p no:xdist` must still load
def pytest_xdist_auto_num_workers(config: pytest.Config) -> int | None:
    """`-n auto --dist loadgroup` on 2 or more usable cores: one worker per core for the CPU-bound
    tests plus one per timed unit, which mostly sleep.

    With one worker per core the timed units' waiting held a core's worth of worker idle for most of
    the run (the suite's wall was the timed tests' ~4.7 min back to back). Cores are the ones this
    process may run on (a container's or `taskset`'s share, as xdist counts them without psutil), and
    on a single core the timed tests get no extra worker to compete with."""
    if os.environ.get("PYTEST_XDIST_AUTO_NUM_WORKERS") or config.getvalue("dist") != "loadgroup":
        return None  # xdist's own hook decides
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    return cores + TIMED_UNITS if cores >= 2 else None


@pytest.hookimpl(tryfirst=True, optionalhook=True)  # before xdist's own `loadgroup` scheduler
def pytest_xdist_make_scheduler(config: pytest.Config, log):
    """`--dist loadgroup` with the timed units (``timed_unit``), read from each test's id on the controller.

    xdist's own loadgroup reads an ``xdist_group`` mark that its worker appends to the test's id
    (``id@group``); with pytest 9.2's structured ids that append no longer takes effect, and every
    test was scheduled alone (pytest-dev/pytest-xdist#1386, fix pending in #1388): the timed tests
    ran on several workers at once. The groups are the largest units, so xdist hands them out first."""
    if config.getvalue("dist") != "loadgroup":
        return None
    from xdist.scheduler import LoadGroupScheduling

    class TimedTogether(LoadGroupScheduling):
        def _split_scope(self, nodeid: str) -> str:
            return timed_unit(nodeid) or super()._split_scope(nodeid)

    return TimedTogether(config, log)


@pytest.fixture(autouse=True)
def _no_vm_outlives_its_test():
    """Power off every LocalVM a test booted, whether or not the test kept a handle to kill it: a
    rendered script's watcher left running polls forever (64 were found after one suite run)."""
    from cli.drill import localvm

    made: list = []
    original = localvm.LocalVM.__init__

    def registering(self, *args, **kwargs):
        original(self, *args, **kwargs)
        made.append(self)

    localvm.LocalVM.__init__ = registering
    try:
        yield
    finally:
        localvm.LocalVM.__init__ = original
        for vm in made:
            vm.kill_all()


@pytest.fixture(autouse=True)
def _own_event_cache(monkeypatch: pytest.MonkeyPatch, tmp_path_factory: pytest.TempPathFactory):
    """Each test its own durable event cache (cli.lifecycle.eventstore): moto buckets of the same name
    in two tests hold different objects, and a cache shared between them would mix their events."""
    monkeypatch.setenv("SPOTCTL_EVENT_CACHE", str(tmp_path_factory.mktemp("event-cache") / "events.sqlite"))
