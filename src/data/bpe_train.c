/* bpe_train.c — training a byte-level BPE from a corpus, with incremental pair counts.
 *
 * 1. The corpus is split by GPT-2's pre-tokenizer and the distinct pieces ("words") are counted;
 *    merges never cross a word, as in GPT-2.
 * 2. Every adjacent symbol pair gets a count (the sum of the frequencies of the words holding it)
 *    and the list of words where it occurs; a max-heap orders pairs by (count, then smallest ids).
 * 3. Each step pops the best pair, rewrites only the words on its list, and adjusts the counts of
 *    the pairs those words lose and gain; the changed pairs are pushed again and stale heap
 *    entries are skipped when popped. A step costs what the merge touches, not the corpus size.
 *
 * The new token's bytes are the concatenation of the pair's; if those bytes are already a token
 * (two pairs can spell the same string), the merge reuses that id instead of adding a duplicate.
 * Ids are assigned in merge order, so the id is the rank, as encoding (bpe.c) expects. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "data/tok_internal.h"

/* ---- growable arrays ----------------------------------------------------------------------------
 */

typedef struct u32vec {
    uint32_t *v;  /* items */
    uint32_t n;   /* used */
    uint32_t cap; /* allocated */
} u32vec;

static bool vec_push(u32vec *a, uint32_t x)
{
    if (a->n == a->cap) {
        uint32_t cap = a->cap ? a->cap * 2 : 4;
        uint32_t *v = realloc(a->v, (size_t)cap * sizeof *v);
        if (!v) return false;
        a->v = v;
        a->cap = cap;
    }
    a->v[a->n++] = x;
    return true;
}

/* ---- word counting ------------------------------------------------------------------------------
 */

typedef struct word_table {
    uint8_t *pool;   /* word bytes */
    size_t pool_len; /* used */
    size_t pool_cap; /* allocated */
    uint64_t *off;   /* per word: offset in pool */
    uint32_t *len;   /* per word: length */
    uint64_t *count; /* per word: frequency */
    size_t n;        /* words */
    size_t cap;      /* allocated words */
    uint32_t *slots; /* hash slots: word index + 1, 0 = empty */
    size_t nslots;   /* power of two */
    bool oom;        /* an allocation failed */
} word_table;

static uint64_t hash_bytes(const uint8_t *s, size_t n)
{
    uint64_t h = 0xcbf29ce484222325ull;
    for (size_t i = 0; i < n; i++) h = (h ^ s[i]) * 0x100000001b3ull;
    return h ^ (h >> 31);
}

static bool wt_grow_slots(word_table *w)
{
    size_t n = w->nslots ? w->nslots * 2 : 1 << 16;
    uint32_t *s = calloc(n, sizeof *s);
    if (!s) return false;
    for (size_t i = 0; i < w->n; i++) {
        size_t h = hash_bytes(w->pool + w->off[i], w->len[i]) & (n - 1);
        while (s[h]) h = (h + 1) & (n - 1);
        s[h] = (uint32_t)i + 1;
    }
    free(w->slots);
    w->slots = s;
    w->nslots = n;
    return true;
}

static bool count_word(void *ctx, const uint8_t *p, size_t len)
{
    word_table *w = ctx;
    if (len > UINT32_MAX / 2)
        len = UINT32_MAX / 2; /* a gigantic piece: its tail is not trained on */
    if (2 * (w->n + 1) > w->nslots && !wt_grow_slots(w)) goto oom;
    size_t h = hash_bytes(p, len) & (w->nslots - 1);
    for (; w->slots[h]; h = (h + 1) & (w->nslots - 1)) {
        uint32_t i = w->slots[h] - 1;
        if (w->len[i] == len && memcmp(w->pool + w->off[i], p, len) == 0) {
            w->count[i]++;
            return true;
        }
    }
    if (w->n == w->cap) {
        size_t cap = w->cap ? w->cap * 2 : 4096;
        uint64_t *off = realloc(w->off, cap * sizeof *off);
        if (off) w->off = off;
        uint32_t *ln = realloc(w->len, cap * sizeof *ln);
        if (ln) w->len = ln;
        uint64_t *cnt = realloc(w->count, cap * sizeof *cnt);
        if (cnt) w->count = cnt;
        if (!off || !ln || !cnt) goto oom;
        w->cap = cap;
    }
    if (w->pool_len + len > w->pool_cap) {
        size_t cap = w->pool_cap ? w->pool_cap : 1 << 16;
        while (cap < w->pool_len + len) cap *= 2;
        uint8_t *pool = realloc(w->pool, cap);
        if (!pool) goto oom;
        w->pool = pool;
        w->pool_cap = cap;
    }
    memcpy(w->pool + w->pool_len, p, len);
    w->off[w->n] = w->pool_len;
    w->len[w->n] = (uint32_t)len;
    w->count[w->n] = 1;
    w->pool_len += len;
    w->slots[h] = (uint32_t)++w->n;
    return true;
oom:
    w->oom = true;
    em_set_error(EM_ERR_NOMEM, "out of memory counting the corpus's words");
    return false;
}

