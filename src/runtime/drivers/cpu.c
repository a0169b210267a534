/* cpu.c — the CPU driver: host memory, kernels compiled to C by the system compiler and loaded
 * with dlopen, and launches spread over the global thread pool.
 *
 * Compiling: the C generator (codegen/c.c) writes one translation unit per batch; this driver
 * runs `$EMBER_CC $EMBER_CFLAGS -fPIC -shared -x c - -x none -o OUT -lm` with the source file as
 * standard input (default `cc -O3 -march=native -ffp-contract=off` on x86 and ARM hosts, without
 * -march=native elsewhere; both variables are split at whitespace) and captures the compiler's
 * output, which a failure shows. Reading the source from stdin keeps the temp file's name out of
 * the binary, so the same source gives the same bytes in every process. -O3 fully unrolls the
 * lane loops of lines and vectorizes them; -march=native lets them use the host's widest
 * registers; -ffp-contract=off keeps every a * b + c rounded twice, as the kernel says (fused
 * only through fma), whatever the host's instructions (see docs/matmul.md for the
 * measurements). The compiler identity in cache keys is the first line of
 * `$EMBER_CC --version`, the flags, EM_CPU_ABI_VERSION and the host CPU (model and feature
 * flags from /proc/cpuinfo, since -march=native binaries are for this CPU only); it is
 * recomputed when either variable changes.
 *
 * Launching: every generated kernel exports emk_NAME(launch, first, count) running a range of
 * cubes (c_abi.h). A launch of one cube, or a small one (at most 4096 units in the grid and 4096
 * scalars in its largest buffer), runs on the calling thread; larger grids are cut into a few
 * chunks per pool thread and run with em_threadpool_parallel_for. Launches are synchronous.
 *
 * Memory is 64-byte aligned host memory. $EMBER_CPU_MEMORY_LIMIT (bytes, or with a K/M/G suffix)
 * caps what the device hands out, so out-of-memory handling can be exercised; by default the cap
 * is the machine's physical memory. */
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <spawn.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/utsname.h>
#include <sys/wait.h>
#include <unistd.h>
#include "kernel/codegen/c_abi.h"
#include "kernel/codegen/codegen.h"
#include "kernel/lang/tma.h"
#include "runtime/rt.h"

extern char **environ;

#define DEFAULT_CC "cc"
#if defined(__x86_64__) || defined(__i386__) || defined(__aarch64__)
#define DEFAULT_CFLAGS "-O3 -march=native -ffp-contract=off"
#else
#define DEFAULT_CFLAGS "-O3 -ffp-contract=off"
#endif
#define FIXED_FLAGS "-fPIC -shared"
#define ALIGNMENT 64
#define MAX_OUTPUT_SHOWN 2500 /* the error message holds 4 KiB */
#define STACK_PARAMS 16
#define INLINE_WORK 4096 /* launches this small run on the calling thread (small_launch) */

typedef struct cpu_device {
    uint64_t limit;               /* bytes this device may hand out */
    _Atomic uint64_t allocated;   /* bytes handed out now */
    pthread_mutex_t cc_lock;      /* guards cc_spec and cc_id */
    char *cc_spec;                /* "CC\nCFLAGS" that cc_id was computed for */
    char cc_id[768];              /* compiler identity for cache keys */
} cpu_device;

/* ---- device ---------------------------------------------------------------------------------- */

static int cpu_probe(char *why, size_t why_size)
{
    (void)why;
    (void)why_size;
    return 1;
}

/* Parses "123", "64K", "512M", "2G"; 0 when empty or malformed. */
static uint64_t parse_bytes(const char *s)
{
    if (!s || !*s)
        return 0;
    char *end = NULL;
    unsigned long long v = strtoull(s, &end, 10);
    uint64_t mul = 1;
    if (*end == 'k' || *end == 'K')
        mul = 1ull << 10;
    else if (*end == 'm' || *end == 'M')
        mul = 1ull << 20;
    else if (*end == 'g' || *end == 'G')
        mul = 1ull << 30;
    else if (*end)
        return 0;
    return (uint64_t)v * mul;
}

