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
#include <torch/csrc/autograd/custom_function.h>
#include <torch/csrc/autograd/python_variable.h>
#include <torch/csrc/profiler/orchestration/observer.h>
#include <ATen/PythonTorchFunctionTLS.h>
#include <ATen/autocast_mode.h>
#include <c10/core/impl/DeviceGuardImplInterface.h>
#include <c10/core/impl/TorchDispatchModeTLS.h>

#include <algorithm>
#include <optional>
#include <utility>
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

/* A tuple of new references (each taken, also on failure); nullptr with the error set where one is nullptr */
PyObject *tuple_of(std::vector<PyObject *> items) {
    PyObject *out = nullptr;
    bool all = std::all_of(items.begin(), items.end(), [](PyObject *o) { return o != nullptr; });
    if (all) out = PyTuple_New(static_cast<Py_ssize_t>(items.size()));
    if (out == nullptr) {
        for (PyObject *o : items) Py_XDECREF(o);
        return nullptr;
    }
    for (size_t i = 0; i < items.size(); i++) PyTuple_SET_ITEM(out, static_cast<Py_ssize_t>(i), items[i]);
    return out;
}

/* A tuple of the tensors as Python objects; nullptr with the error set where one fails */
PyObject *wrap_all(const std::vector<at::Tensor> &tensors) {
    std::vector<PyObject *> items;
    items.reserve(tensors.size());
    for (const auto &t : tensors) items.push_back(THPVariable_Wrap(t));
    return tuple_of(std::move(items));
}

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

/* A program run on `in` (the GIL held): the returned allocations, or nothing where nothing ran (no CUDA context
 * current on this thread, an allocation not 16-byte aligned: the plans assume it). A launch's error is the
 * Python error the C launcher set, thrown as python_error. */
std::optional<std::vector<at::Tensor>> run_program(const Program *p, uint64_t stream, const std::vector<at::Tensor> &in,
                                                   PyObject *values = nullptr) {
    if (!api->context_current()) return std::nullopt;
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
        if (reinterpret_cast<uintptr_t>(t.data_ptr()) % 16 != 0) return std::nullopt;
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
    for (size_t i = 0; i < p->launches.size(); i++) {
        const Launch &l = p->launches[i];
        for (size_t j = 0; j < l.at.size(); j++) {
            long long v = l.at[j];
            pointers[j] = v == NULL_VALUE ? 0
                        : reinterpret_cast<uintptr_t>(v >= 0 ? in[v].data_ptr() : made[-1 - v].data_ptr());
        }
        int fired = api->launch_raw(l.launch, stream, l.scratch ? scratch : 0, pointers.data(),
                                    static_cast<Py_ssize_t>(l.at.size()),
                                    values != nullptr ? PyTuple_GET_ITEM(values, i) : l.values);
        if (fired == 0) PyErr_SetString(PyExc_RuntimeError, "diyflash_cplan: the CUDA context went away between launches");
        if (fired <= 0) {
            python_error err;
            err.persist();
            throw err;
        }
    }
    std::vector<at::Tensor> out;
    out.reserve(p->returned.size());
    for (Py_ssize_t r : p->returned) out.push_back(made[r]);
    return out;
}

/* run(program, stream, inputs: tuple of tensors[, values]) -> the returned allocations (a tuple), or None where
 * nothing ran (run_program). values: each launch's scalars (a tuple of tuples) instead of the program's own, for
 * a call of the same plan with other strides and lengths (a KV cache one token longer). */
PyObject *run(PyObject *, PyObject *const *args, Py_ssize_t nargs) {
    if ((nargs != 3 && nargs != 4) || !PyTuple_Check(args[2])) {
        PyErr_SetString(PyExc_TypeError, "run(program, stream, inputs: tuple[, values: tuple])");
        return nullptr;
    }
    auto *p = static_cast<Program *>(PyCapsule_GetPointer(args[0], CAPSULE));
    if (p == nullptr) return nullptr;
    PyObject *values = nargs == 4 && args[3] != Py_None ? args[3] : nullptr;
    if (values != nullptr && (!PyTuple_Check(values) || PyTuple_GET_SIZE(values) != static_cast<Py_ssize_t>(p->launches.size()))) {
        PyErr_Format(PyExc_TypeError, "run: values must be a tuple of the program's %zu launches' scalars",
                     p->launches.size());
        return nullptr;
    }
    unsigned long long stream = PyLong_AsUnsignedLongLong(args[1]);
    if (stream == static_cast<unsigned long long>(-1) && PyErr_Occurred()) return nullptr;
    PyObject *inputs = args[2];
    if (PyTuple_GET_SIZE(inputs) != p->ninputs) {
        PyErr_Format(PyExc_TypeError, "run: %zd inputs given, the program takes %zd", PyTuple_GET_SIZE(inputs),
                     p->ninputs);
        return nullptr;
    }
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
        auto made = run_program(p, stream, in, values);
        if (!made) Py_RETURN_NONE;
        return wrap_all(*made);
    END_HANDLE_TH_ERRORS
}

