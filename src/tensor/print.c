/* print.c — PyTorch-style text for tensors: "tensor([[1., 2.],\n        [3., 4.]])", one width
 * for every element, integers-valued floats as "1.", others with 4 decimals or in scientific
 * notation when the magnitudes call for it, a dtype suffix for non-default dtypes and a device
 * suffix off the CPU, and "..." (the first and last 3 of each dim) past 1000 elements. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tensor/internal.h"

#define EDGE 3
#define THRESHOLD 1000

typedef struct fmt {
    em_strbuf *sb;     /* the text */
    const double *v;   /* every element, row-major */
    const int64_t *shape;
    int rank;
    bool summarize;    /* elide the middle of long dims */
    int width;         /* every element padded to this */
    int mode;          /* 0 integer, 1 float as integer ("1."), 2 fixed, 3 scientific, 4 bool */
} fmt;

static int format_one(const fmt *f, double x, char *buf, size_t n)
{
    if (f->mode == 4) return snprintf(buf, n, "%s", x != 0 ? "True" : "False");
    if (isnan(x)) return snprintf(buf, n, "nan");
    if (isinf(x)) return snprintf(buf, n, x > 0 ? "inf" : "-inf");
    switch (f->mode) {
    case 0: return snprintf(buf, n, "%.0f", x);
    case 1: return snprintf(buf, n, "%.0f.", x);
    case 2: return snprintf(buf, n, "%.4f", x);
    default: return snprintf(buf, n, "%.4e", x);
    }
}

static void put_elem(fmt *f, double x)
{
    char buf[64];
    int len = format_one(f, x, buf, sizeof buf);
    for (int i = len; i < f->width; i++) em_sb_append(f->sb, " ");
    em_sb_append(f->sb, buf);
}

/* Appends the block of dim d starting at element `base` (stride of dim d is `step`). */
static void put_dim(fmt *f, int d, int64_t base)
{
    int64_t n = f->shape[d], step = 1;
    for (int i = d + 1; i < f->rank; i++) step *= f->shape[i];
    em_sb_append(f->sb, "[");
    bool cut = f->summarize && n > 2 * EDGE;
    for (int64_t i = 0; i < n; i++) {
        if (cut && i == EDGE) {
            if (d == f->rank - 1) {
                em_sb_append(f->sb, " ...");
            } else {
                em_sb_append(f->sb, "...");
            }
            i = n - EDGE - 1;
        } else if (d == f->rank - 1) {
            put_elem(f, f->v[base + i * step]);
        } else {
            put_dim(f, d + 1, base + i * step);
        }
        if (i + 1 < n) {
            em_sb_append(f->sb, ",");
            if (d == f->rank - 1) {
                em_sb_append(f->sb, " ");
            } else {
                for (int k = 0; k < f->rank - d - 1; k++) em_sb_append(f->sb, "\n");
                em_sb_printf(f->sb, "%*s", 7 + d + 1, "");
            }
        }
    }
    em_sb_append(f->sb, "]");
}

/* Whether element i (row-major) is printed when summarizing. */
static bool shown(const fmt *f, int64_t i)
{
    if (!f->summarize) return true;
    for (int d = f->rank - 1; d >= 0; d--) {
        int64_t c = i % f->shape[d];
        i /= f->shape[d];
        if (f->shape[d] > 2 * EDGE && c >= EDGE && c < f->shape[d] - EDGE) return false;
    }
    return true;
}

static const char *torch_dtype(em_scalar dt)
{
    switch (dt) {
    case EM_F16: return "torch.float16";
    case EM_BF16: return "torch.bfloat16";
    case EM_F64: return "torch.float64";
    case EM_I32: return "torch.int32";
    case EM_U8: return "torch.uint8";
    default: return NULL; /* f32, i64 and bool are the defaults PyTorch leaves out */
    }
}

char *em_tensor_format(const em_tensor *t)
{
    if (!t) return NULL;
    int64_t n = em_numel(t);
    double *v = NULL;
    size_t esz = em_scalar_size(t->dtype);
    void *host = malloc((size_t)n * esz + 8);
    if (!host) {
        em_set_error(EM_ERR_NOMEM, "format: out of host memory");
        return NULL;
    }
    if (em_to_host(t, host, (size_t)n * esz + 8) != EM_OK) {
        free(host);
        return NULL;
    }
    v = malloc(sizeof(double) * (size_t)(n + 1));
    if (!v) {
        free(host);
        em_set_error(EM_ERR_NOMEM, "format: out of host memory");
        return NULL;
    }
    for (int64_t i = 0; i < n; i++) v[i] = tn_host_get(t->dtype, host, (size_t)i);
    free(host);
    em_strbuf sb;
    em_sb_init(&sb);
    fmt f = {&sb, v, t->shape, t->rank, n > THRESHOLD, 0, 0};
    bool fl = em_scalar_is_float(t->dtype);
    f.mode = t->dtype == EM_BOOL ? 4 : fl ? 1 : 0;
    if (fl) {
        double lo = INFINITY, hi = 0;
        for (int64_t i = 0; i < n; i++) {
            if (!shown(&f, i) || !isfinite(v[i])) continue;
            double a = fabs(v[i]);
            if (a != floor(a)) f.mode = 2;
            if (a != 0 && a < lo) lo = a;
            if (a > hi) hi = a;
        }
        if (hi > 1e8 || (f.mode == 2 && (hi / lo > 1000 || lo < 1e-4))) f.mode = 3;
    }
    for (int64_t i = 0; i < n; i++) {
        if (!shown(&f, i)) continue;
        char buf[64];
        int len = format_one(&f, v[i], buf, sizeof buf);
        if (len > f.width) f.width = len;
    }
    em_sb_append(&sb, "tensor(");
    if (t->rank == 0) {
        put_elem(&f, v[0]);
    } else if (n == 0) {
        em_sb_append(&sb, "[]");
        if (t->rank > 1) {
            em_sb_append(&sb, ", size=(");
            for (int i = 0; i < t->rank; i++) em_sb_printf(&sb, "%s%lld", i ? ", " : "", (long long)t->shape[i]);
            em_sb_append(&sb, ")");
        }
    } else {
        put_dim(&f, 0, 0);
    }
    const char *dn = em_device_name(t->st->dev);
    if (strcmp(dn, "cpu") != 0) em_sb_printf(&sb, ", device='%s'", dn);
    if (torch_dtype(t->dtype)) em_sb_printf(&sb, ", dtype=%s", torch_dtype(t->dtype));
    em_sb_append(&sb, ")");
    free(v);
    return em_sb_take(&sb);
}

void em_tensor_print(const em_tensor *t)
{
    char *s = em_tensor_format(t);
    printf("%s\n", s ? s : "(null)");
    free(s);
}
