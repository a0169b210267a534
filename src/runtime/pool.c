/* pool.c — each device's memory pool and the buffer API on top of it.
 *
 * A request is rounded up to a size class (256 bytes, then four classes per power of two, so at
 * most a quarter is wasted). Freed blocks stay in a per-class free list and serve the next request
 * of that class without a driver call. When the driver reports out-of-memory, the pool hands every
 * cached block back to the driver and tries once more; only then does the allocation fail, with
 * EM_ERR_NOMEM. One mutex per pool guards the lists and the statistics. Byte counts in the
 * statistics are block sizes (what the device really holds), not the sizes asked for. The
 * profiler (profile.c) counts allocations, frees and copies while it is on. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "runtime/rt.h"

_Static_assert(sizeof(size_t) == 8, "the size classes assume a 64-bit size_t");

bool em_rt_size_class(size_t bytes, unsigned *cls, size_t *capacity)
{
    if (bytes <= EM_RT_POOL_MIN_BLOCK) {
        *cls = 0;
        *capacity = EM_RT_POOL_MIN_BLOCK;
        return true;
    }
    if (bytes > ((size_t)1 << 62))
        return false;
    unsigned k = 63u - (unsigned)__builtin_clzll((unsigned long long)(bytes - 1)); /* 2^k < bytes */
    size_t step = (size_t)1 << (k - 2);
    size_t cap = (bytes + step - 1) / step * step; /* 1.25, 1.5, 1.75 or 2 times 2^k */
    *cls = (k - 8) * 4 + (unsigned)(cap / step) - 4;
    *capacity = cap;
    return true;
}

void em_rt_pool_init(em_rt_pool *pool)
{
    memset(pool, 0, sizeof(*pool));
    pthread_mutex_init(&pool->lock, NULL);
    /* Like PyTorch's caching allocator, keep every freed block (up to the peak in use) until an
     * allocation runs out of memory or the pool is trimmed; $EMBER_POOL_MAX_CACHED (bytes) caps
     * the idle bytes kept instead. */
    const char *cap = getenv("EMBER_POOL_MAX_CACHED");
    pool->max_cached = cap && *cap ? strtoull(cap, NULL, 10) : 0;
}

/* Gives every cached block back to the driver. Called with the lock held. */
static void trim_locked(em_device *dev)
{
    em_rt_pool *pool = &dev->pool;
    for (unsigned c = 0; c < EM_RT_POOL_CLASSES; c++) {
        while (pool->free_lists[c]) {
            em_buffer *b = pool->free_lists[c];
            pool->free_lists[c] = b->next;
            dev->drv->free(dev->state, b->mem, b->capacity);
            free(b);
        }
    }
    pool->stats.bytes_cached = 0;
}

size_t em_rt_pool_destroy(em_device *dev)
{
    em_rt_pool *pool = &dev->pool;
    size_t live = 0;
    pthread_mutex_lock(&pool->lock);
    trim_locked(dev);
    while (pool->live) {
        em_buffer *b = pool->live;
        pool->live = b->next;
        dev->drv->free(dev->state, b->mem, b->capacity);
        free(b);
        live++;
    }
    pthread_mutex_unlock(&pool->lock);
    return live;
}

/* A block for class cls: from the free list, else from the driver (emptying the cache and trying
 * again when the driver is out of memory). Called with the lock held. */
static em_buffer *take_block(em_device *dev, unsigned cls, size_t cap)
{
    em_rt_pool *pool = &dev->pool;
    em_buffer *b = pool->free_lists[cls];
    if (b) {
        pool->free_lists[cls] = b->next;
        pool->stats.bytes_cached -= cap;
        pool->stats.reuses++;
        return b;
    }
    b = calloc(1, sizeof(*b));
    if (!b) {
        em_set_error(EM_ERR_NOMEM, "out of host memory for a buffer descriptor");
        return NULL;
    }
    void *mem = NULL;
    em_status st = dev->drv->alloc(dev->state, cap, &mem);
    if (st == EM_ERR_NOMEM && pool->stats.bytes_cached > 0) {
        uint64_t cached = pool->stats.bytes_cached;
        trim_locked(dev);
        pool->stats.oom_retries++;
        EM_LOGI("device %s: out of memory for %zu bytes; released %llu cached bytes and retrying",
                dev->name, cap, (unsigned long long)cached);
        st = dev->drv->alloc(dev->state, cap, &mem);
    }
    if (st != EM_OK) {
        free(b);
        if (st == EM_ERR_NOMEM)
            em_set_error(EM_ERR_NOMEM,
                         "device %s: out of memory allocating %zu bytes (%llu bytes in use, "
                         "%llu cached)",
                         dev->name, cap, (unsigned long long)pool->stats.bytes_in_use,
                         (unsigned long long)pool->stats.bytes_cached);
        else
            em_error_context("device %s: allocating %zu bytes", dev->name, cap);
        return NULL;
    }
    b->mem = mem;
    b->capacity = cap;
    b->cls = cls;
    b->dev = dev;
    pool->stats.device_allocs++;
    if (em_rt_profiling())
        em_rt_profile_count(EM_RT_PROF_DEVICE_ALLOC, cap);
    return b;
}