static void wt_free(word_table *w)
{
    free(w->pool);
    free(w->off);
    free(w->len);
    free(w->count);
    free(w->slots);
}

/* ---- pairs --------------------------------------------------------------------------------------
 */

typedef struct pair {
    uint32_t a, b;  /* the symbols */
    int64_t count;  /* frequency-weighted occurrences */
    u32vec words;   /* words where it occurs (may hold stale entries and repeats) */
    uint64_t dirty; /* step that last changed it */
} pair;

typedef struct heap_item {
    int64_t count; /* count when pushed */
    uint32_t a, b; /* the pair */
    uint32_t idx;  /* pair index */
} heap_item;

typedef struct trainer {
    em_tokenizer *t; /* the vocabulary being built */
    word_table w;    /* distinct words */
    uint32_t **sym;  /* per word: its symbols */
    uint32_t *nsym;  /* per word: how many */
    uint64_t *stamp; /* per word: step that last rewrote it */
    pair *pairs;     /* all pairs ever seen */
    size_t npairs, pcap;
    uint32_t *ptab;  /* hash (a, b) -> pair index + 1 */
    size_t ptab_cap; /* power of two */
    heap_item *heap; /* max-heap */
    size_t hn, hcap;
    uint32_t *dirty; /* pairs changed in this step */
    size_t ndirty, dcap;
} trainer;

static uint64_t pair_hash(uint32_t a, uint32_t b)
{
    uint64_t z = ((uint64_t)a << 32 | b) * 0x9e3779b97f4a7c15ull;
    return z ^ (z >> 29);
}

static bool ptab_grow(trainer *tr)
{
    size_t n = tr->ptab_cap ? tr->ptab_cap * 2 : 1 << 16;
    uint32_t *s = calloc(n, sizeof *s);
    if (!s) return false;
    for (size_t i = 0; i < tr->npairs; i++) {
        size_t h = pair_hash(tr->pairs[i].a, tr->pairs[i].b) & (n - 1);
        while (s[h]) h = (h + 1) & (n - 1);
        s[h] = (uint32_t)i + 1;
    }
    free(tr->ptab);
    tr->ptab = s;
    tr->ptab_cap = n;
    return true;
}

/* The pair (a, b), created with count 0 when new; NULL when out of memory. */
static pair *get_pair(trainer *tr, uint32_t a, uint32_t b, uint32_t *index)
{
    if (2 * (tr->npairs + 1) > tr->ptab_cap && !ptab_grow(tr)) return NULL;
    size_t h = pair_hash(a, b) & (tr->ptab_cap - 1);
    for (; tr->ptab[h]; h = (h + 1) & (tr->ptab_cap - 1)) {
        pair *p = &tr->pairs[tr->ptab[h] - 1];
        if (p->a == a && p->b == b) {
            *index = tr->ptab[h] - 1;
            return p;
        }
    }
    if (tr->npairs == tr->pcap) {
        size_t cap = tr->pcap ? tr->pcap * 2 : 1 << 14;
        pair *np = realloc(tr->pairs, cap * sizeof *np);
        if (!np) return NULL;
        tr->pairs = np;
        tr->pcap = cap;
    }
    pair *p = &tr->pairs[tr->npairs];
    memset(p, 0, sizeof *p);
    p->a = a;
    p->b = b;
    p->dirty = UINT64_MAX;
    *index = (uint32_t)tr->npairs;
    tr->ptab[h] = (uint32_t)++tr->npairs;
    return p;
}

static bool item_better(heap_item x, heap_item y)
{
    if (x.count != y.count) return x.count > y.count;
    return x.a != y.a ? x.a < y.a : x.b < y.b;
}

static bool heap_push(trainer *tr, heap_item it)
{
    if (tr->hn == tr->hcap) {
        size_t cap = tr->hcap ? tr->hcap * 2 : 1 << 16;
        heap_item *h = realloc(tr->heap, cap * sizeof *h);
        if (!h) return false;
        tr->heap = h;
        tr->hcap = cap;
    }
    size_t i = tr->hn++;
    tr->heap[i] = it;
    while (i && item_better(tr->heap[i], tr->heap[(i - 1) / 2])) {
        heap_item tmp = tr->heap[i];
        tr->heap[i] = tr->heap[(i - 1) / 2];
        tr->heap[(i - 1) / 2] = tmp;
        i = (i - 1) / 2;
    }
    return true;
}

