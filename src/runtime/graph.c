/* graph.c — recorded graphs: a device's launches, writes and copies recorded once and replayed as
 * a whole (the API and its rules: ember/runtime.h, docs/graphs.md).
 *
 * While dev->recording is set, launch.c and pool.c hand their driver calls here instead of to the
 * driver: a launch is kept with its resolved arguments (the argument array and each buffer's
 * shape and stride copied), a write with a copy of its bytes, a copy as its two ranges. At
 * em_graph_end a driver with native graphs (CUDA) gets the whole sequence issued between its
 * graph_begin and graph_end and returns one executable graph; otherwise em_graph_launch issues
 * the recorded calls to the driver one by one — still without argument checks, kernel lookups or
 * any tensor-layer work.
 *
 * Memory (with pool.c): every buffer allocated or freed while recording is held by the graph
 * (em_buffer.graph_refs); a buffer freed while recording goes on the graph's own free lists, from
 * which later allocations of the same recording are served first (the replays run the same
 * order, so the reuse is safe), and its return to the pool waits until every graph that holds it
 * is freed. At em_graph_end graph_plan.c moves the recording's temporaries into one arena laid
 * out by their lifetimes and gives their blocks back. */
#include <stdlib.h>
#include <string.h>
#include "runtime/graph_internal.h"

bool em_device_recording(const em_device *dev)
{
    return dev && dev->recording;
}

size_t em_graph_ops(const em_graph *g)
{
    return g ? g->nops : 0;
}

bool em_graph_native(const em_graph *g)
{
    return g && g->native;
}

/* Marks g failed with the current error (the first failure wins). */
static void graph_fail(em_graph *g, em_status st)
{
    if (g->failed != EM_OK)
        return;
    g->failed = st;
    snprintf(g->why, sizeof(g->why), "%s", em_last_error());
}

em_status em_rt_graph_refuse(em_device *dev, const char *what)
{
    em_status st = em_set_error(EM_ERR_INVALID,
                                "device %s is recording a graph: %s waits for the device and "
                                "cannot be recorded",
                                dev->name, what);
    graph_fail(dev->recording, st);
    return st;
}

/* ---- holding buffers (called by pool.c with the pool lock held) ------------------------------ */

void em_rt_graph_hold(em_graph *g, em_buffer *b)
{
    if (b->last_graph == g)
        return;
    if (g->nbufs == g->bufs_cap) {
        size_t cap = g->bufs_cap ? 2 * g->bufs_cap : 64;
        em_buffer **nb = realloc(g->bufs, cap * sizeof(*nb));
        if (!nb) {
            graph_fail(g, em_set_error(EM_ERR_NOMEM, "recording a graph: out of host memory"));
            return; /* not held: the recording fails, so no graph will use it */
        }
        g->bufs = nb;
        g->bufs_cap = cap;
    }
    g->bufs[g->nbufs++] = b;
    b->graph_refs++;
    b->last_graph = g;
}

em_buffer *em_rt_graph_take_free(em_graph *g, unsigned cls)
{
    /* its own size class first, else a block of up to GRAPH_REUSE_CLASSES classes larger (at
     * most twice the size): graph-held memory is not shared with the pool, so a temporary of one
     * class serving a smaller one later keeps the replays' footprint near the recording's peak
     * instead of the sum over classes of each class's peak */
    em_buffer *b = NULL;
    for (unsigned c = cls; c < EM_RT_POOL_CLASSES && c <= cls + GRAPH_REUSE_CLASSES && !b; c++)
        b = g->free_lists[c];
    if (b) {
        g->free_lists[b->cls] = b->next;
        b->user_freed = false;
    }
    return b;
}

void em_rt_graph_put_free(em_graph *g, em_buffer *b)
{
    em_rt_graph_hold(g, b);
    b->user_freed = true;
    if (b->last_graph != g) /* not held (out of memory): nothing may reuse it either */
        return;
    b->prev = NULL;
    b->next = g->free_lists[b->cls];
    g->free_lists[b->cls] = b;
}

void em_rt_graph_note_alloc(em_graph *g, em_buffer *b, bool fresh)
{
    if (g->unplanned)
        return;
    if (g->nlives == g->lives_cap) {
        size_t cap = g->lives_cap ? 2 * g->lives_cap : 256;
        graph_life *nl = realloc(g->lives, cap * sizeof(*nl));
        if (!nl) {
            g->unplanned = true; /* out of host memory: no plan for this graph */
            return;
        }
        g->lives = nl;
        g->lives_cap = cap;
    }
    g->lives[g->nlives] = (graph_life){b, b->mem, b->size, g->nops, GRAPH_LIFE_OPEN, fresh};
    b->graph_life = ++g->nlives;
}

void em_rt_graph_note_free(em_graph *g, em_buffer *b)
{
    if (b->graph_life && b->graph_life <= g->nlives && g->lives[b->graph_life - 1].buf == b)
        g->lives[b->graph_life - 1].end = g->nops;
    b->graph_life = 0;
}

