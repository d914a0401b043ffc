// Sparse tensors on {{ cookiecutter.device }}: COO (torch.sparse_coo, the SparsePrivateUse1 dispatch key) and
// the compressed layouts (CSR/CSC/BSR/BSC, SparseCsrPrivateUse1).
//
// A sparse tensor is metadata (sizes, sparse and dense dimensions, the coalesced flag) around
// ordinary device tensors: indices and values (COO), or compressed indices, plain indices and values.
// So construction and metadata need no device code: ATen's own kernels for them are device-generic
// (SparseTensorImpl, SparseCsrTensorImpl) and are registered here as they are. `t._values()`,
// `t.indices()`, `t.crow_indices()`... return views of the device tensors the sparse tensor holds,
// as on the CPU. Copies between host and device (`.to()`, `.cpu()`, `copy_`) copy indices and values
// through the dense copy kernels.
//
// Every other operator on a device sparse tensor — coalesce, to_dense, arithmetic with sparse and
// dense operands, torch.sparse.mm/addmm, index_select, sum, the optimizers' sparse updates — runs
// on the CPU through the boxed fallback registered below: fallback.cpp stages dense device arguments
// as it does for every operator, and the functions here stage sparse ones (a CPU sparse tensor with
// copies of the indices and values), carry the CPU kernel's sparse results to the device, and
// write changed sparse arguments (in-place, out=) back. The dense fallback uses them too, for dense
// operators whose CPU kernel returns a sparse tensor (to_sparse, embedding_bag's sparse backward).
// An operator the CPU has no kernel for on that layout either raises a NotImplementedError naming
// the operator and the layout ("aten::xyz has no {{ cookiecutter.device }} kernel for sparse COO tensors, and the
// CPU fallback cannot run it..."); a view operator the fallback could only copy raises as in
// fallback.cpp. Never a wrong result.
//
// PyTorch gives some operators a generic kernel for every backend (CompositeExplicitAutograd) but
// a sparse one on the CPU; on a sparse tensor the generic one computes something else (`sum`) or
// fails (`mv`, most operators on compressed tensors), so those are routed to the fallback by name.
//
// Compressed layouts: construction (torch.sparse_csr_tensor...), to_sparse_csr/csc/bsr(),
// crow_indices(), col_indices(), values(), to_dense(), .to()/.cpu() work; their operators run
// through the same fallback.
//
// What a hardware team replaces: nothing for correctness. Construction and metadata stay as they
// are; for speed, give hot sparse operators native kernels (e.g. the embedding_bag backward, add_
// of a sparse gradient into a dense parameter, sparse_mask, coalesce) with `m.impl` at the
// SparsePrivateUse1 key, on the device's own indices and values.
#include "aten/sparse.h"

#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/ops/_coalesced_native.h>
#include <ATen/ops/_indices_native.h>
#include <ATen/ops/_nnz_native.h>
#include <ATen/ops/_sparse_compressed_tensor_with_dims_native.h>
#include <ATen/ops/_sparse_coo_tensor_with_dims_and_tensors_native.h>
#include <ATen/ops/_sparse_coo_tensor_with_dims_native.h>
#include <ATen/ops/_to_copy_ops.h>
#include <ATen/ops/_values_native.h>
#include <ATen/ops/ccol_indices_native.h>
#include <ATen/ops/clone_native.h>
#include <ATen/ops/col_indices_native.h>
#include <ATen/ops/copy_native.h>
#include <ATen/ops/copy_ops.h>
#include <ATen/ops/copy_sparse_to_sparse_native.h>
#include <ATen/ops/copy_sparse_to_sparse_ops.h>
#include <ATen/ops/crow_indices_native.h>
#include <ATen/ops/dense_dim_native.h>
#include <ATen/ops/empty_like_native.h>
#include <ATen/ops/empty_native.h>
#include <ATen/ops/indices_native.h>
#include <ATen/ops/is_coalesced_native.h>
#include <ATen/ops/permute_native.h>
#include <ATen/ops/resize_as_sparse_native.h>
#include <ATen/ops/resize_as_sparse_ops.h>
#include <ATen/ops/row_indices_native.h>
#include <ATen/ops/sparse_dim_native.h>
#include <ATen/ops/sparse_resize_and_clear_native.h>
#include <ATen/ops/sparse_resize_and_clear_ops.h>
#include <ATen/ops/sparse_resize_native.h>
#include <ATen/ops/unsqueeze_native.h>
#include <ATen/ops/values_native.h>
#include <ATen/ops/zero_native.h>
#include <torch/library.h>

