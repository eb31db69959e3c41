"""One job inside a stack file's text or document: find its node and lines, set or remove its keys
by replacing exactly their spans."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from cli.lifecycle.stackfile.reading import _loader, _parsed
from infra.basics import NAMESPACE

MISSING = object()  # a key the job did not have


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

    # The tree a read of this text composed (construction may have merged `<<` keys into it: a
    # splice that goes wrong through them is caught by the re-read that checks every splice).
    cached = _parsed(text)[1]
    root = cached["parsed"].root if cached is not None and "parsed" in cached else yaml.compose(text, Loader=_loader())
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
