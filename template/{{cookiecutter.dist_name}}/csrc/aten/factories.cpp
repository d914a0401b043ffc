// Factory operators whose output size the host decides from their scalar arguments, as launches.
//
// - arange: every torch.arange on the device (`arange`, `arange.start`, `arange.start_step`,
//   `arange.out`) ends in the out= form `arange.start_out`, handed an empty tensor to size. The CPU
//   fallback runs an out= call whose output must be resized at once, on the calling thread, after
//   the stream has drained: each torch.arange(n, device=...) — a transformer's position ids, once
//   per forward — waited for all the work queued before it. Here the host decides the size with
//   PyTorch's own rule (ATen's compute_arange_size, which the CPU kernel calls: its errors, a zero
//   step or bounds against the step's sign, are raised by the call), resizes the output when its
//   element count differs (as the CPU kernel does), and queues the CPU kernel that fills it; the
//   call returns at once. A dtype the CPU kernel has no arange for runs in place, where the CPU
//   kernel raises its own error.
//
// What a hardware team replaces: the queued body, with its SDK's fill kernel (start + i * step in
// the output's dtype); the host part (the size, the resize) stays.
#include "aten/kernel_support.h"

#include <ATen/Dispatch.h>
#include <ATen/native/RangeUtils.h>
#include <ATen/ops/arange_ops.h>
#include <torch/library.h>

#include <optional>

namespace {{ cookiecutter.device }}::factories {

namespace {

// The element count arange gives `dtype` for these bounds, by the CPU kernel's rule; none for a
// dtype the CPU kernel does not dispatch (it raises that error itself).
std::optional<int64_t> arange_size(const c10::Scalar& start, const c10::Scalar& end, const c10::Scalar& step,
                                   c10::ScalarType dtype) {
  std::optional<int64_t> size;
  try {
    AT_DISPATCH_ALL_TYPES_AND2(at::kHalf, at::kBFloat16, dtype, "arange", [&] {
      size = at::native::compute_arange_size<scalar_t>(start, end, step);
    });
  } catch (const c10::NotImplementedError&) {
    return std::nullopt;  // the dispatch's own refusal; compute_arange_size's errors are c10::Error and propagate
  }
  return size;
}

}  // namespace

at::Tensor& arange_start_out(const c10::Scalar& start, const c10::Scalar& end, const c10::Scalar& step,
                             at::Tensor& out) {
  const c10::Device device = kernels::common_device("aten::arange.start_out", kernels::CpuArgs::rejected, out);
  c10::DeviceGuard guard(device);
  // ---- on the host: the size and the output -------------------------------------------------
  const std::optional<int64_t> size = arange_size(start, end, step, out.scalar_type());
  if (size.has_value() && out.numel() != *size) out.resize_({*size});
  // ---- device computation, queued on the current stream: replace with your SDK's launch --------
  kernels::launch(device, "aten::arange.start_out", size.has_value(),
                  [start, end, step, out_h = kernels::held(out)]() mutable {
                    at::_ops::arange_start_out::call(start, end, step, out_h.get());
                  });
  // ---- end of device computation ------------------------------------------------------------
  return out;
}

}  // namespace {{ cookiecutter.device }}::factories

TORCH_LIBRARY_IMPL(aten, PrivateUse1, m) {
  m.impl("arange.start_out", TORCH_FN({{ cookiecutter.device }}::factories::arange_start_out));
}