static void cpu_model(char *out, size_t size)
{
    snprintf(out, size, "CPU");
    FILE *f = fopen("/proc/cpuinfo", "r");
    if (!f)
        return;
    char line[512];
    while (fgets(line, sizeof(line), f)) {
        if (strncmp(line, "model name", 10) != 0)
            continue;
        const char *colon = strchr(line, ':');
        if (!colon)
            break;
        colon++;
        while (*colon == ' ' || *colon == '\t')
            colon++;
        snprintf(out, size, "%s", colon);
        out[strcspn(out, "\n")] = '\0';
        break;
    }
    fclose(f);
}

/* The host CPU for cache keys: its model name and a hash of the /proc/cpuinfo lines that say
 * which instructions it has (vendor, family, model, feature flags), or "unknown". */
static void cpu_identity(char *out, size_t size)
{
    static const char *const keys[] = {"vendor_id", "cpu family", "model\t", "flags",
                                       "Features", "CPU implementer", "CPU part"};
    char model[96];
    cpu_model(model, sizeof(model));
    uint64_t h = 1469598103934665603ull; /* FNV-1a over the lines that matter */
    FILE *f = fopen("/proc/cpuinfo", "r");
    char line[4096];
    bool seen[sizeof(keys) / sizeof(keys[0])] = {false};
    while (f && fgets(line, sizeof(line), f)) {
        for (size_t k = 0; k < sizeof(keys) / sizeof(keys[0]); k++) {
            if (seen[k] || strncmp(line, keys[k], strlen(keys[k])) != 0)
                continue;
            seen[k] = true; /* the first processor's */
            for (const char *c = line; *c; c++)
                h = (h ^ (unsigned char)*c) * 1099511628211ull;
        }
    }
    if (f)
        fclose(f);
    snprintf(out, size, "%s %016llx", f ? model : "unknown", (unsigned long long)h);
}

static em_status cpu_open(int index, em_caps *caps, void **state)
{
    (void)index;
    cpu_device *d = calloc(1, sizeof(*d));
    if (!d)
        return em_set_error(EM_ERR_NOMEM, "out of memory");
    pthread_mutex_init(&d->cc_lock, NULL);
    long pages = sysconf(_SC_PHYS_PAGES), page = sysconf(_SC_PAGESIZE);
    uint64_t phys = pages > 0 && page > 0 ? (uint64_t)pages * (uint64_t)page : 0;
    uint64_t limit = parse_bytes(getenv("EMBER_CPU_MEMORY_LIMIT"));
    d->limit = limit ? limit : (phys ? phys : UINT64_MAX);

    memset(caps, 0, sizeof(*caps));
    snprintf(caps->target, sizeof(caps->target), "c");
    struct utsname u;
    snprintf(caps->arch, sizeof(caps->arch), "%.60s", uname(&u) == 0 ? u.machine : "unknown");
    long cores = sysconf(_SC_NPROCESSORS_ONLN);
    caps->compute_units = cores > 0 ? (uint32_t)cores : 1;
    char model[96];
    cpu_model(model, sizeof(model));
    snprintf(caps->device_name, sizeof(caps->device_name), "%s (%u threads)", model,
             caps->compute_units);
    caps->plane_dim = 1;
    caps->max_cube_units = 1024;
    caps->max_cube_dim[0] = 1024;
    caps->max_cube_dim[1] = 1024;
    caps->max_cube_dim[2] = 64;
    caps->max_shared = 1u << 20;
    caps->memory_total = d->limit == UINT64_MAX ? 0 : d->limit;
    for (int s = 0; s < EM_SCALAR_COUNT; s++)
        caps->dtype[s] = true;
    caps->float_atomic_add = true;
    caps->plane_ops = true;
    caps->matrix = false; /* cooperative matrices are lowered to loops */
    caps->print = true;
    *state = d;
    return EM_OK;
}

static void cpu_close(void *state)
{
    cpu_device *d = state;
    pthread_mutex_destroy(&d->cc_lock);
    free(d->cc_spec);
    free(d);
}

/* ---- memory ---------------------------------------------------------------------------------- */

