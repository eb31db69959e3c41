"""The instance metadata server: GCE's (``Metadata-Flavor: Google``) and EC2's IMDSv2 (a session
token first, https://docs.aws.amazon.com/AWSEC2/latest/UserGuide/configuring-instance-metadata-service.html).
Short timeouts: every caller has a budget."""

from __future__ import annotations

import socket
import time
from typing import Optional
from urllib.parse import urlsplit

from agent.config import Config
from agent.util import read, write_atomic


def plain_http(method: str, url: str, headers: dict[str, str], timeout: float) -> Optional[str]:
    """One plain-HTTP request to the metadata server, its body on a 2xx answer, else None. A socket
    and a few lines instead of urllib: the notice's way to the trainer's SIGTERM imports nothing heavy."""
    if timeout <= 0:
        return None
    parts = urlsplit(url)
    path = (parts.path or "/") + ("?" + parts.query if parts.query else "")
    lines = ["%s %s HTTP/1.0" % (method, path), "Host: %s" % parts.netloc, "Content-Length: 0"]
    lines += ["%s: %s" % kv for kv in headers.items()]
    deadline = time.monotonic() + timeout
    try:
        with socket.create_connection((parts.hostname, parts.port or 80), timeout=timeout) as sock:
            sock.sendall(("\r\n".join(lines) + "\r\n\r\n").encode("latin-1"))
            data = b""
            while True:
                sock.settimeout(max(0.01, deadline - time.monotonic()))
                chunk = sock.recv(65536)
                if not chunk:
                    break
                data += chunk
    except (OSError, ValueError, UnicodeError):
        return None
    head, _, body = data.partition(b"\r\n\r\n")
    status = head.split(b"\r\n", 1)[0].split()
    if len(status) < 2 or not status[1].startswith(b"2"):
        return None
    return body.decode("utf-8", "replace")


class Metadata:
    def __init__(self, cfg: Config):
        self.cfg = cfg
        self._token = ""
        self._token_at = 0.0

    def _aws_token(self, timeout: float) -> Optional[str]:
        if self._token and time.monotonic() - self._token_at < 300:
            return self._token
        token = plain_http("PUT", self.cfg.metadata_url + "/latest/api/token",
                           {"X-aws-ec2-metadata-token-ttl-seconds": "21600"}, timeout)
        if token:
            self._token, self._token_at = token, time.monotonic()
        return token

    def get(self, path: str, timeout: float = 2.0) -> Optional[str]:
        """A metadata value (GCE: under computeMetadata/v1; AWS: under latest/meta-data), None when
        absent (AWS answers 404 for "no notice") or unreachable."""
        if self.cfg.cloud == "gcp":
            return plain_http("GET", f"{self.cfg.metadata_url}/{path}", {"Metadata-Flavor": "Google"}, timeout)
        start = time.monotonic()
        token = self._aws_token(timeout)
        if not token:
            return None
        return plain_http("GET", f"{self.cfg.metadata_url}/latest/meta-data/{path}",
                          {"X-aws-ec2-metadata-token": token}, timeout - (time.monotonic() - start))


def identity(cfg: Config, meta: Metadata) -> tuple:
    """(instance name or id, zone), asked once per boot and kept in the state dir."""
    instance = (read(cfg.state("instance")) or "").strip()
    if not instance:
        if cfg.cloud == "gcp":
            instance = meta.get("instance/name") or socket.gethostname()
            zone = (meta.get("instance/zone") or "unknown").rsplit("/", 1)[-1]
        else:
            instance = meta.get("instance-id") or socket.gethostname()
            zone = meta.get("placement/availability-zone") or "unknown"
        write_atomic(cfg.state("zone"), zone)
        write_atomic(cfg.state("instance"), instance)
    zone = (read(cfg.state("zone")) or "unknown").strip() or "unknown"
    return instance, zone
