/*
 * opbridge's ONNX Runtime kernel bridge: a CPython extension that is also an
 * ONNX Runtime custom-op library.
 *
 * Python imports this file as opbridge.onnxruntime._bridge; ONNX Runtime then
 * dlopens the very same file (SessionOptions.register_custom_ops_library) and
 * calls RegisterCustomOps. Because the loader returns the already-loaded
 * object, both sides share this file's globals: Python stages op descriptors
 * with set_pending(), and RegisterCustomOps hands them to ONNX Runtime.
 *
 * At kernel creation the node's id (an int attribute the Python session adds
 * to every bridged node) is passed to the descriptor's Python resolver, which
 * returns the node's kernel callable with its attributes already bound. At
 * compute time the GIL is taken, inputs become read-only numpy arrays over
 * ONNX Runtime's buffers (no copy), the callable runs, and each result is
 * checked (count, dtype against the node's output type) and copied once into
 * an output that ONNX Runtime allocates with the result's shape. Python
 * exceptions become ONNX Runtime error statuses carrying the exception type
 * and message; nothing here aborts. A node whose op has a native C kernel
 * (../_native_kernel.h) runs that first, without the GIL; only the runs it
 * declines reach Python.
 *
 * The ABI declarations live in _ort_abi.h.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#define NPY_NO_DEPRECATED_API NPY_1_7_API_VERSION
#include <numpy/arrayobject.h>

#include <signal.h>
#include <stdio.h>
#include <string.h>

#include "_ort_abi.h"
#include "../_native_kernel.h"

#if defined(__GNUC__)
#define OPB_EXPORT __attribute__((visibility("default")))
#else
#define OPB_EXPORT
#endif

#define OPB_NODE_ATTR "__opbridge_node"
#define OPB_MAX_RANK 64

/* ------------------------------------------------------------------ globals */

static const void *const *g_api = NULL;     /* OrtApi table, set by RegisterCustomOps */
static int g_selfcheck_done = 0;            /* 1 ok, -1 failed */
static char g_selfcheck_msg[512] = "";      /* why the self-check failed, or "" */
static PyObject *g_pending = NULL;          /* list of OpDescriptor staged by set_pending() */
static PyObject *g_exits = NULL;            /* thread ident -> SystemExit a kernel raised, for take_exit() */
static char g_register_error[1024] = "";    /* last RegisterCustomOps failure, for Python */
static long g_registrations = 0;            /* successful RegisterCustomOps calls */
static unsigned g_api_version = 0;          /* version of the OrtApi table in g_api */
static opb_KernelContext_ParallelFor_fn g_parallel_for = NULL; /* NULL before API 17 */

#define API(slot, type) ((type)g_api[OPB_SLOT_##slot])

/* ------------------------------------------------------------------ helpers */

/* Make s valid UTF-8 in place: a sequence cut short at the end (a message cut to its buffer, perhaps
   inside a character) is dropped, any other invalid byte becomes '?'. ONNX Runtime's Python binding
   decodes a status message strictly, and an invalid byte replaced the whole error with a
   UnicodeDecodeError. */
static void opb_utf8_clean(char *s) {
    unsigned char *p = (unsigned char *)s;
    while (*p) {
        const unsigned char c = *p;
        const size_t len = c < 0x80                    ? 1
                           : (c >= 0xC2 && c <= 0xDF) ? 2
                           : (c >= 0xE0 && c <= 0xEF) ? 3
                           : (c >= 0xF0 && c <= 0xF4) ? 4
                                                      : 0;
        if (len == 0) { /* a continuation byte without its lead, or a byte UTF-8 never uses */
            *p++ = '?';
            continue;
        }
        /* the second byte's range where the lead limits it (no overlong forms, surrogates or code points
           past U+10FFFF) */
        const unsigned char lo = c == 0xE0 ? 0xA0 : c == 0xF0 ? 0x90 : 0x80;
        const unsigned char hi = c == 0xED ? 0x9F : c == 0xF4 ? 0x8F : 0xBF;
        size_t i = 1;
        while (i < len && p[i] >= (i == 1 ? lo : 0x80) && p[i] <= (i == 1 ? hi : 0xBF)) i++;
        if (i == len) {
            p += len;
        } else if (p[i] == '\0') { /* cut short at the end */
            *p = '\0';
        } else {
            *p++ = '?';
        }
    }
}

static OrtStatus *opb_status(const char *msg) {
    if (g_api == NULL) return NULL; /* cannot happen after registration; never dereference NULL */
    char clean[4096];
    snprintf(clean, sizeof clean, "%s", msg ? msg : "(no message)");
    opb_utf8_clean(clean);
    return API(CreateStatus, opb_CreateStatus_fn)(OPB_ORT_FAIL, clean);
}

/* Copy an ORT status message into buf and release the status. */
static void opb_take_status(OrtStatus *st, char *buf, size_t n) {
    const char *m = API(GetErrorMessage, opb_GetErrorMessage_fn)(st);
    snprintf(buf, n, "%s", m ? m : "(no message)");
    API(ReleaseStatus, opb_Release_fn)(st);
}

static int opb_elem_to_npy(int elem) {
    switch (elem) {
    case OPB_ELEM_FLOAT: return NPY_FLOAT32;
    case OPB_ELEM_UINT8: return NPY_UINT8;
    case OPB_ELEM_INT8: return NPY_INT8;
    case OPB_ELEM_UINT16: return NPY_UINT16;
    case OPB_ELEM_INT16: return NPY_INT16;
    case OPB_ELEM_INT32: return NPY_INT32;
    case OPB_ELEM_INT64: return NPY_INT64;
    case OPB_ELEM_BOOL: return NPY_BOOL;
    case OPB_ELEM_FLOAT16: return NPY_FLOAT16;
    case OPB_ELEM_DOUBLE: return NPY_FLOAT64;
    case OPB_ELEM_UINT32: return NPY_UINT32;
    case OPB_ELEM_UINT64: return NPY_UINT64;
    case OPB_ELEM_COMPLEX64: return NPY_COMPLEX64;
    case OPB_ELEM_COMPLEX128: return NPY_COMPLEX128;
    default: return -1;
    }
}

/* The alignment an element of type elem asks for: its size (a complex number's parts'), 1 for bytes. */
static uintptr_t opb_elem_align(int elem) {
    switch (elem) {
    case OPB_ELEM_INT16: case OPB_ELEM_UINT16: case OPB_ELEM_FLOAT16: case 16 /* bfloat16 */: return 2;
    case OPB_ELEM_FLOAT: case OPB_ELEM_INT32: case OPB_ELEM_UINT32: case OPB_ELEM_COMPLEX64: return 4;
    case OPB_ELEM_INT64: case OPB_ELEM_UINT64: case OPB_ELEM_DOUBLE: case OPB_ELEM_COMPLEX128: return 8;
    default: return 1;
    }
}

static const char *opb_elem_name(int elem) {
    static const char *names[] = {"undefined", "float32", "uint8",  "int8",   "uint16",    "int16",
                                  "int32",     "int64",   "string", "bool",   "float16",   "float64",
                                  "uint32",    "uint64",  "complex64", "complex128", "bfloat16"};
    if (elem >= 0 && elem < (int)(sizeof(names) / sizeof(names[0]))) return names[elem];
    return "an unsupported element type";
}

/* Whether SIGINT's handler is Python's own (signal.default_int_handler, which raises KeyboardInterrupt; the
   GIL held, no exception set). */
static int opb_default_sigint(void) {
    int is_default = 0;
    /* (_signal, the built-in module: nothing here runs Python code, where a pending signal's handler would
       run and its exception be lost) */
    PyObject *signal = PyImport_ImportModule("_signal");
    PyObject *handler = signal ? PyObject_CallMethod(signal, "getsignal", "i", SIGINT) : NULL;
    PyObject *default_handler = signal ? PyObject_GetAttrString(signal, "default_int_handler") : NULL;
    if (handler != NULL && default_handler != NULL) is_default = handler == default_handler;
    Py_XDECREF(default_handler);
    Py_XDECREF(handler);
    Py_XDECREF(signal);
    PyErr_Clear();
    return is_default;
}

/* Whether this is the main thread of the main interpreter, the one Python delivers signals to (the GIL
   held). CPython's own test, in C: threading.main_thread() would run Python code, where a second signal's
   handler may run and raise, and that exception (a second Ctrl-C, say) be lost with the first. */
static int opb_on_main_thread(void) { return _PyOS_IsMainThread(); }

/* ``s`` (a str) as UTF-8 bytes, a character UTF-8 cannot hold (a lone surrogate, as os.fsdecode makes of
   a file name's undecodable bytes) written as its backslash escape; NULL (no exception set) if that fails. */
static PyObject *opb_utf8_bytes(PyObject *s) {
    PyObject *b = (s != NULL && PyUnicode_Check(s)) ? PyUnicode_AsEncodedString(s, "utf-8", "backslashreplace") : NULL;
    if (b == NULL) {
        PyErr_Clear();
        return NULL;
    }
    /* a NUL would end the C string that carries the text (the rest of a message was lost): written as \x00 */
    if (memchr(PyBytes_AS_STRING(b), 0, (size_t)PyBytes_GET_SIZE(b)) != NULL) {
        PyObject *r = PyObject_CallMethod(b, "replace", "(y#y)", "\0", (Py_ssize_t)1, "\\x00");
        Py_DECREF(b);
        if (r == NULL) PyErr_Clear();
        return r;
    }
    return b;
}

/* Keep a SystemExit (or KeyboardInterrupt) with the pending one's arguments for this thread's take_exit()
   (the exception stays pending). Not the exception itself: its traceback holds the kernel's frames, and they
   its inputs, views of ONNX Runtime's memory that are invalid once the run returns (they would also read as
   inputs kept). */
static void opb_keep_exit(PyObject *base) {
    PyObject *type = NULL, *value = NULL, *tb = NULL;
    PyErr_Fetch(&type, &value, &tb);
    PyErr_NormalizeException(&type, &value, &tb);
    PyObject *args = value != NULL ? PyObject_GetAttrString(value, "args") : NULL;
    PyObject *kept = NULL;
    if (args != NULL && PyTuple_Check(args) && PyTuple_GET_SIZE(args) > 0) {
        /* the arguments copied (sys.exit(x) with x the kernel's input, a view of ONNX Runtime's memory that is
           freed once the run returns); ones that cannot be copied, as text */
        PyObject *copy = PyImport_ImportModule("copy");
        PyObject *copied = copy != NULL ? PyObject_CallMethod(copy, "deepcopy", "(O)", args) : NULL;
        Py_XDECREF(copy);
        if (copied == NULL || !PyTuple_Check(copied)) {
            PyErr_Clear();
            Py_XDECREF(copied);
            copied = PyTuple_New(PyTuple_GET_SIZE(args));
            for (Py_ssize_t j = 0; copied != NULL && j < PyTuple_GET_SIZE(args); j++) {
                PyObject *text = PyObject_Str(PyTuple_GET_ITEM(args, j));
                if (text == NULL) {
                    PyErr_Clear();
                    text = PyUnicode_FromString("(an argument that could not be copied)");
                }
                PyTuple_SET_ITEM(copied, j, text);
            }
        }
        Py_SETREF(args, copied);
    }
    if (args != NULL && PyTuple_Check(args)) {
        kept = PyObject_CallObject((PyObject *)Py_TYPE(value), args); /* its class: a subclass of base too */
        if (kept == NULL || !PyObject_TypeCheck(kept, (PyTypeObject *)base)) {
            PyErr_Clear();
            Py_XDECREF(kept);
            kept = PyObject_CallObject(base, args);
        }
    }
    Py_XDECREF(args);
    if (g_exits == NULL) g_exits = PyDict_New();
    PyObject *key = PyLong_FromUnsignedLong(PyThread_get_thread_ident());
    if (g_exits == NULL || key == NULL || kept == NULL || PyDict_SetItem(g_exits, key, kept) < 0) PyErr_Clear();
    Py_XDECREF(key);
    Py_XDECREF(kept);
    PyErr_Restore(type, value, tb);
}

