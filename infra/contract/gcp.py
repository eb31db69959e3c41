"""GCP rules (see ``infra.contract``). One ``@rule`` per rule the Compute Engine / GCS APIs enforce
on what spotctl declares, each citing its source; checks get the pulumi-gcp constructor inputs."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from infra.contract import UNKNOWN, rule

INSTANCE = "gcp:compute/instance:Instance"
INSTANCE_TEMPLATE = "gcp:compute/instanceTemplate:InstanceTemplate"
REGION_INSTANCE_TEMPLATE = "gcp:compute/regionInstanceTemplate:RegionInstanceTemplate"

METADATA_VALUE_LIMIT = 256 * 1024


@rule("gcp.metadata-value-256k", [INSTANCE, INSTANCE_TEMPLATE, REGION_INSTANCE_TEMPLATE],
      says="A Compute Engine metadata value is limited to 256 KB.",
      fix="keep startup/shutdown scripts and user values small (a long command belongs in a file on the job disk)",
      source="https://cloud.google.com/compute/docs/reference/rest/v1/Metadata (items[].value: \"must be less than or "
             "equal to 262144 bytes (256 KiB)\")")
def metadata_value_size(type_: str, props: Mapping[str, Any]) -> str | None:
    metadata = props.get("metadata")
    if not isinstance(metadata, Mapping):
        return None
    for key, value in metadata.items():
        if value is not None and value is not UNKNOWN and len(str(value).encode()) > METADATA_VALUE_LIMIT:
            return f"metadata {key!r} is {len(str(value).encode()):,} bytes (limit {METADATA_VALUE_LIMIT:,})"
    return None
