/* nvrtc.c — NVRTC through dlopen: finding the library, its version and architectures, and one
 * compile call that turns CUDA C++ source into a cubin (or PTX) with the log kept on failure.
 * The few NVRTC types and prototypes needed are declared here, so the build does not need the
 * CUDA toolkit's headers. Loading happens once (pthread_once); the loaded table is read-only
 * afterwards, and NVRTC itself is thread-safe for distinct programs. */
#include "runtime/drivers/nvrtc.h"
#include <dlfcn.h>
#include <limits.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include "base/base.h"

/* ---- the subset of nvrtc.h we use ------------------------------------------------------------ */

typedef int nvrtcResult; /* NVRTC_SUCCESS = 0; NVRTC_ERROR_COMPILATION = 6 */
typedef struct _nvrtcProgram *nvrtcProgram;
#define NVRTC_SUCCESS 0
#define NVRTC_ERROR_OUT_OF_MEMORY 1
#define NVRTC_ERROR_INVALID_OPTION 5
#define NVRTC_ERROR_COMPILATION 6

typedef struct nvrtc_api {
    const char *(*GetErrorString)(nvrtcResult);
    nvrtcResult (*Version)(int *, int *);
    nvrtcResult (*GetNumSupportedArchs)(int *);      /* optional (NVRTC 11.2+) */
    nvrtcResult (*GetSupportedArchs)(int *);         /* optional (NVRTC 11.2+) */
    nvrtcResult (*CreateProgram)(nvrtcProgram *, const char *, const char *, int,
                                 const char *const *, const char *const *);
    nvrtcResult (*DestroyProgram)(nvrtcProgram *);
    nvrtcResult (*CompileProgram)(nvrtcProgram, int, const char *const *);
    nvrtcResult (*GetProgramLogSize)(nvrtcProgram, size_t *);
    nvrtcResult (*GetProgramLog)(nvrtcProgram, char *);
    nvrtcResult (*GetCUBINSize)(nvrtcProgram, size_t *);
    nvrtcResult (*GetCUBIN)(nvrtcProgram, char *);
    nvrtcResult (*GetPTXSize)(nvrtcProgram, size_t *);
    nvrtcResult (*GetPTX)(nvrtcProgram, char *);
} nvrtc_api;

#define MAX_ARCHS 64
#define MAX_EXTRA_OPTIONS 32

/* Everything found at load time; written once under pthread_once, read-only afterwards. */
static struct {
    bool ok;                        /* the library and every required symbol were found */
    char why[1536];                 /* when !ok: why (the places tried) */
    char tried[1024];               /* candidates that failed to load, comma-separated */
    char path[512];                 /* the file loaded */
    char include_opt[PATH_MAX + 32]; /* "--include-path=DIR" holding cuda_fp16.h, or "" when none was found */
    int major, minor;               /* version */
    int archs[MAX_ARCHS];           /* supported compute capabilities (e.g. 75, 80, 90) */
    int narchs;                     /* entries in archs (0 = unknown: assume any) */
    char common[1024];              /* common options joined, for compiler ids */
    char extra_buf[512];            /* $EMBER_NVRTC_OPTIONS, split in place */
    const char *extra[MAX_EXTRA_OPTIONS]; /* pointers into extra_buf */
    int nextra;                     /* entries in extra */
    nvrtc_api api;                  /* the entry points */
} nv;

static pthread_once_t nv_once = PTHREAD_ONCE_INIT;

/* Tries one candidate; returns the handle or NULL (appending to nv.tried). */
static void *try_open(const char *name, size_t *used)
{
    void *lib = dlopen(name, RTLD_NOW | RTLD_LOCAL);
    if (!lib && *used < sizeof(nv.tried))
        *used += (size_t)snprintf(nv.tried + *used, sizeof(nv.tried) - *used, "%s%s",
                                  *used ? ", " : "", name);
    return lib;
}

