/* matmul_internal.h — what the matmul files of the tensor layer share: the problem (operand
 * geometry after torch.matmul's promotions and batch broadcasting, plus the epilogue), a kernel
 * configuration, and the steps: heuristic choice and candidate lists (matmul_config.c), launch of
 * one configuration (matmul_launch.c) and autotuning (matmul_tune.c). ops_matmul.c is the entry. */
#ifndef EM_TENSOR_MATMUL_INTERNAL_H
#define EM_TENSOR_MATMUL_INTERNAL_H

#include "tensor/internal.h"

/* Which kernel a configuration runs. */
typedef enum mm_kind {
    MM_SIMPLE = 0, /* tensor_matmul.ek: the plain 16 x 16 tiled reference kernel (no epilogue) */
    MM_SIMT,       /* matmul_simt.ek: register-blocked, every dtype */
    MM_MMA,        /* matmul_mma.ek: cooperative matrices (f16/bf16, f32 as tf32 when allowed) */
    MM_CPU,        /* matmul_cpu.ek: packed panels and a register-blocked micro-kernel, one unit */
    MM_WGMMA,      /* matmul_wgmma.ek: Hopper warpgroup MMAs (f16/bf16 on sm_90a) */
    MM_SKINNY,     /* matmul_skinny.ek: few rows (decoding), b streamed once in lines */
} mm_kind;

/* One kernel configuration. */
typedef struct mm_config {
    int kind;   /* an mm_kind */
    int bm, bn; /* output tile of a cube (MMA: wm x wn planes of (16 FM) x (16 FN), FM, FN <= 4) */
    int bk;     /* K step staged in shared memory */
    int tm, tn; /* SIMT: the block of one unit; MMA: planes along M and N; CPU: the micro-kernel's
                   MR x NR block; WGMMA: warpgroups x cubes of a cluster along M (1, or 2 for
                   lanes 5 and 6: the cubes of a cluster share b's tile); SKINNY: KS units along K in a plane x PK
                   groups along K (bm: rows MR, bn: units NU along N, bk: 16, the split's grain) */
    int split;  /* split-K factor (1: none) */
    int lanes;  /* CPU kernel: lanes of a line in its micro-kernel; SKINNY: NL, lines (b row-major)
                   or columns (b transposed) of one unit; WGMMA: 1 for the warp-specialized
                   kernel (matmul_wgmma_ws.ek: a producer warpgroup and tm consumers), 2 for it
                   with setmaxnreg (tm 2: 56 registers a producer unit, 224 a consumer's), 3 for
                   the TMA-fed one (matmul_wgmma_tma.ek; setmaxnreg 40 / 232 when tm is 2), 4
                   for it with the epilogue through shared memory in 16-byte lines, 5 for that
                   and persistent cubes, 6 for that with ping-pong consumers (tm 2; bm x bn is
                   the tile ONE consumer owns, bm 64 or 128), 7 for that with the results as
                   lines of 2 from the registers (no staging), else 0; 0 for the other kinds.
                   WGMMA bm is 64 x tm, except for lanes 6 and lanes 5 with tm 2 and bm 256
                   (two consumers of 128 x bn on one tile) */
    int sk;     /* WGMMA lanes 7 and 8 (split 1): stream-K, every compute unit's cube taking an
                   even share of all tiles' k steps, the pieces summed in the kernel (its SK;
                   written " sk" after the split) */
} mm_config;

/* How the mma kernel runs one configuration on one problem (matmul_mma.ek's comptime values
 * beyond the tile): derived from the configuration and the operands' layout and alignment. */
typedef struct mm_mma_plan {
    int fm, fn;  /* 16 x 16 fragments per plane along M and N */
    int stages;  /* shared-memory buffers in the ring (2 to 4) */
    bool at, bt; /* a's M / b's K is its contiguous dim: k-major a tile / n-major b tile */
    int va, vb;  /* elements per copy: 16 bytes' worth when aligned (asynchronous copies), else 1 */
    size_t smem; /* shared memory bytes of a cube */
} mm_mma_plan;

