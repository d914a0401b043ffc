// Nested tensors on {{ cookiecutter.device }}: torch.nested (the strided layout) and the Transformer fast path.
//
// Why a backend meets them: nn.TransformerEncoder(Layer) and nn.MultiheadAttention in eval mode
// under no_grad treat PrivateUse1 as a fast-path device (`_supported_device_type` in
// torch/nn/modules/transformer.py). Given a src_key_padding_mask, the encoder packs the batch into a
// nested tensor (aten::_nested_tensor_from_mask), runs _transformer_encoder_layer_fwd on it and
// unpacks it with to_padded_tensor. A nested tensor is a NestedTensorImpl: one buffer (its storage)
// and each component's sizes, strides and storage offset in CPU tensors — on CUDA as here, only the
// buffer lives on the device. Its dispatch key is NestedTensorPrivateUse1, for which PyTorch
// registers no kernels.
//
// What this file does:
//   - registers the CPU fallback (fallback.cpp) for NestedTensorPrivateUse1 as well. The fallback
//     stages a nested device argument as a CPU nested tensor over a host copy of its buffer (the
//     same metadata), runs PyTorch's NestedTensorCPU kernel, copies back the buffers the kernel
//     wrote, and turns nested CPU results into nested device tensors: a result on an argument's
//     buffer (a view: detach, unbind, transpose) stays on that argument's device buffer, a new one
//     gets a device buffer of its own. The dense fallback turns the nested results of dense
//     operators (_nested_tensor_from_mask) into nested device tensors the same way.
//   - _to_copy: .to(device), .cpu(), .to(dtype) of a nested device tensor. Through the fallback, a
//     result meant for the host would be moved back to the device.
//   - _nested_tensor_size, _nested_tensor_strides, _nested_tensor_storage_offsets: the metadata is
//     host memory on CPU and CUDA alike; through the fallback it would come back as device tensors.
//   - the fallback by name for the few operators (linear, matmul, ...) whose NestedTensorPrivateUse1
//     entry would otherwise be a decomposition that cannot handle nested tensors (see the bottom).
//
// What a hardware team replaces: nothing at first — nested operators run on the CPU like every
// operator without a kernel. A native nested kernel (at NestedTensorPrivateUse1, e.g.
// _transformer_encoder_layer_fwd or to_padded_tensor) works on the buffer,
// get_nested_tensor_impl(t)->get_unsafe_storage_as_tensor(), a dense device tensor, and reads the
// metadata on the host; over_storage (nested.h) wraps a result buffer as a nested device tensor.
#include "aten/nested.h"

#include <ATen/NestedTensorImpl.h>
#include <ATen/ops/_to_copy_ops.h>
#include <torch/library.h>

namespace {{ cookiecutter.device }}::fallback {
void run_on_cpu(const c10::OperatorHandle& op, torch::jit::Stack* stack);  // csrc/aten/fallback.cpp
}

