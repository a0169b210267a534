/* vulkan.c — the Vulkan device driver: fills em_rt_vulkan_driver (see runtime/driver.h) for any
 * Vulkan 1.1+ device with a compute queue (a GPU's vendor driver, or Mesa's lavapipe on the CPU
 * in CI). This file holds the loader, the instance, devices and their capabilities, memory and
 * the command stream; launches and timing are in vulkan_launch.c, compiling and loading shaders
 * in vulkan_spirv.c.
 *
 * Loading: libvulkan.so.1 is opened with dlopen and every function comes through
 * vkGetInstanceProcAddr / vkGetDeviceProcAddr (vulkan_internal.h), so a build never links the
 * loader and a machine without it still runs, saying why the backend is missing (no loader, no
 * driver (ICD), no device with Vulkan 1.1 and a compute queue). The instance is created once per
 * process (on the first probe) and lives as long as the process. Devices are numbered discrete
 * GPUs first, then integrated, virtual and CPU devices: "vulkan:0" is the best device the machine
 * has. A device gets one compute queue and the optional features ember's shaders may use (f16,
 * f64, 8/16/64-bit integers and storage, float atomics, sub-group size control, cooperative
 * matrices through VK_KHR_cooperative_matrix or VK_NV_cooperative_matrix (vulkan_coopmat.c)), each
 * enabled only where supported and reported in the caps.
 *
 * Memory: one VkBuffer with its own VkDeviceMemory per block (the runtime's pool does the
 * reusing). On a CPU or integrated device whose device-local memory is also host-visible and
 * coherent (lavapipe, UMA GPUs) buffers are mapped and read/write are plain memcpy after the
 * queue drains ("direct" mode). Otherwise buffers are device-local and transfers are staged
 * through host-visible memory with vkCmdCopyBuffer ($EMBER_VK_STAGING=1 forces this mode, so
 * tests on lavapipe cover it). Out-of-memory results map to EM_ERR_NOMEM so that the pool can
 * empty its cache and retry.
 *
 * The command stream: EM_VK_FRAMES command buffers rotate. Launches, copies, staged uploads and
 * timestamps are recorded into the current one, each behind a full compute/transfer memory
 * barrier (so every command sees the results of every earlier one, as on an in-order stream).
 * The frame is submitted at once when the queue is idle (so the device starts early), when its
 * arena or descriptor pool fills, or at a sync point; a frame is waited for (fence) before it is
 * recorded again. Each frame owns an arena — a host-visible buffer holding launch metadata and
 * staged uploads — and a descriptor pool, both reset when the frame is reused. One mutex per
 * device guards all of it, so any thread may call the driver. Every Vulkan call is checked; an
 * error names the call and the VkResult. */
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include "kernel/codegen/codegen.h"
#include "runtime/drivers/vulkan_internal.h"

#define VK_LIBRARY "libvulkan.so.1"
#define VK_MAX_PHYS 32
#define ARENA_DIRECT (1u << 20)   /* arena bytes per frame when buffers are mapped */
#define ARENA_STAGING (16u << 20) /* arena bytes per frame when transfers are staged */
#define DESCS_PER_FRAME 4096      /* storage-buffer descriptors per frame (per-pool total) */
#define QUERIES 512               /* timestamp queries per device */

/* ---- results and errors ---------------------------------------------------------------------- */

const char *em_rt_vk_result_name(VkResult r)
{
    /* clang-format off */
    switch (r) {
#define R(x) case x: return #x;
        R(VK_SUCCESS) R(VK_NOT_READY) R(VK_TIMEOUT) R(VK_EVENT_SET) R(VK_EVENT_RESET)
        R(VK_INCOMPLETE) R(VK_ERROR_OUT_OF_HOST_MEMORY) R(VK_ERROR_OUT_OF_DEVICE_MEMORY)
        R(VK_ERROR_INITIALIZATION_FAILED) R(VK_ERROR_DEVICE_LOST) R(VK_ERROR_MEMORY_MAP_FAILED)
        R(VK_ERROR_LAYER_NOT_PRESENT) R(VK_ERROR_EXTENSION_NOT_PRESENT)
        R(VK_ERROR_FEATURE_NOT_PRESENT) R(VK_ERROR_INCOMPATIBLE_DRIVER) R(VK_ERROR_TOO_MANY_OBJECTS)
        R(VK_ERROR_FORMAT_NOT_SUPPORTED) R(VK_ERROR_FRAGMENTED_POOL) R(VK_ERROR_UNKNOWN)
        R(VK_ERROR_OUT_OF_POOL_MEMORY) R(VK_ERROR_INVALID_EXTERNAL_HANDLE) R(VK_ERROR_FRAGMENTATION)
        R(VK_ERROR_INVALID_OPAQUE_CAPTURE_ADDRESS) R(VK_PIPELINE_COMPILE_REQUIRED)
        R(VK_ERROR_INVALID_SHADER_NV)
#undef R
    default:
        return "unknown VkResult";
    }
    /* clang-format on */
}

em_status em_rt_vk_fail(const char *call, VkResult r)
{
    bool oom = r == VK_ERROR_OUT_OF_HOST_MEMORY || r == VK_ERROR_OUT_OF_DEVICE_MEMORY ||
               r == VK_ERROR_OUT_OF_POOL_MEMORY || r == VK_ERROR_FRAGMENTED_POOL ||
               r == VK_ERROR_FRAGMENTATION || r == VK_ERROR_TOO_MANY_OBJECTS;
    return em_set_error(oom ? EM_ERR_NOMEM : EM_ERR_DEVICE, "vulkan: %s failed: %s (%d)", call,
                        em_rt_vk_result_name(r), (int)r);
}

/* ---- the loader and the instance ------------------------------------------------------------- */

static struct {
    pthread_mutex_t lock;           /* guards everything below */
    bool tried;                     /* the instance was attempted (result below) */
    char why[256];                  /* why there is no usable device ("" when there is) */
    void *lib;                      /* libvulkan.so.1 */
    PFN_vkGetInstanceProcAddr gipa; /* the loader's entry point */
    VkInstance instance;            /* the process's instance */
    uint32_t api_version;           /* the instance's API version */
    EM_VK_GLOBAL_FUNCS(EM_VK_DECLARE)
    EM_VK_INSTANCE_FUNCS(EM_VK_DECLARE)
    VkPhysicalDevice phys[VK_MAX_PHYS]; /* usable devices, best first */
    uint32_t nphys;                     /* how many */
} G = {.lock = PTHREAD_MUTEX_INITIALIZER};

static bool has_extension(const VkExtensionProperties *exts, uint32_t n, const char *name)
{
    for (uint32_t i = 0; i < n; i++)
        if (strcmp(exts[i].extensionName, name) == 0) return true;
    return false;
}

static int type_rank(VkPhysicalDeviceType t)
{
    switch (t) {
    case VK_PHYSICAL_DEVICE_TYPE_DISCRETE_GPU:
        return 0;
    case VK_PHYSICAL_DEVICE_TYPE_INTEGRATED_GPU:
        return 1;
    case VK_PHYSICAL_DEVICE_TYPE_VIRTUAL_GPU:
        return 2;
    case VK_PHYSICAL_DEVICE_TYPE_CPU:
        return 3;
    default:
        return 4;
    }
}

static bool has_compute_queue(VkPhysicalDevice p)
{
    uint32_t n = 0;
    G.vkGetPhysicalDeviceQueueFamilyProperties(p, &n, NULL);
    VkQueueFamilyProperties q[64];
    if (n > 64) n = 64;
    G.vkGetPhysicalDeviceQueueFamilyProperties(p, &n, q);
    for (uint32_t i = 0; i < n; i++)
        if ((q[i].queueFlags & VK_QUEUE_COMPUTE_BIT) && q[i].queueCount > 0) return true;
    return false;
}

