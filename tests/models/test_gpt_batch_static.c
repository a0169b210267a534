/* test_gpt_batch_static.c — the shape-static decode step of src/models/gpt/batch.c and
 * batch_step.c. (1) Greedy decoding through em_gpt_batch_step gives em_gpt_generate's tokens and,
 * at every step, a full forward pass's logits, over a schedule that crosses a bucket of attended
 * keys (64), runs a slot up to max_len exactly, leaves a lower slot unlisted for many steps (its
 * cache must stay intact: its later tokens are checked) and runs one row alone. (2) Two
 * consecutive steps of one (rows, keys bucket, greedy) launch the same kernels with the same
 * arguments — buffers, offsets, shapes, strides, scalars, grids — where a buffer is either one
 * that existed before the step (inputs, weights, caches: the very same buffer) or the step's
 * k-th allocation in both (intermediates: the pool may hand the same blocks out in another order
 * from step to step, and a captured graph keeps its own), and each step is exactly one
 * host -> device write (the inputs), then the launches, then one device -> host read (the
 * result): nothing is read back inside the forward pass. The trace comes from wrapping
 * em_launch, em_buffer_alloc, em_buffer_read and em_buffer_write at link time
 * (tests/CMakeLists.txt), which sees every launch, allocation and copy of the static library. On
 * the CPU or $EMBER_TEST_DEVICE. */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "ember/gpt.h"

/* ---- the trace: every launch and host <-> device copy while `tracing` ------------------------ */

enum { EV_LAUNCH, EV_READ, EV_WRITE, MAX_EVENTS = 4096, MAX_ARGS = 24, MAX_ALLOCS = 4096 };

typedef struct event {
    int kind;                /* EV_* */
    const void *what;        /* the kernel, or the buffer copied */
    uint32_t grid[6];        /* launches: cube counts and dims */
    size_t nargs;            /* launches: arguments */
    em_arg args[MAX_ARGS];   /* launches: the arguments */
    int64_t alloc[MAX_ARGS]; /* launches: per buffer argument, the index of the step's
                              * allocation it is (its latest), or -1 when made before the step */
    size_t offset, bytes;    /* copies */
} event;

static event *events;
static int nevents;
static bool tracing;
static const em_buffer *allocs[MAX_ALLOCS]; /* the current step's allocations, in order */
static int nallocs;

static void add_event(const event *e)
{
    if (nevents < MAX_EVENTS) events[nevents] = *e;
    nevents++;
}

em_status __real_em_launch(em_kernel *kernel, const uint32_t cube_count[3],
                           const uint32_t cube_dim[3], const em_arg *args, size_t nargs);
em_status __wrap_em_launch(em_kernel *kernel, const uint32_t cube_count[3],
                           const uint32_t cube_dim[3], const em_arg *args, size_t nargs);
em_buffer *__real_em_buffer_alloc(em_device *dev, size_t bytes);
em_buffer *__wrap_em_buffer_alloc(em_device *dev, size_t bytes);
em_status __real_em_buffer_read(const em_buffer *buf, size_t offset, void *dst, size_t bytes);
em_status __wrap_em_buffer_read(const em_buffer *buf, size_t offset, void *dst, size_t bytes);
em_status __real_em_buffer_write(em_buffer *buf, size_t offset, const void *src, size_t bytes);
em_status __wrap_em_buffer_write(em_buffer *buf, size_t offset, const void *src, size_t bytes);

em_status __wrap_em_launch(em_kernel *kernel, const uint32_t cube_count[3],
                           const uint32_t cube_dim[3], const em_arg *args, size_t nargs)
{
    if (tracing) {
        event e = {.kind = EV_LAUNCH, .what = kernel, .nargs = nargs};
        for (int i = 0; i < 3; i++) {
            e.grid[i] = cube_count[i];
            e.grid[3 + i] = cube_dim[i];
        }
        memcpy(e.args, args, (nargs < MAX_ARGS ? nargs : MAX_ARGS) * sizeof *args);
        for (size_t i = 0; i < nargs && i < MAX_ARGS; i++) {
            e.alloc[i] = -1;
            for (int k = nallocs; k-- > 0 && e.alloc[i] < 0;)
                if (args[i].kind == EM_PARAM_BUFFER && allocs[k] == args[i].buf) e.alloc[i] = k;
        }
        add_event(&e);
    }
    return __real_em_launch(kernel, cube_count, cube_dim, args, nargs);
}