static em_status cpu_alloc(void *state, size_t bytes, void **mem)
{
    cpu_device *d = state;
    size_t rounded = (bytes + ALIGNMENT - 1) / ALIGNMENT * ALIGNMENT;
    if (rounded < bytes)
        return em_set_error(EM_ERR_NOMEM, "cpu: %zu bytes is too large", bytes);
    uint64_t old = atomic_load(&d->allocated);
    do {
        if (old > d->limit || rounded > d->limit - old)
            return em_set_error(EM_ERR_NOMEM, "cpu: out of memory (%zu bytes asked, %llu of "
                                "%llu in use)", bytes, (unsigned long long)old,
                                (unsigned long long)d->limit);
    } while (!atomic_compare_exchange_weak(&d->allocated, &old, old + rounded));
    void *p = aligned_alloc(ALIGNMENT, rounded ? rounded : ALIGNMENT);
    if (!p) {
        atomic_fetch_sub(&d->allocated, rounded);
        return em_set_error(EM_ERR_NOMEM, "cpu: out of host memory allocating %zu bytes", bytes);
    }
    *mem = p;
    return EM_OK;
}

static void cpu_free(void *state, void *mem, size_t bytes)
{
    cpu_device *d = state;
    free(mem);
    atomic_fetch_sub(&d->allocated, (bytes + ALIGNMENT - 1) / ALIGNMENT * ALIGNMENT);
}

static em_status cpu_write(void *state, void *mem, size_t offset, const void *src, size_t bytes)
{
    (void)state;
    memmove((char *)mem + offset, src, bytes);
    return EM_OK;
}

static em_status cpu_read(void *state, const void *mem, size_t offset, void *dst, size_t bytes)
{
    (void)state;
    memmove(dst, (const char *)mem + offset, bytes);
    return EM_OK;
}

static em_status cpu_copy(void *state, void *dst, size_t dst_offset, const void *src,
                          size_t src_offset, size_t bytes)
{
    (void)state;
    memmove((char *)dst + dst_offset, (const char *)src + src_offset, bytes);
    return EM_OK;
}

/* ---- running the compiler -------------------------------------------------------------------- */

/* Splits s at whitespace into argv (malloc'd array and strings; NULL-terminated). */
static char **split_words(const char *s, size_t *n)
{
    size_t cap = 8, len = 0;
    char **argv = malloc(cap * sizeof(*argv));
    if (!argv)
        return NULL;
    while (s && *s) {
        while (*s == ' ' || *s == '\t' || *s == '\n')
            s++;
        size_t w = strcspn(s, " \t\n");
        if (!w)
            break;
        if (len + 2 > cap) {
            char **grown = realloc(argv, (cap *= 2) * sizeof(*argv));
            if (!grown)
                goto oom;
            argv = grown;
        }
        if (!(argv[len] = strndup(s, w)))
            goto oom;
        len++;
        s += w;
    }
    argv[len] = NULL;
    *n = len;
    return argv;
oom:
    for (size_t i = 0; i < len; i++)
        free(argv[i]);
    free(argv);
    return NULL;
}

static void free_words(char **argv)
{
    for (size_t i = 0; argv && argv[i]; i++)
        free(argv[i]);
    free(argv);
}

/* Runs argv with stdin from stdin_path (NULL: /dev/null), collecting stdout and stderr into out.
 * Returns 0 and sets *status (waitpid status) when it ran, else the errno of the failed spawn. */
static int run_capture(char *const *argv, const char *stdin_path, em_strbuf *out, int *status)
{
    int fds[2];
    if (pipe2(fds, O_CLOEXEC) != 0)
        return errno;
    posix_spawn_file_actions_t fa;
    posix_spawn_file_actions_init(&fa);
    posix_spawn_file_actions_addopen(&fa, 0, stdin_path ? stdin_path : "/dev/null", O_RDONLY, 0);
    posix_spawn_file_actions_adddup2(&fa, fds[1], 1);
    posix_spawn_file_actions_adddup2(&fa, fds[1], 2);
    pid_t pid;
    int err = posix_spawnp(&pid, argv[0], &fa, NULL, argv, environ);
    posix_spawn_file_actions_destroy(&fa);
    close(fds[1]);
    if (err) {
        close(fds[0]);
        return err;
    }
    char chunk[4096];
    for (;;) {
        ssize_t r = read(fds[0], chunk, sizeof(chunk));
        if (r < 0 && errno == EINTR)
            continue;
        if (r <= 0)
            break;
        if (out->len < 65536)
            em_sb_appendn(out, chunk, (size_t)r);
    }
    close(fds[0]);
    while (waitpid(pid, status, 0) < 0) {
        if (errno != EINTR) {
            *status = -1;
            break;
        }
    }
    return 0;
}

