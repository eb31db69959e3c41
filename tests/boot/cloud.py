"""The cloud around a booted guest: ``cli/drill/emulator.py``'s emulator (metadata, IMDSv2, the
event bucket) with what the guests' own agents also ask, served inside the test's namespace on
169.254.169.254:80 and, over TLS with the image's CA, on the public API names (dnsmasq points
them at the namespace's gateway).

- Google's guest agent and its script runner read GCE metadata recursively as JSON
  (``/computeMetadata/v1/?recursive=true&alt=json``, ``instance/attributes/?recursive=true``), the
  agent with ``wait_for_change`` and ETags (GoogleCloudPlatform/guest-agent 20211116.00:
  google_guest_agent/metadata.go, google_metadata_script_runner/main.go).
- cloud-init's Ec2 datasource takes an IMDSv2 token, then crawls ``/<version>/meta-data/``
  directory listings, ``/<version>/user-data`` and ``/<version>/dynamic/instance-identity/``
  (canonical/cloud-init 22.4.2: cloudinit/sources/DataSourceEc2.py, sources/helpers/ec2.py)."""

from __future__ import annotations

import hashlib
import json
import re
import ssl
import threading
import time
import urllib.parse
from pathlib import Path
from typing import Any

from cli.drill.emulator import GCE_PREFIX, ROLE, Emulator, _make_handler, _Server
from infra.agent_artifact import artifact
from tests.boot.netns import GATEWAY, METADATA_IP, Namespace, in_namespace

PROJECT_NUMBER = 123456789
IMDS_PATH = re.compile(r"^/(latest|\d{4}-\d{2}-\d{2})/(meta-data|user-data|dynamic)(/.*)?$")


class _TlsServer(_Server):
    """HTTPS: the handshake in the request's own thread, so a slow client holds up no other."""

    context: ssl.SSLContext

    def finish_request(self, request, client_address) -> None:
        super().finish_request(self.context.wrap_socket(request, server_side=True), client_address)


class GuestCloud(Emulator):
    """The emulator for one guest of ``cloud``; ``serve(ns, tls)`` starts it in the namespace."""

    def __init__(self, cloud: str, *, attributes: dict[str, str] | None = None, user_data: bytes = b"",
                 project: str = "my-ml-project", region: str = "", instance_type: str = "") -> None:
        super().__init__()
        self.cloud, self.user_data, self.project = cloud, user_data, project
        self.region, self.instance_type = region, instance_type
        self.state.attributes = dict(attributes or {})
        self._servers: list[_Server] = []

    def serve(self, ns: Namespace, tls: tuple[Path, Path]) -> GuestCloud:
        handler = _guest_handler(self)
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        context.load_cert_chain(*map(str, tls))

        def bind() -> list[_Server]:
            secure = _TlsServer((GATEWAY, 443), handler)
            secure.context = context
            return [_Server((METADATA_IP, 80), handler), secure]

        self._servers = in_namespace(ns.name, bind)
        for server in self._servers:
            threading.Thread(target=server.serve_forever, args=(0.05,), daemon=True, name="guest-cloud").start()
        return self

    def serve_agent(self, bucket: str) -> None:
        """The agent object the bootstrap fetches (GCS download or signed S3 GET, each at the path
        the plan rendered), as ``spotctl up`` uploads it to the stack's bucket."""
        agent = artifact()
        self.put_object(bucket, agent.object_name, agent.data)

    def serve_code(self, uri: str, data: bytes) -> None:
        """The job's code archive at the object the plan names (``gs://`` or ``s3://``), as
        ``spotctl launch`` uploads it."""
        bucket, key = uri.split("://", 1)[1].split("/", 1)
        self.put_object(bucket, key, data)

    def stop(self) -> None:
        for server in self._servers:
            server.shutdown()
            server.server_close()
        self._servers = []

    # -- what the guest's agents read ---------------------------------------------------------
    def gce_tree(self) -> dict[str, Any]:
        s = self.state
        return {
            "instance": {
                "attributes": dict(s.attributes), "hostname": f"{s.instance}.c.{self.project}.internal",
                "id": 4242424242, "name": s.instance, "zone": f"projects/{PROJECT_NUMBER}/zones/{s.zone}",
                "preempted": "TRUE" if s.preempted else "FALSE", "maintenanceEvent": s.maintenance_event,
                "networkInterfaces": [], "scheduling": {"preemptible": "TRUE", "onHostMaintenance": "TERMINATE"},
            },
            "project": {"projectId": self.project, "numericProjectId": PROJECT_NUMBER, "attributes": {}},
        }

    def imds_tree(self) -> dict[str, Any]:
        s = self.state
        tree: dict[str, Any] = {
            "ami-id": "ami-0spotctlboot", "instance-id": s.instance, "instance-type": self.instance_type,
            "hostname": "ip-10-77-0-10.ec2.internal", "local-hostname": "ip-10-77-0-10.ec2.internal",
            "placement": {"availability-zone": s.zone, "region": self.region},
            "iam": {"security-credentials": {}},
        }
        if s.instance_action:  # IMDS lists spot/ only while a notice is out
            tree["spot"] = {"instance-action": ""}
        return tree

    def identity(self) -> dict[str, Any]:
        s = self.state
        return {"accountId": "123456789012", "architecture": "x86_64", "availabilityZone": s.zone,
                "imageId": "ami-0spotctlboot", "instanceId": s.instance, "instanceType": self.instance_type,
                "privateIp": "10.77.0.10", "region": self.region, "version": "2017-09-30"}