em_buffer *__wrap_em_buffer_alloc(em_device *dev, size_t bytes)
{
    em_buffer *b = __real_em_buffer_alloc(dev, bytes);
    if (tracing && b && nallocs < MAX_ALLOCS) allocs[nallocs++] = b;
    return b;
}

em_status __wrap_em_buffer_read(const em_buffer *buf, size_t offset, void *dst, size_t bytes)
{
    if (tracing)
        add_event(&(event){.kind = EV_READ, .what = buf, .offset = offset, .bytes = bytes});
    return __real_em_buffer_read(buf, offset, dst, bytes);
}

em_status __wrap_em_buffer_write(em_buffer *buf, size_t offset, const void *src, size_t bytes)
{
    if (tracing)
        add_event(&(event){.kind = EV_WRITE, .what = buf, .offset = offset, .bytes = bytes});
    return __real_em_buffer_write(buf, offset, src, bytes);
}

/* The same argument: kind, buffer (made before the step: the same one; else the same
 * allocation of the step, ia and ib), offset, visible length, rank, shape, strides, or scalar. */
static bool same_arg(const em_arg *a, int64_t ia, const em_arg *b, int64_t ib)
{
    if (a->kind != b->kind || a->value_class != b->value_class) return false;
    if (a->kind == EM_PARAM_SCALAR) return a->value.u == b->value.u;
    if (ia != ib || (ia < 0 && a->buf != b->buf)) return false;
    if (a->offset != b->offset || a->len != b->len || a->rank != b->rank) return false;
    for (uint32_t d = 0; d < a->rank && d < EM_MAX_RANK; d++)
        if (a->shape[d] != b->shape[d] || a->stride[d] != b->stride[d]) return false;
    return true;
}

/* Whether two traced launches are the same kernel, grid and arguments. */
static bool same_launch(const event *a, const event *b)
{
    if (a->what != b->what || a->nargs != b->nargs || memcmp(a->grid, b->grid, sizeof a->grid))
        return false;
    for (size_t i = 0; i < a->nargs && i < MAX_ARGS; i++)
        if (!same_arg(&a->args[i], a->alloc[i], &b->args[i], b->alloc[i])) return false;
    return true;
}

/* ---- the model --------------------------------------------------------------------------------
 */

static em_device *dev;

static int setup(void **state)
{
    (void)state;
    const char *name = getenv("EMBER_TEST_DEVICE");
    dev = em_device_open(name && *name ? name : "cpu");
    if (!dev) fprintf(stderr, "[gpt_batch_static] cannot open %s: %s\n", name, em_last_error());
    events = calloc(MAX_EVENTS, sizeof *events);
    return dev && events ? 0 : -1;
}

static int teardown(void **state)
{
    (void)state;
    em_device_close(dev);
    free(events);
    return 0;
}

enum { VOCAB = 61, CTX = 128, MAX_LEN = 100, MAXTOK = 160 };

static em_gpt *tiny_as(bool tied)
{
    em_gpt_config c = {.vocab_size = VOCAB,
                       .block_size = CTX,
                       .n_layer = 2,
                       .n_head = 2,
                       .n_embd = 32,
                       .dropout = 0.1, /* eval mode must switch it off */
                       .bias = true,
                       .tied = tied};
    em_gpt *g = em_gpt_new(dev, EM_F32, &c, 23);
    assert_non_null(g);
    return g;
}

static em_gpt *tiny(void)
{
    return tiny_as(true);
}

