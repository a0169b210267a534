/* ember/lang.h — the kernel language's host API: load kernel sources (files, strings, or the
 * built-in kernels embedded in the library), read their diagnostics, specialize a kernel for a set
 * of bindings (generic element types, comptime values, the line width, the target) into an IR
 * kernel, and compile and launch it on a device.
 *
 * A module is a set of source files sharing one namespace of kernels, helpers and constants.
 * Loading a module lexes, parses and resolves names (errors that do not depend on bindings);
 * types are checked when a kernel is specialized, since they depend on the generic bindings, as
 * C++ templates are checked when instantiated. em_lang_check specializes every kernel with its
 * default bindings. The language itself is described in docs/kernel-language.md. */
#ifndef EMBER_LANG_H
#define EMBER_LANG_H

#include "ember/base.h"
#include "ember/kernel.h"
#include "ember/runtime.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ---- diagnostics ----------------------------------------------------------------------------- */

/* One error, located in a source file. */
typedef struct em_lang_diag {
    const char *file;     /* file name as given when loading */
    uint32_t line, col;   /* 1-based; a tab counts as one column */
    const char *message;  /* "use of undeclared identifier 'x'" */
    const char *hint;     /* NULL, or a suggestion ("did you mean 'y'?") */
    const char *src_line; /* the source line the error is on (without its newline) */
} em_lang_diag;

/* A list of diagnostics. Front-end calls append to it; one call stops at EM_LANG_MAX_ERRORS
 * errors (the formatted text then ends with "error: too many errors; stopped after 20"). */
typedef struct em_lang_diags em_lang_diags;
#define EM_LANG_MAX_ERRORS 20

/* A new, empty list (NULL with the error set when out of memory); free with em_lang_diags_free. */
em_lang_diags *em_lang_diags_new(void);
void em_lang_diags_free(em_lang_diags *d);
void em_lang_diags_clear(em_lang_diags *d);
size_t em_lang_diags_count(const em_lang_diags *d);
/* The i-th diagnostic (owned by the list), NULL when out of range. */
const em_lang_diag *em_lang_diags_at(const em_lang_diags *d, size_t i);
/* Errors reported beyond the limit and not kept (the front end stops soon after the limit). */
size_t em_lang_diags_dropped(const em_lang_diags *d);
/* Every diagnostic as text, malloc'd (the caller frees it): for each,
 *   FILE:LINE:COL: error: MESSAGE
 *   the source line
 *   a caret under the column
 *   hint: HINT            (when there is one)
 * and "error: too many errors; stopped after 20" when a call hit the limit. NULL when out of
 * memory. */
char *em_lang_diags_format(const em_lang_diags *d);

/* ---- modules --------------------------------------------------------------------------------- */

typedef struct em_lang_module em_lang_module;

/* Loads a module from one source text. `filename` names it in diagnostics. Returns the module
 * (the caller frees it with em_lang_module_free), or NULL when the source has errors: they are
 * appended to `diags` when given, and em_last_error() holds them formatted (EM_ERR_INVALID). */
em_lang_module *em_lang_module_from_string(const char *filename, const char *source,
                                           em_lang_diags *diags);
/* The same for a file read from `path` (EM_ERR_IO / EM_ERR_NOT_FOUND when it cannot be read). */
em_lang_module *em_lang_module_from_file(const char *path, em_lang_diags *diags);
/* Loads several sources into one module (one namespace); names[i] names sources[i]. */
em_lang_module *em_lang_module_from_strings(const char *const *names, const char *const *sources,
                                            size_t n, em_lang_diags *diags);
void em_lang_module_free(em_lang_module *m);

/* The kernels of a module, in source order. Names are owned by the module. */
size_t em_lang_kernel_count(const em_lang_module *m);
const char *em_lang_kernel_name(const em_lang_module *m, size_t i);
bool em_lang_has_kernel(const em_lang_module *m, const char *kernel);

/* The built-in kernels (the .ek files of src/kernels), loaded and resolved on first use into one shared,
 * process-wide module that is never freed. NULL with the error set if they fail to load (a bug). */
const em_lang_module *em_lang_builtins(void);

/* ---- bindings and specialization -------------------------------------------------------------- */