static heap_item heap_pop(trainer *tr)
{
    heap_item top = tr->heap[0];
    tr->heap[0] = tr->heap[--tr->hn];
    size_t i = 0;
    for (;;) {
        size_t l = 2 * i + 1, r = l + 1, m = i;
        if (l < tr->hn && item_better(tr->heap[l], tr->heap[m])) m = l;
        if (r < tr->hn && item_better(tr->heap[r], tr->heap[m])) m = r;
        if (m == i) break;
        heap_item tmp = tr->heap[i];
        tr->heap[i] = tr->heap[m];
        tr->heap[m] = tmp;
        i = m;
    }
    return top;
}

/* Adds delta to pair (a, b) for word wi; marks it dirty for this step. */
static bool bump(trainer *tr, uint32_t a, uint32_t b, int64_t delta, uint32_t wi, uint64_t step,
                 bool record_word)
{
    uint32_t idx;
    pair *p = get_pair(tr, a, b, &idx);
    if (!p) return false;
    p->count += delta;
    if (record_word && !vec_push(&p->words, wi)) return false;
    if (p->dirty != step) {
        p->dirty = step;
        if (tr->ndirty == tr->dcap) {
            size_t cap = tr->dcap ? tr->dcap * 2 : 1024;
            uint32_t *d = realloc(tr->dirty, cap * sizeof *d);
            if (!d) return false;
            tr->dirty = d;
            tr->dcap = cap;
        }
        tr->dirty[tr->ndirty++] = idx;
    }
    return true;
}

/* Rewrites word wi, replacing each (a, b) by x left to right, and adjusts the pair counts. */
static bool rewrite_word(trainer *tr, uint32_t wi, uint32_t a, uint32_t b, uint32_t x,
                         uint64_t step)
{
    uint32_t *s = tr->sym[wi];
    uint32_t n = tr->nsym[wi];
    int64_t f = (int64_t)tr->w.count[wi];
    bool found = false;
    for (uint32_t i = 0; i + 1 < n; i++)
        if (s[i] == a && s[i + 1] == b) {
            found = true;
            break;
        }
    if (!found) return true; /* a stale entry on the pair's list */
    for (uint32_t i = 0; i + 1 < n; i++)
        if (!bump(tr, s[i], s[i + 1], -f, wi, step, false)) return false;
    uint32_t w = 0;
    for (uint32_t i = 0; i < n; i++) {
        if (i + 1 < n && s[i] == a && s[i + 1] == b) {
            s[w++] = x;
            i++;
        } else {
            s[w++] = s[i];
        }
    }
    tr->nsym[wi] = w;
    for (uint32_t i = 0; i + 1 < w; i++)
        if (!bump(tr, s[i], s[i + 1], f, wi, step, s[i] == x || s[i + 1] == x)) return false;
    return true;
}

static void trainer_free(trainer *tr)
{
    for (size_t i = 0; i < tr->w.n && tr->sym; i++) free(tr->sym[i]);
    free(tr->sym);
    free(tr->nsym);
    free(tr->stamp);
    for (size_t i = 0; i < tr->npairs; i++) free(tr->pairs[i].words.v);
    free(tr->pairs);
    free(tr->ptab);
    free(tr->heap);
    free(tr->dirty);
    wt_free(&tr->w);
}

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

/* Sets up words as byte symbols and the initial pair counts. */
static bool trainer_init_pairs(trainer *tr)
{
    size_t n = tr->w.n;
    tr->sym = calloc(n ? n : 1, sizeof *tr->sym);
    tr->nsym = calloc(n ? n : 1, sizeof *tr->nsym);
    tr->stamp = calloc(n ? n : 1, sizeof *tr->stamp);
    if (!tr->sym || !tr->nsym || !tr->stamp) return false;
    for (size_t i = 0; i < n; i++) {
        uint32_t len = tr->w.len[i];
        tr->sym[i] = malloc((len ? len : 1) * sizeof **tr->sym);
        if (!tr->sym[i]) return false;
        const uint8_t *p = tr->w.pool + tr->w.off[i];
        for (uint32_t j = 0; j < len; j++) tr->sym[i][j] = tr->t->byte_id[p[j]];
        tr->nsym[i] = len;
        for (uint32_t j = 0; j + 1 < len; j++)
            if (!bump(tr, tr->sym[i][j], tr->sym[i][j + 1], (int64_t)tr->w.count[i], (uint32_t)i, 0,
                      true))
                return false;
    }
    for (size_t i = 0; i < tr->ndirty; i++) {
        pair *p = &tr->pairs[tr->dirty[i]];
        if (!heap_push(tr, (heap_item){p->count, p->a, p->b, tr->dirty[i]})) return false;
    }
    tr->ndirty = 0;
    return true;
}

