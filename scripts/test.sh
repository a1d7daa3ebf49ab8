#!/usr/bin/env bash
# The whole suite, as CI runs it (the README's second command). Arguments, if any, go to one plain
# pytest run instead (`bash scripts/test.sh -m faults -s`).
#
# Two phases. Most tests wait more than they compute (terraform's resource waiters, TensorFlow
# starting, heartbeats), so all but the `exclusive` ones share the cores between three pytest workers
# (two left a sixth of two cores idle; with four, 2026-11-29, tests ran up to twice as long and the
# thirteen largest took 1818 CPU-s instead of 1613: more processes waiting for a core cost more),
# whole modules each (a module's fixtures, such as a kept aws run, are set up once), longest first
# (tests/conftest.py orders them; xdist must not reorder). Beside those, a pytest of its own
# runs the shared phase's `vm` test: its host process waits half an hour on one emulated VM (about
# half a core), and on a worker of three it left the other tests two workers for that time (CI of
# f85d8f1: the shared phase 4444 s, against ~3550 without that test). That test gives its VM's
# autogroup the larger share of the CPU (a nice here would not: every node is a session, and so an
# autogroup, of its own). The `exclusive` tests then run alone: three emulated VMs need every core.
set -uo pipefail
cd "$(dirname "$0")/.."
pytest=(.venv/bin/python -m pytest)
if [ $# -gt 0 ]; then
  exec "${pytest[@]}" "$@"
fi
# its own base directory and no cache writes: two pytest sessions share this checkout. Its log is
# printed as soon as it ends (amid the workers' progress), so a CI run cut off later still shows it.
beside_dir=$(mktemp -d)
(
  "${pytest[@]}" -m "vm and not exclusive" -p no:cacheprovider --basetemp "${beside_dir}/tmp" \
    > "${beside_dir}/log" 2>&1
  code=$?
  printf '\ntest.sh: the vm test beside the shared phase (its own pytest), exit %s:\n' "$code"
  cat "${beside_dir}/log"
  exit "$code"
) &
beside_pid=$!
"${pytest[@]}" -m "not exclusive and not vm" -n 3 --dist loadscope --no-loadscope-reorder
shared=$?
wait "$beside_pid"
beside=$?
rm -rf "${beside_dir}"
"${pytest[@]}" -m exclusive
alone=$?
echo "test.sh: shared phase exit ${shared}, vm beside it exit ${beside}, exclusive phase exit ${alone}"
[ "$shared" -eq 0 ] && [ "$beside" -eq 0 ] && [ "$alone" -eq 0 ]
