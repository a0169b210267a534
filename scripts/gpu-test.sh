#!/usr/bin/env bash
# gpu-test.sh — runs ember's runtime and kernel test suites on a GPU (the H200 machine of
# docs/backends.md) and keeps the logs.
#
#   scripts/gpu-test.sh [--device NAME] [--build DIR] [--no-build] [--only REGEX] [--timeout S]
#   scripts/gpu-test.sh --prepare [--build DIR]      (on the development machine)
#
# Normal mode (on the GPU machine): configures and builds ember in DIR (default build-gpu) with
# gcc and -DEMBER_WERROR=OFF (another gcc may warn differently), prints the machine (nvidia-smi,
# toolkit, compiler, commit) and `ember info`, then runs every runtime_test_* and kernel_test_*
# (and lang_test_*) executable of the build (DIR/tests), the CUDA ones first, each with at most S
# seconds (default 300; --only REGEX picks programs by name), with EMBER_TEST_DEVICE=NAME (default cuda:0; tests that take a device
# read it) and a fresh kernel cache. When the machine cannot build (no cmake, or no cmocka /
# cJSON development files), a build folder made with --prepare and carried along is used as it
# is (--no-build forces that). The commit shown is $EMBER_COMMIT when set (a copy of the tree
# without .git cannot tell), else git's. Logs go to $OUT when it is set, else DIR/gpu-test-logs:
#   summary.txt   what ran, and the result of each test program
#   machine.txt   nvidia-smi, driver, toolkit, compiler, commit
#   build.txt     configure and build output
#   info.txt      `ember info`
#   tests/NAME.log  each test program's output
# Exits 0 when everything built and every test program passed (skips are fine), 1 when a program
# failed or a target did not build, 2 when nothing could be run.
#
# --prepare (on the development machine): builds DIR the same way, copies the shared libraries
# the tests need that the GPU machine may lack (cmocka, cJSON, libmicrohttpd, and glslangValidator for Vulkan) into DIR/gpu-libs and strips debug
# info from the programs, so that DIR can be carried to the GPU machine and run with --no-build.
set -u

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
BUILD=$ROOT/build-gpu
DEVICE=${EMBER_TEST_DEVICE:-cuda:0}
MODE=run
NO_BUILD=0
ONLY='^(runtime|kernel|lang)_test_'
TIMEOUT=300

while [ $# -gt 0 ]; do
    case "$1" in
        --device) DEVICE=$2; shift 2 ;;
        --build) BUILD=$(realpath -m "$2"); shift 2 ;;
        --no-build) NO_BUILD=1; shift ;;
        --only) ONLY=$2; shift 2 ;;
        --timeout) TIMEOUT=$2; shift 2 ;;
        --prepare) MODE=prepare; shift ;;
        -h|--help) sed -n '2,30p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
        *) echo "gpu-test.sh: unknown argument '$1' (try --help)" >&2; exit 2 ;;
    esac
done

LOGS=${OUT:-$BUILD/gpu-test-logs}
mkdir -p "$LOGS/tests"
SUMMARY=$LOGS/summary.txt
: > "$SUMMARY"
say() { echo "$*" | tee -a "$SUMMARY"; }

can_build() {
    command -v cmake > /dev/null && command -v gcc > /dev/null &&
        command -v pkg-config > /dev/null && pkg-config --exists cmocka libcjson
}

