/* module.c — the kernel language's host API (ember/lang.h): modules loaded from strings and files
 * (lex, parse, resolve), the built-in kernels embedded at build time, bindings checked against a
 * kernel's generic and comptime parameters, specialization to IR (with a per-module cache keyed by
 * the binding, so that each distinct binding is lowered once), and compile/launch helpers.
 *
 * Each cached specialization also keeps its IR hash (em_ir_hash, computed once when it is
 * lowered), so that compiling it again — every launch of a tensor op compiles its kernel — is a
 * lookup in the device's kernel map (em_rt_kernel_compile_hashed), not a print and hash of the
 * IR. */
#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kernel/lang/internal.h"
#include "runtime/cache.h"

/* One cached specialization. */
typedef struct spec_entry {
    em_ir_kernel *ir; /* the lowered kernel (owned) */
    char hash[33];    /* em_ir_hash(ir) */
} spec_entry;

struct em_lang_module {
    em_arena arena;   /* syntax tree, tokens' strings */
    lang_file *files; /* the sources */
    size_t nfiles;
    ast_module ast;       /* kernels, helpers, constants */
    pthread_mutex_t lock; /* guards cache */
    em_map cache;         /* binding key -> spec_entry (owned) */
};

/* ---- results and errors ------------------------------------------------------------------------
 */

/* Sets em_last_error to the formatted diagnostics and hands them to the caller's list. */
static void publish(em_lang_diags *tmp, em_lang_diags *out, em_status status)
{
    char *text = em_lang_diags_format(tmp);
    size_t n = text ? strlen(text) : 0;
    while (n && text[n - 1] == '\n') text[--n] = 0;
    em_set_error(status, "%s", text && *text ? text : "invalid kernel source");
    free(text);
    em_lang_diags_move(out, tmp);
}

void em_lang_module_free(em_lang_module *m)
{
    if (!m) return;
    size_t it = 0;
    const char *key;
    size_t klen;
    void *val;
    while (em_map_next(&m->cache, &it, &key, &klen, &val)) {
        em_ir_kernel_free(((spec_entry *)val)->ir);
        free(val);
    }
    em_map_free(&m->cache);
    pthread_mutex_destroy(&m->lock);
    for (size_t i = 0; i < m->nfiles; i++) {
        free(m->files[i].name);
        free(m->files[i].text);
    }
    free(m->files);
    free(m->ast.funcs.items);
    free(m->ast.globals.items);
    em_arena_free(&m->arena);
    free(m);
}

/* Loads n sources; lens[i] gives each one's length (NULL: NUL-terminated strings), so that files
 * with NUL bytes reach the lexer whole. */
static em_lang_module *load(const char *const *names, const char *const *sources, const size_t *lens,
                            size_t n, em_lang_diags *diags)
{
    em_lang_diags *tmp = em_lang_diags_new();
    em_lang_module *m = calloc(1, sizeof(*m));
    if (!tmp || !m || (n && !(m->files = calloc(n, sizeof(lang_file))))) {
        free(m);
        em_lang_diags_free(tmp);
        em_set_error(EM_ERR_NOMEM, "out of memory loading kernel source");
        return NULL;
    }
    em_arena_init(&m->arena, 0);
    pthread_mutex_init(&m->lock, NULL);
    em_map_init(&m->cache);
    bool oom = false;
    for (size_t i = 0; i < n; i++) {
        const char *src = sources[i] ? sources[i] : "";
        m->files[i].name = strdup(names && names[i] ? names[i] : "<string>");
        m->files[i].len = lens ? lens[i] : strlen(src);
        m->files[i].text = malloc(m->files[i].len + 1);
        if (m->files[i].text) {
            memcpy(m->files[i].text, src, m->files[i].len);
            m->files[i].text[m->files[i].len] = 0;
        }
        oom |= !m->files[i].name || !m->files[i].text;
        m->nfiles = i + 1;
    }
    lang_sink sink = {tmp, m->files, m->nfiles, 0};
    for (size_t i = 0; i < n && !oom; i++) {
        if (m->files[i].len > LANG_MAX_SOURCE) {
            em_lang_error(&sink, (lpos){(uint32_t)i, 1, 1}, NULL,
                          "source file is too large (%zu bytes, the limit is %u)", m->files[i].len,
                          LANG_MAX_SOURCE);
            continue;
        }
        token_vec toks = {0};
        oom |= !em_lang_lex(&m->files[i], (uint32_t)i, &m->arena, &sink, &toks);
        if (!oom) oom |= !em_lang_parse(&toks, &m->arena, &sink, &m->ast);
        free(toks.items);
    }
    if (!oom && !sink.errors) em_lang_resolve(&m->ast, &sink);
    if (oom) {
        em_lang_module_free(m);
        em_lang_diags_free(tmp);
        em_set_error(EM_ERR_NOMEM, "out of memory loading kernel source");
        return NULL;
    }
    if (sink.errors) {
        publish(tmp, diags, EM_ERR_INVALID);
        em_lang_diags_free(tmp);
        em_lang_module_free(m);
        return NULL;
    }
    em_lang_diags_free(tmp);
    return m;
}