/* Records the sizes of the largest live buffers (at a new peak). Called with the lock held. */
static void largest_locked(em_rt_pool *pool)
{
    uint64_t *top = pool->stats.peak_largest;
    const size_t n = EM_ARRAY_LEN(pool->stats.peak_largest);
    memset(top, 0, n * sizeof(*top));
    for (const em_buffer *b = pool->live; b; b = b->next) {
        if (b->size <= top[n - 1])
            continue;
        size_t i = n - 1;
        while (i > 0 && top[i - 1] < b->size) {
            top[i] = top[i - 1];
            i--;
        }
        top[i] = b->size;
    }
}

em_buffer *em_buffer_alloc(em_device *dev, size_t bytes)
{
    if (!dev) {
        em_set_error(EM_ERR_INVALID, "em_buffer_alloc: no device");
        return NULL;
    }
    unsigned cls;
    size_t cap;
    if (!em_rt_size_class(bytes, &cls, &cap)) {
        em_set_error(EM_ERR_NOMEM, "device %s: cannot allocate %zu bytes (too large)", dev->name,
                     bytes);
        return NULL;
    }
    em_rt_pool *pool = &dev->pool;
    pthread_mutex_lock(&pool->lock);
    em_graph *g = dev->recording;
    em_buffer *b = g ? em_rt_graph_take_free(g, cls) : NULL;
    if (b) {
        pool->stats.bytes_in_graphs -= b->capacity; /* the graph's again in use */
        pool->stats.requested_in_graphs -= b->size;
    }
    bool fresh = !b;
    if (!b) {
        b = take_block(dev, cls, cap);
        if (b && g)
            em_rt_graph_hold(g, b); /* the replays use it: it stays the graph's */
    }
    if (b && g) {
        b->size = bytes;
        em_rt_graph_note_alloc(g, b, fresh);
    }
    if (b) {
        cap = b->capacity; /* a graph's block may be of a larger class */
        unsigned k = 63u - (unsigned)__builtin_clzll((unsigned long long)cap);
        pool->live_count[k]++;
        pool->live_bytes[k] += cap;
        b->size = bytes;
        b->prev = NULL;
        b->next = pool->live;
        if (pool->live)
            pool->live->prev = b;
        pool->live = b;
        pool->stats.allocs++;
        pool->stats.bytes_in_use += cap;
        pool->stats.requested_in_use += bytes;
        uint64_t asked = pool->stats.requested_in_use + pool->stats.requested_in_graphs;
        if (asked > pool->stats.peak_requested)
            pool->stats.peak_requested = asked;
        uint64_t held = pool->stats.bytes_in_use + pool->stats.bytes_in_graphs;
        if (held > pool->stats.peak_in_use) {
            pool->stats.peak_in_use = held;
            memcpy(pool->peak_count, pool->live_count, sizeof(pool->peak_count));
            memcpy(pool->peak_bytes, pool->live_bytes, sizeof(pool->peak_bytes));
            pool->peak_pending = true;
            largest_locked(pool);
        }
    }
    pthread_mutex_unlock(&pool->lock);
    if (b && em_rt_profiling())
        em_rt_profile_count(EM_RT_PROF_ALLOC, cap);
    return b;
}

void em_buffer_free(em_buffer *buf)
{
    if (!buf)
        return;
    if (em_rt_profiling())
        em_rt_profile_count(EM_RT_PROF_FREE, buf->capacity);
    em_device *dev = buf->dev;
    em_rt_pool *pool = &dev->pool;
    pthread_mutex_lock(&pool->lock);
    if (buf->prev)
        buf->prev->next = buf->next;
    else
        pool->live = buf->next;
    if (buf->next)
        buf->next->prev = buf->prev;
    pool->stats.frees++;
    pool->stats.bytes_in_use -= buf->capacity;
    pool->stats.requested_in_use -= buf->size;
    unsigned k = 63u - (unsigned)__builtin_clzll((unsigned long long)buf->capacity);
    pool->live_count[k]--;
    pool->live_bytes[k] -= buf->capacity;
    if (dev->recording) {
        em_rt_graph_note_free(dev->recording, buf);
        em_rt_graph_put_free(dev->recording, buf); /* reused by this recording only */
        pool->stats.bytes_in_graphs += buf->capacity;
        pool->stats.requested_in_graphs += buf->size;
    } else if (buf->graph_refs > 0) {
        buf->user_freed = true; /* graph.c returns it when its last graph is freed */
        pool->stats.bytes_in_graphs += buf->capacity;
        pool->stats.requested_in_graphs += buf->size;
    } else
        em_rt_pool_release_locked(dev, buf);
    pthread_mutex_unlock(&pool->lock);
}

