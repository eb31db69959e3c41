"""Generated GCP stacks of N jobs for the scale benchmarks (one shape, so only N varies)."""

from __future__ import annotations

from pathlib import Path

HEAD = """config:
  spotctl:cloud: gcp
  spotctl:project: bench-project
  spotctl:region: us-central1
  spotctl:zones: [us-central1-a, us-central1-b, us-central1-c]
  spotctl:jobs:
"""
JOB = """    - id: job-{i:04d}
      # a comment per job, kept by every edit
      machineType: g2-standard-8
      accelerator: {{type: nvidia-l4, count: 1}}
      diskGb: 200
      zone: us-central1-{zone}
      capacity: spot
      attempt: 2
      state: {state}
      command: python train.py --ckpt-dir "$SPOTCTL_CHECKPOINT_DIR"
"""


def write_stack(directory: Path, jobs: int, name: str = "bench") -> Path:
    """stacks/Pulumi.<name>.yaml with ``jobs`` jobs under ``directory`` (a Pulumi.yaml beside it)."""
    (directory / "stacks").mkdir(parents=True, exist_ok=True)
    (directory / "Pulumi.yaml").write_text("name: spotctl\nruntime: python\nmain: infra/\nstackConfigDir: stacks\n")
    body = "".join(JOB.format(i=i, zone="abc"[i % 3], state="running" if i % 2 else "preempted") for i in range(jobs))
    path = directory / "stacks" / f"Pulumi.{name}.yaml"
    path.write_text(HEAD + body)
    return path