namespace {{ cookiecutter.device }}::nested {

const c10::Storage& storage_of(const at::Tensor& t) { return t.unsafeGetTensorImpl()->unsafe_storage(); }

at::Tensor over_storage(c10::Storage storage, c10::DispatchKey backend, const at::Tensor& like, int64_t shift) {
  const at::native::NestedTensorImpl* impl = at::native::get_nested_tensor_impl(like);
  const int64_t numel = static_cast<int64_t>(storage.nbytes() / like.dtype().itemsize());
  // The buffer: a dense 1-d tensor over the whole storage. NestedTensorImpl takes its storage and
  // derives its dispatch keys from the buffer's: CPU -> NestedTensorCPU, PrivateUse1 -> NestedTensorPrivateUse1.
  auto buffer = at::detail::make_tensor<c10::TensorImpl>(std::move(storage), c10::DispatchKeySet(backend), like.dtype());
  buffer.unsafeGetTensorImpl()->set_sizes_contiguous({numel});
  at::Tensor offsets = impl->get_storage_offsets();
  if (shift != 0) offsets = offsets.add(shift);
  return at::detail::make_tensor<at::native::NestedTensorImpl>(buffer, impl->get_nested_sizes(),
                                                              impl->get_nested_strides(), offsets);
}

namespace {

// The whole buffer of a nested tensor as a dense tensor on its device.
at::Tensor buffer_of(const at::Tensor& t) { return at::native::get_nested_tensor_impl(t)->get_unsafe_storage_as_tensor(); }

at::Tensor dense_to(const at::Tensor& dense, c10::Device device, bool non_blocking) {
  return at::_ops::_to_copy::call(dense, std::nullopt, std::nullopt, device, std::nullopt, non_blocking, std::nullopt);
}

// .to() of a nested device tensor: the buffer comes to the host (a dense copy, ordered after the
// stream's work), PyTorch's CPU kernel converts it (dtype; a non-contiguous nested tensor comes out
// contiguous), and a result for the device gets a device buffer.
at::Tensor to_copy(const at::Tensor& self, std::optional<c10::ScalarType> dtype, std::optional<c10::Layout> layout,
                   std::optional<c10::Device> device, std::optional<bool> pin_memory, bool non_blocking,
                   std::optional<c10::MemoryFormat> memory_format) {
  const c10::Device to = device.value_or(self.device());
  TORCH_CHECK(to.is_cpu() || to.type() == c10::DeviceType::PrivateUse1,
              "{{ cookiecutter.device }}: a nested tensor moves between the host and {{ cookiecutter.device }} only, not to ", to);
  const at::Tensor host_buffer = dense_to(buffer_of(self), c10::Device(c10::DeviceType::CPU), false);
  const at::Tensor host = over_storage(host_buffer.storage(), c10::DispatchKey::CPU, self);
  at::Tensor out = at::_ops::_to_copy::call(host, dtype, layout, c10::Device(c10::DeviceType::CPU),
                                            to.is_cpu() ? pin_memory : std::nullopt, false, memory_format);
  if (to.is_cpu()) return out;
  const at::Tensor device_buffer = dense_to(buffer_of(out), to, non_blocking);
  return over_storage(device_buffer.storage(), c10::DispatchKey::PrivateUse1, out);
}

// The metadata, host tensors as on CPU and CUDA.
at::Tensor nested_sizes(const at::Tensor& self) {
  return at::native::get_nested_tensor_impl(self)->get_nested_sizes().clone();
}
at::Tensor nested_strides(const at::Tensor& self) {
  return at::native::get_nested_tensor_impl(self)->get_nested_strides().clone();
}
at::Tensor nested_storage_offsets(const at::Tensor& self) {
  return at::native::get_nested_tensor_impl(self)->get_storage_offsets().clone();
}

}  // namespace
}  // namespace {{ cookiecutter.device }}::nested

TORCH_LIBRARY_IMPL(_, NestedTensorPrivateUse1, m) {
  m.fallback(torch::CppFunction::makeFromBoxedFunction<&{{ cookiecutter.device }}::fallback::run_on_cpu>());
}

TORCH_LIBRARY_IMPL(aten, NestedTensorPrivateUse1, m) {
  namespace nested = {{ cookiecutter.device }}::nested;
  m.impl("_to_copy", TORCH_FN(nested::to_copy));
  m.impl("_nested_tensor_size", TORCH_FN(nested::nested_sizes));
  m.impl("_nested_tensor_strides", TORCH_FN(nested::nested_strides));
  m.impl("_nested_tensor_storage_offsets", TORCH_FN(nested::nested_storage_offsets));
}

// Operators PyTorch gives NestedTensorCPU a kernel of their own but NestedTensorPrivateUse1 only
// their CompositeImplicitAutograd decomposition, which asks a nested tensor for sizes() it does not
// have ("NestedTensorImpl doesn't support sizes"): nn.functional.linear and matmul on nested
// tensors failed. They go to the CPU fallback by name, so PyTorch's nested CPU kernels run them.
TORCH_LIBRARY_IMPL(aten, NestedTensorPrivateUse1, m) {
  auto on_cpu = [] { return torch::CppFunction::makeFromBoxedFunction<&{{ cookiecutter.device }}::fallback::run_on_cpu>(); };
  m.impl("linear", on_cpu());
  m.impl("matmul", on_cpu());
  m.impl("matmul.out", on_cpu());
  m.impl("chunk", on_cpu());
  m.impl("narrow", on_cpu());
  m.impl("silu_backward", on_cpu());
  m.impl("value_selecting_reduction_backward", on_cpu());
}
