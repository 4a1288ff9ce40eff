#!/bin/sh
# pipeline.sh: the whole training pipeline, what `make train` runs.
#   corpus (Debian packages) -> BPE tokenizer -> token ids -> PyTorch training (resumable)
#   -> float32 export -> tide's quantising export (models/tide-tiny-en) + a BF16 export.
# TRAIN_OUT (default build/train) holds everything but the shipped checkpoint;
# TRAIN_ARGS are passed to train.py (e.g. "--minutes 5"). Rerunning resumes training
# from TRAIN_OUT/run/ckpt.pt; delete that directory to start over.
set -eu
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
cd "$ROOT"
OUT=${TRAIN_OUT:-$ROOT/build/train}
MODEL=${TRAIN_MODEL:-$ROOT/models/tide-tiny-en}
TIDE=${TIDE:-$ROOT/build/tide}
PY=/usr/bin/python3
mkdir -p "$OUT"

need=""
for p in python3-torch python3-regex; do dpkg -s "$p" >/dev/null 2>&1 || need="$need $p"; done
if [ -n "$need" ]; then
  echo "train: installing$need" >&2
  DEBIAN_FRONTEND=noninteractive apt-get install -y -o DPkg::Lock::Timeout=600 --no-install-recommends $need >/dev/null
fi
# Debian's torch calls libblas.so.3, which is the slow reference BLAS unless OpenBLAS is the
# system's choice. Use OpenBLAS (serial) for this process only, from its package unpacked here.
BLAS=/usr/lib/x86_64-linux-gnu/openblas-serial
if [ ! -e "$BLAS/libblas.so.3" ]; then
  BLAS=$OUT/debs/usr/lib/x86_64-linux-gnu/openblas-serial
  if [ ! -e "$BLAS/libblas.so.3" ]; then
    (cd "$OUT" && mkdir -p debs && cd debs && apt-get download libopenblas0-serial >/dev/null 2>&1 &&
      dpkg-deb -x libopenblas0-serial_*.deb .) || echo "train: no OpenBLAS; torch will be slow" >&2
  fi
fi
export LD_LIBRARY_PATH="$BLAS${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"

$PY scripts/train/corpus.py --out "$OUT"
$PY scripts/train/tokenizer.py train --corpus "$OUT" --vocab 4096 --out "$OUT/tokenizer"
for s in train heldout; do
  $PY scripts/train/tokenizer.py encode --tokenizer "$OUT/tokenizer" --in "$OUT/$s.txt" --out "$OUT/$s.u16"
done
# shellcheck disable=SC2086
$PY scripts/train/train.py --data "$OUT" --out "$OUT/run" ${TRAIN_ARGS:-}
$PY scripts/train/export.py --ckpt "$OUT/run/ckpt.pt" --out "$OUT/f32"
"$TIDE" scripts/train/export.lua --in "$OUT/f32" --out "$MODEL" --tokenizer "$OUT/tokenizer"
"$TIDE" scripts/train/export.lua --in "$OUT/f32" --out "$OUT/bf16" --variant bf16 --tokenizer "$OUT/tokenizer"
echo "train: done: $MODEL (FP8/MXFP4), $OUT/bf16 (BF16)" >&2
