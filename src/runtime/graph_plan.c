/* graph_plan.c — the memory plan of a recorded graph, made at em_graph_end before its ops are
 * issued. While recording, the pool serves a temporary from the blocks the recording freed before
 * (graph.c), but only from its own size class or a few above, so a recording holds about the sum
 * over size classes of each class's peak, more than the most bytes live at once. Here every
 * temporary of the recording — allocated and freed while recording — gets an offset in one arena
 * by its lifetime (the ops between its allocation and its free): largest first, each at the
 * lowest offset no temporary of an overlapping lifetime covers. The recorded ops are rewritten to
 * the arena, and the temporaries' blocks go back to the pool.
 *
 * A block moves only when every use of it in the graph is one of its temporaries: each of its
 * allocations freed while recording, the first taken from the pool (not from the graph's freed
 * blocks, which may hold bytes written before the recording), no other graph holding it, its
 * address never handed out (em_buffer.addr_fixed: tensor maps, collectives), and no recorded op
 * outside its lifetimes naming it (checked before anything is rewritten). The replays run the ops
 * in order on one queue, so two temporaries whose lifetimes do not meet may share bytes, as
 * consecutive eager ops share a block the pool hands out again. Nothing changes when the arena
 * would not be smaller than the blocks it replaces, when host memory or the arena's device memory
 * is short, or with EMBER_GRAPH_PLAN=0. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include "runtime/graph_internal.h"

/* The arena's grain: 256 bytes, or the device's buffer offset alignment where larger (OpenCL
 * passes an offset buffer as a sub-buffer, whose origin NVIDIA's OpenCL wants 512 bytes aligned) */
#define PLAN_ALIGN ((size_t)256)

size_t em_rt_graph_plan_align(const em_caps *caps)
{
    size_t a = caps ? caps->buffer_align : 0;
    return a > PLAN_ALIGN ? (a + PLAN_ALIGN - 1) / PLAN_ALIGN * PLAN_ALIGN : PLAN_ALIGN;
}

/* A temporary to place: its lifetime [begin, end), bytes (aligned) and offset in the arena. */
typedef struct plan_item {
    size_t life; /* index in g->lives */
    size_t begin, end, size, offset;
} plan_item;

/* A block that may move, with its temporaries (items[first .. first + n), by begin). */
typedef struct plan_block {
    uintptr_t mem;
    em_buffer *buf;
    size_t first, n;
} plan_block;

static int by_block_then_begin(const void *x, const void *y)
{
    const plan_item *a = x, *b = y;
    /* items carry their block's mem in `offset` until placed */
    if (a->offset != b->offset)
        return a->offset < b->offset ? -1 : 1;
    return a->begin < b->begin ? -1 : a->begin > b->begin;
}

static int by_size_desc(const void *x, const void *y)
{
    const plan_item *const *a = x, *const *b = y;
    if ((*a)->size != (*b)->size)
        return (*a)->size > (*b)->size ? -1 : 1;
    return (*a)->begin < (*b)->begin ? -1 : (*a)->begin > (*b)->begin;
}

static int by_offset(const void *x, const void *y)
{
    const plan_item *const *a = x, *const *b = y;
    return (*a)->offset < (*b)->offset ? -1 : (*a)->offset > (*b)->offset;
}

/* Places items by size, largest first, each at the lowest offset free over its lifetime; returns
 * the arena's bytes, or 0 when host memory is short. */
static size_t place(plan_item *items, size_t n)
{
    plan_item **order = malloc(n * sizeof(*order)), **meet = malloc(n * sizeof(*meet));
    if (!order || !meet) {
        free(order);
        free(meet);
        return 0;
    }
    for (size_t i = 0; i < n; i++)
        order[i] = &items[i];
    qsort(order, n, sizeof(*order), by_size_desc);
    size_t arena = 0;
    for (size_t i = 0; i < n; i++) {
        plan_item *it = order[i];
        size_t nm = 0;
        for (size_t j = 0; j < i; j++)
            if (order[j]->begin < it->end && it->begin < order[j]->end)
                meet[nm++] = order[j];
        qsort(meet, nm, sizeof(*meet), by_offset);
        size_t at = 0;
        for (size_t j = 0; j < nm && meet[j]->offset < at + it->size; j++)
            if (meet[j]->offset + meet[j]->size > at)
                at = meet[j]->offset + meet[j]->size;
        it->offset = at;
        if (at + it->size > arena)
            arena = at + it->size;
    }
    free(order);
    free(meet);
    return arena;
}

/* The block named mem among blocks[0, nb) (sorted by mem), or NULL. */
static const plan_block *find_block(const plan_block *blocks, size_t nb, const void *mem)
{
    size_t lo = 0, hi = nb;
    while (lo < hi) {
        size_t mid = (lo + hi) / 2;
        if (blocks[mid].mem < (uintptr_t)mem)
            lo = mid + 1;
        else
            hi = mid;
    }
    return lo < nb && blocks[lo].mem == (uintptr_t)mem ? &blocks[lo] : NULL;
}

/* Op i's reference (*mem, *offset): unchanged when it names no moving block; moved to the arena
 * (apply) or only checked. false when it names a moving block outside its temporaries. */
static bool remap(const plan_block *blocks, size_t nb, const plan_item *items, size_t i,
                  void *arena, void **mem, size_t *offset, bool apply)
{
    const plan_block *b = find_block(blocks, nb, *mem);
    if (!b)
        return true;
    const plan_item *it = NULL;
    for (size_t k = b->first; k < b->first + b->n && items[k].begin <= i; k++)
        it = &items[k];
    if (!it || i >= it->end)
        return false;
    if (apply) {
        *mem = arena;
        *offset += it->offset;
    }
    return true;
}

