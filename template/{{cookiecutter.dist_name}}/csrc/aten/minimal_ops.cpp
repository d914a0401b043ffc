// The minimal operator set every PrivateUse1 backend must implement: tensor creation (empty,
// empty_strided), views (as_strided, view, _reshape_alias), resize_, copies between host and device
// (_copy_from, _copy_from_and_resize), reading a scalar (_local_scalar_dense), set_ and
// record_stream.
// Everything else reaches the device through native kernels (csrc/aten/ops/) or the CPU fallback.
//
// What a hardware team replaces: nothing at first. Without the driver's host_mapping, a copy of
// one dense block is one driver::memcpy and every other copy (strided, converting) is staged
// (kernel_support.h); a chip's strided-copy kernel can take the staged path's place later.
// Creation, views and resize only manage metadata and the allocator.
#include <ATen/EmptyTensor.h>
#include <ATen/MemoryOverlap.h>
#include <ATen/ops/_local_scalar_dense_ops.h>
#include <ATen/ops/as_strided_ops.h>
#include <ATen/ops/copy_ops.h>
#include <ATen/ops/resize_ops.h>
#include <ATen/ops/view_ops.h>
#include <c10/core/CachingDeviceAllocator.h>
#include <c10/core/impl/DeviceGuardImplInterface.h>
#include <torch/library.h>

#include <algorithm>
#include <vector>

#include "aten/kernel_support.h"
#include "runtime/runtime.h"