typedef enum em_lang_bind_kind {
    EM_BIND_TYPE = 0, /* a generic type parameter: `type` */
    EM_BIND_INT,      /* a comptime integer (or bool: 0/1, or float) parameter: `i` */
    EM_BIND_FLOAT,    /* a comptime float parameter: `f` */
    EM_BIND_BOOL,     /* a comptime bool parameter: `b` */
    EM_BIND_TEXT,     /* any of the above written as text ("f16", "16", "true", "0.5"): `text` */
} em_lang_bind_kind;

/* One binding of a kernel's generic or comptime parameter, by name. */
typedef struct em_lang_bind {
    const char *name; /* the parameter's name; "LINE_WIDTH" binds the line width */
    uint8_t kind;     /* an em_lang_bind_kind */
    em_scalar type;   /* EM_BIND_TYPE */
    int64_t i;        /* EM_BIND_INT */
    double f;         /* EM_BIND_FLOAT */
    bool b;           /* EM_BIND_BOOL */
    const char *text; /* EM_BIND_TEXT */
} em_lang_bind;

static inline em_lang_bind em_lang_bind_type(const char *name, em_scalar t)
{
    em_lang_bind b = {name, EM_BIND_TYPE, t, 0, 0, false, NULL};
    return b;
}
static inline em_lang_bind em_lang_bind_int(const char *name, int64_t v)
{
    em_lang_bind b = {name, EM_BIND_INT, EM_SCALAR_COUNT, v, 0, false, NULL};
    return b;
}
static inline em_lang_bind em_lang_bind_float(const char *name, double v)
{
    em_lang_bind b = {name, EM_BIND_FLOAT, EM_SCALAR_COUNT, 0, v, false, NULL};
    return b;
}
static inline em_lang_bind em_lang_bind_bool(const char *name, bool v)
{
    em_lang_bind b = {name, EM_BIND_BOOL, EM_SCALAR_COUNT, 0, 0, v, NULL};
    return b;
}
static inline em_lang_bind em_lang_bind_text(const char *name, const char *text)
{
    em_lang_bind b = {name, EM_BIND_TEXT, EM_SCALAR_COUNT, 0, 0, false, text};
    return b;
}

/* Everything a specialization depends on. Unbound generics and comptime parameters take their
 * declared defaults (a generic without one takes the first type of its bound: f32 for float,
 * i32 for int...; a comptime parameter without one is an error, except in em_lang_check). */
typedef struct em_lang_spec {
    const em_lang_bind *binds; /* bindings by name (may be NULL when nbinds is 0) */
    size_t nbinds;
    unsigned line_width;  /* lanes of line(T) in the kernel: 1..16 (0 means 1) */
    const em_caps *caps;  /* the target, for has(...): NULL = portable (every has() is false);
                           * em_lang_compile/launch fill it from the device when NULL */
} em_lang_spec;

/* Specializes `kernel` of module `m` into a new IR kernel (the caller frees it). Errors (unknown
 * kernel, bad binding, type errors) go to `diags` when given, and NULL is returned with
 * em_last_error() holding them formatted. Thread-safe. */
em_ir_kernel *em_lang_specialize(const em_lang_module *m, const char *kernel,
                                 const em_lang_spec *spec, em_lang_diags *diags);

/* Specializes every kernel with its defaults (comptime parameters without a default take 1,
 * false or 1.0) to find type errors. EM_OK, or EM_ERR_INVALID with the diagnostics in `diags`
 * and em_last_error(). */
em_status em_lang_check(const em_lang_module *m, em_lang_diags *diags);

/* ---- compile and launch ------------------------------------------------------------------------ */

/* Specializes (cached in the module, per distinct binding) and compiles (cached by the runtime,
 * per distinct IR) `kernel` for `dev`. The device owns the result. NULL with the error set. */
em_kernel *em_lang_compile(em_device *dev, const em_lang_module *m, const char *kernel,
                           const em_lang_spec *spec);

/* Compiles as above and launches over cube_count cubes of cube_dim units. `args` follow the
 * kernel's runtime parameters in declaration order (comptime parameters take no argument). */
em_status em_lang_launch(em_device *dev, const em_lang_module *m, const char *kernel,
                         const em_lang_spec *spec, const uint32_t cube_count[3],
                         const uint32_t cube_dim[3], const em_arg *args, size_t nargs);

#ifdef __cplusplus
}
#endif
#endif
