/* ember/record.h — safetensors files and checkpoints.
 *
 * A safetensors file is an 8-byte little-endian header length, a JSON header (name -> dtype,
 * shape, data_offsets; an optional "__metadata__" of string pairs) and the raw little-endian data.
 * Reading maps the file and checks every entry (offsets in range, sizes matching dtype x shape,
 * no overlaps) so a corrupt file gives a message, never a crash. Writing goes to a temporary file
 * that is renamed over the target, so an interrupted save leaves the previous file intact. */
#ifndef EMBER_RECORD_H
#define EMBER_RECORD_H

#include "ember/nn.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct em_safetensors em_safetensors;

/* Opens and validates a file (mmap). NULL with the error set (naming the file and the problem). */
em_safetensors *em_safetensors_open(const char *path);
void em_safetensors_close(em_safetensors *f);
int em_safetensors_count(const em_safetensors *f);
/* Name of entry i (in file order), its dtype and shape. */
const char *em_safetensors_name(const em_safetensors *f, int i);
bool em_safetensors_info(const em_safetensors *f, const char *name, em_scalar *dtype, em_shape *shape);
/* A metadata value or NULL. */
const char *em_safetensors_metadata(const em_safetensors *f, const char *key);
/* The named tensor on dev, converted to dtype (EM_SCALAR_COUNT keeps the file's). NULL with the
 * error set when absent or unconvertible. */
em_tensor *em_safetensors_load(const em_safetensors *f, const char *name, em_device *dev,
                               em_scalar dtype);

/* Writing: collect named tensors (retained until the writer is freed), then save atomically. */
typedef struct em_safetensors_writer em_safetensors_writer;
em_safetensors_writer *em_safetensors_writer_new(void);
em_status em_safetensors_add(em_safetensors_writer *w, const char *name, const em_tensor *t);
em_status em_safetensors_add_metadata(em_safetensors_writer *w, const char *key, const char *value);
em_status em_safetensors_write(em_safetensors_writer *w, const char *path);
void em_safetensors_writer_free(em_safetensors_writer *w);

/* A module's parameters and buffers by full name. Loading checks every entry: the error lists
 * the missing, unexpected and mis-shaped tensors (strict), or only fails on mis-shaped ones and
 * reports the rest through the log when !strict. `rename` (NULL for none) maps a file name to
 * the module's name (or NULL to skip it), e.g. to drop a "transformer." prefix. */
em_status em_module_save(em_module *m, const char *path);
typedef const char *(*em_name_map_fn)(const char *file_name, char *buf, size_t size, void *user);
em_status em_module_load(em_module *m, const char *path, bool strict, em_name_map_fn rename,
                         void *user);

#ifdef __cplusplus
}
#endif
#endif