/* With its own head: greedy decoding then moves from token to token (the tied head's logits
 * favour the token just fed, so its greedy run repeats one), so a token fed wrongly shows. */
static em_gpt *tiny_untied(void)
{
    return tiny_as(false);
}

typedef struct collect {
    int64_t *out;
    int64_t n;
} collect;

static bool collect_tok(int64_t tok, void *user)
{
    collect *c = user;
    c->out[c->n++] = tok;
    return true;
}

/* The last position's logits of a full forward pass over ids[0, n). */
static void forward_last(em_gpt *g, const int64_t *ids, int64_t n, float *out)
{
    em_module_train(em_gpt_module(g), false);
    em_no_grad_begin();
    em_scope_begin();
    em_tensor *x = em_from_host(dev, EM_I64, EM_SHAPE(1, n), ids);
    em_tensor *logits = em_gpt_forward(g, x, NULL);
    assert_non_null(logits);
    assert_int_equal(
        em_to_host(em_select(em_select(logits, 0, 0), 0, n - 1), out, VOCAB * sizeof *out), EM_OK);
    em_scope_end(NULL, 0);
    em_no_grad_end();
}

static int64_t host_argmax(const float *x, int64_t n)
{
    int64_t best = 0;
    for (int64_t i = 1; i < n; i++)
        if (x[i] > x[best]) best = i;
    return best;
}

/* ---- (1) the schedule against em_gpt_generate and full passes ---------------------------------
 */

typedef struct seq {
    int64_t hist[MAXTOK]; /* prompt, then the tokens made */
    int64_t n;            /* tokens in hist */
    int64_t ref[MAXTOK];  /* em_gpt_generate's tokens after the prompt */
    int64_t np;           /* prompt length */
} seq;

/* A prompt of np tokens and em_gpt_generate's greedy continuation up to `until` tokens. */
static void start_seq(em_gpt *g, seq *q, int64_t np, int64_t until, int salt)
{
    q->np = q->n = np;
    for (int64_t t = 0; t < np; t++) q->hist[t] = (salt * 11 + t * 7 + 3) % VOCAB;
    em_sample_config sc = {0, 0, 1.0, 1.0, 1};
    collect c = {q->ref, 0};
    int64_t made = 0;
    assert_int_equal(em_gpt_generate(g, q->hist, np, until - np, &sc, -1, collect_tok, &c, &made),
                     EM_OK);
    assert_int_equal(made, until - np);
}

/* One step over the listed slots (their last token fed): each row's logits match a full pass
 * within 1e-4 and its argmax is em_gpt_generate's next token, which is appended. */
static void step_and_check(em_gpt *g, em_gpt_batch *b, seq *s, const int64_t *slots, int n,
                           int step)
{
    int64_t toks[4];
    float lg[4 * VOCAB], want[VOCAB];
    for (int i = 0; i < n; i++) toks[i] = s[slots[i]].hist[s[slots[i]].n - 1];
    assert_int_equal(em_gpt_batch_step(b, slots, toks, n, lg), EM_OK);
    for (int i = 0; i < n; i++) {
        seq *q = &s[slots[i]];
        assert_int_equal(em_gpt_batch_len(b, slots[i]), q->n);
        forward_last(g, q->hist, q->n, want);
        for (int v = 0; v < VOCAB; v++)
            if (fabs((double)lg[i * VOCAB + v] - want[v]) > 1e-4)
                fail_msg("step %d, slot %lld (length %lld): logit %d is %g, a full pass gives %g",
                         step, (long long)slots[i], (long long)q->n, v, lg[i * VOCAB + v], want[v]);
        int64_t tok = host_argmax(lg + i * VOCAB, VOCAB);
        if (tok != q->ref[q->n - q->np])
            fail_msg("step %d, slot %lld: token %lld, em_gpt_generate %lld", step,
                     (long long)slots[i], (long long)tok, (long long)q->ref[q->n - q->np]);
        q->hist[q->n++] = tok;
    }
}

