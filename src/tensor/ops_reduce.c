/* ops_reduce.c — reductions over any set of dims (sum, mean, prod, max, min, argmax, argmin,
 * var, std, logsumexp, all, any), cumsum, softmax/log_softmax and layer/RMS norm, through the
 * kernels of src/kernels/tensor_reduce.ek. The reduced dims are moved last by a permuted view (no
 * copy); one cube reduces one output element.
 *
 * The common case — float softmax, log_softmax, layer_norm, rms_norm, sum and mean over the last
 * dim(s), those being contiguous (stride 1) and the other dims stepping from row to row with one
 * stride — takes the fast path of src/kernels/tensor_rowwise.ek instead, on the CPU and on
 * devices with plane ops: rows read as 16-byte lines, a plane (or a part of one) per short row
 * and several rows per cube, rows of up to 16384 elements held in registers between passes
 * (tn_rows_plan_for says how the host chooses).
 *
 * Float sum and mean over leading dims, the kept dims being one contiguous inner block (bias
 * gradients: [B*T, C] over dim 0), take the column path of src/kernels/tensor_cols.ek on every
 * device: consecutive units read consecutive columns of a row, cubes cover tiles of columns and
 * slices of rows, and a second launch sums the slices' partials (cols_plan_for).
 *
 * Few long rows (fewer than the compute units, 4096 elements or more) are split over several
 * cubes each: tensor_reduce_split reduces chunks of a row into partials, tensor_reduce_combine
 * combines them (reduce_split_for says when; docs/architecture.md, "Split rows").
 *
 * With fusion on, softmax, log_softmax, the norms and the row sums on the row-wise path do not
 * launch: their result is a pending node (fusion_rows.c) that absorbs the elementwise ops applied
 * to it, and runs (tn_rows_run) as one launch with them in its stores. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "tensor/fusion_internal.h"
#include "tensor/internal.h"

enum { R_SUM = 0, R_PROD, R_MAX, R_MIN, R_ARGMAX, R_ARGMIN, R_MEAN, R_VAR, R_STD, R_LSE, R_ALL, R_ANY };

/* ---- the row-wise fast path (src/kernels/tensor_rowwise.ek) ---------------------------------- */

/* Whether the last k dims of t are contiguous together (rows of *n elements, stride 1) and its
 * other dims merge into one (rows at a stride of *rs elements): then t is *rows x *n rows. */
bool tn_rows_geometry(const em_tensor *t, int k, int64_t *rows, int64_t *n, int64_t *rs)
{
    if (t->rank < 1 || k < 1 || k > t->rank) return false;
    int64_t nn = 1;
    for (int i = t->rank - 1; i >= t->rank - k; i--) {
        if (t->shape[i] != 1 && t->stride[i] != nn) return false;
        nn *= t->shape[i];
    }
    int64_t r = 1, st = nn;
    bool seen = false;
    for (int i = t->rank - k - 1; i >= 0; i--) {
        if (t->shape[i] == 1) continue;
        if (seen && t->stride[i] != st * r) return false;
        if (!seen) st = t->stride[i];
        seen = true;
        r *= t->shape[i];
    }
    *rows = r;
    *n = nn;
    *rs = st;
    return true;
}

/* The widest line width that the device takes for dt (em_line_lanes: 16 bytes, 32 for 2-byte
 * types on GPUs, 4 lanes on the CPU), then halves, that divides n and every offset or stride in
 * al[0..na): a row's lines must start on a line boundary. */
static unsigned rows_width(const em_caps *c, em_scalar dt, int64_t n, const int64_t *al, int na,
                           unsigned cap)
{
    unsigned lw = em_line_lanes(c, (unsigned)em_scalar_size(dt));
    while (lw > cap && lw > 1) lw /= 2;
    for (; lw > 1; lw /= 2) {
        bool ok = n % lw == 0;
        for (int i = 0; i < na; i++) ok = ok && al[i] % lw == 0;
        if (ok) break;
    }
    return lw;
}

/* The number of lines a unit keeps in registers for `need`: the next of 1, 2, 3, 4, 6, 8, 12,
 * 16, 24, 32 (so that few distinct kernels are compiled as row lengths vary). */
static unsigned rows_quantize(int64_t need)
{
    static const unsigned steps[] = {1, 2, 3, 4, 6, 8, 12, 16, 24, 32};
    for (size_t i = 0; i < EM_ARRAY_LEN(steps); i++)
        if (need <= steps[i]) return steps[i];
    return 0;
}

/* Chooses the plan for rows x n elements of dtype dt (offsets and strides in al) on dev; false
 * when the fast path does not apply (then the general kernels run):
 *   - The CPU target (a cube is one thread looping over its units, planes of 1): a unit per row,
 *     16 rows per cube, the row walked once per pass (it stays in the cache).
 *   - Devices with plane ops: units per row g, a power of two, grows up to the plane size while
 *     a unit would get more than 4 lines, then past it (a cube per row, the planes meeting
 *     through shared memory) while a unit would hold more than 32 values of the compute type
 *     (16 for f64; `values` when given to tn_rows_plan_caps) in registers. Past g = 512 (rows over 16384 f32 elements) the rows are walked
 *     by 256 units, once per pass. A cube holds at least 128 units (several rows when g is
 *     smaller). The kernel checks PLANE_DIM itself, so this choice affects speed only.
 *   - Other devices (no plane ops: PoCL, NVIDIA's OpenCL), and rows over 65536 elements on the
 *     CPU (whose one unit per row would sum them serially): the general kernels.
 *   - Sizes beyond the kernel's u32 indices: the general kernels (which report them). */
bool tn_rows_plan_for(em_device *dev, em_scalar dt, int64_t rows, int64_t n, int64_t x_rs,
                      const int64_t *al, int na, unsigned cap, tn_rows_plan *p)
{
    return tn_rows_plan_caps(em_device_caps(dev), dt, rows, n, x_rs, al, na, cap, 0, p);
}

bool tn_rows_plan_caps(const em_caps *c, em_scalar dt, int64_t rows, int64_t n, int64_t x_rs,
                       const int64_t *al, int na, unsigned cap, unsigned values, tn_rows_plan *p)
{
    if (!c || rows < 1 || n < 1) return false;
    bool cpu = !strcmp(c->target, "c");
    if (!cpu && !(c->plane_ops && c->plane_dim > 1)) return false;
    /* the CPU's one unit per row accumulates serially: past 2^16 elements the general kernels'
     * cube-wide pairwise tree keeps f32 sums accurate (a row of 2^24 + 37 ones sums exactly) */
    if (cpu && n > 65536) return false;
    p->lw = rows_width(c, dt, n, al, na, cap);
    int64_t nl = n / p->lw;
    if (rows > UINT32_MAX || n > UINT32_MAX || x_rs / p->lw > UINT32_MAX) return false;
    p->rows = (uint32_t)rows;
    p->nl = (uint32_t)nl;
    p->x_rs = (uint32_t)(x_rs / p->lw);
    if (cpu) {
        p->g = 1;
        p->cube = 16;
        p->v = 0;
        return true;
    }
    unsigned maxu = c->max_cube_units ? c->max_cube_units : 256, gmax = 1;
    while (gmax * 2 <= maxu && gmax < 512) gmax *= 2;
    if (!values) values = tn_compute_type(dt) == EM_F64 ? 16 : 32;
    unsigned budget = values > p->lw ? values / p->lw : 1, g = 1;
    while (g * 2 <= c->plane_dim && g < gmax && (int64_t)g * 4 < nl) g *= 2;
    while (g < gmax && (nl + g - 1) / g > budget) g *= 2;
    p->v = rows_quantize((nl + g - 1) / g);
    if (p->v == 0 || p->v > budget) {
        p->v = 0;
        g = gmax < 256 ? gmax : 256;
    }
    p->g = g;
    p->cube = g < 128 && gmax >= 128 ? 128 : g;
    return true;
}

