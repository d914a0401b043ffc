// Device memory allocator: every tensor on {{ cookiecutter.device }} gets its memory here.
//
// Subclasses c10::DeviceAllocator, so torch.accelerator.memory_allocated(), max_memory_allocated(),
// memory_stats(), reset_peak_memory_stats() and empty_cache() work. It allocates straight from the
// driver (no caching) and keeps per-device statistics. Running out of device memory raises
// torch.OutOfMemoryError with the requested and free bytes. What a hardware team replaces: usually
// nothing at first (the driver does the work); later, a caching allocator on top of driver::malloc.
#include <c10/core/CachingDeviceAllocator.h>

#include <mutex>
#include <vector>

#include "runtime/runtime.h"

namespace {{ cookiecutter.device }}::runtime {
namespace {

using c10::CachingAllocator::Stat;
using c10::CachingAllocator::StatType;
using c10::CachingDeviceAllocator::DeviceStats;

void update(Stat& stat, int64_t delta) {
  stat.current += delta;
  stat.peak = std::max(stat.peak, stat.current);
  if (delta > 0) stat.allocated += delta; else stat.freed -= delta;
}

void reset_peak(Stat& stat) { stat.peak = stat.current; }
void reset_accumulated(Stat& stat) { stat.allocated = 0; stat.freed = 0; }

// Applies fn to every statistic this allocator keeps.
template <typename Fn>
void for_each_stat(DeviceStats& s, Fn fn) {
  for (auto* arr : {&s.allocation, &s.segment, &s.active, &s.allocated_bytes, &s.reserved_bytes, &s.active_bytes,
                    &s.requested_bytes})
    for (auto& stat : *arr) fn(stat);
}

class DeviceAllocator final : public c10::DeviceAllocator {
 public:
  c10::DataPtr allocate(size_t nbytes) override {
    c10::DeviceIndex device = current_device();
    void* ptr = nullptr;
    if (nbytes > 0) {
      driver::Status s = driver::malloc(device, &ptr, nbytes);
      if (s == driver::Status::out_of_memory) {
        size_t free_bytes = 0, total = 0;
        driver::mem_info(device, &free_bytes, &total);
        {
          std::lock_guard<std::mutex> lock(mu_);
          stats(device).num_ooms += 1;
        }
        TORCH_CHECK_WITH(OutOfMemoryError, false, "{{ cookiecutter.device }} out of memory: tried to allocate ",
                         nbytes, " bytes on device ", int(device), " with ", free_bytes, " bytes free of ", total);
      }
      TORCH_CHECK(s == driver::Status::ok, "{{ cookiecutter.device }} driver: malloc of ", nbytes, " bytes on device ", int(device),
                  " failed: ", driver::status_string(s));
      record(device, static_cast<int64_t>(nbytes));
    }
    return {ptr, ptr, &DeviceAllocator::deleter, c10::Device(c10::DeviceType::PrivateUse1, device)};
  }

  c10::DeleterFnPtr raw_deleter() const override { return &DeviceAllocator::deleter; }

  void copy_data(void* dest, const void* src, std::size_t count) const override {
    {{ cookiecutter.DEVICE }}_CHECK(driver::memcpy(dest, src, count, driver::CopyKind::device_to_device));
  }

  bool initialized() override { return true; }
  void emptyCache(c10::MempoolId_t) override {}  // nothing is cached
  void recordStream(const c10::DataPtr&, c10::Stream) override {}  // streams are synchronous

  DeviceStats getDeviceStats(c10::DeviceIndex device) override {
    check_device(device);
    std::lock_guard<std::mutex> lock(mu_);
    return stats(device);
  }

  void resetAccumulatedStats(c10::DeviceIndex device) override {
    check_device(device);
    std::lock_guard<std::mutex> lock(mu_);
    for_each_stat(stats(device), reset_accumulated);
    stats(device).num_ooms = 0;
  }

  void resetPeakStats(c10::DeviceIndex device) override {
    check_device(device);
    std::lock_guard<std::mutex> lock(mu_);
    for_each_stat(stats(device), reset_peak);
  }

  std::pair<size_t, size_t> getMemoryInfo(c10::DeviceIndex device) override {
    size_t free_bytes = 0, total = 0;
    {{ cookiecutter.DEVICE }}_CHECK(driver::mem_info(device, &free_bytes, &total));
    return {free_bytes, total};
  }

  static DeviceAllocator& instance();

  void free_block(void* ptr) {
    int device = 0;
    size_t bytes = 0;
    if (driver::free(ptr, &device, &bytes) == driver::Status::ok) {
      record(static_cast<c10::DeviceIndex>(device), -static_cast<int64_t>(bytes));
    }
  }

 private:
  static void deleter(void* ptr);

  DeviceStats& stats(c10::DeviceIndex device) {
    if (stats_.size() < static_cast<size_t>(device_count())) stats_.resize(device_count());
    return stats_[device];
  }

  void record(c10::DeviceIndex device, int64_t delta) {
    std::lock_guard<std::mutex> lock(mu_);
    auto& s = stats(device);
    const auto all = static_cast<size_t>(StatType::AGGREGATE);
    for (size_t i : {all, static_cast<size_t>(StatType::LARGE_POOL)}) {
      update(s.allocation[i], delta > 0 ? 1 : -1);
      update(s.segment[i], delta > 0 ? 1 : -1);
      update(s.active[i], delta > 0 ? 1 : -1);
      update(s.allocated_bytes[i], delta);
      update(s.reserved_bytes[i], delta);
      update(s.active_bytes[i], delta);
      update(s.requested_bytes[i], delta);
    }
    if (delta > 0) s.num_device_alloc += 1; else s.num_device_free += 1;
  }

  std::mutex mu_;
  std::vector<DeviceStats> stats_;
};

DeviceAllocator& DeviceAllocator::instance() {
  static DeviceAllocator* a = new DeviceAllocator();  // outlives every tensor, even at exit
  return *a;
}

void DeviceAllocator::deleter(void* ptr) {
  if (ptr != nullptr) instance().free_block(ptr);  // the driver knows each block's device and size
}

}  // namespace

c10::Allocator* device_allocator() { return &DeviceAllocator::instance(); }

REGISTER_ALLOCATOR(c10::DeviceType::PrivateUse1, device_allocator())

}  // namespace {{ cookiecutter.device }}::runtime
