// Pinned (page-locked) host memory: what tensor.pin_memory() returns and is_pinned() recognises.
//
// Subclasses at::HostAllocator, registered for PrivateUse1 and handed out by the hooks. Memory
// comes from driver::host_malloc; statistics are kept for torch's host-memory queries. What a
// hardware team replaces: nothing here — the driver's host_malloc becomes the SDK's pinned alloc.
#include <ATen/core/CachingHostAllocator.h>

#include <mutex>
#include <unordered_map>

#include "runtime/runtime.h"

namespace {{ cookiecutter.device }}::runtime {
namespace {

class HostAllocator final : public at::HostAllocator {
 public:
  at::DataPtr allocate(size_t nbytes) override {
    void* ptr = nullptr;
    {{ cookiecutter.DEVICE }}_CHECK(driver::host_malloc(&ptr, nbytes));
    {
      std::lock_guard<std::mutex> lock(mu_);
      allocated_ += static_cast<int64_t>(nbytes);
      peak_ = std::max(peak_, allocated_);
      sizes_[ptr] = nbytes;
    }
    return {ptr, ptr, &HostAllocator::deleter, c10::Device(c10::DeviceType::CPU)};
  }

  c10::DeleterFnPtr raw_deleter() const override { return &HostAllocator::deleter; }

  void copy_data(void* dest, const void* src, std::size_t count) const override {
    {{ cookiecutter.DEVICE }}_CHECK(driver::memcpy(dest, src, count, driver::CopyKind::host_to_host));
  }

  bool record_event(void*, void*, c10::Stream) override { return true; }  // streams are synchronous
  void empty_cache() override {}  // nothing is cached

  at::HostStats get_stats() override {
    std::lock_guard<std::mutex> lock(mu_);
    at::HostStats stats;
    stats.allocated_bytes.current = allocated_;
    stats.allocated_bytes.peak = peak_;
    return stats;
  }
  void reset_accumulated_stats() override {}
  void reset_peak_stats() override {
    std::lock_guard<std::mutex> lock(mu_);
    peak_ = allocated_;
  }

  static HostAllocator& instance() {
    static HostAllocator* a = new HostAllocator();  // never destroyed: pinned tensors may outlive statics
    return *a;
  }

 private:
  static void deleter(void* ptr) {
    if (ptr == nullptr) return;
    auto& self = instance();
    {
      std::lock_guard<std::mutex> lock(self.mu_);
      auto it = self.sizes_.find(ptr);
      if (it != self.sizes_.end()) {
        self.allocated_ -= static_cast<int64_t>(it->second);
        self.sizes_.erase(it);
      }
    }
    driver::host_free(ptr);
  }

  std::mutex mu_;
  int64_t allocated_ = 0;
  int64_t peak_ = 0;
  std::unordered_map<void*, size_t> sizes_;
};

}  // namespace

c10::Allocator* host_allocator() { return &HostAllocator::instance(); }

REGISTER_HOST_ALLOCATOR(at::kPrivateUse1, &HostAllocator::instance())

}  // namespace {{ cookiecutter.device }}::runtime
