// Host views of device memory for the collective backend (process_group.cpp, through host_memory.h)
// and for the kernels torch.compile writes ({{ cookiecutter.package }}/compiler/inductor.py).
//
// Where the driver has the host_mapping capability (the default driver does: its device memory is
// host memory behind the driver), the collective transport hands gloo CPU tensors that alias the
// device tensors (no copy): gloo reads and writes device memory in place; Inductor's C++ kernels run
// on such views too. Without it (a discrete device, the minimal driver) there is no host view:
// process_group.cpp and compiler/inductor.py (call_staged) stage through host copies instead. A
// view waits for the current stream first, so it sees the work queued before it. This file gives
// Python that alias as a custom operator,
// torch.ops.{{ cookiecutter.package }}.host_view(t). Unlike the kernels' host_alias (kernel_support.h), the view
// owns a reference to the device storage: a collective in flight keeps its memory alive even if
// Python drops the device tensor (a temporary buffer, say) before the collective completes.
// What a hardware team replaces: nothing here. A collective library that takes device pointers
// gets device tensors in process_group.cpp and never calls this operator.
#include <ATen/core/Tensor.h>
#include <c10/core/Storage.h>
#include <torch/library.h>

#include "distributed/host_memory.h"
#include "driver/driver.h"
#include "runtime/runtime.h"

namespace {{ cookiecutter.device }}::distributed {
namespace {

void release_storage(void* ctx) { delete static_cast<c10::Storage*>(ctx); }

}  // namespace

bool has_host_views() { return driver::has(driver::Capability::host_mapping); }

// A CPU tensor over the bytes of the device tensor `t`: same sizes, strides, offset and dtype.
at::Tensor host_view(const at::Tensor& t) {
  TORCH_CHECK(t.device().type() == c10::DeviceType::PrivateUse1, "host_view: expected a {{ cookiecutter.device }} tensor, got ",
              t.device());
  TORCH_CHECK(!t.is_conj() && !t.is_neg(), "host_view: resolve the conjugate/negative bit first (resolve_conj())");
  TORCH_CHECK(has_host_views(), "host_view: the {{ cookiecutter.device }} driver has no host_mapping capability ",
              "(driver.h): device memory has no host address");
  const c10::Storage& st = t.storage();
  // The collective runs on the host: the device's queued work on t must be done first.
  const c10::DeviceIndex device = t.device().index();
  {{ cookiecutter.DEVICE }}_CHECK(driver::stream_synchronize(device, runtime::current_stream_id(device)));
  void* bytes = st.data() != nullptr ? driver::host_address(st.data()) : nullptr;
  TORCH_CHECK(st.data() == nullptr || bytes != nullptr, "host_view: the tensor's storage is not device memory");
  auto* keep = new c10::Storage(st);  // released with the view's memory
  c10::DataPtr ptr(bytes, keep, &release_storage, c10::Device(c10::DeviceType::CPU));
  c10::Storage host(c10::Storage::use_byte_size_t(), st.nbytes(), std::move(ptr), /*allocator=*/nullptr,
                    /*resizable=*/false);
  auto view = at::detail::make_tensor<c10::TensorImpl>(std::move(host), c10::DispatchKeySet(c10::DispatchKey::CPU),
                                                       t.dtype());
  view.unsafeGetTensorImpl()->set_sizes_and_strides(t.sizes(), t.strides(), t.storage_offset());
  return view;
}

}  // namespace {{ cookiecutter.device }}::distributed

TORCH_LIBRARY_FRAGMENT({{ cookiecutter.package }}, m) {
  m.def("host_view(Tensor(a) self) -> Tensor(a)", &{{ cookiecutter.device }}::distributed::host_view);
}