/* Forgets the open allocations' places in g->lives (the recording is over). Pool lock held. */
static void close_lives(em_graph *g)
{
    for (size_t i = 0; i < g->nlives; i++)
        if (g->lives[i].end == GRAPH_LIFE_OPEN && g->lives[i].buf->graph_life == i + 1)
            g->lives[i].buf->graph_life = 0;
}

/* ---- recording ------------------------------------------------------------------------------- */

static graph_op *op_add(em_graph *g)
{
    if (g->nops == g->cap) {
        size_t cap = g->cap ? 2 * g->cap : 64;
        graph_op *no = realloc(g->ops, cap * sizeof(*no));
        if (!no)
            return NULL;
        g->ops = no;
        g->cap = cap;
    }
    graph_op *op = &g->ops[g->nops];
    memset(op, 0, sizeof(*op));
    return op;
}

static void op_free(graph_op *op)
{
    if (op->kind == OP_LAUNCH && op->launch.args) {
        for (size_t i = 0; i < op->launch.nargs; i++)
            free((void *)op->launch.args[i].shape); /* shape and stride share one block */
        free((void *)op->launch.args);
    }
    free(op->bytes);
}

static em_status record_nomem(em_graph *g)
{
    em_status st = em_set_error(EM_ERR_NOMEM, "recording a graph: out of host memory");
    graph_fail(g, st);
    return st;
}

/* EM_OK while the recording may take one more operation; else fails it (EMBER_GRAPH_MAX_OPS:
 * a bound on a graph's size, which also lets tests exercise the callers' eager fallbacks). */
static em_status check_limit(em_graph *g)
{
    if (!g->max_ops || g->nops < g->max_ops)
        return EM_OK;
    em_status st = em_set_error(EM_ERR_INVALID,
                                "recording a graph: more than EMBER_GRAPH_MAX_OPS = %zu operations",
                                g->max_ops);
    graph_fail(g, st);
    return st;
}

em_status em_rt_graph_record_launch(em_graph *g, void *fn, const em_drv_launch *launch)
{
    if (check_limit(g) != EM_OK)
        return g->failed;
    graph_op *op = op_add(g);
    em_drv_arg *args = op ? calloc(launch->nargs ? launch->nargs : 1, sizeof(*args)) : NULL;
    if (!args)
        return record_nomem(g);
    bool ok = true;
    for (size_t i = 0; i < launch->nargs; i++) {
        args[i] = launch->args[i];
        args[i].shape = args[i].stride = NULL;
        uint32_t r = launch->args[i].rank;
        if (launch->args[i].kind != EM_PARAM_BUFFER || !r)
            continue;
        int64_t *dims = malloc(2 * r * sizeof(*dims));
        if (!dims) {
            ok = false;
            break;
        }
        memcpy(dims, launch->args[i].shape, r * sizeof(*dims));
        memcpy(dims + r, launch->args[i].stride, r * sizeof(*dims));
        args[i].shape = dims;
        args[i].stride = dims + r;
    }
    op->kind = OP_LAUNCH;
    op->fn = fn;
    op->launch = *launch;
    op->launch.args = args;
    if (!ok) {
        op_free(op);
        return record_nomem(g);
    }
    g->nops++;
    return EM_OK;
}

em_status em_rt_graph_record_write(em_graph *g, void *mem, size_t offset, const void *src,
                                   size_t bytes)
{
    if (check_limit(g) != EM_OK)
        return g->failed;
    graph_op *op = op_add(g);
    void *copy = op ? malloc(bytes) : NULL;
    if (!copy)
        return record_nomem(g);
    memcpy(copy, src, bytes);
    *op = (graph_op){.kind = OP_WRITE, .mem = mem, .offset = offset, .bytes = copy, .size = bytes};
    g->nops++;
    return EM_OK;
}

em_status em_rt_graph_record_copy(em_graph *g, void *dst, size_t dst_offset, const void *src,
                                  size_t src_offset, size_t bytes)
{
    if (check_limit(g) != EM_OK)
        return g->failed;
    graph_op *op = op_add(g);
    if (!op)
        return record_nomem(g);
    *op = (graph_op){.kind = OP_COPY, .mem = dst, .offset = dst_offset, .src = src,
                     .src_offset = src_offset, .size = bytes};
    g->nops++;
    return EM_OK;
}

/* ---- the API --------------------------------------------------------------------------------- */

