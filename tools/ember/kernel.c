/* kernel.c — `ember kernel`: check kernel-language files, list their kernels, and dump a kernel's
 * IR and generated code for a target, specialized with --set bindings. Also dumps the IR-builder
 * samples of src/kernel/examples.h (`--example NAME`) and the built-in kernels (`--builtin`).
 * Exit status: 0 on success, 1 when a source has errors, 2 on bad usage. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"
#include "ember/lang.h"
#include "ember/runtime.h"
#include "kernel/examples.h"

#define MAX_SETS 64

static void usage(FILE *out)
{
    fprintf(out,
            "usage: ember kernel check FILE...\n"
            "       ember kernel list [FILE]\n"
            "       ember kernel dump FILE|--builtin [--kernel NAME] [--target TARGET]\n"
            "                         [--arch ARCH] [--set NAME=VALUE]... [--line-width N]\n"
            "       ember kernel dump --example NAME [--target TARGET]\n"
            "\n"
            "  check       parse and type-check every kernel of each file (comptime parameters\n"
            "              without a default are checked with 1, false or 1.0); print diagnostics\n"
            "  list        the kernels of FILE, or the built-in kernels\n"
            "  dump        print the IR of a kernel specialized with the bindings, and with\n"
            "              --target the code generated for it (c, cuda, opencl, glsl)\n"
            "  --arch A    the target's architecture (cuda: sm_90a turns on wgmma and TMA)\n"
            "  --set N=V   bind generic N to a type (F=f16) or comptime parameter N to a value\n"
            "              (TILE=16, FLAG=true); LINE_WIDTH=4 sets the line width\n"
            "  --example   a sample kernel built with the IR builder:");
    for (const char *const *n = em_ir_example_names(); n && *n; n++) fprintf(out, " %s", *n);
    fprintf(out, "\n");
}

static int check_files(int argc, char **argv)
{
    if (argc < 1) {
        usage(stderr);
        return 2;
    }
    int status = 0;
    for (int i = 0; i < argc; i++) {
        em_lang_diags *d = em_lang_diags_new();
        em_lang_module *m = em_lang_module_from_file(argv[i], d);
        if (m && em_lang_check(m, d) == EM_OK) {
            printf("%s: ok (%zu kernel%s)\n", argv[i], em_lang_kernel_count(m),
                   em_lang_kernel_count(m) == 1 ? "" : "s");
        } else {
            status = 1;
            if (em_lang_diags_count(d)) {
                char *text = em_lang_diags_format(d);
                fputs(text ? text : "", stderr);
                free(text);
            } else {
                fprintf(stderr, "%s: %s\n", argv[i], em_last_error());
            }
        }
        em_lang_module_free(m);
        em_lang_diags_free(d);
    }
    return status;
}

static int list_kernels(int argc, char **argv)
{
    em_lang_module *owned = NULL;
    const em_lang_module *m;
    if (argc >= 1) {
        m = owned = em_lang_module_from_file(argv[0], NULL);
    } else {
        m = em_lang_builtins();
    }
    if (!m) {
        fprintf(stderr, "%s\n", em_last_error());
        return 1;
    }
    for (size_t i = 0; i < em_lang_kernel_count(m); i++) printf("%s\n", em_lang_kernel_name(m, i));
    em_lang_module_free(owned);
    return 0;
}

/* Prints the IR of k, then (when simplification changes it) the simplified IR that the targets
 * compile, then the code for `target` when given. */
static int dump_one(const em_ir_kernel *k, const em_caps *caps)
{
    char *ir = em_ir_print_kernel(k);
    if (!ir) {
        fprintf(stderr, "ember kernel: %s\n", em_last_error());
        return 1;
    }
    fputs(ir, stdout);
    em_ir_kernel *simple = em_ir_kernel_clone(k);
    if (simple && em_ir_simplify(simple) == EM_OK) {
        char *sir = em_ir_print_kernel(simple);
        if (sir && strcmp(sir, ir) != 0)
            printf("\n/* ---- after simplification (what every target compiles) ---- */\n%s", sir);
        free(sir);
    }
    em_ir_kernel_free(simple);
    free(ir);
    if (!caps) return 0;
    const char *target = caps->target;
    char *src = em_kernel_source_caps(k, caps);
    if (!src) {
        fprintf(stderr, "ember kernel: target '%s': %s\n", target, em_last_error());
        return 1;
    }
    printf("\n/* ---- generated %s ---- */\n%s", target, src);
    free(src);
    return 0;
}

