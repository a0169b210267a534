/* ops_xent.c — the fused classifier (issue #13): cross-entropy of each row of logits [N, C]
 * against a class per row, and its gradient, through src/kernels/tensor_xent.ek. The forward
 * keeps no probabilities (one [N] result); the gradient recomputes each row's log-sum-exp and
 * writes softmax - onehot in one pass. For f16/bf16 logits the loss is f32 (the compute type,
 * as PyTorch's autocast computes cross-entropy) and the gradient is computed in f32 and rounded
 * once to the logits' dtype, so a model need not cast its logits to f32 first. The classes are read back and checked on the host (as the
 * indexing ops check theirs), mapped to an i32 class per row with -1 for ignore_index; that
 * tensor is what the op records as its second input, so the backward reads it as it is. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "ember/tensor_grad.h"
#include "tensor/fusion.h"
#include "tensor/fusion_internal.h" /* the per-row loss as a pending reduction (fusion_rows.c) */
#include "tensor/internal.h"

static em_tensor *checked_targets(const char *op, const em_tensor *targets, int64_t n_class,
                                  int64_t ignore_index, int64_t *valid);

/* The checked classes as i32 (-1 where ignored), on logits' device; *valid counts the rest. */
em_tensor *tn_xent_classes(const char *op, const em_tensor *targets, int64_t n_class,
                           int64_t ignore_index, int64_t *valid)
{
    return checked_targets(op, targets, n_class, ignore_index, valid);
}

static em_tensor *checked_targets(const char *op, const em_tensor *targets, int64_t n_class,
                                  int64_t ignore_index, int64_t *valid)
{
    size_t n = (size_t)em_numel(targets);
    if (em_trusted_indices()) { /* kept on the device (ops_index_device.c): none ignored */
        if (valid) *valid = (int64_t)n;
        return tn_classes_device(targets, n_class);
    }
    int64_t *host = malloc((n ? n : 1) * sizeof *host);
    int32_t *cls = malloc((n ? n : 1) * sizeof *cls);
    em_tensor *out = NULL;
    if (!host || !cls) {
        em_set_error(EM_ERR_NOMEM, "%s: out of host memory for %zu classes", op, n);
        goto done;
    }
    em_tensor *wide = targets->dtype == EM_I64 ? (em_tensor *)targets : em_cast(targets, EM_I64);
    em_status st = wide ? em_to_host(wide, host, n * sizeof *host) : em_last_status();
    if (wide != targets) em_release(wide);
    if (st != EM_OK) goto done;
    int64_t count = 0;
    for (size_t i = 0; i < n; i++) {
        int64_t v = host[i];
        if (v == ignore_index) {
            cls[i] = -1;
            continue;
        }
        if (v < 0 || v >= n_class) {
            em_set_error(EM_ERR_INVALID,
                         "%s: target %lld (row %zu) is out of range for %lld classes (and is not "
                         "ignore_index %lld)",
                         op, (long long)v, i, (long long)n_class, (long long)ignore_index);
            goto done;
        }
        cls[i] = (int32_t)v;
        count++;
    }
    out = em_from_host(targets->st->dev, EM_I32, EM_SHAPE((int64_t)n), cls);
    if (valid) *valid = count;
done:
    free(host);
    free(cls);
    return out;
}

/* The logits' line width: 16 bytes' worth of elements (at most what the device takes,
 * em_line_lanes, and cap), halved until it divides the row length, the row stride and the
 * offset; 1 unless the rows are contiguous. */
static unsigned xent_width(const em_tensor *x, unsigned cap)
{
    int64_t C = x->shape[1];
    if (x->stride[1] != 1 && C > 1) return 1;
    const em_caps *c = em_device_caps(x->st->dev);
    unsigned esz = (unsigned)em_scalar_size(x->dtype);
    unsigned lw = c ? em_line_lanes(c, esz) : 1;
    while (lw > 1 && (lw > cap || lw * esz > 16)) lw /= 2;
    for (; lw > 1; lw /= 2)
        if (C % lw == 0 && x->stride[0] % lw == 0 && x->offset % lw == 0) break;
    return lw;
}

