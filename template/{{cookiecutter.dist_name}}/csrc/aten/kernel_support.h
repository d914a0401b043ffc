// Helpers every {{ cookiecutter.device }} kernel uses to run on device memory (see kernel_support.cpp).
//
// The emulated device's memory is host memory behind the driver, so a kernel can view its tensors
// as CPU tensors without copying (`host_alias`, through driver::host_address), run the CPU kernel
// on them, and publish the result back (`write_back` for mutated arguments, `to_device` for new
// results). A kernel body runs as the current stream's next item (`StreamScope`): after the work
// queued there, before work queued after it. On real hardware kernels launch SDK work instead and
// need these only for host<->device staging. `common_device`, `empty_device` and `StreamScope` are
// what any backend's kernels need: argument checks, output allocation and stream order.
#pragma once

// Every kernel file includes this header, so it stays narrow: c10::List and c10::IListRef (their
// headers pull in the IValue machinery, ~3 s of every compile) are only forward-declared here,
// through ATen_fwd.h; kernels with a Tensor?[] or Tensor[] argument include <ATen/core/List.h> or
// <ATen/core/IListRef.h> themselves.
#include <ATen/core/ATen_fwd.h>
#include <ATen/core/Tensor.h>
#include <c10/core/Device.h>
#include <c10/core/DeviceGuard.h>
#include <c10/core/TensorOptions.h>

#include <optional>
#include <vector>

namespace {{ cookiecutter.device }}::kernels {

at::Tensor host_alias(const at::Tensor& t);
std::optional<at::Tensor> host_alias(const std::optional<at::Tensor>& t);
std::vector<at::Tensor> host_alias(at::ITensorListRef ts);
std::vector<at::Tensor> host_alias(at::TensorList ts);
c10::List<std::optional<at::Tensor>> host_alias(const c10::List<std::optional<at::Tensor>>& ts);

// A CPU tensor over the same bytes as the CPU tensor `t` that does not keep them alive: for work
// queued on a stream, which (like a kernel on real hardware) holds no reference to its buffers.
at::Tensor borrowed(const at::Tensor& t);

// After an in-place or out= call on `host_out` (a host alias of `device_out`): carry its new
// sizes/strides back, or — if the CPU kernel had to reallocate it — grow the device storage, give
// the device tensor the result's sizes and strides, and copy.
void write_back(const at::Tensor& device_out, const at::Tensor& host_out);

// A new host result -> a new device tensor on `device` (one copy).
at::Tensor to_device(const at::Tensor& host, c10::Device device);

// The device a kernel runs on: `t`'s device if it is a {{ cookiecutter.device }} tensor, else the current device.
c10::Device device_of(const at::Tensor& t);

// How an operator treats CPU tensors among its arguments. PyTorch checks this before or inside
// its kernels; the CPU kernels the emulator borrows cannot, because host aliases are all CPU tensors.
enum class CpuArgs {
  rejected,  // every tensor on one device (operators with device_check ExactSame)
  scalars,   // CPU scalars (0-dim tensors) allowed, as TensorIterator allows them
  allowed,   // any CPU tensor (device_check NoCheck, e.g. CPU indices); the device tensors must agree
};

namespace detail {
void check_device(std::optional<c10::Device>& common, const at::Tensor& t, CpuArgs cpu, const char* op);
void check_device(std::optional<c10::Device>& common, const std::optional<at::Tensor>& t, CpuArgs cpu, const char* op);
void check_device(std::optional<c10::Device>& common, at::ITensorListRef ts, CpuArgs cpu, const char* op);
void check_device(std::optional<c10::Device>& common, at::TensorList ts, CpuArgs cpu, const char* op);
void check_device(std::optional<c10::Device>& common, const c10::List<std::optional<at::Tensor>>& ts, CpuArgs cpu,
                  const char* op);
c10::Device current();
}  // namespace detail

// The device `op` runs on — that of its first {{ cookiecutter.device }} tensor argument, else the
// current device — after checking every tensor argument against it (a clear error, as on CPU/CUDA).
template <typename... Tensors>
c10::Device common_device(const char* op, CpuArgs cpu, const Tensors&... tensors) {
  std::optional<c10::Device> common;
  (detail::check_device(common, tensors, cpu, op), ...);
  return common.has_value() ? *common : detail::current();
}

// Holds `device`'s current stream for a kernel body run on the calling thread: waits for the work
// queued on it, and work launched meanwhile from other threads queues behind the body.
// `name` (a string literal) is what the profiler shows.
class StreamScope {
 public:
  explicit StreamScope(c10::Device device, const char* name = nullptr);
  ~StreamScope();
  StreamScope(const StreamScope&) = delete;
  StreamScope& operator=(const StreamScope&) = delete;

 private:
  int device_;
  int64_t stream_;
  const char* name_;
};

// A new tensor in device memory on the current device: contiguous (in `options`' memory format)
// when `strides` is empty, else with those strides. Takes the allocator directly, not the
// dispatcher: this is how a kernel allocates its outputs.
at::Tensor empty_device(c10::IntArrayRef sizes, c10::IntArrayRef strides, const c10::TensorOptions& options);

// A device tensor sharing `base`'s storage with the geometry of `view`, a view of `host_alias(base)`
// (e.g. what the CPU operator returned for it): its sizes, strides, storage offset and dtype — which
// may differ from base's (view_as_real, view.dtype: the offset counts elements of the view's dtype)
// — and its conjugate and negative bits. Metadata only: no data moves, no stream work. Throws if
// `view` is not on base's memory (a CPU kernel that returned a copy).
at::Tensor device_view(const at::Tensor& base, const at::Tensor& view);

// Makes a device storage at least `nbytes` long, keeping its contents (resize_, out= results).
void grow_storage(const c10::Storage& storage, size_t nbytes, c10::Device device);

}  // namespace {{ cookiecutter.device }}::kernels