namespace {{ cookiecutter.device }}::minimal_ops {

constexpr auto kKeys = c10::DispatchKeySet(c10::DispatchKey::PrivateUse1);

c10::Device target(std::optional<c10::Device> device) {
  c10::Device d = device.value_or(c10::Device(c10::DeviceType::PrivateUse1));
  TORCH_CHECK(d.type() == c10::DeviceType::PrivateUse1, "expected a {{ cookiecutter.device }} device, got ", d);
  if (!d.has_index()) return c10::Device(c10::DeviceType::PrivateUse1, runtime::current_device());
  runtime::check_device(d.index());
  return d;
}

at::Tensor empty_memory_format(c10::IntArrayRef size, std::optional<c10::ScalarType> dtype,
                               std::optional<c10::Layout> layout, std::optional<c10::Device> device,
                               std::optional<bool> pin_memory, std::optional<c10::MemoryFormat> memory_format) {
  TORCH_CHECK(layout.value_or(c10::kStrided) == c10::kStrided, "{{ cookiecutter.device }} supports strided tensors only");
  c10::Device d = target(device);
  c10::DeviceGuard guard(d);  // the allocator allocates on the current device
  return at::detail::empty_generic(size, runtime::device_allocator(), kKeys,
                                   dtype.value_or(c10::get_default_dtype_as_scalartype()), memory_format);
}

at::Tensor empty_strided(c10::IntArrayRef size, c10::IntArrayRef stride, std::optional<c10::ScalarType> dtype,
                         std::optional<c10::Layout> layout, std::optional<c10::Device> device,
                         std::optional<bool> pin_memory) {
  TORCH_CHECK(layout.value_or(c10::kStrided) == c10::kStrided, "{{ cookiecutter.device }} supports strided tensors only");
  c10::Device d = target(device);
  c10::DeviceGuard guard(d);
  return at::detail::empty_strided_generic(size, stride, runtime::device_allocator(), kKeys,
                                           dtype.value_or(c10::get_default_dtype_as_scalartype()));
}

// Views share the device storage; their geometry is computed by the CPU kernel on a host alias,
// so error messages and edge cases match PyTorch's own.
at::Tensor as_strided(const at::Tensor& self, c10::IntArrayRef size, c10::IntArrayRef stride,
                      std::optional<int64_t> storage_offset) {
  at::Tensor v = at::_ops::as_strided::call(kernels::host_alias(self), c10::fromIntArrayRefSlow(size),
                                            c10::fromIntArrayRefSlow(stride),
                                            storage_offset.has_value() ? std::optional<c10::SymInt>(*storage_offset)
                                                                       : std::nullopt);
  return kernels::device_view(self, v);
}

at::Tensor view(const at::Tensor& self, c10::IntArrayRef size) {
  at::Tensor v = at::_ops::view::call(kernels::host_alias(self), c10::fromIntArrayRefSlow(size));
  return kernels::device_view(self, v);
}

at::Tensor reshape_alias(const at::Tensor& self, c10::IntArrayRef size, c10::IntArrayRef stride) {
  return minimal_ops::as_strided(self, size, stride, self.storage_offset());
}

// PyTorch's resize_ semantics: the same sizes keep the tensor as it is (strides, offset and all:
// out= and in-place write-backs resize to the size a view already has), new sizes make it
// contiguous, the storage grows when it must (keeping its contents) and never shrinks, and a
// memory format restrides the result.
const at::Tensor& resize_(const at::Tensor& self, c10::IntArrayRef size,
                          std::optional<c10::MemoryFormat> memory_format) {
  c10::TensorImpl* impl = self.unsafeGetTensorImpl();
  if (self.sizes() != size) {
    impl->set_sizes_contiguous(size);
    const size_t needed = impl->numel() == 0 ? 0
        : at::detail::computeStorageNbytesContiguous(size, self.dtype().itemsize(), self.storage_offset());
    kernels::grow_storage(self.storage(), needed, self.device());
  }
  if (memory_format.has_value()) {
    TORCH_CHECK(*memory_format != c10::MemoryFormat::Preserve, "Unsupported memory format ", *memory_format);
    impl->empty_tensor_restride(*memory_format);
  }
  return self;
}

// Whether a copy is one block of bytes: the same dtype, sizes and strides, dense, no conj/neg bits.
bool dense_same_layout(const at::Tensor& src, const at::Tensor& dst) {
  return src.dtype() == dst.dtype() && src.sizes() == dst.sizes() && src.strides() == dst.strides() &&
         src.is_non_overlapping_and_dense() && !src.is_conj() && !dst.is_conj() && !src.is_neg() && !dst.is_neg();
}

// Copies between the host and the device, or between devices. The CPU copy kernel handles dtype
// conversion, broadcasting and strides on host aliases of both sides. As on CUDA:
//   - a copy within one device is queued on the current stream and returns at once;
//   - a non_blocking copy between the device and pinned host memory is queued too, and the
//     pinned block is not reused before the stream passes the copy (the host allocator's
//     record_event); the host must synchronize before it reads (or refills) the host side;
//   - every other copy with the host is blocking: it runs after the stream's queued work and
//     returns when done.
// The argument checks PyTorch's copy kernels make (TensorIterator's: the source broadcasts to the
// destination; the destination has no internal overlap and does not partly overlap the source), made
// here on the host before anything is queued, so a bad copy_ raises in the call that made it.
void check_copy(const at::Tensor& self, const at::Tensor& dst) {
  if (self.is_same(dst)) return;
  const std::vector<int64_t> broadcast = kernels::broadcast_shape(dst.sizes(), self.sizes());
  TORCH_CHECK(c10::IntArrayRef(broadcast) == dst.sizes(), "output with shape ", dst.sizes(),
              " doesn't match the broadcast shape ", c10::IntArrayRef(broadcast));
  at::assert_no_internal_overlap(dst);
  at::assert_no_partial_overlap(dst, self);
}

at::Tensor copy_from(const at::Tensor& self, const at::Tensor& dst, bool non_blocking) {
  check_copy(self, dst);
  const bool dst_on_device = dst.device().type() == c10::DeviceType::PrivateUse1;
  const bool src_on_device = self.device().type() == c10::DeviceType::PrivateUse1;
  const c10::Device device = kernels::device_of(dst_on_device ? dst : self);
  c10::DeviceGuard guard(device);
  const int64_t stream = runtime::current_stream_id(device.index());
  if (dst_on_device && src_on_device && self.device() != dst.device()) {
    // Between devices: the source's device finishes what it queued, then the copy runs in order
    // on the destination's stream.
    {{ cookiecutter.DEVICE }}_CHECK(driver::stream_synchronize(self.device().index(),
                                                               runtime::current_stream_id(self.device().index())));
  }
  const at::Tensor& host_side = dst_on_device ? self : dst;
  const bool pinned = !(dst_on_device && src_on_device) && driver::is_host_pinned(host_side.storage().data());
  const bool queued = (dst_on_device && src_on_device && self.device() == dst.device()) || (non_blocking && pinned);
  // the profiler shows copies between host and device as memcpys by these names
  const char* name = dst_on_device && src_on_device ? "copy device to device"
                     : dst_on_device                ? "copy host to device"
                                                    : "copy device to host";
  if (!kernels::host_mapped() && dense_same_layout(self, dst)) {  // one driver copy, no staging
    const driver::CopyKind kind = dst_on_device && src_on_device ? driver::CopyKind::device_to_device
                                  : dst_on_device                ? driver::CopyKind::host_to_device
                                                                 : driver::CopyKind::device_to_host;
    const size_t nbytes = static_cast<size_t>(self.numel()) * self.dtype().itemsize();
    if (nbytes > 0) {
      {{ cookiecutter.DEVICE }}_CHECK(queued ? driver::memcpy_async(dst.data_ptr(), self.data_ptr(), nbytes, kind, device.index(), stream)
                                             : driver::memcpy(dst.data_ptr(), self.data_ptr(), nbytes, kind, device.index(), stream));
    }
    if (queued && pinned) {
      runtime::record_host_use(host_side.storage().data_ptr(), c10::Stream(c10::Stream::UNSAFE, device, stream));
    }
    return dst;
  }
  if (!queued || !kernels::host_mapped()) {  // without host mapping, staged on this thread
    kernels::StreamScope on_stream(device, name);
    at::Tensor dst_alias = kernels::host_alias(dst);
    at::_ops::copy_::call(dst_alias, kernels::host_alias(self), false);
    return dst;
  }
  // The work holds views, not references: like a kernel on real hardware, it does not keep the
  // tensors alive (record_stream / the pinned allocator's events do that).
  at::Tensor to = dst_on_device ? kernels::host_alias(dst) : kernels::borrowed(dst);
  at::Tensor from = src_on_device ? kernels::host_alias(self) : kernels::borrowed(self);
  kernels::launch(device, name, [to = std::move(to), from = std::move(from)]() mutable {
    at::_ops::copy_::call(to, from, false);
  });
  if (pinned) {
    const c10::DataPtr& block = host_side.storage().data_ptr();
    runtime::record_host_use(block, c10::Stream(c10::Stream::UNSAFE, device, stream));
  }
  return dst;
}

at::Tensor copy_from_and_resize(const at::Tensor& self, const at::Tensor& dst) {
  if (dst.device().type() == c10::DeviceType::PrivateUse1) {
    resize_(dst, self.sizes(), std::nullopt);
  } else {
    at::_ops::resize_::call(dst, self.sym_sizes(), std::nullopt);
  }
  return copy_from(self, dst, false);
}

c10::Scalar local_scalar_dense(const at::Tensor& self) {  // the host waits for the value
  kernels::StreamScope on_stream(self.device(), "_local_scalar_dense");
  if (!kernels::host_mapped() && self.numel() == 1) {  // stage the one element, not the storage
    at::Tensor host = at::detail::empty_cpu({}, self.scalar_type(), std::nullopt, std::nullopt, std::nullopt,
                                           std::nullopt);
    {{ cookiecutter.DEVICE }}_CHECK(driver::memcpy(host.data_ptr(), self.data_ptr(), self.dtype().itemsize(),
                                                   driver::CopyKind::device_to_host, self.device().index(),
                                                   runtime::current_stream_id(self.device().index())));
    if (self.is_conj()) host._set_conj(true);
    if (self.is_neg()) host._set_neg(true);
    return at::_ops::_local_scalar_dense::call(host);
  }
  return at::_ops::_local_scalar_dense::call(kernels::host_alias(self));
}

// tensor.record_stream(s): the caching allocator keeps the memory from reuse until s has passed
// the work queued on it when the tensor is freed.
void record_stream(at::Tensor& self, c10::Stream s) {
  TORCH_CHECK(s.device_type() == c10::DeviceType::PrivateUse1, "record_stream: expected a {{ cookiecutter.device }} stream, got ",
              s.device());
  static_cast<c10::DeviceAllocator*>(runtime::device_allocator())->recordStream(self.storage().data_ptr(), s);
}

at::Tensor& set_storage_offset(at::Tensor& self, c10::Storage source, int64_t storage_offset, c10::IntArrayRef size,
                               c10::IntArrayRef stride) {
  c10::TensorImpl* impl = self.unsafeGetTensorImpl();
  impl->set_storage_keep_dtype(std::move(source));
  impl->set_storage_offset(storage_offset);
  if (stride.empty()) {
    impl->set_sizes_contiguous(size);
  } else {
    impl->set_sizes_and_strides(size, stride);
  }
  return self;
}

at::Tensor& set_storage(at::Tensor& self, c10::Storage source) {
  const int64_t numel = static_cast<int64_t>(source.nbytes() / self.dtype().itemsize());
  return set_storage_offset(self, std::move(source), 0, {numel}, {});
}

at::Tensor& set_tensor(at::Tensor& self, const at::Tensor& source) {
  if (self.is_same(source)) return self;
  return set_storage_offset(self, source.storage(), source.storage_offset(), source.sizes(), source.strides());
}

// A quantized tensor's integer bytes as a plain tensor of its underlying integer type (int8 for
// qint8, ...), aliasing the same storage with the same geometry.
at::Tensor integer_bytes(const at::Tensor& q) {
  const c10::DispatchKey key = q.is_cpu() ? c10::DispatchKey::CPU : c10::DispatchKey::PrivateUse1;
  auto t = at::detail::make_tensor<c10::TensorImpl>(c10::Storage(q.storage()), c10::DispatchKeySet(key),
                                                    c10::scalarTypeToTypeMeta(c10::toUnderlying(q.scalar_type())));
  t.unsafeGetTensorImpl()->set_sizes_and_strides(q.sizes(), q.strides(), q.storage_offset());
  return t;
}

// Copies between quantized tensors of the device and the host (`q.cpu()`, `.to(device)`): copy_ has
// already given `dst` the source's quantizer; what moves is the integer bytes.
at::Tensor quantized_copy_from(const at::Tensor& self, const at::Tensor& dst, bool non_blocking) {
  TORCH_CHECK(self.is_quantized() && dst.is_quantized() && self.scalar_type() == dst.scalar_type(),
              "copying between quantized and non-quantized {{ cookiecutter.device }} tensors: dequantize or quantize first");
  copy_from(integer_bytes(self), integer_bytes(dst), non_blocking);
  return dst;
}

// Whether `self` may take `from`'s data in place (`param.data = moved`): nn.Module.to() keeps the
// same Parameter object, and so tied weights stay tied, only when this is true. PyTorch's own
// answer (TensorImpl::has_compatible_shallow_copy_type) lists CPU, CUDA and the other in-tree dense
// devices but not PrivateUse1, so without this kernel `.to(device)` replaces every parameter and
// two modules sharing one weight silently get two. Dense strided tensors of the device and the CPU
// are compatible, as CPU and CUDA tensors are.
bool plain_dense(const at::Tensor& t) {
  return t.layout() == c10::kStrided && !t.is_nested() && !t.is_quantized() && !t.is_mkldnn() &&
         (t.is_cpu() || t.is_privateuseone());
}

bool has_compatible_shallow_copy_type(const at::Tensor& self, const at::Tensor& from) {
  if (self.unsafeGetTensorImpl()->has_compatible_shallow_copy_type(from.key_set())) return true;
  return plain_dense(self) && plain_dense(from);
}

}  // namespace {{ cookiecutter.device }}::minimal_ops

