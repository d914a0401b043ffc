// Random kernels: the ops behind torch.randn/rand/randint/randperm/bernoulli/multinomial/poisson and
// dropout on {{ cookiecutter.device }}, drawing from the device's generators so
// torch.{{ cookiecutter.device }}.manual_seed and torch.Generator(device="{{ cookiecutter.device }}") are honoured.
//
// Each kernel is a launch, as on CUDA: on the host it checks its arguments and allocates its outputs
// (their geometry is the CPU operator's), reserves its offset of the generator (runtime/generator.h: the
// numbers it draws are fixed by the host's call order), and queues the draw on the current stream;
// the queued work runs the CPU kernel on the device memory with the CPU generator derived from the
// reserved (seed, offset). What a hardware team replaces: the queued bodies, with its SDK's random
// kernels keyed by the same (seed, offset).
#include "aten/kernel_support.h"
#include "runtime/generator.h"

#include <ATen/ops/bernoulli_ops.h>
#include <ATen/ops/cauchy_ops.h>
#include <ATen/CPUGeneratorImpl.h>
#include <ATen/MemoryOverlap.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/empty_like.h>
#include <ATen/ops/exponential_ops.h>
#include <ATen/ops/geometric_ops.h>
#include <ATen/ops/log_normal_ops.h>
#include <ATen/ops/multinomial_ops.h>
#include <ATen/ops/native_dropout_ops.h>
#include <ATen/ops/normal_ops.h>
#include <ATen/ops/poisson_ops.h>
#include <ATen/ops/random_ops.h>
#include <ATen/ops/randperm_ops.h>
#include <ATen/ops/uniform_ops.h>
#include <torch/library.h>