em_lang_module *em_lang_module_from_strings(const char *const *names, const char *const *sources,
                                            size_t n, em_lang_diags *diags)
{
    return load(names, sources, NULL, n, diags);
}

em_lang_module *em_lang_module_from_string(const char *filename, const char *source,
                                           em_lang_diags *diags)
{
    return em_lang_module_from_strings(&filename, &source, 1, diags);
}

em_lang_module *em_lang_module_from_file(const char *path, em_lang_diags *diags)
{
    size_t len = 0;
    char *text = em_file_read(path, &len);
    if (!text) return NULL;
    const char *src = text;
    em_lang_module *m = load(&path, &src, &len, 1, diags);
    free(text);
    return m;
}

/* ---- kernels ------------------------------------------------------------------------------------
 */

static const ast_func *find_kernel(const em_lang_module *m, const char *name)
{
    for (size_t i = 0; m && name && i < m->ast.funcs.len; i++) {
        const ast_func *f = m->ast.funcs.items[i];
        if (f->is_kernel && !strcmp(f->name, name)) return f;
    }
    return NULL;
}

size_t em_lang_kernel_count(const em_lang_module *m)
{
    size_t n = 0;
    for (size_t i = 0; m && i < m->ast.funcs.len; i++) n += m->ast.funcs.items[i]->is_kernel;
    return n;
}

const char *em_lang_kernel_name(const em_lang_module *m, size_t i)
{
    for (size_t j = 0; m && j < m->ast.funcs.len; j++) {
        if (!m->ast.funcs.items[j]->is_kernel) continue;
        if (i-- == 0) return m->ast.funcs.items[j]->name;
    }
    return NULL;
}

bool em_lang_has_kernel(const em_lang_module *m, const char *kernel)
{
    return find_kernel(m, kernel) != NULL;
}

/* ---- bindings
 * --------------------------------------------------------------------------------------- */

static bool parse_int_text(const char *text, int64_t *out)
{
    if (!strcmp(text, "true") || !strcmp(text, "false")) {
        *out = text[0] == 't';
        return true;
    }
    char *end;
    errno = 0;
    long long v = strtoll(text, &end, 0);
    if (errno || end == text || *end) return false;
    *out = v;
    return true;
}

static bool int_in_range(em_scalar s, int64_t v)
{
    if (s == EM_BOOL) return v == 0 || v == 1;
    int bits = (int)em_scalar_size(s) * 8;
    if (em_scalar_is_signed(s))
        return bits >= 64 || (v >= -(INT64_C(1) << (bits - 1)) && v < (INT64_C(1) << (bits - 1)));
    return v >= 0 && (bits >= 64 || (uint64_t)v < (UINT64_C(1) << bits));
}

