/* vulkan_spirv.c — the compiling and loading half of the Vulkan driver (vulkan.c has the rest):
 * GLSL -> SPIR-V, the binary files in the kernel cache, SPIR-V reflection, and shader modules,
 * layouts and pipelines.
 *
 * Source: the GLSL generator writes one GLSL 450 compute shader per kernel; a batch is the
 * shaders one after another, each opened by a line `//@@ember-kernel NAME`. Text before the first
 * such line, if any, is a preamble shared by every shader of the batch.
 *
 * Compilers, loaded or found at run time so that no build needs them:
 *  - libshaderc (dlopen "libshaderc.so.1", or libshaderc_shared.so.1 as the LunarG SDK names it,
 *    or the file $EMBER_SHADERC_LIB names), in process;
 *  - else the glslangValidator executable (glslang-tools; $EMBER_GLSLANG names another), which
 *    is the same glslang front end that shaderc wraps. Debian 12's libshaderc1 (2023.2-1) cannot
 *    be loaded at all (it was built without its glslang and SPIRV-Tools dependencies: dlopen says
 *    "undefined symbol"), so there this is the path taken.
 * $EMBER_VK_COMPILER=shaderc|glslang forces one. The compiler's identity (library and SPIR-V
 * version, or glslangValidator's version line), the target environment and the ABI versions go
 * into compiler_id and so into every cache key.
 *
 * Binaries: a batch of one kernel is stored as a plain SPIR-V module — `spirv-val` and
 * `spirv-dis` read cache entries directly — whose entry point is renamed from "main" to the
 * kernel's name, so a module names the kernels it holds. A batch of several kernels is a small
 * container (all words little-endian u32):
 *     "EMBS" "PVB1"   magic (8 bytes)
 *     count           number of modules (1..4096)
 *     count x { words; words u32 of one SPIR-V module }
 * load accepts either, checks every header, instruction length and the entry point before any
 * of it reaches the driver, and fails with EM_ERR_CORRUPT on anything malformed.
 *
 * Reflection: from each module the loader reads the entry point, the storage-buffer bindings of
 * descriptor set 0, the push-constant block's members (offset and type, in order), LocalSize and
 * which of specialization constants 0/1/2 exist. Descriptor-set and pipeline layouts follow from
 * it; a pipeline is made per cube dimension on first launch (specialization constants 0, 1, 2 =
 * the cube dimension) and kept in the kernel. */
#include <errno.h>
#include <fcntl.h>
#include <spawn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>
#include <dlfcn.h>
#include "runtime/drivers/vulkan_internal.h"

extern char **environ;

#define SEPARATOR "//@@ember-kernel "
#define BATCH_MAGIC "EMBSPVB1"
#define MAX_BATCH 4096
#define MAX_LOG_SHOWN 2500 /* the error message holds 4 KiB */
#define SPIRV_MAGIC 0x07230203u

/* ---- libshaderc, dlopen'd -------------------------------------------------------------------- */

/* shaderc's C API, declared here so that no build needs its headers; the values are those of
 * shaderc/shaderc.h, env.h and status.h, which are stable ABI. */
typedef struct sc_compiler *sc_compiler_t;
typedef struct sc_options *sc_options_t;
typedef struct sc_result *sc_result_t;
enum {
    SC_COMPUTE_SHADER = 2,    /* shaderc_compute_shader */
    SC_TARGET_ENV_VULKAN = 0, /* shaderc_target_env_vulkan */
    SC_OPT_PERFORMANCE = 2,   /* shaderc_optimization_level_performance */
    SC_STATUS_SUCCESS = 0,    /* shaderc_compilation_status_success */
};

static struct {
    pthread_once_t once;
    void *lib;              /* the library, or NULL (why says why) */
    char path[256];         /* what was opened */
    char why[512];          /* why no library could be used */
    sc_compiler_t compiler; /* one compiler for the process (thread-safe) */
    char version[160];      /* "spv 1.6 rev 1": the SPIR-V it writes */
    sc_compiler_t (*compiler_initialize)(void);
    sc_options_t (*options_initialize)(void);
    void (*options_release)(sc_options_t);
    void (*set_target_env)(sc_options_t, int, uint32_t);
    void (*set_optimization_level)(sc_options_t, int);
    sc_result_t (*compile_into_spv)(sc_compiler_t, const char *, size_t, int, const char *,
                                    const char *, sc_options_t);
    void (*result_release)(sc_result_t);
    size_t (*result_get_length)(sc_result_t);
    const char *(*result_get_bytes)(sc_result_t);
    int (*result_get_compilation_status)(sc_result_t);
    const char *(*result_get_error_message)(sc_result_t);
    void (*get_spv_version)(unsigned *, unsigned *);
} SC = {.once = PTHREAD_ONCE_INIT};

static bool sc_bind(void *lib)
{
#define SYM(field, name)                                                                           \
    if (!(*(void **)&SC.field = dlsym(lib, name))) return false;
    SYM(compiler_initialize, "shaderc_compiler_initialize")
    SYM(options_initialize, "shaderc_compile_options_initialize")
    SYM(options_release, "shaderc_compile_options_release")
    SYM(set_target_env, "shaderc_compile_options_set_target_env")
    SYM(set_optimization_level, "shaderc_compile_options_set_optimization_level")
    SYM(compile_into_spv, "shaderc_compile_into_spv")
    SYM(result_release, "shaderc_result_release")
    SYM(result_get_length, "shaderc_result_get_length")
    SYM(result_get_bytes, "shaderc_result_get_bytes")
    SYM(result_get_compilation_status, "shaderc_result_get_compilation_status")
    SYM(result_get_error_message, "shaderc_result_get_error_message")
    SYM(get_spv_version, "shaderc_get_spv_version")
#undef SYM
    return true;
}

static void sc_load(void)
{
    const char *env = getenv("EMBER_SHADERC_LIB");
    const char *names[] = {"libshaderc.so.1", "libshaderc_shared.so.1", "libshaderc_shared.so",
                           "libshaderc.so"};
    size_t used = 0;
    for (size_t i = 0; i < (env && *env ? 1 : EM_ARRAY_LEN(names)); i++) {
        const char *name = env && *env ? env : names[i];
        dlerror();
        void *lib = dlopen(name, RTLD_NOW | RTLD_LOCAL);
        if (!lib) {
            const char *e = dlerror();
            if (used < sizeof(SC.why))
                used += (size_t)snprintf(SC.why + used, sizeof(SC.why) - used, "%s%s",
                                         used ? "; " : "", e ? e : name);
            continue;
        }
        if (!sc_bind(lib)) {
            if (used < sizeof(SC.why))
                used += (size_t)snprintf(SC.why + used, sizeof(SC.why) - used,
                                         "%s%s lacks the shaderc C API", used ? "; " : "", name);
            dlclose(lib);
            continue;
        }
        SC.compiler = SC.compiler_initialize();
        if (!SC.compiler) {
            if (used < sizeof(SC.why))
                used += (size_t)snprintf(SC.why + used, sizeof(SC.why) - used,
                                         "%sshaderc_compiler_initialize failed in %s",
                                         used ? "; " : "", name);
            dlclose(lib);
            continue;
        }
        SC.lib = lib;
        snprintf(SC.path, sizeof(SC.path), "%s", name);
        unsigned v = 0, r = 0;
        SC.get_spv_version(&v, &r);
        snprintf(SC.version, sizeof(SC.version), "spv %u.%u rev %u", (v >> 16) & 0xff,
                 (v >> 8) & 0xff, r);
        SC.why[0] = '\0';
        return;
    }
}

