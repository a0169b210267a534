/* test_fusion.c — lazy elementwise fusion (src/tensor/fusion.c, docs/fusion.md): randomized op
 * graphs give the same results fused and one op at a time; a chain of N elementwise ops launches
 * one kernel; a one-block GPT's forward and backward launches fewer kernels fused than unfused
 * (both counts printed, a bound asserted) with the same loss and gradients, moves fewer bytes and
 * peaks no higher in device memory; a recorded chain allocates only its result's buffer, when it
 * runs, and running out of memory then is an error at the sync point; bytes moved are counted
 * exactly; and misuse: errors stay at the op, NULL propagates, writes after a lazy read do not
 * leak into the lazy result.
 *
 * Randomized graphs: EMBER_FUSION_GRAPHS graphs on every device (default 1000; the sanitizer
 * build's CTest sets 300). Graphs come in families of EMBER_FUSION_FAMILY (default 16 on the CPU,
 * 40 on the other devices, whose LLVM-based compilers take about 1 s per new kernel cold) that
 * share their structure (ops, dtypes, operands) and a palette of 3 dim sizes,
 * and differ in shapes, broadcasts, views, scalars and data: most of a family's fused kernels are
 * compiled once, which keeps the test near 1.5 minutes cold. Each graph has 1-4 inputs of random
 * shapes broadcasting to one shape (size-1 and zero-size dims included), some of them transposed
 * or sliced views, of dtypes f32/f16/bf16/f64/i32/bool, and 2-12 ops (unary, scalar, binary with
 * broadcasting and type promotion, comparisons, where, masked_fill, casts, views of results)
 * whose operands are drawn from every value so far (a DAG). The last value and one earlier value
 * are read back. Tolerance: on the CPU results must be bitwise equal (the generated C is compiled
 * with -ffp-contract=off and a fused kernel rounds each op's result to its dtype as the unfused op
 * stores it); on other devices, whose compilers may contract a * b + c differently once ops share
 * a kernel, floats agree within a normalized error of 1e-5 (f32), 4e-3 (f16), 3e-2 (bf16), 1e-12
 * (f64), and integers and bools exactly. */
#include "tensor_util.h"

#include "ember/autodiff.h"
#include "ember/gpt.h"
#include "ember/nn.h"

/* ---- a tiny deterministic generator ---------------------------------------------------------- */

static uint32_t xorshift(uint64_t *x)
{
    *x ^= *x << 13;
    *x ^= *x >> 7;
    *x ^= *x << 17;
    return (uint32_t)(*x >> 11);
}
/* Two streams: rs draws a graph's structure (ops, dtypes, operands), vs its variation (sizes,
 * broadcasts, views, scalars, data). Graphs of one family share rs's seed, so they mostly share
 * fused-kernel signatures (one compile each) while their shapes and values differ. */
static uint64_t rs, vs;
static uint32_t rnd(void) { return xorshift(&rs); }
static int rint_(int n) { return (int)(rnd() % (uint32_t)n); }
static int vint_(int n) { return (int)(xorshift(&vs) % (uint32_t)n); }

/* ---- graphs ---------------------------------------------------------------------------------- */

enum { G_INPUT, G_UNARY, G_SCALAR, G_BINARY, G_WHERE, G_MASKED, G_CAST, G_TRANSPOSE, G_NARROW,
       G_RESHAPE, G_NOT };

typedef struct gstep {
    int kind, code, a, b, c; /* op, its variant, operands (value indices) */
    double s;                /* a scalar */
    em_scalar dt;            /* cast target / input dtype */
    em_shape shape;          /* input shape (as created, before a view) */
    int view;                /* inputs: 0 plain, 1 transposed, 2 sliced */
    uint32_t seed;           /* inputs: data */
} gstep;

typedef struct graph {
    gstep st[24];
    int n;
    int out2; /* the earlier value read back */
} graph;

/* What the generator knows of a value while building: its shape and dtype. */
typedef struct gval {
    em_shape s;
    em_scalar dt;
} gval;

static const em_scalar g_dtypes[] = {EM_F32, EM_F16, EM_BF16, EM_F64, EM_I32, EM_BOOL};

static bool bcast(em_shape a, em_shape b, em_shape *out)
{
    int r = a.rank > b.rank ? a.rank : b.rank;
    out->rank = r;
    for (int i = 0; i < r; i++) {
        int ia = i - (r - a.rank), ib = i - (r - b.rank);
        int64_t da = ia >= 0 ? a.d[ia] : 1, db = ib >= 0 ? b.d[ib] : 1;
        if (da != db && da != 1 && db != 1) return false;
        out->d[i] = da == 1 ? db : da;
    }
    return true;
}

static bool is_fl(em_scalar t) { return em_scalar_is_float(t); }

/* A value index whose shape broadcasts with v's (v itself when none). */
static int partner(const gval *vals, int n, int v)
{
    int pick = v;
    for (int tries = 0; tries < 8; tries++) { /* always 8 draws: the structure stays in step */
        int c = rint_(n);
        em_shape o;
        if (pick == v && bcast(vals[c].s, vals[v].s, &o)) pick = c;
    }
    return pick;
}

