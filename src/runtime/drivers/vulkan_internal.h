/* vulkan_internal.h — what the three files of the Vulkan driver share: vulkan.c (the loader,
 * instance, devices, memory and the command stream), vulkan_launch.c (launches and timing) and
 * vulkan_spirv.c (GLSL -> SPIR-V through shaderc or glslangValidator, the binary format, SPIR-V
 * reflection, shader modules, layouts and pipelines).
 *
 * <vulkan/vulkan.h> is included for its types only (VK_NO_PROTOTYPES): libvulkan.so.1 is opened
 * with dlopen and every function comes from vkGetInstanceProcAddr / vkGetDeviceProcAddr through
 * the tables below, so libember never links the loader. Nothing outside src/runtime/drivers/
 * vulkan*.c includes this header. */
#ifndef EM_RUNTIME_DRIVERS_VULKAN_INTERNAL_H
#define EM_RUNTIME_DRIVERS_VULKAN_INTERNAL_H

#define VK_NO_PROTOTYPES
#include <vulkan/vulkan.h>
#include <pthread.h>
#include "runtime/rt.h"

/* Bump when the contract between this driver and the GLSL the code generator writes changes in a
 * way the generated source does not show (how launch fills bindings, metadata, push constants):
 * it is part of compiler_id and so of every cache key. */
#define EM_VK_DRIVER_ABI 1

/* ---- function tables ------------------------------------------------------------------------- */

/* Functions the loader itself exports (vkGetInstanceProcAddr(NULL, ...)). */
#define EM_VK_GLOBAL_FUNCS(X)                                                                      \
    X(vkCreateInstance)                                                                            \
    X(vkEnumerateInstanceExtensionProperties)

/* Instance-level functions. */
#define EM_VK_INSTANCE_FUNCS(X)                                                                    \
    X(vkDestroyInstance)                                                                           \
    X(vkEnumeratePhysicalDevices)                                                                  \
    X(vkGetPhysicalDeviceProperties)                                                               \
    X(vkGetPhysicalDeviceProperties2)                                                              \
    X(vkGetPhysicalDeviceFeatures2)                                                                \
    X(vkGetPhysicalDeviceQueueFamilyProperties)                                                    \
    X(vkGetPhysicalDeviceMemoryProperties)                                                         \
    X(vkEnumerateDeviceExtensionProperties)                                                        \
    X(vkCreateDevice)                                                                              \
    X(vkGetDeviceProcAddr)

/* Device-level functions (through vkGetDeviceProcAddr: no loader trampoline per call). */
#define EM_VK_DEVICE_FUNCS(X)                                                                      \
    X(vkDestroyDevice)                                                                             \
    X(vkGetDeviceQueue)                                                                            \
    X(vkDeviceWaitIdle)                                                                            \
    X(vkQueueSubmit)                                                                               \
    X(vkCreateCommandPool)                                                                         \
    X(vkDestroyCommandPool)                                                                        \
    X(vkAllocateCommandBuffers)                                                                    \
    X(vkBeginCommandBuffer)                                                                        \
    X(vkEndCommandBuffer)                                                                          \
    X(vkResetCommandBuffer)                                                                        \
    X(vkCreateFence)                                                                               \
    X(vkDestroyFence)                                                                              \
    X(vkWaitForFences)                                                                             \
    X(vkResetFences)                                                                               \
    X(vkGetFenceStatus)                                                                            \
    X(vkCreateBuffer)                                                                              \
    X(vkDestroyBuffer)                                                                             \
    X(vkGetBufferMemoryRequirements)                                                               \
    X(vkAllocateMemory)                                                                            \
    X(vkFreeMemory)                                                                                \
    X(vkBindBufferMemory)                                                                          \
    X(vkMapMemory)                                                                                 \
    X(vkUnmapMemory)                                                                               \
    X(vkCmdCopyBuffer)                                                                             \
    X(vkCmdPipelineBarrier)                                                                        \
    X(vkCmdBindPipeline)                                                                           \
    X(vkCmdBindDescriptorSets)                                                                     \
    X(vkCmdPushConstants)                                                                          \
    X(vkCmdDispatch)                                                                               \
    X(vkCmdDispatchBase)                                                                           \
    X(vkCmdResetQueryPool)                                                                         \
    X(vkCmdWriteTimestamp)                                                                         \
    X(vkCreateQueryPool)                                                                           \
    X(vkDestroyQueryPool)                                                                          \
    X(vkGetQueryPoolResults)                                                                       \
    X(vkCreateDescriptorPool)                                                                      \
    X(vkDestroyDescriptorPool)                                                                     \
    X(vkResetDescriptorPool)                                                                       \
    X(vkAllocateDescriptorSets)                                                                    \
    X(vkUpdateDescriptorSets)                                                                      \
    X(vkCreateDescriptorSetLayout)                                                                 \
    X(vkDestroyDescriptorSetLayout)                                                                \
    X(vkCreatePipelineLayout)                                                                      \
    X(vkDestroyPipelineLayout)                                                                     \
    X(vkCreateShaderModule)                                                                        \
    X(vkDestroyShaderModule)                                                                       \
    X(vkCreateComputePipelines)                                                                    \
    X(vkDestroyPipeline)                                                                           \
    X(vkCreatePipelineCache)                                                                       \
    X(vkDestroyPipelineCache)

