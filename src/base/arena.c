/* arena.c — the bump allocator behind em_arena: a chain of calloc'd blocks, each carved from the
 * front in 16-byte aligned pieces. A request larger than a quarter of the block size gets a block
 * of its own, chained behind the current one so that the current block's free space stays in use.
 * Blocks are never reused before em_arena_free, so every piece handed out is still zero. */
#include "base/arena.h"
#include "ember/base.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#define ARENA_ALIGN 16
#define ARENA_DEFAULT_BLOCK (64 * 1024)

struct em_arena_block {
    em_arena_block *next; /* older block */
    unsigned char *base;  /* first 16-byte aligned byte of data */
    size_t size;          /* usable bytes from base */
    size_t used;          /* bytes carved from the front of base */
    unsigned char data[]; /* size + ARENA_ALIGN bytes, so base fits whatever malloc's alignment */
};

void em_arena_init(em_arena *a, size_t block_size)
{
    a->head = NULL;
    a->block_size = block_size ? block_size : ARENA_DEFAULT_BLOCK;
    a->total = 0;
}

static uintptr_t align_up(uintptr_t n)
{
    return (n + (ARENA_ALIGN - 1)) & ~(uintptr_t)(ARENA_ALIGN - 1);
}

/* A fresh zeroed block with `size` usable bytes; NULL (error set) when out of memory. */
static em_arena_block *new_block(size_t size)
{
    if (size > SIZE_MAX - sizeof(em_arena_block) - ARENA_ALIGN) {
        em_set_error(EM_ERR_NOMEM, "arena: allocation of %zu bytes is too large", size);
        return NULL;
    }
    em_arena_block *b = calloc(1, sizeof(em_arena_block) + size + ARENA_ALIGN);
    if (!b) {
        em_set_error(EM_ERR_NOMEM, "arena: out of memory allocating a block of %zu bytes", size);
        return NULL;
    }
    uintptr_t addr = (uintptr_t)b->data;
    b->base = b->data + (align_up(addr) - addr);
    b->size = size;
    return b;
}

/* Serves a large request from a dedicated block placed behind the head. */
static void *alloc_dedicated(em_arena *a, size_t size)
{
    em_arena_block *b = new_block(size);
    if (!b) return NULL;
    b->used = size;
    if (a->head) {
        b->next = a->head->next;
        a->head->next = b;
    } else {
        a->head = b;
    }
    return b->base;
}

void *em_arena_alloc(em_arena *a, size_t size)
{
    if (size == 0) size = 1; /* every call gets a distinct pointer */
    if (size > SIZE_MAX - ARENA_ALIGN) {
        em_set_error(EM_ERR_NOMEM, "arena: allocation of %zu bytes is too large", size);
        return NULL;
    }
    size_t need = align_up(size);
    void *p;
    em_arena_block *b = a->head;
    if (b && b->size - b->used >= need) {
        p = b->base + b->used;
        b->used += need;
    } else if (need > a->block_size / 4) {
        p = alloc_dedicated(a, need);
    } else {
        b = new_block(a->block_size);
        if (!b) return NULL;
        b->next = a->head;
        a->head = b;
        b->used = need;
        p = b->base;
    }
    if (p) a->total += size;
    return p;
}

char *em_arena_strndup(em_arena *a, const char *s, size_t n)
{
    if (n == SIZE_MAX) {
        em_set_error(EM_ERR_NOMEM, "arena: string of %zu bytes is too large", n);
        return NULL;
    }
    char *p = em_arena_alloc(a, n + 1);
    if (!p) return NULL;
    memcpy(p, s, n);
    p[n] = '\0';
    return p;
}

char *em_arena_strdup(em_arena *a, const char *s)
{
    return em_arena_strndup(a, s, strlen(s));
}

void em_arena_free(em_arena *a)
{
    em_arena_block *b = a->head;
    while (b) {
        em_arena_block *next = b->next;
        free(b);
        b = next;
    }
    a->head = NULL;
    a->total = 0;
}
