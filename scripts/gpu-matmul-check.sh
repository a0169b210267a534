#!/usr/bin/env bash
# gpu-matmul-check.sh — issue #11's check of the Hopper matmul (src/kernels/matmul_wgmma.ek) on
# the H200, in one call, from a built tree:
#
#   scripts/gpu-matmul-check.sh [BUILD_DIR]        (default: build-gpu)
#
# 1. correctness first: tests/tensor/test_matmul (every kernel and layout, the wgmma kernel
#    natively on sm_90a, against float64 references) and tests/kernel/test_wgmma on cuda:0;
#    a failure stops the script with exit code 1 before any figure is printed;
# 2. `ember bench matmul --dtype bf16` on the issue's shapes (4096^3, 8192^3, GPT-2's), three
#    ways: autotuned (what users get: wgmma and mma candidates), and the wgmma kernel forced at
#    128x256 and at 128x128 tiles; EMBER_LOG=debug names the kernel and configuration chosen;
# 3. a table: shape, TFLOP/s of each run, cuBLAS's TFLOP/s and the ratio.
# Logs go to $OUT when set (the device machine's output folder), else BUILD_DIR/gpu-matmul-logs.
# A fresh kernel and autotune cache is used, so earlier winners do not decide.
set -u

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
BUILD=${1:-$ROOT/build-gpu}
[ -d "$BUILD" ] || BUILD=$ROOT/$BUILD
LOGS=${OUT:-$BUILD/gpu-matmul-logs}
mkdir -p "$LOGS"
EMBER=$BUILD/ember
[ -x "$EMBER" ] || { echo "gpu-matmul-check: no ember binary at $EMBER (build first)"; exit 2; }
export EMBER_CACHE_DIR=$(mktemp -d /tmp/ember-mm-cache.XXXXXX)
export EMBER_TEST_DEVICE=cuda:0
trap 'rm -rf "$EMBER_CACHE_DIR"' EXIT

echo "== correctness (cuda:0) =="
fail=0
for t in tensor_test_matmul kernel_test_wgmma; do
    if [ ! -x "$BUILD/tests/$t" ]; then
        echo "  $t: MISSING"; fail=1; continue
    fi
    start=$(date +%s)
    if timeout 1200 "$BUILD/tests/$t" > "$LOGS/$t.log" 2>&1; then
        echo "  $t: passed ($(( $(date +%s) - start )) s)"
    else
        echo "  $t: FAILED (log: $LOGS/$t.log)"; tail -40 "$LOGS/$t.log"; fail=1
    fi
done
grep -q "running on cuda:0" "$LOGS/tensor_test_matmul.log" 2>/dev/null ||
    { echo "  tensor_test_matmul did not run on cuda:0"; fail=1; }
if [ $fail -ne 0 ]; then
    echo "gpu-matmul-check: WRONG RESULTS or missing tests: no benchmark"; exit 1
fi

SHAPES=4096x4096x4096,8192x8192x8192,16384x2304x768,16384x768x768,16384x3072x768,16384x768x3072,16384x50304x768
run() { # NAME CONFIG(or "")
    if [ -n "$2" ]; then export EMBER_MATMUL_CONFIG=$2; else unset EMBER_MATMUL_CONFIG; fi
    EMBER_LOG=debug "$EMBER" bench matmul --device cuda:0 --dtype bf16 --shapes "$SHAPES" \
        > "$LOGS/bench-$1.jsonl" 2> "$LOGS/bench-$1.log"
    local rc=$?
    unset EMBER_MATMUL_CONFIG
    [ $rc -eq 0 ] || { echo "  bench $1: exit $rc"; tail -20 "$LOGS/bench-$1.log"; }
    return $rc
}
echo "== ember bench matmul --dtype bf16 =="
run auto "" || fail=1
run wg256 "wgmma 128x256x64 2x1 s1" || fail=1
run wg128 "wgmma 128x128x64 2x1 s1" || fail=1
echo "kernels chosen (autotuned):"
grep -o 'matmul matmul-v3 [^"]*"[^"]*"[^[]*\[[^]]*\]' "$LOGS/bench-auto.log" | sed 's/^/  /' | sort -u

# one JSON line per shape -> "M N K ember_tflops ref_tflops ratio"
fields() {
    sed -n 's/.*"shape":\[\([0-9]*\),\([0-9]*\),\([0-9]*\)\].*"ember_tflops":\([0-9.]*\).*"ref_tflops":\([0-9.]*\),"ratio":\([0-9.]*\).*/\1x\2x\3 \4 \5 \6/p' "$1"
}
echo
printf '%-18s %12s %12s %12s %12s %8s\n' shape "auto TF/s" "wg256 TF/s" "wg128 TF/s" "cuBLAS TF/s" "ratio"
fields "$LOGS/bench-auto.jsonl" | while read -r shape t ref ratio; do
    w1=$(fields "$LOGS/bench-wg256.jsonl" | awk -v s="$shape" '$1 == s {print $2}')
    w2=$(fields "$LOGS/bench-wg128.jsonl" | awk -v s="$shape" '$1 == s {print $2}')
    printf '%-18s %12s %12s %12s %12s %8s\n' "$shape" "$t" "${w1:--}" "${w2:--}" "$ref" "$ratio"
done | tee "$LOGS/table.txt"
echo "(ratio: cuBLAS time / ember time for the autotuned run; the goal is >= 0.8)"
echo "logs: $LOGS"
exit $fail
