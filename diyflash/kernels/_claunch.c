/* A compiled Triton kernel launched by one C call: the kernel's parameters packed once, when a launch
 * is bound (_claunch.py), so that a call only writes its pointers (and, for run_with, its scalars) into
 * the packed block and calls cuLaunchKernel. Triton's own launcher parses every argument from Python
 * and asks the driver about every pointer on each launch. Compiled at first use with the system
 * compiler through Triton's build helper; libcuda is opened at run time, so no CUDA header or toolkit
 * is needed. */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <dlfcn.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#if PY_VERSION_HEX < 0x030B00A1
#define PACK_HALF _PyFloat_Pack2
#else
#define PACK_HALF PyFloat_Pack2
#endif

typedef int CUresult;
typedef void *CUfunction;
typedef void *CUstream;
typedef void *CUcontext;
typedef CUresult (*launch_fn)(CUfunction, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned,
                              CUstream, void **, void **);
typedef CUresult (*ctx_fn)(CUcontext *);
typedef CUresult (*error_fn)(CUresult, const char **);
/* cuTensorMapEncodeTiled and cuTensorMapReplaceAddress (CUDA 12): a host TMA descriptor ('T') is encoded once,
 * when a launch is made, and only its global address is replaced when a launch gets another tensor */
typedef struct { _Alignas(64) unsigned char bytes[128]; } TensorMap;
typedef CUresult (*encode_fn)(TensorMap *, int, uint32_t, void *, const uint64_t *, const uint64_t *,
                              const uint32_t *, const uint32_t *, int, int, int, int);
typedef CUresult (*replace_fn)(TensorMap *, void *);

static launch_fn cu_launch = NULL;
static ctx_fn cu_ctx_get_current = NULL;
static error_fn cu_error_string = NULL;
static encode_fn cu_map_encode = NULL;
static replace_fn cu_map_replace = NULL;

/* codes of a parameter's C type (one per scalar argument; pointers are 'p') */
static int code_size(char code) {
    switch (code) {
    case 'b': case 'B': return 1;
    case 'h': case 'H': case 'e': case 'E': return 2;
    case 'i': case 'I': case 'f': return 4;
    case 'q': case 'Q': case 'd': case 'p': return 8;
    default: return 0;
    }
}

typedef struct {
    PyObject_HEAD
    CUfunction function;
    unsigned grid[3];
    unsigned block;
    unsigned shared;
    Py_ssize_t nparams;   /* the kernel's parameters, the two scratch pointers included */
    Py_ssize_t npointers; /* leading open pointers */
    Py_ssize_t nargs;     /* scalars after them that run_with may replace */
    char *blob;           /* the packed parameters, each at an 8-byte aligned offset */
    char *bound;          /* the blob as make packed it: launch_with puts its scalars back after a launch */
    void **params;        /* nparams pointers into blob */
    Py_ssize_t *pointer_offsets; /* npointers offsets in blob, -1 where the kernel has no parameter */
    Py_ssize_t *arg_offsets;     /* nargs offsets, -1 likewise */
    char *arg_codes;             /* nargs codes */
    Py_ssize_t scratch_offset;   /* the global scratch pointer's offset */
    Py_ssize_t nmaps;            /* host TMA descriptors ('T'), each a 128-byte map followed by its shape and
                                  * strides as parameters (Triton's launcher passes the same) */
    TensorMap *maps;             /* 64-byte aligned, as the driver wants them */
    uint64_t *map_addresses;     /* the global address each map holds */
    Py_ssize_t *pointer_maps;    /* npointers: the map an open 'T' pointer writes, -1 for a plain pointer */
} Launch;

