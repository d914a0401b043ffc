// PrivateUse1 hooks: how core PyTorch asks the {{ cookiecutter.device }} backend about itself —
// availability, device count and current device, default and new generators, pinned memory and
// which device owns a pointer.
//
// What a hardware team replaces: nothing here; each answer comes from the driver or the runtime.
#include <ATen/detail/PrivateUse1HooksInterface.h>

#include "runtime/generator.h"
#include "runtime/runtime.h"

namespace {{ cookiecutter.device }}::runtime {
namespace {

struct Hooks final : public at::PrivateUse1HooksInterface {
  bool isBuilt() const override { return true; }
  bool isAvailable() const override { return device_count() > 0; }
  bool hasPrimaryContext(c10::DeviceIndex index) const override { return index >= 0 && index < device_count(); }
  void init() const override {}
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

  void resizePrivateUse1Bytes(const c10::Storage& storage, size_t new_bytes) const override {
    c10::StorageImpl* impl = storage.unsafeGetStorageImpl();
    TORCH_CHECK(impl->resizable(), "trying to resize storage that is not resizable");
    c10::DataPtr fresh = impl->allocator()->allocate(new_bytes);
    size_t keep = std::min(new_bytes, impl->nbytes());
    if (keep > 0) {
      {{ cookiecutter.DEVICE }}_CHECK(driver::memcpy(fresh.get(), impl->data(), keep, driver::CopyKind::device_to_device));
    }
    impl->set_data_ptr_noswap(std::move(fresh));
    impl->set_nbytes(new_bytes);
  }
};

struct Registration {
  Registration() { at::RegisterPrivateUse1HooksInterface(new Hooks()); }  // leaked: lives until exit
} registration;

}  // namespace
}  // namespace {{ cookiecutter.device }}::runtime
