// Host views of device memory (host_memory.cpp), shared by the collective backend (process_group.cpp).
#pragma once

#include <ATen/core/Tensor.h>

namespace {{ cookiecutter.device }}::distributed {

// A CPU tensor over the bytes of the device tensor `t` (same sizes, strides, offset, dtype) that
// keeps t's storage alive; waits for t's device's current stream first.
at::Tensor host_view(const at::Tensor& t);

}  // namespace {{ cookiecutter.device }}::distributed