static void Launch_dealloc(Launch *self) {
    PyMem_Free(self->blob);
    PyMem_Free(self->bound);
    PyMem_Free(self->params);
    PyMem_Free(self->pointer_offsets);
    PyMem_Free(self->arg_offsets);
    PyMem_Free(self->arg_codes);
    free(self->maps);
    PyMem_Free(self->map_addresses);
    PyMem_Free(self->pointer_maps);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static int pointer_value(PyObject *obj, uint64_t *out);

static int pack(char code, PyObject *value, char *slot) {
    if (code == 'p') {
        uint64_t ptr;
        if (pointer_value(value, &ptr)) return -1;
        memcpy(slot, &ptr, 8);
        return 0;
    }
    if (code == 'e' || code == 'E' || code == 'f' || code == 'd') {
        double x = PyFloat_AsDouble(value);
        if (x == -1.0 && PyErr_Occurred()) return -1;
        if (code == 'd') { memcpy(slot, &x, 8); return 0; }
        if (code == 'e') { return PACK_HALF(x, (unsigned char *)slot, 1); }
        float f = (float)x;
        if (code == 'f') { memcpy(slot, &f, 4); return 0; }
        uint32_t u; memcpy(&u, &f, 4);
        uint16_t h = (uint16_t)(u >> 16); /* bf16 as Triton's launcher packs it: truncated */
        memcpy(slot, &h, 2);
        return 0;
    }
    if (code == 'B' || code == 'H' || code == 'I' || code == 'Q') {
        unsigned long long u = PyLong_AsUnsignedLongLongMask(value);
        if (u == (unsigned long long)-1 && PyErr_Occurred()) return -1;
        memcpy(slot, &u, code_size(code)); /* little-endian: the low bytes */
        return 0;
    }
    long long s = PyLong_AsLongLong(value);
    if (s == -1 && PyErr_Occurred()) return -1;
    memcpy(slot, &s, code_size(code));
    return 0;
}

static PyObject *data_ptr_name = NULL;
static PyObject *empty_tuple = NULL;

/* a pointer argument: an int, None (null) or an object with data_ptr() (a tensor) */
static int pointer_value(PyObject *obj, uint64_t *out) {
    if (obj == Py_None) { *out = 0; return 0; }
    if (PyLong_Check(obj)) {
        *out = PyLong_AsUnsignedLongLong(obj);
        return (*out == (uint64_t)-1 && PyErr_Occurred()) ? -1 : 0;
    }
    PyObject *ret = PyObject_CallMethodNoArgs(obj, data_ptr_name);
    if (ret == NULL) return -1;
    *out = PyLong_AsUnsignedLongLong(ret);
    Py_DECREF(ret);
    return (*out == (uint64_t)-1 && PyErr_Occurred()) ? -1 : 0;
}

static PyTypeObject LaunchType;

/* the global address of a host TMA descriptor (an object whose `base` is a tensor) */
static int descriptor_address(PyObject *desc, uint64_t *out) {
    PyObject *base = PyObject_GetAttrString(desc, "base");
    if (base == NULL) return -1;
    int r = pointer_value(base, out);
    Py_DECREF(base);
    return r;
}

static int int_items(PyObject *seq, const char *what, Py_ssize_t rank, long long *out) {
    PyObject *fast = PySequence_Fast(seq, what);
    if (fast == NULL) return -1;
    if (PySequence_Fast_GET_SIZE(fast) != rank) {
        PyErr_Format(PyExc_ValueError, "make: a tensor descriptor's %s has %zd entries, its block %zd", what,
                     PySequence_Fast_GET_SIZE(fast), rank);
        Py_DECREF(fast);
        return -1;
    }
    for (Py_ssize_t i = 0; i < rank; i++) {
        out[i] = PyLong_AsLongLong(PySequence_Fast_GET_ITEM(fast, i));
        if (out[i] == -1 && PyErr_Occurred()) { Py_DECREF(fast); return -1; }
    }
    Py_DECREF(fast);
    return 0;
}

/* A host TMA descriptor's map, as Triton's fill_tma_descriptor encodes it: spec = (swizzle, element size,
 * element type (the host enum), block shape, fill: 1 for NaN padding); desc has base, shape and strides
 * (elements, the last 1). Its shape and strides go to shape and strides (the parameters after the map). */
static int encode_map(TensorMap *map, PyObject *spec, PyObject *desc, uint64_t *address, long long *shape,
                      long long *strides, Py_ssize_t *rank_out) {
    int swizzle, elem_size, elem_type, fill;
    PyObject *block;
    if (!PyTuple_Check(spec) || !PyArg_ParseTuple(spec, "iiiOi", &swizzle, &elem_size, &elem_type, &block, &fill))
        return -1;
    Py_ssize_t rank = PySequence_Size(block);
    if (rank < 1 || rank > 5) {
        if (!PyErr_Occurred()) PyErr_Format(PyExc_ValueError, "make: a tensor descriptor of rank %zd", rank);
        return -1;
    }
    long long box[5];
    if (int_items(block, "block shape", rank, box) || descriptor_address(desc, address)) return -1;
    PyObject *shape_obj = PyObject_GetAttrString(desc, "shape");
    PyObject *strides_obj = shape_obj ? PyObject_GetAttrString(desc, "strides") : NULL;
    int bad = strides_obj == NULL || int_items(shape_obj, "shape", rank, shape)
              || int_items(strides_obj, "strides", rank, strides);
    Py_XDECREF(shape_obj);
    Py_XDECREF(strides_obj);
    if (bad) return -1;
    uint64_t dims[5], bytes[5];
    uint32_t boxes[5], element_strides[5] = {1, 1, 1, 1, 1};
    for (Py_ssize_t i = 0; i < rank; i++) {
        dims[rank - 1 - i] = (uint64_t)shape[i];
        boxes[rank - 1 - i] = (uint32_t)box[i];
    }
    for (Py_ssize_t i = 0; i + 1 < rank; i++) bytes[rank - 2 - i] = (uint64_t)elem_size * (uint64_t)strides[i];
    /* interleave none (0), L2 promotion 128 B (2), as Triton's launcher encodes them */
    CUresult err = cu_map_encode(map, elem_type, (uint32_t)rank, (void *)(uintptr_t)*address, dims, bytes, boxes,
                                 element_strides, 0, swizzle, 2, fill);
    if (err != 0) {
        PyErr_Format(PyExc_RuntimeError, "diyflash C launcher: cuTensorMapEncodeTiled failed with CUDA error %d", err);
        return -1;
    }
    *rank_out = rank;
    return 0;
}

/* a descriptor's shape or stride value in parameter slot p of the blob (size bytes of its 8) */
static void put_slot(Launch *L, Py_ssize_t p, const void *value, size_t size) {
    memcpy(L->blob + 8 * p, value, size);
    L->params[p] = L->blob + 8 * p;
}

/* make(function, grid, block, shared, codes, values, npointers, nargs[, specs]) -> Launch
 * codes: one char per parameter of the kernel in order ('x' for a constexpr, which has none; 'T' for a host
 * TMA descriptor, which is a 128-byte map and then its shape (i32) and strides (i64) as parameters);
 * values: as many Python values (pointers among them as ints or None, descriptors as objects with base,
 * shape and strides); the first npointers are the open pointers (a launch passes them), the nargs after
 * them the scalars run_with may replace (descriptors there stay as made); specs: one per 'T', in order
 * (encode_map). Two scratch pointers follow the parameters. */
static PyObject *make(PyObject *self, PyObject *args) {
    unsigned long long function;
    unsigned gx, gy, gz, block, shared;
    const char *codes;
    Py_ssize_t ncodes, npointers, nargs;
    PyObject *values, *specs = NULL;
    if (!PyArg_ParseTuple(args, "K(III)IIs#O!nn|O!", &function, &gx, &gy, &gz, &block, &shared, &codes, &ncodes,
                          &PyTuple_Type, &values, &npointers, &nargs, &PyTuple_Type, &specs))
        return NULL;
    if (specs == NULL) specs = empty_tuple;
    if (PyTuple_GET_SIZE(values) != ncodes || npointers + nargs > ncodes || npointers < 0 || nargs < 0) {
        PyErr_SetString(PyExc_ValueError, "make: codes, values, npointers and nargs disagree");
        return NULL;
    }
    Launch *L = PyObject_New(Launch, &LaunchType);
    if (L == NULL) return NULL;
    L->function = (CUfunction)(uintptr_t)function;
    L->grid[0] = gx; L->grid[1] = gy; L->grid[2] = gz;
    L->block = block; L->shared = shared;
    L->npointers = npointers; L->nargs = nargs;
    L->blob = NULL; L->bound = NULL; L->params = NULL; L->pointer_offsets = NULL; L->arg_offsets = NULL; L->arg_codes = NULL;
    L->nmaps = 0; L->maps = NULL; L->map_addresses = NULL; L->pointer_maps = NULL;
    Py_ssize_t nparams = 2;
    for (Py_ssize_t i = 0; i < ncodes; i++) {
        if (codes[i] == 'x') continue;
        if (codes[i] == 'T') {
            if (L->nmaps >= PyTuple_GET_SIZE(specs)) {
                PyErr_SetString(PyExc_ValueError, "make: fewer specs than tensor descriptors");
                Py_DECREF(L);
                return NULL;
            }
            Py_ssize_t rank = PyTuple_Check(PyTuple_GET_ITEM(specs, L->nmaps))
                ? PySequence_Size(PyTuple_GetItem(PyTuple_GET_ITEM(specs, L->nmaps), 3)) : -1;
            if (rank < 1 || rank > 5) {
                PyErr_Clear();
                PyErr_SetString(PyExc_ValueError, "make: a descriptor's spec needs a block shape of rank 1 to 5");
                Py_DECREF(L);
                return NULL;
            }
            nparams += 1 + 2 * rank;
            L->nmaps++;
            continue;
        }
        if (code_size(codes[i]) == 0) {
            PyErr_Format(PyExc_ValueError, "make: unknown parameter code %c", codes[i]);
            Py_DECREF(L);
            return NULL;
        }
        nparams++;
    }
    if (L->nmaps && (cu_map_encode == NULL || cu_map_replace == NULL)) {
        PyErr_SetString(PyExc_RuntimeError, "diyflash C launcher: no cuTensorMapEncodeTiled here (load() first)");
        Py_DECREF(L);
        return NULL;
    }
    L->nparams = nparams;
    L->blob = PyMem_Calloc(nparams, 8);
    L->params = PyMem_Calloc(nparams, sizeof(void *));
    L->pointer_offsets = PyMem_Calloc(npointers + 1, sizeof(Py_ssize_t));
    L->pointer_maps = PyMem_Calloc(npointers + 1, sizeof(Py_ssize_t));
    L->arg_offsets = PyMem_Calloc(nargs + 1, sizeof(Py_ssize_t));
    L->arg_codes = PyMem_Calloc(nargs + 1, 1);
    L->map_addresses = PyMem_Calloc(L->nmaps + 1, sizeof(uint64_t));
    if (L->nmaps && posix_memalign((void **)&L->maps, 64, L->nmaps * sizeof(TensorMap)) != 0) L->maps = NULL;
    if (!L->blob || !L->params || !L->pointer_offsets || !L->pointer_maps || !L->arg_offsets || !L->arg_codes
            || !L->map_addresses || (L->nmaps && !L->maps)) {
        Py_DECREF(L);
        return PyErr_NoMemory();
    }
    Py_ssize_t p = 0, m = 0;
    for (Py_ssize_t i = 0; i < ncodes; i++) {
        char code = codes[i];
        Py_ssize_t offset = code == 'x' || code == 'T' ? -1 : 8 * p;
        if (i < npointers) { L->pointer_offsets[i] = offset; L->pointer_maps[i] = code == 'T' ? m : -1; }
        else if (i < npointers + nargs) { L->arg_offsets[i - npointers] = offset; L->arg_codes[i - npointers] = code; }
        if (code == 'x') continue;
        if (code == 'T') {
            long long shape[5], strides[5];
            Py_ssize_t rank;
            if (encode_map(&L->maps[m], PyTuple_GET_ITEM(specs, m), PyTuple_GET_ITEM(values, i), &L->map_addresses[m],
                           shape, strides, &rank)) {
                Py_DECREF(L);
                return NULL;
            }
            L->params[p++] = &L->maps[m++];
            for (Py_ssize_t d = 0; d < rank; d++) {
                int32_t x = (int32_t)shape[d];
                put_slot(L, p++, &x, 4);
            }
            for (Py_ssize_t d = 0; d < rank; d++) {
                int64_t x = (int64_t)strides[d];
                put_slot(L, p++, &x, 8);
            }
            continue;
        }
        if (pack(code, PyTuple_GET_ITEM(values, i), L->blob + offset)) { Py_DECREF(L); return NULL; }
        L->params[p] = L->blob + offset;
        p++;
    }
    L->scratch_offset = 8 * p;
    L->params[p] = L->blob + 8 * p;         /* global scratch */
    L->params[p + 1] = L->blob + 8 * (p + 1); /* profile scratch: 0 (launches with one are not made) */
    L->bound = PyMem_Malloc(8 * nparams);
    if (L->bound == NULL) { Py_DECREF(L); return PyErr_NoMemory(); }
    memcpy(L->bound, L->blob, 8 * nparams);
    return (PyObject *)L;
}

/* pointer i of a launch at this address: a plain pointer's slot, or a host TMA descriptor's map (of the launch's
 * shape: only its address may differ, and is replaced where it does) */
static int put_pointer(Launch *L, Py_ssize_t i, uint64_t address) {
    Py_ssize_t map = L->pointer_maps[i];
    if (map >= 0) {
        if (address != L->map_addresses[map]) {
            CUresult err = cu_map_replace(&L->maps[map], (void *)(uintptr_t)address);
            if (err != 0) {
                PyErr_Format(PyExc_RuntimeError, "diyflash C launcher: cuTensorMapReplaceAddress failed with CUDA error %d",
                             err);
                return -1;
            }
            L->map_addresses[map] = address;
        }
        return 0;
    }
    Py_ssize_t offset = L->pointer_offsets[i];
    if (offset >= 0) memcpy(L->blob + offset, &address, 8);
    return 0;
}

static int write_pointers(Launch *L, PyObject *const *pointers, Py_ssize_t n) {
    if (n != L->npointers) {
        PyErr_Format(PyExc_TypeError, "launch: %zd pointers given, the launch takes %zd", n, L->npointers);
        return -1;
    }
    for (Py_ssize_t i = 0; i < n; i++) {
        uint64_t address;
        if (L->pointer_maps[i] >= 0) {
            if (descriptor_address(pointers[i], &address)) return -1;
        } else if (L->pointer_offsets[i] < 0) {
            continue; /* no parameter (a constexpr) */
        } else if (pointer_value(pointers[i], &address)) {
            return -1;
        }
        if (put_pointer(L, i, address)) return -1;
    }
    return 0;
}

static int write_scratch(Launch *L, PyObject *scratch) {
    uint64_t ptr;
    if (pointer_value(scratch, &ptr)) return -1;
    memcpy(L->blob + L->scratch_offset, &ptr, 8);
    return 0;
}

/* 1: launched; 0: no current CUDA context on this thread (nothing launched: the caller goes through
 * Triton's launcher, which makes one current); -1: an error is set */
static int fire_on(Launch *L, uint64_t stream) {
    if (L->grid[0] == 0 || L->grid[1] == 0 || L->grid[2] == 0) return 1; /* an empty grid launches nothing */
    if (cu_launch == NULL) {
        PyErr_SetString(PyExc_RuntimeError, "diyflash C launcher: libcuda not loaded (load() first)");
        return -1;
    }
    CUcontext ctx = NULL;
    if (cu_ctx_get_current(&ctx) != 0 || ctx == NULL) return 0;
    /* The GIL stays held: the parameters live in the Launch, which another thread launching the same plan
     * would rewrite while the driver reads them. cuLaunchKernel returns in microseconds (it blocks only on
     * a full launch queue, which the GPU drains). */
    CUresult err = cu_launch(L->function, L->grid[0], L->grid[1], L->grid[2], L->block, 1, 1, L->shared,
                             (CUstream)(uintptr_t)stream, L->params, NULL);
    if (err != 0) {
        const char *text = NULL;
        if (cu_error_string == NULL || cu_error_string(err, &text) != 0 || text == NULL) text = "unknown error";
        PyErr_Format(PyExc_RuntimeError, "diyflash C launcher: cuLaunchKernel failed with CUDA error %d (%s)", err,
                     text);
        return -1;
    }
    return 1;
}

/* fire with these scalars after the pointers (a tuple of L->nargs), then the bound ones back: a plain launch
 * runs with them */
static int fire_with(Launch *L, uint64_t stream, PyObject *values) {
    int fired = -1;
    Py_ssize_t i = 0;
    for (; i < L->nargs; i++) {
        Py_ssize_t offset = L->arg_offsets[i];
        if (offset >= 0 && pack(L->arg_codes[i], PyTuple_GET_ITEM(values, i), L->blob + offset)) break;
    }
    if (i == L->nargs) fired = fire_on(L, stream);
    for (Py_ssize_t j = 0; j < L->nargs; j++) {
        Py_ssize_t offset = L->arg_offsets[j];
        if (offset >= 0) memcpy(L->blob + offset, L->bound + offset, 8);
    }
    return fired;
}

static int fire(Launch *L, PyObject *stream_obj) {
    uint64_t stream;
    if (pointer_value(stream_obj, &stream)) return -1;
    return fire_on(L, stream);
}

/* For C callers (diyflash's C++ plans, _cplan.cpp), through the capsule diyflash_claunch._C_API; the GIL held.
 * launch_raw: a Launch with its open pointers as addresses (a descriptor's: its tensor's) and the global
 * scratch's, as launch() fires it (1, 0 or -1 with an error set), and with `values` (a tuple of its nargs
 * scalars, or NULL: the bound ones) as launch_with() does; context: whether a CUDA context is current. */
static int launch_raw(PyObject *obj, uint64_t stream, uint64_t scratch, const uint64_t *pointers, Py_ssize_t n,
                      PyObject *values) {
    if (Py_TYPE(obj) != &LaunchType) {
        PyErr_SetString(PyExc_TypeError, "launch_raw: not a Launch");
        return -1;
    }
    Launch *L = (Launch *)obj;
    if (n != L->npointers) {
        PyErr_Format(PyExc_TypeError, "launch_raw: %zd pointers given, the launch takes %zd", n, L->npointers);
        return -1;
    }
    if (values != NULL && (!PyTuple_Check(values) || PyTuple_GET_SIZE(values) != L->nargs)) {
        PyErr_Format(PyExc_TypeError, "launch_raw: the values are not a tuple of the launch's %zd", L->nargs);
        return -1;
    }
    for (Py_ssize_t i = 0; i < n; i++)
        if (put_pointer(L, i, pointers[i])) return -1;
    memcpy(L->blob + L->scratch_offset, &scratch, 8);
    return values == NULL ? fire_on(L, stream) : fire_with(L, stream, values);
}

static int context_current(void) {
    CUcontext ctx = NULL;
    return cu_ctx_get_current != NULL && cu_ctx_get_current(&ctx) == 0 && ctx != NULL;
}

typedef struct {
    int version; /* 2 */
    int (*launch_raw)(PyObject *, uint64_t, uint64_t, const uint64_t *, Py_ssize_t, PyObject *);
    int (*context_current)(void);
} ClaunchAPI;
static ClaunchAPI c_api = {2, launch_raw, context_current};

/* launch(L, stream, scratch, *pointers) -> True (launched) or False (no current context: nothing ran) */
static PyObject *launch(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs < 3 || Py_TYPE(args[0]) != &LaunchType) {
        PyErr_SetString(PyExc_TypeError, "launch(L, stream, scratch, *pointers)");
        return NULL;
    }
    Launch *L = (Launch *)args[0];
    if (write_pointers(L, args + 3, nargs - 3) || write_scratch(L, args[2])) return NULL;
    int fired = fire(L, args[1]);
    if (fired < 0) return NULL;
    return PyBool_FromLong(fired);
}

