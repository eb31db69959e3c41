"""Finding, reading and safely rewriting ``stacks/Pulumi.<stack>.yaml``.

Edits are round-trips through ruamel.yaml (comments, key order and ``secure:`` values untouched),
validated before anything is written, and written atomically (temp file + rename) under a file
lock, so a crash or a concurrent spotctl leaves either the old or the new valid file.

Longer than 420 lines because every way spotctl reads or rewrites a stack file (the one loader with
its bounds, the lock, the atomic write, splicing, cutting and restoring a job, the hooks that pull and
push its shared copy: ``cli.lifecycle.sync``) must agree, so they live together.
"""

from __future__ import annotations

import collections
import contextlib
import copy
import errno
import io
import json
import os
import re
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from infra.basics import NAMESPACE, ConfigError

if TYPE_CHECKING:
    from infra.config import StackConfig


# infra.config (pydantic's models) is imported on the first validation, not with this module: a
# command that validates nothing (`status` of a file validated before) never pays for it (issue 20).
def validate(raw: Mapping[str, Any], source: str) -> StackConfig:
    from infra.config import validate

    return validate(raw, source)


def namespaced(config: Mapping[str, Any], source: str) -> dict[str, Any]:
    from infra.config import namespaced

    return namespaced(config, source)


def provider_conflicts(config: Mapping[str, Any], cfg: StackConfig, source: str) -> None:
    from infra.config import provider_conflicts

    provider_conflicts(config, cfg, source)

STACK_FILE_RE = re.compile(r"Pulumi\.(?P<stack>[A-Za-z0-9_.-]+)\.yaml")  # fullmatch: `$` would allow a trailing newline
LOCK_TIMEOUT_S = 30.0


@dataclass(frozen=True)
class StackRef:
    """A stack by name and the file that holds its config; ``qualified`` is the name Pulumi selects
    it by when it was given as ``org/project/stack`` (``name`` is always the short stack name)."""

    name: str
    path: Path
    qualified: str | None = None

    @property
    def pulumi_name(self) -> str:
        return self.qualified or self.name


def project_root(start: Path | None = None) -> Path:
    """The nearest directory at or above ``start`` holding ``Pulumi.yaml`` (else ``start``)."""
    here = (start or Path.cwd()).resolve()
    for d in (here, *here.parents):
        if (d / "Pulumi.yaml").is_file():
            return d
    return here


# Used with fullmatch: `$` would also match before a trailing newline.
STACK_NAME_RE = re.compile(r"(?:(?P<org>[A-Za-z0-9_.-]+)/(?:(?P<project>[A-Za-z0-9_.-]+)/)?)?(?P<stack>[A-Za-z0-9_.-]+)")


def resolve(stack: str | None, stack_file: Path | None) -> StackRef:
    """Turn ``--stack NAME`` or ``--stack-file PATH`` into a StackRef, as Pulumi picks a stack:
    the option, else ``$PULUMI_STACK``, else the stack selected in the workspace. ``NAME`` may be
    ``org/project/stack`` (or ``org/stack``); the file is ``Pulumi.<stack>.yaml`` in the project's
    ``stackConfigDir``.

    Raises:
        ConfigError: both given, none found, a name of another project, or a file not named
            ``Pulumi.<stack>.yaml``.
    """
    if stack is not None and stack_file is not None:
        raise ConfigError("spotctl", ["give one of --stack NAME or --stack-file PATH, not both"])
    if stack_file is not None:
        m = STACK_FILE_RE.fullmatch(stack_file.name)
        if not m:
            raise ConfigError(str(stack_file), ["a stack file must be named Pulumi.<stack>.yaml"])
        return StackRef(m["stack"], stack_file)
    from cli.lifecycle.workspace import project_settings, selected_stack, stack_config_dir

    root = project_root()
    source = "--stack"
    if stack is None and os.environ.get("PULUMI_STACK"):
        stack, source = os.environ["PULUMI_STACK"], "PULUMI_STACK"
    if stack is None:
        stack, source = selected_stack(root), "the selected stack"
    if stack is None:
        raise ConfigError("spotctl", ["no stack: give --stack NAME (or --stack-file PATH), set PULUMI_STACK, "
                                      "or select one with `pulumi stack select NAME`"])
    m = STACK_NAME_RE.fullmatch(stack)
    if not m:
        raise ConfigError("spotctl", [f"{source} {stack!r}: expected NAME or org/project/NAME "
                                      "(letters, digits, '-', '_' and '.')"])
    project = project_settings(root).get("name")
    if m["project"] and project and m["project"] != project:
        raise ConfigError("spotctl", [f"{source} {stack!r}: stack of project {m['project']!r}, but this is project "
                                      f"{project!r} ({root / 'Pulumi.yaml'})"])
    path = stack_config_dir(root) / f"Pulumi.{m['stack']}.yaml"
    with contextlib.suppress(ValueError):
        path = path.relative_to(Path.cwd())
    return StackRef(m["stack"], path, stack if m["org"] else None)


def _yaml():
    from ruamel.yaml import YAML

    y = YAML(typ="rt")
    y.preserve_quotes = True
    y.width = 4096  # never re-wrap long commands
    y.indent(mapping=2, sequence=4, offset=2)
    return y


BOM = "\ufeff"
MAX_DEPTH = 32  # nesting of a stack file (jobs > job > env is 5 deep)
MAX_NODES = 1_000_000  # nodes after expanding aliases: a 5,000-job stack has ~150,000; a bomb has billions


def _read_text(path: Path) -> str:
    """The file as text: UTF-8 (a byte-order mark is dropped, and kept on write by atomic_write)
    with LF line ends (CRLF files are read as LF and written back as CRLF)."""
    try:
        with open(path, "rb") as fh:
            data = fh.read()
            state = _file_state(os.fstat(fh.fileno()))  # after the read: what was read is this version
    except FileNotFoundError:
        raise ConfigError(str(path), [f"stack file not found; {_stacks_there(path.parent)}"]) from None
    except OSError as exc:
        raise ConfigError(str(path), [f"cannot read: {exc.strerror}"]) from None
    last = _LAST_READ[0] if _LAST_READ else None
    if last is not None and last[1] == data:  # read again under the lock: the same text object, so every
        _LAST_READ[:] = [(last[0], data, state)]  # cache keyed by it (guard, part, parse) answers by identity (issue 20)
        return last[0]
    text = decode(data, str(path))
    _LAST_READ[:] = [(text, data, state)]
    return text


def _stacks_there(folder: Path) -> str:
    """The stacks a folder has files for, to name with a stack that is not there."""
    try:
        names = sorted(m["stack"] for p in folder.iterdir() if (m := STACK_FILE_RE.fullmatch(p.name)))
    except OSError:
        names = []
    where = folder if str(folder) not in ("", ".") else Path(".")
    return f"the stacks in {where}/ are: {', '.join(names)}" if names else f"{where}/ has no Pulumi.<stack>.yaml"


_LAST_READ: list[tuple[str, bytes, str]] = []  # the last text read, its bytes and the file's state after the read


def _file_state(st: os.stat_result) -> str:
    """A file version's identity as the index's guard records it (see the job index's comment)."""
    return f"state:{st.st_dev}:{st.st_ino}:{st.st_size}:{st.st_mtime_ns}:{st.st_ctime_ns}"


def decode(data: bytes, where: str) -> str:
    """A stack file's bytes as the loader reads them: UTF-8, no byte-order mark, LF line ends."""
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        line = data[: exc.start].count(b"\n") + 1
        raise ConfigError(where, [f"line {line}: not UTF-8 text (byte 0x{data[exc.start]:02x}); save the file as UTF-8"]) from None
    text = text.removeprefix(BOM)
    return text.replace("\r\n", "\n") if b"\r" in data else text  # (a scan of the bytes, not a copy)


def _check_shape(path: Path, text: str) -> tuple[int, bool]:
    """Refuse, before anything builds objects from it, YAML nested deeper than MAX_DEPTH or that
    expands (through aliases) to more than MAX_NODES nodes: streamed events, no recursion.

    Returns:
        (the nodes it expands to, whether it has anchors or aliases) for the job index.
    """
    import yaml

    anchored = False
    sizes: dict[str, int] = {}
    frames: list[list[Any]] = [[None, 0]]  # [anchor, nodes so far]
    try:
        for event in yaml.parse(text, Loader=getattr(yaml, "CSafeLoader", yaml.SafeLoader)):
            if isinstance(event, yaml.AliasEvent):
                anchored = True
                frames[-1][1] += sizes.get(event.anchor, 1)
            elif isinstance(event, yaml.ScalarEvent):
                frames[-1][1] += 1
                if event.anchor:
                    anchored = True
                    sizes[event.anchor] = 1
            elif isinstance(event, (yaml.MappingStartEvent, yaml.SequenceStartEvent)):
                frames.append([event.anchor, 1])
                anchored = anchored or bool(event.anchor)
                if len(frames) > MAX_DEPTH + 1:
                    line = event.start_mark.line + 1
                    raise ConfigError(str(path), [f"line {line}: nested more than {MAX_DEPTH} levels deep"])
            elif isinstance(event, (yaml.MappingEndEvent, yaml.SequenceEndEvent)):
                anchor, size = frames.pop()
                if anchor:
                    sizes[anchor] = size
                frames[-1][1] += size
            if frames[-1][1] > MAX_NODES or (len(frames) > 1 and sum(f[1] for f in frames) > MAX_NODES):
                line = event.start_mark.line + 1
                raise ConfigError(str(path), [f"line {line}: expands to more than {MAX_NODES} values (aliases of aliases?)"])
    except yaml.YAMLError as exc:
        raise _yaml_error(path, exc) from None
    return frames[0][1], anchored


