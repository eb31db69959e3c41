"""A private repository: the VM clones the commit the entry records over HTTPS with the token of the
job's `secure:` env value (named by code.tokenEnv), sent as an HTTP header through git's environment.
The server is `git http-backend` behind a Basic-auth check on 127.0.0.1; the token is nowhere in the
job log, on the disk or in the events."""

from __future__ import annotations

import base64
import json
import subprocess
import sys
import threading
import urllib.parse
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from cli.drill.emulator import Emulator
from cli.drill.localvm import LocalVM, local_context
from infra.render import ScriptContext, secret_payload

TOKEN = "ghp_s3cr3t-token-for-the-test"
REF = "projects/p/secrets/spotctl-team-a-train-env"


class GitServer:
    """Smart HTTP git (git-http-backend(1) as a CGI) serving ``root``, refusing requests without the token."""

    def __init__(self, root: Path):
        self.root, self.refused, self.served = root, 0, 0
        server = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):
                pass

            def _serve(self):
                want = "Basic " + base64.b64encode(f"x-access-token:{TOKEN}".encode()).decode()
                if self.headers.get("Authorization") != want:
                    server.refused += 1
                    self.send_response(401)
                    self.send_header("WWW-Authenticate", 'Basic realm="git"')
                    self.send_header("Content-Length", "0")
                    self.end_headers()
                    return
                server.served += 1
                url = urllib.parse.urlsplit(self.path)
                body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                env = {"GIT_PROJECT_ROOT": str(server.root), "GIT_HTTP_EXPORT_ALL": "1", "PATH_INFO": url.path,
                       "QUERY_STRING": url.query, "REQUEST_METHOD": self.command, "REMOTE_USER": "x-access-token",
                       "CONTENT_TYPE": self.headers.get("Content-Type") or "", "CONTENT_LENGTH": str(len(body)),
                       "GIT_PROTOCOL": self.headers.get("Git-Protocol") or "", "PATH": "/usr/bin:/bin"}
                out = subprocess.run(["git", "http-backend"], input=body, env=env, capture_output=True, check=False).stdout
                head, _, payload = out.partition(b"\r\n\r\n")
                lines = head.decode().split("\r\n")
                status = next((int(line.split()[1]) for line in lines if line.startswith("Status:")), 200)
                self.send_response(status)
                for line in lines:
                    if ":" in line and not line.startswith("Status:"):
                        key, value = line.split(":", 1)
                        self.send_header(key, value.strip())
                self.send_header("Content-Length", str(len(payload)))
                self.end_headers()
                self.wfile.write(payload)

            do_GET = do_POST = _serve

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.httpd.server_address[1]}/repo.git"


@pytest.fixture
def repo(tmp_path):
    work = tmp_path / "work"
    git = ["git", "-c", "user.email=t@t", "-c", "user.name=t", "-C", str(work)]
    subprocess.run(["git", "init", "-q", str(work)], check=True)
    (work / "train.py").write_text("import os\nopen(os.environ['SPOTCTL_MOUNT'] + '/ran', 'w').write('private code')\n")
    subprocess.run([*git, "add", "."], check=True)
    subprocess.run([*git, "commit", "-qm", "one"], check=True)
    commit = subprocess.run([*git, "rev-parse", "HEAD"], capture_output=True, text=True, check=True).stdout.strip()
    subprocess.run(["git", "clone", "-q", "--bare", str(work), str(tmp_path / "srv" / "repo.git")], check=True)
    server = GitServer(tmp_path / "srv")
    yield server, commit
    server.httpd.shutdown()


def git_vm(tmp_path, emu, server, commit, secret: dict[str, str]) -> LocalVM:
    if secret:
        emu.state.secrets[REF] = secret_payload(secret)
    ctx = ScriptContext(cloud="gcp", stack="team-a", kind="job", name="train", event_bucket="b", region="r",
                        command=f"{sys.executable} train.py", code_git_url=server.url, code_git_commit=commit,
                        code_git_token_env="GH_TOKEN", secret_keys=("GH_TOKEN",), secret_ref=REF, poll_interval_s=1)
    return LocalVM(local_context(ctx, emu, tmp_path / "disk", tmp_path / "state"), tmp_path / "vm")


def run(vm: LocalVM) -> None:
    try:
        assert vm.boot(env={"SPOTCTL_CODE_WAIT_S": "5"}).returncode == 0
        assert vm.wait_exit("run.pid", 60), vm.debug_log()
    finally:
        vm.kill_all()


def test_a_private_repository_is_cloned_with_the_secure_env_token(tmp_path, repo):
    server, commit = repo
    with Emulator() as emu:
        vm = git_vm(tmp_path, emu, server, commit, {"GH_TOKEN": TOKEN})
        run(vm)
        assert [e["event"] for e in vm.events()][-1] == "completed", vm.debug_log()
        assert (vm.disk / "ran").read_text() == "private code" and server.served and not server.refused
        stored = b"".join(p.read_bytes() for root in (vm.disk, vm.state) for p in root.rglob("*")
                          if p.is_file() and "code" not in p.relative_to(root).parts[:1])
        assert TOKEN.encode() not in stored  # not in the log, the events or the state
        assert TOKEN not in json.dumps(emu.events())
        assert (vm.disk / "code" / commit / "train.py").exists()


def test_without_the_token_the_clone_fails_the_attempt_naming_the_job_and_code(tmp_path, repo):
    server, commit = repo
    with Emulator() as emu:
        vm = git_vm(tmp_path, emu, server, commit, {"GH_TOKEN": "wrong"})
        run(vm)
        (failed,) = [e for e in vm.events() if e["event"] == "failed"]
        assert failed["details"]["key"] == "code" and failed["details"]["reason"].startswith(f"job train: code git {server.url} at {commit}")
        assert server.refused and not server.served and not (vm.disk / "ran").exists()
        assert not (vm.disk / "code" / commit).exists()  # nothing half-written
        assert len(emu.state.poweroffs) == 1