/* launch_with(L, stream, scratch, pointers, values): launch with other scalars after the pointers */
static PyObject *launch_with(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 5 || Py_TYPE(args[0]) != &LaunchType || !PyTuple_Check(args[3]) || !PyTuple_Check(args[4])) {
        PyErr_SetString(PyExc_TypeError, "launch_with(L, stream, scratch, pointers: tuple, values: tuple)");
        return NULL;
    }
    Launch *L = (Launch *)args[0];
    PyObject *values = args[4];
    if (PyTuple_GET_SIZE(values) != L->nargs) {
        PyErr_Format(PyExc_TypeError, "launch_with: %zd values given, the launch takes %zd",
                     PyTuple_GET_SIZE(values), L->nargs);
        return NULL;
    }
    if (write_pointers(L, &PyTuple_GET_ITEM(args[3], 0), PyTuple_GET_SIZE(args[3])) || write_scratch(L, args[2]))
        return NULL;
    uint64_t stream;
    if (pointer_value(args[1], &stream)) return NULL;
    int fired = fire_with(L, stream, values);
    if (fired < 0) return NULL;
    return PyBool_FromLong(fired);
}

/* launch_seq(stream, scratch, values, L1, at1, s1, L2, at2, s2, ...) -> how many launched, in order: a plan's
 * launches in one C call. Launch i takes its pointers from the tuple `values` at the indices of the tuple
 * at_i (ints), and the global scratch where s_i is true (None elsewhere). Stops where no CUDA context is
 * current (returning the count so far: the caller launches the rest through Triton's launcher) */