def _yaml_error(path: Path, exc: Exception) -> ConfigError:
    mark = getattr(exc, "problem_mark", None)
    where = f"line {mark.line + 1}: " if mark is not None else ""
    problem = getattr(exc, "problem", None) or str(exc).splitlines()[0]
    return ConfigError(str(path), [f"{where}not valid YAML: {problem}"])


def _check_document(path: Path, doc: Any) -> Any:
    if doc is None:
        doc = {}
    if not isinstance(doc, Mapping):
        raise ConfigError(str(path), ["expected a YAML mapping with a 'config:' key"])
    outside = [str(k) for k in doc if ":" in str(k)]  # (a stack file's own keys, e.g. secretsprovider, have none)
    if outside:
        raise ConfigError(str(path), [f"{k}: outside `config:`: Pulumi reads a stack's settings only under `config:` "
                                      f"(indent {k} under a `config:` line)" for k in outside])
    config = doc.get("config", {})
    if not isinstance(config, Mapping):
        raise ConfigError(str(path), ["config: expected a mapping of 'namespace:key' entries"])
    return doc


def _load_document(path: Path, text: str | None = None) -> Any:
    """Round-trip load (ruamel): for edits that must keep comments and layout."""
    from ruamel.yaml.error import YAMLError

    text = _read_text(path) if text is None else text
    _check_shape(path, text)
    _fast_load(path, text)  # the same errors as every reader (duplicates named with their line)
    try:
        doc = _yaml().load(text)
    except YAMLError as exc:
        raise _yaml_error(path, exc) from None
    return _check_document(path, doc)


def _fast_loader():
    """PyYAML's C loader with YAML 1.2 booleans (true/false only), as Pulumi reads stack files."""
    import yaml

    base = getattr(yaml, "CSafeLoader", yaml.SafeLoader)

    class Loader(base):  # type: ignore[misc, valid-type]
        pass

    bool_tag = "tag:yaml.org,2002:bool"
    Loader.yaml_implicit_resolvers = {
        first: [(tag, rx) for tag, rx in resolvers if tag != bool_tag]
        for first, resolvers in base.yaml_implicit_resolvers.items()
    }
    Loader.add_implicit_resolver(bool_tag, re.compile(r"^(?:true|True|TRUE|false|False|FALSE)$"), list("tTfF"))

    def construct_mapping(self, node, deep=False):
        # PyYAML keeps the last of duplicate keys silently (ruamel, the editor, refuses them):
        # refuse them here too, so validate, plan and the editor agree on every file.
        seen: dict[Any, int] = {}
        for key_node, _ in node.value:
            if isinstance(key_node, yaml.ScalarNode):
                if key_node.value in seen:
                    raise yaml.constructor.ConstructorError(
                        None, None, f"duplicate key {key_node.value!r} (first on line {seen[key_node.value] + 1})",
                        key_node.start_mark)
                seen[key_node.value] = key_node.start_mark.line
        return base.construct_mapping(self, node, deep=deep)

    Loader.construct_mapping = construct_mapping
    return Loader


_FAST_LOADER = None

# Parsed (and validated) stack files by the sha256 of their whole text: a watcher reads the same
# 1,000-job file every cycle and again under the lock for each edit, and parsing it is most of the
# cost (bench/watch.py). The text is read every time (cheap); only the parse is reused. Unlike an
# mtime+size guard, the hash never misses an edit of the same length within the clock's granularity.
# Only successes are kept; the last few texts suffice (the file before and after an edit).
_PARSED: collections.OrderedDict[str, dict[str, Any]] = collections.OrderedDict()
_PARSED_MAX = 4


_PARSED_LOCK = threading.Lock()


def sha256(data: bytes):
    """A sha256 hash object of ``data``: OpenSSL's (hashlib) for large data or once it is loaded, else
    Python's built-in module (the same digest): loading OpenSSL is ~2 ms of a short command (issue 20)."""
    import sys

    if len(data) < 1 << 18 and "hashlib" not in sys.modules:
        with contextlib.suppress(ImportError):
            from _sha256 import sha256 as small

            return small(data)
    import hashlib

    return hashlib.sha256(data)


_LAST_DIGEST: list[tuple[str, str]] = []  # (text, its sha256): a command reads the same text several times


def _digest(text: str) -> str:
    """The sha256 of ``text``: the parse cache's key and the job index's guard (one hash of a text, not one each)."""
    last = _LAST_DIGEST[0] if _LAST_DIGEST else None
    if last is not None and last[0] == text:  # a memcmp, far cheaper than hashing megabytes again
        return last[1]
    # the bytes of this very text when just read or written as is (no BOM, LF): no copy of 2 MB to encode
    known = next((data for seen, data, *_ in (*_LAST_READ, *_LAST_WRITTEN)
                  if seen is text and not data.startswith(BOM.encode()) and b"\r" not in data), None)
    digest = sha256(known if known is not None else text.encode("utf-8", "surrogatepass")).hexdigest()
    _LAST_DIGEST[:] = [(text, digest)]
    return digest


def _parsed(text: str) -> tuple[str, dict[str, Any] | None]:
    digest = _digest(text)
    with _PARSED_LOCK:
        entry = _PARSED.get(digest)
        if entry is not None:
            _PARSED.move_to_end(digest)
    return digest, entry


def _remember(digest: str, **values: Any) -> None:
    with _PARSED_LOCK:
        _PARSED.setdefault(digest, {}).update(values)
        _PARSED.move_to_end(digest)
        while len(_PARSED) > _PARSED_MAX:
            _PARSED.popitem(last=False)


@dataclass
class _Parsed:
    """One fast parse of a stack file: the document, its node tree (where each job's lines are) and
    its shape (for the job index)."""

    doc: Any
    root: Any
    nodes: int
    anchored: bool


def _parse(path: Path, text: str, shared: bool = True) -> _Parsed:
    """The document (PyYAML's C loader) with its node tree. ``shared``: kept for later reads of the same
    text, so callers copy the document (``plain``) before changing anything; a job's lines read alone
    (the job index) are not kept, so they never push a whole file out."""
    import yaml

    global _FAST_LOADER
    digest, cached = _parsed(text) if shared else ("", None)
    if cached is not None and "parsed" in cached:
        return cached["parsed"]
    _FAST_LOADER = _FAST_LOADER or _fast_loader()
    nodes, anchored = _check_shape(path, text)
    loader = _FAST_LOADER(text)
    try:  # what yaml.load does, keeping the node tree for _jobs_node (splicing reads its marks)
        node = loader.get_single_node()
        doc = loader.construct_document(node) if node is not None else None
    except yaml.YAMLError as exc:
        raise _yaml_error(path, exc) from None
    finally:
        loader.dispose()
    parsed = _Parsed(_check_document(path, doc), node, nodes, anchored)
    if shared:
        _remember(digest, parsed=parsed)
    return parsed


def _fast_load(path: Path, text: str) -> Any:
    """The document as plain Python, shared with later reads of the same text (see ``_parse``)."""
    return _parse(path, text).doc


def plain(value: Any) -> Any:
    """ruamel's round-trip types -> plain dict/list/int/float/str/bool."""
    if isinstance(value, Mapping):
        return {str(k): plain(v) for k, v in value.items()}
    if isinstance(value, list):
        return [plain(v) for v in value]
    if isinstance(value, bool):
        return bool(value)
    if isinstance(value, int):
        return int(value)
    if isinstance(value, float):
        return float(value)
    if isinstance(value, str):
        return str(value)
    return value


def read_config(path: Path) -> dict[str, Any]:
    """The file's ``config:`` map as plain Python values."""
    return plain(_fast_load(path, _read_text(path)).get("config", {}))


def load(ref: StackRef, text: str | None = None) -> StackConfig:
    """Read and validate a stack's config (and that provider settings do not contradict it); a text
    validated before is not validated again (``StackConfig`` is frozen). A valid file is indexed
    (see ``load_job``)."""
    text = _read_text(ref.path) if text is None else text
    digest, cached = _parsed(text)
    if cached is not None and "cfg" in cached:
        if cached.get("indexed") != os.path.abspath(ref.path):  # the same text validated for another file
            _index(ref.path, text, _parse(ref.path, text))
        return cached["cfg"]
    parsed = _parse(ref.path, text)
    config = plain(parsed.doc.get("config", {}))
    cfg = validate(namespaced(config, str(ref.path)), str(ref.path))
    provider_conflicts(config, cfg, str(ref.path))
    _remember(digest, cfg=cfg)
    _index(ref.path, text, parsed)
    return cfg


def load_job(ref: StackRef, job_id: str, text: str | None = None) -> StackConfig:
    """The stack's config for a command about one job: the stack-wide settings and that job,
    validated as ``load`` does. When the file is one spotctl already validated whole (its index
    matches), only those lines are read and validated, so the time does not grow with the number of
    jobs; the config then holds only that job. Otherwise the whole file is loaded (and indexed).
    ``text``: the file's text, already read."""
    part = _stamped_part(ref.path, job_id) if text is None else None  # (a file spotctl wrote: never read whole)
    if part is not None:
        cfg = validate(namespaced(part.raw, str(ref.path)), str(ref.path))
        provider_conflicts(part.raw, cfg, str(ref.path))
        return cfg
    text = _read_text(ref.path) if text is None else text
    cached = _parsed(text)[1] if _PARSED else None  # (a new process has nothing parsed: no hash of the whole text)
    if cached is not None and "cfg" in cached:
        return load(ref, text)  # validated already; indexed for this file too if it was another's text
    part = _job_part(ref.path, text, job_id)
    if part is None:
        return load(ref, text)
    cfg = validate(namespaced(part.raw, str(ref.path)), str(ref.path))
    provider_conflicts(part.raw, cfg, str(ref.path))
    return cfg