/* Launches tensor_xent or tensor_xent_backward (args[0] the logits, args[1] its row length and
 * args[3] its row stride in elements, args[lines] the other tensor of lines (the gradient) or
 * none for lines = 0, the last tensor argument the one it writes), reading the rows `passes`
 * times, in lines as wide as the logits allow (xent_width): a pending logits tensor (a cast of
 * matmul results, say) is computed in the kernel's loads when it can be (fu_prologue_begin),
 * else realized by tn_launch. */
static em_status xent_launch(const char *op, const char *kernel, int passes, const em_lang_bind *bind,
                             size_t nb, const uint32_t cubes[3], const uint32_t units[3], tn_arg *args,
                             size_t nargs, size_t lines)
{
    bool writes[8] = {false}; /* the scalars of the kernel: one per argument (a tensor's offset) */
    for (size_t i = nargs; i-- > 0;)
        if (args[i].t) {
            writes[i] = true;
            break;
        }
    fu_prologue pr;
    const em_tensor *x = args[0].t;
    bool fused = fu_prologue_begin(x, passes, (int)nargs, &pr);
    unsigned lw = xent_width(x, fused ? pr.max_lw : 16);
    if (lw > 1) { /* lengths and offsets in lines; the other tensors stay tensors of scalars */
        args[1].scalar = em_arg_u32((uint32_t)(x->shape[1] / lw));
        args[3].scalar = em_arg_u32((uint32_t)(x->stride[0] / lw));
        args[0].offset /= lw;
        for (size_t i = 1; i < nargs; i++)
            if (args[i].t && i != lines) args[i].lanes = 1;
        if (lines) args[lines].offset /= lw;
    }
    em_status st;
    if (fused) {
        st = tn_launch_prologue(op, &pr, "tensor_xent", kernel, bind, nb, lw, cubes, units, args, nargs,
                                writes);
        fu_prologue_end(&pr);
    } else {
        st = tn_launch(op, x->st->dev, kernel, bind, nb, lw, cubes, units, args, nargs);
    }
    return st;
}

/* Launches tensor_xent: out[r] (contiguous, one value per row) = the loss of row r of logits x
 * against classes cls, with epilogue epi (a pending node's, fusion_rows.c) in its store, or
 * none; out's buffer exists when epi is given. EM_OK or the error set. */
static em_status xent_forward(const char *op, const em_tensor *x, const em_tensor *cls,
                              const em_tensor *out, double smoothing, const fu_node *epi)
{
    int64_t N = x->shape[0], C = x->shape[1];
    em_scalar ct = tn_compute_type(x->dtype);
    unsigned cube = tn_cube_for(C, NULL);
    em_lang_bind bind[6] = {em_lang_bind_type("T", x->dtype), em_lang_bind_type("C", ct),
                            em_lang_bind_type("M", tn_math_type(x->st->dev, ct)),
                            em_lang_bind_type("O", ct), em_lang_bind_bool("SMOOTH", smoothing > 0),
                            em_lang_bind_int("CUBE", cube)};
    uint32_t cubes[3] = {(uint32_t)N, 1, 1}, units[3] = {cube, 1, 1};
    if (!epi) {
        tn_arg args[7] = {tn_arg_flat(x), tn_arg_s(em_arg_u32((uint32_t)C)),
                          tn_arg_s(em_arg_u32((uint32_t)x->stride[1])),
                          tn_arg_s(em_arg_u32((uint32_t)x->stride[0])), tn_arg_t(cls), tn_arg_t(out),
                          tn_arg_s(tn_scalar_arg(x->dtype, smoothing))};
        return xent_launch(op, "tensor_xent", 1, bind, 6, cubes, units, args, 7, 0);
    }
    /* with an epilogue the arguments are built here, as the row-wise kernels build theirs */
    fu_prologue pr;
    int scalars = 7 + epi->nleaves + epi->nparams;
    bool fused = scalars <= FU_MAX_SCALARS && fu_prologue_begin(x, 1, scalars, &pr);
    if ((!fused && tn_realize(x) != EM_OK) || tn_realize(cls) != EM_OK) return em_error_context("%s", op);
    unsigned lw = xent_width(x, fused ? pr.max_lw : 16);
    em_arg a[10] = {fused ? em_arg_u32(0) : tn_flat_buffer(x, x->dtype, lw), em_arg_u32((uint32_t)(x->offset / lw)),
                    em_arg_u32((uint32_t)(C / lw)), em_arg_u32((uint32_t)x->stride[1]),
                    em_arg_u32((uint32_t)(x->stride[0] / lw)), tn_flat_buffer(cls, cls->dtype, 1),
                    em_arg_u32((uint32_t)cls->offset), tn_flat_buffer(out, out->dtype, 1),
                    em_arg_u32((uint32_t)out->offset), tn_scalar_arg(x->dtype, smoothing)};
    em_lang_spec spec = {bind, 6, lw, NULL};
    uint64_t read = tn_view_bytes(cls->dtype, cls->rank, cls->shape, cls->stride) +
                    (fused ? 0 : tn_view_bytes(x->dtype, x->rank, x->shape, x->stride));
    uint64_t written = tn_view_bytes(out->dtype, out->rank, out->shape, out->stride);
    em_status st = fu_reduce_launch(fused ? &pr : NULL, epi, true, x->st->dev, "tensor_xent", "tensor_xent",
                                    &spec, cubes, units, a, 10, 7, read, written);
    if (fused) fu_prologue_end(&pr);
    if (st != EM_OK) em_error_context("%s", op);
    return st;
}