/* ---- glslangValidator ------------------------------------------------------------------------ */

static struct {
    pthread_mutex_t lock;
    char *exe;         /* the executable the version is for */
    char version[160]; /* its first --version line ("" when it cannot run) */
} GT = {.lock = PTHREAD_MUTEX_INITIALIZER};

/* Runs argv with stdin from /dev/null, collecting stdout and stderr into out. Returns 0 and sets
 * *status (waitpid status) when it ran, else the errno of the failed spawn. */
static int run_capture(char *const *argv, em_strbuf *out, int *status)
{
    int fds[2];
    if (pipe2(fds, O_CLOEXEC) != 0) return errno;
    posix_spawn_file_actions_t fa;
    posix_spawn_file_actions_init(&fa);
    posix_spawn_file_actions_addopen(&fa, 0, "/dev/null", O_RDONLY, 0);
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
        if (r < 0 && errno == EINTR) continue;
        if (r <= 0) break;
        if (out->len < 65536) em_sb_appendn(out, chunk, (size_t)r);
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

static const char *glslang_exe(void)
{
    const char *e = getenv("EMBER_GLSLANG");
    return e && *e ? e : "glslangValidator";
}

/* The executable's version line into out ("" when it does not run). */
static void glslang_version(const char *exe, char *out, size_t size)
{
    pthread_mutex_lock(&GT.lock);
    if (!GT.exe || strcmp(GT.exe, exe) != 0) {
        free(GT.exe);
        GT.exe = strdup(exe);
        GT.version[0] = '\0';
        char *argv[] = {(char *)exe, "--version", NULL};
        em_strbuf sb;
        em_sb_init(&sb);
        int status = 0;
        if (run_capture(argv, &sb, &status) == 0 && WIFEXITED(status) && WEXITSTATUS(status) == 0 &&
            sb.data && sb.len)
            snprintf(GT.version, sizeof(GT.version), "%.*s", (int)strcspn(sb.data, "\n"), sb.data);
        em_sb_free(&sb);
    }
    snprintf(out, size, "%s", GT.version);
    pthread_mutex_unlock(&GT.lock);
}

/* ---- choosing the compiler ------------------------------------------------------------------- */

typedef struct compiler_choice {
    em_vk_compiler_kind kind;
    char exe[256];   /* glslangValidator: the executable */
    char ident[480]; /* identity for compiler_id */
} compiler_choice;

/* Picks the compiler ($EMBER_VK_COMPILER, else shaderc when it loads, else glslangValidator).
 * EM_ERR_UNSUPPORTED (error set, saying what was tried) when neither works. */
static em_status choose_compiler(compiler_choice *c)
{
    const char *force = getenv("EMBER_VK_COMPILER");
    bool want_sc = !force || !*force || strcmp(force, "auto") == 0 || strcmp(force, "shaderc") == 0;
    bool want_gl = !force || !*force || strcmp(force, "auto") == 0 || strcmp(force, "glslang") == 0;
    if (!want_sc && !want_gl)
        return em_set_error(EM_ERR_INVALID,
                            "vulkan: EMBER_VK_COMPILER is '%s'; expected "
                            "shaderc, glslang or auto",
                            force);
    memset(c, 0, sizeof(*c));
    if (want_sc) {
        pthread_once(&SC.once, sc_load);
        if (SC.lib) {
            c->kind = EM_VK_SHADERC;
            snprintf(c->ident, sizeof(c->ident), "shaderc %.160s (%.255s)", SC.version, SC.path);
            return EM_OK;
        }
    }
    char version[160] = "";
    if (want_gl) {
        snprintf(c->exe, sizeof(c->exe), "%s", glslang_exe());
        glslang_version(c->exe, version, sizeof(version));
        if (version[0]) {
            c->kind = EM_VK_GLSLANG_TOOL;
            snprintf(c->ident, sizeof(c->ident), "glslangValidator %s (%s)", version, c->exe);
            return EM_OK;
        }
    }
    return em_set_error(EM_ERR_UNSUPPORTED, "vulkan: no GLSL compiler: %s%s%s%s%s",
                        want_sc ? "libshaderc: " : "", want_sc ? SC.why : "",
                        want_sc && want_gl ? "; " : "", want_gl ? glslang_exe() : "",
                        want_gl ? " cannot be run (install glslang-tools, or a working "
                                  "libshaderc.so.1)"
                                : "");
}

em_status em_rt_vk_compiler_id(void *state, char *out, size_t out_size)
{
    em_vk_device *d = state;
    const char *f = getenv("EMBER_VK_COMPILER"), *l = getenv("EMBER_SHADERC_LIB");
    char spec[600];
    snprintf(spec, sizeof(spec), "%s\n%s\n%s", f ? f : "", l ? l : "", glslang_exe());
    pthread_mutex_lock(&d->cc_lock);
    em_status st = EM_OK;
    if (!d->cc_spec || strcmp(d->cc_spec, spec) != 0) {
        compiler_choice c;
        st = choose_compiler(&c);
        if (st == EM_OK) {
            snprintf(d->cc_id, sizeof(d->cc_id), "%s | target %s | driver abi %d", c.ident,
                     d->env_name, EM_VK_DRIVER_ABI);
            free(d->cc_spec);
            d->cc_spec = strdup(spec);
            EM_LOGD("vulkan: compiler identity: %s", d->cc_id);
        }
    }
    if (st == EM_OK) snprintf(out, out_size, "%s", d->cc_id);
    pthread_mutex_unlock(&d->cc_lock);
    return st;
}

/* ---- compiling one shader -------------------------------------------------------------------- */

typedef struct spirv {
    uint32_t *words;
    size_t n;
} spirv;

/* Appends the compiler's log to sb, replacing `path` (a temp file name) by `shown`, cut at
 * MAX_LOG_SHOWN bytes, and then the source line the first error points at. */
static void quote_log(em_strbuf *sb, const char *log, const char *path, const char *shown,
                      const char *src)
{
    size_t plen = path ? strlen(path) : 0;
    size_t start = sb->len;
    em_strbuf text;
    em_sb_init(&text);
    for (const char *p = log; *p;) {
        if (plen && strncmp(p, path, plen) == 0) {
            em_sb_append(&text, shown);
            p += plen;
        } else {
            em_sb_appendc(&text, *p++);
        }
    }
    /* line by line, without glslangValidator's file-name banner, blank lines and trailer */
    for (const char *p = text.data ? text.data : ""; *p && sb->len - start < MAX_LOG_SHOWN;) {
        size_t n = strcspn(p, "\n");
        size_t t = n;
        while (t && (p[t - 1] == ' ' || p[t - 1] == '\r')) t--;
        bool skip = t == 0 || (t == strlen(shown) && strncmp(p, shown, t) == 0) ||
                    strncmp(p, "SPIR-V is not generated", 23) == 0;
        if (!skip) em_sb_printf(sb, "%s%.*s", sb->len > start ? "\n" : "", (int)t, p);
        p += n + (p[n] == '\n');
    }
    em_sb_free(&text);
    /* "NAME.comp:12: error" (shaderc) or "ERROR: NAME.comp:12:" (glslang) */
    char needle[320];
    snprintf(needle, sizeof(needle), "%s:", shown);
    const char *at = sb->data ? strstr(sb->data + start, needle) : NULL;
    long line = 0;
    if (at) line = strtol(at + strlen(needle), NULL, 10);
    if (line > 0) {
        const char *s = src;
        for (long i = 1; i < line && s; i++) {
            s = strchr(s, '\n');
            if (s) s++;
        }
        if (s && *s) em_sb_printf(sb, "\n  %ld | %.*s", line, (int)strcspn(s, "\n"), s);
    }
}

static em_status compile_shaderc(em_vk_device *d, const char *name, const char *src, spirv *out)
{
    sc_options_t opts = SC.options_initialize();
    if (!opts)
        return em_set_error(EM_ERR_NOMEM, "vulkan: shaderc_compile_options_initialize failed");
    SC.set_target_env(opts, SC_TARGET_ENV_VULKAN, d->spirv_env);
    SC.set_optimization_level(opts, SC_OPT_PERFORMANCE);
    char file[300];
    snprintf(file, sizeof(file), "%s.comp", name);
    sc_result_t r =
        SC.compile_into_spv(SC.compiler, src, strlen(src), SC_COMPUTE_SHADER, file, "main", opts);
    SC.options_release(opts);
    if (!r)
        return em_set_error(EM_ERR_NOMEM, "vulkan: shaderc_compile_into_spv returned no result");
    em_status st = EM_OK;
    if (SC.result_get_compilation_status(r) != SC_STATUS_SUCCESS) {
        em_strbuf sb;
        em_sb_init(&sb);
        quote_log(&sb, SC.result_get_error_message(r), NULL, file, src);
        st = em_set_error(EM_ERR_COMPILE,
                          "vulkan: shaderc failed to compile kernel %s (GLSL "
                          "-> SPIR-V):\n%s",
                          name, sb.data ? sb.data : "");
        em_sb_free(&sb);
    } else {
        size_t len = SC.result_get_length(r);
        out->words = malloc(len ? len : 4);
        if (!out->words) {
            st = em_set_error(EM_ERR_NOMEM, "out of memory");
        } else {
            memcpy(out->words, SC.result_get_bytes(r), len);
            out->n = len / 4;
        }
    }
    SC.result_release(r);
    return st;
}

static em_status compile_glslang(em_vk_device *d, const compiler_choice *c, const char *tmp_base,
                                 size_t index, const char *name, const char *src, spirv *out)
{
    char in[4200], outp[4200], shown[300];
    snprintf(in, sizeof(in), "%s.k%zu.comp", tmp_base, index);
    snprintf(outp, sizeof(outp), "%s.k%zu.spv", tmp_base, index);
    snprintf(shown, sizeof(shown), "%s.comp", name);
    em_status st = em_file_write_atomic(in, src, strlen(src));
    if (st != EM_OK) return em_error_context("vulkan: writing the shader for glslangValidator");
    char *argv[] = {(char *)c->exe,
                    "-V",
                    "--target-env",
                    (char *)d->env_name,
                    "-S",
                    "comp",
                    "-o",
                    outp,
                    in,
                    NULL};
    em_strbuf log;
    em_sb_init(&log);
    int status = 0;
    int err = run_capture(argv, &log, &status);
    if (err) {
        st = em_set_error(EM_ERR_COMPILE, "vulkan: cannot run %s: %s", c->exe, strerror(err));
    } else if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) {
        em_strbuf sb;
        em_sb_init(&sb);
        quote_log(&sb, log.data ? log.data : "", in, shown, src);
        st = em_set_error(EM_ERR_COMPILE,
                          "vulkan: glslangValidator failed to compile kernel %s "
                          "(GLSL -> SPIR-V):\n%s",
                          name, sb.data ? sb.data : "");
        em_sb_free(&sb);
    } else {
        size_t len = 0;
        char *bytes = em_file_read(outp, &len);
        if (!bytes) {
            st = em_error_context("vulkan: reading glslangValidator's output");
        } else {
            out->words = (uint32_t *)(void *)bytes; /* malloc'd: suitably aligned */
            out->n = len / 4;
        }
    }
    em_sb_free(&log);
    unlink(in);
    unlink(outp);
    return st;
}