void em_rt_pool_release_locked(em_device *dev, em_buffer *buf)
{
    em_rt_pool *pool = &dev->pool;
    buf->addr_fixed = false; /* nobody holds it: whatever held its address is gone */
    if (pool->max_cached && pool->stats.bytes_cached + buf->capacity > pool->max_cached) {
        dev->drv->free(dev->state, buf->mem, buf->capacity);
        free(buf);
    } else {
        buf->prev = NULL;
        buf->next = pool->free_lists[buf->cls];
        pool->free_lists[buf->cls] = buf;
        pool->stats.bytes_cached += buf->capacity;
    }
}

void em_device_pool_stats(const em_device *dev, em_pool_stats *out)
{
    if (!out)
        return;
    memset(out, 0, sizeof(*out));
    if (!dev)
        return;
    em_rt_pool *pool = (em_rt_pool *)&dev->pool;
    pthread_mutex_lock(&pool->lock);
    *out = pool->stats;
    pthread_mutex_unlock(&pool->lock);
}

void em_device_pool_reset_peak(em_device *dev)
{
    if (!dev)
        return;
    em_rt_pool *pool = &dev->pool;
    pthread_mutex_lock(&pool->lock);
    pool->stats.peak_in_use = pool->stats.bytes_in_use + pool->stats.bytes_in_graphs;
    pool->stats.peak_requested = pool->stats.requested_in_use + pool->stats.requested_in_graphs;
    memcpy(pool->peak_count, pool->live_count, sizeof(pool->peak_count));
    memcpy(pool->peak_bytes, pool->live_bytes, sizeof(pool->peak_bytes));
    pool->stats.peak_kernel[0] = '\0';
    pool->stats.peak_launch = 0;
    __atomic_store_n(&pool->launches, 0, __ATOMIC_RELAXED);
    pool->peak_pending = true;
    pthread_mutex_unlock(&pool->lock);
}

void em_rt_pool_note_launch(em_device *dev, const char *kernel)
{
    em_rt_pool *pool = &dev->pool;
    uint64_t n = __atomic_fetch_add(&pool->launches, 1, __ATOMIC_RELAXED);
    if (!__atomic_load_n(&pool->peak_pending, __ATOMIC_RELAXED))
        return;
    pthread_mutex_lock(&pool->lock);
    if (pool->peak_pending) {
        snprintf(pool->stats.peak_kernel, sizeof(pool->stats.peak_kernel), "%s", kernel);
        pool->stats.peak_launch = n;
        pool->peak_pending = false;
    }
    pthread_mutex_unlock(&pool->lock);
}

size_t em_device_pool_peak_buckets(const em_device *dev, em_pool_bucket *out, size_t max)
{
    if (!dev || !out)
        return 0;
    em_rt_pool *pool = (em_rt_pool *)&dev->pool;
    size_t n = 0;
    pthread_mutex_lock(&pool->lock);
    for (int k = 63; k >= 0 && n < max; k--)
        if (pool->peak_count[k])
            out[n++] = (em_pool_bucket){(uint64_t)1 << k, pool->peak_count[k], pool->peak_bytes[k]};
    pthread_mutex_unlock(&pool->lock);
    return n;
}

void em_device_pool_trim(em_device *dev)
{
    if (!dev)
        return;
    pthread_mutex_lock(&dev->pool.lock);
    trim_locked(dev);
    pthread_mutex_unlock(&dev->pool.lock);
}

size_t em_buffer_size(const em_buffer *buf)
{
    return buf ? buf->size : 0;
}

bool em_buffer_settled(const em_buffer *buf)
{
    return buf && __atomic_load_n(&buf->written, __ATOMIC_RELAXED) <=
                      __atomic_load_n(&buf->dev->settled, __ATOMIC_RELAXED);
}

em_device *em_buffer_device(const em_buffer *buf)
{
    return buf ? buf->dev : NULL;
}

/* ---- transfers ------------------------------------------------------------------------------- */

static bool in_range(size_t offset, size_t bytes, size_t size)
{
    return offset <= size && bytes <= size - offset;
}

static em_status range_error(const char *fn, const em_buffer *buf, size_t offset, size_t bytes)
{
    return em_set_error(EM_ERR_INVALID,
                        "%s: bytes [%zu, %zu + %zu) are outside the buffer of %zu bytes on %s", fn,
                        offset, offset, bytes, buf->size, buf->dev->name);
}

