// Matrix products with a wider result dtype on {{ cookiecutter.device }}: torch.mm, torch.bmm, torch.addmm and
// torch.baddbmm with `out_dtype=` (a float result of half or bfloat16 inputs).
//
// PyTorch has CUDA kernels only for these overloads (`mm.dtype`, `bmm.dtype`, `addmm.dtype`,
// `baddbmm.dtype` and their `out=` forms), so the CPU fallback has nothing to call. Here each is a
// launch: the host checks the dtypes (CUDA's rule: `out_dtype` is the inputs' dtype, or float for
// half and bfloat16 inputs) and the shapes (the float operator on meta tensors), allocates the
// result, and queues the computation as CUDA computes it — the inputs' products accumulated in
// float: the CPU's float matrix product on host aliases, cast to `out_dtype`.
// What a hardware team replaces: the bodies, with a matmul that reads the narrow inputs and
// accumulates and writes in the wide dtype (no float copies of the inputs).
#include "aten/kernel_support.h"

#include <ATen/ops/addmm_ops.h>
#include <ATen/ops/baddbmm_ops.h>
#include <ATen/ops/bmm_ops.h>
#include <ATen/ops/mm_ops.h>
#include <c10/core/ScalarType.h>
#include <torch/library.h>

#include <functional>

namespace {{ cookiecutter.device }}::out_dtype_matmul {

namespace {

void check_dtypes(const char* op, const at::Tensor& a, const at::Tensor& b, c10::ScalarType out_dtype) {
  TORCH_CHECK(a.scalar_type() == b.scalar_type(), op, ": expected both inputs of one dtype, got ", a.scalar_type(),
              " and ", b.scalar_type());
  const auto in = a.scalar_type();
  TORCH_CHECK(out_dtype == in || (out_dtype == c10::kFloat && (in == c10::kHalf || in == c10::kBFloat16)), op,
              ": out_dtype must be the same as the input dtype or float for half and bfloat16 inputs, got ", out_dtype,
              " for ", in, " inputs");
}

void check_out(const char* op, const at::Tensor& out, c10::ScalarType out_dtype) {
  TORCH_CHECK(out.scalar_type() == out_dtype, op, ": expected out of dtype ", out_dtype, ", got ", out.scalar_type());
}

at::Tensor wide(const at::Tensor& t) {
  const auto type = t.scalar_type();
  return (type == c10::kHalf || type == c10::kBFloat16) ? t.to(c10::kFloat) : t;
}

// The result's sizes: the float operator on meta tensors (PyTorch's shape checks and messages, on
// the host). mm, bmm, addmm and baddbmm have meta kernels in every torch.
at::IntArrayRef result_sizes(const char* op, at::Tensor& meta, const std::function<at::Tensor()>& pre_pass) {
  TORCH_CHECK(kernels::on_meta([&] { meta = pre_pass(); }), op, ": the installed torch has no meta kernel for it");
  return meta.sizes();
}

at::Tensor wide_meta(const at::Tensor& t) { return wide(kernels::meta_like(t)); }

at::Tensor new_result(at::IntArrayRef sizes, c10::ScalarType out_dtype) {
  return kernels::empty_device(sizes, {}, c10::TensorOptions().dtype(out_dtype));
}

// `out` with `sizes`: a new result (undefined `out`), or an out= argument resized if it must be.
at::Tensor& sized(at::Tensor& out, at::IntArrayRef sizes, c10::ScalarType out_dtype) {
  if (!out.defined()) {
    out = new_result(sizes, out_dtype);
  } else if (!out.sizes().equals(sizes)) {
    out.resize_(sizes);
  }
  return out;
}

// Queues out = product(wide(a), wide(b), wide(c)) (c: addmm's and baddbmm's self, else undefined).
void queue(c10::Device device, const char* name, const at::Tensor& out, const at::Tensor& a, const at::Tensor& b,
           const at::Tensor& c, std::function<at::Tensor(const at::Tensor&, const at::Tensor&, const at::Tensor&)> product) {
  kernels::launch(device, name,
                  [a_h = kernels::held(a), b_h = kernels::held(b), c_h = kernels::held(c), out_h = kernels::held(out),
                   product = std::move(product)]() mutable {
                    const at::Tensor c_wide = c_h.get().defined() ? wide(c_h.get()) : at::Tensor();
                    out_h.get().copy_(product(wide(a_h.get()), wide(b_h.get()), c_wide));
                  });
}

at::Tensor& mm_into(const at::Tensor& self, const at::Tensor& mat2, c10::ScalarType out_dtype, at::Tensor& out,
                    c10::Device device) {
  at::Tensor meta;
  sized(out, result_sizes("mm", meta, [&] { return at::_ops::mm::call(wide_meta(self), wide_meta(mat2)); }),
        out_dtype);
  const at::Tensor none;
  queue(device, "aten::mm.dtype", out, self, mat2, none,
        [](const at::Tensor& a, const at::Tensor& b, const at::Tensor&) { return at::_ops::mm::call(a, b); });
  return out;
}

at::Tensor& bmm_into(const at::Tensor& self, const at::Tensor& mat2, c10::ScalarType out_dtype, at::Tensor& out,
                     c10::Device device) {
  at::Tensor meta;
  sized(out, result_sizes("bmm", meta, [&] { return at::_ops::bmm::call(wide_meta(self), wide_meta(mat2)); }),
        out_dtype);
  const at::Tensor none;
  queue(device, "aten::bmm.dtype", out, self, mat2, none,
        [](const at::Tensor& a, const at::Tensor& b, const at::Tensor&) { return at::_ops::bmm::call(a, b); });
  return out;
}

at::Tensor& addmm_into(const at::Tensor& self, const at::Tensor& mat1, const at::Tensor& mat2, const c10::Scalar& beta,
                       const c10::Scalar& alpha, c10::ScalarType out_dtype, at::Tensor& out, c10::Device device) {
  at::Tensor meta;
  sized(out, result_sizes("addmm", meta, [&] {
          return at::_ops::addmm::call(wide_meta(self), wide_meta(mat1), wide_meta(mat2), beta, alpha);
        }),
        out_dtype);
  queue(device, "aten::addmm.dtype", out, mat1, mat2, self,
        [beta, alpha](const at::Tensor& a, const at::Tensor& b, const at::Tensor& c) {
          return at::_ops::addmm::call(c, a, b, beta, alpha);
        });
  return out;
}

at::Tensor& baddbmm_into(const at::Tensor& self, const at::Tensor& batch1, const at::Tensor& batch2,
                         const c10::Scalar& beta, const c10::Scalar& alpha, c10::ScalarType out_dtype, at::Tensor& out, c10::Device device) {
  at::Tensor meta;
  sized(out, result_sizes("baddbmm", meta, [&] {
          return at::_ops::baddbmm::call(wide_meta(self), wide_meta(batch1), wide_meta(batch2), beta, alpha);
        }),
        out_dtype);
  queue(device, "aten::baddbmm.dtype", out, batch1, batch2, self,
        [beta, alpha](const at::Tensor& a, const at::Tensor& b, const at::Tensor& c) {
          return at::_ops::baddbmm::call(c, a, b, beta, alpha);
        });
  return out;
}

at::Tensor mm(const at::Tensor& self, const at::Tensor& mat2, c10::ScalarType out_dtype) {
  check_dtypes("mm", self, mat2, out_dtype);
  const c10::Device device = kernels::common_device("mm", kernels::CpuArgs::rejected, self, mat2);
  c10::DeviceGuard guard(device);
  at::Tensor out;
  return mm_into(self, mat2, out_dtype, out, device);
}

at::Tensor& mm_out(const at::Tensor& self, const at::Tensor& mat2, c10::ScalarType out_dtype, at::Tensor& out) {
  check_dtypes("mm", self, mat2, out_dtype);
  check_out("mm", out, out_dtype);
  const c10::Device device = kernels::common_device("mm", kernels::CpuArgs::rejected, self, mat2, out);
  c10::DeviceGuard guard(device);
  return mm_into(self, mat2, out_dtype, out, device);
}

at::Tensor bmm(const at::Tensor& self, const at::Tensor& mat2, c10::ScalarType out_dtype) {
  check_dtypes("bmm", self, mat2, out_dtype);
  const c10::Device device = kernels::common_device("bmm", kernels::CpuArgs::rejected, self, mat2);
  c10::DeviceGuard guard(device);
  at::Tensor out;
  return bmm_into(self, mat2, out_dtype, out, device);
}

at::Tensor& bmm_out(const at::Tensor& self, const at::Tensor& mat2, c10::ScalarType out_dtype, at::Tensor& out) {
  check_dtypes("bmm", self, mat2, out_dtype);
  check_out("bmm", out, out_dtype);
  const c10::Device device = kernels::common_device("bmm", kernels::CpuArgs::rejected, self, mat2, out);
  c10::DeviceGuard guard(device);
  return bmm_into(self, mat2, out_dtype, out, device);
}

at::Tensor addmm(const at::Tensor& self, const at::Tensor& mat1, const at::Tensor& mat2, c10::ScalarType out_dtype,
                 const c10::Scalar& beta, const c10::Scalar& alpha) {
  check_dtypes("addmm", mat1, mat2, out_dtype);
  const c10::Device device = kernels::common_device("addmm", kernels::CpuArgs::rejected, self, mat1, mat2);
  c10::DeviceGuard guard(device);
  at::Tensor out;
  return addmm_into(self, mat1, mat2, beta, alpha, out_dtype, out, device);
}

at::Tensor& addmm_out(const at::Tensor& self, const at::Tensor& mat1, const at::Tensor& mat2, c10::ScalarType out_dtype,
                      const c10::Scalar& beta, const c10::Scalar& alpha, at::Tensor& out) {
  check_dtypes("addmm", mat1, mat2, out_dtype);
  check_out("addmm", out, out_dtype);
  const c10::Device device = kernels::common_device("addmm", kernels::CpuArgs::rejected, self, mat1, mat2, out);
  c10::DeviceGuard guard(device);
  return addmm_into(self, mat1, mat2, beta, alpha, out_dtype, out, device);
}

at::Tensor baddbmm(const at::Tensor& self, const at::Tensor& batch1, const at::Tensor& batch2, c10::ScalarType out_dtype,
                   const c10::Scalar& beta, const c10::Scalar& alpha) {
  check_dtypes("baddbmm", batch1, batch2, out_dtype);
  const c10::Device device = kernels::common_device("baddbmm", kernels::CpuArgs::rejected, self, batch1, batch2);
  c10::DeviceGuard guard(device);
  at::Tensor out;
  return baddbmm_into(self, batch1, batch2, beta, alpha, out_dtype, out, device);
}

at::Tensor& baddbmm_out(const at::Tensor& self, const at::Tensor& batch1, const at::Tensor& batch2,
                        c10::ScalarType out_dtype, const c10::Scalar& beta, const c10::Scalar& alpha, at::Tensor& out) {
  check_dtypes("baddbmm", batch1, batch2, out_dtype);
  check_out("baddbmm", out, out_dtype);
  const c10::Device device =
      kernels::common_device("baddbmm", kernels::CpuArgs::rejected, self, batch1, batch2, out);
  c10::DeviceGuard guard(device);
  return baddbmm_into(self, batch1, batch2, beta, alpha, out_dtype, out, device);
}

}  // namespace

}  // namespace {{ cookiecutter.device }}::out_dtype_matmul

TORCH_LIBRARY_IMPL(aten, PrivateUse1, m) {
  m.impl("mm.dtype", TORCH_FN({{ cookiecutter.device }}::out_dtype_matmul::mm));
  m.impl("mm.dtype_out", TORCH_FN({{ cookiecutter.device }}::out_dtype_matmul::mm_out));
  m.impl("bmm.dtype", TORCH_FN({{ cookiecutter.device }}::out_dtype_matmul::bmm));
  m.impl("bmm.dtype_out", TORCH_FN({{ cookiecutter.device }}::out_dtype_matmul::bmm_out));
  m.impl("addmm.dtype", TORCH_FN({{ cookiecutter.device }}::out_dtype_matmul::addmm));
  m.impl("addmm.dtype_out", TORCH_FN({{ cookiecutter.device }}::out_dtype_matmul::addmm_out));
  m.impl("baddbmm.dtype", TORCH_FN({{ cookiecutter.device }}::out_dtype_matmul::baddbmm));
  m.impl("baddbmm.dtype_out", TORCH_FN({{ cookiecutter.device }}::out_dtype_matmul::baddbmm_out));
}
