#!/bin/bash
# Run every test (C unit tests and busted specs, all registered with ctest)
# and end with one line "N passed, N failed". Usage: scripts/run_tests.sh [BUILD_DIR] [ctest args]
set -o pipefail
BUILD=${1:-build}
shift || true
mkdir -p "$BUILD/test-tmp"
cd "$BUILD" || exit 1
log=$(mktemp)
# TIDE_TEST_TIMEOUT: the per-test limit in seconds, a hang detector only (an hour
# by default): no test may fail because a shared machine is slow
ctest --output-on-failure -j2 --timeout "${TIDE_TEST_TIMEOUT:-3600}" "$@" 2>&1 | tee "$log"
rc=$?
line=$(grep -E 'tests passed, [0-9]+ tests? failed out of [0-9]+' "$log" | tail -n 1)
rm -f "$log"
total=$(echo "$line" | sed -E 's/.*out of ([0-9]+).*/\1/')
failed=$(echo "$line" | sed -E 's/.*passed, ([0-9]+) tests? failed.*/\1/')
if [ -n "$total" ] && [ -n "$failed" ]; then
  echo "$((total - failed)) passed, $failed failed"
else
  echo "0 passed, 1 failed (ctest did not run)"
  rc=1
fi
exit $rc
