#!/bin/sh
# scripts/fuzz.sh [--build-only | --no-build] [SECONDS] [NAME...]
# Build the libFuzzer targets with clang (AddressSanitizer + UBSan, the
# library instrumented for coverage) in build-fuzz/ ($FUZZ_BUILD), then run
# each for SECONDS (default $FUZZ_SECONDS, else 60), one after the other.
# NAME is a target: tests/fuzz/fuzz_NAME.c (C) or tests/fuzz/fuzz_NAME.lua
# (Lua, run by tests/fuzz/lua_harness.c); no NAME = every target.
#   --build-only  build the targets and the fuzz model, run nothing
#                 (make test's fuzz/build fixture)
#   --no-build    run targets built before (make test's fuzz/NAME tests)
# Seeds come from tests/fuzz/corpus/NAME/, tokens from tests/fuzz/fuzz_NAME.dict;
# the growing corpus, the logs and any crash inputs stay in the build
# directory. The Lua targets load generated checkpoints (presets demo and
# tiny) from $TIDE_FUZZ_MODELS, default $FUZZ_BUILD/models, made here.
# FUZZ_RUNS=N also ends each run after N executions (whichever comes first).
# Each run ends with one line: "fuzz: NAME clean: R runs in S s, cov C,
# ft F, corpus N" (cov = C edges of libtide, ft = libFuzzer's features,
# Lua line pairs included).
# Exit status: 0 when every run is clean, 1 on a finding or a build failure,
# 77 (skipped) when clang's libFuzzer is not installed.
set -e
ROOT=$(cd "$(dirname "$0")/.." && pwd)
MODE=all
case "$1" in
  --build-only) MODE=build; shift ;;
  --no-build) MODE=run; shift ;;
esac
SECS=${FUZZ_SECONDS:-60}
RUNS=${FUZZ_RUNS:--1}
case "$1" in
  ''|*[!0-9]*) ;;
  *) SECS=$1; shift ;;
esac
BUILD=${FUZZ_BUILD:-$ROOT/build-fuzz}
CC=${FUZZ_CC:-clang}
export TIDE_FUZZ_MODELS=${TIDE_FUZZ_MODELS:-$BUILD/models}

mkdir -p "$BUILD"
probe="$BUILD/probe.$$.c"
echo 'int LLVMFuzzerTestOneInput(const unsigned char *d, unsigned long n) { (void)d; (void)n; return 0; }' > "$probe"
if ! command -v "$CC" >/dev/null 2>&1 || ! "$CC" -fsanitize=fuzzer,address "$probe" -o "$BUILD/probe.$$" >/dev/null 2>&1; then
  rm -f "$probe"
  echo "fuzz: $CC with libFuzzer (-fsanitize=fuzzer) is unavailable: install clang and libclang-rt-14-dev" \
       "(scripts/deps.sh); fuzzing skipped"
  exit 77
fi
rm -f "$probe" "$BUILD/probe.$$"