static void gen_graph(graph *g, em_device *dev)
{
    static const int64_t sizes[] = {1, 2, 3, 4, 5, 8, 17, 0};
    memset(g, 0, sizeof *g);
    gval vals[24];
    em_shape S;
    /* a family's sizes come from a palette of 3 (few distinct walks and line widths, so few
     * kernel specializations); zero-size dims from any */
    int64_t pal[3] = {sizes[rint_(7)], sizes[rint_(7)], sizes[rint_(7)]};
    S.rank = rint_(5);
    for (int i = 0; i < S.rank; i++) S.d[i] = vint_(40) == 0 ? 0 : pal[vint_(3)];
    int nin = 1 + rint_(4);
    for (int k = 0; k < nin; k++) {
        gstep *s = &g->st[g->n];
        s->kind = G_INPUT;
        em_shape x = S;
        int drop = x.rank ? rint_(x.rank + 1) : 0;
        if (rint_(2) == 0) drop = 0;
        x.rank -= drop;
        for (int i = 0; i < x.rank; i++) {
            x.d[i] = S.d[i + drop];
            if (vint_(4) == 0) x.d[i] = 1;
        }
        do s->dt = g_dtypes[rint_(6)];
        while (!tu_has(dev, s->dt));
        s->shape = x;
        s->view = x.rank >= 2 ? vint_(3) : (x.rank == 1 ? 2 * vint_(2) : 0);
        s->seed = xorshift(&vs);
        vals[g->n].s = x;
        vals[g->n].dt = s->dt;
        g->n++;
    }
    int nops = 2 + rint_(11);
    for (int k = 0; k < nops; k++) {
        gstep *s = &g->st[g->n];
        int a = rint_(g->n);
        gval va = vals[a];
        s->a = a;
        int pick = rint_(20);
        gval r = va;
        if (pick < 5) {
            if (va.dt == EM_BOOL) {
                s->kind = G_NOT;
            } else {
                s->kind = G_UNARY;
                s->code = is_fl(va.dt) ? rint_(8) : 4 + rint_(2); /* ints: neg / abs / relu */
                if (!is_fl(va.dt) && s->code == 4) s->code = 8;
            }
        } else if (pick < 8) {
            s->kind = G_SCALAR;
            s->code = rint_(5);
            s->s = (double)(vint_(9) - 4) * (is_fl(va.dt) ? 0.375 : 1);
            if (va.dt == EM_BOOL) {
                s->code = 4; /* eq_scalar is the one scalar op on bools */
                s->s = 1;
            }
            if (s->code >= 3) r.dt = EM_BOOL;
        } else if (pick < 13) {
            s->kind = G_BINARY;
            s->b = partner(vals, g->n, a);
            s->code = rint_(7);
            em_shape o;
            bcast(va.s, vals[s->b].s, &o);
            r.s = o;
            em_scalar pt = em_promote_types(va.dt, vals[s->b].dt);
            if (pt == EM_BOOL && s->code != 6) s->code = rint_(2) ? 6 : 4; /* bools: eq, maximum */
            if (s->code == 3 && !is_fl(pt)) pt = EM_F32;
            r.dt = s->code >= 5 ? EM_BOOL : pt;
        } else if (pick < 15) {
            int c = -1;
            for (int i = 0; i < g->n; i++)
                if (vals[i].dt == EM_BOOL) c = i;
            if (c < 0) {
                s->kind = G_SCALAR;
                s->code = va.dt == EM_BOOL ? 4 : 3;
                s->s = 0.25;
                r.dt = EM_BOOL;
            } else {
                em_shape o1, o2;
                s->b = partner(vals, g->n, a);
                s->c = c;
                if (!bcast(va.s, vals[s->b].s, &o1) || !bcast(o1, vals[c].s, &o2)) {
                    s->b = a;
                    if (!bcast(va.s, vals[c].s, &o2)) s->c = -1;
                    o1 = va.s;
                }
                if (s->c < 0) {
                    s->kind = G_CAST;
                    s->dt = EM_F32;
                    r.dt = EM_F32;
                } else if (rint_(2) == 0 && o2.rank == va.s.rank &&
                           !memcmp(o2.d, va.s.d, sizeof(int64_t) * (size_t)o2.rank)) {
                    s->kind = G_MASKED;
                    s->s = -1.5;
                    r = va;
                } else {
                    s->kind = G_WHERE;
                    r.s = o2;
                    r.dt = em_promote_types(va.dt, vals[s->b].dt);
                }
            }
        } else if (pick < 17) {
            s->kind = G_CAST;
            do s->dt = g_dtypes[rint_(6)];
            while (!tu_has(dev, s->dt));
            r.dt = s->dt;
        } else if (va.s.rank >= 2 && pick == 17) {
            s->kind = G_TRANSPOSE;
            r.s.d[va.s.rank - 1] = va.s.d[va.s.rank - 2];
            r.s.d[va.s.rank - 2] = va.s.d[va.s.rank - 1];
        } else if (va.s.rank >= 1 && pick == 18 && va.s.d[0] >= 2) {
            s->kind = G_NARROW;
            s->code = vint_((int)va.s.d[0] - 1);
            r.s.d[0] = va.s.d[0] - s->code - 1 > 0 ? va.s.d[0] - s->code - 1 : 1;
        } else {
            s->kind = G_RESHAPE; /* flatten (a view of a contiguous value: inlinable) */
            int64_t n = 1;
            for (int i = 0; i < va.s.rank; i++) n *= va.s.d[i];
            r.s.rank = 1;
            r.s.d[0] = n;
        }
        vals[g->n] = r;
        g->n++;
    }
    g->out2 = rint_(g->n - 1);
}

static em_tensor *make_input(em_device *dev, const gstep *s)
{
    em_shape cs = s->shape;
    if (s->view == 1) {
        cs.d[cs.rank - 1] = s->shape.d[cs.rank - 2];
        cs.d[cs.rank - 2] = s->shape.d[cs.rank - 1];
    } else if (s->view == 2) {
        cs.d[0] += 2;
    }
    size_t n = 1;
    for (int i = 0; i < cs.rank; i++) n *= (size_t)cs.d[i];
    double *v = malloc(n * sizeof(double) + 8);
    assert_non_null(v);
    tu_fill(v, n, -2.5, 2.5, s->seed);
    for (size_t i = 0; i < n; i++) {
        if (s->dt == EM_I32) v[i] = floor(v[i] * 2);
        if (s->dt == EM_BOOL) v[i] = v[i] > 0;
    }
    em_tensor *t = tu_tensor(dev, s->dt, cs, v);
    free(v);
    if (s->view == 1) return em_transpose(em_take(t), -1, -2);
    if (s->view == 2) return em_narrow(em_take(t), 0, 1, s->shape.d[0]);
    return t;
}