em_status em_graph_begin(em_device *dev)
{
    if (!dev)
        return em_set_error(EM_ERR_INVALID, "em_graph_begin: no device");
    if (dev->recording)
        return em_set_error(EM_ERR_INVALID, "em_graph_begin: device %s is already recording",
                            dev->name);
    em_graph *g = calloc(1, sizeof(*g));
    if (!g)
        return em_set_error(EM_ERR_NOMEM, "em_graph_begin: out of host memory");
    g->dev = dev;
    g->first_seq = __atomic_load_n(&dev->launch_seq, __ATOMIC_RELAXED) + 1;
    const char *lim = getenv("EMBER_GRAPH_MAX_OPS");
    g->max_ops = lim && *lim ? (size_t)strtoull(lim, NULL, 10) : 0;
    pthread_mutex_lock(&dev->pool.lock);
    dev->recording = g;
    pthread_mutex_unlock(&dev->pool.lock);
    return EM_OK;
}

/* Issues every recorded op to the driver, in order. */
static em_status issue(em_graph *g)
{
    em_device *dev = g->dev;
    const em_driver *drv = dev->drv;
    em_status st = EM_OK;
    for (size_t i = 0; i < g->nops && st == EM_OK; i++) {
        graph_op *op = &g->ops[i];
        if (op->kind == OP_LAUNCH)
            st = drv->launch(dev->state, op->fn, &op->launch);
        else if (op->kind == OP_WRITE)
            st = drv->write(dev->state, op->mem, op->offset, op->bytes, op->size);
        else
            st = drv->copy(dev->state, op->mem, op->offset, op->src, op->src_offset, op->size);
    }
    return st;
}

em_status em_graph_end(em_device *dev, em_graph **out)
{
    if (out)
        *out = NULL;
    if (!dev || !out)
        return em_set_error(EM_ERR_INVALID, "em_graph_end: no device or no result pointer");
    em_graph *g = dev->recording;
    if (!g)
        return em_set_error(EM_ERR_INVALID, "em_graph_end: device %s is not recording",
                            dev->name);
    pthread_mutex_lock(&dev->pool.lock);
    dev->recording = NULL;
    memset(g->free_lists, 0, sizeof(g->free_lists)); /* the blocks stay in g->bufs */
    close_lives(g);
    pthread_mutex_unlock(&dev->pool.lock);
    if (g->failed != EM_OK) {
        em_status st = g->failed;
        char why[sizeof(g->why)];
        memcpy(why, g->why, sizeof(why));
        em_graph_free(g);
        return em_set_error(st, "em_graph_end: the recording on %s failed: %s", dev->name, why);
    }
    em_rt_graph_plan(g);
    if (dev->drv->graph_begin && g->nops) {
        em_status st = dev->drv->graph_begin(dev->state);
        if (st == EM_OK) {
            em_status si = issue(g);
            st = dev->drv->graph_end(dev->state, &g->native);
            if (si != EM_OK)
                st = si;
        }
        if (st != EM_OK) {
            /* the calls still replay one by one */
            EM_LOGW("device %s: no native graph (%s); the graph replays call by call", dev->name,
                    em_last_error());
            if (g->native)
                dev->drv->graph_free(dev->state, g->native);
            g->native = NULL;
            em_clear_error();
        }
    }
    *out = g;
    return EM_OK;
}

em_status em_graph_launch(em_graph *g)
{
    if (!g)
        return em_set_error(EM_ERR_INVALID, "em_graph_launch: no graph");
    em_device *dev = g->dev;
    if (dev->recording)
        return em_set_error(EM_ERR_INVALID, "em_graph_launch: device %s is recording",
                            dev->name);
    /* what the recorded launches write (numbered from first_seq on) is in flight again */
    uint64_t unsettled = g->first_seq - 1;
    if (__atomic_load_n(&dev->settled, __ATOMIC_RELAXED) > unsettled)
        __atomic_store_n(&dev->settled, unsettled, __ATOMIC_RELAXED);
    em_status st = g->native ? dev->drv->graph_launch(dev->state, g->native) : issue(g);
    if (st != EM_OK)
        em_error_context("graph on %s", dev->name);
    return st;
}

void em_graph_free(em_graph *g)
{
    if (!g)
        return;
    em_device *dev = g->dev;
    if (g->native)
        dev->drv->graph_free(dev->state, g->native);
    for (size_t i = 0; i < g->nops; i++)
        op_free(&g->ops[i]);
    free(g->ops);
    if (g->arena) /* a replay may still run on it */
        (void)dev->drv->sync(dev->state);
    pthread_mutex_lock(&dev->pool.lock);
    if (dev->recording == g) {
        dev->recording = NULL;
        close_lives(g);
    }
    em_rt_graph_arena_free_locked(g);
    for (size_t i = 0; i < g->nbufs; i++) {
        em_buffer *b = g->bufs[i];
        if (b->last_graph == g)
            b->last_graph = NULL;
        if (--b->graph_refs == 0 && b->user_freed) {
            b->user_freed = false;
            dev->pool.stats.bytes_in_graphs -= b->capacity;
            dev->pool.stats.requested_in_graphs -= b->size;
            em_rt_pool_release_locked(dev, b);
        }
    }
    pthread_mutex_unlock(&dev->pool.lock);
    free(g->bufs);
    free(g->lives);
    free(g);
}