/* The bytes a row-wise kernel moves through t (tn_view_bytes of its view). */
static uint64_t view_bytes(const em_tensor *t)
{
    return tn_view_bytes(t->dtype, t->rank, t->shape, t->stride);
}


/* A flat buffer argument over t's whole storage, in elements of `lanes` scalars. */
static em_arg rows_buffer(const em_tensor *t, unsigned lanes)
{
    return tn_flat_buffer(t, t->dtype, lanes);
}

/* Launches a row-wise kernel over the plan's rows: args[0] is its input x, read from t's buffer,
 * or with pr (a pending t fused into its loads, fusion_reduce.c) computed from pr's leaves.
 * `read` counts the bytes of its other inputs, `written` those of its output (em_tensor_stats).
 * EM_OK or the error set (prefixed with op). */
static em_status rows_launch(const char *op, const em_tensor *t, fu_prologue *pr, const fu_node *epi,
                             size_t out_at, const char *kernel, const tn_rows_plan *p, const em_lang_bind *binds,
                             size_t nb, const em_arg *args, size_t na, uint64_t read, uint64_t written)
{
    unsigned per = p->cube / p->g;
    uint32_t cubes[3] = {(p->rows + per - 1) / per, 1, 1}, units[3] = {p->cube, 1, 1};
    em_lang_spec spec = {binds, nb, p->lw, NULL};
    em_status st;
    if (epi) { /* the epilogue in its stores (out is args[out_at]), and the prologue if any */
        if (!pr) read += tn_view_bytes(t->dtype, t->rank, t->shape, t->stride);
        st = fu_reduce_launch(pr, epi, out_at == 2, t->st->dev, "tensor_rowwise", kernel, &spec, cubes, units,
                              args, na, out_at, read, written);
    } else if (pr) {
        st = fu_prologue_launch(pr, "tensor_rowwise", kernel, &spec, cubes, units, args + 1, na - 1, read,
                                written);
    } else {
        const em_lang_module *m = em_lang_builtins();
        if (!m) return em_error_context("%s", op);
        st = em_lang_launch(t->st->dev, m, kernel, &spec, cubes, units, args, na);
        if (st == EM_OK) fu_count_launch(kernel, read + tn_view_bytes(t->dtype, t->rank, t->shape, t->stride), written);
    }
    if (st != EM_OK) em_error_context("%s", op);
    return st;
}

/* Whether t's pending tree (if any) is computed in the loads of a row-wise kernel writing out
 * with `scalars` scalar arguments (fu_prologue_begin; on the CPU, whose kernels walk a row once
 * per pass, `passes`): then *pr holds it (and the fusion lock) and *cap is the widest line width
 * its leaves allow; else t is realized and *cap is unbounded. EM_OK or the error set. */
static em_status rows_input(const char *op, const em_tensor *t, const em_tensor *out, int passes, int scalars,
                            fu_prologue *pr, bool *fused, unsigned *cap)
{
    *fused = out->st != t->st && scalars <= FU_MAX_SCALARS && fu_prologue_begin(t, passes, scalars, pr);
    *cap = *fused ? pr->max_lw : 64;
    if (!*fused && tn_realize(t) != EM_OK) return em_error_context("%s", op);
    return EM_OK;
}

/* The row-wise kernels bind buffers themselves, outside tn_launch: their weight and bias's
 * pending fused computations run first (the input's, unless fused: rows_input), and so do those
 * reading out's buffer, which the kernel writes. */
static em_status realize_rows(const char *op, const em_tensor *w, const em_tensor *bias, const em_tensor *out)
{
    if (tn_realize(w) != EM_OK || tn_realize(bias) != EM_OK || em_realize(out) != EM_OK)
        return em_error_context("%s", op);
    return EM_OK;
}

/* The comptime bindings every row-wise kernel takes (G, CUBE, V); returns the count added. */
size_t tn_rows_binds(const tn_rows_plan *p, em_lang_bind *b)
{
    b[0] = em_lang_bind_int("G", p->g);
    b[1] = em_lang_bind_int("CUBE", p->cube);
    b[2] = em_lang_bind_int("V", p->v);
    return 3;
}

/* Runs tensor_rows (op 0 softmax, 1 log_softmax, 2 layer_norm, 3 rms_norm) over the last k dims
 * of t into out (contiguous, t's shape); w and bias (or NULL) are contiguous, of the k dims.
 * With epi (a pending node's epilogue: tn_rows_run), out is of epi's dtype and its buffer is not
 * realized again. *taken is false when t's geometry does not fit the fast path (nothing runs;
 * the caller runs the general kernel). EM_OK or the error set. */
static em_status rows_exec(const char *op, const em_tensor *t, int k, const em_tensor *w,
                           const em_tensor *bias, em_tensor *out, double eps, int code,
                           const fu_node *epi, bool deferred, bool *taken)
{
    int64_t rows, n, rs;
    *taken = false;
    if (!tn_rows_geometry(t, k, &rows, &n, &rs)) return EM_OK;
    fu_prologue pr;
    bool fused = false;
    unsigned cap;
    *taken = true;
    int escalars = epi ? epi->nleaves + epi->nparams : 0;
    /* a missing w or bias is bound to a placeholder of dtype T: x when bound, else out, which
     * with an epilogue of a narrower dtype may be too small for a line of T (tiny tensors): then
     * x is realized and bound (the prologue not taken) */
    if (!(w && bias) && em_scalar_size(out->dtype) < em_scalar_size(t->dtype) &&
        out->st->bytes < em_scalar_size(t->dtype) * 32)
        escalars += FU_MAX_SCALARS + 1;
    if (realize_rows(op, w, bias, deferred ? NULL : out) != EM_OK ||
        rows_input(op, t, out, 3, 11 + escalars, &pr, &fused, &cap) != EM_OK)
        return em_last_status();
    if (epi) { /* the epilogue's leaves (and the result) must allow the kernel's line width */
        fu_walk ew;
        int64_t offs[FU_WALK_MAX];
        em_scalar dts[FU_WALK_MAX];
        unsigned ecap = fu_node_walk(epi, &ew, dts, offs);
        if (ecap < cap) cap = ecap;
    }
    int64_t al[5] = {t->offset, rs, out->offset, w ? w->offset : 0, bias ? bias->offset : 0};
    tn_rows_plan p;
    if (!tn_rows_plan_for(t->st->dev, t->dtype, rows, n, rs, al, 5, cap, &p)) {
        *taken = false;
        if (fused) fu_prologue_end(&pr);
        return EM_OK;
    }
    em_scalar ct = tn_compute_type(t->dtype);
    em_lang_bind b[6] = {em_lang_bind_type("T", t->dtype), em_lang_bind_type("C", ct),
                         em_lang_bind_type("M", tn_math_type(t->st->dev, ct))};
    size_t nb = 3 + tn_rows_binds(&p, b + 3);
    const em_tensor *ph = fused ? out : t; /* the placeholder (above) */
    const em_tensor *wt = w ? w : ph, *bt = bias ? bias : ph;
    em_arg a[15] = {fused ? em_arg_u32(0) : rows_buffer(t, p.lw), em_arg_u32((uint32_t)(t->offset / p.lw)),
                    tn_flat_buffer(wt, t->dtype, p.lw), em_arg_u32((uint32_t)(w ? w->offset / p.lw : 0)),
                    tn_flat_buffer(bt, t->dtype, p.lw), em_arg_u32((uint32_t)(bias ? bias->offset / p.lw : 0)),
                    rows_buffer(out, p.lw), em_arg_u32((uint32_t)(out->offset / p.lw)),
                    em_arg_u32(p.rows), em_arg_u32(p.nl), em_arg_u32(p.x_rs), em_arg_u32(p.nl),
                    tn_scalar_arg(t->dtype, eps), em_arg_u32((uint32_t)code),
                    em_arg_u32((w ? 1u : 0u) | (bias ? 2u : 0u))};
    uint64_t read = (w ? view_bytes(w) : 0) + (bias ? view_bytes(bias) : 0);
    em_status st = rows_launch(op, t, fused ? &pr : NULL, epi, 6, "tensor_rows", &p, b, nb, a, 15, read,
                               view_bytes(out));
    if (fused) fu_prologue_end(&pr);
    return st;
}