static em_tensor *run_step(em_device *dev, const gstep *s, em_tensor **v)
{
    em_tensor *a = v[s->a];
    switch (s->kind) {
    case G_INPUT: return make_input(dev, s);
    case G_NOT: return em_logical_not(a);
    case G_UNARY: {
        switch (s->code) {
        case 0: return em_exp(a);
        case 1: return em_tanh(a);
        case 2: return em_sigmoid(a);
        case 3: return em_gelu_tanh(a);
        case 4: return em_sin(a);
        case 5: return em_neg(a);
        case 6: return em_abs(a);
        case 7: return em_sqrt(a);
        default: return em_relu(a);
        }
    }
    case G_SCALAR: {
        switch (s->code) {
        case 0: return em_add_scalar(a, s->s);
        case 1: return em_mul_scalar(a, s->s);
        case 2: return em_maximum_scalar(a, s->s);
        case 3: return em_gt_scalar(a, s->s);
        default: return em_eq_scalar(a, s->s);
        }
    }
    case G_BINARY: {
        em_tensor *b = v[s->b];
        switch (s->code) {
        case 0: return em_add(a, b);
        case 1: return em_sub(a, b);
        case 2: return em_mul(a, b);
        case 3: return em_div(a, b);
        case 4: return em_maximum(a, b);
        case 5: return em_lt(a, b);
        default: return em_eq(a, b);
        }
    }
    case G_WHERE: return em_where(v[s->c], a, v[s->b]);
    case G_MASKED: return em_masked_fill(a, v[s->c], s->s);
    case G_CAST: return em_cast(a, s->dt);
    case G_TRANSPOSE: return em_transpose(a, -1, -2);
    case G_NARROW: {
        int64_t len = em_dim(a, 0) - s->code - 1;
        return em_narrow(a, 0, s->code, len > 0 ? len : 1);
    }
    default: return em_reshape(a, EM_SHAPE(em_numel(a)));
    }
}

/* The two values read back, as doubles (NULL when the graph failed: then *err holds why). */
typedef struct gresult {
    double *v[2];
    size_t n[2];
    em_scalar dt[2];
    bool failed;
    char err[256];
} gresult;

static void run_graph(em_device *dev, const graph *g, bool fused, gresult *r)
{
    em_fusion_set(fused);
    memset(r, 0, sizeof *r);
    em_scope_begin();
    em_tensor *v[24] = {0};
    for (int i = 0; i < g->n; i++) {
        v[i] = run_step(dev, &g->st[i], v);
        if (!v[i]) {
            r->failed = true;
            snprintf(r->err, sizeof r->err, "step %d: %s", i, em_last_error());
            break;
        }
    }
    if (!r->failed) {
        int idx[2] = {g->n - 1, g->out2};
        for (int k = 0; k < 2; k++) {
            r->v[k] = tu_read(v[idx[k]]);
            r->n[k] = (size_t)em_numel(v[idx[k]]);
            r->dt[k] = em_dtype(v[idx[k]]);
        }
    }
    em_scope_end(NULL, 0);
    em_fusion_set(true);
}

/* Prints a graph's steps (on a failure). */
static void dump_graph(const graph *g)
{
    static const char *kinds[] = {"input", "unary", "scalar", "binary", "where", "masked_fill", "cast",
                                  "transpose", "narrow", "reshape", "not"};
    for (int i = 0; i < g->n; i++) {
        const gstep *s = &g->st[i];
        fprintf(stderr, "  v%d = %s code %d (v%d, v%d, v%d) s %g dt %s", i, kinds[s->kind], s->code, s->a,
                s->b, s->c, s->s, em_scalar_name(s->dt));
        if (s->kind == G_INPUT) {
            fprintf(stderr, " shape [");
            for (int k = 0; k < s->shape.rank; k++) fprintf(stderr, "%s%lld", k ? ", " : "", (long long)s->shape.d[k]);
            fprintf(stderr, "] view %d", s->view);
        }
        fprintf(stderr, "\n");
    }
    fprintf(stderr, "  read: v%d and v%d\n", g->n - 1, g->out2);
}

static double fuse_tol(em_scalar dt)
{
    switch (dt) {
    case EM_F16: return 4e-3;
    case EM_BF16: return 3e-2;
    case EM_F32: return 1e-5;
    case EM_F64: return 1e-12;
    default: return 0;
    }
}

static int graph_count(void)
{
    const char *e = getenv("EMBER_FUSION_GRAPHS");
    return e && atoi(e) > 0 ? atoi(e) : 1000;
}

/* Graphs per family (EMBER_FUSION_FAMILY; 1 makes every graph's structure new): by default 16 on
 * the CPU and 40 on the other devices, whose compilers (PoCL's and lavapipe's LLVM) cost about a
 * second per new kernel: 25 structures there, each in 40 shapes, views and data. */
static int family_size(em_device *dev)
{
    const char *e = getenv("EMBER_FUSION_FAMILY");
    return e && atoi(e) > 0 ? atoi(e) : tu_is_cpu(dev) ? 16 : 40;
}

