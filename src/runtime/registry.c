/* registry.c — the backends this build knows and the devices open in this process.
 *
 * Every backend has a row: its name, its driver vtable (NULL while the driver is not written
 * yet) and the shared library a GPU driver loads at run time. em_backend_list probes each row;
 * em_device_open parses "NAME" or "NAME:INDEX", finds the row, and returns the already-open
 * device of that name with one more reference, or opens it. The registry lock guards the open
 * devices and every reference count, so open and close are safe from any thread. */
#include <dlfcn.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "runtime/rt.h"

typedef struct backend_row {
    const char *name;         /* backend name, the device-name prefix */
    const em_driver *driver;  /* the vtable, or NULL while this build has no driver for it */
    const char *library;      /* what a driver loads at run time (probed while driver is NULL) */
} backend_row;

static const backend_row BACKENDS[] = {
    {"cpu", &em_rt_cpu_driver, NULL},
    {"cuda", &em_rt_cuda_driver, "libcuda.so.1"},
    {"opencl", &em_rt_opencl_driver, "libOpenCL.so.1"},
    {"vulkan", &em_rt_vulkan_driver, "libvulkan.so.1"},
};

#define MAX_OPEN_DEVICES 64

static pthread_mutex_t registry_lock = PTHREAD_MUTEX_INITIALIZER;
static em_device *open_devices[MAX_OPEN_DEVICES]; /* guarded by registry_lock */

/* Probes a backend that has no driver yet: says whether its library is present. */
static int probe_unbuilt(const backend_row *row, char *why, size_t why_size)
{
    void *lib = dlopen(row->library, RTLD_LAZY | RTLD_LOCAL);
    if (!lib) {
        snprintf(why, why_size, "%s not found", row->library);
        return 0;
    }
    dlclose(lib);
    snprintf(why, why_size, "%s found, but the %s backend is not built yet", row->library,
             row->name);
    return 0;
}

static int probe_row(const backend_row *row, char *why, size_t why_size)
{
    why[0] = '\0';
    if (!row->driver)
        return probe_unbuilt(row, why, why_size);
    return row->driver->probe(why, why_size);
}

size_t em_backend_list(em_backend_info *out, size_t max)
{
    size_t n = EM_ARRAY_LEN(BACKENDS);
    for (size_t i = 0; i < n && i < max && out; i++) {
        memset(&out[i], 0, sizeof(out[i]));
        out[i].name = BACKENDS[i].name;
        out[i].device_count = probe_row(&BACKENDS[i], out[i].why, sizeof(out[i].why));
    }
    return n;
}

static void known_backends(char *out, size_t size)
{
    size_t used = 0;
    out[0] = '\0';
    for (size_t i = 0; i < EM_ARRAY_LEN(BACKENDS) && used < size; i++)
        used += (size_t)snprintf(out + used, size - used, "%s%s", i ? ", " : "", BACKENDS[i].name);
}

/* Splits "NAME[:INDEX]" into a backend row and an index; sets a clear error when malformed. */
static const backend_row *parse_name(const char *name, int *index)
{
    const char *colon = strchr(name, ':');
    size_t prefix = colon ? (size_t)(colon - name) : strlen(name);
    const backend_row *row = NULL;
    for (size_t i = 0; i < EM_ARRAY_LEN(BACKENDS); i++)
        if (strlen(BACKENDS[i].name) == prefix && strncmp(BACKENDS[i].name, name, prefix) == 0)
            row = &BACKENDS[i];
    if (!row) {
        char known[128];
        known_backends(known, sizeof(known));
        em_set_error(EM_ERR_NOT_FOUND,
                     "unknown device '%s': device names are BACKEND or BACKEND:INDEX with a "
                     "backend among %s (e.g. \"cpu\", \"cuda:0\"); `ember info` lists this "
                     "machine's devices",
                     name, known);
        return NULL;
    }
    *index = 0;
    if (colon) {
        const char *digits = colon + 1;
        char *end = NULL;
        errno = 0;
        long v = strtol(digits, &end, 10);
        if (!*digits || *end || errno || v < 0 || v > 1000 || (digits[0] == '+' || digits[0] == '-')) {
            em_set_error(EM_ERR_INVALID,
                         "bad device name '%s': the index after ':' must be a number (e.g. "
                         "\"%s:0\")",
                         name, row->name);
            return NULL;
        }
        *index = (int)v;
    }
    return row;
}

em_device *em_device_open(const char *name)
{
    if (!name) {
        em_set_error(EM_ERR_INVALID, "em_device_open: no device name given");
        return NULL;
    }
    em_rt_profile_init_env(); /* EMBER_PROFILE, before anything can launch */
    int index;
    const backend_row *row = parse_name(name, &index);
    if (!row)
        return NULL;
    char canonical[32];
    if (strcmp(row->name, "cpu") == 0)
        snprintf(canonical, sizeof(canonical), "cpu");
    else
        snprintf(canonical, sizeof(canonical), "%s:%d", row->name, index);

    pthread_mutex_lock(&registry_lock);
    for (size_t i = 0; i < MAX_OPEN_DEVICES; i++) {
        em_device *d = open_devices[i];
        if (d && strcmp(d->name, canonical) == 0) {
            d->refs++;
            pthread_mutex_unlock(&registry_lock);
            return d;
        }
    }
    char why[256];
    int count = probe_row(row, why, sizeof(why));
    em_device *dev = NULL;
    if (count == 0) {
        em_set_error(EM_ERR_UNSUPPORTED, "device '%s' is unavailable: %s", name,
                     why[0] ? why : "no devices found");
    } else if (index >= count) {
        em_set_error(EM_ERR_NOT_FOUND, "device '%s' does not exist: the %s backend has %d device%s%s",
                     name, row->name, count, count == 1 ? "" : "s",
                     count == 1 && strcmp(row->name, "cpu") == 0 ? " (\"cpu\")" : "");
    } else {
        size_t slot = MAX_OPEN_DEVICES;
        for (size_t i = 0; i < MAX_OPEN_DEVICES && slot == MAX_OPEN_DEVICES; i++)
            if (!open_devices[i])
                slot = i;
        if (slot == MAX_OPEN_DEVICES)
            em_set_error(EM_ERR_UNSUPPORTED, "cannot open '%s': %d devices are open already",
                         name, MAX_OPEN_DEVICES);
        else if ((dev = em_rt_device_create(row->driver, index, canonical)))
            open_devices[slot] = dev;
    }
    pthread_mutex_unlock(&registry_lock);
    return dev;
}

void em_device_close(em_device *dev)
{
    if (!dev)
        return;
    pthread_mutex_lock(&registry_lock);
    bool last = --dev->refs == 0;
    if (last)
        for (size_t i = 0; i < MAX_OPEN_DEVICES; i++)
            if (open_devices[i] == dev)
                open_devices[i] = NULL;
    pthread_mutex_unlock(&registry_lock);
    if (last)
        em_rt_device_destroy(dev);
}