def beside(path: Path, suffix: str) -> Path:
    """``.<name><suffix>`` beside the file a symbolic link points to: the stack file's lock, the
    watcher's lease, journal and holder, so every path to one file (the link, its target, another
    link) names the same ones; beside a link they were two locks, and two edits lost one another's."""
    real = Path(os.path.realpath(path))
    return real.with_name(f".{real.name}{suffix}")


def lock_path(path: Path) -> Path:
    """The stack file's lock (the apply lock is named after it), per real file (``beside``)."""
    return beside(path, ".lock")


_held = threading.local()  # lock files this thread holds, with a count (locked() nests)


@contextlib.contextmanager
def locked(path: Path, timeout: float = LOCK_TIMEOUT_S) -> Iterator[None]:
    """Hold the stack file's lock (another spotctl, or another thread, editing the same stack
    waits). Re-entrant in one thread, so a command can decide and act under one hold while the
    edits it makes take the lock again."""
    from filelock import FileLock, Timeout

    name = str(lock_path(path).resolve())
    counts = _held.__dict__.setdefault("counts", {})
    if counts.get(name):
        counts[name] += 1
        try:
            yield
        finally:
            counts[name] -= 1
        return
    lock = FileLock(name, timeout=timeout)
    try:
        lock.acquire()
    except Timeout:
        raise ConfigError(str(path), [f"locked by another spotctl for more than {timeout:.0f} s"]) from None
    counts[name] = 1
    try:
        _drop_dead_proposal(path)
        session = _SHARED.get(_shared_name(path))
        if session is not None:
            session.pull()  # the shared copy's news first, so every decision under the lock sees them
        yield
    finally:
        counts.pop(name, None)
        lock.release()


# ---- the shared copy (cli.lifecycle.sync): pulled when the lock is taken, pushed after each write ----

SYNC_TRIES = 3
_SHARED: dict[str, Any] = {}  # the stack file's real path -> its session (``pull()``, ``push()``)


class SharedCopyMoved(Exception):
    """Another machine wrote the shared copy between this one's pull and its push."""


class SharedCopyUnreachable(ConfigError):
    """The shared copy could not be read or written (the network, the credentials): not a lost race."""

    def __init__(self, source: str, problems: list[str], reason: str = ""):
        super().__init__(source, problems)
        self.reason = reason  # the cloud's own words


def _shared_name(path: Path) -> str:
    return os.path.realpath(path)


@contextlib.contextmanager
def sharing(path: Path, session: Any) -> Iterator[None]:
    """While inside, every lock of ``path`` pulls through ``session`` and every write pushes."""
    name = _shared_name(path)
    _SHARED[name] = session
    try:
        yield
    finally:
        _SHARED.pop(name, None)


def _commit(path: Path, old_text: str, new_text: str) -> None:
    """Write the stack file (under the lock), then push it; a lost race puts the old text back,
    pulls what won, and raises SharedCopyMoved so the edit is decided again (``_synced``). A push that
    fails otherwise puts the old text back too and fails the command: nothing may be applied on an edit
    the other machines (the watcher) cannot see, or they act on the same event again."""
    session = _SHARED.get(_shared_name(path))
    expect = _read_state(old_text)  # a hand edit saved since the read is kept, never overwritten
    if session is None:
        write_stack(path, new_text, expect)
        return
    was = session.mark_unpushed()  # before the write: a kill -9 before the push leaves the mark
    try:
        written = write_stack(path, new_text, expect)  # (None: the file system dropped the stamp)
    except ConfigError:
        session.mark_unpushed(was)  # nothing written: a hand edit is not this command's to push
        raise
    if held_back(path):
        return  # an edit awaiting its confirmation (or its undo) stays here: pushed once confirmed (``publish``)
    try:
        session.push()
    except (SharedCopyMoved, SharedCopyUnreachable) as exc:
        try:
            write_stack(path, old_text, written)  # (a save made during the push is kept, not undone)
        except ConfigError:
            session.mark_unpushed(was)
            why = "the shared copy changed" if isinstance(exc, SharedCopyMoved) else f"{exc.source} {exc.problems[0]}"
            raise ConfigError(str(path), [f"{why}, and the file changed here while the edit was pushed (saved from an "
                                          "editor?): it is left as saved, nothing was pushed or applied; check it and run "
                                          "the command again"]) from None
        session.mark_unpushed(was)
        if isinstance(exc, SharedCopyMoved):
            session.pull()
            raise
        raise ConfigError(str(path), [f"{exc.source} {exc.problems[0]}: the edit was undone here and nothing was applied; "
                                      "run the command again"]) from None


def pull_shared(path: Path) -> None:
    """Pull the shared copy now (when the file is shared): a reader outside the lock sees its news too."""
    if _SHARED.get(_shared_name(path)) is not None:
        with locked(path):
            pass


def _synced(path: Path, edit: Callable[[], Any]) -> Any:
    """Run one locked edit; when its push lost a race, decide and write it again on what won."""
    with locked(path):
        for _ in range(SYNC_TRIES):
            try:
                return edit()
            except SharedCopyMoved:
                continue
    raise ConfigError(str(path), [f"the shared copy kept changing while this edit was written ({SYNC_TRIES} tries): "
                                  "run the command again"])


# ---- a proposal: an edit awaiting its confirmation never leaves this machine --------------------------
# ``operations.change_job`` writes the edit, previews it and asks. Until the answer, the edit is a
# proposal: recorded in ``proposal_path`` (this process's pid, the job, the keys it set and what they
# were), written to the local file only (``_commit`` marks it unpushed, and no push of any spotctl on
# this machine sends the file while a live process holds a proposal), pushed once confirmed
# (``publish``), undone otherwise. A proposal whose process died (kill -9 at the question) is undone
# by the next spotctl that takes the stack file's lock, before it pulls: it was never confirmed.

MISSING = object()  # a key the job did not have
_local_only = threading.local()  # set while a dead proposal is undone (its writes are not pushed either)


def proposal_path(path: Path) -> Path:
    """Beside the real file, as its lock (``lock_path``): every path to one stack file (a link, its
    target) sees the same proposal, so none decides on or pushes an edit still awaiting its answer."""
    real = Path(os.path.realpath(path))
    return index_path(real).with_name(f"{real.name}.proposal.json")


def pid_alive(pid: int) -> bool:
    """A process with this pid runs on this machine (another user's included)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's process
        return True
    return True


def process_started(pid: int) -> int | None:
    """When process ``pid`` started (clock ticks since boot: field 22 of ``/proc/PID/stat``, proc(5)),
    or None where there is no /proc (or no such process). With the pid it names one process: a pid
    is reused once its process is gone, the pair is not."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_bytes()  # the command name may be any bytes
        return int(stat.rsplit(b")", 1)[1].split()[19])  # after the command name, which may hold spaces
    except (OSError, ValueError, IndexError):
        return None


def _proposer_alive(doc: dict[str, Any]) -> bool:
    """The process that wrote a proposal record still runs (its pid, and its start time when recorded)."""
    if not pid_alive(doc["pid"]):
        return False
    started = doc.get("started")
    return started is None or process_started(doc["pid"]) in (None, started)


def _proposal(path: Path) -> dict[str, Any] | None:
    """The proposal record when this user's spotctl wrote it (sealed: a forged record, say one a commit
    carried, would otherwise have its "before" values written into the job when it is undone)."""
    from cli.lifecycle import cachefile

    doc = cachefile.open_record(proposal_path(path))
    return doc if doc is not None and isinstance(doc.get("pid"), int) else None


def write_proposal(path: Path, doc: Mapping[str, Any]) -> None:
    """Write the proposal record of ``path``, sealed (``_proposal``), durably (it outlives a kill -9)."""
    from cli.lifecycle import cachefile

    proposal_path(path).parent.mkdir(parents=True, exist_ok=True)
    cachefile.save_record(proposal_path(path), dict(doc))


def held_back(path: Path) -> bool:
    """Whether the stack file holds an edit awaiting its confirmation (this or another live process's)."""
    return getattr(_local_only, "on", False) or proposed_job(path) is not None


def proposed_job(path: Path) -> str | None:
    """The job an edit of ``path`` awaiting its confirmation is about (a live process's proposal), ``""``
    while its record names no job yet, or None when no edit awaits one. The file then holds an attempt
    that may yet be undone: ``watch`` decides nothing on that job meanwhile (its events would look stale)."""
    doc = _proposal(path)
    if doc is None or not _proposer_alive(doc):
        return None
    job = doc.get("job")
    return job if isinstance(job, str) else ""


@contextlib.contextmanager
def proposing(path: Path) -> Iterator[None]:
    """While inside, this process's edits of ``path`` stay local (``held_back``) until ``publish``; on
    leaving, the record goes, and what is still unpushed (edits other spotctls made meanwhile) is pushed."""
    record = proposal_path(path)
    write_proposal(path, {"pid": os.getpid(), "started": process_started(os.getpid())})
    try:
        yield
    finally:
        with contextlib.suppress(FileNotFoundError):
            record.unlink()
        if _SHARED.get(_shared_name(path)) is not None:
            with contextlib.suppress(ConfigError):
                pull_shared(path)  # pushes what was held back meanwhile; an error here is the next command's


def note_proposal(path: Path, job_id: str, before: Mapping[str, Any], wrote: Mapping[str, Any]) -> None:
    """Record, before it is written, what the proposed edit sets (so a dead proposal can be undone)."""
    doc = {"pid": os.getpid(), "started": process_started(os.getpid()), "job": job_id, "wrote": plain(dict(wrote)),
           "before": {k: plain(v) for k, v in before.items() if v is not MISSING},
           "missing": [k for k, v in before.items() if v is MISSING]}
    write_proposal(path, doc)