static void test_random_graphs(void **state)
{
    (void)state;
    for (int di = 0; di < tu_ndev; di++) {
        em_device *dev = tu_devs[di];
        bool exact = tu_is_cpu(dev);
        int count = graph_count(), fam = family_size(dev), failed = 0, fused_kernels = 0;
        em_tensor_stats c0 = em_tensor_stats_get();
        for (int gi = 0; gi < count; gi++) {
            graph g;
            rs = 0x9e3779b97f4a7c15ull * (uint64_t)(gi / fam + 1) + (uint64_t)di;
            vs = 0xd1b54a32d192ed03ull * (uint64_t)(gi + 1) + (uint64_t)di;
            for (int w = 0; w < 4; w++) (void)rnd(), (void)xorshift(&vs); /* mix the seeds */
            gen_graph(&g, dev);
            const char *first = getenv("EMBER_FUSION_FIRST"); /* debugging: skip to a graph */
            if (first && gi < atoi(first)) continue;
            gresult a, b;
            em_tensor_stats s0 = em_tensor_stats_get();
            run_graph(dev, &g, true, &a);
            fused_kernels += (int)(em_tensor_stats_get().fused_launches - s0.fused_launches);
            run_graph(dev, &g, false, &b);
            if (a.failed != b.failed) {
                dump_graph(&g);
                fail_msg("graph %d on %s: fused %s, unfused %s", gi, em_device_name(dev),
                         a.failed ? a.err : "ok", b.failed ? b.err : "ok");
            }
            if (a.failed) failed++;
            for (int k = 0; k < 2 && !a.failed; k++) {
                assert_int_equal(a.n[k], b.n[k]);
                assert_int_equal(a.dt[k], b.dt[k]);
                double tol = exact ? 0 : fuse_tol(a.dt[k]);
                char what[96];
                snprintf(what, sizeof what, "graph %d value %d (%s) on %s", gi, k,
                         em_scalar_name(a.dt[k]), em_device_name(dev));
                for (size_t i = 0; i < a.n[k]; i++) {
                    double x = a.v[k][i], y = b.v[k][i];
                    bool ok = (isnan(x) && isnan(y)) || x == y ||
                              (!isinf(x) && !isinf(y) && fabs(x - y) <= tol * (fabs(y) > 1 ? fabs(y) : 1));
                    if (!ok) {
                        dump_graph(&g);
                        fail_msg("%s: element %zu is %.17g fused, %.17g unfused", what, i, x, y);
                    }
                }
                free(a.v[k]);
                free(b.v[k]);
            }
        }
        fprintf(stderr,
                "[fusion] %s: %d graphs in families of %d (%d failed in both runs alike), %d fused "
                "kernels launched, %llu fused sources generated\n",
                em_device_name(dev), count, fam, failed, fused_kernels,
                (unsigned long long)(em_tensor_stats_get().fused_compiles - c0.fused_compiles));
        assert_true(failed < count / 10 + 1); /* the generator builds valid graphs */
        assert_true(fused_kernels > count / 2);
    }
}

/* ---- launch counts ---------------------------------------------------------------------------- */

static void test_chain_is_one_launch(void **state)
{
    (void)state;
    for (int di = 0; di < tu_ndev; di++) {
        em_device *dev = tu_devs[di];
        for (int n = 1; n <= 12; n++) {
            uint64_t fused_bytes = 0;
            for (int fused = 1; fused >= 0; fused--) {
                em_fusion_set(fused);
                em_scope_begin();
                double v[96], w[32], ref[96];
                tu_fill(v, 96, -1, 1, 7u + (unsigned)n);
                tu_fill(w, 32, -1, 1, 9u);
                em_tensor *x = tu_tensor(dev, EM_F32, EM_SHAPE(3, 32), v);
                em_tensor *b = tu_tensor(dev, EM_F32, EM_SHAPE(32), w);
                em_tensor_stats s0 = em_tensor_stats_get();
                em_tensor *y = x;
                for (int i = 0; i < 96; i++) ref[i] = v[i];
                for (int k = 0; k < n; k++) {
                    switch (k % 4) {
                    case 0:
                        y = em_add(em_take(y == x ? em_retain(x) : y), b);
                        for (int i = 0; i < 96; i++) ref[i] = (float)(ref[i] + w[i % 32]);
                        break;
                    case 1:
                        y = em_tanh(em_take(y));
                        for (int i = 0; i < 96; i++) ref[i] = tanhf((float)ref[i]);
                        break;
                    case 2:
                        y = em_mul_scalar(em_take(y), 1.5);
                        for (int i = 0; i < 96; i++) ref[i] = (float)(ref[i] * 1.5f);
                        break;
                    default:
                        y = em_sub(b, em_take(y));
                        for (int i = 0; i < 96; i++) ref[i] = (float)(w[i % 32] - ref[i]);
                        break;
                    }
                }
                double *got = tu_read(y);
                em_tensor_stats s1 = em_tensor_stats_get();
                uint64_t launches = s1.launches - s0.launches;
                if (launches != (fused ? 1u : (uint64_t)n))
                    fail_msg("%d ops %s on %s: %llu launches", n, fused ? "fused" : "unfused",
                             em_device_name(dev), (unsigned long long)launches);
                if (fused) assert_int_equal(s1.fused_ops - s0.fused_ops, n);
                /* bytes moved: fused, x and b read once and y written once; unfused, every
                 * intermediate written and read back */
                uint64_t bytes =
                    s1.bytes_read - s0.bytes_read + s1.bytes_written - s0.bytes_written;
                if (fused) {
                    fused_bytes = bytes;
                    assert_int_equal(bytes, (96 + 32 + 96) * 4);
                } else if (n > 1 && fused_bytes >= bytes) {
                    fail_msg("%d ops on %s: %llu bytes moved fused, %llu unfused", n,
                             em_device_name(dev), (unsigned long long)fused_bytes,
                             (unsigned long long)bytes);
                }
                assert_true(tu_close_n("chain", got, ref, 96, 1e-5));
                free(got);
                em_scope_end(NULL, 0);
            }
        }
        em_fusion_set(true);
    }
}

/* The row-wise kernels (softmax, norms, sums over the last dims: ops_reduce.c's fast path) bind
 * buffers outside tn_launch: they realize a pending input first, read its values, and count as
 * launches. */