/* With fusion on, records call c as a pending node (fusion_rows.c) when the row-wise path fits
 * its input at every line width the node may run with (al: the offsets and strides the plan
 * checks, al[1] filled with the row stride). 1 when recorded, 0 when it must run now, -1 with
 * the error set. */
static int rows_record(fu_rows_call *c, int64_t *al, int na)
{
    int64_t rows, n, rs;
    tn_rows_plan p;
    if (!fu_enabled() || c->out.st == c->x.st || !tn_rows_geometry(&c->x, c->k, &rows, &n, &rs))
        return 0;
    al[1] = rs;
    if (!tn_rows_plan_for(c->x.st->dev, c->x.dtype, rows, n, rs, al, na, 1, &p)) return 0;
    int r = fu_rows_record(c);
    if (r < 0) em_error_context("%s", c->op);
    return r;
}

/* rows_exec, or with fusion on (the fast path fitting) out recorded as a pending node that
 * runs rows_exec when realized (fusion_rows.c). out is a fresh tensor of t's shape. */
static em_status rows_apply(const char *op, const em_tensor *t, int k, const em_tensor *w,
                            const em_tensor *bias, em_tensor *out, double eps, int code, bool *taken)
{
    fu_rows_call c = {.op = op, .kind = 0, .x = *t, .has_w = w != NULL, .has_b = bias != NULL, .out = *out,
                      .k = k, .eps = eps, .code = code};
    if (w) c.w = *w;
    if (bias) c.b = *bias;
    int64_t al[5] = {t->offset, 0, out->offset, w ? w->offset : 0, bias ? bias->offset : 0};
    int r = rows_record(&c, al, 5);
    *taken = r != 0;
    if (r != 0) return r > 0 ? EM_OK : em_last_status();
    return rows_exec(op, t, k, w, bias, out, eps, code, NULL, false, taken);
}

static em_status rows_sum_exec(const char *op, const em_tensor *t, int k, em_tensor *out, double scale,
                               const fu_node *epi, bool deferred, bool *taken);

em_status tn_rows_run(const fu_rows_call *c, const fu_node *epi)
{
    if (c->kind == 2) return tn_xent_run(c, epi);
    em_tensor out = c->out;
    bool taken;
    em_status st = c->kind == 1 ? rows_sum_exec(c->op, &c->x, c->k, &out, c->eps, epi, true, &taken)
                                : rows_exec(c->op, &c->x, c->k, c->has_w ? &c->w : NULL,
                                            c->has_b ? &c->b : NULL, &out, c->eps, c->code, epi, true, &taken);
    if (st == EM_OK && !taken)
        st = em_set_error(EM_ERR_INTERNAL, "%s: the row-wise kernel no longer fits its input", c->op);
    return st;
}

/* Runs tensor_rows_sum: out (contiguous, one value per row) = scale * the sums over the last k
 * dims of t; epi and deferred as for rows_exec. *taken as for rows_exec. */
static em_status rows_sum_exec(const char *op, const em_tensor *t, int k, em_tensor *out, double scale,
                               const fu_node *epi, bool deferred, bool *taken)
{
    int64_t rows, n, rs;
    *taken = false;
    if (!tn_rows_geometry(t, k, &rows, &n, &rs)) return EM_OK;
    fu_prologue pr;
    bool fused = false;
    unsigned cap;
    *taken = true;
    int escalars = epi ? epi->nleaves + epi->nparams : 0;
    if (realize_rows(op, NULL, NULL, deferred ? NULL : out) != EM_OK ||
        rows_input(op, t, out, 1, 6 + escalars, &pr, &fused, &cap) != EM_OK)
        return em_last_status();
    int64_t al[2] = {t->offset, rs};
    tn_rows_plan p;
    if (!tn_rows_plan_for(t->st->dev, t->dtype, rows, n, rs, al, 2, cap, &p)) {
        *taken = false;
        if (fused) fu_prologue_end(&pr);
        return EM_OK;
    }
    em_lang_bind b[5] = {em_lang_bind_type("T", t->dtype),
                         em_lang_bind_type("C", tn_compute_type(t->dtype))};
    size_t nb = 2 + tn_rows_binds(&p, b + 2);
    em_arg a[8] = {fused ? em_arg_u32(0) : rows_buffer(t, p.lw), em_arg_u32((uint32_t)(t->offset / p.lw)),
                   rows_buffer(out, 1), em_arg_u32((uint32_t)out->offset), em_arg_u32(p.rows),
                   em_arg_u32(p.nl), em_arg_u32(p.x_rs), tn_scalar_arg(t->dtype, scale)};
    em_status st = rows_launch(op, t, fused ? &pr : NULL, epi, 2, "tensor_rows_sum", &p, b, nb, a, 8, 0,
                               view_bytes(out));
    if (fused) fu_prologue_end(&pr);
    return st;
}

/* rows_sum_exec, or with fusion on (the fast path fitting) out recorded as a pending node
 * (fusion_rows.c), as rows_apply does. out is a fresh tensor of one value per row. */
static em_status rows_sum(const char *op, const em_tensor *t, int k, em_tensor *out, double scale,
                          bool *taken)
{
    fu_rows_call c = {.op = op, .kind = 1, .x = *t, .out = *out, .k = k, .eps = scale};
    int64_t al[2] = {t->offset, 0};
    int r = rows_record(&c, al, 2);
    *taken = r != 0;
    if (r != 0) return r > 0 ? EM_OK : em_last_status();
    return rows_sum_exec(op, t, k, out, scale, NULL, false, taken);
}

/* ---- the column path (src/kernels/tensor_cols.ek) -------------------------------------------- */

/* How the rows x n elements of a column reduction are read and spread over cubes. */
typedef struct cols_plan {
    unsigned lw;     /* line width: scalars per load */
    unsigned tx, ty; /* units of a cube along the columns (bands) and along the rows */
    unsigned v;      /* lines of a unit's band: consecutive lines it adds row by row */
    uint32_t rows;   /* rows reduced */
    uint32_t nl;     /* lines per row (the columns kept, over lw) */
    uint32_t x_rs;   /* row stride of the input, in lines */
    uint32_t rpc;    /* rows per cube along the grid's Y axis */
    uint32_t slices; /* cubes along Y: 1, or the rows of the partials the second launch reduces */
    uint32_t tiles;  /* cubes along X */
} cols_plan;

/* Whether t, reduced over the dims set in red, is a column reduction: leaving out dims of size 1,
 * the reduced dims all come before the kept ones, the kept dims are contiguous together (*n
 * elements, stride 1) and the reduced dims merge into one (*rows rows at a stride of *rs). */
static bool cols_geometry(const em_tensor *t, const bool *red, int64_t *rows, int64_t *n,
                          int64_t *rs)
{
    int64_t nn = 1, r = 1, st = 0;
    bool seen = false; /* a reduced dim of size > 1 */
    for (int i = t->rank - 1; i >= 0; i--) {
        if (t->shape[i] == 1) continue;
        if (!red[i]) {
            if (seen || t->stride[i] != nn) return false;
            nn *= t->shape[i];
            continue;
        }
        if (seen && t->stride[i] != st * r) return false;
        if (!seen) st = t->stride[i];
        seen = true;
        r *= t->shape[i];
    }
    *rows = r;
    *n = nn;
    *rs = st;
    return true;
}