/* opbridge.errors.KernelResultError: a check of a kernel's result failed, in a message that names the op */
static PyObject *g_result_error = NULL;

/* Render the pending Python exception as "Type: message (at file:line)" and clear it; a KernelResultError
   as its message alone. */
static void opb_format_exception(char *buf, size_t n) {
    PyObject *type = NULL, *value = NULL, *tb = NULL;
    PyErr_Fetch(&type, &value, &tb);
    PyErr_NormalizeException(&type, &value, &tb);
    const int bare = type != NULL && g_result_error != NULL && PyErr_GivenExceptionMatches(type, g_result_error);
    const char *tname = type ? ((PyTypeObject *)type)->tp_name : "Exception";
    PyObject *str = value ? PyObject_Str(value) : NULL;
    if (str == NULL) PyErr_Clear();
    PyObject *text = opb_utf8_bytes(str);
    Py_XDECREF(str);
    const char *msg = text ? PyBytes_AS_STRING(text) : "(message could not be read)";
    char where[256] = "";
    if (tb != NULL && !bare) {
        PyObject *last = tb, *next;
        Py_INCREF(last);
        while ((next = PyObject_GetAttrString(last, "tb_next")) != NULL && next != Py_None) {
            Py_DECREF(last);
            last = next;
        }
        Py_XDECREF(next);
        PyErr_Clear();
        PyObject *line = PyObject_GetAttrString(last, "tb_lineno");
        PyObject *frame = PyObject_GetAttrString(last, "tb_frame");
        PyObject *code = frame ? PyObject_GetAttrString(frame, "f_code") : NULL;
        PyObject *file = code ? PyObject_GetAttrString(code, "co_filename") : NULL;
        PyObject *func = code ? PyObject_GetAttrString(code, "co_name") : NULL;
        PyObject *file8 = opb_utf8_bytes(file), *func8 = opb_utf8_bytes(func);
        if (line && file8 && func8) {
            snprintf(where, sizeof(where), " (in %s, %s:%ld)", PyBytes_AS_STRING(func8), PyBytes_AS_STRING(file8),
                     PyLong_AsLong(line));
        }
        Py_XDECREF(file8);
        Py_XDECREF(func8);
        PyErr_Clear();
        Py_XDECREF(line);
        Py_XDECREF(frame);
        Py_XDECREF(code);
        Py_XDECREF(file);
        Py_XDECREF(func);
        Py_DECREF(last);
    }
    if (bare)
        snprintf(buf, n, "%s", msg);
    else
        snprintf(buf, n, "%s: %s%s", tname, msg, where);
    Py_XDECREF(text);
    Py_XDECREF(type);
    Py_XDECREF(value);
    Py_XDECREF(tb);
}

/* ------------------------------------------------------------------ ABI self-check */

/* Call harmless table functions and compare their results with what we gave them.
 * A wrong slot index would return garbage here (or fault in this very check, which
 * the test suite runs), instead of corrupting a user's session later. */
static int opb_abi_selfcheck(void) {
    if (g_selfcheck_done) return g_selfcheck_done;
    const char *probe = "opbridge abi probe";
    OrtStatus *st = API(CreateStatus, opb_CreateStatus_fn)(OPB_ORT_INVALID_GRAPH, probe);
    if (st == NULL) {
        snprintf(g_selfcheck_msg, sizeof g_selfcheck_msg, "CreateStatus (slot %d) returned NULL", OPB_SLOT_CreateStatus);
        return g_selfcheck_done = -1;
    }
    int code = API(GetErrorCode, opb_GetErrorCode_fn)(st);
    const char *msg = API(GetErrorMessage, opb_GetErrorMessage_fn)(st);
    int ok = code == OPB_ORT_INVALID_GRAPH && msg != NULL && strcmp(msg, probe) == 0;
    API(ReleaseStatus, opb_Release_fn)(st);
    if (!ok) {
        snprintf(g_selfcheck_msg, sizeof g_selfcheck_msg,
                 "status round-trip failed (slots %d/%d/%d): code %d", OPB_SLOT_CreateStatus, OPB_SLOT_GetErrorCode,
                 OPB_SLOT_GetErrorMessage, code);
        return g_selfcheck_done = -1;
    }

    OrtAllocator *alloc = NULL;
    st = API(GetAllocatorWithDefaultOptions, opb_GetAllocatorWithDefaultOptions_fn)(&alloc);
    if (st != NULL || alloc == NULL) {
        if (st) opb_take_status(st, g_selfcheck_msg, sizeof g_selfcheck_msg);
        else snprintf(g_selfcheck_msg, sizeof g_selfcheck_msg, "no default allocator");
        return g_selfcheck_done = -1;
    }
    const int64_t shape[3] = {2, 3, 5};
    OrtValue *value = NULL;
    st = API(CreateTensorAsOrtValue, opb_CreateTensorAsOrtValue_fn)(alloc, shape, 3, OPB_ELEM_INT64, &value);
    if (st != NULL || value == NULL) {
        if (st) opb_take_status(st, g_selfcheck_msg, sizeof g_selfcheck_msg);
        else snprintf(g_selfcheck_msg, sizeof g_selfcheck_msg, "CreateTensorAsOrtValue gave no value");
        return g_selfcheck_done = -1;
    }
    OrtTensorTypeAndShapeInfo *info = NULL;
    int elem = -1;
    size_t rank = 0;
    int64_t dims[3] = {0, 0, 0};
    void *data = NULL;
    ok = API(GetTensorTypeAndShape, opb_GetTensorTypeAndShape_fn)(value, &info) == NULL && info != NULL;
    if (ok) {
        ok = API(GetTensorElementType, opb_GetTensorElementType_fn)(info, &elem) == NULL &&
             API(GetDimensionsCount, opb_GetDimensionsCount_fn)(info, &rank) == NULL && rank == 3 &&
             API(GetDimensions, opb_GetDimensions_fn)(info, dims, 3) == NULL;
        API(ReleaseTensorTypeAndShapeInfo, opb_Release_fn)(info);
    }
    ok = ok && elem == OPB_ELEM_INT64 && dims[0] == 2 && dims[1] == 3 && dims[2] == 5;
    ok = ok && API(GetTensorMutableData, opb_GetTensorMutableData_fn)(value, &data) == NULL && data != NULL;
    if (ok) memset(data, 0, 30 * sizeof(int64_t)); /* the buffer must be ours to write */
    API(ReleaseValue, opb_Release_fn)(value);
    if (!ok) {
        snprintf(g_selfcheck_msg, sizeof g_selfcheck_msg,
                 "tensor probe failed: type %d, rank %zu, dims %lld,%lld,%lld", elem, rank, (long long)dims[0],
                 (long long)dims[1], (long long)dims[2]);
        return g_selfcheck_done = -1;
    }
    return g_selfcheck_done = 1;
}

/* ------------------------------------------------------------------ op descriptors */

/* One custom op type (domain + op type) registered for one session. The OrtCustomOp
 * must stay valid as long as ONNX Runtime may call it: while the session options
 * that received it can create sessions (its OpDescriptor, which Python keeps as long
 * as those options live) and while a kernel made from it exists (ONNX Runtime calls
 * KernelCompute and KernelDestroy through it). Each of those holds a reference; the
 * last one frees the entry. */
typedef struct {
    OpbCustomOp op; /* first member: ORT's OrtCustomOp* is our OpbOpEntry* */
    char *domain;
    char *name;
    size_t n_inputs;
    size_t n_outputs;
    int *output_types; /* element type per output, 0 = follow the input */
    PyObject *resolver; /* node id -> (callable, label, writable_inputs) */
    int registered;
    long refs; /* the OpDescriptor's and one per live kernel (atomic) */
} OpbOpEntry;

static long g_live_ops = 0; /* entries not yet freed (atomic), for abi_report() */

static void opb_entry_free(OpbOpEntry *e) {
    free(e->domain);
    free(e->name);
    free(e->output_types);
    free(e);
    __atomic_sub_fetch(&g_live_ops, 1, __ATOMIC_RELAXED);
}

/* Drop one reference to e; the last frees it (its resolver is already gone: the OpDescriptor drops it first). */
static void opb_entry_unref(OpbOpEntry *e) {
    if (e != NULL && __atomic_sub_fetch(&e->refs, 1, __ATOMIC_ACQ_REL) == 0) opb_entry_free(e);
}

typedef struct {
    PyObject *fn;     /* kernel callable: fn(*arrays[, out=...]) -> array | tuple of arrays */
    PyObject *shapes; /* optional: shapes(*arrays) -> output shapes (or None), enables out= */
    char *label;      /* "domain::Op node 'name'" for messages */
    int writable;     /* give the kernel writable input arrays (torch.from_numpy wants them) */
    PyObject *native_obj;             /* the capsule that owns `native`, or NULL */
    const opb_native_kernel *native;  /* a C kernel tried before fn (../_native_kernel.h), or NULL */
    int threads;                      /* the session's intra-op threads, for the native kernel */
    OpbOpEntry *entry;                /* the op, kept while ONNX Runtime may call it through this kernel */
} OpbKernel;

static const char *opb_get_name(const OpbCustomOp *op) { return ((const OpbOpEntry *)op)->name; }
static const char *opb_get_provider(const OpbCustomOp *op) { (void)op; return NULL; /* CPU */ }
static int opb_get_input_type(const OpbCustomOp *op, size_t i) { (void)op; (void)i; return OPB_ELEM_UNDEFINED; }
static size_t opb_get_input_count(const OpbCustomOp *op) { return ((const OpbOpEntry *)op)->n_inputs; }
static int opb_get_output_type(const OpbCustomOp *op, size_t i) {
    const OpbOpEntry *e = (const OpbOpEntry *)op;
    return i < e->n_outputs ? e->output_types[i] : OPB_ELEM_UNDEFINED;
}
static size_t opb_get_output_count(const OpbCustomOp *op) { return ((const OpbOpEntry *)op)->n_outputs; }
/* Every input and output is optional to ONNX Runtime: the Python side knows which
 * are required and checks that itself, so nodes that omit trailing optional inputs
 * and ops with several dynamically typed inputs both load. */
