#!/usr/bin/env bash
# gpu-train-check.sh — one device call for issues #13 and #14 on the H200: the tests of the
# training step's ops on cuda:0, then GPT-2 training (b16 x 1024, the step replayed as a graph,
# with each of ember's A/B switches) beside PyTorch torch.compile, then decoding at batch 1
# beside transformers, all in the same call; a short table is printed last.
#
#   scripts/gpu-train-check.sh [--build DIR] [--anchors DIR] [--deadline S] [--skip-tests]
#   scripts/gpu-train-check.sh --prepare      (on the development machine)
#
# The attention benchmark runs first (after the tests), then training, then decoding.
# --prepare builds build-gpu (`scripts/gpu-test.sh --prepare`: the tests, ember and the shared
# libraries in gpu-libs) and copies what this script runs into .cache/gpu-carry/build (ember, the
# test programs below, gpu-libs: about 20 MB, where the whole build folder is over the device
# tool's 64 MiB) and ../shared/anchors into .cache/gpu-carry/anchors; carry .cache/gpu-carry.
# DIR defaults to that copy when it exists, else build-gpu. TRAIN_VARIANTS (below) picks the
# training runs, ATTN_VARIANTS the attention benchmark's (`ember bench attention` beside
# scripts/attention_ref.py), MATMUL_VARIANTS the matmul benchmark's (none by default; a value may
# be quoted: "pp:EMBER_MATMUL_CONFIG='wgmma-tma-ppr 128x192x64 2x1 s1'"; words starting with
# -- are the benchmark's: "dw:--at --shapes 768x768x16384"), NCU_CONFIGS Nsight Compute's
# (below), B32=1 training at batch 32 as well (B32_VARIANTS "NAME:VAR=VALUE;..." more b32 runs), GPU_TESTS the test programs (default: all of
# the list; PROGRAM:PATTERN for the tests matching PATTERN only), TEST_LIMIT the seconds each
# may take (100); ATTN=0 and DECODE=0 leave the attention and decoding runs out, LOSS=1 adds the 200-step loss curves
# (scripts/loss-curve, after decoding), LOSS_SEEDS="1 2 3" the b16 curves from other inits, NCU_TRAIN Nsight Compute's figures for
# the training step's kernels (below), TORCH_PROFILE=1 PyTorch's own breakdown of its compiled
# step (scripts/torch-profile-gpt2.py). A step runs
# with at most the time left before --deadline seconds (default 560) after the start, and is
# skipped when under 30 s are left. Logs go to
# $OUT (the device tool's folder), else DIR/train-check-logs. The commit shown is $EMBER_COMMIT.
set -u
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
BUILD=$ROOT/build-gpu
[ -x "$ROOT/.cache/gpu-carry/build/ember" ] && BUILD=$ROOT/.cache/gpu-carry/build
ANCHORS=$ROOT/.cache/gpu-carry/anchors
DEADLINE=560
TESTS=1
PREPARE=0
TEST_PROGRAMS="kernel_test_wgmma tensor_test_norm_backward tensor_test_gelu_backward tensor_test_attention_qkv \
    tensor_test_trusted_indices tensor_test_attention_wgmma autodiff_test_gradcheck_linear_xent \
    runtime_test_graph models_test_gpt_batch_static optim_test_flat train_test_step_graph \
    tensor_test_attention tensor_test_matmul_tma tensor_test_reduce_cols tensor_test_fusion_matmul tensor_test_xent autodiff_test_grad_into"
START=$(date +%s)
while [ $# -gt 0 ]; do
    case "$1" in
        --build) BUILD=$(realpath -m "$2"); shift 2 ;;
        --anchors) ANCHORS=$(realpath -m "$2"); shift 2 ;;
        --deadline) DEADLINE=$2; shift 2 ;;
        --skip-tests) TESTS=0; shift ;;
        --prepare) PREPARE=1; shift ;;
        -h|--help) sed -n '2,18p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
        *) echo "gpu-train-check.sh: unknown argument '$1'" >&2; exit 2 ;;
    esac
