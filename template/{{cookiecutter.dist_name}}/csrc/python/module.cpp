// The {{ cookiecutter.package }}._C extension module: the few C++ entry points the Python package needs.
//
// Written against the plain CPython API on purpose: pybind11 (torch/csrc/utils/pybind.h) costs
// ~12 s of compile time for a dozen functions that take and return ints. Everything else in the
// backend is registered by static initialisers when this library loads; functions that take
// tensors are custom operators (torch.ops.{{ cookiecutter.package }}.*, see aten/serialization.cpp),
// which need no Python binding at all. What a hardware team replaces: nothing, unless it exposes
// more of its SDK to Python (add a function and a line in kMethods). Two test aids use optional
// capabilities of the driver (driver.h): sleep needs `spin`, hold/release `host_tasks`,
// set_memory_limit `memory_limit`;
// capabilities() tells Python which the driver has, so tests that need one skip without it.
#include <Python.h>
#include <ATen/Context.h>
#include <torch/csrc/Event.h>
#include <torch/csrc/Generator.h>
#include <torch/csrc/utils/device_lazy_init.h>

#include <chrono>
#include <condition_variable>
#include <exception>
#include <map>
#include <memory>
#include <mutex>

#include "aten/fallback.h"
#include "driver/driver.h"
#include "runtime/generator.h"
#include "runtime/runtime.h"

namespace {{ cookiecutter.device }}::distributed {
// csrc/distributed/process_group.cpp (the one file with pybind11: it hands a c10d Backend to Python)
PyObject* make_process_group_backend(PyObject*, PyObject* args);
}  // namespace {{ cookiecutter.device }}::distributed

