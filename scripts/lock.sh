#!/usr/bin/env bash
# Refreshes the project's hash locks, locks/{dev,run,checkov}.txt, from pyproject.toml and locks/*.in:
#   bash scripts/lock.sh                          # after editing dependencies: changes only what must
#   bash scripts/lock.sh --upgrade                # the newest releases of everything
#   bash scripts/lock.sh --upgrade-package NAME   # the newest release of one package
# Then review and commit the diff of locks/. scripts/install.sh installs only what the locks hold;
# tests/test_project_locks.py fails while a lock is older than pyproject.toml. See scripts/lock.py.
set -euo pipefail
cd "$(dirname "$0")/.."
python=python3
[ -x .venv/bin/python ] && python=.venv/bin/python
exec "$python" scripts/lock.py "$@"
