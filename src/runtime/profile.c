/* profile.c — the launch profiler (docs/profiling.md): while it is on, em_launch comes here and
 * each launch is timed on the host (the whole em_launch call: argument checks and the driver's
 * launch) and on the device, and counted under its kernel's name; pool.c and device.c count
 * allocations, copies and syncs through em_rt_profile_count, and the tensor layer adds the bytes
 * each of its launches moves (em_profile_add_bytes). Off, em_launch and the counters test one
 * flag (em_rt_profiling) and do nothing else.
 *
 * Device time. On CUDA, an event is recorded before and after each launch and the pair is kept
 * pending; pairs are resolved (the stop event waited for, the time between the two read) when
 * the figures are read, when the device closes, or when MAX_PENDING pairs have piled up — so the
 * launches still run asynchronously, one after another on the stream, as without the profiler
 * (the events add about a microsecond of host time per launch, outside the host time measured).
 * The time between the events also covers the launch's metadata upload, a few hundred bytes on
 * the same stream. Every other backend is synced before and after each launch and the device
 * time is the wall time from the launch call to the end of the second sync: exact for one
 * kernel, but kernels no longer overlap with the host, so totals there show where the time goes,
 * not how long a run takes unprofiled. On the CPU, launches are synchronous anyway.
 *
 * One mutex guards everything below (taken only while profiling, or by the API calls). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "runtime/rt.h"

_Atomic int em_rt_profile_on;

#define MAX_PENDING 4096 /* CUDA event pairs waiting to be resolved */

typedef struct prof_kernel {
    char *name;            /* the kernel's name (owned copy) */
    em_profile_kernel fig; /* its figures */
} prof_kernel;

typedef struct pending {
    prof_kernel *pk; /* whose launch */
    em_device *dev;  /* the device that recorded the events */
    void *e0, *e1;   /* the driver's events before and after the launch */
} pending;

static struct {
    pthread_mutex_t lock;     /* guards the rest */
    em_map kernels;           /* name -> prof_kernel * */
    pending pend[MAX_PENDING]; /* unresolved event pairs */
    size_t npend;             /* how many */
    em_profile_counts c;      /* the totals (wall_s, kernels and compiles filled when read) */
    double wall_acc;          /* seconds of being on before t_on, since the last reset */
    double t_on;              /* when it was last turned on */
    uint64_t compiles0;       /* compiler runs at the last reset */
    bool reported;            /* em_profile_report was called (no report at exit) */
} P = {.lock = PTHREAD_MUTEX_INITIALIZER};

/* ---- device timings -------------------------------------------------------------------------- */

static bool uses_events(const em_device *dev)
{
    return dev->drv == &em_rt_cuda_driver && dev->drv->event_record && dev->drv->event_elapsed;
}

/* Resolves pending pair i (its events are destroyed). Called with the lock held. */
static void resolve(size_t i)
{
    pending *p = &P.pend[i];
    const em_driver *drv = p->dev->drv;
    double s = 0;
    if (drv->event_elapsed(p->dev->state, p->e0, p->e1, &s) == EM_OK && s >= 0) {
        p->pk->fig.device_s += s;
        P.c.launch_device_s += s;
    }
    drv->event_destroy(p->dev->state, p->e0);
    drv->event_destroy(p->dev->state, p->e1);
}

/* Resolves the pending pairs of dev (every pair when dev is NULL). Called with the lock held. */
static void resolve_pending(const em_device *dev)
{
    size_t kept = 0;
    for (size_t i = 0; i < P.npend; i++) {
        if (!dev || P.pend[i].dev == dev)
            resolve(i);
        else
            P.pend[kept++] = P.pend[i];
    }
    P.npend = kept;
}

void em_rt_profile_device_closing(em_device *dev)
{
    pthread_mutex_lock(&P.lock);
    resolve_pending(dev);
    pthread_mutex_unlock(&P.lock);
}

/* ---- recording ------------------------------------------------------------------------------- */

static _Atomic bool labels_on;          /* EMBER_PROFILE=shapes: launches counted per label */
static _Thread_local char tl_label[96]; /* this thread's label (em_profile_label), "" for none */

