#!/bin/sh
# measure.sh: the numbers of docs/training.md, through tide (and PyTorch for the MTP).
#   scripts/train/measure.sh [MODEL_DIR] [BF16_DIR]   (after `make train`; logs to build/train/measure/)
set -eu
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
cd "$ROOT"
MODEL=${1:-models/tide-tiny-en}
BF16=${2:-build/train/bf16}
OUT=build/train/measure
TIDE=${TIDE:-build/tide}
mkdir -p "$OUT"
# the evaluation text: ~40 KB of held-out documents (26 KB of KJV chapters, 14 KB of fortunes)
/usr/bin/python3 scripts/train/eval_text.py build/train/heldout.txt "$OUT/eval.txt"
P="$TIDE perplexity --file $OUT/eval.txt --ctx 256 --batch 4 --quiet"
echo "== held-out bits per byte, FP8/MXFP4 vs BF16 (ctx 256)"
$P --model "$MODEL" | tee "$OUT/fp8.txt"
$P --model "$BF16" | tee "$OUT/bf16.txt"
echo "== indexer: trained top-k vs every compressed entry vs a random top-k"
$P --model "$MODEL" --index dense | tee "$OUT/dense.txt"
$P --model "$MODEL" --index random:1 | tee "$OUT/random.txt"
echo "== golden reference vs fast path (first 1000 tokens)"
rm -f "$OUT/ref.kld"
$P --model "$MODEL" --limit 1000 --reference --kld-base "$OUT/ref.kld"
$P --model "$MODEL" --limit 1000 --kld-base "$OUT/ref.kld" | tee "$OUT/kl.txt"
rm -f "$OUT/ref.kld"
echo "== MTP greedy acceptance (PyTorch)"
BLAS=/usr/lib/x86_64-linux-gnu/openblas-serial
[ -e "$BLAS/libblas.so.3" ] || BLAS=build/train/debs/usr/lib/x86_64-linux-gnu/openblas-serial
LD_LIBRARY_PATH=$BLAS /usr/bin/python3 scripts/train/mtp_accept.py --ckpt build/train/run/ckpt.pt --data build/train \
  --windows 16 | tee "$OUT/mtp.txt"
echo "== sampling"
G="$TIDE generate --model $MODEL --prompt 'And the king said' --max-tokens 48 --seed 1"
for opt in "--temp 0.3" "--temp 1.2" "--temp 0.8 --repeat-penalty 1.5"; do
  echo "-- $opt"
  sh -c "$G $opt" 2>/dev/null
  echo
done | tee "$OUT/sampling.txt"
