# The boot tier job's command: run from the unpacked code after its setup (or it fails the attempt).
[ -f setup-runs ] || { echo "setup-runs missing in $(pwd): setup did not run here first" >&2; exit 3; }
exec python3 /opt/spotctl-boot/trainer.py