#define MAX_SEQ_POINTERS 64
static PyObject *launch_seq(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs < 3 || (nargs - 3) % 3 != 0 || !PyTuple_Check(args[2])) {
        PyErr_SetString(PyExc_TypeError, "launch_seq(stream, scratch, values: tuple, L, at: tuple, scratch?: bool, ...)");
        return NULL;
    }
    PyObject *values = args[2];
    Py_ssize_t nvalues = PyTuple_GET_SIZE(values), n = (nargs - 3) / 3;
    PyObject *pointers[MAX_SEQ_POINTERS];
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *at = args[4 + 3 * i];
        if (Py_TYPE(args[3 + 3 * i]) != &LaunchType || !PyTuple_Check(at)) {
            PyErr_Format(PyExc_TypeError, "launch_seq: launch %zd is not (Launch, tuple of indices, bool)", i);
            return NULL;
        }
        Launch *L = (Launch *)args[3 + 3 * i];
        Py_ssize_t np = PyTuple_GET_SIZE(at);
        if (np > MAX_SEQ_POINTERS) {
            PyErr_Format(PyExc_ValueError, "launch_seq: launch %zd has %zd pointers (at most %d)", i, np,
                         MAX_SEQ_POINTERS);
            return NULL;
        }
        for (Py_ssize_t j = 0; j < np; j++) {
            Py_ssize_t k = PyLong_AsSsize_t(PyTuple_GET_ITEM(at, j));
            if (k == -1 && PyErr_Occurred()) return NULL;
            if (k < 0 || k >= nvalues) {
                PyErr_Format(PyExc_IndexError, "launch_seq: launch %zd reads value %zd of %zd", i, k, nvalues);
                return NULL;
            }
            pointers[j] = PyTuple_GET_ITEM(values, k);
        }
        int use_scratch = PyObject_IsTrue(args[5 + 3 * i]);
        if (use_scratch < 0) return NULL;
        if (write_pointers(L, pointers, np) || write_scratch(L, use_scratch ? args[1] : Py_None)) return NULL;
        int fired = fire(L, args[0]);
        if (fired < 0) return NULL;
        if (fired == 0) return PyLong_FromSsize_t(i);
    }
    return PyLong_FromSsize_t(n);
}