/* Stores binding `bd` for comptime parameter q (index i). */
static bool bind_comptime(lang_sink *sink, const ast_func *f, const ast_param *q, uint32_t i,
                          const em_lang_bind *bd, lang_binding *out)
{
    em_scalar s = (em_scalar)q->type->scalar;
    const char *tn = em_scalar_name(s);
    em_ir_const c = {0};
    int64_t iv = 0;
    double fv = 0;
    bool is_float_val = false;
    switch (bd->kind) {
    case EM_BIND_INT:
        iv = bd->i;
        break;
    case EM_BIND_BOOL:
        iv = bd->b;
        break;
    case EM_BIND_FLOAT:
        fv = bd->f;
        is_float_val = true;
        break;
    case EM_BIND_TEXT:
        if (!bd->text) goto bad;
        if (em_scalar_is_float(s)) {
            char *end;
            fv = strtod(bd->text, &end);
            if (end == bd->text || *end) goto bad;
            is_float_val = true;
        } else if (!parse_int_text(bd->text, &iv)) {
            goto bad;
        }
        break;
    default:
        goto bad;
    }
    if (em_scalar_is_float(s)) {
        c.f = is_float_val ? fv : (double)iv;
    } else if (is_float_val) {
        goto bad;
    } else if (s == EM_BOOL) {
        if (bd->kind != EM_BIND_BOOL && iv != 0 && iv != 1) goto bad;
        c.i = iv != 0;
    } else {
        if (!int_in_range(s, iv)) {
            em_lang_error_nopos(
                sink, "value %lld for comptime parameter '%s' of kernel '%s' does not fit in '%s'",
                (long long)iv, q->name, f->name, tn);
            return false;
        }
        if (em_scalar_is_signed(s))
            c.i = iv;
        else
            c.u = (uint64_t)iv;
    }
    out->comptime[i] = c;
    out->have_comptime[i] = true;
    return true;
bad:
    em_lang_error_nopos(
        sink, "bad value for comptime parameter '%s' of kernel '%s': expected a value of type '%s'",
        q->name, f->name, tn);
    return false;
}

static bool bind_one(lang_sink *sink, const ast_func *f, const em_lang_bind *bd, lang_binding *out)
{
    const char *name = bd->name ? bd->name : "";
    if (!strcmp(name, "LINE_WIDTH")) {
        int64_t w = 0;
        if (bd->kind == EM_BIND_INT)
            w = bd->i;
        else if (bd->kind != EM_BIND_TEXT || !bd->text || !parse_int_text(bd->text, &w))
            w = -1;
        if (w < 1 || w > EM_MAX_LANES) {
            em_lang_error_nopos(sink, "LINE_WIDTH must be between 1 and %d", EM_MAX_LANES);
            return false;
        }
        out->line_width = (unsigned)w;
        return true;
    }
    for (uint32_t g = 0; g < f->ngenerics; g++) {
        const ast_generic *gen = &f->generics[g];
        if (strcmp(gen->name, name)) continue;
        em_scalar s = bd->kind == EM_BIND_TYPE               ? bd->type
                      : bd->kind == EM_BIND_TEXT && bd->text ? em_scalar_parse(bd->text)
                                                             : EM_SCALAR_COUNT;
        if ((unsigned)s >= EM_SCALAR_COUNT) {
            em_lang_error_nopos(
                sink, "generic '%s' of kernel '%s' must be bound to a scalar type (f32, i32...)",
                name, f->name);
            return false;
        }
        if (!em_lang_bound_allows((gen_bound)gen->bound, s)) {
            em_lang_error_nopos(
                sink, "type '%s' does not satisfy the bound '%s' of generic '%s' of kernel '%s'",
                em_scalar_name(s), em_lang_bound_name((gen_bound)gen->bound), name, f->name);
            return false;
        }
        out->generic[g] = s;
        return true;
    }
    for (uint32_t i = 0; i < f->nparams; i++) {
        const ast_param *q = &f->params[i];
        if (strcmp(q->name, name)) continue;
        if (!q->is_comptime) {
            em_lang_error_nopos(sink,
                                "parameter '%s' of kernel '%s' is not comptime: pass it at launch",
                                name, f->name);
            return false;
        }
        return bind_comptime(sink, f, q, i, bd, out);
    }
    const char *cands[LANG_MAX_GENERICS + LANG_MAX_PARAMS + 1];
    size_t nc = 0;
    for (uint32_t g = 0; g < f->ngenerics; g++) cands[nc++] = f->generics[g].name;
    for (uint32_t i = 0; i < f->nparams; i++)
        if (f->params[i].is_comptime) cands[nc++] = f->params[i].name;
    cands[nc++] = "LINE_WIDTH";
    char hint[256];
    bool h = em_lang_nearest(name, cands, nc, hint, sizeof(hint));
    em_lang_error_nopos(sink, "kernel '%s' has no generic or comptime parameter named '%s'%s%s",
                        f->name, name, h ? "; " : "", h ? hint : "");
    return false;
}

