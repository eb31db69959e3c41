"""AWS rules (see ``infra.contract``). One ``@rule`` per rule the AWS APIs enforce on what spotctl
declares, each citing its source; checks get the pulumi-aws constructor inputs as plain Python."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from infra.contract import dig, known, rule

INSTANCE = "aws:ec2/instance:Instance"
LAUNCH_TEMPLATE = "aws:ec2/launchTemplate:LaunchTemplate"

@rule("aws.imdsv2-required", [INSTANCE, LAUNCH_TEMPLATE],
      says="spotctl requires IMDSv2 on every VM: metadata_options.http_tokens = 'required' (EC2's default is 'optional').",
      fix="build metadata_options with http_tokens='required' (infra/aws.py _metadata_options)",
      source="https://docs.aws.amazon.com/AWSEC2/latest/UserGuide/configuring-IMDS-new-instances.html")
def imdsv2(type_: str, props: Mapping[str, Any]) -> str | None:
    tokens = dig(props, "metadata_options.http_tokens")
    if not known(tokens):
        return None
    return None if tokens == "required" else f"metadata_options.http_tokens is {tokens!r}"
