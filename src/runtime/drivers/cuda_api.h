/* cuda_api.h — the subset of the CUDA driver API (cuda.h) that drivers/cuda.c uses, declared
 * here so that ember builds without the CUDA toolkit: libcuda.so.1 is opened with dlopen at run
 * time and every entry point is looked up by name into a cuda_api table. Types, constants and
 * signatures are copied from cuda.h (CUDA 13.0); they are part of NVIDIA's stable ABI. Entry
 * points that cuda.h renames with a version suffix (cuMemAlloc -> cuMemAlloc_v2, ...) are looked
 * up under the suffixed name, as a program compiled against cuda.h would. */
#ifndef EM_RUNTIME_DRIVERS_CUDA_API_H
#define EM_RUNTIME_DRIVERS_CUDA_API_H
#include <stddef.h>

typedef int CUresult; /* CUDA_SUCCESS or a CUDA_ERROR_* code */
typedef int CUdevice; /* device ordinal handle */
typedef unsigned long long CUdeviceptr; /* device address (64-bit hosts) */
typedef struct CUctx_st *CUcontext;
typedef struct CUmod_st *CUmodule;
typedef struct CUfunc_st *CUfunction;
typedef struct CUstream_st *CUstream;
typedef struct CUevent_st *CUevent;
typedef struct CUgraph_st *CUgraph;
typedef struct CUgraphExec_st *CUgraphExec;

/* CUresult values this driver looks at (the rest are reported by name). */
#define CUDA_SUCCESS 0
#define CUDA_ERROR_INVALID_VALUE 1
#define CUDA_ERROR_OUT_OF_MEMORY 2
#define CUDA_ERROR_NOT_INITIALIZED 3
#define CUDA_ERROR_STUB_LIBRARY 34
#define CUDA_ERROR_NO_DEVICE 100
#define CUDA_ERROR_INVALID_DEVICE 101
#define CUDA_ERROR_INVALID_IMAGE 200
#define CUDA_ERROR_NO_BINARY_FOR_GPU 209
#define CUDA_ERROR_INVALID_PTX 218
#define CUDA_ERROR_UNSUPPORTED_PTX_VERSION 222
#define CUDA_ERROR_INVALID_SOURCE 300
#define CUDA_ERROR_NOT_FOUND 500
#define CUDA_ERROR_NOT_READY 600
#define CUDA_ERROR_LAUNCH_OUT_OF_RESOURCES 701

/* CUdevice_attribute values. */
#define CU_DEVICE_ATTRIBUTE_MAX_THREADS_PER_BLOCK 1
#define CU_DEVICE_ATTRIBUTE_MAX_BLOCK_DIM_X 2
#define CU_DEVICE_ATTRIBUTE_MAX_BLOCK_DIM_Y 3
#define CU_DEVICE_ATTRIBUTE_MAX_BLOCK_DIM_Z 4
#define CU_DEVICE_ATTRIBUTE_MAX_GRID_DIM_X 5
#define CU_DEVICE_ATTRIBUTE_MAX_GRID_DIM_Y 6
#define CU_DEVICE_ATTRIBUTE_MAX_GRID_DIM_Z 7
#define CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK 8
#define CU_DEVICE_ATTRIBUTE_WARP_SIZE 10
#define CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT 16
#define CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR 75
#define CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR 76
#define CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN 97

/* CUfunction_attribute values. */
#define CU_FUNC_ATTRIBUTE_MAX_THREADS_PER_BLOCK 0
#define CU_FUNC_ATTRIBUTE_SHARED_SIZE_BYTES 1
#define CU_FUNC_ATTRIBUTE_NUM_REGS 4
#define CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES 8

/* cuTensorMapEncodeTiled's enums (CUtensorMapDataType, ...: the values this driver passes). */
#define CU_TENSOR_MAP_DATA_TYPE_UINT8 0
#define CU_TENSOR_MAP_DATA_TYPE_UINT16 1
#define CU_TENSOR_MAP_DATA_TYPE_UINT32 2
#define CU_TENSOR_MAP_DATA_TYPE_INT32 3
#define CU_TENSOR_MAP_DATA_TYPE_UINT64 4
#define CU_TENSOR_MAP_DATA_TYPE_INT64 5
#define CU_TENSOR_MAP_DATA_TYPE_FLOAT16 6
#define CU_TENSOR_MAP_DATA_TYPE_FLOAT32 7
#define CU_TENSOR_MAP_DATA_TYPE_FLOAT64 8
#define CU_TENSOR_MAP_DATA_TYPE_BFLOAT16 9
#define CU_TENSOR_MAP_INTERLEAVE_NONE 0
#define CU_TENSOR_MAP_SWIZZLE_NONE 0
#define CU_TENSOR_MAP_SWIZZLE_128B 3
#define CU_TENSOR_MAP_L2_PROMOTION_L2_128B 2
#define CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE 0 /* zeros outside the dims */

