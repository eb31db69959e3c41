"""The Pulumi program: read and validate the stack's config, then declare the cloud's components.

Run by the Pulumi CLI through ``infra/__main__.py`` and, under mocks, by ``spotctl plan``.
"""

from __future__ import annotations

import pulumi

from infra.common import job_plan
from infra.config import StackConfig, namespaced, provider_conflicts, validate
from infra.naming import stack_slug


def stack_config_source(stack: str) -> str:
    return f"stacks/Pulumi.{stack}.yaml"


def read_config(stack: str) -> StackConfig:
    """The stack's ``spotctl:`` config as the engine handed it to the program, validated."""
    from pulumi.runtime.config import CONFIG, get_config_env

    raw = {**get_config_env(), **CONFIG.get()}
    source = stack_config_source(stack)
    cfg = validate(namespaced(raw, source), source)
    provider_conflicts(raw, cfg, source)
    return cfg


def declare(cfg: StackConfig, stack: str) -> dict[str, object]:
    """Declare every resource of the stack; returns the stack outputs (also exported)."""
    plans = [job_plan(stack, job) for job in cfg.jobs]
    if cfg.cloud == "gcp":
        from infra import gcp

        outputs = gcp.declare(gcp.StackArgs(cfg, stack, stack_slug(stack)), plans)
    else:
        from infra import aws

        outputs = aws.declare(aws.StackArgs(cfg, stack, stack_slug(stack)), plans)
    for key, value in outputs.items():
        pulumi.export(key, value)
    return outputs


def main() -> dict[str, object]:
    from infra import contract

    stack = pulumi.get_stack()
    cfg = read_config(stack)
    contract.install()  # every resource from here on is checked against the clouds' rules
    return declare(cfg, stack)