static int opb_get_io_characteristic(const OpbCustomOp *op, size_t i) { (void)op; (void)i; return OPB_IO_OPTIONAL; }
static int opb_get_mem_type(const OpbCustomOp *op, size_t i) { (void)op; (void)i; return OPB_MEM_DEFAULT; }
static int opb_variadic_min_arity(const OpbCustomOp *op) { (void)op; return 1; }
static int opb_variadic_homogeneity(const OpbCustomOp *op) { (void)op; return 0; }

static void opb_kernel_free(OpbKernel *k) {
    if (k == NULL) return;
    if (k->fn != NULL && Py_IsInitialized()) {
        PyGILState_STATE g = PyGILState_Ensure();
        Py_CLEAR(k->fn);
        Py_CLEAR(k->shapes);
        Py_CLEAR(k->native_obj);
        PyGILState_Release(g);
    }
    free(k->label);
    opb_entry_unref(k->entry); /* (ONNX Runtime calls nothing of the op after KernelDestroy returns) */
    free(k);
}

static OrtStatus *opb_create_kernel_v2(const OpbCustomOp *op, const void *api, const OrtKernelInfo *info, void **out) {
    (void)api;
    const OpbOpEntry *e = (const OpbOpEntry *)op;
    char buf[1024];
    if (out == NULL) return opb_status("opbridge: ONNX Runtime passed no kernel slot");
    *out = NULL;
    int64_t node_id = -1;
    OrtStatus *st = API(KernelInfoGetAttribute_int64, opb_KernelInfoGetAttribute_int64_fn)(info, OPB_NODE_ATTR, &node_id);
    if (st != NULL) {
        API(ReleaseStatus, opb_Release_fn)(st);
        snprintf(buf, sizeof buf,
                 "opbridge: node of %s::%s has no '%s' attribute; bridged kernels run only in sessions "
                 "created by opbridge.InferenceSession",
                 e->domain, e->name, OPB_NODE_ATTR);
        return opb_status(buf);
    }
    if (!Py_IsInitialized()) return opb_status("opbridge: the Python interpreter is not running");
    PyGILState_STATE g = PyGILState_Ensure();
    OrtStatus *result = NULL;
    PyObject *res = NULL;
    if (e->resolver == NULL) {
        snprintf(buf, sizeof buf, "opbridge: %s::%s was registered for a session that is gone; create a new "
                 "opbridge.InferenceSession", e->domain, e->name);
        result = opb_status(buf);
        goto done;
    }
    res = PyObject_CallFunction(e->resolver, "L", (long long)node_id);
    if (res == NULL) {
        char exc[768];
        opb_format_exception(exc, sizeof exc);
        snprintf(buf, sizeof buf, "opbridge: creating the kernel of %s::%s failed: %s", e->domain, e->name, exc);
        result = opb_status(buf);
        goto done;
    }
    PyObject *fn = NULL, *label = NULL, *shapes = Py_None, *native = Py_None;
    int writable = 0, threads = 1;
    if (!PyArg_ParseTuple(res, "OUp|OOi", &fn, &label, &writable, &shapes, &native, &threads) ||
        !PyCallable_Check(fn) || (shapes != Py_None && !PyCallable_Check(shapes))) {
        PyErr_Clear();
        snprintf(buf, sizeof buf, "opbridge: the resolver of %s::%s returned a bad value", e->domain, e->name);
        result = opb_status(buf);
        goto done;
    }
    const opb_native_kernel *nk = NULL;
    if (native != Py_None) {
        nk = (const opb_native_kernel *)PyCapsule_GetPointer(native, OPB_NATIVE_CAPSULE);
        if (nk == NULL || nk->abi != OPB_NATIVE_ABI || nk->compute == NULL) {
            PyErr_Clear();
            snprintf(buf, sizeof buf, "opbridge: the native kernel of %s::%s is not a '%s' capsule of ABI %d; "
                     "rebuild opbridge (pip install -e .)", e->domain, e->name, OPB_NATIVE_CAPSULE, OPB_NATIVE_ABI);
            result = opb_status(buf);
            goto done;
        }
    }
    OpbKernel *k = (OpbKernel *)calloc(1, sizeof(OpbKernel));
    PyObject *lab = opb_utf8_bytes(label);
    if (k == NULL || lab == NULL || (k->label = strdup(PyBytes_AS_STRING(lab))) == NULL) {
        PyErr_Clear();
        Py_XDECREF(lab);
        free(k);
        result = opb_status("opbridge: out of memory creating a kernel");
        goto done;
    }
    Py_DECREF(lab);
    __atomic_add_fetch(&((OpbOpEntry *)e)->refs, 1, __ATOMIC_RELAXED);
    k->entry = (OpbOpEntry *)e;
    Py_INCREF(fn);
    k->fn = fn;
    if (shapes != Py_None) {
        Py_INCREF(shapes);
        k->shapes = shapes;
    }
    k->writable = writable;
    if (nk != NULL) {
        Py_INCREF(native);
        k->native_obj = native;
        k->native = nk;
        k->threads = threads > 1 ? threads : 1;
    }
    *out = k;
done:
    Py_XDECREF(res);
    PyGILState_Release(g);
    return result;
}

static void *opb_create_kernel_v1(const OpbCustomOp *op, const void *api, const OrtKernelInfo *info) {
    /* Only used if ONNX Runtime ignored CreateKernelV2, which releases >= 1.16 never do. */
    void *k = NULL;
    OrtStatus *st = opb_create_kernel_v2(op, api, info, &k);
    if (st != NULL) API(ReleaseStatus, opb_Release_fn)(st);
    return k;
}

static void opb_kernel_destroy(void *kernel) { opb_kernel_free((OpbKernel *)kernel); }

/* Input i of the node: its data (NULL for an empty tensor), element type, rank and dimensions (dims
 * holds max_rank). Returns OPB_INPUT_OK, OPB_INPUT_ABSENT (an absent optional input),
 * OPB_INPUT_RANK (rank above max_rank, *rank set) or -1 with ONNX Runtime's message in err. */
enum { OPB_INPUT_OK = 0, OPB_INPUT_ABSENT = 1, OPB_INPUT_RANK = 2 };

static int opb_describe_input(OrtKernelContext *ctx, size_t i, size_t max_rank, void **data, int *elem,
                              size_t *rank, int64_t *dims, char *err, size_t n) {
    const OrtValue *v = NULL;
    OrtTensorTypeAndShapeInfo *info = NULL;
    OrtStatus *st = API(KernelContext_GetInput, opb_KernelContext_GetInput_fn)(ctx, i, &v);
    if (st == NULL && v == NULL) return OPB_INPUT_ABSENT;
    if (st == NULL) st = API(GetTensorTypeAndShape, opb_GetTensorTypeAndShape_fn)(v, &info);
    if (st == NULL) st = API(GetTensorElementType, opb_GetTensorElementType_fn)(info, elem);
    if (st == NULL) st = API(GetDimensionsCount, opb_GetDimensionsCount_fn)(info, rank);
    if (st == NULL && *rank > max_rank) {
        API(ReleaseTensorTypeAndShapeInfo, opb_Release_fn)(info);
        return OPB_INPUT_RANK;
    }
    if (st == NULL) st = API(GetDimensions, opb_GetDimensions_fn)(info, dims, *rank);
    if (info) API(ReleaseTensorTypeAndShapeInfo, opb_Release_fn)(info);
    if (st == NULL) st = API(GetTensorMutableData, opb_GetTensorMutableData_fn)((OrtValue *)v, data);
    if (st != NULL) {
        opb_take_status(st, err, n);
        return -1;
    }
    return OPB_INPUT_OK;
}

/* Build the input tuple: numpy arrays viewing ORT's buffers, None for absent inputs. */
static PyObject *opb_inputs(OpbKernel *k, OrtKernelContext *ctx, char *err, size_t n) {
    size_t count = 0;
    OrtStatus *st = API(KernelContext_GetInputCount, opb_KernelContext_GetCount_fn)(ctx, &count);
    if (st != NULL) {
        opb_take_status(st, err, n);
        return NULL;
    }
    PyObject *args = PyTuple_New((Py_ssize_t)count);
    if (args == NULL) {
        snprintf(err, n, "%s: out of memory", k->label);
        return NULL;
    }
    for (size_t i = 0; i < count; i++) {
        int elem = 0;
        size_t rank = 0;
        int64_t dims[OPB_MAX_RANK];
        void *data = NULL;
        const int got = opb_describe_input(ctx, i, OPB_MAX_RANK, &data, &elem, &rank, dims, err, n);
        if (got == OPB_INPUT_ABSENT) {
            Py_INCREF(Py_None);
            PyTuple_SET_ITEM(args, (Py_ssize_t)i, Py_None);
            continue;
        }
        if (got == OPB_INPUT_RANK)
            snprintf(err, n, "%s: input %zu has rank %zu, more than the %d supported", k->label, i, rank, OPB_MAX_RANK);
        if (got != OPB_INPUT_OK) {
            Py_DECREF(args);
            return NULL;
        }
        int typenum = opb_elem_to_npy(elem);
        if (typenum < 0) {
            snprintf(err, n, "%s: input %zu has element type %s, which the Python bridge does not pass to kernels",
                     k->label, i, opb_elem_name(elem));
            Py_DECREF(args);
            return NULL;
        }
        npy_intp shape[OPB_MAX_RANK];
        npy_intp size = 1;
        for (size_t d = 0; d < rank; d++) {
            shape[d] = (npy_intp)dims[d];
            size *= shape[d];
        }
        PyObject *arr;
        if (size == 0 || data == NULL) {
            arr = PyArray_SimpleNew((int)rank, shape, typenum); /* empty: nothing to view */
        } else {
            /* (no NPY_ARRAY_ALIGNED: numpy works out for itself whether the data is aligned, and a
               caller's feed may start at any address) */
            int flags = NPY_ARRAY_C_CONTIGUOUS | (k->writable ? NPY_ARRAY_WRITEABLE : 0);
            arr = PyArray_New(&PyArray_Type, (int)rank, shape, typenum, NULL, data, 0, flags, NULL);
        }
        if (arr == NULL) { /* (numpy refused the dims: "array is too big", say) */
            char exc[1024];
            opb_format_exception(exc, sizeof exc);
            snprintf(err, n, "%s: input %zu cannot be given to the kernel as a numpy array: %s", k->label, i, exc);
            Py_DECREF(args);
            return NULL;
        }
        PyTuple_SET_ITEM(args, (Py_ssize_t)i, arr);
    }
    return args;
}