static const char *env_or(const char *name, const char *fallback)
{
    const char *v = getenv(name);
    return v && *v ? v : fallback;
}

static em_status cpu_compiler_id(void *state, char *out, size_t out_size)
{
    cpu_device *d = state;
    const char *cc = env_or("EMBER_CC", DEFAULT_CC);
    const char *cflags = env_or("EMBER_CFLAGS", DEFAULT_CFLAGS);
    size_t spec_len = strlen(cc) + strlen(cflags) + 2;
    char *spec = malloc(spec_len);
    if (!spec)
        return em_set_error(EM_ERR_NOMEM, "out of memory");
    snprintf(spec, spec_len, "%s\n%s", cc, cflags);
    pthread_mutex_lock(&d->cc_lock);
    if (!d->cc_spec || strcmp(d->cc_spec, spec) != 0) {
        char version[256] = "";
        size_t n = 0;
        char **argv = split_words(cc, &n);
        char **full = argv && n ? realloc(argv, (n + 2) * sizeof(*argv)) : NULL;
        if (full) {
            argv = full;
            argv[n] = strdup("--version");
            argv[n + 1] = NULL;
            em_strbuf sb;
            em_sb_init(&sb);
            int status = 0;
            if (argv[n] && run_capture(argv, NULL, &sb, &status) == 0 && WIFEXITED(status) &&
                WEXITSTATUS(status) == 0 && sb.data) {
                snprintf(version, sizeof(version), "%.*s", (int)strcspn(sb.data, "\n"), sb.data);
            }
            em_sb_free(&sb);
        }
        free_words(argv);
        if (!version[0])
            snprintf(version, sizeof(version), "unavailable");
        char host[160];
        cpu_identity(host, sizeof(host));
        snprintf(d->cc_id, sizeof(d->cc_id), "%s | cc=%s | flags=%s %s | abi=%d | host=%s",
                 version, cc, cflags, FIXED_FLAGS, EM_CPU_ABI_VERSION, host);
        free(d->cc_spec);
        d->cc_spec = spec;
        spec = NULL;
        EM_LOGD("cpu: compiler identity: %s", d->cc_id);
    }
    snprintf(out, out_size, "%s", d->cc_id);
    pthread_mutex_unlock(&d->cc_lock);
    free(spec);
    return EM_OK;
}

static char *cpu_generate(void *state, const em_ir_kernel *const *ks, size_t n, const em_caps *caps)
{
    (void)state;
    return em_codegen_c(ks, n, caps);
}

/* Appends the words of a command line, for messages. */
static void describe_command(em_strbuf *sb, char *const *argv)
{
    for (size_t i = 0; argv[i]; i++)
        em_sb_printf(sb, "%s%s", i ? " " : "", argv[i]);
}

static em_status cpu_build(void *state, const char *source, const char *out_path)
{
    (void)state;
    const char *cc = env_or("EMBER_CC", DEFAULT_CC);
    const char *cflags = env_or("EMBER_CFLAGS", DEFAULT_CFLAGS);
    char src_path[4096];
    snprintf(src_path, sizeof(src_path), "%s.c", out_path);
    FILE *f = fopen(src_path, "w");
    if (!f)
        return em_set_error(EM_ERR_IO, "cpu: cannot write %s: %s", src_path, strerror(errno));
    bool written = fputs(source, f) >= 0;
    written = fclose(f) == 0 && written;
    if (!written) {
        unlink(src_path);
        return em_set_error(EM_ERR_IO, "cpu: cannot write %s", src_path);
    }

    em_strbuf cmd;
    em_sb_init(&cmd);
    em_sb_printf(&cmd, "%s %s " FIXED_FLAGS " -x c - -x none -o", cc, cflags);
    size_t n = 0;
    char **argv = split_words(cmd.data, &n);
    em_sb_free(&cmd);
    char **full = argv ? realloc(argv, (n + 4) * sizeof(*argv)) : NULL;
    if (!full) {
        free_words(argv);
        unlink(src_path);
        return em_set_error(EM_ERR_NOMEM, "out of memory");
    }
    argv = full;
    argv[n] = strdup(out_path);
    argv[n + 1] = strdup("-lm");
    argv[n + 2] = NULL;
    if (!argv[n] || !argv[n + 1]) {
        for (size_t i = n; i < n + 2; i++)
            free(argv[i]);
        argv[n] = NULL;
        free_words(argv);
        unlink(src_path);
        return em_set_error(EM_ERR_NOMEM, "out of memory");
    }

    em_strbuf output;
    em_sb_init(&output);
    int status = 0;
    int err = run_capture(argv, src_path, &output, &status);
    em_status st = EM_OK;
    if (err) {
        st = em_set_error(EM_ERR_COMPILE,
                          "cannot run the C compiler '%s': %s (set EMBER_CC to a working C "
                          "compiler; source kept at %s)",
                          argv[0], strerror(err), src_path);
    } else if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) {
        em_strbuf how;
        em_sb_init(&how);
        describe_command(&how, argv);
        char reason[64];
        if (status == -1)
            snprintf(reason, sizeof(reason), "could not be waited for");
        else if (WIFSIGNALED(status))
            snprintf(reason, sizeof(reason), "was killed by signal %d", WTERMSIG(status));
        else
            snprintf(reason, sizeof(reason), "exited with status %d", WEXITSTATUS(status));
        const char *text = output.data && output.len ? output.data : "(no output)\n";
        int shown = (int)EM_MIN(strlen(text), (size_t)MAX_OUTPUT_SHOWN);
        st = em_set_error(EM_ERR_COMPILE,
                          "C compiler '%s' %s\ncommand: %s\nsource: %s\ncompiler output:\n%.*s%s",
                          argv[0], reason, how.data ? how.data : "?", src_path, shown, text,
                          (size_t)shown < strlen(text) ? "\n[... output truncated]" : "");
        em_sb_free(&how);
    } else {
        unlink(src_path);
    }
    em_sb_free(&output);
    free_words(argv);
    return st;
}

