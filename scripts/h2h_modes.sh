#!/bin/bash
# h2h_modes.sh: llama.cpp beside tide's exact path and its opt-in int8 mode
# (TIDE_Q8=all) on the same checkpoint, interleaved per round: llama-bench
# (pp512, tg64, tg32 at depth 4096), then scripts/bench_model.lua with
# TIDE_Q8=off and =all. Needs the llama.cpp build and GGUF that
# ../shared/peers/h2h.sh makes (run that once first). Run from tide's root.
# env: THREADS (2), ROUNDS (2), LOG (build/h2h_modes.log), LLAMA_DIR
set -u
LD=${LLAMA_DIR:-$HOME/.cache/tide-llama}
LB=$LD/build/bin/llama-bench
W=$LD/h2h
CK=$W/tide_bench; G=$W/tide_bench.native.gguf
T=${THREADS:-2}; R=${ROUNDS:-2}
log=${LOG:-build/h2h_modes.log}; : > "$log"
[ -x "$LB" ] && [ -f "$G" ] || { echo "h2h_modes: run ../shared/peers/h2h.sh first (no $LB or $G)" >&2; exit 1; }
for r in $(seq "$R"); do
  echo "## round $r llama t=$T load $(cut -d' ' -f1 /proc/loadavg)" >> "$log"
  "$LB" -m "$G" -t "$T" -p 512 -n 64 -r 3 -o md >> "$log" 2>/dev/null
  "$LB" -m "$G" -t "$T" -p 0 -n 32 -d 4096 -r 2 -o md 2>/dev/null | grep tg >> "$log"
  for q in off all; do
    echo "## round $r tide q8=$q t=$T load $(cut -d' ' -f1 /proc/loadavg)" >> "$log"
    TIDE_Q8=$q OMP_NUM_THREADS=$T ./build/tide scripts/bench_model.lua --model "$CK" --threads "$T" >> "$log" 2>&1
  done
done
grep -E '^## |pp512|tg64|tg32|prefill|decode at|bandwidth' "$log"
