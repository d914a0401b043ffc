// Helpers every {{ cookiecutter.device }} kernel uses to run on device memory (see kernel_support.cpp).
//
// The emulated device's memory is host memory, so a kernel can view its tensors as CPU tensors
// without copying (`host_alias`), run the CPU kernel on them, and publish the result back
// (`write_back` for mutated arguments, `to_device` for new results). On real hardware kernels
// call the SDK instead and need these only for host<->device staging.
#pragma once

#include <ATen/core/ATen_fwd.h>
#include <ATen/core/List.h>
#include <ATen/core/Tensor.h>
#include <c10/core/Device.h>

#include <optional>
#include <vector>

namespace {{ cookiecutter.device }}::kernels {

at::Tensor host_alias(const at::Tensor& t);
std::optional<at::Tensor> host_alias(const std::optional<at::Tensor>& t);
std::vector<at::Tensor> host_alias(at::ITensorListRef ts);
std::vector<at::Tensor> host_alias(at::TensorList ts);
c10::List<std::optional<at::Tensor>> host_alias(const c10::List<std::optional<at::Tensor>>& ts);

// After an in-place or out= call on `host_out` (a host alias of `device_out`): carry its new
// sizes/strides back, or — if the CPU kernel had to reallocate it — resize the device tensor and copy.
void write_back(const at::Tensor& device_out, const at::Tensor& host_out);

// A new host result -> a new device tensor on `device` (one copy).
at::Tensor to_device(const at::Tensor& host, c10::Device device);

// The device a kernel runs on: `t`'s device if it is a {{ cookiecutter.device }} tensor, else the current device.
c10::Device device_of(const at::Tensor& t);

// A device tensor sharing `base`'s storage with the geometry of `view` (a host view of base's alias).
at::Tensor device_view(const at::Tensor& base, const at::Tensor& view);

}  // namespace {{ cookiecutter.device }}::kernels