def publish(path: Path) -> None:
    """Push the confirmed edit now (a proposal is never pushed by ``_commit``): merged first with what
    the shared copy got meanwhile (the same job changed there too is a conflict: an error, nothing applied)."""
    session = _SHARED.get(_shared_name(path))
    if session is None:
        return
    for _ in range(SYNC_TRIES):
        try:
            with locked(path):  # pulls (merges) first
                session.push(force=True)
                return
        except SharedCopyMoved:
            continue
        except SharedCopyUnreachable as exc:
            raise ConfigError(str(path), [f"{exc.source} {exc.problems[0]}: nothing was applied"]) from None
    raise ConfigError(str(path), [f"the shared copy kept changing while this edit was pushed ({SYNC_TRIES} tries): "
                                  "run the command again"])


def restore_fields(path: Path, job_id: str, before: Mapping[str, Any], wrote: Mapping[str, Any]) -> None:
    """Put back the keys an edit set, under the lock, each only while it still holds what the edit
    wrote (a concurrent complete, failover or hand edit wins); a job removed meanwhile stays removed."""

    def keys(current: StackConfig, written: Any) -> dict[str, Any]:
        return {k: v for k, v in before.items() if k in wrote and written.get(k, MISSING) == wrote[k]} if written else {}

    update_job(path, job_id, keys)  # (a key the job did not have is removed: ``MISSING``)


def _drop_dead_proposal(path: Path) -> None:
    """Undo the proposal of a spotctl that died at its question (under the lock, before the pull)."""
    doc = _proposal(path)
    if doc is None and os.path.lexists(proposal_path(path)):
        from cli.lifecycle import cachefile

        cachefile.say_once(proposal_path(path), "not a record this user's spotctl sealed (an earlier version's, or carried "
                                                "by a commit): ignored; remove it once you have checked the stack file")
    if doc is None or _proposer_alive(doc):
        return
    if isinstance(doc.get("job"), str) and isinstance(doc.get("wrote"), dict):
        before = {**doc.get("before", {}), **{k: MISSING for k in doc.get("missing", [])}}
        _local_only.on = True
        try:
            restore_fields(path, doc["job"], before, doc["wrote"])
        except (ConfigError, KeyError, StopIteration):
            pass  # the file changed by hand meanwhile: what it says now stands
        finally:
            _local_only.on = False
    with contextlib.suppress(FileNotFoundError):
        proposal_path(path).unlink()


def refuse_linked_folder(target: Path) -> None:
    """Refuse to write a record into a ``.spotctl`` folder that is a symbolic link (a commit can carry
    one pointing anywhere the user may write).

    Raises:
        ConfigError: naming the folder.
    """
    folder = Path(os.path.abspath(target)).parent
    if folder.name == ".spotctl" and os.path.islink(folder):
        raise ConfigError(str(folder), ["a symbolic link: spotctl writes its records only into a real folder "
                                        "(remove the link; spotctl makes the folder)"])


CHANGED_MEANWHILE = "the file changed while this command edited it (saved from an editor?): nothing was written; run the command again"


def write_stack(path: Path, text: str, expect: str | None = None) -> str | None:
    """Write the stack file atomically; a symlinked stack file is written where it points.

    ``expect``: the file's state when the text this replaces was read (``_read_state``). When the file
    no longer has it right before the rename (an editor saved it meanwhile), nothing is written.

    Returns:
        The new file's state (``_file_state``), or None when the file system dropped spotctl's stamp.

    Raises:
        ConfigError: the file changed since it was read (``expect``).
    """
    try:
        return atomic_write(path, text, follow=True, expect=expect)
    except _Changed:
        raise ConfigError(str(path), [CHANGED_MEANWHILE]) from None


def _read_state(text: str | None) -> str | None:
    """The file's state when ``text`` (this very object) was read or written here, or None."""
    if text is None:
        return None
    return next((state for seen, _, state in (*_LAST_READ, *_LAST_WRITTEN) if seen is text and state), None)


_LAST_WRITTEN: list[tuple[str, bytes, str | None]] = []  # the stack file's last text written, its bytes and state


def _line_ends(path: Path) -> tuple[bool, bool, bool]:
    """(whether the file starts with a byte-order mark, has a CRLF line end, has an LF one without a
    CR), read in fixed chunks: a 2 MB stack file is not copied into memory once more for three facts
    (issue 20)."""
    from cli.lifecycle.cachefile import open_regular

    chunk, bom, crlf, lf, previous = bytearray(1 << 16), False, False, False, b""
    opened = open_regular(path)  # (a link or a device is no old file)
    if opened is None:
        return bom, crlf, lf
    with open(opened[0], "rb", buffering=0) as fh:
        first = True
        while not (crlf and lf) and (size := fh.readinto(chunk)):
            view = bytes(chunk[:size]) if size < len(chunk) else chunk
            if first:
                bom, first = view.startswith(BOM.encode()), False
            pairs = view.count(b"\r\n") + (previous == b"\r" and view[:1] == b"\n")
            crlf = crlf or pairs > 0
            lf = lf or view.count(b"\n") > pairs
            previous = view[-1:]
    return bom, crlf, lf


def _keep_line_ends(old: bytes, text: str) -> str:
    """``text`` (LF line ends) with each line's end as in the old file of mixed CRLF and LF ends: a line
    kept or changed in place keeps its own end, a new line takes the end of the line before it, so an
    edit does not rewrite the ends of lines it did not touch."""
    before = old.decode("utf-8", "replace").removeprefix(BOM).split("\n")
    crs, bare = [line.endswith("\r") for line in before], [line.removesuffix("\r") for line in before]
    lines = text.split("\n")
    ends, last = [], crs[0] if len(crs) > 1 else False
    for i in _kept_lines(bare[:-1], lines[:-1]):  # (the pieces after the last line end have none)
        last = crs[i] if i is not None else last
        ends.append(last)
    return "".join(line + ("\r\n" if cr else "\n") for line, cr in zip(lines, ends, strict=False)) + lines[-1]


def _kept_lines(old: list[str], new: list[str]) -> list[int | None]:
    """For each line of ``new``, the line of ``old`` it is (None: a new one), as a patience diff pairs
    them: the common lines at both ends of a stretch, then the lines found once in each side of it as
    anchors in order (their longest increasing run), the stretches between anchors alike; a stretch
    with no anchor pairs its lines by position (a line changed in place). Stack files repeat lines
    thousands of times (``state: running``): a general diff over them grows with the cube of the
    stretch, this with its size (an audit timed minutes for an edit of every tenth job of 2,000)."""
    from collections import Counter

    out: list[int | None] = [None] * len(new)
    todo = [(0, len(old), 0, len(new))]
    while todo:
        a0, a1, b0, b1 = todo.pop()
        while a0 < a1 and b0 < b1 and old[a0] == new[b0]:
            out[b0], a0, b0 = a0, a0 + 1, b0 + 1
        while a0 < a1 and b0 < b1 and old[a1 - 1] == new[b1 - 1]:
            a1, b1 = a1 - 1, b1 - 1
            out[b1] = a1
        if a0 == a1 or b0 == b1:
            continue
        seen_a, seen_b = Counter(old[a0:a1]), Counter(new[b0:b1])
        at = {line: i for i, line in enumerate(old[a0:a1], a0) if seen_a[line] == 1}
        anchors = [(at[line], j) for j, line in enumerate(new[b0:b1], b0) if seen_b[line] == 1 and line in at]
        run = _increasing(anchors)
        if not run:
            for k in range(min(a1 - a0, b1 - b0)):
                out[b0 + k] = a0 + k
            continue
        for i, j in run:
            out[j] = i
            todo.append((a0, i, b0, j))
            a0, b0 = i + 1, j + 1
        todo.append((a0, a1, b0, b1))
    return out


def _increasing(pairs: list[tuple[int, int]]) -> list[tuple[int, int]]:
    """The longest run of ``pairs`` (in order) whose first items increase (patience sorting)."""
    import bisect

    tops: list[int] = []  # the smallest last first item of a run of each length
    ends: list[int] = []  # its index in pairs
    back = [-1] * len(pairs)
    for k, (i, _) in enumerate(pairs):
        n = bisect.bisect_left(tops, i)
        back[k] = ends[n - 1] if n else -1
        if n == len(tops):
            tops.append(i)
            ends.append(k)
        else:
            tops[n], ends[n] = i, k
    run, k = [], ends[-1] if ends else -1
    while k >= 0:
        run.append(pairs[k])
        k = back[k]
    return run[::-1]


def atomic_write(path: Path, text: str, follow: bool = False, expect: str | None = None) -> str | None:
    """Write ``text`` to ``path`` so readers only ever see the old or the new content.

    ``follow``: a symlinked file is written where it points (the link stays a link): for the stack
    file only (``write_stack``). spotctl's own records are never written through a link: a link is
    replaced by the file, and a ``.spotctl`` folder that is a link is refused (a commit can carry a
    link there to any file of the user's: an audit made one overwrite the cache key). The old file's
    line ends (CRLF; in a file of both, each line's) and byte-order mark are kept, since ``_read_text``
    hands out LF text without one.

    ``expect``: the state (``_file_state``) the file must still have right before the rename.

    Returns:
        With ``follow``, the new file's state while it has spotctl's stamp (else None).

    Raises:
        ConfigError: the record's folder is a symbolic link.
        _Changed: the file no longer has the state ``expect`` (nothing written).
    """
    if follow:
        target = Path(os.path.realpath(path))
    else:
        target = Path(os.path.abspath(path))
        refuse_linked_folder(target)
    bom, crlf, lf = _line_ends(target)
    if crlf and lf:
        text = _keep_line_ends(target.read_bytes(), text.replace("\r\n", "\n"))
    elif crlf:
        text = text.replace("\r\n", "\n").replace("\n", "\r\n")
    if bom:
        text = BOM + text
    data = text.encode("utf-8")  # (one C encode, not a text layer's chunks)
    import tempfile

    mode = target.stat().st_mode & 0o777 if target.exists() and not target.is_symlink() else 0o644
    fd, tmp = tempfile.mkstemp(prefix=f".{target.name}.", suffix=".tmp", dir=target.parent)
    stamp = time.time_ns()  # the stack file's mtime to the nanosecond: see the job index's comment
    try:
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)
            fh.flush()
            if follow:
                os.utime(fh.fileno(), ns=(stamp, stamp))
            os.fsync(fh.fileno())
        os.chmod(tmp, mode)
        if expect is not None:
            _still(target, expect)
        os.replace(tmp, target)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise
    _sync_folder(target)
    if not follow:
        return None
    state = _stamped_state(target, stamp, len(data)) or None
    _LAST_WRITTEN[:] = [(text, data, state)]
    return state


