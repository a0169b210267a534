/* vulkan_coopmat.c — cooperative matrices for the Vulkan driver: which of VK_KHR_cooperative_matrix
 * and VK_NV_cooperative_matrix a device has, the (M, N, K, A/B/C/result type) combinations it
 * runs at subgroup scope, and which one the driver enables and publishes in the caps
 * (caps.matrix, caps.matrix_api, caps.matrix_shapes) for the GLSL generator and legalization.
 *
 * Choice ($EMBER_VK_COOPMAT=auto, the default): KHR when the device lists it and the GLSL compiler
 * accepts GL_KHR_cooperative_matrix (glslang 13 and later; a one-shader probe at open), else NV
 * when the device lists it (NVIDIA drivers list both; glslang 11+ knows GL_NV_cooperative_matrix),
 * else none. "khr" / "nv" force one (when listed), "off" disables both. Both need the Vulkan
 * memory model (glslang writes OpMemoryModel Vulkan for GL_KHR_memory_scope_semantics), so a
 * device without vulkanMemoryModel gets none.
 *
 * The KHR structures are declared here when the Vulkan headers predate the extension (Debian 12
 * ships 1.3.239; the extension arrived in 1.3.255): their values are the registry's, stable ABI. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "runtime/drivers/vulkan_internal.h"

#ifndef VK_KHR_cooperative_matrix
#define VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_COOPERATIVE_MATRIX_FEATURES_KHR                          \
    ((VkStructureType)1000506000)
#define VK_STRUCTURE_TYPE_COOPERATIVE_MATRIX_PROPERTIES_KHR ((VkStructureType)1000506001)
typedef struct VkCooperativeMatrixPropertiesKHR {
    VkStructureType sType;
    void *pNext;
    uint32_t MSize;
    uint32_t NSize;
    uint32_t KSize;
    int32_t AType; /* VkComponentTypeKHR: the same values as VkComponentTypeNV */
    int32_t BType;
    int32_t CType;
    int32_t ResultType;
    VkBool32 saturatingAccumulation;
    int32_t scope; /* VkScopeKHR: 3 = subgroup */
} VkCooperativeMatrixPropertiesKHR;
typedef struct VkPhysicalDeviceCooperativeMatrixFeaturesKHR {
    VkStructureType sType;
    void *pNext;
    VkBool32 cooperativeMatrix;
    VkBool32 cooperativeMatrixRobustBufferAccess;
} VkPhysicalDeviceCooperativeMatrixFeaturesKHR;
typedef VkResult(VKAPI_PTR *PFN_vkGetPhysicalDeviceCooperativeMatrixPropertiesKHR)(
    VkPhysicalDevice physicalDevice, uint32_t *pPropertyCount,
    VkCooperativeMatrixPropertiesKHR *pProperties);
#endif

#define SCOPE_SUBGROUP 3
#define MAX_PROPS 64

/* ember's scalar kind of a VkComponentType (KHR and NV share the values 0..10), or -1. */
static int component_scalar(int32_t t)
{
    static const int kinds[] = {EM_F16, EM_F32, EM_F64, EM_I8,  EM_I16, EM_I32,
                                EM_I64, EM_U8,  EM_U16, EM_U32, EM_U64};
    return t >= 0 && t < (int32_t)(sizeof kinds / sizeof kinds[0]) ? kinds[t] : -1;
}

static bool has_ext(const VkExtensionProperties *exts, uint32_t n, const char *name)
{
    for (uint32_t i = 0; exts && i < n; i++)
        if (strcmp(exts[i].extensionName, name) == 0) return true;
    return false;
}

/* Adds one combination (when ember has its types, at subgroup scope, not saturating). */
static void add_shape(em_matrix_shape *shapes, uint32_t *count, uint32_t m, uint32_t n, uint32_t k,
                      int32_t a, int32_t b, int32_t c, int32_t d, int32_t scope, bool saturating)
{
    int sa = component_scalar(a), sb = component_scalar(b), sc = component_scalar(c),
        sd = component_scalar(d);
    if (scope != SCOPE_SUBGROUP || saturating || sa < 0 || sb < 0 || sc < 0 || sd < 0) return;
    if (m > 0xffff || n > 0xffff || k > 0xffff || *count >= EM_CAPS_MATRIX_SHAPES) return;
    shapes[(*count)++] = (em_matrix_shape){(uint16_t)m, (uint16_t)n, (uint16_t)k, (uint8_t)sa,
                                           (uint8_t)sb, (uint8_t)sc, (uint8_t)sd};
}

