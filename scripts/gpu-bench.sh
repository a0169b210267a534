#!/usr/bin/env bash
# gpu-bench.sh — ember's backend micro-benchmarks on the GPU machine, beside PyTorch's, in one call
# (the figures of docs/benchmarks.md, "Backend micro-benchmarks"): device-to-device copy
# bandwidth, GELU f32 and bf16 over 1 GiB (GB/s and % of the copy bandwidth), launch overhead, and
# cold / warm compile times; then issue #6's tensor ops (softmax, layer_norm, gelu, sum, transpose
# + contiguous at GPT-2 shapes: bench/bench_tensor.c beside bench/reference/torch_tensor_ops.py).
#
#   scripts/gpu-bench.sh [--device NAME] [--build DIR] [--bytes N] [--no-sweep] [--timeout S]
#
# (--timeout: seconds each of the two programs may run, default 300.)
# Runs DIR/bench/ember_bench_backend --device NAME --bytes N --json --sweep (DIR defaults to
# build-gpu, as made by `scripts/gpu-test.sh --prepare` on the development machine and carried
# along; when it is missing and this machine can build, only that target is built), then
# bench/reference/torch_elementwise.py --bytes N, and prints a short table of ember vs torch with
# ratios. NAME defaults to cuda:0, N to 1G. Raw outputs go to $OUT/gpu-bench when $OUT is set
# (a folder of its own, so that gpu-test.sh can write to the same $OUT), else DIR/gpu-bench-logs:
#   ember_backend.json   ember's JSON line          ember_backend.txt   its table and messages
#   torch_elementwise.json  PyTorch's JSON line     torch_elementwise.txt  its messages
#   ember_tensor.json    ember_bench_tensor's line  ember_tensor.txt    its table and messages
#   torch_tensor_ops.json  PyTorch's line          torch_tensor_ops.txt  its messages
#   info.txt             `ember info`               summary.txt         the final table
# The commit shown is $EMBER_COMMIT when set (a copy of the tree without .git cannot tell).
# Exits 0 when both ran, 1 when the device is absent or ember's benchmark failed, 3 when only the
# PyTorch reference failed, 2 when there is nothing to run.
set -u

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
BUILD=$ROOT/build-gpu
DEVICE=cuda:0
BYTES=1G
SWEEP=--sweep
TIMEOUT=300

while [ $# -gt 0 ]; do
    case "$1" in
        --device) DEVICE=$2; shift 2 ;;
        --build) BUILD=$(realpath -m "$2"); shift 2 ;;
        --bytes) BYTES=$2; shift 2 ;;
        --no-sweep) SWEEP=; shift ;;
        --timeout) TIMEOUT=$2; shift 2 ;;
        -h|--help) sed -n '2,/^set -u/p' "$0" | grep '^#' | sed 's/^# \{0,1\}//'; exit 0 ;;
        *) echo "gpu-bench.sh: unknown argument '$1' (try --help)" >&2; exit 2 ;;
    esac
done

LOGS=${OUT:+$OUT/gpu-bench}
LOGS=${LOGS:-$BUILD/gpu-bench-logs}
mkdir -p "$LOGS"
SUMMARY=$LOGS/summary.txt
: > "$SUMMARY"
say() { echo "$*" | tee -a "$SUMMARY"; }

BENCH=$BUILD/bench/ember_bench_backend
if [ ! -x "$BENCH" ]; then
    if command -v cmake > /dev/null && command -v gcc > /dev/null && command -v pkg-config > /dev/null &&
        pkg-config --exists libcjson; then
        say "== no $BENCH: building it (gcc, EMBER_WERROR=OFF)"
        { CC=gcc cmake -S "$ROOT" -B "$BUILD" -DCMAKE_BUILD_TYPE=RelWithDebInfo -DEMBER_WERROR=OFF &&
            cmake --build "$BUILD" -j "$(nproc)" --target ember_bench_backend ember_bench_tensor ember_cli; } \
            > "$LOGS/build.txt" 2>&1
    fi
    if [ ! -x "$BENCH" ]; then
        say "no $BENCH, and it could not be built here: run scripts/gpu-test.sh --prepare on the"
        say "development machine and carry the build folder along (see $LOGS/build.txt)"
        exit 2
    fi
fi
if [ -d "$BUILD/gpu-libs" ]; then
    export LD_LIBRARY_PATH="$BUILD/gpu-libs${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
fi
export EMBER_LOG=${EMBER_LOG:-warn}

