/* sample.c — `ember sample`: text generation. (Placeholder until its issue lands: says so and fails.) */
#include <stdio.h>

#include "cli.h"

int em_cli_sample(int argc, char **argv)
{
    (void)argc;
    (void)argv;
    fprintf(stderr, "ember sample: not available in this build yet\n");
    return 2;
}
