"""The watcher VM's startup script, executed: a sandbox where the network tools, git, package and user
management and systemd are stand-ins that record what they were asked, the GCP metadata server and
Secret Manager a local HTTP fake. What it installs, writes and enables is read back from the files."""

from __future__ import annotations

import base64
import io
import json
import os
import stat
import subprocess
import tarfile
import threading
from http.server import BaseHTTPRequestHandler, HTTPServer
from pathlib import Path

import pytest

from infra.render import WatcherContext, watcher_script

ROOT = Path(__file__).resolve().parent.parent
PASSPHRASE = "pa ss'\"$(reboot)\n"  # what a passphrase may hold; it must arrive byte for byte


def _exe(path: Path, text: str) -> None:
    path.write_text(text)
    path.chmod(path.stat().st_mode | stat.S_IXUSR | stat.S_IXGRP | stat.S_IXOTH)


def _tarball(path: Path, top: str, files: dict[str, str]) -> None:
    with tarfile.open(path, "w:gz") as tar:
        for name, text in files.items():
            data = text.encode()
            info = tarfile.TarInfo(f"{top}/{name}")
            info.size, info.mode = len(data), 0o755
            tar.addfile(info, io.BytesIO(data))


@pytest.fixture
def sandbox(tmp_path: Path) -> dict[str, Path]:
    stubs, downloads, log = tmp_path / "stubs", tmp_path / "downloads", tmp_path / "calls.log"
    stubs.mkdir()
    downloads.mkdir()
    _tarball(downloads / "uv-x86_64-unknown-linux-gnu.tar.gz", "uv-x86_64-unknown-linux-gnu",
             {"uv": f'#!/bin/bash\necho "uv $*" >>{log}\nmkdir -p "${{@: -1}}/.venv/bin"\n'})
    _tarball(downloads / "pulumi-v3.220.0-linux-x64.tar.gz", "pulumi", {"pulumi": "#!/bin/bash\necho pulumi\n"})
    repo = tmp_path / "repo"
    (repo / "examples").mkdir(parents=True)
    (repo / "examples" / "spotctl-watch@.service").write_text((ROOT / "examples" / "spotctl-watch@.service").read_text())
    # curl: serves https:// downloads from the local directory by file name; anything else is refused.
    _exe(stubs / "curl", f"""#!/bin/bash
echo "curl $*" >>{log}
out="" url=""
while [ $# -gt 0 ]; do case "$1" in -o) out=$2; shift 2;; https://*) url=$1; shift;; *) shift;; esac; done
[ -n "$url" ] && [ -n "$out" ] || exit 22
cp "{downloads}/${{url##*/}}" "$out"
""")
    _exe(stubs / "git", f"""#!/bin/bash
echo "git $*" >>{log}
if [ "$1" = clone ]; then cp -r {repo} "${{@: -1}}"; mkdir -p "${{@: -1}}/.git"; fi
""")
    for name in ("useradd", "chown", "systemctl", "apt-get"):
        _exe(stubs / name, f'#!/bin/bash\necho "{name} $*" >>{log}\n')
    _exe(stubs / "id", "#!/bin/bash\nexit 1\n")  # no such user yet
    _exe(stubs / "runuser", f'#!/bin/bash\necho "runuser $*" >>{log}\nshift 3\nexec "$@"\n')
    return {"root": tmp_path, "stubs": stubs, "log": log}


def _context(sandbox: dict[str, Path], cloud: str, **over) -> WatcherContext:
    root = sandbox["root"]
    base = dict(
        cloud=cloud, stack="team-a", region="us-central1" if cloud == "gcp" else "us-east-1", project="proj-1",
        repo="https://github.com/team/infra.git", ref="main", backend=f"{'gs' if cloud == 'gcp' else 's3'}://team-state/pulumi",
        secrets_provider="passphrase", passphrase_secret="pulumi-passphrase" if cloud == "gcp" else "/spotctl/team-a/pass",
        pulumi_version="3.220.0", uv_version="0.13.9", project_dir=str(root / "opt" / "spotctl"),
        pulumi_root=str(root / "opt" / "pulumi"), bin_dir=str(root / "usr" / "local" / "bin"), etc_dir=str(root / "etc" / "spotctl"),
        systemd_dir=str(root / "etc" / "systemd" / "system"), home=str(root / "home" / "spotctl"),
    )
    return WatcherContext(**{**base, **over})