say "== $(date -u '+%Y-%m-%d %H:%M:%S UTC'), commit ${EMBER_COMMIT:-$(git -C "$ROOT" rev-parse --short HEAD 2> /dev/null || echo unknown)}"
say "   $(nvidia-smi -L 2> /dev/null | head -1)"

# ---- is the device there? -----------------------------------------------------------------
backend=${DEVICE%%:*}
if [ -x "$BUILD/ember" ]; then
    "$BUILD/ember" info > "$LOGS/info.txt" 2>&1
    line=$(grep -E "^ +$backend +" "$LOGS/info.txt" | head -1)
    if [ -n "$line" ] && ! echo "$line" | grep -qE "^ +$backend +[1-9][0-9]* device"; then
        say "$DEVICE is absent: $(echo "$line" | sed -E 's/^ +//')"
        exit 1
    fi
fi

# ---- ember ---------------------------------------------------------------------------------
say "== ember: $BENCH --device $DEVICE --bytes $BYTES --json $SWEEP"
timeout "$TIMEOUT" "$BENCH" --device "$DEVICE" --bytes "$BYTES" --json $SWEEP \
    > "$LOGS/ember_backend.json" 2> "$LOGS/ember_backend.txt"
ember_rc=$?
tee -a "$SUMMARY" < "$LOGS/ember_backend.txt"
if [ $ember_rc -ne 0 ]; then
    if grep -q "cannot open device" "$LOGS/ember_backend.txt"; then
        say "$DEVICE is absent (see above)"
        exit 1
    fi
    [ $ember_rc -eq 124 ] && say "ember_bench_backend was still running after $TIMEOUT s (killed)"
    say "ember_bench_backend FAILED (exit $ember_rc); what it measured is in $LOGS/ember_backend.json"
fi

# ---- PyTorch -------------------------------------------------------------------------------
say "== torch: python3 bench/reference/torch_elementwise.py --bytes $BYTES"
timeout "$TIMEOUT" python3 "$ROOT/bench/reference/torch_elementwise.py" --bytes "$BYTES" \
    > "$LOGS/torch_elementwise.json" 2> "$LOGS/torch_elementwise.txt"
torch_rc=$?
if [ $torch_rc -ne 0 ]; then
    say "the PyTorch reference FAILED (exit $torch_rc):"
    tail -5 "$LOGS/torch_elementwise.txt" | sed 's/^/    /' | tee -a "$SUMMARY"
fi

# ---- side by side --------------------------------------------------------------------------
if command -v python3 > /dev/null; then
    python3 - "$LOGS/ember_backend.json" "$LOGS/torch_elementwise.json" << 'EOF' | tee -a "$SUMMARY"
import json, sys

def load(path):
    try:
        with open(path) as f:
            lines = [l for l in f.read().splitlines() if l.startswith("{")]
        return json.loads(lines[-1]) if lines else {}
    except (OSError, ValueError):
        return {}

e, t = load(sys.argv[1]), load(sys.argv[2])

def gelu(d, dtype, key):
    for g in d.get("gelu", []):
        if g.get("dtype") == dtype:
            return g.get(key)
    return None

def best_sweep(d, dtype):
    rows = [g for g in d.get("gelu_sweep", []) if g.get("dtype") == dtype]
    return max(rows, key=lambda g: g["gbps"]) if rows else None

rows = [("D2D copy (GB/s)", e.get("copy", {}).get("gbps"), t.get("copy", {}).get("gbps"), "higher")]
for dt in ("f32", "bf16"):
    rows.append((f"GELU {dt} (GB/s)", gelu(e, dt, "gbps"), gelu(t, dt, "gbps"), "higher"))
    rows.append((f"GELU {dt} (% of own copy)", gelu(e, dt, "pct_of_copy"), gelu(t, dt, "pct_of_copy"), "higher"))
    b = best_sweep(e, dt)
    if b:
        rows.append((f"GELU {dt} sweep best, line {b['line_width']} cube {b['cube_dim']} (GB/s)",
                     b["gbps"], gelu(t, dt, "gbps"), "higher"))
rows.append(("launch overhead (us per launch)", e.get("launch", {}).get("median_us"),
             t.get("launch", {}).get("median_us"), "lower"))
c = e.get("compile", {})
rows.append(("compile cold (ms per kernel)", c.get("cold_ms"), None, ""))
rows.append(("compile warm, disk hit (ms)", c.get("disk_hit_ms"), None, ""))
rows.append(("compile warm, memory hit (us)", c.get("memory_hit_us"), None, ""))

