/* chat.c — `ember chat`: terminal chat. (Placeholder until its issue lands: says so and fails.) */
#include <stdio.h>

#include "cli.h"

int em_cli_chat(int argc, char **argv)
{
    (void)argc;
    (void)argv;
    fprintf(stderr, "ember chat: not available in this build yet\n");
    return 2;
}
