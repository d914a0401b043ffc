// Random kernels: the ops behind torch.randn/rand/randint/randperm/bernoulli/multinomial/poisson and
// dropout on {{ cookiecutter.device }}, drawing from the device's generators so
// torch.{{ cookiecutter.device }}.manual_seed and torch.Generator(device="{{ cookiecutter.device }}") are honoured.
//
// Each kernel is a launch, as on CUDA: on the host it checks its arguments and decides its outputs
// (the operator on meta tensors), reserves its offset of the generator (runtime/generator.h: the
// numbers it draws are fixed by the host's call order), and queues the draw on the current stream;
// the queued work runs the CPU kernel on the device memory with the CPU generator derived from the
// reserved (seed, offset). What a hardware team replaces: the queued bodies, with its SDK's random
// kernels keyed by the same (seed, offset).
#include "aten/kernel_support.h"
#include "runtime/generator.h"

#include <ATen/ops/bernoulli_ops.h>
#include <ATen/ops/cauchy_ops.h>
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
    kernels::launch(device, name, std::function<void()>(std::move(body)));
    return;
  }
  kernels::StreamScope on_stream(device, name);
  body();
}

// An in-place random op (`op(self, generator)`): its checks and geometry rules are the operator's
// own, run on a meta tensor before anything is reserved or queued; the draw writes `self` in place.
template <typename Op>
at::Tensor& in_place(at::Tensor& self, const Gen& gen, const char* name, Op op) {
  const c10::Device device = kernels::device_of(self);
  c10::DeviceGuard guard(device);
  const bool queue = kernels::on_meta([&] {
    at::Tensor m = kernels::meta_like(self);
    op(m, Gen());
  });
  if (self.numel() == 0) return self;  // nothing drawn, no offset taken (as CUDA's)
  draw(device, name, gen, queue, [s = kernels::held(self), op](Gen g) mutable { op(s.get(), g); });
  return self;
}

// A random op with a new result: `meta()` is the operator on meta tensors (checks, the result's
// geometry); `work(generator)` computes the result on the held arguments.
template <typename Meta, typename Work>
at::Tensor new_result(c10::Device device, const char* name, const Gen& gen, Meta meta, Work work) {
  c10::DeviceGuard guard(device);
  at::Tensor m;
  if (!kernels::on_meta([&] { m = meta(); })) {
    at::Tensor result;
    draw(device, name, gen, false, [&](Gen g) { result = kernels::to_device(work(g), device); });
    return result;
  }
  at::Tensor out = kernels::empty_like_meta(m, device);
  if (out.numel() == 0) return out;
  draw(device, name, gen, true, [o = kernels::held(out), work](Gen g) mutable { kernels::copy_result(o.get(), work(g)); });
  return out;
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
  return new_result(
      device, "aten::multinomial", gen,
      [&] { return at::_ops::multinomial::call(kernels::meta_like(self), num_samples, replacement, Gen()); },
      [s = kernels::held(self), num_samples, replacement](Gen g) mutable {
        return at::_ops::multinomial::call(s.get(), num_samples, replacement, g);
      });
}

at::Tensor poisson(const at::Tensor& self, Gen gen) {
  const c10::Device device = kernels::common_device("poisson", CpuArgs::rejected, self);
  return new_result(
      device, "aten::poisson", gen, [&] { return at::_ops::poisson::call(kernels::meta_like(self), Gen()); },
      [s = kernels::held(self)](Gen g) mutable { return at::_ops::poisson::call(s.get(), g); });
}