namespace {{ cookiecutter.device }}::fallback {
// csrc/aten/fallback.cpp: the CPU fallback, redispatching to the CPU kernel at `cpu_keys`.
void run_on_cpu_as(const c10::OperatorHandle& op, torch::jit::Stack* stack, c10::DispatchKeySet cpu_keys);
}  // namespace {{ cookiecutter.device }}::fallback

namespace {{ cookiecutter.device }}::sparse {

namespace {

at::Tensor copy_to(const at::Tensor& t, c10::Device device) {
  return at::_ops::_to_copy::call(t, std::nullopt, std::nullopt, device, std::nullopt, /*non_blocking=*/false,
                                  std::nullopt);
}

bool is_compressed(const at::Tensor& t) { return is_sparse_layout(t) && t.layout() != c10::kSparse; }

}  // namespace

// _to_copy of a sparse tensor copies its member tensors and rebuilds the sparse tensor around them
// on the target device (through the constructors registered below).
at::Tensor to_host(const at::Tensor& device_tensor) {
  return copy_to(device_tensor, c10::Device(c10::DeviceType::CPU));
}

at::Tensor to_device(const at::Tensor& host_tensor, c10::Device device) { return copy_to(host_tensor, device); }

void write_back(const at::Tensor& device_tensor, const at::Tensor& host_tensor) {
  if (!is_compressed(device_tensor)) {
    // cleared first, so that any new geometry is allowed (a sparse tensor with elements refuses to
    // shrink); then it takes device copies of the host indices and values
    at::_ops::sparse_resize_and_clear_::call(device_tensor, host_tensor.sizes(), host_tensor.sparse_dim(),
                                             host_tensor.dense_dim());
    at::_ops::copy_sparse_to_sparse_::call(const_cast<at::Tensor&>(device_tensor), host_tensor, false);
    return;
  }
  // compressed: the member tensors take the new geometry (nnz may have changed), then the contents
  at::_ops::resize_as_sparse_::call(device_tensor, host_tensor);
  at::_ops::copy_::call(const_cast<at::Tensor&>(device_tensor), host_tensor, false);
}

Snapshot snapshot(const at::Tensor& t) {
  Snapshot s;
  s.sizes = t.sizes().vec();
  s.nnz = t._nnz();
  s.sparse_dim = t.sparse_dim();
  s.dense_dim = t.dense_dim();
  if (t.layout() == c10::kSparse) {
    s.coalesced = t.is_coalesced();
    s.indices = t._indices().unsafeGetTensorImpl();
    s.values = t._values().unsafeGetTensorImpl();
  } else {
    s.indices = t.crow_indices().unsafeGetTensorImpl();  // a view: its identity says nothing
    s.values = nullptr;
  }
  return s;
}

bool changed(const Snapshot& before, const at::Tensor& t) {
  if (t.sizes() != c10::IntArrayRef(before.sizes) || t._nnz() != before.nnz || t.sparse_dim() != before.sparse_dim ||
      t.dense_dim() != before.dense_dim) {
    return true;
  }
  if (t.layout() != c10::kSparse) return false;
  return t.is_coalesced() != before.coalesced || t._indices().unsafeGetTensorImpl() != before.indices ||
         t._values().unsafeGetTensorImpl() != before.values;
}

namespace {

// ATen's own backends reach the kernels below through generated wrappers that first make the target
// device current: a new sparse tensor starts with empty indices and values on the current device
// (SparseTensorImpl's constructor), and SparseTensorImpl asserts that later members match. These
// wrappers do the same for kernels that make a new sparse tensor, so `.to("{{ cookiecutter.device }}:1")` lands on device 1.
c10::Device target(std::optional<c10::Device> device) {
  return device.value_or(c10::Device(c10::DeviceType::PrivateUse1));  // an index of -1: the current device
}

at::Tensor coo_with_dims_and_tensors(int64_t sparse_dim, int64_t dense_dim, c10::SymIntArrayRef size,
                                     const at::Tensor& indices, const at::Tensor& values,
                                     std::optional<c10::ScalarType> dtype, std::optional<c10::Layout> layout,
                                     std::optional<c10::Device> device, std::optional<bool> pin_memory,
                                     std::optional<bool> is_coalesced) {
  c10::DeviceGuard guard(target(device));
  return at::native::new_with_dims_and_tensor_sparse_symint(sparse_dim, dense_dim, size, indices, values, dtype, layout,
                                                            device, pin_memory, is_coalesced);
}

at::Tensor coo_with_dims(int64_t sparse_dim, int64_t dense_dim, c10::IntArrayRef size,
                         std::optional<c10::ScalarType> dtype, std::optional<c10::Layout> layout,
                         std::optional<c10::Device> device, std::optional<bool> pin_memory) {
  c10::DeviceGuard guard(target(device));
  return at::native::new_with_dims_sparse(sparse_dim, dense_dim, size, dtype, layout, device, pin_memory);
}

at::Tensor empty_coo(c10::IntArrayRef size, std::optional<c10::ScalarType> dtype, std::optional<c10::Layout> layout,
                     std::optional<c10::Device> device, std::optional<bool> pin_memory,
                     std::optional<c10::MemoryFormat> memory_format) {
  c10::DeviceGuard guard(target(device));
  return at::native::empty_sparse(size, dtype, layout, device, pin_memory, memory_format);
}

at::Tensor empty_compressed(c10::IntArrayRef size, std::optional<c10::ScalarType> dtype,
                            std::optional<c10::Layout> layout, std::optional<c10::Device> device,
                            std::optional<bool> pin_memory, std::optional<c10::MemoryFormat> memory_format) {
  c10::DeviceGuard guard(target(device));
  return at::native::empty_sparse_compressed(size, dtype, layout, device, pin_memory, memory_format);
}

at::Tensor compressed_with_dims(int64_t nnz, int64_t dense_dim, c10::IntArrayRef size, c10::IntArrayRef blocksize,
                                c10::ScalarType index_dtype, std::optional<c10::ScalarType> dtype,
                                std::optional<c10::Layout> layout, std::optional<c10::Device> device,
                                std::optional<bool> pin_memory) {
  c10::DeviceGuard guard(target(device));
  return at::native::sparse_compressed_tensor_with_dims(nnz, dense_dim, size, blocksize, index_dtype, dtype, layout,
                                                        device, pin_memory);
}

at::Tensor empty_like_coo(const at::Tensor& self, std::optional<c10::ScalarType> dtype,
                          std::optional<c10::Layout> layout, std::optional<c10::Device> device,
                          std::optional<bool> pin_memory, std::optional<c10::MemoryFormat> memory_format) {
  c10::DeviceGuard guard(device.value_or(self.device()));
  return at::native::empty_like_sparse_coo(self, dtype, layout, device, pin_memory, memory_format);
}

at::Tensor empty_like_compressed(const at::Tensor& self, std::optional<c10::ScalarType> dtype,
                                 std::optional<c10::Layout> layout, std::optional<c10::Device> device,
                                 std::optional<bool> pin_memory, std::optional<c10::MemoryFormat> memory_format) {
  c10::DeviceGuard guard(device.value_or(self.device()));
  return at::native::empty_like_sparse_csr(self, dtype, layout, device, pin_memory, memory_format);
}

at::Tensor clone_coo(const at::Tensor& self, std::optional<c10::MemoryFormat> memory_format) {
  c10::DeviceGuard guard(self.device());
  return at::native::clone_sparse(self, memory_format);
}

at::Tensor clone_compressed(const at::Tensor& self, std::optional<c10::MemoryFormat> memory_format) {
  c10::DeviceGuard guard(self.device());
  return at::native::clone_sparse_compressed(self, memory_format);
}

at::Tensor permute_coo(const at::Tensor& self, c10::IntArrayRef dims) {
  c10::DeviceGuard guard(self.device());
  return at::native::permute_sparse_coo(self, dims);
}

at::Tensor unsqueeze_coo(const at::Tensor& self, int64_t dim) {
  c10::DeviceGuard guard(self.device());
  return at::native::unsqueeze_sparse(self, dim);
}

// The boxed fallback for operators on device sparse tensors: the CPU's sparse kernels run on
// staged copies (fallback.cpp and the functions above).
void run_coo_on_cpu(const c10::OperatorHandle& op, torch::jit::Stack* stack) {
  fallback::run_on_cpu_as(op, stack, c10::DispatchKeySet({c10::DispatchKey::SparseCPU, c10::DispatchKey::CPU}));
}

void run_compressed_on_cpu(const c10::OperatorHandle& op, torch::jit::Stack* stack) {
  fallback::run_on_cpu_as(
      op, stack,
      c10::DispatchKeySet({c10::DispatchKey::SparseCsrCPU, c10::DispatchKey::SparseCPU, c10::DispatchKey::CPU}));
}

}  // namespace
}  // namespace {{ cookiecutter.device }}::sparse

