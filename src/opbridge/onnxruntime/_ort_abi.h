/*
 * The slice of ONNX Runtime's C ABI that the opbridge kernel bridge uses.
 *
 * onnxruntime's pip wheel ships no C headers, so these declarations are our
 * own, written from the public C API documentation. The ABI facts they rely on:
 *
 *   - A custom-op library exports RegisterCustomOps(OrtSessionOptions*, const
 *     OrtApiBase*). OrtApiBase is two function pointers: GetApi(version) and
 *     GetVersionString().
 *   - GetApi(version) returns the OrtApi table: a struct made only of function
 *     pointers, append-only across releases. A slot is therefore addressed by
 *     its position. We ask for version 17 (onnxruntime 1.17) and, if the
 *     runtime is older, for version 16, the oldest table that has everything
 *     we need; only the parallel copy of large results needs 17, so the bridge
 *     works on every release since 1.16.
 *   - OrtCustomOp is a struct of a uint32 `version` followed by function
 *     pointers, also append-only; ONNX Runtime reads a field only when the
 *     op's `version` is at least the release that added it.
 *
 * Every OrtApi slot below carries the index we call it by and how the index
 * was derived (its position in the documented member order, counting from 0).
 * The indices are checked at run time by opb_abi_selfcheck() in _bridge.c,
 * which calls harmless functions and compares their results, and by the test
 * suite (tests/test_ort_bridge.py), which exercises every kernel-side slot.
 */
#ifndef OPBRIDGE_ORT_ABI_H
#define OPBRIDGE_ORT_ABI_H

#include <stddef.h>
#include <stdint.h>

/* The API table versions requested from GetApi, and the OrtCustomOp version we
 * declare (16 = the release that added CreateKernelV2 / KernelComputeV2).
 * The bridge asks for the newer table first: version 17 adds
 * KernelContext_ParallelFor, which the bridge uses to copy large outputs on
 * ONNX Runtime's intra-op threads. An older runtime answers NULL for 17; the
 * bridge then takes the version-16 table and copies on one thread. */
#define OPB_ORT_API_VERSION 16u
#define OPB_ORT_API_VERSION_PARALLEL 17u
#define OPB_CUSTOM_OP_VERSION 16u

/* Opaque runtime handles: only ever used through pointers. */
typedef struct OrtStatus OrtStatus;
typedef struct OrtSessionOptions OrtSessionOptions;
typedef struct OrtCustomOpDomain OrtCustomOpDomain;
typedef struct OrtKernelInfo OrtKernelInfo;
typedef struct OrtKernelContext OrtKernelContext;
typedef struct OrtValue OrtValue;
typedef struct OrtTensorTypeAndShapeInfo OrtTensorTypeAndShapeInfo;
typedef struct OrtAllocator OrtAllocator;

/* Error codes (OrtErrorCode enum, in documented order). */
enum { OPB_ORT_OK = 0, OPB_ORT_FAIL = 1, OPB_ORT_INVALID_ARGUMENT = 2, OPB_ORT_INVALID_GRAPH = 10 };

/* Tensor element types (ONNXTensorElementDataType; identical to onnx.TensorProto's numbering). */
enum {
    OPB_ELEM_UNDEFINED = 0,
    OPB_ELEM_FLOAT = 1,
    OPB_ELEM_UINT8 = 2,
    OPB_ELEM_INT8 = 3,
    OPB_ELEM_UINT16 = 4,
    OPB_ELEM_INT16 = 5,
    OPB_ELEM_INT32 = 6,
    OPB_ELEM_INT64 = 7,
    OPB_ELEM_STRING = 8,
    OPB_ELEM_BOOL = 9,
    OPB_ELEM_FLOAT16 = 10,
    OPB_ELEM_DOUBLE = 11,
    OPB_ELEM_UINT32 = 12,
    OPB_ELEM_UINT64 = 13,
    OPB_ELEM_COMPLEX64 = 14,
    OPB_ELEM_COMPLEX128 = 15
};

