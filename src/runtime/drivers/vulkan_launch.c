/* vulkan_launch.c — launches and timing for the Vulkan driver (vulkan.c has devices, memory and
 * the command stream; vulkan_spirv.c compiles and loads shaders).
 *
 * A launch follows the GLSL generator's ABI (kernel/codegen/glsl.c): descriptor set 0 holds
 * storage buffer binding i for buffer parameter i and the tensor-metadata buffer at the binding
 * after the last parameter (u64 words: per buffer parameter len, shape, stride); scalar parameters
 * go into the push-constant block, member j for the j-th scalar parameter, converted to the
 * member's type as reflected from the SPIR-V (glsl.c gives each an 8-byte slot); the cube
 * dimension goes into specialization constants 0, 1, 2 (one pipeline per dimension, cached in
 * the kernel). The metadata is written into the current frame's arena and bound from there; the
 * descriptor set comes from the frame's pool. A buffer's descriptor starts at the argument's
 * offset, which must therefore be a multiple of minStorageBufferOffsetAlignment (16 bytes on
 * lavapipe and NVIDIA); other offsets are refused with a message saying so. A grid larger than
 * the device dispatches at once (maxComputeWorkGroupCount) is split into vkCmdDispatchBase
 * pieces, which keeps gl_WorkGroupID global; only kernels that read gl_NumWorkGroups cannot be
 * split.
 *
 * Timing: an event is a timestamp query written into the command stream (bottom of pipe), read
 * after a sync; without timestamps it is the host clock after a sync. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "runtime/drivers/vulkan_internal.h"

/* ---- launches -------------------------------------------------------------------------------- */

/* IEEE binary16 bits of a float (round to nearest even). */
static uint16_t f32_to_f16(float v)
{
    uint32_t x;
    memcpy(&x, &v, 4);
    uint32_t sign = (x >> 16) & 0x8000u, e = (x >> 23) & 0xffu, m = x & 0x7fffffu;
    if (e == 0xff) return (uint16_t)(sign | 0x7c00u | (m ? 0x200u : 0));
    int32_t exp = (int32_t)e - 127 + 15;
    if (exp >= 31) return (uint16_t)(sign | 0x7c00u);
    if (exp <= 0) {
        if (exp < -10) return (uint16_t)sign;
        m |= 0x800000u;
        uint32_t shift = (uint32_t)(14 - exp);
        uint32_t half = m >> shift, rest = m & ((1u << shift) - 1), mid = 1u << (shift - 1);
        if (rest > mid || (rest == mid && (half & 1))) half++;
        return (uint16_t)(sign | half);
    }
    uint32_t half = ((uint32_t)exp << 10) | (m >> 13), rest = m & 0x1fffu;
    if (rest > 0x1000u || (rest == 0x1000u && (half & 1)))
        half++; /* may carry into the exponent, which is right */
    return (uint16_t)(sign | half);
}

