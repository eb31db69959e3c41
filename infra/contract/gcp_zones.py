"""Compute Engine's zones per region: a zone name the table does not list for a region it lists is refused
by ``spotctl validate`` (``infra.catalog``), as AWS's are. Pure Python."""

from __future__ import annotations

# `gcloud compute zones list` (NAME;REGION;STATUS), as exported by github.com/Cyclenerd/
# google-cloud-pricing-cost-calculator tools/zones.csv (@dac31281, the file of 2023-03-30, every zone UP);
# Google's own list: https://cloud.google.com/compute/docs/regions-zones#available. Regions newer than the export (africa-south1,
# asia-southeast3, europe-north2, europe-west10, me-central2, northamerica-south1) are not listed, so
# their zones are never refused. Values: the zone letters.
ZONES_SOURCE = ("gcloud compute zones list as exported in github.com/Cyclenerd/google-cloud-pricing-cost-calculator "
                "tools/zones.csv of 2023-03-30; https://cloud.google.com/compute/docs/regions-zones#available")
ZONES_DATE = "2023-03-30"

_LETTERS: dict[str, str] = {
    "asia-east1": "abc",
    "asia-east2": "abc",
    "asia-northeast1": "abc",
    "asia-northeast2": "abc",
    "asia-northeast3": "abc",
    "asia-south1": "abc",
    "asia-south2": "abc",
    "asia-southeast1": "abc",
    "asia-southeast2": "abc",
    "australia-southeast1": "abc",
    "australia-southeast2": "abc",
    "europe-central2": "abc",
    "europe-north1": "abc",
    "europe-southwest1": "abc",
    "europe-west1": "bcd",
    "europe-west12": "abc",
    "europe-west2": "abc",
    "europe-west3": "abc",
    "europe-west4": "abc",
    "europe-west6": "abc",
    "europe-west8": "abc",
    "europe-west9": "abc",
    "me-central1": "abc",
    "me-west1": "abc",
    "northamerica-northeast1": "abc",
    "northamerica-northeast2": "abc",
    "southamerica-east1": "abc",
    "southamerica-west1": "abc",
    "us-central1": "abcf",
    "us-east1": "bcd",
    "us-east4": "abc",
    "us-east5": "abc",
    "us-south1": "abc",
    "us-west1": "abc",
    "us-west2": "abc",
    "us-west3": "abc",
    "us-west4": "abc",
}

ZONES: dict[str, tuple[str, ...]] = {r: tuple(f"{r}-{c}" for c in letters) for r, letters in _LETTERS.items()}


def zones_of(region: str) -> tuple[str, ...] | None:
    """The zones of ``region``, or None when the table does not list it (then nothing is refused)."""
    return ZONES.get(region)
