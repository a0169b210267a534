#!/usr/bin/env bash
# gpu-session.sh — one full run on the GPU machine, for the device tool's single call: unpacks the
# carried Vulkan loader (.gl/*.deb), registers NVIDIA's OpenCL library, then runs `ember info`,
# the runtime/kernel/lang suites on cuda:0 (scripts/gpu-test.sh), the conformance suite on every
# NVIDIA backend, the tensor suites on cuda:0 and vulkan:0, and the benchmarks with their PyTorch
# references (scripts/gpu-bench.sh). Everything lands in one archive $OUT/gpu-session.tgz (the
# device tool brings back few files) and a short table is printed last.
#
#   EMBER_COMMIT=<sha> scripts/gpu-session.sh [--build DIR] [--skip-bench] [--extra 'CMD']
set -u
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
BUILD=$ROOT/build-gpu
BENCH=1
EXTRA=
while [ $# -gt 0 ]; do
    case "$1" in
        --build) BUILD=$(realpath -m "$2"); shift 2 ;;
        --skip-bench) BENCH=0; shift ;;
        --extra) EXTRA=$2; shift 2 ;;
        *) echo "gpu-session.sh: unknown argument '$1'" >&2; exit 2 ;;
    esac
done
OUTDIR=${OUT:-/tmp/gpu-session}
LOGS=$OUTDIR/logs
mkdir -p "$LOGS"
export LD_LIBRARY_PATH=$BUILD/gpu-libs:${LD_LIBRARY_PATH:-}

# Vulkan loader and NVIDIA ICD; NVIDIA OpenCL.
if ls "$ROOT"/.gl/*.deb > /dev/null 2>&1; then
    for f in "$ROOT"/.gl/*.deb; do dpkg -x "$f" /; done
    ldconfig
fi
for icd in /usr/local/nvidia/share/vulkan/icd.d/nvidia_icd.json /usr/share/vulkan/icd.d/nvidia_icd.json; do
    [ -f "$icd" ] && export VK_DRIVER_FILES=$icd && break
done
ocl=$(ls /usr/local/nvidia/lib64/libnvidia-opencl.so* 2> /dev/null | head -1)
if [ -n "$ocl" ]; then
    mkdir -p /tmp/ember-ocl && echo "$ocl" > /tmp/ember-ocl/nvidia.icd
    export OCL_ICD_VENDORS=/tmp/ember-ocl
fi

declare -A RESULT
step() { # name, command...
    local name=$1; shift
    local t0=$(date +%s)
    timeout 150 "$@" > "$LOGS/$name.txt" 2>&1
    local rc=$?
    RESULT[$name]="rc=$rc $(( $(date +%s) - t0 ))s"
    echo "== $name: ${RESULT[$name]}"
}

step info "$BUILD/ember" info
if [ "$BENCH" = 1 ]; then
    OUT=$LOGS/bench step gpu_bench "$ROOT/scripts/gpu-bench.sh" --build "$BUILD" --timeout 140
fi
[ -n "$EXTRA" ] && step extra bash -c "$EXTRA"
for dev in cuda:0 vulkan:0 opencl:0; do
    step "conformance_${dev%%:*}" "$BUILD/tests/conformance/conformance" "$dev"
done
OUT=$LOGS/gpu-test step gpu_test "$ROOT/scripts/gpu-test.sh" --build "$BUILD" --no-build --timeout 40 \
    --only '^(runtime_test_cuda|runtime_test_launch|runtime_test_cache|kernel_test_exec_(basic|control|numeric)|lang_test_exec)'
for dev in cuda:0 vulkan:0; do
    for t in "$BUILD"/tests/tensor_test_*; do
        EMBER_TEST_DEVICE=$dev step "$(basename "$t")_${dev%%:*}" "$t"
    done
done

echo
echo "== summary"
for k in $(echo "${!RESULT[@]}" | tr ' ' '\n' | sort); do printf '%-40s %s\n' "$k" "${RESULT[$k]}"; done
for f in "$LOGS"/conformance_*.txt; do echo "-- $(basename "$f"):"; tail -4 "$f"; done
[ -f "$LOGS/gpu-test/summary.txt" ] && { echo "-- gpu-test summary:"; tail -30 "$LOGS/gpu-test/summary.txt"; }
for f in $(find "$LOGS/bench" -name summary.txt 2> /dev/null); do echo "-- bench summary:"; cat "$f"; done
(cd "$OUTDIR" && tar czf gpu-session.tgz logs && rm -rf logs)
