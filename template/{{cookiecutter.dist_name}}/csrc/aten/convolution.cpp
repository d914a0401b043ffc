// Convolutions on {{ cookiecutter.device }}: the two entry points PyTorch reserves for out-of-tree backends.
//
// nn.Conv*d on a PrivateUse1 tensor reaches aten::convolution_overrideable (forward) and
// aten::convolution_backward_overrideable (backward); their CPU versions only raise, so the CPU
// fallback cannot serve them. Here they are launches, like every kernel: on the host, the
// operator on meta tensors decides the results' shapes, which are allocated in the memory format
// PyTorch predicts for an overrideable backend (at::native::_determine_backend_memory_format:
// torch.compile's fake kernels promise that layout and the compiled graph asserts it); the queued
// computation runs PyTorch's CPU convolution on the device memory and copies into the results.
// What a hardware team replaces: the queued computations, with its SDK's convolution kernels.
#include "aten/kernel_support.h"

#include <ATen/ops/convolution_backward_ops.h>
#include <ATen/native/ConvUtils.h>
#include <ATen/ops/convolution_ops.h>
#include <torch/library.h>

namespace {{ cookiecutter.device }}::convolution {

// A tensor shaped like `t` in the layout PyTorch expects of this backend's convolution results for
// `input` and `weight` (all meta tensors: metadata only); a 1-d convolution's layout is decided as
// a 2-d one's, as PyTorch does.
at::Tensor in_promised_layout(const at::Tensor& t, const at::Tensor& input, const at::Tensor& weight) {
  if (!t.defined() || t.dim() < 3) return t;
  const bool one_d = weight.dim() == 3;
  const at::Tensor in2 = one_d ? input.contiguous().unsqueeze(2) : input;
  const at::Tensor w2 = one_d ? weight.unsqueeze(2) : weight;
  const auto format = at::native::_determine_backend_memory_format(in2, w2, at::native::ConvBackend::Overrideable);
  if (one_d && format == at::MemoryFormat::ChannelsLast) return t.unsqueeze(2).contiguous(format).squeeze(2);
  return t.contiguous(format);
}

at::Tensor forward(const at::Tensor& input, const at::Tensor& weight, const std::optional<at::Tensor>& bias,
                   c10::SymIntArrayRef stride, c10::SymIntArrayRef padding, c10::SymIntArrayRef dilation,
                   bool transposed, c10::SymIntArrayRef output_padding, c10::SymInt groups) {
  const c10::Device device = kernels::common_device("aten::convolution_overrideable", kernels::CpuArgs::rejected,
                                                    input, weight, bias);
  c10::DeviceGuard guard(device);
  // ---- on the host: the result's shape (the operator on meta tensors) and layout -------------
  const at::Tensor input_m = kernels::meta_like(input), weight_m = kernels::meta_like(weight);
  const at::Tensor out_m = at::_ops::convolution::call(input_m, weight_m, kernels::meta_like(bias), stride, padding,
                                                       dilation, transposed, output_padding, groups);
  at::Tensor out = kernels::empty_like_meta(in_promised_layout(out_m, input_m, weight_m), device);
  // ---- device computation, queued on the current stream: replace with your SDK's convolution --
  kernels::launch(device, "aten::convolution_overrideable",
                  [input = kernels::held(input), weight = kernels::held(weight), bias = kernels::held(bias),
                   stride = kernels::keep(stride), padding = kernels::keep(padding), dilation = kernels::keep(dilation),
                   transposed, output_padding = kernels::keep(output_padding), groups, out_h = kernels::held(out)]() mutable {
                    kernels::copy_result(out_h.get(), at::_ops::convolution::call(
                        input.get(), weight.get(), bias.get(), kernels::pass(stride), kernels::pass(padding),
                        kernels::pass(dilation), transposed, kernels::pass(output_padding), groups));
                  });
  return out;
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> backward(
    const at::Tensor& grad_output, const at::Tensor& input, const at::Tensor& weight, c10::SymIntArrayRef stride,
    c10::SymIntArrayRef padding, c10::SymIntArrayRef dilation, bool transposed, c10::SymIntArrayRef output_padding,
    c10::SymInt groups, std::array<bool, 3> output_mask) {
  const c10::Device device = kernels::common_device("aten::convolution_backward_overrideable",
                                                    kernels::CpuArgs::rejected, grad_output, input, weight);
  c10::DeviceGuard guard(device);
  std::optional<c10::SymInt> bias_size;
  if (output_mask[2]) bias_size = transposed ? weight.sym_size(1) * groups : weight.sym_size(0);
  std::optional<std::vector<c10::SymInt>> bias_sizes;
  if (bias_size.has_value()) bias_sizes = std::vector<c10::SymInt>{*bias_size};
  // ---- on the host: the gradients' shapes (the operator on meta tensors) and layouts ---------
  const at::Tensor input_m = kernels::meta_like(input), weight_m = kernels::meta_like(weight);
  auto [gi_m, gw_m, gb_m] = at::_ops::convolution_backward::call(
      kernels::meta_like(grad_output), input_m, weight_m, kernels::pass(bias_sizes), stride, padding, dilation,
      transposed, output_padding, groups, output_mask);
  at::Tensor gi = kernels::empty_like_meta(in_promised_layout(gi_m, input_m, weight_m), device);
  at::Tensor gw = kernels::empty_like_meta(in_promised_layout(gw_m, input_m, weight_m), device);
  at::Tensor gb = kernels::empty_like_meta(gb_m, device);
  // ---- device computation, queued on the current stream: replace with your SDK's convolution --
  kernels::launch(device, "aten::convolution_backward_overrideable",
                  [grad_output = kernels::held(grad_output), input = kernels::held(input), weight = kernels::held(weight),
                   bias_sizes, stride = kernels::keep(stride), padding = kernels::keep(padding),
                   dilation = kernels::keep(dilation), transposed, output_padding = kernels::keep(output_padding),
                   groups, output_mask, gi_h = kernels::held(gi), gw_h = kernels::held(gw),
                   gb_h = kernels::held(gb)]() mutable {
                    auto [r_gi, r_gw, r_gb] = at::_ops::convolution_backward::call(
                        grad_output.get(), input.get(), weight.get(), kernels::pass(bias_sizes), kernels::pass(stride),
                        kernels::pass(padding), kernels::pass(dilation), transposed, kernels::pass(output_padding),
                        groups, output_mask);
                    kernels::copy_result(gi_h.get(), r_gi);
                    kernels::copy_result(gw_h.get(), r_gw);
                    kernels::copy_result(gb_h.get(), r_gb);
                  });
  return {gi, gw, gb};
}

}  // namespace {{ cookiecutter.device }}::convolution

TORCH_LIBRARY_IMPL(aten, PrivateUse1, m) {
  m.impl("convolution_overrideable", TORCH_FN({{ cookiecutter.device }}::convolution::forward));
  m.impl("convolution_backward_overrideable", TORCH_FN({{ cookiecutter.device }}::convolution::backward));
}