static int dump_example(const char *name, const char *target)
{
    em_ir_kernel *k = em_ir_example(name);
    if (!k) {
        fprintf(stderr, "ember kernel: %s\n", em_last_error());
        return 1;
    }
    em_caps caps = {0};
    if (target) snprintf(caps.target, sizeof(caps.target), "%s", target);
    int rc = dump_one(k, target ? &caps : NULL);
    em_ir_kernel_free(k);
    return rc;
}

static int dump(int argc, char **argv)
{
    const char *file = NULL, *kernel = NULL, *target = NULL, *example = NULL, *arch = NULL;
    bool builtin = false;
    em_lang_bind binds[MAX_SETS];
    size_t nbinds = 0;
    unsigned width = 0;
    for (int i = 0; i < argc; i++) {
        const char *a = argv[i];
        bool has_next = i + 1 < argc;
        if (!strcmp(a, "--kernel") && has_next) {
            kernel = argv[++i];
        } else if (!strcmp(a, "--target") && has_next) {
            target = argv[++i];
        } else if (!strcmp(a, "--arch") && has_next) {
            arch = argv[++i];
        } else if (!strcmp(a, "--example") && has_next) {
            example = argv[++i];
        } else if (!strcmp(a, "--line-width") && has_next) {
            width = (unsigned)strtoul(argv[++i], NULL, 10);
        } else if (!strcmp(a, "--builtin")) {
            builtin = true;
        } else if (!strcmp(a, "--set") && has_next) {
            char *eq = strchr(argv[++i], '=');
            if (!eq || eq == argv[i] || nbinds == MAX_SETS) {
                fprintf(stderr, "ember kernel: --set takes NAME=VALUE\n");
                return 2;
            }
            *eq = 0;
            binds[nbinds++] = em_lang_bind_text(argv[i], eq + 1);
        } else if (a[0] != '-' && !file) {
            file = a;
        } else {
            fprintf(stderr, "ember kernel: unexpected argument '%s'\n", a);
            usage(stderr);
            return 2;
        }
    }
    if (example) return dump_example(example, target);
    if (!file && !builtin) {
        usage(stderr);
        return 2;
    }
    em_lang_diags *d = em_lang_diags_new();
    em_lang_module *owned = builtin ? NULL : em_lang_module_from_file(file, d);
    const em_lang_module *m = builtin ? em_lang_builtins() : owned;
    int rc = 0;
    em_caps caps = {0};
    if (target) snprintf(caps.target, sizeof(caps.target), "%s", target);
    if (arch) snprintf(caps.arch, sizeof(caps.arch), "%s", arch);
    em_lang_spec spec = {binds, nbinds, width, target ? &caps : NULL};
    for (size_t i = 0; m && i < em_lang_kernel_count(m) && !rc; i++) {
        const char *name = em_lang_kernel_name(m, i);
        if (kernel && strcmp(kernel, name)) continue;
        em_ir_kernel *k = em_lang_specialize(m, name, &spec, d);
        if (!k) {
            rc = 1;
            break;
        }
        rc = dump_one(k, target ? &caps : NULL);
        em_ir_kernel_free(k);
        if (kernel) break;
    }
    if (m && kernel && !em_lang_has_kernel(m, kernel)) {
        em_ir_kernel *k = em_lang_specialize(m, kernel, &spec, d); /* reports the unknown name */
        em_ir_kernel_free(k);
        rc = 1;
    }
    if (!m || em_lang_diags_count(d)) {
        rc = 1;
        char *text = em_lang_diags_count(d) ? em_lang_diags_format(d) : NULL;
        fprintf(stderr, "%s", text ? text : "");
        if (!text) fprintf(stderr, "ember kernel: %s\n", em_last_error());
        free(text);
    }
    em_lang_module_free(owned);
    em_lang_diags_free(d);
    return rc;
}

int em_cli_kernel(int argc, char **argv)
{
    if (argc < 2 || !strcmp(argv[1], "--help") || !strcmp(argv[1], "-h")) {
        usage(argc < 2 ? stderr : stdout);
        return argc < 2 ? 2 : 0;
    }
    const char *sub = argv[1];
    if (!strcmp(sub, "check")) return check_files(argc - 2, argv + 2);
    if (!strcmp(sub, "list")) return list_kernels(argc - 2, argv + 2);
    if (!strcmp(sub, "dump")) return dump(argc - 2, argv + 2);
    fprintf(stderr, "ember kernel: unknown subcommand '%s'\n", sub);
    usage(stderr);
    return 2;
}