/* How the wgmma kernels run one configuration (bm = 64 x warpgroups, bk = 64) on one problem. */
typedef struct mm_wgmma_plan {
    int stages;  /* shared-memory buffers in the ring (3 to 6) */
    bool at, bt; /* a's M / b's K is its contiguous dim: MN-major a / K-major b tiles */
    bool ws;     /* the warp-specialized kernel (c->lanes 1 or 2) */
    bool regs;   /* ws: the producer gives its registers to the consumers (setmaxnreg) */
    bool tma;    /* ws fed by TMA (c->lanes 3): the maps below are valid */
    bool az, bz; /* tma: a's / b's batch coordinate is the batch index (else broadcast: 0) */
    bool sepi;   /* tma (c->lanes 4, 5): the epilogue through shared memory in 16-byte lines (out
                    row-major, its rows and batch strides multiples of 8, no split-K) */
    bool pairs;   /* tma, in place of sepi with lanes 7: results out as lines of 2 from the
                     registers */
    bool quads;   /* pairs as lines of 4, two neighbouring units swapping a pair (whole 32-byte
                     sectors a store) */
    bool rv;      /* quads with the residual operand staged through shared memory (the kernel's
                     RV: mm_res_rows16) */
    bool cs;      /* quads with the result's column sums in the epilogue (the kernel's CS:
                   * mm_problem.colsum set, not split) */
    bool pre;     /* quads with the value before the activation written too (the kernel's PRE:
                   * mm_problem.pre set, not split, N a multiple of 4) */
    bool bs;      /* tma with b N-major and unbatched: b's column sums added up by the producer
                   * warpgroup's idle planes (the kernel's BS: mm_problem.bsum set, not cs) */
    bool persist; /* tma (c->lanes 5, 6): min(tiles, compute units) cubes loop over the tiles */
    bool ping;    /* tma (c->lanes 6): the two consumers take the cube's tiles in turns, each a
                     bm x bn tile of its own (bm / 64 accumulator sets a unit) */
    int cluster;    /* tma persist: cubes of a cluster, on row tiles of the same columns (c->tn) */
    bool multicast; /* cluster > 1 on CUDA: the cluster's cubes load b's tile once, each a
                       1 / cluster of it to all (b's map box: 64 x bn / cluster when K-major) */
    int mw;       /* accumulator sets of 64 rows a consumer unit holds (the kernel's MW): 1, or 2
                     for ping with bm 128 and for the cooperative 256-row tile (lanes 5, tm 2,
                     bm 256: each consumer 128 x bn) */
    int64_t adim[3], astr[3]; /* tma: a's map (elements; innermost first): contiguous dim, the
                                 other, the flattened batch */
    int64_t bdim[3], bstr[3]; /* tma: b's map */
    int units;   /* units of a cube: 128 per warpgroup, the producer's included */
    size_t smem; /* shared memory bytes of a cube */
} mm_wgmma_plan;

/* How the skinny kernel runs one configuration on one problem. */
typedef struct mm_skinny_plan {
    bool bt;      /* b's K is its contiguous dim (x W^T): lines along K */
    bool fold;    /* b's batch strides are all 0: batch and M are one run of rows */
    int64_t rows; /* rows the cubes' row blocks cover: batch * M when folded, else M */
    int v;        /* lanes of b's lines (the launch's line width): 16 bytes' worth when aligned */
    int uk;       /* lines a unit loads together per step */
    int nout;     /* output columns of a cube */
    size_t smem;  /* shared memory bytes of a cube (with the layer-norm prologue's sums) */
} mm_skinny_plan;

