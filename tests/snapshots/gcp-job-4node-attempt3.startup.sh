#!/bin/bash
# spotctl gcp main script for a job (attempt 3, node 2 of 4).
# (No user value appears in a comment: quoting does not protect a comment from a newline.)
# Rendered by spotctl from templates/; do not edit on the VM. One file, several entry points:
#   main      at boot: mount the job disk, write the environment, start the units
#   run       the job unit: run the command exactly as written, record completed/failed
#   watch     the watcher unit: poll the metadata server for preemption notices
#   shutdown  on a stop: tell a preemption from a normal stop, let the trainer checkpoint, record it
#   busy/idle (pools) the agent's work state: recorded; on AWS scale-in protection follows it
# User values are single-quoted on purpose: they must never expand here.
# shellcheck disable=SC2016
set -uo pipefail
umask 022

# ---- spotctl: settings (every value shell-quoted at render time) ------------------------------
SPOTCTL_CLOUD=gcp
SPOTCTL_STACK=team-a
SPOTCTL_KIND=job
SPOTCTL_NAME=llm
SPOTCTL_ATTEMPT=3
SPOTCTL_NODE_RANK=2
SPOTCTL_WORLD_SIZE=4
# What this attempt runs on: the `started` event carries them, so cost reports keep each attempt's own.
SPOTCTL_CAPACITY=on-demand
SPOTCTL_MACHINE_TYPE=a3-highgpu-8g
SPOTCTL_MASTER_ADDR=10.128.0.42
SPOTCTL_MASTER_PORT=29500
SPOTCTL_COMMAND='torchrun --nnodes "$WORLD_SIZE" --node-rank "$NODE_RANK" train.py'
SPOTCTL_DISK_DEVICE=/dev/disk/by-id/google-spotctl-data
# Other names the job disk may appear under (AWS Xen instance types: /dev/sdf, /dev/xvdf).
SPOTCTL_DISK_ALIASES=''
SPOTCTL_MOUNT=/mnt/spotctl
SPOTCTL_CWD=''
SPOTCTL_STATE_DIR=/var/lib/spotctl
SPOTCTL_SYSTEMD_DIR=/etc/systemd/system
SPOTCTL_METADATA_URL=http://metadata.google.internal/computeMetadata/v1
SPOTCTL_STORAGE_URL=https://storage.googleapis.com
SPOTCTL_BUCKET=team-a-events-4d8689f7
SPOTCTL_EVENT_PREFIX=team-a/
SPOTCTL_REGION=us-central1
# The job's secret env values: only their names and where they are kept (README "Secrets in env").
SPOTCTL_SECRET_KEYS='HF_TOKEN WANDB_API_KEY'
SPOTCTL_SECRET_REF=projects/p/secrets/spotctl-team-a-llm-env
SPOTCTL_SECRETS_URL=https://secretmanager.googleapis.com
SPOTCTL_POLL_S=5
# At most one `checkpoint` event per this many seconds (a trainer may checkpoint every step).
SPOTCTL_CHECKPOINT_EVENT_S=60
# Seconds the trainer gets to checkpoint after SIGTERM; ends before the cloud's hard stop (30 s).
SPOTCTL_STOP_BUDGET_S=20
# Seconds for the `preempted` a notice's path records last, in the foreground, after the trainer's
# budget: what the notice leaves after the trainer's budget, tee and the flush (4 s) and 4 s for the
# power-off, between 2 and 10 (GCP by default 2; AWS, whose notice is 2 minutes, 10: a single try of
# 2 s was seen to miss on a slow VM, the event then only on the disk).
SPOTCTL_LAST_RECORD_S=2
SPOTCTL_UNIT=spotctl-job
SPOTCTL_FSTAB=/etc/fstab
SPOTCTL_SELF="$SPOTCTL_STATE_DIR/spotctl.sh"
SPOTCTL_DEBUG_LOG="$SPOTCTL_STATE_DIR/spotctl.log"

# ---- helpers ---------------------------------------------------------------------------------
spotctl_log() {
  printf '%s spotctl[%s]: %s\n' "$(date -u +%Y-%m-%dT%H:%M:%SZ)" "$$" "$*" >>"$SPOTCTL_DEBUG_LOG" 2>/dev/null || true
  printf 'spotctl: %s\n' "$*" >&2
}