/* ---- SPIR-V ---------------------------------------------------------------------------------- */

enum {
    OP_NAME_ENTRY = 15, /* OpEntryPoint */
    OP_EXEC_MODE = 16,  /* OpExecutionMode */
    OP_TYPE_BOOL = 20,
    OP_TYPE_INT = 21,
    OP_TYPE_FLOAT = 22,
    OP_TYPE_VECTOR = 23,
    OP_TYPE_STRUCT = 30,
    OP_TYPE_POINTER = 32,
    OP_CONSTANT = 43,
    OP_SPEC_CONSTANT = 50,
    OP_VARIABLE = 59,
    OP_DECORATE = 71,
    OP_MEMBER_DECORATE = 72,
    OP_FUNCTION_END = 56,
    OP_EXEC_MODE_ID = 331,
    DEC_SPEC_ID = 1,
    DEC_BUILTIN = 11,
    BUILTIN_NUM_WORKGROUPS = 24,
    BUILTIN_SUBGROUP_SIZE = 36,
    BUILTIN_SUBGROUP_LOCAL_ID = 41,
    OP_CAPABILITY = 17,
    CAP_GROUP_NON_UNIFORM = 61, /* GroupNonUniform .. GroupNonUniformQuad: 61..68 */
    CAP_GROUP_NON_UNIFORM_QUAD = 68,
    DEC_BLOCK = 2,
    DEC_BUFFER_BLOCK = 3,
    DEC_BINDING = 33,
    DEC_SET = 34,
    DEC_OFFSET = 35,
    SC_UNIFORM = 2,
    SC_PUSH_CONSTANT = 9,
    SC_STORAGE_BUFFER = 12,
    MODEL_GLCOMPUTE = 5,
    MODE_LOCAL_SIZE = 17,
    MODE_LOCAL_SIZE_ID = 38,
    MAX_BOUND = 1u << 22,
};

