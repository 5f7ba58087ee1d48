#!/usr/bin/env bash
# Runs the whole test suite (unit, component, engine and e2e tests without a cluster).
# Extra arguments go to pytest, e.g. scripts/test.sh -m "not engine" for the fast part only.
set -uo pipefail
cd "$(dirname "$0")/.."
# Python run from here must not put this folder first on sys.path: its operator/ (the package
# slaq.operator) would shadow the standard library's operator module, which a fresh venv has
# not imported yet when `python -m pip` or `python -m pytest` starts (Python >= 3.11).
export PYTHONSAFEPATH=1
PY=${PYTHON:-python3}
"$PY" -m pytest "$@"
rc=$?
if [ $rc -eq 5 ]; then
  echo "pytest collected no tests: that is a failure here" >&2
  exit 1
fi
exit $rc