/* Slot 0 from 60 tokens to max_len exactly (crossing 64 keys, then the bucket capped at
 * max_len); slot 1 listed for 3 steps, unlisted below listed slots for 30, then listed again;
 * slot 2 from 3 tokens; then slot 0 again alone (one row) from 62 tokens across 64. */
static void test_schedule_matches_generate(void **state)
{
    (void)state;
    em_gpt *g = tiny();
    em_gpt_batch *b = em_gpt_batch_new(g, 4, MAX_LEN);
    assert_non_null(b);
    assert_int_equal(em_gpt_batch_max_len(b), MAX_LEN);
    static seq s[3];
    start_seq(g, &s[0], 60, MAX_LEN + 1, 0);
    start_seq(g, &s[1], 10, 60, 1);
    start_seq(g, &s[2], 3, 50, 2);
    float lg[VOCAB];
    for (int64_t k = 0; k < 3; k++) {
        assert_int_equal(em_gpt_batch_prefill(b, k, s[k].hist, s[k].n, lg), EM_OK);
        s[k].hist[s[k].n++] = host_argmax(lg, VOCAB);
        assert_int_equal(s[k].hist[s[k].n - 1], s[k].ref[0]);
    }
    for (int step = 0; em_gpt_batch_len(b, 0) < MAX_LEN; step++) {
        int64_t slots[3];
        int n = 0;
        slots[n++] = 2;
        if (step < 3 || step >= 33) slots[n++] = 1;
        slots[n++] = 0;
        step_and_check(g, b, s, slots, n, step);
    }
    assert_int_equal(em_gpt_batch_len(b, 0), MAX_LEN); /* full: one more is an error */
    int64_t zero[1] = {0}, tok[1] = {1};
    assert_int_equal(em_gpt_batch_step(b, zero, tok, 1, lg), EM_ERR_INVALID);
    /* one row alone across 64 keys */
    em_gpt_batch_clear(b, 0);
    start_seq(g, &s[0], 62, 70, 3);
    assert_int_equal(em_gpt_batch_prefill(b, 0, s[0].hist, s[0].n, lg), EM_OK);
    s[0].hist[s[0].n++] = host_argmax(lg, VOCAB);
    for (int step = 0; s[0].n < 70; step++) step_and_check(g, b, s, zero, 1, 100 + step);
    em_gpt_batch_free(b);
    em_gpt_free(g);
}

/* ---- (2) the trace of consecutive steps ------------------------------------------------------ */

/* Traces one step over slots (fed tokens toks), greedy or not, into events[first, nevents). */
static int traced_step(em_gpt_batch *b, const int64_t *slots, int64_t *toks, int n, bool greedy)
{
    float lg[4 * VOCAB];
    int64_t next[4];
    int first = nevents;
    nallocs = 0;
    tracing = true;
    em_status st = greedy ? em_gpt_batch_step_greedy(b, slots, toks, n, next)
                          : em_gpt_batch_step(b, slots, toks, n, lg);
    tracing = false;
    assert_int_equal(st, EM_OK);
    assert_true(nevents <= MAX_EVENTS);
    for (int i = 0; i < n; i++) toks[i] = greedy ? next[i] : host_argmax(lg + i * VOCAB, VOCAB);
    return first;
}

/* A step's trace [a, z): one write (the inputs: 2 * slots i64), launches, one read at the end. */
static void check_shape_of_step(int a, int z, int64_t slots)
{
    assert_true(z - a >= 3);
    assert_int_equal(events[a].kind, EV_WRITE);
    assert_int_equal(events[a].bytes, 2 * slots * sizeof(int64_t));
    for (int i = a + 1; i < z - 1; i++)
        if (events[i].kind != EV_LAUNCH)
            fail_msg("event %d of the step is a %s inside the forward pass", i - a,
                     events[i].kind == EV_READ ? "device -> host read" : "host -> device write");
    assert_int_equal(events[z - 1].kind, EV_READ);
}