/* Per-id facts gathered in one pass. */
typedef struct id_info {
    uint16_t op;      /* defining opcode (types, constants, variables) */
    uint32_t a, b, c; /* operands: see reflect() */
    int32_t binding;  /* Binding decoration (-1 none) */
    int32_t set;      /* DescriptorSet decoration (-1 none) */
    int32_t spec_id;  /* SpecId decoration (-1 none) */
    uint8_t block;    /* 1 Block, 2 BufferBlock */
} id_info;

/* What load needs from one module. */
typedef struct reflection {
    char name[256];        /* entry point name */
    size_t entry_at;       /* word index of the OpEntryPoint (for renaming) */
    uint32_t local[3];     /* LocalSize */
    bool spec[3];          /* specialization constants 0/1/2 exist */
    bool flat;             /* spec constants 3/4/5 give the cube's axes; the group is 1-D */
    uint32_t bindings[64]; /* storage-buffer bindings of set 0 */
    uint32_t nbindings;
    em_vk_push_member push[64]; /* push-constant members in order */
    uint32_t npush;
    uint32_t push_size; /* bytes */
    bool num_groups;    /* reads gl_NumWorkGroups */
    bool subgroups;     /* uses sub-group operations or built-ins */
} reflection;

static em_status corrupt(const char *what, const char *detail)
{
    return em_set_error(EM_ERR_CORRUPT, "vulkan: %s: %s", what, detail);
}

/* Reads a literal string at w[at..end) into out; false when unterminated. */
static bool read_string(const uint32_t *w, size_t at, size_t end, char *out, size_t size,
                        size_t *words)
{
    const char *s = (const char *)(w + at);
    size_t max = (end - at) * 4;
    size_t len = strnlen(s, max);
    if (len == max || len + 1 > size) return false;
    memcpy(out, s, len + 1);
    *words = len / 4 + 1;
    return true;
}

/* Size in bytes and member description of a push-constant member type. */
static bool member_type(const id_info *ids, uint32_t bound, uint32_t t, em_vk_push_member *pm,
                        uint32_t *size)
{
    if (t >= bound) return false;
    const id_info *ti = &ids[t];
    uint32_t count = 1;
    if (ti->op == OP_TYPE_VECTOR) { /* a = component type, b = count */
        count = ti->b;
        if (ti->a >= bound) return false;
        ti = &ids[ti->a];
    }
    if (ti->op == OP_TYPE_INT) { /* a = width, b = signedness */
        pm->kind = ti->b ? 1 : 0;
        pm->bits = (uint8_t)ti->a;
    } else if (ti->op == OP_TYPE_FLOAT) { /* a = width */
        pm->kind = 2;
        pm->bits = (uint8_t)ti->a;
    } else {
        return false;
    }
    if (pm->bits != 8 && pm->bits != 16 && pm->bits != 32 && pm->bits != 64) return false;
    *size = pm->bits / 8 * count;
    return true;
}

