// Autocast (AMP) for {{ cookiecutter.device }}: the policies torch.autocast("{{ cookiecutter.device }}", dtype=...) applies.
//
// Each policy is a boxed kernel: it casts the floating-point {{ cookiecutter.device }} tensors on the stack and
// redispatches below autocast, so this file needs only the dispatcher's headers (ATen/autocast_mode.h
// pulls in all of ATen and would cost ~14 s of every build). Which operator gets which policy is the
// autocast table, kept in backendgen.json and registered by csrc/aten/ops/generated/registration.cpp:
// `backendgen amp list` shows it, `backendgen amp set OP POLICY` changes it (matrix products and
// convolutions in the autocast dtype, numerically sensitive operators in float32, by default).
// The Python side (torch.{{ cookiecutter.device }}.get_amp_supported_dtype) says which dtypes are allowed.
// What a hardware team replaces: the table (with `backendgen amp set`), to match what its hardware
// computes fast and well; a policy of its own goes here, beside these.
#include <ATen/core/Tensor.h>
#include <ATen/ops/_to_copy_ops.h>
#include <c10/core/impl/LocalDispatchKeySet.h>
#include <torch/library.h>

namespace at::autocast {
// Exported by libtorch_cpu and declared in ATen/autocast_mode.h; `backendgen check` verifies it.
TORCH_API at::ScalarType get_autocast_dtype(at::DeviceType device_type);
}  // namespace at::autocast

namespace {{ cookiecutter.device }}::autocast {

namespace {

at::Tensor cast(const at::Tensor& t, at::ScalarType to) {
  if (!t.defined() || !t.is_floating_point() || t.scalar_type() == to ||
      t.device().type() != c10::DeviceType::PrivateUse1) {
    return t;
  }
  return at::_ops::_to_copy::call(t, to, std::nullopt, std::nullopt, std::nullopt, false, std::nullopt);
}

// Calls `fn` on every tensor argument of the call on the stack (lists included).
template <typename Fn>
void for_each_tensor(const c10::OperatorHandle& op, torch::jit::Stack* stack, Fn fn) {
  const size_t n = op.schema().arguments().size();
  for (auto it = stack->end() - static_cast<std::ptrdiff_t>(n); it != stack->end(); ++it) {
    if (it->isTensor()) {
      *it = fn(it->toTensor());
    } else if (it->isTensorList()) {
      c10::List<at::Tensor> list = it->toTensorList();
      for (size_t i = 0; i < list.size(); ++i) list.set(i, fn(list.get(i)));
      *it = list;
    }
  }
}

void cast_all(const c10::OperatorHandle& op, torch::jit::Stack* stack, at::ScalarType to) {
  for_each_tensor(op, stack, [to](const at::Tensor& t) { return cast(t, to); });
}

void redispatch(const c10::OperatorHandle& op, c10::DispatchKeySet keys, torch::jit::Stack* stack) {
  c10::impl::ExcludeDispatchKeyGuard no_autocast(c10::DispatchKey::AutocastPrivateUse1);
  op.redispatchBoxed(keys.remove(c10::DispatchKey::AutocastPrivateUse1), stack);
}

}  // namespace

// lower_precision_fp: floating-point arguments in the autocast dtype (torch.autocast(dtype=...); PyTorch
// defaults it to float16 for PrivateUse1).
void run_lower_precision_fp(const c10::OperatorHandle& op, c10::DispatchKeySet keys, torch::jit::Stack* stack) {
  cast_all(op, stack, at::autocast::get_autocast_dtype(c10::DeviceType::PrivateUse1));
  redispatch(op, keys, stack);
}

// fp32: floating-point arguments in float32.
void run_fp32(const c10::OperatorHandle& op, c10::DispatchKeySet keys, torch::jit::Stack* stack) {
  cast_all(op, stack, at::kFloat);
  redispatch(op, keys, stack);
}

// promote: floating-point arguments in the widest floating-point type among them (for operators
// that would otherwise refuse mixed dtypes).
void run_promote(const c10::OperatorHandle& op, c10::DispatchKeySet keys, torch::jit::Stack* stack) {
  std::optional<at::ScalarType> widest;
  for_each_tensor(op, stack, [&widest](const at::Tensor& t) {
    if (t.defined() && t.is_floating_point() && t.device().type() == c10::DeviceType::PrivateUse1) {
      widest = widest ? c10::promoteTypes(*widest, t.scalar_type()) : t.scalar_type();
    }
    return t;
  });
  if (widest) cast_all(op, stack, *widest);
  redispatch(op, keys, stack);
}

// fp32_set_opt_dtype: for operators with an optional `dtype` argument (softmax, sum, ...): when it is
// not given and a floating-point argument is on the device, compute in float32 by setting it,
// without casting the arguments; an operator without one is run as fp32.
void run_fp32_set_opt_dtype(const c10::OperatorHandle& op, c10::DispatchKeySet keys, torch::jit::Stack* stack) {
  const auto& args = op.schema().arguments();
  const size_t n = args.size();
  std::optional<size_t> dtype_at;
  bool floating = false;
  for (size_t i = 0; i < n; ++i) {
    const c10::IValue& v = (*stack)[stack->size() - n + i];
    if (args[i].name() == "dtype") dtype_at = i;
    if (v.isTensor() && v.toTensor().defined() && v.toTensor().is_floating_point() &&
        v.toTensor().device().type() == c10::DeviceType::PrivateUse1) {
      floating = true;
    }
  }
  if (!dtype_at) return run_fp32(op, keys, stack);
  c10::IValue& dtype = (*stack)[stack->size() - n + *dtype_at];
  if (floating && dtype.isNone()) dtype = c10::IValue(at::kFloat);
  redispatch(op, keys, stack);
}

}  // namespace {{ cookiecutter.device }}::autocast

// Operators not in the table run in the dtypes they are given.
TORCH_LIBRARY_IMPL(_, AutocastPrivateUse1, m) {
  m.fallback(torch::CppFunction::makeFallthrough());
}
