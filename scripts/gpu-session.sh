#!/usr/bin/env bash
# gpu-session.sh — one full run on the GPU machine, for the device tool's single call: unpacks the
# carried Vulkan loader (.gl/*.deb), registers NVIDIA's OpenCL library, then runs `ember info`,
# the runtime/kernel/lang suites on cuda:0 (scripts/gpu-test.sh), the conformance suite on every
# NVIDIA backend, the tensor suites on cuda:0 and vulkan:0, and the benchmarks with their PyTorch
# references (scripts/gpu-bench.sh). Everything lands in one archive $OUT/gpu-session.tgz (the
# device tool brings back few files) and a short table is printed last.
#
#   EMBER_COMMIT=<sha> scripts/gpu-session.sh [--build DIR] [--skip-bench] [--extra 'CMD']
#       [--extra-timeout S] [--suites REGEX] [--deadline S]
#
# --extra runs CMD (bash) right after `ember info`, with at most --extra-timeout seconds (150).
# --suites picks the test programs of DIR/tests run on cuda:0 and vulkan:0 (default
# '^tensor_test_'). --deadline (default 540): steps that would start later than this many seconds
# after the start are skipped, so the archive is always written inside the device's call limit.
set -u
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
BUILD=$ROOT/build-gpu
BENCH=1
EXTRA=
EXTRA_TIMEOUT=150
SUITES='^tensor_test_'
DEADLINE=540
START=$(date +%s)
while [ $# -gt 0 ]; do
    case "$1" in
        --build) BUILD=$(realpath -m "$2"); shift 2 ;;
        --skip-bench) BENCH=0; shift ;;
        --extra) EXTRA=$2; shift 2 ;;
        --extra-timeout) EXTRA_TIMEOUT=$2; shift 2 ;;
        --suites) SUITES=$2; shift 2 ;;
        --deadline) DEADLINE=$2; shift 2 ;;
        *) echo "gpu-session.sh: unknown argument '$1'" >&2; exit 2 ;;
    esac
done
OUTDIR=${OUT:-/tmp/gpu-session}
LOGS=$OUTDIR/logs
mkdir -p "$LOGS"
export LD_LIBRARY_PATH=$BUILD/gpu-libs:${LD_LIBRARY_PATH:-}
[ -x "$BUILD/gpu-libs/glslangValidator" ] && export EMBER_GLSLANG=$BUILD/gpu-libs/glslangValidator
# test programs built elsewhere look for their source tree (kernels, fixtures) where they were
# built: point that path at this tree
SRC_AT_BUILD=$(sed -n 's/^CMAKE_HOME_DIRECTORY:INTERNAL=//p' "$BUILD/CMakeCache.txt" 2> /dev/null)
if [ -n "$SRC_AT_BUILD" ] && [ "$SRC_AT_BUILD" != "$ROOT" ] && [ ! -e "$SRC_AT_BUILD" ]; then
    mkdir -p "$(dirname "$SRC_AT_BUILD")" && ln -s "$ROOT" "$SRC_AT_BUILD"
fi

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
step() { # name, command... (STEP_TIMEOUT: seconds, default 150)
    local name=$1; shift
    local t0=$(date +%s)
    local left=$(( DEADLINE - (t0 - START) ))
    if [ "$left" -le 5 ]; then
        RESULT[$name]="skipped (deadline)"
        echo "== $name: ${RESULT[$name]}"
        return
    fi
    local limit=${STEP_TIMEOUT:-150}
    [ "$limit" -gt "$left" ] && limit=$left
    timeout "$limit" "$@" > "$LOGS/$name.txt" 2>&1
    local rc=$?
    RESULT[$name]="rc=$rc $(( $(date +%s) - t0 ))s"
    echo "== $name: ${RESULT[$name]}"
}

step info "$BUILD/ember" info
if [ "$BENCH" = 1 ]; then
    OUT=$LOGS/bench step gpu_bench "$ROOT/scripts/gpu-bench.sh" --build "$BUILD" --timeout 140
fi
[ -n "$EXTRA" ] && OUT=$LOGS/extra STEP_TIMEOUT=$EXTRA_TIMEOUT step extra bash -c "$EXTRA"
for dev in cuda:0 vulkan:0 opencl:0; do
    step "conformance_${dev%%:*}" "$BUILD/tests/conformance/conformance" "$dev"
done
OUT=$LOGS/gpu-test step gpu_test "$ROOT/scripts/gpu-test.sh" --build "$BUILD" --no-build --timeout 40 \
    --only '^(runtime_test_cuda|runtime_test_launch|runtime_test_cache|kernel_test_exec_(basic|control|numeric)|lang_test_exec)'
for dev in cuda:0 vulkan:0; do
    for t in "$BUILD"/tests/*; do
        [ -x "$t" ] && [ -f "$t" ] && [[ "$(basename "$t")" =~ $SUITES ]] || continue
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
