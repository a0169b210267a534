/* cli.h — the subcommands of the `ember` CLI, one file each in tools/ember/. Each takes the
 * arguments after its own name (argv[0] is the subcommand) and returns the process exit code. */
#ifndef EMBER_CLI_H
#define EMBER_CLI_H

int em_cli_info(int argc, char **argv);   /* info.c: devices found, and why others are missing */
int em_cli_kernel(int argc, char **argv); /* kernel.c: check / dump kernels */
int em_cli_tokenize(int argc, char **argv); /* tokenize.c: text <-> token ids */
int em_cli_data(int argc, char **argv);     /* data.c: token shards, tokenizer training */
int em_cli_train(int argc, char **argv);    /* train.c: GPT training with the dashboard */
int em_cli_sample(int argc, char **argv);   /* sample.c: text generation */
int em_cli_chat(int argc, char **argv);     /* chat.c: terminal chat */
int em_cli_serve(int argc, char **argv);    /* serve.c: the HTTP server and web chat page */
int em_cli_bench(int argc, char **argv);    /* bench.c: benchmarks (matmul, ...) */
int em_cli_bench_decode(int argc, char **argv); /* bench_decode.c: bench decode */
int em_cli_bench_train(int argc, char **argv);  /* bench_train.c: bench train-gpt2 */
int em_cli_bench_attention(int argc, char **argv); /* bench_attention.c: bench attention */

#endif
