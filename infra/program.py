"""The Pulumi program: read and validate the stack's config, then declare the cloud's components.

Run by the Pulumi CLI through ``infra/__main__.py`` and, under mocks, by ``spotctl plan``.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

import pulumi

from infra import secrets
from infra.common import job_plan
from infra.config import NAMESPACE, ConfigError, StackConfig, namespaced, provider_conflicts, validate
from infra.naming import stack_slug
from infra.render import secret_payload


def stack_config_source(stack: str) -> str:
    return f"stacks/Pulumi.{stack}.yaml"


def read_config(stack: str) -> tuple[StackConfig, dict[str, dict[str, str]]]:
    """The stack's ``spotctl:`` config as the engine handed it to the program, validated, and the
    clear values of the jobs' secret env values (``{job id: {key: value}}``; see ``infra.secrets``:
    the config model keeps only the ``{secure: ...}`` markers)."""
    from pulumi.runtime.config import CONFIG, get_config_env, is_config_secret

    raw = {**get_config_env(), **CONFIG.get()}
    source = stack_config_source(stack)
    spotctl = namespaced(raw, source)
    clear: dict[tuple[int, str], str] = {}
    # The engine hands secrets over decrypted; only spotctl:jobs is searched for them (env values),
    # so a secret anywhere else would reach a script or a label in clear: refuse it.
    elsewhere = sorted(k for k in raw if k.startswith(f"{NAMESPACE}:") and k != f"{NAMESPACE}:jobs" and is_config_secret(k))
    if elsewhere:
        raise ConfigError(source, [f"{key} holds a secret: only a job's env values may be secrets "
                                   f"({NAMESPACE}:jobs[i].env.KEY)" for key in elsewhere])
    if is_config_secret(f"{NAMESPACE}:jobs"):
        # The engine decrypted secrets nested in spotctl:jobs; the stack file says which they were.
        path = secrets.find_stack_file(stack, [Path.cwd(), Path(__file__).resolve().parent.parent])
        if path is None:
            raise ConfigError(source, [f"{NAMESPACE}:jobs holds secrets, but the stack file was not found to tell which "
                                       "env values they are (run from the project directory)"])
        source = str(path)
        spotctl, clear = secrets.take_secrets(spotctl, secrets.stack_file_config(path), source)
    cfg = validate(spotctl, source)
    provider_conflicts(raw, cfg, source)
    return cfg, secrets.by_job(cfg, clear)


def declare(cfg: StackConfig, stack: str, env_secrets: Mapping[str, Mapping[str, str]] | None = None) -> dict[str, object]:
    """Declare every resource of the stack; returns the stack outputs (also exported).

    ``env_secrets``: each job's secret env values in clear (``read_config``); they enter the program
    here as ``pulumi.Output.secret`` payloads and nowhere else."""
    plans = [job_plan(stack, job) for job in cfg.jobs]
    siblings = secrets.sibling_stacks(stack, [Path.cwd(), Path(__file__).resolve().parent.parent])
    payloads = {job_id: pulumi.Output.secret(secret_payload(values)) for job_id, values in (env_secrets or {}).items()}
    if cfg.cloud == "gcp":
        from infra import gcp

        outputs = gcp.declare(gcp.StackArgs(cfg, stack, stack_slug(stack), payloads, siblings), plans)
    else:
        from infra import aws

        outputs = aws.declare(aws.StackArgs(cfg, stack, stack_slug(stack), payloads, siblings), plans)
    for key, value in outputs.items():
        pulumi.export(key, value)
    return outputs


def main() -> dict[str, object]:
    from infra import contract

    stack = pulumi.get_stack()
    cfg, env_secrets = read_config(stack)
    contract.install()  # every resource from here on is checked against the clouds' rules
    return declare(cfg, stack, env_secrets)
