"""A small evaluator of the IAM policy forms spotctl writes (tests only): enough to ask "would this
policy allow that request?" of the watcher's policy and the stacks' permissions boundaries.

It follows the documented evaluation logic for one identity policy: an explicit Deny wins, else an
Allow whose Action, Resource and every Condition match, else the implicit deny
(https://docs.aws.amazon.com/IAM/latest/UserGuide/reference_policies_evaluation-logic.html). Action
and Resource use IAM's wildcards (``*`` and ``?``, ``*`` crossing ``/`` and ``:``); conditions: the
operators spotctl uses; a key absent from the request fails every operator except ``...IfExists``
and the negated ones (reference_policies_elements_condition_operators.html).
"""

from __future__ import annotations

import fnmatch
from typing import Any


def _list(value: Any) -> list:
    return value if isinstance(value, list) else [value]


def _like(pattern: str, value: str) -> bool:
    return fnmatch.fnmatchcase(value, pattern.replace("[", "[[]"))


def _condition(op: str, key: str, wanted: Any, context: dict[str, Any]) -> bool:
    present = key in context
    values = _list(context.get(key))
    wanted = _list(wanted)
    if op.startswith("ForAnyValue:"):
        return present and any(_condition(op.split(":", 1)[1], key, wanted, {key: v}) for v in values)
    if op.endswith("IfExists"):
        return not present or _condition(op.removesuffix("IfExists"), key, wanted, context)
    if op in ("StringEquals", "ArnEquals"):
        return present and any(v == w for v in values for w in wanted)
    if op in ("StringLike", "ArnLike"):
        return present and any(_like(w, v) for v in values for w in wanted)
    if op == "StringNotEquals":
        return not present or all(v != w for v in values for w in wanted)
    raise AssertionError(f"operator {op} not modelled")


def _matches(statement: dict, action: str, resource: str, context: dict[str, Any]) -> bool:
    if not any(_like(a, action) for a in _list(statement["Action"])):
        return False
    if not any(_like(r, resource) for r in _list(statement["Resource"])):
        return False
    return all(_condition(op, key, wanted, context)
               for op, keys in statement.get("Condition", {}).items() for key, wanted in keys.items())


def allowed(policy: dict, action: str, resource: str, **context: Any) -> bool:
    """Whether ``policy`` lets ``action`` on ``resource`` with request ``context`` (condition keys)."""
    statements = policy["Statement"]
    if any(s["Effect"] == "Deny" and _matches(s, action, resource, context) for s in statements):
        return False
    return any(s["Effect"] == "Allow" and _matches(s, action, resource, context) for s in statements)