void em_profile_label(const char *label)
{
    if (!atomic_load(&labels_on)) return;
    snprintf(tl_label, sizeof tl_label, "%s", label ? label : "");
}

bool em_profile_labels_on(void)
{
    return atomic_load(&labels_on) && atomic_load(&em_rt_profile_on);
}

/* The name a launch of kernel `name` is counted under: "name label" while this thread has a label,
 * in buf. */
static const char *counted_name(const char *name, char *buf, size_t size)
{
    if (!tl_label[0] || !atomic_load(&labels_on)) return name;
    snprintf(buf, size, "%s %s", name, tl_label);
    return buf;
}

/* The entry of a kernel name, made on first use; NULL when out of memory. Called with the lock
 * held. */
static prof_kernel *entry(const char *name)
{
    prof_kernel *pk = em_map_gets(&P.kernels, name);
    if (pk)
        return pk;
    pk = calloc(1, sizeof(*pk));
    if (pk)
        pk->name = strdup(name);
    if (!pk || !pk->name || !em_map_puts(&P.kernels, name, pk)) {
        if (pk)
            free(pk->name);
        free(pk);
        return NULL;
    }
    return pk;
}

em_status em_rt_profile_launch(em_kernel *kernel, const uint32_t cube_count[3],
                               const uint32_t cube_dim[3], const em_arg *args, size_t nargs)
{
    if (!kernel)
        return em_rt_launch(kernel, cube_count, cube_dim, args, nargs);
    em_device *dev = kernel->dev;
    const em_driver *drv = dev->drv;
    bool events = uses_events(dev);
    void *e0 = NULL, *e1 = NULL;
    if (events) {
        if (drv->event_record(dev->state, &e0) != EM_OK)
            e0 = NULL; /* no device time for this launch */
    } else if (drv->sync) {
        (void)drv->sync(dev->state); /* earlier work is not this kernel's; a fault shows later */
    }
    double t0 = em_rt_now();
    em_status st = em_rt_launch(kernel, cube_count, cube_dim, args, nargs);
    double t1 = em_rt_now(), device_s = -1;
    if (st == EM_OK && events && e0 && drv->event_record(dev->state, &e1) != EM_OK)
        e1 = NULL;
    if (st == EM_OK && !events) {
        if (drv->sync)
            st = drv->sync(dev->state);
        device_s = em_rt_now() - t0;
    }
    char key[192];
    const char *name = counted_name(em_ir_kernel_name(kernel->ir), key, sizeof key);
    pthread_mutex_lock(&P.lock);
    prof_kernel *pk = st == EM_OK ? entry(name) : NULL;
    if (pk) {
        pk->fig.launches++;
        pk->fig.host_s += t1 - t0;
        P.c.launches++;
        P.c.launch_host_s += t1 - t0;
        if (device_s >= 0) {
            pk->fig.device_s += device_s;
            P.c.launch_device_s += device_s;
        }
    }
    if (pk && e0 && e1) {
        if (P.npend == MAX_PENDING)
            resolve_pending(NULL);
        P.pend[P.npend++] = (pending){pk, dev, e0, e1};
    } else {
        if (e0)
            drv->event_destroy(dev->state, e0);
        if (e1)
            drv->event_destroy(dev->state, e1);
    }
    pthread_mutex_unlock(&P.lock);
    return st;
}

void em_rt_profile_count(em_rt_prof_event what, uint64_t bytes)
{
    pthread_mutex_lock(&P.lock);
    switch (what) {
    case EM_RT_PROF_ALLOC: P.c.allocs++; break;
    case EM_RT_PROF_DEVICE_ALLOC: P.c.device_allocs++; break;
    case EM_RT_PROF_FREE: P.c.frees++; break;
    case EM_RT_PROF_WRITE: P.c.writes++, P.c.write_bytes += bytes; break;
    case EM_RT_PROF_READ: P.c.reads++, P.c.read_bytes += bytes; break;
    case EM_RT_PROF_COPY: P.c.copies++, P.c.copy_bytes += bytes; break;
    case EM_RT_PROF_SYNC: P.c.syncs++; break;
    }
    pthread_mutex_unlock(&P.lock);
}