def _run(sandbox: dict[str, Path], script: str) -> subprocess.CompletedProcess:
    path = sandbox["root"] / "startup.sh"
    path.write_text(script)
    env = {k: v for k, v in os.environ.items() if "proxy" not in k.lower()}
    env["PATH"] = f"{sandbox['stubs']}:{os.environ['PATH']}"
    return subprocess.run(["bash", str(path)], capture_output=True, text=True, env=env, timeout=60)


class _FakeGoogle(BaseHTTPRequestHandler):
    def do_GET(self):  # noqa: N802 - http.server's name
        if self.path == "/instance/service-accounts/default/token" and self.headers.get("Metadata-Flavor") == "Google":
            body = {"access_token": "tok-1", "expires_in": 3600}
        elif (self.path == "/v1/projects/proj-1/secrets/pulumi-passphrase/versions/latest:access"
              and self.headers.get("Authorization") == "Bearer tok-1"):
            body = {"payload": {"data": base64.b64encode(PASSPHRASE.encode()).decode()}}
        else:
            self.send_error(403)
            return
        data = json.dumps(body).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, *args):
        pass


@pytest.fixture
def google():
    server = HTTPServer(("127.0.0.1", 0), _FakeGoogle)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_port}"
    server.shutdown()


def test_gcp_boot_installs_once_and_starts_the_shipped_unit(sandbox, google):
    root = sandbox["root"]
    ctx = _context(sandbox, "gcp", metadata_url=google, secrets_url=google)
    first = _run(sandbox, watcher_script(ctx))
    assert first.returncode == 0, first.stderr
    assert (root / "usr/local/bin/uv").exists() and (root / "opt/pulumi/bin/pulumi").exists()
    assert (root / "opt/spotctl/.git").is_dir()
    env = (root / "etc/spotctl/watch-team-a.env").read_text().splitlines()
    assert "PULUMI_BACKEND_URL=gs://team-state/pulumi" in env and "GOOGLE_CLOUD_PROJECT=proj-1" in env
    assert f"SPOTCTL_PULUMI_ROOT={root}/opt/pulumi" in env
    assert f"PULUMI_CONFIG_PASSPHRASE_FILE={root}/etc/spotctl/passphrase-team-a" in env
    passphrase = root / "etc/spotctl/passphrase-team-a"
    assert passphrase.read_bytes() == PASSPHRASE.encode() and stat.S_IMODE(passphrase.stat().st_mode) == 0o600
    unit = root / "etc/systemd/system/spotctl-watch@.service"
    assert unit.read_text() == (ROOT / "examples" / "spotctl-watch@.service").read_text()
    dropin = (root / "etc/systemd/system/spotctl-watch@.service.d/10-watcher-vm.conf").read_text()
    assert f"WorkingDirectory={root}/opt/spotctl" in dropin and f"ReadWritePaths={root}/opt/spotctl/.venv" in dropin
    calls = sandbox["log"].read_text()
    assert "systemctl enable --now spotctl-watch@team-a.service" in calls
    assert "useradd --system --create-home" in calls and "apt-get" not in calls
    assert f"uv sync --frozen --quiet --project {root}/opt/spotctl" in calls
    assert "git clone --quiet -- https://github.com/team/infra.git" in calls
    # A reboot: nothing downloaded or cloned again, the checkout (with the watcher's edits) kept.
    (root / "opt/spotctl/edited-by-the-watcher").write_text("x")
    sandbox["log"].write_text("")
    again = _run(sandbox, watcher_script(ctx))
    assert again.returncode == 0, again.stderr
    calls = sandbox["log"].read_text()
    assert "curl" not in calls and "git clone" not in calls and "systemctl enable --now" in calls
    assert (root / "opt/spotctl/edited-by-the-watcher").exists()


