"""A reentrant training loop: the pattern to copy into your own training script.

Logistic regression on generated data, dependency-free. What makes it survive spot preemptions:

1. It keeps ALL training state in one checkpoint (weights, step): nothing else is needed to resume.
2. It checkpoints every --checkpoint-every steps AND when it receives SIGTERM (spotctl sends one
   SIGTERM at preemption and gives the trainer 20 s on GCP, 100 s on AWS).
3. It writes checkpoints atomically (temp file + rename), so a kill mid-write never corrupts one.
4. It resumes from the newest checkpoint when SPOTCTL_RESUME=1 (attempt 2 and later).
5. Its data order depends only on the step number, so a resumed run computes exactly what an
   uninterrupted run would: same final weights, bit for bit.
6. It prints `SPOTCTL_PROGRESS step/total` so `spotctl drill` can see how far it got.

The PyTorch equivalent of steps 1-4 is in the README ("Making a PyTorch script reentrant").

Run it under a simulated preemption, as a job with ``code: ./examples/quickstart`` runs it on a VM
(docs/guides/code.md):

  uv run spotctl drill --code examples/quickstart --setup "python3 -m venv .venv && \
      .venv/bin/python -m pip install -r requirements.txt" --verify -- .venv/bin/python train.py
"""

from __future__ import annotations

import argparse
import json
import math
import os
import random
import signal
import sys
import time

FEATURES = 8


def dataset(n: int = 512, seed: int = 7) -> list[tuple[list[float], int]]:
    rng = random.Random(seed)
    true_w = [rng.uniform(-2, 2) for _ in range(FEATURES)]
    rows = []
    for _ in range(n):
        x = [rng.gauss(0, 1) for _ in range(FEATURES)]
        rows.append((x, 1 if sum(a * b for a, b in zip(x, true_w, strict=False)) > 0 else 0))
    return rows


def sgd_step(w: list[float], data, step: int, lr: float, batch: int = 32) -> list[float]:
    # The batch is a function of the step only: resuming at step k sees exactly what step k would have.
    start = (step * batch) % len(data)
    grad = [0.0] * FEATURES
    for x, y in (data[(start + i) % len(data)] for i in range(batch)):
        p = 1 / (1 + math.exp(-sum(a * b for a, b in zip(x, w, strict=False))))
        for j in range(FEATURES):
            grad[j] += (p - y) * x[j] / batch
    return [wj - lr * gj for wj, gj in zip(w, grad, strict=False)]


def save_checkpoint(ckpt_dir: str, step: int, w: list[float]) -> None:
    os.makedirs(ckpt_dir, exist_ok=True)
    path = os.path.join(ckpt_dir, f"step-{step:08d}.json")
    with open(path + ".tmp", "w") as fh:
        json.dump({"step": step, "weights": w}, fh)
        fh.flush()
        os.fsync(fh.fileno())
    os.replace(path + ".tmp", path)  # atomic: a checkpoint is whole or absent
    print(f"SPOTCTL_CHECKPOINT {step}", flush=True)


def load_newest_checkpoint(ckpt_dir: str) -> tuple[int, list[float]] | None:
    if not os.path.isdir(ckpt_dir):
        return None
    names = sorted(n for n in os.listdir(ckpt_dir) if n.startswith("step-") and n.endswith(".json"))
    if not names:
        return None
    with open(os.path.join(ckpt_dir, names[-1])) as fh:
        state = json.load(fh)
    return state["step"], state["weights"]


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=600)
    parser.add_argument("--checkpoint-every", type=int, default=50)
    parser.add_argument("--step-seconds", type=float, default=0.004, help="simulated compute per step")
    parser.add_argument("--lr", type=float, default=0.5)
    args = parser.parse_args()

    workdir = os.environ.get("SPOTCTL_WORKDIR", ".")
    ckpt_dir = os.environ.get("SPOTCTL_CHECKPOINT_DIR", os.path.join(workdir, "checkpoints"))
    stop = {"requested": False}
    signal.signal(signal.SIGTERM, lambda *_: stop.update(requested=True))

    data = dataset()
    step, w = 0, [0.0] * FEATURES
    if os.environ.get("SPOTCTL_RESUME") == "1":
        found = load_newest_checkpoint(ckpt_dir)
        if found:
            step, w = found
            print(f"resuming from step {step}", flush=True)

    while step < args.steps:
        if stop["requested"]:
            save_checkpoint(ckpt_dir, step, w)  # preemption: save and leave; the next attempt resumes
            return 143
        w = sgd_step(w, data, step, args.lr)
        step += 1
        time.sleep(args.step_seconds)
        print(f"SPOTCTL_PROGRESS {step}/{args.steps}", flush=True)
        if step % args.checkpoint_every == 0:
            save_checkpoint(ckpt_dir, step, w)

    os.makedirs(os.path.join(workdir, "output"), exist_ok=True)
    with open(os.path.join(workdir, "output", "model.json"), "w") as fh:
        json.dump({"steps": step, "weights": w}, fh)
    print("training complete", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