void em_profile_add_bytes(const char *name, uint64_t read, uint64_t written)
{
    if (!atomic_load(&em_rt_profile_on) || !name)
        return;
    char key[192];
    name = counted_name(name, key, sizeof key);
    pthread_mutex_lock(&P.lock);
    prof_kernel *pk = entry(name);
    if (pk) {
        pk->fig.bytes_read += read;
        pk->fig.bytes_written += written;
    }
    P.c.bytes_read += read;
    P.c.bytes_written += written;
    pthread_mutex_unlock(&P.lock);
}

/* ---- the API --------------------------------------------------------------------------------- */

static uint64_t compiles_now(void)
{
    em_cache_stats cs;
    em_cache_stats_get(&cs);
    return cs.compiles;
}

void em_profile_enable(bool on)
{
    pthread_mutex_lock(&P.lock);
    bool was = atomic_load(&em_rt_profile_on) != 0;
    if (on && !was)
        P.t_on = em_rt_now();
    else if (!on && was)
        P.wall_acc += em_rt_now() - P.t_on;
    atomic_store(&em_rt_profile_on, on ? 1 : 0);
    pthread_mutex_unlock(&P.lock);
}

bool em_profile_enabled(void)
{
    return atomic_load(&em_rt_profile_on) != 0;
}

/* Frees every kernel entry. Called with the lock held and nothing pending. */
static void free_entries(void)
{
    size_t it = 0;
    const char *key;
    size_t len;
    void *v;
    while (em_map_next(&P.kernels, &it, &key, &len, &v)) {
        prof_kernel *pk = v;
        free(pk->name);
        free(pk);
    }
    em_map_free(&P.kernels);
    em_map_init(&P.kernels);
}

void em_profile_reset(void)
{
    pthread_mutex_lock(&P.lock);
    resolve_pending(NULL);
    free_entries();
    memset(&P.c, 0, sizeof(P.c));
    P.wall_acc = 0;
    P.t_on = em_rt_now();
    P.compiles0 = compiles_now();
    pthread_mutex_unlock(&P.lock);
}

/* The totals. Called with the lock held. */
static void totals_locked(em_profile_counts *out)
{
    resolve_pending(NULL);
    *out = P.c;
    out->wall_s = P.wall_acc + (atomic_load(&em_rt_profile_on) ? em_rt_now() - P.t_on : 0);
    out->kernels = P.kernels.count;
    out->compiles = compiles_now() - P.compiles0;
}

void em_profile_get(em_profile_counts *out)
{
    if (!out)
        return;
    pthread_mutex_lock(&P.lock);
    totals_locked(out);
    pthread_mutex_unlock(&P.lock);
}

bool em_profile_kernel_get(const char *name, em_profile_kernel *out)
{
    if (out)
        memset(out, 0, sizeof(*out));
    if (!name)
        return false;
    pthread_mutex_lock(&P.lock);
    resolve_pending(NULL);
    prof_kernel *pk = em_map_gets(&P.kernels, name);
    if (pk && out)
        *out = pk->fig;
    pthread_mutex_unlock(&P.lock);
    return pk != NULL;
}

/* Device time first, then host time, then the name: the largest cost on top. */
static int by_time(const void *a, const void *b)
{
    const prof_kernel *x = *(const prof_kernel *const *)a, *y = *(const prof_kernel *const *)b;
    if (x->fig.device_s != y->fig.device_s)
        return x->fig.device_s < y->fig.device_s ? 1 : -1;
    if (x->fig.host_s != y->fig.host_s)
        return x->fig.host_s < y->fig.host_s ? 1 : -1;
    return strcmp(x->name, y->name);
}

/* A byte count with a unit. */
static const char *bytes_str(uint64_t n, char *buf, size_t size)
{
    if (n >= (1u << 20))
        snprintf(buf, size, "%.1f MiB", (double)n / (1 << 20));
    else if (n >= 1024)
        snprintf(buf, size, "%.1f KiB", (double)n / 1024);
    else
        snprintf(buf, size, "%llu B", (unsigned long long)n);
    return buf;
}