all=""
for f in "$ROOT"/tests/fuzz/fuzz_*.c "$ROOT"/tests/fuzz/fuzz_*.lua; do
  n=$(basename "$f"); n=${n%.c}; n=${n%.lua}; n=${n#fuzz_}
  [ "$n" = common ] || all="$all $n"
done
[ $# -eq 0 ] && set -- $all

if [ "$MODE" != run ]; then
  targets="tide_cli"
  for n in $all; do targets="$targets fuzz_$n"; done
  log="$BUILD/build.log"
  # a new build directory leaves the AVX-512 kernels out: the parsers do not
  # need them, and clang takes very long over them with the sanitizers on
  first=""
  [ -f "$BUILD/CMakeCache.txt" ] || first="-DTIDE_CC_AVX512=OFF"
  if ! { cmake -S "$ROOT" -B "$BUILD" $first -DCMAKE_C_COMPILER="$CC" -DCMAKE_BUILD_TYPE=Debug \
           -DCMAKE_C_FLAGS="-O1 -g -fsanitize=fuzzer-no-link" -DTIDE_FUZZ=ON -DTIDE_SANITIZE=address,undefined \
           -DTIDE_DNNL=OFF && \
         cmake --build "$BUILD" -j2 --target $targets; } > "$log" 2>&1; then
    cat "$log"
    echo "fuzz: build failed"
    exit 1
  fi
  # the models are deterministic: any tide makes the same bytes, and the
  # uninstrumented one (make test's, or build/) is much faster
  gen="$BUILD/tide"
  for cand in "$TIDE_EXE" "$ROOT/build/tide"; do
    if [ -n "$cand" ] && [ -x "$cand" ]; then gen=$cand; break; fi
  done
  for preset in demo tiny; do
    dir="$TIDE_FUZZ_MODELS/$preset"
    [ -f "$dir/config.json" ] && continue
    rm -rf "$dir.tmp"
    if ! ASAN_OPTIONS=detect_leaks=0 "$gen" "$ROOT/scripts/make_checkpoint.lua" --preset $preset --quiet \
           --out "$dir.tmp" > "$BUILD/model.log" 2>&1; then
      cat "$BUILD/model.log"
      echo "fuzz: cannot generate the fuzz model $preset"
      exit 1
    fi
    mv "$dir.tmp" "$dir"
  done
  echo "fuzz: built$(for n in $all; do printf ' fuzz_%s' "$n"; done) in $BUILD"
  [ "$MODE" = build ] && exit 0
fi

status=0
for n in "$@"; do
  exe="$BUILD/fuzz_$n"
  if [ ! -x "$exe" ]; then
    echo "fuzz: $exe is missing (scripts/fuzz.sh --build-only builds it)"
    status=1
    continue
  fi
  corpus="$BUILD/corpus/$n"
  arts="$BUILD/artifacts/$n/"
  mkdir -p "$corpus" "$arts"
  dict=""
  [ -f "$ROOT/tests/fuzz/fuzz_$n.dict" ] && dict="-dict=$ROOT/tests/fuzz/fuzz_$n.dict"
  seeds=""
  [ -d "$ROOT/tests/fuzz/corpus/$n" ] && seeds="$ROOT/tests/fuzz/corpus/$n"
  # libFuzzer runs LeakSanitizer after an input whose mallocs and frees do
  # not balance; for a Lua target that reports everything only LuaJIT's heap
  # holds (LSan does not scan it: the models), and the server's connection
  # thread unbalances inputs at random. Lua targets count tide's allocations
  # per input instead (lua_harness.c); LSan still checks at exit, after the
  # Lua state is closed.
  leaks=""
  [ -f "$ROOT/tests/fuzz/fuzz_$n.lua" ] && leaks="-detect_leaks=0"
  echo "fuzz: fuzz_$n for ${SECS}s"
  flog="$BUILD/fuzz_$n.log"
  # shellcheck disable=SC2086
  if TMPDIR="$BUILD" ASAN_OPTIONS=detect_leaks=1:allocator_may_return_null=1 \
       UBSAN_OPTIONS=halt_on_error=1:print_stacktrace=1 \
       "$exe" -max_total_time="$SECS" -runs="$RUNS" -timeout=30 -rss_limit_mb=3072 -print_final_stats=1 \
       -artifact_prefix="$arts" $leaks $dict "$corpus" $seeds > "$flog" 2>&1; then
    runs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$flog" | tail -n 1)
    took=$(sed -n 's/^Done [0-9]* runs in \([0-9]*\) second.*/\1/p' "$flog" | tail -n 1)
    last=$(grep -E '^#[0-9]+' "$flog" | tail -n 1)
    cov=$(echo "$last" | sed -n 's/.*cov: \([0-9]*\).*/\1/p')
    ft=$(echo "$last" | sed -n 's/.*ft: \([0-9]*\).*/\1/p')
    echo "fuzz: $n clean: ${runs:-0} runs in ${took:-$SECS} s, cov ${cov:-?}, ft ${ft:-?}, corpus $(ls "$corpus" | wc -l)"
  else
    tail -n 60 "$flog"
    echo "fuzz: fuzz_$n FAILED (log $flog, inputs in $arts)"
    status=1
  fi
done
exit $status
