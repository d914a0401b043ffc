// Operators whose CPU kernel accepts less than CUDA's, where code written for accelerators relies on
// what CUDA accepts: the CPU fallback would pass such a call to a CPU kernel that refuses it.
//
// - histc of integer tensors: CUDA counts integers, the CPU kernel only floating point. Hugging
//   Face's mixture-of-experts routing (Mixtral, Qwen-MoE, ...) calls torch.histc on integer expert
//   ids on every device but the CPU and MPS. Here integers are counted through float64 (exact up to
//   2^53) and the counts come back in the input's dtype, as on CUDA. A launch like every kernel: the
//   output's size is `bins` whatever the data, so the host checks the arguments, allocates the
//   counts and queues the CPU kernel on host aliases; only an error that depends on the data (a
//   range of NaN or infinite values) is reported later, by the next call that waits for the stream,
//   as on CUDA.
//
// What a hardware team replaces: the bodies, with its SDK's kernels (a histogram kernel that takes
// integers directly).
#include "aten/kernel_support.h"

#include <ATen/ops/histc_ops.h>
#include <torch/library.h>

namespace {{ cookiecutter.device }}::cuda_parity {

namespace {

// The counts of `host` (a host alias, in the queued work), in host's dtype.
at::Tensor histc_on_host(const at::Tensor& host, int64_t bins, const c10::Scalar& min, const c10::Scalar& max) {
  const bool integral = c10::isIntegralType(host.scalar_type(), /*includeBool=*/false);
  at::Tensor counts = at::_ops::histc::call(integral ? host.to(at::kDouble) : host, bins, min, max);
  return counts;  // copied into the output, in its dtype
}

// What the CPU kernel checks before it reads the data, checked on the host.
void check_histc(const at::Tensor& self, int64_t bins, const c10::Scalar& min, const c10::Scalar& max) {
  TORCH_CHECK(bins > 0, "torch.histc: bins must be > 0, but got ", bins);
  TORCH_CHECK(self.scalar_type() != at::kBool && !self.is_complex(), "torch.histc: not implemented for '",
              self.scalar_type(), "'");
  TORCH_CHECK(min.toDouble() <= max.toDouble(), "torch.histc: max must be larger than min");
}

// Queues the counting of `self` into `out` (bins elements of self's dtype).
void queue_histc(c10::Device device, const at::Tensor& self, int64_t bins, const c10::Scalar& min,
                 const c10::Scalar& max, const at::Tensor& out) {
  kernels::launch(device, "aten::histc",
                  [in = kernels::held(self), out_h = kernels::held(out), bins, min, max]() mutable {
                    out_h.get().copy_(histc_on_host(in.get(), bins, min, max));
                  });
}

}  // namespace

at::Tensor histc(const at::Tensor& self, int64_t bins, const c10::Scalar& min, const c10::Scalar& max) {
  const c10::Device device = kernels::common_device("aten::histc", kernels::CpuArgs::rejected, self);
  c10::DeviceGuard guard(device);
  check_histc(self, bins, min, max);
  at::Tensor out = kernels::empty_device({bins}, {}, c10::TensorOptions().dtype(self.scalar_type()));
  queue_histc(device, self, bins, min, max, out);
  return out;
}

at::Tensor& histc_out(const at::Tensor& self, int64_t bins, const c10::Scalar& min, const c10::Scalar& max,
                      at::Tensor& out) {
  const c10::Device device = kernels::common_device("aten::histc.out", kernels::CpuArgs::rejected, self, out);
  c10::DeviceGuard guard(device);
  TORCH_CHECK(out.scalar_type() == self.scalar_type(), "torch.histc: input tensor and out tensor should have the same dtype, but got ",
              self.scalar_type(), " and ", out.scalar_type());
  check_histc(self, bins, min, max);
  if (out.dim() != 1 || out.size(0) != bins) out.resize_({bins});
  queue_histc(device, self, bins, min, max, out);
  return out;
}

}  // namespace {{ cookiecutter.device }}::cuda_parity

TORCH_LIBRARY_IMPL(aten, PrivateUse1, m) {
  m.impl("histc", TORCH_FN({{ cookiecutter.device }}::cuda_parity::histc));
  m.impl("histc.out", TORCH_FN({{ cookiecutter.device }}::cuda_parity::histc_out));
}
