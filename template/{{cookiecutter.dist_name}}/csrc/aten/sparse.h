// Sparse tensors on the device (see sparse.cpp): how the CPU fallback stages them.
#pragma once

#include <ATen/core/Tensor.h>
#include <c10/core/Device.h>

#include <cstdint>
#include <vector>

namespace {{ cookiecutter.device }}::sparse {

// Whether `t` has a sparse layout: COO (torch.sparse_coo) or compressed (CSR, CSC, BSR, BSC).
inline bool is_sparse_layout(const at::Tensor& t) {
  const c10::Layout layout = t.layout();
  return layout == c10::kSparse || layout == c10::kSparseCsr || layout == c10::kSparseCsc ||
         layout == c10::kSparseBsr || layout == c10::kSparseBsc;
}

// A device tensor of a sparse layout as a new CPU tensor of that layout: its indices and values
// are copied, its coalesced flag kept.
at::Tensor to_host(const at::Tensor& device_tensor);

// A CPU tensor of a sparse layout (a CPU kernel's result) as a new tensor of that layout on `device`.
at::Tensor to_device(const at::Tensor& host_tensor, c10::Device device);

// Gives the device tensor the geometry and contents of `host_tensor`, its staged copy that a CPU
// kernel changed (an in-place or out= argument).
void write_back(const at::Tensor& device_tensor, const at::Tensor& host_tensor);

// Whether the CPU kernel changed `host_tensor` (as `to_host` made it, `snapshot` taken then) in a
// way the device tensor must be told about without the schema saying so: new sizes, dimensions,
// number of elements, coalesced flag, or new indices/values tensors.
struct Snapshot {
  std::vector<int64_t> sizes;
  int64_t nnz = 0;
  int64_t sparse_dim = 0;
  int64_t dense_dim = 0;
  bool coalesced = false;
  const void* indices = nullptr;
  const void* values = nullptr;
};
Snapshot snapshot(const at::Tensor& host_tensor);
bool changed(const Snapshot& before, const at::Tensor& host_tensor);

}  // namespace {{ cookiecutter.device }}::sparse