static void test_rowwise_reads_pending(void **state)
{
    (void)state;
    for (int di = 0; di < tu_ndev; di++) {
        em_device *dev = tu_devs[di];
        em_scope_begin();
        double v[4 * 32], w[32], b[32];
        tu_fill(v, 4 * 32, -2, 2, 21u);
        tu_fill(w, 32, 0.5, 1.5, 22u);
        tu_fill(b, 32, -1, 1, 23u);
        em_tensor *x = tu_tensor(dev, EM_F32, EM_SHAPE(4, 32), v);
        em_tensor *tw = tu_tensor(dev, EM_F32, EM_SHAPE(32), w);
        em_tensor *tb = tu_tensor(dev, EM_F32, EM_SHAPE(32), b);
        int last = -1;
        for (int op = 0; op < 3; op++) {
            double ref[4 * 32], e[4 * 32];
            int64_t nout = op == 2 ? 4 : 4 * 32;
            for (int i = 0; i < 4 * 32; i++) e[i] = (float)((float)(v[i] * 0.5f) + 0.25f);
            for (int r = 0; r < 4; r++) {
                const double *row = e + r * 32;
                double mx = row[0], sum = 0, mean = 0, var = 0;
                for (int j = 0; j < 32; j++) mx = row[j] > mx ? row[j] : mx;
                for (int j = 0; j < 32; j++) sum += exp(row[j] - mx);
                for (int j = 0; j < 32; j++) mean += row[j] / 32;
                for (int j = 0; j < 32; j++) var += (row[j] - mean) * (row[j] - mean) / 32;
                for (int j = 0; j < 32; j++) {
                    if (op == 0) ref[r * 32 + j] = exp(row[j] - mx) / sum;
                    if (op == 1) ref[r * 32 + j] = (row[j] - mean) / sqrt(var + 1e-5) * w[j] + b[j];
                }
                if (op == 2) ref[r] = mean * 32;
            }
            for (int fused = 1; fused >= 0; fused--) {
                em_fusion_set(fused);
                em_tensor *p = em_add_scalar(em_take(em_mul_scalar(x, 0.5)), 0.25); /* pending */
                /* a pending weight too: its buffer is bound directly */
                em_tensor *pw = em_mul_scalar(tw, 1);
                em_tensor_stats s0 = em_tensor_stats_get();
                em_tensor *y = op == 0 ? em_softmax(p, -1)
                               : op == 1 ? em_layer_norm(p, 1, pw, tb, 1e-5)
                                         : em_sum(p, &last, 1, false);
                assert_non_null(y);
                assert_int_equal(em_realize(y), EM_OK); /* a pending reduction (fusion_rows.c) runs */
                em_tensor_stats s1 = em_tensor_stats_get();
                /* fused: the row-wise kernel computes the pending chain in its loads (one
                 * launch; tests/tensor/test_fusion_reduce.c) on GPUs; the CPU and the general
                 * kernels (no plane ops) run the chain first; the pending weight runs first as
                 * a fused kernel;
                 * unfused: the 2 ops (3 with the weight) ran before s0 */
                /* the CPU computes only single ops in its row kernels' loads (fusion_reduce.c) */
                bool prologue = !tu_is_cpu(dev) && em_device_caps(dev)->plane_ops;
                uint64_t want = !fused ? 1u : (op == 1 ? 2u : 1u) + (prologue ? 0u : 1u);
                if (s1.launches - s0.launches != want)
                    fail_msg("row-wise op %d %s on %s: %llu launches, want %llu", op,
                             fused ? "fused" : "unfused", em_device_name(dev),
                             (unsigned long long)(s1.launches - s0.launches),
                             (unsigned long long)want);
                char what[64];
                snprintf(what, sizeof what, "row-wise op %d %s", op, fused ? "fused" : "unfused");
                double *got = tu_read(y);
                assert_true(tu_close_n(what, got, ref, (size_t)nout, 1e-4));
                free(got);
                em_release(y);
                em_release(p);
                em_release(pw);
            }
        }
        em_fusion_set(true);
        em_scope_end(NULL, 0);
    }
}

typedef struct grads {
    char names[64][96];
    double *v[64];
    size_t n[64];
    int count;
} grads;

static bool collect_grad(const char *name, em_module_entry *e, void *user)
{
    grads *g = user;
    if (!e->is_param || g->count >= 64) return true;
    em_tensor *gr = em_grad(e->t);
    snprintf(g->names[g->count], sizeof g->names[0], "%s", name);
    g->v[g->count] = gr ? tu_read(gr) : NULL;
    g->n[g->count] = gr ? (size_t)em_numel(gr) : 0;
    g->count++;
    return true;
}

/* What one step cost: tensor-layer launches, bytes moved (read + written) and the pool's peak
 * bytes in use during the step. */
typedef struct step_cost {
    uint64_t launches, bytes, peak;
} step_cost;

/* A one-block GPT: forward, loss and backward; returns what the step cost. */
static step_cost gpt_step(em_device *dev, bool fused, double *loss, grads *gr)
{
    em_fusion_set(fused);
    em_gpt_config cfg = {64, 16, 1, 2, 32, 0.0, true, true};
    em_gpt *g = em_gpt_new(dev, EM_F32, &cfg, 11);
    assert_non_null(g);
    int64_t ids[32], tg[32];
    for (int i = 0; i < 32; i++) {
        ids[i] = (i * 7 + 3) % 64;
        tg[i] = (i * 5 + 1) % 64;
    }
    em_tensor *tid = em_from_host(dev, EM_I64, EM_SHAPE(2, 16), ids);
    em_tensor *ttg = em_from_host(dev, EM_I64, EM_SHAPE(2, 16), tg);
    assert_int_equal(em_flush(), EM_OK);
    em_device_pool_reset_peak(dev);
    em_tensor_stats s0 = em_tensor_stats_get();
    em_tensor *l = em_gpt_loss(g, tid, ttg);
    assert_non_null(l);
    assert_int_equal(em_backward(l, NULL), EM_OK);
    assert_int_equal(em_flush(), EM_OK); /* everything pending runs: a fair count */
    em_tensor_stats s1 = em_tensor_stats_get();
    em_pool_stats ps;
    em_device_pool_stats(dev, &ps);
    step_cost cost = {s1.launches - s0.launches,
                      s1.bytes_read - s0.bytes_read + s1.bytes_written - s0.bytes_written,
                      ps.peak_in_use};
    *loss = em_item(l);
    memset(gr, 0, sizeof *gr);
    em_module_visit(em_gpt_module(g), collect_grad, gr);
    em_release(l);
    em_release(tid);
    em_release(ttg);
    em_gpt_free(g);
    em_fusion_set(true);
    return cost;
}

