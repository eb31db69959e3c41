"""Reading a stack file's ``config:`` map: ``validate`` (pydantic's errors as the user's key paths,
with "did you mean"), ``namespaced``, and the provider settings that must agree."""

from __future__ import annotations

import contextlib
import difflib
import json
import re
from collections.abc import Mapping, Sequence
from typing import Any

from pydantic import (
    BaseModel,
    ValidationError,
)

from infra.basics import NAMESPACE, ConfigError
from infra.config.base import _choice_message, _CrossErrors, _show
from infra.config.stack import StackConfig


def provider_conflicts(config: Mapping[str, Any], cfg: StackConfig, source: str) -> None:
    """Refuse provider settings that contradict ``spotctl:`` keys (spotctl configures the provider
    itself from ``spotctl:region``).

    Raises:
        ConfigError: naming both keys.
    """
    if cfg.cloud == "aws":
        region = config.get("aws:region")
        if isinstance(region, str) and region and region != cfg.region:
            raise ConfigError(source, [f"aws:region: {region!r} conflicts with {NAMESPACE}:region {cfg.region!r} "
                                       f"(spotctl uses {NAMESPACE}:region for every AWS resource; remove aws:region or make them equal)"])


# --- reading ---------------------------------------------------------------------------------


def _path(loc: Sequence[str | int]) -> str:
    """('jobs', 2, 'capacity') -> 'spotctl:jobs[2].capacity'."""
    out = NAMESPACE + ":"
    first = True
    for part in loc:
        if isinstance(part, int):
            out += f"[{part}]"
        else:
            out += part if first else f".{part}"
        first = False
    return out


def _model_at(loc: Sequence[str | int]) -> type[BaseModel] | None:
    """The model class that owns the last key of ``loc`` (to suggest its real keys)."""
    model: Any = StackConfig
    map_key = False  # the part after a mapping field (spotctl:prices.<type>) is a user's key
    for part in loc[:-1]:
        if isinstance(part, int) or map_key:
            map_key = False
            continue
        field = model.model_fields.get(_snake(part))
        if field is None:
            return None
        map_key = getattr(field.annotation, "__origin__", None) is dict
        model = _inner_model(field.annotation)
        if model is None:
            return None
    return model


def _inner_model(annotation: Any) -> type[BaseModel] | None:
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation
    for arg in getattr(annotation, "__args__", ()):
        found = _inner_model(arg)
        if found is not None:
            return found
    return None


def _snake(key: str) -> str:
    return re.sub(r"(?<!^)(?=[A-Z])", "_", key).lower()


def _keys_of(model: type[BaseModel]) -> list[str]:
    return [f.alias or name for name, f in model.model_fields.items()]


_TYPE_WORDS = {
    "int_type": "an integer",
    "int_parsing": "an integer",
    "int_from_float": "an integer",
    "float_type": "a number",
    "float_parsing": "a number",
    "finite_number": "a finite number",
    "string_type": "a string",
    "bool_type": "true or false",
    "bool_parsing": "true or false",
    "list_type": "a list",
    "dict_type": "a mapping of keys to values",
    "model_type": "a mapping of keys to values",
    "model_attributes_type": "a mapping of keys to values",
}


