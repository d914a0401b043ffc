// SyncBatchNorm on {{ cookiecutter.device }}: the batch-norm statistics operators nn.SyncBatchNorm calls.
//
// nn.SyncBatchNorm (torch/nn/modules/_functions.py) accepts PrivateUse1 inputs and runs, forward:
// batch_norm_stats (each rank's per-channel mean and 1/std), an all_gather of them, then
// batch_norm_gather_stats_with_counts (the global statistics, and the running statistics'
// update) and batch_norm_elemt (normalize); backward: batch_norm_backward_reduce (per-channel sums
// of the gradient), an all_reduce of them, then batch_norm_backward_elemt. PyTorch has CUDA kernels
// only for these, so the CPU fallback has nothing to call. Here each is a launch: the host checks
// the arguments and allocates the results (their sizes follow from the input's: C statistics, or
// the input's shape), and the queued work computes them with CPU ATen operators (sum, mul,
// rsqrt...) on host aliases of the device memory, updating the running statistics in place. As CUDA's do, half and bfloat16 inputs get float statistics (the
// normalized output and the input gradient keep the input's dtype); `batch_norm_gather_stats`
// (one count for every rank) is served too.
// What a hardware team replaces: the bodies, with a fused per-channel reduction (stats, backward
// reduce) and a fused elementwise kernel (elemt, backward elemt) each.
#include "aten/kernel_support.h"

#include <c10/core/ScalarType.h>
#include <torch/library.h>

#include <tuple>
#include <vector>

