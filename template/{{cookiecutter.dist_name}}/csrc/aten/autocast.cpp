// Autocast (AMP) for {{ cookiecutter.device }}: what torch.autocast("{{ cookiecutter.device }}", dtype=...) runs.
//
// Matrix products and convolutions run in the autocast dtype (bfloat16 by default, float16 allowed),
// numerically sensitive ops run in float32, and every other op falls through to its normal kernel.
// The kernels are boxed: one function per policy casts the floating-point {{ cookiecutter.device }} tensors
// on the stack and redispatches below autocast, so this file needs only the dispatcher's headers
// (ATen/autocast_mode.h pulls in all of ATen and would cost ~14 s of every build).
// The Python side (torch.{{ cookiecutter.device }}.get_amp_supported_dtype) says which dtypes are allowed.
// What a hardware team replaces: the two lists, to match what its hardware computes fast and well.
#include <ATen/core/Tensor.h>
#include <ATen/ops/_to_copy_ops.h>
#include <c10/core/impl/LocalDispatchKeySet.h>
#include <torch/library.h>

namespace at::autocast {
// Exported by libtorch_cpu and declared in ATen/autocast_mode.h; `backendgen check` verifies it.
TORCH_API at::ScalarType get_autocast_dtype(at::DeviceType device_type);
}  // namespace at::autocast

namespace {{ cookiecutter.device }}::autocast {

enum class Policy { lower_precision, fp32 };

at::Tensor cast(const at::Tensor& t, at::ScalarType to) {
  if (!t.defined() || !t.is_floating_point() || t.scalar_type() == to ||
      t.device().type() != c10::DeviceType::PrivateUse1) {
    return t;
  }
  return at::_ops::_to_copy::call(t, to, std::nullopt, std::nullopt, std::nullopt, false, std::nullopt);
}

template <Policy policy>
void run(const c10::OperatorHandle& op, c10::DispatchKeySet keys, torch::jit::Stack* stack) {
  const at::ScalarType to =
      policy == Policy::fp32 ? at::kFloat : at::autocast::get_autocast_dtype(c10::DeviceType::PrivateUse1);
  const size_t n = op.schema().arguments().size();
  for (auto it = stack->end() - static_cast<std::ptrdiff_t>(n); it != stack->end(); ++it) {
    if (it->isTensor()) {
      *it = cast(it->toTensor(), to);
    } else if (it->isTensorList()) {
      c10::List<at::Tensor> list = it->toTensorList();
      for (size_t i = 0; i < list.size(); ++i) list.set(i, cast(list.get(i), to));
      *it = list;
    }
  }
  c10::impl::ExcludeDispatchKeyGuard no_autocast(c10::DispatchKey::AutocastPrivateUse1);
  op.redispatchBoxed(keys.remove(c10::DispatchKey::AutocastPrivateUse1), stack);
}

}  // namespace {{ cookiecutter.device }}::autocast

TORCH_LIBRARY_IMPL(_, AutocastPrivateUse1, m) {
  m.fallback(torch::CppFunction::makeFallthrough());
}

TORCH_LIBRARY_IMPL(aten, AutocastPrivateUse1, m) {
  using {{ cookiecutter.device }}::autocast::Policy;
  using {{ cookiecutter.device }}::autocast::run;
  // lower precision: the autocast dtype
  for (const char* op : {"mm", "bmm", "addmm", "addbmm", "baddbmm", "matmul", "linear", "conv1d", "conv2d", "conv3d"}) {
    m.impl(op, torch::CppFunction::makeFromBoxedFunction<&run<Policy::lower_precision>>());
  }
  // float32: ops that lose too much in lower precision
  for (const char* op : {"softmax.int", "log_softmax.int", "layer_norm", "mse_loss", "cross_entropy_loss", "exp", "log",
                         "pow.Tensor_Scalar", "sum"}) {
    m.impl(op, torch::CppFunction::makeFromBoxedFunction<&run<Policy::fp32>>());
  }
}
