// Device memory shared between processes: the C++ half of {{ cookiecutter.package }}/ipc.py, which makes
// torch.multiprocessing send {{ cookiecutter.device }} tensors as CUDA's are sent (a handle of the memory, not a copy).
//
// Three custom operators, torch.ops.{{ cookiecutter.package }}.ipc_*, over the driver's optional capability ipc:
//   - ipc_export(t): waits for the device's queued work (what the receiver reads is what the sender
//     wrote before it sent), then the handle of the driver allocation holding t's storage and the
//     storage's offset and size in it. The sender keeps the storage alive (ipc.py) until every
//     receiver let go of it, so its allocator does not hand the block to another tensor meanwhile.
//   - ipc_open(handle, ...): in the receiver, maps the allocation and returns a byte tensor over the
//     storage's bytes, on a storage that cannot be resized (it is a window into someone else's
//     block). When that storage dies, its deleter waits for the queued work on it, unmaps it and
//     takes one off the sender's count of receivers: a slot of an int64 CPU tensor in shared memory
//     (the sender's; the receiver holds a reference to it until then).
//   - ipc_counter(counters, slot, delta): that count, changed atomically (delta 0 reads it).
// What a hardware team replaces: nothing here; the driver's ipc_export/ipc_open/ipc_close are the
// SDK's (docs/porting.md, "ipc").
#include <ATen/core/Tensor.h>
#include <c10/core/Storage.h>
#include <torch/library.h>

#include <unistd.h>

#include <atomic>
#include <tuple>
#include <vector>

#include "driver/driver.h"
#include "runtime/runtime.h"

namespace {{ cookiecutter.device }}::ipc {
namespace {

void check_capability() {
  TORCH_CHECK_NOT_IMPLEMENTED(driver::has(driver::Capability::ipc),
                              "sharing {{ cookiecutter.device }} memory with another process needs driver.h's optional ",
                              "capability 'ipc', which this driver lacks");
}

int64_t add_to_counter(const at::Tensor& counters, int64_t slot, int64_t delta) {
  TORCH_CHECK(counters.device().is_cpu() && counters.scalar_type() == at::kLong && counters.is_contiguous(),
              "ipc_counter: expected a contiguous int64 CPU tensor");
  TORCH_CHECK(slot >= 0 && slot < counters.numel(), "ipc_counter: slot ", slot, " out of range");
  std::atomic_ref<int64_t> count(counters.data_ptr<int64_t>()[slot]);
  return count.fetch_add(delta) + delta;
}

// What a received storage owns: the mapping, and the sender's count it takes one off when it dies.
struct Received {
  void* base;
  at::Tensor counters;
  int64_t slot;
};

void release_received(void* ctx) {
  auto* r = static_cast<Received*>(ctx);
  driver::ipc_close(r->base);  // waits for the queued work on it; nothing to report from a deleter
  add_to_counter(r->counters, r->slot, -1);
  delete r;
}

}  // namespace

std::tuple<std::vector<int64_t>, int64_t, int64_t, int64_t> ipc_export(const at::Tensor& t) {
  TORCH_CHECK(t.device().type() == c10::DeviceType::PrivateUse1, "ipc_export: expected a {{ cookiecutter.device }} tensor, got ",
              t.device());
  check_capability();
  const c10::Storage& st = t.storage();
  TORCH_CHECK(st.data() != nullptr, "ipc_export: the tensor has no memory (an empty storage)");
  {{ cookiecutter.DEVICE }}_CHECK(driver::device_synchronize(t.device().index()));
  driver::IpcHandle handle;
  size_t offset = 0, bytes = 0;
  {{ cookiecutter.DEVICE }}_CHECK(driver::ipc_export(st.data(), &handle, &offset, &bytes));
  TORCH_CHECK(offset + st.nbytes() <= bytes, "ipc_export: the storage extends past its allocation");
  std::vector<int64_t> raw(std::begin(handle.bytes), std::end(handle.bytes));
  return {raw, handle.fd, static_cast<int64_t>(offset), static_cast<int64_t>(st.nbytes())};
}

at::Tensor ipc_open(c10::IntArrayRef raw, int64_t fd, int64_t device, int64_t offset, int64_t nbytes,
                    const at::Tensor& counters, int64_t slot) {
  driver::IpcHandle handle;
  try {
    check_capability();
    runtime::check_device(static_cast<c10::DeviceIndex>(device));
    TORCH_CHECK(raw.size() == sizeof(handle.bytes), "ipc_open: a handle has ", sizeof(handle.bytes), " bytes");
    TORCH_CHECK(offset >= 0 && nbytes >= 0, "ipc_open: a negative offset or size");
  } catch (...) {
    if (fd >= 0) ::close(static_cast<int>(fd));  // the descriptor is this call's until the driver takes it
    throw;
  }
  for (size_t i = 0; i < raw.size(); ++i) handle.bytes[i] = static_cast<unsigned char>(raw[i]);
  handle.fd = static_cast<int>(fd);
  void* base = nullptr;
  {{ cookiecutter.DEVICE }}_CHECK(driver::ipc_open(static_cast<int>(device), handle, &base));
  const c10::Device where(c10::DeviceType::PrivateUse1, static_cast<c10::DeviceIndex>(device));
  auto* owner = new Received{base, counters, slot};
  c10::DataPtr ptr(static_cast<char*>(base) + offset, owner, &release_received, where);
  c10::Storage storage(c10::Storage::use_byte_size_t(), nbytes, std::move(ptr), /*allocator=*/nullptr,
                       /*resizable=*/false);
  auto bytes = at::detail::make_tensor<c10::TensorImpl>(
      std::move(storage), c10::DispatchKeySet(c10::DispatchKey::PrivateUse1), caffe2::TypeMeta::Make<uint8_t>());
  bytes.unsafeGetTensorImpl()->set_sizes_contiguous({nbytes});
  return bytes;
}

int64_t ipc_counter(const at::Tensor& counters, int64_t slot, int64_t delta) {
  return add_to_counter(counters, slot, delta);
}

}  // namespace {{ cookiecutter.device }}::ipc

TORCH_LIBRARY_FRAGMENT({{ cookiecutter.package }}, m) {
  m.def("ipc_export(Tensor self) -> (int[], int, int, int)", &{{ cookiecutter.device }}::ipc::ipc_export);
  m.def("ipc_open(int[] handle, int fd, int device, int offset, int nbytes, Tensor counters, int slot) -> Tensor",
        &{{ cookiecutter.device }}::ipc::ipc_open);
  m.def("ipc_counter(Tensor counters, int slot, int delta) -> int", &{{ cookiecutter.device }}::ipc::ipc_counter);
}
