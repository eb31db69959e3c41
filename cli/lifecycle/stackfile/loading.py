"""Loading a stack's validated config: whole, or one job's part when the file is indexed."""

from __future__ import annotations

import os
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from infra.config import StackConfig

from cli.lifecycle.stackfile import jobindex, reading
from cli.lifecycle.stackfile.parts import _job_part, _stamped_part
from cli.lifecycle.stackfile.reading import _PARSED, _parse, _parsed, _remember, namespaced, plain, provider_conflicts
from cli.lifecycle.stackfile.refs import StackRef


def load(ref: StackRef, text: str | None = None) -> StackConfig:
    """Read and reading.validate a stack's config (and that provider settings do not contradict it); a text
    validated before is not validated again (``StackConfig`` is frozen). A valid file is indexed
    (see ``load_job``)."""
    text = reading._read_text(ref.path) if text is None else text
    digest, cached = _parsed(text)
    if cached is not None and "cfg" in cached:
        if cached.get("indexed") != os.path.abspath(ref.path):  # the same text validated for another file
            jobindex._index(ref.path, text, _parse(ref.path, text))
        return cached["cfg"]
    parsed = _parse(ref.path, text)
    config = plain(parsed.doc.get("config", {}))
    cfg = reading.validate(namespaced(config, str(ref.path)), str(ref.path))
    provider_conflicts(config, cfg, str(ref.path))
    _remember(digest, cfg=cfg)
    jobindex._index(ref.path, text, parsed)
    return cfg


def load_job(ref: StackRef, job_id: str, text: str | None = None) -> StackConfig:
    """The stack's config for a command about one job: the stack-wide settings and that job,
    validated as ``load`` does. When the file is one spotctl already validated whole (its index
    matches), only those lines are read and validated, so the time does not grow with the number of
    jobs; the config then holds only that job. Otherwise the whole file is loaded (and indexed).
    ``text``: the file's text, already read."""
    part = _stamped_part(ref.path, job_id) if text is None else None  # (a file spotctl wrote: never read whole)
    if part is not None:
        cfg = reading.validate(namespaced(part.raw, str(ref.path)), str(ref.path))
        provider_conflicts(part.raw, cfg, str(ref.path))
        return cfg
    text = reading._read_text(ref.path) if text is None else text
    cached = _parsed(text)[1] if _PARSED else None  # (a new process has nothing parsed: no hash of the whole text)
    if cached is not None and "cfg" in cached:
        return load(ref, text)  # validated already; indexed for this file too if it was another's text
    part = _job_part(ref.path, text, job_id)
    if part is None:
        return load(ref, text)
    cfg = reading.validate(namespaced(part.raw, str(ref.path)), str(ref.path))
    provider_conflicts(part.raw, cfg, str(ref.path))
    return cfg