static bool make_binding(lang_sink *sink, const ast_func *f, const em_lang_spec *spec,
                         bool check_mode, lang_binding *out)
{
    memset(out, 0, sizeof(*out));
    out->check_mode = check_mode;
    out->line_width = spec && spec->line_width ? spec->line_width : 1;
    out->caps = spec ? spec->caps : NULL;
    if (out->line_width > EM_MAX_LANES) {
        em_lang_error_nopos(sink, "line width %u is out of range (1 to %d)", out->line_width,
                            EM_MAX_LANES);
        return false;
    }
    for (uint32_t g = 0; g < f->ngenerics; g++) {
        const ast_generic *gen = &f->generics[g];
        out->generic[g] =
            gen->def ? (em_scalar)gen->def->scalar : em_lang_bound_default((gen_bound)gen->bound);
    }
    bool ok = true;
    for (size_t i = 0; spec && i < spec->nbinds; i++) ok &= bind_one(sink, f, &spec->binds[i], out);
    return ok;
}

/* ---- specialization
 * ------------------------------------------------------------------------------ */

static em_ir_kernel *specialize(const em_lang_module *m, const char *kernel,
                                const em_lang_spec *spec, em_lang_diags *diags, bool check_mode)
{
    em_lang_diags *tmp = em_lang_diags_new();
    if (!tmp) return NULL;
    lang_sink sink = {tmp, m ? m->files : NULL, m ? m->nfiles : 0, 0};
    em_ir_kernel *k = NULL;
    const ast_func *f = find_kernel(m, kernel);
    em_status status = EM_ERR_INVALID;
    if (!m) {
        em_lang_error_nopos(&sink, "no module given");
    } else if (!f) {
        const char *cands[256];
        size_t nc = 0;
        for (size_t i = 0; i < m->ast.funcs.len && nc < 256; i++)
            if (m->ast.funcs.items[i]->is_kernel) cands[nc++] = m->ast.funcs.items[i]->name;
        char hint[256];
        bool h = kernel && em_lang_nearest(kernel, cands, nc, hint, sizeof(hint));
        em_lang_error_nopos(&sink, "no kernel named '%s'%s%s", kernel ? kernel : "(null)",
                            h ? "; " : "", h ? hint : "");
        status = EM_ERR_NOT_FOUND;
    } else {
        lang_binding b;
        if (make_binding(&sink, f, spec, check_mode, &b)) {
            k = em_lang_lower(&m->ast, f, &b, &sink);
            if (!k && !sink.errors) { /* out of memory: the error is set */
                em_lang_diags_free(tmp);
                return NULL;
            }
        }
    }
    if (!k) publish(tmp, diags, status);
    em_lang_diags_free(tmp);
    return k;
}

em_ir_kernel *em_lang_specialize(const em_lang_module *m, const char *kernel,
                                 const em_lang_spec *spec, em_lang_diags *diags)
{
    return specialize(m, kernel, spec, diags, false);
}

