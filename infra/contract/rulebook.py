"""How a cloud's rule is written down and registered (rule), and what the checks of both clouds
share: reading inputs that may not be known yet, Pulumi durations, a move's create timeout."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any


class _Unknown:
    """An input whose value is not known at registration (an unresolved Output)."""

    def __repr__(self) -> str:
        return "<unknown>"


UNKNOWN = _Unknown()


@dataclass(frozen=True)
class Rule:
    """One rule a cloud enforces.

    ``check(type_, props)`` gets the resource's type token and its inputs as plain Python (snake_case keys, as the pulumi-aws /
    pulumi-gcp constructors name them; nested ``*Args`` as dicts; unknown values as ``UNKNOWN``) and
    returns what is wrong, or None. Rules with ``types`` empty are context rules, checked through
    ``enforce`` by the component that has the context.
    """

    id: str
    types: tuple[str, ...]
    says: str
    fix: str
    source: str
    check: Callable[[str, Mapping[str, Any]], str | None] | None = None
    # A context rule whose inputs are the cloud's answers to look-ups (data sources), named here: under
    # spotctl's plan mocks those answers are made up, so offline it is noted, not enforced (``offline``).
    lookup: str = ""


_RULES: dict[str, Rule] = {}
_BY_TYPE: dict[str, tuple[Rule, ...]] = {}  # type token -> the rules checking it (every resource asks)


def rule(id: str, types: Iterable[str], says: str, fix: str, source: str, lookup: str = ""):
    """Register a rule; used as a decorator on its check (or called bare for a context rule)."""

    def register(check: Callable[[str, Mapping[str, Any]], str | None] | None) -> Callable | None:
        if id in _RULES:
            raise ValueError(f"contract rule {id} registered twice")
        _RULES[id] = Rule(id, tuple(types), says, fix, source, check, lookup)
        _BY_TYPE.clear()
        return check

    return register


def dig(props: Any, path: str) -> Any:
    """``props["a"]["b"][0]`` for path ``a.b.0``; None when absent, UNKNOWN when not known yet."""
    value = props
    for part in path.split("."):
        if value is UNKNOWN:
            return UNKNOWN
        if isinstance(value, Mapping):
            value = value.get(part)
        elif isinstance(value, list | tuple) and part.isdigit() and int(part) < len(value):
            value = value[int(part)]
        else:
            return None
    return value


def known(*values: Any) -> bool:
    return all(v is not UNKNOWN for v in values)


TIMEOUTS = "_custom_timeouts"


def duration_h(text: str | None) -> float | None:
    """Hours in a Pulumi duration string ("12h", "90m", "1h30m"; units ns..h as Pulumi's
    customTimeouts takes them); None when absent or unreadable."""
    import re

    if not text:
        return None
    parts = re.findall(r"(\d+(?:\.\d+)?)(ns|us|µs|ms|s|m|h)", str(text))
    if not parts or "".join(n + u for n, u in parts) != str(text):
        return None
    per_h = {"h": 1.0, "m": 1 / 60, "s": 1 / 3600, "ms": 1 / 3.6e6, "us": 1 / 3.6e9, "µs": 1 / 3.6e9, "ns": 1 / 3.6e12}
    return sum(float(n) * per_h[u] for n, u in parts)


MOVE_CREATE_MIN_H = 6.0


def move_timeout_problem(props: Mapping[str, Any], what: str) -> str | None:
    """What is wrong with the create timeout of a move resource (``what`` names it), or None."""
    create = (props.get(TIMEOUTS) or {}).get("create")
    hours = duration_h(create)
    if hours is None:
        return f"{what} declares no create timeout (custom_timeouts create: {create!r}): the provider's default applies"
    return None if hours >= MOVE_CREATE_MIN_H else f"{what} waits only {create} to be created (< {MOVE_CREATE_MIN_H:g} h)"
