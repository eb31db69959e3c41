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
import re
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
    if op in ("StringNotLike", "ArnNotLike"):
        return not present or not any(_like(w, v) for v in values for w in wanted)
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


# ---- GCP: the subset of CEL spotctl writes in IAM conditions ------------------------------------
# resource.type / resource.name compared with == and !=, resource.name.startsWith("..."), !, && and
# || with CEL's precedence (! binds tightest, then &&, then ||), parentheses, string literals
# (https://cloud.google.com/iam/docs/conditions-overview, "Common Expression Language").

_TOKEN = re.compile(r'\s*(?:(?P<str>"[^"]*")|(?P<op>&&|\|\||==|!=|!|\(|\))|(?P<attr>resource\.(?:type|name))'
                    r'(?P<call>\.startsWith)?)')


def _tokens(expression: str) -> list[tuple[str, str]]:
    out, pos = [], 0
    while pos < len(expression.rstrip()):
        m = _TOKEN.match(expression, pos)
        assert m and m.end() > pos, f"not modelled at {expression[pos:pos + 30]!r}"
        pos = m.end()
        if m["str"]:
            out.append(("str", m["str"][1:-1]))
        elif m["op"]:
            out.append(("op", m["op"]))
        else:
            out.append(("attr", m["attr"]))
            if m["call"]:
                out.append(("call", "startsWith"))
    return out


def condition_holds(expression: str, resource_type: str, resource_name: str) -> bool:
    """Whether an IAM condition ``expression`` is true for a resource of that type and name."""
    tokens, i = _tokens(expression), 0
    attrs = {"resource.type": resource_type, "resource.name": resource_name}

    def take(kind: str, value: str | None = None) -> str:
        nonlocal i
        k, v = tokens[i]
        assert k == kind and (value is None or v == value), (tokens[i], kind, value)
        i += 1
        return v

    def peek() -> tuple[str, str] | None:
        return tokens[i] if i < len(tokens) else None

    def primary() -> bool:
        if peek() == ("op", "!"):
            take("op", "!")
            return not primary()
        if peek() == ("op", "("):
            take("op", "(")
            value = either()
            take("op", ")")
            return value
        attr = attrs[take("attr")]
        if peek() == ("call", "startsWith"):
            take("call")
            take("op", "(")
            prefix = take("str")
            take("op", ")")
            return attr.startswith(prefix)
        op = take("op")
        literal = take("str")
        return attr == literal if op == "==" else attr != literal

    def both() -> bool:
        value = primary()
        while peek() == ("op", "&&"):
            take("op", "&&")
            value = primary() and value
        return value

    def either() -> bool:
        value = both()
        while peek() == ("op", "||"):
            take("op", "||")
            value = both() or value
        return value

    result = either()
    assert i == len(tokens), tokens[i:]
    return result