def _still(target: Path, state: str) -> None:
    """The last check before a rename over ``target``: a save made meanwhile (in place, over it, or a
    removal) is kept, since the file no longer has ``state``.

    Raises:
        _Changed: it has not (nothing may be written).
    """
    try:
        if _file_state(os.stat(target)) == state:
            return
    except FileNotFoundError:
        pass
    raise _Changed


def _sync_folder(target: Path) -> None:
    """Make a rename into ``target``'s folder durable."""
    dir_fd = os.open(target.parent, os.O_RDONLY)
    try:
        os.fsync(dir_fd)
    finally:
        os.close(dir_fd)


def _stamped_state(target: Path, stamp: int, size: int) -> str:
    """The file's state while it still has spotctl's ``stamp`` and ``size``, else "" (another wrote
    since, or the file system dropped the stamp's nanoseconds)."""
    st = os.stat(target)
    return _file_state(st) if (st.st_mtime_ns, st.st_size) == (stamp, size) else ""


def edit(path: Path, change: Callable[[Any, StackConfig], None]) -> StackConfig:
    """``_edit`` (below), pushed to the shared copy when the stack file is shared."""
    return _synced(path, lambda: _edit(path, change))


def _edit(path: Path, change: Callable[[Any, StackConfig], None]) -> StackConfig:
    """Apply ``change`` to the stack file's round-trip document, validate, and write it back.

    ``change(config_map, current)`` mutates the ruamel ``config:`` map in place (so comments and
    unrelated keys stay exactly as they were) given the validated current config. The result is
    validated before writing; an invalid result raises ConfigError and the file is not touched.

    Returns:
        The validated new config.
    """
    with locked(path):
        text = _read_text(path)
        doc = _load_document(path, text)
        config = doc.setdefault("config", {})
        current = validate(namespaced(plain(config), str(path)), str(path))
        before = plain(config)
        change(config, current)
        if plain(config) == before:
            return current  # nothing to write: the file stays byte-for-byte as it was
        new = validate(namespaced(plain(config), str(path)), str(path))
        buf = io.StringIO()
        _yaml().dump(doc, buf)
        _commit(path, text, buf.getvalue())
        return new


def key(name: str) -> str:
    """``jobs`` -> ``spotctl:jobs``."""
    return f"{NAMESPACE}:{name}"


def job_entry(config: Any, job_id: str) -> Any:
    """The ruamel mapping of one job inside ``spotctl:jobs`` (edited in place keeps comments)."""
    for entry in config.get(key("jobs")) or []:
        if isinstance(entry, Mapping) and entry.get("id") == job_id:
            return entry
    raise KeyError(job_id)


def set_job_fields(config: Any, job_id: str, fields: Mapping[str, Any]) -> None:
    """Set keys of one job; existing keys keep their place (and comments), new ones go at the end;
    a key set to ``MISSING`` is removed."""
    _set_fields(job_entry(config, job_id), fields)


def _set_fields(entry: Any, fields: Mapping[str, Any]) -> None:
    for name, value in fields.items():
        if value is MISSING:
            entry.pop(name, None)
        else:
            entry[name] = value


def remove_job(config: Any, job_id: str) -> None:
    jobs = config.get(key("jobs"))
    for i, entry in enumerate(jobs):
        if isinstance(entry, Mapping) and entry.get("id") == job_id:
            del jobs[i]
            return
    raise KeyError(job_id)


def _jobs_node(text: str) -> Any:
    import yaml

    global _FAST_LOADER
    _FAST_LOADER = _FAST_LOADER or _fast_loader()
    # The tree a read of this text composed (construction may have merged `<<` keys into it: a
    # splice that goes wrong through them is caught by the re-read that checks every splice).
    cached = _parsed(text)[1]
    root = cached["parsed"].root if cached is not None and "parsed" in cached else yaml.compose(text, Loader=_FAST_LOADER)
    return _jobs_in(root)


def _jobs_in(root: Any) -> Any:
    """The block sequence node of ``spotctl:jobs``, or None (absent, or written in flow style)."""
    import yaml

    if not isinstance(root, yaml.MappingNode):
        return None
    config = next((v for k, v in root.value if k.value == "config"), None)
    jobs = next((v for k, v in getattr(config, "value", []) if k.value == key("jobs")), None) if config else None
    return jobs if isinstance(jobs, yaml.SequenceNode) and not jobs.flow_style else None


def _last_line(node: Any) -> int:
    """The last text line (0-based) a block node's content is on."""
    while isinstance(node.value, list) and node.value and not node.flow_style:
        last = node.value[-1]
        node = last[1] if isinstance(last, tuple) else last
    end = node.end_mark
    return end.line - 1 if end.column == 0 and end.line > node.start_mark.line else end.line


def _entry_lines(text: str, index: int) -> tuple[int, int]:
    """Lines [start, end) of the ``index``-th job: its own comment lines just above it (at the
    indentation of its ``-``), the entry itself and its trailing comments on the same line."""
    jobs = _jobs_node(text)
    entry = jobs.value[index]
    lines = text.split("\n")
    start, end = entry.start_mark.line, _last_line(entry) + 1
    dash = len(lines[start]) - len(lines[start].lstrip(" "))
    while start > 0 and lines[start - 1].strip().startswith("#") and len(lines[start - 1]) - len(lines[start - 1].lstrip(" ")) == dash:
        start -= 1
    return start, end


def take_job(path: Path, job_id: str) -> tuple[str, int, dict[str, Any]]:
    """``_take_job`` (below), pushed to the shared copy when the stack file is shared."""
    return _synced(path, lambda: _take_job(path, job_id))


def _take_job(path: Path, job_id: str) -> tuple[str, int, dict[str, Any]]:
    """Remove one job from the stack file (under the lock, validated, atomically) by cutting exactly
    its lines, so the comments of the jobs around it stay. Returns (its text, its index, its keys)
    for ``put_back_job``. Raises KeyError when the file has no such job."""
    with locked(path):
        text = _read_text(path)
        raw = plain(_fast_load(path, text).get("config", {}))
        jobs = raw.get(key("jobs")) or []
        index = next((i for i, e in enumerate(jobs) if isinstance(e, dict) and e.get("id") == job_id), None)
        if index is None:
            raise KeyError(job_id)
        validate(namespaced(raw, str(path)), str(path))
        expected = copy.deepcopy(raw)
        entry = expected[key("jobs")].pop(index)
        block, new_text = "", None
        if _jobs_node(text) is not None:
            lines = text.split("\n")
            start, end = _entry_lines(text, index)
            block = "\n".join(lines[start:end]) + "\n"
            new_text = "\n".join(lines[:start] + lines[end:])
        if new_text is None or plain(_fast_load(path, new_text).get("config", {})) != expected:
            doc = _load_document(path, text)
            remove_job(doc["config"], job_id)
            buf = io.StringIO()
            _yaml().dump(doc, buf)
            new_text, block = buf.getvalue(), ""
        validate(namespaced(plain(_fast_load(path, new_text).get("config", {})), str(path)), str(path))
        _commit(path, text, new_text)
        return block, index, entry


def retire(path: Path, job_id: str, attempt: int) -> None:
    """Record that the job ``job_id`` is gone after ``attempt`` (``spotctl:retiredJobs``, under the lock):
    a new job of that id then starts after it (infra/config.py), so the old one's events, which are
    kept, are never read as the new one's."""

    def change(config: Any, current: StackConfig) -> None:
        retired = config.get(key("retiredJobs"))
        if retired is None:
            config[key("retiredJobs")] = retired = {}
        retired[job_id] = max(attempt, int(retired.get(job_id) or 0))

    edit(path, change)


def put_back_job(path: Path, taken: tuple[str, int, dict[str, Any]]) -> bool:
    """``_put_back_job`` (below), pushed to the shared copy when the stack file is shared."""
    return _synced(path, lambda: _put_back_job(path, taken))


def _put_back_job(path: Path, taken: tuple[str, int, dict[str, Any]]) -> bool:
    """Undo ``take_job``: re-insert the job where it was, only if the file has no job of that id
    (a concurrent edit wins); everything else in the file stays as it is now. Returns whether it did."""
    block, index, entry = taken
    with locked(path):
        text = _read_text(path)
        raw = plain(_fast_load(path, text).get("config", {}))
        jobs = raw.get(key("jobs")) or []
        if any(isinstance(e, dict) and e.get("id") == entry.get("id") for e in jobs):
            return False
        expected = copy.deepcopy(raw)
        expected.setdefault(key("jobs"), []).insert(min(index, len(jobs)), entry)
        new_text = None
        if block and jobs and _jobs_node(text) is not None:
            lines = text.split("\n")
            at = _entry_lines(text, index)[0] if index < len(jobs) else _entry_lines(text, len(jobs) - 1)[1]
            new_text = "\n".join(lines[:at]) + ("\n" if at else "") + block + "\n".join(lines[at:])
        if new_text is None or plain(_fast_load(path, new_text).get("config", {})) != expected:
            doc = _load_document(path, text)
            config = doc.setdefault("config", {})
            if config.get(key("jobs")) is None:
                config[key("jobs")] = []
            config[key("jobs")].insert(min(index, len(jobs)), entry)
            buf = io.StringIO()
            _yaml().dump(doc, buf)
            new_text = buf.getvalue()
        validate(namespaced(plain(_fast_load(path, new_text).get("config", {})), str(path)), str(path))
        _commit(path, text, new_text)
        return True


