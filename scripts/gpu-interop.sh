#!/usr/bin/env bash
# gpu-interop.sh — the checks that need PyTorch, transformers and Python's safetensors, run on the
# GPU machine (whose image has them) in one call; results land in $OUT (default /tmp/gpu-interop):
#   fixtures/         every tests/fixtures/gen/*.py run afresh (commit what changed)
#   export/           an ember-trained GPT exported with `ember sample --export-hf` (model.safetensors
#                     + config.json) and transformers_logits.json: the logits transformers computes
#                     for it (tests/models/test_gpt.c compares ember's own logits against them)
#   safetensors.txt   Python's safetensors reading a training checkpoint ember wrote
#   summary.txt       one line per check
#   scripts/gpu-interop.sh [--build DIR] [--device NAME]
set -u
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
BUILD=$ROOT/build-gpu
DEVICE=cuda:0
while [ $# -gt 0 ]; do
    case "$1" in
        --build) BUILD=$(realpath -m "$2"); shift 2 ;;
        --device) DEVICE=$2; shift 2 ;;
        *) echo "gpu-interop.sh: unknown argument '$1'" >&2; exit 2 ;;
    esac
done
RES=${OUT:-/tmp/gpu-interop}
WORK=/tmp/gpu-interop-work
mkdir -p "$RES/fixtures" "$WORK"
SUMMARY=$RES/summary.txt
: > "$SUMMARY"
STAMP=$WORK/start.stamp
touch "$STAMP"
sleep 1
say() { echo "$*" | tee -a "$SUMMARY"; }

# 1. fixtures: each generator writes into tests/fixtures/ (or the path given), copied out
for gen in "$ROOT"/tests/fixtures/gen/*.py; do
    name=$(basename "$gen" .py)
    if timeout 120 python3 "$gen" > "$RES/fixtures/$name.log" 2>&1; then
        say "fixture $name: ok"
    else
        say "fixture $name: FAILED (rc $?)"
    fi
done
(cd "$ROOT/tests/fixtures" && find . -maxdepth 2 -newer "$STAMP" -type f ! -path './gen/*' \
    -exec cp --parents {} "$RES/fixtures/" \;)

# 2. an ember-trained GPT (a few steps on docs/architecture.md, characters) exported for transformers
EMBER=$BUILD/ember
if timeout 120 "$EMBER" train --data "$ROOT/docs/architecture.md" --preset tiny --steps 3 --batch 4 --seq 32 \
        --device "$DEVICE" --dashboard quiet --sample-every -1 --eval-every 1000 \
        --out "$WORK/train" > "$RES/train.txt" 2>&1 &&
    "$EMBER" sample --checkpoint "$WORK/train" --export-hf "$RES/export" >> "$RES/train.txt" 2>&1 &&
    timeout 120 python3 "$ROOT/tests/fixtures/gen/gpt2_tiny.py" --check-ember "$RES/export" \
        >> "$RES/train.txt" 2>&1; then
    say "export: transformers loaded ember's export ($(tail -1 "$RES/train.txt"))"
else
    say "export: FAILED (see train.txt)"
fi

# 3. Python's safetensors reads the training checkpoint ember wrote (model, optimizer, metadata)
if python3 - "$WORK/train/ckpt.safetensors" > "$RES/safetensors.txt" 2>&1 << 'PY'
import sys
from safetensors import safe_open
with safe_open(sys.argv[1], framework="np") as f:
    keys = list(f.keys())
    total = sum(f.get_tensor(k).size for k in keys)
    meta = f.metadata() or {}
print(f"{sys.argv[1]}: {len(keys)} tensors, {total} elements, metadata keys {sorted(meta)}")
PY
then
    say "safetensors: $(tail -1 "$RES/safetensors.txt")"
else
    say "safetensors: FAILED ($(tail -1 "$RES/safetensors.txt"))"
fi
rm -rf "$WORK"
cat "$SUMMARY"