def _describe(err: Mapping[str, Any]) -> tuple[str, str]:
    """Turn one pydantic error into (key path, message)."""
    loc = [p for p in err["loc"]]
    kind = err["type"]
    value = err.get("input")
    if kind == "value_error" and isinstance(err.get("ctx", {}).get("error"), _CrossErrors):
        raise AssertionError("cross errors are expanded by the caller")
    if kind == "extra_forbidden":
        model = _model_at(loc)
        key = str(loc[-1])
        msg = "unknown key"
        if model is not None:
            close = difflib.get_close_matches(key, _keys_of(model), n=1, cutoff=0.6)
            msg += f" (did you mean {close[0]!r}?)" if close else f"; valid keys: {', '.join(_keys_of(model))}"
        return _path(loc), msg
    if kind == "missing":
        return _path(loc), "required key is missing"
    if kind in ("literal_error", "enum"):
        choices = re.findall(r"'([^']*)'", err.get("ctx", {}).get("expected", ""))
        return _path(loc), _choice_message(str(loc[-1]), value, choices)
    if kind in _TYPE_WORDS:
        return _path(loc), f"expected {_TYPE_WORDS[kind]}, got {_show(value)}"
    if kind in ("greater_than_equal", "greater_than", "less_than_equal", "less_than"):
        ctx = err.get("ctx", {})
        op = {"greater_than_equal": ">=", "greater_than": ">", "less_than_equal": "<=", "less_than": "<"}[kind]
        bound = next(iter(ctx.values()))
        return _path(loc), f"expected a number {op} {bound}, got {_show(value)}"
    if kind in ("too_short", "string_too_short"):
        return _path(loc), "must not be empty"
    if kind == "string_too_long":
        return _path(loc), f"is {len(value)} characters long; at most {err['ctx']['max_length']}"
    if kind == "finite_number":
        return _path(loc), f"expected a finite number, got {_show(value)}"
    if kind == "string_pattern_mismatch":
        what = {"region": "a region name such as 'us-central1' or 'us-east-1'"}.get(
            str(loc[-1]), "a zone name such as 'us-central1-a' or 'us-east-1a'" if "zone" in str(loc[-2:]) else
            "printable text (no control characters)")
        return _path(loc), f"expected {what}, got {_show(value)}"
    if kind == "value_error":
        return _path(loc), str(err["ctx"]["error"])
    return _path(loc), f"{err['msg']}, got {_show(value)}"


def validate(raw: Mapping[str, Any], source: str) -> StackConfig:
    """Validate the ``spotctl:`` part of a stack's config.

    Args:
        raw: config keys without the namespace (``{"cloud": "gcp", "jobs": [...]}``).
        source: what to name in errors (the stack file path).

    Raises:
        ConfigError: naming every problem found, each with its key path.
    """
    try:
        return StackConfig.model_validate(dict(raw))
    except ValidationError as exc:
        problems: list[str] = []
        for err in exc.errors(include_url=False):
            cross = err.get("ctx", {}).get("error")
            if isinstance(cross, _CrossErrors):
                problems += [f"{_path(_split(k))}: {m}" for k, m in cross.problems]
                continue
            key, msg = _describe(err)
            problems.append(f"{key}: {msg}")
        raise ConfigError(source, problems) from None


def _split(key: str) -> list[str | int]:
    out: list[str | int] = []
    for part in re.findall(r"[^.\[\]]+|\[\d+\]", key):
        out.append(int(part[1:-1]) if part.startswith("[") else part)
    return out


def namespaced(config: Mapping[str, Any], source: str) -> dict[str, Any]:
    """Pick the ``spotctl:`` keys of a Pulumi config map, decoding JSON-string values.

    Pulumi hands config to programs as strings (JSON for lists and maps); a stack file read
    with YAML already has typed values. Both arrive here.
    """
    known = _keys_of(StackConfig)
    bare = [str(k) for k in config if ":" not in str(k) and str(k) in known]
    if bare:  # (Pulumi's own `pulumi config set` writes the namespace; a hand edit may leave it out)
        raise ConfigError(source, [f"config.{k}: missing the `spotctl:` prefix: write `spotctl:{k}`" for k in bare])
    raw: dict[str, Any] = {}
    for key, value in config.items():
        ns, sep, name = str(key).partition(":")
        if ns != NAMESPACE or not sep:
            continue
        if isinstance(value, Mapping) and set(value) == {"secure"}:
            raise ConfigError(source, [f"{key}: spotctl settings cannot be secrets (nothing here is secret)"])
        if isinstance(value, str):
            # The engine passes every top-level value as a string ("30", "true", '["a"]').
            with contextlib.suppress(json.JSONDecodeError):
                value = json.loads(value)
        raw[name] = value
    return raw
