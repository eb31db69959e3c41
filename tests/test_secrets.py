"""Secrets in job env (docs/guides/secrets.md): `{secure: ...}` values as `pulumi config set --secret
--path` writes them are accepted, reach the VM through the cloud's secret store readable only by the
job's identity, and are never written in clear into the plan, the stack file or the scripts."""

from __future__ import annotations

import base64
import gzip
import hashlib
import json
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from cli.app import app
from cli.drill.emulator import Emulator
from cli.drill.localvm import LocalVM, local_context
from cli.lifecycle import stackfile
from cli.plan import mocks, tree
from infra import contract, secrets
from infra.config import ConfigError, validate
from infra.contract import ContractError
from infra.render import ScriptContext, bootstrap_config, read_secret_payload, secret_payload
from tests.conftest import AWS_BASE, GCP_BASE, ROOT, aws_job, gcp_job, pulumi_calls, stack_config

runner = CliRunner()
CIPHER = "v1:AAAAAAAAAAAAAAAAAbWVhbmluZ2xlc3MgY2lwaGVydGV4dA=="
# A value no part of spotctl may ever write down: quotes, $(...), a newline, non-ASCII, base64 chars.
CLEAR = "hf_S3cr3t 'q' \"d\" $(touch /tmp/pwned) `id` \n\u00e9+/=="
SECURE = {"secure": CIPHER}


def write_stack(project: Path, name: str, config: dict) -> Path:
    """A stack file as Pulumi writes one: the secret nested as {secure: ...} (YAML via json: valid YAML)."""
    path = project / "stacks" / f"Pulumi.{name}.yaml"
    path.write_text("# a comment that must survive\nconfig:\n" + "".join(
        f"  spotctl:{k}: {json.dumps(v)}\n" for k, v in config.items()))
    return path


def gcp_stack(**over):
    return stack_config(GCP_BASE, jobs=[
        gcp_job(env={"WANDB_PROJECT": "vit", "HF_TOKEN": SECURE}, **over),
        gcp_job(id="other", env={"API_KEY": SECURE}),
        gcp_job(id="plain", env={"X": "1"}),
    ], pools=[{"name": "l4", "machineType": "g2-standard-8", "spotMax": 2}])


def aws_stack(**over):
    return stack_config(AWS_BASE, jobs=[
        aws_job(env={"WANDB_PROJECT": "vit", "HF_TOKEN": SECURE}, **over),
        aws_job(id="other", env={"API_KEY": SECURE}),
        aws_job(id="plain", env={"X": "1"}),
    ], pools=[{"name": "g5", "instanceTypes": ["g5.xlarge"], "spotMax": 2}])


# ---- config ------------------------------------------------------------------------------------


def test_a_secure_env_value_validates_and_is_kept_as_ciphertext(project):
    path = write_stack(project, "s", gcp_stack())
    result = runner.invoke(app, ["validate", "--stack", "s"])
    assert result.exit_code == 0, result.output
    cfg = stackfile.load(stackfile.resolve("s", None))
    job = cfg.job("train")
    assert job.secret_keys == ("HF_TOKEN",) and job.plain_env == {"WANDB_PROJECT": "vit"}
    assert job.env["HF_TOKEN"].secure == CIPHER
    assert CIPHER in path.read_text()


@pytest.mark.parametrize("value,expect", [
    ({"secure": 5}, "must be a string or a Pulumi secret"),
    ({"secure": CIPHER, "other": "x"}, "must be a string or a Pulumi secret"),
    ({"secure": ""}, "must be a string or a Pulumi secret"),
    (["a"], "must be a string or a Pulumi secret"),
])
def test_a_malformed_secret_is_one_error_naming_the_key(project, value, expect):
    write_stack(project, "s", stack_config(GCP_BASE, jobs=[gcp_job(env={"HF_TOKEN": value})]))
    result = runner.invoke(app, ["validate", "--stack", "s"])
    assert result.exit_code == 1
    assert "spotctl:jobs[0].env" in result.output and expect in result.output, result.output
    assert "Traceback" not in result.output


def test_a_reserved_name_stays_reserved_as_a_secret():
    with pytest.raises(ConfigError, match=r"env key 'SPOTCTL_ATTEMPT' is reserved"):
        validate(stack_config(AWS_BASE, jobs=[aws_job(env={"SPOTCTL_ATTEMPT": SECURE})]), "s.yaml")