def _scalar_text(value: Any) -> str:
    import yaml

    return yaml.safe_dump(value, default_flow_style=True, width=10**9).split("\n...")[0].strip()


def _splice_job_fields(text: str, job_id: str, fields: Mapping[str, Any]) -> str | None:
    """``text`` with one job's scalar fields set, by replacing exactly the value spans (or adding a
    line after the job's last key); None when the layout is not the plain block style this handles."""
    import yaml

    jobs = _jobs_node(text)
    if jobs is None:
        return None
    entry = next((n for n in jobs.value if isinstance(n, yaml.MappingNode)
                  and any(k.value == "id" and v.value == job_id for k, v in n.value)), None)
    if entry is None or entry.flow_style:
        return None
    edits: list[tuple[int, int, str]] = []
    missing = []
    for name, value in fields.items():
        key, node = next(((k, v) for k, v in entry.value if k.value == name), (None, None))
        if value is MISSING:  # the key's line goes (a key spotctl added: one line, nothing after its value)
            if node is None:
                continue
            start = text.rfind("\n", 0, key.start_mark.index) + 1
            end = text.find("\n", node.end_mark.index)
            end = len(text) if end < 0 else end + 1
            one_line = text[start:end].count("\n") <= 1 and text[start:key.start_mark.index].strip() == ""
            if not one_line or text[node.end_mark.index:end].strip() or len(entry.value) < 2:
                return None
            edits.append((start, end, ""))
        elif node is None:
            missing.append((name, value))
        elif isinstance(node, yaml.ScalarNode) and node.start_mark.index == node.end_mark.index:
            # An empty value (`key:`, null as ruamel writes it, e.g. a cleared ``applying`` mark): its
            # marks are not where it would go; it goes right after the colon (a comment after it kept).
            colon = key.end_mark.index
            line_end = text.find("\n", colon)
            after = text[colon + 1:len(text) if line_end < 0 else line_end]
            rest = colon + 1 + len(after) - len(after.lstrip(" "))
            if text[colon:colon + 1] != ":" or text[rest:rest + 1] not in ("\n", "\r", "#", ""):
                return None
            edits.append((colon + 1, rest, f" {_scalar_text(value)}" + (" " if text[rest:rest + 1] == "#" else "")))
        elif (isinstance(node, yaml.ScalarNode) and not node.style) or (  # plain (None, or "" from the C loader),
                isinstance(node, yaml.MappingNode | yaml.SequenceNode) and node.flow_style  # or a one-line {..}/[..]
                and "\n" not in text[node.start_mark.index:node.end_mark.index]):  # as this writes them
            edits.append((node.start_mark.index, node.end_mark.index, _scalar_text(value)))
        else:
            return None
    if missing:
        last_key = entry.value[-1][0]
        indent = " " * last_key.start_mark.column
        end_of_entry = text.find("\n", entry.value[-1][1].end_mark.index)
        at = len(text) if end_of_entry < 0 else end_of_entry + 1
        block = "".join(f"{indent}{name}: {_scalar_text(value)}\n" for name, value in missing)
        if end_of_entry < 0 and not text.endswith("\n"):
            block = "\n" + block
        edits.append((at, at, block))
    for start, end, new in sorted(edits, reverse=True):
        text = text[:start] + new + text[end:]
    return text


def update_job(path: Path, job_id: str, decide: Callable[[StackConfig, Mapping[str, Any]], Mapping[str, Any]]
               ) -> tuple[StackConfig, StackConfig]:
    """``_update_job`` (below), pushed to the shared copy when the stack file is shared (a lost race
    calls ``decide`` again, on the file with what won merged in)."""
    return _synced(path, lambda: _update_job(path, job_id, decide))


def _update_job(path: Path, job_id: str, decide: Callable[[StackConfig, Mapping[str, Any]], Mapping[str, Any]]
                ) -> tuple[StackConfig, StackConfig]:
    """Set fields of one job: ``decide(current, raw_entry)`` (called under the lock, on the validated
    file; ``raw_entry`` is the job's keys as written) returns them. Fast path: splice the values into the text, then re-read and check the result
    is exactly the intended config; anything unusual takes the ruamel round-trip instead. Either
    way comments and layout stay, the result is validated, and it is written atomically.

    Returns:
        (config before, config after); the same object twice when nothing changed.
    """
    with locked(path):
        part = _stamped_part(path, job_id)  # (a file spotctl wrote: never read whole)
        text = _read_text(path) if part is None else ""
        part = part or _job_part(path, text, job_id)
        if part is not None:
            raw = part.raw
            current = validate(namespaced(raw, str(path)), str(path))
        else:
            raw = plain(_fast_load(path, text).get("config", {}))  # plain: a copy of the shared parse
            cached = _parsed(text)[1] or {}
            current = cached.get("cfg") or validate(namespaced(raw, str(path)), str(path))
        written = next((e for e in raw.get(key("jobs")) or [] if isinstance(e, dict) and e.get("id") == job_id), {})
        fields = dict(decide(current, written))
        if not fields:
            return current, current
        if not written:  # removed since this command last read it (a hand edit, `cleanup --no-apply`)
            raise ConfigError(str(path), [f"job {job_id}: no longer in the stack file (removed while this command ran)"])
        if part is not None:
            spliced = _splice_part(path, part, job_id, fields)
            if spliced is not None:
                block, new, index = spliced
                if part.text is None:
                    guard = _rewrite(path, part, block)
                    if guard is None:  # a hand edit under the lock: never overwritten, and decided on what it replaced
                        raise ConfigError(str(path), [f"job {job_id}: {CHANGED_MEANWHILE}"])
                    index.guard, index.plain = guard, block.isascii()
                else:
                    start, end = part.index.span(part.at)
                    new_text = part.text[:start] + block + part.text[end:]  # one copy of the file, no split into lines
                    _commit(path, text, new_text)
                    index.guard, index.plain = _guard(new_text), _plain_written(new_text)  # (after the write)
                if index.guard:
                    _write_index(path, index)
                return current, new  # (only this job: never kept as the whole file's config)
            # something unusual: the whole file, with the fields already decided
            text = text or _read_text(path)  # (read in pieces: now whole)
            raw = plain(_fast_load(path, text).get("config", {}))
            current = validate(namespaced(raw, str(path)), str(path))
        expected = raw  # already a copy of its own (plain), and decide is done with `written`
        entry = next(e for e in expected[key("jobs")] if isinstance(e, dict) and e.get("id") == job_id)
        _set_fields(entry, fields)
        new_text = _splice_job_fields(text, job_id, fields)
        new_raw = plain(_fast_load(path, new_text).get("config", {})) if new_text is not None else None
        if new_raw != expected:
            doc = _load_document(path, text)
            set_job_fields(doc["config"], job_id, fields)
            buf = io.StringIO()
            _yaml().dump(doc, buf)
            new_text = buf.getvalue()
            new_raw = plain(_fast_load(path, new_text).get("config", {}))
        new = validate(namespaced(new_raw, str(path)), str(path))
        _commit(path, text, new_text)
        try:
            provider_conflicts(new_raw, new, str(path))
        except ConfigError:
            pass  # the next load reports it
        else:  # the next cycle's load of what was just written is not parsed or validated again
            _remember(_parsed(new_text)[0], cfg=new)
            _index(path, new_text, _parse(path, new_text))
        return current, new


def job_fields(path: Path, job_id: str, names: list[str]) -> dict[str, Any]:
    """The current values of some keys of one job, as written in the file."""
    raw = read_config(path)
    entry = next(e for e in raw.get(key("jobs")) or [] if isinstance(e, dict) and e.get("id") == job_id)
    return {n: entry[n] for n in names if n in entry}


# ---- the job index: one job read and edited in a time independent of the stack's size ----------------
# A stack file spotctl validated whole is recorded by the sha256 of its whole text and the
# validation code's fingerprint, with the place of every job. While the file still has that hash, a
# command about one job reads and validates only the stack-wide settings and that job's lines: every
# cross-job rule of infra/config.py compares only job ids (unique, not a pool's name), and an edit of
# one job never changes its id. A file with anchors or aliases, or not in plain block layout, is never
# indexed; anything unexpected falls back to the whole file. The index is a cache: a stale, damaged
# or foreign one only means the whole file is read.
#
# Why these choices (issue 20: the cost of one job's edit must not grow with the stack; and an
# adversary): a file spotctl read is guarded by its content, not size + mtime + inode (an in-place
# edit within the file system's timestamp granularity keeps those: the kernel stamps writes with a
# clock that moves once per tick), and by a cryptographic hash, not a CRC: a CRC is linear, so a file
# of the same length and CRC is built in milliseconds, and an audit did so with a copy of a job
# inside another job's `command: |` text at the old offsets: the edit changed that text and reported
# success. A file spotctl itself wrote is guarded by its state instead (device, inode, size, mtime and
# ctime, read after the write): spotctl stamps the new file's mtime with the clock to the nanosecond,
# which no later write leaves in place (a write sets the tick's time, a rename-over another inode,
# and either sets the ctime, which only the kernel sets), so the state names that version of the
# file without hashing it twice per edit (~1 ms each for a 2 MB file); what a commit or a hand edit
# brings never has it, so it is read and hashed whole. A file system that drops the nanoseconds (the
# stamp read back differs) gets the hash. Who can run code as this user could forge the state, but
# could as well replace this user's key below. The index file itself is sealed with this user's key
# (``cli.lifecycle.cachefile``): the folder is in the checkout, and a forged index could name any
# lines as a job's. Jobs are stored as the lengths of the text's segments (the gap before each job,
# the job), not absolute offsets, so an edit changes one number instead of shifting every later
# job's; the ids and lengths are stored raw (a space-separated line and a machine-word array) rather
# than as JSON, so reading and rewriting the index is a few memory copies at any size.