/* Checks a module's structure and reads what load needs. */
static em_status reflect(const uint32_t *w, size_t n, const char *what, reflection *out)
{
    memset(out, 0, sizeof(*out));
    if (n < 5 || w[0] != SPIRV_MAGIC)
        return corrupt(what, "not a SPIR-V module (bad magic number)");
    if ((w[1] & 0xff0000ffu) != 0 || w[1] < 0x00010000u || w[1] > 0x00010600u)
        return corrupt(what, "unknown SPIR-V version");
    uint32_t bound = w[3];
    if (bound == 0 || bound > MAX_BOUND || w[4] != 0)
        return corrupt(what, "bad SPIR-V header (id bound or schema)");
    id_info *ids = calloc(bound, sizeof(*ids));
    if (!ids) return em_set_error(EM_ERR_NOMEM, "out of memory reading %s", what);
    for (uint32_t i = 0; i < bound; i++) ids[i].binding = ids[i].set = ids[i].spec_id = -1;
    typedef struct {
        uint32_t s, m, off;
    } member_offset;
    member_offset *offs = NULL;
    size_t noffs = 0, cap_offs = 0;
    em_status st = EM_OK;
    bool have_entry = false;
    uint32_t last_op = 0;
    uint32_t local_ids[3] = {0};
    bool local_by_id = false;
    out->local[0] = out->local[1] = out->local[2] = 1;

    for (size_t i = 5; i < n && st == EM_OK;) {
        uint32_t op = w[i] & 0xffffu, wc = w[i] >> 16;
        if (wc == 0 || wc > n - i) {
            st = corrupt(what, "truncated or malformed SPIR-V instruction stream");
            break;
        }
        last_op = op;
        const uint32_t *o = w + i + 1; /* operands */
        uint32_t no = wc - 1;
        switch (op) {
        case OP_CAPABILITY:
            if (no >= 1 && o[0] >= CAP_GROUP_NON_UNIFORM && o[0] <= CAP_GROUP_NON_UNIFORM_QUAD)
                out->subgroups = true;
            break;
        case OP_NAME_ENTRY:
            if (no >= 3 && o[0] == MODEL_GLCOMPUTE && !have_entry) {
                size_t sw;
                if (!read_string(w, i + 3, i + wc, out->name, sizeof(out->name), &sw)) {
                    st = corrupt(what, "bad entry point name");
                    break;
                }
                have_entry = true;
                out->entry_at = i;
            }
            break;
        case OP_EXEC_MODE:
            if (no >= 5 && o[1] == MODE_LOCAL_SIZE) {
                out->local[0] = o[2];
                out->local[1] = o[3];
                out->local[2] = o[4];
            }
            break;
        case OP_EXEC_MODE_ID:
            if (no >= 5 && o[1] == MODE_LOCAL_SIZE_ID) {
                local_by_id = true;
                local_ids[0] = o[2];
                local_ids[1] = o[3];
                local_ids[2] = o[4];
            }
            break;
        case OP_TYPE_INT:
        case OP_TYPE_VECTOR:
        case OP_TYPE_POINTER:
        case OP_VARIABLE:
            if (no < 3 || (op == OP_VARIABLE ? o[1] : o[0]) >= bound) {
                st = corrupt(what, "malformed type or variable");
                break;
            }
            if (op == OP_VARIABLE) { /* result type, result id, storage class */
                ids[o[1]] = (id_info){
                    OP_VARIABLE,       o[0],           o[2], 0, ids[o[1]].binding, ids[o[1]].set,
                    ids[o[1]].spec_id, ids[o[1]].block};
            } else {
                id_info *t = &ids[o[0]];
                t->op = (uint16_t)op;
                t->a = o[1];
                t->b = o[2];
            }
            break;
        case OP_TYPE_FLOAT:
        case OP_TYPE_BOOL:
            if (no < 1 || o[0] >= bound) {
                st = corrupt(what, "malformed type");
                break;
            }
            ids[o[0]].op = (uint16_t)op;
            ids[o[0]].a = no >= 2 ? o[1] : 0;
            break;
        case OP_TYPE_STRUCT:
            if (no < 1 || o[0] >= bound) {
                st = corrupt(what, "malformed struct type");
                break;
            }
            ids[o[0]].op = OP_TYPE_STRUCT;
            ids[o[0]].a = (uint32_t)i; /* where its member list is */
            ids[o[0]].b = no - 1;      /* member count */
            break;
        case OP_CONSTANT:
        case OP_SPEC_CONSTANT:
            if (no >= 3 && o[1] < bound) {
                ids[o[1]].op = (uint16_t)op;
                ids[o[1]].a = o[2];
            }
            break;
        case OP_DECORATE:
            if (no >= 2 && o[0] < bound) {
                id_info *t = &ids[o[0]];
                if (o[1] == DEC_BINDING && no >= 3)
                    t->binding = (int32_t)o[2];
                else if (o[1] == DEC_SET && no >= 3)
                    t->set = (int32_t)o[2];
                else if (o[1] == DEC_SPEC_ID && no >= 3)
                    t->spec_id = (int32_t)o[2];
                else if (o[1] == DEC_BLOCK)
                    t->block = 1;
                else if (o[1] == DEC_BUFFER_BLOCK)
                    t->block = 2;
                else if (o[1] == DEC_BUILTIN && no >= 3 && o[2] == BUILTIN_NUM_WORKGROUPS)
                    out->num_groups = true;
                else if (o[1] == DEC_BUILTIN && no >= 3 &&
                         (o[2] == BUILTIN_SUBGROUP_SIZE || o[2] == BUILTIN_SUBGROUP_LOCAL_ID))
                    out->subgroups = true;
            }
            break;
        case OP_MEMBER_DECORATE:
            if (no >= 4 && o[2] == DEC_OFFSET) {
                if (noffs == cap_offs) {
                    size_t nc = cap_offs ? cap_offs * 2 : 32;
                    member_offset *g = realloc(offs, nc * sizeof(*g));
                    if (!g) {
                        st = em_set_error(EM_ERR_NOMEM, "out of memory");
                        break;
                    }
                    offs = g;
                    cap_offs = nc;
                }
                offs[noffs++] = (member_offset){o[0], o[1], o[3]};
            }
            break;
        default:
            break;
        }
        i += wc;
    }
    if (st == EM_OK && !have_entry) st = corrupt(what, "no GLCompute entry point");
    if (st == EM_OK && last_op != OP_FUNCTION_END) /* every module ends with a function */
        st = corrupt(what, "truncated SPIR-V module (it does not end with OpFunctionEnd)");

    for (uint32_t id = 0; id < bound && st == EM_OK; id++) {
        const id_info *v = &ids[id];
        if (v->spec_id >= 0 && v->spec_id < 3 && v->op == OP_SPEC_CONSTANT)
            out->spec[v->spec_id] = true;
        if (v->spec_id == 3 && v->op == OP_SPEC_CONSTANT) out->flat = true;
        if (v->op != OP_VARIABLE) continue;
        uint32_t storage = v->b;
        const id_info *ptr = v->a < bound ? &ids[v->a] : NULL;
        uint32_t pointee = ptr && ptr->op == OP_TYPE_POINTER ? ptr->b : bound;
        const id_info *block = pointee < bound ? &ids[pointee] : NULL;
        if (storage == SC_STORAGE_BUFFER || (storage == SC_UNIFORM && block && block->block)) {
            if (storage == SC_UNIFORM && block->block == 1) {
                st = em_set_error(EM_ERR_UNSUPPORTED,
                                  "vulkan: %s uses a uniform buffer; ember "
                                  "kernels bind storage buffers only",
                                  what);
                break;
            }
            if (v->binding < 0 || (v->set > 0)) {
                st = em_set_error(EM_ERR_UNSUPPORTED,
                                  "vulkan: %s: a storage buffer outside "
                                  "descriptor set 0 or without a binding",
                                  what);
                break;
            }
            if (out->nbindings >= EM_ARRAY_LEN(out->bindings)) {
                st = em_set_error(EM_ERR_UNSUPPORTED,
                                  "vulkan: %s has more than %zu storage "
                                  "buffers",
                                  what, EM_ARRAY_LEN(out->bindings));
                break;
            }
            uint32_t b = (uint32_t)v->binding;
            bool seen = false; /* two views of one buffer share a binding */
            for (uint32_t q = 0; q < out->nbindings && !seen; q++) seen = out->bindings[q] == b;
            if (seen) continue;
            uint32_t at = out->nbindings++;
            while (at > 0 && out->bindings[at - 1] > b) { /* keep them sorted */
                out->bindings[at] = out->bindings[at - 1];
                at--;
            }
            out->bindings[at] = b;
        } else if (storage == SC_PUSH_CONSTANT) {
            if (!block || block->op != OP_TYPE_STRUCT) {
                st = corrupt(what, "push-constant block is not a struct");
                break;
            }
            uint32_t nm = block->b;
            const uint32_t *members = w + block->a + 2;
            if (nm > EM_ARRAY_LEN(out->push)) {
                st = em_set_error(EM_ERR_UNSUPPORTED,
                                  "vulkan: %s: push-constant block with "
                                  "%u members",
                                  what, nm);
                break;
            }
            for (uint32_t m = 0; m < nm && st == EM_OK; m++) {
                em_vk_push_member *pm = &out->push[m];
                uint32_t size = 0;
                bool found = false;
                for (size_t k = 0; k < noffs; k++)
                    if (offs[k].s == pointee && offs[k].m == m) {
                        pm->offset = offs[k].off;
                        found = true;
                    }
                if (!found || !member_type(ids, bound, members[m], pm, &size)) {
                    st = em_set_error(EM_ERR_UNSUPPORTED,
                                      "vulkan: %s: push-constant member %u "
                                      "is not a scalar with an offset",
                                      what, m);
                    break;
                }
                if (pm->offset + size > out->push_size) out->push_size = pm->offset + size;
            }
            out->npush = nm;
        }
    }
    if (st == EM_OK && local_by_id) {
        for (int a = 0; a < 3; a++) {
            uint32_t c = local_ids[a];
            if (c >= bound) continue;
            if (ids[c].spec_id == a) out->spec[a] = true;
            out->local[a] = ids[c].a;
        }
    }
    free(offs);
    free(ids);
    return st;
}