/* Keeps the devices with Vulkan 1.1 and a compute queue, best first; says why when none. */
static void pick_devices(VkPhysicalDevice *all, uint32_t n)
{
    char skipped[160] = "";
    size_t used = 0;
    for (uint32_t i = 0; i < n; i++) {
        VkPhysicalDeviceProperties p;
        G.vkGetPhysicalDeviceProperties(all[i], &p);
        const char *problem = NULL;
        if (VK_API_VERSION_MINOR(p.apiVersion) < 1 && VK_API_VERSION_MAJOR(p.apiVersion) <= 1)
            problem = "Vulkan 1.0 only";
        else if (!has_compute_queue(all[i]))
            problem = "no compute queue";
        if (problem) {
            if (used < sizeof(skipped))
                used += (size_t)snprintf(skipped + used, sizeof(skipped) - used, "%s%s: %s",
                                         used ? "; " : "", p.deviceName, problem);
            continue;
        }
        /* insertion by type rank, stable */
        uint32_t at = G.nphys;
        int r = type_rank(p.deviceType);
        while (at > 0) {
            VkPhysicalDeviceProperties q;
            G.vkGetPhysicalDeviceProperties(G.phys[at - 1], &q);
            if (type_rank(q.deviceType) <= r) break;
            G.phys[at] = G.phys[at - 1];
            at--;
        }
        G.phys[at] = all[i];
        G.nphys++;
    }
    if (!G.nphys)
        snprintf(G.why, sizeof(G.why),
                 "%u Vulkan device%s, none usable (ember needs Vulkan 1.1 "
                 "and a compute queue): %s",
                 n, n == 1 ? "" : "s", skipped);
}

/* Opens the loader, creates the instance and lists the devices; once per process. Called with
 * G.lock held. */