em_tokenizer *em_bpe_train(const char *text, size_t len, const em_bpe_train_opts *opts)
{
    if (!opts || (!text && len))
        return em_set_error(EM_ERR_INVALID, "em_bpe_train: NULL argument"), NULL;
    uint32_t want = opts->vocab_size;
    if (want < 256 + opts->nspecials)
        return em_set_error(EM_ERR_INVALID, "vocab size %u is below 256 bytes + %zu special tokens",
                            want, opts->nspecials),
               NULL;
    double t0 = now_s();
    trainer tr;
    memset(&tr, 0, sizeof tr);
    tr.t = tok_new(EM_TOK_BPE);
    if (!tr.t || !tok_bpe_init_regex(tr.t)) goto fail;
    for (int i = 0; i < 256; i++) {
        uint8_t b = (uint8_t)i;
        if (!tok_set(tr.t, (uint32_t)i, &b, 1, false)) goto fail;
    }
    if (!tok_pretokenize(tr.t, (const uint8_t *)text, len, count_word, &tr.w)) goto fail;
    double t1 = now_s();
    if (!trainer_init_pairs(&tr)) {
        em_set_error(EM_ERR_NOMEM, "out of memory counting pairs");
        goto fail;
    }
    uint32_t target = want - (uint32_t)opts->nspecials;
    uint64_t step = 0;
    uint8_t buf[4096];
    while (tr.t->nids < target && tr.hn) {
        heap_item top = heap_pop(&tr);
        pair *p = &tr.pairs[top.idx];
        if (top.count != p->count || p->count <= 0) continue; /* stale */
        step++;
        uint32_t a = p->a, b = p->b;
        size_t la = tr.t->len[a], lb = tr.t->len[b];
        uint32_t x;
        uint8_t *cat = la + lb <= sizeof buf ? buf : malloc(la + lb);
        if (!cat) {
            em_set_error(EM_ERR_NOMEM, "out of memory training");
            goto fail;
        }
        memcpy(cat, tr.t->pool + tr.t->off[a], la);
        memcpy(cat + la, tr.t->pool + tr.t->off[b], lb);
        x = tok_lookup(tr.t, cat, la + lb);
        if (x == TOK_NONE) {
            x = tr.t->nids;
            if (!tok_set(tr.t, x, cat, la + lb, false)) {
                if (cat != buf) free(cat);
                goto fail;
            }
        }
        if (cat != buf) free(cat);
        /* take the word list: rewriting may append to other pairs' lists (and reallocate) */
        u32vec words = p->words;
        p->words = (u32vec){0};
        for (uint32_t i = 0; i < words.n; i++) {
            uint32_t wi = words.v[i];
            if (tr.stamp[wi] == step) continue;
            tr.stamp[wi] = step;
            if (!rewrite_word(&tr, wi, a, b, x, step)) {
                free(words.v);
                em_set_error(EM_ERR_NOMEM, "out of memory training");
                goto fail;
            }
        }
        free(words.v);
        for (size_t i = 0; i < tr.ndirty; i++) {
            pair *q = &tr.pairs[tr.dirty[i]];
            if (q->count > 0 && !heap_push(&tr, (heap_item){q->count, q->a, q->b, tr.dirty[i]})) {
                em_set_error(EM_ERR_NOMEM, "out of memory training");
                goto fail;
            }
        }
        tr.ndirty = 0;
        if (opts->verbose && step % 1000 == 0)
            fprintf(stderr, "\rbpe: %u / %u tokens", tr.t->nids, target);
    }
    if (opts->verbose)
        fprintf(stderr,
                "\rbpe: %u tokens from %zu distinct words in %.2f s (pre-tokenizing %.2f s)\n",
                tr.t->nids, tr.w.n, now_s() - t0, t1 - t0);
    for (size_t i = 0; i < opts->nspecials; i++)
        if (em_tok_add_special(tr.t, opts->specials[i], -1) < 0) goto fail;
    em_tokenizer *t = tr.t;
    tr.t = NULL;
    trainer_free(&tr);
    return t;
fail:
    em_error_context("training BPE");
    em_tok_free(tr.t);
    trainer_free(&tr);
    return NULL;
}
