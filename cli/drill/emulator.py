"""A local stand-in for the cloud around a VM, on 127.0.0.1: GCE metadata, AWS IMDSv2, the event
bucket (GCS JSON upload API and S3 PutObject with SigV4 checked), a job's secret env values (SSM
GetParameter with SigV4 checked; Secret Manager ``versions/latest:access`` with the VM's token) and,
for pool VMs, the Auto Scaling Query API (DescribeAutoScalingInstances, SetInstanceProtection; SigV4
checked).

Used by the tests and by ``spotctl drill``: the rendered scripts are pointed at it through their
``metadata_url``/``storage_url`` template variables. It can flip to "preempted"/"instance-action",
answer slowly, fail with 5xx, or (by stopping) be unreachable.
"""

from __future__ import annotations

import base64
import json
import re
import threading
import time
import urllib.parse
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from cli.drill.sigv4 import ACCESS_KEY, SECRET_KEY, SESSION_TOKEN, sigv4_ok

GCE_PREFIX = "/computeMetadata/v1/"
ROLE = "spotctl-instance-role"
GCS_TOKEN = "ya29.spotctl-emulator"
POWEROFF_PATH = "/spotctl-emulator/poweroff"


@dataclass
class Fault:
    """How a part of the emulator misbehaves: delay every answer and/or fail with a status."""

    delay_s: float = 0.0
    status: int | None = None


@dataclass
class Upload:
    bucket: str
    name: str
    body: dict[str, Any]
    received: float  # time.monotonic()


@dataclass
class State:
    instance: str = "vm-1"
    zone: str = "us-central1-a"
    preempted: bool = False
    maintenance_event: str = "NONE"
    attributes: dict[str, str] = field(default_factory=dict)  # GCE custom metadata (instance/attributes/<key>)
    instance_action: dict[str, str] | None = None
    rebalance: dict[str, str] | None = None
    metadata_fault: Fault = field(default_factory=Fault)
    sink_fault: Fault = field(default_factory=Fault)
    tokens: set[str] = field(default_factory=set)
    uploads: list[Upload] = field(default_factory=list)
    log_chunks: dict[str, bytes] = field(default_factory=dict)  # object name -> a chunk of a trainer log
    chunk_buckets: dict[str, str] = field(default_factory=dict)  # object name -> the bucket of its chunk
    # Other objects (a stack file's shared copy, ``spotctl sync``) by (bucket, name), and the generation
    # of every object written through the GCS upload API (for ifGenerationMatch).
    blobs: dict[tuple[str, str], bytes] = field(default_factory=dict)
    generations: dict[tuple[str, str], int] = field(default_factory=dict)
    rejected: list[str] = field(default_factory=list)
    # The next N bucket writes are carried out (stored, or refused) but never answered: the connection
    # closes, as when curl's --max-time runs out after the bucket kept the object.
    lose_answers: int = 0
    requests: list[tuple[str, str]] = field(default_factory=list)
    # Auto Scaling: the group the instance belongs to, and every SetInstanceProtection received
    # as (group, instance, protected).
    autoscaling_group: str = "spotctl-pool-asg"
    protection: list[tuple[str, str, bool]] = field(default_factory=list)
    # Secret env payloads by reference (SSM parameter name / Secret Manager secret name) and the
    # references read, in order.
    secrets: dict[str, str] = field(default_factory=dict)
    secret_reads: list[str] = field(default_factory=list)
    # Object downloads as (bucket, name, "vm" with the VM's token or signature, else "anonymous").
    downloads: list[tuple[str, str, str]] = field(default_factory=list)
    # Every power-off a VM asked for (the agent's self-stop): {"instance", "argv", "received"}.
    poweroffs: list[dict[str, Any]] = field(default_factory=list)


class _Server(ThreadingHTTPServer):
    daemon_threads = True

    def handle_error(self, request, client_address) -> None:
        # A client that gave up (its own timeout, a killed VM) is business as usual here.
        pass


