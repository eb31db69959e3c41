"""The emulator's check of AWS Signature Version 4, as AWS checks a request (single chunk, signed
payload), with the emulator's one set of instance-role credentials."""

from __future__ import annotations

import hashlib
import hmac

ACCESS_KEY = "AKIASPOTCTLEMULATOR"
SECRET_KEY = "spotctl-emulator-secret-key"
SESSION_TOKEN = "spotctl-emulator-session-token"


def sigv4_ok(method: str, raw_path: str, headers: dict[str, str], body: bytes, service: str = "s3") -> bool:
    """Check a SigV4 Authorization header the way AWS would (single-chunk, signed payload)."""
    expected_service = service
    auth = headers.get("authorization", "")
    if not auth.startswith("AWS4-HMAC-SHA256 "):
        return False
    parts = dict(p.strip().split("=", 1) for p in auth[len("AWS4-HMAC-SHA256 ") :].split(","))
    akid, day, region, service, term = parts["Credential"].split("/")
    if akid != ACCESS_KEY or service != expected_service or term != "aws4_request":
        return False
    payload_hash = hashlib.sha256(body).hexdigest()
    if headers.get("x-amz-content-sha256") != payload_hash:
        return False
    if headers.get("x-amz-security-token") != SESSION_TOKEN:
        return False
    signed = parts["SignedHeaders"].split(";")
    path, _, query = raw_path.partition("?")
    canonical = "\n".join(
        [method, path, query, "".join(f"{h}:{headers.get(h, '').strip()}\n" for h in signed), ";".join(signed), payload_hash]
    )
    amz_date = headers.get("x-amz-date", "")
    scope = f"{day}/{region}/{service}/{term}"
    to_sign = "\n".join(["AWS4-HMAC-SHA256", amz_date, scope, hashlib.sha256(canonical.encode()).hexdigest()])
    key = ("AWS4" + SECRET_KEY).encode()
    for part in (day, region, service, term):
        key = hmac.new(key, part.encode(), hashlib.sha256).digest()
    expected = hmac.new(key, to_sign.encode(), hashlib.sha256).hexdigest()
    return hmac.compare_digest(expected, parts["Signature"])