def test_only_env_values_may_be_secrets():
    raw = {"spotctl:jobs": [{"id": "a", "command": SECURE, "env": {"K": SECURE}}], "spotctl:labels": {"team": SECURE}}
    with pytest.raises(ConfigError) as err:
        secrets.markers(raw, "s.yaml")
    assert "spotctl:jobs[0].command: only a job's env values may be secrets" in str(err.value)
    assert "spotctl:labels.team" in str(err.value)
    assert secrets.markers({"spotctl:jobs": [{"id": "a", "env": {"K": SECURE, "P": "x"}}]}, "s") == {(0, "K"): CIPHER}


def test_the_engines_clear_values_are_taken_out_and_the_markers_put_back():
    file = {"spotctl:jobs": [{"id": "a", "env": {"K": SECURE, "P": "x"}}]}
    engine = {"jobs": [{"id": "a", "env": {"K": CLEAR, "P": "x"}}]}
    raw, clear = secrets.take_secrets(engine, file, "s.yaml")
    assert raw["jobs"][0]["env"] == {"K": SECURE, "P": "x"} and clear == {(0, "K"): CLEAR}
    assert engine["jobs"][0]["env"]["K"] == CLEAR  # the engine's map is not edited in place
    with pytest.raises(ConfigError, match="no decrypted string"):
        secrets.take_secrets({"jobs": [{"id": "a", "env": {"P": "x"}}]}, file, "s.yaml")
    with pytest.raises(ConfigError) as err:
        secrets.take_secrets({"jobs": [{"id": "a", "env": {"K": "bad\x00" + CLEAR, "P": "x"}}]}, file, "s.yaml")
    assert "NUL" in str(err.value) and CLEAR not in str(err.value)  # never the value in a message


@pytest.mark.parametrize("file_env", [{"P": "x"}, {"K": SECURE, "P": "changed"}, {"K": SECURE}])
def test_a_stack_file_that_does_not_match_the_engines_config_is_refused(file_env):
    """Guessing which values are secret could put one into a script: refuse instead."""
    engine = {"jobs": [{"id": "a", "env": {"K": CLEAR, "P": "x"}}]}
    with pytest.raises(ConfigError, match="cannot tell which env values are secrets") as err:
        secrets.take_secrets(engine, {"spotctl:jobs": [{"id": "a", "env": file_env}]}, "s.yaml")
    assert CLEAR not in str(err.value)


def test_a_secret_outside_the_jobs_env_is_refused_as_the_engine_hands_it_over():
    """The engine decrypts a secret in spotctl:pools too; the program must not use it in clear."""
    import pulumi

    from infra.program import read_config

    pulumi.runtime.set_all_config({"spotctl:cloud": "gcp", "spotctl:pools": json.dumps([{"agentCommand": CLEAR}])},
                                  ["spotctl:pools"])
    try:
        with pytest.raises(ConfigError, match=r"spotctl:pools holds a secret: only a job's env values") as err:
            read_config("sec")
        assert CLEAR not in str(err.value)
    finally:
        pulumi.runtime.set_all_config({}, [])


# ---- the program under the mocks, fed as the engine feeds it --------------------------------------


def engine_plan(project: Path, monkeypatch, cloud: str):
    """Plan the stack as `pulumi up` would run the program: clear values in spotctl:jobs (a secret
    key), the stack file in the project telling which were secrets. Returns (plan, payloads seen)."""
    config = gcp_stack() if cloud == "gcp" else aws_stack()
    write_stack(project, "sec", config)
    cfg = validate(config, "sec")
    seen: list[str] = []
    plain = mocks._plain

    def spy(value):
        from pulumi.runtime.rpc import is_rpc_secret, unwrap_rpc_secret

        if is_rpc_secret(value):
            seen.append(unwrap_rpc_secret(value))
        return plain(value)

    monkeypatch.setattr(mocks, "_plain", spy)
    plan = mocks.run(cfg, "sec", decrypted={(0, "HF_TOKEN"): CLEAR, (1, "API_KEY"): CLEAR + "2"})
    return plan, seen


def every_text_of(plan) -> str:
    """The serialized plan, the tree, and every script in it decoded (AWS user data is gzip+base64)."""
    texts = [plan.to_json(), tree.render(plan, width=200)]
    for r in plan.resources:
        if r.type == "aws:ec2/instance:Instance":
            texts.append(gzip.decompress(base64.b64decode(r.inputs["userDataBase64"])).decode())
        for key in ("startup-script", "shutdown-script"):
            if key in (r.inputs.get("metadata") or {}):
                texts.append(r.inputs["metadata"][key])
    return "\n".join(texts)


