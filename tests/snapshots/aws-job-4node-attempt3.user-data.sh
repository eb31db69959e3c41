#!/bin/bash
# spotctl aws main bootstrap for a job (attempt 3, node 2 of 4).
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
SPOTCTL_METADATA_URL=http://169.254.169.254
SPOTCTL_STORAGE_URL=https://s3.us-east-1.amazonaws.com
SPOTCTL_REGION=us-east-1
SPOTCTL_AGENT_PATH=/team-a-events-4d8689f7/_spotctl/agent/<agent-sha256>.pyz
SPOTCTL_CONFIG_JSON='{"attempt":3,"autoscaling_url":"https://autoscaling.us-east-1.amazonaws.com","capacity":"on-demand","checkpoint_event_s":60,"cloud":"aws","code_git_commit":"","code_git_token_env":"","code_git_url":"","code_sha256":"","code_uri":"","command":"torchrun --nnodes \"$WORLD_SIZE\" --node-rank \"$NODE_RANK\" train.py","container":"","cwd":"","disk_aliases":[],"disk_device":"/dev/disk/by-id/nvme-Amazon_Elastic_Block_Store_vol0123456789abcdef0","disk_wait_s":600,"env":{},"event_bucket":"team-a-events-4d8689f7","event_prefix":"team-a/","fstab":"/etc/fstab","kind":"job","machine_type":"p5.48xlarge","master_addr":"10.128.0.42","master_port":29500,"metadata_url":"http://169.254.169.254","mount_point":"/mnt/spotctl","name":"llm","node_rank":2,"notice_s":120,"poll_interval_s":5,"region":"us-east-1","secret_keys":["HF_TOKEN","WANDB_API_KEY"],"secret_ref":"/spotctl/team-a/llm/env","secrets_url":"https://ssm.us-east-1.amazonaws.com","setup":"","stack":"team-a","state_dir":"/var/lib/spotctl","stop_budget_s":100,"storage_url":"https://s3.us-east-1.amazonaws.com","systemd_dir":"/etc/systemd/system","unit":"spotctl-job","workdir":"","world_size":4}'
agent="$SPOTCTL_STATE_DIR/agent-$SPOTCTL_AGENT_SHA256.pyz"

verified() { [ "$(sha256sum "$1" 2>/dev/null | cut -d' ' -f1)" = "$SPOTCTL_AGENT_SHA256" ]; }

# An S3 GET signed with SigV4 (curl and openssl only) with the instance role's IMDSv2 credentials:
# https://docs.aws.amazon.com/IAM/latest/UserGuide/create-signed-request.html
fetch() {
  local token role creds akid secret session amz_date day host empty canonical scope k sig
  imds() { curl -sf --connect-timeout 2 --max-time 5 -H "X-aws-ec2-metadata-token: $token" "$SPOTCTL_METADATA_URL/latest/meta-data/$1"; }
  field() { sed -n "s/.*\"$1\"[[:space:]]*:[[:space:]]*\"\\([^\"]*\\)\".*/\\1/p" | head -n 1; }
  hmac() { printf '%s' "$2" | openssl dgst -sha256 -mac HMAC -macopt "$1" | sed 's/^.*= *//'; }
  token=$(curl -sf --connect-timeout 2 --max-time 5 -X PUT -H 'X-aws-ec2-metadata-token-ttl-seconds: 300' \
    "$SPOTCTL_METADATA_URL/latest/api/token") || return 1
  role=$(imds iam/security-credentials/ | head -n 1) && creds=$(imds "iam/security-credentials/$role" | tr -d '\n') || return 1
  akid=$(printf '%s' "$creds" | field AccessKeyId) secret=$(printf '%s' "$creds" | field SecretAccessKey)
  session=$(printf '%s' "$creds" | field Token)
  amz_date=$(date -u +%Y%m%dT%H%M%SZ) day=${amz_date%%T*} host=${SPOTCTL_STORAGE_URL#*://}
  empty=e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855
  canonical=$(printf 'GET\n%s\n\nhost:%s\nx-amz-content-sha256:%s\nx-amz-date:%s\nx-amz-security-token:%s\n\n%s\n%s' \
    "$SPOTCTL_AGENT_PATH" "${host%%/*}" "$empty" "$amz_date" "$session" "host;x-amz-content-sha256;x-amz-date;x-amz-security-token" "$empty")
  scope="$day/$SPOTCTL_REGION/s3/aws4_request"
  k=$(hmac "key:AWS4$secret" "$day") && k=$(hmac "hexkey:$k" "$SPOTCTL_REGION") && k=$(hmac "hexkey:$k" s3) &&
    k=$(hmac "hexkey:$k" aws4_request) || return 1
  sig=$(hmac "hexkey:$k" "$(printf 'AWS4-HMAC-SHA256\n%s\n%s\n%s' "$amz_date" "$scope" "$(printf '%s' "$canonical" | sha256sum | cut -d' ' -f1)")")
  curl -sf --connect-timeout 2 --max-time 60 -o "$1" -H "x-amz-date: $amz_date" -H "x-amz-content-sha256: $empty" \
    -H "x-amz-security-token: $session" \
    -H "Authorization: AWS4-HMAC-SHA256 Credential=$akid/$scope, SignedHeaders=host;x-amz-content-sha256;x-amz-date;x-amz-security-token, Signature=$sig" \
    "$SPOTCTL_STORAGE_URL$SPOTCTL_AGENT_PATH"
}

mkdir -p "$SPOTCTL_STATE_DIR" && chmod 700 "$SPOTCTL_STATE_DIR" || exit 1
python=$(command -v python3) || { echo "spotctl: python3 (>= 3.8) is needed on the image" >&2; exit 1; }
run_dir="$SPOTCTL_STATE_DIR/agent-$SPOTCTL_AGENT_SHA256"
# Retried for 10 minutes at boot: a role or binding made in the same update can take minutes to
# apply. A stop path has seconds: it runs the agent the boot fetched, or nothing.
tries=120
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
SPOTCTL_CONFIG="$SPOTCTL_STATE_DIR/config.json" exec "$python" -E -S "$run_dir/__main__.py" "${1:-main}"