static void *open_library(void)
{
    size_t used = 0;
    const char *override = getenv("EMBER_NVRTC");
    void *lib = NULL;
    if (override && *override) {
        lib = try_open(override, &used);
        if (lib)
            snprintf(nv.path, sizeof(nv.path), "%s", override);
        return lib; /* an explicit choice is never second-guessed */
    }
    static const char *const names[] = {"libnvrtc.so.13", "libnvrtc.so.12", "libnvrtc.so"};
    for (size_t i = 0; i < EM_ARRAY_LEN(names) && !lib; i++)
        if ((lib = try_open(names[i], &used)))
            snprintf(nv.path, sizeof(nv.path), "%s", names[i]);
    const char *roots[] = {getenv("CUDA_HOME"), getenv("CUDA_PATH"), "/usr/local/cuda"};
    static const char *const subdirs[] = {"lib64", "lib"};
    for (size_t r = 0; r < EM_ARRAY_LEN(roots) && !lib; r++) {
        if (!roots[r] || !*roots[r])
            continue;
        for (size_t d = 0; d < EM_ARRAY_LEN(subdirs) && !lib; d++)
            for (size_t i = 0; i < EM_ARRAY_LEN(names) && !lib; i++) {
                char path[512];
                snprintf(path, sizeof(path), "%s/%s/%s", roots[r], subdirs[d], names[i]);
                if ((lib = try_open(path, &used)))
                    snprintf(nv.path, sizeof(nv.path), "%s", path);
            }
    }
    return lib;
}

/* Splits $EMBER_NVRTC_OPTIONS on spaces (no quoting: NVRTC options have no spaces). */
static void read_extra_options(void)
{
    const char *env = getenv("EMBER_NVRTC_OPTIONS");
    if (!env)
        return;
    snprintf(nv.extra_buf, sizeof(nv.extra_buf), "%s", env);
    char *save = NULL;
    for (char *tok = strtok_r(nv.extra_buf, " \t", &save); tok && nv.nextra < MAX_EXTRA_OPTIONS;
         tok = strtok_r(NULL, " \t", &save))
        nv.extra[nv.nextra++] = tok;
}

#define COMMON_OPTIONS "--std=c++17 -default-device"

static bool has_fp16_header(const char *dir)
{
    char path[PATH_MAX + 16];
    snprintf(path, sizeof(path), "%s/cuda_fp16.h", dir);
    return access(path, R_OK) == 0;
}

/* NVRTC builds in only a few headers; cuda_fp16.h / cuda_bf16.h come from the toolkit's include
 * folder. Looks next to the loaded library first (so the headers match its version), then in
 * $EMBER_CUDA_INCLUDE, $CUDA_HOME, $CUDA_PATH, /usr/local/cuda and /usr/include. */
static void find_headers(void)
{
    const char *env = getenv("EMBER_CUDA_INCLUDE");
    char dir[PATH_MAX] = "";
    if (env && *env && has_fp16_header(env))
        snprintf(dir, sizeof(dir), "%s", env);
    Dl_info info;
    char real[PATH_MAX];
    if (!dir[0] && dladdr((void *)nv.api.Version, &info) && info.dli_fname &&
        realpath(info.dli_fname, real)) {
        char *slash = strrchr(real, '/');
        if (slash) {
            *slash = '\0'; /* real is now the library's folder */
            static const char *const rel[] = {"../include", "../../include"};
            for (size_t i = 0; i < EM_ARRAY_LEN(rel) && !dir[0]; i++) {
                char cand[PATH_MAX + 32];
                snprintf(cand, sizeof(cand), "%s/%s", real, rel[i]);
                char resolved[PATH_MAX];
                if (realpath(cand, resolved) && has_fp16_header(resolved))
                    snprintf(dir, sizeof(dir), "%s", resolved);
            }
        }
    }
    const char *roots[] = {getenv("CUDA_HOME"), getenv("CUDA_PATH"), "/usr/local/cuda"};
    for (size_t r = 0; r < EM_ARRAY_LEN(roots) && !dir[0]; r++) {
        if (!roots[r] || !*roots[r])
            continue;
        char cand[PATH_MAX];
        snprintf(cand, sizeof(cand), "%s/include", roots[r]);
        if (has_fp16_header(cand))
            snprintf(dir, sizeof(dir), "%s", cand);
    }
    if (!dir[0] && has_fp16_header("/usr/include"))
        snprintf(dir, sizeof(dir), "/usr/include");
    if (dir[0])
        snprintf(nv.include_opt, sizeof(nv.include_opt), "--include-path=%s", dir);
}

