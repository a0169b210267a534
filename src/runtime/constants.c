/* constants.c — em_device_constant: small, content-addressed blocks of device memory that kernels
 * read as launch-time constants (a TMA matmul's two tensor maps, 256 bytes); and
 * em_device_counters, the device's block of zero counters for last-cube reductions. A launch's
 * constants used to be a pool allocation and a host-to-device write per launch, the write queued in
 * front of the kernel; the same bytes now find the copy written for an earlier launch.
 *
 * The device keeps EM_RT_CONST_SLOTS slots of EM_RT_CONST_BYTES in one buffer, with a host copy of
 * each slot's bytes to compare. A miss writes the next slot round-robin: the write is queued
 * after every launch issued before it, so a launch still to read the slot's old bytes reads them
 * first. A graph's launches could be replayed after the slot is rewritten, so while recording the
 * call refuses (the caller allocates its own). Freed with the device. */
#include <string.h>

#include "runtime/rt.h"

/* FNV-1a over n bytes. */
static uint64_t fnv1a(const void *data, size_t n)
{
    const unsigned char *p = data;
    uint64_t h = 0xcbf29ce484222325ull;
    for (size_t i = 0; i < n; i++) h = (h ^ p[i]) * 0x100000001b3ull;
    return h;
}

em_status em_device_constant(em_device *dev, const void *data, size_t n, em_buffer **buf,
                             size_t *offset)
{
    if (!dev || !data || !buf || !offset || !n)
        return em_set_error(EM_ERR_INVALID, "em_device_constant: NULL argument or no bytes");
    if (n > EM_RT_CONST_BYTES)
        return em_set_error(EM_ERR_INVALID, "em_device_constant: %zu bytes (at most %d)", n,
                            EM_RT_CONST_BYTES);
    if (dev->recording)
        return em_set_error(EM_ERR_INVALID,
                            "em_device_constant: device %s is recording a graph (a replay may "
                            "outlive the slot)",
                            dev->name);
    em_rt_constants *c = &dev->consts;
    em_status st = EM_OK;
    pthread_mutex_lock(&c->lock);
    if (!c->buf) c->buf = em_buffer_alloc(dev, (size_t)EM_RT_CONST_SLOTS * EM_RT_CONST_BYTES);
    if (!c->buf) {
        st = em_error_context("em_device_constant");
    } else {
        int hit = -1;
        uint64_t h = fnv1a(data, n);
        for (int i = 0; i < c->used && hit < 0; i++)
            if (c->hash[i] == h && c->len[i] == n && !memcmp(c->bytes[i], data, n)) hit = i;
        if (hit < 0) {
            hit = c->next;
            c->next = (c->next + 1) % EM_RT_CONST_SLOTS;
            if (c->used < EM_RT_CONST_SLOTS) c->used++;
            c->len[hit] = 0; /* invalid until written */
            st = em_buffer_write(c->buf, (size_t)hit * EM_RT_CONST_BYTES, data, n);
            if (st == EM_OK) {
                memcpy(c->bytes[hit], data, n);
                c->len[hit] = n;
                c->hash[hit] = h;
            }
        }
        if (st == EM_OK) {
            *buf = c->buf;
            *offset = (size_t)hit * EM_RT_CONST_BYTES;
        }
    }
    pthread_mutex_unlock(&c->lock);
    return st;
}

em_status em_device_counters(em_device *dev, em_buffer **buf)
{
    if (!dev || !buf) return em_set_error(EM_ERR_INVALID, "em_device_counters: NULL argument");
    em_rt_constants *c = &dev->consts;
    em_status st = EM_OK;
    pthread_mutex_lock(&c->lock);
    if (!c->counters && dev->recording) {
        st = em_set_error(EM_ERR_INVALID,
                          "em_device_counters: device %s is recording a graph (the block would "
                          "be made zero inside it)",
                          dev->name);
    } else if (!c->counters) {
        em_buffer *b = em_buffer_alloc(dev, (size_t)EM_DEVICE_COUNTERS * sizeof(uint32_t));
        if (!b || em_buffer_fill_zero(b) != EM_OK) {
            em_buffer_free(b);
            st = em_error_context("em_device_counters");
        } else {
            c->counters = b;
        }
    }
    if (st == EM_OK) *buf = c->counters;
    pthread_mutex_unlock(&c->lock);
    return st;
}

void em_rt_constants_destroy(em_device *dev)
{
    em_buffer_free(dev->consts.buf);
    em_buffer_free(dev->consts.counters);
    dev->consts.counters = NULL;
    dev->consts.buf = NULL;
    pthread_mutex_destroy(&dev->consts.lock);
}
