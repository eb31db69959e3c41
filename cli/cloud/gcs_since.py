"""One folder of a GCS bucket listed from a cursor (the event readers' incremental listing)."""

from __future__ import annotations

from collections.abc import Mapping

from cli.cloud.gcp import _gcs, gcs_fetcher
from cli.cloud.types import Stored, bounded_reads


def gcs_stored_since(bucket: str, prefix: str, after: str | None, suffix: str, known: Mapping[str, str],
                     limit: int) -> tuple[list[Stored], list[str]]:
    """``Cloud.stored_since`` on GCS: objects.list with ``delimiter`` (sub-folders come back in
    ``prefixes``) and ``startOffset`` (names "lexicographically equal to or after startOffset": the
    cursor's own key is dropped here; cloud.google.com/storage/docs/json_api/v1/objects/list)."""
    session, base = _gcs(bucket)
    objects, folders, token = [], [], None
    while True:
        params = {"prefix": prefix, "delimiter": "/", **({"startOffset": after} if after else {}),
                  **({"pageToken": token} if token else {})}
        listing = session.get(base, params=params, timeout=30)
        listing.raise_for_status()
        body = listing.json()
        objects += [(i["name"], str(i.get("generation", "")), int(i.get("size", 0)))
                    for i in body.get("items", []) if i["name"] != after]
        folders += body.get("prefixes", [])
        token = body.get("nextPageToken")
        if not token:
            return bounded_reads(objects, suffix, known, limit, gcs_fetcher(session, base, limit)), folders