// COO: construction, metadata and views, copies, resizing — ATen's device-generic kernels.
TORCH_LIBRARY_IMPL(aten, SparsePrivateUse1, m) {
  namespace sparse = {{ cookiecutter.device }}::sparse;
  m.impl("_sparse_coo_tensor_with_dims_and_tensors", TORCH_FN(sparse::coo_with_dims_and_tensors));
  m.impl("_sparse_coo_tensor_with_dims", TORCH_FN(sparse::coo_with_dims));
  m.impl("empty.memory_format", TORCH_FN(sparse::empty_coo));
  m.impl("empty_like", TORCH_FN(sparse::empty_like_coo));
  m.impl("_indices", TORCH_FN(at::native::_indices_sparse));
  m.impl("_values", TORCH_FN(at::native::_values_sparse));
  m.impl("indices", TORCH_FN(at::native::indices_sparse));
  m.impl("values", TORCH_FN(at::native::values_sparse));
  m.impl("_nnz", TORCH_FN(at::native::_nnz_sparse));
  m.impl("sparse_dim", TORCH_FN(at::native::sparse_dim_sparse));
  m.impl("dense_dim", TORCH_FN(at::native::dense_dim_sparse));
  m.impl("_dimI", TORCH_FN(at::native::sparse_dim_sparse));
  m.impl("_dimV", TORCH_FN(at::native::dense_dim_sparse));
  m.impl("is_coalesced", TORCH_FN(at::native::is_coalesced_sparse));
  m.impl("_coalesced_", TORCH_FN(at::native::_coalesced_sparse_));
  m.impl("sparse_resize_", TORCH_FN(at::native::sparse_resize_));
  m.impl("sparse_resize_and_clear_", TORCH_FN(at::native::sparse_resize_and_clear_));
  m.impl("copy_", TORCH_FN(at::native::copy_sparse_wrapper_));
  m.impl("copy_sparse_to_sparse_", TORCH_FN(at::native::copy_sparse_));
  m.impl("clone", TORCH_FN(sparse::clone_coo));
  m.impl("zero_", TORCH_FN(at::native::zero_sparse_));
  m.impl("permute", TORCH_FN(sparse::permute_coo));
  m.impl("unsqueeze", TORCH_FN(sparse::unsqueeze_coo));
}

