/* shard.c — token shards in llm.c's .bin format: a header of 256 little-endian int32 (magic
 * 20240520, version, token count, the rest zero), then the tokens as uint16 (version 1) or uint32
 * (version 2, for vocabularies over 65,536 ids). Shards are written atomically (temporary file,
 * then rename) and read through a memory map, checked before use: a wrong magic, an unknown
 * version or a size that disagrees with the count is reported, naming the file. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/file.h"
#include "ember/data.h"

static void put_le32(uint8_t *p, uint32_t v)
{
    p[0] = (uint8_t)v;
    p[1] = (uint8_t)(v >> 8);
    p[2] = (uint8_t)(v >> 16);
    p[3] = (uint8_t)(v >> 24);
}

static uint32_t get_le32(const uint8_t *p)
{
    return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}

em_status em_shard_write(const char *path, const uint32_t *ids, size_t n, uint32_t vocab_size)
{
    if (!path || (!ids && n)) return em_set_error(EM_ERR_INVALID, "em_shard_write: NULL argument");
    if (n > INT32_MAX)
        return em_set_error(EM_ERR_INVALID, "%s: %zu tokens do not fit one shard (at most %d)",
                            path, n, INT32_MAX);
    bool wide = vocab_size > 65536;
    size_t width = wide ? 4 : 2;
    size_t header = EM_SHARD_HEADER_INTS * 4;
    uint8_t *buf = calloc(1, header + n * width);
    if (!buf) return em_set_error(EM_ERR_NOMEM, "out of memory writing shard %s", path);
    put_le32(buf, EM_SHARD_MAGIC);
    put_le32(buf + 4, wide ? EM_SHARD_VERSION_U32 : EM_SHARD_VERSION_U16);
    put_le32(buf + 8, (uint32_t)n);
    uint8_t *p = buf + header;
    for (size_t i = 0; i < n; i++) {
        if (ids[i] >= vocab_size) {
            free(buf);
            return em_set_error(EM_ERR_INVALID,
                                "%s: token %zu has id %u, outside the vocabulary "
                                "(%u ids)",
                                path, i, ids[i], vocab_size);
        }
        p[0] = (uint8_t)ids[i];
        p[1] = (uint8_t)(ids[i] >> 8);
        if (wide) {
            p[2] = (uint8_t)(ids[i] >> 16);
            p[3] = (uint8_t)(ids[i] >> 24);
        }
        p += width;
    }
    em_status st = em_file_write_atomic(path, buf, header + n * width);
    free(buf);
    return st;
}

em_status em_shard_open(em_shard *s, const char *path)
{
    memset(s, 0, sizeof *s);
    if (!path) return em_set_error(EM_ERR_INVALID, "em_shard_open: NULL path");
    if (!em_file_exists(path))
        return em_set_error(EM_ERR_NOT_FOUND, "shard %s: no such file", path);
    em_mmap m;
    em_status st = em_mmap_open(&m, path);
    if (st != EM_OK) return em_error_context("shard %s", path);
    size_t header = EM_SHARD_HEADER_INTS * 4;
    const uint8_t *b = m.data;
    const char *why = NULL;
    uint32_t magic = 0, version = 0, count = 0;
    if (m.size < header) {
        why = "shorter than the 1024-byte header";
    } else {
        magic = get_le32(b);
        version = get_le32(b + 4);
        count = get_le32(b + 8);
        if (magic != EM_SHARD_MAGIC)
            why = "wrong magic";
        else if (version != EM_SHARD_VERSION_U16 && version != EM_SHARD_VERSION_U32)
            why = "unknown version";
    }
    if (why) {
        size_t size = m.size;
        em_mmap_close(&m);
        if (magic != EM_SHARD_MAGIC && size >= header)
            return em_set_error(EM_ERR_CORRUPT,
                                "shard %s: %s (%u, expected %d): not an llm.c token "
                                "shard",
                                path, why, magic, EM_SHARD_MAGIC);
        if (size >= header)
            return em_set_error(EM_ERR_CORRUPT,
                                "shard %s: %s %u (expected 1 for uint16 or 2 for "
                                "uint32 tokens)",
                                path, why, version);
        return em_set_error(EM_ERR_CORRUPT, "shard %s: %s (%zu bytes)", path, why, size);
    }
    size_t width = version == EM_SHARD_VERSION_U16 ? 2 : 4;
    if (count > INT32_MAX || m.size != header + (size_t)count * width) {
        size_t size = m.size;
        em_mmap_close(&m);
        return em_set_error(EM_ERR_CORRUPT,
                            "shard %s: the header counts %u tokens (%zu bytes), but "
                            "the file has %zu bytes",
                            path, count, header + (size_t)count * width, size);
    }
    s->path = strdup(path);
    if (!s->path) {
        em_mmap_close(&m);
        return em_set_error(EM_ERR_NOMEM, "out of memory opening %s", path);
    }
    s->map = m.data;
    s->map_size = m.size;
    s->version = (int)version;
    s->ntokens = count;
    s->tokens = b + header;
    return EM_OK;
}

void em_shard_close(em_shard *s)
{
    if (!s) return;
    em_mmap m = {s->map, s->map_size};
    if (s->map) em_mmap_close(&m);
    free(s->path);
    memset(s, 0, sizeof *s);
}