em_status tn_xent_run(const fu_rows_call *c, const fu_node *epi)
{
    return xent_forward(c->op, &c->x, &c->w, &c->out, c->eps, epi);
}

em_tensor *tn_xent_rows(const em_tensor *logits, const em_tensor *cls)
{
    int64_t N = logits->shape[0];
    em_tensor *out = tn_new(logits->st->dev, tn_compute_type(logits->dtype), 1, &N);
    if (out && N > 0 && xent_forward("cross_entropy_rows", logits, cls, out, 0.0, NULL) != EM_OK) {
        em_release(out);
        out = NULL;
    }
    return out;
}

em_tensor *em_cross_entropy_rows(const em_tensor *logits, const em_tensor *targets,
                                 int64_t ignore_index, double label_smoothing, int64_t *valid)
{
    const char *op = "cross_entropy_rows";
    em_tensor *out = NULL, *cls = NULL;
    if (!logits || !targets) goto done;
    char a[96], b[96];
    bool ok = logits->rank == 2 && targets->rank == 1 && targets->shape[0] == logits->shape[0] &&
              em_scalar_is_float(logits->dtype) &&
              (targets->dtype == EM_I32 || targets->dtype == EM_I64) && logits->shape[1] > 0;
    if (!ok) {
        em_set_error(EM_ERR_INVALID,
                     "%s: logits %s and targets %s do not match (expected float logits [N, C], "
                     "C >= 1, and i32/i64 targets [N])",
                     op, em_describe(logits, a, sizeof a), em_describe(targets, b, sizeof b));
        goto done;
    }
    if (!tn_same_device(op, logits, targets)) goto done;
    if (!(label_smoothing >= 0 && label_smoothing < 1)) {
        em_set_error(EM_ERR_INVALID, "%s: label_smoothing must be in [0, 1), got %g", op,
                     label_smoothing);
        goto done;
    }
    int64_t N = logits->shape[0], C = logits->shape[1];
    if (N > (int64_t)UINT32_MAX || C > (int64_t)INT32_MAX) {
        em_set_error(EM_ERR_INVALID, "%s: logits %s are too large for one launch", op,
                     em_describe(logits, a, sizeof a));
        goto done;
    }
    cls = checked_targets(op, targets, C, ignore_index, valid);
    if (!cls) goto done;
    em_scalar ct = tn_compute_type(logits->dtype);
    /* the loss in f32 for f16/bf16 logits; with fusion on a pending reduction whose epilogue
     * the elementwise ops on its donated result extend (fusion_rows.c), run when read */
    bool lazy = fu_enabled() && N > 0;
    out = lazy ? tn_new_deferred(logits->st->dev, ct, 1, &N) : tn_new(logits->st->dev, ct, 1, &N);
    if (!out || N == 0) goto done;
    if (lazy) {
        fu_rows_call c = {.op = op, .kind = 2, .x = *logits, .w = *cls, .has_w = true, .out = *out,
                          .k = 1, .eps = label_smoothing};
        int r = fu_rows_record(&c);
        if (r > 0) goto done;
        if (r < 0) {
            em_error_context("%s", op);
            em_release(out);
            out = NULL;
            goto done;
        }
    }
    if (xent_forward(op, logits, cls, out, label_smoothing, NULL) != EM_OK) {
        em_release(out);
        out = NULL;
    }
done:
    if (out) {
        em_top_params p = {0};
        p.f[0] = label_smoothing;
        const em_tensor *in[2] = {logits, cls};
        tn_record(EM_TOP_CROSS_ENTROPY, &p, in, 2, out);
    }
    em_release(cls);
    tn_done(logits);
    tn_done(targets);
    return out;
}