INDEX_VERSION = 5  # 5: guard by sha256 or spotctl's stamped write; 4: sealed, guard by sha256; 3: CRC-32 (forgeable), segment lengths in binary; 2: JSON offsets; 1: lines
_RULES: list[str] = []
_WORD = "I"  # array typecode of a segment length (4 bytes: a stack file is far below 4 GiB)


def index_path(path: Path) -> Path:
    """Where a stack file's job index lives (beside ``spotctl policy fit``'s learned file)."""
    return path.parent / ".spotctl" / f"{path.name}.index"


def sync_record_path(path: Path) -> Path:
    """Where ``spotctl sync`` records the shared copy this file was last synced with (``cli.lifecycle.sync``)."""
    return index_path(path).with_name(f"{path.name}.sync.json")


def _rules() -> str:
    """A fingerprint of the code that validates stack files: an index written under other rules
    (another spotctl version) proves nothing."""
    if not _RULES:
        import importlib.util

        infra_dir = Path(importlib.util.find_spec("infra").origin).parent  # (not imported: no pydantic for a reader)
        _RULES.append(code_fingerprint(INDEX_VERSION, infra_dir / "config.py", infra_dir / "basics.py",
                                       infra_dir / "contract" / "gcp.py", Path(__file__)))
    return _RULES[0]


def code_fingerprint(version: int, *sources: Path) -> str:
    """Which code this is, for a cache that code produced: each source file's size and CRC-32 (a
    version check, not a guard against forgery: ~30x cheaper than hashing it, issue 20)."""
    import zlib

    parts = [str(version)]
    for source in sources:
        data = source.read_bytes()
        parts.append(f"{len(data)}:{zlib.crc32(data):08x}")
    return "/".join(parts)


def _guard(text: str) -> str:
    """The guard an index of ``text`` records: the file's state when spotctl just wrote this very text
    (stamped: the section's comment), else the text's sha256."""
    last = _LAST_WRITTEN[0] if _LAST_WRITTEN else None
    if last is not None and last[0] is text and last[2] is not None:
        return last[2]
    return _digest(text)


def _plain_written(text: str) -> bool:
    """Whether the stack file spotctl just wrote as ``text`` is plain (its bytes are its text)."""
    last = _LAST_WRITTEN[0] if _LAST_WRITTEN else None
    return last is not None and last[0] is text and len(last[1]) == len(text)


def _guards(guard: str, text: str) -> bool:
    """Whether an index's ``guard`` holds for ``text`` (the file's, as just read or written)."""
    if guard.startswith("state:"):
        return any(seen is text and state == guard for seen, _, state in (*_LAST_READ, *_LAST_WRITTEN))
    return guard == _digest(text)


def _job_spans(lines: list[str], parsed: _Parsed) -> list[list[Any]] | None:
    """``[[id, first line, end line], ...]`` of every job in file order (its own comment lines above
    it included, as ``_entry_lines``), or None for a file the index does not handle."""
    import yaml

    jobs = _jobs_in(parsed.root)
    if parsed.anchored or jobs is None or not jobs.value:
        return None
    spans: list[list[Any]] = []
    previous_end = 0
    for entry in jobs.value:
        if not isinstance(entry, yaml.MappingNode) or entry.flow_style:
            return None
        ident = next((v.value for k, v in entry.value if k.value == "id" and isinstance(v, yaml.ScalarNode)), None)
        if not isinstance(ident, str) or not ident or ident.split() != [ident]:  # (ids are stored space-separated)
            return None
        start, end = entry.start_mark.line, _last_line(entry) + 1
        dash = len(lines[start]) - len(lines[start].lstrip(" "))
        while start > previous_end and lines[start - 1].strip().startswith("#") and \
                len(lines[start - 1]) - len(lines[start - 1].lstrip(" ")) == dash:
            start -= 1
        spans.append([ident, start, end])
        previous_end = end
    return spans