// COO: operators PyTorch gives a generic kernel for every backend but a sparse one on the CPU (the
// generic kernel computes something else on a sparse tensor: sum, or fails: mv): the CPU's,
// through the fallback.
TORCH_LIBRARY_IMPL(aten, SparsePrivateUse1, m) {
  const auto cpu = [] {
    return torch::CppFunction::makeFromBoxedFunction<&{{ cookiecutter.device }}::sparse::run_coo_on_cpu>();
  };
  m.impl("abs", cpu());
  m.impl("abs_", cpu());
  m.impl("nan_to_num", cpu());
  m.impl("nan_to_num_", cpu());
  m.impl("mv", cpu());
  m.impl("rad2deg", cpu());
  m.impl("rad2deg_", cpu());
  m.impl("rad2deg.out", cpu());
  m.impl("deg2rad", cpu());
  m.impl("deg2rad_", cpu());
  m.impl("deg2rad.out", cpu());
  m.impl("sum", cpu());
  m.impl("zeros.out", cpu());
}

TORCH_LIBRARY_IMPL(_, SparsePrivateUse1, m) {
  m.fallback(torch::CppFunction::makeFromBoxedFunction<&{{ cookiecutter.device }}::sparse::run_coo_on_cpu>());
}

// Compressed layouts: construction, metadata and views, copies.
TORCH_LIBRARY_IMPL(aten, SparseCsrPrivateUse1, m) {
  namespace sparse = {{ cookiecutter.device }}::sparse;
  m.impl("_sparse_compressed_tensor_with_dims", TORCH_FN(sparse::compressed_with_dims));
  m.impl("empty.memory_format", TORCH_FN(sparse::empty_compressed));
  m.impl("empty_like", TORCH_FN(sparse::empty_like_compressed));
  m.impl("crow_indices", TORCH_FN(at::native::crow_indices_sparse_csr));
  m.impl("col_indices", TORCH_FN(at::native::col_indices_sparse_csr));
  m.impl("ccol_indices", TORCH_FN(at::native::ccol_indices_sparse_csr));
  m.impl("row_indices", TORCH_FN(at::native::row_indices_sparse_csr));
  m.impl("values", TORCH_FN(at::native::values_sparse_csr));
  m.impl("_nnz", TORCH_FN(at::native::_nnz_sparse_csr));
  m.impl("sparse_dim", TORCH_FN(at::native::sparse_dim_sparse_csr));
  m.impl("dense_dim", TORCH_FN(at::native::dense_dim_sparse_csr));
  m.impl("resize_as_sparse_", TORCH_FN(at::native::resize_as_sparse_compressed_));
  m.impl("copy_", TORCH_FN(at::native::copy_sparse_compressed_));
  m.impl("clone", TORCH_FN(sparse::clone_compressed));
  m.impl("zero_", TORCH_FN(at::native::zero_sparse_csr_));
}