em_status em_buffer_write(em_buffer *buf, size_t offset, const void *src, size_t bytes)
{
    if (!buf || (!src && bytes))
        return em_set_error(EM_ERR_INVALID, "em_buffer_write: no buffer or no source");
    if (!in_range(offset, bytes, buf->size))
        return range_error("em_buffer_write", buf, offset, bytes);
    if (!bytes)
        return EM_OK;
    if (buf->dev->recording)
        return em_rt_graph_record_write(buf->dev->recording, buf->mem, offset, src, bytes);
    if (em_rt_profiling())
        em_rt_profile_count(EM_RT_PROF_WRITE, bytes);
    em_status st = buf->dev->drv->write(buf->dev->state, buf->mem, offset, src, bytes);
    return st == EM_OK ? st : em_error_context("device %s: buffer write", buf->dev->name);
}

em_status em_buffer_read(const em_buffer *buf, size_t offset, void *dst, size_t bytes)
{
    if (!buf || (!dst && bytes))
        return em_set_error(EM_ERR_INVALID, "em_buffer_read: no buffer or no destination");
    if (!in_range(offset, bytes, buf->size))
        return range_error("em_buffer_read", buf, offset, bytes);
    if (!bytes)
        return EM_OK;
    if (buf->dev->recording)
        return em_rt_graph_refuse(buf->dev, "a read (em_buffer_read)");
    if (em_rt_profiling())
        em_rt_profile_count(EM_RT_PROF_READ, bytes);
    /* the read waits for the device's queue before it: what was launched so far has completed */
    uint64_t seq = __atomic_load_n(&buf->dev->launch_seq, __ATOMIC_RELAXED);
    em_status st = buf->dev->drv->read(buf->dev->state, buf->mem, offset, dst, bytes);
    if (st == EM_OK) em_rt_settle(buf->dev, seq);
    return st == EM_OK ? st : em_error_context("device %s: buffer read", buf->dev->name);
}

#define STAGING_CHUNK ((size_t)16 << 20)

em_status em_buffer_copy(em_buffer *dst, size_t dst_offset, const em_buffer *src, size_t src_offset,
                         size_t bytes)
{
    if (!dst || !src)
        return em_set_error(EM_ERR_INVALID, "em_buffer_copy: no source or destination buffer");
    if (!in_range(dst_offset, bytes, dst->size))
        return range_error("em_buffer_copy (destination)", dst, dst_offset, bytes);
    if (!in_range(src_offset, bytes, src->size))
        return range_error("em_buffer_copy (source)", src, src_offset, bytes);
    if (!bytes)
        return EM_OK;
    if (dst->dev == src->dev && dst->dev->recording)
        return em_rt_graph_record_copy(dst->dev->recording, dst->mem, dst_offset, src->mem,
                                       src_offset, bytes);
    if (src->dev->recording || dst->dev->recording)
        return em_rt_graph_refuse(src->dev->recording ? src->dev : dst->dev,
                                  "a copy between devices");
    if (em_rt_profiling())
        em_rt_profile_count(EM_RT_PROF_COPY, bytes);
    if (dst->dev == src->dev) {
        em_status st = dst->dev->drv->copy(dst->dev->state, dst->mem, dst_offset, src->mem,
                                           src_offset, bytes);
        return st == EM_OK ? st : em_error_context("device %s: buffer copy", dst->dev->name);
    }
    /* Between devices: through host memory, a chunk at a time. */
    size_t chunk = EM_MIN(bytes, STAGING_CHUNK);
    void *staging = malloc(chunk);
    if (!staging)
        return em_set_error(EM_ERR_NOMEM, "em_buffer_copy: out of host memory for staging");
    em_status st = EM_OK;
    for (size_t done = 0; done < bytes && st == EM_OK; done += chunk) {
        size_t n = EM_MIN(chunk, bytes - done);
        st = em_buffer_read(src, src_offset + done, staging, n);
        if (st == EM_OK)
            st = em_buffer_write(dst, dst_offset + done, staging, n);
    }
    free(staging);
    return st;
}

em_status em_buffer_fill_zero(em_buffer *buf)
{
    if (!buf)
        return em_set_error(EM_ERR_INVALID, "em_buffer_fill_zero: no buffer");
    size_t chunk = EM_MIN(buf->size, (size_t)1 << 20);
    if (!chunk)
        return EM_OK;
    void *zeros = calloc(1, chunk);
    if (!zeros)
        return em_set_error(EM_ERR_NOMEM, "em_buffer_fill_zero: out of host memory");
    em_status st = EM_OK;
    for (size_t done = 0; done < buf->size && st == EM_OK; done += chunk)
        st = em_buffer_write(buf, done, zeros, EM_MIN(chunk, buf->size - done));
    free(zeros);
    return st;
}