/* The fast path's autograd node (issue: a Python autograd.Function's backward runs Python on autograd's device
 * thread, where it costs about twice its time on the calling thread). `attach` gives a fast-path forward's out
 * and lse a torch::autograd::Function node whose backward runs, without Python, the Program kept for dout's
 * layout in the forward's Cache; anything else (dlse given, a layout not kept yet, a mode, tracer, profiler or
 * autocast that must see the op, grad mode on) calls the Python backward set by `set_backward`, which also
 * keeps new layouts' Programs (`cache_add`). Caches, programs and the C launcher are touched only with the GIL held. */
struct Cache {
    struct Entry {
        std::vector<int64_t> sizes, strides;
        at::ScalarType dtype;
        bool aligned, deterministic;
        PyObject *capsule; /* the Program's (a reference held) */
    };
    int64_t device;
    std::vector<Entry> entries;
};
PyObject *python_backward = nullptr; /* set_backward's (a reference held) */

struct Gil {
    PyGILState_STATE state;
    Gil() : state(PyGILState_Ensure()) {}
    ~Gil() { PyGILState_Release(state); }
};

bool aligned16(const at::Tensor &t) { return reinterpret_cast<uintptr_t>(t.data_ptr()) % 16 == 0; }

const Program *find(const Cache &cache, const at::Tensor &dout, bool deterministic) {
    for (const auto &e : cache.entries)
        if (e.deterministic == deterministic && e.dtype == dout.scalar_type() && dout.sizes().equals(e.sizes)
            && dout.strides().equals(e.strides) && e.aligned == aligned16(dout))
            return static_cast<const Program *>(PyCapsule_GetPointer(e.capsule, CAPSULE));
    return nullptr;
}

/* Whether nothing could see the op skipped (ops/eager.py op_observed, as far as C++ reads it): grad mode off
 * (no double backward), no dispatch or function mode, no profiler or autocast, and dout a tensor of q's kind
 * (a subclass or a functorch wrapper has other dispatch keys). */
bool unobserved(const at::Tensor &dout, const at::Tensor &q) {
    return !at::GradMode::is_enabled() && c10::impl::TorchDispatchModeTLS::stack_len() == 0
           && !at::impl::torch_function_mode_enabled() && !torch::profiler::impl::profilerEnabled()
           && !at::autocast::is_autocast_enabled(at::kCUDA) && !at::autocast::is_autocast_enabled(at::kCPU)
           && dout.key_set() == q.key_set();
}

PyObject *none_or(const at::Tensor &t) {
    if (t.defined()) return THPVariable_Wrap(t);
    Py_RETURN_NONE;
}

using Outputs = std::pair<at::Tensor, at::Tensor>; /* out, lse */

}  // namespace

namespace diyflash { /* (the node's name: torch::autograd::CppNode<diyflash::Attention>) */

struct Attention : public torch::autograd::Function<Attention> {
    /* compiled autograd traces the backward: under its tracing mode it calls the Python backward, which calls
     * the op (ops/attention_fast.py _node_backward) */
    static constexpr bool is_traceable = true;

    static torch::autograd::variable_list forward(torch::autograd::AutogradContext *ctx, const at::Tensor &q,
                                                  const at::Tensor &k, const at::Tensor &v, const Outputs *made,
                                                  int64_t cache, bool programs, bool causal,
                                                  c10::IValue scale, int64_t left, int64_t right, double softcap,
                                                  int64_t deterministic) {
        /* (in one list: compiled autograd lifts top-level numbers into graph inputs, nested ones it specializes on) */
        c10::impl::GenericList args(c10::AnyType::get());
        for (const c10::IValue &a : {c10::IValue(cache), c10::IValue(programs), c10::IValue(causal), scale,
                                     c10::IValue(left), c10::IValue(right), c10::IValue(softcap),
                                     c10::IValue(deterministic)})
            args.push_back(a);
        ctx->saved_data["args"] = args;
        ctx->save_for_backward({q, k, v, made->first, made->second});
        ctx->set_materialize_grads(false);
        return {made->first, made->second};
    }

