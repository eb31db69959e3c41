"""Reading a stack file: bounded (size, depth, aliases), parsed once per text, validated through
``infra.config``; the last texts read and written, and their digests."""

from __future__ import annotations

import collections
import contextlib
import os
import re
import threading
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from infra.basics import ConfigError

if TYPE_CHECKING:
    from infra.config import StackConfig


# infra.config (pydantic's models) is imported on the first validation, not with this module: a
# command that validates nothing (`status` of a file validated before) never pays for it.
def validate(raw: Mapping[str, Any], source: str) -> StackConfig:
    from infra.config import validate

    return validate(raw, source)


def namespaced(config: Mapping[str, Any], source: str) -> dict[str, Any]:
    from infra.config import namespaced

    return namespaced(config, source)


def provider_conflicts(config: Mapping[str, Any], cfg: StackConfig, source: str) -> None:
    from infra.config import provider_conflicts

    provider_conflicts(config, cfg, source)


def _yaml():
    from ruamel.yaml import YAML

    y = YAML(typ="rt")
    y.preserve_quotes = True
    y.width = 4096  # never re-wrap long commands
    y.indent(mapping=2, sequence=4, offset=2)
    return y


BOM = "\ufeff"
MAX_DEPTH = 32  # nesting of a stack file (jobs > job > env is 5 deep)
MAX_BYTES = 64 << 20  # a stack file read (a 5,000-job stack is ~2 MB)
MAX_NODES = 1_000_000  # nodes after expanding aliases: a 5,000-job stack has ~150,000; a bomb has billions


def _read_text(path: Path) -> str:
    """The file as text: UTF-8 (a byte-order mark is dropped, and kept on write by atomic_write)
    with LF line ends (CRLF files are read as LF and written back as CRLF)."""
    import stat

    try:
        # O_NONBLOCK: a FIFO opens at once (and is refused below) instead of waiting for a writer.
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
    except FileNotFoundError:
        raise ConfigError(str(path), [f"stack file not found; {_stacks_there(path.parent)}"]) from None
    except OSError as exc:
        raise ConfigError(str(path), [f"cannot read: {exc.strerror}"]) from None
    mode = os.fstat(fd).st_mode
    if not stat.S_ISREG(mode):  # a link to /dev/zero, a FIFO, a device: read for ever, or never
        os.close(fd)
        kind = "a directory" if stat.S_ISDIR(mode) else "a FIFO" if stat.S_ISFIFO(mode) else "not a regular file"
        raise ConfigError(str(path), [f"cannot read: {kind} (a stack file is a regular file)"])
    with open(fd, "rb") as fh:
        try:
            data = fh.read(MAX_BYTES + 1)
        except OSError as exc:
            raise ConfigError(str(path), [f"cannot read: {exc.strerror}"]) from None
        if len(data) > MAX_BYTES:
            raise ConfigError(str(path), [f"over {MAX_BYTES >> 20} MiB: not read (a stack of 5,000 jobs is ~2 MB)"])
        state = _file_state(os.fstat(fd))  # after the read: what was read is this version
    last = _LAST_READ[0] if _LAST_READ else None
    if last is not None and last[1] == data:  # read again under the lock: the same text object, so every
        _LAST_READ[:] = [(last[0], data, state)]  # cache keyed by it (guard, part, parse) answers by identity
        return last[0]
    text = decode(data, str(path))
    _LAST_READ[:] = [(text, data, state)]
    return text


def _stacks_there(folder: Path) -> str:
    """The stacks a folder has files for, to name with a stack that is not there."""
    try:
        names = sorted(p.name[len("Pulumi."):-len(".yaml")] for p in folder.glob("Pulumi.?*.yaml"))
    except OSError:
        names = []
    where = folder if str(folder) not in ("", ".") else Path(".")
    if names:
        return f"the stacks in {where}/ are: {', '.join(names)}"
    here = (folder if folder.is_dir() else Path.cwd()).resolve()
    outside = not any((d / "Pulumi.yaml").is_file() for d in (here, *here.parents))  # (refs.project_root's search)
    return f"{where}/ has no Pulumi.<stack>.yaml" + (" and no Pulumi.yaml is at or above it: run spotctl in the "
                                                      "project, or give `spotctl -C DIR` (the directory holding Pulumi.yaml)" if outside else "")


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


def _loader():
    """``_fast_loader``, built once."""
    global _FAST_LOADER
    _FAST_LOADER = _FAST_LOADER or _fast_loader()
    return _FAST_LOADER

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
    Python's built-in module (the same digest): loading OpenSSL is ~2 ms of a short command."""
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

    digest, cached = _parsed(text) if shared else ("", None)
    if cached is not None and "parsed" in cached:
        return cached["parsed"]
    nodes, anchored = _check_shape(path, text)
    loader = _loader()(text)
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


def _read_state(text: str | None) -> str | None:
    """The file's state when ``text`` (this very object) was read or written here, or None."""
    if text is None:
        return None
    return next((state for seen, _, state in (*_LAST_READ, *_LAST_WRITTEN) if seen is text and state), None)


_LAST_WRITTEN: list[tuple[str, bytes, str | None]] = []  # the stack file's last text written, its bytes and state


def read_text(path: Path) -> str:
    """The stack file's text as every reader here sees it (UTF-8, LF, no byte-order mark).

    Raises:
        ConfigError: missing, unreadable or not UTF-8.
    """
    return _read_text(path)