em_status em_lang_check(const em_lang_module *m, em_lang_diags *diags)
{
    em_lang_diags *all = em_lang_diags_new();
    if (!all) return EM_ERR_NOMEM;
    bool ok = true;
    for (size_t i = 0; m && i < m->ast.funcs.len; i++) {
        const ast_func *f = m->ast.funcs.items[i];
        if (!f->is_kernel) continue;
        em_ir_kernel *k = specialize(m, f->name, NULL, all, true);
        if (!k && em_last_status() == EM_ERR_NOMEM) {
            em_lang_diags_free(all);
            return EM_ERR_NOMEM;
        }
        ok &= k != NULL;
        em_ir_kernel_free(k);
        if (em_lang_diags_count(all) >= EM_LANG_MAX_ERRORS) break;
    }
    if (ok) {
        em_lang_diags_free(all);
        return EM_OK;
    }
    publish(all, diags, EM_ERR_INVALID);
    em_lang_diags_free(all);
    return EM_ERR_INVALID;
}

/* The cache key of a specialization: the kernel and every input of lowering. Built at every
 * launch, so without printf (a float binding aside). */
static void spec_key(const char *kernel, const em_lang_spec *spec, em_strbuf *sb)
{
    em_sb_append(sb, kernel);
    em_sb_append(sb, "|w");
    em_sb_append_int(sb, spec->line_width ? spec->line_width : 1);
    for (size_t i = 0; i < spec->nbinds; i++) {
        const em_lang_bind *b = &spec->binds[i];
        em_sb_appendc(sb, '|');
        em_sb_append(sb, b->name ? b->name : "");
        em_sb_appendc(sb, '=');
        em_sb_append_int(sb, b->kind);
        em_sb_appendc(sb, ':');
        switch (b->kind) {
        case EM_BIND_TYPE:
            em_sb_append_int(sb, (int)b->type);
            break;
        case EM_BIND_INT:
            em_sb_append_int(sb, (long long)b->i);
            break;
        case EM_BIND_FLOAT:
            em_sb_printf(sb, "%a", b->f);
            break;
        case EM_BIND_BOOL:
            em_sb_append_int(sb, b->b);
            break;
        default:
            em_sb_append(sb, b->text ? b->text : "");
            break;
        }
    }
    const em_caps *c = spec->caps;
    if (c) {
        em_sb_append(sb, "|t=");
        em_sb_append(sb, c->target);
        em_sb_appendc(sb, ':');
        em_sb_append_int(sb, c->plane_ops);
        em_sb_append_int(sb, c->matrix);
        em_sb_append_int(sb, c->float_atomic_add);
        em_sb_append_int(sb, c->print);
        em_sb_appendc(sb, ':');
        em_sb_append_int(sb, (long long)c->max_shared);
    }
}

/* The specialization for `spec` and its IR hash, lowered and hashed once per distinct binding;
 * owned by the module. */
static const spec_entry *cached(const em_lang_module *cm, const char *kernel,
                                const em_lang_spec *spec)
{
    em_lang_module *m = (em_lang_module *)cm; /* only the cache, guarded by the lock, changes */
    em_strbuf key;
    em_sb_init(&key);
    spec_key(kernel, spec, &key);
    if (key.oom) {
        em_sb_free(&key);
        em_set_error(EM_ERR_NOMEM, "out of memory");
        return NULL;
    }
    pthread_mutex_lock(&m->lock);
    spec_entry *e = em_map_gets(&m->cache, key.data);
    pthread_mutex_unlock(&m->lock);
    if (!e) {
        em_ir_kernel *k = em_lang_specialize(m, kernel, spec, NULL);
        e = k ? malloc(sizeof(*e)) : NULL;
        if (k && !e) em_set_error(EM_ERR_NOMEM, "out of memory");
        if (e) {
            e->ir = k;
            em_ir_hash(k, e->hash); /* outside the lock: it prints the whole kernel */
            pthread_mutex_lock(&m->lock);
            spec_entry *other = em_map_gets(&m->cache, key.data);
            bool put = !other && em_map_puts(&m->cache, key.data, e);
            pthread_mutex_unlock(&m->lock);
            if (!put) {
                em_ir_kernel_free(k);
                free(e);
                e = other;
                if (!e) em_set_error(EM_ERR_NOMEM, "out of memory");
            }
        } else {
            em_ir_kernel_free(k);
        }
    }
    em_sb_free(&key);
    return e;
}