/* ------------------------------------------------------------------ copying results
 *
 * A kernel that returns a new array costs one copy into ONNX Runtime's output.
 * Copies under OPB_LARGE_COPY bytes are one memcpy with the GIL held. Larger ones
 * release the GIL and take one of two routes (benchmarks/ORT_BRIDGE.md has the
 * measurements behind them):
 *
 *   - A fresh result (it owns its memory and only the bridge still refers to it,
 *     so the kernel has just written it and it dies after the copy) is copied on
 *     the calling thread with non-temporal stores. The kernel has just pushed at
 *     least the whole result, usually its inputs and temporaries too, through
 *     the caches, so ORT's output buffer is mostly out of them: ordinary stores
 *     would first read every destination line from memory. Streaming stores
 *     skip that read. On data still in the caches they are slower, hence the
 *     second route.
 *   - Any other result (an input returned as is, a view, a cached array) is
 *     usually still in cache. It is cut into OPB_COPY_CHUNK pieces that the
 *     session's intra-op thread pool copies side by side with ordinary stores,
 *     through KernelContext_ParallelFor (C API 17, onnxruntime >= 1.17). The
 *     pool follows the session's intra_op_num_threads (with 1 thread the calling
 *     thread copies every piece) and hands pieces out one at a time. The bridge
 *     creates no threads. Before API 17 the calling thread copies it.
 */
#define OPB_LARGE_COPY ((size_t)1 << 20)
#define OPB_COPY_CHUNK ((size_t)256 << 10)

/* How large results are copied. AUTO is the rule above; the others force one
 * route for every large result and exist so benchmarks can compare them side by
 * side (_set_copy_mode). */
enum { OPB_COPY_SERIAL = 0, OPB_COPY_PARALLEL = 1, OPB_COPY_STREAM = 2, OPB_COPY_AUTO = 3 };
static const char *const g_copy_mode_names[] = {"serial", "parallel", "stream", "auto"};
static int g_copy_mode = OPB_COPY_AUTO;
static long g_large_copies[3] = {0, 0, 0}; /* large copies done serially, on the pool, streamed */

#if defined(__SSE2__)
#include <emmintrin.h>
/* memcpy with non-temporal stores for the aligned bulk: the destination bypasses the caches. */
static void opb_copy_stream(char *dst, const char *src, size_t n) {
    size_t i = (size_t)(-(uintptr_t)dst & 15u);
    if (i > n) i = n;
    memcpy(dst, src, i);
    for (; i + 64 <= n; i += 64) {
        __m128i a = _mm_loadu_si128((const __m128i *)(src + i));
        __m128i b = _mm_loadu_si128((const __m128i *)(src + i + 16));
        __m128i c = _mm_loadu_si128((const __m128i *)(src + i + 32));
        __m128i d = _mm_loadu_si128((const __m128i *)(src + i + 48));
        _mm_stream_si128((__m128i *)(dst + i), a);
        _mm_stream_si128((__m128i *)(dst + i + 16), b);
        _mm_stream_si128((__m128i *)(dst + i + 32), c);
        _mm_stream_si128((__m128i *)(dst + i + 48), d);
    }
    _mm_sfence(); /* streaming stores are weakly ordered: make them visible before ORT reads the output */
    memcpy(dst + i, src + i, n - i);
}
#else
static void opb_copy_stream(char *dst, const char *src, size_t n) { memcpy(dst, src, n); }
#endif

typedef struct {
    char *dst;
    const char *src;
    size_t nbytes;
    size_t done; /* pieces copied, counted atomically: the pool must visit every one */
} OpbCopyJob;

static void opb_copy_piece(void *user_data, size_t i) {
    OpbCopyJob *job = (OpbCopyJob *)user_data;
    size_t off = i * OPB_COPY_CHUNK;
    if (off >= job->nbytes) return;
    size_t len = job->nbytes - off < OPB_COPY_CHUNK ? job->nbytes - off : OPB_COPY_CHUNK;
    memcpy(job->dst + off, job->src + off, len);
    __atomic_fetch_add(&job->done, 1, __ATOMIC_RELAXED);
}

/* Whether a kernel's result was made by this call: it owns its memory and only the
 * caller of this check (one reference, before any conversion) refers to it. */
static int opb_fresh(PyObject *obj) {
    return PyArray_Check(obj) && PyArray_CHKFLAGS((PyArrayObject *)obj, NPY_ARRAY_OWNDATA) && Py_REFCNT(obj) == 1;
}

static int opb_overlap(const void *a, const void *b, size_t n) {
    const char *x = (const char *)a, *y = (const char *)b;
    return x < y + n && y < x + n;
}

/* Copy nbytes from src to dst (they must not overlap). Called with the GIL held,
 * which it releases for large copies; the caller's reference keeps src alive. */
static void opb_copy_bytes(OrtKernelContext *ctx, void *dst, const void *src, size_t nbytes, int fresh) {
    if (nbytes < OPB_LARGE_COPY) {
        memcpy(dst, src, nbytes);
        return;
    }
    int mode = g_copy_mode == OPB_COPY_AUTO ? (fresh ? OPB_COPY_STREAM : OPB_COPY_PARALLEL) : g_copy_mode;
    Py_BEGIN_ALLOW_THREADS
    int copied = 0;
    if (mode == OPB_COPY_PARALLEL && g_parallel_for != NULL && ctx != NULL) {
        OpbCopyJob job = {(char *)dst, (const char *)src, nbytes, 0};
        size_t pieces = (nbytes + OPB_COPY_CHUNK - 1) / OPB_COPY_CHUNK;
        OrtStatus *st = g_parallel_for(ctx, opb_copy_piece, pieces, 0, &job);
        if (st != NULL) API(ReleaseStatus, opb_Release_fn)(st);
        /* Trust the pool only if it reports success and copied every piece;
         * otherwise copy it all here (copying again is harmless). */
        copied = st == NULL && __atomic_load_n(&job.done, __ATOMIC_RELAXED) == pieces;
    }
    if (!copied) {
        if (mode == OPB_COPY_STREAM) opb_copy_stream((char *)dst, (const char *)src, nbytes);
        else memcpy(dst, src, nbytes);
    }
    __atomic_fetch_add(&g_large_copies[copied ? OPB_COPY_PARALLEL : mode == OPB_COPY_STREAM ? OPB_COPY_STREAM : 0],
                       1, __ATOMIC_RELAXED);
    Py_END_ALLOW_THREADS
}

/* Output i of ONNX Runtime's node, allocated with the given shape: its element type and buffer (NULL
 * for an empty tensor). Returns 0, or -1 with the reason in err. */
static int opb_get_output(OrtKernelContext *ctx, const char *label, size_t i, const int64_t *dims, size_t rank,
                          int *elem, void **data, char *err, size_t n) {
    OrtValue *out = NULL;
    OrtTensorTypeAndShapeInfo *info = NULL;
    OrtStatus *st = API(KernelContext_GetOutput, opb_KernelContext_GetOutput_fn)(ctx, i, dims, rank, &out);
    if (st == NULL && out == NULL) st = opb_status("no output value");
    if (st == NULL) st = API(GetTensorTypeAndShape, opb_GetTensorTypeAndShape_fn)(out, &info);
    if (st == NULL) st = API(GetTensorElementType, opb_GetTensorElementType_fn)(info, elem);
    if (info) API(ReleaseTensorTypeAndShapeInfo, opb_Release_fn)(info);
    if (st == NULL) st = API(GetTensorMutableData, opb_GetTensorMutableData_fn)(out, data);
    if (st == NULL) return 0;
    char ort[512];
    opb_take_status(st, ort, sizeof ort);
    snprintf(err, n, "%s: ONNX Runtime could not allocate output %zu: %s", label, i, ort);
    return -1;
}

/* Copy one kernel result into ORT output i. */
static int opb_output(OpbKernel *k, OrtKernelContext *ctx, size_t i, PyObject *obj, char *err, size_t n) {
    int fresh = opb_fresh(obj);
    /* Arrays and numpy scalars only: anything else would be converted with a guessed dtype. */
    PyArrayObject *arr = (PyArray_Check(obj) || PyArray_IsScalar(obj, Generic)) ? (PyArrayObject *)PyArray_FROM_O(obj)
                                                                             : NULL;
    if (arr == NULL) {
        PyErr_Clear();
        snprintf(err, n, "%s: output %zu is a %s, not an array; return numpy arrays (or torch tensors "
                 "for torch kernels)", k->label, i, Py_TYPE(obj)->tp_name);
        return -1;
    }
    int rank = PyArray_NDIM(arr);
    int64_t dims[NPY_MAXDIMS > OPB_MAX_RANK ? NPY_MAXDIMS : OPB_MAX_RANK];
    for (int d = 0; d < rank; d++) dims[d] = (int64_t)PyArray_DIM(arr, d);
    int elem = 0;
    void *dst = NULL;
    if (opb_get_output(ctx, k->label, i, dims, (size_t)rank, &elem, &dst, err, n) < 0) {
        Py_DECREF(arr);
        return -1;
    }
    int want = opb_elem_to_npy(elem);
    if (want < 0 || !PyArray_EquivTypenums(want, PyArray_TYPE(arr))) {
        PyObject *got = PyObject_Str((PyObject *)PyArray_DESCR(arr));
        snprintf(err, n, "%s: output %zu has dtype %s, but the node's output type is %s; return an array of "
                 "dtype %s (e.g. result.astype(np.%s))", k->label, i, got ? PyUnicode_AsUTF8(got) : "?",
                 opb_elem_name(elem), opb_elem_name(elem), opb_elem_name(elem));
        Py_XDECREF(got);
        PyErr_Clear();
        Py_DECREF(arr);
        return -1;
    }
    npy_intp nbytes = PyArray_NBYTES(arr);
    if (nbytes > 0 && dst != NULL) {
        if (PyArray_IS_C_CONTIGUOUS(arr) && PyArray_ISNOTSWAPPED(arr)) {
            opb_copy_bytes(ctx, dst, PyArray_DATA(arr), (size_t)nbytes, fresh);
        } else {
            /* Strided (e.g. a transpose) or byte-swapped result: numpy writes it into the ORT buffer. */
            npy_intp shape[NPY_MAXDIMS];
            for (int d = 0; d < rank; d++) shape[d] = PyArray_DIM(arr, d);
            PyObject *view = PyArray_New(&PyArray_Type, rank, shape, PyArray_TYPE(arr), NULL, dst, 0,
                                         NPY_ARRAY_CARRAY, NULL);
            if (view == NULL || PyArray_CopyInto((PyArrayObject *)view, arr) < 0) {
                Py_XDECREF(view);
                opb_format_exception(err, n);
                Py_DECREF(arr);
                return -1;
            }
            Py_DECREF(view);
        }
    }
    Py_DECREF(arr);
    return 0;
}

/* Allocate every ORT output with the shapes the op's shape rule gives and wrap them as
 * writable arrays for the kernel's out= argument. Returns a tuple, Py_None when the rule
 * cannot say (the kernel then allocates its own results), or NULL with err set. */