static void test_gpt_block_launches(void **state)
{
    (void)state;
    em_device *dev = tu_devs[0];
    double lf, lu;
    grads *gf = calloc(1, sizeof *gf), *gu = calloc(1, sizeof *gu);
    assert_non_null(gf);
    assert_non_null(gu);
    step_cost f = gpt_step(dev, true, &lf, gf);
    step_cost u = gpt_step(dev, false, &lu, gu);
    fprintf(stderr,
            "[fusion] one-block GPT forward + backward on %s: %llu launches fused, %llu unfused; "
            "%llu bytes moved fused, %llu unfused; peak %llu bytes in use fused, %llu unfused\n",
            em_device_name(dev), (unsigned long long)f.launches, (unsigned long long)u.launches,
            (unsigned long long)f.bytes, (unsigned long long)u.bytes, (unsigned long long)f.peak,
            (unsigned long long)u.peak);
    /* the bound: fused, at most 80% of the launches, the row-wise kernels of ops_reduce.c counted
     * in both (113 of 170 on the CPU when this was written; 67 of 88 since the norms' and the
     * GELU's backward became one op each, a decomposition fusion no longer has to merge) */
    assert_true(f.launches * 10 <= u.launches * 8);
    /* fused, intermediates are neither written nor read back, and those inlined and freed unread
     * never get a buffer (docs/fusion.md has the figures) */
    assert_true(f.bytes < u.bytes);
    /* and the peak is no higher, within 1%: a pending node holds its inputs until its consumer
     * realizes it, where the unfused op freed them at once (195,712 bytes fused against 457,600
     * unfused before the norms' backward was one pass; 180,096 against 179,072 since) */
    assert_true(f.peak * 100 <= u.peak * 101);
    double tol = tu_is_cpu(dev) ? 1e-6 : 1e-4;
    assert_true(fabs(lf - lu) <= tol * fabs(lu));
    assert_int_equal(gf->count, gu->count);
    assert_true(gf->count > 4);
    for (int i = 0; i < gf->count; i++) {
        assert_int_equal(gf->n[i], gu->n[i]);
        if (!gf->v[i]) continue;
        assert_non_null(gu->v[i]);
        for (size_t j = 0; j < gf->n[i]; j++)
            if (fabs(gf->v[i][j] - gu->v[i][j]) > 1e-4 * (fabs(gu->v[i][j]) > 1e-2 ? fabs(gu->v[i][j]) : 1e-2))
                fail_msg("grad %s[%zu]: %.9g fused, %.9g unfused", gf->names[i], j, gf->v[i][j], gu->v[i][j]);
        free(gf->v[i]);
        free(gu->v[i]);
    }
    free(gf);
    free(gu);
}

/* ---- memory and bytes moved ------------------------------------------------------------------ */

/* A recorded chain whose intermediates are inlined and freed allocates only its result, when it
 * runs; a pending result dropped unread allocates nothing. Unfused, every op allocates. */
static void test_deferred_allocation(void **state)
{
    (void)state;
    for (int di = 0; di < tu_ndev; di++) {
        em_device *dev = tu_devs[di];
        for (int fused = 1; fused >= 0; fused--) {
            em_fusion_set(fused);
            em_scope_begin();
            double v[1000], ref[1000];
            tu_fill(v, 1000, -1, 1, 31u);
            em_tensor *x = tu_tensor(dev, EM_F32, EM_SHAPE(1000), v);
            assert_int_equal(em_flush(), EM_OK);
            em_pool_stats p0, p1, p2;
            em_device_pool_stats(dev, &p0);
            em_device_pool_reset_peak(dev);
            em_tensor *a = em_exp(x);
            em_tensor *b = em_add_scalar(a, 1);
            em_tensor *c = em_mul(b, x);
            em_release(a);
            em_release(b);
            em_release(em_sigmoid(c)); /* dropped unread */
            em_device_pool_stats(dev, &p1);
            if (fused) {
                assert_null(c->st->buf); /* recorded: no buffer yet */
                assert_int_equal(p1.allocs, p0.allocs);
            } else {
                assert_int_equal(p1.allocs - p0.allocs, 4);
            }
            assert_int_equal(em_realize(c), EM_OK);
            assert_non_null(c->st->buf);
            em_device_pool_stats(dev, &p2);
            uint64_t in_use = p2.bytes_in_use - p0.bytes_in_use;
            uint64_t peak = p2.peak_in_use - p0.bytes_in_use;
            if (fused) {
                /* one buffer of 4000 bytes (its size class), never more at once */
                assert_int_equal(p2.allocs - p0.allocs, 1);
                assert_true(in_use >= 4000 && in_use < 8000);
                assert_int_equal(peak, in_use);
            } else {
                assert_true(peak >= 3 * in_use); /* a, b and c were live together */
            }
            for (int i = 0; i < 1000; i++)
                ref[i] = (float)((float)((float)exp(v[i]) + 1.0f) * (float)v[i]);
            tu_check("deferred chain", c, EM_SHAPE(1000), ref, 1e-5);
            em_scope_end(NULL, 0);
        }
        em_fusion_set(true);
    }
}

/* Out of device memory when a recorded tree runs is an error at the sync point, never a crash:
 * an f64 tensor of 2^32 - 1 elements (32 GiB) is more than the CPU device may hand out here (its
 * limit is the machine's memory), so its fill records fine and fails to run. */
/* A pending value read by three consumers (each realized in turn): a cheap one (neg) is inlined
 * into each, 3 launches covering 6 ops, everywhere; a transcendental one (exp) on the CPU is
 * inlined into its first consumer only and then realized once, 4 launches covering 5 ops (docs/
 * fusion.md: recomputing it would cost more than reading it back there); other devices inline it
 * into each. Values are checked against the host either way. Then one op reading a pending tanh
 * twice after its input was freed (the storage an inlined leaf reads must stay held). */
