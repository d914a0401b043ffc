// Convolutions on {{ cookiecutter.device }}: the two entry points PyTorch reserves for out-of-tree backends.
//
// nn.Conv*d on a PrivateUse1 tensor reaches aten::convolution_overrideable (forward) and
// aten::convolution_backward_overrideable (backward); their CPU versions only raise, so the CPU
// fallback cannot serve them. Here they run PyTorch's CPU convolution on the device memory.
// Results come back in the memory format PyTorch predicts for an overrideable backend
// (at::native::_determine_backend_memory_format): torch.compile's fake kernels promise that layout
// and the compiled graph asserts it, while the CPU kernel may answer channels_last.
// What a hardware team replaces: both bodies, with its SDK's convolution kernels.
#include "aten/kernel_support.h"

#include <ATen/ops/convolution_backward_ops.h>
#include <ATen/native/ConvUtils.h>
#include <ATen/ops/convolution_ops.h>
#include <torch/library.h>

namespace {{ cookiecutter.device }}::convolution {

// `host` (a CPU kernel's result for `input` and `weight`) in the layout PyTorch expects of this
// backend's convolution; a 1-d convolution's layout is decided as a 2-d one's, as PyTorch does.
at::Tensor in_promised_layout(const at::Tensor& host, const at::Tensor& input, const at::Tensor& weight) {
  if (!host.defined() || host.dim() < 3) return host;
  const bool one_d = weight.dim() == 3;
  const at::Tensor in2 = one_d ? input.contiguous().unsqueeze(2) : input;
  const at::Tensor w2 = one_d ? weight.unsqueeze(2) : weight;
  const auto format = at::native::_determine_backend_memory_format(in2, w2, at::native::ConvBackend::Overrideable);
  if (one_d && format == at::MemoryFormat::ChannelsLast) return host.unsqueeze(2).contiguous(format).squeeze(2);
  return host.contiguous(format);
}

at::Tensor forward(const at::Tensor& input, const at::Tensor& weight, const std::optional<at::Tensor>& bias,
                   c10::SymIntArrayRef stride, c10::SymIntArrayRef padding, c10::SymIntArrayRef dilation,
                   bool transposed, c10::SymIntArrayRef output_padding, c10::SymInt groups) {
  const c10::Device device = kernels::device_of(input);
  c10::OptionalDeviceGuard guard(device);
  kernels::StreamScope on_stream(device, "convolution");
  at::Tensor out = at::_ops::convolution::call(kernels::host_alias(input), kernels::host_alias(weight),
                                               kernels::host_alias(bias), stride, padding, dilation, transposed,
                                               output_padding, groups);
  return kernels::to_device(in_promised_layout(out, input, weight), device);
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> backward(
    const at::Tensor& grad_output, const at::Tensor& input, const at::Tensor& weight, c10::SymIntArrayRef stride,
    c10::SymIntArrayRef padding, c10::SymIntArrayRef dilation, bool transposed, c10::SymIntArrayRef output_padding,
    c10::SymInt groups, std::array<bool, 3> output_mask) {
  const c10::Device device = kernels::device_of(input);
  c10::OptionalDeviceGuard guard(device);
  kernels::StreamScope on_stream(device, "convolution_backward");
  std::optional<c10::SymInt> bias_size;
  if (output_mask[2]) bias_size = transposed ? weight.sym_size(1) * groups : weight.sym_size(0);
  std::optional<c10::SymIntArrayRef> bias_sizes;
  if (bias_size.has_value()) bias_sizes = c10::SymIntArrayRef(&*bias_size, 1);
  auto [gi, gw, gb] = at::_ops::convolution_backward::call(
      kernels::host_alias(grad_output), kernels::host_alias(input), kernels::host_alias(weight), bias_sizes, stride,
      padding, dilation, transposed, output_padding, groups, output_mask);
  return {kernels::to_device(in_promised_layout(gi, input, weight), device),
          kernels::to_device(in_promised_layout(gw, input, weight), device), kernels::to_device(gb, device)};
}

}  // namespace {{ cookiecutter.device }}::convolution

TORCH_LIBRARY_IMPL(aten, PrivateUse1, m) {
  m.impl("convolution_overrideable", TORCH_FN({{ cookiecutter.device }}::convolution::forward));
  m.impl("convolution_backward_overrideable", TORCH_FN({{ cookiecutter.device }}::convolution::backward));
}
