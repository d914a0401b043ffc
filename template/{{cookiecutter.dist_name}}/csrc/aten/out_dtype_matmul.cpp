// Matrix products with a wider result dtype on {{ cookiecutter.device }}: torch.mm, torch.bmm, torch.addmm and
// torch.baddbmm with `out_dtype=` (a float result of half or bfloat16 inputs).
//
// PyTorch has CUDA kernels only for these overloads (`mm.dtype`, `bmm.dtype`, `addmm.dtype`,
// `baddbmm.dtype` and their `out=` forms), so the CPU fallback has nothing to call. Here each is
// computed as CUDA computes it — the inputs' products accumulated in float — by the float matrix
// product on the device, then cast to `out_dtype`; CUDA's rule on dtypes is kept (`out_dtype` is the
// inputs' dtype, or float for half and bfloat16 inputs).
// What a hardware team replaces: the bodies, with a matmul that reads the narrow inputs and
// accumulates and writes in the wide dtype (no float copies of the inputs).
#include "aten/kernel_support.h"

#include <ATen/ops/addmm_ops.h>
#include <ATen/ops/baddbmm_ops.h>
#include <ATen/ops/bmm_ops.h>
#include <ATen/ops/mm_ops.h>
#include <c10/core/ScalarType.h>
#include <torch/library.h>

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

at::Tensor wide(const at::Tensor& t) {
  const auto type = t.scalar_type();
  return (type == c10::kHalf || type == c10::kBFloat16) ? t.to(c10::kFloat) : t;
}

at::Tensor& into(at::Tensor& out, const at::Tensor& value) {
  if (!out.sizes().equals(value.sizes())) out.resize_(value.sizes());
  out.copy_(value);
  return out;
}

at::Tensor mm(const at::Tensor& self, const at::Tensor& mat2, c10::ScalarType out_dtype) {
  check_dtypes("mm", self, mat2, out_dtype);
  return at::_ops::mm::call(wide(self), wide(mat2)).to(out_dtype);
}

at::Tensor& mm_out(const at::Tensor& self, const at::Tensor& mat2, c10::ScalarType out_dtype, at::Tensor& out) {
  TORCH_CHECK(out.scalar_type() == out_dtype, "mm: expected out of dtype ", out_dtype, ", got ", out.scalar_type());
  return into(out, mm(self, mat2, out_dtype));
}

at::Tensor bmm(const at::Tensor& self, const at::Tensor& mat2, c10::ScalarType out_dtype) {
  check_dtypes("bmm", self, mat2, out_dtype);
  return at::_ops::bmm::call(wide(self), wide(mat2)).to(out_dtype);
}

at::Tensor& bmm_out(const at::Tensor& self, const at::Tensor& mat2, c10::ScalarType out_dtype, at::Tensor& out) {
  TORCH_CHECK(out.scalar_type() == out_dtype, "bmm: expected out of dtype ", out_dtype, ", got ", out.scalar_type());
  return into(out, bmm(self, mat2, out_dtype));
}

at::Tensor addmm(const at::Tensor& self, const at::Tensor& mat1, const at::Tensor& mat2, c10::ScalarType out_dtype,
                 const c10::Scalar& beta, const c10::Scalar& alpha) {
  check_dtypes("addmm", mat1, mat2, out_dtype);
  return at::_ops::addmm::call(wide(self), wide(mat1), wide(mat2), beta, alpha).to(out_dtype);
}

at::Tensor& addmm_out(const at::Tensor& self, const at::Tensor& mat1, const at::Tensor& mat2, c10::ScalarType out_dtype,
                      const c10::Scalar& beta, const c10::Scalar& alpha, at::Tensor& out) {
  TORCH_CHECK(out.scalar_type() == out_dtype, "addmm: expected out of dtype ", out_dtype, ", got ", out.scalar_type());
  return into(out, addmm(self, mat1, mat2, out_dtype, beta, alpha));
}

at::Tensor baddbmm(const at::Tensor& self, const at::Tensor& batch1, const at::Tensor& batch2, c10::ScalarType out_dtype,
                   const c10::Scalar& beta, const c10::Scalar& alpha) {
  check_dtypes("baddbmm", batch1, batch2, out_dtype);
  return at::_ops::baddbmm::call(wide(self), wide(batch1), wide(batch2), beta, alpha).to(out_dtype);
}

at::Tensor& baddbmm_out(const at::Tensor& self, const at::Tensor& batch1, const at::Tensor& batch2,
                        c10::ScalarType out_dtype, const c10::Scalar& beta, const c10::Scalar& alpha, at::Tensor& out) {
  TORCH_CHECK(out.scalar_type() == out_dtype, "baddbmm: expected out of dtype ", out_dtype, ", got ", out.scalar_type());
  return into(out, baddbmm(self, batch1, batch2, out_dtype, beta, alpha));
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