/* tensor_xent_backward's cube and its V (lines a unit keeps in registers between its passes,
 * 0: none, the row read twice) for logits x of C classes: on GPUs, where x is realized (its
 * line width then known: xent_width), the cube of tn_cube_for doubled up to 1024 units (the
 * device's most) until each unit keeps at most 128 bytes of the row (32 registers of T:
 * GPT-2's 50304 bf16 classes as 1024 units of 7 lines of 8); EMBER_XENT_KEEP=0 keeps none
 * (A/B). */
static unsigned xent_keep(const em_tensor *x, int64_t C, unsigned *cube)
{
    *cube = tn_cube_for(C, NULL);
    const em_caps *c = em_device_caps(x->st->dev);
    const char *env = getenv("EMBER_XENT_KEEP");
    if (!c || !strcmp(c->target, "c") || (env && !strcmp(env, "0")) || !x->st->buf || x->st->pending)
        return 0;
    unsigned lw = xent_width(x, 16), most = c->max_cube_units ? c->max_cube_units : 256;
    int64_t nl = C / lw, line = (int64_t)lw * (int64_t)em_scalar_size(x->dtype);
    for (unsigned k = *cube; k <= 1024 && k <= most; k *= 2) {
        int64_t v = (nl + k - 1) / k;
        if (v * line <= 128) {
            *cube = k;
            return (unsigned)v;
        }
    }
    return 0;
}

/* tensor_xent_backward_staged's shape for logits x [N, C] and the gradient's destination dx
 * (contiguous), or false for tensor_xent_backward: 2-byte logits, realized, with contiguous rows
 * of a multiple of 8 elements starting 16-byte aligned, whose two row buffers (and the cube's
 * reduction slots) fit the device's shared memory. On by default where copy_async is
 * asynchronous (the CUDA target); EMBER_XENT_STAGED=1 takes it wherever it fits (the other
 * targets run the same kernel with plain copies: the tests), a larger K as well with at most K
 * cubes (rows taking turns in the tests), =0 never (A/B). *cube gets the units a cube (up to
 * 1024, fewer for short rows), *cubes the persistent grid (at most the rows, the cubes the
 * device holds at once). */
static bool xent_staged(const em_tensor *x, const em_tensor *dx, unsigned *cube, uint32_t *cubes)
{
    const em_caps *c = em_device_caps(x->st->dev);
    const char *env = getenv("EMBER_XENT_STAGED");
    long force = env ? strtol(env, NULL, 10) : -1;
    if (!c || force == 0 || (force < 0 && strcmp(c->target, "cuda"))) return false;
    int64_t N = x->shape[0], C = x->shape[1];
    if (em_scalar_size(x->dtype) != 2 || !x->st->buf || x->st->pending || x->stride[1] != 1 ||
        C % 8 || x->stride[0] % 8 || x->offset % 8 || dx->offset % 8)
        return false;
    /* the kernel's element indices are u32: x's last row and dx's end must fit */
    if ((uint64_t)x->offset + (uint64_t)(N - 1) * (uint64_t)x->stride[0] + (uint64_t)C >
            UINT32_MAX ||
        (uint64_t)dx->offset + (uint64_t)N * (uint64_t)C > UINT32_MAX)
        return false;
    unsigned most = c->max_cube_units ? c->max_cube_units : 256;
    unsigned k = 1024;
    while (k > most || (k > 32 && (int64_t)k * 8 > C)) k /= 2;
    uint64_t bytes = (uint64_t)C * 2 * 2 + ((uint64_t)k + 1) * 8 + 1024;
    if (bytes > c->max_shared) return false;
    uint64_t at_once = c->max_shared / bytes;
    if (at_once * k > 2048) at_once = 2048 / k;
    uint64_t grid = (uint64_t)(c->compute_units ? c->compute_units : 1) * (at_once ? at_once : 1);
    if (force > 1 && grid > (uint64_t)force) grid = (uint64_t)force;
    *cube = k;
    *cubes = (uint32_t)((int64_t)grid < N ? (int64_t)grid : N);
    return true;
}

