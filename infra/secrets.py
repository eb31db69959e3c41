"""Job env secrets: which env values are Pulumi secrets and their clear values, kept out of the config model.

How Pulumi hands a nested secret to a program (pulumi/pulumi sdk/go/common/resource/config):
``pulumi config set --secret --path 'spotctl:jobs[0].env.HF_TOKEN' VALUE`` stores the value in the
stack file as ``{secure: <ciphertext>}`` at that path (object.go ``marshalObject``); the engine
decrypts every ciphertext of a key and passes the key's whole value to the program as JSON with the
clear strings, listing the top-level key (``spotctl:jobs``) among the secret keys (map.go
``SecureKeys``, object.go ``Secure``: true when any nested value is secure). The Python SDK only
knows that level too (``pulumi.runtime.config.is_config_secret``; ``Config.require_secret_object``
wraps the whole key in one secret Output). Which *nested* values were secret is therefore not in
what the engine passes: spotctl reads it from the stack file (its ``{secure: ...}`` markers), takes
the clear values at exactly those paths from the engine's config, and puts the markers back before
validation, so the validated :class:`StackConfig` never holds a clear secret. The clear values live
only in ``pulumi.Output.secret`` from here on (Pulumi encrypts them in its state and masks them in
its output).

Under ``spotctl plan`` (mocks) the config comes from the stack file unchanged: the markers are
there, no clear value is, and each secret becomes the placeholder :data:`PLACEHOLDER`.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from infra.config import NAMESPACE, SECRET_PLACEHOLDER, ConfigError, StackConfig, env_value_problem

PLACEHOLDER = SECRET_PLACEHOLDER  # what plan, status and drill show (and what mocks deliver) for a secret


def _is_marker(value: Any) -> bool:
    return isinstance(value, Mapping) and set(value) == {"secure"} and isinstance(value["secure"], str)


def markers(stack_config: Mapping[str, Any], source: str) -> dict[tuple[int, str], str]:
    """``{(job index, env key): ciphertext}`` of the stack file's ``spotctl:`` secrets.

    Raises:
        ConfigError: a secret anywhere but in a job's ``env`` (nothing else of spotctl's is secret).
    """
    found: dict[tuple[int, str], str] = {}
    misplaced: list[str] = []

    def walk(value: Any, path: str) -> None:
        if _is_marker(value):
            misplaced.append(path)
        elif isinstance(value, Mapping):
            for k, v in value.items():
                walk(v, f"{path}.{k}")
        elif isinstance(value, list):
            for i, v in enumerate(value):
                walk(v, f"{path}[{i}]")

    for key, value in stack_config.items():
        ns, _, name = str(key).partition(":")
        if ns != NAMESPACE:
            continue
        if name != "jobs" or not isinstance(value, list):
            walk(value, f"{NAMESPACE}:{name}")
            continue
        for i, job in enumerate(value):
            if not isinstance(job, Mapping):
                continue
            for field, v in job.items():
                if field == "env" and isinstance(v, Mapping):
                    for env_key, env_value in v.items():
                        if _is_marker(env_value):
                            found[(i, str(env_key))] = env_value["secure"]
                        else:
                            walk(env_value, f"{NAMESPACE}:jobs[{i}].env.{env_key}")
                else:
                    walk(v, f"{NAMESPACE}:jobs[{i}].{field}")
    if misplaced:
        raise ConfigError(source, [f"{p}: only a job's env values may be secrets" for p in misplaced])
    return found


def take_secrets(raw: Mapping[str, Any], file_config: Mapping[str, Any],
                 source: str) -> tuple[dict[str, Any], dict[tuple[int, str], str]]:
    """Split the engine's decrypted ``spotctl:`` config (``raw``, without the namespace) into the same
    config with the stack file's ``secure:`` markers put back, and the clear values.

    ``file_config`` is the stack file's ``config:`` map. Every env value the engine passed must be
    a secret there or the same string: a file that does not match (another file, an edit since)
    cannot say which values are secrets, and guessing could put a secret into a script.

    Raises:
        ConfigError: the file holds no secret or does not match, the engine's config has no string
            where the file has a secret, or a clear value no process could receive (keys are named,
            never values).
    """
    found = markers(file_config, source)
    jobs = raw.get("jobs")
    out = dict(raw)
    if not found:
        raise ConfigError(source, [f"{NAMESPACE}:jobs: Pulumi passed it as a secret, but this stack file has no "
                                   "{secure: ...} env value: cannot tell which env values are secrets"])
    file_jobs = file_config.get(f"{NAMESPACE}:jobs")
    file_jobs = file_jobs if isinstance(file_jobs, list) else []
    for i, job in enumerate(jobs if isinstance(jobs, list) else []):
        env = job.get("env") if isinstance(job, Mapping) else None
        file_job = file_jobs[i] if i < len(file_jobs) and isinstance(file_jobs[i], Mapping) else {}
        file_env = file_job.get("env") if isinstance(file_job.get("env"), Mapping) else {}
        for key, value in (env.items() if isinstance(env, Mapping) else ()):
            if (i, str(key)) not in found and file_env.get(key) != value:
                raise ConfigError(source, [f"{NAMESPACE}:jobs[{i}].env.{key}: this stack file does not match the config "
                                           "Pulumi passed: cannot tell which env values are secrets"])
    if not isinstance(jobs, list):
        raise ConfigError(source, [f"{NAMESPACE}:jobs: the stack file has secrets in job env, but the config Pulumi passed has no jobs"])
    jobs = [dict(j) if isinstance(j, Mapping) else j for j in jobs]
    clear: dict[tuple[int, str], str] = {}
    problems: list[str] = []
    for (i, key), ciphertext in sorted(found.items()):
        where = f"{NAMESPACE}:jobs[{i}].env.{key}"
        job = jobs[i] if i < len(jobs) else None
        env = job.get("env") if isinstance(job, dict) else None
        value = env.get(key) if isinstance(env, Mapping) else None
        if not isinstance(value, str):
            problems.append(f"{where}: the stack file holds a secret here but Pulumi passed no decrypted string "
                            "(run through `pulumi up`, which decrypts it)")
            continue
        problem = env_value_problem(value)
        if problem:
            problems.append(f"{where}: the secret's value {problem}")
            continue
        clear[(i, key)] = value
        job["env"] = {**env, key: {"secure": ciphertext}}
    if problems:
        raise ConfigError(source, problems)
    out["jobs"] = jobs
    return out, clear


def by_job(cfg: StackConfig, clear: Mapping[tuple[int, str], str]) -> dict[str, dict[str, str]]:
    """``{job id: {key: value}}`` for every secret env key of every job: the clear value where the
    engine gave one, else :data:`PLACEHOLDER` (mocks: nothing was decrypted)."""
    out: dict[str, dict[str, str]] = {}
    for i, job in enumerate(cfg.jobs):
        if job.secret_keys:
            out[job.id] = {k: clear.get((i, k), PLACEHOLDER) for k in job.secret_keys}
    return out


def find_stack_file(stack: str, starts: list[Path]) -> Path | None:
    """``Pulumi.<stack>.yaml`` in the ``stackConfigDir`` (Pulumi.yaml) of the first project found at or
    above one of ``starts`` (the program's working directory, then the project the program lives in)."""
    path = _stack_file_in(stack, starts)
    return path if path is not None and path.is_file() else None


def sibling_stacks(stack: str, starts: list[Path]) -> tuple[str, ...]:
    """The other stacks of this stack's project: the ``Pulumi.<name>.yaml`` files next to its own
    (found as ``find_stack_file`` finds it); () when the stack file is not found."""
    path = find_stack_file(stack, starts)
    if path is None:
        return ()
    own = path.name
    return tuple(sorted(p.name[len("Pulumi."):-len(".yaml")] for p in path.parent.glob("Pulumi.*.yaml") if p.name != own))


def _stack_file_in(stack: str, starts: list[Path]) -> Path | None:
    import yaml

    for start in starts:
        for d in (start, *start.parents):
            settings = d / "Pulumi.yaml"
            if not settings.is_file():
                continue
            try:
                doc = yaml.safe_load(settings.read_text(encoding="utf-8")) or {}
            except yaml.YAMLError:
                doc = {}
            where = d / str(doc.get("stackConfigDir") or "") if isinstance(doc, dict) else d
            path = where / f"Pulumi.{stack.rsplit('/', 1)[-1]}.yaml"
            if path.is_file():
                return path
            break
    return None


def stack_file_config(path: Path) -> dict[str, Any]:
    """The ``config:`` map of a stack file (only its ``secure:`` markers are used)."""
    import yaml

    try:
        doc = yaml.safe_load(path.read_text(encoding="utf-8-sig")) or {}
    except (OSError, yaml.YAMLError) as exc:
        raise ConfigError(str(path), [f"cannot read it to find which env values are secrets: {exc}"]) from None
    config = doc.get("config") if isinstance(doc, dict) else None
    return dict(config) if isinstance(config, Mapping) else {}