/* The plan for rows x n elements of dtype dt at a row stride of x_rs (offsets and strides in
 * al[0..na)) on dev; `one_slice` keeps every row in one cube along Y (the second launch). False
 * when the sizes pass the kernel's u32 indices (then the general kernel runs, and reports them).
 *   - Devices other than the CPU: cubes of 256 units (or the device's most, a power of two); TX
 *     a power of two up to 32 (a plane of NVIDIA's) chosen to waste the fewest units on the last
 *     tile, the larger on a tie, so that a plane reads TX consecutive lines of each of
 *     32 / TX rows; TY the rest. The rows are split into slices, enough for about 8 cubes per
 *     compute unit (one wave on a GPU), while each unit still adds at least 8 rows. With one
 *     slice, TX as low as 4 while the tiles are fewer than the compute units (below).
 *   - The CPU (a cube is one thread looping over its units): TY = 1 (no barriers); each unit
 *     adds a band of V consecutive lines (the largest of 16, 8, 4, 2, 1 dividing nl) row by row,
 *     reading whole cache lines (a unit per line, the four units sharing a cache line each
 *     walking the slice's rows, measured 2.5x to 5x slower on f32 [16384, 768] and [16384,
 *     3072]); TX up to 64 bands chosen as above; slices of at least 256 rows, enough for about 4
 *     cubes per thread, and at most 4096 rows (a unit adds its slice serially). */
static bool cols_plan_for(em_device *dev, em_scalar dt, int64_t rows, int64_t n, int64_t x_rs,
                          const int64_t *al, int na, bool one_slice, cols_plan *p)
{
    const em_caps *c = em_device_caps(dev);
    if (!c || rows < 1 || n < 1) return false;
    bool cpu = !strcmp(c->target, "c");
    p->lw = rows_width(c, dt, n, al, na, 64);
    int64_t nl = n / p->lw;
    /* the kernel's line indices: the last row's start plus a row, and x_rs * (TY * 4) steps */
    if (rows >= INT32_MAX || nl > UINT32_MAX || x_rs / p->lw > UINT32_MAX / 1024 ||
        (rows + 1) * (x_rs / p->lw) + nl > (int64_t)UINT32_MAX)
        return false;
    unsigned cube = 1, txmax = 64;
    if (!cpu) {
        unsigned maxu = c->max_cube_units ? c->max_cube_units : 256;
        while (cube * 2 <= maxu && cube < 256) cube *= 2;
        txmax = cube < 32 ? cube : 32;
    }
    p->v = 1;
    while (cpu && p->v < 16 && nl % (p->v * 2) == 0) p->v *= 2;
    int64_t nb = nl / p->v; /* bands of v lines, one per unit along X */
    unsigned tx = 1;
    for (unsigned w = 1; w <= txmax; w *= 2)
        if ((nb + w - 1) / w * w <= (nb + tx - 1) / tx * tx) tx = w;
    /* one slice on a GPU (the partials' second launch, the norms' partials): as few as 4 bands
     * a cube while that gives fewer cubes than compute units, so that more cubes share the rows
     * and each unit adds fewer of them in turn (768 f32 columns of 256 partial rows: 48 cubes of
     * 4 x 64 units adding 4 rows each, not 6 of 32 x 8 adding 32); EMBER_COLS_NARROW=0 keeps the
     * widest bands (A/B) */
    /* one slice of few rows on a GPU (the matmul's partial column sums, a handful of rows): a
     * unit a band, adding every row itself (TY 1: no shared memory, no barriers), as many
     * units a cube as bands up to the cube's */
    bool few = !cpu && one_slice && rows <= 32;
    const char *nar = getenv("EMBER_COLS_NARROW");
    if (few)
        for (tx = 1; tx < cube && (int64_t)tx < nb;) tx *= 2;
    else if (!cpu && one_slice && !(nar && !strcmp(nar, "0")))
        while (tx > 4 && (nb + tx - 1) / tx < (int64_t)(c->compute_units ? c->compute_units : 64))
            tx /= 2;
    p->tx = tx;
    p->ty = cpu || few ? 1 : cube / tx;
    p->rows = (uint32_t)rows;
    p->nl = (uint32_t)nl;
    p->x_rs = (uint32_t)(x_rs / p->lw);
    p->tiles = (uint32_t)((nb + tx - 1) / tx);
    int64_t target = (int64_t)(c->compute_units ? c->compute_units : 64) * (cpu ? 4 : 8);
    int64_t least = cpu ? 256 : (int64_t)p->ty * 8, most = cpu ? 4096 : rows;
    int64_t s = (target + p->tiles - 1) / p->tiles;
    if (s > (rows + least - 1) / least) s = (rows + least - 1) / least;
    if (s < (rows + most - 1) / most) s = (rows + most - 1) / most;
    if (s > 65535) s = 65535;
    if (one_slice || s < 1) s = 1;
    int64_t rpc = (rows + s - 1) / s;
    rpc = (rpc + p->ty - 1) / p->ty * p->ty;
    p->rpc = (uint32_t)rpc;
    p->slices = (uint32_t)((rows + rpc - 1) / rpc);
    return true;
}

/* Launches tensor_cols_sum over plan p: x (dtype xt, from line x_off) into out (dtype ot, from
 * line out_off), one row of nl lines per slice, times scale. EM_OK or the error set. */
static em_status cols_launch(const char *op, em_device *dev, const cols_plan *p, em_scalar xt,
                             const em_tensor *x, uint32_t x_off, em_scalar ot, const em_tensor *out,
                             uint32_t out_off, double scale)
{
    em_scalar ct = tn_compute_type(xt);
    em_lang_bind b[6] = {em_lang_bind_type("T", xt), em_lang_bind_type("U", ot),
                         em_lang_bind_type("C", ct), em_lang_bind_int("TX", p->tx),
                         em_lang_bind_int("TY", p->ty), em_lang_bind_int("V", p->v)};
    em_arg a[9] = {rows_buffer(x, p->lw),  em_arg_u32(x_off),     rows_buffer(out, p->lw),
                   em_arg_u32(out_off),    em_arg_u32(p->rows),   em_arg_u32(p->nl),
                   em_arg_u32(p->x_rs),    em_arg_u32(p->rpc),    tn_scalar_arg(xt, scale)};
    const em_lang_module *m = em_lang_builtins();
    if (!m) return em_error_context("%s", op);
    uint32_t cubes[3] = {p->tiles, p->slices, 1}, units[3] = {p->tx * p->ty, 1, 1};
    em_lang_spec spec = {b, 6, p->lw, NULL};
    em_status st = em_lang_launch(dev, m, "tensor_cols_sum", &spec, cubes, units, a, 9);
    /* it reads rows x (nl lines) of x and writes one row of nl lines per slice */
    uint64_t line_in = (uint64_t)p->lw * em_scalar_size(xt);
    uint64_t line_out = (uint64_t)p->lw * em_scalar_size(ot);
    if (st != EM_OK) em_error_context("%s", op);
    else fu_count_launch("tensor_cols_sum", (uint64_t)p->rows * p->nl * line_in,
                         (uint64_t)p->slices * p->nl * line_out);
    return st;
}

/* Runs the column path: out (contiguous, the kept dims' n values, of t's dtype or another float
 * dtype; any offset a line divides) = scale * the sums of t over the dims set in red, when they are
 * leading dims (cols_geometry); with several slices, through a scratch buffer of compute-type
 * partials and a second launch (one_slice: always one launch). *taken as for rows_apply. */
