#!/usr/bin/env bash
# The whole suite, as CI runs it (the README's second command). Arguments, if any, go to one plain
# pytest run instead (`bash scripts/test.sh -m faults -s`).
#
# Two phases. Most tests wait more than they compute (terraform's resource waiters, TensorFlow
# starting, heartbeats), so everything but the VM boots shares the cores between two pytest workers,
# whole modules each (their module fixtures, such as a kept aws run, are set up once). The VM
# boots then run alone: three emulated VMs need every core, and their time is part of their test.
set -uo pipefail
cd "$(dirname "$0")/.."
pytest=(.venv/bin/python -m pytest)
if [ $# -gt 0 ]; then
  exec "${pytest[@]}" "$@"
fi
"${pytest[@]}" -m "not vm" -n 2 --dist loadscope
first=$?
"${pytest[@]}" -m vm
second=$?
echo "test.sh: not-vm phase exit ${first}, vm phase exit ${second}"
[ "$first" -eq 0 ] && [ "$second" -eq 0 ]
