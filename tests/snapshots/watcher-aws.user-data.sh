#!/bin/bash
# spotctl watcher VM (aws): at boot (GCP: every boot; AWS: the first, through cloud-init), install what is missing (git, uv, the Pulumi CLI, the
# project checkout and its environment), then run `spotctl watch` under the shipped systemd unit
# (examples/spotctl-watch@.service). Rendered by spotctl from templates/watcher/; do not edit on the VM.
# Any change of this script (ref, backend, versions, ...) replaces the VM: a new VM clones the ref, and
# its watcher takes the stack file's shared copy from the event bucket (cli/lifecycle/sync.py).
# (No user value appears in a comment: quoting does not protect a comment from a newline.)
set -euo pipefail
umask 022

STACK=team-a
REGION=us-east-1
REPO=https://github.com/team/infra.git
REF=main
BACKEND=s3://team-state/pulumi
SECRETS_PROVIDER=passphrase
PASSPHRASE_SECRET=/spotctl/team-a/passphrase
PULUMI_URL=https://github.com/pulumi/pulumi/releases/download/v3.220.0/pulumi-v3.220.0-linux-x64.tar.gz
UV_URL=https://github.com/astral-sh/uv/releases/download/0.13.9/uv-x86_64-unknown-linux-gnu.tar.gz
PROJECT_DIR=/opt/spotctl
PULUMI_ROOT=/opt/pulumi
BIN_DIR=/usr/local/bin
ETC_DIR=/etc/spotctl
SYSTEMD_DIR=/etc/systemd/system
WATCH_USER=spotctl
WATCH_HOME=/home/spotctl
UNIT="spotctl-watch@$STACK.service"

log() {
  printf 'spotctl-watcher: %s\n' "$*" >&2
}

# $1 URL, $2 file: HTTPS only, retried (the NAT or the network may still be coming up at first boot).
download() {
  curl --proto '=https' --tlsv1.2 -fsSL --retry 30 --retry-delay 10 --retry-all-errors -o "$2" "$1"
}

install_packages() {
  local missing=()
  command -v git >/dev/null 2>&1 || missing+=(git)
  command -v curl >/dev/null 2>&1 || missing+=(curl ca-certificates)
  command -v python3 >/dev/null 2>&1 || missing+=(python3)
  if [ "${#missing[@]}" -gt 0 ]; then
    log "installing ${missing[*]}"
    DEBIAN_FRONTEND=noninteractive apt-get update -q
    DEBIAN_FRONTEND=noninteractive apt-get install -y -q "${missing[@]}"
  fi
}

# An unprivileged user with a home for uv's cache, ~/.pulumi and ~/.config/spotctl (the key that seals
# spotctl's records beside the stack file: cli/lifecycle/cachefile.py; private, 0700); the unit runs as
# it. These directories must exist before the unit starts: its ReadWritePaths= names them, and systemd fails a
# unit whose ReadWritePaths= path is missing (226/NAMESPACE) unless it is prefixed with "-"
# (systemd.exec(5), ReadWritePaths=).
ensure_user() {
  if ! id -u "$WATCH_USER" >/dev/null 2>&1; then
    useradd --system --create-home --home-dir "$WATCH_HOME" --shell /usr/sbin/nologin "$WATCH_USER"
  fi
  mkdir -p "$WATCH_HOME/.pulumi" "$WATCH_HOME/.cache" "$WATCH_HOME/.config/spotctl"
  chown "$WATCH_USER:" "$WATCH_HOME" "$WATCH_HOME/.pulumi" "$WATCH_HOME/.cache" "$WATCH_HOME/.config" "$WATCH_HOME/.config/spotctl"
  chmod 0700 "$WATCH_HOME/.config/spotctl"
}

# $1 URL of a .tar.gz, $2 directory: the archive's files (first path component dropped) land in $2.
install_tarball() {
  local tmp
  tmp=$(mktemp -d)
  download "$1" "$tmp/archive.tar.gz"
  mkdir -p "$2"
  tar -xzf "$tmp/archive.tar.gz" -C "$2" --strip-components=1
  rm -rf "$tmp"
}

install_tools() {
  if [ ! -x "$BIN_DIR/uv" ]; then
    log "installing uv"
    install_tarball "$UV_URL" "$BIN_DIR"
  fi
  if [ ! -x "$PULUMI_ROOT/bin/pulumi" ]; then
    log "installing the Pulumi CLI"
    install_tarball "$PULUMI_URL" "$PULUMI_ROOT/bin"
  fi
}