# JSON string literal of $1 (control characters other than \n \r \t are dropped).
spotctl_json_str() {
  local s=$1 LC_ALL=C  # (bytes: ranges of byte values, multibyte characters kept whole)
  # bash's own pattern, not `tr` in a subshell (a fork and exec per event field); bash strings hold no NUL
  s=${s//[$'\001'-$'\010'$'\013'$'\014'$'\016'-$'\037']/}
  s=${s//\\/\\\\}
  s=${s//\"/\\\"}
  s=${s//$'\n'/\\n}
  s=${s//$'\r'/\\r}
  s=${s//$'\t'/\\t}
  printf '"%s"' "$s"
}

# The string value of JSON field $1 on stdin (the first one; a value without quotes or backslashes).
spotctl_json_field() { sed -n "s/.*\"$1\"[[:space:]]*:[[:space:]]*\"\\([^\"]*\\)\".*/\\1/p" | head -n 1; }

# Percent-encode $1 for a URL path or query value (keeps A-Z a-z 0-9 - _ . ~ and, with $2=path, /).
spotctl_urlencode() {
  local s=$1 keep=${2:-} out="" c i
  local LC_ALL=C
  for ((i = 0; i < ${#s}; i++)); do
    c=${s:i:1}
    case "$c" in
      [A-Za-z0-9._~-]) out+=$c ;;
      /) if [ "$keep" = path ]; then out+=/; else out+=%2F; fi ;;
      *) out+=$(printf '%%%02X' "'$c") ;;
    esac
  done
  printf '%s' "$out"
}

# Set the variable named $1 to the epoch second: bash's own clock (bash >= 4.2), no `date` process
# (the scripts read the clock ~35 times a boot; a fork and exec each).
spotctl_epoch() { printf -v "$1" '%(%s)T' -1; }

# Seconds left until the epoch second $1 (never negative).
spotctl_left() {
  local left
  spotctl_epoch left
  left=$(($1 - left))
  [ "$left" -gt 0 ] || left=0
  printf '%s' "$left"
}

# A curl --max-time for one step of a task due at the epoch second $1: what is left of it, at most
# $2 seconds. Fails when nothing is left (curl reads --max-time 0 as "no limit").
spotctl_max() {
  local left
  left=$(spotctl_left "$1")
  [ "$left" -gt 0 ] || return 1
  [ -z "${2:-}" ] || [ "$left" -le "$2" ] || left=$2
  printf '%s' "$left"
}

# GET a metadata path (e.g. instance/preempted). Short timeouts: the caller has a budget.
spotctl_meta() {
  curl -sf --connect-timeout 1 --max-time 2 -H 'Metadata-Flavor: Google' "$SPOTCTL_METADATA_URL/$1"
}

# Cache instance name and zone once; events carry them.
spotctl_identity() {
  mkdir -p "$SPOTCTL_STATE_DIR"
  if [ ! -s "$SPOTCTL_STATE_DIR/instance" ]; then
    spotctl_meta instance/name >"$SPOTCTL_STATE_DIR/instance" 2>/dev/null || hostname >"$SPOTCTL_STATE_DIR/instance"
    local zone
    zone=$(spotctl_meta instance/zone 2>/dev/null) || zone=unknown
    printf '%s' "${zone##*/}" >"$SPOTCTL_STATE_DIR/zone"
  fi
  SPOTCTL_INSTANCE=$(cat "$SPOTCTL_STATE_DIR/instance")
  SPOTCTL_ZONE=$(cat "$SPOTCTL_STATE_DIR/zone" 2>/dev/null || printf unknown)
}

# Where the event log lives: on the job disk when it is mounted, so it survives the VM.
spotctl_event_log() {
  if [ -d "$SPOTCTL_MOUNT/.spotctl" ]; then
    printf '%s' "$SPOTCTL_MOUNT/.spotctl/events.jsonl"
  else
    printf '%s' "$SPOTCTL_STATE_DIR/events.jsonl"
  fi
}

# The VM's service account token (within $1 seconds).
spotctl_gcp_token() {
  local token
  token=$(curl -sf --connect-timeout 1 --max-time "$1" -H 'Metadata-Flavor: Google' \
    "$SPOTCTL_METADATA_URL/instance/service-accounts/default/token" | spotctl_json_field access_token) || return 1
  [ -n "$token" ] && printf '%s' "$token"
}

# Upload $2 (JSON) as object $1 to the event bucket with the VM's service account token, by the
# epoch second $3: the token request and the upload share that time (each one gets what is left).
# Only if no object has that name yet (ifGenerationMatch=0), and 412 Precondition Failed counts as
# stored: every name is written once, by this VM, so an object there is this upload, stored by an
# earlier try whose answer was lost (curl's --max-time ran out after GCS kept it). A plain retry
# would be an overwrite, which the VM's roles/storage.objectCreator refuses (403: replacing an
# object needs storage.objects.delete too, cloud.google.com/storage/docs/access-control/iam-permissions),
# so it failed forever. Precondition and 412: cloud.google.com/storage/docs/request-preconditions.
spotctl_upload_once() {
  local object=$1 body=$2 deadline=$3 token max code
  max=$(spotctl_max "$deadline") || return 1
  token=$(spotctl_gcp_token "$max") || return 1
  max=$(spotctl_max "$deadline") || return 1
  code=$(curl -s -o /dev/null -w '%{http_code}' --connect-timeout 1 --max-time "$max" -X POST \
    -H "Authorization: Bearer $token" -H 'Content-Type: application/json' --data-binary "$body" \
    "$SPOTCTL_STORAGE_URL/upload/storage/v1/b/$(spotctl_urlencode "$SPOTCTL_BUCKET")/o?uploadType=media&ifGenerationMatch=0&name=$(spotctl_urlencode "$object")") ||
    return 1
  case $code in
    2?? | 412) return 0 ;;
  esac
  return 1
}

# Record one event: always appended to the local log first (synchronously, so the log keeps the
# order of events), then uploaded with retries until the budget (seconds, $SPOTCTL_RECORD_BUDGET_S,
# default 10) runs out. With SPOTCTL_RECORD_BG=1 the upload goes on in the background: nothing that
# matters (the trainer, a checkpoint) ever waits for the bucket. Extra args are key=value details.
spotctl_record() {
  local event=$1
  shift
  local details="" kv now line log object
  for kv in "$@"; do
    details+=",$(spotctl_json_str "${kv%%=*}"):$(spotctl_json_str "${kv#*=}")"
  done
  [ -n "${SPOTCTL_INSTANCE:-}" ] || spotctl_identity
  now=$(date -u +%Y-%m-%dT%H:%M:%S.%3NZ)
  line="{\"stack\":$(spotctl_json_str "$SPOTCTL_STACK"),\"kind\":$(spotctl_json_str "$SPOTCTL_KIND"),\"job\":$(spotctl_json_str "$SPOTCTL_NAME"),\"attempt\":$SPOTCTL_ATTEMPT,\"node\":$SPOTCTL_NODE_RANK,\"event\":$(spotctl_json_str "$event"),\"time\":\"$now\",\"instance\":$(spotctl_json_str "$SPOTCTL_INSTANCE"),\"zone\":$(spotctl_json_str "$SPOTCTL_ZONE"),\"details\":{${details#,}}}"
  log=$(spotctl_event_log)
  mkdir -p "$(dirname "$log")"
  printf '%s\n' "$line" >>"$log"
  spotctl_log "event $event"
  object="${SPOTCTL_EVENT_PREFIX}${SPOTCTL_NAME}/attempt-${SPOTCTL_ATTEMPT}/node-${SPOTCTL_NODE_RANK}/${now}-${event}.json"
  if [ "${SPOTCTL_RECORD_BG:-}" = 1 ]; then
    spotctl_publish "$object" "$line" "${SPOTCTL_RECORD_BUDGET_S:-10}" </dev/null >/dev/null 2>&1 &
  else
    spotctl_publish "$object" "$line" "${SPOTCTL_RECORD_BUDGET_S:-10}"
  fi
}

# Upload one event object, retrying until $3 seconds have passed (every request of every try
# within them, 5 s a try at most). Never fails the caller.
spotctl_publish() {
  local object=$1 line=$2 budget=$3 deadline try_max try=0 now
  spotctl_epoch deadline
  deadline=$((deadline + budget))
  while :; do
    try_max=$(spotctl_max "$deadline" 5) || break
    spotctl_epoch now
    if spotctl_upload_once "$object" "$line" "$((now + try_max))"; then
      return 0
    fi
    try=$((try + 1))
    sleep "0.$((try < 5 ? try * 2 : 9))"
  done
  spotctl_log "event ${object##*-} not uploaded within ${budget}s (kept in the local event log)"
  return 0
}

# Upload what the trainer wrote to its log since the last call, next to the events, as objects
# named by their byte offset (`spotctl logs` joins them): ...attempt-N/node-R/logs/<offset>.log.
# Chunks of at most 64 KiB (one curl argument); the offset advances only after an upload. $1: seconds.
# A chunk not known to be stored is sent again with the same bytes, also by a later call when the
# log has grown since (its length is kept beside the offset): on GCP an object already there is
# taken as that chunk (spotctl_upload_once), so what follows it must start where it ended.
# The offset is the log's own (a kept boot disk carries the state dir into the next attempt, whose
# log starts at 0); one upload at a time (the watcher's and the run's last one would both send
# the same chunk and race on the offset).
# $1 seconds for the uploads, counted once this call holds the lock: waiting out another upload
# (the watcher's, in the background, as long as its own budget) must not spend the last call's
# time, or the log's last lines were never sent. 1: the log's end was not reached in time.
spotctl_upload_log() {
  local budget=${1:-5}
  (
    flock -w "$((budget + 10))" 5 || exit 1
    local deadline
    spotctl_epoch deadline
    spotctl_upload_log_chunks "$((deadline + budget))"
  ) 5>>"$SPOTCTL_STATE_DIR/log-upload.lock"
}

spotctl_upload_log_chunks() {
  local deadline=$1 log offset_file offset size chunk object length pending pending_at pending_len
  log=$(spotctl_trainer_log)
  [ -f "$log" ] || return 0
  offset_file="$SPOTCTL_STATE_DIR/log-offset-attempt-$SPOTCTL_ATTEMPT-node-$SPOTCTL_NODE_RANK"
  pending="$offset_file.pending"  # "<offset> <length>" of the chunk being sent
  offset=$(cat "$offset_file" 2>/dev/null) || offset=0
  size=$(stat -c %s "$log" 2>/dev/null) || return 0
  while [ "$offset" -lt "$size" ]; do
    length=65536
    if read -r pending_at pending_len 2>/dev/null <"$pending" && [ "$pending_at" = "$offset" ] &&
      [ "$pending_len" -gt 0 ] 2>/dev/null; then
      length=$pending_len
    fi
    # The trailing x keeps trailing newlines through $(...); LC_ALL=C: ${#chunk} counts bytes.
    chunk=$(tail -c +"$((offset + 1))" "$log" | head -c "$length"; printf x)
    chunk=${chunk%x}
    length=$(LC_ALL=C; printf '%s' "${#chunk}")
    printf '%s %s\n' "$offset" "$length" >"$pending"
    object="${SPOTCTL_EVENT_PREFIX}${SPOTCTL_NAME}/attempt-${SPOTCTL_ATTEMPT}/node-${SPOTCTL_NODE_RANK}/logs/$(printf '%012d' "$offset").log"
    until spotctl_upload_once "$object" "$chunk" "$deadline"; do  # retried until the budget is spent
      spotctl_max "$deadline" >/dev/null || return 1
      sleep 0.5
    done
    offset=$((offset + length))
    printf '%s' "$offset" >"$offset_file"
  done
}

# ---- secret env values -------------------------------------------------------------------------
# The job's secret payload (infra/render.py secret_payload: KEY=<base64url> ...), read with this
# VM's own identity, the only one allowed to read it. Printed to the caller, never written to disk.
spotctl_secret_payload() {
  local token answer
  token=$(spotctl_gcp_token 5) || return 1
  answer=$(curl -sf --connect-timeout 2 --max-time 10 -H "Authorization: Bearer $token" \
    "$SPOTCTL_SECRETS_URL/v1/$SPOTCTL_SECRET_REF/versions/latest:access") || return 1
  # Secret Manager answers payload.data in base64 (no backslash is legitimate in it).
  printf '%s' "$answer" | tr -d '\n' | spotctl_json_field data | tr -d '\134' | base64 -d
}

# Export the job's secret env values into this (the trainer's) shell. Retried for 2 minutes
# (SPOTCTL_SECRET_WAIT_S): a role or binding made in the same update can take that long to apply.
spotctl_load_secrets() {
  local payload="" deadline item key value count=0 want=0 now
  spotctl_epoch deadline
  deadline=$((deadline + ${SPOTCTL_SECRET_WAIT_S:-120}))
  until payload=$(spotctl_secret_payload 2>/dev/null) && [ -n "$payload" ]; do
    spotctl_epoch now
    if [ "$now" -ge "$deadline" ]; then
      spotctl_log "could not read the job's secret env values from $SPOTCTL_SECRET_REF: not starting the trainer"
      return 1
    fi
    sleep 2
  done
  # Word splitting on purpose: the payload is KEY=<base64url> words (no glob characters); no
  # here-string, which bash may back with a temporary file.
  for item in $payload; do
    key=${item%%=*}
    case " $SPOTCTL_SECRET_KEYS " in
      *" $key "*) ;;
      *) continue ;;  # only the names this job declares (never SPOTCTL_* or another reserved one)
    esac
    # base64url -> base64; the trailing x keeps trailing newlines of the value.
    value=$(printf '%s' "${item#*=}" | tr '_-' '/+' | base64 -d 2>/dev/null && printf x) || {
      spotctl_log "the secret value of $key in $SPOTCTL_SECRET_REF is not base64"
      return 1
    }
    export "$key=${value%x}"
    count=$((count + 1))
  done
  for key in $SPOTCTL_SECRET_KEYS; do want=$((want + 1)); done
  if [ "$count" -ne "$want" ]; then
    spotctl_log "$SPOTCTL_SECRET_REF holds $count of the job's $want secret env values"
    return 1
  fi
}

# ---- the trainer -----------------------------------------------------------------------------
# The trainer: its process group (the leader's pid is the group's id, setsid), alive while any of
# its processes is. Not the leader alone: `bash -c 'a; b'` (or a pipeline) keeps bash as the
# leader, which dies at once on SIGTERM while its child goes on writing the checkpoint.
spotctl_trainer_pid() {
  local pid
  pid=$(cat "$SPOTCTL_STATE_DIR/trainer.pid" 2>/dev/null) || return 1
  [ -n "$pid" ] || return 1
  kill -0 -- "-$pid" 2>/dev/null || kill -0 "$pid" 2>/dev/null || return 1
  printf '%s' "$pid"
}

# The job completed on this disk (spotctl_run's marker, written as its trainer exited 0 unsignaled)
# and no trainer process is left: a stop or notice now has nothing to stop or record.
spotctl_finished() {
  spotctl_already_completed && ! spotctl_trainer_pid >/dev/null
}

# Wait (at most $1 seconds) for tee to have written the trainer's last lines to its log: tee ends
# when the last writer of its pipe has gone. The stop path runs in another process than tee's
# parent (spotctl_run), hence tee.pid.
spotctl_wait_tee() {
  local pid waited=0
  pid=$(cat "$SPOTCTL_STATE_DIR/tee.pid" 2>/dev/null) || return 0
  [ -n "$pid" ] || return 0
  while kill -0 "$pid" 2>/dev/null && [ "$waited" -lt $(($1 * 10)) ]; do
    sleep 0.1
    waited=$((waited + 1))
  done
}

# SIGTERM the trainer's whole process group (torchrun and its workers) so it checkpoints. At most
# once per boot: a second SIGTERM makes many trainers abandon the checkpoint they are writing.
spotctl_signal_trainer() {
  local pid
  pid=$(spotctl_trainer_pid) || return 0
  [ ! -e "$SPOTCTL_STATE_DIR/signaled" ] || return 0
  : >"$SPOTCTL_STATE_DIR/signaled"
  spotctl_log "sending SIG$1 to trainer process group $pid"
  kill -s "$1" -- "-$pid" 2>/dev/null || kill -s "$1" "$pid" 2>/dev/null || true
}

# Wait up to $1 seconds for the trainer to exit; 0 if it did.
spotctl_wait_trainer() {
  local deadline now
  spotctl_epoch deadline
  deadline=$((deadline + $1))
  while spotctl_trainer_pid >/dev/null; do
    spotctl_epoch now
    [ "$now" -lt "$deadline" ] || return 1
    sleep 0.2
  done
  return 0
}

# Classify a stop, signal the trainer, give it its budget, record the outcome. $1: preempted|stopped.
spotctl_stop() {
  local event=$1 progress
  shift
  : >"$SPOTCTL_STATE_DIR/stopping"
  spotctl_signal_trainer TERM
  # How far training got (the newest SPOTCTL_PROGRESS step): cost's work lost is this minus the last checkpoint.
  progress=$(spotctl_last_step PROGRESS "$(spotctl_trainer_log)") || progress=""
  SPOTCTL_RECORD_BUDGET_S=${SPOTCTL_RECORD_BUDGET_S:-8} SPOTCTL_RECORD_BG=1 spotctl_record "$event" "$@" ${progress:+"progress=$progress"}
  if spotctl_wait_trainer "$SPOTCTL_STOP_BUDGET_S"; then
    spotctl_log "trainer stopped"
  else
    spotctl_log "trainer still running after ${SPOTCTL_STOP_BUDGET_S}s"
    SPOTCTL_RECORD_BUDGET_S=2 SPOTCTL_RECORD_BG=1 spotctl_record checkpoint-timeout "budget_s=$SPOTCTL_STOP_BUDGET_S"
  fi
  # The checkpoint line the trainer wrote on SIGTERM may still be in tee's pipe.
  spotctl_wait_tee 2
  spotctl_checkpoint_flush 2
  wait  # for the uploads: the VM may power off when this returns
}

spotctl_trainer_log() { printf '%s' "$SPOTCTL_MOUNT/.spotctl/logs/attempt-$SPOTCTL_ATTEMPT-node-$SPOTCTL_NODE_RANK.log"; }

# The step of the newest `SPOTCTL_$1 N` line in the log $2 (within its last MiB); fails if none.
spotctl_last_step() {
  local found
  found=$(tail -c 1048576 "$2" 2>/dev/null | grep -aoE "^SPOTCTL_$1[[:space:]]+[0-9]+" | tail -n 1) || return 1
  [ -n "$found" ] || return 1
  printf '%s' "${found##*[[:space:]]}"
}

# A `checkpoint` event for step $1 (at=$2: when its line was seen, if that was earlier), unless
# this attempt already recorded that step. The follower and a stop path both flush: the lock
# covers only claiming the step, never the upload (a background upload would inherit the lock's
# descriptor and hold it, the stop path's flush waiting on the bucket).
spotctl_checkpoint_event() {
  local claimed
  claimed=$(
    {
      flock -w 2 8 || exit 0
      [ "$(cat "$SPOTCTL_STATE_DIR/checkpoint-recorded" 2>/dev/null)" != "$SPOTCTL_ATTEMPT $1" ] || exit 0
      printf '%s' "$SPOTCTL_ATTEMPT $1" >"$SPOTCTL_STATE_DIR/checkpoint-recorded"
      printf yes
    } 8>"$SPOTCTL_STATE_DIR/checkpoint.lock"
  )
  [ "$claimed" = yes ] || return 0
  spotctl_record checkpoint "step=$1" ${2:+"at=$2"}
}

# The newest checkpoint in the trainer's log, recorded if the rate limit skipped it or the trainer
# wrote it while stopping: the last checkpoint before a preemption is always an event (spotctl cost
# takes the work lost from it). $1: seconds for the upload.
spotctl_checkpoint_flush() {
  local step seen at=""
  step=$(spotctl_last_step CHECKPOINT "$(spotctl_trainer_log)") || return 0
  seen=$(cat "$SPOTCTL_STATE_DIR/checkpoint-seen" 2>/dev/null) || seen=""
  [ "${seen% *}" != "$SPOTCTL_ATTEMPT $step" ] || at=${seen##* }
  SPOTCTL_RECORD_BUDGET_S=${1:-5} spotctl_checkpoint_event "$step" "$at"
}

# The attempt's first SPOTCTL_PROGRESS/SPOTCTL_CHECKPOINT line ends its changeover: one `progress` event
# (spotctl measures the job's changeover from it). Only this run's lines count (from byte $3 on):
# the log of an attempt goes on across reboots. Read once, as it grows, until tee ($2) exits; no
# pipeline, which would wait for tail after grep's match.
spotctl_first_progress() {
  local log=$1 pid=$2 start=$3
  if grep -qaE -m 1 '^SPOTCTL_(PROGRESS|CHECKPOINT)' < <(tail -c +"$((start + 1))" -s 1 --pid="$pid" -F "$log" 2>/dev/null); then
    spotctl_record progress
  fi
}

# Follows the trainer's log (its output path is untouched) until the trainer ($2) exits: the first
# progress line (above), and each `SPOTCTL_CHECKPOINT N` as a `checkpoint` event (step=N), at most one
# per SPOTCTL_CHECKPOINT_EVENT_S seconds so the bucket is not flooded; the newest one held back is
# recorded when the trainer exits, with the time it was seen. Only checkpoint lines reach the shell
# loop (grep drops the rest), so a trainer printing progress every step costs it nothing.
spotctl_follow_progress() {
  local log=$1 pid=$2 start=$3 line last=0 now
  spotctl_first_progress "$log" "$pid" "$start" &
  while IFS= read -r line; do
    [[ $line =~ ^SPOTCTL_CHECKPOINT[[:space:]]+([0-9]+)[[:space:]]*$ ]] || continue
    printf -v now '%(%s)T' -1
    if [ $((now - last)) -ge "$SPOTCTL_CHECKPOINT_EVENT_S" ]; then
      last=$now
      SPOTCTL_RECORD_BG=1 spotctl_checkpoint_event "${BASH_REMATCH[1]}"
    else
      printf '%s %s %s' "$SPOTCTL_ATTEMPT" "${BASH_REMATCH[1]}" "$(date -u +%Y-%m-%dT%H:%M:%S.%3NZ)" >"$SPOTCTL_STATE_DIR/checkpoint-seen"
    fi
  done < <(tail -c +"$((start + 1))" -s 1 --pid="$pid" -F "$log" 2>/dev/null | grep --line-buffered -aE '^SPOTCTL_CHECKPOINT[[:space:]]')
  spotctl_checkpoint_flush
  wait
}

# The trainer's process: the job's environment is read here, in the trainer's own shell, never
# into this script's (so no env value can change what the script runs, signals or records), and
# the command comes as $1, which the environment file cannot touch.
spotctl_exec_trainer() {
  # Secret values first (in memory only), then the env file, whose spotctl variables come last.
  spotctl_load_secrets || return 1
  # shellcheck disable=SC1091
  . "$SPOTCTL_STATE_DIR/env" || return 1
  # $2: 1 when the disk shows training already ran here (spotctl_has_progress), after the env file
  # so nothing in it can change the answer.
  if [ "${2:-}" = 1 ]; then export SPOTCTL_RESUME=1; else unset SPOTCTL_RESUME; fi
  exec setsid bash -c "$1"
}

# Deep Learning VM images install the NVIDIA driver at a boot disk's first boot when the VM's
# metadata asks for it (install-nvidia-driver=True, which spotctl sets: infra/gcp.py). No unit
# order is known to put that install before this one, so the trainer starts once nvidia-smi
# answers, at most SPOTCTL_DRIVER_WAIT_S seconds (20 min) later; then it starts anyway and its own
# error says why. A VM that did not ask waits for nothing.
spotctl_wait_driver() {
  local want deadline now
  want=$(spotctl_meta instance/attributes/install-nvidia-driver 2>/dev/null) || return 0
  [ "${want,,}" = true ] || return 0
  spotctl_epoch deadline
  deadline=$((deadline + ${SPOTCTL_DRIVER_WAIT_S:-1200}))
  until nvidia-smi >/dev/null 2>&1; do
    spotctl_epoch now
    if [ "$now" -ge "$deadline" ] || [ -e "$SPOTCTL_STATE_DIR/stopping" ]; then
      spotctl_log "the NVIDIA driver is not ready (nvidia-smi fails): starting the trainer anyway"
      return 0
    fi
    sleep 2
  done
}

spotctl_has_progress() {
  [ -n "$(ls -A "$SPOTCTL_MOUNT/checkpoints" 2>/dev/null)" ] && return 0
  grep -qs '"event":"started"' "$SPOTCTL_MOUNT/.spotctl/events.jsonl"
}

# This node's work is done on its disk: its trainer exited 0 unsignaled. A job of one node never
# runs again (a stop/start, a reboot, a new attempt: its command may not be reentrant). A gang's
# node only within the attempt that completed: a later attempt of the gang (another node was
# preempted mid-work) needs every rank back for its rendezvous.
spotctl_already_completed() {
  local marker=$SPOTCTL_MOUNT/.spotctl/completed
  [ -e "$marker" ] || return 1
  [ "$SPOTCTL_WORLD_SIZE" -le 1 ] || [ "$(cat "$marker" 2>/dev/null)" = "$SPOTCTL_ATTEMPT" ] ||
    # (a marker a power loss left empty, or an older spotctl's: this node's own event says it)
    grep -qsF "\"attempt\":$SPOTCTL_ATTEMPT,\"node\":$SPOTCTL_NODE_RANK,\"event\":\"completed\"" "$SPOTCTL_MOUNT/.spotctl/events.jsonl"
}

# Where the job already completed on this disk: say so, record it again (the watcher may not have
# seen it), and succeed, so the caller runs nothing.
spotctl_completed_before() {
  spotctl_already_completed || return 1
  spotctl_log "this job already completed on this disk; not running it again"
  spotctl_record completed "reason=already completed"
  return 0  # (whatever the record's upload did: the job must not run again)
}

# The job itself: run the command exactly as written, record how it ended.
spotctl_run() {
  spotctl_identity
  if [ -z "$SPOTCTL_COMMAND" ]; then
    spotctl_log "no command to run"
    return 0
  fi
  # AWS starts the enabled units at a later boot without main (a stop/start of a finished job).
  ! spotctl_completed_before || return 0
  mkdir -p "$SPOTCTL_MOUNT/.spotctl/logs"
  cd "${SPOTCTL_CWD:-$SPOTCTL_MOUNT}" || return 1
  # A resume whenever the disk shows training already ran here: a checkpoint, or an earlier
  # `started` (a later attempt, or the same VM after a reboot). Never from the attempt number
  # alone: a VM restarted within its attempt would start at step 0 over its checkpoint.
  local resume=0
  ! spotctl_has_progress || resume=1
  SPOTCTL_RECORD_BG=1 spotctl_record started "capacity=$SPOTCTL_CAPACITY" "machineType=$SPOTCTL_MACHINE_TYPE" "nodes=$SPOTCTL_WORLD_SIZE"
  # After `started`: the driver's install is part of the changeover spotctl measures.
  spotctl_wait_driver
  if [ -e "$SPOTCTL_STATE_DIR/stopping" ]; then
    spotctl_log "stopped before the trainer started; the stop path records the event"
    return 0
  fi
  local rc=0 child logfd tee_pid log_start follower
  # A last line the previous boot's power loss cut short is ended here, so this run's lines start
  # on lines of their own (a trainer may write a line's text and its newline in two writes).
  if [ -s "$(spotctl_trainer_log)" ] && [ -n "$(tail -c 1 "$(spotctl_trainer_log)")" ]; then
    printf '\n' >>"$(spotctl_trainer_log)"
  fi
  # Where this run's lines begin: an attempt's log goes on across reboots.
  log_start=$(stat -c %s "$(spotctl_trainer_log)" 2>/dev/null) || log_start=0
  # The trainer's output goes to its log on the job disk and to this script's output. tee is this
  # shell's child, not the trainer's, so the log's final upload can wait for its last lines.
  exec {logfd}> >(exec tee -a "$(spotctl_trainer_log)")
  tee_pid=$!
  printf '%s' "$tee_pid" >"$SPOTCTL_STATE_DIR/tee.pid"
  # setsid: the trainer leads its own process group, so one signal reaches all of its processes.
  spotctl_exec_trainer "$SPOTCTL_COMMAND" "$resume" >&"$logfd" 2>&1 &
  child=$!
  exec {logfd}>&-
  printf '%s' "$child" >"$SPOTCTL_STATE_DIR/trainer.pid"
  # The follower reads the log until tee has written its last line (not until the trainer's leader exits).
  spotctl_follow_progress "$(spotctl_trainer_log)" "$tee_pid" "$log_start" </dev/null >/dev/null 2>&1 &
  follower=$!
  # systemd stopping the unit is a stop, not a failure of the job.
  trap ': >"$SPOTCTL_STATE_DIR/stopping"; spotctl_signal_trainer TERM' TERM INT
  while :; do
    rc=0
    wait "$child" || rc=$?
    kill -0 "$child" 2>/dev/null || break
  done
  # Whether a stop had signaled the trainer when it exited, taken now: the waits and the log upload
  # below take seconds, and a stop that begins in them must not make a finished job a stopped one.
  local signaled=0
  [ ! -e "$SPOTCTL_STATE_DIR/signaled" ] || signaled=1
  # The marker at once (the event follows the log's upload): a power-off in between keeps it. It
  # names the attempt (spotctl_already_completed).
  [ "$rc" -ne 0 ] || [ "$signaled" -ne 0 ] || printf '%s' "$SPOTCTL_ATTEMPT" >"$SPOTCTL_MOUNT/.spotctl/completed"
  # In a stop the leader may be gone while the rest of its group still checkpoints (see
  # spotctl_trainer_pid): wait for the group, within the budget. This script is the unit's main
  # process; once it exits, systemd SIGKILLs every process left in the unit (KillMode=mixed: "the
  # SIGTERM signal is sent to the main process while the subsequent SIGKILL signal is sent to all
  # remaining processes of the unit's control group", systemd.kill(5)).
  if [ -e "$SPOTCTL_STATE_DIR/stopping" ]; then
    spotctl_wait_trainer "$SPOTCTL_STOP_BUDGET_S" || spotctl_log "trainer's processes still running after ${SPOTCTL_STOP_BUDGET_S}s"
  fi
  # A stop from here on (systemd's SIGTERM to this unit: KillMode=mixed) lets this run record how
  # the trainer ended: the stop path records nothing for a job that completed (spotctl_finished).
  trap ': >"$SPOTCTL_STATE_DIR/stopping"' TERM INT
  rm -f "$SPOTCTL_STATE_DIR/trainer.pid"
  # tee ends when the last writer closes the pipe; a process the trainer left running may keep it
  # open, so at most 5 s.
  local waited=0
  while kill -0 "$tee_pid" 2>/dev/null && [ "$waited" -lt 50 ]; do sleep 0.1; waited=$((waited + 1)); done
  # The follower records the trainer's last checkpoint (the one written on SIGTERM) once tee is
  # done: wait for it, at most 10 s. This script is the unit's main process: when it exits, systemd
  # kills what is left of the unit, a follower before its flush included, and a stop's event was lost.
  waited=0
  while kill -0 "$follower" 2>/dev/null && [ "$waited" -lt 100 ]; do sleep 0.1; waited=$((waited + 1)); done
  # Not during a stop: those seconds belong to the checkpoint and the events (the log's last
  # lines since the watcher's last upload stay on the job disk).
  # A slow bucket gets one more, longer try: after this the VM may be gone.
  [ -e "$SPOTCTL_STATE_DIR/stopping" ] || spotctl_upload_log 5 || [ -e "$SPOTCTL_STATE_DIR/stopping" ] ||
    spotctl_upload_log 20 || spotctl_log "the log's last lines were not uploaded (they stay on the job disk)"
  # It ended on its own, before any stop reached it: completed or failed by its exit code, also when
  # a stop began since (a failure recorded as a stop would be retried without counting against
  # maxFailures).
  if [ "$signaled" -eq 0 ] && [ "$rc" -eq 0 ]; then
    spotctl_record completed
  elif [ "$signaled" -eq 0 ]; then
    spotctl_record failed "exit_code=$rc"
  else
    spotctl_log "trainer exited with $rc during a stop; the stop path records the event"
  fi
  return "$rc"
}

# ---- boot --------------------------------------------------------------------------------------
# Mount the job disk by its stable device name. Format it only when it holds no filesystem and no
# partition table (blkid -p exit status 2) and its first MiB reads as zeros, as a new disk does;
# anything else is data and is never touched.
# GCE attaches the disk with the instance.
SPOTCTL_DISK_WAIT_S=120
spotctl_prepare_disk() {
  if [ -z "$SPOTCTL_DISK_DEVICE" ]; then
    mkdir -p "$SPOTCTL_MOUNT"
    return 0
  fi
  local waited=0 probe=0 name found=""
  while [ -z "$found" ]; do
    # Word splitting on purpose: device paths without spaces (infra/render.py checks them).
    for name in "$SPOTCTL_DISK_DEVICE" $SPOTCTL_DISK_ALIASES; do
      if [ -e "$name" ]; then
        found=$name
        break
      fi
    done
    [ -n "$found" ] || [ "$waited" -lt "$SPOTCTL_DISK_WAIT_S" ] || {
      spotctl_log "job disk $SPOTCTL_DISK_DEVICE did not appear"
      return 1
    }
    [ -n "$found" ] || sleep 1
    waited=$((waited + 1))
  done
  [ "$found" = "$SPOTCTL_DISK_DEVICE" ] || spotctl_log "job disk found as $found"
  SPOTCTL_DISK_DEVICE=$found
  if mountpoint -q "$SPOTCTL_MOUNT" 2>/dev/null; then
    return 0
  fi
  blkid -p "$SPOTCTL_DISK_DEVICE" >/dev/null 2>&1 || probe=$?
  if [ "$probe" -eq 2 ]; then
    if ! cmp -s -n 1048576 "$SPOTCTL_DISK_DEVICE" /dev/zero; then
      spotctl_log "job disk has no filesystem but is not blank: refusing to format it"
      return 1
    fi
    spotctl_log "job disk is blank: creating a filesystem"
    mkfs.ext4 -q -F -L spotctl-data -m 0 "$SPOTCTL_DISK_DEVICE" || return 1
  elif [ "$probe" -ne 0 ]; then
    spotctl_log "cannot probe $SPOTCTL_DISK_DEVICE (blkid exit $probe): not formatting"
    return 1
  fi
  mkdir -p "$SPOTCTL_MOUNT"
  mount -o defaults,discard "$SPOTCTL_DISK_DEVICE" "$SPOTCTL_MOUNT"
}

# The environment the command sees (sourced by the trainer's shell only); %q keeps every value one
# shell word. The user's env comes first, so spotctl's own variables always win.
spotctl_write_env() {
  local env_file="$SPOTCTL_STATE_DIR/env"
  {
    printf 'export %s=%q\n' SPOTCTL_CLOUD "$SPOTCTL_CLOUD"
    printf 'export %s=%q\n' SPOTCTL_REGION "$SPOTCTL_REGION"
    printf 'export %s=%q\n' SPOTCTL_STACK "$SPOTCTL_STACK"
    printf 'export %s=%q\n' SPOTCTL_JOB_ID "$SPOTCTL_NAME"
    printf 'export %s=%q\n' SPOTCTL_ATTEMPT "$SPOTCTL_ATTEMPT"
    printf 'export %s=%q\n' SPOTCTL_WORKDIR "$SPOTCTL_MOUNT"
    printf 'export %s=%q\n' SPOTCTL_CHECKPOINT_DIR "$SPOTCTL_MOUNT/checkpoints"
    printf 'export %s=%q\n' MASTER_ADDR "$SPOTCTL_MASTER_ADDR"
    printf 'export %s=%q\n' MASTER_PORT "$SPOTCTL_MASTER_PORT"
    printf 'export %s=%q\n' NODE_RANK "$SPOTCTL_NODE_RANK"
    printf 'export %s=%q\n' WORLD_SIZE "$SPOTCTL_WORLD_SIZE"
  } >"$env_file.tmp"
  mv "$env_file.tmp" "$env_file"
  mkdir -p "$SPOTCTL_MOUNT/checkpoints"
}

spotctl_write_unit() {
  local name=$1 body=$2
  printf '%s\n' "$body" >"$SPOTCTL_SYSTEMD_DIR/$name.service"
}

# Run the job and the watcher as systemd units; without systemd (containers, `spotctl drill`,
# SPOTCTL_NO_SYSTEMD=1), as background processes in their own sessions.
spotctl_start_units() {
  if [ -z "${SPOTCTL_NO_SYSTEMD:-}" ] && [ -d /run/systemd/system ] && command -v systemctl >/dev/null 2>&1; then
    spotctl_write_unit "$SPOTCTL_UNIT" "[Unit]
Description=spotctl $SPOTCTL_KIND ${SPOTCTL_NAME//[^A-Za-z0-9_.-]/_} (attempt $SPOTCTL_ATTEMPT, node $SPOTCTL_NODE_RANK)
Wants=network-online.target
After=network-online.target
RequiresMountsFor=$SPOTCTL_MOUNT
# Stopped after the shutdown script has classified the stop and let the trainer checkpoint.
Before=google-shutdown-scripts.service

[Service]
Type=simple
ExecStart=/bin/bash $SPOTCTL_SELF run
KillMode=mixed
KillSignal=SIGTERM
TimeoutStopSec=$SPOTCTL_STOP_BUDGET_S
Restart=no

[Install]
WantedBy=multi-user.target"
    # The watcher is stopped after the shutdown path has run (at shutdown systemd stops units in
    # the inverse of their start-up order, systemd.unit(5) Before=/After=): it may be recording the
    # preemption then. GCP: before google-shutdown-scripts.service (its ExecStop runs the shutdown
    # script); AWS: spotctl-stop is ordered after this unit.
    spotctl_write_unit spotctl-watch "[Unit]
Description=spotctl preemption watcher
After=network-online.target
RequiresMountsFor=$SPOTCTL_MOUNT
Before=google-shutdown-scripts.service

[Service]
Type=simple
ExecStart=/bin/bash $SPOTCTL_SELF watch
Restart=on-failure
RestartSec=2

[Install]
WantedBy=multi-user.target"
    spotctl_order_shutdown_scripts
    local units=(spotctl-watch.service "$SPOTCTL_UNIT.service")
    systemctl daemon-reload
    # Not enabled: GCE runs this startup script at every boot ("Most linux-based images will run
    # the content of metadata.startup-script in a shell on every boot", pulumi-gcp Instance.metadata),
    # and starts it in google-startup-scripts.service, which is ordered after google-guest-agent
    # (GoogleCloudPlatform/guest-agent google-startup-scripts.service), later than an enabled unit
    # ordered only after network-online.target would start. Enabled units would run the previous
    # boot's copy of this script (a kept boot disk: the previous attempt's) before this one is
    # copied in. An enable left by an earlier spotctl is undone.
    systemctl disable "${units[@]}" >/dev/null 2>&1 || true
    # To the disk now: ext4 allocates a new file's blocks up to 30 s after the write (delayed
    # allocation), and a reset or power loss before that left the units just written empty, so on
    # AWS (user data runs once) the job never came back (found by tests/boot/).
    sync
    # Starting an already active unit (a second run of this script) changes nothing.
    systemctl start --no-block "${units[@]}"
  else
    # A second run of this script in the same boot finds its processes alive: start nothing twice.
    if ! spotctl_alive watch.pid; then
      setsid bash "$SPOTCTL_SELF" watch </dev/null >>"$SPOTCTL_DEBUG_LOG" 2>&1 &
      printf '%s' "$!" >"$SPOTCTL_STATE_DIR/watch.pid"
    fi
    if ! spotctl_alive run.pid; then
      setsid bash "$SPOTCTL_SELF" run </dev/null >>"$SPOTCTL_DEBUG_LOG" 2>&1 &
      printf '%s' "$!" >"$SPOTCTL_STATE_DIR/run.pid"
    fi
  fi
}

# At shutdown systemd unmounts a disk once the units ordered after its mount have stopped, and
# only those: the job unit and the watcher (RequiresMountsFor), and, by this drop-in, the guest
# agent's unit whose stop runs the shutdown script. Without it the job disk was unmounted as soon
# as the job unit ended, while the shutdown script still recorded the stop on it (its events then
# went to the boot disk, which the next attempt replaces). Ordering only (no Requires=): a VM
# booted without its disk still runs its shutdown script. (systemd.unit(5): "the stopping order is
# the reverse of the start-up order"; google-shutdown-scripts.service, GoogleCloudPlatform/guest-agent.)
spotctl_order_shutdown_scripts() {
  local dir="$SPOTCTL_SYSTEMD_DIR/google-shutdown-scripts.service.d" mount_unit
  mount_unit=$(systemd-escape --path --suffix=mount "$SPOTCTL_MOUNT") || return 0
  mkdir -p "$dir" && printf '[Unit]\nAfter=%s\n' "$mount_unit" >"$dir/spotctl.conf"
}

# Is the process in pid file $1 (in the state dir) alive? Pid files are cleared at every boot.
spotctl_alive() {
  local pid
  pid=$(cat "$SPOTCTL_STATE_DIR/$1" 2>/dev/null) || return 1
  [ -n "$pid" ] && kill -0 "$pid" 2>/dev/null
}

# The job disk in /etc/fstab by UUID with nofail, so a reboot or stop/start mounts it before the
# job unit (RequiresMountsFor) starts, and a VM booted without it still boots.
spotctl_fstab() {
  local uuid
  [ -n "$SPOTCTL_DISK_DEVICE" ] || return 0
  uuid=$(blkid -s UUID -o value "$SPOTCTL_DISK_DEVICE" 2>/dev/null) || return 0
  [ -n "$uuid" ] || return 0
  grep -qs "^UUID=$uuid " "$SPOTCTL_FSTAB" && return 0
  printf 'UUID=%s %s auto defaults,discard,nofail,x-systemd.device-timeout=120s 0 2\n' "$uuid" "$SPOTCTL_MOUNT" >>"$SPOTCTL_FSTAB"
}

# The first entry point to run in a boot (main, or an enabled unit that started before it)
# forgets the previous boot's stop markers, pid files and identity; the others, and a second run
# of main in the same boot, find the boot id already recorded and keep what this boot wrote (a
# trainer.pid the job unit wrote before main ran). Under a lock: the units start together.
spotctl_boot() {
  local boot
  boot=${SPOTCTL_BOOT_ID:-$(cat /proc/sys/kernel/random/boot_id 2>/dev/null || printf unknown)}
  mkdir -p "$SPOTCTL_STATE_DIR"
  (
    flock -w 10 7 || true
    [ "$(cat "$SPOTCTL_STATE_DIR/boot" 2>/dev/null)" != "$boot" ] || exit 0
    rm -f "$SPOTCTL_STATE_DIR/stopping" "$SPOTCTL_STATE_DIR/notice" "$SPOTCTL_STATE_DIR/notice.claimed" "$SPOTCTL_STATE_DIR/signaled" \
      "$SPOTCTL_STATE_DIR/maintenance" "$SPOTCTL_STATE_DIR/instance" "$SPOTCTL_STATE_DIR/zone" \
      "$SPOTCTL_STATE_DIR/run.pid" "$SPOTCTL_STATE_DIR/watch.pid" "$SPOTCTL_STATE_DIR/trainer.pid" \
      "$SPOTCTL_STATE_DIR/tee.pid" "$SPOTCTL_STATE_DIR/preempted-recorded" "$SPOTCTL_STATE_DIR/shutdown" \
      "$SPOTCTL_STATE_DIR/busy" "$SPOTCTL_STATE_DIR/reported"
    printf '%s' "$boot" >"$SPOTCTL_STATE_DIR/boot"
  ) 7>>"$SPOTCTL_STATE_DIR/boot.lock"
}

# Runs at every boot on GCP (startup script) and may run again in one boot; spotctl_boot ran first.
spotctl_main() {
  if [ "$(readlink -f "${BASH_SOURCE[0]}")" != "$(readlink -f "$SPOTCTL_SELF")" ]; then
    cp "${BASH_SOURCE[0]}" "$SPOTCTL_SELF.tmp" && mv "$SPOTCTL_SELF.tmp" "$SPOTCTL_SELF"
  fi
  spotctl_identity
  if ! spotctl_prepare_disk; then
    spotctl_record failed "reason=job disk $SPOTCTL_DISK_DEVICE could not be mounted"
    return 1
  fi
  ! spotctl_completed_before || return 0
  spotctl_write_env
  if [ -z "${SPOTCTL_NO_SYSTEMD:-}" ] && [ -d /run/systemd/system ]; then
    spotctl_fstab || spotctl_log "could not add the job disk to $SPOTCTL_FSTAB"
  fi
  spotctl_start_units
}

# ---- preemption --------------------------------------------------------------------------------
# A notice arrived (AWS instance-action, GCE preempted=TRUE seen early): record it, SIGTERM the
# trainer, and record `preempted` once it has stopped. The cloud's clock started when the notice
# came, not when a poll saw it: the trainer's budget runs from SPOTCTL_NOTICE_SINCE (the epoch second
# of the watcher's last look that found none; default now), so a poll's delay comes out of the
# trainer's time, never out of the cloud's. After the trainer, at most tee 2 + flush 2 + `preempted`
# SPOTCTL_LAST_RECORD_S: the whole path ends 20 + 6 s after the notice on GCP (30 s to the hard stop,
# NOTICE_S in infra/render.py), 100 + 14 on AWS (120).
spotctl_notice() {
  local since=${SPOTCTL_NOTICE_SINCE:-} now budget
  spotctl_epoch now
  [ -n "$since" ] || since=$now
  budget=$((SPOTCTL_STOP_BUDGET_S - (now - since)))
  [ "$budget" -ge 0 ] || budget=0
  if spotctl_finished; then
    spotctl_log "notice after the job completed: nothing to record ($*)"
    return 0
  fi
  # One path handles a notice (noclobber: the claim is atomic). The watcher's poll and the shutdown
  # path can both see it: the other one only waits for the trainer and records the preemption
  # through the one record-once marker (spotctl_preempted_once), which is a no-op once recorded.
  if ! (set -C && : >"$SPOTCTL_STATE_DIR/notice.claimed") 2>/dev/null; then
    spotctl_wait_trainer "$budget" || true
    spotctl_preempted_once "$@"
    return 0
  fi
  # The notice's details, one per line: the shutdown path records `preempted` with them if this
  # watcher is gone before it could.
  printf '%s\n' "$@" >"$SPOTCTL_STATE_DIR/notice"
  : >"$SPOTCTL_STATE_DIR/stopping"
  spotctl_signal_trainer TERM
  local progress
  progress=$(spotctl_last_step PROGRESS "$(spotctl_trainer_log)") || progress=""
  SPOTCTL_RECORD_BUDGET_S=5 SPOTCTL_RECORD_BG=1 spotctl_record preemption-notice "$@" ${progress:+"progress=$progress"}
  if ! spotctl_wait_trainer "$budget"; then
    SPOTCTL_RECORD_BUDGET_S=2 SPOTCTL_RECORD_BG=1 spotctl_record checkpoint-timeout "budget_s=$budget"
  fi
  spotctl_preempted_once "$@"
  wait
}

# After a notice and the trainer's stop: the checkpoint it wrote on SIGTERM, then `preempted` with
# how far it got (cost's work lost is the difference), once per boot: by the watcher, or by the
# shutdown path when the watcher could not. The lock is held through the upload, so the shutdown
# path waits for the watcher's instead of recording it twice.
spotctl_preempted_once() {
  (
    flock -w 15 6 || true
    [ ! -e "$SPOTCTL_STATE_DIR/preempted-recorded" ] || exit 0
    # The trainer finished on its own as the notice came (spotctl_run recorded `completed`): the
    # work is done, and a `preempted` would only start an attempt that finds it done.
    if spotctl_finished; then
      spotctl_log "the job completed as the notice came: no preempted event"
      exit 0
    fi
    spotctl_wait_tee 2  # the trainer's last lines may still be in tee's pipe
    spotctl_checkpoint_flush 2
    local progress
    progress=$(spotctl_last_step PROGRESS "$(spotctl_trainer_log)") || progress=""
    # In the foreground and last, after the trainer's whole budget: only what is left of the notice
    # (the default 10 s would end after GCE's hard stop).
    SPOTCTL_RECORD_BUDGET_S=$SPOTCTL_LAST_RECORD_S spotctl_record preempted "$@" ${progress:+"progress=$progress"}
    : >"$SPOTCTL_STATE_DIR/preempted-recorded"
  ) 6>>"$SPOTCTL_STATE_DIR/preempted.lock"
}

spotctl_watch() {
  spotctl_identity
  local value polls=0 asked last_asked
  spotctl_epoch last_asked
  while :; do
    # The shutdown path classifies this stop itself (the watcher outlives its start, see the unit).
    [ ! -e "$SPOTCTL_STATE_DIR/shutdown" ] || return 0
    spotctl_epoch asked  # a notice seen now came after the last look: $last_asked
    value=$(spotctl_meta instance/preempted 2>/dev/null) || value=""
    if [ "$value" = TRUE ]; then
      SPOTCTL_NOTICE_SINCE=$last_asked spotctl_notice "source=metadata" "preempted=TRUE"
      return 0
    fi
    # GPU VMs are terminated for host maintenance with a 60 s notice: checkpoint then too.
    value=$(spotctl_meta instance/maintenance-event 2>/dev/null) || value=""
    case "$value" in
      TERMINATE_ON_HOST_MAINTENANCE | SHUTDOWN_ON_HOST_MAINTENANCE)
        if [ ! -e "$SPOTCTL_STATE_DIR/maintenance" ]; then
          : >"$SPOTCTL_STATE_DIR/maintenance"
          : >"$SPOTCTL_STATE_DIR/stopping"
          SPOTCTL_RECORD_BUDGET_S=3 SPOTCTL_RECORD_BG=1 spotctl_record maintenance-notice "maintenance_event=$value"
          spotctl_signal_trainer TERM
        fi
        ;;
    esac
    polls=$((polls + 1))
    last_asked=$asked
    # The trainer's log reaches the bucket about every 30 s (in the background: never delays a notice).
    [ $((polls * SPOTCTL_POLL_S % 30)) -ge "$SPOTCTL_POLL_S" ] || spotctl_upload_log 5 </dev/null >/dev/null 2>&1 &
    sleep "$SPOTCTL_POLL_S"
  done
}

# A stop of the VM. GCE runs this as the shutdown script (about 30 s before power-off on Spot);
# on AWS it is the stop hook unit's ExecStop.
spotctl_shutdown() {
  spotctl_identity
  if [ -e "$SPOTCTL_STATE_DIR/notice" ]; then
    # The watcher saw the notice and records the preemption once the trainer has stopped; if it
    # was stopped before it could, this path records it, with the notice's details.
    spotctl_wait_trainer "$SPOTCTL_STOP_BUDGET_S" || true
    local details=()
    mapfile -t details <"$SPOTCTL_STATE_DIR/notice"
    spotctl_preempted_once "${details[@]}"
    return 0
  fi
  : >"$SPOTCTL_STATE_DIR/shutdown"
  if spotctl_finished; then
    spotctl_log "stop after completion: nothing to record"
    return 0
  fi
  local value
  value=$(spotctl_meta instance/preempted 2>/dev/null) || value=unknown
  if [ "$value" = TRUE ]; then
    # As the watcher would have (it may be seeing it now): one `preempted`, whoever records it.
    spotctl_notice "source=shutdown-script" "preempted=TRUE"
  elif [ -e "$SPOTCTL_STATE_DIR/maintenance" ]; then
    spotctl_stop stopped "reason=host-maintenance" "preempted=$value"
  else
    spotctl_stop stopped "preempted=$value"
  fi
}

# Every entry point first settles which boot this is (spotctl_boot, above).
case "${1:-main}" in
  main | run | watch | shutdown) spotctl_boot ;;
esac
case "${1:-main}" in
  main) spotctl_main ;;
  run) spotctl_run ;;
  watch) spotctl_watch ;;
  shutdown) spotctl_shutdown ;;
  *)
    echo "usage: $0 [main|run|watch|shutdown]" >&2
    exit 2
    ;;
esac