/* bfloat16 bits of a float (round to nearest even). */
static uint16_t f32_to_bf16(float v)
{
    uint32_t x;
    memcpy(&x, &v, 4);
    if ((x & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((x >> 16) | 0x40u);
    x += 0x7fffu + ((x >> 16) & 1u);
    return (uint16_t)(x >> 16);
}

/* Writes scalar argument a as the push-constant member pm into block. */
static void put_scalar(uint8_t *block, const em_vk_push_member *pm, const em_drv_arg *a)
{
    bool is_float = em_scalar_is_float((em_scalar)a->type.scalar);
    bool is_signed = em_scalar_is_signed((em_scalar)a->type.scalar);
    uint8_t *p = block + pm->offset;
    if (pm->kind == 2) { /* float member: convert the value */
        double v = is_float ? a->value.f : is_signed ? (double)a->value.i : (double)a->value.u;
        if (pm->bits == 64) {
            memcpy(p, &v, 8);
        } else if (pm->bits == 32) {
            float f = (float)v;
            memcpy(p, &f, 4);
        } else {
            uint16_t h = f32_to_f16((float)v);
            memcpy(p, &h, 2);
        }
        return;
    }
    uint64_t bits;
    if (is_float) { /* an integer member holding a float parameter: its bits */
        float f = (float)a->value.f;
        uint32_t u32;
        switch ((em_scalar)a->type.scalar) {
        case EM_F16:
            bits = f32_to_f16(f);
            break;
        case EM_BF16:
            bits = f32_to_bf16(f);
            break;
        case EM_F64:
            memcpy(&bits, &a->value.f, 8);
            break;
        default:
            memcpy(&u32, &f, 4);
            bits = u32;
            break;
        }
    } else {
        bits = a->value.u;
    }
    switch (pm->bits) {
    case 8: {
        uint8_t v = (uint8_t)bits;
        memcpy(p, &v, 1);
        break;
    }
    case 16: {
        uint16_t v = (uint16_t)bits;
        memcpy(p, &v, 2);
        break;
    }
    case 64:
        memcpy(p, &bits, 8);
        break;
    default: {
        uint32_t v = (uint32_t)bits;
        memcpy(p, &v, 4);
        break;
    }
    }
}

/* Bytes of launch metadata: the u64 words of spmd.h — per buffer parameter, in parameter order,
 * len, shape[0..rank), stride[0..rank) — and at least one word. */
static size_t meta_size(const em_drv_launch *l)
{
    size_t words = 0;
    for (size_t i = 0; i < l->nargs; i++)
        if (l->args[i].kind == EM_PARAM_BUFFER) words += 1 + 2 * (size_t)l->args[i].rank;
    return (words ? words : 1) * 8;
}

static void meta_fill(uint8_t *out, const em_drv_launch *l)
{
    uint64_t w[1 + 2 * EM_MAX_RANK];
    size_t at = 0;
    for (size_t i = 0; i < l->nargs; i++) {
        const em_drv_arg *a = &l->args[i];
        if (a->kind != EM_PARAM_BUFFER) continue;
        uint32_t rank = a->rank <= EM_MAX_RANK ? a->rank : EM_MAX_RANK;
        size_t n = 0;
        w[n++] = a->len;
        for (uint32_t r = 0; r < rank; r++) w[n++] = (uint64_t)a->shape[r];
        for (uint32_t r = 0; r < rank; r++) w[n++] = (uint64_t)a->stride[r];
        memcpy(out + at, w, n * 8);
        at += n * 8;
    }
    if (!at) memset(out, 0, 8);
}

/* The descriptor of buffer argument `index`: from its offset (which must be a multiple of the
 * device's minStorageBufferOffsetAlignment: the shader indexes from element 0 of the binding)
 * over the elements it may touch. */
static em_status buffer_binding(em_vk_device *d, const em_drv_arg *a, size_t index,
                                VkDescriptorBufferInfo *info)
{
    const em_vk_mem *m = a->mem;
    size_t elem = em_scalar_size((em_scalar)a->type.scalar) * (a->type.lanes ? a->type.lanes : 1);
    VkDeviceSize base = a->offset, range = (VkDeviceSize)a->len * elem;
    if (base % d->ssbo_align)
        return em_set_error(EM_ERR_UNSUPPORTED,
                            "vulkan: argument %zu starts at byte offset %zu, "
                            "which is not a multiple of %llu (%s binds storage buffers only at "
                            "multiples of minStorageBufferOffsetAlignment)",
                            index, a->offset, (unsigned long long)d->ssbo_align,
                            d->props.deviceName);
    if (range == 0 || base >= m->size) { /* nothing visible: bind something valid */
        base = 0;
        range = m->size < 16 ? m->size : 16;
    }
    if (base + range > m->size) range = m->size - base;
    if (range > d->props.limits.maxStorageBufferRange)
        return em_set_error(EM_ERR_UNSUPPORTED,
                            "vulkan: argument %zu spans %llu bytes, more "
                            "than %s can bind (maxStorageBufferRange %u)",
                            index, (unsigned long long)range, d->props.deviceName,
                            d->props.limits.maxStorageBufferRange);
    info->buffer = m->buffer;
    info->offset = base;
    info->range = range;
    return EM_OK;
}

static em_status launch_locked(em_vk_device *d, em_vk_kernel *k, const em_drv_launch *l)
{
    const VkPhysicalDeviceLimits *lim = &d->props.limits;
    bool split = false;
    for (int i = 0; i < 3; i++) split |= l->cube_count[i] > lim->maxComputeWorkGroupCount[i];
    if (split && k->num_groups) /* its CUBE_COUNT would see one piece */
        return em_set_error(EM_ERR_UNSUPPORTED,
                            "vulkan: kernel %s: a grid of %ux%ux%u cubes is "
                            "more than %s dispatches at once (%ux%ux%u) and the kernel reads "
                            "gl_NumWorkGroups, so it cannot run in pieces",
                            k->name, l->cube_count[0], l->cube_count[1], l->cube_count[2],
                            d->props.deviceName, lim->maxComputeWorkGroupCount[0],
                            lim->maxComputeWorkGroupCount[1], lim->maxComputeWorkGroupCount[2]);
    VkPipeline pipe;
    em_status st = em_rt_vk_pipeline(d, k, l->cube_dim, &pipe);
    if (st != EM_OK) return st;

    /* descriptors: every binding of the shader is a buffer parameter or the metadata */
    VkDescriptorBufferInfo infos[64];
    VkWriteDescriptorSet writes[64];
    if (k->nbindings > 64 || l->nargs > 64)
        return em_set_error(EM_ERR_UNSUPPORTED, "vulkan: kernel %s has more than 64 parameters",
                            k->name);
    for (size_t i = 0; i < l->nargs; i++) {
        if (l->args[i].kind != EM_PARAM_BUFFER) continue;
        if ((st = buffer_binding(d, &l->args[i], i, &infos[i])) != EM_OK)
            return em_error_context("kernel %s", k->name);
    }
    size_t meta_bytes = meta_size(l);
    em_vk_frame *f;
    VkDeviceSize meta_off;
    if ((st = em_rt_vk_frame_room(d, 1, meta_bytes, d->ssbo_align, &f, &meta_off)) != EM_OK)
        return st;
    meta_fill(f->arena_map + meta_off, l);

    VkDescriptorSet set = VK_NULL_HANDLE;
    if (k->nbindings) {
        VkDescriptorSetAllocateInfo ai = {.sType = VK_STRUCTURE_TYPE_DESCRIPTOR_SET_ALLOCATE_INFO,
                                          .descriptorPool = f->pool,
                                          .descriptorSetCount = 1,
                                          .pSetLayouts = &k->set_layout};
        VkResult r = d->fn.vkAllocateDescriptorSets(d->device, &ai, &set);
        if (r == VK_ERROR_OUT_OF_POOL_MEMORY || r == VK_ERROR_FRAGMENTED_POOL) {
            /* the pool ran out of descriptors before sets: continue in a fresh frame */
            if ((st = em_rt_vk_frame_submit(d)) != EM_OK ||
                (st = em_rt_vk_frame_room(d, 1, meta_bytes, d->ssbo_align, &f, &meta_off)) != EM_OK)
                return st;
            meta_fill(f->arena_map + meta_off, l);
            ai.descriptorPool = f->pool;
            r = d->fn.vkAllocateDescriptorSets(d->device, &ai, &set);
        }
        if (r != VK_SUCCESS) return em_rt_vk_fail("vkAllocateDescriptorSets", r);
        f->sets++;
        VkDescriptorBufferInfo meta = {f->arena, meta_off, meta_bytes};
        for (uint32_t b = 0; b < k->nbindings; b++) {
            uint32_t binding = k->bindings[b];
            const VkDescriptorBufferInfo *info;
            if (binding < l->nargs && l->args[binding].kind == EM_PARAM_BUFFER)
                info = &infos[binding];
            else if (binding == l->nargs)
                info = &meta;
            else
                return em_set_error(EM_ERR_INVALID,
                                    "vulkan: kernel %s: shader binding %u is "
                                    "neither a buffer parameter nor the metadata (binding %zu)",
                                    k->name, binding, l->nargs);
            writes[b] = (VkWriteDescriptorSet){
                .sType = VK_STRUCTURE_TYPE_WRITE_DESCRIPTOR_SET,
                .dstSet = set,
                .dstBinding = binding,
                .descriptorCount = 1,
                .descriptorType = VK_DESCRIPTOR_TYPE_STORAGE_BUFFER,
                .pBufferInfo = info,
            };
        }
        d->fn.vkUpdateDescriptorSets(d->device, k->nbindings, writes, 0, NULL);
    }

    uint8_t push[256];
    if (k->push_size) {
        memset(push, 0, sizeof(push));
        size_t j = 0;
        for (size_t i = 0; i < l->nargs; i++) {
            if (l->args[i].kind != EM_PARAM_SCALAR) continue;
            if (j >= k->npush)
                return em_set_error(EM_ERR_INVALID,
                                    "vulkan: kernel %s: scalar parameter %zu "
                                    "has no push-constant member (the shader has %u)",
                                    k->name, i, k->npush);
            put_scalar(push, &k->push[j++], &l->args[i]);
        }
    }

    em_rt_vk_barrier(d, f, false);
    d->fn.vkCmdBindPipeline(f->cmd, VK_PIPELINE_BIND_POINT_COMPUTE, pipe);
    if (set)
        d->fn.vkCmdBindDescriptorSets(f->cmd, VK_PIPELINE_BIND_POINT_COMPUTE, k->layout, 0, 1, &set,
                                      0, NULL);
    if (k->push_size)
        d->fn.vkCmdPushConstants(f->cmd, k->layout, VK_SHADER_STAGE_COMPUTE_BIT, 0, k->push_size,
                                 push);
    if (!split) {
        d->fn.vkCmdDispatch(f->cmd, l->cube_count[0], l->cube_count[1], l->cube_count[2]);
    } else { /* pieces of at most the device's limit per axis; gl_WorkGroupID counts from 0 */
        const uint32_t *max = lim->maxComputeWorkGroupCount;
        const uint32_t *c = l->cube_count;
        for (uint64_t z = 0; z < c[2]; z += max[2])
            for (uint64_t y = 0; y < c[1]; y += max[1])
                for (uint64_t x = 0; x < c[0]; x += max[0])
                    d->fn.vkCmdDispatchBase(f->cmd, (uint32_t)x, (uint32_t)y, (uint32_t)z,
                                            (uint32_t)EM_MIN(max[0], c[0] - x),
                                            (uint32_t)EM_MIN(max[1], c[1] - y),
                                            (uint32_t)EM_MIN(max[2], c[2] - z));
    }
    f->commands++;
    return em_rt_vk_kick(d);
}

em_status em_rt_vk_launch(void *state, void *fn, const em_drv_launch *l)
{
    em_vk_device *d = state;
    if (!l->cube_count[0] || !l->cube_count[1] || !l->cube_count[2]) return EM_OK;
    pthread_mutex_lock(&d->lock);
    em_status st = launch_locked(d, fn, l);
    pthread_mutex_unlock(&d->lock);
    return st;
}

/* ---- timing ---------------------------------------------------------------------------------- */

typedef struct vk_event {
    int32_t query; /* timestamp query index, or -1 for the host clock */
    double host;   /* host seconds (when query < 0) */
} vk_event;

em_status em_rt_vk_event_record(void *state, void **out)
{
    em_vk_device *d = state;
    vk_event *e = calloc(1, sizeof(*e));
    if (!e) return em_set_error(EM_ERR_NOMEM, "out of memory");
    e->query = -1;
    pthread_mutex_lock(&d->lock);
    for (uint32_t i = 0; i < d->query_count && e->query < 0; i++)
        if (!d->query_used[i]) e->query = (int32_t)i;
    em_status st;
    if (e->query < 0) { /* no timestamps (or all in use): the host clock after a sync */
        st = em_rt_vk_sync_locked(d);
        e->host = em_rt_now();
    } else {
        em_vk_frame *f;
        st = em_rt_vk_frame_begin(d, &f);
        if (st == EM_OK) {
            d->query_used[e->query] = 1;
            d->fn.vkCmdResetQueryPool(f->cmd, d->queries, (uint32_t)e->query, 1);
            d->fn.vkCmdWriteTimestamp(f->cmd, VK_PIPELINE_STAGE_BOTTOM_OF_PIPE_BIT, d->queries,
                                      (uint32_t)e->query);
            f->commands++;
            st = em_rt_vk_kick(d);
        }
    }
    pthread_mutex_unlock(&d->lock);
    if (st != EM_OK) {
        if (e->query >= 0) {
            pthread_mutex_lock(&d->lock);
            d->query_used[e->query] = 0;
            pthread_mutex_unlock(&d->lock);
        }
        free(e);
        return st;
    }
    *out = e;
    return EM_OK;
}

em_status em_rt_vk_event_elapsed(void *state, void *start, void *stop, double *seconds)
{
    em_vk_device *d = state;
    vk_event *a = start, *b = stop;
    pthread_mutex_lock(&d->lock);
    em_status st = em_rt_vk_sync_locked(d);
    if (st == EM_OK && a->query >= 0 && b->query >= 0) {
        uint64_t t[2];
        VkResult r =
            d->fn.vkGetQueryPoolResults(d->device, d->queries, (uint32_t)a->query, 1, 8, &t[0], 8,
                                        VK_QUERY_RESULT_64_BIT | VK_QUERY_RESULT_WAIT_BIT);
        if (r == VK_SUCCESS)
            r = d->fn.vkGetQueryPoolResults(d->device, d->queries, (uint32_t)b->query, 1, 8, &t[1],
                                            8, VK_QUERY_RESULT_64_BIT | VK_QUERY_RESULT_WAIT_BIT);
        if (r != VK_SUCCESS)
            st = em_rt_vk_fail("vkGetQueryPoolResults", r);
        else
            *seconds = (double)((t[1] - t[0]) & d->timestamp_mask) * d->timestamp_ns * 1e-9;
    } else if (st == EM_OK && a->query < 0 && b->query < 0) {
        *seconds = b->host - a->host;
    } else if (st == EM_OK) {
        st = em_set_error(EM_ERR_UNSUPPORTED, "vulkan: cannot time between a timestamp and a "
                                              "host-clock event (too many timers at once)");
    }
    pthread_mutex_unlock(&d->lock);
    return st;
}

void em_rt_vk_event_destroy(void *state, void *event)
{
    em_vk_device *d = state;
    vk_event *e = event;
    if (!e) return;
    if (e->query >= 0) {
        pthread_mutex_lock(&d->lock);
        d->query_used[e->query] = 0;
        pthread_mutex_unlock(&d->lock);
    }
    free(e);
}