done
if [ "$PREPARE" = 1 ]; then
    "$ROOT/scripts/gpu-test.sh" --prepare || exit 1
    CARRY=$ROOT/.cache/gpu-carry
    rm -rf "$CARRY/build" "$CARRY/anchors"
    mkdir -p "$CARRY/build/tests"
    cp "$ROOT/build-gpu/ember" "$CARRY/build/"
    cp -r "$ROOT/build-gpu/gpu-libs" "$CARRY/build/"
    for t in $TEST_PROGRAMS; do cp "$ROOT/build-gpu/tests/$t" "$CARRY/build/tests/"; done
    cp -r "$ROOT/../shared/anchors" "$CARRY/anchors"
    echo "prepared $CARRY ($(du -sh "$CARRY" | cut -f1)): carry .cache/gpu-carry"
    exit 0
fi
LOGS=${OUT:-$BUILD/train-check-logs}
mkdir -p "$LOGS"
SUMMARY=$LOGS/summary.txt
: > "$SUMMARY"
export LD_LIBRARY_PATH=$BUILD/gpu-libs:${LD_LIBRARY_PATH:-}
export EMBER_CACHE_DIR=/tmp/ember-train-check-cache  # outside $OUT: the device tool returns few files
# a kernel cache carried from an earlier call (KEEP_CACHE=1 leaves this call's in
# $OUT/kcache.tgz; copied to .cache/gpu-carry/kcache.tgz it saves the next call's NVRTC compiles
# and tuning, about 150 s on a fresh machine)
KCACHE=$ROOT/.cache/gpu-carry/kcache.tgz
[ -f "$KCACHE" ] && mkdir -p "$EMBER_CACHE_DIR" && tar xzf "$KCACHE" -C "$EMBER_CACHE_DIR"
# its compiled kernels only: the autotuner's winners came from another card or commit, so this
# call tunes afresh (fast with the kernels there) unless KEEP_TUNE=1
[ "${KEEP_TUNE:-0}" = 1 ] || rm -rf "$EMBER_CACHE_DIR/autotune"
EMBER=$BUILD/ember
say() { echo "$*" | tee -a "$SUMMARY"; }
left() { echo $((DEADLINE - ($(date +%s) - START))); }
# run NAME SECONDS CMD...: runs CMD with its output in NAME.log unless the deadline is near
# (with less than SECONDS left before the deadline but at least 30, it runs with what is left as
# its limit: most runs take far less than their limit)
run() {
    local name=$1 limit=$2
    shift 2
    if [ "$(left)" -lt "$limit" ]; then
        if [ "$(left)" -lt 30 ]; then
            say "skipped $name: $(left) s left"
            return 1
        fi
        limit=$(left)
        say "$name: limited to the $limit s left"
    fi
    timeout "$limit" "$@" > "$LOGS/$name.log" 2>&1
    local rc=$?
    say "$name: rc $rc ($(($(date +%s) - START)) s)"
    return $rc
}
jfield() { python3 -c "import json,sys
for l in open(sys.argv[1]):
    l=l.strip()
    if l.startswith('{'):
        d=json.loads(l); print(d.get(sys.argv[2], '?')); break" "$1" "$2" 2>/dev/null; }

say "commit ${EMBER_COMMIT:-$(git -C "$ROOT" rev-parse --short HEAD 2>/dev/null)}, $(date -u +%F\ %T)"
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm --format=csv,noheader >> "$SUMMARY" 2>&1

if [ "$TESTS" = 1 ]; then
    for entry in ${GPU_TESTS:-$TEST_PROGRAMS}; do
        # PROGRAM:PATTERN runs only the tests whose names match PATTERN (TU_ONLY, where the
        # program reads it: tensor_test_matmul_tma, tensor_test_attention_wgmma, tensor_test_xent,
        # tensor_test_norm_backward)
        t=${entry%%:*}
        only=
        [ "$t" != "$entry" ] && only=${entry#*:}
        [ -x "$BUILD/tests/$t" ] || { say "missing $t"; continue; }
        EMBER_TEST_DEVICE=cuda:0 run "$t" "${TEST_LIMIT:-100}" env ${only:+"TU_ONLY=$only"} "$BUILD/tests/$t" ||
            grep -v "^\[ *\(OK\|RUN\) *\]" "$LOGS/$t.log" | tail -25 | tee -a "$SUMMARY"
    done
fi

# attention alone (b16 x 12 heads x 1024 x 64, causal, bf16): ember's kernels with each tile
# configuration of ATTN_VARIANTS ("NAME:VAR=VALUE ...;..."), then PyTorch's flash attention
A="bench attention --device cuda:0"
ANAMES=
IFS=';' read -ra ALIST <<< "${ATTN_VARIANTS:-"default:;t64:EMBER_ATTENTION_TILES=2:64:2:32:2:64;wg1:EMBER_ATTENTION_TILES=1:128:1:64:1:64"}"
if [ "${ATTN:-1}" = 1 ]; then
    for v in "${ALIST[@]}"; do
        name=${v%%:*}
        # shellcheck disable=SC2086
        run "attn_$name" 60 env ${v#*:} "$EMBER" $A
        ANAMES="$ANAMES attn_$name"
    done
    run attn_torch_flash 90 python3 "$ROOT/scripts/attention_ref.py"
fi

# matmul alone (issue #11): `ember bench matmul` on the GPT-2 shapes and 4096^3 / 8192^3 in each
# variant of MATMUL_VARIANTS ("NAME:VAR=VALUE ...;..."; e.g. a configuration forced with
# EMBER_MATMUL_CONFIG), cuBLAS in the same process; empty (the default) leaves it out
MNAMES=
MSHAPES=${MATMUL_SHAPES:-16384x2304x768,16384x768x768,16384x3072x768,16384x768x3072,16384x50304x768,4096x4096x4096,8192x8192x8192}
if [ -n "${MATMUL_VARIANTS:-}" ]; then
    IFS=';' read -ra MLIST <<< "$MATMUL_VARIANTS"
    for v in "${MLIST[@]}"; do
        name=${v%%:*}
        # the words as the shell splits them, so that a value may be quoted ('wgmma-tma-ppr
        # 128x...'): VAR=VALUE ones go to the environment, the rest (--at, --bt, --shapes L) to
        # the benchmark; without --shapes it runs MSHAPES
        eval "mwords=(${v#*:})"
        menv=() margs=()
        for w in "${mwords[@]}"; do
            case "$w" in -*) margs+=("$w") ;; *=*) menv+=("$w") ;; *) margs+=("$w") ;; esac
        done
        case " ${margs[*]} " in *" --shapes "*) ;; *) margs+=(--shapes "$MSHAPES") ;; esac
        run "mm_$name" 200 env EMBER_LOG=debug "${menv[@]}" "$EMBER" bench matmul --device cuda:0 --dtype bf16 "${margs[@]}"
        MNAMES="$MNAMES mm_$name"
    done
