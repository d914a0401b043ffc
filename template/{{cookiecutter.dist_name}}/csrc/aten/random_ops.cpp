// In-place random kernels (normal_, uniform_, random_, bernoulli_, exponential_): the ops behind
// torch.randn/rand/randint/dropout on {{ cookiecutter.device }}, drawing from the device's generators so
// torch.{{ cookiecutter.device }}.manual_seed and torch.Generator(device="{{ cookiecutter.device }}") are honoured.
//
// Each kernel lends the device generator's state to a CPU generator (runtime/generator.h), runs the
// CPU kernel on the device memory and takes the advanced state back. What a hardware team replaces:
// the bodies, with its SDK's random kernels seeded from the same generator.
#include "aten/kernel_support.h"
#include "runtime/generator.h"

#include <ATen/ops/bernoulli_ops.h>
#include <ATen/ops/exponential_ops.h>
#include <ATen/ops/normal_ops.h>
#include <ATen/ops/random_ops.h>
#include <ATen/ops/uniform_ops.h>
#include <torch/library.h>

namespace {{ cookiecutter.device }}::random_ops {

using Gen = std::optional<at::Generator>;

// Runs `fn(host_alias, host_generator)` with the device's generator state.
template <typename Fn>
at::Tensor& with_host_generator(at::Tensor& self, const Gen& gen, Fn fn) {
  c10::OptionalDeviceGuard guard(kernels::device_of(self));
  kernels::StreamScope on_stream(kernels::device_of(self), "random");
  runtime::HostGeneratorScope scope(gen, kernels::device_of(self));
  at::Tensor h = kernels::host_alias(self);
  fn(h, scope.host());
  kernels::write_back(self, h);
  return self;
}

at::Tensor& normal_(at::Tensor& self, double mean, double std, Gen gen) {
  return with_host_generator(self, gen, [&](at::Tensor& h, Gen g) { at::_ops::normal_::call(h, mean, std, g); });
}
at::Tensor& uniform_(at::Tensor& self, double from, double to, Gen gen) {
  return with_host_generator(self, gen, [&](at::Tensor& h, Gen g) { at::_ops::uniform_::call(h, from, to, g); });
}
at::Tensor& random_from(at::Tensor& self, int64_t from, std::optional<int64_t> to, Gen gen) {
  return with_host_generator(self, gen, [&](at::Tensor& h, Gen g) { at::_ops::random__from::call(h, from, to, g); });
}
at::Tensor& random_to(at::Tensor& self, int64_t to, Gen gen) {
  return with_host_generator(self, gen, [&](at::Tensor& h, Gen g) { at::_ops::random__to::call(h, to, g); });
}
at::Tensor& random_(at::Tensor& self, Gen gen) {
  return with_host_generator(self, gen, [&](at::Tensor& h, Gen g) { at::_ops::random_::call(h, g); });
}
at::Tensor& bernoulli_float(at::Tensor& self, double p, Gen gen) {
  return with_host_generator(self, gen, [&](at::Tensor& h, Gen g) { at::_ops::bernoulli__float::call(h, p, g); });
}
at::Tensor& exponential_(at::Tensor& self, double lambd, Gen gen) {
  return with_host_generator(self, gen, [&](at::Tensor& h, Gen g) { at::_ops::exponential_::call(h, lambd, g); });
}

}  // namespace {{ cookiecutter.device }}::random_ops

TORCH_LIBRARY_IMPL(aten, PrivateUse1, m) {
  namespace ops = {{ cookiecutter.device }}::random_ops;
  m.impl("normal_", TORCH_FN(ops::normal_));
  m.impl("uniform_", TORCH_FN(ops::uniform_));
  m.impl("random_.from", TORCH_FN(ops::random_from));
  m.impl("random_.to", TORCH_FN(ops::random_to));
  m.impl("random_", TORCH_FN(ops::random_));
  m.impl("bernoulli_.float", TORCH_FN(ops::bernoulli_float));
  m.impl("exponential_", TORCH_FN(ops::exponential_));
}