/* OrtCustomOpInputOutputCharacteristic: required = 0, optional = 1, variadic = 2. */
enum { OPB_IO_REQUIRED = 0, OPB_IO_OPTIONAL = 1, OPB_IO_VARIADIC = 2 };

/* OrtMemType: the default (device) memory of the kernel's provider is 0. */
enum { OPB_MEM_DEFAULT = 0 };

typedef struct OpbApiBase {
    const void *(*GetApi)(uint32_t version);
    const char *(*GetVersionString)(void);
} OpbApiBase;

/* ------------------------------------------------------------------ OrtApi slots
 *
 * Member order of OrtApi as documented, with the running index:
 *   0 CreateStatus, 1 GetErrorCode, 2 GetErrorMessage,
 *   3-6 the four environment functions (CreateEnv ... DisableTelemetryEvents),
 *   7-9 CreateSession, CreateSessionFromArray, Run,
 *   10-25 the sixteen session-options setters (CreateSessionOptions ... SetInterOpNumThreads),
 *   26 CreateCustomOpDomain, 27 CustomOpDomain_Add, 28 AddCustomOpDomain, 29 RegisterCustomOpsLibrary,
 *   30-38 the nine session input/output queries, 39-47 the nine run-options functions,
 *   48 CreateTensorAsOrtValue, 49 CreateTensorWithDataAsOrtValue, 50 IsTensor, 51 GetTensorMutableData,
 *   52-54 the three string-tensor functions, 55-56 the two type-info casts,
 *   57 CreateTensorTypeAndShapeInfo, 58 SetTensorElementType, 59 SetDimensions,
 *   60 GetTensorElementType, 61 GetDimensionsCount, 62 GetDimensions, 63 GetSymbolicDimensions,
 *   64 GetTensorShapeElementCount, 65 GetTensorTypeAndShape, 66 GetTypeInfo, 67 GetValueType,
 *   68-74 the seven memory-info functions, 75-77 AllocatorAlloc/Free/GetInfo,
 *   78 GetAllocatorWithDefaultOptions, 79 AddFreeDimensionOverride, 80-84 the five value functions,
 *   85 KernelInfoGetAttribute_float, 86 KernelInfoGetAttribute_int64, 87 KernelInfoGetAttribute_string,
 *   88 KernelContext_GetInputCount, 89 KernelContext_GetOutputCount,
 *   90 KernelContext_GetInput, 91 KernelContext_GetOutput,
 *   92 ReleaseEnv, 93 ReleaseStatus, 94 ReleaseMemoryInfo, 95 ReleaseSession, 96 ReleaseValue,
 *   97 ReleaseRunOptions, 98 ReleaseTypeInfo, 99 ReleaseTensorTypeAndShapeInfo, ...
 * All slots we use date from the first published table, so their positions
 * are the same in every version of it.
 */