static void load_once(void)
{
    void *lib = open_library();
    if (!lib) {
        snprintf(nv.why, sizeof(nv.why), "libnvrtc not found (install the CUDA toolkit's NVRTC "
                 "or set EMBER_NVRTC to its path)");
        return;
    }
    struct {
        void **slot;
        const char *name;
        bool required;
    } syms[] = {
        {(void **)&nv.api.GetErrorString, "nvrtcGetErrorString", true},
        {(void **)&nv.api.Version, "nvrtcVersion", true},
        {(void **)&nv.api.GetNumSupportedArchs, "nvrtcGetNumSupportedArchs", false},
        {(void **)&nv.api.GetSupportedArchs, "nvrtcGetSupportedArchs", false},
        {(void **)&nv.api.CreateProgram, "nvrtcCreateProgram", true},
        {(void **)&nv.api.DestroyProgram, "nvrtcDestroyProgram", true},
        {(void **)&nv.api.CompileProgram, "nvrtcCompileProgram", true},
        {(void **)&nv.api.GetProgramLogSize, "nvrtcGetProgramLogSize", true},
        {(void **)&nv.api.GetProgramLog, "nvrtcGetProgramLog", true},
        {(void **)&nv.api.GetCUBINSize, "nvrtcGetCUBINSize", true},
        {(void **)&nv.api.GetCUBIN, "nvrtcGetCUBIN", true},
        {(void **)&nv.api.GetPTXSize, "nvrtcGetPTXSize", true},
        {(void **)&nv.api.GetPTX, "nvrtcGetPTX", true},
    };
    for (size_t i = 0; i < EM_ARRAY_LEN(syms); i++) {
        *syms[i].slot = dlsym(lib, syms[i].name);
        if (!*syms[i].slot && syms[i].required) {
            snprintf(nv.why, sizeof(nv.why), "libnvrtc unusable: %s has no %s (NVRTC too old; "
                     "CUDA 11.1 or newer is needed)", nv.path, syms[i].name);
            dlclose(lib);
            return;
        }
    }
    if (nv.api.Version(&nv.major, &nv.minor) != NVRTC_SUCCESS) {
        snprintf(nv.why, sizeof(nv.why), "libnvrtc unusable: nvrtcVersion failed in %s", nv.path);
        dlclose(lib);
        return;
    }
    int n = 0;
    if (nv.api.GetNumSupportedArchs && nv.api.GetSupportedArchs &&
        nv.api.GetNumSupportedArchs(&n) == NVRTC_SUCCESS && n > 0 && n <= MAX_ARCHS &&
        nv.api.GetSupportedArchs(nv.archs) == NVRTC_SUCCESS)
        nv.narchs = n;
    find_headers();
    read_extra_options();
    size_t used = (size_t)snprintf(nv.common, sizeof(nv.common), "%s%s%s", COMMON_OPTIONS,
                                   nv.include_opt[0] ? " " : "", nv.include_opt);
    for (int i = 0; i < nv.nextra && used < sizeof(nv.common); i++)
        used += (size_t)snprintf(nv.common + used, sizeof(nv.common) - used, " %s", nv.extra[i]);
    nv.ok = true; /* the library stays loaded for the life of the process */
}