static void test_shared_transcendental(void **state)
{
    (void)state;
    em_fusion_set(true);
    for (int di = 0; di < tu_ndev; di++) {
        em_device *dev = tu_devs[di];
        for (int costly = 0; costly < 2; costly++) {
            em_scope_begin();
            double v[300], ref[3][300];
            tu_fill(v, 300, -1, 1, 77u + (uint32_t)costly);
            em_tensor *x = tu_tensor(dev, EM_F32, EM_SHAPE(300), v);
            assert_int_equal(em_flush(), EM_OK);
            em_tensor_stats s0 = em_tensor_stats_get();
            em_tensor *e = costly ? em_exp(x) : em_neg(x);
            em_tensor *y[3] = {em_add_scalar(e, 1), NULL, NULL};
            assert_int_equal(em_realize(y[0]), EM_OK);
            y[1] = em_mul_scalar(e, 2);
            assert_int_equal(em_realize(y[1]), EM_OK);
            y[2] = em_add_scalar(e, 3);
            assert_int_equal(em_realize(y[2]), EM_OK);
            em_tensor_stats s1 = em_tensor_stats_get();
            bool once = costly && tu_is_cpu(dev);
            assert_int_equal(s1.fused_launches - s0.fused_launches, once ? 4 : 3);
            assert_int_equal(s1.fused_ops - s0.fused_ops, once ? 5 : 6);
            for (int i = 0; i < 300; i++) {
                double ev = tu_round(EM_F32, costly ? exp(tu_round(EM_F32, v[i])) : -v[i]);
                ref[0][i] = ev + 1, ref[1][i] = ev * 2, ref[2][i] = ev + 3;
            }
            for (int j = 0; j < 3; j++)
                tu_check("shared consumer", y[j], EM_SHAPE(300), ref[j], tu_tol_on(dev, EM_F32));
            em_scope_end(NULL, 0);
        }
        /* one op reading the same pending tanh twice, its input freed: the first operand inlines
         * the tree (its leaf, the input's buffer, held from then on), the second realizes it on
         * the CPU (a shared transcendental), which frees the tree's own hold on that buffer */
        em_scope_begin();
        double v[300], ref[300];
        tu_fill(v, 300, -2, 2, 79u);
        em_tensor *m = tu_tensor(dev, EM_F32, EM_SHAPE(300), v);
        assert_int_equal(em_flush(), EM_OK);
        em_tensor *t = em_tanh(m);
        em_release(m); /* the tree's leaf is now the only holder of m's buffer */
        em_tensor *z = em_mul(t, t);
        assert_non_null(z);
        for (int i = 0; i < 300; i++) {
            double tv = tu_round(EM_F32, tanh(tu_round(EM_F32, v[i])));
            ref[i] = tv * tv;
        }
        tu_check("a pending tanh read twice by one op", z, EM_SHAPE(300), ref, tu_tol_on(dev, EM_F32) * 4);
        em_scope_end(NULL, 0);
    }
}

static void test_realize_out_of_memory(void **state)
{
    (void)state;
    em_device *dev = tu_devs[0];
    const em_caps *caps = em_device_caps(dev);
    const int64_t n = (int64_t)UINT32_MAX;
    if (!tu_is_cpu(dev) || !caps->memory_total || caps->memory_total >= (uint64_t)n * 8) {
        fprintf(stderr, "[fusion] skipping the out-of-memory check (%s has %llu bytes)\n",
                em_device_name(dev), (unsigned long long)caps->memory_total);
        return;
    }
    em_fusion_set(true);
    em_tensor *big = em_full(dev, EM_F64, EM_SHAPE(n), 1.0);
    assert_non_null(big); /* recorded: nothing allocated yet */
    em_tensor *y = em_mul_scalar(big, 2);
    assert_non_null(y);
    em_status st = em_flush();
    assert_int_equal(st, EM_ERR_NOMEM);
    assert_non_null(strstr(em_last_error(), "out of memory"));
    assert_non_null(strstr(em_last_error(), "fused kernel of"));
    assert_int_equal(em_realize(y), EM_ERR_NOMEM); /* the same error at the next sync point */
    assert_non_null(strstr(em_last_error(), "out of memory"));
    em_release(y);
    em_release(big);
    assert_int_equal(em_flush(), EM_OK); /* dropped: nothing left pending */
    em_clear_error();
    /* unfused, the op itself reports it */
    em_fusion_set(false);
    tu_expect_error(em_full(dev, EM_F64, EM_SHAPE(n), 1.0), "out of memory");
    em_fusion_set(true);
    em_clear_error();
}

/* The bytes a launch moves are the views it binds: add of two f32[1000] reads 8000 bytes and
 * writes 4000, fused or not; a broadcast operand counts once; the profiler's rows agree. */
