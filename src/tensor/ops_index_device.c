/* ops_index_device.c — trusted indices: a per-thread mode in which the ops that read their
 * indices back to check them on the host (embedding and index_select, the embedding gradient,
 * cross-entropy's targets) keep them on the device instead, so that a step using them can be
 * recorded as a graph (docs/graphs.md). Indices are clamped into range on the device (never a
 * stray read); an out-of-range index is not reported. The results equal the checked forms' for
 * indices in range: the embedding gradient's stable sort by id is computed on the device
 * (src/kernels/tensor_index_sort.ek) in the order the host's counting sort gives, and
 * cross-entropy's targets become i32 classes with none ignored. */
#include "tensor/internal.h"

static _Thread_local int g_trusted; /* open trusted-index regions of this thread */

void em_trusted_indices_begin(void)
{
    g_trusted++;
}

void em_trusted_indices_end(void)
{
    if (g_trusted > 0) g_trusted--;
}

bool em_trusted_indices(void)
{
    return g_trusted > 0;
}

em_tensor *tn_embedding_backward_device(const char *op, const em_tensor *grad, const em_tensor *ids,
                                        int64_t V)
{
    int64_t n = em_numel(ids), D = grad->shape[grad->rank - 1];
    int64_t shape[2] = {V, D};
    em_tensor *out = tn_new(grad->st->dev, grad->dtype, 2, shape);
    if (!out || V * D == 0) return out;
    if (n == 0) {
        if (tn_fill(out, 0) == EM_OK) return out;
        em_release(out);
        return NULL;
    }
    em_device *dev = grad->st->dev;
    em_tensor *ic = tn_contig(ids);
    em_tensor *order = em_empty(dev, EM_I32, EM_SHAPE(n));
    em_tensor *sorted = em_empty(dev, EM_I32, EM_SHAPE(n));
    em_tensor *starts = em_empty(dev, EM_I32, EM_SHAPE(V + 1));
    em_tensor *g2 = em_reshape(grad, EM_SHAPE(n, D));
    em_status st = ic && order && sorted && starts && g2 ? EM_OK : em_last_status();
    uint32_t cubes[3], units[3];
    if (st == EM_OK) {
        /* cubes of 128 units (fewer where the device's cubes are smaller): a power of two */
        const em_caps *caps = em_device_caps(dev);
        uint32_t cube = 128;
        while (caps && caps->max_cube_units && cube > caps->max_cube_units) cube /= 2;
        em_lang_bind b[2] = {em_lang_bind_type("I", ic->dtype), em_lang_bind_int("CUBE", cube)};
        tn_arg a[5] = {tn_arg_flat(ic), tn_arg_flat(order), tn_arg_flat(sorted),
                       tn_arg_s(em_arg_u32((uint32_t)n)), tn_arg_s(em_arg_u32((uint32_t)V))};
        cubes[0] = (uint32_t)(((uint64_t)n + cube - 1) / cube), cubes[1] = cubes[2] = 1;
        units[0] = cube, units[1] = units[2] = 1;
        if (n > 0) st = tn_launch(op, dev, "tensor_ids_sort", b, 2, 1, cubes, units, a, 5);
    }
    if (st == EM_OK) {
        tn_arg a[4] = {tn_arg_flat(sorted), tn_arg_flat(starts), tn_arg_s(em_arg_u32((uint32_t)n)),
                       tn_arg_s(em_arg_u32((uint32_t)V))};
        tn_grid_1d((uint64_t)V + 1, cubes, units);
        st = tn_launch(op, dev, "tensor_ids_starts", NULL, 0, 1, cubes, units, a, 4);
    }
    if (st == EM_OK) {
        em_lang_bind b[2] = {em_lang_bind_type("T", grad->dtype),
                             em_lang_bind_type("C", tn_compute_type(grad->dtype))};
        tn_arg a[4] = {tn_arg_t(g2), tn_arg_flat(order), tn_arg_flat(starts), tn_arg_t(out)};
        tn_grid_1d((uint64_t)(V * D), cubes, units);
        st = tn_launch(op, dev, "tensor_embedding_backward", b, 2, 1, cubes, units, a, 4);
    }
    em_release(ic);
    em_release(order);
    em_release(sorted);
    em_release(starts);
    em_release(g2);
    if (st == EM_OK) return out;
    em_release(out);
    return NULL;
}

em_tensor *tn_classes_device(const em_tensor *targets, int64_t n_class)
{
    em_tensor *c = em_clamp(targets, 0, (double)(n_class - 1));
    em_tensor *flat = c ? em_reshape(c, EM_SHAPE(em_numel(targets))) : NULL;
    em_release(c);
    if (!flat || flat->dtype == EM_I32) return flat;
    em_tensor *cls = em_cast(flat, EM_I32);
    em_release(flat);
    return cls;
}