class Emulator:
    """Start with ``with Emulator() as emu:``; ``emu.url`` is the base for metadata and storage."""

    def __init__(self) -> None:
        self.state = State()
        self._lock = threading.Lock()
        self._server: ThreadingHTTPServer | None = None
        self._thread: threading.Thread | None = None

    # -- lifecycle --------------------------------------------------------------------------------
    def start(self) -> Emulator:
        handler = _make_handler(self)
        self._server = _Server(("127.0.0.1", 0), handler)
        self._thread = threading.Thread(target=self._server.serve_forever, args=(0.05,), name="spotctl-emulator", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None

    def __enter__(self) -> Emulator:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    @property
    def port(self) -> int:
        assert self._server is not None
        return self._server.server_address[1]

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def metadata_url(self, cloud: str) -> str:
        return f"{self.url}/computeMetadata/v1" if cloud == "gcp" else self.url

    # -- what the cloud does ----------------------------------------------------------------------
    def preempt_gcp(self) -> float:
        """GCE marks the VM preempted; returns the monotonic time of the flip."""
        with self._lock:
            self.state.preempted = True
        return time.monotonic()

    def notice_aws(self, action: str = "terminate", lead_s: float = 120.0) -> float:
        """IMDS starts answering spot/instance-action with a stop/terminate time ``lead_s`` ahead."""
        when = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(time.time() + lead_s))
        with self._lock:
            self.state.instance_action = {"action": action, "time": when}
        return time.monotonic()

    def reset(self, **changes: Any) -> None:
        with self._lock:
            for key, value in changes.items():
                setattr(self.state, key, value)

    def put_object(self, bucket: str, name: str, data: bytes) -> None:
        """An object a VM reads with its identity (the agent, a job's code archive)."""
        with self._lock:
            self.state.blobs[(bucket, name)] = data

    @property
    def poweroff_url(self) -> str:
        return self.url + POWEROFF_PATH

    def events(self) -> list[dict[str, Any]]:
        with self._lock:
            return [u.body for u in self.state.uploads]

    def uploads(self) -> list[Upload]:
        with self._lock:
            return list(self.state.uploads)


def _is_shared_copy(name: str) -> bool:
    """``<stack>.spotctl/Pulumi.<stack>.yaml``: a stack file's shared copy (cli/lifecycle/sync.py), not an event."""
    return name.split("/", 1)[0].endswith(".spotctl")