# Clone once into a temporary directory, then rename: a boot interrupted mid-clone starts over.
checkout() {
  if [ ! -d "$PROJECT_DIR/.git" ]; then
    log "cloning the project"
    rm -rf "$PROJECT_DIR.tmp"
    git clone --quiet -- "$REPO" "$PROJECT_DIR.tmp"
    # A branch is origin/REF after a clone; a tag or a commit is REF itself.
    git -C "$PROJECT_DIR.tmp" checkout --quiet --detach "origin/$REF" -- 2>/dev/null \
      || git -C "$PROJECT_DIR.tmp" checkout --quiet --detach "$REF" --
    mv "$PROJECT_DIR.tmp" "$PROJECT_DIR"
  fi
  mkdir -p "$PROJECT_DIR/stacks"  # the shipped unit's ReadWritePaths= names it (see ensure_user)
  chown -R "$WATCH_USER:" "$PROJECT_DIR"
  runuser -u "$WATCH_USER" -- env HOME="$WATCH_HOME" "$BIN_DIR/uv" sync --frozen --quiet --project "$PROJECT_DIR"
}

# PULUMI_CONFIG_PASSPHRASE from the secret named in the stack (passphrase secrets provider only),
# into a file only the watcher's user reads (Pulumi reads PULUMI_CONFIG_PASSPHRASE_FILE).
fetch_passphrase() {
  local file="$ETC_DIR/passphrase-$STACK"
  [ "$SECRETS_PROVIDER" = passphrase ] || return 0
  ( umask 077
    "$PROJECT_DIR/.venv/bin/python" - "$REGION" "$PASSPHRASE_SECRET" >"$file.tmp" <<'PY'
import sys
import boto3
region, name = sys.argv[1:3]
value = boto3.client("ssm", region_name=region).get_parameter(Name=name, WithDecryption=True)["Parameter"]["Value"]
sys.stdout.write(value)
PY
  )
  chown "$WATCH_USER:" "$file.tmp"
  mv "$file.tmp" "$file"
}

# The unit's EnvironmentFile: every value was validated by spotctl to a strict alphabet.
write_environment() {
  local env="$ETC_DIR/watch-$STACK.env"
  mkdir -p "$ETC_DIR"
  {
    printf '%s=%s\n' PULUMI_BACKEND_URL "$BACKEND"
    printf '%s=%s\n' SPOTCTL_PULUMI_ROOT "$PULUMI_ROOT"
    printf '%s=%s\n' PULUMI_SKIP_UPDATE_CHECK true
    printf '%s=%s\n' AWS_REGION "$REGION"
    printf '%s=%s\n' AWS_DEFAULT_REGION "$REGION"
    if [ "$SECRETS_PROVIDER" = passphrase ]; then
      printf '%s=%s\n' PULUMI_CONFIG_PASSPHRASE_FILE "$ETC_DIR/passphrase-$STACK"
    fi
  } >"$env.tmp"
  mv "$env.tmp" "$env"
}

# The shipped unit as it is, plus a drop-in for what this VM adds (uv may update the checkout's venv).
install_unit() {
  mkdir -p "$SYSTEMD_DIR/spotctl-watch@.service.d"
  install -m 0644 "$PROJECT_DIR/examples/spotctl-watch@.service" "$SYSTEMD_DIR/spotctl-watch@.service"
  {
    printf '%s\n' '[Service]'
    printf 'WorkingDirectory=%s\n' "$PROJECT_DIR"
    printf 'ReadWritePaths=%s\n' "$PROJECT_DIR/.venv"
    # The home this VM's user really has (the shipped unit names /home/spotctl).
    printf 'ReadWritePaths=%s %s %s\n' "$WATCH_HOME/.pulumi" "$WATCH_HOME/.cache" "$WATCH_HOME/.config/spotctl"
  } >"$SYSTEMD_DIR/spotctl-watch@.service.d/10-watcher-vm.conf"
  systemctl daemon-reload
  systemctl enable --now "$UNIT"
}

main() {
  install_packages
  ensure_user
  install_tools
  checkout
  mkdir -p "$ETC_DIR"
  fetch_passphrase
  write_environment
  install_unit
  log "watching stack $STACK in $REGION ($UNIT)"
}

main "$@"
