#!/bin/sh
# scripts/fuzz.sh [SECONDS] [NAME...]: build the libFuzzer targets
# tests/fuzz/fuzz_NAME.c with clang (AddressSanitizer + UBSan, the library
# instrumented for coverage) in build-fuzz/ ($FUZZ_BUILD), then run each
# for SECONDS (default $FUZZ_SECONDS, else 60). No NAME = every target.
# Seeds come from tests/fuzz/corpus/NAME/, tokens from tests/fuzz/fuzz_NAME.dict;
# the growing corpus and any crash inputs stay in the build directory.
# Exit status: 0 when every run is clean, 1 on a finding or a build failure,
# 77 (skipped) when clang's libFuzzer is not installed.
set -e
ROOT=$(cd "$(dirname "$0")/.." && pwd)
SECS=${1:-${FUZZ_SECONDS:-60}}
[ $# -gt 0 ] && shift
BUILD=${FUZZ_BUILD:-$ROOT/build-fuzz}
CC=${FUZZ_CC:-clang}

mkdir -p "$BUILD"
probe="$BUILD/probe.c"
echo 'int LLVMFuzzerTestOneInput(const unsigned char *d, unsigned long n) { (void)d; (void)n; return 0; }' > "$probe"
if ! command -v "$CC" >/dev/null 2>&1 || ! "$CC" -fsanitize=fuzzer,address "$probe" -o "$BUILD/probe" >/dev/null 2>&1; then
  echo "fuzz: $CC with libFuzzer (-fsanitize=fuzzer) is unavailable: install clang and libclang-rt-14-dev" \
       "(scripts/deps.sh); fuzzing skipped"
  exit 77
fi
rm -f "$probe" "$BUILD/probe"

if [ $# -eq 0 ]; then
  set --
  for f in "$ROOT"/tests/fuzz/fuzz_*.c; do
    n=$(basename "$f" .c)
    set -- "$@" "${n#fuzz_}"
  done
fi
targets=""
for n in "$@"; do targets="$targets fuzz_$n"; done

log="$BUILD/build.log"
if ! { cmake -S "$ROOT" -B "$BUILD" -DCMAKE_C_COMPILER="$CC" -DCMAKE_BUILD_TYPE=Debug \
         -DCMAKE_C_FLAGS="-O1 -g -fsanitize=fuzzer-no-link" -DTIDE_FUZZ=ON -DTIDE_SANITIZE=address,undefined \
         -DTIDE_DNNL=OFF && \
       cmake --build "$BUILD" -j2 --target $targets; } > "$log" 2>&1; then
  cat "$log"
  echo "fuzz: build failed"
  exit 1
fi

status=0
for n in "$@"; do
  exe="$BUILD/fuzz_$n"
  corpus="$BUILD/corpus/$n"
  arts="$BUILD/artifacts/$n/"
  mkdir -p "$corpus" "$arts"
  set -- -max_total_time="$SECS" -timeout=20 -rss_limit_mb=2048 -print_final_stats=1 -artifact_prefix="$arts"
  [ -f "$ROOT/tests/fuzz/fuzz_$n.dict" ] && set -- "$@" -dict="$ROOT/tests/fuzz/fuzz_$n.dict"
  seeds=""
  [ -d "$ROOT/tests/fuzz/corpus/$n" ] && seeds="$ROOT/tests/fuzz/corpus/$n"
  echo "fuzz: fuzz_$n for ${SECS}s"
  # shellcheck disable=SC2086
  if ASAN_OPTIONS=detect_leaks=1 UBSAN_OPTIONS=halt_on_error=1:print_stacktrace=1 \
       "$exe" "$@" "$corpus" $seeds > "$BUILD/fuzz_$n.log" 2>&1; then
    grep -E "stat::number_of_executed_runs|Done [0-9]+ runs" "$BUILD/fuzz_$n.log" | tail -n 2
    echo "fuzz: fuzz_$n clean ($(ls "$corpus" | wc -l) inputs in $corpus)"
  else
    tail -n 60 "$BUILD/fuzz_$n.log"
    echo "fuzz: fuzz_$n FAILED (inputs in $arts)"
    status=1
  fi
done
exit $status