def _etag(tree: dict[str, Any]) -> str:
    return hashlib.sha256(json.dumps(tree, sort_keys=True).encode()).hexdigest()[:16]


def _guest_handler(cloud: GuestCloud):
    base = _make_handler(cloud)

    class Handler(base):
        def _answer(self, status: int, body: bytes, ctype: str, headers: dict[str, str] | None = None) -> None:
            try:
                self.send_response(status)
                self.send_header("Content-Type", ctype)
                self.send_header("Content-Length", str(len(body)))
                for key, value in (headers or {}).items():
                    self.send_header(key, value)
                self.end_headers()
                self.wfile.write(body)
            except (BrokenPipeError, ConnectionResetError):
                pass

        def do_GET(self) -> None:
            url = urllib.parse.urlsplit(self.path)
            query = {k: v[-1] for k, v in urllib.parse.parse_qs(url.query).items()}
            if url.path.rstrip("/") + "/" == GCE_PREFIX or url.path.startswith(GCE_PREFIX):
                if self._gce_more(url.path[len(GCE_PREFIX):] if url.path.startswith(GCE_PREFIX) else "", query):
                    return
            elif IMDS_PATH.match(url.path):
                cloud.state.requests.append(("GET", self.path))
                self._imds_more(*IMDS_PATH.match(url.path).groups())
                return
            super().do_GET()

        def _gce_more(self, rel: str, query: dict[str, str]) -> bool:
            """Recursive reads and the keys the emulator has no answer for; False: the emulator's own."""
            if self.headers.get("Metadata-Flavor") != "Google":
                return False
            extra = {"project/project-id": cloud.project, "project/numeric-project-id": str(PROJECT_NUMBER),
                     "instance/id": "4242424242", "instance/hostname": cloud.gce_tree()["instance"]["hostname"]}
            if rel in extra:
                self._answer(200, extra[rel].encode(), "application/text")
                return True
            if query.get("recursive") != "true":
                return False
            cloud.state.requests.append(("GET", self.path))
            deadline = time.monotonic() + min(float(query.get("timeout_sec", "60")), 60)
            while True:
                tree = cloud.gce_tree()
                tag = _etag(tree)
                if query.get("wait_for_change") != "true" or query.get("last_etag") != tag or time.monotonic() > deadline:
                    break
                time.sleep(0.2)
            node: Any = tree
            for part in [p for p in rel.split("/") if p]:
                key = re.sub(r"-([a-z])", lambda m: m[1].upper(), part)
                node = node.get(key) if isinstance(node, dict) else None
                if node is None:
                    self._answer(404, b"not found", "text/html")
                    return True
            self._answer(200, json.dumps(node).encode(), "application/json", {"ETag": tag})
            return True

        def _imds_more(self, version: str, part: str, rest: str | None) -> None:
            if self.headers.get("X-aws-ec2-metadata-token") not in cloud.state.tokens:
                self._answer(401, b"Unauthorized", "text/plain")
                return
            rest = (rest or "").lstrip("/")
            if part == "user-data":
                if cloud.user_data:
                    self._answer(200, cloud.user_data, "application/octet-stream")
                else:
                    self._answer(404, b"Not Found", "text/plain")
                return
            if part == "dynamic":
                if rest.rstrip("/") == "instance-identity":
                    self._answer(200, b"document", "text/plain")
                elif rest == "instance-identity/document":
                    self._answer(200, json.dumps(cloud.identity(), indent=2).encode(), "text/plain")
                else:
                    self._answer(404, b"Not Found", "text/plain")
                return
            node: Any = cloud.imds_tree()
            for key in [p for p in rest.split("/") if p]:
                node = node.get(key) if isinstance(node, dict) else None
                if node is None:
                    break
            if isinstance(node, dict):  # a directory: its entries, subdirectories with a slash
                listing = "\n".join(f"{k}/" if isinstance(v, dict) else k for k, v in node.items())
                if rest.rstrip("/") == "iam/security-credentials":
                    listing = ROLE
                self._answer(200, listing.encode(), "text/plain")
                return
            if node not in (None, ""):
                self._answer(200, str(node).encode(), "text/plain")
                return
            # The emulator's own leaves: the notice, the role's credentials.
            self.path = f"/latest/meta-data/{rest}"
            base.do_GET(self)

    return Handler
