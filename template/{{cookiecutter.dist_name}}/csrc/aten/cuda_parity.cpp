// Operators whose CPU kernel accepts less than CUDA's, where code written for accelerators relies on
// what CUDA accepts: the CPU fallback would pass such a call to a CPU kernel that refuses it.
//
// - histc of integer tensors: CUDA counts integers, the CPU kernel only floating point. Hugging
//   Face's mixture-of-experts routing (Mixtral, Qwen-MoE, ...) calls torch.histc on integer expert
//   ids on every device but the CPU and MPS. Here integers are counted through float64 (exact up to
//   2^53) and the counts come back in the input's dtype, as on CUDA.
//
// What a hardware team replaces: the bodies, with its SDK's kernels (a histogram kernel that takes
// integers directly).
#include "aten/kernel_support.h"

#include <ATen/ops/_copy_from_and_resize_ops.h>
#include <ATen/ops/histc_ops.h>
#include <torch/library.h>

namespace {{ cookiecutter.device }}::cuda_parity {

// The counts of `self` (a device tensor) on the host, in self's dtype.
at::Tensor histc_on_host(const at::Tensor& self, int64_t bins, const c10::Scalar& min, const c10::Scalar& max) {
  const at::Tensor host = kernels::host_alias(self);
  const bool integral = c10::isIntegralType(self.scalar_type(), /*includeBool=*/false);
  at::Tensor counts = at::_ops::histc::call(integral ? host.to(at::kDouble) : host, bins, min, max);
  return integral ? counts.to(self.scalar_type()) : counts;
}

at::Tensor histc(const at::Tensor& self, int64_t bins, const c10::Scalar& min, const c10::Scalar& max) {
  const c10::Device device = kernels::common_device("aten::histc", kernels::CpuArgs::rejected, self);
  c10::OptionalDeviceGuard guard(device);
  kernels::StreamScope on_stream(device, "histc");
  return kernels::to_device(histc_on_host(self, bins, min, max), device);
}

at::Tensor& histc_out(const at::Tensor& self, int64_t bins, const c10::Scalar& min, const c10::Scalar& max,
                      at::Tensor& out) {
  const c10::Device device = kernels::common_device("aten::histc.out", kernels::CpuArgs::rejected, self, out);
  c10::OptionalDeviceGuard guard(device);
  TORCH_CHECK(out.scalar_type() == self.scalar_type(), "torch.histc: input tensor and out tensor should have the same dtype, but got ",
              self.scalar_type(), " and ", out.scalar_type());
  at::Tensor counts;
  {
    kernels::StreamScope on_stream(device, "histc");
    counts = histc_on_host(self, bins, min, max);
  }
  // resize `out` and copy the counts in, in stream order, as any out= result
  at::_ops::_copy_from_and_resize::call(counts, out);
  return out;
}

}  // namespace {{ cookiecutter.device }}::cuda_parity

TORCH_LIBRARY_IMPL(aten, PrivateUse1, m) {
  m.impl("histc", TORCH_FN({{ cookiecutter.device }}::cuda_parity::histc));
  m.impl("histc.out", TORCH_FN({{ cookiecutter.device }}::cuda_parity::histc_out));
}