namespace {

namespace dev = {{ cookiecutter.device }};

// Sets torch.AcceleratorError for a driver's failure (as torch's own bindings do, with the status
// as its error_code); RuntimeError if torch has no such class.
void set_accelerator_error(const c10::AcceleratorError& e) {
  static PyObject* cls = [] {
    PyObject* torch = PyImport_ImportModule("torch");
    PyObject* found = torch != nullptr ? PyObject_GetAttrString(torch, "AcceleratorError") : nullptr;
    Py_XDECREF(torch);
    if (found == nullptr) PyErr_Clear();
    return found;  // kept for the process's life
  }();
  PyObject* exc = cls != nullptr ? PyObject_CallFunction(cls, "s", e.what_without_backtrace()) : nullptr;
  if (exc == nullptr) {
    PyErr_Clear();
    PyErr_SetString(PyExc_RuntimeError, e.what_without_backtrace());
    return;
  }
  PyObject* code = PyLong_FromLong(e.get_error_code());
  if (code == nullptr || PyObject_SetAttrString(exc, "error_code", code) != 0) PyErr_Clear();
  Py_XDECREF(code);
  PyErr_SetObject(cls, exc);
  Py_DECREF(exc);
}

// Runs `body`, turning a C++ exception into the matching Python one (nullptr return).
template <typename F>
PyObject* guarded(F&& body) {
  try {
    return body();
  } catch (const c10::AcceleratorError& e) {
    set_accelerator_error(e);
  } catch (const c10::IndexError& e) {
    PyErr_SetString(PyExc_IndexError, e.what_without_backtrace());
  } catch (const c10::ValueError& e) {
    PyErr_SetString(PyExc_ValueError, e.what_without_backtrace());
  } catch (const c10::Error& e) {
    PyErr_SetString(PyExc_RuntimeError, e.what_without_backtrace());
  } catch (const std::exception& e) {
    PyErr_SetString(PyExc_RuntimeError, e.what());
  }
  return nullptr;
}

// A device index argument: a Python int, checked against the device count.
bool device_arg(PyObject* arg, c10::DeviceIndex* out) {
  long index = PyLong_AsLong(arg);
  if (index == -1 && PyErr_Occurred()) return false;
  if (index < 0 || index >= dev::runtime::device_count()) {
    PyErr_Format(PyExc_RuntimeError, "The device index is out of range: invalid {{ cookiecutter.device }} device index %ld (%d devices)", index,
                 static_cast<int>(dev::runtime::device_count()));
    return false;
  }
  *out = static_cast<c10::DeviceIndex>(index);
  return true;
}

PyObject* device_count(PyObject*, PyObject*) {
  return PyLong_FromLong(dev::runtime::device_count());
}

PyObject* current_device(PyObject*, PyObject*) {
  return guarded([] { return PyLong_FromLong(dev::runtime::current_device()); });
}

PyObject* set_device(PyObject*, PyObject* arg) {
  c10::DeviceIndex index;
  if (!device_arg(arg, &index)) return nullptr;
  return guarded([&] {
    dev::runtime::set_device(index);
    Py_RETURN_NONE;
  });
}

// Makes `index` current (a negative index changes nothing) and returns the previous device.
PyObject* exchange_device(PyObject*, PyObject* arg) {
  long requested = PyLong_AsLong(arg);
  if (requested == -1 && PyErr_Occurred()) return nullptr;
  c10::DeviceIndex index = -1;
  if (requested >= 0 && !device_arg(arg, &index)) return nullptr;
  return guarded([&] {
    const auto old = dev::runtime::current_device();
    if (index >= 0) dev::runtime::set_device(index);
    return PyLong_FromLong(old);
  });
}

// Waits without the GIL: other Python threads (and the work they queue) go on meanwhile.
PyObject* synchronize(PyObject*, PyObject* arg) {
  c10::DeviceIndex index;
  if (!device_arg(arg, &index)) return nullptr;
  dev::driver::Status status;
  Py_BEGIN_ALLOW_THREADS
  status = dev::driver::device_synchronize(index);
  Py_END_ALLOW_THREADS
  return guarded([&] {
    {{ cookiecutter.DEVICE }}_CHECK(status);
    Py_RETURN_NONE;
  });
}

// Test aid (like torch.cuda._sleep): keeps the current stream of the current device busy.
PyObject* sleep(PyObject*, PyObject* arg) {
  const long long us = PyLong_AsLongLong(arg);
  if (us == -1 && PyErr_Occurred()) return nullptr;
  return guarded([&] {
    const c10::DeviceIndex index = dev::runtime::current_device();
    {{ cookiecutter.DEVICE }}_CHECK(dev::driver::spin(index, dev::runtime::current_stream_id(index), us));
    Py_RETURN_NONE;
  });
}

// Test aid: a gate on the current stream. hold(timeout_us) queues host work (launch_host) that
// keeps the stream busy until release(token) opens it, or until timeout_us passed, whichever comes
// first, and returns the token. What the host launches meanwhile queues behind the gate, so a test
// sees a launch still pending for as long as it looks, without sleeping a fixed time. A call that
// waits for the stream to drain returns only once the gate timed out: release() tells whether it did.
struct Gate {
  std::mutex mu;
  std::condition_variable cv;
  bool open = false;
  bool timed_out = false;
};
std::mutex gates_mu;
std::map<long long, std::shared_ptr<Gate>> gates;
long long next_gate = 0;

PyObject* hold(PyObject*, PyObject* arg) {
  const long long us = PyLong_AsLongLong(arg);
  if (us == -1 && PyErr_Occurred()) return nullptr;
  return guarded([&] {
    auto gate = std::make_shared<Gate>();
    const c10::DeviceIndex index = dev::runtime::current_device();
    {{ cookiecutter.DEVICE }}_CHECK(dev::driver::launch_host(index, dev::runtime::current_stream_id(index), "hold", [gate, us] {
      std::unique_lock<std::mutex> lock(gate->mu);
      gate->timed_out = !gate->cv.wait_for(lock, std::chrono::microseconds(us), [&] { return gate->open; });
    }));
    std::lock_guard<std::mutex> lock(gates_mu);
    gates.emplace(++next_gate, std::move(gate));
    return PyLong_FromLongLong(next_gate);
  });
}

PyObject* release(PyObject*, PyObject* arg) {
  const long long token = PyLong_AsLongLong(arg);
  if (token == -1 && PyErr_Occurred()) return nullptr;
  std::shared_ptr<Gate> gate;
  {
    std::lock_guard<std::mutex> lock(gates_mu);
    auto it = gates.find(token);
    if (it == gates.end()) Py_RETURN_FALSE;  // released already
    gate = std::move(it->second);
    gates.erase(it);
  }
  bool timed_out;
  {
    std::lock_guard<std::mutex> lock(gate->mu);
    gate->open = true;
    timed_out = gate->timed_out;
  }
  gate->cv.notify_all();
  return PyBool_FromLong(timed_out);
}

// The driver's optional capabilities (driver.h), as a tuple of names.
PyObject* capabilities(PyObject*, PyObject*) {
  namespace driver = dev::driver;
  PyObject* names = PyTuple_New(0);
  if (names == nullptr) return nullptr;
  for (driver::Capability c : driver::kCapabilities) {
    if (!driver::has(c)) continue;
    PyObject* name = PyUnicode_FromString(driver::capability_name(c));
    if (name == nullptr || _PyTuple_Resize(&names, PyTuple_GET_SIZE(names) + 1) != 0) {
      Py_XDECREF(name);
      Py_XDECREF(names);
      return nullptr;
    }
    PyTuple_SET_ITEM(names, PyTuple_GET_SIZE(names) - 1, name);
  }
  return names;
}

// PyTorch's flag, set in a child forked after the device was initialised (runtime/hooks.cpp
// registers PyTorch's fork handler in init()).
PyObject* is_in_bad_fork(PyObject*, PyObject*) {
  return PyBool_FromLong(torch::utils::is_device_in_bad_fork(c10::DeviceType::PrivateUse1));
}

// torch's lazy device initialisation: runs the hooks' init() once per process.
PyObject* lazy_init(PyObject*, PyObject*) {
  return guarded([] {
    at::globalContext().lazyInitDevice(c10::DeviceType::PrivateUse1);
    Py_RETURN_NONE;
  });
}

PyObject* is_initialized(PyObject*, PyObject*) {
  return PyBool_FromLong(dev::runtime::is_initialized());
}

// The priority of a stream (device index, stream id); lower values run first.
PyObject* stream_priority(PyObject*, PyObject* args) {
  PyObject* device;
  long long stream;
  if (!PyArg_ParseTuple(args, "OL", &device, &stream)) return nullptr;
  c10::DeviceIndex index;
  if (!device_arg(device, &index)) return nullptr;
  return guarded([&] { return PyLong_FromLong(dev::runtime::stream_priority(index, stream)); });
}

// (least, greatest) stream priority, as torch.cuda.Stream.priority_range() reports them.
PyObject* stream_priority_range(PyObject*, PyObject*) {
  return guarded([] {
    const auto [least, greatest] = dev::runtime::stream_priority_range();
    return Py_BuildValue("(ii)", least, greatest);
  });
}

// Milliseconds between two recorded events. torch.Event.elapsed_time accepts only an exact
// torch.Event as its argument; this takes torch.{{ cookiecutter.device }}.Event (a subclass) as well.
PyObject* event_elapsed_time(PyObject*, PyObject* args) {
  PyObject* start;
  PyObject* end;
  if (!PyArg_ParseTuple(args, "OO", &start, &end)) return nullptr;
  if (!THPEvent_Check(start) || !THPEvent_Check(end)) {
    PyErr_SetString(PyExc_TypeError, "elapsed_time expects two torch.Event objects");
    return nullptr;
  }
  return guarded([&] {
    const c10::Event& a = reinterpret_cast<THPEvent*>(start)->event;
    return PyFloat_FromDouble(a.elapsedTime(reinterpret_cast<THPEvent*>(end)->event));
  });
}

// The device's default torch.Generator (one Python object per device, shared with C++).
PyObject* default_generator(PyObject*, PyObject* arg) {
  c10::DeviceIndex index;
  if (!device_arg(arg, &index)) return nullptr;
  return guarded([&] { return THPGenerator_initDefaultGenerator(dev::runtime::default_generator(index)); });
}

PyObject* set_memory_limit(PyObject*, PyObject* args) {
  PyObject* device;
  PyObject* nbytes;
  if (!PyArg_ParseTuple(args, "OO", &device, &nbytes)) return nullptr;
  const unsigned long long bytes = PyLong_AsUnsignedLongLong(nbytes);  // a negative count raises OverflowError
  if (bytes == static_cast<unsigned long long>(-1) && PyErr_Occurred()) return nullptr;
  c10::DeviceIndex index;
  if (!device_arg(device, &index)) return nullptr;
  return guarded([&] {
    {{ cookiecutter.DEVICE }}_CHECK(dev::driver::set_memory_limit(index, static_cast<size_t>(bytes)));
    Py_RETURN_NONE;
  });
}

// (free bytes, total bytes) of a device.
PyObject* mem_info(PyObject*, PyObject* arg) {
  c10::DeviceIndex index;
  if (!device_arg(arg, &index)) return nullptr;
  return guarded([&] {
    size_t free_bytes = 0, total = 0;
    {{ cookiecutter.DEVICE }}_CHECK(dev::driver::mem_info(index, &free_bytes, &total));
    return Py_BuildValue("(KK)", static_cast<unsigned long long>(free_bytes), static_cast<unsigned long long>(total));
  });
}

// (name, major, minor, total memory, multiprocessors) of a device: the driver's properties.
PyObject* device_properties(PyObject*, PyObject* arg) {
  c10::DeviceIndex index;
  if (!device_arg(arg, &index)) return nullptr;
  return guarded([&] {
    dev::driver::DeviceProperties p;
    {{ cookiecutter.DEVICE }}_CHECK(dev::driver::get_device_properties(index, &p));
    return Py_BuildValue("(siiKi)", p.name.c_str(), p.major, p.minor, static_cast<unsigned long long>(p.total_memory),
                         p.multi_processor_count);
  });
}

// {operator name: (calls, seconds)} of the operators that ran through the CPU fallback.
PyObject* fallback_stats(PyObject*, PyObject*) {
  return guarded([]() -> PyObject* {
    PyObject* out = PyDict_New();
    if (out == nullptr) return nullptr;
    for (const auto& [name, stat] : dev::fallback::stats()) {
      PyObject* value = Py_BuildValue("(Ld)", static_cast<long long>(stat.calls), stat.nanos * 1e-9);
      if (value == nullptr || PyDict_SetItemString(out, name.c_str(), value) != 0) {
        Py_XDECREF(value);
        Py_DECREF(out);
        return nullptr;
      }
      Py_DECREF(value);
    }
    return out;
  });
}

PyObject* reset_fallback_counts(PyObject*, PyObject*) {
  dev::fallback::reset_counts();
  Py_RETURN_NONE;
}

PyObject* set_fallback_warning(PyObject*, PyObject* arg) {
  const int enabled = PyObject_IsTrue(arg);
  if (enabled < 0) return nullptr;
  dev::fallback::set_warning(enabled != 0);
  Py_RETURN_NONE;
}

PyObject* fallback_warning(PyObject*, PyObject*) {
  return PyBool_FromLong(dev::fallback::warning_enabled());
}

PyMethodDef kMethods[] = {
    {"device_count", device_count, METH_NOARGS, "Number of {{ cookiecutter.device }} devices."},
    {"current_device", current_device, METH_NOARGS, "Index of the current device."},
    {"set_device", set_device, METH_O, "Make a device current."},
    {"exchange_device", exchange_device, METH_O, "Make a device current (negative: none); return the previous."},
    {"synchronize", synchronize, METH_O, "Wait for all work on a device."},
    {"sleep", sleep, METH_O, "Keep the current stream busy for a number of microseconds (test aid)."},
    {"hold", hold, METH_O, "Hold the current stream until release(token) or a timeout in microseconds (test aid)."},
    {"release", release, METH_O, "Open a gate hold() returned; whether it had timed out (test aid)."},
    {"capabilities", capabilities, METH_NOARGS, "The driver's optional capabilities (names, driver.h)."},
    {"is_in_bad_fork", is_in_bad_fork, METH_NOARGS, "Whether this is a forked child of an initialised parent."},
    {"lazy_init", lazy_init, METH_NOARGS, "Initialise the device runtime (once per process)."},
    {"is_initialized", is_initialized, METH_NOARGS, "Whether the device runtime was initialised."},
    {"stream_priority", stream_priority, METH_VARARGS, "The priority of a stream: (device, stream id)."},
    {"stream_priority_range", stream_priority_range, METH_NOARGS, "(least, greatest) stream priority."},
    {"event_elapsed_time", event_elapsed_time, METH_VARARGS, "Milliseconds between two recorded events."},
    {"default_generator", default_generator, METH_O, "The default torch.Generator of a device."},
    {"set_memory_limit", set_memory_limit, METH_VARARGS, "Set a device's capacity in bytes."},
    {"mem_info", mem_info, METH_O, "(free, total) bytes of a device."},
    {"device_properties", device_properties, METH_O, "(name, major, minor, total_memory, multiprocessors) of a device."},
    {"make_process_group_backend", dev::distributed::make_process_group_backend, METH_VARARGS,
     "The c10d Backend for device tensors over a gloo Backend: (transport, rank, size, timeout_seconds)."},
    {"fallback_stats", fallback_stats, METH_NOARGS, "Operators run through the CPU fallback: (calls, seconds)."},
    {"reset_fallback_counts", reset_fallback_counts, METH_NOARGS, "Zero the fallback counters."},
    {"set_fallback_warning", set_fallback_warning, METH_O, "Warn once per operator that falls back to the CPU."},
    {"fallback_warning", fallback_warning, METH_NOARGS, "Whether the fallback warning is on."},
    {nullptr, nullptr, 0, nullptr},
};

PyModuleDef kModule = {
    PyModuleDef_HEAD_INIT, "_C", "C++ runtime of the {{ cookiecutter.device }} PyTorch backend", -1, kMethods,
};

}  // namespace

PyMODINIT_FUNC PyInit__C() {
  return PyModule_Create(&kModule);
}