@pytest.mark.parametrize("cloud", ["gcp", "aws"])
def test_plan_holds_no_clear_secret_anywhere(project, monkeypatch, cloud):
    plan, seen = engine_plan(project, monkeypatch, cloud)
    text = every_text_of(plan)
    for needle in (CLEAR, CLEAR.split()[0], base64.urlsafe_b64encode(CLEAR.encode()).decode()):
        assert needle not in text
    assert "[secret]" in plan.to_json()
    # ... and yet the secret store got the real values, as a secret, once per job with secrets.
    payloads = [read_secret_payload(p) for p in seen if isinstance(p, str) and p.startswith(("HF_TOKEN=", "API_KEY="))]
    assert sorted(payloads, key=str) == sorted([{"HF_TOKEN": CLEAR}, {"API_KEY": CLEAR + "2"}], key=str)


def test_the_program_needs_the_stack_file_to_know_which_values_are_secrets(tmp_path, monkeypatch):
    cfg = validate(aws_stack(), "sec")
    monkeypatch.chdir(tmp_path)  # no Pulumi.yaml here: the program cannot tell
    monkeypatch.setattr(secrets, "find_stack_file", lambda stack, starts: None)
    with pytest.raises(Exception, match="stack file was not found"):
        mocks.run(cfg, "sec", decrypted={(0, "HF_TOKEN"): CLEAR})


def test_aws_one_parameter_per_job_readable_by_that_jobs_role_only(project, monkeypatch):
    plan, _ = engine_plan(project, monkeypatch, "aws")
    params = plan.by_type("aws:ssm/parameter:Parameter")
    assert [p.inputs["name"] for p in params] == ["/spotctl/sec/other/env", "/spotctl/sec/train/env"]
    assert all(p.inputs["type"] == "SecureString" and p.inputs["value"] == "[secret]" for p in params)
    policies = {r.name: json.loads(r.inputs["policy"]) for r in plan.by_type("aws:iam/rolePolicy:RolePolicy")}
    ssm = {name: p for name, p in policies.items() if "ssm:" in json.dumps(p)}
    assert sorted(ssm) == ["job-other-env-secret-policy", "job-train-env-secret-policy"]  # no pool, no plain job
    for job in ("train", "other"):
        (statement,) = ssm[f"job-{job}-env-secret-policy"]["Statement"]
        assert statement["Action"] == "ssm:GetParameter"
        assert statement["Resource"] == f"arn:aws:ssm:us-east-1:123456789012:parameter/spotctl/sec/{job}/env"
        role = plan.named(f"job-{job}-env-secret-policy").inputs["role"]
        assert role == plan.named(f"job-{job}-events-policy").inputs["role"]  # the job's own role
        vm = plan.named(f"job-{job}-n0-vm")
        assert plan.named(f"job-{job}-env-secret").urn in vm.dependencies
    assert plan.named("stack-ssm-endpoint").inputs["vpcEndpointType"] == "Interface"


def test_gcp_one_secret_per_job_readable_by_that_jobs_account_only(project, monkeypatch):
    plan, _ = engine_plan(project, monkeypatch, "gcp")
    ids = [s.inputs["secretId"] for s in plan.by_type("gcp:secretmanager/secret:Secret")]
    assert ids == ["spotctl-sec-other-env", "spotctl-sec-train-env"]
    versions = plan.by_type("gcp:secretmanager/secretVersion:SecretVersion")
    assert [v.inputs["secretData"] for v in versions] == ["[secret]", "[secret]"]
    readers = plan.by_type("gcp:secretmanager/secretIamMember:SecretIamMember")
    assert len(readers) == 2
    for job in ("train", "other"):
        reader = plan.named(f"job-{job}-env-secret-reader")
        account = plan.named(f"job-{job}-sa-account").inputs["accountId"]
        assert reader.inputs["role"] == "roles/secretmanager.secretAccessor"
        assert reader.inputs["member"] == f"serviceAccount:{account}@proj-1.iam.gserviceaccount.com"
        assert reader.inputs["secretId"] == f"spotctl-sec-{job}-env"
        assert plan.named(f"job-{job}-env-secret-version").urn in plan.named(f"job-{job}-n0-vm").dependencies
        script = plan.named(f"job-{job}-n0-vm").inputs["metadata"]["startup-script"]
        assert bootstrap_config(script)["secret_ref"] == f"projects/proj-1/secrets/spotctl-sec-{job}-env"


def test_plan_cli_shows_secret_placeholders(project):
    write_stack(project, "s", aws_stack())
    result = runner.invoke(app, ["plan", "--stack", "s"])
    assert result.exit_code == 0, result.output
    assert "/spotctl/s/train/env  SecureString  Standard  value [secret]" in result.output
    doc = json.loads(runner.invoke(app, ["plan", "--stack", "s", "--json"]).output)
    (param,) = [r for r in doc["resources"] if r["name"] == "job-train-env-secret"]
    assert param["inputs"]["value"] == "[secret]"


