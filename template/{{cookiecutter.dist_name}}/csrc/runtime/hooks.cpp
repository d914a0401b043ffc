// PrivateUse1 hooks: how core PyTorch asks the {{ cookiecutter.device }} backend about itself —
// availability, device count and current device, default and new generators, pinned memory and
// which device owns a pointer — and the backend's one-time initialisation.
//
// init() runs once per process, the first time PyTorch needs the device (torch's lazy device
// initialisation: at::globalContext().lazyInitDevice, which torch.{{ cookiecutter.device }}._lazy_init calls
// before the first tensor is created from Python). It starts the driver, creates the default
// generators and registers PyTorch's device-init fork handler: a process forked after this point
// is "in a bad fork" for PyTorch (torch.{{ cookiecutter.device }}._is_in_bad_fork()), and its first use of the
// device raises "Cannot re-initialize {{ cookiecutter.device }} in forked subprocess", as CUDA does.
//
// What a hardware team replaces: nothing here; each answer comes from the driver or the runtime.
#include <ATen/detail/PrivateUse1HooksInterface.h>
#include <c10/core/DeviceGuard.h>
#include <torch/csrc/utils/device_lazy_init.h>

#include <atomic>

#include "runtime/generator.h"
#include "runtime/runtime.h"

namespace {{ cookiecutter.device }}::runtime {
namespace {

std::atomic<bool> hooks_initialized{false};

struct Hooks final : public at::PrivateUse1HooksInterface {
  bool isBuilt() const override { return true; }
  bool isAvailable() const override { return device_count() > 0; }
  bool hasPrimaryContext(c10::DeviceIndex index) const override { return index >= 0 && index < device_count(); }
  void init() const override {
    const driver::Status status = driver::init();
    TORCH_CHECK(status != driver::Status::forked, "Cannot re-initialize {{ cookiecutter.device }} in forked subprocess. To use ",
                "{{ cookiecutter.device }} with multiprocessing, you must use the 'spawn' start method");
    {{ cookiecutter.DEVICE }}_CHECK(status);
    // From here on a fork() child must not use the device: PyTorch's handler marks it.
    torch::utils::register_fork_handler_for_device_init(c10::DeviceType::PrivateUse1);
    for (c10::DeviceIndex i = 0; i < device_count(); ++i) default_generator(i);  // created once, here
    hooks_initialized = true;
  }
  c10::DeviceIndex deviceCount() const override { return device_count(); }
  void setCurrentDevice(c10::DeviceIndex index) const override { set_device(index); }
  c10::DeviceIndex getCurrentDevice() const override { return current_device(); }
  c10::DeviceIndex exchangeDevice(c10::DeviceIndex index) const override {
    c10::DeviceIndex old = current_device();
    if (index >= 0 && index != old) set_device(index);
    return old;
  }
  c10::DeviceIndex maybeExchangeDevice(c10::DeviceIndex index) const override { return exchangeDevice(index); }

  const at::Generator& getDefaultGenerator(c10::DeviceIndex index) const override { return default_generator(index); }
  at::Generator getNewGenerator(c10::DeviceIndex index) const override { return new_generator(index); }

  bool isPinnedPtr(const void* data) const override { return driver::is_host_pinned(data); }
  at::Allocator* getPinnedMemoryAllocator() const override { return host_allocator(); }

  at::Device getDeviceFromPtr(void* data) const override {
    int device = driver::pointer_device(data);
    TORCH_CHECK(device >= 0, "pointer ", data, " is not {{ cookiecutter.device }} device memory");
    return at::Device(c10::DeviceType::PrivateUse1, static_cast<c10::DeviceIndex>(device));
  }

  // storage.resize_(n): new memory on the storage's own device (not the current one), the kept
  // bytes copied in order on that device's current stream.
  void resizePrivateUse1Bytes(const c10::Storage& storage, size_t new_bytes) const override {
    c10::StorageImpl* impl = storage.unsafeGetStorageImpl();
    TORCH_CHECK(impl->resizable(), "trying to resize storage that is not resizable");
    c10::Device device = impl->device();
    if (!device.has_index()) device = c10::Device(c10::DeviceType::PrivateUse1, current_device());
    c10::DeviceGuard guard(device);  // the allocator allocates on the current device
    c10::DataPtr fresh = impl->allocator()->allocate(new_bytes);
    size_t keep = std::min(new_bytes, impl->nbytes());
    if (keep > 0) {
      {{ cookiecutter.DEVICE }}_CHECK(driver::memcpy(fresh.get(), impl->data(), keep, driver::CopyKind::device_to_device,
                                                     device.index(), current_stream_id(device.index())));
    }
    impl->set_data_ptr_noswap(std::move(fresh));
    impl->set_nbytes(new_bytes);
  }
};

struct Registration {
  Registration() { at::RegisterPrivateUse1HooksInterface(new Hooks()); }  // leaked: lives until exit
} registration;

}  // namespace

bool is_initialized() { return hooks_initialized; }

}  // namespace {{ cookiecutter.device }}::runtime
