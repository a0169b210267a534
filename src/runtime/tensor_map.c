/* tensor_map.c — em_tensor_map_encode: the device-independent checks of a tiled tensor map (the
 * rules CUDA's cuTensorMapEncodeTiled sets, restricted to what the kernel language's tma_load
 * emulates exactly: no interleave, no swizzle or a 128-byte one spanning the box's rows), then the
 * driver's encoder (drivers/cuda.c: CUtensorMap; drivers/cpu.c: the words of kernel/lang/tma.h).
 * Devices without one (OpenCL, Vulkan) refuse with a message naming the device. */
#include "runtime/rt.h"

static em_status bad(const char *what, unsigned dim, uint64_t v)
{
    return em_set_error(EM_ERR_INVALID, "tensor map: %s (dim %u: %llu)", what, dim,
                        (unsigned long long)v);
}

/* Checks d against the rules above and that the view lies inside `size` bytes from `offset`. */
static em_status check(const em_tensor_map_desc *d, size_t offset, size_t size)
{
    if ((unsigned)d->dtype >= EM_SCALAR_COUNT || d->dtype == EM_BOOL)
        return em_set_error(EM_ERR_INVALID, "tensor map: element type %d is not a number",
                            (int)d->dtype);
    size_t es = em_scalar_size(d->dtype);
    if (d->rank < 1 || d->rank > 3)
        return em_set_error(EM_ERR_INVALID, "tensor map: rank %u (1 to 3)", d->rank);
    if (offset % 16)
        return em_set_error(EM_ERR_INVALID, "tensor map: byte offset %zu is not 16-byte aligned",
                            offset);
    if (d->swizzle != 0 && d->swizzle != 128)
        return em_set_error(EM_ERR_INVALID, "tensor map: swizzle of %u bytes (0 or 128)",
                            d->swizzle);
    uint64_t last = 0; /* bytes from the first element to the last */
    for (unsigned i = 0; i < d->rank; i++) {
        if (d->dims[i] < 1 || d->dims[i] > (1ull << 32))
            return bad("dims must be 1 to 2^32", i, d->dims[i]);
        if (d->box[i] < 1 || d->box[i] > 256) return bad("box sizes must be 1 to 256", i, d->box[i]);
        if (i == 0 && d->strides[0] != 1) return bad("the innermost stride must be 1", 0, d->strides[0]);
        if (i > 0 && ((d->strides[i] * es) % 16 || d->strides[i] * es >= (1ull << 40)))
            return bad("strides must be 16-byte multiples below 2^40 bytes", i, d->strides[i]);
        if (d->dims[i] > 1 && d->strides[i] > (UINT64_MAX / 2) / d->dims[i])
            return bad("the view is too large", i, d->dims[i]);
        last += (d->dims[i] - 1) * d->strides[i] * es;
    }
    if ((d->box[0] * es) % 16) return bad("the innermost box must span 16-byte multiples", 0, d->box[0]);
    if (d->swizzle == 128 && d->box[0] * es != 128)
        return bad("a 128-byte swizzle needs an innermost box of 128 bytes", 0, d->box[0]);
    if (offset > size || last + es > size - offset)
        return em_set_error(EM_ERR_INVALID, "tensor map: the view (%llu bytes from byte %zu) lies "
                            "outside the buffer of %zu bytes", (unsigned long long)(last + es),
                            offset, size);
    return EM_OK;
}

em_status em_tensor_map_encode(em_buffer *buf, size_t offset, const em_tensor_map_desc *d,
                               uint64_t out[EM_TENSOR_MAP_WORDS])
{
    if (!buf || !d || !out)
        return em_set_error(EM_ERR_INVALID, "em_tensor_map_encode: NULL argument");
    em_device *dev = buf->dev;
    if (!dev->drv->tensor_map)
        return em_set_error(EM_ERR_UNSUPPORTED, "%s: tensor maps (TMA) need CUDA on compute "
                            "capability 9.0 or the CPU; this device has none", dev->name);
    em_status st = check(d, offset, buf->size);
    if (st != EM_OK) return st;
    /* every map is 3-D (tma_load takes three coordinates): the dims past the rank have size 1
     * and a 16-byte multiple as stride */
    em_tensor_map_desc x = *d;
    size_t es = em_scalar_size(x.dtype);
    for (unsigned i = x.rank; i < 3; i++) {
        uint64_t bytes = x.strides[i - 1] * x.dims[i - 1] * es;
        x.dims[i] = 1, x.box[i] = 1, x.strides[i] = (bytes + 15) / 16 * 16 / es;
    }
    x.rank = 3;
    st = check(&x, offset, buf->size);
    if (st != EM_OK) return st;
    for (unsigned i = 0; i < EM_TENSOR_MAP_WORDS; i++) out[i] = 0;
    buf->addr_fixed = true; /* the map holds its address: a graph's plan must not move it */
    return dev->drv->tensor_map(dev->state, buf->mem, offset, &x, out);
}