static em_status cols_sum(const char *op, const em_tensor *t, const bool *red, em_tensor *out,
                          double scale, bool one_slice, bool *taken)
{
    int64_t rows, n, rs;
    *taken = false;
    if (!cols_geometry(t, red, &rows, &n, &rs)) return EM_OK;
    em_device *dev = t->st->dev;
    int64_t al[3] = {t->offset, rs, out->offset};
    cols_plan p, q;
    if (!cols_plan_for(dev, t->dtype, rows, n, rs, al, 3, one_slice, &p) ||
        t->offset / p.lw + (int64_t)p.rows * p.x_rs + p.nl > (int64_t)UINT32_MAX ||
        out->offset / p.lw + p.nl > (int64_t)UINT32_MAX)
        return EM_OK;
    *taken = true;
    /* out may be a view of a buffer others read (a gradient's slot): they run first */
    if (tn_realize(t) != EM_OK || realize_rows(op, NULL, NULL, out) != EM_OK ||
        fu_before_write(out->st) != EM_OK)
        return em_error_context("%s", op);
    uint32_t x_off = (uint32_t)(t->offset / p.lw), o_off = (uint32_t)(out->offset / p.lw);
    if (p.slices == 1)
        return cols_launch(op, dev, &p, t->dtype, t, x_off, out->dtype, out, o_off, scale);
    em_scalar ct = tn_compute_type(t->dtype);
    int64_t al2[3] = {0, n, out->offset};
    if (!cols_plan_for(dev, ct, p.slices, n, n, al2, 3, true, &q)) {
        /* cannot happen: the partials are fewer and contiguous */
        return em_set_error(EM_ERR_INTERNAL, "%s: no plan for %u partial rows", op, p.slices);
    }
    em_tensor *part = tn_new(dev, ct, 2, (int64_t[]){p.slices, n});
    if (!part) return em_error_context("%s", op);
    em_status st = cols_launch(op, dev, &p, t->dtype, t, x_off, ct, part, 0, 1.0);
    if (st == EM_OK)
        st = cols_launch(op, dev, &q, ct, part, 0, out->dtype, out, (uint32_t)(out->offset / q.lw),
                         scale);
    em_release(part);
    return st;
}

em_status tn_cols_sum_rows(const char *op, const em_tensor *t, em_tensor *out)
{
    bool red[EM_MAX_RANK] = {true, false}, taken = false;
    /* few rows (the norms' per-cube partials): one launch, not partials of partials */
    em_status st = t->rank == 2 ? cols_sum(op, t, red, out, 1.0, t->shape[0] <= 2048, &taken) : EM_OK;
    if (st == EM_OK && !taken)
        st = em_set_error(EM_ERR_INTERNAL, "%s: the column sum does not fit its input", op);
    return st;
}

em_status tn_sum_leading_into(const char *op, const em_tensor *t, em_tensor *out)
{
    char a[128], b[128];
    int lead = t->rank - out->rank;
    bool fits = lead >= 0 && em_scalar_is_float(t->dtype) && em_scalar_is_float(out->dtype);
    for (int i = 0; fits && i < out->rank; i++) fits = out->shape[i] == t->shape[lead + i];
    if (!fits)
        return em_set_error(EM_ERR_INVALID,
                            "%s: %s is not the sum of %s over its leading dims (float tensors)", op,
                            em_describe(out, a, sizeof a), em_describe(t, b, sizeof b));
    em_status st = EM_OK;
    if (!tn_same_device(op, out, t)) return em_last_status();
    if ((st = tn_check_write(out, op)) != EM_OK) return st;
    /* a pending matmul's result: its column sums in its epilogue where the kernel can */
    bool taken = false;
    if (lead > 0 && (st = fu_mm_colsum_into(t, out, &taken)) != EM_OK) return st;
    if (taken) return EM_OK;
    bool red[EM_MAX_RANK] = {false};
    for (int i = 0; i < lead; i++) red[i] = true;
    /* the column path writes out itself; else the sum is made and copied in */
    if (lead > 0 && em_is_contiguous(out) && tn_numel(t->rank, t->shape) > 0)
        st = cols_sum(op, t, red, out, 1.0, false, &taken);
    if (st == EM_OK && !taken) {
        int dims[EM_MAX_RANK];
        for (int i = 0; i < lead; i++) dims[i] = i;
        em_scope_begin();
        /* summed in out's dtype where it differs (f32 sums of bf16, as the column path's) */
        const em_tensor *in = out->dtype == t->dtype ? t : em_cast(t, out->dtype);
        em_tensor *s = !in ? NULL : lead > 0 ? em_sum(in, dims, lead, false) : (em_tensor *)in;
        st = s ? em_copy_(out, s) : em_last_status();
        em_scope_end(NULL, 0);
    }
    return st;
}

em_status em_sum_leading_into(em_tensor *out, const em_tensor *t)
{
    const char *op = "sum_leading_into";
    if (!out || !t) {
        tn_done(t);
        return em_last_status() != EM_OK ? em_last_status()
                                         : em_set_error(EM_ERR_INVALID, "%s: NULL tensor", op);
    }
    em_status st = tn_sum_leading_into(op, t, out);
    tn_done(t);
    return st;
}

/* ---- long rows split over cubes (tensor_reduce_split, tensor_reduce_combine) ---------------- */

enum {
    SPLIT_MIN_LEN = 4096,    /* rows shorter than this stay in one cube */
    SPLIT_MIN_CHUNK = 2048,  /* the fewest elements a chunk (one cube of pass 1) reduces */
    SPLIT_MAX_CHUNKS = 1024, /* the most partials a row's cube combines in pass 2 */
};

/* How reduction `code` of rows x n elements is split on dev: returns the chunks per row (1: one
 * cube per row, the single-pass kernel) and sets *len, the elements of a chunk (chunk c holds
 * elements c * len .. min(n, (c + 1) * len) - 1; none is empty). A row is split when the rows
 * are fewer than the device's compute units and it holds at least SPLIT_MIN_LEN elements: into
 * about two cubes per compute unit over all rows, each chunk at least SPLIT_MIN_CHUNK long, at
 * most SPLIT_MAX_CHUNKS. var, std and logsumexp (two passes over the row) are never split.
 * EMBER_REDUCE_SPLIT=off never splits; =N splits every other row into N chunks (at most n; for
 * tests). */
static uint32_t reduce_split_for(em_device *dev, int code, int64_t rows, int64_t n, uint32_t *len)
{
    *len = (uint32_t)(n > 0 && n <= UINT32_MAX ? n : 0);
    if (code == R_VAR || code == R_STD || code == R_LSE) return 1;
    if (rows < 1 || rows > 65535 || n < 2 || n > (int64_t)(UINT32_MAX / 2)) return 1;
    int64_t chunks = 0;
    const char *env = getenv("EMBER_REDUCE_SPLIT");
    if (env && !strcmp(env, "off")) return 1;
    if (env && *env) {
        char *end;
        long v = strtol(env, &end, 10);
        if (*end == '\0' && v >= 1) chunks = v < 65535 ? v : 65535;
    }
    if (chunks == 0) {
        const em_caps *c = em_device_caps(dev);
        int64_t cu = c && c->compute_units ? c->compute_units : 1;
        if (n < SPLIT_MIN_LEN || rows >= cu) return 1;
        chunks = (2 * cu + rows - 1) / rows;
        if (chunks > n / SPLIT_MIN_CHUNK) chunks = n / SPLIT_MIN_CHUNK;
        if (chunks > SPLIT_MAX_CHUNKS) chunks = SPLIT_MAX_CHUNKS;
    }
    if (chunks > n) chunks = n;
    if (chunks < 2) return 1;
    int64_t l = (n + chunks - 1) / chunks;
    *len = (uint32_t)l;
    return (uint32_t)((n + l - 1) / l);
}