/* Prints the first difference between two traced launches (for a failure's message). */
static void print_difference(int i, const event *a, const event *b)
{
    if (a->what != b->what || a->nargs != b->nargs || memcmp(a->grid, b->grid, sizeof a->grid)) {
        fprintf(stderr, "launch %d: another kernel, grid or argument count\n", i);
        return;
    }
    for (size_t k = 0; k < a->nargs && k < MAX_ARGS; k++)
        if (!same_arg(&a->args[k], a->alloc[k], &b->args[k], b->alloc[k])) {
            fprintf(stderr,
                    "launch %d, argument %zu: buffer %p (allocation %lld) +%zu len %llu, then %p "
                    "(allocation %lld) +%zu len %llu\n",
                    i, k, (void *)a->args[k].buf, (long long)a->alloc[k], a->args[k].offset,
                    (unsigned long long)a->args[k].len, (void *)b->args[k].buf,
                    (long long)b->alloc[k], b->args[k].offset, (unsigned long long)b->args[k].len);
            return;
        }
}

/* Same launches, one for one, in the traces [a, a + n) and [b, b + n); explain prints the first
 * difference. */
static bool same_steps(int a, int b, int n, bool explain)
{
    for (int i = 0; i < n; i++)
        if (events[a + i].kind != events[b + i].kind ||
            (events[a + i].kind == EV_LAUNCH && !same_launch(&events[a + i], &events[b + i]))) {
            if (explain && events[a + i].kind == events[b + i].kind)
                print_difference(i, &events[a + i], &events[b + i]);
            return false;
        }
    return true;
}

static void run_trace(bool greedy)
{
    em_gpt *g = tiny();
    em_gpt_batch *b = em_gpt_batch_new(g, 3, MAX_LEN);
    assert_non_null(b);
    int64_t p0[10], p2[20];
    for (int i = 0; i < 20; i++) p2[i] = (i * 5 + 1) % VOCAB;
    for (int i = 0; i < 10; i++) p0[i] = (i * 3 + 2) % VOCAB;
    int64_t t0 = 0, t2 = 0;
    assert_int_equal(em_gpt_batch_prefill_greedy(b, 0, p0, 10, &t0), EM_OK);
    assert_int_equal(em_gpt_batch_prefill_greedy(b, 2, p2, 20, &t2), EM_OK);
    /* slot 1 is unlisted between them: rows 3, keys 64 for the steps below */
    int64_t slots[2] = {2, 0}, toks[2] = {t2, t0};
    nevents = 0;
    traced_step(b, slots, toks, 2, greedy); /* compiles and tunes what it needs */
    traced_step(b, slots, toks, 2, greedy);
    int a = traced_step(b, slots, toks, 2, greedy);
    int m = traced_step(b, slots, toks, 2, greedy);
    int z = nevents;
    check_shape_of_step(a, m, 3);
    check_shape_of_step(m, z, 3);
    if (m - a != z - m || !same_steps(a, m, m - a, true))
        fail_msg("two steps of one bucket (rows 3, keys 64, greedy %d) launch different kernels "
                 "or arguments (%d and %d events)",
                 greedy, m - a, z - m);
    /* the trace tells shapes apart: one row is another key */
    int64_t one[1] = {0}, tok1[1] = {toks[1]};
    traced_step(b, one, tok1, 1, greedy);
    int r1 = traced_step(b, one, tok1, 1, greedy);
    int r2 = nevents;
    check_shape_of_step(r1, r2, 3);
    assert_false(z - m == r2 - r1 && same_steps(m, r1, z - m, false));
    em_gpt_batch_free(b);
    em_gpt_free(g);
}

static void test_steps_of_a_bucket_launch_alike(void **state)
{
    (void)state;
    setenv("EMBER_DECODE_GRAPHS", "0", 1); /* eager steps: their launches are traced */
    run_trace(false);
    run_trace(true);
    unsetenv("EMBER_DECODE_GRAPHS");
}

/* With graphs (the default): a key's first step runs eagerly, its second is recorded and
 * replayed, and from the third on a step is one inputs write, no em_launch, one read — with the
 * tokens of the eager steps (test_schedule_matches_generate runs both ways). */