def _make_handler(emu: Emulator):
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, *args: Any) -> None:  # quiet
            pass

        def _send(self, status: int, body: str | bytes = b"", ctype: str = "text/plain") -> None:
            if getattr(self, "mute", False):  # a lost answer (State.lose_answers)
                self.mute, self.close_connection = False, True
                return
            data = body.encode() if isinstance(body, str) else body
            try:
                self.send_response(status)
                self.send_header("Content-Type", ctype)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)
            except (BrokenPipeError, ConnectionResetError):
                pass  # the script gave up (its timeout): that is the point of a slow fault

        def _fault(self, which: str) -> bool:
            fault = emu.state.metadata_fault if which == "metadata" else emu.state.sink_fault
            if fault.delay_s:
                time.sleep(fault.delay_s)
            if fault.status:
                self._send(fault.status, "emulated failure")
                return True
            return False

        def _lose_answer(self) -> None:
            """Answer this bucket write with nothing when State.lose_answers says so."""
            with emu._lock:
                if emu.state.lose_answers > 0:
                    emu.state.lose_answers -= 1
                    self.mute = True

        def _body(self) -> bytes:
            length = int(self.headers.get("Content-Length") or 0)
            return self.rfile.read(length) if length else b""

        def do_GET(self) -> None:
            emu.state.requests.append(("GET", self.path))
            url = urllib.parse.urlsplit(self.path)
            path = url.path
            if (self.headers.get("Authorization") or "").startswith("AWS4-HMAC-SHA256 "):
                self._s3_read()
            elif path.startswith("/storage/v1/b/"):
                self._gcs_read(path, urllib.parse.parse_qs(url.query))
            elif path.startswith("/v1/projects/") and path.endswith("/versions/latest:access"):
                self._secret_access(path[len("/v1/") : -len("/versions/latest:access")])
            elif path.startswith(GCE_PREFIX):
                if self._fault("metadata"):
                    return
                self._gce(path[len(GCE_PREFIX) :])
            elif path.startswith("/latest/meta-data/"):
                if self._fault("metadata"):
                    return
                self._imds(path[len("/latest/meta-data/") :])
            else:
                self._send(404, "not found")

        def do_PUT(self) -> None:
            emu.state.requests.append(("PUT", self.path))
            body = self._body()
            if self.path == "/latest/api/token":
                if self._fault("metadata"):
                    return
                if not self.headers.get("X-aws-ec2-metadata-token-ttl-seconds"):
                    self._send(400, "missing ttl")
                    return
                token = f"token-{len(emu.state.tokens) + 1}"
                emu.state.tokens.add(token)
                self._send(200, token)
                return
            if self._fault("sink"):
                return
            self._lose_answer()
            headers = {k.lower(): v for k, v in self.headers.items()}
            if not sigv4_ok("PUT", self.path, headers, body):
                emu.state.rejected.append(self.path)
                self._send(403, "SignatureDoesNotMatch")
                return
            bucket, _, key = urllib.parse.unquote(urllib.parse.urlsplit(self.path).path).lstrip("/").partition("/")
            self._store(bucket, key, body)

        def do_POST(self) -> None:
            emu.state.requests.append(("POST", self.path))
            body = self._body()
            url = urllib.parse.urlsplit(self.path)
            if url.path == POWEROFF_PATH:
                with emu._lock:
                    emu.state.poweroffs.append({**json.loads(body or b"{}"), "received": time.monotonic()})
                self._send(200, "ok")
                return
            if url.path == "/" and self.headers.get("X-Amz-Target") == "AmazonSSM.GetParameter":
                self._ssm_get_parameter(body)
                return
            if url.path == "/":
                self._autoscaling(body)
                return
            if not url.path.startswith("/upload/storage/v1/b/"):
                self._send(404, "not found")
                return
            if self._fault("sink"):
                return
            self._lose_answer()
            bucket = urllib.parse.unquote(url.path[len("/upload/storage/v1/b/") :].split("/")[0])
            query = urllib.parse.parse_qs(url.query)
            name = query.get("name", [""])[0]
            # A VM's uploads carry its token; spotctl's own client (a shared stack file, ``spotctl sync``)
            # talks to a private endpoint anonymously (cli/cloud/gcp.py ``_gcs``).
            if self.headers.get("Authorization") != f"Bearer {GCS_TOKEN}" and not _is_shared_copy(name):
                emu.state.rejected.append(self.path)
                self._send(401, "bad token")
                return
            with emu._lock:  # ifGenerationMatch: 0 = no live object; else the current generation
                current = emu.state.generations.get((bucket, name), 0)
                if "ifGenerationMatch" in query and query["ifGenerationMatch"][0] != str(current):
                    self._send(412, json.dumps({"error": {"code": 412, "message": "conditionNotMet"}}), "application/json")
                    return
                if current and not _is_shared_copy(name):
                    # A VM's identity has roles/storage.objectCreator only: replacing an object needs
                    # storage.objects.delete too (cloud.google.com/storage/docs/access-control/iam-permissions).
                    emu.state.rejected.append(self.path)
                    self._send(403, json.dumps({"error": {"code": 403, "message": "does not have storage.objects.delete "
                                                          "access to the Google Cloud Storage object"}}), "application/json")
                    return
                emu.state.generations[(bucket, name)] = int(time.time() * 1e6) if not current else current + 1
            self._store(bucket, name, body)

        def _autoscaling(self, body: bytes) -> None:
            """The Auto Scaling Query API: DescribeAutoScalingInstances and SetInstanceProtection."""
            if self._fault("sink"):
                return
            headers = {k.lower(): v for k, v in self.headers.items()}
            if not sigv4_ok("POST", self.path, headers, body, service="autoscaling"):
                emu.state.rejected.append("autoscaling")
                self._send(403, "SignatureDoesNotMatch")
                return
            form = {k: v[0] for k, v in urllib.parse.parse_qs(body.decode()).items()}
            instance, group = form.get("InstanceIds.member.1", ""), emu.state.autoscaling_group
            xml = "text/xml"
            if form.get("Action") == "DescribeAutoScalingInstances":
                self._send(200, "<DescribeAutoScalingInstancesResponse><DescribeAutoScalingInstancesResult><AutoScalingInstances>"
                                f"<member><InstanceId>{instance}</InstanceId><AutoScalingGroupName>{group}</AutoScalingGroupName>"
                                "</member></AutoScalingInstances></DescribeAutoScalingInstancesResult></DescribeAutoScalingInstancesResponse>", xml)
            elif form.get("Action") == "SetInstanceProtection" and form.get("AutoScalingGroupName") == group:
                emu.state.protection.append((group, instance, form.get("ProtectedFromScaleIn") == "true"))
                self._send(200, "<SetInstanceProtectionResponse><SetInstanceProtectionResult/></SetInstanceProtectionResponse>", xml)
            else:
                self._send(400, f"<ErrorResponse><Error><Code>ValidationError</Code><Message>{form.get('Action')}</Message></Error></ErrorResponse>", xml)

        def _ssm_get_parameter(self, body: bytes) -> None:
            """SSM GetParameter (JSON protocol, X-Amz-Target signed): the payload of a SecureString."""
            if self._fault("sink"):
                return
            headers = {k.lower(): v for k, v in self.headers.items()}
            if not sigv4_ok("POST", self.path, headers, body, service="ssm") or "x-amz-target" not in \
                    headers.get("authorization", ""):
                emu.state.rejected.append("ssm")
                self._send(400, json.dumps({"__type": "InvalidSignatureException"}), "application/x-amz-json-1.1")
                return
            request = json.loads(body or b"{}")
            name = request.get("Name", "")
            with emu._lock:
                emu.state.secret_reads.append(name)
                value = emu.state.secrets.get(name)
            if value is None or request.get("WithDecryption") is not True:
                self._send(400, json.dumps({"__type": "ParameterNotFound"}), "application/x-amz-json-1.1")
                return
            # json.dumps escapes "/" never; AWS may (the scripts drop backslashes from base64url anyway).
            self._send(200, json.dumps({"Parameter": {"Name": name, "Type": "SecureString", "Value": value,
                                                      "Version": 1, "DataType": "text"}}), "application/x-amz-json-1.1")

        def _secret_access(self, name: str) -> None:
            """Secret Manager ``projects/P/secrets/S/versions/latest:access`` with the VM's token."""
            if self._fault("sink"):
                return
            if self.headers.get("Authorization") != f"Bearer {GCS_TOKEN}":
                emu.state.rejected.append("secretmanager")
                self._send(401, "bad token")
                return
            with emu._lock:
                emu.state.secret_reads.append(name)
                value = emu.state.secrets.get(name)
            if value is None:
                self._send(404, json.dumps({"error": {"code": 404, "status": "NOT_FOUND"}}), "application/json")
                return
            data = base64.b64encode(value.encode()).decode()
            # Pretty-printed over several lines, as Google's APIs answer.
            self._send(200, json.dumps({"name": f"{name}/versions/1", "payload": {"data": data, "dataCrc32c": "0"}},
                                       indent=2), "application/json")

        def _store(self, bucket: str, name: str, body: bytes) -> None:
            generation = emu.state.generations.get((bucket, name), 0)
            if _is_shared_copy(name):
                with emu._lock:
                    emu.state.blobs[(bucket, name)] = body
                self._send(200, json.dumps({"bucket": bucket, "name": name, "generation": str(generation)}), "application/json")
                return
            if "/logs/" in name:  # a chunk of the trainer's log (text), next to the events
                with emu._lock:
                    emu.state.log_chunks[name] = body
                    emu.state.chunk_buckets[name] = bucket
                self._send(200, json.dumps({"bucket": bucket, "name": name}), "application/json")
                return
            try:
                doc = json.loads(body)
            except json.JSONDecodeError:
                self._send(400, "not JSON")
                return
            with emu._lock:  # a second write of a name replaces the object (S3 PutObject overwrites)
                emu.state.uploads = [u for u in emu.state.uploads if (u.bucket, u.name) != (bucket, name)]
                emu.state.uploads.append(Upload(bucket, name, doc, time.monotonic()))
            self._send(200, json.dumps({"bucket": bucket, "name": name}), "application/json")

        def _s3_read(self) -> None:
            """S3 GetObject (signed): objects put with :meth:`Emulator.put_object` (the agent, code)."""
            headers = {k.lower(): v for k, v in self.headers.items()}
            if not sigv4_ok("GET", self.path, headers, b""):
                emu.state.rejected.append(self.path)
                self._send(403, "SignatureDoesNotMatch")
                return
            bucket, _, key = urllib.parse.unquote(urllib.parse.urlsplit(self.path).path).lstrip("/").partition("/")
            with emu._lock:
                data = emu.state.blobs.get((bucket, key))
                emu.state.downloads.append((bucket, key, "vm"))  # (signed: the instance role's credentials)
            self._send(404, "NoSuchKey") if data is None else self._send(200, data, "application/octet-stream")

        def _gcs_read(self, path: str, query: dict[str, list[str]]) -> None:
            """GCS JSON API reads: list objects (prefix) and download one (alt=media)."""
            bucket, _, rest = path[len("/storage/v1/b/"):].partition("/")
            bucket = urllib.parse.unquote(bucket)
            with emu._lock:  # event objects (JSON) and log chunks (bytes as uploaded)
                mine = {u.name: json.dumps(u.body).encode() for u in emu.state.uploads if u.bucket == bucket}
                mine.update({n: c for n, c in emu.state.log_chunks.items() if emu.state.chunk_buckets.get(n) == bucket})
                mine.update({n: c for (b, n), c in emu.state.blobs.items() if b == bucket})
                generations = {u.name: str(int(u.received * 1e6)) for u in emu.state.uploads if u.bucket == bucket}
                generations.update({n: str(g) for (b, n), g in emu.state.generations.items() if b == bucket})
            if rest == "o":  # items are object resources: name, size and generation as strings (JSON API objects.list)
                prefix = query.get("prefix", [""])[0]
                delimiter, start = query.get("delimiter", [""])[0], query.get("startOffset", [""])[0]
                names = [n for n in sorted(mine) if n.startswith(prefix) and n >= start]
                folders = sorted({prefix + n[len(prefix):].split(delimiter, 1)[0] + delimiter for n in names
                                  if delimiter and delimiter in n[len(prefix):]})
                items = [{"name": n, "bucket": bucket, "size": str(len(mine[n])), "generation": generations.get(n, "1")}
                         for n in names if not (delimiter and delimiter in n[len(prefix):])]
                self._send(200, json.dumps({"kind": "storage#objects", "items": items,
                                            **({"prefixes": folders} if folders else {})}), "application/json")
            elif rest.startswith("o/"):
                name = urllib.parse.unquote(rest[2:])
                if query.get("alt") == ["media"] and name in mine:
                    emu.state.downloads.append((bucket, name, "vm" if self.headers.get("Authorization") == f"Bearer {GCS_TOKEN}" else "anonymous"))
                wanted = query.get("generation", [None])[0]
                if name not in mine or (wanted is not None and wanted != generations.get(name)):
                    self._send(404, "no such object")
                elif query.get("alt") == ["media"]:
                    ranged = re.fullmatch(r"bytes=(\d+)-(\d+)", self.headers.get("Range") or "")
                    if ranged:  # a partial download (cloud.google.com/storage/docs/downloads)
                        self._send(206, mine[name][int(ranged[1]):int(ranged[2]) + 1], "application/octet-stream")
                    else:
                        self._send(200, mine[name], "application/octet-stream")
                else:  # the object's metadata
                    self._send(200, json.dumps({"bucket": bucket, "name": name, "generation": generations.get(name, "1")}),
                               "application/json")
            else:
                self._send(404, "not found")

        def _gce(self, rel: str) -> None:
            if self.headers.get("Metadata-Flavor") != "Google":
                self._send(403, "Missing Metadata-Flavor:Google header.")
                return
            s = emu.state
            answers = {
                "instance/preempted": "TRUE" if s.preempted else "FALSE",
                "instance/maintenance-event": s.maintenance_event,
                "instance/name": s.instance,
                "instance/zone": f"projects/123456789/zones/{s.zone}",
                "instance/service-accounts/default/token": json.dumps(
                    {"access_token": GCS_TOKEN, "expires_in": 3599, "token_type": "Bearer"}
                ),
            }
            if rel.startswith("instance/attributes/") and rel.removeprefix("instance/attributes/") in s.attributes:
                self._send(200, s.attributes[rel.removeprefix("instance/attributes/")])
            elif rel in answers:
                self._send(200, answers[rel])
            else:
                self._send(404, "not found")

        def _imds(self, rel: str) -> None:
            if self.headers.get("X-aws-ec2-metadata-token") not in emu.state.tokens:
                self._send(401, "Unauthorized")
                return
            s = emu.state
            if rel == "spot/instance-action":
                self._send(200, json.dumps(s.instance_action)) if s.instance_action else self._send(404, "Not Found")
            elif rel == "events/recommendations/rebalance":
                self._send(200, json.dumps(s.rebalance)) if s.rebalance else self._send(404, "Not Found")
            elif rel == "instance-id":
                self._send(200, s.instance)
            elif rel == "placement/availability-zone":
                self._send(200, s.zone)
            elif rel == "iam/security-credentials/":
                self._send(200, ROLE)
            elif rel == f"iam/security-credentials/{ROLE}":
                self._send(
                    200,
                    json.dumps(
                        {
                            "Code": "Success",
                            "Type": "AWS-HMAC",
                            "AccessKeyId": ACCESS_KEY,
                            "SecretAccessKey": SECRET_KEY,
                            "Token": SESSION_TOKEN,
                            "Expiration": "2099-01-01T00:00:00Z",
                        },
                        indent=2,
                    ),
                )
            else:
                self._send(404, "Not Found")

    return Handler
