/* arena.h — a bump allocator: many small allocations freed together. Used by the compiler for
 * AST and IR nodes, and anywhere a batch of objects shares one lifetime. */
#ifndef EM_BASE_ARENA_H
#define EM_BASE_ARENA_H
#include <stddef.h>

typedef struct em_arena_block em_arena_block;
typedef struct em_arena {
    em_arena_block *head; /* newest block; older ones chained behind it */
    size_t block_size;    /* default size of a new block */
    size_t total;         /* bytes handed out, for statistics */
} em_arena;

/* Initializes an empty arena; block_size 0 picks 64 KiB. */
void em_arena_init(em_arena *a, size_t block_size);
/* Returns zeroed memory aligned to 16 bytes, owned by the arena; NULL (error set) when out of
 * memory. */
void *em_arena_alloc(em_arena *a, size_t size);
/* Copies a NUL-terminated string (or n bytes + NUL with em_arena_strndup) into the arena. */
char *em_arena_strdup(em_arena *a, const char *s);
char *em_arena_strndup(em_arena *a, const char *s, size_t n);
/* Frees every block; the arena can be reused after em_arena_init. */
void em_arena_free(em_arena *a);

#endif