fi

# Nsight Compute on one matmul shape (NCU_SHAPE, default 16384x768x768): each configuration of
# NCU_CONFIGS ("NAME:CONFIG;...", forced with EMBER_MATMUL_CONFIG), then cuBLAS's kernel in the
# same benchmark; the full reports stay in $LOGS/ncu_NAME.log, the headline figures go to the
# summary
if [ -n "${NCU_CONFIGS:-}" ]; then
    NCU=$(command -v ncu || echo /usr/local/cuda/bin/ncu)
    NSH=${NCU_SHAPE:-16384x768x768}
    NSEC="--section SpeedOfLight --section ComputeWorkloadAnalysis --section MemoryWorkloadAnalysis --section WarpStateStats --section SchedulerStats"
    NMET="--metrics regex:smsp__average_warps_issue_stalled_.*_per_issue_active\\.ratio"
    IFS=';' read -ra NLIST <<< "$NCU_CONFIGS"
    for v in "${NLIST[@]}" "cublas:"; do
        name=${v%%:*}
        cfg=${v#*:}
        k=regex:matmul_wgmma_tma
        [ "$name" = cublas ] && k='regex:^(nvjet|sm90|cutlass)'
        # cuBLAS's run forces the first configuration too (no tuning under the profiler)
        [ "$name" = cublas ] && cfg=${NLIST[0]#*:}
        # shellcheck disable=SC2086
        run "ncu_$name" 150 env EMBER_MATMUL_CONFIG="$cfg" "$NCU" --clock-control none \
            -k "$k" --launch-skip 12 --launch-count 1 $NSEC $NMET \
            "$EMBER" bench matmul --device cuda:0 --dtype bf16 --shapes "$NSH"
        say "  ncu $name ($NSH):"
        # the kernel's name, the headline figures, the L2's write sectors, NMET's stall reasons
        grep -E "^  [a-z]|Duration|Compute \(SM\) Throughput|Memory Throughput|L2 Cache Throughput|DRAM Throughput|Compression Input|Issue Slots Busy|Executed Ipc Active|Warp Cycles Per Issued|No Eligible|stalled_" \
            "$LOGS/ncu_$name.log" | head -40 | sed 's/^/    /' | tee -a "$SUMMARY"
    done
fi

# Nsight Compute on the eager training step's kernels whose names match NCU_TRAIN (a regex, e.g.
# "tensor_norm_backward|tensor_cols_sum"): the launches of the second step (NCU_TRAIN_SKIP of
# them skipped first, NCU_TRAIN_COUNT profiled), each kernel's duration and DRAM traffic, summed
# per kernel name into the summary (per name and launch shape with NCU_BY_GRID=1; the raw CSV
# stays in $LOGS/ncu_train.log)
if [ -n "${NCU_TRAIN:-}" ]; then
    NCU=$(command -v ncu || echo /usr/local/cuda/bin/ncu)
    run ncu_train 200 "$NCU" --clock-control none --cache-control none -k "regex:$NCU_TRAIN" \
        --launch-skip "${NCU_TRAIN_SKIP:-0}" --launch-count "${NCU_TRAIN_COUNT:-200}" --csv --print-units base \
        --metrics gpu__time_duration.sum,dram__bytes_read.sum,dram__bytes_write.sum,launch__grid_size,launch__block_size \
        "$EMBER" bench train-gpt2 --device cuda:0 --batch 16 --seq 1024 --steps 1 --warmup 1
    say "  ncu of the training step's kernels (name: launches, total us, GB read, GB written, TB/s, grid x block of the largest):"
    python3 - "$LOGS/ncu_train.log" "${NCU_BY_GRID:-0}" <<'PY' 2>&1 | tee -a "$SUMMARY"
import csv, sys, collections
rows = [r for r in csv.reader(l for l in open(sys.argv[1]) if l.startswith('"'))]
if not rows:
    sys.exit("    no ncu rows")
h = rows[0]; ix = {k: h.index(k) for k in ("ID", "Kernel Name", "Metric Name", "Metric Value")}
k = collections.defaultdict(dict)
for r in rows[1:]:
    try: v = float(r[ix["Metric Value"]].replace(",", ""))
    except ValueError: continue
    k[r[ix["ID"]]][r[ix["Metric Name"]]] = v; k[r[ix["ID"]]]["name"] = r[ix["Kernel Name"]].split("(")[0]
agg = collections.defaultdict(lambda: [0, 0.0, 0.0, 0.0, 0.0, ""])
by_grid = sys.argv[2] == "1"
for d in k.values():
    key = d["name"]
    if by_grid: key += " %dx%d" % (d.get("launch__grid_size", 0), d.get("launch__block_size", 0))
    a = agg[key]; t = d.get("gpu__time_duration.sum", 0) / 1e3
    a[0] += 1; a[1] += t; a[2] += d.get("dram__bytes_read.sum", 0) / 1e9; a[3] += d.get("dram__bytes_write.sum", 0) / 1e9
    if t > a[4]: a[4] = t; a[5] = "%dx%d (%.1f us)" % (d.get("launch__grid_size", 0), d.get("launch__block_size", 0), t)
for n, a in sorted(agg.items(), key=lambda x: -x[1][1]):
    print("    %s: %d, %.1f us, %.3f GB, %.3f GB, %.2f TB/s, %s" % (n, a[0], a[1], a[2], a[3], (a[2] + a[3]) / (a[1] * 1e-6) / 1e3 if a[1] else 0, a[5]))
PY
fi

# training: ember's graph-replayed step in each variant, then torch.compile in the same call
# (TORCH_B16=0 leaves it out). TRAIN_VARIANTS: "NAME:VAR=VALUE ...;NAME:..." (environment per
# run; set but empty: no b16 run); a NAME starting with
# "base" runs DIR/ember-base, a build of an earlier commit carried for an A/B, where present; one
# starting with "eager" runs without --graph (EMBER_PROFILE=1 then gives the step's breakdown).
VARIANTS=${TRAIN_VARIANTS-"default:;profile:EMBER_PROFILE=1;no_fused_head:EMBER_FUSED_HEAD=0;no_graph_plan:EMBER_GRAPH_PLAN=0"}
T="bench train-gpt2 --device cuda:0 --batch 16 --seq 1024 --steps 10 --warmup 3 --graph"
NAMES=
IFS=';' read -ra VLIST <<< "$VARIANTS"
for v in "${VLIST[@]}"; do
    name=${v%%:*}
    vars=${v#*:}
    bin=$EMBER
    t=$T
    case "$name" in
        base*) bin=$BUILD/ember-base ;;
        eager*) t=${T% --graph} ;; # the profiler sees eager launches only, not graph replays
    esac
    [ -x "$bin" ] || { say "skipped train_$name: no $bin"; continue; }
    # shellcheck disable=SC2086
    # the first run compiles every kernel through NVRTC into a cold cache (over 150 s on an H100)
    limit=150
    [ -z "$NAMES" ] && limit=${TRAIN_LIMIT:-300} # with a carried kernel cache 150 is plenty
    run "train_$name" $limit env $vars "$bin" $t
    NAMES="$NAMES train_$name"
done
[ "${TORCH_B16:-1}" = 1 ] &&
    run torch_compile 240 python3 "$ANCHORS/gpt2_train.py" --batch 16 --seq 1024 --steps 30 --compile
# TORCH_PROFILE=1: torch.profiler's device time a step by kernel family, beside ember's eager profile
[ "${TORCH_PROFILE:-0}" = 1 ] &&
    run torch_profile 240 python3 "$ROOT/scripts/torch-profile-gpt2.py" --anchors "$ANCHORS" --batch 16 --compile
# B32=1: ember's default step and torch.compile at batch 32 too
if [ "${B32:-0}" = 1 ]; then
    # shellcheck disable=SC2086  # T's words are the benchmark's arguments
    # (the call's first step compiles every kernel when no b16 step ran before it)
    run train_b32 "$([ -z "$NAMES" ] && echo "${TRAIN_LIMIT:-300}" || echo 150)" "$EMBER" ${T/--batch 16/--batch 32}
    # B32_VARIANTS ("NAME:VAR=VALUE ...;..."): more b32 runs, each in its own environment
    IFS=';' read -ra BLIST <<< "${B32_VARIANTS:-}"
    for v in "${BLIST[@]}"; do
        # shellcheck disable=SC2086
        run "train_b32_${v%%:*}" 150 env ${v#*:} "$EMBER" ${T/--batch 16/--batch 32}
        NAMES="$NAMES train_b32_${v%%:*}"
    done
    run torch_compile_b32 240 python3 "$ANCHORS/gpt2_train.py" --batch 32 --seq 1024 --steps 30 --compile
    NAMES="$NAMES train_b32"
fi
# decoding at batch 1 beside transformers (DECODE=0 leaves it out)
if [ "${DECODE:-1}" = 1 ]; then
    D="bench decode --device cuda:0 --dtype f32 --batch 1 --prompt 16 --new 200"
    run decode_sync1 60 "$EMBER" $D --steps-per-sync 1
    run decode_sync8 60 "$EMBER" $D --steps-per-sync 8
    run transformers 120 python3 "$ANCHORS/decode.py" --dtype fp32 --new 128
fi

# LOSS=1: the 200-step loss curves beside PyTorch (scripts/loss-curve: b16 and b32, PyTorch eager
# with flash and, at b16, math attention as the noise yardstick; the shard made by
# scripts/loss-curve-data and carried in .cache/gpu-carry), with the time left (LOSS_LIMIT, 420 s)
if [ "${LOSS:-0}" = 1 ]; then
    # ATTN is this script's switch (ATTN=0 leaves the attention benchmark out) and loss-curve's
    # PyTorch attention kernel: set it for loss-curve
    run loss_curve "${LOSS_LIMIT:-420}" env EMBER="$EMBER" DEVICE=cuda:0 BATCH="16 32" STEPS=200 \
        NOISE_BATCH=16 ATTN=flash "$ROOT/scripts/loss-curve"
    [ -n "${OUT:-}" ] && [ -f "$OUT/loss-curve-summary.jsonl" ] && cat "$OUT/loss-curve-summary.jsonl" >> "$SUMMARY"
fi
# LOSS_SEEDS="1 2 3": the b16 curves again from other inits (loss-curve's SEED), each with at most
# LOSS_SEED_LIMIT seconds (150): one init's curve sat 0.1 under PyTorch's where four others did
# not (session 30), so the loss criterion is read over several; the curves in $OUT/loss-seeds.tgz
if [ -n "${LOSS_SEEDS:-}" ]; then
    SEEDS_DIR=/tmp/ember-loss-seeds
    rm -rf "$SEEDS_DIR"
    for S in $LOSS_SEEDS; do
        run "loss_seed$S" "${LOSS_SEED_LIMIT:-150}" env EMBER="$EMBER" DEVICE=cuda:0 BATCH=16 \
            STEPS=200 ATTN=flash SEED="$S" RES="$SEEDS_DIR/s$S" "$ROOT/scripts/loss-curve"
        cat "$SEEDS_DIR/s$S/summary.jsonl" >> "$SUMMARY" 2> /dev/null
    done
    [ -n "${OUT:-}" ] && [ -d "$SEEDS_DIR" ] && tar czf "$OUT/loss-seeds.tgz" -C "$SEEDS_DIR" .
fi

if [ "${KEEP_CACHE:-0}" = 1 ] && [ -n "${OUT:-}" ]; then
    tar czf "$OUT/kcache.tgz" -C "$EMBER_CACHE_DIR" . && say "kernel cache: $(du -h "$OUT/kcache.tgz" | cut -f1)"
fi
say ""
say "training b16 x 1024 (tokens/s, ms/step, peak GiB):"
for n in $NAMES torch_compile torch_compile_b32; do
    [ -f "$LOGS/$n.log" ] && say "  $n: $(jfield "$LOGS/$n.log" tokens_per_s) $(jfield "$LOGS/$n.log" ms_per_step) $(jfield "$LOGS/$n.log" peak_mem_gib)"
done
for n in $NAMES; do
    case "$n" in
        train_eager*) say "  $n profile:"; grep -v '^{' "$LOGS/$n.log" | tail -90 | tee -a "$SUMMARY" ;;
    esac
done
[ -f "$LOGS/torch_profile.log" ] && { say "  torch.compile profile:"; grep -v '^{' "$LOGS/torch_profile.log" | tail -62 | tee -a "$SUMMARY"; }
say "attention b16 x 12 x 1024 x 64 causal bf16 (fwd ms, bwd ms, fwd TFLOP/s, bwd TFLOP/s):"
for n in $ANAMES attn_torch_flash; do
    [ -f "$LOGS/$n.log" ] && say "  $n: $(jfield "$LOGS/$n.log" fwd_ms) $(jfield "$LOGS/$n.log" bwd_ms) $(jfield "$LOGS/$n.log" fwd_tflops) $(jfield "$LOGS/$n.log" bwd_tflops)"
done
[ -n "$MNAMES" ] && say "matmul bf16 (shape: TFLOP/s, cuBLAS TFLOP/s, ratio, configuration; then the choices per bucket):"
for n in $MNAMES; do
    say "  $n:"
    python3 -c "import json,sys
for l in open(sys.argv[1]):
    if l.startswith('{'):
        d=json.loads(l); print('    %s: %.1f %.1f %.3f %s' % ('x'.join(map(str, d.get('shape', []))), d.get('ember_tflops', 0), d.get('ref_tflops', 0), d.get('ratio', 0), d.get('config', '')))" "$LOGS/$n.log" 2>&1 | tee -a "$SUMMARY"
    grep -o 'matmul matmul-v[^"]*"[^"]*" ([a-z ]*)' "$LOGS/$n.log" | sort -u | sed 's/^/    /' | tee -a "$SUMMARY"
done
say "decode b1 f32 (tokens/s):"
for n in decode_sync1 decode_sync8 transformers; do
    [ -f "$LOGS/$n.log" ] && say "  $n: $(jfield "$LOGS/$n.log" tokens_per_s)"
done
cat "$SUMMARY"