/* packed(L) -> the parameters as the kernel receives them (bytes, 8 per parameter): for tests */
static PyObject *packed(PyObject *self, PyObject *arg) {
    if (Py_TYPE(arg) != &LaunchType) {
        PyErr_SetString(PyExc_TypeError, "packed(L)");
        return NULL;
    }
    Launch *L = (Launch *)arg;
    return PyBytes_FromStringAndSize(L->blob, 8 * L->nparams);
}

/* tma() -> whether launches may take host TMA descriptors ('T': libcuda has the tensor-map entry points) */
static PyObject *tma(PyObject *self, PyObject *unused) {
    return PyBool_FromLong(cu_map_encode != NULL && cu_map_replace != NULL);
}

/* load() -> whether libcuda and its three entry points were found */
static PyObject *load(PyObject *self, PyObject *unused) {
    if (cu_launch != NULL) Py_RETURN_TRUE;
    void *lib = dlopen("libcuda.so.1", RTLD_LAZY | RTLD_LOCAL);
    if (lib == NULL) Py_RETURN_FALSE;
    launch_fn l = (launch_fn)dlsym(lib, "cuLaunchKernel");
    ctx_fn c = (ctx_fn)dlsym(lib, "cuCtxGetCurrent");
    cu_error_string = (error_fn)dlsym(lib, "cuGetErrorString");
    cu_map_encode = (encode_fn)dlsym(lib, "cuTensorMapEncodeTiled"); /* optional: 'T' codes need them */
    cu_map_replace = (replace_fn)dlsym(lib, "cuTensorMapReplaceAddress");
    if (l == NULL || c == NULL) Py_RETURN_FALSE;
    cu_ctx_get_current = c;
    cu_launch = l;
    Py_RETURN_TRUE;
}