at::Tensor normal_tensor_float(const at::Tensor& mean, double std, Gen gen) {
  const c10::Device device = kernels::common_device("normal", CpuArgs::scalars, mean);
  return new_result(
      device, "aten::normal", gen,
      [&] { return at::_ops::normal_Tensor_float::call(kernels::meta_like(mean), std, Gen()); },
      [m = kernels::held(mean), std](Gen g) mutable { return at::_ops::normal_Tensor_float::call(m.get(), std, g); });
}
at::Tensor normal_float_tensor(double mean, const at::Tensor& std, Gen gen) {
  const c10::Device device = kernels::common_device("normal", CpuArgs::scalars, std);
  return new_result(
      device, "aten::normal", gen,
      [&] { return at::_ops::normal_float_Tensor::call(mean, kernels::meta_like(std), Gen()); },
      [mean, s = kernels::held(std)](Gen g) mutable { return at::_ops::normal_float_Tensor::call(mean, s.get(), g); });
}
at::Tensor normal_tensor_tensor(const at::Tensor& mean, const at::Tensor& std, Gen gen) {
  const c10::Device device = kernels::common_device("normal", CpuArgs::scalars, mean, std);
  return new_result(
      device, "aten::normal", gen,
      [&] { return at::_ops::normal_Tensor_Tensor::call(kernels::meta_like(mean), kernels::meta_like(std), Gen()); },
      [m = kernels::held(mean), s = kernels::held(std)](Gen g) mutable {
        return at::_ops::normal_Tensor_Tensor::call(m.get(), s.get(), g);
      });
}

// native_dropout (F.dropout in training; the CPU operator draws from the CPU's default generator,
// so the body is written out: a bernoulli(1 - p) mask, scaled by 1 / (1 - p), as the CPU kernel).
std::tuple<at::Tensor, at::Tensor> native_dropout(const at::Tensor& input, double p, std::optional<bool> train) {
  const c10::Device device = kernels::common_device("native_dropout", CpuArgs::rejected, input);
  c10::DeviceGuard guard(device);
  std::tuple<at::Tensor, at::Tensor> m;
  const bool queue = kernels::on_meta([&] { m = at::_ops::native_dropout::call(kernels::meta_like(input), p, train); });
  at::Tensor out = queue ? kernels::empty_like_meta(std::get<0>(m), device) : at::Tensor();
  at::Tensor mask = queue ? kernels::empty_like_meta(std::get<1>(m), device) : at::Tensor();
  const bool drawing = !train.has_value() || *train;  // in inference nothing is drawn, no offset taken
  auto body = [in = kernels::held(input), p, train, drawing](Gen g) mutable {
    if (!drawing) return at::_ops::native_dropout::call(in.get(), p, train);  // the input and a mask of ones
    const double keep = 1.0 - p;
    at::Tensor mask = at::empty_like(in.get(), c10::MemoryFormat::Contiguous).bernoulli_(keep, g);
    at::Tensor out = in.get().mul(mask).mul_(keep == 0.0 ? 0.0 : 1.0 / keep);
    return std::make_tuple(out, mask.to(at::kBool));
  };
  if (!queue) {
    std::tuple<at::Tensor, at::Tensor> r;
    auto here = [&](Gen g) {
      auto [o, k] = body(g);
      r = {kernels::to_device(o, device), kernels::to_device(k, device)};
    };
    if (drawing) {
      draw(device, "aten::native_dropout", Gen(), false, here);
    } else {
      kernels::StreamScope on_stream(device, "aten::native_dropout");
      here(Gen());
    }
    return r;
  }
  if (out.numel() == 0) return {out, mask};
  auto work = [o = kernels::held(out), k = kernels::held(mask), body](Gen g) mutable {
    auto [ro, rk] = body(g);
    kernels::copy_result(o.get(), ro);
    kernels::copy_result(k.get(), rk);
  };
  if (drawing) {
    draw(device, "aten::native_dropout", Gen(), true, std::move(work));
  } else {
    kernels::launch(device, "aten::native_dropout", std::function<void()>([work]() mutable { work(Gen()); }));
  }
  return {out, mask};
}

// randperm(n, generator, out): behind torch.randperm. The result's size, n, is known on the host.
at::Tensor& randperm_out(int64_t n, Gen gen, at::Tensor& out) {
  const c10::Device device = kernels::device_of(out);
  c10::DeviceGuard guard(device);
  at::Tensor m = kernels::meta_like(out);
  const bool queue = kernels::on_meta([&] { at::_ops::randperm_generator_out::call(n, Gen(), m); });
  if (out.dim() != 1 || out.size(0) != n) out.resize_({n});  // on the host, before the work is queued
  if (n == 0) return out;
  draw(device, "aten::randperm", gen, queue,
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
