#!/usr/bin/env bash
# Runs the whole test suite (unit, component, engine and e2e tests without a cluster).
# Extra arguments go to pytest, e.g. scripts/test.sh -m "not engine" for the fast part only.
set -uo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
"$PY" -m pytest "$@"
rc=$?
if [ $rc -eq 5 ]; then
  echo "pytest collected no tests: that is a failure here" >&2
  exit 1
fi
exit $rc