/* Whether t's storage holds a pending computation (fusion), which the row-wise kernels may
 * compute in their loads (a prologue) and the split kernels would realize first. */
static bool input_pending(const em_tensor *t)
{
    pthread_mutex_lock(&fu_lock);
    bool p = t->st->pending != NULL;
    pthread_mutex_unlock(&fu_lock);
    return p;
}

/* Runs reduction `code` of x (the kernel's view: rank R, its last k dims reduced, rows rows)
 * into out (viewed with R dims, the reduced ones of size 1) in two launches: each of the chunks
 * cubes of a row reduces len elements into a partial (compute type ct, and the winner's index
 * for max/min kinds) in scratch buffers, then one cube per row combines them and finishes as
 * the single-pass kernel does (scale: the mean's). EM_OK or the error set (prefixed with op). */
static em_status reduce_split_run(const char *op, const tn_arg *x, const tn_arg *out, em_scalar ct, int code,
                                  int kind, int R, int k, int64_t rows, uint32_t chunks, uint32_t len,
                                  em_arg scale)
{
    em_device *dev = x->t->st->dev;
    int64_t np = rows * (int64_t)chunks;
    em_tensor *part = tn_new(dev, ct, 1, &np), *part_i = tn_new(dev, EM_I32, 1, &np);
    em_status st = part && part_i ? EM_OK : em_error_context("%s", op);
    unsigned log1, log2;
    unsigned cube1 = tn_cube_for(len, &log1), cube2 = tn_cube_for(chunks, &log2);
    if (st == EM_OK) {
        em_lang_bind b[8] = {em_lang_bind_type("T", x->t->dtype), em_lang_bind_type("C", ct),
                             em_lang_bind_int("R", R), em_lang_bind_int("K", k),
                             em_lang_bind_int("OP", code), em_lang_bind_int("KIND", kind),
                             em_lang_bind_int("CUBE", cube1), em_lang_bind_int("LOG", log1)};
        tn_arg a[4] = {*x, tn_arg_flat(part), tn_arg_flat(part_i), tn_arg_s(em_arg_u32(len))};
        uint32_t cubes[3] = {chunks, (uint32_t)rows, 1}, units[3] = {cube1, 1, 1};
        st = tn_launch(op, dev, "tensor_reduce_split", b, 8, 1, cubes, units, a, 4);
    }
    if (st == EM_OK) {
        em_lang_bind b[8] = {em_lang_bind_type("U", out->t->dtype), em_lang_bind_type("C", ct),
                             em_lang_bind_int("R", R), em_lang_bind_int("K", k),
                             em_lang_bind_int("OP", code), em_lang_bind_int("KIND", kind),
                             em_lang_bind_int("CUBE", cube2), em_lang_bind_int("LOG", log2)};
        tn_arg a[5] = {tn_arg_flat(part), tn_arg_flat(part_i), *out, tn_arg_s(scale),
                       tn_arg_s(em_arg_u32(chunks))};
        uint32_t cubes[3] = {(uint32_t)rows, 1, 1}, units[3] = {cube2, 1, 1};
        st = tn_launch(op, dev, "tensor_reduce_combine", b, 8, 1, cubes, units, a, 5);
    }
    em_release(part);
    em_release(part_i);
    return st;
}

/* Splits t's dims into kept (first) and reduced (last). Fills perm; returns the number reduced,
 * or -1 with the error set. `all` when dims is empty. */
static int split_dims(const char *op, const em_tensor *t, const int *dims, int ndims, int *perm, bool *red)
{
    memset(red, 0, sizeof(bool) * EM_MAX_RANK);
    if (!dims || ndims == 0) {
        for (int i = 0; i < t->rank; i++) red[i] = true;
    } else {
        for (int i = 0; i < ndims; i++) {
            int d = tn_dim(op, dims[i], t->rank);
            if (d < 0) return -1;
            if (t->rank == 0) continue;
            if (red[d]) {
                em_set_error(EM_ERR_INVALID, "%s: dim %d appears more than once", op, d);
                return -1;
            }
            red[d] = true;
        }
    }
    int k = 0, j = 0;
    for (int i = 0; i < t->rank; i++)
        if (!red[i]) perm[j++] = i;
    for (int i = 0; i < t->rank; i++)
        if (red[i]) {
            perm[j++] = i;
            k++;
        }
    return k;
}

/* Reports a reduction (float results only; argmax/argmin/all/any record nothing). */
static void record_reduce(int code, const em_tensor *t, const bool *red, bool keepdim,
                          int correction, em_tensor *out)
{
    static const em_tensor_op top[] = {
        [R_SUM] = EM_TOP_SUM, [R_PROD] = EM_TOP_PROD, [R_MAX] = EM_TOP_MAX, [R_MIN] = EM_TOP_MIN,
        [R_MEAN] = EM_TOP_MEAN, [R_VAR] = EM_TOP_VAR, [R_STD] = EM_TOP_STD,
        [R_LSE] = EM_TOP_LOGSUMEXP,
    };
    if (code >= (int)(sizeof top / sizeof *top) || top[code] == EM_TOP_NONE) return;
    em_top_params p = tn_params_k(correction);
    p.flag = keepdim;
    for (int i = 0; i < t->rank; i++)
        if (red[i]) p.i[p.ni++] = i;
    tn_record(top[code], &p, &t, 1, out);
}

