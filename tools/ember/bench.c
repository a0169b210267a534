/* bench.c — `ember bench`: benchmarks. (Placeholder until its issue lands: says so and fails.) */
#include <stdio.h>

#include "cli.h"

int em_cli_bench(int argc, char **argv)
{
    (void)argc;
    (void)argv;
    fprintf(stderr, "ember bench: not available in this build yet\n");
    return 2;
}