// Compressed layouts: operators PyTorch gives a generic kernel for every backend (one that would
// treat a compressed tensor as strided) but a compressed kernel on the CPU: the CPU's, through the
// fallback. (select.int returns a view, so through the fallback it raises as view operators do.)
TORCH_LIBRARY_IMPL(aten, SparseCsrPrivateUse1, m) {
  const auto cpu = [] {
    return torch::CppFunction::makeFromBoxedFunction<&{{ cookiecutter.device }}::sparse::run_compressed_on_cpu>();
  };
  m.impl("abs", cpu());
  m.impl("abs_", cpu());
  m.impl("sgn", cpu());
  m.impl("sgn_", cpu());
  m.impl("_conj_physical", cpu());
  m.impl("conj_physical_", cpu());
  m.impl("add.Tensor", cpu());
  m.impl("add_.Tensor", cpu());
  m.impl("asinh", cpu());
  m.impl("asinh_", cpu());
  m.impl("atanh", cpu());
  m.impl("atanh_", cpu());
  m.impl("asin", cpu());
  m.impl("asin_", cpu());
  m.impl("atan", cpu());
  m.impl("atan_", cpu());
  m.impl("ceil", cpu());
  m.impl("ceil_", cpu());
  m.impl("erf", cpu());
  m.impl("erf_", cpu());
  m.impl("expm1", cpu());
  m.impl("expm1_", cpu());
  m.impl("floor", cpu());
  m.impl("floor_", cpu());
  m.impl("frac", cpu());
  m.impl("frac_", cpu());
  m.impl("log1p", cpu());
  m.impl("log1p_", cpu());
  m.impl("mm", cpu());
  m.impl("mul.Tensor", cpu());
  m.impl("mul_.Tensor", cpu());
  m.impl("mul.Scalar", cpu());
  m.impl("mul_.Scalar", cpu());
  m.impl("rad2deg", cpu());
  m.impl("rad2deg_", cpu());
  m.impl("rad2deg.out", cpu());
  m.impl("deg2rad", cpu());
  m.impl("deg2rad_", cpu());
  m.impl("deg2rad.out", cpu());
  m.impl("neg", cpu());
  m.impl("neg_", cpu());
  m.impl("round", cpu());
  m.impl("round_", cpu());
  m.impl("select.int", cpu());
  m.impl("sin", cpu());
  m.impl("sin_", cpu());
  m.impl("sinh", cpu());
  m.impl("sinh_", cpu());
  m.impl("sum", cpu());
  m.impl("sum.dim_IntList", cpu());
  m.impl("sqrt", cpu());
  m.impl("sqrt_", cpu());
  m.impl("tan", cpu());
  m.impl("tan_", cpu());
  m.impl("tanh", cpu());
  m.impl("tanh_", cpu());
  m.impl("threshold_backward", cpu());
  m.impl("trunc", cpu());
  m.impl("trunc_", cpu());
  m.impl("addmm", cpu());
  m.impl("erfinv", cpu());
  m.impl("erfinv_", cpu());
  m.impl("sign", cpu());
  m.impl("sign_", cpu());
  m.impl("signbit", cpu());
  m.impl("isinf", cpu());
  m.impl("isposinf", cpu());
  m.impl("isneginf", cpu());
  m.impl("select_copy.int", cpu());
}

TORCH_LIBRARY_IMPL(_, SparseCsrPrivateUse1, m) {
  m.fallback(torch::CppFunction::makeFromBoxedFunction<&{{ cookiecutter.device }}::sparse::run_compressed_on_cpu>());
}
