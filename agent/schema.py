"""The event schema, object names, disk paths and limits, shared by the VM agent and ``cli/``.

Stdlib only and Python 3.8 syntax: this module runs on the VM inside the agent's zipapp.
"""

from __future__ import annotations

import json
import re
import time
from typing import Mapping, Optional

# The keys of one event document, in the order the agent writes them.
EVENT_KEYS = ("stack", "kind", "job", "attempt", "node", "event", "time", "instance", "zone", "details")

# What one recorded event may cost whoever reads it. A job's VM writes its own events, so a broken or
# hostile one must not exhaust the reader (the watcher is a small VM serving every job of the stack):
# one event is one JSON line of a few hundred bytes; 1 MiB is far above it and a larger object is
# skipped unread. A job disk's ``events.jsonl`` (a year of 10-minute checkpoints ~20 MB) gets 64 MiB.
EVENT_OBJECT_LIMIT = 1 << 20
EVENT_LOG_LIMIT = 1 << 26
# A detail value longer than this is cut (the whole event stays far below EVENT_OBJECT_LIMIT).
DETAIL_LIMIT = 4096
# The trainer's log travels in chunks of at most this many bytes, named by their byte offset.
LOG_CHUNK = 1 << 16

# On the job disk.
DISK_DIR = ".spotctl"
EVENT_LOG = DISK_DIR + "/events.jsonl"
COMPLETED_MARKER = DISK_DIR + "/completed"
CHECKPOINTS = "checkpoints"
CODE_DIR = "code"

# Object keys: ``<stack>/<job>/attempt-N/node-K/<time>-<event>.json`` and ``.../logs/<offset>.log``.
EVENT_KEY = re.compile(r"(?P<stack>[^/]+)/(?P<job>[^/]+)/attempt-(?P<attempt>\d+)/node-(?P<node>\d+)/[^/]+\.json")
# A copy of one job's objects: ``attempt-N/node-K/<file>``.
JOB_COPY_FILE = re.compile(r"attempt-\d+/node-[^/]+/[^/]+")
DISK_LOG_RE = re.compile(r"^attempt-(\d+)-node-(\d+)\.log$")
CHUNK_RE = re.compile(r"attempt-(\d+)/node-(\d+)/logs/(\d+)\.log$")
# Where a stack's agent zipapp is kept in its bucket (one object per digest, kept when replaced, so
# a VM whose bootstrap pins an older digest still finds its agent).
AGENT_PREFIX = "_spotctl/agent/"

# Lines a trainer prints to tell spotctl how far it got (README "Checkpoints").
PROGRESS_LINE = re.compile(rb"^SPOTCTL_PROGRESS\s+([0-9]+)")
CHECKPOINT_LINE = re.compile(rb"^SPOTCTL_CHECKPOINT\s+([0-9]+)\s*$")

# Every variable the VM exports to the command, with what it means (docs are generated from this).
# The job's own env comes first: none of these can be overridden by it.
EXPORTED_VARIABLES: dict[str, str] = {
    "SPOTCTL_CLOUD": "gcp or aws",
    "SPOTCTL_REGION": "the stack's region",
    "SPOTCTL_STACK": "the stack's name",
    "SPOTCTL_JOB_ID": "the job's id (jobs only)",
    "SPOTCTL_POOL": "the pool's name (pools only)",
    "SPOTCTL_BUSY_FILE": "create it while the pool's agent works, remove it when idle (pools only)",
    "SPOTCTL_ATTEMPT": "the attempt number, 1 for the first launch",
    "SPOTCTL_MOUNT": "where the job disk is mounted",
    "SPOTCTL_WORKDIR": "with code: the code's workdir, where the command runs; without: the job disk (write outputs here)",
    "SPOTCTL_CODE_DIR": "the unpacked code (empty without code)",
    "SPOTCTL_CHECKPOINT_DIR": "the job disk's checkpoints directory: write checkpoints here",
    "SPOTCTL_RESUME": "1 when the disk shows training already ran (a checkpoint or an earlier start)",
    "MASTER_ADDR": "the address of node 0 (torchrun's rendezvous)",
    "MASTER_PORT": "the rendezvous port",
    "NODE_RANK": "this node's rank, 0 to WORLD_SIZE - 1",
    "WORLD_SIZE": "the number of nodes",
}


def variables_table() -> str:
    """EXPORTED_VARIABLES as the Markdown table of docs/guides/vm-agent.md (a test keeps them equal)."""
    return "| variable | meaning |\n| --- | --- |\n" + "".join("| `%s` | %s |\n" % kv for kv in EXPORTED_VARIABLES.items())
POOL_ONLY = ("SPOTCTL_POOL", "SPOTCTL_BUSY_FILE")


def event_object_prefix(stack: str, name: str) -> str:
    """Where the VM of job or pool ``name`` writes its objects (the default event prefix)."""
    return f"{stack}/{name}/"


def node_prefix(event_prefix: str, name: str, attempt: int, node: int, vm: str = "") -> str:
    """``<event_prefix><name>/attempt-N/node-K[-vm-<vm>]/``: a pool's VMs are all attempt 1, node 0,
    so their objects also carry the VM's name (no two VMs ever write one object name)."""
    return "%s%s/attempt-%d/node-%d%s/" % (event_prefix, name, attempt, node, ("-vm-" + vm) if vm else "")


def event_object(node_dir: str, at: str, event: str) -> str:
    return f"{node_dir}{at}-{event}.json"


def log_object(node_dir: str, offset: int) -> str:
    return "%slogs/%012d.log" % (node_dir, offset)


def disk_log(attempt: int, node: int) -> str:
    """The trainer's log on the job disk, relative to the mount."""
    return "%s/logs/attempt-%d-node-%d.log" % (DISK_DIR, attempt, node)


def agent_object(sha256: str) -> str:
    return f"{AGENT_PREFIX}{sha256}.pyz"


_CONTROL = re.compile("[\x00-\x08\x0b\x0c\x0e-\x1f]")


def clean(value: object) -> str:
    """A value as an event carries it: control characters other than newline, CR and tab dropped."""
    return _CONTROL.sub("", str(value))


def event_time(now: Optional[float] = None) -> str:
    """UTC with milliseconds: ``2026-01-02T03:04:05.678Z``."""
    t = time.time() if now is None else now
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(t)) + ".%03dZ" % int((t % 1) * 1000)


def event_line(stack: str, kind: str, name: str, attempt: int, node: int, event: str, at: str,
               instance: str, zone: str, details: Mapping[str, object]) -> str:
    """One event as the JSON line the agent writes and uploads."""
    doc = {
        "stack": clean(stack), "kind": clean(kind), "job": clean(name), "attempt": int(attempt), "node": int(node),
        "event": clean(event), "time": at, "instance": clean(instance), "zone": clean(zone),
        "details": {clean(k): clean(v)[:DETAIL_LIMIT] for k, v in details.items()},
    }
    return json.dumps(doc, ensure_ascii=False, separators=(",", ":"))
