// The {{ cookiecutter.package }}._C extension module: the few C++ entry points the Python package needs.
//
// This is the one translation unit that includes pybind11 and torch's Python headers (the
// heaviest headers of all); everything else in the backend is registered by static initialisers
// when this library loads. What a hardware team replaces: nothing, unless it exposes more of its
// SDK to Python (add functions here).
#include <torch/csrc/Generator.h>
#include <torch/csrc/utils/pybind.h>

#include "aten/fallback.h"
#include "aten/serialization.h"
#include "runtime/generator.h"
#include "runtime/runtime.h"

namespace py = pybind11;
namespace dev = {{ cookiecutter.device }};

PYBIND11_MODULE(_C, m) {
  m.doc() = "C++ runtime of the {{ cookiecutter.device }} PyTorch backend";

  m.def("device_count", [] { return static_cast<int>(dev::runtime::device_count()); });
  m.def("current_device", [] { return static_cast<int>(dev::runtime::current_device()); });
  m.def("set_device", [](int index) { dev::runtime::set_device(static_cast<c10::DeviceIndex>(index)); });
  m.def("exchange_device", [](int index) {
    auto old = dev::runtime::current_device();
    if (index >= 0) dev::runtime::set_device(static_cast<c10::DeviceIndex>(index));
    return static_cast<int>(old);
  });
  m.def("synchronize", [](int index) {
    dev::runtime::check_device(static_cast<c10::DeviceIndex>(index));
    {{ cookiecutter.DEVICE }}_CHECK(dev::driver::device_synchronize(index));
  });
  m.def("is_in_bad_fork", [] { return dev::driver::in_bad_fork(); });

  m.def("default_generator", [](int index) {
    return py::reinterpret_steal<py::object>(
        THPGenerator_initDefaultGenerator(dev::runtime::default_generator(static_cast<c10::DeviceIndex>(index))));
  });

  m.def("set_memory_limit", [](int index, size_t bytes) {
    dev::runtime::check_device(static_cast<c10::DeviceIndex>(index));
    {{ cookiecutter.DEVICE }}_CHECK(dev::driver::set_mem_limit(index, bytes));
  });
  m.def("mem_info", [](int index) {
    dev::runtime::check_device(static_cast<c10::DeviceIndex>(index));
    size_t free_bytes = 0, total = 0;
    {{ cookiecutter.DEVICE }}_CHECK(dev::driver::mem_info(index, &free_bytes, &total));
    return py::make_tuple(free_bytes, total);
  });

  m.def("fallback_counts", [] {
    py::dict out;
    for (const auto& [name, n] : dev::fallback::counts()) out[py::str(name)] = n;
    return out;
  });
  m.def("reset_fallback_counts", &dev::fallback::reset_counts);
  m.def("set_fallback_warning", &dev::fallback::set_warning);
  m.def("fallback_warning", &dev::fallback::warning_enabled);

  m.def("set_layout_tag", &dev::serialization::set_layout_tag);
  m.def("layout_tag", &dev::serialization::layout_tag);
}