def fmt(v):
    return "-" if v is None else f"{v:.4g}"

print()
print(f"{'':46} {'ember':>10} {'torch':>10} {'ember/torch':>12}")
for name, ev, tv, better in rows:
    ratio = f"{ev / tv:.3f}" if ev is not None and tv else "-"
    print(f"{name:46} {fmt(ev):>10} {fmt(tv):>10} {ratio:>12}" + (f"  ({better} is better)" if better and ratio != "-" else ""))
print()
print(f"ember: {e.get('device', '?')} {e.get('device_name', '')}, commit {e.get('commit', '?')}, "
      f"{e.get('bytes', 0) / 2**20:.0f} MiB buffers, median of {e.get('repeats', '?')}")
print(f"torch: {t.get('torch', '?')} (CUDA {t.get('cuda', '?')}), {t.get('device_name', '?')}; "
      f"launch = {t.get('launch', {}).get('what', '?')}")
for err in e.get("errors", []):
    print(f"ember error: {err}")
EOF
fi

# ---- tensor ops (issue #6): ember_bench_tensor beside torch_tensor_ops.py --------------------
TBENCH=$BUILD/bench/ember_bench_tensor
if [ -x "$TBENCH" ]; then
    say "== ember: $TBENCH --device $DEVICE --json"
    timeout "$TIMEOUT" "$TBENCH" --device "$DEVICE" --json \
        > "$LOGS/ember_tensor.json" 2> "$LOGS/ember_tensor.txt"
    trc=$?
    tee -a "$SUMMARY" < "$LOGS/ember_tensor.txt"
    [ $trc -ne 0 ] && ember_rc=$trc && say "ember_bench_tensor FAILED (exit $trc)"
    say "== torch: python3 bench/reference/torch_tensor_ops.py"
    timeout "$TIMEOUT" python3 "$ROOT/bench/reference/torch_tensor_ops.py" \
        > "$LOGS/torch_tensor_ops.json" 2> "$LOGS/torch_tensor_ops.txt"
    trc=$?
    if [ $trc -ne 0 ]; then
        torch_rc=$trc
        say "torch_tensor_ops.py FAILED (exit $trc):"
        tail -5 "$LOGS/torch_tensor_ops.txt" | sed 's/^/    /' | tee -a "$SUMMARY"
    fi
    if command -v python3 > /dev/null; then
        python3 - "$LOGS/ember_tensor.json" "$LOGS/torch_tensor_ops.json" << 'EOF' | tee -a "$SUMMARY"
import json, sys

def load(path):
    try:
        with open(path) as f:
            lines = [l for l in f.read().splitlines() if l.startswith("{")]
        return json.loads(lines[-1]) if lines else {}
    except (OSError, ValueError):
        return {}

e, t = load(sys.argv[1]), load(sys.argv[2])
eo, to = e.get("ops", {}), t.get("ops", {})
print()
print(f"{'tensor op (GB/s; ratio = torch time / ember time)':52} {'ember':>9} {'torch':>9} {'ember/torch':>12}")
for name in ("softmax", "layer_norm", "gelu_tanh", "gelu_erf", "sum_last", "transpose_contiguous"):
    a, b = eo.get(name, {}), to.get(name, {})
    shape = "x".join(str(d) for d in (a.get("shape") or b.get("shape") or []))
    ev, tv = a.get("gbps"), b.get("gbps")
    note = ""
    if a and not a.get("verified", False):
        ratio = "WRONG"
    elif a.get("shape") and b.get("shape") and a["shape"] != b["shape"]:
        ratio = "shapes differ"
    elif a.get("median_ms") and b.get("median_ms"):
        r = b["median_ms"] / a["median_ms"]
        ratio, note = f"{r:.3f}", ("" if r >= 0.9 else "  (below the 0.9 goal)")
    else:
        ratio = "-"
    fmt = lambda v: "-" if v is None else f"{v:.4g}"
    print(f"{name + ' ' + shape:52} {fmt(ev):>9} {fmt(tv):>9} {ratio:>12}{note}")
print(f"(goal, issue 6: ember at least 0.9x PyTorch eager on each; ember commit {e.get('commit', '?')})")
EOF
    fi
else
    say "no $TBENCH: the tensor-op comparison was skipped"
fi

say "== logs in $LOGS"
[ $ember_rc -ne 0 ] && exit 1
[ $torch_rc -ne 0 ] && exit 3
exit 0