#define EM_VK_DECLARE(name) PFN_##name name;
typedef struct em_vk_device_fns {
    EM_VK_DEVICE_FUNCS(EM_VK_DECLARE)
} em_vk_device_fns;

/* ---- devices --------------------------------------------------------------------------------- */

/* Command buffers in flight at once. Work is recorded into the current frame; a frame is
 * submitted when the queue would otherwise idle, when it fills, or at a sync point, and its fence
 * is waited for before it is recorded again. */
#define EM_VK_FRAMES 3

typedef struct em_vk_frame {
    VkCommandBuffer cmd;      /* one primary command buffer */
    VkFence fence;            /* signalled when its submission completes */
    VkDescriptorPool pool;    /* descriptor sets of its launches (reset when reused) */
    VkBuffer arena;           /* host-visible buffer: launch metadata and staged transfers */
    VkDeviceMemory arena_mem; /* the arena's memory (host-visible, coherent, mapped) */
    uint8_t *arena_map;       /* the arena, mapped */
    VkDeviceSize arena_used;  /* bytes of the arena taken since the frame began */
    uint32_t commands;        /* commands recorded since the frame began */
    uint32_t sets;            /* descriptor sets allocated since the frame began */
    bool recording;           /* cmd is between begin and end */
    bool in_flight;           /* submitted and not yet waited for */
} em_vk_frame;

/* A block of device memory: one VkBuffer bound to its own VkDeviceMemory. */
typedef struct em_vk_mem {
    VkBuffer buffer;       /* usage: storage, transfer source and destination */
    VkDeviceMemory memory; /* its memory */
    void *map;             /* host pointer when the memory is host-visible (direct mode) */
    VkDeviceSize size;     /* bytes */
} em_vk_mem;

/* Which GLSL -> SPIR-V compiler builds this device's shaders. */
typedef enum em_vk_compiler_kind {
    EM_VK_SHADERC = 0,  /* libshaderc, dlopen'd */
    EM_VK_GLSLANG_TOOL, /* the glslangValidator executable */
} em_vk_compiler_kind;

typedef struct em_vk_device {
    em_vk_device_fns fn;              /* device-level functions */
    VkPhysicalDevice phys;            /* the physical device */
    VkDevice device;                  /* the logical device */
    VkQueue queue;                    /* one compute queue */
    uint32_t queue_family;            /* its family */
    uint32_t api_version;             /* the device's Vulkan version (at most the instance's) */
    VkPhysicalDeviceProperties props; /* properties and limits */
    VkPhysicalDeviceMemoryProperties mem_props; /* memory types and heaps */
    uint32_t buffer_type;                       /* memory type of buffers */
    uint32_t staging_type;            /* memory type of frame arenas (host-visible, coherent) */
    bool direct;                      /* buffers are host-visible: read/write map them */
    VkDeviceSize heap_size;           /* bytes of the heap buffers come from */
    VkDeviceSize max_allocation;      /* maxMemoryAllocationSize */
    VkDeviceSize arena_size;          /* bytes per frame arena */
    VkDeviceSize ssbo_align;          /* minStorageBufferOffsetAlignment (at least 4) */
    VkCommandPool cmd_pool;           /* command buffers of the frames */
    em_vk_frame frames[EM_VK_FRAMES]; /* command buffers in rotation */
    unsigned cur;                     /* the frame being recorded */
    VkPipelineCache pipeline_cache;   /* driver-side cache for pipeline creation (in memory) */
    VkQueryPool queries;              /* timestamp queries (VK_NULL_HANDLE without timestamps) */
    uint32_t query_count;             /* queries in the pool */
    uint8_t *query_used;              /* query_count flags: held by an event */
    uint64_t timestamp_mask;          /* valid bits of a timestamp */
    double timestamp_ns;              /* nanoseconds per timestamp tick */
    bool plane_ops;                   /* subgroup operations usable in compute shaders */
    bool size_control;                /* sub-group size varies and can be required */
    uint32_t subgroup_size;           /* the size caps.plane_dim reports */
    uint32_t max_group_subgroups;     /* maxComputeWorkgroupSubgroups (with size_control) */
    uint32_t spirv_env;               /* shaderc target-env version (shaderc_env_version_*) */
    const char *env_name;             /* "vulkan1.2": the target environment's name */
    pthread_mutex_t lock;             /* guards frames, queries, submission and pipelines */
    pthread_mutex_t cc_lock;          /* guards cc_spec and cc_id */
    char *cc_spec;                    /* compiler choice cc_id was computed for */
    char cc_id[512];                  /* compiler identity for cache keys */
} em_vk_device;