static void init_instance_locked(void)
{
    if (G.tried) return;
    G.tried = true;
    G.lib = dlopen(VK_LIBRARY, RTLD_NOW | RTLD_LOCAL);
    if (!G.lib) {
        const char *e = dlerror();
        snprintf(G.why, sizeof(G.why), "%s not found (the Vulkan loader is not installed%s%s)",
                 VK_LIBRARY, e ? ": " : "", e ? e : "");
        return;
    }
    G.gipa = (PFN_vkGetInstanceProcAddr)dlsym(G.lib, "vkGetInstanceProcAddr");
    if (!G.gipa) {
        snprintf(G.why, sizeof(G.why), "%s has no vkGetInstanceProcAddr", VK_LIBRARY);
        return;
    }
#define LOAD_GLOBAL(name) G.name = (PFN_##name)G.gipa(NULL, #name);
    EM_VK_GLOBAL_FUNCS(LOAD_GLOBAL)
#undef LOAD_GLOBAL
    PFN_vkEnumerateInstanceVersion enum_version =
        (PFN_vkEnumerateInstanceVersion)G.gipa(NULL, "vkEnumerateInstanceVersion");
    uint32_t loader_version = VK_API_VERSION_1_0;
    if (!G.vkCreateInstance || !G.vkEnumerateInstanceExtensionProperties) {
        snprintf(G.why, sizeof(G.why), "%s lacks vkCreateInstance", VK_LIBRARY);
        return;
    }
    if (enum_version) enum_version(&loader_version);
    if (loader_version < VK_API_VERSION_1_1) {
        snprintf(G.why, sizeof(G.why),
                 "the Vulkan loader supports only Vulkan 1.0; ember needs "
                 "1.1");
        return;
    }
    G.api_version = loader_version < VK_API_VERSION_1_3 ? loader_version : VK_API_VERSION_1_3;

    VkExtensionProperties exts[256];
    uint32_t next = 256;
    VkResult r = G.vkEnumerateInstanceExtensionProperties(NULL, &next, exts);
    if (r != VK_SUCCESS && r != VK_INCOMPLETE) next = 0;
    const char *enabled[2];
    uint32_t nenabled = 0;
    VkInstanceCreateFlags flags = 0;
    if (has_extension(exts, next, "VK_KHR_portability_enumeration")) {
        enabled[nenabled++] = "VK_KHR_portability_enumeration";
        flags |= 0x00000001; /* VK_INSTANCE_CREATE_ENUMERATE_PORTABILITY_BIT_KHR */
    }
    VkApplicationInfo app = {
        .sType = VK_STRUCTURE_TYPE_APPLICATION_INFO,
        .pApplicationName = "ember",
        .pEngineName = "ember",
        .apiVersion = G.api_version,
    };
    VkInstanceCreateInfo ci = {
        .sType = VK_STRUCTURE_TYPE_INSTANCE_CREATE_INFO,
        .flags = flags,
        .pApplicationInfo = &app,
        .enabledExtensionCount = nenabled,
        .ppEnabledExtensionNames = enabled,
    };
    r = G.vkCreateInstance(&ci, NULL, &G.instance);
    if (r == VK_ERROR_INCOMPATIBLE_DRIVER) {
        snprintf(G.why, sizeof(G.why),
                 "no usable Vulkan driver (ICD): vkCreateInstance "
                 "returned VK_ERROR_INCOMPATIBLE_DRIVER (none is installed, or none could start; "
                 "VK_LOADER_DEBUG=error says which; Mesa's lavapipe runs on the CPU)");
        return;
    }
    if (r != VK_SUCCESS) {
        snprintf(G.why, sizeof(G.why), "vkCreateInstance failed: %s", em_rt_vk_result_name(r));
        G.instance = VK_NULL_HANDLE;
        return;
    }
#define LOAD_INSTANCE(name) G.name = (PFN_##name)G.gipa(G.instance, #name);
    EM_VK_INSTANCE_FUNCS(LOAD_INSTANCE)
#undef LOAD_INSTANCE
#define CHECK_INSTANCE(name)                                                                       \
    if (!G.name) {                                                                                 \
        snprintf(G.why, sizeof(G.why), "the Vulkan loader lacks %s", #name);                       \
        return;                                                                                    \
    }
    EM_VK_INSTANCE_FUNCS(CHECK_INSTANCE)
#undef CHECK_INSTANCE
    VkPhysicalDevice all[VK_MAX_PHYS];
    uint32_t n = VK_MAX_PHYS;
    r = G.vkEnumeratePhysicalDevices(G.instance, &n, all);
    if (r != VK_SUCCESS && r != VK_INCOMPLETE) {
        snprintf(G.why, sizeof(G.why), "vkEnumeratePhysicalDevices failed: %s",
                 em_rt_vk_result_name(r));
        return;
    }
    if (n == 0) {
        snprintf(G.why, sizeof(G.why),
                 "the Vulkan loader found no device (no driver (ICD) that "
                 "sees hardware; VK_DRIVER_FILES / VK_ICD_FILENAMES choose ICDs)");
        return;
    }
    pick_devices(all, n);
}

static int vk_probe(char *why, size_t why_size)
{
    pthread_mutex_lock(&G.lock);
    init_instance_locked();
    int n = (int)G.nphys;
    if (!n && why && why_size) snprintf(why, why_size, "%s", G.why);
    pthread_mutex_unlock(&G.lock);
    return n;
}

/* ---- opening a device ------------------------------------------------------------------------ */

/* What the device supports, queried once at open. */
typedef struct vk_support {
    VkPhysicalDeviceFeatures2 f2;
    VkPhysicalDeviceVulkan11Features f11;
    VkPhysicalDeviceVulkan12Features f12;
    VkPhysicalDevice16BitStorageFeatures s16; /* Vulkan 1.1 devices */
    VkPhysicalDeviceShaderAtomicFloatFeaturesEXT af;
    VkPhysicalDeviceSubgroupProperties subgroup;
    VkPhysicalDeviceMaintenance3Properties m3;
    VkPhysicalDeviceSubgroupSizeControlFeatures ssc;    /* Vulkan 1.3 devices */
    VkPhysicalDeviceSubgroupSizeControlProperties sscp; /* Vulkan 1.3 devices */
    bool has_12;                                        /* Vulkan 1.2 structs are valid */
    bool has_13;                                        /* Vulkan 1.3 structs are valid */
    bool atomic_float;                                  /* VK_EXT_shader_atomic_float is present */
    bool portability; /* VK_KHR_portability_subset must be enabled */
    bool sm_builtins; /* VK_NV_shader_sm_builtins (SM count) */
    em_vk_coopmat cm; /* cooperative matrices (vulkan_coopmat.c) */
} vk_support;

static void query_support(em_vk_device *d, vk_support *s)
{
    memset(s, 0, sizeof(*s));
    VkExtensionProperties *exts = NULL;
    uint32_t next = 0;
    if (G.vkEnumerateDeviceExtensionProperties(d->phys, NULL, &next, NULL) == VK_SUCCESS && next)
        exts = calloc(next, sizeof(*exts));
    if (exts && G.vkEnumerateDeviceExtensionProperties(d->phys, NULL, &next, exts) != VK_SUCCESS)
        next = 0;
    s->atomic_float = exts && has_extension(exts, next, "VK_EXT_shader_atomic_float");
    s->portability = exts && has_extension(exts, next, "VK_KHR_portability_subset");
    s->sm_builtins = exts && has_extension(exts, next, "VK_NV_shader_sm_builtins");
    em_rt_vk_coopmat_query(G.gipa, G.instance, d->phys, exts, exts ? next : 0, &s->cm);
    free(exts);

    s->has_12 = d->api_version >= VK_API_VERSION_1_2;
    s->has_13 = d->api_version >= VK_API_VERSION_1_3;
    s->ssc.sType = VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_SUBGROUP_SIZE_CONTROL_FEATURES;
    s->sscp.sType = VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_SUBGROUP_SIZE_CONTROL_PROPERTIES;
    s->af.sType = VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_SHADER_ATOMIC_FLOAT_FEATURES_EXT;
    s->f12.sType = VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_VULKAN_1_2_FEATURES;
    s->f11.sType = VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_VULKAN_1_1_FEATURES;
    s->s16.sType = VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_16BIT_STORAGE_FEATURES;
    s->f2.sType = VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_FEATURES_2;
    void *chain = s->atomic_float ? &s->af : NULL;
    if (s->has_13) {
        s->ssc.pNext = chain;
        chain = &s->ssc;
    }
    if (s->has_12) {
        s->f12.pNext = chain;
        s->f11.pNext = &s->f12;
        s->f2.pNext = &s->f11;
    } else {
        s->s16.pNext = chain;
        s->f2.pNext = &s->s16;
    }
    G.vkGetPhysicalDeviceFeatures2(d->phys, &s->f2);
    if (!s->has_12) { /* the same fields, from the 1.1 struct */
        s->f11.storageBuffer16BitAccess = s->s16.storageBuffer16BitAccess;
        s->f11.uniformAndStorageBuffer16BitAccess = s->s16.uniformAndStorageBuffer16BitAccess;
        s->f11.storagePushConstant16 = s->s16.storagePushConstant16;
    }

    s->subgroup.sType = VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_SUBGROUP_PROPERTIES;
    s->m3.sType = VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_MAINTENANCE_3_PROPERTIES;
    s->m3.pNext = &s->subgroup;
    if (s->has_13) s->subgroup.pNext = &s->sscp;
    VkPhysicalDeviceProperties2 p2 = {.sType = VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_PROPERTIES_2,
                                      .pNext = &s->m3};
    G.vkGetPhysicalDeviceProperties2(d->phys, &p2);
    d->props = p2.properties;
}

static uint32_t sm_count(em_vk_device *d)
{
    VkPhysicalDeviceShaderSMBuiltinsPropertiesNV sm = {
        .sType = VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_SHADER_SM_BUILTINS_PROPERTIES_NV};
    VkPhysicalDeviceProperties2 p2 = {.sType = VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_PROPERTIES_2,
                                      .pNext = &sm};
    G.vkGetPhysicalDeviceProperties2(d->phys, &p2);
    return sm.shaderSMCount;
}

/* Picks the compute queue family: one with timestamps if any. */
static bool pick_queue(em_vk_device *d, uint32_t *valid_bits)
{
    uint32_t n = 0;
    G.vkGetPhysicalDeviceQueueFamilyProperties(d->phys, &n, NULL);
    VkQueueFamilyProperties q[64];
    if (n > 64) n = 64;
    G.vkGetPhysicalDeviceQueueFamilyProperties(d->phys, &n, q);
    int best = -1;
    for (uint32_t i = 0; i < n; i++) {
        if (!(q[i].queueFlags & VK_QUEUE_COMPUTE_BIT) || !q[i].queueCount) continue;
        if (best < 0 || (q[best].timestampValidBits == 0 && q[i].timestampValidBits > 0))
            best = (int)i;
    }
    if (best < 0) return false;
    d->queue_family = (uint32_t)best;
    *valid_bits = q[best].timestampValidBits;
    return true;
}

/* Creates the logical device with the features ember's shaders may use. */
static em_status create_device(em_vk_device *d, const vk_support *s)
{
    VkPhysicalDeviceFeatures2 f2 = {.sType = VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_FEATURES_2};
    f2.features.shaderFloat64 = s->f2.features.shaderFloat64;
    f2.features.shaderInt64 = s->f2.features.shaderInt64;
    f2.features.shaderInt16 = s->f2.features.shaderInt16;
    VkPhysicalDeviceVulkan11Features f11 = {
        .sType = VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_VULKAN_1_1_FEATURES};
    f11.storageBuffer16BitAccess = s->f11.storageBuffer16BitAccess;
    f11.uniformAndStorageBuffer16BitAccess = s->f11.uniformAndStorageBuffer16BitAccess;
    f11.storagePushConstant16 = s->f11.storagePushConstant16;
    VkPhysicalDevice16BitStorageFeatures s16 = {
        .sType = VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_16BIT_STORAGE_FEATURES,
        .storageBuffer16BitAccess = s->f11.storageBuffer16BitAccess,
        .uniformAndStorageBuffer16BitAccess = s->f11.uniformAndStorageBuffer16BitAccess,
        .storagePushConstant16 = s->f11.storagePushConstant16,
    };
    VkPhysicalDeviceVulkan12Features f12 = {
        .sType = VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_VULKAN_1_2_FEATURES};
    f12.shaderFloat16 = s->f12.shaderFloat16;
    f12.shaderInt8 = s->f12.shaderInt8;
    f12.storageBuffer8BitAccess = s->f12.storageBuffer8BitAccess;
    f12.uniformAndStorageBuffer8BitAccess = s->f12.uniformAndStorageBuffer8BitAccess;
    f12.storagePushConstant8 = s->f12.storagePushConstant8;
    f12.shaderBufferInt64Atomics = s->f12.shaderBufferInt64Atomics;
    f12.shaderSharedInt64Atomics = s->f12.shaderSharedInt64Atomics;
    f12.subgroupBroadcastDynamicId = s->f12.subgroupBroadcastDynamicId;
    f12.vulkanMemoryModel = s->f12.vulkanMemoryModel;
    f12.vulkanMemoryModelDeviceScope = s->f12.vulkanMemoryModelDeviceScope;
    f12.scalarBlockLayout = s->f12.scalarBlockLayout;
    f12.hostQueryReset = s->f12.hostQueryReset;
    VkPhysicalDeviceShaderAtomicFloatFeaturesEXT af = s->af;
    af.pNext = NULL;
    VkPhysicalDeviceSubgroupSizeControlFeatures ssc = {
        .sType = VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_SUBGROUP_SIZE_CONTROL_FEATURES,
        .subgroupSizeControl = VK_TRUE};

    const char *exts[4];
    uint32_t nexts = 0;
    void *chain = NULL;
    if (s->atomic_float) {
        exts[nexts++] = "VK_EXT_shader_atomic_float";
        chain = &af;
    }
    uint64_t cm_storage[8]; /* the cooperative-matrix feature struct (KHR or NV) */
    VkBaseOutStructure *cm_feature = NULL;
    const char *cm_ext =
        em_rt_vk_coopmat_enable(&s->cm, cm_storage, sizeof(cm_storage), (void **)&cm_feature);
    if (cm_ext && s->has_12) {
        exts[nexts++] = cm_ext;
        cm_feature->pNext = chain;
        chain = cm_feature;
    }
    if (s->portability) exts[nexts++] = "VK_KHR_portability_subset";
    if (d->size_control) {
        ssc.pNext = chain;
        chain = &ssc;
    }
    if (s->has_12) {
        f12.pNext = chain;
        f11.pNext = &f12;
        f2.pNext = &f11;
    } else {
        s16.pNext = chain;
        f2.pNext = &s16;
    }
    float priority = 1.0f;
    VkDeviceQueueCreateInfo qci = {
        .sType = VK_STRUCTURE_TYPE_DEVICE_QUEUE_CREATE_INFO,
        .queueFamilyIndex = d->queue_family,
        .queueCount = 1,
        .pQueuePriorities = &priority,
    };
    VkDeviceCreateInfo dci = {
        .sType = VK_STRUCTURE_TYPE_DEVICE_CREATE_INFO,
        .pNext = &f2,
        .queueCreateInfoCount = 1,
        .pQueueCreateInfos = &qci,
        .enabledExtensionCount = nexts,
        .ppEnabledExtensionNames = exts,
    };
    VK_TRY("vkCreateDevice", G.vkCreateDevice(d->phys, &dci, NULL, &d->device));
#define LOAD_DEVICE(name) d->fn.name = (PFN_##name)G.vkGetDeviceProcAddr(d->device, #name);
    EM_VK_DEVICE_FUNCS(LOAD_DEVICE)
#undef LOAD_DEVICE
#define CHECK_DEVICE(name)                                                                         \
    if (!d->fn.name)                                                                               \
        return em_set_error(EM_ERR_DEVICE, "vulkan: vkGetDeviceProcAddr found no %s", #name);
    EM_VK_DEVICE_FUNCS(CHECK_DEVICE)
#undef CHECK_DEVICE
    d->fn.vkGetDeviceQueue(d->device, d->queue_family, 0, &d->queue);
    return EM_OK;
}

#define BUFFER_USAGE                                                                               \
    (VK_BUFFER_USAGE_STORAGE_BUFFER_BIT | VK_BUFFER_USAGE_TRANSFER_SRC_BIT |                       \
     VK_BUFFER_USAGE_TRANSFER_DST_BIT)

/* Index of the first memory type in `bits` with all of `want`, preferring ones with `prefer` and
 * without `avoid`; -1 when none. */
static int find_type(const em_vk_device *d, uint32_t bits, VkMemoryPropertyFlags want,
                     VkMemoryPropertyFlags prefer, VkMemoryPropertyFlags avoid)
{
    int best = -1, best_score = -1;
    for (uint32_t i = 0; i < d->mem_props.memoryTypeCount; i++) {
        VkMemoryPropertyFlags f = d->mem_props.memoryTypes[i].propertyFlags;
        if (!(bits & (1u << i)) || (f & want) != want) continue;
        int score = ((f & prefer) == prefer ? 2 : 0) + ((f & avoid) ? 0 : 1);
        if (score > best_score) {
            best = (int)i;
            best_score = score;
        }
    }
    return best;
}

/* Chooses memory types for buffers and arenas, and direct or staged transfers. */
static em_status choose_memory(em_vk_device *d)
{
    G.vkGetPhysicalDeviceMemoryProperties(d->phys, &d->mem_props);
    VkBufferCreateInfo bci = {.sType = VK_STRUCTURE_TYPE_BUFFER_CREATE_INFO,
                              .size = 256,
                              .usage = BUFFER_USAGE,
                              .sharingMode = VK_SHARING_MODE_EXCLUSIVE};
    VkBuffer probe;
    VK_TRY("vkCreateBuffer", d->fn.vkCreateBuffer(d->device, &bci, NULL, &probe));
    VkMemoryRequirements req;
    d->fn.vkGetBufferMemoryRequirements(d->device, probe, &req);
    d->fn.vkDestroyBuffer(d->device, probe, NULL);

    const VkMemoryPropertyFlags local = VK_MEMORY_PROPERTY_DEVICE_LOCAL_BIT;
    const VkMemoryPropertyFlags host =
        VK_MEMORY_PROPERTY_HOST_VISIBLE_BIT | VK_MEMORY_PROPERTY_HOST_COHERENT_BIT;
    const VkMemoryPropertyFlags cached = VK_MEMORY_PROPERTY_HOST_CACHED_BIT;
    bool uma = d->props.deviceType == VK_PHYSICAL_DEVICE_TYPE_CPU ||
               d->props.deviceType == VK_PHYSICAL_DEVICE_TYPE_INTEGRATED_GPU;
    const char *staging = getenv("EMBER_VK_STAGING"); /* force staged transfers (tests) */
    if (staging && strcmp(staging, "1") == 0) uma = false;
    int t = uma ? find_type(d, req.memoryTypeBits, local | host, cached, 0) : -1;
    d->direct = t >= 0;
    if (t < 0) t = find_type(d, req.memoryTypeBits, local, 0, VK_MEMORY_PROPERTY_HOST_VISIBLE_BIT);
    if (t < 0) t = find_type(d, req.memoryTypeBits, 0, local, 0);
    int s = find_type(d, req.memoryTypeBits, host, cached, 0);
    if (t < 0 || s < 0)
        return em_set_error(EM_ERR_UNSUPPORTED,
                            "vulkan: %s has no usable memory type for "
                            "storage buffers%s",
                            d->props.deviceName, s < 0 ? " in host-visible coherent memory" : "");
    d->buffer_type = (uint32_t)t;
    d->staging_type = (uint32_t)s;
    d->heap_size = d->mem_props.memoryHeaps[d->mem_props.memoryTypes[t].heapIndex].size;
    d->arena_size = d->direct ? ARENA_DIRECT : ARENA_STAGING;
    return EM_OK;
}

/* Creates a buffer with its own memory of type `type`; maps it when map is true. */
static em_status make_buffer(em_vk_device *d, VkDeviceSize bytes, uint32_t type, bool map,
                             em_vk_mem *m)
{
    memset(m, 0, sizeof(*m));
    VkBufferCreateInfo bci = {.sType = VK_STRUCTURE_TYPE_BUFFER_CREATE_INFO,
                              .size = bytes,
                              .usage = BUFFER_USAGE,
                              .sharingMode = VK_SHARING_MODE_EXCLUSIVE};
    VK_TRY("vkCreateBuffer", d->fn.vkCreateBuffer(d->device, &bci, NULL, &m->buffer));
    VkMemoryRequirements req;
    d->fn.vkGetBufferMemoryRequirements(d->device, m->buffer, &req);
    VkMemoryAllocateInfo mai = {.sType = VK_STRUCTURE_TYPE_MEMORY_ALLOCATE_INFO,
                                .allocationSize = req.size,
                                .memoryTypeIndex = type};
    VkResult r = d->fn.vkAllocateMemory(d->device, &mai, NULL, &m->memory);
    if (r != VK_SUCCESS) {
        d->fn.vkDestroyBuffer(d->device, m->buffer, NULL);
        m->buffer = VK_NULL_HANDLE;
        em_rt_vk_fail("vkAllocateMemory", r);
        return em_error_context("%s: allocating %llu bytes", d->props.deviceName,
                                (unsigned long long)bytes);
    }
    r = d->fn.vkBindBufferMemory(d->device, m->buffer, m->memory, 0);
    if (r == VK_SUCCESS && map)
        r = d->fn.vkMapMemory(d->device, m->memory, 0, VK_WHOLE_SIZE, 0, &m->map);
    if (r != VK_SUCCESS) {
        d->fn.vkDestroyBuffer(d->device, m->buffer, NULL);
        d->fn.vkFreeMemory(d->device, m->memory, NULL);
        memset(m, 0, sizeof(*m));
        return em_rt_vk_fail(map ? "vkBindBufferMemory/vkMapMemory" : "vkBindBufferMemory", r);
    }
    m->size = bytes;
    return EM_OK;
}

static void drop_buffer(em_vk_device *d, em_vk_mem *m)
{
    if (m->map) d->fn.vkUnmapMemory(d->device, m->memory);
    if (m->buffer) d->fn.vkDestroyBuffer(d->device, m->buffer, NULL);
    if (m->memory) d->fn.vkFreeMemory(d->device, m->memory, NULL);
    memset(m, 0, sizeof(*m));
}

/* Command pool, frames (command buffer, fence, descriptor pool, arena), pipeline cache, queries. */
static em_status create_stream(em_vk_device *d, uint32_t timestamp_bits)
{
    VkCommandPoolCreateInfo cpi = {.sType = VK_STRUCTURE_TYPE_COMMAND_POOL_CREATE_INFO,
                                   .flags = VK_COMMAND_POOL_CREATE_RESET_COMMAND_BUFFER_BIT,
                                   .queueFamilyIndex = d->queue_family};
    VK_TRY("vkCreateCommandPool", d->fn.vkCreateCommandPool(d->device, &cpi, NULL, &d->cmd_pool));
    VkDescriptorPoolSize size = {VK_DESCRIPTOR_TYPE_STORAGE_BUFFER, DESCS_PER_FRAME};
    for (unsigned i = 0; i < EM_VK_FRAMES; i++) {
        em_vk_frame *f = &d->frames[i];
        VkCommandBufferAllocateInfo cai = {.sType = VK_STRUCTURE_TYPE_COMMAND_BUFFER_ALLOCATE_INFO,
                                           .commandPool = d->cmd_pool,
                                           .level = VK_COMMAND_BUFFER_LEVEL_PRIMARY,
                                           .commandBufferCount = 1};
        VK_TRY("vkAllocateCommandBuffers",
               d->fn.vkAllocateCommandBuffers(d->device, &cai, &f->cmd));
        VkFenceCreateInfo fci = {.sType = VK_STRUCTURE_TYPE_FENCE_CREATE_INFO};
        VK_TRY("vkCreateFence", d->fn.vkCreateFence(d->device, &fci, NULL, &f->fence));
        VkDescriptorPoolCreateInfo dpi = {.sType = VK_STRUCTURE_TYPE_DESCRIPTOR_POOL_CREATE_INFO,
                                          .maxSets = EM_VK_SETS_PER_FRAME,
                                          .poolSizeCount = 1,
                                          .pPoolSizes = &size};
        VK_TRY("vkCreateDescriptorPool",
               d->fn.vkCreateDescriptorPool(d->device, &dpi, NULL, &f->pool));
        em_vk_mem arena;
        em_status st = make_buffer(d, d->arena_size, d->staging_type, true, &arena);
        if (st != EM_OK) return st;
        f->arena = arena.buffer;
        f->arena_mem = arena.memory;
        f->arena_map = arena.map;
    }
    VkPipelineCacheCreateInfo pci = {.sType = VK_STRUCTURE_TYPE_PIPELINE_CACHE_CREATE_INFO};
    VK_TRY("vkCreatePipelineCache",
           d->fn.vkCreatePipelineCache(d->device, &pci, NULL, &d->pipeline_cache));
    if (timestamp_bits > 0 && d->props.limits.timestampPeriod > 0) {
        VkQueryPoolCreateInfo qpi = {.sType = VK_STRUCTURE_TYPE_QUERY_POOL_CREATE_INFO,
                                     .queryType = VK_QUERY_TYPE_TIMESTAMP,
                                     .queryCount = QUERIES};
        VK_TRY("vkCreateQueryPool", d->fn.vkCreateQueryPool(d->device, &qpi, NULL, &d->queries));
        d->query_used = calloc(QUERIES, 1);
        if (!d->query_used) return em_set_error(EM_ERR_NOMEM, "out of memory");
        d->query_count = QUERIES;
        d->timestamp_mask = timestamp_bits >= 64 ? UINT64_MAX : (UINT64_C(1) << timestamp_bits) - 1;
        d->timestamp_ns = d->props.limits.timestampPeriod;
    }
    return EM_OK;
}

static void fill_caps(em_vk_device *d, const vk_support *s, em_caps *caps)
{
    memset(caps, 0, sizeof(*caps));
    const VkPhysicalDeviceLimits *l = &d->props.limits;
    snprintf(caps->target, sizeof(caps->target), "glsl");
    snprintf(caps->arch, sizeof(caps->arch), "spirv-%s", d->env_name);
    snprintf(caps->device_name, sizeof(caps->device_name), "%.127s", d->props.deviceName);
    caps->plane_dim = s->subgroup.subgroupSize ? s->subgroup.subgroupSize : 1;
    caps->max_cube_units = l->maxComputeWorkGroupInvocations;
    for (int i = 0; i < 3; i++) caps->max_cube_dim[i] = l->maxComputeWorkGroupSize[i];
    caps->max_shared = l->maxComputeSharedMemorySize;
    caps->memory_total =
        d->mem_props.memoryHeaps[d->mem_props.memoryTypes[d->buffer_type].heapIndex].size;
    if (s->sm_builtins)
        caps->compute_units = sm_count(d);
    else if (d->props.deviceType == VK_PHYSICAL_DEVICE_TYPE_CPU)
        caps->compute_units = (uint32_t)sysconf(_SC_NPROCESSORS_ONLN);
    caps->buffer_align = (uint32_t)EM_MIN(d->ssbo_align, (VkDeviceSize)UINT32_MAX);
    bool i16 = s->f2.features.shaderInt16 && s->f11.storageBuffer16BitAccess;
    bool i8 = s->has_12 && s->f12.shaderInt8 && s->f12.storageBuffer8BitAccess;
    caps->dtype[EM_BOOL] = caps->dtype[EM_I32] = caps->dtype[EM_U32] = caps->dtype[EM_F32] = true;
    caps->dtype[EM_I64] = caps->dtype[EM_U64] = s->f2.features.shaderInt64;
    caps->dtype[EM_I16] = caps->dtype[EM_U16] = i16;
    caps->dtype[EM_I8] = caps->dtype[EM_U8] = i8;
    caps->dtype[EM_F16] = s->has_12 && s->f12.shaderFloat16 && s->f11.storageBuffer16BitAccess;
    caps->dtype[EM_F64] = s->f2.features.shaderFloat64;
    caps->float_atomic_add =
        s->atomic_float && s->af.shaderBufferFloat32AtomicAdd && s->af.shaderSharedFloat32AtomicAdd;
    const VkSubgroupFeatureFlags need =
        VK_SUBGROUP_FEATURE_BASIC_BIT | VK_SUBGROUP_FEATURE_VOTE_BIT |
        VK_SUBGROUP_FEATURE_ARITHMETIC_BIT | VK_SUBGROUP_FEATURE_BALLOT_BIT |
        VK_SUBGROUP_FEATURE_SHUFFLE_BIT | VK_SUBGROUP_FEATURE_SHUFFLE_RELATIVE_BIT;
    caps->plane_ops = (s->subgroup.supportedStages & VK_SHADER_STAGE_COMPUTE_BIT) &&
                      (s->subgroup.supportedOperations & need) == need;
    d->plane_ops = caps->plane_ops;
    /* cooperative matrices: the API chosen at open (vulkan_coopmat.c) and its combinations */
    caps->matrix = s->cm.api != EM_VK_COOPMAT_NONE;
    snprintf(caps->matrix_api, sizeof(caps->matrix_api), "%s",
             s->cm.api == EM_VK_COOPMAT_KHR  ? "VK_KHR_cooperative_matrix"
             : s->cm.api == EM_VK_COOPMAT_NV ? "VK_NV_cooperative_matrix"
                                             : "");
    caps->matrix_shape_count = s->cm.count;
    memcpy(caps->matrix_shapes, s->cm.shapes, sizeof(caps->matrix_shapes));
    /* bf16: 16-bit patterns in buffers (uint16_t), f32 in registers (glsl.c), so 16-bit storage is
     * all it needs. Left off where cooperative matrices are on: the tensor matmul then picks its
     * matrix kernel for bf16 (src/tensor/matmul_config.c), and GLSL has no bf16 cooperative
     * matrix without GL_EXT_bfloat16 (glslang 15+), so bf16 matmuls would fail to compile there. */
    caps->dtype[EM_BF16] = i16 && !caps->matrix;
    caps->print = false; /* debugPrintf needs the validation layer */
}

static void destroy_device(em_vk_device *d)
{
    if (d->device) {
        d->fn.vkDeviceWaitIdle(d->device);
        for (unsigned i = 0; i < EM_VK_FRAMES; i++) {
            em_vk_frame *f = &d->frames[i];
            if (f->fence) d->fn.vkDestroyFence(d->device, f->fence, NULL);
            if (f->pool) d->fn.vkDestroyDescriptorPool(d->device, f->pool, NULL);
            em_vk_mem arena = {f->arena, f->arena_mem, f->arena_map, d->arena_size};
            drop_buffer(d, &arena);
        }
        if (d->cmd_pool) d->fn.vkDestroyCommandPool(d->device, d->cmd_pool, NULL);
        if (d->pipeline_cache) d->fn.vkDestroyPipelineCache(d->device, d->pipeline_cache, NULL);
        if (d->queries) d->fn.vkDestroyQueryPool(d->device, d->queries, NULL);
        d->fn.vkDestroyDevice(d->device, NULL);
    }
    free(d->query_used);
    free(d->cc_spec);
    pthread_mutex_destroy(&d->lock);
    pthread_mutex_destroy(&d->cc_lock);
    free(d);
}

static em_status vk_open(int index, em_caps *caps, void **out)
{
    pthread_mutex_lock(&G.lock);
    init_instance_locked();
    bool ok = index >= 0 && (uint32_t)index < G.nphys;
    VkPhysicalDevice phys = ok ? G.phys[index] : VK_NULL_HANDLE;
    char why[256];
    snprintf(why, sizeof(why), "%s", G.why);
    pthread_mutex_unlock(&G.lock);
    if (!ok)
        return em_set_error(EM_ERR_NOT_FOUND, "vulkan: no device %d (%s)", index,
                            why[0] ? why : "index out of range");
    em_vk_device *d = calloc(1, sizeof(*d));
    if (!d) return em_set_error(EM_ERR_NOMEM, "out of memory opening vulkan:%d", index);
    pthread_mutex_init(&d->lock, NULL);
    pthread_mutex_init(&d->cc_lock, NULL);
    d->phys = phys;
    VkPhysicalDeviceProperties p;
    G.vkGetPhysicalDeviceProperties(phys, &p);
    d->api_version = p.apiVersion < G.api_version ? p.apiVersion : G.api_version;
    vk_support s;
    query_support(d, &s);
    if (d->api_version >= VK_API_VERSION_1_2) {
        d->spirv_env = (1u << 22) | (2u << 12); /* shaderc_env_version_vulkan_1_2 */
        d->env_name = "vulkan1.2";
    } else {
        d->spirv_env = (1u << 22) | (1u << 12); /* shaderc_env_version_vulkan_1_1 */
        d->env_name = "vulkan1.1";
    }
    /* sub-group size control matters where the size varies (Intel, AMD): pipelines that use
     * sub-groups then ask for the size the caps report */
    d->size_control = s.has_13 && s.ssc.subgroupSizeControl &&
                      (s.sscp.requiredSubgroupSizeStages & VK_SHADER_STAGE_COMPUTE_BIT) &&
                      s.sscp.minSubgroupSize != s.sscp.maxSubgroupSize &&
                      s.subgroup.subgroupSize >= s.sscp.minSubgroupSize &&
                      s.subgroup.subgroupSize <= s.sscp.maxSubgroupSize;
    em_rt_vk_coopmat_choose(d, s.has_12 && s.f12.vulkanMemoryModel, &s.cm);
    if (s.cm.why[0])
        EM_LOGI("vulkan:%d: %s: cooperative matrices not used: %s", index, p.deviceName, s.cm.why);
    d->subgroup_size = s.subgroup.subgroupSize;
    d->max_group_subgroups = s.sscp.maxComputeWorkgroupSubgroups;
    d->ssbo_align = d->props.limits.minStorageBufferOffsetAlignment;
    if (d->ssbo_align < 16) d->ssbo_align = 16;
    uint32_t ts_bits = 0;
    em_status st = EM_OK;
    if (!pick_queue(d, &ts_bits))
        st = em_set_error(EM_ERR_UNSUPPORTED, "vulkan: %s has no compute queue",
                          d->props.deviceName);
    if (st == EM_OK) st = create_device(d, &s);
    if (st == EM_OK) st = choose_memory(d);
    if (st == EM_OK) st = create_stream(d, ts_bits);
    if (st != EM_OK) {
        em_error_context("vulkan:%d (%s)", index, d->props.deviceName);
        destroy_device(d);
        return st;
    }
    d->max_allocation = s.m3.maxMemoryAllocationSize ? s.m3.maxMemoryAllocationSize : UINT64_MAX;
    fill_caps(d, &s, caps);
    EM_LOGD("vulkan:%d: %s, Vulkan %u.%u, %s memory, subgroup %u, shared %u bytes", index,
            d->props.deviceName, VK_API_VERSION_MAJOR(d->api_version),
            VK_API_VERSION_MINOR(d->api_version), d->direct ? "mapped (direct)" : "staged",
            caps->plane_dim, (unsigned)caps->max_shared);
    *out = d;
    return EM_OK;
}

/* ---- the command stream ---------------------------------------------------------------------- */

/* Waits for a submitted frame and makes it reusable. */
static em_status frame_wait(em_vk_device *d, em_vk_frame *f)
{
    if (!f->in_flight) return EM_OK;
    VkResult r = d->fn.vkWaitForFences(d->device, 1, &f->fence, VK_TRUE, UINT64_MAX);
    if (r != VK_SUCCESS) return em_rt_vk_fail("vkWaitForFences", r);
    f->in_flight = false;
    VK_TRY("vkResetFences", d->fn.vkResetFences(d->device, 1, &f->fence));
    VK_TRY("vkResetDescriptorPool", d->fn.vkResetDescriptorPool(d->device, f->pool, 0));
    f->arena_used = 0;
    f->sets = 0;
    f->commands = 0;
    return EM_OK;
}

/* The frame being recorded, begun if needed. */
em_status em_rt_vk_frame_begin(em_vk_device *d, em_vk_frame **out)
{
    em_vk_frame *f = &d->frames[d->cur];
    if (!f->recording) {
        em_status st = frame_wait(d, f);
        if (st != EM_OK) return st;
        if (f->sets) { /* an earlier frame that was begun but never submitted (an error) */
            VK_TRY("vkResetDescriptorPool", d->fn.vkResetDescriptorPool(d->device, f->pool, 0));
        }
        f->arena_used = 0;
        f->sets = 0;
        f->commands = 0;
        VkCommandBufferBeginInfo bi = {.sType = VK_STRUCTURE_TYPE_COMMAND_BUFFER_BEGIN_INFO,
                                       .flags = VK_COMMAND_BUFFER_USAGE_ONE_TIME_SUBMIT_BIT};
        VK_TRY("vkBeginCommandBuffer", d->fn.vkBeginCommandBuffer(f->cmd, &bi));
        f->recording = true;
    }
    *out = f;
    return EM_OK;
}

/* Makes every earlier compute and transfer write visible to later commands (or the host). */
void em_rt_vk_barrier(em_vk_device *d, em_vk_frame *f, bool to_host)
{
    VkMemoryBarrier mb = {
        .sType = VK_STRUCTURE_TYPE_MEMORY_BARRIER,
        .srcAccessMask = VK_ACCESS_SHADER_WRITE_BIT | VK_ACCESS_TRANSFER_WRITE_BIT,
        .dstAccessMask = to_host ? VK_ACCESS_HOST_READ_BIT
                                 : VK_ACCESS_SHADER_READ_BIT | VK_ACCESS_SHADER_WRITE_BIT |
                                       VK_ACCESS_TRANSFER_READ_BIT | VK_ACCESS_TRANSFER_WRITE_BIT,
    };
    VkPipelineStageFlags stages =
        VK_PIPELINE_STAGE_COMPUTE_SHADER_BIT | VK_PIPELINE_STAGE_TRANSFER_BIT;
    d->fn.vkCmdPipelineBarrier(f->cmd, stages, to_host ? VK_PIPELINE_STAGE_HOST_BIT : stages, 0, 1,
                               &mb, 0, NULL, 0, NULL);
}

/* Submits the frame being recorded (if it holds work) and moves on to the next. */
em_status em_rt_vk_frame_submit(em_vk_device *d)
{
    em_vk_frame *f = &d->frames[d->cur];
    if (!f->recording) return EM_OK;
    if (!f->commands) {
        /* nothing recorded: leave it open for the next command; what failed launches took of
         * the arena and the pool is not referenced by anything */
        f->arena_used = 0;
        if (f->sets)
            VK_TRY("vkResetDescriptorPool", d->fn.vkResetDescriptorPool(d->device, f->pool, 0));
        f->sets = 0;
        return EM_OK;
    }
    em_rt_vk_barrier(d, f, true);
    f->recording = false;
    VK_TRY("vkEndCommandBuffer", d->fn.vkEndCommandBuffer(f->cmd));
    VkSubmitInfo si = {.sType = VK_STRUCTURE_TYPE_SUBMIT_INFO,
                       .commandBufferCount = 1,
                       .pCommandBuffers = &f->cmd};
    VkResult r = d->fn.vkQueueSubmit(d->queue, 1, &si, f->fence);
    if (r != VK_SUCCESS) {
        f->commands = 0;
        return em_rt_vk_fail("vkQueueSubmit", r);
    }
    f->in_flight = true;
    d->cur = (d->cur + 1) % EM_VK_FRAMES;
    return EM_OK;
}

static bool has_pending(const em_vk_device *d)
{
    for (unsigned i = 0; i < EM_VK_FRAMES; i++)
        if (d->frames[i].in_flight || (d->frames[i].recording && d->frames[i].commands))
            return true;
    return false;
}

/* Submits pending work and waits for all of it. Called with d->lock held. */
em_status em_rt_vk_sync_locked(em_vk_device *d)
{
    em_status st = em_rt_vk_frame_submit(d);
    for (unsigned i = 0; i < EM_VK_FRAMES; i++) {
        em_status s2 = frame_wait(d, &d->frames[i]);
        if (st == EM_OK) st = s2;
    }
    return st;
}

/* After recording a command: submits the frame at once when the queue has nothing else to do
 * (so the device starts while the host records more), or when the frame is long. */
em_status em_rt_vk_kick(em_vk_device *d)
{
    em_vk_frame *f = &d->frames[d->cur];
    if (f->commands >= EM_VK_MAX_COMMANDS) return em_rt_vk_frame_submit(d);
    for (unsigned i = 0; i < EM_VK_FRAMES; i++) {
        em_vk_frame *o = &d->frames[i];
        if (!o->in_flight) continue;
        VkResult r = d->fn.vkGetFenceStatus(d->device, o->fence);
        if (r == VK_NOT_READY) return EM_OK; /* busy: keep batching */
        if (r != VK_SUCCESS) return em_rt_vk_fail("vkGetFenceStatus", r);
    }
    return em_rt_vk_frame_submit(d);
}

/* A frame with room for `sets` more descriptor sets and `bytes` arena bytes (aligned to
 * `align`); *offset receives the arena offset. When the current frame is full it is submitted
 * and the next one begun. */
em_status em_rt_vk_frame_room(em_vk_device *d, uint32_t sets, VkDeviceSize bytes,
                              VkDeviceSize align, em_vk_frame **out, VkDeviceSize *offset)
{
    if (bytes > d->arena_size)
        return em_set_error(EM_ERR_INTERNAL, "vulkan: %llu bytes do not fit a frame's arena",
                            (unsigned long long)bytes);
    for (int attempt = 0; attempt < 2; attempt++) {
        em_vk_frame *f = NULL;
        em_status st = em_rt_vk_frame_begin(d, &f);
        if (st != EM_OK) return st;
        VkDeviceSize off = (f->arena_used + align - 1) / align * align;
        if (off + bytes <= d->arena_size && f->sets + sets <= EM_VK_SETS_PER_FRAME &&
            f->commands < EM_VK_MAX_COMMANDS) {
            f->arena_used = off + bytes;
            *out = f;
            *offset = off;
            return EM_OK;
        }
        if ((st = em_rt_vk_frame_submit(d)) != EM_OK) return st;
    }
    return em_set_error(EM_ERR_INTERNAL, "vulkan: a fresh frame had no room");
}

em_status em_rt_vk_sync(void *state)
{
    em_vk_device *d = state;
    pthread_mutex_lock(&d->lock);
    em_status st = em_rt_vk_sync_locked(d);
    pthread_mutex_unlock(&d->lock);
    return st;
}

/* ---- memory ---------------------------------------------------------------------------------- */

static em_status vk_alloc(void *state, size_t bytes, void **out)
{
    em_vk_device *d = state;
    em_vk_mem *m = calloc(1, sizeof(*m));
    if (!m) return em_set_error(EM_ERR_NOMEM, "out of host memory");
    if (bytes == 0) bytes = 4;
    bytes = (bytes + 3) & ~(size_t)3; /* copies and bindings work in whole words */
    if (bytes > d->heap_size || bytes > d->max_allocation) {
        free(m);
        return em_set_error(EM_ERR_NOMEM,
                            "vulkan: out of memory: %zu bytes is more than %s "
                            "can allocate at once (heap %llu bytes, largest allocation %llu)",
                            bytes, d->props.deviceName, (unsigned long long)d->heap_size,
                            (unsigned long long)d->max_allocation);
    }
    em_status st = make_buffer(d, bytes, d->buffer_type, d->direct, m);
    if (st != EM_OK) {
        free(m);
        return st;
    }
    *out = m;
    return EM_OK;
}

static void vk_free(void *state, void *mem, size_t bytes)
{
    (void)bytes;
    em_vk_device *d = state;
    em_vk_mem *m = mem;
    if (!m) return;
    pthread_mutex_lock(&d->lock);
    if (has_pending(d) &&
        em_rt_vk_sync_locked(d) != EM_OK) /* queued work may still use the block */
        EM_LOGW("vulkan: freeing a buffer after a failed sync: %s", em_last_error());
    drop_buffer(d, m);
    pthread_mutex_unlock(&d->lock);
    free(m);
}

static em_status write_locked(em_vk_device *d, em_vk_mem *m, size_t offset, const uint8_t *src,
                              size_t bytes)
{
    if (m->map) {
        if (has_pending(d)) {
            em_status st = em_rt_vk_sync_locked(d);
            if (st != EM_OK) return st;
        }
        memcpy((uint8_t *)m->map + offset, src, bytes);
        return EM_OK;
    }
    while (bytes) {
        size_t chunk = bytes < d->arena_size ? bytes : (size_t)d->arena_size;
        em_vk_frame *f;
        VkDeviceSize off;
        em_status st = em_rt_vk_frame_room(d, 0, chunk, 16, &f, &off);
        if (st != EM_OK) return st;
        memcpy(f->arena_map + off, src, chunk);
        em_rt_vk_barrier(d, f, false);
        VkBufferCopy region = {off, offset, chunk};
        d->fn.vkCmdCopyBuffer(f->cmd, f->arena, m->buffer, 1, &region);
        f->commands++;
        if ((st = em_rt_vk_kick(d)) != EM_OK) return st;
        src += chunk;
        offset += chunk;
        bytes -= chunk;
    }
    return EM_OK;
}

static em_status vk_write(void *state, void *mem, size_t offset, const void *src, size_t bytes)
{
    em_vk_device *d = state;
    pthread_mutex_lock(&d->lock);
    em_status st = write_locked(d, mem, offset, src, bytes);
    pthread_mutex_unlock(&d->lock);
    return st;
}

static em_status read_locked(em_vk_device *d, const em_vk_mem *m, size_t offset, uint8_t *dst,
                             size_t bytes)
{
    if (m->map) {
        em_status st = em_rt_vk_sync_locked(d);
        if (st != EM_OK) return st;
        memcpy(dst, (const uint8_t *)m->map + offset, bytes);
        return EM_OK;
    }
    while (bytes) {
        size_t chunk = bytes < d->arena_size ? bytes : (size_t)d->arena_size;
        em_vk_frame *f;
        VkDeviceSize off;
        em_status st = em_rt_vk_frame_room(d, 0, chunk, 16, &f, &off);
        if (st != EM_OK) return st;
        em_rt_vk_barrier(d, f, false);
        VkBufferCopy region = {offset, off, chunk};
        d->fn.vkCmdCopyBuffer(f->cmd, m->buffer, f->arena, 1, &region);
        f->commands++;
        if ((st = em_rt_vk_frame_submit(d)) != EM_OK || (st = frame_wait(d, f)) != EM_OK) return st;
        memcpy(dst, f->arena_map + off, chunk); /* the frame is idle until the next begin */
        dst += chunk;
        offset += chunk;
        bytes -= chunk;
    }
    return EM_OK;
}

static em_status vk_read(void *state, const void *mem, size_t offset, void *dst, size_t bytes)
{
    em_vk_device *d = state;
    pthread_mutex_lock(&d->lock);
    em_status st = read_locked(d, mem, offset, dst, bytes);
    pthread_mutex_unlock(&d->lock);
    return st;
}

static em_status copy_locked(em_vk_device *d, em_vk_mem *dst, size_t doff, const em_vk_mem *src,
                             size_t soff, size_t bytes)
{
    bool overlap = dst == src && doff < soff + bytes && soff < doff + bytes;
    if (overlap && doff == soff) return EM_OK;
    em_vk_mem tmp = {0};
    if (overlap) { /* vkCmdCopyBuffer forbids overlapping regions: go through a temporary */
        em_status st = make_buffer(d, bytes, d->buffer_type, false, &tmp);
        if (st != EM_OK) return st;
    }
    em_vk_frame *f;
    em_status st = em_rt_vk_frame_begin(d, &f);
    if (st == EM_OK) {
        em_rt_vk_barrier(d, f, false);
        if (overlap) {
            VkBufferCopy a = {soff, 0, bytes}, b = {0, doff, bytes};
            d->fn.vkCmdCopyBuffer(f->cmd, src->buffer, tmp.buffer, 1, &a);
            em_rt_vk_barrier(d, f, false);
            d->fn.vkCmdCopyBuffer(f->cmd, tmp.buffer, dst->buffer, 1, &b);
        } else {
            VkBufferCopy region = {soff, doff, bytes};
            d->fn.vkCmdCopyBuffer(f->cmd, src->buffer, dst->buffer, 1, &region);
        }
        f->commands++;
        st = overlap ? em_rt_vk_sync_locked(d) : em_rt_vk_kick(d);
    }
    if (overlap) drop_buffer(d, &tmp);
    return st;
}

static em_status vk_copy(void *state, void *dst, size_t dst_offset, const void *src,
                         size_t src_offset, size_t bytes)
{
    em_vk_device *d = state;
    if (!bytes) return EM_OK;
    pthread_mutex_lock(&d->lock);
    em_status st = copy_locked(d, dst, dst_offset, src, src_offset, bytes);
    pthread_mutex_unlock(&d->lock);
    return st;
}

static void vk_close(void *state)
{
    em_vk_device *d = state;
    pthread_mutex_lock(&d->lock);
    if (em_rt_vk_sync_locked(d) != EM_OK)
        EM_LOGW("vulkan: closing %s after a failed sync: %s", d->props.deviceName, em_last_error());
    pthread_mutex_unlock(&d->lock);
    destroy_device(d);
}

/* ---- the vtable ------------------------------------------------------------------------------ */

static char *vk_generate(void *state, const em_ir_kernel *const *ks, size_t n, const em_caps *caps)
{
    (void)state;
    return em_codegen_glsl(ks, n, caps);
}

const em_driver em_rt_vulkan_driver = {
    .name = "vulkan",
    .target = "glsl",
    .binary_ext = ".spv",
    .probe = vk_probe,
    .open = vk_open,
    .close = vk_close,
    .alloc = vk_alloc,
    .free = vk_free,
    .write = vk_write,
    .read = vk_read,
    .copy = vk_copy,
    .generate = vk_generate,
    .compiler_id = em_rt_vk_compiler_id,
    .build = em_rt_vk_build,
    .load = em_rt_vk_load,
    .unload = em_rt_vk_unload,
    .function = em_rt_vk_function,
    .launch = em_rt_vk_launch,
    .sync = em_rt_vk_sync,
    .event_record = em_rt_vk_event_record,
    .event_elapsed = em_rt_vk_event_elapsed,
    .event_destroy = em_rt_vk_event_destroy,
};