/* ---- modules --------------------------------------------------------------------------------- */

static em_status cpu_load(void *state, const char *path, void **module)
{
    (void)state;
    void *h = dlopen(path, RTLD_NOW | RTLD_LOCAL);
    if (!h) {
        const char *why = dlerror();
        return em_set_error(EM_ERR_CORRUPT, "cpu: cannot load %s: %s", path, why ? why : "?");
    }
    *module = h;
    return EM_OK;
}

static void cpu_unload(void *state, void *module)
{
    (void)state;
    dlclose(module);
}

static em_status cpu_function(void *state, void *module, const char *kernel_name, void **fn)
{
    (void)state;
    char sym[300];
    snprintf(sym, sizeof(sym), "emk_%s", kernel_name);
    dlerror();
    void *p = dlsym(module, sym);
    if (!p)
        return em_set_error(EM_ERR_NOT_FOUND, "cpu: the module has no function %s", sym);
    *fn = p;
    return EM_OK;
}

/* ---- launching ------------------------------------------------------------------------------- */

typedef struct chunk_job {
    em_cpu_kernel_fn fn;        /* the kernel */
    const em_cpu_launch *L;     /* its arguments and grid */
    uint64_t cubes;             /* cubes in the grid */
    uint64_t per_chunk;         /* cubes per chunk */
} chunk_job;

static void run_chunk(void *ctx, size_t index, unsigned worker)
{
    (void)worker;
    const chunk_job *job = ctx;
    uint64_t first = (uint64_t)index * job->per_chunk;
    if (first < job->cubes)
        job->fn(job->L, first, EM_MIN(job->per_chunk, job->cubes - first));
}

/* True for a launch too small to be worth the pool: units in the grid and scalars in its largest
 * buffer both at most INLINE_WORK. Handing cubes to a pool thread costs a wake-up and a wait for
 * its report (tens of microseconds, more on a busy machine), more than an elementwise kernel
 * takes for a few thousand elements on one thread. The largest buffer stands for the work of
 * kernels that loop inside a unit (matmul's cubes are one unit each). */
static bool small_launch(const em_drv_launch *launch, uint64_t cubes)
{
    uint64_t work = cubes * launch->cube_dim[0] * launch->cube_dim[1] * launch->cube_dim[2];
    for (size_t i = 0; i < launch->nargs && work <= INLINE_WORK; i++) {
        const em_drv_arg *a = &launch->args[i];
        if (a->kind == EM_PARAM_BUFFER && a->len * a->type.lanes > work)
            work = a->len * a->type.lanes;
    }
    return work <= INLINE_WORK;
}