static PyTypeObject LaunchType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "diyflash_claunch.Launch",
    .tp_basicsize = sizeof(Launch),
    .tp_dealloc = (destructor)Launch_dealloc,
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "A kernel launch with its parameters packed (make)",
};

static PyMethodDef methods[] = {
    {"make", make, METH_VARARGS,
     "make(function, grid, block, shared, codes, values, npointers, nargs[, specs]) -> Launch"},
    {"launch", (PyCFunction)(void (*)(void))launch, METH_FASTCALL, "launch(L, stream, scratch, *pointers) -> bool"},
    {"launch_with", (PyCFunction)(void (*)(void))launch_with, METH_FASTCALL,
     "launch_with(L, stream, scratch, pointers, values) -> bool"},
    {"launch_seq", (PyCFunction)(void (*)(void))launch_seq, METH_FASTCALL,
     "launch_seq(stream, scratch, values, L, at, scratch?, ...) -> int: launched"},
    {"packed", packed, METH_O, "packed(L) -> bytes"},
    {"load", load, METH_NOARGS, "load() -> bool: libcuda found"},
    {"tma", tma, METH_NOARGS, "tma() -> bool: host TMA descriptors can be launched"},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "diyflash_claunch", NULL, -1, methods};

PyMODINIT_FUNC PyInit_diyflash_claunch(void) {
    if (PyType_Ready(&LaunchType) < 0) return NULL;
    data_ptr_name = PyUnicode_InternFromString("data_ptr");
    empty_tuple = PyTuple_New(0);
    if (data_ptr_name == NULL || empty_tuple == NULL) return NULL;
    PyObject *m = PyModule_Create(&module);
    if (m == NULL) return NULL;
    PyObject *capsule = PyCapsule_New(&c_api, "diyflash_claunch._C_API", NULL);
    if (capsule == NULL || PyModule_AddObject(m, "_C_API", capsule) < 0) {
        Py_XDECREF(capsule);
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