/* A copy of a module whose entry point (at word `at`) is renamed to `name`. */
static em_status rename_entry(const spirv *in, size_t at, const char *name, spirv *out)
{
    const uint32_t *w = in->words;
    uint32_t wc = w[at] >> 16;
    size_t old_name_words = strnlen((const char *)(w + at + 3), (wc - 3) * 4) / 4 + 1;
    size_t len = strlen(name);
    size_t name_words = len / 4 + 1;
    size_t new_wc = wc - old_name_words + name_words;
    if (new_wc > 0xffff) return em_set_error(EM_ERR_INVALID, "vulkan: kernel name too long");
    out->n = in->n - wc + new_wc;
    out->words = calloc(out->n, 4);
    if (!out->words) return em_set_error(EM_ERR_NOMEM, "out of memory");
    uint32_t *o = out->words;
    memcpy(o, w, at * 4);
    o[at] = (uint32_t)(new_wc << 16) | OP_NAME_ENTRY;
    o[at + 1] = w[at + 1];
    o[at + 2] = w[at + 2];
    memcpy(o + at + 3, name, len); /* the rest of its words are zero: the NUL and padding */
    size_t rest_at = at + 3 + old_name_words, new_rest = at + 3 + name_words;
    memcpy(o + new_rest, w + rest_at, (in->n - rest_at) * 4);
    return EM_OK;
}

/* ---- building -------------------------------------------------------------------------------- */

typedef struct segment {
    char name[256];
    const char *text; /* start of the shader (after its separator line) */
    size_t len;       /* bytes */
} segment;

/* Splits a batch at its separator lines. *preamble_len gets the bytes before the first one. */
static em_status split_source(const char *src, segment **out, size_t *n, size_t *preamble_len)
{
    size_t cap = 4, count = 0;
    segment *segs = malloc(cap * sizeof(*segs));
    if (!segs) return em_set_error(EM_ERR_NOMEM, "out of memory");
    *preamble_len = 0;
    const char *p = src;
    while (p && *p) {
        const char *line = p;
        const char *nl = strchr(p, '\n');
        p = nl ? nl + 1 : NULL;
        if (strncmp(line, SEPARATOR, strlen(SEPARATOR)) != 0) {
            if (count)
                segs[count - 1].len =
                    (size_t)((p ? p : line + strlen(line)) - segs[count - 1].text);
            else
                *preamble_len = (size_t)((p ? p : line + strlen(line)) - src);
            continue;
        }
        if (count == cap) {
            segment *g = realloc(segs, (cap *= 2) * sizeof(*g));
            if (!g) {
                free(segs);
                return em_set_error(EM_ERR_NOMEM, "out of memory");
            }
            segs = g;
        }
        const char *nm = line + strlen(SEPARATOR);
        size_t nlen = strcspn(nm, " \t\r\n");
        bool ok = nlen > 0 && nlen < sizeof(segs[0].name);
        for (size_t i = 0; ok && i < nlen; i++)
            ok = nm[i] == '_' || (nm[i] >= 'a' && nm[i] <= 'z') || (nm[i] >= 'A' && nm[i] <= 'Z') ||
                 (i && nm[i] >= '0' && nm[i] <= '9');
        if (!ok) {
            free(segs);
            return em_set_error(EM_ERR_INVALID, "vulkan: bad kernel separator line '%.*s'",
                                (int)strcspn(line, "\n"), line);
        }
        memcpy(segs[count].name, nm, nlen);
        segs[count].name[nlen] = '\0';
        segs[count].text = p ? p : line + strlen(line);
        segs[count].len = 0;
        count++;
    }
    if (!count) {
        free(segs);
        return em_set_error(EM_ERR_INVALID,
                            "vulkan: the GLSL source names no kernel (no '%s"
                            "NAME' line)",
                            SEPARATOR);
    }
    *out = segs;
    *n = count;
    return EM_OK;
}

static em_status write_file(const char *path, const void *a, size_t alen, const void *b,
                            size_t blen)
{
    FILE *f = fopen(path, "wb");
    if (!f) return em_set_error(EM_ERR_IO, "vulkan: cannot create %s: %s", path, strerror(errno));
    bool ok = fwrite(a, 1, alen, f) == alen && (!blen || fwrite(b, 1, blen, f) == blen);
    ok = (fclose(f) == 0) && ok;
    if (!ok) return em_set_error(EM_ERR_IO, "vulkan: cannot write %s: %s", path, strerror(errno));
    return EM_OK;
}

/* Writes one module as it is, or several as a batch container. */
static em_status write_binary(const char *path, spirv *mods, size_t n)
{
    if (n == 1) return write_file(path, mods[0].words, mods[0].n * 4, NULL, 0);
    size_t words = 3;
    for (size_t i = 0; i < n; i++) words += 1 + mods[i].n;
    uint32_t *buf = malloc(words * 4);
    if (!buf) return em_set_error(EM_ERR_NOMEM, "out of memory");
    memcpy(buf, BATCH_MAGIC, 8);
    buf[2] = (uint32_t)n;
    size_t at = 3;
    for (size_t i = 0; i < n; i++) {
        buf[at++] = (uint32_t)mods[i].n;
        memcpy(buf + at, mods[i].words, mods[i].n * 4);
        at += mods[i].n;
    }
    em_status st = write_file(path, buf, words * 4, NULL, 0);
    free(buf);
    return st;
}

em_status em_rt_vk_build(void *state, const char *source, const char *out_path)
{
    em_vk_device *d = state;
    compiler_choice c;
    em_status st = choose_compiler(&c);
    if (st != EM_OK) return st;
    segment *segs = NULL;
    size_t n = 0, pre = 0;
    if ((st = split_source(source, &segs, &n, &pre)) != EM_OK) return st;
    if (n > MAX_BATCH) {
        free(segs);
        return em_set_error(EM_ERR_UNSUPPORTED, "vulkan: %zu kernels in one batch (at most %d)", n,
                            MAX_BATCH);
    }
    spirv *mods = calloc(n, sizeof(*mods));
    if (!mods) {
        free(segs);
        return em_set_error(EM_ERR_NOMEM, "out of memory");
    }
    for (size_t i = 0; i < n && st == EM_OK; i++) {
        char *text = malloc(pre + segs[i].len + 1);
        if (!text) {
            st = em_set_error(EM_ERR_NOMEM, "out of memory");
            break;
        }
        memcpy(text, source, pre);
        memcpy(text + pre, segs[i].text, segs[i].len);
        text[pre + segs[i].len] = '\0';
        spirv raw = {0};
        st = c.kind == EM_VK_SHADERC
                 ? compile_shaderc(d, segs[i].name, text, &raw)
                 : compile_glslang(d, &c, out_path, i, segs[i].name, text, &raw);
        free(text);
        reflection refl;
        char what[300];
        snprintf(what, sizeof(what), "compiled kernel %s", segs[i].name);
        if (st == EM_OK && (st = reflect(raw.words, raw.n, what, &refl)) != EM_OK)
            em_error_context("the compiler's output");
        if (st == EM_OK) st = rename_entry(&raw, refl.entry_at, segs[i].name, &mods[i]);
        free(raw.words);
    }
    if (st == EM_OK) st = write_binary(out_path, mods, n);
    for (size_t i = 0; i < n; i++) free(mods[i].words);
    free(mods);
    free(segs);
    return st;
}

