"""GCP list prices from the Cloud Billing Catalog's public Compute Engine SKUs."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

# Compute Engine's service in the catalog and how its SKUs name machine series and GPUs, as
# SkyPilot's catalog fetcher matches them (skypilot-org/skypilot sky/catalog/data_fetchers/fetch_gcp.py):
# a machine costs vCPUs x its series' "Core" SKU + GiB x its "Ram" SKU + GPUs x the GPU SKU, with
# usageType OnDemand or Preemptible (spot), in SKUs whose serviceRegions list the region.
# API shape: cloud.google.com/billing/v1/how-tos/catalog-api (unitPrice = units + nanos / 1e9).
GCE_SERVICE_ID = "6F81-5844-456A"
SERIES_SKU = {"a2": "A2 Instance", "a3": "A3 Instance", "g2": "G2 Instance", "n1": "N1 Predefined Instance",
              "n2": "N2 Instance", "n2d": "N2D AMD Instance", "c2": "Compute optimized", "c3": "C3 Instance", "e2": "E2 Instance"}
GPU_SKU = {"nvidia-tesla-a100": "A100 GPU", "nvidia-a100-80gb": "A100 80GB GPU", "nvidia-h100-80gb": "H100 80GB GPU",
           "nvidia-l4": "L4 GPU", "nvidia-tesla-t4": "T4 GPU", "nvidia-tesla-v100": "V100 GPU", "nvidia-tesla-p100": "P100 GPU"}
SKIPPED_SKUS = ("custom", "premium", "reserved", "sole tenancy", "commitment")


def compute_skus(endpoint: str | None = None) -> list[dict]:
    """Compute Engine's public SKUs (Cloud Billing Catalog; application-default credentials, or
    anonymously at ``endpoint``), without the ones no VM of ours is billed by."""
    if endpoint:
        import requests

        session: Any = requests.Session()
    else:
        import google.auth
        from google.auth.transport.requests import AuthorizedSession

        credentials, _ = google.auth.default(scopes=["https://www.googleapis.com/auth/cloud-billing.readonly"])
        session, endpoint = AuthorizedSession(credentials), "https://cloudbilling.googleapis.com"
    skus, token = [], None
    while True:
        got = session.get(f"{endpoint}/v1/services/{GCE_SERVICE_ID}/skus", params={"pageSize": 5000, **({"pageToken": token} if token else {})}, timeout=60)
        got.raise_for_status()
        body = got.json()
        skus += [s for s in body.get("skus", []) if s.get("category", {}).get("resourceFamily") == "Compute"
                 and s["category"].get("usageType") in ("OnDemand", "Preemptible")
                 and not any(word in s.get("description", "").lower() for word in SKIPPED_SKUS)]
        token = body.get("nextPageToken")
        if not token:
            return skus


def _unit_price(sku: dict) -> float:
    rate = sku["pricingInfo"][0]["pricingExpression"]["tieredRates"][0]["unitPrice"]
    return int(rate.get("units", 0) or 0) + rate.get("nanos", 0) / 1e9


def _sku_price(skus: list[dict], region: str, usage: str, group: str, words: str) -> float | None:
    for sku in skus:
        cat, desc = sku["category"], sku.get("description", "")
        if cat["usageType"] != usage or region not in sku.get("serviceRegions", []) or words.lower() not in desc.lower():
            continue
        if cat["resourceGroup"] == group or (cat["resourceGroup"] == "N1Standard" and {"CPU": "Core", "RAM": "Ram"}.get(group, "") in desc):
            return _unit_price(sku)
    return None


def machine_price(skus: list[dict], region: str, machine_type: str, vcpus: int, memory_gib: float,
                  gpus: list[tuple[str, int]], usage: str) -> float | None:
    """$/h of one machine type from its resources; None when a SKU is missing."""
    series = SERIES_SKU.get(machine_type.split("-")[0])
    if series is None:
        return None
    cpu, ram = _sku_price(skus, region, usage, "CPU", series), _sku_price(skus, region, usage, "RAM", series)
    if cpu is None or ram is None:
        return None
    total = cpu * vcpus + ram * memory_gib
    for gpu, count in gpus:
        unit = _sku_price(skus, region, usage, "GPU", GPU_SKU.get(gpu, f"{gpu} GPU"))
        if unit is None:
            return None
        total += unit * count
    return total


def gcp_prices(project: str, region: str, zone: str, machine_types: list[str], endpoint: str | None = None,
               billing_endpoint: str | None = None) -> dict[str, tuple[float, float, str]]:
    """{type: (spot, on-demand, source)}: each machine type's vCPUs, memory and GPUs from the Compute
    API (machineTypes.get in ``zone``), priced with the Cloud Billing Catalog's SKUs for ``region``."""

    from google.cloud import compute_v1

    kwargs: dict[str, Any] = {}
    if endpoint:
        from google.api_core.client_options import ClientOptions
        from google.auth.credentials import AnonymousCredentials

        kwargs = {"credentials": AnonymousCredentials(), "transport": "rest", "client_options": ClientOptions(api_endpoint=endpoint)}
    client = compute_v1.MachineTypesClient(**kwargs)
    skus = compute_skus(billing_endpoint)
    out = {}
    for name in machine_types:
        mt = client.get(project=project, zone=zone, machine_type=name)
        gpus = [(a.guest_accelerator_type, a.guest_accelerator_count) for a in mt.accelerators]
        args = (skus, region, name, mt.guest_cpus, mt.memory_mb / 1024, gpus)
        spot, od = machine_price(*args, usage="Preemptible"), machine_price(*args, usage="OnDemand")
        if spot is not None and od is not None:
            out[name] = (spot, od, f"GCP Cloud Billing Catalog, {datetime.now(UTC).date()}: SKUs for vCPU, memory and GPUs in {region}")
    return out