#define OPB_SLOT_CreateStatus 0                    /* checked: code and message round-trip */
#define OPB_SLOT_GetErrorCode 1                    /* checked: returns the code given to CreateStatus */
#define OPB_SLOT_GetErrorMessage 2                 /* checked: returns the message given */
#define OPB_SLOT_CreateCustomOpDomain 26           /* checked: registration succeeds (tests) */
#define OPB_SLOT_CustomOpDomain_Add 27             /* checked: ops are found by ORT (tests) */
#define OPB_SLOT_AddCustomOpDomain 28              /* checked: ops are found by ORT (tests) */
#define OPB_SLOT_CreateTensorAsOrtValue 48         /* checked: creates a probe tensor */
#define OPB_SLOT_GetTensorMutableData 51           /* checked: probe tensor data is writable */
#define OPB_SLOT_GetTensorElementType 60           /* checked: probe tensor's type comes back */
#define OPB_SLOT_GetDimensionsCount 61             /* checked: probe tensor's rank comes back */
#define OPB_SLOT_GetDimensions 62                  /* checked: probe tensor's dims come back */
#define OPB_SLOT_GetTensorTypeAndShape 65          /* checked: probe tensor */
#define OPB_SLOT_GetAllocatorWithDefaultOptions 78 /* checked: gives the probe's allocator */
#define OPB_SLOT_KernelInfoGetAttribute_int64 86   /* checked: node ids reach the right kernel (tests) */
#define OPB_SLOT_KernelContext_GetInputCount 88    /* checked: input counts (tests) */
#define OPB_SLOT_KernelContext_GetOutputCount 89   /* checked: output counts (tests) */
#define OPB_SLOT_KernelContext_GetInput 90         /* checked: input values (tests) */
#define OPB_SLOT_KernelContext_GetOutput 91        /* checked: output values (tests) */
#define OPB_SLOT_ReleaseStatus 93                  /* checked: releases the probe status */
#define OPB_SLOT_ReleaseValue 96                   /* checked: releases the probe tensor */
#define OPB_SLOT_ReleaseTensorTypeAndShapeInfo 99  /* checked: releases the probe's type info */
#define OPB_SLOT_ReleaseCustomOpDomain 101          /* checked: a session's domains are released with its options (tests) */

/* One slot from a later table, used only when GetApi(17) succeeded.
 *
 * The table grows by whole release versions. Counting the members each version
 * appends (as the documentation lists them): version 1 ends at
 * ReleaseCustomOpDomain (index 101); version 2 adds 17 (to 118), 3 adds 6 (124),
 * 4 adds 2 (126), 5 adds 23 (149), 6 adds 8 (157), 7 adds 4 (161), 8 adds 8
 * (169), 9 adds 22 (191), 10 adds 12 (203), 11 adds 6 (209), 12 adds 9 (218),
 * 13 adds 6 (224), 14 adds 14 (238), 15 adds 16 (254), 16 adds 11 (255-265,
 * ending at KernelContext_GetResource). Version 17 then appends
 * SetUserLoggingFunction (266), the four ShapeInferContext functions (267-270),
 * SetSymbolicDimensions (271), ReadOpAttr (272), SetDeterministicCompute (273)
 * and KernelContext_ParallelFor (274). The same index follows from the byte
 * offset 2192 = 274 * 8 that published 64-bit bindings give for the member.
 *
 * KernelContext_ParallelFor(ctx, fn, total, num_batch, user_data) calls
 * fn(user_data, i) once for every i in [0, total) on the session's intra-op
 * thread pool (the calling thread takes part; with no pool it runs them all
 * inline) and returns when all calls are done. num_batch = 0 lets the pool
 * hand out the indices one by one. */
#define OPB_SLOT_KernelContext_ParallelFor 274     /* checked: every index is visited, the copy is exact (tests) */

/* Signatures of those slots (all use the platform's C calling convention on Linux/macOS). */
typedef OrtStatus *(*opb_CreateStatus_fn)(int code, const char *msg);
typedef int (*opb_GetErrorCode_fn)(const OrtStatus *status);
typedef const char *(*opb_GetErrorMessage_fn)(const OrtStatus *status);
typedef OrtStatus *(*opb_CreateCustomOpDomain_fn)(const char *domain, OrtCustomOpDomain **out);
typedef OrtStatus *(*opb_CustomOpDomain_Add_fn)(OrtCustomOpDomain *domain, const void *op);
typedef OrtStatus *(*opb_AddCustomOpDomain_fn)(OrtSessionOptions *options, OrtCustomOpDomain *domain);
typedef OrtStatus *(*opb_CreateTensorAsOrtValue_fn)(OrtAllocator *alloc, const int64_t *shape, size_t rank,
                                                    int elem_type, OrtValue **out);
