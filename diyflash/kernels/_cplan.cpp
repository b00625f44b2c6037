/* A launch plan replayed by one C++ call: its outputs and buffers allocated through ATen and its launches
 * fired through the C launcher (_claunch.c), with no Python run between them. A replay from Python allocates
 * each tensor through torch's argument parser (~4-8 us each on an H200 host) and builds the launches'
 * pointer tuples; here a call costs the allocations and the driver calls. Compiled at first use with the
 * system C++ compiler against torch's headers (_cplan.py); no CUDA header or toolkit: the launches go
 * through _claunch's C entry points (its capsule), the stream comes from the caller. */
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <ATen/ATen.h>
#include <torch/csrc/Dtype.h>
#include <torch/csrc/Exceptions.h>
#include <torch/csrc/autograd/python_variable.h>

#include <algorithm>
#include <cstdint>
#include <vector>

namespace {

struct ClaunchAPI {
    int version;
    int (*launch_raw)(PyObject *, uint64_t, uint64_t, const uint64_t *, Py_ssize_t, PyObject *);
    int (*context_current)();
};
const ClaunchAPI *api = nullptr;

constexpr long long NULL_VALUE = -(1LL << 40); /* a value that is a null pointer */

struct Alloc {
    int kind;                    /* 0: empty_like(inputs[of]); 1: fp32 rows of inputs[of] (its shape but the last); 2: explicit */
    Py_ssize_t of;
    std::vector<int64_t> shape;  /* kind 2, on inputs[0]'s device */
    at::ScalarType dtype = at::kFloat;
};

struct Launch {
    PyObject *launch = nullptr;  /* a _claunch Launch (a reference held) */
    PyObject *values = nullptr;  /* its scalars after the pointers (a tuple, a reference held), or NULL: the bound ones */
    std::vector<long long> at;   /* its pointers: values by index (>= 0 an input, < 0 allocation -1-v, NULL_VALUE null) */
    bool scratch;
};

struct Program {
    Py_ssize_t ninputs;
    std::vector<Alloc> allocs;
    std::vector<Launch> launches;
    std::vector<Py_ssize_t> returned; /* allocations returned, in order */
    int64_t need, align;              /* the global scratch: bytes of the largest launch, its alignment */
    Py_ssize_t max_pointers;
    ~Program() { /* (the GIL held: a capsule's destructor, or make's error paths) */
        for (auto &l : launches) {
            Py_XDECREF(l.launch);
            Py_XDECREF(l.values);
        }
    }
};

const char *CAPSULE = "diyflash_cplan.Program";

void program_free(PyObject *capsule) {
    auto *p = static_cast<Program *>(PyCapsule_GetPointer(capsule, CAPSULE));
    delete p;
}

bool as_int(PyObject *obj, long long *out) {
    *out = PyLong_AsLongLong(obj);
    return !(*out == -1 && PyErr_Occurred());
}

/* make(ninputs, allocs, launches, returned, need, align) -> Program
 * allocs: ((0, i) | (1, i) | (2, shape, dtype), ...); launches: ((Launch, at, scratch?[, values]), ...) with `at` a
 * tuple of ints (>= 0: input i; < 0: allocation -1-v) or None (a null pointer), and values the scalars the launch
 * takes after its pointers instead of its bound ones; returned: allocation indices. */
PyObject *make(PyObject *, PyObject *args) {
    Py_ssize_t ninputs;
    PyObject *allocs, *launches, *returned;
    long long need, align;
    if (!PyArg_ParseTuple(args, "nO!O!O!LL", &ninputs, &PyTuple_Type, &allocs, &PyTuple_Type, &launches,
                          &PyTuple_Type, &returned, &need, &align))
        return nullptr;
    if (api == nullptr) {
        PyErr_SetString(PyExc_RuntimeError, "diyflash_cplan: bind() the C launcher first");
        return nullptr;
    }
    if (ninputs < 1 || need < 0 || align < 1) {
        PyErr_SetString(PyExc_ValueError, "make: needs an input, need >= 0 and align >= 1");
        return nullptr;
    }
    auto p = std::make_unique<Program>();
    p->ninputs = ninputs;
    p->need = need;
    p->align = align;
    p->max_pointers = 0;
    Py_ssize_t nallocs = PyTuple_GET_SIZE(allocs);
    for (Py_ssize_t i = 0; i < nallocs; i++) {
        PyObject *spec = PyTuple_GET_ITEM(allocs, i);
        long long kind, of = 0;
        if (!PyTuple_Check(spec) || PyTuple_GET_SIZE(spec) < 2 || !as_int(PyTuple_GET_ITEM(spec, 0), &kind)) {
            PyErr_Format(PyExc_TypeError, "make: allocation %zd is not (kind, ...)", i);
            return nullptr;
        }
        Alloc a;
        a.kind = static_cast<int>(kind);
        if (kind == 0 || kind == 1) {
            if (!as_int(PyTuple_GET_ITEM(spec, 1), &of)) return nullptr;
            if (of < 0 || of >= ninputs) {
                PyErr_Format(PyExc_IndexError, "make: allocation %zd is shaped by input %lld of %zd", i, of, ninputs);
                return nullptr;
            }
            a.of = static_cast<Py_ssize_t>(of);
        } else if (kind == 2 && PyTuple_GET_SIZE(spec) == 3 && PyTuple_Check(PyTuple_GET_ITEM(spec, 1))
                   && THPDtype_Check(PyTuple_GET_ITEM(spec, 2))) {
            PyObject *shape = PyTuple_GET_ITEM(spec, 1);
            for (Py_ssize_t d = 0; d < PyTuple_GET_SIZE(shape); d++) {
                long long n;
                if (!as_int(PyTuple_GET_ITEM(shape, d), &n)) return nullptr;
                a.shape.push_back(n);
            }
            a.dtype = reinterpret_cast<THPDtype *>(PyTuple_GET_ITEM(spec, 2))->scalar_type;
            a.of = 0;
        } else {
            PyErr_Format(PyExc_TypeError, "make: allocation %zd is not (0, i), (1, i) or (2, shape, dtype)", i);
            return nullptr;
        }
        p->allocs.push_back(std::move(a));
    }
    for (Py_ssize_t i = 0; i < PyTuple_GET_SIZE(returned); i++) {
        long long r;
        if (!as_int(PyTuple_GET_ITEM(returned, i), &r)) return nullptr;
        if (r < 0 || r >= nallocs) {
            PyErr_Format(PyExc_IndexError, "make: returns allocation %lld of %zd", r, nallocs);
            return nullptr;
        }
        p->returned.push_back(static_cast<Py_ssize_t>(r));
    }
    for (Py_ssize_t i = 0; i < PyTuple_GET_SIZE(launches); i++) {
        PyObject *spec = PyTuple_GET_ITEM(launches, i);
        Py_ssize_t size = PyTuple_Check(spec) ? PyTuple_GET_SIZE(spec) : 0;
        if ((size != 3 && size != 4) || !PyTuple_Check(PyTuple_GET_ITEM(spec, 1))
            || (size == 4 && !PyTuple_Check(PyTuple_GET_ITEM(spec, 3)))) {
            PyErr_Format(PyExc_TypeError, "make: launch %zd is not (Launch, at: tuple, scratch?: bool[, values: tuple])",
                         i);
            return nullptr;
        }
        Launch l;
        PyObject *at = PyTuple_GET_ITEM(spec, 1);
        for (Py_ssize_t j = 0; j < PyTuple_GET_SIZE(at); j++) {
            PyObject *v = PyTuple_GET_ITEM(at, j);
            long long index = NULL_VALUE;
            if (v != Py_None && !as_int(v, &index)) return nullptr;
            if (v != Py_None && (index >= ninputs || index < -nallocs)) {
                PyErr_Format(PyExc_IndexError, "make: launch %zd reads value %lld (%zd inputs, %zd allocations)", i,
                             index, ninputs, nallocs);
                return nullptr;
            }
            l.at.push_back(index);
        }
        int scratch = PyObject_IsTrue(PyTuple_GET_ITEM(spec, 2));
        if (scratch < 0) return nullptr;
        l.scratch = scratch != 0;
        l.launch = PyTuple_GET_ITEM(spec, 0);
        Py_INCREF(l.launch);
        l.values = size == 4 ? PyTuple_GET_ITEM(spec, 3) : nullptr;
        Py_XINCREF(l.values);
        p->max_pointers = std::max(p->max_pointers, static_cast<Py_ssize_t>(l.at.size()));
        p->launches.push_back(std::move(l));
    }
    PyObject *capsule = PyCapsule_New(p.get(), CAPSULE, program_free);
    if (capsule != nullptr) p.release();
    return capsule;
}

/* run(program, stream, inputs: tuple of tensors) -> the returned allocations (a tuple), or None where nothing
 * ran: no CUDA context current on this thread, or an allocation not 16-byte aligned (the plans assume it) */
PyObject *run(PyObject *, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 3 || !PyTuple_Check(args[2])) {
        PyErr_SetString(PyExc_TypeError, "run(program, stream, inputs: tuple)");
        return nullptr;
    }
    auto *p = static_cast<Program *>(PyCapsule_GetPointer(args[0], CAPSULE));
    if (p == nullptr) return nullptr;
    unsigned long long stream = PyLong_AsUnsignedLongLong(args[1]);
    if (stream == static_cast<unsigned long long>(-1) && PyErr_Occurred()) return nullptr;
    PyObject *inputs = args[2];
    if (PyTuple_GET_SIZE(inputs) != p->ninputs) {
        PyErr_Format(PyExc_TypeError, "run: %zd inputs given, the program takes %zd", PyTuple_GET_SIZE(inputs),
                     p->ninputs);
        return nullptr;
    }
    if (!api->context_current()) Py_RETURN_NONE;
    HANDLE_TH_ERRORS /* an allocation's error as torch raises it (torch.OutOfMemoryError, ...) */
        std::vector<at::Tensor> in;
        in.reserve(p->ninputs);
        for (Py_ssize_t i = 0; i < p->ninputs; i++) {
            PyObject *t = PyTuple_GET_ITEM(inputs, i);
            if (!THPVariable_Check(t)) {
                PyErr_Format(PyExc_TypeError, "run: input %zd is not a tensor", i);
                return nullptr;
            }
            in.push_back(THPVariable_Unpack(t));
        }
        std::vector<at::Tensor> made;
        made.reserve(p->allocs.size());
        for (const auto &a : p->allocs) {
            const at::Tensor &of = in[a.of];
            at::Tensor t;
            if (a.kind == 0) {
                t = at::empty_like(of);
            } else if (a.kind == 1) {
                t = at::empty(of.sizes().slice(0, of.dim() - 1), of.options().dtype(at::kFloat));
            } else {
                t = at::empty(a.shape, of.options().dtype(a.dtype));
            }
            if (reinterpret_cast<uintptr_t>(t.data_ptr()) % 16 != 0) Py_RETURN_NONE;
            made.push_back(std::move(t));
        }
        at::Tensor scratch_buffer;
        uint64_t scratch = 0;
        if (p->need > 0) { /* (as the allocator Triton is given: torch's, on the stream's device) */
            scratch_buffer = at::empty({p->need + p->align}, in[0].options().dtype(at::kByte));
            uint64_t base = reinterpret_cast<uintptr_t>(scratch_buffer.data_ptr());
            scratch = (base + p->align - 1) / p->align * p->align;
        }
        std::vector<uint64_t> pointers(p->max_pointers);
        for (const auto &l : p->launches) {
            for (size_t j = 0; j < l.at.size(); j++) {
                long long v = l.at[j];
                pointers[j] = v == NULL_VALUE ? 0
                            : reinterpret_cast<uintptr_t>(v >= 0 ? in[v].data_ptr() : made[-1 - v].data_ptr());
            }
            int fired = api->launch_raw(l.launch, stream, l.scratch ? scratch : 0, pointers.data(),
                                        static_cast<Py_ssize_t>(l.at.size()), l.values);
            if (fired < 0) return nullptr;
            if (fired == 0) {
                PyErr_SetString(PyExc_RuntimeError, "diyflash_cplan: the CUDA context went away between launches");
                return nullptr;
            }
        }
        PyObject *out = PyTuple_New(static_cast<Py_ssize_t>(p->returned.size()));
        if (out == nullptr) return nullptr;
        for (size_t i = 0; i < p->returned.size(); i++) {
            PyObject *t = THPVariable_Wrap(made[p->returned[i]]);
            if (t == nullptr) {
                Py_DECREF(out);
                return nullptr;
            }
            PyTuple_SET_ITEM(out, static_cast<Py_ssize_t>(i), t);
        }
        return out;
    END_HANDLE_TH_ERRORS
}

