/* schedule.c — learning-rate schedules as plain functions of the step (0 for the first).
 *
 *   warmup (every kind but NOAM): step < warmup gives base * step / warmup (from 0, as Hugging
 *   Face's get_*_schedule_with_warmup); after it, with progress p = (step - warmup) /
 *   max(1, total_steps - warmup) clamped to [0, 1]:
 *   CONSTANT  base
 *   LINEAR    base + (min_lr - base) * p
 *   COSINE    min_lr + (base - min_lr) * (1 + cos(pi p)) / 2
 *   STEP      base * gamma^floor((step - warmup) / step_size)   (step_size <= 0: no decay)
 *   NOAM      base * dim^-0.5 * min(n^-0.5, n * warmup^-1.5) with n = max(step, 1)
 *             (dim <= 0 counts as 1; warmup <= 0 leaves n^-0.5)
 * Negative steps count as 0. A sequence hands each part the step counted from its own start. */
#include <math.h>
#include <string.h>

#include "optim/internal.h"

static double warmup_factor(const em_lr_schedule *s, int64_t step)
{
    return s->warmup > 0 && step < s->warmup ? (double)step / (double)s->warmup : 1.0;
}

static double noam(const em_lr_schedule *s, int64_t step)
{
    double n = (double)(step < 1 ? 1 : step);
    double dim = s->dim > 0 ? (double)s->dim : 1.0;
    double f = 1.0 / sqrt(n);
    if (s->warmup > 0) f = fmin(f, n * pow((double)s->warmup, -1.5));
    return s->base * f / sqrt(dim);
}

double em_lr_at(const em_lr_schedule *s, int64_t step)
{
    if (!s) return 0;
    if (step < 0) step = 0;
    if (s->kind == EM_LR_NOAM) return noam(s, step);
    if (s->warmup > 0 && step < s->warmup) return s->base * warmup_factor(s, step);
    int64_t after = step - (s->warmup > 0 ? s->warmup : 0);
    int64_t span = s->total_steps - (s->warmup > 0 ? s->warmup : 0);
    double p = (double)after / (double)(span > 1 ? span : 1);
    p = p < 0 ? 0 : p > 1 ? 1 : p;
    switch (s->kind) {
    case EM_LR_LINEAR:
        return s->base + (s->min_lr - s->base) * p;
    case EM_LR_COSINE:
        return s->min_lr + (s->base - s->min_lr) * 0.5 * (1.0 + cos(M_PI * p));
    case EM_LR_STEP:
        if (s->step_size <= 0) return s->base;
        return s->base * pow(s->gamma, (double)(after / s->step_size));
    case EM_LR_CONSTANT:
    default:
        return s->base;
    }
}

double em_lr_sequence_at(const em_lr_sequence *s, int64_t step)
{
    if (!s || s->n <= 0 || !s->parts) return 0;
    int k = 0;
    for (int i = 1; i < s->n; i++)
        if (s->starts && step >= s->starts[i]) k = i;
    int64_t start = s->starts && k > 0 ? s->starts[k] : 0;
    return em_lr_at(&s->parts[k], step - start);
}

bool em_lr_kind_parse(const char *name, em_lr_kind *out)
{
    static const struct {
        const char *name;
        em_lr_kind kind;
    } kinds[] = {{"constant", EM_LR_CONSTANT},
                 {"linear", EM_LR_LINEAR},
                 {"cosine", EM_LR_COSINE},
                 {"step", EM_LR_STEP},
                 {"noam", EM_LR_NOAM}};
    for (size_t i = 0; name && i < EM_ARRAY_LEN(kinds); i++)
        if (strcmp(name, kinds[i].name) == 0) {
            if (out) *out = kinds[i].kind;
            return true;
        }
    em_set_error(EM_ERR_INVALID,
                 "unknown learning-rate schedule \"%s\" (constant, linear, cosine, "
                 "step, noam)",
                 name ? name : "(null)");
    return false;
}
