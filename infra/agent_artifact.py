"""The VM agent as one file: a zipapp of the ``agent`` package (stdlib only), built reproducibly (fixed
timestamps, sorted names) so its sha256 changes only with its source. Infra uploads it to the stack's
bucket under that digest; every VM's bootstrap pins the digest it was rendered with."""

from __future__ import annotations

import hashlib
import io
import zipfile
from dataclasses import dataclass
from functools import cache
from pathlib import Path

import agent
from agent.schema import agent_object

AGENT_DIR = Path(agent.__file__).resolve().parent
_EPOCH = (1980, 1, 1, 0, 0, 0)
# Runs ``agent.main`` when Python is handed the archive (https://docs.python.org/3/library/zipapp.html).
_MAIN = b"import sys\nfrom agent.main import main\nsys.exit(main(sys.argv[1:]))\n"


@dataclass(frozen=True)
class Artifact:
    data: bytes
    sha256: str

    @property
    def object_name(self) -> str:
        return agent_object(self.sha256)


def sources() -> dict[str, bytes]:
    """{archive name: content} of every module the VM runs."""
    return {f"agent/{p.name}": p.read_bytes() for p in sorted(AGENT_DIR.glob("*.py"))}


@cache
def artifact() -> Artifact:
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w", zipfile.ZIP_DEFLATED) as zf:
        for name, data in [("__main__.py", _MAIN), *sorted(sources().items())]:
            info = zipfile.ZipInfo(name, _EPOCH)
            info.external_attr = 0o644 << 16
            info.compress_type = zipfile.ZIP_DEFLATED
            zf.writestr(info, data)
    data = buf.getvalue()
    return Artifact(data, hashlib.sha256(data).hexdigest())
