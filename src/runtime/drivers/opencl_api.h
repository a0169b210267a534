/* opencl_api.h — the slice of the OpenCL API the OpenCL driver (opencl.c) uses, as a table of
 * function pointers filled by dlopen("libOpenCL.so.1") + dlsym, so that libember never links the
 * ICD loader and a machine without OpenCL still builds and runs. <CL/cl.h> and <CL/cl_ext.h> are
 * included for their types and constants only: each pointer's type is taken from the header's own
 * prototype with __typeof__, so a signature can never drift from the real one, and no symbol of
 * the library is referenced. Every function listed is required: a loader without one of them is
 * reported as unusable. */
#ifndef EM_RUNTIME_DRIVERS_OPENCL_API_H
#define EM_RUNTIME_DRIVERS_OPENCL_API_H

#ifndef CL_TARGET_OPENCL_VERSION
#define CL_TARGET_OPENCL_VERSION 300
#endif
#ifndef CL_USE_DEPRECATED_OPENCL_1_2_APIS
#define CL_USE_DEPRECATED_OPENCL_1_2_APIS /* clCreateCommandQueue: every 1.2+ platform has it */
#endif
#include <CL/cl.h>
#include <CL/cl_ext.h> /* CL_PLATFORM_NOT_FOUND_KHR, CL_DEVICE_SUB_GROUP_SIZES_INTEL */

/* X(name): every function the driver calls (all in OpenCL 1.2). */
#define EM_CL_REQUIRED_FUNCS(X)                                                                    \
    X(clGetPlatformIDs)                                                                            \
    X(clGetPlatformInfo)                                                                           \
    X(clGetDeviceIDs)                                                                              \
    X(clGetDeviceInfo)                                                                             \
    X(clCreateContext)                                                                             \
    X(clReleaseContext)                                                                            \
    X(clCreateCommandQueue)                                                                        \
    X(clReleaseCommandQueue)                                                                       \
    X(clCreateBuffer)                                                                              \
    X(clCreateSubBuffer)                                                                           \
    X(clReleaseMemObject)                                                                          \
    X(clEnqueueReadBuffer)                                                                         \
    X(clEnqueueWriteBuffer)                                                                        \
    X(clEnqueueCopyBuffer)                                                                         \
    X(clCreateProgramWithSource)                                                                   \
    X(clCreateProgramWithBinary)                                                                   \
    X(clBuildProgram)                                                                              \
    X(clGetProgramInfo)                                                                            \
    X(clGetProgramBuildInfo)                                                                       \
    X(clReleaseProgram)                                                                            \
    X(clCreateKernel)                                                                              \
    X(clReleaseKernel)                                                                             \
    X(clSetKernelArg)                                                                              \
    X(clGetKernelWorkGroupInfo)                                                                    \
    X(clEnqueueNDRangeKernel)                                                                      \
    X(clEnqueueMarkerWithWaitList)                                                                 \
    X(clFinish)                                                                                    \
    X(clWaitForEvents)                                                                             \
    X(clGetEventProfilingInfo)                                                                     \
    X(clReleaseEvent)

/* The loaded library: one pointer per function, named as in OpenCL. */
typedef struct em_cl_api {
    void *lib; /* dlopen handle of libOpenCL.so.1 (kept for the life of the process) */
#define EM_CL_FIELD(name) __typeof__(&name) name;
    EM_CL_REQUIRED_FUNCS(EM_CL_FIELD)
#undef EM_CL_FIELD
} em_cl_api;

#endif
