#!/usr/bin/env bash
# gpu-gpt2.sh — GPT-2 (124M by default) on the GPU machine: `ember train` and PyTorch trained on the
# same token shards from the same initial weights, for the side-by-side loss curve of
# docs/benchmarks.md (issue #10). PyTorch writes a fresh Hugging Face GPT2LMHeadModel
# (bench/reference/gpt2_curve.py --make-init), ember starts from it (--init-from), both train
# N steps with the same batches (no shuffling), schedule, AdamW settings and clipping, then a table
# of the losses at a few steps and the throughput of each is printed.
#
#   scripts/gpu-gpt2.sh --data DIR [--build DIR] [--steps N] [--batch B] [--seq T] [--time S]
#                       [--bf16] [--device NAME]
#
# DIR holds train_000000.bin from `ember data prepare --tokenizer gpt2` (made on the development
# machine and carried, since the GPU machine has no GPT-2 tokenizer files). Results go to $OUT
# (default /tmp/gpu-gpt2): ember_metrics.jsonl, ember_train.txt, torch_curve.jsonl, loss.svg,
# summary.txt. The checkpoints and the initial weights stay in /tmp (they are large).
set -u
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
BUILD=$ROOT/build-gpu
DATA=
STEPS=200
BATCH=8
SEQ=1024
TIME=240
BF16=
DEVICE=cuda:0
while [ $# -gt 0 ]; do
    case "$1" in
        --data) DATA=$(realpath -m "$2"); shift 2 ;;
        --build) BUILD=$(realpath -m "$2"); shift 2 ;;
        --steps) STEPS=$2; shift 2 ;;
        --batch) BATCH=$2; shift 2 ;;
        --seq) SEQ=$2; shift 2 ;;
        --time) TIME=$2; shift 2 ;;
        --bf16) BF16=--bf16; shift ;;
        --device) DEVICE=$2; shift 2 ;;
        *) echo "gpu-gpt2.sh: unknown argument '$1'" >&2; exit 2 ;;
    esac
done
[ -f "$DATA/train_000000.bin" ] || { echo "gpu-gpt2.sh: --data DIR with train_000000.bin needed" >&2; exit 2; }
RES=${OUT:-/tmp/gpu-gpt2}
WORK=/tmp/gpu-gpt2-work
mkdir -p "$RES" "$WORK"
COMMON=(--steps "$STEPS" --batch "$BATCH" --seq "$SEQ" --lr 6e-4 --min-lr 6e-5 --warmup 20)

python3 "$ROOT/bench/reference/gpt2_curve.py" --make-init "$WORK/init" > "$RES/init.txt" 2>&1 ||
    { echo "gpu-gpt2.sh: making the initial weights failed:"; tail -5 "$RES/init.txt"; exit 1; }
"$BUILD/ember" train --init-from "$WORK/init/model.safetensors" --data "$DATA" "${COMMON[@]}" \
    --weight-decay 0.1 --grad-clip 1.0 --dropout 0 --eval-every 50 --eval-batches 4 \
    --sample-every -1 --ckpt-every 1000000 --dashboard plain --device "$DEVICE" $BF16 \
    --time "$TIME" --out "$WORK/ember" > "$RES/ember_train.txt" 2>&1
echo "ember train: rc=$?"
cp "$WORK/ember/metrics.jsonl" "$RES/ember_metrics.jsonl" 2> /dev/null
cp "$WORK/ember/loss.svg" "$RES/loss.svg" 2> /dev/null
python3 "$ROOT/bench/reference/gpt2_curve.py" --init "$WORK/init" --data "$DATA/train_000000.bin" \
    "${COMMON[@]}" --wd 0.1 --clip 1.0 ${BF16:+--bf16} > "$RES/torch_curve.jsonl" 2> "$RES/torch.txt"
echo "torch: rc=$?"
python3 - "$RES" "$BATCH" "$SEQ" << 'PY' | tee "$RES/summary.txt"
import json, sys, statistics
res, B, T = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
def load(path):
    out = {}
    try:
        for line in open(path):
            try:
                j = json.loads(line)
            except ValueError:
                continue
            if "loss" in j and "step" in j:
                out[j["step"]] = j
    except OSError:
        pass
    return out
e, t = load(res + "/ember_metrics.jsonl"), load(res + "/torch_curve.jsonl")
print(f"{'step':>6} {'ember loss':>11} {'torch loss':>11}")
last = max(list(e) + list(t) + [0])
for s in sorted({1, 10, 25, 50, 100, 150, 200, last}):
    if s in e or s in t:
        el = e.get(s, {}).get("loss"); tl = t.get(s, {}).get("loss")
        print(f"{s:>6} {el if el is not None else '-':>11} {tl if tl is not None else '-':>11}")
def med(d, key, skip=5):
    v = [d[s][key] for s in sorted(d)[skip:] if d[s].get(key) is not None]
    return statistics.median(v) if v else None
et = med(e, "tokens_per_s"); tms = med(t, "ms")
print(f"ember tokens/s (median after 5 steps): {et}")
print(f"torch tokens/s (median after 5 steps): {B * T / (tms / 1000) if tms else None}")
PY
rm -rf "$WORK"