static PyObject *opb_preallocate(OpbKernel *k, OrtKernelContext *ctx, PyObject *args, size_t n_out, char *err,
                                 size_t n) {
    PyObject *shapes = PyObject_Call(k->shapes, args, NULL);
    if (shapes == NULL) {
        char exc[1024];
        opb_format_exception(exc, sizeof exc);
        snprintf(err, n, "%s: the shape rule raised %s", k->label, exc);
        return NULL;
    }
    if (shapes == Py_None) return shapes;
    /* tuples (copies), not the rule's own lists: reading a dim can run Python code (__index__) */
    PyObject *seq = PySequence_Tuple(shapes);
    Py_DECREF(shapes);
    if (seq == NULL || (size_t)PyTuple_GET_SIZE(seq) != n_out) {
        PyErr_Clear();
        snprintf(err, n, "%s: the shape rule gives %zd output(s), the node has %zu", k->label,
                 seq ? PyTuple_GET_SIZE(seq) : (Py_ssize_t)-1, n_out);
        Py_XDECREF(seq);
        return NULL;
    }
    PyObject *outs = PyTuple_New((Py_ssize_t)n_out);
    for (size_t i = 0; outs != NULL && i < n_out; i++) {
        PyObject *dims_seq = PySequence_Tuple(PyTuple_GET_ITEM(seq, (Py_ssize_t)i));
        Py_ssize_t rank = dims_seq ? PyTuple_GET_SIZE(dims_seq) : -1;
        int64_t dims[OPB_MAX_RANK];
        npy_intp shape[OPB_MAX_RANK];
        int bad = rank < 0 || rank > OPB_MAX_RANK, not_int = 0;
        Py_ssize_t bad_dim = -1;
        long long bad_value = 0;
        for (Py_ssize_t d = 0; !bad && d < rank; d++) {
            long long v = PyLong_AsLongLong(PyTuple_GET_ITEM(dims_seq, d));
            not_int = v == -1 && PyErr_Occurred() != NULL;
            if (not_int || v < 0) {
                bad = 1;
                bad_dim = d;
                bad_value = v;
            }
            dims[d] = (int64_t)v;
            shape[d] = (npy_intp)v;
        }
        Py_XDECREF(dims_seq);
        if (bad) {
            PyErr_Clear();
            if (bad_dim < 0 || not_int)
                snprintf(err, n, "%s: the shape rule gave a bad shape for output %zu", k->label, i);
            else
                snprintf(err, n, "%s: the shape rule gave output %zu a dim %zd of %lld for these inputs; sizes are >= 0",
                         k->label, i, bad_dim, bad_value);
            Py_CLEAR(outs);
            break;
        }
        int elem = 0;
        void *dst = NULL;
        if (opb_get_output(ctx, k->label, i, dims, (size_t)rank, &elem, &dst, err, n) < 0) {
            Py_CLEAR(outs);
            break;
        }
        int typenum = opb_elem_to_npy(elem);
        if (typenum < 0) {
            snprintf(err, n, "%s: output %zu has element type %s, which the Python bridge cannot fill", k->label, i,
                     opb_elem_name(elem));
            Py_CLEAR(outs);
            break;
        }
        PyObject *arr = PyArray_New(&PyArray_Type, (int)rank, shape, typenum, NULL, dst, 0, NPY_ARRAY_CARRAY, NULL);
        if (arr == NULL) {
            char exc[1024];
            opb_format_exception(exc, sizeof exc);
            snprintf(err, n, "%s: output %zu cannot be given to the kernel as a numpy array: %s", k->label, i, exc);
            Py_CLEAR(outs);
            break;
        }
        PyTuple_SET_ITEM(outs, (Py_ssize_t)i, arr);
    }
    Py_DECREF(seq);
    if (outs == NULL && err[0] == '\0') snprintf(err, n, "%s: out of memory", k->label);
    return outs;
}

/* "(2, 3)" for an array's shape. */
static void opb_shape_text(PyArrayObject *a, char *buf, size_t n) {
    size_t used = (size_t)snprintf(buf, n, "(");
    for (int d = 0; d < PyArray_NDIM(a) && used < n; d++)
        used += (size_t)snprintf(buf + used, n - used, d ? ", %lld" : "%lld", (long long)PyArray_DIM(a, d));
    if (used < n) snprintf(buf + used, n - used, PyArray_NDIM(a) == 1 ? ",)" : ")");
}

/* The bytes [lo, hi) an array's elements span (its data pointer and strides, either sign). */
static void opb_span(PyArrayObject *a, const char **lo, const char **hi) {
    const char *start = (const char *)PyArray_DATA(a), *end = start;
    npy_intp size = PyArray_SIZE(a);
    if (size > 0) {
        for (int d = 0; d < PyArray_NDIM(a); d++) {
            npy_intp step = PyArray_STRIDE(a, d) * (PyArray_DIM(a, d) - 1);
            if (step < 0) start += step;
            else end += step;
        }
        end += PyArray_ITEMSIZE(a);
    }
    *lo = start;
    *hi = end;
}

/* ``res`` (a tuple of results, one per output) where a result lies in another output's preallocated
 * buffer (a kernel that computed output j in out[i], i != j): that result copied first, as filling
 * output i would overwrite it before output j is filled. A new reference, or NULL with ``err`` set. */
static PyObject *opb_detach_crossed(OpbKernel *k, PyObject *res, PyObject *outs, char *err, size_t n) {
    Py_ssize_t count = PyTuple_GET_SIZE(res);
    PyObject *fixed = NULL;
    for (Py_ssize_t j = 0; j < count; j++) {
        PyObject *item = PyTuple_GET_ITEM(res, j);
        if (!PyArray_Check(item) || PyArray_SIZE((PyArrayObject *)item) == 0) continue;
        const char *lo, *hi;
        opb_span((PyArrayObject *)item, &lo, &hi);
        int crossed = 0;
        for (Py_ssize_t i = 0; i < count && !crossed; i++) {
            PyArrayObject *dst = (PyArrayObject *)PyTuple_GET_ITEM(outs, i);
            if (i == j || PyArray_NBYTES(dst) == 0) continue;
            const char *start = (const char *)PyArray_DATA(dst), *end = start + PyArray_NBYTES(dst);
            crossed = lo < end && start < hi;
        }
        if (!crossed) continue;
        if (fixed == NULL) { /* (a tuple of its own: the kernel's may be referenced elsewhere) */
            fixed = PyTuple_New(count);
            if (fixed == NULL) break;
            for (Py_ssize_t m = 0; m < count; m++) {
                Py_INCREF(PyTuple_GET_ITEM(res, m));
                PyTuple_SET_ITEM(fixed, m, PyTuple_GET_ITEM(res, m));
            }
        }
        PyObject *copy = PyArray_NewCopy((PyArrayObject *)item, NPY_CORDER);
        if (copy == NULL) {
            Py_CLEAR(fixed);
            break;
        }
        Py_DECREF(PyTuple_GET_ITEM(fixed, j));
        PyTuple_SET_ITEM(fixed, j, copy);
    }
    if (PyErr_Occurred()) {
        opb_format_exception(err, n);
        snprintf(err + strlen(err), n - strlen(err), " (%s: copying a result that lies in another output)", k->label);
        return NULL;
    }
    if (fixed == NULL) {
        Py_INCREF(res);
        return res;
    }
    return fixed;
}

/* Deliver result i into a preallocated output: nothing to do when the kernel wrote in place. */
static int opb_fill_preallocated(OpbKernel *k, OrtKernelContext *ctx, size_t i, PyObject *obj, PyObject *target,
                                 char *err, size_t n) {
    if (obj == target) return 0;
    int fresh = opb_fresh(obj);
    PyArrayObject *dst = (PyArrayObject *)target;
    if (!(PyArray_Check(obj) || PyArray_IsScalar(obj, Generic))) {
        snprintf(err, n, "%s: output %zu is a %s, not an array; return numpy arrays (a kernel that writes `out` "
                 "returns it)", k->label, i, Py_TYPE(obj)->tp_name);
        return -1;
    }
    PyArrayObject *arr = (PyArrayObject *)PyArray_FROM_O(obj);
    if (arr == NULL) {
        opb_format_exception(err, n);
        return -1;
    }
    int rc = 0;
    if (!PyArray_EquivTypenums(PyArray_TYPE(arr), PyArray_TYPE(dst))) {
        PyObject *got = PyObject_Str((PyObject *)PyArray_DESCR(arr));
        PyObject *want = PyObject_Str((PyObject *)PyArray_DESCR(dst));
        snprintf(err, n, "%s: output %zu has dtype %s, but the node's output type is %s", k->label, i,
                 got ? PyUnicode_AsUTF8(got) : "?", want ? PyUnicode_AsUTF8(want) : "?");
        Py_XDECREF(got);
        Py_XDECREF(want);
        PyErr_Clear();
        rc = -1;
    } else if (!PyArray_SAMESHAPE(arr, dst)) {
        char got[256], want[256];
        opb_shape_text(arr, got, sizeof got);
        opb_shape_text(dst, want, sizeof want);
        snprintf(err, n, "%s: output %zu has shape %s, but the op's shape rule gives %s for these inputs", k->label,
                 i, got, want);
        rc = -1;
    } else if (PyArray_DATA(arr) == PyArray_DATA(dst) && PyArray_ISNOTSWAPPED(arr) && /* (a byte-swapped view of
               `out` holds other values: copied below) */
               (PyArray_NDIM(dst) == 0 || /* (a 0-d array has no strides to compare: NULL) */
                memcmp(PyArray_STRIDES(arr), PyArray_STRIDES(dst), (size_t)PyArray_NDIM(dst) * sizeof(npy_intp)) == 0)) {
        /* the output itself (a view of it in another layout, e.g. its transpose, is copied below:
           numpy's copy sees the overlap) */
    } else if (PyArray_IS_C_CONTIGUOUS(arr) && PyArray_ISNOTSWAPPED(arr) &&
               !opb_overlap(PyArray_DATA(arr), PyArray_DATA(dst), (size_t)PyArray_NBYTES(dst))) {
        opb_copy_bytes(ctx, PyArray_DATA(dst), PyArray_DATA(arr), (size_t)PyArray_NBYTES(dst), fresh);
    } else if (PyArray_CopyInto(dst, arr) < 0) {
        opb_format_exception(err, n);
        rc = -1;
    }
    Py_DECREF(arr);
    return rc;
}

/* ------------------------------------------------------------------ native kernels
 *
 * A node whose op has a native kernel (../_native_kernel.h) runs it first, without the GIL: inputs
 * are described by pointer, element type and shape, outputs are allocated through a callback, and
 * the kernel splits its work over the session's intra-op threads (KernelContext_ParallelFor). A
 * kernel that declines a call leaves it to the Python path below. */
#define OPB_NATIVE_MAX_INPUTS 16

typedef struct {
    OrtKernelContext *ctx;
    const char *label;
} OpbNativeHost;