bool em_lang_spec_hash(const em_lang_module *m, const char *kernel, const em_lang_spec *spec,
                       char out[33])
{
    if (!m || !kernel || !out) {
        em_set_error(EM_ERR_INVALID, "em_lang_spec_hash: missing module, kernel name or output");
        return false;
    }
    em_lang_spec s = spec ? *spec : (em_lang_spec){0};
    const spec_entry *e = cached(m, kernel, &s);
    if (e) memcpy(out, e->hash, sizeof(e->hash));
    return e != NULL;
}

em_kernel *em_lang_compile(em_device *dev, const em_lang_module *m, const char *kernel,
                           const em_lang_spec *spec)
{
    if (!dev || !m || !kernel) {
        em_set_error(EM_ERR_INVALID, "em_lang_compile: missing device, module or kernel name");
        return NULL;
    }
    em_lang_spec s = spec ? *spec : (em_lang_spec){0};
    if (!s.caps) s.caps = em_device_caps(dev);
    const spec_entry *e = cached(m, kernel, &s);
    if (!e) return NULL;
    em_kernel *out = em_rt_kernel_compile_hashed(dev, e->ir, e->hash);
    if (!out) em_error_context("kernel '%s'", kernel);
    return out;
}

em_status em_lang_launch(em_device *dev, const em_lang_module *m, const char *kernel,
                         const em_lang_spec *spec, const uint32_t cube_count[3],
                         const uint32_t cube_dim[3], const em_arg *args, size_t nargs)
{
    em_kernel *k = em_lang_compile(dev, m, kernel, spec);
    if (!k) return em_last_status() != EM_OK ? em_last_status() : EM_ERR_INVALID;
    em_status st = em_launch(k, cube_count, cube_dim, args, nargs);
    if (st != EM_OK) em_error_context("launching kernel '%s'", kernel);
    return st;
}

/* ---- built-in kernels
 * ------------------------------------------------------------------------------- */

typedef struct {
    const char *name;   /* file stem */
    const char *source; /* contents */
} em_builtin_kernel_src;
extern const em_builtin_kernel_src em_builtin_kernel_sources[];

static pthread_once_t builtins_once = PTHREAD_ONCE_INIT;
static em_lang_module *builtins_module;
static char builtins_error[1024];

static void load_builtins(void)
{
    size_t n = 0;
    while (em_builtin_kernel_sources[n].name) n++;
    const char **names = calloc(n ? n : 1, sizeof(char *));
    const char **sources = calloc(n ? n : 1, sizeof(char *));
    char(*paths)[96] = calloc(n ? n : 1, 96);
    if (!names || !sources || !paths) {
        snprintf(builtins_error, sizeof(builtins_error),
                 "out of memory loading the built-in kernels");
    } else {
        for (size_t i = 0; i < n; i++) {
            snprintf(paths[i], 96, "%s.ek", em_builtin_kernel_sources[i].name);
            names[i] = paths[i];
            sources[i] = em_builtin_kernel_sources[i].source;
        }
        builtins_module = em_lang_module_from_strings(names, sources, n, NULL);
        if (!builtins_module)
            snprintf(builtins_error, sizeof(builtins_error), "%s", em_last_error());
    }
    free(names);
    free(sources);
    free(paths);
}

const em_lang_module *em_lang_builtins(void)
{
    pthread_once(&builtins_once, load_builtins);
    if (!builtins_module) em_set_error(EM_ERR_INTERNAL, "built-in kernels: %s", builtins_error);
    return builtins_module;
}
