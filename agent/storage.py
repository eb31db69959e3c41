"""The cloud's APIs with the VM's own identity: object reads and writes (S3 signed with SigV4 from the
instance role's IMDS credentials; GCS with the metadata server's token), the secret env payload (SSM,
Secret Manager) and, for AWS pools, Auto Scaling's scale-in protection. Every call has a deadline."""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import re
import socket
import time
import urllib.parse
from typing import Optional

from agent.config import Config
from agent.imds import Metadata


class Answer:
    def __init__(self, status: int, body: bytes):
        self.status, self.body = status, body

    @property
    def ok(self) -> bool:
        return 200 <= self.status < 300


def http(method: str, url: str, headers: dict[str, str], body: bytes, timeout: float) -> Optional[Answer]:
    """One request; None when it got no answer within ``timeout`` (a lost answer, a refused connection)."""
    if timeout <= 0:
        return None
    import urllib.error  # (here: the stop path signals the trainer before it needs HTTPS)
    import urllib.request

    req = urllib.request.Request(url, data=body if method in ("PUT", "POST") else None, method=method, headers=headers)
    try:
        with urllib.request.urlopen(req, timeout=timeout) as answer:
            return Answer(answer.status, answer.read())
    except urllib.error.HTTPError as e:
        return Answer(e.code, e.read() if e.fp else b"")
    except (urllib.error.URLError, OSError, socket.timeout, ValueError):
        return None


def quote(value: str, keep_slash: bool = False) -> str:
    return urllib.parse.quote(value, safe="/~" if keep_slash else "~")