static void *opb_native_output(const opb_native_call *call, size_t i, const int64_t *dims, size_t rank,
                               int32_t *elem) {
    const OpbNativeHost *h = (const OpbNativeHost *)call->host;
    int type = 0;
    void *data = NULL;
    if (opb_get_output(h->ctx, h->label, i, dims, rank, &type, &data, call->err, call->err_len) < 0) return NULL;
    if (data == NULL) { /* the native kernels write non-empty outputs only */
        snprintf(call->err, call->err_len, "%s: ONNX Runtime gave output %zu no buffer", h->label, i);
        return NULL;
    }
    *elem = (int32_t)type;
    return data;
}

typedef struct {
    void (*fn)(void *, size_t);
    void *user;
    size_t done; /* pieces run, counted atomically */
} OpbNativePieces;

static void opb_native_piece(void *user_data, size_t i) {
    OpbNativePieces *p = (OpbNativePieces *)user_data;
    p->fn(p->user, i);
    __atomic_fetch_add(&p->done, 1, __ATOMIC_RELAXED);
}

static void opb_native_parallel_for(const opb_native_call *call, void (*fn)(void *, size_t), size_t n, void *user) {
    const OpbNativeHost *h = (const OpbNativeHost *)call->host;
    if (n > 1 && g_parallel_for != NULL) {
        OpbNativePieces pieces = {fn, user, 0};
        OrtStatus *st = g_parallel_for(h->ctx, opb_native_piece, n, 0, &pieces);
        if (st != NULL) API(ReleaseStatus, opb_Release_fn)(st);
        if (st == NULL && __atomic_load_n(&pieces.done, __ATOMIC_RELAXED) == n) return;
        if (__atomic_load_n(&pieces.done, __ATOMIC_RELAXED) != 0) {
            /* some pieces ran: running them again is not allowed, so this cannot be recovered here */
            snprintf(call->err, call->err_len, "%s: ONNX Runtime's thread pool ran %zu of %zu pieces", h->label,
                     __atomic_load_n(&pieces.done, __ATOMIC_RELAXED), n);
            return;
        }
    }
    for (size_t i = 0; i < n; i++) fn(user, i);
}

/* OPB_NATIVE_DONE, OPB_NATIVE_DECLINE, or OPB_NATIVE_ERROR with the message in err */
static int opb_run_native(OpbKernel *k, OrtKernelContext *ctx, char *err, size_t n) {
    size_t count = 0, n_out = 0;
    OrtStatus *st = API(KernelContext_GetInputCount, opb_KernelContext_GetCount_fn)(ctx, &count);
    if (st == NULL) st = API(KernelContext_GetOutputCount, opb_KernelContext_GetCount_fn)(ctx, &n_out);
    if (st != NULL) {
        opb_take_status(st, err, n);
        return OPB_NATIVE_ERROR;
    }
    if (count > OPB_NATIVE_MAX_INPUTS) return OPB_NATIVE_DECLINE;
    opb_native_tensor inputs[OPB_NATIVE_MAX_INPUTS];
    int64_t dims[OPB_NATIVE_MAX_INPUTS][8];
    for (size_t i = 0; i < count; i++) {
        int elem = 0;
        size_t rank = 0;
        void *data = NULL;
        memset(&inputs[i], 0, sizeof inputs[i]);
        inputs[i].dims = dims[i];
        const int got = opb_describe_input(ctx, i, 8, &data, &elem, &rank, dims[i], err, n);
        if (got == OPB_INPUT_ABSENT) continue;                /* an absent optional input */
        if (got == OPB_INPUT_RANK) return OPB_NATIVE_DECLINE; /* no native kernel takes such ranks */
        if (got != OPB_INPUT_OK) return OPB_NATIVE_ERROR;
        /* a caller's feed may start at any address: native kernels read whole elements (and vectors) */
        if ((uintptr_t)data % opb_elem_align(elem) != 0) return OPB_NATIVE_DECLINE;
        inputs[i].data = data;
        inputs[i].elem = elem;
        inputs[i].rank = (int32_t)rank;
    }
    OpbNativeHost host = {ctx, k->label};
    opb_native_call call = {count, inputs, n_out, opb_native_output, opb_native_parallel_for, k->threads, &host,
                            err, n};
    err[0] = '\0';
    int rc = k->native->compute(k->native, &call);
    if (rc == OPB_NATIVE_DONE && err[0] != '\0') return OPB_NATIVE_ERROR; /* the thread pool failed it */
    if (rc == OPB_NATIVE_ERROR && err[0] == '\0') snprintf(err, n, "%s: the native kernel failed", k->label);
    return rc == OPB_NATIVE_DONE || rc == OPB_NATIVE_ERROR ? rc : OPB_NATIVE_DECLINE;
}

/* The arrays the kernel got over ONNX Runtime's memory (its inputs, its out= arrays) are valid during
   the call only: ONNX Runtime reuses or frees that memory after it. A kernel that keeps one (in a
   list, a closure, an attribute; a view of it counts too, as it holds the array) would read freed
   memory later or write over a result already returned. Each such array is held by its tuple alone
   once the call's own references are dropped; one held elsewhere fails the run, naming it. */
/* gc.collect(0): the youngest generation only (errors cleared: the full collection follows where needed) */
static void opb_collect_young(void) {
    PyObject *gc = PyImport_ImportModule("gc");
    PyObject *r = gc != NULL ? PyObject_CallMethod(gc, "collect", "(i)", 0) : NULL;
    if (r == NULL) PyErr_Clear();
    Py_XDECREF(r);
    Py_XDECREF(gc);
}

/* Give a kept array (made by the bridge over ONNX Runtime's memory: no base, owning nothing) a copy of
   its data in its place, so that reading it later gives the values it had instead of reading freed
   memory. A view the kernel made of it has a data pointer of its own, which cannot be mended. */
static void opb_detach_kept(PyArrayObject *a) {
    if (PyArray_BASE(a) != NULL || !PyArray_IS_C_CONTIGUOUS(a)) return;
    PyObject *copy = PyArray_NewCopy(a, NPY_CORDER);
    if (copy == NULL) {
        PyErr_Clear();
        return;
    }
    char *data = PyArray_BYTES((PyArrayObject *)copy);
    if (PyArray_SetBaseObject(a, copy) < 0) { /* (steals the copy either way) */
        PyErr_Clear();
        return;
    }
    ((PyArrayObject_fields *)a)->data = data;
}

static OrtStatus *opb_check_kept(OpbKernel *k, PyObject *args, PyObject *outs, char *err, size_t n) {
    PyObject *groups[2] = {args, outs};
    const char *what[2] = {"input", "out= array"};
    int collected = 0, first_group = -1;
    Py_ssize_t first = -1;
    for (int gi = 0; gi < 2; gi++) {
        PyObject *tup = groups[gi];
        if (tup == NULL || !PyTuple_Check(tup)) continue;
        for (Py_ssize_t i = 0; i < PyTuple_GET_SIZE(tup); i++) {
            PyObject *a = PyTuple_GET_ITEM(tup, i);
            if (!PyArray_Check(a) || (PyArray_FLAGS((PyArrayObject *)a) & NPY_ARRAY_OWNDATA)) continue;
            if (Py_REFCNT(a) > 1 && !collected) {
                /* a reference cycle (a kept exception, a closure over the input) holds the kernel's
                   frame until the collector runs: collect once before judging. The youngest generation
                   first, where a cycle made during the call is (a full collection per call took 20-100 ms
                   with torch imported); all of them only where that leaves the array held */
                collected = 1;
                opb_collect_young();
                if (Py_REFCNT(a) > 1) PyGC_Collect();
            }
            if (Py_REFCNT(a) > 1) { /* every kept array is mended, the first is named */
                opb_detach_kept((PyArrayObject *)a);
                if (first_group < 0) {
                    first_group = gi;
                    first = i;
                }
            }
        }
    }
    if (first_group < 0) return NULL;
    snprintf(err, n,
             "%s: the kernel kept its %s %zd after returning; it views ONNX Runtime's memory, valid during the call "
             "only (reused after it): keep a copy instead (x.copy(), x.clone()). The kept array was given a copy of "
             "its values (a view made of it was not)",
             k->label, what[first_group], first);
    return opb_status(err);
}