/* Launches tensor_xent_backward_staged (xent_staged said yes) with xent_backward's arguments. */
static em_status xent_launch_staged(const char *op, const em_tensor *x, const em_tensor *classes,
                                    const em_tensor *g, const em_tensor *loss, em_tensor *dx,
                                    double smoothing, unsigned cube, uint32_t ncubes)
{
    int64_t N = x->shape[0], C = x->shape[1];
    em_scalar ct = tn_compute_type(x->dtype);
    em_lang_bind bind[7] = {em_lang_bind_type("T", x->dtype),
                            em_lang_bind_type("C", ct),
                            em_lang_bind_type("M", tn_math_type(x->st->dev, ct)),
                            em_lang_bind_type("O", g->dtype),
                            em_lang_bind_int("CUBE", cube),
                            em_lang_bind_bool("LOSS", loss != NULL),
                            em_lang_bind_int("NB", C)};
    tn_arg args[9] = {tn_arg_flat(x),
                      tn_arg_s(em_arg_u32((uint32_t)C)),
                      tn_arg_s(em_arg_u32((uint32_t)x->stride[0])),
                      tn_arg_s(em_arg_u32((uint32_t)N)),
                      tn_arg_t(classes),
                      tn_arg_t(g),
                      tn_arg_t(loss ? loss : g),
                      tn_arg_flat(dx),
                      tn_arg_s(tn_scalar_arg(x->dtype, smoothing))};
    for (int i = 0; i < 7; i++) args[i].lanes = 1; /* the logits, classes, g and losses: scalars */
    args[7].offset /= 2;                           /* dx: lines of 2 */
    uint32_t cubes[3] = {ncubes, 1, 1}, units[3] = {cube, 1, 1};
    return tn_launch(op, x->st->dev, "tensor_xent_backward_staged", bind, 7, 2, cubes, units, args,
                     9);
}

/* Launches tensor_xent_backward (a cube a row) with xent_backward's arguments. */
static em_status xent_launch_rows(const char *op, const em_tensor *logits, const em_tensor *classes,
                                  const em_tensor *g, const em_tensor *loss, em_tensor *dx,
                                  double smoothing)
{
    int64_t N = logits->shape[0], C = logits->shape[1];
    em_scalar ct = tn_compute_type(logits->dtype);
    unsigned cube, keep = xent_keep(logits, C, &cube);
    em_lang_bind bind[7] = {em_lang_bind_type("T", logits->dtype), em_lang_bind_type("C", ct),
                            em_lang_bind_type("M", tn_math_type(logits->st->dev, ct)),
                            em_lang_bind_type("O", g->dtype), em_lang_bind_int("CUBE", cube),
                            em_lang_bind_bool("LOSS", loss != NULL), em_lang_bind_int("V", keep)};
    /* without loss, g stands in for it (never written) */
    tn_arg args[9] = {tn_arg_flat(logits), tn_arg_s(em_arg_u32((uint32_t)C)),
                      tn_arg_s(em_arg_u32((uint32_t)logits->stride[1])),
                      tn_arg_s(em_arg_u32((uint32_t)logits->stride[0])), tn_arg_t(classes), tn_arg_t(g),
                      tn_arg_t(loss ? loss : g), tn_arg_flat(dx),
                      tn_arg_s(tn_scalar_arg(logits->dtype, smoothing))};
    uint32_t cubes[3] = {(uint32_t)N, 1, 1}, units[3] = {cube, 1, 1};
    return xent_launch(op, "tensor_xent_backward", keep ? 1 : 2, bind, 7, cubes, units, args, 9, 7);
}