static void test_replayed_steps_launch_nothing(void **state)
{
    (void)state;
    for (int greedy = 0; greedy < 2; greedy++) {
        em_gpt *g = tiny();
        em_gpt_batch *b = em_gpt_batch_new(g, 2, MAX_LEN);
        assert_non_null(b);
        int64_t p[5] = {1, 2, 3, 4, 5}, t = 0;
        assert_int_equal(em_gpt_batch_prefill_greedy(b, 0, p, 5, &t), EM_OK);
        int64_t slot[1] = {0}, tok[1] = {t};
        int launches[4];
        for (int k = 0; k < 4; k++) {
            int a = traced_step(b, slot, tok, 1, greedy);
            launches[k] = 0;
            for (int i = a; i < nevents; i++) launches[k] += events[i].kind == EV_LAUNCH;
        }
        assert_true(launches[0] > 0);
        assert_int_equal(launches[2], 0);
        assert_int_equal(launches[3], 0);
        em_gpt_batch_free(b);
        em_gpt_free(g);
    }
}

static void test_schedule_without_graphs(void **state)
{
    setenv("EMBER_DECODE_GRAPHS", "0", 1);
    test_schedule_matches_generate(state);
    unsetenv("EMBER_DECODE_GRAPHS");
}

/* Recordings that fail (more operations than EMBER_GRAPH_MAX_OPS) leave those steps eager: the
 * same schedule, the same tokens. */
static void test_schedule_when_recording_fails(void **state)
{
    setenv("EMBER_GRAPH_MAX_OPS", "10", 1);
    test_schedule_matches_generate(state);
    unsetenv("EMBER_GRAPH_MAX_OPS");
}

/* ---- (3) greedy steps in a row, fed on the device --------------------------------------------- */

/* em_gpt_batch_steps_greedy over chunks of 5, 1, 7 and 3 steps gives em_gpt_generate's tokens
 * (slot 0 crossing 64 keys, slot 2 from 3 tokens, slot 1 unlisted below slot 2 and intact after);
 * a chunk is one write of the tokens and positions, one write of positions for each later step,
 * launches and one read at the end; a slot without room for the chunk is refused before anything
 * runs. */
/* The distinct values of x[0, n). */
static int distinct(const int64_t *x, int n)
{
    int d = 0;
    for (int i = 0; i < n; i++) {
        bool seen = false;
        for (int j = 0; j < i && !seen; j++) seen = x[j] == x[i];
        d += !seen;
    }
    return d;
}

