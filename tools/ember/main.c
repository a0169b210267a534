/* main.c — the `ember` command: `ember <command> [args]`. Each command lives in its own file
 * (cli.h) and receives the arguments after `ember` (argv[0] is the command name). This file only
 * dispatches and prints the overall help and version; `ember <command> --help` is the command's
 * own business, so each command documents itself. */
#include <execinfo.h>
#include <signal.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>
#include "ember/runtime.h"
#include "cli.h"

#ifndef EMBER_VERSION
#define EMBER_VERSION "0.1.0-dev"
#endif

typedef struct command {
    const char *name;                  /* what the user types */
    int (*run)(int argc, char **argv); /* the implementation (cli.h) */
    const char *summary;               /* one line for `ember --help` */
} command;

static const command COMMANDS[] = {
    {"info", em_cli_info, "list backends and devices, their capabilities, or why they are missing"},
    {"kernel", em_cli_kernel, "check, dump and run kernels"},
    {"tokenize", em_cli_tokenize, "print the token ids of a text (or decode ids back to text)"},
    {"data", em_cli_data, "prepare token shards from text, train a BPE tokenizer"},
    {"train", em_cli_train, "train a GPT on token shards or a text file, with a live dashboard"},
    {"sample", em_cli_sample, "generate text from a checkpoint (KV cache, top-k/top-p sampling)"},
    {"chat", em_cli_chat, "talk to a model in the terminal"},
    {"serve", em_cli_serve, "an OpenAI-compatible HTTP server with a web chat page"},
    {"bench", em_cli_bench,
     "benchmarks: matmul (against cuBLAS / OpenBLAS), decode, train-gpt2, attention"},
};

static void usage(FILE *out)
{
    fprintf(out, "usage: ember <command> [args]\n"
                 "       ember <command> --help\n"
                 "       ember --version\n\n"
                 "ember is a deep-learning stack in C: kernels compiled at run time for every\n"
                 "device, tensors, autodiff and a GPT.\n\ncommands:\n");
    for (size_t i = 0; i < sizeof(COMMANDS) / sizeof(COMMANDS[0]); i++)
        fprintf(out, "  %-10s %s\n", COMMANDS[i].name, COMMANDS[i].summary);
    fprintf(out, "\nenvironment:\n"
                 "  EMBER_CACHE_DIR  kernel cache (default $XDG_CACHE_HOME/ember or "
                 "~/.cache/ember)\n"
                 "  EMBER_CC         C compiler for CPU kernels (default cc)\n"
                 "  EMBER_CFLAGS     its flags (default -O2)\n"
                 "  EMBER_THREADS    CPU worker threads (default: cores - 1)\n"
                 "  EMBER_LOG        log level: error, warn, info, debug, trace (default warn)\n");
}

/* On a crash (a bug in ember or in a driver it loaded), prints the signal and a backtrace before
 * dying with the same signal, so that a report from a machine without a debugger still says where.
 * Only async-signal-safe calls are used. */
static void crash_handler(int sig)
{
    static const char msg[] = "ember: crashed; backtrace follows (addr2line -e ember ADDR resolves it)\n";
    ssize_t w = write(STDERR_FILENO, msg, sizeof msg - 1);
    (void)w;
    void *frames[64];
    int n = backtrace(frames, 64);
    backtrace_symbols_fd(frames, n, STDERR_FILENO);
    signal(sig, SIG_DFL);
    raise(sig);
}

static void install_crash_handler(void)
{
#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
    return; /* the sanitizer's own report is better */
#endif
    void *warm[1];
    backtrace(warm, 1); /* loads libgcc now, not inside the handler */
    signal(SIGSEGV, crash_handler);
    signal(SIGBUS, crash_handler);
    signal(SIGFPE, crash_handler);
    signal(SIGILL, crash_handler);
}

int main(int argc, char **argv)
{
    install_crash_handler();
    if (argc < 2) {
        usage(stderr);
        return 2;
    }
    const char *cmd = argv[1];
    if (strcmp(cmd, "--help") == 0 || strcmp(cmd, "-h") == 0 || strcmp(cmd, "help") == 0) {
        if (strcmp(cmd, "help") == 0 && argc > 2) {
            for (size_t i = 0; i < sizeof(COMMANDS) / sizeof(COMMANDS[0]); i++) {
                if (strcmp(argv[2], COMMANDS[i].name) == 0) {
                    char *help_argv[] = {argv[2], "--help", NULL};
                    return COMMANDS[i].run(2, help_argv);
                }
            }
            fprintf(stderr, "ember: unknown command '%s'\n", argv[2]);
            return 2;
        }
        usage(stdout);
        return 0;
    }
    if (strcmp(cmd, "--version") == 0 || strcmp(cmd, "-V") == 0) {
        printf("ember %s\n", EMBER_VERSION);
        return 0;
    }
    for (size_t i = 0; i < sizeof(COMMANDS) / sizeof(COMMANDS[0]); i++)
        if (strcmp(cmd, COMMANDS[i].name) == 0)
            return COMMANDS[i].run(argc - 1, argv + 1);
    fprintf(stderr, "ember: unknown command '%s'\n\n", cmd);
    usage(stderr);
    return 2;
}
