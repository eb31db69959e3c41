"""The contract: every rule AWS and GCP enforce that spotctl relies on, in one table with sources,
checked on every resource at registration.

Pulumi's mocks accept anything, and a real ``pulumi up`` finds a broken input only when the cloud
API refuses it, half-way through an update. So each rule the clouds enforce on what we declare is
written down here (``aws.py``, ``gcp.py``: a ``Rule`` each, with the doc URL or provider source it
comes from) and checked by a Pulumi stack transformation that ``infra.program`` installs first:
the same code runs under the mocks (``spotctl plan``, the tests) and in the real program. A
violation is one ``ContractError`` naming the resource, the rule and the fix, raised before the
resource is registered when its inputs are known then (otherwise as soon as they resolve).

Rules that need more than one resource's inputs (e.g. a root volume against the AMI's snapshot
size) are checked by the component that has both, through ``enforce`` with the rule's id, so the
table stays the one list of what the clouds require.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterable, Iterator, Mapping
from functools import cache
from typing import Any

from infra.contract.rulebook import (  # noqa: F401
    _BY_TYPE,
    _RULES,
    MOVE_CREATE_MIN_H,
    TIMEOUTS,
    UNKNOWN,
    Rule,
    _Unknown,
    dig,
    duration_h,
    known,
    move_timeout_problem,
    rule,
)


class ContractError(Exception):
    """A declared resource breaks a rule the cloud enforces; ``str()`` names resource, rule and fix."""

    rule: Rule | None = None
    resource: str = ""
    problem: str = ""

    def one_line(self) -> str:
        """The error on one line (for the lifecycle commands' ``error:`` line): resource, problem, rule and fix."""
        if self.rule is None:
            return " ".join(str(self).split())
        return f"{self.resource}: {self.problem} (rule {self.rule.id}: {self.rule.fix})"


def rules() -> list[Rule]:
    """Every rule, both clouds (importing the rule modules registers them)."""
    from infra.contract import aws, aws_fleet, gcp, gcp_fleet  # noqa: F401

    return sorted(_RULES.values(), key=lambda r: r.id)


def get(id: str) -> Rule:
    rules()
    return _RULES[id]


def error(rule: Rule, resource: str, problem: str) -> ContractError:  # noqa: F811  (the rule at hand)
    exc = ContractError(f"{resource}: {problem}\n  rule {rule.id}: {rule.says}\n  fix: {rule.fix}\n  source: {rule.source}")
    exc.rule, exc.resource, exc.problem = rule, resource, problem
    return exc


_OFFLINE: list[set[str]] = []  # the notes of the plans under way offline (innermost last)


@contextlib.contextmanager
def offline(notes: set[str]) -> Iterator[None]:
    """Plan offline (spotctl's mocks, no cloud): rules with a ``lookup`` are not enforced, their
    look-ups' answers being made up; ``notes`` gets one line per rule left to the real engine. A
    lifecycle command's targets then never depend on an invented fact (a subnet's VPC)."""
    _OFFLINE.append(notes)
    try:
        yield
    finally:
        _OFFLINE.pop()


def enforce(id: str, resource: str, problem: str | None) -> None:
    """Raise ContractError for a context rule when ``problem`` is not None (offline, a rule with a
    ``lookup`` is only noted: ``offline``)."""
    r = get(id)
    if _READ_BACK[0]:
        return
    if _OFFLINE and r.lookup:
        _OFFLINE[-1].add(f"{id} not checked offline: it needs {r.lookup}, which only the cloud knows "
                         "(`pulumi preview` checks it)")
        return
    if problem is not None:
        raise error(r, resource, problem)


def rules_for(type_: str) -> tuple[Rule, ...]:
    """The rules that check resources of ``type_``, in id order."""
    if type_ not in _BY_TYPE:
        _BY_TYPE[type_] = tuple(r for r in rules() if r.check is not None and type_ in r.types)
    return _BY_TYPE[type_]


def violations(type_: str, props: Mapping[str, Any]) -> list[tuple[Rule, str]]:
    """(rule, problem) for every rule of ``type_`` that ``props`` break."""
    found = []
    for r in rules_for(type_):
        problem = r.check(type_, props)
        if problem is not None:
            found.append((r, problem))
    return found


_READ_BACK = [False]  # inside ``read_back()``: nothing raised (a single-threaded CLI's flag, not a program's)


@contextlib.contextmanager
def read_back() -> Iterator[None]:
    """Plan a config only to read its URNs back (a lifecycle command's file before its edit, whose
    resources are never applied again): its broken rules are not this change's to refuse."""
    _READ_BACK[0] = True
    try:
        yield
    finally:
        _READ_BACK[0] = False


def reading_back() -> bool:
    """Whether a plan now is only read back (``read_back``): its rules are not enforced."""
    return _READ_BACK[0]


def check(type_: str, name: str, props: Mapping[str, Any]) -> None:
    """Raise ContractError for the first rule ``props`` break."""
    if _READ_BACK[0]:
        return
    for r, problem in violations(type_, props):
        raise error(r, f"{type_} {name!r}", problem)


@cache
def _input_names(cls: type) -> tuple[str, ...] | None:
    """The Python names of a pulumi ``*Args`` input type's properties; None for any other type."""
    from pulumi import _types

    return tuple(_types.input_type_py_to_pulumi_names(cls)) if _types.is_input_type(cls) else None


def _plain_now(value: Any, pending: list[tuple[Any, Any, Any]]) -> Any:
    """Inputs as plain Python without waiting, in one walk: nested ``*Args`` objects become dicts with
    their Python (snake_case) names; Outputs and awaitables become UNKNOWN, each noted in ``pending``
    as (container, key, the Output) so the check can wait for just those values."""
    import pulumi

    names = _input_names(type(value))
    if names is not None:
        # An input type keeps its values under their Python names, in __dict__ or, for a dict
        # subclass, as items (pulumi._types.get / set).
        values = value if isinstance(value, dict) else vars(value)
        out: Any = {}
        items: Iterable[tuple[Any, Any]] = ((py, values[py]) for py in names if values.get(py) is not None)
    elif isinstance(value, Mapping):
        out = {}
        items = value.items()
    elif isinstance(value, list | tuple):
        out = [None] * len(value)
        items = enumerate(value)
    else:
        return value
    for k, v in items:
        if v is None or type(v) in _SCALARS:  # most values: no Output, nothing to walk
            out[k] = v
        elif isinstance(v, pulumi.Output) or hasattr(v, "__await__"):
            out[k] = UNKNOWN
            pending.append((out, k, v))
        else:
            out[k] = _plain_now(v, pending)
    return out


_SCALARS = frozenset({str, int, float, bool})
"""The key under which a check also gets the resource's ``custom_timeouts`` option (a dict of its
create/update/delete duration strings, or None): a rule may need an option, not only inputs."""


def _timeouts(opts: Any) -> dict[str, str] | None:
    ct = getattr(opts, "custom_timeouts", None)
    if ct is None:
        return None
    return {k: v for k in ("create", "update", "delete") if (v := getattr(ct, k, None))}
"""The least create timeout a move's snapshot (or disk restored from one) declares: both providers
give up far sooner by default (GCP 20 min, AWS EBS snapshot 10 min, volume 5 min; the rules cite
them), while a snapshot of a large job disk can take hours."""


def transformation(args) -> None:
    """The Pulumi stack transformation: check what is known now, the rest when it resolves.

    Only the unknown values are awaited (one ``Output.all`` of them), not the whole input tree: lifting
    every input into an Output cost ~2 s of CPU per 2,000 resources (bench/plan_scale.py)."""
    import pulumi

    if not rules_for(args.type_):
        return None  # no rule reads this type: nothing to convert, nothing to wait for
    pending: list[tuple[Any, Any, Any]] = []
    now = _plain_now(args.props, pending)
    now[TIMEOUTS] = _timeouts(args.opts)
    check(args.type_, args.name, now)
    if pending:
        def later(resolved: list[Any]) -> None:
            for (container, key, _), value in zip(pending, resolved, strict=True):
                container[key] = value
            check(args.type_, args.name, now)

        if len(pending) == 1:  # the usual case: no Output.all (an Output and a task fewer per resource)
            pulumi.Output.from_input(pending[0][2]).apply(lambda value: later([value]))
        else:
            pulumi.Output.all(*(output for _, _, output in pending)).apply(later)
    return None


def install() -> None:
    """Check every resource registered from now on (call first in the program)."""
    import pulumi

    rules()
    pulumi.runtime.register_stack_transformation(transformation)