# ---- contract rules ------------------------------------------------------------------------------


@pytest.mark.parametrize("type_,rule,bad,good", [
    ("aws:ssm/parameter:Parameter", "aws.ssm-parameter-name", {"name": "/aws/x"}, {"name": "/spotctl/s/j/env"}),
    ("aws:ssm/parameter:Parameter", "aws.ssm-parameter-name", {"name": "/a b"}, {"name": "/a_b.c-d"}),
    ("aws:ssm/parameter:Parameter", "aws.ssm-parameter-name", {"name": "/" + "/".join("x" * 16)}, {"name": "/x/y"}),
    ("aws:ssm/parameter:Parameter", "aws.ssm-parameter-name", {"name": "/" + "x" * 1000}, {"name": "/" + "x" * 900}),
    ("aws:ssm/parameter:Parameter", "aws.ssm-parameter-value", {"value": CLEAR * 100, "tier": "Standard"},
     {"value": CLEAR * 100, "tier": "Advanced"}),
    ("aws:ssm/parameter:Parameter", "aws.ssm-parameter-value", {"value": CLEAR * 400, "tier": "Advanced"},
     {"value": CLEAR * 50}),
    ("gcp:secretmanager/secret:Secret", "gcp.secret-id", {"secret_id": "a.b"}, {"secret_id": "spotctl-s-j-env"}),
    ("gcp:secretmanager/secret:Secret", "gcp.secret-id", {"secret_id": "x" * 256}, {"secret_id": "x" * 255}),
    ("gcp:secretmanager/secretVersion:SecretVersion", "gcp.secret-payload-64k", {"secret_data": CLEAR * 3000},
     {"secret_data": CLEAR * 1000}),
])
def test_secret_store_rules(type_, rule, bad, good):
    with pytest.raises(ContractError, match=rule) as err:
        contract.check(type_, "job-x-env-secret", bad)
    assert CLEAR not in str(err.value)  # a rule never quotes a secret
    contract.check(type_, "job-x-env-secret", good)


# ---- the scripts: fetched at boot, exported to the trainer, never on disk --------------------------


def secret_vm(tmp_path: Path, emu: Emulator, cloud: str, values: dict[str, str], *, env=None, keys=None) -> tuple[LocalVM, Path]:
    ref = "/spotctl/team-a/train/env" if cloud == "aws" else "projects/p/secrets/spotctl-team-a-train-env"
    if values:
        emu.state.secrets[ref] = secret_payload(values)
    out = tmp_path / "seen.json"
    # The trainer writes hashes of what it sees, so the clear value itself is never on disk.
    probe = ("import hashlib, json, os; print(json.dumps({k: hashlib.sha256(os.environ[k].encode()).hexdigest() "
             "if k in os.environ else None for k in ['HF_TOKEN', 'API_KEY', 'PLAIN', 'SPOTCTL_ATTEMPT']}))")
    ctx = ScriptContext(
        cloud=cloud, stack="team-a", kind="job", name="train", event_bucket="b", region="us-east-1", attempt=2,
        command=f"{sys.executable} -c {json.dumps(probe)} > {out}", env=env or {"PLAIN": "p"},
        secret_keys=tuple(sorted(keys or values)), secret_ref=ref, poll_interval_s=1,
    )
    return LocalVM(local_context(ctx, emu, tmp_path / "disk", tmp_path / "state"), tmp_path / "vm"), out