/* Every op's references remapped (apply) or checked; false at the first that cannot be. */
static bool remap_ops(em_graph *g, const plan_block *blocks, size_t nb, const plan_item *items,
                      void *arena, bool apply)
{
    for (size_t i = 0; i < g->nops; i++) {
        graph_op *op = &g->ops[i];
        if (op->kind == OP_LAUNCH) {
            em_drv_arg *args = (em_drv_arg *)op->launch.args;
            for (size_t a = 0; a < op->launch.nargs; a++)
                if (args[a].kind == EM_PARAM_BUFFER &&
                    !remap(blocks, nb, items, i, arena, &args[a].mem, &args[a].offset, apply))
                    return false;
            continue;
        }
        if (!remap(blocks, nb, items, i, arena, &op->mem, &op->offset, apply))
            return false;
        if (op->kind == OP_COPY) {
            void *src = (void *)op->src;
            if (!remap(blocks, nb, items, i, arena, &src, &op->src_offset, apply))
                return false;
            op->src = src;
        }
    }
    return true;
}

/* Whether the block of items[i0 .. i1) (one block's temporaries by begin) may move. */
static bool movable(const em_graph *g, const plan_item *items, size_t i0, size_t i1)
{
    const graph_life *first = &g->lives[items[i0].life];
    const em_buffer *b = first->buf;
    if (!first->fresh || b->addr_fixed || b->graph_refs != 1 || !b->user_freed ||
        b->last_graph != g)
        return false;
    for (size_t k = i0; k < i1; k++)
        if (g->lives[items[k].life].end == GRAPH_LIFE_OPEN)
            return false;
    return true;
}

/* Hands the moved blocks back to the pool and counts the arena as the graph's. */
static void release(em_graph *g, const plan_block *blocks, size_t nb)
{
    em_device *dev = g->dev;
    em_rt_pool *pool = &dev->pool;
    pthread_mutex_lock(&pool->lock);
    size_t keep = 0;
    for (size_t i = 0; i < g->nbufs; i++) {
        em_buffer *b = g->bufs[i];
        if (!find_block(blocks, nb, b->mem)) {
            g->bufs[keep++] = b;
            continue;
        }
        b->graph_refs--;
        b->last_graph = NULL;
        b->user_freed = false;
        pool->stats.bytes_in_graphs -= b->capacity;
        pool->stats.requested_in_graphs -= b->size;
        em_rt_pool_release_locked(dev, b);
    }
    g->nbufs = keep;
    pool->stats.bytes_in_graphs += g->arena_size;
    pool->stats.requested_in_graphs += g->arena_size;
    pthread_mutex_unlock(&pool->lock);
}

void em_rt_graph_plan(em_graph *g)
{
    const char *env = getenv("EMBER_GRAPH_PLAN");
    if ((env && !strcmp(env, "0")) || g->unplanned || !g->nlives || !g->nops)
        return;
    size_t n = g->nlives, align = em_rt_graph_plan_align(em_device_caps(g->dev));
    plan_item *items = malloc(n * sizeof(*items));
    plan_block *blocks = malloc(n * sizeof(*blocks));
    if (!items || !blocks)
        goto done;
    for (size_t i = 0; i < n; i++)
        items[i] = (plan_item){i, g->lives[i].begin, g->lives[i].end, 0,
                               (size_t)(uintptr_t)g->lives[i].mem};
    qsort(items, n, sizeof(*items), by_block_then_begin);
    /* keep the temporaries of the blocks that may move, grouped by block */
    size_t m = 0, nb = 0, released = 0;
    for (size_t i0 = 0, i1; i0 < n; i0 = i1) {
        for (i1 = i0 + 1; i1 < n && items[i1].offset == items[i0].offset;)
            i1++;
        if (!movable(g, items, i0, i1))
            continue;
        em_buffer *b = g->lives[items[i0].life].buf;
        blocks[nb++] = (plan_block){(uintptr_t)b->mem, b, m, i1 - i0};
        released += b->capacity;
        for (size_t k = i0; k < i1; k++) {
            plan_item it = items[k];
            size_t bytes = g->lives[it.life].size;
            it.size = bytes < align ? align : (bytes + align - 1) / align * align;
            items[m++] = it;
        }
    }
    if (!nb || !remap_ops(g, blocks, nb, items, NULL, false))
        goto done;
    /* place a copy (placing reorders nothing, but keep items by block for remap) */
    size_t arena = place(items, m);
    if (!arena || arena >= released)
        goto done;
    em_device *dev = g->dev;
    void *mem = NULL;
    if (dev->drv->alloc(dev->state, arena, &mem) != EM_OK) {
        EM_LOGD("device %s: no arena of %zu bytes for a graph's temporaries: %s", dev->name,
                arena, em_last_error());
        em_clear_error();
        goto done;
    }
    remap_ops(g, blocks, nb, items, mem, true);
    g->arena = mem;
    g->arena_size = arena;
    EM_LOGD("device %s: a graph's %zu temporaries in an arena of %zu bytes (their %zu blocks "
            "held %zu)",
            dev->name, m, arena, nb, released);
    release(g, blocks, nb);
done:
    free(items);
    free(blocks);
}

void em_rt_graph_arena_free_locked(em_graph *g)
{
    if (!g->arena)
        return;
    em_device *dev = g->dev;
    dev->drv->free(dev->state, g->arena, g->arena_size);
    dev->pool.stats.bytes_in_graphs -= g->arena_size;
    dev->pool.stats.requested_in_graphs -= g->arena_size;
    g->arena = NULL;
    g->arena_size = 0;
}