static void test_bytes_moved(void **state)
{
    (void)state;
    for (int di = 0; di < tu_ndev; di++) {
        em_device *dev = tu_devs[di];
        bool profiling = em_profile_enabled();
        for (int fused = 1; fused >= 0; fused--) {
            em_fusion_set(fused);
            em_scope_begin();
            double v[1000], w[1000];
            tu_fill(v, 1000, -1, 1, 41u);
            tu_fill(w, 1000, -1, 1, 42u);
            em_tensor *a = tu_tensor(dev, EM_F32, EM_SHAPE(1000), v);
            em_tensor *b = tu_tensor(dev, EM_F32, EM_SHAPE(1000), w);
            em_tensor *a2 = em_reshape(a, EM_SHAPE(10, 100));
            em_tensor *row = em_slice(b, 0, 0, 100, 1); /* f32[100], a view of b */
            assert_non_null(a2);
            assert_non_null(row);
            assert_int_equal(em_flush(), EM_OK);
            em_profile_enable(true);
            em_profile_reset();
            em_tensor_stats s0 = em_tensor_stats_get();
            em_tensor *c = em_add(a, b);
            assert_int_equal(em_realize(c), EM_OK);
            em_tensor_stats s1 = em_tensor_stats_get();
            assert_int_equal(s1.bytes_read - s0.bytes_read, 8000);
            assert_int_equal(s1.bytes_written - s0.bytes_written, 4000);
            em_profile_kernel k;
            assert_true(em_profile_kernel_get(fused ? "fused" : "tensor_binary", &k));
            assert_int_equal(k.bytes_read, 8000);
            assert_int_equal(k.bytes_written, 4000);
            /* f32[10, 100] + f32[100]: the row is read once */
            em_tensor *d = em_add(a2, row);
            assert_int_equal(em_realize(d), EM_OK);
            em_tensor_stats s2 = em_tensor_stats_get();
            assert_int_equal(s2.bytes_read - s1.bytes_read, 4400);
            assert_int_equal(s2.bytes_written - s1.bytes_written, 4000);
            em_profile_counts pc;
            em_profile_get(&pc);
            assert_int_equal(pc.bytes_read, 12400);
            assert_int_equal(pc.bytes_written, 8000);
            em_profile_enable(profiling);
            em_profile_reset();
            em_scope_end(NULL, 0);
        }
        em_fusion_set(true);
    }
}

/* ---- misuse and hazards ---------------------------------------------------------------------- */

static void test_errors_and_hazards(void **state)
{
    (void)state;
    for (int di = 0; di < tu_ndev; di++) {
        em_device *dev = tu_devs[di];
        em_fusion_set(true);
        em_scope_begin();
        double v[6] = {1, 2, 3, 4, 5, 6}, w[4] = {1, 2, 3, 4};
        em_tensor *x = tu_tensor(dev, EM_F32, EM_SHAPE(2, 3), v);
        em_tensor *y = tu_tensor(dev, EM_F32, EM_SHAPE(4), w);
        /* a shape error in the middle of a lazy chain is reported at the op, and NULL propagates */
        em_tensor *a = em_exp(x);
        em_tensor *bad = em_add(a, y);
        tu_expect_error(bad, "add: shapes f32[2, 3] and f32[4] cannot be broadcast");
        assert_null(em_mul_scalar(em_tanh(bad), 2));
        assert_null(em_where(NULL, a, a));
        /* the chain before the error still computes */
        double ra[6];
        for (int i = 0; i < 6; i++) ra[i] = (float)exp(v[i]);
        tu_check("exp before the error", a, EM_SHAPE(2, 3), ra, 1e-6);
        /* a write into an input after a lazy op read it: the lazy result keeps the old values */
        em_tensor *z = em_mul_scalar(x, 2);
        em_tensor *ones = em_ones(dev, EM_F32, EM_SHAPE(2, 3));
        assert_int_equal(em_copy_(x, ones), EM_OK);
        double rz[6], r1[6];
        for (int i = 0; i < 6; i++) {
            rz[i] = 2 * v[i];
            r1[i] = 1;
        }
        tu_check("lazy read before a write", z, EM_SHAPE(2, 3), rz, 0);
        tu_check("the write", x, EM_SHAPE(2, 3), r1, 0);
        /* a lazy result dropped unread is never computed */
        em_tensor_stats s0 = em_tensor_stats_get();
        em_release(em_exp(em_take(em_add_scalar(y, 1))));
        assert_int_equal(em_flush(), EM_OK);
        em_tensor_stats s1 = em_tensor_stats_get();
        assert_int_equal(s1.launches, s0.launches);
        assert_int_equal(s1.recorded_ops - s0.recorded_ops, 2);
        /* a shared lazy value read by two consumers and itself */
        em_tensor *sh = em_sigmoid(y);
        em_tensor *c1 = em_add(sh, y), *c2 = em_mul(sh, sh);
        double rs1[4], rs2[4], rsh[4];
        for (int i = 0; i < 4; i++) {
            rsh[i] = (float)(1 / (1 + exp(-w[i])));
            rs1[i] = (float)(rsh[i] + w[i]);
            rs2[i] = (float)(rsh[i] * rsh[i]);
        }
        tu_check("consumer 1", c1, EM_SHAPE(4), rs1, 1e-6);
        tu_check("consumer 2", c2, EM_SHAPE(4), rs2, 1e-6);
        tu_check("shared", sh, EM_SHAPE(4), rsh, 1e-6);
        em_scope_end(NULL, 0);
    }
}

/* Switching fusion off makes every op launch at once. */
static void test_fusion_off(void **state)
{
    (void)state;
    em_device *dev = tu_devs[0];
    em_fusion_set(false);
    assert_false(em_fusion_enabled());
    em_scope_begin();
    em_tensor *x = em_ones(dev, EM_F32, EM_SHAPE(8));
    em_tensor_stats s0 = em_tensor_stats_get();
    em_tensor *y = em_exp(em_add_scalar(x, 1));
    em_tensor_stats s1 = em_tensor_stats_get();
    assert_int_equal(s1.launches - s0.launches, 2);
    assert_int_equal(s1.recorded_ops, s0.recorded_ops);
    assert_non_null(y);
    em_scope_end(NULL, 0);
    em_fusion_set(true);
    assert_true(em_fusion_enabled());
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_chain_is_one_launch),
        cmocka_unit_test(test_errors_and_hazards),
        cmocka_unit_test(test_fusion_off),
        cmocka_unit_test(test_deferred_allocation),
        cmocka_unit_test(test_shared_transcendental),
        cmocka_unit_test(test_realize_out_of_memory),
        cmocka_unit_test(test_bytes_moved),
        cmocka_unit_test(test_rowwise_reads_pending),
        cmocka_unit_test(test_gpt_block_launches),
        cmocka_unit_test(test_random_graphs),
    };
    return cmocka_run_group_tests(tests, tu_setup, tu_teardown);
}