static void multi_step_schedule(void)
{
    em_gpt *g = tiny_untied();
    em_gpt_batch *b = em_gpt_batch_new(g, 4, MAX_LEN);
    assert_non_null(b);
    static seq s[3];
    start_seq(g, &s[0], 55, 90, 4);
    start_seq(g, &s[1], 10, 20, 5);
    start_seq(g, &s[2], 3, 40, 6);
    for (int j = 0; j < 3; j++) assert_true(distinct(s[j].ref, 10) >= 5); /* not one repeated */
    for (int64_t k = 0; k < 3; k++) {
        int64_t t = -1;
        assert_int_equal(em_gpt_batch_prefill_greedy(b, k, s[k].hist, s[k].n, &t), EM_OK);
        assert_int_equal(t, s[k].ref[0]);
        s[k].hist[s[k].n++] = t;
    }
    static const int64_t chunks[] = {5, 1, 7, 3, 4};
    int64_t slots[2] = {2, 0};
    for (size_t c = 0; c < sizeof chunks / sizeof chunks[0]; c++) {
        int64_t K = chunks[c], toks[2], next[2 * 7];
        for (int i = 0; i < 2; i++) toks[i] = s[slots[i]].hist[s[slots[i]].n - 1];
        bool traced = c == 4;
        int first = nevents;
        nallocs = 0;
        tracing = traced;
        assert_int_equal(em_gpt_batch_steps_greedy(b, slots, toks, 2, K, next), EM_OK);
        tracing = false;
        for (int64_t k = 0; k < K; k++)
            for (int i = 0; i < 2; i++) {
                seq *q = &s[slots[i]];
                if (next[k * 2 + i] != q->ref[q->n - q->np])
                    fail_msg("chunk %zu of %lld steps, step %lld, slot %lld: token %lld, "
                             "em_gpt_generate %lld",
                             c, (long long)K, (long long)k, (long long)slots[i],
                             (long long)next[k * 2 + i], (long long)q->ref[q->n - q->np]);
                q->hist[q->n++] = next[k * 2 + i];
            }
        for (int i = 0; i < 2; i++) assert_int_equal(em_gpt_batch_len(b, slots[i]), s[slots[i]].n - 1);
        if (traced) {
            int z = nevents, writes = 0;
            assert_true(z - first >= 3 && z <= MAX_EVENTS);
            assert_int_equal(events[first].kind, EV_WRITE);
            assert_int_equal(events[first].bytes, 2 * 4 * sizeof(int64_t));
            for (int i = first + 1; i < z - 1; i++) {
                if (events[i].kind == EV_READ) fail_msg("event %d of the chunk is a read", i - first);
                if (events[i].kind == EV_WRITE) {
                    assert_int_equal(events[i].bytes, 4 * sizeof(int64_t));
                    writes++;
                }
            }
            assert_int_equal(writes, K - 1);
            assert_int_equal(events[z - 1].kind, EV_READ);
            assert_int_equal(events[z - 1].bytes, (size_t)K * 3 * sizeof(int64_t));
        }
    }
    /* slot 1, unlisted throughout, still continues as em_gpt_generate */
    int64_t one[1] = {1};
    step_and_check(g, b, s, one, 1, 0);
    /* too few positions left for the chunk: refused, nothing changed */
    int64_t room = MAX_LEN - em_gpt_batch_len(b, 0), len2 = em_gpt_batch_len(b, 2);
    int64_t toks[2] = {s[2].hist[s[2].n - 1], s[0].hist[s[0].n - 1]}, next[2 * 64];
    assert_true(room >= 1 && room < 64);
    assert_int_equal(em_gpt_batch_steps_greedy(b, slots, toks, 2, room + 1, next), EM_ERR_INVALID);
    assert_non_null(strstr(em_last_error(), "slot 0"));
    assert_int_equal(em_gpt_batch_len(b, 0), MAX_LEN - room);
    assert_int_equal(em_gpt_batch_len(b, 2), len2);
    assert_int_equal(em_gpt_batch_steps_greedy(b, slots, toks, 2, 0, next), EM_ERR_INVALID);
    /* exactly to max_len is allowed */
    assert_int_equal(em_gpt_batch_steps_greedy(b, slots, toks, 2, room, next), EM_OK);
    assert_int_equal(em_gpt_batch_len(b, 0), MAX_LEN);
    for (int64_t k = 0; k < room && s[0].n - s[0].np < 35; k++)
        assert_int_equal(next[k * 2 + 1], s[0].ref[s[0].n++ - s[0].np]);
    em_gpt_batch_free(b);
    em_gpt_free(g);
}

static void test_multi_step_matches_generate(void **state)
{
    (void)state;
    multi_step_schedule(); /* graphs: each key's first step eager, then recorded and replayed */
    setenv("EMBER_DECODE_GRAPHS", "0", 1);
    multi_step_schedule();
    unsetenv("EMBER_DECODE_GRAPHS");
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_schedule_matches_generate),
        cmocka_unit_test(test_steps_of_a_bucket_launch_alike),
        cmocka_unit_test(test_replayed_steps_launch_nothing),
        cmocka_unit_test(test_schedule_without_graphs),
        cmocka_unit_test(test_schedule_when_recording_fails),
        cmocka_unit_test(test_multi_step_matches_generate),
    };
    return cmocka_run_group_tests_name("gpt_batch_static", tests, setup, teardown);
}