@dataclass
class _Index:
    """A stack file's job index: what it guards and where each job's lines are (character offsets into
    the LF text without a byte-order mark, whole lines)."""

    guard: str  # _guard of the text it indexes
    nodes: int  # the YAML nodes of the whole text (MAX_NODES holds for an edit of one job)
    ids: str  # the job ids in file order, space-separated
    segments: Any  # array: per job, the characters before it (since the previous job's end), then its own
    plain: bool = False  # the file's bytes are its text (ASCII, LF, no byte-order mark): offsets are the file's

    def find(self, job_id: str) -> int | None:
        """The job's place in file order, or None."""
        at = f" {self.ids} ".find(f" {job_id} ")
        return None if at < 0 else self.ids.count(" ", 0, at)

    def span(self, at: int) -> tuple[int, int]:
        """[start, end) of the ``at``-th job."""
        start = sum(self.segments[:2 * at + 1])
        return start, start + self.segments[2 * at + 1]

    def spans(self) -> list[tuple[str, int, int]]:
        """(id, start, end) of every job in file order."""
        import itertools

        ends = list(itertools.accumulate(self.segments))
        return [(ident, ends[2 * k], ends[2 * k + 1]) for k, ident in enumerate(self.ids.split(" "))]

    def to_bytes(self) -> bytes:
        head = json.dumps({"version": INDEX_VERSION, "rules": _rules(), "guard": self.guard, "nodes": self.nodes,
                           "jobs": len(self.segments) // 2, "plain": self.plain})
        return b"\n".join((head.encode(), self.ids.encode(), self.segments.tobytes()))

    @classmethod
    def from_bytes(cls, data: bytes) -> _Index | None:
        """The index in ``data`` when written by this code under these rules and whole, else None."""
        import array

        try:
            head, ids, raw = data.split(b"\n", 2)
            if len(head) > 4096:
                return None
            meta = json.loads(head)
            segments = array.array(_WORD)
            segments.frombytes(raw)
            index = cls(meta["guard"], meta["nodes"], ids.decode(), segments, meta["plain"] is True)
            ok = (meta["version"] == INDEX_VERSION and meta["rules"] == _rules() and isinstance(index.nodes, int)
                  and isinstance(index.guard, str) and meta["jobs"] > 0 and len(segments) == 2 * meta["jobs"]
                  and index.ids.count(" ") == meta["jobs"] - 1)
        except (ValueError, KeyError, TypeError, RecursionError):  # (json, utf-8 and a torn array are ValueErrors)
            return None
        return index if ok else None


def _index(path: Path, text: str, parsed: _Parsed) -> None:
    """Index ``text``, just validated whole (by ``load`` or a whole-file edit): each job's place as
    lengths of the text's segments (see the section's comment)."""
    import array
    import itertools

    existing = _read_index(path, text)
    kept = existing is not None and existing.guard.startswith("state:")  # (spotctl's write: a hash would be a downgrade)
    lines = [] if kept or "\r" in text else text.split("\n")  # (a lone CR is a YAML line break: never indexed)
    try:
        spans = _job_spans(lines, parsed) if lines else None
        if spans is not None:
            starts = list(itertools.accumulate((len(line) + 1 for line in lines), initial=0))  # of each line
            segments, previous = array.array(_WORD), 0
            for _, a, b in spans:
                start, end = starts[a], min(starts[b], len(text))
                segments.extend((start - previous, end - start))
                previous = end
    except (IndexError, OverflowError):  # YAML's line breaks are not only LF (a lone CR, NEL): not indexed
        spans = None
    if spans is not None:
        _write_index(path, _Index(_guard(text), parsed.nodes, " ".join(ident for ident, _, _ in spans), segments,
                                  _plain_written(text)))
        with contextlib.suppress(OSError):  # an earlier version's index (JSON) says nothing any more
            index_path(path).with_name(f"{path.name}.index.json").unlink()
    # a later load of this text in this process need not index it again (absolute: a relative path
    # names another file once the working directory changes)
    _remember(_digest(text), indexed=os.path.abspath(path))


def _write_index(path: Path, index: _Index) -> None:
    write_cache(index_path(path), index.to_bytes())


def write_cache(target: Path, value: Any) -> None:
    """Write a cache file (the job index, status's per-job cache) whole or not at all, never failing,
    sealed (``cli.lifecycle.cachefile``). ``value``: the bytes to write, or a value written as JSON."""
    from cli.lifecycle import cachefile

    cachefile.write(target, value if isinstance(value, bytes) else json.dumps(value, separators=(",", ":")).encode())


CACHE_LIMIT = 1 << 26  # bytes of a cache file read at most (a 5,000-job index is ~60 KB)


def _read_index(path: Path, text: str) -> _Index | None:
    """The index of exactly this text under these rules, sealed by this user's spotctl, or None."""
    index = _stored_index(path)
    return index if index is not None and _guards(index.guard, text) else None


def _stored_index(path: Path) -> _Index | None:
    """The index file beside ``path`` when sealed by this user's spotctl and written by this code, or None."""
    from cli.lifecycle import cachefile

    data = cachefile.read(index_path(path), CACHE_LIMIT)
    return _Index.from_bytes(data) if data is not None else None


def read_text(path: Path) -> str:
    """The stack file's text as every reader here sees it (UTF-8, LF, no byte-order mark).

    Raises:
        ConfigError: missing, unreadable or not UTF-8.
    """
    return _read_text(path)


def job_digests(ref: StackRef, text: str) -> list[tuple[str, str]] | None:
    """``(id, sha256 of its lines)`` of every job in file order when ``text`` (the file's) is exactly
    one spotctl validated whole under these rules (its index matches), else None. What a reader
    derived from one job's validated config stays true while that job's lines do, so it can be kept
    per job and used without parsing or validating anything (``status``)."""
    index = _read_index(ref.path, text)
    if index is None:
        return None
    return [(ident, sha256(text[start:end].encode("utf-8", "surrogatepass")).hexdigest()) for ident, start, end in index.spans()]


@dataclass
class _Part:
    """One job's lines of an indexed file, and the config they make with the stack-wide settings."""

    index: _Index
    text: str | None  # the whole file (None: read in pieces, ``_stamped_part``)
    at: int  # the job's place in the index
    prefix: str  # the lines before the first job
    block: str  # the job's lines
    suffix: str  # the lines after the last job
    raw: dict[str, Any]  # the config of prefix + block + suffix (this job only)
    nodes: int  # their nodes


_LAST_PART: list[tuple[str, str, _Part]] = []  # a command reads its job, then edits it under the lock: one read of the index


def _job_part(path: Path, text: str, job_id: str) -> _Part | None:
    where = (os.path.abspath(path), job_id)
    with _PARSED_LOCK:  # (a watcher's threads)
        last = _LAST_PART.pop() if _LAST_PART else None
    if last is not None and last[:2] == where and last[2].text == text:
        return last[2]  # the same text (compared whole) of the same file: the same part
    part = _read_part(path, text, job_id)
    if part is not None:
        with _PARSED_LOCK:
            _LAST_PART[:] = [(*where, part)]
    return part


def _read_part(path: Path, text: str, job_id: str) -> _Part | None:
    index = _read_index(path, text)
    if index is None:
        return None
    at = index.find(job_id)
    if at is None:
        return None  # the whole file names the job's absence (with "did you mean")
    try:
        first, last = index.span(0)[0], sum(index.segments)
        start, end = index.span(at)
        if not (0 <= first <= start < end <= last <= len(text)
                and all(i == 0 or text[i - 1] == "\n" for i in (first, start))  # whole lines
                and all(i == len(text) or text[i - 1] == "\n" for i in (end, last))):
            return None
    except (TypeError, ValueError, IndexError):
        return None  # a damaged index: read the whole file, whose errors are the ones to show
    return _part_of(path, job_id, index, at, text, text[:first], text[start:end], text[last:])


def _stamped_part(path: Path, job_id: str) -> _Part | None:
    """One job's part of a stack file spotctl wrote itself, read without reading the file whole: its
    index is guarded by the file's state (the section's comment), which an open descriptor shows
    before and after the reads, and the file is plain (its bytes are its text), so the index's offsets
    are the file's: only the lines before the first job, the job's and those after the last are read.
    None when any of that does not hold (``_read_part`` then reads the file whole)."""
    if _SHARED.get(_shared_name(path)) is not None:
        return None  # a shared file is compared whole with its shared copy at each push anyway
    index = _stored_index(path)
    if index is None or not index.plain or not index.guard.startswith("state:"):
        return None
    at = index.find(job_id)
    if at is None:
        return None
    try:
        first, last = index.span(0)[0], sum(index.segments)
        start, end = index.span(at)
        with open(path, "rb") as fh:
            fd = fh.fileno()
            st = os.fstat(fd)
            if _file_state(st) != index.guard or not 0 <= first <= start < end <= last <= st.st_size:
                return None
            # each piece with the character before it (whole lines: the one before is a line end)
            pieces = [os.pread(fd, b - a + (a > 0), a - (a > 0)) for a, b in ((start, end), (last, st.st_size))]
            prefix = os.pread(fd, first, 0)
            if _file_state(os.fstat(fd)) != index.guard:
                return None  # written in place while read
        (block, suffix), head = (piece.decode("ascii") for piece in pieces), prefix.decode("ascii")
    except (OSError, ValueError, TypeError, IndexError):  # (UnicodeDecodeError is a ValueError)
        return None
    if not (len(head) == first and (first == 0 or head.endswith("\n")) and all(
            (len(piece) == b - a + (a > 0)) and (a == 0 or piece.startswith("\n"))
            for piece, (a, b) in ((block, (start, end)), (suffix, (last, st.st_size))))
            and block.endswith("\n")):
        return None
    return _part_of(path, job_id, index, at, None, head, block[start > 0:], suffix[last > 0:])


def _part_of(path: Path, job_id: str, index: _Index, at: int, text: str | None, prefix: str, block: str,
             suffix: str) -> _Part | None:
    """The part the index names, when the job's lines with the stack-wide ones make a valid config of
    this job alone."""
    try:
        parsed = _parse(path, prefix + block + suffix, shared=False)
    except ConfigError:
        return None  # a damaged index: read the whole file, whose errors are the ones to show
    raw = plain(parsed.doc.get("config", {}))
    jobs = raw.get(key("jobs"))
    if parsed.anchored or not (isinstance(jobs, list) and len(jobs) == 1 and isinstance(jobs[0], dict)
                               and jobs[0].get("id") == job_id):
        return None
    return _Part(index, text, at, prefix, block, suffix, raw, parsed.nodes)


def _splice_part(path: Path, part: _Part, job_id: str, fields: Mapping[str, Any]
                 ) -> tuple[str, StackConfig, _Index] | None:
    """(the new file, its config of this job, its index) with ``fields`` set in the job's lines, or
    None when the whole file must be edited instead (an id changed, an unusual layout, or a result
    the one-job check refuses: the whole file then names the problem with the job's real index)."""
    if "id" in fields:
        return None
    new_part = _splice_job_fields(part.prefix + part.block + part.suffix, job_id, fields)
    if new_part is None:
        return None
    try:
        parsed = _parse(path, new_part, shared=False)
    except ConfigError:
        return None
    expected = copy.deepcopy(part.raw)
    _set_fields(expected[key("jobs")][0], fields)
    if parsed.anchored or plain(parsed.doc.get("config", {})) != expected:
        return None
    head, tail = len(part.prefix), len(new_part) - len(part.suffix)
    if not (tail > head and new_part.startswith(part.prefix) and new_part.endswith(part.suffix)
            and new_part[tail - 1:tail] == part.block[-1:]):  # (still whole lines)
        return None  # the splice reached outside the job's lines
    nodes = part.index.nodes - part.nodes + parsed.nodes
    if nodes > MAX_NODES:
        return None
    try:
        new = validate(namespaced(expected, str(path)), str(path))
    except ConfigError:
        return None
    block = new_part[head:tail]
    segments = part.index.segments[:]  # (a copy: the part may be read again)
    segments[2 * part.at + 1] = len(block)  # the jobs after it keep their gaps: nothing else changes
    return block, new, _Index("", nodes, part.index.ids, segments)  # (its guard once written: ``_update_job``)


def _rewrite(path: Path, part: _Part, block: str) -> str | None:
    """Write the stack file read in pieces (``_stamped_part``) with ``block`` as the job's lines, as
    ``atomic_write`` does, the rest copied from the file by the kernel (never into this process: the
    cost does not grow with the stack). Returns the new file's state when it is still ours after the
    write, "" when not (no index then), or None when the file changed since it was read (nothing written).

    Raises:
        ConfigError: the new file could not be written whole (a full disk): the old one stays.
    """
    import tempfile

    target = Path(os.path.realpath(path))
    start, end = part.index.span(part.at)
    data = block.encode("utf-8")
    stamp = time.time_ns()
    tmp, old = "", -1
    try:
        old = os.open(target, os.O_RDONLY | getattr(os, "O_CLOEXEC", 0))
        st = os.fstat(old)
        if _file_state(st) != part.index.guard:
            raise _Changed
        size = st.st_size - (end - start) + len(data)
        fd, tmp = tempfile.mkstemp(prefix=f".{target.name}.", suffix=".tmp", dir=target.parent)
        with os.fdopen(fd, "wb", buffering=0) as out:
            _copy(old, out.fileno(), 0, start)
            _write_all(out.fileno(), data)
            _copy(old, out.fileno(), end, st.st_size - end)
            if os.fstat(out.fileno()).st_size != size:
                raise OSError(errno.EIO, "the new file came out short")
            os.utime(out.fileno(), ns=(stamp, stamp))
            os.fsync(out.fileno())
        os.chmod(tmp, st.st_mode & 0o777)
        # last, right before the rename: a hand edit saved in place or over the file while this one
        # was copied or synced is kept (the guard covers the file's ctime and inode)
        if _file_state(os.fstat(old)) != part.index.guard:
            raise _Changed
        os.close(old)  # (before the rename, which then frees the old file's pages and blocks itself)
        old = -1
        _still(target, part.index.guard)
        os.replace(tmp, target)
    except BaseException as exc:
        if old >= 0:
            os.close(old)
        if tmp:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(tmp)
        if isinstance(exc, _Changed | FileNotFoundError):  # (removed: a checkout, a stash)
            return None
        if isinstance(exc, OSError):
            raise ConfigError(str(path), [f"cannot write: {exc.strerror or exc}; the file is as it was"]) from None
        raise
    _sync_folder(target)
    return _stamped_state(target, stamp, size)


def _write_all(fd: int, data: bytes) -> None:
    """Write all of ``data``: a short write (a full disk) is continued, and a refused one raises."""
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view):]


class _Changed(Exception):
    """The stack file changed since its pieces were read."""


def _copy(src: int, dst: int, offset: int, count: int) -> None:
    """Append ``count`` bytes of ``src`` from ``offset`` to ``dst``: in the kernel where the file system
    can (copy_file_range), else through a small buffer."""
    kernel = hasattr(os, "copy_file_range")  # (Linux only)
    while count > 0:
        done = 0
        if kernel:
            try:
                done = os.copy_file_range(src, dst, count, offset)
            except OSError:  # (EXDEV, EINVAL, ENOSYS on some file systems)
                kernel = False
        if not kernel:
            chunk = os.pread(src, min(count, 1 << 20), offset)
            _write_all(dst, chunk)
            done = len(chunk)
        if done <= 0:
            raise _Changed  # the file ended early: it changed
        offset, count = offset + done, count - done