/* ---- loaded modules -------------------------------------------------------------------------- */

/* One push-constant member as reflected from the SPIR-V: where and what it is. */
typedef struct em_vk_push_member {
    uint32_t offset; /* byte offset in the block */
    uint8_t kind;    /* 0 unsigned int, 1 signed int, 2 float */
    uint8_t bits;    /* 8, 16, 32 or 64 */
} em_vk_push_member;

/* One kernel of a module: its shader, interface and pipelines (one per cube dimension). */
typedef struct em_vk_kernel {
    char *name;                       /* the entry point's name (the kernel's name) */
    VkShaderModule shader;            /* the module holding the entry point */
    VkDescriptorSetLayout set_layout; /* set 0: the storage buffers */
    VkPipelineLayout layout;          /* set 0 and the push-constant range */
    uint32_t nbindings;               /* storage-buffer bindings in set 0 */
    uint32_t *bindings;               /* their binding numbers, ascending */
    uint32_t npush;                   /* push-constant members (scalar parameters, in order) */
    em_vk_push_member *push;          /* the members */
    uint32_t push_size;               /* bytes of the push-constant block (0 when none) */
    uint32_t local_size[3];           /* LocalSize from the shader */
    bool spec_size[3];                /* axis taken from specialization constant 0/1/2 */
    bool flat;                        /* 1-D group of X*Y*Z units; axes in spec constants 3/4/5 */
    bool num_groups;                  /* reads gl_NumWorkGroups (grid cannot be split) */
    bool subgroups;                   /* uses sub-group operations or built-ins */
    struct {
        uint32_t dim[3]; /* cube dimension it was made for */
        VkPipeline pipeline;
    } * pipes;
    size_t npipes, cap_pipes; /* pipelines made so far */
} em_vk_kernel;

typedef struct em_vk_module {
    size_t n;        /* kernels */
    em_vk_kernel *k; /* the kernels */
} em_vk_module;

/* ---- shared between vulkan.c and vulkan_spirv.c ---------------------------------------------- */

/* "VK_ERROR_OUT_OF_DEVICE_MEMORY" for a VkResult. */
const char *em_rt_vk_result_name(VkResult r);
/* Sets the error for a failed Vulkan call: EM_ERR_NOMEM for out-of-memory results, else
 * EM_ERR_DEVICE; the message names the call and the result. Returns the status. */
em_status em_rt_vk_fail(const char *call, VkResult r);
/* Evaluates a Vulkan call; on failure sets the error and returns its status. */
#define VK_TRY(call_name, expr)                                                                    \
    do {                                                                                           \
        VkResult vk_try_r_ = (expr);                                                               \
        if (vk_try_r_ != VK_SUCCESS) return em_rt_vk_fail(call_name, vk_try_r_);                   \
    } while (0)

/* The command stream (vulkan.c). Except em_rt_vk_sync, all are called with d->lock held. */
#define EM_VK_SETS_PER_FRAME 256 /* descriptor sets (launches) per frame */
#define EM_VK_MAX_COMMANDS 512   /* commands recorded before a frame is submitted anyway */
/* The frame being recorded, begun (after waiting for its previous submission) if needed. */
em_status em_rt_vk_frame_begin(em_vk_device *d, em_vk_frame **out);
/* A frame with room for `sets` descriptor sets and `bytes` arena bytes at an `align`ed offset
 * (*offset); moves to the next frame when the current one is full. */
em_status em_rt_vk_frame_room(em_vk_device *d, uint32_t sets, VkDeviceSize bytes,
                              VkDeviceSize align, em_vk_frame **out, VkDeviceSize *offset);