em_status em_nvrtc_load(void)
{
    pthread_once(&nv_once, load_once);
    if (!nv.ok && nv.tried[0] && !nv.path[0])
        return em_set_error(EM_ERR_UNSUPPORTED, "%s; tried %s", nv.why, nv.tried);
    if (!nv.ok)
        return em_set_error(EM_ERR_UNSUPPORTED, "%s", nv.why);
    return EM_OK;
}

bool em_nvrtc_available(char *why, size_t why_size)
{
    pthread_once(&nv_once, load_once);
    if (!nv.ok && why && why_size)
        snprintf(why, why_size, "%s", nv.why);
    return nv.ok;
}

em_status em_nvrtc_version(int *major, int *minor)
{
    em_status st = em_nvrtc_load();
    if (st != EM_OK)
        return st;
    if (major)
        *major = nv.major;
    if (minor)
        *minor = nv.minor;
    return EM_OK;
}

const char *em_nvrtc_library(void)
{
    pthread_once(&nv_once, load_once);
    return nv.ok ? nv.path : "";
}

bool em_nvrtc_supports_arch(int sm)
{
    if (!em_nvrtc_available(NULL, 0))
        return false;
    if (nv.narchs == 0)
        return true; /* an old NVRTC that cannot tell: let the compile say */
    for (int i = 0; i < nv.narchs; i++)
        if (nv.archs[i] == sm)
            return true;
    return false;
}

int em_nvrtc_max_arch(void)
{
    if (!em_nvrtc_available(NULL, 0))
        return 0;
    int best = 0;
    for (int i = 0; i < nv.narchs; i++)
        best = EM_MAX(best, nv.archs[i]);
    return best;
}

const char *em_nvrtc_common_options(void)
{
    return em_nvrtc_available(NULL, 0) ? nv.common : "";
}

/* Checks "sm_XY", "sm_XYa", "sm_XYf" or "compute_XY"; sets *ptx for compute_. */
static bool parse_arch(const char *arch, bool *ptx)
{
    const char *digits;
    if (strncmp(arch, "sm_", 3) == 0) {
        digits = arch + 3;
        *ptx = false;
    } else if (strncmp(arch, "compute_", 8) == 0) {
        digits = arch + 8;
        *ptx = true;
    } else {
        return false;
    }
    size_t nd = strspn(digits, "0123456789");
    if (nd < 2 || nd > 3)
        return false;
    const char *rest = digits + nd;
    return !*rest || ((rest[0] == 'a' || rest[0] == 'f') && !rest[1]);
}

/* The program's log (malloc'd, possibly ""), NULL when out of memory. */
static char *program_log(nvrtcProgram prog)
{
    size_t n = 0;
    if (nv.api.GetProgramLogSize(prog, &n) != NVRTC_SUCCESS || n == 0)
        n = 1;
    char *log = malloc(n + 1);
    if (!log)
        return NULL;
    log[0] = '\0';
    if (n > 1 && nv.api.GetProgramLog(prog, log) != NVRTC_SUCCESS)
        log[0] = '\0';
    log[n] = '\0';
    /* drop trailing blank lines */
    size_t len = strlen(log);
    while (len && (log[len - 1] == '\n' || log[len - 1] == '\r' || log[len - 1] == ' '))
        log[--len] = '\0';
    return log;
}

