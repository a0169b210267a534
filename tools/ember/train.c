/* train.c — `ember train`: GPT training. (Placeholder until its issue lands: says so and fails.) */
#include <stdio.h>

#include "cli.h"

int em_cli_train(int argc, char **argv)
{
    (void)argc;
    (void)argv;
    fprintf(stderr, "ember train: not available in this build yet\n");
    return 2;
}