static em_tensor *reduce(const char *op, const em_tensor *t, const int *dims, int ndims, bool keepdim,
                         int code, int correction)
{
    if (!t) return NULL;
    em_tensor *out = NULL;
    bool red[EM_MAX_RANK] = {false};
    bool fl = em_scalar_is_float(t->dtype);
    if ((code == R_MEAN || code == R_VAR || code == R_STD || code == R_LSE) && !fl) {
        em_set_error(EM_ERR_INVALID, "%s: needs a floating-point tensor, got %s", op, em_scalar_name(t->dtype));
        goto done;
    }
    int perm[EM_MAX_RANK];
    int k = split_dims(op, t, dims, ndims, perm, red);
    if (k < 0) goto done;
    /* Output shape and the kernel's view of x and out. */
    int64_t oshape[EM_MAX_RANK], kshape[EM_MAX_RANK];
    int orank = 0, kr = 0;
    for (int i = 0; i < t->rank; i++) {
        if (!red[i]) kshape[kr++] = t->shape[i];
        if (!red[i] || keepdim) oshape[orank++] = red[i] ? 1 : t->shape[i];
    }
    em_scalar odt = t->dtype, ct = tn_compute_type(t->dtype);
    if ((code == R_SUM || code == R_PROD) && !fl) odt = ct = EM_I64;
    if (code == R_ARGMAX || code == R_ARGMIN) odt = EM_I64;
    if (code == R_ALL || code == R_ANY) {
        odt = EM_BOOL;
        ct = EM_I32;
    }
    int64_t n_inner = 1, n_outer = tn_numel(kr, kshape);
    for (int i = 0; i < t->rank; i++)
        if (red[i]) n_inner *= t->shape[i];
    /* float sums and means may become pending (fusion_rows.c): their result is deferred */
    out = fl && (code == R_SUM || code == R_MEAN) ? tn_new_deferred(t->st->dev, odt, orank, oshape)
                                                  : tn_new(t->st->dev, odt, orank, oshape);
    if (!out || n_outer == 0) goto done;
    if (n_inner == 0) {
        double v = code == R_PROD || code == R_ALL ? 1 : code == R_LSE ? -INFINITY : 0;
        if (code == R_MAX || code == R_MIN || code == R_ARGMAX || code == R_ARGMIN) {
            em_set_error(EM_ERR_INVALID, "%s: cannot reduce over a zero-size dim", op);
            em_release(out);
            out = NULL;
            goto done;
        }
        if (code == R_MEAN || code == R_VAR || code == R_STD) v = NAN;
        if (tn_fill(out, v) != EM_OK) {
            em_release(out);
            out = NULL;
        }
        goto done;
    }
    int R = t->rank ? t->rank : 1;
    int64_t xs[EM_MAX_RANK], xsh[EM_MAX_RANK], os[EM_MAX_RANK], osh[EM_MAX_RANK], cst[EM_MAX_RANK];
    tn_contig_strides(kr, kshape, cst);
    for (int i = 0; i < t->rank; i++) {
        xsh[i] = t->shape[perm[i]];
        xs[i] = t->stride[perm[i]];
        osh[i] = i < kr ? kshape[i] : 1;
        os[i] = i < kr ? cst[i] : 0;
    }
    if (t->rank == 0) {
        xsh[0] = osh[0] = xs[0] = os[0] = 1;
        k = 1;
    }
    /* sum and mean of floats over the last k dims: the row-wise fast path when they fit; over
     * leading dims, the kept ones contiguous: the column path */
    bool tail = k >= 1 && t->rank >= 1;
    for (int i = 0; i < t->rank; i++) tail = tail && red[i] == (i >= t->rank - k);
    /* few long rows: split over cubes (reduce_split_for); a sum or mean whose input is pending
     * keeps the row-wise path, which computes it in its loads */
    uint32_t len, chunks = reduce_split_for(t->st->dev, code, n_outer, n_inner, &len);
    if (chunks > 1 && fl && (code == R_SUM || code == R_MEAN) && tail && input_pending(t)) chunks = 1;
    if (fl && (code == R_SUM || code == R_MEAN) && (chunks == 1 || !tail)) {
        bool taken;
        double scale = code == R_MEAN ? 1.0 / (double)n_inner : 1.0;
        em_status st = tail ? rows_sum(op, t, k, out, scale, &taken)
                            : cols_sum(op, t, red, out, scale, false, &taken);
        if (taken) {
            if (st != EM_OK) {
                em_release(out);
                out = NULL;
            }
            goto done;
        }
    }
    unsigned log;
    unsigned cube = tn_cube_for(n_inner, &log);
    static const int kind[] = {0, 1, 2, 3, 2, 3, 0, 0, 0, 2, 3, 2};
    em_lang_bind b[10] = {em_lang_bind_type("T", t->dtype), em_lang_bind_type("U", odt),
                         em_lang_bind_type("C", ct), em_lang_bind_type("M", tn_math_type(t->st->dev, ct)), em_lang_bind_int("R", R), em_lang_bind_int("K", k),
                         em_lang_bind_int("OP", code), em_lang_bind_int("KIND", kind[code]),
                         em_lang_bind_int("CUBE", cube), em_lang_bind_int("LOG", log)};
    double scale = code == R_MEAN ? 1.0 / (double)n_inner : 1.0 / (double)(n_inner - correction);
    if ((code == R_VAR || code == R_STD) && n_inner - correction <= 0) scale = NAN;
    tn_arg args[3] = {tn_arg_geom(t, R, xsh, xs, t->offset), tn_arg_geom(out, R, osh, os, 0),
                      tn_arg_s(tn_scalar_arg(ct, scale))};
    if (!em_scalar_is_float(ct)) args[2] = tn_arg_s(tn_scalar_arg(ct, 0));
    uint32_t cubes[3] = {(uint32_t)n_outer, 1, 1}, units[3] = {cube, 1, 1};
    em_status st = chunks > 1 ? reduce_split_run(op, &args[0], &args[1], ct, code, kind[code], R, k, n_outer,
                                                 chunks, len, args[2].scalar)
                              : tn_launch(op, t->st->dev, "tensor_reduce", b, 10, 1, cubes, units, args, 3);
    if (st != EM_OK) {
        em_release(out);
        out = NULL;
    }
done:
    if (out) record_reduce(code, t, red, keepdim, correction, out);
    tn_done(t);
    return out;
}