def test_aws_boot_reads_the_passphrase_through_the_project_python(sandbox):
    root = sandbox["root"]
    ctx = _context(sandbox, "aws")
    # The checkout's venv python (boto3 on the VM) stands in: it must be asked for exactly this parameter.
    stub_python = sandbox["stubs"] / "venv-python"
    _exe(stub_python, '#!/bin/bash\ncat >/dev/null\n[ "$2" = us-east-1 ] && [ "$3" = /spotctl/team-a/pass ] || exit 3\n'
         'printf %s "from-ssm"\n')
    script = watcher_script(ctx).replace('"$PROJECT_DIR/.venv/bin/python"', f'"{stub_python}"')
    result = _run(sandbox, script)
    assert result.returncode == 0, result.stderr
    assert (root / "etc/spotctl/passphrase-team-a").read_text() == "from-ssm"
    env = (root / "etc/spotctl/watch-team-a.env").read_text().splitlines()
    assert "AWS_REGION=us-east-1" in env and "PULUMI_BACKEND_URL=s3://team-state/pulumi" in env


def test_a_kms_stack_fetches_no_passphrase(sandbox):
    ctx = _context(sandbox, "aws", secrets_provider="awskms://1234abcd-12ab-34cd-56ef-1234567890ab", passphrase_secret="")
    result = _run(sandbox, watcher_script(ctx))
    assert result.returncode == 0, result.stderr
    env = (sandbox["root"] / "etc/spotctl/watch-team-a.env").read_text()
    assert "PASSPHRASE" not in env and not (sandbox["root"] / "etc/spotctl/passphrase-team-a").exists()


def test_a_failed_download_stops_the_boot_before_the_unit(sandbox):
    ctx = _context(sandbox, "aws", uv_version="9.9.9", uv_url="https://github.com/astral-sh/uv/releases/download/9.9.9/missing.tar.gz")
    result = _run(sandbox, watcher_script(ctx))
    assert result.returncode != 0
    assert "systemctl" not in sandbox["log"].read_text()


@pytest.mark.parametrize("cloud", ["gcp", "aws"])
def test_every_path_the_unit_must_write_exists_before_it_starts(sandbox, google, cloud):
    """systemd fails a unit at namespace setup (226/NAMESPACE) when a ReadWritePaths= path not prefixed
    with "-" is missing (systemd.exec(5)): the boot creates each one the shipped unit and the drop-in name."""
    root = sandbox["root"]
    over = {"metadata_url": google, "secrets_url": google} if cloud == "gcp" else {"secrets_provider": "awskms://k", "passphrase_secret": ""}
    ctx = _context(sandbox, cloud, **over)
    result = _run(sandbox, watcher_script(ctx))
    assert result.returncode == 0, result.stderr
    unit = (root / "etc/systemd/system/spotctl-watch@.service").read_text()
    dropin = (root / "etc/systemd/system/spotctl-watch@.service.d/10-watcher-vm.conf").read_text()
    # The shipped unit names the default home and checkout; this VM's are under the sandbox root.
    shipped = {"/home/spotctl": ctx.home, "/opt/spotctl": ctx.project_dir}
    paths = []
    for line in (unit + dropin).splitlines():
        if line.startswith("ReadWritePaths="):
            for path in line.removeprefix("ReadWritePaths=").split():
                for default, here in shipped.items():
                    path = here + path[len(default):] if path.startswith(default + "/") else path
                paths.append(path)
    missing = [p for p in paths if not p.startswith("-") and not Path(p).is_dir()]
    assert missing == [], missing
    assert len(paths) >= 5, paths  # the shipped unit's three, the venv, and this VM's home's two
    calls = sandbox["log"].read_text()
    assert f"chown spotctl: {ctx.home} {ctx.home}/.pulumi {ctx.home}/.cache {ctx.home}/.config {ctx.home}/.config/spotctl" in calls  # the unit's user writes them