/* em_cross_entropy_rows_backward; with loss (a contiguous [N] of grad_out's dtype) the rows'
 * losses stored there too, by the same launch (tensor_xent_backward's LOSS). */
static em_tensor *xent_backward(const char *op, const em_tensor *grad_out, const em_tensor *logits,
                                const em_tensor *classes, double label_smoothing, const em_tensor *loss)
{
    em_tensor *dx = NULL;
    if (!grad_out || !logits || !classes) goto done;
    char a[96], b[96], c[96];
    if (logits->rank != 2 || classes->rank != 1 || classes->dtype != EM_I32 ||
        grad_out->rank != 1 || grad_out->shape[0] != logits->shape[0] ||
        classes->shape[0] != logits->shape[0] || !em_scalar_is_float(logits->dtype) ||
        (grad_out->dtype != logits->dtype && grad_out->dtype != tn_compute_type(logits->dtype))) {
        em_set_error(EM_ERR_INVALID,
                     "%s: grad %s, logits %s and classes %s do not match (expected a grad [N] of the "
                     "loss's dtype or the logits', float logits [N, C], i32 classes [N])",
                     op, em_describe(grad_out, a, sizeof a), em_describe(logits, b, sizeof b),
                     em_describe(classes, c, sizeof c));
        goto done;
    }
    if (!tn_same_device(op, grad_out, logits) || !tn_same_device(op, logits, classes)) goto done;
    int64_t N = logits->shape[0], C = logits->shape[1];
    /* donated, realized, contiguous logits: the gradient overwrites them. The kernel reads each
     * row whole (its statistics, then a barrier) before a unit writes, and each element is then
     * read and written by the same unit, so the rows are safe in place. */
    if (tn_reusable(logits) && logits->st->buf && !logits->st->pending &&
        logits->stride[1] == 1 && logits->stride[0] == C) {
        dx = (em_tensor *)logits;
        dx->taken = false;
        if (!dx->scope) tn_scope_track(dx);
        logits = dx;
    } else {
        dx = tn_new(logits->st->dev, logits->dtype, 2, logits->shape);
    }
    if (!dx || N == 0 || C == 0) goto done;
    em_tensor *g = tn_contig(grad_out);
    if (!g) goto fail;
    unsigned cube;
    uint32_t ncubes;
    em_status st = xent_staged(logits, dx, &cube, &ncubes)
                       ? xent_launch_staged(op, logits, classes, g, loss, dx, label_smoothing, cube, ncubes)
                       : xent_launch_rows(op, logits, classes, g, loss, dx, label_smoothing);
    em_release(g);
    if (st == EM_OK) goto done;
fail:
    em_release(dx);
    dx = NULL;
done:
    if (logits != dx) tn_done(logits);
    return dx;
}

em_tensor *em_cross_entropy_rows_backward(const em_tensor *grad_out, const em_tensor *logits,
                                          const em_tensor *classes, double label_smoothing)
{
    return xent_backward("cross_entropy_rows backward", grad_out, logits, classes, label_smoothing, NULL);
}

em_tensor *tn_xent_rows_grad(const em_tensor *grad_out, const em_tensor *logits, const em_tensor *classes,
                             double label_smoothing, em_tensor **rows)
{
    *rows = NULL;
    if (!grad_out || !logits || !classes) {
        tn_done(logits);
        return NULL;
    }
    int64_t N = logits->shape[0];
    em_tensor *loss = tn_new(logits->st->dev, grad_out->dtype, 1, &N);
    em_tensor *dx = loss ? xent_backward("cross_entropy_rows", grad_out, logits, classes, label_smoothing, loss) : NULL;
    if (!loss) tn_done(logits);
    if (!dx) {
        em_release(loss);
        return NULL;
    }
    *rows = loss;
    return dx;
}
