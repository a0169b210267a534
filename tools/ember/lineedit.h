/* lineedit.h — reading a line from the terminal with editing and history, for `ember chat`: left
 * / right (by character), Home / End, Ctrl-A / Ctrl-E, Backspace / Delete, Ctrl-U / Ctrl-K /
 * Ctrl-W, up / down through the earlier lines, Ctrl-D on an empty line for end of input, Ctrl-C
 * to drop the line. When stdin is not a terminal it reads plain lines. */
#ifndef EMBER_LINEEDIT_H
#define EMBER_LINEEDIT_H

#include <stddef.h>

typedef struct le_history {
    char **lines; /* malloc'd entries, oldest first */
    size_t n, cap;
} le_history;

/* Prints prompt and reads one line (without its newline) into a malloc'd string, adding it to
 * the history when non-empty. NULL at end of input. */
char *le_readline(const char *prompt, le_history *h);
void le_history_free(le_history *h);

#endif
