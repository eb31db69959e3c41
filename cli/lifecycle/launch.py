"""``spotctl launch``: a new job, from a job file or flags, validated within its stack, written into the
stack file (under the lock, atomically, the file's other lines and comments kept) and applied alone.

The entry is built and checked here (``entry``, ``check_new``); ``pipeline.change_job`` (``new=``) then
refuses a taken id under the lock, writes the entry and applies its first attempt (``first_attempt``) as
every job change is: preview, question, targeted update, undo (the entry goes).
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from cli.lifecycle import stackfile
from cli.lifecycle.states import Change, LifecycleError, check
from infra.basics import ConfigError, JobState

# The entry's keys in the order they are written (anything else after them, as given).
KEY_ORDER = ("id", "machineType", "instanceType", "accelerator", "nodes", "zone", "capacity", "diskGb", "deadlineHours",
             "jobHours", "policy", "code", "setup", "workdir", "command")


def read_job_file(path: Path) -> dict[str, Any]:
    """A job file: one mapping with the keys of a job entry (as in ``spotctl:jobs``)."""
    import yaml

    try:
        doc = yaml.safe_load(path.read_text(encoding="utf-8"))
    except OSError as exc:
        raise ConfigError(str(path), [f"cannot read: {exc.strerror}"]) from None
    except yaml.YAMLError as exc:
        raise ConfigError(str(path), [f"not valid YAML: {str(exc).splitlines()[0]}"]) from None
    if isinstance(doc, list) and len(doc) == 1:
        doc = doc[0]  # (a job copied with its `- ` from a stack file)
    if not isinstance(doc, dict):
        raise ConfigError(str(path), ["expected one job: a mapping with the keys of a spotctl:jobs entry "
                                      "(id, machineType or instanceType, zone, command, ...)"])
    if "state" in doc:
        raise ConfigError(str(path), ["state: a new job is pending until launch applies it: remove the key"])
    return {str(k): v for k, v in doc.items()}


def rebased_code(code: Any, base: Path, root: Path) -> Any:
    """A ``code`` directory given relative to ``base`` (the job file's directory, or the working
    directory for ``--code``), as the stack file records it: relative to the project root ``root``
    (what resume, watch and drill read it against), or absolute when it lies outside. Repositories,
    absolute and ``~`` paths, and values that are not a directory are left for validation."""
    import os

    text = code if isinstance(code, str) else code.get("dir") if isinstance(code, dict) else None
    if not isinstance(text, str) or not text or text.startswith(("~", "/")) or "\\" in text:
        return code
    where = os.path.normpath(os.path.join(base.resolve(), text))
    rel = os.path.relpath(where, root.resolve())
    new = where if rel == ".." or rel.startswith("../") else "./" if rel == "." else f"./{rel}"
    return new if isinstance(code, str) else {**code, "dir": new}


def parse_gpus(text: str) -> dict[str, Any]:
    """``--gpus TYPE:COUNT`` (or ``TYPE`` for one) as the entry's ``accelerator``."""
    kind, _, count = text.partition(":")
    if not kind or (count and not count.isdigit()) or count == "0":
        raise ConfigError("--gpus", [f"expected TYPE:COUNT (e.g. nvidia-l4:1), got {text!r}"])
    return {"type": kind, "count": int(count or 1)}


def entry(cloud: str, zones: list[str], given: Mapping[str, Any], flags: Mapping[str, Any]) -> dict[str, Any]:
    """The job's entry: the job file's keys (``given``), overridden by the flags that were given; the
    machine flag becomes ``machineType`` (GCP) or ``instanceType`` (AWS); the zone defaults to the
    stack's first."""
    out = dict(given)
    for key, value in flags.items():
        if value is None:
            continue
        if key == "machine":
            out["machineType" if cloud == "gcp" else "instanceType"] = value
        elif key == "gpus":
            out["accelerator"] = parse_gpus(value)
        else:
            out[key] = int(value) if isinstance(value, float) and value.is_integer() else value  # (12, not 12.0)
    if "zone" not in out and zones:
        out["zone"] = zones[0]
    return {k: out[k] for k in sorted(out, key=lambda k: (KEY_ORDER.index(k) if k in KEY_ORDER else len(KEY_ORDER), 0))}


def refuse_taken(ref: stackfile.StackRef, jobs: list, job_id: str) -> None:
    """Raises LifecycleError, naming the job's state, when the stack has a job of this id."""
    for old in jobs:
        if isinstance(old, dict) and old.get("id") == job_id:
            state = old.get("state", "pending")
            raise LifecycleError(f"job {job_id} already exists in {ref.path} (state {state}, attempt {old.get('attempt', 1)}): "
                                 f"pick another id, or `spotctl resume {job_id}` / `spotctl status {job_id}`")


def check_new(ref: stackfile.StackRef, new: Mapping[str, Any], source: str):
    """The stack's config with the new job (validated whole, as the stack file will be), before its
    code is packed and its cost shown. Raises LifecycleError for an id the stack has now (the
    pipeline's ``decide`` refuses it again under the lock), ConfigError naming the job's keys."""
    raw = stackfile.read_config(ref.path)
    jobs = list(raw.get(stackfile.key("jobs")) or [])
    job_id = new.get("id")
    if not job_id:
        raise ConfigError(source, ["id: a job needs an id (--id NAME, or `id:` in the job file)"])
    refuse_taken(ref, jobs, job_id)
    raw[stackfile.key("jobs")] = [*jobs, dict(new)]
    try:
        cfg = stackfile.validate(stackfile.namespaced(raw, str(ref.path)), str(ref.path))
    except ConfigError as exc:  # the new entry's keys by the job's name, not by an index the user never wrote
        at = f"{stackfile.key('jobs')}[{len(jobs)}]"
        raise ConfigError(source, [p.replace(f"{at}.", "").replace(at, f"job {job_id}") for p in exc.problems]) from None
    return cfg


def block(path: Path, new: Mapping[str, Any]) -> str:
    """The entry as YAML lines indented as the file's jobs are ("" when the file has none in block
    style: the round trip then writes it)."""
    import yaml

    lines = stackfile.read_text(path).split("\n")
    head = next((i for i, line in enumerate(lines) if line.strip() == f"{stackfile.key('jobs')}:"), None)
    if head is None:
        return ""
    dash = next((line for line in lines[head + 1:] if line.lstrip().startswith("- ")), None)
    if dash is None:
        return ""
    indent = " " * (len(dash) - len(dash.lstrip()))
    text = yaml.safe_dump([dict(new)], sort_keys=False, default_flow_style=None, width=10**6, allow_unicode=True)
    return "".join(f"{indent}{line}\n" for line in text.splitlines())


def first_attempt(job) -> Change:
    """The decision of the launch's update: the job's first attempt is applied (pending -> running)."""
    if job.state is not JobState.PENDING:
        return Change(job.id, {}, f"is {job.state.value} already", noop=True)
    return Change(job.id, {"state": JobState.RUNNING.value}, check(job.id, JobState.PENDING, JobState.RUNNING))
