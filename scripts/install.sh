#!/usr/bin/env bash
# Idempotent set-up into ./.venv from the committed hash locks in locks/ (refresh: bash scripts/lock.sh).
# `install.sh` → what `dlinfra deploy` needs (TensorFlow CPU, boto3): locks/run.txt;
# `install.sh dev` → also what the tests need (cloud-init's schema validator, chromium, pytest, moto, checkov):
# locks/dev.txt, and locks/checkov.txt into .venv-checkov.
# Every Python package comes off a lock, its hash checked, uv itself included. Each venv is made
# exactly its lock (`uv pip sync`: what the lock does not hold is removed, so a dev venv is what CI
# tests, and switching profile switches the venv), then this checkout is installed editable on top.
set -euo pipefail
cd "$(dirname "$0")/.."
profile="${1:-run}"
case "$profile" in
  run | dev) ;;
  *) echo "install.sh: unknown profile '${profile}' (run or dev)" >&2; exit 2 ;;
esac

as_root() { if [ "$(id -u)" = 0 ]; then "$@"; else sudo "$@"; fi; }

# dev: cloud-init's schema validator checks every rendered user-data; qemu, mmdebstrap and
# genisoimage build node images and boot them as VMs (the vm tests); chromium and its chromedriver
# open `dlinfra report`'s pages in a real headless browser (Selenium drives the system's, no download).
missing=()
if [ "$profile" = dev ]; then
  for tool in cloud-init:cloud-init qemu-system-x86_64:qemu-system-x86 qemu-img:qemu-utils \
      mmdebstrap:mmdebstrap genisoimage:genisoimage mke2fs:e2fsprogs chromium:chromium \
      chromedriver:chromium-driver; do
    command -v "${tool%%:*}" >/dev/null 2>&1 || missing+=("${tool##*:}")
  done
fi
if [ "${#missing[@]}" -gt 0 ]; then
  echo "install.sh: installing Debian's ${missing[*]}"
  as_root apt-get update -qq
  DEBIAN_FRONTEND=noninteractive as_root apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi

# The locks are resolved for CPython 3.11 on Linux x86_64 (scripts/lock.py): this project's machines.
py_of() { "$1" -c 'import sys; print("%d.%d" % sys.version_info[:2])'; }
if [ "$(py_of python3)" != 3.11 ] || [ "$(uname -m)" != x86_64 ]; then
  echo "install.sh: locks/ is for CPython 3.11 on x86_64; python3 is $(py_of python3) on $(uname -m)." \
    "Fix: put a Python 3.11 first on PATH (or add the platform to scripts/lock.py)" >&2
  exit 1
fi
if [ -x .venv/bin/python ] && [ "$(py_of .venv/bin/python)" != 3.11 ]; then
  echo "install.sh: .venv runs Python $(py_of .venv/bin/python), the locks are for 3.11. Fix: rm -r .venv" >&2
  exit 1
fi

quiet() {  # a command's output only if it fails
  local log; log=$(mktemp)
  "$@" >"$log" 2>&1 || { cat "$log" >&2; rm -f "$log"; return 1; }
  rm -f "$log"
}
lock="locks/${profile}.txt"
[ -x .venv/bin/python ] || python3 -m venv .venv

# uv installs the locks, so it comes first, as the lock pins it: pip installs that one release,
# checking its hashes. pip runs without this machine's config (its local wheels and indexes) and from
# the index uv uses, so both take the same files (the index's own, which the hashes are of).
uv=.venv/bin/uv
uv_pin=$(grep -m1 '^uv==' "$lock" | cut -d' ' -f1)
if [ "$("$uv" --version 2>/dev/null | cut -d' ' -f2)" != "${uv_pin#uv==}" ]; then
  pin=$(mktemp)
  awk '/^uv==/ { on = 1; print; next } on && /^ +--hash=/ { print; next } { on = 0 }' "$lock" >"$pin"
  .venv/bin/python -m pip --version >/dev/null 2>&1 || quiet .venv/bin/python -m ensurepip
  quiet env -u PIP_FIND_LINKS -u PIP_INDEX_URL -u PIP_EXTRA_INDEX_URL -u PIP_NO_INDEX -u PIP_CONSTRAINT \
    PIP_CONFIG_FILE=/dev/null .venv/bin/python -m pip install --quiet --disable-pip-version-check \
    --index-url "${UV_DEFAULT_INDEX:-${UV_INDEX_URL:-https://pypi.org/simple}}" \
    --require-hashes --no-deps -r "$pin"
  rm -f "$pin"
fi

checkov=""
if [ "$profile" = dev ]; then
  # checkov pins old boto3/botocore releases; it gets its own venv (and lock) so it never downgrades
  # ours. Synced beside the main venv: the two overlap their downloads.
  # A venv made by an older install.sh (with pip) is made again: uv's sync keeps pip's seed packages.
  [ ! -e .venv-checkov/bin/pip ] || rm -rf .venv-checkov
  { [ -x .venv-checkov/bin/python ] || python3 -m venv --without-pip .venv-checkov
    quiet "$uv" pip sync --python .venv-checkov/bin/python --require-hashes locks/checkov.txt
    quiet "$uv" pip check --python .venv-checkov/bin/python; } &
  checkov=$!
fi
# Compiled once here: where PYTHONDONTWRITEBYTECODE is set (CI machines), every process that imports
# TensorFlow would otherwise compile its ~2000 modules again (measured: 20 s of CPU against 7.5 s).
quiet "$uv" pip sync --python .venv/bin/python --require-hashes --compile-bytecode "$lock"
# this checkout, editable and without dependencies; its build backend is on the lock (no download)
quiet "$uv" pip install --python .venv/bin/python --no-deps --no-build-isolation --offline -e .
# and its modules compiled too, for the same reason: an editable install compiles none, and every CLI
# call compiled its ~120 again (0.21 s of a 1,000-worker render's CPU)
.venv/bin/python -m compileall -q -j 0 src/dlinfra >/dev/null
quiet "$uv" pip check --python .venv/bin/python  # the lock is whole: every package's requirements met
[ -z "$checkov" ] || wait "$checkov"
if [ "$profile" = dev ]; then
  command -v terraform >/dev/null 2>&1 || echo "install.sh: warning: terraform not on PATH; terraform tests will fail" >&2
fi
echo "install.sh: ready (.venv = ${lock}$([ "$profile" = dev ] && echo ', .venv-checkov = locks/checkov.txt'))"
