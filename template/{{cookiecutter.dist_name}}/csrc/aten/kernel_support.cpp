// Implementation of kernel_support.h: zero-copy host views of {{ cookiecutter.device }} memory.
//
// What a hardware team replaces: host_alias only works because the emulated device memory is host
// memory. With real device memory, kernels launch SDK work on device pointers instead, and the
// minimal ops (_copy_from) move bytes with driver::memcpy.
#include "aten/kernel_support.h"

#include <ATen/ops/copy_ops.h>
#include <ATen/ops/empty_ops.h>
#include <ATen/ops/empty_strided_ops.h>
#include <ATen/ops/resize_ops.h>
#include <c10/core/CPUAllocator.h>

#include <cstring>

#include "runtime/runtime.h"

namespace {{ cookiecutter.device }}::kernels {

namespace {
bool on_device(const at::Tensor& t) { return t.defined() && t.device().type() == c10::DeviceType::PrivateUse1; }
}  // namespace

at::Tensor host_alias(const at::Tensor& t) {
  if (!on_device(t)) return t;
  const c10::Storage& st = t.storage();
  // Non-owning: the device allocator frees the memory; resizable, so an out= kernel may grow it
  // (write_back notices and moves the result to device memory).
  c10::Storage host(c10::Storage::use_byte_size_t(), st.nbytes(),
                    c10::DataPtr(const_cast<void*>(st.data()), c10::Device(c10::DeviceType::CPU)),
                    c10::GetCPUAllocator(), /*resizable=*/true);
  auto h = at::detail::make_tensor<c10::TensorImpl>(std::move(host), c10::DispatchKeySet(c10::DispatchKey::CPU),
                                                    t.dtype());
  h.unsafeGetTensorImpl()->set_sizes_and_strides(t.sizes(), t.strides(), t.storage_offset());
  if (t.is_conj()) h._set_conj(true);
  if (t.is_neg()) h._set_neg(true);
  return h;
}

std::optional<at::Tensor> host_alias(const std::optional<at::Tensor>& t) {
  if (!t.has_value()) return t;
  return host_alias(*t);
}

std::vector<at::Tensor> host_alias(at::ITensorListRef ts) {
  std::vector<at::Tensor> out;
  out.reserve(ts.size());
  for (const at::Tensor& t : ts) out.push_back(host_alias(t));
  return out;
}

std::vector<at::Tensor> host_alias(at::TensorList ts) {
  std::vector<at::Tensor> out;
  out.reserve(ts.size());
  for (const at::Tensor& t : ts) out.push_back(host_alias(t));
  return out;
}

c10::List<std::optional<at::Tensor>> host_alias(const c10::List<std::optional<at::Tensor>>& ts) {
  c10::List<std::optional<at::Tensor>> out;
  out.reserve(ts.size());
  for (const std::optional<at::Tensor>& t : ts) out.push_back(host_alias(t));
  return out;
}

void write_back(const at::Tensor& device_out, const at::Tensor& host_out) {
  if (!on_device(device_out) || !host_out.defined()) return;
  c10::TensorImpl* d = device_out.unsafeGetTensorImpl();
  if (host_out.storage().data() == device_out.storage().data()) {
    if (host_out.sizes() != device_out.sizes() || host_out.strides() != device_out.strides() ||
        host_out.storage_offset() != device_out.storage_offset()) {
      d->set_sizes_and_strides(host_out.sizes(), host_out.strides(), host_out.storage_offset());
    }
    return;
  }
  // The CPU kernel reallocated the output (it was too small): grow the device tensor, copy in.
  at::_ops::resize_::call(device_out, host_out.sym_sizes(), std::nullopt);
  if (host_out.is_contiguous() && device_out.is_contiguous()) {
    {{ cookiecutter.DEVICE }}_CHECK(driver::memcpy(device_out.data_ptr(), host_out.data_ptr(), host_out.nbytes(),
                                                   driver::CopyKind::host_to_device));
  } else {
    at::Tensor alias = host_alias(device_out);
    at::_ops::copy_::call(alias, host_out, false);
  }
}

at::Tensor to_device(const at::Tensor& host, c10::Device device) {
  if (!host.defined() || on_device(host)) return host;
  if (device.index() < 0) device = c10::Device(c10::DeviceType::PrivateUse1, runtime::current_device());
  const bool dense = host.is_non_overlapping_and_dense();
  at::Tensor out = dense ? at::_ops::empty_strided::call(host.sym_sizes(), host.sym_strides(), host.scalar_type(),
                                                         std::nullopt, device, std::nullopt)
                         : at::_ops::empty_memory_format::call(host.sym_sizes(), host.scalar_type(), std::nullopt,
                                                               device, std::nullopt, std::nullopt);
  if (dense) {
    {{ cookiecutter.DEVICE }}_CHECK(driver::memcpy(out.data_ptr(), host.data_ptr(), host.nbytes(),
                                                   driver::CopyKind::host_to_device));
  } else {
    at::Tensor alias = host_alias(out);
    at::_ops::copy_::call(alias, host, false);
  }
  return out;
}

c10::Device device_of(const at::Tensor& t) {
  if (on_device(t)) return t.device();
  return c10::Device(c10::DeviceType::PrivateUse1, runtime::current_device());
}

at::Tensor device_view(const at::Tensor& base, const at::Tensor& view) {
  auto v = at::detail::make_tensor<c10::TensorImpl>(c10::TensorImpl::VIEW, c10::Storage(base.storage()),
                                                    base.key_set(), base.dtype());
  v.unsafeGetTensorImpl()->set_sizes_and_strides(view.sizes(), view.strides(), view.storage_offset());
  return v;
}

}  // namespace {{ cookiecutter.device }}::kernels