namespace {{ cookiecutter.device }}::random_ops {

using Gen = std::optional<at::Generator>;
using kernels::CpuArgs;

// Reserves one offset of `gen` now, in host call order, and runs `work(generator)` with the CPU
// generator derived from it: queued on the current stream, or — `queue` false: the installed torch
// has no meta kernel for the operator, so nothing could be decided beforehand — at once on the
// calling thread, in order on the stream.
template <typename Work>
void draw(c10::Device device, const char* name, const Gen& gen, bool queue, Work work) {
  const runtime::Draw reserved = runtime::reserve(gen, device);
  auto body = [reserved, work = std::move(work)]() mutable { work(Gen(reserved.host())); };
  if (queue) {
    kernels::launch(device, name, std::move(body));
    return;
  }
  kernels::StreamScope on_stream(device, name);
  body();
}

// The argument checks of a random op, done on the host as on CUDA: `probe(g)` runs the CPU
// operator on empty CPU tensors of the arguments' dtypes (its dtype and parameter checks; nothing
// drawn). The dispatcher's Meta kernels of most random ops are Python (torch/_meta_registrations.py),
// too slow for a kernel launch, and the geometry of their results is simple enough to write out.
template <typename Probe>
void check_on_host(Probe probe) {
  static thread_local at::Generator scratch = at::make_generator<at::CPUGeneratorImpl>();
  probe(Gen(scratch));
}

at::Tensor probe_like(const at::Tensor& t) { return at::empty({0}, c10::TensorOptions().dtype(t.scalar_type())); }

// An in-place random op (`op(self, generator)`): the operator's checks (its dtype and parameter
// checks, and no element of `self` written twice), then the draw is queued; `self` keeps its geometry.
template <typename Op>
at::Tensor& in_place(at::Tensor& self, const Gen& gen, const char* name, Op op) {
  const c10::Device device = kernels::device_of(self);
  c10::DeviceGuard guard(device);
  at::assert_no_internal_overlap(self);
  check_on_host([&](Gen g) {
    at::Tensor probe = probe_like(self);
    op(probe, g);
  });
  if (self.numel() == 0) return self;  // nothing drawn, no offset taken (as CUDA's)
  draw(device, name, gen, true, [s = kernels::held(self), op](Gen g) mutable { op(s.get(), g); });
  return self;
}

// A random op with a new result, allocated on the host (`out`); `work(generator)` computes it on the
// held arguments when the queued work runs.
template <typename Work>
at::Tensor new_result(c10::Device device, const char* name, const Gen& gen, at::Tensor out, Work work) {
  if (out.numel() == 0) return out;
  draw(device, name, gen, true,
       [o = kernels::held(out), work](Gen g) mutable { kernels::copy_result(o.get(), work(g)); });
  return out;
}

at::Tensor new_device(c10::IntArrayRef sizes, c10::ScalarType dtype) {
  return kernels::empty_device(sizes, {}, c10::TensorOptions().dtype(dtype));
}

at::Tensor& normal_(at::Tensor& self, double mean, double std, Gen gen) {
  return in_place(self, gen, "aten::normal_",
                  [mean, std](at::Tensor& t, Gen g) { at::_ops::normal_::call(t, mean, std, g); });
}
at::Tensor& uniform_(at::Tensor& self, double from, double to, Gen gen) {
  return in_place(self, gen, "aten::uniform_",
                  [from, to](at::Tensor& t, Gen g) { at::_ops::uniform_::call(t, from, to, g); });
}
at::Tensor& random_from(at::Tensor& self, int64_t from, std::optional<int64_t> to, Gen gen) {
  return in_place(self, gen, "aten::random_",
                  [from, to](at::Tensor& t, Gen g) { at::_ops::random__from::call(t, from, to, g); });
}
at::Tensor& random_to(at::Tensor& self, int64_t to, Gen gen) {
  return in_place(self, gen, "aten::random_", [to](at::Tensor& t, Gen g) { at::_ops::random__to::call(t, to, g); });
}
at::Tensor& random_(at::Tensor& self, Gen gen) {
  return in_place(self, gen, "aten::random_", [](at::Tensor& t, Gen g) { at::_ops::random_::call(t, g); });
}
at::Tensor& bernoulli_float(at::Tensor& self, double p, Gen gen) {
  return in_place(self, gen, "aten::bernoulli_",
                  [p](at::Tensor& t, Gen g) { at::_ops::bernoulli__float::call(t, p, g); });
}
at::Tensor& exponential_(at::Tensor& self, double lambd, Gen gen) {
  return in_place(self, gen, "aten::exponential_",
                  [lambd](at::Tensor& t, Gen g) { at::_ops::exponential_::call(t, lambd, g); });
}
at::Tensor& geometric_(at::Tensor& self, double p, Gen gen) {
  return in_place(self, gen, "aten::geometric_", [p](at::Tensor& t, Gen g) { at::_ops::geometric_::call(t, p, g); });
}
at::Tensor& log_normal_(at::Tensor& self, double mean, double std, Gen gen) {
  return in_place(self, gen, "aten::log_normal_",
                  [mean, std](at::Tensor& t, Gen g) { at::_ops::log_normal_::call(t, mean, std, g); });
}
at::Tensor& cauchy_(at::Tensor& self, double median, double sigma, Gen gen) {
  return in_place(self, gen, "aten::cauchy_",
                  [median, sigma](at::Tensor& t, Gen g) { at::_ops::cauchy_::call(t, median, sigma, g); });
}

// bernoulli_(p: Tensor), behind torch.bernoulli(input): p may be a CPU tensor (copied at launch).
at::Tensor& bernoulli_tensor(at::Tensor& self, const at::Tensor& p, Gen gen) {
  kernels::common_device("bernoulli_", CpuArgs::allowed, self, p);
  const c10::Device device = kernels::device_of(self);
  c10::DeviceGuard guard(device);
  const bool queue = kernels::on_meta([&] {
    at::Tensor m = kernels::meta_like(self);
    at::_ops::bernoulli__Tensor::call(m, kernels::meta_like(p), Gen());
  });
  if (self.numel() == 0) return self;
  draw(device, "aten::bernoulli_", gen, queue, [s = kernels::held(self), p = kernels::held(p)](Gen g) mutable {
    at::_ops::bernoulli__Tensor::call(s.get(), p.get(), g);
  });
  return self;
}

at::Tensor multinomial(const at::Tensor& self, int64_t num_samples, bool replacement, Gen gen) {
  const c10::Device device = kernels::common_device("multinomial", CpuArgs::rejected, self);
  c10::DeviceGuard guard(device);
  TORCH_CHECK(self.dim() > 0 && self.dim() <= 2, "prob_dist must be 1 or 2 dim");
  TORCH_CHECK(at::isFloatingType(self.scalar_type()), "multinomial only supports floating-point dtypes for input, got: ",
              self.scalar_type());
  TORCH_CHECK(num_samples > 0, "cannot sample n_sample <= 0 samples");
  const int64_t categories = self.size(-1);
  TORCH_CHECK(replacement || num_samples <= categories,
              "cannot sample n_sample > prob_dist.size(-1) samples without replacement");
  TORCH_CHECK(categories <= (int64_t(1) << 24), "number of categories cannot exceed 2^24");
  at::Tensor out = self.dim() == 1 ? new_device({num_samples}, at::kLong) : new_device({self.size(0), num_samples}, at::kLong);
  // a distribution's values (non-negative, finite, not all zero) are checked by the queued work,
  // its error reported by the next call that waits for the stream (on CUDA: a device-side assert)
  return new_result(device, "aten::multinomial", gen, out, [s = kernels::held(self), num_samples, replacement](Gen g) mutable {
    return at::_ops::multinomial::call(s.get(), num_samples, replacement, g);
  });
}

at::Tensor poisson(const at::Tensor& self, Gen gen) {
  const c10::Device device = kernels::common_device("poisson", CpuArgs::rejected, self);
  c10::DeviceGuard guard(device);
  check_on_host([&](Gen g) { at::_ops::poisson::call(probe_like(self), g); });
  return new_result(device, "aten::poisson", gen, new_device(self.sizes(), self.scalar_type()),
                    [s = kernels::held(self)](Gen g) mutable { return at::_ops::poisson::call(s.get(), g); });
}

at::Tensor normal_tensor_float(const at::Tensor& mean, double std, Gen gen) {
  const c10::Device device = kernels::common_device("normal", CpuArgs::scalars, mean);
  c10::DeviceGuard guard(device);
  check_on_host([&](Gen g) { at::_ops::normal_Tensor_float::call(probe_like(mean), std, g); });
  return new_result(device, "aten::normal", gen, new_device(mean.sizes(), mean.scalar_type()),
                    [m = kernels::held(mean), std](Gen g) mutable {
                      return at::_ops::normal_Tensor_float::call(m.get(), std, g);
                    });
}
at::Tensor normal_float_tensor(double mean, const at::Tensor& std, Gen gen) {
  const c10::Device device = kernels::common_device("normal", CpuArgs::scalars, std);
  c10::DeviceGuard guard(device);
  check_on_host([&](Gen g) { at::_ops::normal_float_Tensor::call(mean, probe_like(std), g); });
  // std's values (>= 0) are checked by the queued work (CUDA checks them with a synchronizing read)
  return new_result(device, "aten::normal", gen, new_device(std.sizes(), std.scalar_type()),
                    [mean, s = kernels::held(std)](Gen g) mutable {
                      return at::_ops::normal_float_Tensor::call(mean, s.get(), g);
                    });
}
at::Tensor normal_tensor_tensor(const at::Tensor& mean, const at::Tensor& std, Gen gen) {
  const c10::Device device = kernels::common_device("normal", CpuArgs::scalars, mean, std);
  c10::DeviceGuard guard(device);
  check_on_host([&](Gen g) { at::_ops::normal_Tensor_Tensor::call(probe_like(mean), probe_like(std), g); });
  const std::vector<int64_t> sizes = kernels::broadcast_shape(mean.sizes(), std.sizes());
  return new_result(device, "aten::normal", gen, new_device(sizes, mean.scalar_type()),
                    [m = kernels::held(mean), s = kernels::held(std)](Gen g) mutable {
                      return at::_ops::normal_Tensor_Tensor::call(m.get(), s.get(), g);
                    });
}

// native_dropout (F.dropout in training; the CPU operator draws from the CPU's default generator,
// so the body is written out: a bernoulli(1 - p) mask, scaled by 1 / (1 - p), as the CPU kernel).
std::tuple<at::Tensor, at::Tensor> native_dropout(const at::Tensor& input, double p, std::optional<bool> train) {
  const c10::Device device = kernels::common_device("native_dropout", CpuArgs::rejected, input);
  c10::DeviceGuard guard(device);
  // the CPU operator's results: the output and a bool mask, both laid out as the input
  at::Tensor out = at::empty_like(input);
  at::Tensor mask = at::empty_like(input, input.options().dtype(at::kBool));
  if (input.numel() == 0) return {out, mask};
  const bool drawing = !train.has_value() || *train;  // in inference nothing is drawn, no offset taken
  auto work = [in = kernels::held(input), o = kernels::held(out), k = kernels::held(mask), p, train,
               drawing](Gen g) mutable {
    if (!drawing) {  // the input and a mask of ones
      auto [ro, rk] = at::_ops::native_dropout::call(in.get(), p, train);
      kernels::copy_result(o.get(), ro);
      kernels::copy_result(k.get(), rk);
      return;
    }
    const double keep = 1.0 - p;
    at::Tensor drawn = at::empty_like(in.get(), c10::MemoryFormat::Contiguous).bernoulli_(keep, g);
    kernels::copy_result(o.get(), in.get().mul(drawn).mul_(keep == 0.0 ? 0.0 : 1.0 / keep));
    kernels::copy_result(k.get(), drawn.to(at::kBool));
  };
  if (drawing) {
    draw(device, "aten::native_dropout", Gen(), true, std::move(work));
  } else {
    kernels::launch(device, "aten::native_dropout", [work]() mutable { work(Gen()); });
  }
  return {out, mask};
}

// randperm(n, generator, out): behind torch.randperm. The result's size, n, is known on the host.
at::Tensor& randperm_out(int64_t n, Gen gen, at::Tensor& out) {
  const c10::Device device = kernels::device_of(out);
  c10::DeviceGuard guard(device);
  TORCH_CHECK(n >= 0, "n must be non-negative, got", n);
  check_on_host([&](Gen g) {
    at::Tensor probe = probe_like(out);
    at::_ops::randperm_generator_out::call(0, g, probe);  // randperm's dtype check
  });
  if (out.dim() != 1 || out.size(0) != n) out.resize_({n});  // on the host, before the work is queued
  if (n == 0) return out;
  draw(device, "aten::randperm", gen, true,
       [o = kernels::held(out), n](Gen g) mutable { at::_ops::randperm_generator_out::call(n, g, o.get()); });
  return out;
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
  m.impl("bernoulli_.Tensor", TORCH_FN(ops::bernoulli_tensor));
  m.impl("exponential_", TORCH_FN(ops::exponential_));
  m.impl("geometric_", TORCH_FN(ops::geometric_));
  m.impl("log_normal_", TORCH_FN(ops::log_normal_));
  m.impl("cauchy_", TORCH_FN(ops::cauchy_));
  m.impl("multinomial", TORCH_FN(ops::multinomial));
  m.impl("poisson", TORCH_FN(ops::poisson));
  m.impl("normal.Tensor_float", TORCH_FN(ops::normal_tensor_float));
  m.impl("normal.float_Tensor", TORCH_FN(ops::normal_float_tensor));
  m.impl("normal.Tensor_Tensor", TORCH_FN(ops::normal_tensor_tensor));
  m.impl("native_dropout", TORCH_FN(ops::native_dropout));
  m.impl("randperm.generator_out", TORCH_FN(ops::randperm_out));
}