typedef OrtStatus *(*opb_GetTensorMutableData_fn)(OrtValue *value, void **out);
typedef OrtStatus *(*opb_GetTensorElementType_fn)(const OrtTensorTypeAndShapeInfo *info, int *out);
typedef OrtStatus *(*opb_GetDimensionsCount_fn)(const OrtTensorTypeAndShapeInfo *info, size_t *out);
typedef OrtStatus *(*opb_GetDimensions_fn)(const OrtTensorTypeAndShapeInfo *info, int64_t *dims, size_t n);
typedef OrtStatus *(*opb_GetTensorTypeAndShape_fn)(const OrtValue *value, OrtTensorTypeAndShapeInfo **out);
typedef OrtStatus *(*opb_GetAllocatorWithDefaultOptions_fn)(OrtAllocator **out);
typedef OrtStatus *(*opb_KernelInfoGetAttribute_int64_fn)(const OrtKernelInfo *info, const char *name, int64_t *out);
typedef OrtStatus *(*opb_KernelContext_GetCount_fn)(const OrtKernelContext *ctx, size_t *out);
typedef OrtStatus *(*opb_KernelContext_GetInput_fn)(const OrtKernelContext *ctx, size_t index, const OrtValue **out);
typedef OrtStatus *(*opb_KernelContext_GetOutput_fn)(OrtKernelContext *ctx, size_t index, const int64_t *dims,
                                                     size_t rank, OrtValue **out);
typedef void (*opb_Release_fn)(void *handle);
typedef OrtStatus *(*opb_KernelContext_ParallelFor_fn)(const OrtKernelContext *ctx, void (*fn)(void *, size_t),
                                                       size_t total, size_t num_batch, void *user_data);

/* ------------------------------------------------------------------ OrtCustomOp
 *
 * Field order as documented. ONNX Runtime reads GetInputCharacteristic /
 * GetOutputCharacteristic from op version 8, GetInputMemoryType from 13, the
 * variadic queries only for variadic inputs/outputs (version 14), and
 * CreateKernelV2 / KernelComputeV2 from 16. The fields after KernelComputeV2
 * (shape inference, start/end version, in-place and alias maps) are read only
 * from version 17 on; we declare version 16, so they are left out.
 */
typedef struct OpbCustomOp OpbCustomOp;
struct OpbCustomOp {
    uint32_t version;
    void *(*CreateKernel)(const OpbCustomOp *op, const void *api, const OrtKernelInfo *info);
    const char *(*GetName)(const OpbCustomOp *op);
    const char *(*GetExecutionProviderType)(const OpbCustomOp *op);
    int (*GetInputType)(const OpbCustomOp *op, size_t index);
    size_t (*GetInputTypeCount)(const OpbCustomOp *op);
    int (*GetOutputType)(const OpbCustomOp *op, size_t index);
    size_t (*GetOutputTypeCount)(const OpbCustomOp *op);
    void (*KernelCompute)(void *kernel, OrtKernelContext *ctx);
    void (*KernelDestroy)(void *kernel);
    int (*GetInputCharacteristic)(const OpbCustomOp *op, size_t index);
    int (*GetOutputCharacteristic)(const OpbCustomOp *op, size_t index);
    int (*GetInputMemoryType)(const OpbCustomOp *op, size_t index);
    int (*GetVariadicInputMinArity)(const OpbCustomOp *op);
    int (*GetVariadicInputHomogeneity)(const OpbCustomOp *op);
    int (*GetVariadicOutputMinArity)(const OpbCustomOp *op);
    int (*GetVariadicOutputHomogeneity)(const OpbCustomOp *op);
    OrtStatus *(*CreateKernelV2)(const OpbCustomOp *op, const void *api, const OrtKernelInfo *info, void **kernel);
    OrtStatus *(*KernelComputeV2)(void *kernel, OrtKernelContext *ctx);
};

#endif /* OPBRIDGE_ORT_ABI_H */