void em_rt_vk_coopmat_query(PFN_vkGetInstanceProcAddr gipa, VkInstance instance,
                            VkPhysicalDevice phys, const VkExtensionProperties *exts, uint32_t n,
                            em_vk_coopmat *out)
{
    memset(out, 0, sizeof(*out));
    PFN_vkGetPhysicalDeviceFeatures2 features2 =
        (PFN_vkGetPhysicalDeviceFeatures2)gipa(instance, "vkGetPhysicalDeviceFeatures2");
    if (!features2) return;
    if (has_ext(exts, n, "VK_KHR_cooperative_matrix")) {
        VkPhysicalDeviceCooperativeMatrixFeaturesKHR f = {
            .sType = VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_COOPERATIVE_MATRIX_FEATURES_KHR};
        VkPhysicalDeviceFeatures2 f2 = {.sType = VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_FEATURES_2,
                                        .pNext = &f};
        features2(phys, &f2);
        PFN_vkGetPhysicalDeviceCooperativeMatrixPropertiesKHR get =
            (PFN_vkGetPhysicalDeviceCooperativeMatrixPropertiesKHR)gipa(
                instance, "vkGetPhysicalDeviceCooperativeMatrixPropertiesKHR");
        out->khr = f.cooperativeMatrix && get;
        VkCooperativeMatrixPropertiesKHR *p = calloc(MAX_PROPS, sizeof(*p));
        uint32_t count = MAX_PROPS;
        for (uint32_t i = 0; p && i < MAX_PROPS; i++)
            p[i].sType = VK_STRUCTURE_TYPE_COOPERATIVE_MATRIX_PROPERTIES_KHR;
        VkResult r = out->khr && p ? get(phys, &count, p) : VK_ERROR_UNKNOWN;
        if (r == VK_SUCCESS || r == VK_INCOMPLETE)
            for (uint32_t i = 0; i < count && i < MAX_PROPS; i++)
                add_shape(out->khr_shapes, &out->nkhr, p[i].MSize, p[i].NSize, p[i].KSize,
                          p[i].AType, p[i].BType, p[i].CType, p[i].ResultType, p[i].scope,
                          p[i].saturatingAccumulation);
        free(p);
    }
    if (has_ext(exts, n, "VK_NV_cooperative_matrix")) {
        VkPhysicalDeviceCooperativeMatrixFeaturesNV f = {
            .sType = VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_COOPERATIVE_MATRIX_FEATURES_NV};
        VkPhysicalDeviceFeatures2 f2 = {.sType = VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_FEATURES_2,
                                        .pNext = &f};
        features2(phys, &f2);
        PFN_vkGetPhysicalDeviceCooperativeMatrixPropertiesNV get =
            (PFN_vkGetPhysicalDeviceCooperativeMatrixPropertiesNV)gipa(
                instance, "vkGetPhysicalDeviceCooperativeMatrixPropertiesNV");
        out->nv = f.cooperativeMatrix && get;
        VkCooperativeMatrixPropertiesNV *p = calloc(MAX_PROPS, sizeof(*p));
        uint32_t count = MAX_PROPS;
        for (uint32_t i = 0; p && i < MAX_PROPS; i++)
            p[i].sType = VK_STRUCTURE_TYPE_COOPERATIVE_MATRIX_PROPERTIES_NV;
        VkResult r = out->nv && p ? get(phys, &count, p) : VK_ERROR_UNKNOWN;
        if (r == VK_SUCCESS || r == VK_INCOMPLETE)
            for (uint32_t i = 0; i < count && i < MAX_PROPS; i++)
                add_shape(out->nv_shapes, &out->nnv, p[i].MSize, p[i].NSize, p[i].KSize, p[i].AType,
                          p[i].BType, p[i].CType, p[i].DType, p[i].scope, false);
        free(p);
    }
}

