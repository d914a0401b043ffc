// Host views of device memory (host_memory.cpp), shared by the collective backend (process_group.cpp).
#pragma once

#include <ATen/core/Tensor.h>

namespace {{ cookiecutter.device }}::distributed {

// A CPU tensor over the bytes of the device tensor `t` (same sizes, strides, offset, dtype) that
// keeps t's storage alive; waits for t's device's current stream first.
at::Tensor host_view(const at::Tensor& t);

// Whether host_view is possible: the driver's host_mapping capability (driver.h).
bool has_host_views();

}  // namespace {{ cookiecutter.device }}::distributed