namespace {{ cookiecutter.device }}::sync_batch_norm {

namespace {

// The dtype the statistics are in: float for half and bfloat16, as CUDA's kernels accumulate.
c10::ScalarType stats_type(c10::ScalarType t) {
  return (t == c10::kHalf || t == c10::kBFloat16) ? c10::kFloat : t;
}

at::Tensor in_type(const at::Tensor& t, c10::ScalarType type) { return t.scalar_type() == type ? t : t.to(type); }

// Every dimension but the channels (1): what per-channel reductions reduce.
std::vector<int64_t> reduced_dims(const at::Tensor& input) {
  TORCH_CHECK(input.dim() >= 2, "batch norm: expected an input of at least 2 dimensions, got ", input.dim());
  std::vector<int64_t> dims{0};
  for (int64_t d = 2; d < input.dim(); ++d) dims.push_back(d);
  return dims;
}

// A per-channel vector [C] shaped to broadcast against `input` [N, C, ...].
at::Tensor per_channel(const at::Tensor& v, const at::Tensor& input) {
  std::vector<int64_t> shape(input.dim(), 1);
  shape[1] = input.size(1);
  return v.reshape(shape);
}

at::Tensor channel_sum(const at::Tensor& t, const at::Tensor& input, c10::ScalarType type) {
  return t.sum(reduced_dims(input), /*keepdim=*/false, type);
}

std::tuple<at::Tensor, at::Tensor> stats_on_host(const at::Tensor& input, double eps) {
  const auto type = stats_type(input.scalar_type());
  const at::Tensor x = in_type(input, type);
  const auto dims = reduced_dims(input);
  at::Tensor mean = x.mean(dims, /*keepdim=*/false, std::nullopt);
  at::Tensor var = x.sub(per_channel(mean, input)).square().mean(dims, /*keepdim=*/false, std::nullopt);
  return {mean, var.add(eps).rsqrt()};
}

// The global statistics from each rank's (mean, invstd, count); updates the running statistics.
std::tuple<at::Tensor, at::Tensor> gather_on_host(const at::Tensor& mean, const at::Tensor& invstd,
                                                  std::optional<at::Tensor>& running_mean,
                                                  std::optional<at::Tensor>& running_var, double momentum, double eps,
                                                  const at::Tensor& counts) {
  const auto type = mean.scalar_type();
  const at::Tensor n = in_type(counts, type).reshape({-1, 1});  // [world, 1]
  const at::Tensor total = n.sum();
  const at::Tensor global_mean = mean.mul(n).sum(0).div(total);
  // each rank's biased variance is 1/invstd^2 - eps; add the spread of the ranks' means
  const at::Tensor var_n = n.mul(invstd.square().reciprocal().sub(eps).add(mean.sub(global_mean).square())).sum(0);
  const at::Tensor global_invstd = var_n.div(total).add(eps).rsqrt();
  if (running_mean.has_value() && running_mean->defined()) {
    running_mean->mul_(1 - momentum).add_(in_type(global_mean, running_mean->scalar_type()), momentum);
  }
  if (running_var.has_value() && running_var->defined()) {
    const at::Tensor unbiased = var_n.div(total.sub(1));
    running_var->mul_(1 - momentum).add_(in_type(unbiased, running_var->scalar_type()), momentum);
  }
  return {global_mean, global_invstd};
}

at::Tensor elemt_value(const at::Tensor& input, const std::optional<at::Tensor>& weight,
                       const std::optional<at::Tensor>& bias, const at::Tensor& mean, const at::Tensor& invstd) {
  const auto type = stats_type(input.scalar_type());
  at::Tensor y = in_type(input, type).sub(per_channel(mean, input)).mul(per_channel(in_type(invstd, type), input));
  if (weight.has_value() && weight->defined()) y = y.mul(per_channel(in_type(*weight, type), input));
  if (bias.has_value() && bias->defined()) y = y.add(per_channel(in_type(*bias, type), input));
  return y;
}

std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor> backward_reduce_on_host(
    const at::Tensor& grad_out, const at::Tensor& input, const at::Tensor& mean, const at::Tensor& invstd,
    const std::optional<at::Tensor>& weight, bool input_g, bool weight_g, bool bias_g) {
  const auto type = stats_type(input.scalar_type());
  const at::Tensor dy = in_type(grad_out, type);
  const at::Tensor xmu = in_type(input, type).sub(per_channel(mean, input));
  const at::Tensor sum_dy = channel_sum(dy, input, type);
  const at::Tensor sum_dy_xmu = channel_sum(dy.mul(xmu), input, type);
  const bool has_weight = weight.has_value() && weight->defined();
  const auto param_type = has_weight ? weight->scalar_type() : input.scalar_type();
  at::Tensor grad_weight, grad_bias;
  if (weight_g) grad_weight = in_type(sum_dy_xmu.mul(in_type(invstd, type)), param_type);
  if (bias_g) grad_bias = in_type(sum_dy, param_type);
  return {input_g ? sum_dy : at::Tensor(), input_g ? sum_dy_xmu : at::Tensor(), grad_weight, grad_bias};
}

at::Tensor backward_elemt_on_host(const at::Tensor& grad_out, const at::Tensor& input, const at::Tensor& mean,
                          const at::Tensor& invstd, const std::optional<at::Tensor>& weight, const at::Tensor& sum_dy,
                          const at::Tensor& sum_dy_xmu, const at::Tensor& count) {
  const auto type = stats_type(input.scalar_type());
  const at::Tensor total = in_type(count, type).sum();
  const at::Tensor mean_dy = in_type(sum_dy, type).div(total);
  const at::Tensor mean_dy_xmu = in_type(sum_dy_xmu, type).div(total);
  const at::Tensor inv = in_type(invstd, type);
  const at::Tensor xmu = in_type(input, type).sub(per_channel(mean, input));
  at::Tensor g = in_type(grad_out, type)
                     .sub(per_channel(mean_dy, input))
                     .sub(xmu.mul(per_channel(inv.square().mul(mean_dy_xmu), input)));
  at::Tensor scale = inv;
  if (weight.has_value() && weight->defined()) scale = scale.mul(in_type(*weight, type));
  return g.mul(per_channel(scale, input));
}


// ---- the operators: checks and results on the host, the computation queued -----------------------

c10::TensorOptions options(c10::ScalarType type) { return c10::TensorOptions().dtype(type); }

// A per-channel result [C] on the current device.
at::Tensor channel_result(const at::Tensor& input, c10::ScalarType type) {
  return kernels::empty_device({input.size(1)}, {}, options(type));
}

// A result shaped as `input`, in its dtype and suggested memory format (CUDA's kernels' layout).
at::Tensor input_like(const at::Tensor& input) {
  return kernels::empty_device(input.sizes(), {},
                               options(input.scalar_type()).memory_format(input.suggest_memory_format()));
}

void put(at::Tensor& out_alias, const at::Tensor& value) {
  if (out_alias.defined()) out_alias.copy_(value);
}

std::tuple<at::Tensor, at::Tensor> stats(const at::Tensor& input, double eps) {
  const c10::Device device = kernels::common_device("batch_norm_stats", kernels::CpuArgs::rejected, input);
  c10::DeviceGuard guard(device);
  reduced_dims(input);  // checks the dimensions
  TORCH_CHECK(input.numel() > 0 && input.numel() / input.size(1) > 0,
              "batch_norm_stats: expected more than 0 values per channel");
  const auto type = stats_type(input.scalar_type());
  at::Tensor mean = channel_result(input, type), invstd = channel_result(input, type);
  kernels::launch(device, "aten::batch_norm_stats",
                  [x = kernels::held(input), mean_h = kernels::held(mean), invstd_h = kernels::held(invstd),
                   eps]() mutable {
                    auto [m, i] = stats_on_host(x.get(), eps);
                    put(mean_h.get(), m);
                    put(invstd_h.get(), i);
                  });
  return {mean, invstd};
}

// The global statistics from each rank's (mean, invstd, count); updates the running statistics.
std::tuple<at::Tensor, at::Tensor> gather_stats_with_counts(const at::Tensor& input, const at::Tensor& mean,
                                                            const at::Tensor& invstd,
                                                            const std::optional<at::Tensor>& running_mean,
                                                            const std::optional<at::Tensor>& running_var,
                                                            double momentum, double eps, const at::Tensor& counts) {
  const char* op = "batch_norm_gather_stats_with_counts";
  const c10::Device device =
      kernels::common_device(op, kernels::CpuArgs::rejected, input, mean, invstd, running_mean, running_var, counts);
  c10::DeviceGuard guard(device);
  TORCH_CHECK(mean.dim() == 2 && invstd.sizes() == mean.sizes(), op, ": expected mean and invstd of size [world, C], got ",
              mean.sizes(), " and ", invstd.sizes());
  TORCH_CHECK(counts.numel() == mean.size(0), op, ": expected ", mean.size(0), " counts, got ", counts.numel());
  const auto type = mean.scalar_type();
  at::Tensor global_mean = kernels::empty_device({mean.size(1)}, {}, options(type));
  at::Tensor global_invstd = kernels::empty_device({mean.size(1)}, {}, options(type));
  kernels::launch(device, "aten::batch_norm_gather_stats_with_counts",
                  [mean_in = kernels::held(mean), invstd_in = kernels::held(invstd),
                   rm = kernels::held(running_mean), rv = kernels::held(running_var), n = kernels::held(counts),
                   mean_h = kernels::held(global_mean), invstd_h = kernels::held(global_invstd), momentum,
                   eps]() mutable {
                    auto [m, i] = gather_on_host(mean_in.get(), invstd_in.get(), rm.get(), rv.get(), momentum, eps,
                                                 n.get());
                    put(mean_h.get(), m);
                    put(invstd_h.get(), i);
                  });
  return {global_mean, global_invstd};
}

std::tuple<at::Tensor, at::Tensor> gather_stats(const at::Tensor& input, const at::Tensor& mean, const at::Tensor& invstd,
                                                const std::optional<at::Tensor>& running_mean,
                                                const std::optional<at::Tensor>& running_var, double momentum, double eps,
                                                int64_t count) {
  c10::DeviceGuard guard(kernels::common_device("batch_norm_gather_stats", kernels::CpuArgs::rejected, mean));
  // the same count for every rank: a new device tensor, filled in stream order
  at::Tensor counts = kernels::empty_device({mean.dim() > 0 ? mean.size(0) : 0}, {}, options(mean.scalar_type()));
  counts.fill_(static_cast<double>(count));
  return gather_stats_with_counts(input, mean, invstd, running_mean, running_var, momentum, eps, counts);
}

void queue_elemt(c10::Device device, const at::Tensor& input, const std::optional<at::Tensor>& weight,
                 const std::optional<at::Tensor>& bias, const at::Tensor& mean, const at::Tensor& invstd,
                 const at::Tensor& out) {
  kernels::launch(device, "aten::batch_norm_elemt",
                  [x = kernels::held(input), w = kernels::held(weight), b = kernels::held(bias),
                   m = kernels::held(mean), i = kernels::held(invstd), out_h = kernels::held(out)]() mutable {
                    put(out_h.get(), elemt_value(x.get(), w.get(), b.get(), m.get(), i.get()));
                  });
}

at::Tensor elemt(const at::Tensor& input, const std::optional<at::Tensor>& weight, const std::optional<at::Tensor>& bias,
                 const at::Tensor& mean, const at::Tensor& invstd, double /*eps*/) {
  const c10::Device device =
      kernels::common_device("batch_norm_elemt", kernels::CpuArgs::rejected, input, weight, bias, mean, invstd);
  c10::DeviceGuard guard(device);
  reduced_dims(input);
  at::Tensor out = input_like(input);
  queue_elemt(device, input, weight, bias, mean, invstd, out);
  return out;
}

at::Tensor& elemt_out(const at::Tensor& input, const std::optional<at::Tensor>& weight,
                      const std::optional<at::Tensor>& bias, const at::Tensor& mean, const at::Tensor& invstd, double /*eps*/,
                      at::Tensor& out) {
  const c10::Device device =
      kernels::common_device("batch_norm_elemt", kernels::CpuArgs::rejected, input, weight, bias, mean, invstd, out);
  c10::DeviceGuard guard(device);
  reduced_dims(input);
  if (!out.sizes().equals(input.sizes())) out.resize_(input.sizes());
  queue_elemt(device, input, weight, bias, mean, invstd, out);
  return out;
}

std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor> backward_reduce(
    const at::Tensor& grad_out, const at::Tensor& input, const at::Tensor& mean, const at::Tensor& invstd,
    const std::optional<at::Tensor>& weight, bool input_g, bool weight_g, bool bias_g) {
  const c10::Device device = kernels::common_device("batch_norm_backward_reduce", kernels::CpuArgs::rejected, grad_out,
                                                    input, mean, invstd, weight);
  c10::DeviceGuard guard(device);
  reduced_dims(input);
  const auto type = stats_type(input.scalar_type());
  const bool has_weight = weight.has_value() && weight->defined();
  const auto param_type = has_weight ? weight->scalar_type() : input.scalar_type();
  at::Tensor sum_dy, sum_dy_xmu, grad_weight, grad_bias;
  if (input_g) {
    sum_dy = channel_result(input, type);
    sum_dy_xmu = channel_result(input, type);
  }
  if (weight_g) grad_weight = channel_result(input, param_type);
  if (bias_g) grad_bias = channel_result(input, param_type);
  kernels::launch(device, "aten::batch_norm_backward_reduce",
                  [dy = kernels::held(grad_out), x = kernels::held(input), m = kernels::held(mean),
                   i = kernels::held(invstd), w = kernels::held(weight), sum_dy_h = kernels::held(sum_dy),
                   sum_dy_xmu_h = kernels::held(sum_dy_xmu), gw_h = kernels::held(grad_weight),
                   gb_h = kernels::held(grad_bias), input_g, weight_g, bias_g]() mutable {
                    auto [a, b, c, d] =
                        backward_reduce_on_host(dy.get(), x.get(), m.get(), i.get(), w.get(), input_g, weight_g, bias_g);
                    put(sum_dy_h.get(), a);
                    put(sum_dy_xmu_h.get(), b);
                    put(gw_h.get(), c);
                    put(gb_h.get(), d);
                  });
  return {sum_dy, sum_dy_xmu, grad_weight, grad_bias};
}

at::Tensor backward_elemt(const at::Tensor& grad_out, const at::Tensor& input, const at::Tensor& mean,
                          const at::Tensor& invstd, const std::optional<at::Tensor>& weight, const at::Tensor& sum_dy,
                          const at::Tensor& sum_dy_xmu, const at::Tensor& count) {
  const c10::Device device = kernels::common_device("batch_norm_backward_elemt", kernels::CpuArgs::rejected, grad_out,
                                                    input, mean, invstd, weight, sum_dy, sum_dy_xmu, count);
  c10::DeviceGuard guard(device);
  reduced_dims(input);
  at::Tensor grad_input = input_like(input);
  kernels::launch(device, "aten::batch_norm_backward_elemt",
                  [dy = kernels::held(grad_out), x = kernels::held(input), m = kernels::held(mean),
                   i = kernels::held(invstd), w = kernels::held(weight), s = kernels::held(sum_dy),
                   sx = kernels::held(sum_dy_xmu), n = kernels::held(count),
                   out_h = kernels::held(grad_input)]() mutable {
                    put(out_h.get(),
                        backward_elemt_on_host(dy.get(), x.get(), m.get(), i.get(), w.get(), s.get(), sx.get(), n.get()));
                  });
  return grad_input;
}

}  // namespace

}  // namespace {{ cookiecutter.device }}::sync_batch_norm

TORCH_LIBRARY_IMPL(aten, PrivateUse1, m) {
  m.impl("batch_norm_stats", TORCH_FN({{ cookiecutter.device }}::sync_batch_norm::stats));
  m.impl("batch_norm_gather_stats", TORCH_FN({{ cookiecutter.device }}::sync_batch_norm::gather_stats));
  m.impl("batch_norm_gather_stats_with_counts", TORCH_FN({{ cookiecutter.device }}::sync_batch_norm::gather_stats_with_counts));
  m.impl("batch_norm_elemt", TORCH_FN({{ cookiecutter.device }}::sync_batch_norm::elemt));
  m.impl("batch_norm_elemt.out", TORCH_FN({{ cookiecutter.device }}::sync_batch_norm::elemt_out));
  m.impl("batch_norm_backward_reduce", TORCH_FN({{ cookiecutter.device }}::sync_batch_norm::backward_reduce));
  m.impl("batch_norm_backward_elemt", TORCH_FN({{ cookiecutter.device }}::sync_batch_norm::backward_elemt));
}