/* Flags. */
#define CU_STREAM_NON_BLOCKING 0x1
#define CU_EVENT_DEFAULT 0x0
#define CU_EVENT_DISABLE_TIMING 0x2
#define CU_STREAM_CAPTURE_MODE_RELAXED 2

/* cuLaunchKernelEx's configuration (cuda.h's layout: an attribute is an id padded to 8 bytes and
 * a 64-byte value union). */
#define CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION 6
typedef struct CUlaunchAttribute {
    int id;
    char pad[4];
    union {
        char bytes[64];
        int programmatic_stream_serialization_allowed;
    } value;
} CUlaunchAttribute;
typedef struct CUlaunchConfig {
    unsigned int gridDimX, gridDimY, gridDimZ;
    unsigned int blockDimX, blockDimY, blockDimZ;
    unsigned int sharedMemBytes;
    CUstream hStream;
    CUlaunchAttribute *attrs;
    unsigned int numAttrs;
} CUlaunchConfig;

/* The entry points, in a table filled by dlsym. */
typedef struct cuda_api {
    CUresult (*GetErrorName)(CUresult, const char **);
    CUresult (*GetErrorString)(CUresult, const char **);
    CUresult (*Init)(unsigned int);
    CUresult (*DriverGetVersion)(int *);
    CUresult (*DeviceGetCount)(int *);
    CUresult (*DeviceGet)(CUdevice *, int);
    CUresult (*DeviceGetName)(char *, int, CUdevice);
    CUresult (*DeviceGetAttribute)(int *, int, CUdevice);
    CUresult (*DeviceTotalMem)(size_t *, CUdevice);           /* cuDeviceTotalMem_v2 */
    CUresult (*DevicePrimaryCtxRetain)(CUcontext *, CUdevice);
    CUresult (*DevicePrimaryCtxRelease)(CUdevice);            /* cuDevicePrimaryCtxRelease_v2 */
    CUresult (*CtxSetCurrent)(CUcontext);
    CUresult (*StreamCreate)(CUstream *, unsigned int);
    CUresult (*StreamDestroy)(CUstream);                      /* cuStreamDestroy_v2 */
    CUresult (*StreamSynchronize)(CUstream);
    CUresult (*MemAlloc)(CUdeviceptr *, size_t);              /* cuMemAlloc_v2 */
    CUresult (*MemFree)(CUdeviceptr);                         /* cuMemFree_v2 */
    CUresult (*MemAllocHost)(void **, size_t);                /* cuMemAllocHost_v2 */
    CUresult (*MemFreeHost)(void *);
    CUresult (*MemcpyHtoDAsync)(CUdeviceptr, const void *, size_t, CUstream); /* _v2 */
    CUresult (*MemcpyDtoHAsync)(void *, CUdeviceptr, size_t, CUstream);       /* _v2 */
    CUresult (*MemcpyDtoDAsync)(CUdeviceptr, CUdeviceptr, size_t, CUstream);  /* _v2 */
    CUresult (*ModuleLoadData)(CUmodule *, const void *);
    CUresult (*ModuleUnload)(CUmodule);
    CUresult (*ModuleGetFunction)(CUfunction *, CUmodule, const char *);
    CUresult (*ModuleGetGlobal)(CUdeviceptr *, size_t *, CUmodule, const char *); /* _v2 */
    CUresult (*FuncGetAttribute)(int *, int, CUfunction);
    CUresult (*FuncSetAttribute)(CUfunction, int, int);
    CUresult (*LaunchKernel)(CUfunction, unsigned int, unsigned int, unsigned int, unsigned int,
                             unsigned int, unsigned int, unsigned int, CUstream, void **, void **);
    CUresult (*EventCreate)(CUevent *, unsigned int);
    CUresult (*EventRecord)(CUevent, CUstream);
    CUresult (*EventSynchronize)(CUevent);
    CUresult (*EventElapsedTime)(float *, CUevent, CUevent);  /* _v2 where the driver has it */
    CUresult (*EventDestroy)(CUevent);                        /* cuEventDestroy_v2 */
    /* graphs (optional: NULL on a driver without them, which then has no native graphs) */
    CUresult (*StreamBeginCapture)(CUstream, int);            /* cuStreamBeginCapture_v2 */
    CUresult (*StreamEndCapture)(CUstream, CUgraph *);
    CUresult (*GraphInstantiate)(CUgraphExec *, CUgraph, unsigned long long); /* WithFlags */
    CUresult (*GraphLaunch)(CUgraphExec, CUstream);
    CUresult (*GraphExecDestroy)(CUgraphExec);
    CUresult (*GraphDestroy)(CUgraph);
    /* launches with attributes (optional: NULL before CUDA 12; programmatic dependent launch) */
    CUresult (*LaunchKernelEx)(const CUlaunchConfig *, CUfunction, void **, void **);
    /* tensor maps (optional: NULL before CUDA 12, which then has no tensor maps) */
    CUresult (*TensorMapEncodeTiled)(void *, int, unsigned, void *, const unsigned long long *,
                                     const unsigned long long *, const unsigned *,
                                     const unsigned *, int, int, int, int);
} cuda_api;

#endif