static OrtStatus *opb_kernel_compute_v2(void *kernel, OrtKernelContext *ctx) {
    OpbKernel *k = (OpbKernel *)kernel;
    char err[2048];
    if (k == NULL || k->fn == NULL) return opb_status("opbridge: kernel was not created");
    if (k->native != NULL) {
        int rc = opb_run_native(k, ctx, err, sizeof err);
        if (rc == OPB_NATIVE_DONE) return NULL;
        if (rc == OPB_NATIVE_ERROR) return opb_status(err);
    }
    if (!Py_IsInitialized()) return opb_status("opbridge: the Python interpreter is not running");
    PyGILState_STATE g = PyGILState_Ensure();
    OrtStatus *result = NULL;
    PyObject *res = NULL;
    PyObject *outs = NULL, *kwargs = NULL;
    err[0] = '\0';
    PyObject *args = opb_inputs(k, ctx, err, sizeof err);
    if (args == NULL) {
        result = opb_status(err);
        goto done;
    }
    size_t n_out = 0;
    OrtStatus *st = API(KernelContext_GetOutputCount, opb_KernelContext_GetCount_fn)(ctx, &n_out);
    if (st != NULL) {
        opb_take_status(st, err, sizeof err);
        result = opb_status(err);
        goto done;
    }
    if (k->shapes != NULL && n_out > 0) {
        outs = opb_preallocate(k, ctx, args, n_out, err, sizeof err);
        if (outs == NULL) {
            result = opb_status(err);
            goto done;
        }
        if (outs == Py_None) {
            Py_CLEAR(outs);
        } else {
            kwargs = PyDict_New();
            PyObject *given = n_out == 1 ? PyTuple_GET_ITEM(outs, 0) : outs; /* one array, or a tuple */
            if (kwargs == NULL || PyDict_SetItemString(kwargs, "out", given) < 0) {
                opb_format_exception(err, sizeof err);
                result = opb_status(err);
                goto done;
            }
        }
    }
    res = PyObject_Call(k->fn, args, kwargs);
    if (res == NULL) {
        char exc[1536];
        /* Ctrl-C inside a kernel: the run fails (ONNX Runtime cannot carry the exception), and SIGINT is
           raised again for Python to deliver once the run has returned, so that it still interrupts.
           Only on the main thread, where Ctrl-C arrives: elsewhere a KeyboardInterrupt is the kernel's
           own exception, and the run's error carries it. */
        const int interrupted = PyErr_ExceptionMatches(PyExc_KeyboardInterrupt);
        int resignal = 0;
        if (interrupted) {
            /* With a SIGINT handler of the program's own, that handler ran already (and raised this), or
               the kernel raised the KeyboardInterrupt itself: raising SIGINT again would call the handler
               once more (a second Ctrl-C the user never pressed). run() raises the KeyboardInterrupt
               itself then (take_exit), as for sys.exit(). */
            PyObject *type = NULL, *value = NULL, *tb = NULL;
            PyErr_Fetch(&type, &value, &tb);
            const int on_main = opb_on_main_thread();
            resignal = on_main && opb_default_sigint();
            PyErr_Restore(type, value, tb);
            if (on_main && !resignal) opb_keep_exit(PyExc_KeyboardInterrupt);
        }
        /* sys.exit() inside a kernel (a SIGTERM handler's, say): the run fails, and run() raises the
           SystemExit itself once ONNX Runtime has returned (take_exit), as for Ctrl-C */
        if (PyErr_ExceptionMatches(PyExc_SystemExit)) opb_keep_exit(PyExc_SystemExit);
        /* another exception that is no Exception (a SIGTERM's opbridge Terminated, which unwinds the command):
           raised again by run() the same way */
        else if (!interrupted && !PyErr_ExceptionMatches(PyExc_Exception)) opb_keep_exit(PyExc_BaseException);
        const int checked = g_result_error != NULL && PyErr_ExceptionMatches(g_result_error);
        opb_format_exception(exc, sizeof exc);
        if (resignal) PyErr_SetInterrupt();
        if (checked) /* the kernel returned; its result failed a check whose message names the op */
            snprintf(err, sizeof err, "%s", exc);
        else
            snprintf(err, sizeof err, "%s: kernel raised %s", k->label, exc);
        result = opb_status(err);
        goto done;
    }
    if (PyList_Check(res)) {
        /* a list's items as a tuple: large outputs are copied without the GIL, while another thread
           may change the list */
        PyObject *items = PyList_AsTuple(res);
        Py_SETREF(res, items);
        if (res == NULL) {
            opb_format_exception(err, sizeof err);
            result = opb_status(err);
            goto done;
        }
    }
    if (PyTuple_Check(res)) {
        Py_ssize_t got = PyTuple_GET_SIZE(res);
        if ((size_t)got != n_out) {
            snprintf(err, sizeof err, "%s: the kernel returned %zd output(s), the node has %zu; return %s", k->label,
                     got, n_out, n_out == 1 ? "one array" : "a tuple with one array per output");
            result = opb_status(err);
            goto done;
        }
        if (outs && got > 1) { /* (a result in another output's buffer is copied before any is filled) */
            PyObject *detached = opb_detach_crossed(k, res, outs, err, sizeof err);
            if (detached == NULL) {
                result = opb_status(err);
                goto done;
            }
            Py_SETREF(res, detached);
        }
        for (Py_ssize_t i = 0; i < got; i++) {
            PyObject *item = PyTuple_GET_ITEM(res, i);
            int rc = outs ? opb_fill_preallocated(k, ctx, (size_t)i, item, PyTuple_GET_ITEM(outs, i), err, sizeof err)
                          : opb_output(k, ctx, (size_t)i, item, err, sizeof err);
            if (rc < 0) {
                result = opb_status(err);
                goto done;
            }
        }
    } else {
        if (n_out != 1 && res == Py_None) {
            snprintf(err, sizeof err, "%s: the kernel returned None, the node has %zu outputs; return a tuple with "
                     "one array per output (a kernel that writes out returns out)", k->label, n_out);
            result = opb_status(err);
            goto done;
        }
        if (n_out != 1) {
            snprintf(err, sizeof err, "%s: the kernel returned 1 output, the node has %zu; return a tuple with one "
                     "array per output", k->label, n_out);
            result = opb_status(err);
            goto done;
        }
        int rc = outs ? opb_fill_preallocated(k, ctx, 0, res, PyTuple_GET_ITEM(outs, 0), err, sizeof err)
                      : opb_output(k, ctx, 0, res, err, sizeof err);
        if (rc < 0) {
            result = opb_status(err);
            goto done;
        }
    }
done:
    Py_XDECREF(res);
    Py_XDECREF(kwargs);
    if (result == NULL) {
        result = opb_check_kept(k, args, outs, err, sizeof err);
    } else if (args != NULL) {
        /* a kernel that failed may have kept an array too: both are said */
        char kept[1024], both[sizeof err + sizeof kept + 8];
        OrtStatus *also = opb_check_kept(k, args, outs, kept, sizeof kept);
        if (also != NULL) {
            opb_take_status(also, kept, sizeof kept);
            opb_take_status(result, err, sizeof err);
            snprintf(both, sizeof both, "%s; and %s", err, kept);
            result = opb_status(both);
        }
    }
    Py_XDECREF(outs);
    Py_XDECREF(args);
    PyGILState_Release(g);
    return result;
}

static void opb_kernel_compute_v1(void *kernel, OrtKernelContext *ctx) {
    /* Only used if ONNX Runtime ignored KernelComputeV2; errors cannot be reported here. */
    OrtStatus *st = opb_kernel_compute_v2(kernel, ctx);
    if (st != NULL) API(ReleaseStatus, opb_Release_fn)(st);
}

/* ------------------------------------------------------------------ OpDescriptor (Python type) */

typedef struct {
    PyObject_HEAD OpbOpEntry *entry;
    OrtCustomOpDomain *domain; /* the domain registration made with this op first, which this descriptor owns */
} OpDescriptor;

static void OpDescriptor_dealloc(OpDescriptor *self) {
    OpbOpEntry *e = self->entry;
    /* The session options that received the domain are gone (Python keeps the descriptors as long as they
     * live), and sessions read a domain only when they are created; their kernels keep the ops. */
    if (self->domain != NULL && g_api != NULL) API(ReleaseCustomOpDomain, opb_Release_fn)(self->domain);
    self->domain = NULL;
    if (e != NULL) {
        Py_CLEAR(e->resolver);
        opb_entry_unref(e);
    }
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static int OpDescriptor_init(OpDescriptor *self, PyObject *args, PyObject *kwargs) {
    static char *kwlist[] = {"domain", "op_type", "n_inputs", "output_types", "resolver", NULL};
    const char *domain, *name;
    Py_ssize_t n_inputs;
    PyObject *types, *resolver;
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "ssnOO", kwlist, &domain, &name, &n_inputs, &types, &resolver))
        return -1;
    if (self->entry != NULL) {
        PyErr_SetString(PyExc_RuntimeError, "OpDescriptor is already initialised");
        return -1;
    }
    if (n_inputs < 0 || !PyCallable_Check(resolver)) {
        PyErr_SetString(PyExc_ValueError, "n_inputs must be >= 0 and resolver callable");
        return -1;
    }
    PyObject *seq = PySequence_Tuple(types); /* (a copy: reading an int can run Python code) */
    if (seq == NULL) return -1;
    Py_ssize_t n_out = PyTuple_GET_SIZE(seq);
    if (n_out < 1) {
        Py_DECREF(seq);
        PyErr_SetString(PyExc_ValueError, "an op needs at least one output");
        return -1;
    }
    OpbOpEntry *e = (OpbOpEntry *)calloc(1, sizeof(OpbOpEntry));
    if (e == NULL || (e->domain = strdup(domain)) == NULL || (e->name = strdup(name)) == NULL ||
        (e->output_types = (int *)calloc((size_t)n_out, sizeof(int))) == NULL) {
        if (e) {
            free(e->domain);
            free(e->name);
            free(e);
        }
        Py_DECREF(seq);
        PyErr_NoMemory();
        return -1;
    }
    for (Py_ssize_t i = 0; i < n_out; i++) {
        long t = PyLong_AsLong(PyTuple_GET_ITEM(seq, i));
        if (t == -1 && PyErr_Occurred()) {
            Py_DECREF(seq);
            free(e->domain);
            free(e->name);
            free(e->output_types);
            free(e);
            return -1;
        }
        e->output_types[i] = opb_elem_to_npy((int)t) >= 0 ? (int)t : OPB_ELEM_UNDEFINED;
    }
    Py_DECREF(seq);
    e->n_inputs = (size_t)n_inputs;
    e->n_outputs = (size_t)n_out;
    e->refs = 1;
    __atomic_add_fetch(&g_live_ops, 1, __ATOMIC_RELAXED);
    Py_INCREF(resolver);
    e->resolver = resolver;

    OpbCustomOp *op = &e->op;
    op->version = OPB_CUSTOM_OP_VERSION;
    op->CreateKernel = opb_create_kernel_v1;
    op->GetName = opb_get_name;
    op->GetExecutionProviderType = opb_get_provider;
    op->GetInputType = opb_get_input_type;
    op->GetInputTypeCount = opb_get_input_count;
    op->GetOutputType = opb_get_output_type;
    op->GetOutputTypeCount = opb_get_output_count;
    op->KernelCompute = opb_kernel_compute_v1;
    op->KernelDestroy = opb_kernel_destroy;
    op->GetInputCharacteristic = opb_get_io_characteristic;
    op->GetOutputCharacteristic = opb_get_io_characteristic;
    op->GetInputMemoryType = opb_get_mem_type;
    op->GetVariadicInputMinArity = opb_variadic_min_arity;
    op->GetVariadicInputHomogeneity = opb_variadic_homogeneity;
    op->GetVariadicOutputMinArity = opb_variadic_min_arity;
    op->GetVariadicOutputHomogeneity = opb_variadic_homogeneity;
    op->CreateKernelV2 = opb_create_kernel_v2;
    op->KernelComputeV2 = opb_kernel_compute_v2;
    self->entry = e;
    return 0;
}

static PyObject *OpDescriptor_release(OpDescriptor *self, PyObject *unused) {
    (void)unused;
    if (self->entry) Py_CLEAR(self->entry->resolver);
    Py_RETURN_NONE;
}

static PyObject *OpDescriptor_repr(OpDescriptor *self) {
    if (self->entry == NULL) return PyUnicode_FromString("<OpDescriptor (uninitialised)>");
    return PyUnicode_FromFormat("<OpDescriptor %s::%s inputs=%zd outputs=%zd%s>", self->entry->domain,
                                self->entry->name, (Py_ssize_t)self->entry->n_inputs,
                                (Py_ssize_t)self->entry->n_outputs, self->entry->registered ? " registered" : "");
}

static PyObject *OpDescriptor_get_registered(OpDescriptor *self, void *closure) {
    (void)closure;
    return PyBool_FromLong(self->entry != NULL && self->entry->registered);
}

static PyMethodDef OpDescriptor_methods[] = {
    {"release", (PyCFunction)OpDescriptor_release, METH_NOARGS,
     "Drop the resolver (call once the session is created; kernels keep their own references)."},
    {NULL, NULL, 0, NULL}};

static PyGetSetDef OpDescriptor_getset[] = {
    {"registered", (getter)OpDescriptor_get_registered, NULL, "Whether ONNX Runtime has received this op.", NULL},
    {NULL, NULL, NULL, NULL, NULL}};

static PyTypeObject OpDescriptorType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "opbridge.onnxruntime._bridge.OpDescriptor",
    .tp_basicsize = sizeof(OpDescriptor),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "OpDescriptor(domain, op_type, n_inputs, output_types, resolver): one custom op for one session.",
    .tp_new = PyType_GenericNew,
    .tp_init = (initproc)OpDescriptor_init,
    .tp_dealloc = (destructor)OpDescriptor_dealloc,
    .tp_repr = (reprfunc)OpDescriptor_repr,
    .tp_methods = OpDescriptor_methods,
    .tp_getset = OpDescriptor_getset,
};