#define REDUCE(name, code)                                                                         \
    em_tensor *em_##name(const em_tensor *t, const int *dims, int ndims, bool keepdim)             \
    {                                                                                              \
        return reduce(#name, t, dims, ndims, keepdim, code, 0);                                    \
    }
REDUCE(sum, R_SUM)
REDUCE(mean, R_MEAN)
REDUCE(prod, R_PROD)
REDUCE(max, R_MAX)
REDUCE(min, R_MIN)
REDUCE(all, R_ALL)
REDUCE(any, R_ANY)
REDUCE(logsumexp, R_LSE)

em_tensor *em_var(const em_tensor *t, const int *dims, int ndims, int correction, bool keepdim)
{
    return reduce("var", t, dims, ndims, keepdim, R_VAR, correction);
}

em_tensor *em_std(const em_tensor *t, const int *dims, int ndims, int correction, bool keepdim)
{
    return reduce("std", t, dims, ndims, keepdim, R_STD, correction);
}

em_tensor *em_argmax(const em_tensor *t, int dim, bool keepdim)
{
    return reduce("argmax", t, &dim, 1, keepdim, R_ARGMAX, 0);
}

em_tensor *em_argmin(const em_tensor *t, int dim, bool keepdim)
{
    return reduce("argmin", t, &dim, 1, keepdim, R_ARGMIN, 0);
}

/* ---- along one dim: softmax, cumsum ---------------------------------------------------------- */

/* The geometry of t (and of a same-shape out) with dim d moved last. */
static void dim_last(const em_tensor *t, int d, int64_t *shape, int64_t *stride)
{
    int j = 0;
    for (int i = 0; i < t->rank; i++)
        if (i != d) {
            shape[j] = t->shape[i];
            stride[j++] = t->stride[i];
        }
    shape[j] = t->shape[d];
    stride[j] = t->stride[d];
}

static em_tensor *softmax(const char *op, const em_tensor *t, int dim, bool log_softmax)
{
    if (!t) return NULL;
    em_tensor *out = NULL;
    if (!em_scalar_is_float(t->dtype)) {
        em_set_error(EM_ERR_INVALID, "%s: needs a floating-point tensor, got %s", op, em_scalar_name(t->dtype));
        goto done;
    }
    int d = tn_dim(op, dim, t->rank);
    if (d < 0) goto done;
    out = tn_new_deferred(t->st->dev, t->dtype, t->rank, t->shape); /* pending: fusion_rows.c */
    if (!out || em_numel(t) == 0) goto done;
    if (t->rank && d == t->rank - 1) {
        bool taken;
        em_status st = rows_apply(op, t, 1, NULL, NULL, out, 0, log_softmax ? 1 : 0, &taken);
        if (taken) {
            if (st != EM_OK) {
                em_release(out);
                out = NULL;
            }
            goto done;
        }
    }
    int R = t->rank ? t->rank : 1;
    int64_t xsh[EM_MAX_RANK] = {1}, xs[EM_MAX_RANK] = {1}, osh[EM_MAX_RANK] = {1}, os[EM_MAX_RANK] = {1};
    if (t->rank) {
        dim_last(t, d, xsh, xs);
        dim_last(out, d, osh, os);
    }
    unsigned log;
    unsigned cube = tn_cube_for(xsh[R - 1], &log);
    em_scalar ct = tn_compute_type(t->dtype);
    em_lang_bind b[7] = {em_lang_bind_type("T", t->dtype), em_lang_bind_type("C", ct),
                         em_lang_bind_type("M", tn_math_type(t->st->dev, ct)),
                         em_lang_bind_int("R", R), em_lang_bind_bool("LOG_SOFTMAX", log_softmax),
                         em_lang_bind_int("CUBE", cube), em_lang_bind_int("LOG", log)};
    tn_arg args[2] = {tn_arg_geom(t, R, xsh, xs, t->offset), tn_arg_geom(out, R, osh, os, 0)};
    uint32_t cubes[3] = {(uint32_t)(em_numel(t) / xsh[R - 1]), 1, 1}, units[3] = {cube, 1, 1};
    if (tn_launch(op, t->st->dev, "tensor_softmax", b, 7, 1, cubes, units, args, 2) != EM_OK) {
        em_release(out);
        out = NULL;
    }
done:
    if (out) {
        em_top_params p = tn_params_k(tn_dim(op, dim, t->rank));
        tn_record(log_softmax ? EM_TOP_LOG_SOFTMAX : EM_TOP_SOFTMAX, &p, &t, 1, out);
    }
    tn_done(t);
    return out;
}

em_tensor *em_softmax(const em_tensor *t, int dim) { return softmax("softmax", t, dim, false); }
em_tensor *em_log_softmax(const em_tensor *t, int dim) { return softmax("log_softmax", t, dim, true); }

em_tensor *em_cumsum(const em_tensor *t, int dim)
{
    if (!t) return NULL;
    em_tensor *out = NULL;
    int d = tn_dim("cumsum", dim, t->rank);
    if (d < 0) goto done;
    em_scalar odt = em_scalar_is_float(t->dtype) ? t->dtype : EM_I64;
    out = tn_new(t->st->dev, odt, t->rank, t->shape);
    if (!out || em_numel(t) == 0) goto done;
    int R = t->rank ? t->rank : 1;
    int64_t xsh[EM_MAX_RANK] = {1}, xs[EM_MAX_RANK] = {1}, osh[EM_MAX_RANK] = {1}, os[EM_MAX_RANK] = {1};
    if (t->rank) {
        dim_last(t, d, xsh, xs);
        dim_last(out, d, osh, os);
    }
    int64_t rows = em_numel(t) / xsh[R - 1];
    em_lang_bind b[4] = {em_lang_bind_type("T", t->dtype), em_lang_bind_type("U", odt),
                         em_lang_bind_type("C", em_scalar_is_float(t->dtype) ? tn_compute_type(t->dtype) : EM_I64),
                         em_lang_bind_int("R", R)};
    tn_arg args[3] = {tn_arg_geom(t, R, xsh, xs, t->offset), tn_arg_geom(out, R, osh, os, 0),
                      tn_arg_s(em_arg_u32((uint32_t)rows))};
    uint32_t cubes[3], units[3];
    tn_grid_1d((uint64_t)rows, cubes, units);
    if (tn_launch("cumsum", t->st->dev, "tensor_cumsum", b, 4, 1, cubes, units, args, 3) != EM_OK) {
        em_release(out);
        out = NULL;
    }
done:
    if (out) {
        em_top_params p = tn_params_k(d);
        tn_record(EM_TOP_CUMSUM, &p, &t, 1, out);
    }
    tn_done(t);
    return out;
}

/* ---- norms ----------------------------------------------------------------------------------- */

static bool check_affine(const char *op, const char *what, const em_tensor *t, int nnorm, const em_tensor *p)
{
    if (!p) return true;
    bool ok = p->rank == nnorm && p->dtype == t->dtype;
    for (int i = 0; ok && i < nnorm; i++)
        if (p->shape[i] != t->shape[t->rank - nnorm + i]) ok = false;
    if (!ok) {
        char a[128], b[128];
        em_set_error(EM_ERR_INVALID, "%s: %s %s does not match the normalized dims of %s", op, what,
                     em_describe(p, a, sizeof a), em_describe(t, b, sizeof b));
        return false;
    }
    return tn_same_device(op, t, p);
}

static em_tensor *norm(const char *op, const em_tensor *t, int nnorm, const em_tensor *w,
                       const em_tensor *bias, double eps, bool rms)
{
    em_tensor *out = NULL, *wc = NULL, *bc = NULL;
    if (!em_scalar_is_float(t->dtype)) {
        em_set_error(EM_ERR_INVALID, "%s: needs a floating-point tensor, got %s", op, em_scalar_name(t->dtype));
        return NULL;
    }
    if (nnorm < 1 || nnorm > t->rank) {
        em_set_error(EM_ERR_INVALID, "%s: cannot normalize over the last %d dims of a tensor of rank %d", op,
                     nnorm, t->rank);
        return NULL;
    }
    if (!check_affine(op, "weight", t, nnorm, w) || !check_affine(op, "bias", t, nnorm, bias)) return NULL;
    out = tn_new_deferred(t->st->dev, t->dtype, t->rank, t->shape); /* pending: fusion_rows.c */
    if (!out || em_numel(t) == 0) return out;
    wc = w ? tn_contig(w) : NULL;
    bc = bias ? tn_contig(bias) : NULL;
    if ((w && !wc) || (bias && !bc)) goto fail;
    bool taken;
    if (rows_apply(op, t, nnorm, wc, bc, out, eps, rms ? 3 : 2, &taken) != EM_OK) goto fail;
    if (taken) {
        em_release(wc);
        em_release(bc);
        return out;
    }
    int64_t n = 1;
    for (int i = t->rank - nnorm; i < t->rank; i++) n *= t->shape[i];
    unsigned log;
    unsigned cube = tn_cube_for(n, &log);
    em_lang_bind b[9] = {em_lang_bind_type("T", t->dtype), em_lang_bind_type("C", tn_compute_type(t->dtype)),
                         em_lang_bind_int("R", t->rank), em_lang_bind_int("K", nnorm),
                         em_lang_bind_bool("RMS", rms), em_lang_bind_bool("HAS_W", wc != NULL),
                         em_lang_bind_bool("HAS_B", bc != NULL), em_lang_bind_int("CUBE", cube),
                         em_lang_bind_int("LOG", log)};
    tn_arg args[5] = {tn_arg_t(t), tn_arg_flat(wc ? wc : t), tn_arg_flat(bc ? bc : t), tn_arg_t(out),
                      tn_arg_s(tn_scalar_arg(t->dtype, eps))};
    uint32_t cubes[3] = {(uint32_t)(em_numel(t) / n), 1, 1}, units[3] = {cube, 1, 1};
    if (tn_launch(op, t->st->dev, "tensor_norm", b, 9, 1, cubes, units, args, 5) != EM_OK) goto fail;
    em_release(wc);
    em_release(bc);
    return out;
fail:
    em_release(wc);
    em_release(bc);
    em_release(out);
    return NULL;
}

em_tensor *em_layer_norm(const em_tensor *t, int nnorm, const em_tensor *weight, const em_tensor *bias,
                         double eps)
{
    em_tensor *out = t ? norm("layer_norm", t, nnorm, weight, bias, eps, false) : NULL;
    em_top_params p = tn_params_k(nnorm);
    p.f[0] = eps;
    const em_tensor *ins[3] = {t, weight, bias};
    tn_record(EM_TOP_LAYER_NORM, &p, ins, 3, out);
    tn_done(t);
    tn_done(weight);
    tn_done(bias);
    return out;
}

em_tensor *em_rms_norm(const em_tensor *t, int nnorm, const em_tensor *weight, double eps)
{
    em_tensor *out = t ? norm("rms_norm", t, nnorm, weight, NULL, eps, true) : NULL;
    em_top_params p = tn_params_k(nnorm);
    p.f[0] = eps;
    const em_tensor *ins[2] = {t, weight};
    tn_record(EM_TOP_RMS_NORM, &p, ins, 2, out);
    tn_done(t);
    tn_done(weight);
    return out;
}
