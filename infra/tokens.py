"""Plain-text env values that look like credentials: a warning (never an error, never the value shown)
that the stack file and every VM's script carry them, and the command that stores them as a secret."""

from __future__ import annotations

import math
import re
from collections import Counter

from infra.config import StackConfig

# Shapes the issuers document, so a match is a credential whatever the variable is called:
# AWS access key ids start with AKIA (long-term) or ASIA (temporary)
#   (https://docs.aws.amazon.com/IAM/latest/UserGuide/reference_identifiers.html#identifiers-unique-ids);
# GitHub tokens with ghp_/gho_/ghu_/ghs_/ghr_ and fine-grained ones with github_pat_
#   (https://github.blog/engineering/platform-security/behind-githubs-new-authentication-token-formats/);
# Hugging Face user access tokens with hf_ (https://huggingface.co/docs/hub/security-tokens);
# Slack tokens with xoxb-/xoxp-/xoxa-/xoxr-/xoxs- (https://api.slack.com/authentication/token-types);
# Google API keys with AIza (https://cloud.google.com/docs/authentication/api-keys);
# a JSON Web Token is three base64url parts, the first a JSON header ("eyJ" = '{"', RFC 7519).
SHAPES = (
    (re.compile(r"(AKIA|ASIA)[0-9A-Z]{16}"), "an AWS access key id"),
    (re.compile(r"(ghp|gho|ghu|ghs|ghr)_[A-Za-z0-9]{30,}|github_pat_[A-Za-z0-9_]{30,}"), "a GitHub token"),
    (re.compile(r"hf_[A-Za-z0-9]{30,}"), "a Hugging Face token"),
    (re.compile(r"xox[abprs]-[A-Za-z0-9-]{10,}"), "a Slack token"),
    (re.compile(r"AIza[0-9A-Za-z_-]{35}"), "a Google API key"),
    (re.compile(r"eyJ[A-Za-z0-9_-]{8,}\.[A-Za-z0-9_-]{8,}\.[A-Za-z0-9_-]{8,}"), "a JSON Web Token"),
)
# A variable named like a credential whose value is long and random-looking (not a path, not a word).
SECRET_NAME = re.compile(r"TOKEN|SECRET|PASSWORD|PASSWD|API_?KEY|ACCESS_KEY|PRIVATE_KEY|CREDENTIAL", re.IGNORECASE)
MIN_LENGTH = 20
MIN_BITS_PER_CHAR = 3.0


def _random_looking(value: str) -> bool:
    if len(value) < MIN_LENGTH or any(c in value for c in " /$"):
        return False
    counts = Counter(value)
    bits = -sum(n / len(value) * math.log2(n / len(value)) for n in counts.values())
    return bits >= MIN_BITS_PER_CHAR


def looks_like(name: str, value: str) -> str:
    """What the value looks like ("" when nothing)."""
    for shape, what in SHAPES:
        if shape.search(value):
            return what
    if SECRET_NAME.search(name) and _random_looking(value):
        return f"a credential (named {name}, a long random value)"
    return ""


def token_warnings(cfg: StackConfig) -> list[str]:
    """One warning per plain env value that looks like a credential, with the command that stores it
    encrypted (README "Secrets in env"); the value itself is never shown."""
    out = []
    for i, job in enumerate(cfg.jobs):
        for name, value in job.plain_env.items():
            what = looks_like(name, value)
            if what:
                path = f"spotctl:jobs[{i}].env.{name}"
                out.append(f"{path}: looks like {what} in plain text: the stack file and every VM's script carry it; "
                           f"store it encrypted with `pulumi config set --secret --path '{path}'` (it asks for the value)")
    return out
