"""``spotctl launch``: a new job, from a job file or flags, validated within its stack, written into the
stack file (under the lock, atomically, the file's other lines and comments kept) and applied alone.

The entry is built and checked here (``entry``, ``check_new``); ``pipeline.change_job`` (``new=``) then
refuses a taken id under the lock, writes the entry and applies its first attempt (``first_attempt``) as
every job change is: preview, question, targeted update, undo (the entry goes).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from cli.lifecycle import stackfile
from cli.lifecycle.states import Change, LifecycleError, check
from infra.basics import ConfigError, JobState, read_regular

# The entry's keys in the order they are written (anything else after them, as given).
KEY_ORDER = ("id", "machineType", "instanceType", "accelerator", "nodes", "zone", "capacity", "diskGb", "deadlineHours",
             "jobHours", "policy", "code", "setup", "workdir", "command")


JOB_FILE_LIMIT = 1 << 20  # one job's keys: a file larger than this is not a job file (and is never read whole)


def read_job_file(path: Path) -> dict[str, Any]:
    """A job file: one mapping with the keys of a job entry (as in ``spotctl:jobs``)."""
    import yaml

    try:  # (decoded as a stack file is: one line naming the file and the first byte that is not UTF-8)
        doc = yaml.safe_load(stackfile.decode(read_regular(path, JOB_FILE_LIMIT), str(path)))
    except OSError as exc:
        raise ConfigError(str(path), [f"cannot read: {exc.strerror}"]) from None
    except yaml.YAMLError as exc:
        raise ConfigError(str(path), [f"not valid YAML: {str(exc).splitlines()[0]}"]) from None
    if isinstance(doc, list) and len(doc) == 1:
        doc = doc[0]  # (a job copied with its `- ` from a stack file)
    if not isinstance(doc, dict):
        raise ConfigError(str(path), ["expected one job: a mapping with the keys of a spotctl:jobs entry "
                                      "(id, machineType or instanceType, zone, command, ...)"])
    from infra.config.jobs import Job

    managed = [k for k in map(str, doc) if Job.managed_key(k)]
    if managed:
        raise ConfigError(str(path), ["state: a new job is pending until launch applies it: remove the key" if k == "state"
                                      else f"{k}: spotctl writes this key as the job runs (a new job has none): remove "
                                      "the key" for k in managed])
    return {str(k): v for k, v in doc.items()}


def rebased_code(code: Any, base: Path, root: Path, source: str) -> Any:
    """A job file's ``code`` directory (relative to ``base``, the job file's directory) as the stack file
    records it: relative to the project root ``root``, through the check ``--code`` gets (:func:`code_flag`),
    so no machine-local path reaches the shared stack file. Repositories and values that are not a
    directory name are left for validation; ConfigError names ``source`` (the job file) and the key."""
    text = code if isinstance(code, str) else code.get("dir") if isinstance(code, dict) else None
    if not isinstance(text, str) or not text or "\\" in text:
        return code
    key = "code" if isinstance(code, str) else "code.dir"
    try:
        new = code_flag(text, root, base)
    except ConfigError as exc:
        raise ConfigError(source, [f"{key}: {p}" for p in exc.problems]) from None
    return new if isinstance(code, str) else {**code, "dir": new}


def code_flag(text: str, root: Path, cwd: Path) -> str:
    """``--code DIR`` as the entry's ``code``: a directory as the shell means it (relative to ``cwd``),
    written relative to the project root ``root`` (as ``code:`` is read, on every machine that launches
    or resumes the job). Raises ConfigError for no such directory or one outside the project root."""
    import re

    if re.match(r"[a-z+]+://|git@", text):
        return text  # (the entry's own check says how a repository is written)
    full = (cwd / Path(text).expanduser()).resolve()
    if not full.is_dir():
        raise ConfigError("--code", [f"{text}: {full} {'is not a directory' if full.exists() else 'does not exist'}"])
    try:
        inside = full.relative_to(root.resolve())
    except ValueError:
        raise ConfigError("--code", [f"{text}: {full} is outside the project root {root} (the directory holding "
                                     "Pulumi.yaml): the stack file names code relative to it, for every machine that "
                                     "launches or resumes the job. Move the code under it, or give a job file with "
                                     "code: {git: URL, ref: REF}"]) from None
    return "./" + inside.as_posix() if inside.parts else "./"


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
        elif key == "gpus":  # (``--gpus`` as the catalog resolves it: cli.commands.launch.parse_gpus)
            out["accelerator"] = value
        else:
            out[key] = int(value) if isinstance(value, float) and value.is_integer() else value  # (12, not 12.0)
    if "zone" not in out and zones:
        out["zone"] = zones[0]
    return {k: out[k] for k in sorted(out, key=lambda k: (KEY_ORDER.index(k) if k in KEY_ORDER else len(KEY_ORDER), 0))}


# The flags of the entry's keys: a flag user reads errors in the words they typed.
FLAG_OF = {"id": "--id", "machineType": "--machine", "instanceType": "--machine", "accelerator": "--gpus", "nodes": "--nodes",
           "zone": "--zone", "command": "--command", "code": "--code", "deadlineHours": "--deadline-hours", "jobHours": "--job-hours"}


def in_flags(problem: str, keys: set[str]) -> str:
    """``problem`` (``KEY: message``) in flag words when ``KEY`` came from a flag (or is missing with no job file)."""
    key, sep, message = problem.partition(": ")
    top = key.split(".")[0].split("[")[0]
    if not sep or top not in keys or top not in FLAG_OF:
        return problem
    message = message.replace("required key is missing", "required").replace("required on GCP", "required (the GCP "
                              "machine type)").replace("required on AWS", "required (the EC2 instance type)")
    message = re.sub(r"set (?:accelerator )?\{type: ([\w.-]+), count: (\d+)\}", r"give --gpus \1:\2", message)
    message = message.replace("leave accelerator out", "leave --gpus out").replace("set accelerator count ", "give --gpus ")
    return f"{FLAG_OF[top]}: {message}"


def refuse_taken(ref: stackfile.StackRef, jobs: list, job_id: str) -> None:
    """Raises LifecycleError, naming the job's state, when the stack has a job of this id."""
    for old in jobs:
        if isinstance(old, dict) and old.get("id") == job_id:
            state = old.get("state", "pending")
            undo = f", or `spotctl cleanup {job_id} --no-apply --yes` (never applied: only its entry goes)" \
                if never_applied(old) else ""
            raise LifecycleError(f"job {job_id} already exists in {ref.path} (state {state}, attempt {old.get('attempt', 1)}): "
                                 f"pick another id, or `spotctl resume {job_id}` / `spotctl status {job_id}`{undo}")