/* bind(capsule): the C launcher's entry points (diyflash_claunch._C_API) */
PyObject *bind(PyObject *, PyObject *capsule) {
    auto *a = static_cast<const ClaunchAPI *>(PyCapsule_GetPointer(capsule, "diyflash_claunch._C_API"));
    if (a == nullptr) return nullptr;
    if (a->version != 2) {
        PyErr_Format(PyExc_RuntimeError, "diyflash_cplan: the C launcher's API is version %d, not 2", a->version);
        return nullptr;
    }
    api = a;
    Py_RETURN_NONE;
}

PyMethodDef methods[] = {
    {"make", make, METH_VARARGS, "make(ninputs, allocs, launches, returned, need, align) -> Program"},
    {"run", reinterpret_cast<PyCFunction>(reinterpret_cast<void (*)()>(run)), METH_FASTCALL,
     "run(program, stream, inputs) -> tuple of tensors, or None"},
    {"bind", bind, METH_O, "bind(capsule): the C launcher's entry points"},
    {nullptr, nullptr, 0, nullptr},
};

PyModuleDef module_def = {PyModuleDef_HEAD_INIT, "diyflash_cplan", nullptr, -1, methods};

}  // namespace

PyMODINIT_FUNC PyInit_diyflash_cplan(void) { return PyModule_Create(&module_def); }