/* Copies the compiled image out of prog. */
static em_status fetch_output(nvrtcProgram prog, bool ptx, const char *arch, void **binary,
                              size_t *size)
{
    size_t n = 0;
    nvrtcResult r = ptx ? nv.api.GetPTXSize(prog, &n) : nv.api.GetCUBINSize(prog, &n);
    if (r != NVRTC_SUCCESS || n == 0)
        return em_set_error(EM_ERR_COMPILE, "NVRTC %d.%d produced no %s for %s (%s)", nv.major,
                            nv.minor, ptx ? "PTX" : "cubin", arch,
                            r != NVRTC_SUCCESS ? nv.api.GetErrorString(r) : "empty output");
    char *out = malloc(n);
    if (!out)
        return em_set_error(EM_ERR_NOMEM, "out of memory for a %zu-byte %s", n,
                            ptx ? "PTX" : "cubin");
    r = ptx ? nv.api.GetPTX(prog, out) : nv.api.GetCUBIN(prog, out);
    if (r != NVRTC_SUCCESS) {
        free(out);
        return em_set_error(EM_ERR_COMPILE, "NVRTC %d.%d: fetching the %s failed: %s", nv.major,
                            nv.minor, ptx ? "PTX" : "cubin", nv.api.GetErrorString(r));
    }
    *binary = out;
    *size = n;
    return EM_OK;
}

em_status em_nvrtc_compile(const char *src, const char *arch, char **log, void **binary,
                           size_t *size)
{
    if (log)
        *log = NULL;
    if (!src || !arch || !binary || !size)
        return em_set_error(EM_ERR_INVALID, "em_nvrtc_compile: no source, arch or output");
    *binary = NULL;
    *size = 0;
    bool ptx = false;
    if (!parse_arch(arch, &ptx))
        return em_set_error(EM_ERR_INVALID, "NVRTC: bad architecture '%s' (expected sm_XY, "
                            "sm_XYa or compute_XY, e.g. sm_90)", arch);
    em_status st = em_nvrtc_load();
    if (st != EM_OK)
        return st;

    char arch_opt[64];
    snprintf(arch_opt, sizeof(arch_opt), "--gpu-architecture=%s", arch);
    const char *opts[4 + MAX_EXTRA_OPTIONS];
    int nopts = 0;
    opts[nopts++] = arch_opt;
    opts[nopts++] = "--std=c++17";
    opts[nopts++] = "-default-device";
    if (nv.include_opt[0])
        opts[nopts++] = nv.include_opt;
    for (int i = 0; i < nv.nextra; i++)
        opts[nopts++] = nv.extra[i];

    nvrtcProgram prog = NULL;
    nvrtcResult r = nv.api.CreateProgram(&prog, src, "ember.cu", 0, NULL, NULL);
    if (r != NVRTC_SUCCESS)
        return em_set_error(r == NVRTC_ERROR_OUT_OF_MEMORY ? EM_ERR_NOMEM : EM_ERR_COMPILE,
                            "NVRTC %d.%d: cannot create a program: %s", nv.major, nv.minor,
                            nv.api.GetErrorString(r));
    r = nv.api.CompileProgram(prog, nopts, opts);
    char *text = program_log(prog);
    if (r != NVRTC_SUCCESS) {
        if (r == NVRTC_ERROR_COMPILATION || r == NVRTC_ERROR_INVALID_OPTION)
            st = em_set_error(EM_ERR_COMPILE, "NVRTC %d.%d (%s) failed to compile CUDA source "
                              "for %s (options: %s %s):\n%s", nv.major, nv.minor, nv.path, arch,
                              arch_opt, nv.common, text && *text ? text : "(no log)");
        else
            st = em_set_error(r == NVRTC_ERROR_OUT_OF_MEMORY ? EM_ERR_NOMEM : EM_ERR_COMPILE,
                              "NVRTC %d.%d failed for %s: %s%s%s", nv.major, nv.minor, arch,
                              nv.api.GetErrorString(r), text && *text ? "\n" : "",
                              text ? text : "");
    } else {
        st = fetch_output(prog, ptx, arch, binary, size);
    }
    nv.api.DestroyProgram(&prog);
    if (log && text)
        *log = text;
    else
        free(text);
    if (st == EM_OK && log && !*log && !(*log = calloc(1, 1))) {
        free(*binary);
        *binary = NULL;
        *size = 0;
        return em_set_error(EM_ERR_NOMEM, "out of memory");
    }
    return st;
}
