#!/usr/bin/env bash
# The suite in two tiers (docs/tests.md):
#   bash scripts/test.sh          the default tier (the README's second command; CI runs it): every
#                                 test not marked `full`, each capability's real end-to-end test among them
#   bash scripts/test.sh --full   the default tier and the slow one (`full`: VM boots, image bakes,
#                                 soaks, long heals). Run it after a change to node images, cloud-init
#                                 rendering, the Terraform modules, the node agent's boot path or the controller.
#   bash scripts/test.sh ARGS     one plain pytest run of ARGS (`bash scripts/test.sh -m faults -s`)
# DLINFRA_TEST_CPU=FILE in the environment appends each test's wall and CPU seconds to FILE, in any tier.
#
# Most tests wait more than they compute (terraform's resource waiters, TensorFlow starting,
# heartbeats), so they share the two cores between three pytest workers (two left a sixth of two cores
# idle; with four, 2026-11-29, the thirteen largest tests took 1818 CPU-s instead of 1613: more
# processes waiting for a core cost more), whole modules each (a module's fixtures, such as a kept aws
# run, are set up once), longest first (tests/conftest.py orders them; xdist must not reorder).
set -uo pipefail
cd "$(dirname "$0")/.."
pytest=(.venv/bin/python -m pytest)
workers=(-n 3 --dist loadscope --no-loadscope-reorder)
case "${1:-}" in
  "")
    exec "${pytest[@]}" -m "not full" "${workers[@]}"
    ;;
  --full)
    [ $# -eq 1 ] || { echo "test.sh: --full takes no other arguments" >&2; exit 2; }
    ;;
  *)
    exec "${pytest[@]}" "$@"
    ;;
esac

# --full. Beside the shared phase, a pytest of its own runs the controller's VM test: its host process
# waits half an hour on one emulated VM (about half a core), and on a worker of three it left the
# other tests two workers for that time (CI of f85d8f1: the shared phase 4444 s, against ~3550 without
# it). That test gives its VM's autogroup the larger share of the CPU (a nice here would not: the
# VM's qemu is a session, and so an autogroup, of its own). The `exclusive` tests then run alone: three
# emulated VMs need every core. The beside pytest has its own base directory and no cache writes (two
# pytest sessions share this checkout); its log is printed as soon as it ends, amid the workers'
# progress, so a run cut off later still shows it.
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
"${pytest[@]}" -m "not exclusive and not vm" "${workers[@]}"
shared=$?
wait "$beside_pid"
beside=$?
rm -rf "${beside_dir}"
"${pytest[@]}" -m exclusive
alone=$?
echo "test.sh --full: shared phase exit ${shared}, vm beside it exit ${beside}, exclusive phase exit ${alone}"
[ "$shared" -eq 0 ] && [ "$beside" -eq 0 ] && [ "$alone" -eq 0 ]