/* A matmul problem: everything the kernels need, in the kernels' rank-R geometry. */
typedef struct mm_problem {
    em_device *dev;         /* the device of a, b and out */
    const em_caps *caps;    /* its capabilities */
    em_scalar dt;           /* operand and result dtype */
    em_scalar ct;           /* accumulation type */
    int R;                  /* kernel rank: batch dims + 2 */
    int64_t M, N, K, batch; /* sizes; batch = product of the broadcast batch dims */
    const em_tensor *a, *b; /* operands (borrowed) */
    em_tensor *out;         /* the result (contiguous) */
    int64_t ash[EM_MAX_RANK], ast[EM_MAX_RANK]; /* a as [batch..., M, K] (broadcast strides 0) */
    int64_t bsh[EM_MAX_RANK], bst[EM_MAX_RANK]; /* b as [batch..., K, N] */
    int64_t osh[EM_MAX_RANK], ost[EM_MAX_RANK]; /* out as [batch..., M, N] */
    const em_tensor *bias;                      /* epilogue bias [N] or NULL */
    int64_t bias_stride;                        /* its stride along N */
    int64_t bias_off;                           /* its offset */
    const em_tensor *res;                       /* epilogue residual or NULL */
    int64_t rst[EM_MAX_RANK];     /* its strides in out's rank-R geometry (0 where broadcast) */
    int act;                      /* em_matmul_act, or MM_ACT_GELU_GRAD / _TANH_GRAD below */
    bool tf32;                    /* f32 may run on tensor cores as tf32 */
    bool ln;                      /* a's rows layer-normalized over K in the kernel (skinny only) */
    const em_tensor *ln_w, *ln_b; /* with ln: its weight and bias [K] or NULL */
    double ln_eps;                /* with ln: its epsilon */
    em_tensor *colsum; /* or NULL: also the result's sums over its rows and batch, [N] (a bias's
                        * gradient; fusion_matmul.c), written by mm_launch: in the TMA kernel's
                        * epilogue (CS) where it stores lines of 4 unsplit, else by a column sum
                        * of the result after it */
    em_tensor *pre;    /* or NULL: with act (1 to 3) and no residual, the result before the
                        * activation (after the bias) is written here too, out's shape, contiguous
                        * as out (fusion_matmul.c: a GELU kept for its backward), by the TMA kernel's
                        * lines of 4 (PRE); other configurations run the product into pre and the
                        * activation from it into out */
    em_tensor *bsum;   /* or NULL: also b's sums over its K rows, [N] of any float dtype (a bias's
                        * gradient beside its weight's: em_matmul_sum_b), written by mm_launch: by
                        * the TMA kernel's producer warpgroup (BS) where b is N-major and unbatched,
                        * else by a column sum of b */
} mm_problem;

/* Whether p's residual (the epilogue's, added: not the GELU backward's input) has 16-byte
 * aligned rows of 2-byte elements (its last dim contiguous, N a multiple of 8): the TMA kernel's
 * lines of 4 then stage it through shared memory (its RV; matmul_config.c). */
bool mm_res_rows16(const mm_problem *p);

/* Epilogue codes past em_matmul_act's, used by fusion only (fusion_matmul.c): GELU's and
 * GELU-tanh's backward, the result (plus bias) times the derivative at the residual operand (the
 * activation's input) instead of the residual added; the kernels' ACT 4 and 5 (mm_epilogue). */
enum { MM_ACT_GELU_GRAD = EM_MATMUL_ACT_GELU_TANH + 1, MM_ACT_GELU_TANH_GRAD };

/* ops_matmul.c */
/* Checks epilogue ep (NULL: none) against p, whose result has rank rr and shape rsh, and fills
 * p's epilogue fields (bias, residual, act, tf32). false with the error set (naming the shapes). */
bool mm_setup_epilogue(mm_problem *p, const em_matmul_epilogue *ep, int rr, const int64_t *rsh);
/* The tensor maps of the TMA-fed wgmma kernel (c, plan q with q->tma) on p, a's (map 0) and b's
 * (map 1), 32 words, as the kernel's `maps` and `maps_off` arguments (out[0], out[1]): a slot of
 * the device's constants (em_device_constant), or while recording a graph a tensor of their own
 * (*own: the caller releases it after the launch); a and b realized first. False with the error
 * set (a device without tensor maps, a map the driver refuses). */
bool mm_tma_maps(const mm_problem *p, const mm_config *c, const mm_wgmma_plan *q, tn_arg out[2],
                 em_tensor **own);
/* Runs p (its result's buffer allocated): the configuration mm_choose picks (autotuning
 * included), launched. EM_OK or the error set. */
em_status mm_execute(const mm_problem *p);

/* fusion_matmul.c */
/* With fusion on, records checked problem p (p->out a fresh result without a buffer yet, of rank
 * rr and shape rsh) as the pending matmul that fills p->out's storage, instead of launching it;
 * later in-place elementwise ops on the result may extend its epilogue (docs/fusion.md). 1 when
 * recorded, 0 when it must run now (fusion off, out of host memory), -1 with the error set (an
 * operand that is itself a pending matmul failed to run). */
int fu_mm_record(const mm_problem *p, int rr, const int64_t *rsh);