static em_status cpu_launch(void *state, void *fn_ptr, const em_drv_launch *launch)
{
    (void)state;
    em_cpu_buf bufs_stack[STACK_PARAMS];
    em_cpu_scalar scalars_stack[STACK_PARAMS];
    em_cpu_buf *bufs = bufs_stack;
    em_cpu_scalar *scalars = scalars_stack;
    size_t n = launch->nargs;
    if (n > STACK_PARAMS) {
        bufs = calloc(n, sizeof(*bufs));
        scalars = calloc(n, sizeof(*scalars));
        if (!bufs || !scalars) {
            free(bufs);
            free(scalars);
            return em_set_error(EM_ERR_NOMEM, "cpu: out of memory launching");
        }
    }
    for (size_t i = 0; i < n; i++) {
        const em_drv_arg *a = &launch->args[i];
        memset(&bufs[i], 0, sizeof(bufs[i]));
        memset(&scalars[i], 0, sizeof(scalars[i]));
        if (a->kind == EM_PARAM_BUFFER) {
            bufs[i].data = (char *)a->mem + a->offset;
            bufs[i].len = a->len;
            bufs[i].shape = a->shape;
            bufs[i].stride = a->stride;
        } else {
            memcpy(&scalars[i], &a->value, sizeof(scalars[i]));
        }
    }
    em_cpu_launch L;
    L.bufs = bufs;
    L.scalars = scalars;
    memcpy(L.cube_dim, launch->cube_dim, sizeof(L.cube_dim));
    memcpy(L.cube_count, launch->cube_count, sizeof(L.cube_count));
    em_cpu_kernel_fn fn;
    memcpy(&fn, &fn_ptr, sizeof(fn)); /* dlsym's object pointer to a function pointer */
    uint64_t cubes = (uint64_t)L.cube_count[0] * L.cube_count[1] * L.cube_count[2];
    em_threadpool *pool = cubes > 1 && !small_launch(launch, cubes) ? em_threadpool_global() : NULL;
    if (!pool) {
        fn(&L, 0, cubes);
    } else {
        uint64_t chunks = EM_MIN(cubes, (uint64_t)em_threadpool_size(pool) * 4);
        chunk_job job = {fn, &L, cubes, (cubes + chunks - 1) / chunks};
        chunks = (cubes + job.per_chunk - 1) / job.per_chunk;
        em_threadpool_parallel_for(pool, (size_t)chunks, 1, run_chunk, &job);
    }
    if (bufs != bufs_stack) {
        free(bufs);
        free(scalars);
    }
    return EM_OK;
}

static em_status cpu_sync(void *state)
{
    (void)state;
    return EM_OK; /* launches are synchronous */
}

/* The CPU form of a tensor map (kernel/lang/tma.h): the geometry the emulated tma_load reads. */
static em_status cpu_tensor_map(void *state, void *mem, size_t offset, const em_tensor_map_desc *d,
                                uint64_t *out)
{
    (void)state, (void)mem;
    size_t es = em_scalar_size(d->dtype);
    out[EM_TMA_W_MAGIC] = EM_TMA_MAGIC;
    for (unsigned i = 0; i < 3; i++) {
        out[EM_TMA_W_DIM + i] = d->dims[i];
        out[EM_TMA_W_BOX + i] = d->box[i];
    }
    out[EM_TMA_W_STRIDE] = d->strides[1];
    out[EM_TMA_W_STRIDE + 1] = d->strides[2];
    out[EM_TMA_W_SWIZZLE] = d->swizzle;
    out[EM_TMA_W_ESIZE] = es;
    out[EM_TMA_W_OFFSET] = offset / es;
    return EM_OK;
}

const em_driver em_rt_cpu_driver = {
    .name = "cpu",
    .target = "c",
    .binary_ext = ".so",
    .probe = cpu_probe,
    .open = cpu_open,
    .close = cpu_close,
    .alloc = cpu_alloc,
    .free = cpu_free,
    .write = cpu_write,
    .read = cpu_read,
    .copy = cpu_copy,
    .generate = cpu_generate,
    .compiler_id = cpu_compiler_id,
    .build = cpu_build,
    .load = cpu_load,
    .unload = cpu_unload,
    .function = cpu_function,
    .launch = cpu_launch,
    .sync = cpu_sync,
    .event_record = NULL,
    .event_elapsed = NULL,
    .event_destroy = NULL,
    .tensor_map = cpu_tensor_map,
};