    static torch::autograd::variable_list backward(torch::autograd::AutogradContext *ctx,
                                                   torch::autograd::variable_list grads) {
        auto saved = ctx->get_saved_variables(); /* q, k, v, out, lse */
        const at::Tensor dout = grads[0], dlse = grads[1];
        auto saved_args = ctx->saved_data["args"].toList(); /* cache, programs, causal, scale, left, right, softcap, det */
        int64_t det = saved_args.get(7).toInt(); /* -1: None, resolved now as PyTorch's own kernels do */
        bool deterministic = det < 0 ? at::globalContext().deterministicAlgorithms() : det != 0;
        torch::autograd::variable_list result(12); /* one per forward argument */
        Gil gil;
        auto *cache = reinterpret_cast<const Cache *>(saved_args.get(0).toInt());
        if (dout.defined() && !dlse.defined() && saved_args.get(1).toBool() && unobserved(dout, saved[0])) {
            const Program *p = find(*cache, dout, deterministic);
            const auto *impl = p != nullptr ? c10::impl::getDeviceGuardImpl(c10::DeviceType::CUDA) : nullptr;
            if (p != nullptr && impl->getDevice().index() == cache->device) {
                auto stream = impl->getStream(c10::Device(c10::DeviceType::CUDA, cache->device));
                auto made = run_program(p, reinterpret_cast<uint64_t>(impl->getStreamNativeHandle(stream)),
                                        {dout, saved[0], saved[1], saved[2], saved[3], saved[4]});
                if (made) {
                    std::copy(made->begin(), made->end(), result.begin());
                    return result;
                }
            }
        }
        PyObject *args = tuple_of(
            {none_or(dout), none_or(dlse), THPVariable_Wrap(saved[0]), THPVariable_Wrap(saved[1]),
             THPVariable_Wrap(saved[2]), THPVariable_Wrap(saved[3]), THPVariable_Wrap(saved[4]),
             PyLong_FromLongLong(saved_args.get(0).toInt()), PyBool_FromLong(saved_args.get(2).toBool()),
             saved_args.get(3).isNone() ? (Py_INCREF(Py_None), Py_None) : PyFloat_FromDouble(saved_args.get(3).toDouble()),
             PyLong_FromLongLong(saved_args.get(4).toInt()), PyLong_FromLongLong(saved_args.get(5).toInt()),
             PyFloat_FromDouble(saved_args.get(6).toDouble()), det < 0 ? (Py_INCREF(Py_None), Py_None) : PyBool_FromLong(det)});
        PyObject *grads_in = args != nullptr ? PyObject_Call(python_backward, args, nullptr) : nullptr;
        Py_XDECREF(args);
        if (grads_in == nullptr) {
            python_error err;
            err.persist();
            throw err;
        }
        bool shaped = PyTuple_Check(grads_in) && PyTuple_GET_SIZE(grads_in) == 3;
        for (int i = 0; shaped && i < 3; i++) {
            PyObject *g = PyTuple_GET_ITEM(grads_in, i);
            if (THPVariable_Check(g)) result[i] = THPVariable_Unpack(g);
            else shaped = g == Py_None;
        }
        Py_DECREF(grads_in);
        if (!shaped) {
            PyErr_SetString(PyExc_TypeError, "diyflash_cplan: the Python backward did not return (dq, dk, dv)");
            python_error err;
            err.persist();
            throw err;
        }
        return result;
    }
};

}  // namespace diyflash