/* One row: f's launches, times, share of device time, bytes (MiB) and bytes per device second. */
static void print_row(FILE *out, int w, const char *name, const em_profile_kernel *f,
                      double device_total)
{
    double dn = f->launches ? (double)f->launches : 1;
    double moved = (double)(f->bytes_read + f->bytes_written);
    char rate[32] = "-";
    if (moved > 0 && f->device_s > 0)
        snprintf(rate, sizeof rate, "%.1f", moved / f->device_s / 1e9);
    fprintf(out, "%-*.*s %9llu %10.3f %8.2f %10.3f %8.2f %6.1f %10.1f %11.1f %7s\n", w, w, name,
            (unsigned long long)f->launches, f->host_s * 1e3, f->host_s * 1e6 / dn,
            f->device_s * 1e3, f->device_s * 1e6 / dn,
            device_total > 0 ? 100.0 * f->device_s / device_total : 0.0,
            (double)f->bytes_read / (1 << 20), (double)f->bytes_written / (1 << 20), rate);
}

void em_profile_report(FILE *out)
{
    if (!out)
        out = stderr;
    pthread_mutex_lock(&P.lock);
    P.reported = true;
    em_profile_counts c;
    totals_locked(&c);
    size_t n = 0, it = 0;
    prof_kernel **rows = calloc(P.kernels.count ? P.kernels.count : 1, sizeof(*rows));
    const char *key;
    size_t len;
    void *v;
    int w = 6;
    while (rows && em_map_next(&P.kernels, &it, &key, &len, &v)) {
        rows[n++] = v;
        if ((int)len > w)
            w = len > 40 ? 40 : (int)len;
    }
    if (rows)
        qsort(rows, n, sizeof(*rows), by_time);
    fprintf(out, "ember profile: %.3f s of wall time, %llu launches of %llu kernels\n", c.wall_s,
            (unsigned long long)c.launches, (unsigned long long)c.kernels);
    fprintf(out, "%-*s %9s %10s %8s %10s %8s %6s %10s %11s %7s\n", w, "kernel", "launches",
            "host ms", "us/call", "device ms", "us/call", "dev %", "MiB read", "MiB written",
            "GB/s");
    for (size_t i = 0; i < n; i++)
        print_row(out, w, rows[i]->name, &rows[i]->fig, c.launch_device_s);
    if (!rows)
        fprintf(out, "(out of memory listing the kernels)\n");
    em_profile_kernel total = {c.launches, c.launch_host_s, c.launch_device_s, c.bytes_read,
                               c.bytes_written};
    print_row(out, w, "total", &total, c.launch_device_s);
    char b1[32], b2[32], b3[32];
    fprintf(out,
            "buffers: %llu allocs (%llu from the driver), %llu frees; copies: %llu host->device "
            "(%s), %llu device->host (%s), %llu device->device (%s); %llu syncs; %llu compiler "
            "runs\n",
            (unsigned long long)c.allocs, (unsigned long long)c.device_allocs,
            (unsigned long long)c.frees, (unsigned long long)c.writes,
            bytes_str(c.write_bytes, b1, sizeof b1), (unsigned long long)c.reads,
            bytes_str(c.read_bytes, b2, sizeof b2), (unsigned long long)c.copies,
            bytes_str(c.copy_bytes, b3, sizeof b3), (unsigned long long)c.syncs,
            (unsigned long long)c.compiles);
    fflush(out);
    free(rows);
    pthread_mutex_unlock(&P.lock);
}

/* ---- EMBER_PROFILE --------------------------------------------------------------------------- */

static void report_at_exit(void)
{
    pthread_mutex_lock(&P.lock);
    bool reported = P.reported;
    pthread_mutex_unlock(&P.lock);
    if (!reported)
        em_profile_report(stderr);
}

static pthread_once_t env_once = PTHREAD_ONCE_INIT;

static void read_env(void)
{
    const char *v = getenv("EMBER_PROFILE");
    if (!v || !*v || strcmp(v, "0") == 0)
        return;
    atomic_store(&labels_on, strcmp(v, "shapes") == 0);
    em_profile_reset();
    em_profile_enable(true);
    atexit(report_at_exit);
}

void em_rt_profile_init_env(void)
{
    pthread_once(&env_once, read_env);
}