/* ------------------------------------------------------------------ RegisterCustomOps */

static OrtStatus *opb_register(OrtSessionOptions *options, const OpbApiBase *base) {
    g_register_error[0] = '\0';
    if (base == NULL || base->GetApi == NULL) {
        snprintf(g_register_error, sizeof g_register_error, "ONNX Runtime passed no API base");
        return NULL; /* nothing to build a status with; Python reads g_register_error */
    }
    unsigned version = OPB_ORT_API_VERSION_PARALLEL;
    const void *const *api = (const void *const *)base->GetApi(version);
    if (api == NULL) { /* a runtime older than 1.17: no ParallelFor */
        version = OPB_ORT_API_VERSION;
        api = (const void *const *)base->GetApi(version);
    }
    if (api == NULL) {
        snprintf(g_register_error, sizeof g_register_error,
                 "this onnxruntime (%s) does not offer C API version %u; opbridge needs onnxruntime >= 1.16",
                 base->GetVersionString ? base->GetVersionString() : "?", OPB_ORT_API_VERSION);
        return NULL;
    }
    g_api = api;
    g_api_version = version;
    g_parallel_for = version >= OPB_ORT_API_VERSION_PARALLEL
                         ? API(KernelContext_ParallelFor, opb_KernelContext_ParallelFor_fn)
                         : NULL;
    if (opb_abi_selfcheck() < 0) {
        snprintf(g_register_error, sizeof g_register_error, "opbridge: ONNX Runtime C API self-check failed: %s",
                 g_selfcheck_msg);
        return opb_status(g_register_error);
    }
    if (g_pending == NULL || PyList_GET_SIZE(g_pending) == 0) {
        snprintf(g_register_error, sizeof g_register_error,
                 "opbridge: no ops staged; the bridge library is registered by opbridge.InferenceSession");
        return opb_status(g_register_error);
    }
    Py_ssize_t n = PyList_GET_SIZE(g_pending);
    /* One OrtCustomOpDomain per distinct domain, in staging order. */
    for (Py_ssize_t i = 0; i < n; i++) {
        OpbOpEntry *first = ((OpDescriptor *)PyList_GET_ITEM(g_pending, i))->entry;
        int seen = 0;
        for (Py_ssize_t j = 0; j < i && !seen; j++)
            seen = strcmp(((OpDescriptor *)PyList_GET_ITEM(g_pending, j))->entry->domain, first->domain) == 0;
        if (seen) continue;
        OrtCustomOpDomain *domain = NULL;
        OrtStatus *st = API(CreateCustomOpDomain, opb_CreateCustomOpDomain_fn)(first->domain, &domain);
        ((OpDescriptor *)PyList_GET_ITEM(g_pending, i))->domain = domain; /* released with the descriptor */
        for (Py_ssize_t j = i; st == NULL && j < n; j++) {
            OpbOpEntry *e = ((OpDescriptor *)PyList_GET_ITEM(g_pending, j))->entry;
            if (strcmp(e->domain, first->domain) != 0) continue;
            st = API(CustomOpDomain_Add, opb_CustomOpDomain_Add_fn)(domain, &e->op);
            if (st == NULL) e->registered = 1;
        }
        /* The session options keep a raw pointer to the domain from here on: it is released with its
         * descriptor, which Python keeps as long as the options live. */
        if (st == NULL) st = API(AddCustomOpDomain, opb_AddCustomOpDomain_fn)(options, domain);
        if (st != NULL) {
            char msg[512];
            opb_take_status(st, msg, sizeof msg);
            snprintf(g_register_error, sizeof g_register_error, "opbridge: registering domain '%s' failed: %s",
                     first->domain, msg);
            return opb_status(g_register_error);
        }
    }
    g_registrations++;
    return NULL;
}

OPB_EXPORT OrtStatus *RegisterCustomOps(OrtSessionOptions *options, const OpbApiBase *base) {
    if (!Py_IsInitialized()) return NULL;
    PyGILState_STATE g = PyGILState_Ensure();
    OrtStatus *st = opb_register(options, base);
    Py_CLEAR(g_pending);
    PyGILState_Release(g);
    return st;
}

/* ------------------------------------------------------------------ module functions */

static PyObject *py_set_pending(PyObject *self, PyObject *arg) {
    (void)self;
    if (!PyList_Check(arg)) {
        PyErr_SetString(PyExc_TypeError, "set_pending expects a list of OpDescriptor");
        return NULL;
    }
    Py_ssize_t n = PyList_GET_SIZE(arg);
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *item = PyList_GET_ITEM(arg, i);
        if (!PyObject_TypeCheck(item, &OpDescriptorType) || ((OpDescriptor *)item)->entry == NULL) {
            PyErr_SetString(PyExc_TypeError, "set_pending expects initialised OpDescriptor objects");
            return NULL;
        }
        if (((OpDescriptor *)item)->entry->registered) {
            PyErr_SetString(PyExc_ValueError, "an OpDescriptor can be registered only once; make a new one");
            return NULL;
        }
    }
    PyObject *copy = PyList_GetSlice(arg, 0, n);
    if (copy == NULL) return NULL;
    Py_XSETREF(g_pending, copy);
    g_register_error[0] = '\0';
    Py_RETURN_NONE;
}

static PyObject *py_clear_pending(PyObject *self, PyObject *unused) {
    (void)self;
    (void)unused;
    Py_CLEAR(g_pending);
    Py_RETURN_NONE;
}

static PyObject *py_take_exit(PyObject *self, PyObject *args) {
    (void)self;
    PyObject *thread = NULL;
    if (!PyArg_ParseTuple(args, "|O!:take_exit", &PyLong_Type, &thread)) return NULL;
    if (g_exits == NULL) Py_RETURN_NONE;
    PyObject *key = thread;
    if (key != NULL)
        Py_INCREF(key);
    else
        key = PyLong_FromUnsignedLong(PyThread_get_thread_ident());
    if (key == NULL) return NULL;
    PyObject *kept = PyDict_GetItemWithError(g_exits, key); /* borrowed */
    if (kept == NULL) {
        Py_DECREF(key);
        if (PyErr_Occurred()) return NULL;
        Py_RETURN_NONE;
    }
    Py_INCREF(kept);
    if (PyDict_DelItem(g_exits, key) < 0) PyErr_Clear();
    Py_DECREF(key);
    return kept;
}

static PyObject *py_registration_error(PyObject *self, PyObject *unused) {
    (void)self;
    (void)unused;
    if (g_register_error[0] == '\0') Py_RETURN_NONE;
    return PyUnicode_FromString(g_register_error);
}

static PyObject *py_abi_report(PyObject *self, PyObject *unused) {
    (void)self;
    (void)unused;
    return Py_BuildValue("{s:i,s:s,s:l,s:l,s:I,s:I,s:O,s:O,s:n,s:{s:l,s:l,s:l}}", "selfcheck", g_selfcheck_done,
                         "selfcheck_error", g_selfcheck_msg, "registrations", g_registrations, "live_ops",
                         __atomic_load_n(&g_live_ops, __ATOMIC_RELAXED), "api_version",
                         g_api_version, "custom_op_version", OPB_CUSTOM_OP_VERSION, "api_loaded",
                         g_api ? Py_True : Py_False, "parallel_copy", g_parallel_for ? Py_True : Py_False,
                         "large_copy", (Py_ssize_t)OPB_LARGE_COPY, "large_copies", "serial",
                         __atomic_load_n(&g_large_copies[0], __ATOMIC_RELAXED), "parallel",
                         __atomic_load_n(&g_large_copies[1], __ATOMIC_RELAXED), "stream",
                         __atomic_load_n(&g_large_copies[2], __ATOMIC_RELAXED));
}

static PyObject *py_set_copy_mode(PyObject *self, PyObject *arg) {
    (void)self;
    const char *name = PyUnicode_Check(arg) ? PyUnicode_AsUTF8(arg) : NULL;
    for (int i = 0; name != NULL && i < 4; i++) {
        if (strcmp(name, g_copy_mode_names[i]) == 0) {
            const char *previous = g_copy_mode_names[g_copy_mode];
            g_copy_mode = i;
            return PyUnicode_FromString(previous);
        }
    }
    PyErr_Clear();
    PyErr_SetString(PyExc_ValueError, "copy mode must be 'auto' (the default), 'serial', 'parallel' or 'stream'");
    return NULL;
}

static PyMethodDef module_methods[] = {
    {"set_pending", py_set_pending, METH_O, "Stage OpDescriptors for the next RegisterCustomOps call."},
    {"clear_pending", py_clear_pending, METH_NOARGS, "Drop staged OpDescriptors."},
    {"registration_error", py_registration_error, METH_NOARGS, "Why the last RegisterCustomOps failed, or None."},
    {"take_exit", py_take_exit, METH_VARARGS,
     "take_exit([thread]): the SystemExit a kernel raised on this thread (or on the thread of that ident: an "
     "inter-op thread of ONNX Runtime's parallel execution mode) in its last failed run, once; else None."},
    {"abi_report", py_abi_report, METH_NOARGS, "State of the C API self-check and registrations."},
    {"_set_copy_mode", py_set_copy_mode, METH_O,
     "_set_copy_mode(mode): how large results are copied into ONNX Runtime's outputs, for benchmarks: "
     "'auto' (the default), 'serial', 'parallel' or 'stream'. Returns the previous mode."},
    {NULL, NULL, 0, NULL}};

static struct PyModuleDef bridge_module = {
    PyModuleDef_HEAD_INIT, "_bridge",
    "opbridge's ONNX Runtime custom-op library and CPython extension (see opbridge.onnxruntime.bridge).", -1,
    module_methods};

PyMODINIT_FUNC PyInit__bridge(void) {
    import_array();
    if (PyType_Ready(&OpDescriptorType) < 0) return NULL;
    PyObject *m = PyModule_Create(&bridge_module);
    if (m == NULL) return NULL;
    Py_INCREF(&OpDescriptorType);
    if (PyModule_AddObject(m, "OpDescriptor", (PyObject *)&OpDescriptorType) < 0) {
        Py_DECREF(&OpDescriptorType);
        Py_DECREF(m);
        return NULL;
    }
    PyObject *errors = PyImport_ImportModule("opbridge.errors");
    g_result_error = errors ? PyObject_GetAttrString(errors, "KernelResultError") : NULL;
    Py_XDECREF(errors);
    if (g_result_error == NULL) {
        Py_DECREF(m);
        return NULL;
    }
    PyModule_AddStringConstant(m, "NODE_ATTRIBUTE", OPB_NODE_ATTR);
    PyModule_AddIntConstant(m, "API_VERSION", OPB_ORT_API_VERSION);
    return m;
}