/* matmul_config.c */
/* Whether c can run p on p's device (dtype, shared memory, cube size, grid); with p->ln only
 * the skinny kernel, the one with the layer-norm prologue. */
bool mm_config_valid(const mm_problem *p, const mm_config *c);
/* The mma plan of c on p (false when c's tile has no plan: planes of 16..64 x 16..64). */
bool mm_mma_plan_of(const mm_problem *p, const mm_config *c, mm_mma_plan *out);
/* Whether a device of these capabilities runs warpgroup MMAs natively: CUDA compiling for sm_90a
 * (the CUDA driver publishes the architecture as caps.arch "sm_90a"). Also the attention's test. */
bool mm_wgmma_native(const em_caps *caps);
/* The wgmma plan of c on p (false when c or p's operands do not fit the wgmma kernels: f16/bf16,
 * 16-byte aligned contiguous operands, 1 to 3 (consumer) warpgroups, BN a multiple of 64 up to
 * 256; c->lanes 0 for matmul_wgmma, 1 or 2 for matmul_wgmma_ws, 3 to 6 for matmul_wgmma_tma (6:
 * two ping-pong consumers of bm 64 or 128 each, at most 128 x 128 or 64 x 256; 5 also with bm
 * 256 and tm 2: two cooperative consumers of 128 x bn, bn at most 192), which
 * also needs each operand's batch dims flattenable to one stride or broadcast, and rows that do
 * not overlap). */
bool mm_wgmma_plan_of(const mm_problem *p, const mm_config *c, mm_wgmma_plan *out);
/* Whether stream-K (c->sk) takes p under plan q, and its workers (clusters of cubes). */
bool mm_sk_fits(const mm_problem *p, const mm_config *c, const mm_wgmma_plan *q);
int64_t mm_sk_workers(const mm_problem *p, const mm_config *c, const mm_wgmma_plan *q);
/* The skinny plan of c on p (false when c does not fit p's device: units, planes, shared
 * memory). */
bool mm_skinny_plan_of(const mm_problem *p, const mm_config *c, mm_skinny_plan *out);
/* The heuristic default configuration (EMBER_AUTOTUNE=off, and the first candidate). */
mm_config mm_heuristic(const mm_problem *p);
/* Whether the CPU kernel's micro-kernel should fuse its multiply-adds (fma): the host has FMA
 * and the CPU driver's flags let the C compiler use it (its default -march=native, or flags
 * naming "native" or "fma"); else an fma would be a library call per lane. */
bool mm_cpu_fma(void);
/* Up to max valid candidates for autotuning (full: a longer list). Returns the count. */
int mm_candidates(const mm_problem *p, bool full, mm_config *out, int max);
/* "simt 64x64x8 4x4 s1" ("cpu 64x256x256 8x32x16 s1": MR x NR x lanes; "wgmma-ws 128x256x64
 * 2x1 s1": the warp-specialized wgmma kernel, lanes 1; "wgmma-ws-regs": lanes 2; "wgmma-tma":
 * lanes 3; "wgmma-tma-se": lanes 4; "wgmma-tma-p": lanes 5; "wgmma-tma-pp": lanes 6) and back
 * (false when text is not a configuration). */
void mm_config_format(const mm_config *c, char *buf, size_t size);
bool mm_config_parse(const char *text, mm_config *c);
/* The autotune key of p: device-independent parts (kernel family, dtype, layout, shape bucket). */
void mm_tune_key(const mm_problem *p, char *buf, size_t size);

/* matmul_launch.c */
/* Runs c on p, writing p->out. EM_OK or the error set. */
em_status mm_launch(const mm_problem *p, const mm_config *c);

/* matmul_tune.c */
/* The configuration to run p with: $EMBER_MATMUL_CONFIG when set (tests and benchmarks), else
 * the heuristic (EMBER_AUTOTUNE=off), else the cached winner, else the winner of a benchmark of
 * the candidates, stored in the autotune cache. */
mm_config mm_choose(const mm_problem *p);

/* The configuration mm_choose last picked on this thread, as text ("wgmma-tma-ppr 128x192x64 2x1
 * s1"), or "" before any: what a benchmark ran (the choice happens when a pending matmul runs). */
const char *mm_last_config(void);

#endif
