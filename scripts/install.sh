#!/usr/bin/env bash
# Idempotent set-up into ./.venv.  `install.sh` → what `dlinfra deploy` needs (TensorFlow CPU, boto3);
# `install.sh dev` → also what the tests need (cloud-init's schema validator, pytest, moto, checkov).
set -euo pipefail
cd "$(dirname "$0")/.."
profile="${1:-run}"

as_root() { if [ "$(id -u)" = 0 ]; then "$@"; else sudo "$@"; fi; }

# dev: cloud-init's schema validator checks every rendered user-data; qemu, mmdebstrap and
# genisoimage build node images and boot them as VMs (the vm tests).
missing=()
if [ "$profile" = dev ]; then
  for tool in cloud-init:cloud-init qemu-system-x86_64:qemu-system-x86 qemu-img:qemu-utils \
      mmdebstrap:mmdebstrap genisoimage:genisoimage mke2fs:e2fsprogs; do
    command -v "${tool%%:*}" >/dev/null 2>&1 || missing+=("${tool##*:}")
  done
fi
if [ "${#missing[@]}" -gt 0 ]; then
  echo "install.sh: installing Debian's ${missing[*]}"
  as_root apt-get update -qq
  DEBIAN_FRONTEND=noninteractive as_root apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi

if [ ! -x .venv/bin/python ]; then
  python3 -m venv .venv
fi
extras="train,aws,report"
[ "$profile" = dev ] && extras="train,aws,report,dev"
pipq() {  # quiet unless it fails: this machine's pip config warns about every local index miss
  local log; log=$(mktemp)
  "$@" --quiet --disable-pip-version-check >"$log" 2>&1 || { cat "$log" >&2; rm -f "$log"; return 1; }
  rm -f "$log"
}
checkov=""
if [ "$profile" = dev ] && [ ! -x .venv-checkov/bin/checkov ]; then
  # checkov pins old boto3/botocore releases; it gets its own venv so it never downgrades ours.
  # Installed beside the main venv: pip mostly waits on downloads and the disk, so the two overlap.
  { python3 -m venv .venv-checkov && pipq .venv-checkov/bin/python -m pip install "checkov>=3.2,<4"; } &
  checkov=$!
fi
pipq .venv/bin/python -m pip install -e ".[${extras}]"
[ -z "$checkov" ] || wait "$checkov"
if [ "$profile" = dev ]; then
  command -v terraform >/dev/null 2>&1 || echo "install.sh: warning: terraform not on PATH; terraform tests will fail" >&2
fi
echo "install.sh: ready (.venv, extras: ${extras})"