namespace {

using diyflash::Attention;

/* attach(q, k, v, out, lse, cache, programs, causal, scale, left, right, softcap, deterministic) -> (out, lse) with
 * the node (Attention) as their grad_fn. cache: cache_new's; programs: whether the node may run kept Programs
 * (else every backward is Python's); scale: float or None; deterministic: -1 (None), 0 or 1. */
PyObject *attach(PyObject *, PyObject *args) {
    PyObject *tensors[5], *scale;
    long long cache, left, right, deterministic;
    int programs, causal;
    double softcap;
    if (!PyArg_ParseTuple(args, "OOOOOLppOLLdL", &tensors[0], &tensors[1], &tensors[2], &tensors[3], &tensors[4],
                          &cache, &programs, &causal, &scale, &left, &right, &softcap, &deterministic))
        return nullptr;
    for (auto *t : tensors)
        if (!THPVariable_Check(t)) {
            PyErr_SetString(PyExc_TypeError, "attach: q, k, v, out and lse must be tensors");
            return nullptr;
        }
    if (python_backward == nullptr) {
        PyErr_SetString(PyExc_RuntimeError, "attach: set_backward() first");
        return nullptr;
    }
    HANDLE_TH_ERRORS
        c10::IValue scale_value;
        if (scale != Py_None) scale_value = PyFloat_AsDouble(scale);
        if (PyErr_Occurred()) return nullptr;
        /* (out and lse not as tensor arguments: an output that is an input would be returned as a view of it) */
        Outputs made{THPVariable_Unpack(tensors[3]), THPVariable_Unpack(tensors[4])};
        auto outs = Attention::apply(THPVariable_Unpack(tensors[0]), THPVariable_Unpack(tensors[1]),
                                     THPVariable_Unpack(tensors[2]), &made, static_cast<int64_t>(cache), programs != 0,
                                     causal != 0, scale_value, static_cast<int64_t>(left), static_cast<int64_t>(right),
                                     softcap, static_cast<int64_t>(deterministic));
        return wrap_all(outs);
    END_HANDLE_TH_ERRORS
}

/* cache_new(device) -> an id (a Cache, never freed: a node may outlive its forward's plan; cache_clear empties it) */
PyObject *cache_new(PyObject *, PyObject *arg) {
    long long device;
    if (!as_int(arg, &device)) return nullptr;
    auto *cache = new Cache();
    cache->device = device;
    return PyLong_FromVoidPtr(cache);
}

Cache *cache_of(PyObject *id) {
    void *p = PyLong_AsVoidPtr(id);
    return p == nullptr && PyErr_Occurred() ? nullptr : static_cast<Cache *>(p);
}

/* cache_add(cache, dout, deterministic, program): a Program for backwards of dout's layout (and mode) */
PyObject *cache_add(PyObject *, PyObject *args) {
    PyObject *id, *dout, *capsule;
    int deterministic;
    if (!PyArg_ParseTuple(args, "OOpO", &id, &dout, &deterministic, &capsule)) return nullptr;
    Cache *cache = cache_of(id);
    if (cache == nullptr || !THPVariable_Check(dout) || PyCapsule_GetPointer(capsule, CAPSULE) == nullptr) {
        if (!PyErr_Occurred()) PyErr_SetString(PyExc_TypeError, "cache_add(cache, dout: tensor, deterministic, program)");
        return nullptr;
    }
    const at::Tensor &t = THPVariable_Unpack(dout);
    if (find(*cache, t, deterministic != 0) == nullptr) {
        Py_INCREF(capsule);
        cache->entries.push_back({t.sizes().vec(), t.strides().vec(), t.scalar_type(), aligned16(t), deterministic != 0,
                                  capsule});
    }
    Py_RETURN_NONE;
}

/* cache_clear(cache): its Programs dropped (their plan's kernels may be released) */
PyObject *cache_clear(PyObject *, PyObject *id) {
    Cache *cache = cache_of(id);
    if (cache == nullptr) return nullptr;
    auto entries = std::move(cache->entries);
    cache->entries.clear();
    for (auto &e : entries) Py_DECREF(e.capsule);
    Py_RETURN_NONE;
}

/* set_backward(fn): the Python backward of nodes that run no Program */
PyObject *set_backward(PyObject *, PyObject *fn) {
    Py_INCREF(fn);
    Py_XSETREF(python_backward, fn);
    Py_RETURN_NONE;
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
     "run(program, stream, inputs[, values]) -> tuple of tensors, or None"},
    {"bind", bind, METH_O, "bind(capsule): the C launcher's entry points"},
    {"attach", attach, METH_VARARGS, "attach(q, k, v, out, lse, cache, programs, causal, scale, left, right, softcap, "
                                     "deterministic) -> (out, lse) with the fast path's autograd node"},
    {"cache_new", cache_new, METH_O, "cache_new(device) -> a backward Cache's id"},
    {"cache_add", cache_add, METH_VARARGS, "cache_add(cache, dout, deterministic, program)"},
    {"cache_clear", cache_clear, METH_O, "cache_clear(cache)"},
    {"set_backward", set_backward, METH_O, "set_backward(fn): the nodes' Python backward"},
    {nullptr, nullptr, 0, nullptr},
};

PyModuleDef module_def = {PyModuleDef_HEAD_INIT, "diyflash_cplan", nullptr, -1, methods};

}  // namespace

PyMODINIT_FUNC PyInit_diyflash_cplan(void) { return PyModule_Create(&module_def); }
