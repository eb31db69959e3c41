#!/usr/bin/python3
"""The boot tier's trainer: a step every STEP_S seconds, a checkpoint every CKPT_EVERY steps and on
SIGTERM (taking CKPT_S seconds), resumed from its checkpoint; STEPS steps in all, then exit 0.

It prints the lines spotctl follows (SPOTCTL_PROGRESS n, SPOTCTL_CHECKPOINT n) and tells the host
what happens when, on the second serial port (the host stamps each line as it arrives)."""

import json
import os
import signal
import sys
import time

CKPT_DIR = os.environ["SPOTCTL_CHECKPOINT_DIR"]
CKPT = os.path.join(CKPT_DIR, "ckpt.json")


def probe(line: str) -> None:
    try:
        with open("/dev/ttyS1", "w") as port:
            port.write(line + "\n")
    except OSError:
        pass


def save(step: int) -> None:
    with open(CKPT + ".tmp", "w") as fh:
        json.dump({"step": step, "saved_at": time.time()}, fh)
        fh.flush()
        os.fsync(fh.fileno())
    os.replace(CKPT + ".tmp", CKPT)
    # The rename on the disk too (a careful trainer's checkpoint): ext4 commits it up to 5 s later,
    # and the reset scenario comes as soon as the first checkpoint's event is in the bucket.
    fd = os.open(CKPT_DIR, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
    print(f"SPOTCTL_CHECKPOINT {step}", flush=True)


term = []
signal.signal(signal.SIGTERM, lambda *_: term.append(time.time()))
step = 0
if os.path.exists(CKPT):
    with open(CKPT) as fh:
        step = json.load(fh)["step"]
steps = int(os.environ.get("STEPS", "1000000"))
every = int(os.environ.get("CKPT_EVERY", "20"))
print(f"start step={step} resume={os.environ.get('SPOTCTL_RESUME', '0')}", flush=True)
probe(f"start {step} resume={os.environ.get('SPOTCTL_RESUME', '0')}")
while step < steps:
    if term:
        probe(f"term {step}")
        time.sleep(float(os.environ.get("CKPT_S", "2")))
        save(step)
        probe(f"saved {step}")
        sys.exit(143)
    step += 1
    if step % every == 0:  # (a line per checkpoint: an emulated CPU pays for every line logged)
        print(f"SPOTCTL_PROGRESS {step}", flush=True)
        save(step)
    time.sleep(float(os.environ.get("STEP_S", "0.1")))
save(step)
probe(f"done {step}")
print("done", flush=True)
