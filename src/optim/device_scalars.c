/* device_scalars.c — Adam/AdamW with the per-step scalars in device memory, for training steps
 * recorded once and replayed as graphs (docs/graphs.md, docs/optim.md). A recorded launch keeps
 * the scalars it was given, so in this mode the fused kernels (fused.c, optim_adam.ek's _dev
 * forms) read the step size, bias correction and decay from a small buffer of the parameters'
 * device (o->dscal, OP_SC_* slots) that the host rewrites before each replay, and clipping
 * computes the norm and coefficient on the device (optim_clip_coef) and leaves them there: the
 * rescale and the update read the coefficient and the "finite" flag, so a non-finite norm skips
 * the update without the host looking. The values and their roundings are the host path's, so
 * results are the same bit for bit where the device adds the partial sums in f64. */
#include <math.h>

#include "optim/internal.h"
#include "tensor/internal.h"

/* The device of every parameter, or NULL (with the error set) when they are on several or none. */
static em_device *params_device(const em_optimizer *o)
{
    if (o->n == 0) {
        em_set_error(EM_ERR_INVALID, "device scalars: the optimizer has no parameters");
        return NULL;
    }
    em_device *dev = em_tensor_device(o->ps[0].t);
    for (int i = 1; i < o->n; i++)
        if (em_tensor_device(o->ps[i].t) != dev) {
            em_set_error(EM_ERR_UNSUPPORTED,
                         "device scalars: parameters %s and %s are on %s and %s", o->ps[0].name,
                         o->ps[i].name, em_device_name(dev),
                         em_device_name(em_tensor_device(o->ps[i].t)));
            return NULL;
        }
    return dev;
}

/* Writes v[0..OP_SC_COUNT) into o->dscal (outside any recording). */
static em_status write_slots(em_optimizer *o, const double *v)
{
    em_device *dev = em_tensor_device(o->dscal);
    if (em_device_recording(dev))
        return em_set_error(EM_ERR_INVALID,
                            "device scalars: %s is recording; write the scalars "
                            "before the recording or the replay",
                            em_device_name(dev));
    em_status st = em_realize(o->dscal);
    if (st != EM_OK) return st;
    em_scalar dt = em_dtype(o->dscal);
    uint8_t host[OP_SC_COUNT * 8];
    for (int i = 0; i < OP_SC_COUNT; i++) tn_host_set(dt, host, (size_t)i, v[i]);
    size_t esz = em_scalar_size(dt);
    return em_buffer_write(o->dscal->st->buf, (size_t)o->dscal->offset * esz, host,
                           OP_SC_COUNT * esz);
}

em_status em_optimizer_device_scalars(em_optimizer *o, bool on)
{
    if (!o) return em_set_error(EM_ERR_INVALID, "optimizer_device_scalars: NULL optimizer");
    if (!on) {
        em_release(o->dscal);
        o->dscal = NULL;
        return EM_OK;
    }
    if (o->dscal) return EM_OK;
    if (o->fused != op_adam_fused)
        return em_set_error(EM_ERR_UNSUPPORTED,
                            "device scalars: %s has no fused kernel (Adam and "
                            "AdamW have)",
                            o->kind);
    em_device *dev = params_device(o);
    if (!dev) return em_last_status();
    em_tensor *s = em_zeros(dev, op_scalar_type(dev), EM_SHAPE(OP_SC_COUNT));
    if (!s) return em_last_status();
    em_tensor_untrack(s);
    o->dscal = s;
    em_status st = em_optimizer_write_scalars(o);
    if (st != EM_OK) {
        em_release(o->dscal);
        o->dscal = NULL;
    }
    return st;
}

em_status em_optimizer_write_scalars(em_optimizer *o)
{
    if (!o || !o->dscal)
        return em_set_error(EM_ERR_INVALID, "optimizer_write_scalars: %s",
                            o ? "device scalars are off" : "NULL optimizer");
    const em_adam_config *c = &o->cfg.adam;
    double t = (double)(o->steps + 1);
    double bc1 = 1.0 - pow(c->beta1, t), bc2 = 1.0 - pow(c->beta2, t);
    double v[OP_SC_COUNT] = {0};
    v[OP_SC_STEP_SIZE] = o->lr / bc1; /* as op_adam_fused computes them */
    v[OP_SC_BC2_SQRT] = sqrt(bc2);
    v[OP_SC_DECAY] = c->decoupled ? 1.0 - o->lr * c->weight_decay : c->weight_decay;
    v[OP_SC_NORM] = NAN;
    v[OP_SC_COEF] = 1;
    v[OP_SC_OK] = 1;
    return write_slots(o, v);
}

static em_status clip_device(em_optimizer *o, double max_norm, bool defer)
{
    if (!o || !o->dscal)
        return em_set_error(EM_ERR_INVALID, "clip_grad_norm_device: %s",
                            o ? "device scalars are off" : "NULL optimizer");
    if (!(max_norm >= 0))
        return em_set_error(EM_ERR_INVALID, "clip_grad_norm_device: max_norm %g < 0", max_norm);
    em_no_grad_begin();
    em_status st = op_clip_device(o, max_norm, defer);
    em_no_grad_end();
    return st == EM_OK ? EM_OK : em_error_context("clip_grad_norm_device");
}

em_status em_clip_grad_norm_device(em_optimizer *o, double max_norm)
{
    return clip_device(o, max_norm, false);
}

em_status em_clip_grad_norm_device_deferred(em_optimizer *o, double max_norm)
{
    return clip_device(o, max_norm, true);
}

em_status em_optimizer_device_norm(em_optimizer *o, double *norm)
{
    *norm = NAN;
    if (!o || !o->dscal)
        return em_set_error(EM_ERR_INVALID, "optimizer_device_norm: %s",
                            o ? "device scalars are off" : "NULL optimizer");
    uint8_t host[OP_SC_COUNT * 8];
    em_scalar dt = em_dtype(o->dscal);
    em_status st = em_to_host(o->dscal, host, OP_SC_COUNT * em_scalar_size(dt));
    if (st == EM_OK) *norm = tn_host_get(dt, host, OP_SC_NORM);
    return st;
}

void em_optimizer_set_steps(em_optimizer *o, int64_t steps)
{
    if (o && steps >= 0) o->steps = steps;
}