def check_new(ref: stackfile.StackRef, new: Mapping[str, Any], source: str, flagged: set[str] = frozenset()):
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
        problems = [p.replace(f"{at}.", "").replace(at, f"job {job_id}") for p in exc.problems]
        problems = [in_flags(p.removeprefix(f"job {job_id}: ") if source.endswith(f"job {job_id}") else p, set(flagged))
                    for p in problems]
        raise ConfigError(source, problems) from None
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
    # One key a line, as the file's jobs are written (a small mapping such as the accelerator stays
    # `{type: ..., count: 1}`): PyYAML would write an entry of plain values as one `{...}` line.
    def one(key: str, value: Any) -> list[str]:
        if not isinstance(value, (dict, list)):
            return yaml.safe_dump({key: value}, default_flow_style=False, width=10**6, allow_unicode=True).splitlines()
        return yaml.safe_dump({key: value}, sort_keys=False, default_flow_style=None, width=10**6,
                              allow_unicode=True).splitlines()

    lines = [line for k, v in new.items() for line in one(k, v)]
    return "".join(f"{indent}{'- ' if n == 0 else '  '}{line}\n" for n, line in enumerate(lines))


def never_applied(entry: Mapping[str, Any]) -> bool:
    """A job entry no spotctl command ever applied: pending, no attempt recorded, no update under way
    (what ``launch --no-apply`` writes)."""
    return entry.get("state", "pending") == "pending" and "attempt" not in entry and "applying" not in entry


def listed_never_applied(ref: stackfile.StackRef, job_id: str) -> bool:
    """Whether the stack file has ``job_id`` as a never-applied entry (``forget`` decides again under the lock)."""
    entry = next((e for e in stackfile.read_config(ref.path).get(stackfile.key("jobs")) or []
                  if isinstance(e, dict) and e.get("id") == job_id), None)
    return entry is not None and never_applied(entry)


def forget(ref: stackfile.StackRef, job_id: str) -> None:
    """Take a never-applied job out of the stack file (decided and cut under one hold of the lock);
    any other job is refused: it may have disks, and ``cleanup`` decides on those."""
    with stackfile.locked(ref.path):
        raw = stackfile.read_config(ref.path)
        entry = next((e for e in raw.get(stackfile.key("jobs")) or [] if isinstance(e, dict) and e.get("id") == job_id), None)
        if entry is None:
            raise LifecycleError(f"job {job_id} is not in {ref.path}")
        if not never_applied(entry):
            raise LifecycleError(f"job {job_id} was applied (state {entry.get('state', 'pending')}, attempt "
                                 f"{entry.get('attempt', 1)}): its entry goes with its disks, by `spotctl cleanup {job_id}` "
                                 "once it completed")
        stackfile.take_job(ref.path, job_id)


def first_attempt(job) -> Change:
    """The decision of the launch's update: the job's first attempt is applied (pending -> running)."""
    if job.state is not JobState.PENDING:
        return Change(job.id, {}, f"is {job.state.value} already", noop=True)
    return Change(job.id, {"state": JobState.RUNNING.value}, check(job.id, JobState.PENDING, JobState.RUNNING))
