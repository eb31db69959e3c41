"""The vocabulary every section of a stack file uses: name rules, limits, small types, secret values
and the messages that list choices."""

from __future__ import annotations

import difflib
import re
from collections.abc import Mapping, Sequence
from typing import Annotated, Any

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    StringConstraints,
)
from pydantic.alias_generators import to_camel

# Job ids and pool names become parts of cloud resource names (GCE: RFC 1035, 63 chars; we append
# suffixes such as "-a12-n3-disk"), so they are kept short and in the strictest common alphabet.
# Every pattern here is used with fullmatch: `$` would also match before a trailing newline.
NAME_RE = re.compile(r"[a-z]([-a-z0-9]{0,28}[a-z0-9])?")
NAME_RULE = (
    "1-30 characters: lowercase letters, digits and hyphens, starting with a letter and not ending with a hyphen"
)

POLICY_NAMES = ("default", "greedy", "uniform-progress", "uniform-progress-nh", "n-preemptions", "on-demand")


class _Model(BaseModel):
    model_config = ConfigDict(
        extra="forbid",
        alias_generator=to_camel,
        populate_by_name=True,
        frozen=True,
        use_enum_values=False,
    )


Name = Annotated[str, StringConstraints(strict=True)]
NonEmpty = Annotated[str, StringConstraints(strict=True, min_length=1, max_length=256, pattern=r"^[^\x00-\x1f]+$")]

MAX_ATTEMPT = 9999
MAX_HOURS = 87600.0  # ten years: past that a deadline is a typo (and 1e300 overflowed the planner)
# A command travels in the VM's startup script: GCE metadata values are limited to 256 KB and AWS
# user data to 16 KB (the contract checks the rendered script); no real command is longer than this.
MAX_COMMAND = 8192
MAX_ENV_VALUE = 4096
# What plan, status and drill show for (and what mocks and drills deliver as) a secret env value.
SECRET_PLACEHOLDER = "[secret]"
# Regions and zones: ASCII, structured; a zone is its region plus one letter (GCP "-a", AWS "a"),
# or an AWS Local Zone ("us-west-2-lax-1a"). These go to pydantic, whose (Rust) regex `$` matches
# only at the very end, unlike Python's.
REGION_RE = r"^[a-z]{2,}(-[a-z]+)+-?[0-9]{1,2}$"
ZONE_RE = r"^[a-z]{2,}(-[a-z]+)+-?[0-9]{1,2}(-[a-z]|[a-z]|-[a-z]{3}-[0-9][a-z])$"

# Names a job's env may not set: spotctl's own variables and the rendezvous it sets up, names
# that change how bash, the dynamic linker or command lookup behave. (The scripts set their own
# variables after the user's regardless; this makes the stack file say so up front.)
RESERVED_ENV_PREFIXES = {"SPOTCTL_": "spotctl sets its own SPOTCTL_* variables", "BASH_": "it changes how bash runs",
                         "LD_": "it changes the dynamic linker"}
RESERVED_ENV_NAMES = {
    **dict.fromkeys(("MASTER_ADDR", "MASTER_PORT", "NODE_RANK", "WORLD_SIZE"), "spotctl sets the rendezvous variables"),
    **dict.fromkeys(("PATH", "CDPATH", "FPATH", "MAILPATH", "ENV", "BASHOPTS", "SHELLOPTS", "IFS", "GLOBIGNORE",
                     "PS1", "PS2", "PS3", "PS4", "PROMPT_COMMAND", "POSIXLY_CORRECT", "OPTIND", "OPTARG", "HOME", "PWD",
                     "OLDPWD", "SHELL", "SHLVL", "PPID", "UID", "EUID", "TMOUT", "HISTFILE", "EXECIGNORE", "INPUTRC"),
                    "it changes how the shell or command lookup behaves"),
}


def reserved_env_key(key: str) -> str:
    """Why a job's env may not set ``key`` ("" when it may)."""
    if key in RESERVED_ENV_NAMES:
        return RESERVED_ENV_NAMES[key]
    return next((why for prefix, why in RESERVED_ENV_PREFIXES.items() if key.upper().startswith(prefix)), "")


def zone_in_region(zone: str, region: str, cloud: str) -> bool:
    """``zone`` is one of ``region``'s zones by its structure, not a string prefix
    (``us-central10-c`` is not in ``us-central1``)."""
    if cloud == "gcp":
        return re.fullmatch(re.escape(region) + r"-[a-z]", zone) is not None
    return re.fullmatch(re.escape(region) + r"([a-z]|-[a-z]{3}-[0-9][a-z])", zone) is not None


def env_value_problem(value: str) -> str:
    """What is wrong with an env value ("" when nothing); never quotes the value (it may be a secret)."""
    if "\x00" in value:
        return "must not contain a NUL character (no process can receive it)"
    if len(value) > MAX_ENV_VALUE:
        return f"is {len(value)} characters; at most {MAX_ENV_VALUE}"
    return ""


def _bounded(value: str) -> str:
    if len(value) > MAX_ENV_VALUE:
        raise ValueError(f"an env value is {len(value)} characters; at most {MAX_ENV_VALUE}")
    return value
PositiveInt = Annotated[int, Field(strict=True, ge=1)]
NonNegativeInt = Annotated[int, Field(strict=True, ge=0)]


class SecureValue(_Model):
    """A value Pulumi encrypted in the stack file: ``{secure: <ciphertext>}``, as ``pulumi config set
    --secret --path 'spotctl:jobs[0].env.KEY'`` writes it (pulumi/pulumi
    sdk/go/common/resource/config/object.go: ``marshalObject`` writes a secure string as a map with
    the single key ``secure``; ``isSecureValue`` reads exactly that shape back). spotctl never sees the
    clear value: the Pulumi engine decrypts it for the program (``infra.program.read_config``)."""

    secure: Annotated[str, StringConstraints(strict=True, min_length=1)]


def _env_value(key: str, value: Any) -> Any:
    """A job env value: a string, or a Pulumi secret (exactly ``{secure: <ciphertext>}``)."""
    if isinstance(value, SecureValue | str):
        return value
    if isinstance(value, Mapping) and set(value) == {"secure"} and isinstance(value["secure"], str) and value["secure"]:
        return SecureValue(secure=value["secure"])
    raise ValueError(f"env value of {key!r} must be a string or a Pulumi secret "
                     f"({{secure: <ciphertext>}}, as `pulumi config set --secret --path` writes it), got {_show(value)}")


def _no_nul(value: str) -> str:
    if "\x00" in value:
        raise ValueError("must not contain a NUL character (no process can receive it)")
    return value


class _CrossErrors(ValueError):
    def __init__(self, problems: list[tuple[str, str]]):
        self.problems = problems
        super().__init__("; ".join(f"{k}: {m}" for k, m in problems))


def _choice_message(what: str, got: object, choices: Sequence[str]) -> str:
    msg = f"expected one of {', '.join(repr(c) for c in choices)}, got {got!r}"
    close = difflib.get_close_matches(str(got), [str(c) for c in choices], n=1, cutoff=0.6)
    if close:
        msg += f" (did you mean {close[0]!r}?)"
    return msg


def _show(value: Any) -> str:
    if isinstance(value, Mapping):
        return "a mapping"
    if isinstance(value, list):
        return "a list"
    return repr(value)
