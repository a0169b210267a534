/* fuzz_safetensors.c — libFuzzer target over the safetensors reader. The input bytes are a file:
 * open it (every validation path), query every entry and metadata key, load every tensor ember can
 * hold onto the CPU device (which reads exactly the bytes validation allowed), and when the file
 * opens, write the loaded tensors back with the writer and check that the copy reopens with the
 * same names, dtypes and shapes. Any crash, sanitizer report or failed round trip
 * (__builtin_trap) is a bug. Seeds are in fuzz/corpus/safetensors. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/file.h"
#include "ember/record.h"

static em_device *g_cpu; /* opened once per process */
static char g_dir[512];  /* a private scratch directory */

int LLVMFuzzerInitialize(int *argc, char ***argv);
int LLVMFuzzerInitialize(int *argc, char ***argv)
{
    (void)argc;
    (void)argv;
    g_cpu = em_device_open("cpu");
    if (em_temp_dir("ember-fuzz-st", g_dir, sizeof g_dir) != EM_OK)
        snprintf(g_dir, sizeof g_dir, "/tmp");
    return 0;
}

static bool same_shape(em_shape a, em_shape b)
{
    if (a.rank != b.rank) return false;
    for (int i = 0; i < a.rank; i++)
        if (a.d[i] != b.d[i]) return false;
    return true;
}

/* Loads every entry, writes the loadable ones to a copy and compares the copy's index. */
static void exercise(em_safetensors *f)
{
    int n = em_safetensors_count(f);
    em_safetensors_writer *w = em_safetensors_writer_new();
    int written = 0;
    for (int i = 0; i < n; i++) {
        const char *name = em_safetensors_name(f, i);
        em_scalar dt;
        em_shape sh;
        if (!name || !em_safetensors_info(f, name, &dt, &sh)) __builtin_trap();
        em_tensor *t = g_cpu ? em_safetensors_load(f, name, g_cpu, EM_SCALAR_COUNT) : NULL;
        if (!t) continue; /* unsupported dtype (I8, ...): an error, not a crash */
        if (em_dtype(t) != dt || !same_shape(em_shape_of(t), sh)) __builtin_trap();
        if (em_safetensors_add(w, name, t) != EM_OK) __builtin_trap();
        written++;
        em_release(t);
    }
    em_safetensors_metadata(f, "format");
    char copy[600];
    snprintf(copy, sizeof copy, "%s/copy.safetensors", g_dir);
    if (em_safetensors_write(w, copy) == EM_OK) {
        em_safetensors *g = em_safetensors_open(copy);
        if (!g || em_safetensors_count(g) != written) __builtin_trap();
        for (int i = 0; i < written; i++) {
            const char *name = em_safetensors_name(g, i);
            em_scalar d1, d2;
            em_shape s1, s2;
            if (!em_safetensors_info(g, name, &d1, &s1) ||
                !em_safetensors_info(f, name, &d2, &s2) || d1 != d2 || !same_shape(s1, s2))
                __builtin_trap();
        }
        em_safetensors_close(g);
    }
    em_safetensors_writer_free(w);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    char path[600];
    snprintf(path, sizeof path, "%s/in.safetensors", g_dir);
    FILE *fp = fopen(path, "wb");
    if (!fp) return 0;
    if (size) fwrite(data, 1, size, fp);
    fclose(fp);
    em_safetensors *f = em_safetensors_open(path);
    if (f) {
        exercise(f);
        em_safetensors_close(f);
    }
    return 0;
}
