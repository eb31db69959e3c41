#!/bin/bash
# spotctl gcp shutdown bootstrap for a job (attempt 1, node 0 of 1).
# (No user value appears in a comment: quoting does not protect a comment from a newline.)
# Rendered by spotctl: fetches the VM agent pinned by its sha256 from the stack's bucket with this
# VM's own identity, checks the digest, and runs it with this VM's settings. A cached copy with the
# right digest is used as is: an agent upgraded in the bucket never reaches a running attempt.
# User values are single-quoted on purpose: they must never expand here.
# shellcheck disable=SC2016
set -uo pipefail
umask 022
SPOTCTL_STATE_DIR=/var/lib/spotctl
SPOTCTL_AGENT_SHA256=<agent-sha256>
SPOTCTL_METADATA_URL=http://metadata.google.internal/computeMetadata/v1
SPOTCTL_STORAGE_URL=https://storage.googleapis.com
SPOTCTL_AGENT_PATH='/storage/v1/b/team-a-events-4d8689f7/o/_spotctl%2Fagent%2F<agent-sha256>.pyz?alt=media'
SPOTCTL_CONFIG_JSON='{"attempt":1,"autoscaling_url":"https://autoscaling.us-central1.amazonaws.com","capacity":"spot","checkpoint_event_s":60,"cloud":"gcp","code_git_commit":"","code_git_token_env":"","code_git_url":"","code_sha256":"","code_uri":"","command":"python finetune.py --resume-from \"$SPOTCTL_CHECKPOINT_DIR\"","container":"","cwd":"","disk_aliases":[],"disk_device":"/dev/disk/by-id/google-spotctl-data","disk_wait_s":120,"env":{"WANDB_PROJECT":"vit runs"},"event_bucket":"team-a-events-4d8689f7","event_prefix":"team-a/","fstab":"/etc/fstab","kind":"job","machine_type":"g2-standard-8","master_addr":"127.0.0.1","master_port":29500,"metadata_url":"http://metadata.google.internal/computeMetadata/v1","mount_point":"/mnt/spotctl","name":"vit","node_rank":0,"notice_s":30,"poll_interval_s":5,"region":"us-central1","secret_keys":[],"secret_ref":"","secrets_url":"https://secretmanager.googleapis.com","setup":"","stack":"team-a","state_dir":"/var/lib/spotctl","stop_budget_s":20,"storage_url":"https://storage.googleapis.com","systemd_dir":"/etc/systemd/system","unit":"spotctl-job","workdir":"","world_size":1}'
agent="$SPOTCTL_STATE_DIR/agent-$SPOTCTL_AGENT_SHA256.pyz"

verified() { [ "$(sha256sum "$1" 2>/dev/null | cut -d' ' -f1)" = "$SPOTCTL_AGENT_SHA256" ]; }

fetch() {
  local token
  token=$(curl -sf --connect-timeout 2 --max-time 10 -H 'Metadata-Flavor: Google' \
    "$SPOTCTL_METADATA_URL/instance/service-accounts/default/token" |
    sed -n 's/.*"access_token"[[:space:]]*:[[:space:]]*"\([^"]*\)".*/\1/p') && [ -n "$token" ] || return 1
  curl -sf --connect-timeout 2 --max-time 60 -H "Authorization: Bearer $token" -o "$1" "$SPOTCTL_STORAGE_URL$SPOTCTL_AGENT_PATH"
}

mkdir -p "$SPOTCTL_STATE_DIR" && chmod 700 "$SPOTCTL_STATE_DIR" || exit 1
# A stop of the VM, a preemption or not: every stop path SIGTERMs the trainer first, so it gets it
# here, before Python starts (bench/agent_latency.py). Once per boot: the agent's signal_trainer
# claims the same marker (created exclusively, set -C), and `stopping` tells the run it is a stop.
if pid=$(cat "$SPOTCTL_STATE_DIR/trainer.pid" 2>/dev/null) && [ -n "$pid" ] && kill -0 -- "-$pid" 2>/dev/null; then
  : >"$SPOTCTL_STATE_DIR/stopping"
  # A leader that has exited (a zombie its run has not reaped yet) ended on its own: not claimed.
  state=$(sed 's/.*) //' "/proc/$pid/stat" 2>/dev/null | cut -d' ' -f1)
  if [ "$state" != Z ] && (set -C && : >"$SPOTCTL_STATE_DIR/signaled") 2>/dev/null; then kill -TERM -- "-$pid"; fi
fi
python=$(command -v python3) || { echo "spotctl: python3 (>= 3.8) is needed on the image" >&2; exit 1; }
run_dir="$SPOTCTL_STATE_DIR/agent-$SPOTCTL_AGENT_SHA256"
# Retried for 10 minutes at boot: a role or binding made in the same update can take minutes to
# apply. A stop path has seconds: it runs the agent the boot fetched, or nothing.
tries=0
until [ -f "$run_dir/__main__.py" ] || verified "$agent"; do
  if fetch "$agent.tmp" && verified "$agent.tmp"; then
    mv "$agent.tmp" "$agent"
  elif [ "$tries" -le 0 ]; then
    echo "spotctl: the agent $SPOTCTL_AGENT_SHA256 could not be fetched and verified from the bucket" >&2
    exit 1
  else
    tries=$((tries - 1))
    sleep 5
  fi
done
# Unpacked once from the verified archive and compiled: every later start (a stop path's above
# all) loads cached bytecode instead of compiling the archive's source.
if [ ! -f "$run_dir/__main__.py" ]; then
  rm -rf "$run_dir.tmp" && "$python" -E -S -m zipfile -e "$agent" "$run_dir.tmp" &&
    "$python" -E -S -m compileall -q "$run_dir.tmp" >/dev/null && mv "$run_dir.tmp" "$run_dir" || exit 1
fi
printf '%s' "$SPOTCTL_CONFIG_JSON" >"$SPOTCTL_STATE_DIR/config.json.tmp" && mv "$SPOTCTL_STATE_DIR/config.json.tmp" "$SPOTCTL_STATE_DIR/config.json"
# -E -S: the standard library only, whatever PYTHON* variables or site-packages the image has
# (not -I: from 3.11 it leaves the script's own directory out of sys.path).
SPOTCTL_CONFIG="$SPOTCTL_STATE_DIR/config.json" exec "$python" -E -S "$run_dir/__main__.py" "${1:-shutdown}"
