"""The EC2 user data a VM gets (the gzip of its bootstrap) against EC2's 16,384-byte limit, with the
longest realistic values: 4 nodes, a 300-flag command, 40 env values of 200 characters, a 4,000
character pool agent command, code delivery from an archive with setup, workdir and a container.

The bash scripts it replaced used 14.1-14.8 KB of the 16 KB (1.1-2.2 KB left): the agent itself
is now fetched, so the user data holds only the settings.

Run: uv run python bench/bootstrap_size.py
"""

from __future__ import annotations

import gzip
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from infra.render import ScriptContext, scripts_for  # noqa: E402

LIMIT = 16 * 1024


def contexts() -> dict[str, ScriptContext]:
    base = dict(cloud="aws", stack="team-a-research", event_bucket="spotctl-team-a-research-events-0123456789abcdef",
                region="ap-southeast-2", disk_device="/dev/disk/by-id/nvme-Amazon_Elastic_Block_Store_vol0123456789abcdef0",
                disk_aliases=("/dev/sdf", "/dev/xvdf"), capacity="spot", machine_type="p5.48xlarge")
    env = {f"VAR_{i:02d}": "v" * 200 for i in range(40)}
    return {
        "job, 4 nodes, long command and env": ScriptContext(
            **base, kind="job", name="llm-pretrain-" + "x" * 40, attempt=12, node_rank=3, world_size=4,
            master_addr="10.128.255.254", command="torchrun train.py " + " ".join(f"--flag-{i}=value-{i}" for i in range(300)),
            env=env, secret_keys=tuple(f"SECRET_{i}" for i in range(10)), secret_ref="/spotctl/team-a-research/llm/env",
            secrets_url="https://vpce-0fe5b17a0707d6abc-29p5708s.ssm.ap-southeast-2.vpce.amazonaws.com",
            code_uri="s3://spotctl-team-a-research-events-0123456789abcdef/team-a-research/llm/code/" + "a" * 64 + ".tar.gz",
            code_sha256="a" * 64, setup="python -m venv $SPOTCTL_MOUNT/venv && $SPOTCTL_MOUNT/venv/bin/pip install -r requirements.txt",
            workdir="src/training", container="nvcr.io/nvidia/pytorch:24.01-py3"),
        "pool, 4,000-character agent command": ScriptContext(
            **base, kind="pool", name="g5", command="agent " + "x" * 4000, env=env),
    }


def main() -> None:
    print(f"{'user data':38} {'raw B':>7} {'gzip B':>7} {'limit B':>8} {'left B':>7} {'used':>6}")
    for name, ctx in contexts().items():
        raw = scripts_for(ctx).user_data.encode()
        packed = len(gzip.compress(raw, mtime=0))
        print(f"{name:38} {len(raw):>7} {packed:>7} {LIMIT:>8} {LIMIT - packed:>7} {packed / LIMIT:>6.2f}")


if __name__ == "__main__":
    main()
