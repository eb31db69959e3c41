"""The instance metadata server: GCE's (``Metadata-Flavor: Google``) and EC2's IMDSv2 (a session
token first, https://docs.aws.amazon.com/AWSEC2/latest/UserGuide/configuring-instance-metadata-service.html).
Short timeouts: every caller has a budget."""

from __future__ import annotations

import socket
import time
import urllib.error
import urllib.request
from typing import Optional

from agent.config import Config
from agent.util import read, write_atomic


class Metadata:
    def __init__(self, cfg: Config):
        self.cfg = cfg
        self._token = ""
        self._token_at = 0.0

    def _open(self, req: urllib.request.Request, timeout: float) -> Optional[str]:
        try:
            with urllib.request.urlopen(req, timeout=max(0.1, timeout)) as answer:
                return answer.read().decode("utf-8", "replace")
        except (urllib.error.URLError, OSError, socket.timeout, ValueError):
            return None

    def _aws_token(self, timeout: float) -> Optional[str]:
        if self._token and time.monotonic() - self._token_at < 300:
            return self._token
        req = urllib.request.Request(self.cfg.metadata_url + "/latest/api/token", method="PUT",
                                     headers={"X-aws-ec2-metadata-token-ttl-seconds": "21600"})
        token = self._open(req, timeout)
        if token:
            self._token, self._token_at = token, time.monotonic()
        return token

    def get(self, path: str, timeout: float = 2.0) -> Optional[str]:
        """A metadata value (GCE: under computeMetadata/v1; AWS: under latest/meta-data), None when
        absent (AWS answers 404 for "no notice") or unreachable."""
        if self.cfg.cloud == "gcp":
            req = urllib.request.Request(f"{self.cfg.metadata_url}/{path}", headers={"Metadata-Flavor": "Google"})
            return self._open(req, timeout)
        start = time.monotonic()
        token = self._aws_token(timeout)
        if not token:
            return None
        req = urllib.request.Request(f"{self.cfg.metadata_url}/latest/meta-data/{path}",
                                     headers={"X-aws-ec2-metadata-token": token})
        return self._open(req, timeout - (time.monotonic() - start))


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