# Configures and builds; a target that fails to build (someone's half-finished test) does not
# stop the others (make -k): the run goes on with what was built, and the summary says so.
build() {
    say "== building in $BUILD (gcc, EMBER_WERROR=OFF)"
    CC=gcc cmake -S "$ROOT" -B "$BUILD" -DCMAKE_BUILD_TYPE=RelWithDebInfo -DEMBER_WERROR=OFF \
        > "$LOGS/build.txt" 2>&1 || {
        say "configure FAILED; the end of $LOGS/build.txt:"
        tail -30 "$LOGS/build.txt" | tee -a "$SUMMARY"
        return 1
    }
    cmake --build "$BUILD" -j "$(nproc)" -- -k >> "$LOGS/build.txt" 2>&1
    local rc=$?
    if [ $rc -ne 0 ]; then
        say "build had ERRORS (exit $rc); running what was built. The errors:"
        grep -a -E 'error:|Error [0-9]|undefined reference' "$LOGS/build.txt" | head -30 | sed 's/^/    /' | tee -a "$SUMMARY"
        BUILD_ERRORS=1
    fi
    ls "$BUILD"/tests/*_test_* > /dev/null 2>&1
}
BUILD_ERRORS=0

if [ "$MODE" = prepare ]; then
    can_build || { say "cannot build here: need cmake, gcc, pkg-config, cmocka and cJSON"; exit 2; }
    build || exit 1
    mkdir -p "$BUILD/gpu-libs"
    for exe in "$BUILD"/ember "$BUILD"/tests/*_test_*; do
        [ -x "$exe" ] || continue
        ldd "$exe" | awk '/=> \// {print $3}' | grep -E 'cmocka|cjson|microhttpd' || true
    done | sort -u | while read -r lib; do cp -L "$lib" "$BUILD/gpu-libs/"; done
    # the GLSL compiler of ember's Vulkan driver, absent there: Debian's glslangValidator (linked
    # statically against glslang; Debian's libshaderc.so.1 cannot be loaded on its own, see
    # src/runtime/drivers/vulkan_spirv.c), found through EMBER_GLSLANG
    g=$(command -v glslangValidator || true)
    [ -n "$g" ] && cp -L "$g" "$BUILD/gpu-libs/"
    # debug info would make the folder too big to carry (the GPU machine has no debugger anyway)
    for exe in "$BUILD"/ember "$BUILD"/tests/*_test_* "$BUILD"/bench/*; do
        [ -f "$exe" ] && [ -x "$exe" ] && strip --strip-debug "$exe" 2> /dev/null
    done
    say "prepared $BUILD ($(du -sh "$BUILD" | cut -f1)); libraries in gpu-libs: $(ls "$BUILD/gpu-libs" | tr '\n' ' ')"
    say "carry it to the GPU machine and run: scripts/gpu-test.sh --build ${BUILD#"$ROOT"/} --no-build"
    exit 0
fi

# ---- the machine ---------------------------------------------------------------------------
{
    echo "date: $(date -u '+%Y-%m-%d %H:%M:%S UTC')"
    if [ -n "${EMBER_COMMIT:-}" ]; then
        echo "commit: $EMBER_COMMIT"
    elif git -C "$ROOT" rev-parse --short HEAD > /dev/null 2>&1; then
        echo "commit: $(git -C "$ROOT" rev-parse --short HEAD)$(git -C "$ROOT" diff --quiet HEAD || echo ' (with local changes)')"
    else
        echo "commit: unknown (no git here; set EMBER_COMMIT)"
    fi
    echo "host: $(uname -srm)"
    echo "gcc: $(gcc --version 2>/dev/null | head -1)"
    echo "cmake: $(cmake --version 2>/dev/null | head -1)"
    echo "nvcc: $(/usr/local/cuda/bin/nvcc --version 2>/dev/null | tail -1)"
    echo "kernel module: $(head -1 /proc/driver/nvidia/version 2>/dev/null)"
    nvidia-smi 2>&1 || echo "nvidia-smi: not available"
} > "$LOGS/machine.txt" 2>&1
say "== $(sed -n 1,2p "$LOGS/machine.txt" | tr '\n' ' ')"
say "   $(nvidia-smi -L 2>/dev/null | head -4 | tr '\n' ' ')"

# ---- build ---------------------------------------------------------------------------------
if [ $NO_BUILD -eq 0 ] && can_build; then
    build || exit 1
else
    if ! ls "$BUILD"/tests/runtime_test_* > /dev/null 2>&1; then
        say "no build to run: this machine cannot build (needs cmake, gcc, pkg-config, cmocka and"
        say "cJSON) and $BUILD holds no test programs; run scripts/gpu-test.sh --prepare on the"
        say "development machine and carry the build folder along"
        exit 2
    fi
    say "== using the prebuilt $BUILD"
fi
if [ -d "$BUILD/gpu-libs" ]; then
    export LD_LIBRARY_PATH="$BUILD/gpu-libs${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
    [ -x "$BUILD/gpu-libs/glslangValidator" ] && export EMBER_GLSLANG="$BUILD/gpu-libs/glslangValidator"
fi

# ---- ember info ----------------------------------------------------------------------------
export EMBER_CACHE_DIR=$BUILD/gpu-test-cache
rm -rf "$EMBER_CACHE_DIR"
if [ -x "$BUILD/ember" ]; then
    "$BUILD/ember" info > "$LOGS/info.txt" 2>&1
    rc=$?
    if [ $rc -ge 128 ]; then
        say "== ember info CRASHED (signal $((rc - 128))); what it printed:"
    else
        say "== ember info (exit $rc):"
    fi
    tee -a "$SUMMARY" < "$LOGS/info.txt"
else
    say "== no ember binary in $BUILD"
fi

# ---- tests ---------------------------------------------------------------------------------
export EMBER_TEST_DEVICE=$DEVICE
export EMBER_LOG=${EMBER_LOG:-warn}
say "== tests on $DEVICE (EMBER_TEST_DEVICE), programs matching $ONLY"
passed=0
failed=0
ran=0
# the CUDA programs first, then the rest of runtime, kernel and lang
programs=$(cd "$BUILD/tests" && ls -1 | grep -E '_test_' | awk '
    /^runtime_test_cuda/ { print 0, $0; next }
    /^runtime_test_/ { print 1, $0; next }
    { print 2, $0 }' | sort -k1,1n -k2 | cut -d' ' -f2)
for name in $programs; do
    exe=$BUILD/tests/$name
    [ -x "$exe" ] && [ -f "$exe" ] || continue
    echo "$name" | grep -Eq "$ONLY" || continue
    ran=$((ran + 1))
    start=$(date +%s.%N)
    (cd "$BUILD/tests" && timeout "$TIMEOUT" "$exe") > "$LOGS/tests/$name.log" 2>&1
    rc=$?
    secs=$(awk -v a="$start" -v b="$(date +%s.%N)" 'BEGIN { printf "%.1f", b - a }')
    ok=$(grep -ao 'PASSED  \] [0-9]*' "$LOGS/tests/$name.log" | grep -o '[0-9]*$' | tail -1)
    skipped=$(grep -aoE 'SKIPPED \] +[0-9]+ test' "$LOGS/tests/$name.log" | grep -oE '[0-9]+' | tail -1)
    if [ $rc -eq 0 ]; then
        passed=$((passed + 1))
        say "$(printf '  %-36s ok    %3s passed %3s skipped  %6s s' "$name" "${ok:-0}" "${skipped:-0}" "$secs")"
    else
        failed=$((failed + 1))
        if [ $rc -eq 124 ]; then
            say "$(printf '  %-36s FAIL  still running after %s s (killed)' "$name" "$TIMEOUT")"
        else
            say "$(printf '  %-36s FAIL  exit %d' "$name" "$rc")"
        fi
        grep -a -E '^\[  (FAILED|ERROR) |\[  FAILED  \]|error:|Error|fail' "$LOGS/tests/$name.log" |
            head -20 | sed 's/^/      /' | tee -a "$SUMMARY"
    fi
done
if [ $ran -eq 0 ]; then
    say "no test programs matched $ONLY in $BUILD"
    exit 2
fi
say "== $passed of $ran test programs passed, $failed failed; logs in $LOGS"
[ $BUILD_ERRORS -eq 0 ] || say "== the build had errors: some test programs may be missing (see build.txt)"
[ $failed -eq 0 ] && [ $BUILD_ERRORS -eq 0 ]
