/*
 * opbridge's native kernel ABI: a C kernel that ONNX Runtime's bridge (opbridge.onnxruntime._bridge)
 * calls directly, without Python and without the GIL.
 *
 * An op registers one with ``register_kernel(fn, native=factory)``: ``factory(attrs)`` returns a
 * PyCapsule named OPB_NATIVE_CAPSULE over an opb_native_kernel (or None: this node runs ``fn``).
 * The capsule owns the kernel (its destructor frees it) and the bridge keeps a reference to it for
 * as long as ONNX Runtime keeps the node's kernel. The kernel is usually the first member of a
 * struct that also holds the node's attributes.
 *
 * Per run, the bridge describes the node's inputs (ranks up to 8; larger ones are declined for the
 * kernel) and calls compute(), which returns:
 *   OPB_NATIVE_DONE     every output allocated (call->output) and written;
 *   OPB_NATIVE_DECLINE  these inputs are not for the native kernel (a dtype, a size, an error case
 *                       whose message the Python kernel gives): nothing was allocated, and the
 *                       bridge runs the op's Python kernel instead;
 *   OPB_NATIVE_ERROR    a message in call->err (the run fails with it).
 * compute() may be called from several threads at once (sessions run concurrently) and must
 * not call into Python.
 */
#ifndef OPBRIDGE_NATIVE_KERNEL_H
#define OPBRIDGE_NATIVE_KERNEL_H

#include <stddef.h>
#include <stdint.h>

#define OPB_NATIVE_ABI 1
#define OPB_NATIVE_CAPSULE "opbridge.native_kernel"

enum { OPB_NATIVE_ERROR = -1, OPB_NATIVE_DECLINE = 0, OPB_NATIVE_DONE = 1 };

/* ONNX TensorProto element types the kernels use */
enum { OPB_NATIVE_FLOAT = 1, OPB_NATIVE_INT64 = 7 };

typedef struct {
    const void *data; /* NULL for an absent input or an empty tensor */
    int32_t elem;     /* ONNX element type; 0 for an absent input */
    int32_t rank;
    const int64_t *dims;
} opb_native_tensor;

typedef struct opb_native_call opb_native_call;
struct opb_native_call {
    size_t n_inputs;
    const opb_native_tensor *inputs;
    size_t n_outputs;
    /* Allocates output i with the given shape; returns its (writable, contiguous) data and sets
       *elem to its element type, or returns NULL with a message in err. An output is allocated
       once per run. */
    void *(*output)(const opb_native_call *call, size_t i, const int64_t *dims, size_t rank, int32_t *elem);
    /* fn(user, i) for every i in [0, n), on the session's intra-op threads (the caller's thread
       takes part; with one thread it runs them in turn); returns when all are done. */
    void (*parallel_for)(const opb_native_call *call, void (*fn)(void *, size_t), size_t n, void *user);
    int threads; /* the session's intra-op threads (at least 1): more pieces than this only add cost */
    void *host;  /* the bridge's state for this run */
    char *err;
    size_t err_len;
};

typedef struct opb_native_kernel opb_native_kernel;
struct opb_native_kernel {
    uint32_t abi; /* OPB_NATIVE_ABI */
    const char *name;
    int (*compute)(const opb_native_kernel *self, const opb_native_call *call);
};

#endif