class Cloud:
    """The VM's identity towards its bucket and APIs."""

    def __init__(self, cfg: Config, meta: Metadata):
        self.cfg, self.meta = cfg, meta
        self._creds: Optional[tuple[str, str, str]] = None
        self._creds_at = 0.0

    # ---- identity ----------------------------------------------------------------------------
    def gcp_token(self, timeout: float) -> Optional[str]:
        raw = self.meta.get("instance/service-accounts/default/token", timeout)
        try:
            return json.loads(raw or "")["access_token"] or None
        except (ValueError, KeyError, TypeError):
            return None

    def aws_creds(self, timeout: float) -> Optional[tuple[str, str, str]]:
        """The instance role's credentials, kept 5 minutes (IMDS renews them well before they expire)."""
        if self._creds and time.monotonic() - self._creds_at < 300:
            return self._creds
        deadline = time.monotonic() + timeout
        role = (self.meta.get("iam/security-credentials/", timeout) or "").split("\n")[0].strip()
        if not role:
            return None
        raw = self.meta.get("iam/security-credentials/" + role, deadline - time.monotonic())
        try:
            doc = json.loads(raw or "")
            creds = (doc["AccessKeyId"], doc["SecretAccessKey"], doc.get("Token", ""))
        except (ValueError, KeyError, TypeError):
            return None
        if not creds[0] or not creds[1]:
            return None
        self._creds, self._creds_at = creds, time.monotonic()
        return creds

    def aws_request(self, method: str, base: str, path: str, service: str, ctype: str, body: bytes,
                    timeout: float, target: str = "", query: str = "") -> Optional[Answer]:
        """One AWS API request signed with SigV4 (single chunk, signed payload):
        https://docs.aws.amazon.com/IAM/latest/UserGuide/create-signed-request.html"""
        deadline = time.monotonic() + timeout
        creds = self.aws_creds(timeout)
        if not creds:
            return None
        akid, secret, session = creds
        now = time.gmtime()
        amz_date, day = time.strftime("%Y%m%dT%H%M%SZ", now), time.strftime("%Y%m%d", now)
        host = urllib.parse.urlsplit(base).netloc
        payload_hash = hashlib.sha256(body).hexdigest()
        headers = {"host": host, "x-amz-content-sha256": payload_hash, "x-amz-date": amz_date}
        if session:
            headers["x-amz-security-token"] = session
        if target:
            headers["x-amz-target"] = target
        signed = ";".join(sorted(headers))
        canonical = "\n".join([method, path, query, "".join(f"{k}:{headers[k]}\n" for k in sorted(headers)),
                               signed, payload_hash])
        scope = f"{day}/{self.cfg.region}/{service}/aws4_request"
        to_sign = "\n".join(["AWS4-HMAC-SHA256", amz_date, scope, hashlib.sha256(canonical.encode()).hexdigest()])
        key = ("AWS4" + secret).encode()
        for part in (day, self.cfg.region, service, "aws4_request"):
            key = hmac.new(key, part.encode(), hashlib.sha256).digest()
        signature = hmac.new(key, to_sign.encode(), hashlib.sha256).hexdigest()
        send = {k: v for k, v in headers.items() if k != "host"}
        send["Content-Type"] = ctype
        send["Authorization"] = f"AWS4-HMAC-SHA256 Credential={akid}/{scope}, SignedHeaders={signed}, Signature={signature}"
        url = base.rstrip("/") + path + ("?" + query if query else "")
        return http(method, url, send, body, deadline - time.monotonic())

    # ---- objects -----------------------------------------------------------------------------
    def put_once(self, bucket: str, name: str, body: bytes, timeout: float, ctype: str = "application/json") -> bool:
        """Store object ``name``; True once it is known stored.

        GCS: only if no object has that name yet (ifGenerationMatch=0), and 412 Precondition Failed
        counts as stored: every name is written once, by this VM, so an object there is this upload,
        stored by an earlier try whose answer was lost. A plain retry would be an overwrite, which the
        VM's roles/storage.objectCreator refuses (replacing needs storage.objects.delete,
        https://cloud.google.com/storage/docs/access-control/iam-permissions; preconditions:
        https://cloud.google.com/storage/docs/request-preconditions).
        S3: a retry overwrites the same object, which s3:PutObject allows (the bucket has no Object Lock)."""
        deadline = time.monotonic() + timeout
        if self.cfg.cloud == "gcp":
            token = self.gcp_token(timeout)
            if not token:
                return False
            url = f"{self.cfg.storage_url}/upload/storage/v1/b/{quote(bucket)}/o?uploadType=media&ifGenerationMatch=0&name={quote(name)}"
            answer = http("POST", url, {"Authorization": "Bearer " + token, "Content-Type": ctype}, body,
                          deadline - time.monotonic())
            return answer is not None and (answer.ok or answer.status == 412)
        answer = self.aws_request("PUT", self.cfg.storage_url, f"/{quote(bucket)}/{quote(name, True)}", "s3",
                                  ctype, body, timeout)
        return answer is not None and answer.ok

    def get(self, uri: str, timeout: float) -> Optional[Answer]:
        """Read ``s3://B/K`` or ``gs://B/K`` with the VM's identity."""
        scheme, _, rest = uri.partition("://")
        bucket, _, name = rest.partition("/")
        deadline = time.monotonic() + timeout
        if scheme == "gs":
            token = self.gcp_token(timeout)
            if not token:
                return None
            url = f"{self.cfg.storage_url}/storage/v1/b/{quote(bucket)}/o/{quote(name)}?alt=media"
            return http("GET", url, {"Authorization": "Bearer " + token}, b"", deadline - time.monotonic())
        if scheme == "s3":
            return self.aws_request("GET", self.cfg.storage_url, f"/{quote(bucket)}/{quote(name, True)}", "s3",
                                    "application/octet-stream", b"", timeout)
        raise ValueError(f"not an s3:// or gs:// URI: {uri!r}")

    # ---- secrets -----------------------------------------------------------------------------
    def secret_payload(self, timeout: float) -> Optional[str]:
        """The job's secret payload (``KEY=<base64url> ...``), in memory only."""
        if self.cfg.cloud == "gcp":
            token = self.gcp_token(timeout)
            if not token:
                return None
            url = f"{self.cfg.secrets_url}/v1/{self.cfg.secret_ref}/versions/latest:access"
            answer = http("GET", url, {"Authorization": "Bearer " + token}, b"", timeout)
            try:
                return base64.b64decode(json.loads(answer.body)["payload"]["data"]).decode() if answer and answer.ok else None
            except (ValueError, KeyError, TypeError):
                return None
        body = json.dumps({"Name": self.cfg.secret_ref, "WithDecryption": True}).encode()
        answer = self.aws_request("POST", self.cfg.secrets_url, "/", "ssm", "application/x-amz-json-1.1", body, timeout,
                                  target="AmazonSSM.GetParameter")
        try:
            return json.loads(answer.body)["Parameter"]["Value"] if answer and answer.ok else None
        except (ValueError, KeyError, TypeError):
            return None

    # ---- pools (AWS) -------------------------------------------------------------------------
    def protect(self, instance: str, protected: bool) -> bool:
        """Scale-in protection of this instance in its Auto Scaling group (Query API)."""
        form = "application/x-www-form-urlencoded; charset=utf-8"
        body = f"Action=DescribeAutoScalingInstances&InstanceIds.member.1={quote(instance)}&Version=2011-01-01"
        answer = self.aws_request("POST", self.cfg.autoscaling_url, "/", "autoscaling", form, body.encode(), 10)
        found = re.search(rb"<AutoScalingGroupName>([^<]*)</AutoScalingGroupName>", answer.body) if answer and answer.ok else None
        if not found:
            return False
        body = ("Action=SetInstanceProtection&AutoScalingGroupName={}&InstanceIds.member.1={}&ProtectedFromScaleIn={}"
                "&Version=2011-01-01").format(quote(found.group(1).decode()), quote(instance), "true" if protected else "false")
        answer = self.aws_request("POST", self.cfg.autoscaling_url, "/", "autoscaling", form, body.encode(), 10)
        return answer is not None and answer.ok
