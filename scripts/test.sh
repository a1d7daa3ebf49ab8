#!/usr/bin/env bash
# The whole suite, as CI runs it (the README's second command). Arguments, if any, go to one plain
# pytest run instead (`bash scripts/test.sh -m faults -s`).
#
# Two phases. Most tests wait more than they compute (terraform's resource waiters, TensorFlow
# starting, heartbeats), so all but the `exclusive` ones share the cores between four pytest workers
# (two left a sixth of two cores idle; with three, the CPU counted to the tests was 1.44 cores of
# the phase's 56:32 on 2026-11-29, each worker busy to its end: they waited, not the scheduler),
# whole modules each (a module's fixtures, such as a kept aws run, are set up once), longest first
# (tests/conftest.py orders them; xdist must not reorder). Beside those, a pytest of its own
# runs the shared phase's `vm` test: its host process waits half an hour on one emulated VM (about
# half a core), and on a worker of three it left the other tests two workers for that time (CI of
# f85d8f1: the shared phase 4444 s, against ~3550 without that test). The workers run at a lower
# priority (nice 10) than that VM: its test waits on fixed deadlines, and among the workers' many
# TensorFlow threads its one emulating thread got so little that CI of 1c4e1b7 ran it 3026 s (1475 s
# here) and its 2400 s wait ran out. The workers lose no CPU overall: the VM's work is the same, done
# sooner. The `exclusive` tests then run alone: three emulated VMs need every core.
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
nice -n 10 "${pytest[@]}" -m "not exclusive and not vm" -n 4 --dist loadscope --no-loadscope-reorder
shared=$?
wait "$beside_pid"
beside=$?
rm -rf "${beside_dir}"
"${pytest[@]}" -m exclusive
alone=$?
echo "test.sh: shared phase exit ${shared}, vm beside it exit ${beside}, exclusive phase exit ${alone}"
[ "$shared" -eq 0 ] && [ "$beside" -eq 0 ] && [ "$alone" -eq 0 ]
