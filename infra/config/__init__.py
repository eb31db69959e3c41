"""The stack configuration (`spotctl:*` keys of `stacks/Pulumi.<stack>.yaml`), read and validated here only.

Both the Pulumi program and every CLI command go through :func:`validate`, so a bad stack file is
rejected with the same message everywhere: the file, the key path as the user wrote it
(``spotctl:jobs[2].capacity``), what was expected, and a "did you mean" for misspelled keys.

This package imports neither pulumi nor any cloud SDK: the CLI must start fast. Its modules, lowest
first: ``base`` (names, limits, small types), ``jobs`` (pools and jobs), ``sections`` (prices,
network, watcher), ``checks`` (rules across sections), ``stack`` (``StackConfig``) and ``reading``
(``validate``, ``namespaced``, the messages). Every name stays importable from here.
"""

from infra.basics import MAX_JOB_NODES, NAMESPACE, Capacity, ConfigError, JobState, own_events  # noqa: F401  (re-exported)
from infra.config.base import (  # noqa: F401
    MAX_ATTEMPT,
    MAX_COMMAND,
    MAX_ENV_VALUE,
    MAX_HOURS,
    NAME_RE,
    NAME_RULE,
    POLICY_NAMES,
    REGION_RE,
    RESERVED_ENV_NAMES,
    RESERVED_ENV_PREFIXES,
    SECRET_PLACEHOLDER,
    ZONE_RE,
    Name,
    NonEmpty,
    NonNegativeInt,
    PositiveInt,
    SecureValue,
    _bounded,
    _choice_message,
    _CrossErrors,
    _env_value,
    _Model,
    _no_nul,
    _show,
    env_value_problem,
    reserved_env_key,
    zone_in_region,
)
from infra.config.checks import (  # noqa: F401
    DEADLINE_POLICIES,
    _aws_network,
    _conversion_checks,
    _disk_kind_checks,
    _gcp_checks,
    _move_checks,
    _per_cloud,
    _regional_series,
    _replica_checks,
    _unique,
    _watcher_checks,
    policy_warnings,
    recorded_disk_kind,
)
from infra.config.jobs import (  # noqa: F401
    MOVE_STEPS,
    Accelerator,
    Job,
    Move,
    Pool,
    ZoneStay,
)
from infra.config.reading import (  # noqa: F401
    _TYPE_WORDS,
    _describe,
    _inner_model,
    _keys_of,
    _model_at,
    _path,
    _snake,
    _split,
    namespaced,
    provider_conflicts,
    validate,
)
from infra.config.sections import (  # noqa: F401
    ASG_MAX_INSTANCE_TYPES,
    AWS_EGRESS,
    AWS_KMS_RE,
    AWS_S3_ENDPOINT,
    BACKEND_RE,
    GCP_EGRESS,
    GCP_KMS_RE,
    GCP_SECRET_RE,
    GIT_REF_RE,
    MAX_PRICE_PER_HOUR,
    PULUMI_VERSION,
    REPO_RE,
    SSM_PARAMETER_RE,
    UV_VERSION,
    VERSION_RE,
    WATCHER_MACHINE,
    MachinePrice,
    Network,
    Watcher,
)
from infra.config.stack import (  # noqa: F401
    StackConfig,
)