bool em_rt_vk_glsl_compiles(em_vk_device *d, const char *src)
{
    char saved[4096];
    em_status saved_status = em_last_status();
    snprintf(saved, sizeof(saved), "%s", em_last_error());
    compiler_choice c;
    bool ok = false;
    if (choose_compiler(&c) == EM_OK) {
        spirv raw = {0};
        if (c.kind == EM_VK_SHADERC) {
            ok = compile_shaderc(d, "ember_probe", src, &raw) == EM_OK;
        } else {
            const char *tmp = getenv("TMPDIR");
            char base[600];
            static unsigned counter;
            snprintf(base, sizeof(base), "%s/ember-vk-probe-%ld-%u", tmp && *tmp ? tmp : "/tmp",
                     (long)getpid(), __atomic_fetch_add(&counter, 1, __ATOMIC_RELAXED));
            ok = compile_glslang(d, &c, base, 0, "ember_probe", src, &raw) == EM_OK;
        }
        free(raw.words);
    }
    em_clear_error();
    if (saved[0]) em_set_error(saved_status, "%s", saved);
    return ok;
}

/* ---- loading --------------------------------------------------------------------------------- */

static void free_kernel(em_vk_device *d, em_vk_kernel *k)
{
    for (size_t i = 0; i < k->npipes; i++)
        d->fn.vkDestroyPipeline(d->device, k->pipes[i].pipeline, NULL);
    free(k->pipes);
    if (k->layout) d->fn.vkDestroyPipelineLayout(d->device, k->layout, NULL);
    if (k->set_layout) d->fn.vkDestroyDescriptorSetLayout(d->device, k->set_layout, NULL);
    if (k->shader) d->fn.vkDestroyShaderModule(d->device, k->shader, NULL);
    free(k->bindings);
    free(k->push);
    free(k->name);
}

/* Makes the shader module and layouts of one kernel from its checked SPIR-V. */
static em_status make_kernel(em_vk_device *d, const uint32_t *w, size_t n, const reflection *r,
                             em_vk_kernel *k)
{
    memset(k, 0, sizeof(*k));
    k->name = strdup(r->name);
    k->nbindings = r->nbindings;
    k->bindings = malloc((r->nbindings ? r->nbindings : 1) * sizeof(uint32_t));
    k->npush = r->npush;
    k->push = malloc((r->npush ? r->npush : 1) * sizeof(*k->push));
    if (!k->name || !k->bindings || !k->push) return em_set_error(EM_ERR_NOMEM, "out of memory");
    memcpy(k->bindings, r->bindings, r->nbindings * sizeof(uint32_t));
    memcpy(k->push, r->push, r->npush * sizeof(*k->push));
    k->push_size = r->push_size;
    memcpy(k->local_size, r->local, sizeof(k->local_size));
    memcpy(k->spec_size, r->spec, sizeof(k->spec_size));
    k->flat = r->flat;
    k->num_groups = r->num_groups;
    k->subgroups = r->subgroups;
    if (k->push_size > d->props.limits.maxPushConstantsSize || k->push_size > 256)
        return em_set_error(EM_ERR_UNSUPPORTED,
                            "vulkan: kernel %s needs %u bytes of push "
                            "constants; %s has %u",
                            k->name, k->push_size, d->props.deviceName,
                            d->props.limits.maxPushConstantsSize);

    VkShaderModuleCreateInfo smi = {
        .sType = VK_STRUCTURE_TYPE_SHADER_MODULE_CREATE_INFO, .codeSize = n * 4, .pCode = w};
    VK_TRY("vkCreateShaderModule", d->fn.vkCreateShaderModule(d->device, &smi, NULL, &k->shader));
    VkDescriptorSetLayoutBinding lb[64];
    for (uint32_t i = 0; i < k->nbindings; i++)
        lb[i] = (VkDescriptorSetLayoutBinding){.binding = k->bindings[i],
                                               .descriptorType = VK_DESCRIPTOR_TYPE_STORAGE_BUFFER,
                                               .descriptorCount = 1,
                                               .stageFlags = VK_SHADER_STAGE_COMPUTE_BIT};
    VkDescriptorSetLayoutCreateInfo dli = {.sType =
                                               VK_STRUCTURE_TYPE_DESCRIPTOR_SET_LAYOUT_CREATE_INFO,
                                           .bindingCount = k->nbindings,
                                           .pBindings = lb};
    VK_TRY("vkCreateDescriptorSetLayout",
           d->fn.vkCreateDescriptorSetLayout(d->device, &dli, NULL, &k->set_layout));
    VkPushConstantRange range = {VK_SHADER_STAGE_COMPUTE_BIT, 0, k->push_size};
    VkPipelineLayoutCreateInfo pli = {.sType = VK_STRUCTURE_TYPE_PIPELINE_LAYOUT_CREATE_INFO,
                                      .setLayoutCount = 1,
                                      .pSetLayouts = &k->set_layout,
                                      .pushConstantRangeCount = k->push_size ? 1 : 0,
                                      .pPushConstantRanges = &range};
    VK_TRY("vkCreatePipelineLayout",
           d->fn.vkCreatePipelineLayout(d->device, &pli, NULL, &k->layout));
    return EM_OK;
}

/* Splits a binary into its modules (pointers into data); checks the container's bounds. */
static em_status split_binary(const uint32_t *w, size_t nwords, const char *path,
                              const uint32_t ***mods, size_t **lens, size_t *count)
{
    if (nwords >= 1 && w[0] == SPIRV_MAGIC) {
        *mods = malloc(sizeof(**mods));
        *lens = malloc(sizeof(**lens));
        if (!*mods || !*lens) return em_set_error(EM_ERR_NOMEM, "out of memory");
        (*mods)[0] = w;
        (*lens)[0] = nwords;
        *count = 1;
        return EM_OK;
    }
    if (nwords < 3 || memcmp(w, BATCH_MAGIC, 8) != 0)
        return corrupt(path, "neither a SPIR-V module nor an ember SPIR-V batch");
    size_t n = w[2];
    if (n == 0 || n > MAX_BATCH) return corrupt(path, "bad module count in batch");
    *mods = malloc(n * sizeof(**mods));
    *lens = malloc(n * sizeof(**lens));
    if (!*mods || !*lens) return em_set_error(EM_ERR_NOMEM, "out of memory");
    size_t at = 3;
    for (size_t i = 0; i < n; i++) {
        if (at >= nwords || w[at] > nwords - at - 1)
            return corrupt(path, "batch entry runs past the end of the file");
        (*lens)[i] = w[at];
        (*mods)[i] = w + at + 1;
        at += 1 + w[at];
    }
    if (at != nwords) return corrupt(path, "trailing bytes after the last module");
    *count = n;
    return EM_OK;
}