def sha(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


def files_under(*roots: Path) -> bytes:
    return b"".join(p.read_bytes() for root in roots for p in sorted(root.rglob("*")) if p.is_file())


@pytest.mark.parametrize("cloud", ["gcp", "aws"])
def test_the_trainer_gets_its_secrets_and_no_file_holds_them(tmp_path, cloud):
    with Emulator() as emu:
        vm, out = secret_vm(tmp_path, emu, cloud, {"HF_TOKEN": CLEAR, "API_KEY": "k/+=="})
        assert vm.boot().returncode == 0
        assert vm.wait_exit("run.pid", 30), vm.debug_log()
        seen = json.loads(out.read_text())
        assert seen == {"HF_TOKEN": sha(CLEAR), "API_KEY": sha("k/+=="), "PLAIN": sha("p"), "SPOTCTL_ATTEMPT": sha("2")}
        assert [e["event"] for e in vm.events()] == ["started", "completed"]
        assert emu.state.secret_reads == [vm.ctx.secret_ref] and emu.state.rejected == []
        # Not in the script, the env file, the state dir, the job disk, events or uploaded logs.
        on_disk = files_under(tmp_path / "vm", tmp_path / "state", tmp_path / "disk")
        uploaded = json.dumps(emu.events()).encode() + b"".join(emu.state.log_chunks.values())
        for needle in (CLEAR.encode(), CLEAR.split()[0].encode(), base64.urlsafe_b64encode(CLEAR.encode())):
            assert needle not in on_disk and needle not in uploaded
        assert b"HF_TOKEN" in (tmp_path / "vm" / "startup.sh").read_bytes()  # only the name travels


@pytest.mark.parametrize("cloud", ["gcp", "aws"])
def test_a_payload_cannot_set_names_the_job_did_not_declare(tmp_path, cloud):
    with Emulator() as emu:
        vm, out = secret_vm(tmp_path, emu, cloud, {"HF_TOKEN": "t", "SPOTCTL_ATTEMPT": "999"}, keys=["HF_TOKEN"])
        vm.boot()
        assert vm.wait_exit("run.pid", 30), vm.debug_log()
        seen = json.loads(out.read_text())
        assert seen["HF_TOKEN"] == sha("t") and seen["SPOTCTL_ATTEMPT"] == sha("2")


@pytest.mark.parametrize("cloud", ["gcp", "aws"])
def test_an_unreadable_secret_fails_the_attempt_with_a_clear_reason(tmp_path, cloud):
    with Emulator() as emu:
        vm, out = secret_vm(tmp_path, emu, cloud, {}, keys=["HF_TOKEN"])  # the store has nothing
        vm.boot(env={"SPOTCTL_SECRET_WAIT_S": "1"})
        assert vm.wait_exit("run.pid", 30), vm.debug_log()
        assert not out.exists()  # the trainer never started
        assert [e["event"] for e in vm.events()] == ["started", "failed"]
        log = (tmp_path / "disk" / ".spotctl" / "logs" / "attempt-2-node-0.log").read_text()
        assert f"could not read the job's secret env values from {vm.ctx.secret_ref}" in log


# ---- the stack file and the drill ----------------------------------------------------------------


def test_editing_the_stack_file_keeps_the_secure_value_untouched(project, runner, fake_pulumi):
    path = project / "stacks" / "Pulumi.example-aws.yaml"
    text = path.read_text()
    anchor = "    - id: diffusion\n"
    path.write_text(text.replace(anchor, anchor + f"      env:\n        HF_TOKEN:\n          secure: {CIPHER}\n"))
    result = runner.invoke(app, ["resume", "diffusion", "--stack", "example-aws", "--yes"])
    assert result.exit_code == 0, result.output
    after = path.read_text()
    assert f"      env:\n        HF_TOKEN:\n          secure: {CIPHER}\n" in after
    assert after.count(CIPHER) == 1 and "# Example stack for a team on AWS" in after
    cfg = stackfile.load(stackfile.resolve("example-aws", None))
    assert cfg.job("diffusion").attempt == 3 and cfg.job("diffusion").secret_keys == ("HF_TOKEN",)
    (up,) = [c for c in pulumi_calls(fake_pulumi) if "up" in c]
    assert any(t.endswith("::job-diffusion-env-secret") for t in up)  # the secret goes with the job's update


def test_drill_of_a_job_with_a_secret_serves_a_placeholder(project, tmp_path):
    seen = tmp_path / "seen.txt"
    write_stack(project, "d", stack_config(AWS_BASE, jobs=[aws_job(
        id="tiny", env={"HF_TOKEN": SECURE, "PLAIN": "p"},
        command=f"printf '%s|%s' \"$HF_TOKEN\" \"$PLAIN\" > {seen}")]))
    result = runner.invoke(app, ["drill", "--stack", "d", "--job", "tiny", "--preempt-every", "60"])
    assert result.exit_code == 1  # not-exercised: it finished before any preemption
    assert "not-exercised" in result.output
    assert "secret env HF_TOKEN=[secret]: placeholders (a drill decrypts nothing" in result.output
    assert seen.read_text() == "[secret]|p"  # fetched through the emulated secret store


def test_payload_round_trip_uses_only_characters_json_never_escapes():
    values = {"B": CLEAR, "A": "", "C": "x" * 100}
    payload = secret_payload(values)
    assert read_secret_payload(payload) == values
    assert set(payload) <= set("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_= ")
    assert json.dumps(payload) == f'"{payload}"'


def test_the_secrets_guide_documents_secrets():
    text = (ROOT / "docs" / "guides" / "secrets.md").read_text()
    assert "# Secrets in env" in text and "pulumi config set --secret --path" in text
