// Batch norm's forward on {{ cookiecutter.device }} (aten::native_batch_norm): a launch, like every kernel.
//
// Written here rather than by add-op (its backward is add-op's, in csrc/aten/ops/) because PyTorch's
// meta function for it disagrees with the CPU in eval mode: it gives save_mean and save_invstd C
// elements where the CPU kernel returns none, and a queued kernel must decide its outputs before
// it runs. So the host checks the arguments and takes the output's shape from the operator on
// meta tensors (or, on a torch without that meta kernel, the input's shape in its suggested memory
// format, as the CPU kernel gives it), and shapes the saved statistics as the CPU does (C elements when training, none in
// eval; float for a reduced-precision input with float parameters). The queued computation runs
// PyTorch's CPU kernel on the device memory; in training it updates running_mean and running_var
// in place, in stream order.
// What a hardware team replaces: the queued computation, with its SDK's batch norm kernel.
#include "aten/kernel_support.h"

#include <ATen/ops/native_batch_norm_ops.h>
#include <torch/library.h>

#include <tuple>

namespace {{ cookiecutter.device }}::batch_norm {

using Result = std::tuple<at::Tensor, at::Tensor, at::Tensor>;

Result forward(const at::Tensor& input, const std::optional<at::Tensor>& weight, const std::optional<at::Tensor>& bias,
               const std::optional<at::Tensor>& running_mean, const std::optional<at::Tensor>& running_var,
               bool training, double momentum, double eps) {
  const c10::Device device = kernels::common_device("aten::native_batch_norm", kernels::CpuArgs::rejected, input, weight,
                                                    bias, running_mean, running_var);
  c10::DeviceGuard guard(device);
  // ---- on the host: check the arguments and decide the outputs ------------------------------
  Result m;
  at::Tensor out;
  c10::ScalarType stats_dtype;
  if (kernels::on_meta([&] {
        m = at::_ops::native_batch_norm::call(kernels::meta_like(input), kernels::meta_like(weight),
                                              kernels::meta_like(bias), kernels::meta_like(running_mean),
                                              kernels::meta_like(running_var), training, momentum, eps);
      })) {
    out = kernels::empty_like_meta(std::get<0>(m), device);
    stats_dtype = std::get<1>(m).scalar_type();
  } else {  // no meta kernel in the installed torch: the CPU kernel's geometry and dtypes
    TORCH_CHECK(input.dim() >= 2, "batch_norm: expected an input of at least 2 dimensions, got ", input.dim());
    out = kernels::empty_device(input.sizes(), {},
                                c10::TensorOptions().dtype(input.scalar_type()).memory_format(input.suggest_memory_format()));
    const bool reduced = input.scalar_type() == c10::kHalf || input.scalar_type() == c10::kBFloat16;
    const bool float_params = weight.has_value() && weight->defined() && weight->scalar_type() == c10::kFloat;
    stats_dtype = reduced && float_params ? c10::kFloat : input.scalar_type();
  }
  const auto options = c10::TensorOptions().dtype(stats_dtype);
  const std::vector<int64_t> stats_size{training ? input.size(1) : 0};
  at::Tensor save_mean = kernels::empty_device(stats_size, {}, options);
  at::Tensor save_invstd = kernels::empty_device(stats_size, {}, options);
  // ---- device computation, queued on the current stream: replace with your SDK's kernel ----
  kernels::launch(device, "aten::native_batch_norm",
                  [input = kernels::held(input), weight = kernels::held(weight), bias = kernels::held(bias),
                   running_mean = kernels::held(running_mean), running_var = kernels::held(running_var), training,
                   momentum, eps, out_h = kernels::held(out), mean_h = kernels::held(save_mean),
                   invstd_h = kernels::held(save_invstd)]() mutable {
                    auto [o, mean, invstd] = at::_ops::native_batch_norm::call(
                        input.get(), weight.get(), bias.get(), running_mean.get(), running_var.get(), training,
                        momentum, eps);
                    kernels::copy_result(out_h.get(), o);
                    kernels::copy_result(mean_h.get(), mean);
                    kernels::copy_result(invstd_h.get(), invstd);
                  });
  return {out, save_mean, save_invstd};
}

}  // namespace {{ cookiecutter.device }}::batch_norm

TORCH_LIBRARY_IMPL(aten, PrivateUse1, m) {
  m.impl("native_batch_norm", TORCH_FN({{ cookiecutter.device }}::batch_norm::forward));
}