/* Records a barrier making earlier compute/transfer writes visible to later commands (or to the
 * host). */
void em_rt_vk_barrier(em_vk_device *d, em_vk_frame *f, bool to_host);
/* Submits the frame being recorded if it holds commands, and moves to the next. */
em_status em_rt_vk_frame_submit(em_vk_device *d);
/* After recording: submits at once when the queue is idle or the frame is long. */
em_status em_rt_vk_kick(em_vk_device *d);
/* Submits pending work and waits for all of it. */
em_status em_rt_vk_sync_locked(em_vk_device *d);
/* The driver's sync (takes the device lock). */
em_status em_rt_vk_sync(void *dev);

/* Launches and timing (vulkan_launch.c): the driver's launch and event entries. */
em_status em_rt_vk_launch(void *dev, void *fn, const em_drv_launch *launch);
em_status em_rt_vk_event_record(void *dev, void **event);
em_status em_rt_vk_event_elapsed(void *dev, void *start, void *stop, double *seconds);
void em_rt_vk_event_destroy(void *dev, void *event);

/* Compilation (vulkan_spirv.c): the driver's compiler_id and build entries. */
em_status em_rt_vk_compiler_id(void *dev, char *out, size_t out_size);
em_status em_rt_vk_build(void *dev, const char *source, const char *out_path);
/* Loading: load / unload / function of the driver vtable. */
em_status em_rt_vk_load(void *dev, const char *path, void **module);
void em_rt_vk_unload(void *dev, void *module);
em_status em_rt_vk_function(void *dev, void *module, const char *name, void **fn);
/* The pipeline of kernel k for a cube dimension, made on first use. Called with d->lock held. */
em_status em_rt_vk_pipeline(em_vk_device *d, em_vk_kernel *k, const uint32_t dim[3],
                            VkPipeline *out);
/* True when the device's GLSL compiler compiles `src` (one compute shader) to SPIR-V for the
 * device's target environment; the error state is left as it was. */
bool em_rt_vk_glsl_compiles(em_vk_device *d, const char *src);

/* ---- cooperative matrices (vulkan_coopmat.c) ------------------------------------------------- */

typedef enum em_vk_coopmat_api {
    EM_VK_COOPMAT_NONE = 0,
    EM_VK_COOPMAT_KHR, /* VK_KHR_cooperative_matrix, GLSL GL_KHR_cooperative_matrix */
    EM_VK_COOPMAT_NV,  /* VK_NV_cooperative_matrix, GLSL GL_NV_cooperative_matrix */
} em_vk_coopmat_api;

/* What a device offers for cooperative matrices and what the driver uses. */
typedef struct em_vk_coopmat {
    bool khr, nv;          /* the extensions are listed (and their cooperativeMatrix feature set) */
    em_vk_coopmat_api api; /* the one enabled and published in the caps (NONE: caps.matrix off) */
    uint32_t count;        /* combinations of `api` usable by ember's shaders (subgroup scope) */
    em_matrix_shape shapes[EM_CAPS_MATRIX_SHAPES];
    char why[200];      /* when api is NONE but an extension is listed: why it is not used */
    uint32_t nkhr, nnv; /* what each extension lists */
    em_matrix_shape khr_shapes[EM_CAPS_MATRIX_SHAPES], nv_shapes[EM_CAPS_MATRIX_SHAPES];
} em_vk_coopmat;

/* Queries both extensions of the physical device (exts: its extension list) and lists their
 * subgroup-scope combinations. gipa/instance give the instance-level query functions. */
void em_rt_vk_coopmat_query(PFN_vkGetInstanceProcAddr gipa, VkInstance instance,
                            VkPhysicalDevice phys, const VkExtensionProperties *exts, uint32_t n,
                            em_vk_coopmat *out);
/* Chooses the API to use (api, count and shapes filled), given what the device-creation
 * features allow (memory_model: vulkanMemoryModel is enabled) and $EMBER_VK_COOPMAT (khr, nv,
 * off, or auto: KHR where the GLSL compiler knows GL_KHR_cooperative_matrix, else NV). Called
 * before the logical device exists: the compiler probe needs only d->env_name and d->spirv_env. */
void em_rt_vk_coopmat_choose(em_vk_device *d, bool memory_model, em_vk_coopmat *cm);
/* The extension name and a feature struct (to chain into vkCreateDevice) for cm->api; NULL when
 * none. *feature must live until the device is created. */
const char *em_rt_vk_coopmat_enable(const em_vk_coopmat *cm, void *feature_storage,
                                    size_t storage_size, void **feature);

#endif
