#!/usr/bin/env bash
# The whole suite, as CI runs it (the README's second command). Arguments, if any, go to one plain
# pytest run instead (`bash scripts/test.sh -m faults -s`).
#
# Two phases. Most tests wait more than they compute (terraform's resource waiters, TensorFlow
# starting, heartbeats), so all but the `exclusive` ones share the cores between three pytest workers
# (two left a sixth of two cores idle),
# whole modules each (a module's fixtures, such as a kept aws run, are set up once), longest first
# (tests/conftest.py orders them; xdist must not reorder). The `exclusive` tests then run alone:
# three emulated VMs need every core.
set -uo pipefail
cd "$(dirname "$0")/.."
pytest=(.venv/bin/python -m pytest)
if [ $# -gt 0 ]; then
  exec "${pytest[@]}" "$@"
fi
"${pytest[@]}" -m "not exclusive" -n 3 --dist loadscope --no-loadscope-reorder
shared=$?
"${pytest[@]}" -m exclusive
alone=$?
echo "test.sh: shared phase exit ${shared}, exclusive phase exit ${alone}"
[ "$shared" -eq 0 ] && [ "$alone" -eq 0 ]