em_status em_rt_vk_load(void *state, const char *path, void **out)
{
    em_vk_device *d = state;
    size_t len = 0;
    char *data = em_file_read(path, &len);
    if (!data) return em_last_status();
    em_status st = EM_OK;
    if (len % 4 || len < 12) st = corrupt(path, "size is not a whole number of 32-bit words");
    const uint32_t **mods = NULL;
    size_t *lens = NULL, n = 0;
    if (st == EM_OK)
        st = split_binary((const uint32_t *)(void *)data, len / 4, path, &mods, &lens, &n);
    em_vk_module *m = NULL;
    if (st == EM_OK && !(m = calloc(1, sizeof(*m))))
        st = em_set_error(EM_ERR_NOMEM, "out of memory");
    if (st == EM_OK && !(m->k = calloc(n, sizeof(*m->k))))
        st = em_set_error(EM_ERR_NOMEM, "out of memory");
    for (size_t i = 0; i < n && st == EM_OK; i++) {
        reflection r;
        char what[4200];
        snprintf(what, sizeof(what), "%s (module %zu)", path, i);
        if ((st = reflect(mods[i], lens[i], what, &r)) != EM_OK) break;
        for (size_t j = 0; j < m->n; j++)
            if (strcmp(m->k[j].name, r.name) == 0)
                st = corrupt(path, "two modules with one entry point name");
        if (st != EM_OK) break;
        st = make_kernel(d, mods[i], lens[i], &r, &m->k[i]);
        m->n = i + 1;
        if (st != EM_OK) em_error_context("loading %s", path);
    }
    free(mods);
    free(lens);
    free(data);
    if (st != EM_OK) {
        em_rt_vk_unload(d, m);
        return st;
    }
    *out = m;
    return EM_OK;
}

void em_rt_vk_unload(void *state, void *module)
{
    em_vk_device *d = state;
    em_vk_module *m = module;
    if (!m) return;
    /* queued launches may still use the pipelines */
    if (em_rt_vk_sync(d) != EM_OK)
        EM_LOGW("vulkan: unloading a module after a failed sync: %s", em_last_error());
    pthread_mutex_lock(&d->lock);
    for (size_t i = 0; i < m->n; i++) free_kernel(d, &m->k[i]);
    pthread_mutex_unlock(&d->lock);
    free(m->k);
    free(m);
}

em_status em_rt_vk_function(void *state, void *module, const char *name, void **fn)
{
    (void)state;
    em_vk_module *m = module;
    for (size_t i = 0; i < m->n; i++) {
        if (strcmp(m->k[i].name, name) == 0) {
            *fn = &m->k[i];
            return EM_OK;
        }
    }
    em_strbuf names;
    em_sb_init(&names);
    for (size_t i = 0; i < m->n && i < 16; i++)
        em_sb_printf(&names, "%s%s", i ? ", " : "", m->k[i].name);
    em_status st = em_set_error(EM_ERR_NOT_FOUND,
                                "vulkan: no kernel '%s' in the module (it "
                                "holds %s)",
                                name, names.data ? names.data : "");
    em_sb_free(&names);
    return st;
}

em_status em_rt_vk_pipeline(em_vk_device *d, em_vk_kernel *k, const uint32_t dim[3],
                            VkPipeline *out)
{
    for (size_t i = 0; i < k->npipes; i++) {
        if (memcmp(k->pipes[i].dim, dim, sizeof(k->pipes[i].dim)) == 0) {
            *out = k->pipes[i].pipeline;
            return EM_OK;
        }
    }
    /* Generated kernels run flat (1-D) work groups of X*Y*Z units, so that sub-groups are runs of
     * consecutive linear unit indices whatever the cube's shape; the axes come from spec
     * constants 3/4/5. Hand-written shaders may use the plain 3-D scheme of constants 0/1/2. */
    uint32_t units3 = dim[0] * dim[1] * dim[2];
    uint32_t want[3] = {k->flat ? units3 : dim[0], k->flat ? 1 : dim[1], k->flat ? 1 : dim[2]};
    for (int a = 0; a < 3; a++)
        if (!k->spec_size[a] && k->local_size[a] != want[a])
            return em_set_error(EM_ERR_INVALID,
                                "vulkan: kernel %s is compiled for cubes of "
                                "%ux%ux%u units and cannot run with %ux%ux%u",
                                k->name, k->local_size[0], k->local_size[1], k->local_size[2],
                                dim[0], dim[1], dim[2]);
    if (k->npipes == k->cap_pipes) {
        size_t nc = k->cap_pipes ? k->cap_pipes * 2 : 4;
        void *g = realloc(k->pipes, nc * sizeof(*k->pipes));
        if (!g) return em_set_error(EM_ERR_NOMEM, "out of memory");
        k->pipes = g;
        k->cap_pipes = nc;
    }
    uint32_t values[6] = {want[0], want[1], want[2], dim[0], dim[1], dim[2]};
    VkSpecializationMapEntry entries[6] = {{0, 0, 4},  {1, 4, 4},  {2, 8, 4},
                                           {3, 12, 4}, {4, 16, 4}, {5, 20, 4}};
    VkSpecializationInfo spec = {k->flat ? 6 : 3, entries, sizeof values, values};
    /* where the sub-group size varies, a kernel using sub-groups gets the size of the caps */
    VkPipelineShaderStageRequiredSubgroupSizeCreateInfo size = {
        .sType = VK_STRUCTURE_TYPE_PIPELINE_SHADER_STAGE_REQUIRED_SUBGROUP_SIZE_CREATE_INFO,
        .requiredSubgroupSize = d->subgroup_size};
    uint64_t units = (uint64_t)dim[0] * dim[1] * dim[2];
    bool require = d->size_control && k->subgroups &&
                   units <= (uint64_t)d->max_group_subgroups * d->subgroup_size;
    VkComputePipelineCreateInfo ci = {
        .sType = VK_STRUCTURE_TYPE_COMPUTE_PIPELINE_CREATE_INFO,
        .flags = VK_PIPELINE_CREATE_DISPATCH_BASE_BIT, /* large grids run in pieces */
        .stage = {.sType = VK_STRUCTURE_TYPE_PIPELINE_SHADER_STAGE_CREATE_INFO,
                  .pNext = require ? &size : NULL,
                  .stage = VK_SHADER_STAGE_COMPUTE_BIT,
                  .module = k->shader,
                  .pName = k->name,
                  .pSpecializationInfo = &spec},
        .layout = k->layout,
    };
    VkPipeline p;
    VkResult r = d->fn.vkCreateComputePipelines(d->device, d->pipeline_cache, 1, &ci, NULL, &p);
    if (r != VK_SUCCESS) {
        em_rt_vk_fail("vkCreateComputePipelines", r);
        return em_error_context("kernel %s, cube %ux%ux%u", k->name, dim[0], dim[1], dim[2]);
    }
    memcpy(k->pipes[k->npipes].dim, dim, sizeof(k->pipes[k->npipes].dim));
    k->pipes[k->npipes++].pipeline = p;
    *out = p;
    return EM_OK;
}