/* A one-fragment shader in the KHR dialect: does the compiler know GL_KHR_cooperative_matrix? */
static const char khr_probe[] =
    "#version 450\n"
    "#extension GL_KHR_cooperative_matrix : require\n"
    "#extension GL_KHR_memory_scope_semantics : require\n"
    "layout(local_size_x = 32) in;\n"
    "layout(std430, binding = 0) buffer B { float d[]; } b;\n"
    "void main()\n"
    "{\n"
    "    coopmat<float, gl_ScopeSubgroup, 16, 16, gl_MatrixUseAccumulator> m =\n"
    "        coopmat<float, gl_ScopeSubgroup, 16, 16, gl_MatrixUseAccumulator>(1.0);\n"
    "    coopMatStore(m, b.d, 0, 16, gl_CooperativeMatrixLayoutRowMajor);\n"
    "}\n";

static void use(em_vk_coopmat *cm, em_vk_coopmat_api api)
{
    bool khr = api == EM_VK_COOPMAT_KHR;
    cm->api = api;
    cm->count = khr ? cm->nkhr : cm->nnv;
    memcpy(cm->shapes, khr ? cm->khr_shapes : cm->nv_shapes, sizeof(cm->shapes));
    cm->why[0] = '\0';
}

void em_rt_vk_coopmat_choose(em_vk_device *d, bool memory_model, em_vk_coopmat *cm)
{
    cm->api = EM_VK_COOPMAT_NONE;
    cm->count = 0;
    if (!cm->khr && !cm->nv) return;
    const char *want = getenv("EMBER_VK_COOPMAT");
    if (!want || !*want) want = "auto";
    if (strcmp(want, "off") == 0) {
        snprintf(cm->why, sizeof(cm->why), "switched off ($EMBER_VK_COOPMAT=off)");
        return;
    }
    if (!memory_model) {
        snprintf(cm->why, sizeof(cm->why),
                 "the device lacks vulkanMemoryModel, which cooperative-matrix shaders need");
        return;
    }
    if (strcmp(want, "nv") == 0) {
        if (cm->nv)
            use(cm, EM_VK_COOPMAT_NV);
        else
            snprintf(cm->why, sizeof(cm->why),
                     "$EMBER_VK_COOPMAT=nv, but the device has no "
                     "VK_NV_cooperative_matrix");
        return;
    }
    if (strcmp(want, "khr") == 0) {
        if (cm->khr)
            use(cm, EM_VK_COOPMAT_KHR);
        else
            snprintf(cm->why, sizeof(cm->why),
                     "$EMBER_VK_COOPMAT=khr, but the device has no "
                     "VK_KHR_cooperative_matrix");
        return;
    }
    if (cm->khr && em_rt_vk_glsl_compiles(d, khr_probe)) {
        use(cm, EM_VK_COOPMAT_KHR);
    } else if (cm->nv) {
        use(cm, EM_VK_COOPMAT_NV);
    } else {
        snprintf(cm->why, sizeof(cm->why),
                 "the GLSL compiler does not know GL_KHR_cooperative_matrix (glslang 13 or later "
                 "does)");
    }
}

const char *em_rt_vk_coopmat_enable(const em_vk_coopmat *cm, void *feature_storage,
                                    size_t storage_size, void **feature)
{
    *feature = NULL;
    if (cm->api == EM_VK_COOPMAT_KHR &&
        storage_size >= sizeof(VkPhysicalDeviceCooperativeMatrixFeaturesKHR)) {
        VkPhysicalDeviceCooperativeMatrixFeaturesKHR *f = feature_storage;
        memset(f, 0, sizeof(*f));
        f->sType = VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_COOPERATIVE_MATRIX_FEATURES_KHR;
        f->cooperativeMatrix = VK_TRUE;
        *feature = f;
        return "VK_KHR_cooperative_matrix";
    }
    if (cm->api == EM_VK_COOPMAT_NV &&
        storage_size >= sizeof(VkPhysicalDeviceCooperativeMatrixFeaturesNV)) {
        VkPhysicalDeviceCooperativeMatrixFeaturesNV *f = feature_storage;
        memset(f, 0, sizeof(*f));
        f->sType = VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_COOPERATIVE_MATRIX_FEATURES_NV;
        f->cooperativeMatrix = VK_TRUE;
        *feature = f;
        return "VK_NV_cooperative_matrix";
    }
    return NULL;
}
