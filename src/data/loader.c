/* loader.c — the memory-mapped data loader. It maps a set of token shards and cuts them into
 * samples of T+1 tokens (sample k of a shard starts at token k*T), so a batch is B samples with
 * inputs = tokens[0, T) and targets = tokens[1, T+1) of each. An epoch visits every sample once, in
 * order or in a permutation drawn from (seed, epoch); batch s of rank r takes the epoch's samples
 * [(s * world + r) * B, + B), so ranks never overlap and every rank sees the same number of
 * batches. The position (epoch, step) is all the state there is, so a run resumes exactly.
 *
 * With prefetch on, a background thread fills a ring of batches ahead of the consumer; a seek
 * bumps a generation number, so batches filled for the old position are thrown away. Only the
 * thread that fills batches touches the permutation. */
#include <glob.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "data/loader_internal.h"

/* ---- the sample plan ----------------------------------------------------------------------------
 */

static uint64_t mix64(uint64_t z)
{
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

/* The permutation of every sample for `epoch` (Fisher–Yates over a splitmix64 stream). */
static void shuffle_epoch(em_loader *l, uint64_t epoch)
{
    uint64_t n = l->nsamples;
    for (uint64_t i = 0; i < n; i++) l->perm[i] = i;
    uint64_t state =
        mix64(l->o.seed ^ 0x6a09e667f3bcc909ull) ^ mix64(epoch + 0x3c6ef372fe94f82bull);
    for (uint64_t i = n - 1; i > 0; i--) {
        state += 0x9e3779b97f4a7c15ull;
        uint64_t r = mix64(state);
        uint64_t j = (uint64_t)(((unsigned __int128)r * (i + 1)) >> 64);
        uint64_t tmp = l->perm[i];
        l->perm[i] = l->perm[j];
        l->perm[j] = tmp;
    }
    l->perm_epoch = epoch;
}

void loader_fill(em_loader *l, em_loader_pos pos, int32_t *inputs, int32_t *targets)
{
    if (l->perm && l->perm_epoch != pos.epoch) shuffle_epoch(l, pos.epoch);
    size_t B = (size_t)l->o.batch, T = (size_t)l->o.seq;
    uint64_t world = (uint64_t)l->o.world, rank = (uint64_t)l->o.rank;
    for (size_t b = 0; b < B; b++) {
        uint64_t g = (pos.step * world + rank) * B + b;
        uint64_t sample = l->perm ? l->perm[g] : g;
        /* the shard holding it: the last with first[s] <= sample */
        size_t lo = 0, hi = l->nshards;
        while (hi - lo > 1) {
            size_t mid = (lo + hi) / 2;
            if (l->first[mid] <= sample)
                lo = mid;
            else
                hi = mid;
        }
        const em_shard *sh = &l->shards[lo];
        size_t start = (size_t)(sample - l->first[lo]) * T;
        int32_t *in = inputs + b * T, *tg = targets + b * T;
        if (sh->version == EM_SHARD_VERSION_U16) {
            const uint16_t *tok = (const uint16_t *)sh->tokens + start;
            for (size_t j = 0; j < T; j++) {
                in[j] = tok[j];
                tg[j] = tok[j + 1];
            }
        } else {
            const uint32_t *tok = (const uint32_t *)sh->tokens + start;
            for (size_t j = 0; j < T; j++) {
                in[j] = (int32_t)tok[j];
                tg[j] = (int32_t)tok[j + 1];
            }
        }
    }
}

static em_loader_pos advance(const em_loader *l, em_loader_pos p)
{
    if (++p.step >= l->per_epoch) {
        p.step = 0;
        p.epoch++;
    }
    return p;
}

static bool same_pos(em_loader_pos a, em_loader_pos b)
{
    return a.epoch == b.epoch && a.step == b.step;
}

/* ---- prefetch thread ----------------------------------------------------------------------------
 */

static void *prefetch_main(void *arg)
{
    em_loader *l = arg;
    pthread_mutex_lock(&l->mu);
    for (;;) {
        int free_slot = -1;
        while (!l->stop) {
            for (int i = 0; i < LOADER_RING && free_slot < 0; i++)
                if (l->ring[i].state == SLOT_FREE) free_slot = i;
            if (free_slot >= 0) break;
            pthread_cond_wait(&l->cv, &l->mu);
        }
        if (l->stop) break;
        loader_slot *s = &l->ring[free_slot];
        s->state = SLOT_FILLING;
        em_loader_pos pos = l->prod_pos;
        uint64_t gen = l->gen;
        pthread_mutex_unlock(&l->mu);
        loader_fill(l, pos, s->inputs, s->targets);
        pthread_mutex_lock(&l->mu);
        if (gen == l->gen) {
            s->pos = pos;
            s->state = SLOT_READY;
            l->prod_pos = advance(l, pos);
        } else {
            s->state = SLOT_FREE; /* a seek happened meanwhile */
        }
        pthread_cond_broadcast(&l->cv);
    }
    pthread_mutex_unlock(&l->mu);
    return NULL;
}

/* ---- opening ------------------------------------------------------------------------------------
 */

static bool is_dir(const char *p)
{
    struct stat st;
    return stat(p, &st) == 0 && S_ISDIR(st.st_mode);
}

/* The shard paths named by path (file, directory of *.bin, or glob), sorted. */
static em_status find_shards(const char *path, glob_t *g)
{
    char pattern[4096];
    if (is_dir(path))
        snprintf(pattern, sizeof pattern, "%s/*.bin", path);
    else
        snprintf(pattern, sizeof pattern, "%s", path);
    int rc = glob(pattern, 0, NULL, g);
    if (rc == GLOB_NOMATCH || (rc == 0 && g->gl_pathc == 0)) {
        globfree(g);
        if (is_dir(path))
            return em_set_error(EM_ERR_NOT_FOUND, "loader: no *.bin shards in directory %s", path);
        return em_set_error(EM_ERR_NOT_FOUND, "loader: no shard matches %s", path);
    }
    if (rc != 0) {
        globfree(g);
        return em_set_error(EM_ERR_IO, "loader: cannot list %s", path);
    }
    return EM_OK;
}

em_loader *em_loader_open(const em_loader_opts *opts)
{
    if (!opts || !opts->path) return em_set_error(EM_ERR_INVALID, "em_loader_open: no path"), NULL;
    em_loader_opts o = *opts;
    if (o.world <= 0) o.world = 1;
    if (o.batch <= 0 || o.seq <= 0 || o.rank < 0 || o.rank >= o.world)
        return em_set_error(EM_ERR_INVALID, "loader: bad options (batch %d, seq %d, rank %d of %d)",
                            o.batch, o.seq, o.rank, o.world),
               NULL;
    glob_t g;
    if (find_shards(o.path, &g) != EM_OK) return NULL;
    em_loader *l = calloc(1, sizeof *l);
    if (!l) {
        globfree(&g);
        return em_set_error(EM_ERR_NOMEM, "out of memory opening a loader"), NULL;
    }
    l->o = o;
    l->path = strdup(o.path);
    l->o.path = l->path;
    l->shards = calloc(g.gl_pathc, sizeof *l->shards);
    l->first = calloc(g.gl_pathc + 1, sizeof *l->first);
    if (!l->path || !l->shards || !l->first) {
        globfree(&g);
        em_loader_close(l);
        return em_set_error(EM_ERR_NOMEM, "out of memory opening a loader"), NULL;
    }
    for (size_t i = 0; i < g.gl_pathc; i++) {
        if (em_shard_open(&l->shards[l->nshards], g.gl_pathv[i]) != EM_OK) {
            globfree(&g);
            em_error_context("loader");
            em_loader_close(l);
            return NULL;
        }
        const em_shard *s = &l->shards[l->nshards++];
        l->tokens += s->ntokens;
        l->first[l->nshards] =
            l->first[l->nshards - 1] + (s->ntokens > 0 ? (s->ntokens - 1) / (size_t)o.seq : 0);
    }
    globfree(&g);
    l->nsamples = l->first[l->nshards];
    uint64_t per_batch = (uint64_t)o.batch * (uint64_t)o.world;
    l->per_epoch = l->nsamples / per_batch;
    if (l->per_epoch == 0) {
        em_set_error(EM_ERR_INVALID,
                     "loader: %s holds %llu tokens in %zu shard(s): %llu samples of "
                     "%d+1 tokens, fewer than one batch needs (%d x %d ranks)",
                     o.path, (unsigned long long)l->tokens, l->nshards,
                     (unsigned long long)l->nsamples, o.seq, o.batch, o.world);
        em_loader_close(l);
        return NULL;
    }
    if (o.shuffle) {
        l->perm = malloc(l->nsamples * sizeof *l->perm);
        if (!l->perm) {
            em_loader_close(l);
            return em_set_error(EM_ERR_NOMEM, "out of memory for %llu samples",
                                (unsigned long long)l->nsamples),
                   NULL;
        }
        l->perm_epoch = UINT64_MAX;
    }
    if (o.prefetch) {
        size_t n = (size_t)o.batch * (size_t)o.seq;
        for (int i = 0; i < LOADER_RING; i++) {
            l->ring[i].inputs = malloc(n * sizeof(int32_t));
            l->ring[i].targets = malloc(n * sizeof(int32_t));
            if (!l->ring[i].inputs || !l->ring[i].targets) {
                em_loader_close(l);
                return em_set_error(EM_ERR_NOMEM, "out of memory for prefetch buffers"), NULL;
            }
        }
        pthread_mutex_init(&l->mu, NULL);
        pthread_cond_init(&l->cv, NULL);
        l->sync_init = true;
        if (pthread_create(&l->thread, NULL, prefetch_main, l) != 0) {
            em_loader_close(l);
            return em_set_error(EM_ERR_INTERNAL, "loader: cannot start the prefetch thread"), NULL;
        }
        l->thread_started = true;
    }
    return l;
}

void em_loader_close(em_loader *l)
{
    if (!l) return;
    if (l->thread_started) {
        pthread_mutex_lock(&l->mu);
        l->stop = true;
        pthread_cond_broadcast(&l->cv);
        pthread_mutex_unlock(&l->mu);
        pthread_join(l->thread, NULL);
    }
    if (l->sync_init) {
        pthread_mutex_destroy(&l->mu);
        pthread_cond_destroy(&l->cv);
    }
    for (int i = 0; i < LOADER_RING; i++) {
        free(l->ring[i].inputs);
        free(l->ring[i].targets);
    }
    for (size_t i = 0; i < l->nshards; i++) em_shard_close(&l->shards[i]);
    free(l->shards);
    free(l->first);
    free(l->perm);
    free(l->path);
    free(l);
}

/* ---- batches ------------------------------------------------------------------------------------
 */

uint64_t em_loader_batches_per_epoch(const em_loader *l)
{
    return l ? l->per_epoch : 0;
}

uint64_t em_loader_tokens(const em_loader *l)
{
    return l ? l->tokens : 0;
}

em_status em_loader_next(em_loader *l, int32_t *inputs, int32_t *targets)
{
    if (!l || !inputs || !targets)
        return em_set_error(EM_ERR_INVALID, "em_loader_next: NULL argument");
    if (!l->thread_started) {
        loader_fill(l, l->pos, inputs, targets);
        l->pos = advance(l, l->pos);
        return EM_OK;
    }
    size_t bytes = (size_t)l->o.batch * (size_t)l->o.seq * sizeof(int32_t);
    pthread_mutex_lock(&l->mu);
    for (;;) {
        int hit = -1;
        for (int i = 0; i < LOADER_RING; i++)
            if (l->ring[i].state == SLOT_READY && same_pos(l->ring[i].pos, l->pos)) hit = i;
        if (hit >= 0) {
            memcpy(inputs, l->ring[hit].inputs, bytes);
            memcpy(targets, l->ring[hit].targets, bytes);
            l->ring[hit].state = SLOT_FREE;
            l->pos = advance(l, l->pos);
            pthread_cond_broadcast(&l->cv);
            break;
        }
        l->waits++;
        pthread_cond_wait(&l->cv, &l->mu);
    }
    pthread_mutex_unlock(&l->mu);
    return EM_OK;
}

em_loader_pos em_loader_tell(const em_loader *l)
{
    em_loader_pos p = {0, 0};
    if (!l) return p;
    if (l->thread_started) pthread_mutex_lock((pthread_mutex_t *)&l->mu);
    p = l->pos;
    if (l->thread_started) pthread_mutex_unlock((pthread_mutex_t *)&l->mu);
    return p;
}

em_status em_loader_seek(em_loader *l, em_loader_pos pos)
{
    if (!l) return em_set_error(EM_ERR_INVALID, "em_loader_seek: NULL loader");
    if (pos.step >= l->per_epoch)
        return em_set_error(EM_ERR_INVALID, "loader: step %llu is past the epoch's %llu batches",
                            (unsigned long long)pos.step, (unsigned long long)l->per_epoch);
    if (!l->thread_started) {
        l->pos = pos;
        return EM_OK;
    }
    pthread_mutex_lock(&l->mu);
    l->gen++;
    for (int i = 0; i < LOADER_RING; i++)
        if (l->ring[i].state == SLOT_READY) l->ring[i].state = SLOT_FREE;
    l->pos = pos;
    l->prod_pos = pos;
    pthread_cond_broadcast(&l->cv);
    pthread_mutex_unlock(&l->mu);
    return EM_OK;
}