TORCH_LIBRARY_IMPL(aten, PrivateUse1, m) {
  namespace ops = {{ cookiecutter.device }}::minimal_ops;
  m.impl("empty.memory_format", TORCH_FN(ops::empty_memory_format));
  m.impl("empty_strided", TORCH_FN(ops::empty_strided));
  m.impl("as_strided", TORCH_FN(ops::as_strided));
  m.impl("view", TORCH_FN(ops::view));
  m.impl("_reshape_alias", TORCH_FN(ops::reshape_alias));
  m.impl("resize_", TORCH_FN(ops::resize_));
  m.impl("_copy_from", TORCH_FN(ops::copy_from));
  m.impl("_copy_from_and_resize", TORCH_FN(ops::copy_from_and_resize));
  m.impl("_local_scalar_dense", TORCH_FN(ops::local_scalar_dense));
  m.impl("record_stream", TORCH_FN(ops::record_stream));
  m.impl("set_.source_Storage", TORCH_FN(ops::set_storage));
  m.impl("set_.source_Storage_storage_offset", TORCH_FN(ops::set_storage_offset));
  m.impl("set_.source_Tensor", TORCH_FN(ops::set_tensor));
  m.impl("_has_compatible_shallow_copy_type", TORCH_FN(ops::has_compatible_shallow_copy_type));
}

TORCH_LIBRARY_IMPL(aten, QuantizedPrivateUse1, m) {
  m.impl("_copy_from", TORCH_FN({{ cookiecutter.device }}::minimal_ops::quantized_copy_from));
}

// A conjugated or negated source reaches _copy_from as it is: copy_ is conj/neg-aware, and so is
// copy_from (the CPU copy on the host aliases resolves the bits). Without these fallthroughs the
// Conjugate/Negative fallback would first materialise the source with clone, whose copy_ calls
// _copy_from again with the same source: endless recursion (`x.conj() + x` crashed the process).
TORCH_LIBRARY_IMPL(aten, Conjugate, m) {
  m.impl("_copy_from", torch::CppFunction::makeFallthrough());
  m.impl("_copy_from_and_resize", torch::CppFunction::makeFallthrough());
}

TORCH_LIBRARY_IMPL(aten, Negative, m) {
  m.impl("_copy_from", torch::CppFunction::makeFallthrough());
  m.impl("_copy_from_and_resize", torch::CppFunction::makeFallthrough());
}
