"""The scripts a booted guest runs, from the real plan of the shipped example stacks: the stack's
settings as shipped, its jobs replaced by the tier's job (the example's single-node job with the
tier's trainer as its command), planned by ``spotctl plan``'s planner (Pulumi mocks), and taken out
of the planned VM exactly as the cloud would get them (GCE metadata; EC2's gzip user data)."""

from __future__ import annotations

import base64
import copy
import gzip
import re
from dataclasses import dataclass
from pathlib import Path

from cli.code.prepare import pack_directory
from cli.lifecycle.stackfile import namespaced, read_config, validate
from cli.plan import mocks as planner
from infra.render import bootstrap_config

ROOT = Path(__file__).resolve().parents[2]
STACKS = {"gcp": "example-gcp", "aws": "example-aws"}
EXAMPLE_JOB = {"gcp": "vit-finetune", "aws": "sweep-07"}
CODE = ROOT / "tests" / "boot" / "code"


@dataclass(frozen=True)
class VmPlan:
    cloud: str
    stack: str
    job: str
    attempt: int
    metadata: dict[str, str]  # GCE: the instance's metadata (startup-script, shutdown-script, ...)
    user_data: bytes  # EC2: what IMDS serves as user-data (the gzip the plan base64-encodes)
    script: str  # the startup bootstrap (GCE) or the user data's bootstrap (EC2)
    volume_serial: str  # EC2: the job volume's id without its dash (its NVMe serial)
    bucket: str
    region: str
    zone: str
    instance_type: str
    stop_budget_s: float  # what the agent gives the trainer between its SIGTERM and the stop's record
    code_uri: str  # the code archive's object (gs:// or s3://), as the plan tells the VM
    code: bytes  # the archive `spotctl launch` uploads there
    mount_point: str  # the job disk's, in the guest
    code_dir: str  # where the agent unpacks the code, relative to the job disk's root


def _config(cloud: str, job_id: str, env: dict[str, str], attempt: int, digest: str) -> dict:
    raw = read_config(ROOT / "stacks" / f"Pulumi.{STACKS[cloud]}.yaml")
    jobs = raw["spotctl:jobs"]
    job = copy.deepcopy(next(j for j in jobs if j["id"] == EXAMPLE_JOB[cloud]))
    # The job's code as `spotctl launch` packs it (tests/boot/code: its setup, then a command that
    # runs the image's trainer), the archive's digest recorded in the entry.
    job.update({"id": job_id, "code": CODE.relative_to(ROOT).as_posix(), "setup": "sh setup.sh", "command": "sh train.sh",
                "codeDigest": digest, "env": env, "attempt": attempt,
                "capacity": "spot", "state": "running"})
    job.pop("workdir", None)
    if cloud == "gcp":
        # No GPU in the guest: a CPU machine type, so the plan asks for no NVIDIA driver install
        # (the startup script would wait 20 minutes for nvidia-smi).
        job.pop("accelerator", None)
        job["machineType"] = "e2-standard-4"
    raw["spotctl:jobs"] = [job]
    raw["spotctl:pools"] = []
    return raw


def plan_vm(cloud: str, job_id: str, env: dict[str, str], attempt: int = 1) -> VmPlan:
    stack = STACKS[cloud]
    code = pack_directory(CODE, "the boot tier's code")
    cfg = validate(namespaced(_config(cloud, job_id, env, attempt, code.sha256), stack), stack)
    plan = planner.run(cfg, stack)
    vm = next(r for r in plan.resources if r.type.endswith(":Instance") and f"job-{job_id}-n0" in r.name)
    if cloud == "gcp":
        metadata = dict(vm.inputs["metadata"])
        script = metadata["startup-script"]
        user_data, serial = b"", ""
        zone, instance_type = vm.inputs["zone"], vm.inputs["machineType"]
    else:
        metadata = {}
        user_data = base64.b64decode(vm.inputs["userDataBase64"])
        script = gzip.decompress(user_data).decode()
        serial = re.fullmatch(r"/dev/disk/by-id/nvme-Amazon_Elastic_Block_Store_(\S+)",
                              str(bootstrap_config(script)["disk_device"]))[1]
        zone, instance_type = vm.inputs["availabilityZone"], vm.inputs["instanceType"]
    agent = bootstrap_config(script)
    return VmPlan(cloud, stack, job_id, attempt, metadata, user_data, script, serial, str(agent["event_bucket"]), cfg.region,
                  zone, instance_type, float(agent["stop_budget_s"]), str(agent["code_uri"]),
                  code.data, str(agent["mount_point"]), f"code/{agent['code_sha256']}")
