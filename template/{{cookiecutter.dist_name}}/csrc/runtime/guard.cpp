// Device guard, streams and events: how PyTorch switches the current {{ cookiecutter.device }} device
// and stream, and what torch.Stream, torch.Event and torch.accelerator.* run on.
//
// Implements c10::impl::DeviceGuardImplInterface on top of the driver and registers it for
// PrivateUse1. The current stream is kept per thread and per device. Streams handed out
// (torch.Stream(), getStreamFromGlobalPool for collectives and copies) come from a pool per device
// and priority, as on CUDA: the first request creates kStreamsPerPool driver streams of that
// priority, later requests cycle through them round-robin. A process never creates more than
// that many streams per device and priority, however often it asks (hardware queues are few).
// What a hardware team replaces: nothing here — the driver's stream and event calls become the SDK's.
#include <c10/core/DeviceCapability.h>
#include <c10/core/impl/DeviceGuardImplInterface.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <cstdint>
#include <memory>
#include <mutex>
#include <unordered_map>
#include <vector>

#include "runtime/runtime.h"

namespace {{ cookiecutter.device }}::runtime {

c10::DeviceIndex device_count() { return static_cast<c10::DeviceIndex>(driver::device_count()); }

void check_device(c10::DeviceIndex index) {
  // a RuntimeError in Python, as CUDA, XPU and PyTorch's reference backend raise for a bad index
  TORCH_CHECK(index >= 0 && index < device_count(), "The device index is out of range: invalid {{ cookiecutter.device }} device index ",
              int(index), " (this machine has ", int(device_count()), " {{ cookiecutter.device }} devices)");
}

c10::DeviceIndex current_device() {
  int device = 0;
  {{ cookiecutter.DEVICE }}_CHECK(driver::get_device(&device));
  return static_cast<c10::DeviceIndex>(device);
}

void set_device(c10::DeviceIndex index) {
  check_device(index);
  {{ cookiecutter.DEVICE }}_CHECK(driver::set_device(index));
}

namespace {

constexpr auto kType = c10::DeviceType::PrivateUse1;

// The calling thread's current stream on `index`, a valid device (0, the default stream, until set).
// Read at every launch and allocation: no call into the driver.
c10::StreamId& current_stream_of(c10::DeviceIndex index) {
  thread_local std::vector<c10::StreamId> streams;
  if (static_cast<size_t>(index) >= streams.size()) streams.resize(static_cast<size_t>(index) + 1, 0);
  return streams[index];
}

// ---- the stream pool --------------------------------------------------------------------------

constexpr int kStreamsPerPool = 32;

struct PriorityPool {
  std::once_flag created;
  std::array<int64_t, kStreamsPerPool> ids{};
  std::atomic<uint32_t> next{0};
};

struct StreamPools {
  int least = 0, greatest = 0;  // the driver's priority range (least is the default, 0)
  std::vector<std::vector<PriorityPool>> pools;  // [device][least - priority]
  std::mutex mu;
  std::vector<std::unordered_map<int64_t, int>> priority_of;  // [device]: pool stream id -> priority

  StreamPools() {
    {{ cookiecutter.DEVICE }}_CHECK(driver::stream_priority_range(&least, &greatest));
    const int n = driver::device_count();
    pools = std::vector<std::vector<PriorityPool>>(n);
    for (auto& per_device : pools) per_device = std::vector<PriorityPool>(least - greatest + 1);
    priority_of.resize(n);
  }
};

StreamPools& stream_pools() {
  static StreamPools* p = new StreamPools();  // never destroyed: streams live as long as the process
  return *p;
}

// A priority request mapped onto the driver's range (CUDA clamps the same way).
int clamp_priority(int priority) {
  const StreamPools& p = stream_pools();
  return std::min(std::max(priority, p.greatest), p.least);
}

// The next stream of `device`'s pool of `priority` (created on first use).
int64_t pool_stream(c10::DeviceIndex device, int priority) {
  StreamPools& p = stream_pools();
  priority = clamp_priority(priority);
  PriorityPool& pool = p.pools[device][p.least - priority];
  std::call_once(pool.created, [&] {
    for (int64_t& id : pool.ids) {{ cookiecutter.DEVICE }}_CHECK(driver::stream_create(device, priority, &id));
    std::lock_guard<std::mutex> lock(p.mu);
    for (int64_t id : pool.ids) p.priority_of[device][id] = priority;
  });
  return pool.ids[pool.next.fetch_add(1, std::memory_order_relaxed) % kStreamsPerPool];
}

// torch.Stream(device="{{ cookiecutter.device }}") arrives without an index: that means the current device.
c10::Device resolve(c10::Device d) {
  if (!d.has_index()) return c10::Device(kType, current_device());
  check_device(d.index());
  return d;
}

struct GuardImpl final : public c10::impl::DeviceGuardImplInterface {
  c10::DeviceType type() const override { return kType; }

  c10::Device exchangeDevice(c10::Device d) const override {
    c10::Device old = getDevice();
    if (old.index() != d.index()) setDevice(d);
    return old;
  }
  c10::Device getDevice() const override { return c10::Device(kType, current_device()); }
  void setDevice(c10::Device d) const override {
    TORCH_CHECK(d.type() == kType, "expected a {{ cookiecutter.device }} device, got ", d);
    set_device(d.index());
  }
  void uncheckedSetDevice(c10::Device d) const noexcept override { driver::set_device(d.index()); }

  c10::Stream getStream(c10::Device d) const override {
    d = resolve(d);
    return c10::Stream(c10::Stream::UNSAFE, d, current_stream_of(d.index()));
  }
  c10::Stream getDefaultStream(c10::Device d) const override {
    d = resolve(d);
    return c10::Stream(c10::Stream::DEFAULT, d);
  }
  c10::Stream getStreamFromGlobalPool(c10::Device d, bool high_priority) const override {
    return getNewStream(d, high_priority ? stream_pools().greatest : stream_pools().least);
  }
  // torch.Stream(device=..., priority=p): a pool stream of priority p (lower runs first; clamped
  // to the driver's range).
  c10::Stream getNewStream(c10::Device d, int priority) const override {
    d = resolve(d);
    return c10::Stream(c10::Stream::UNSAFE, d, pool_stream(d.index(), priority));
  }
  c10::Stream exchangeStream(c10::Stream s) const override {
    c10::Stream old = getStream(s.device());
    current_stream_of(s.device_index()) = s.id();
    return old;
  }
  c10::DeviceIndex deviceCount() const noexcept override { return device_count(); }

  // torch.accelerator.get_device_capability(): the dtypes the device computes in. The {{ "emulated" if cookiecutter.driver == "emulator" else "minimal driver's" }}
  // device runs every dtype (all bits set, c10::DeviceCapability's default); a chip without, say,
  // float64 clears capability_data.supported_scalar_types.has_Double here.
  c10::DeviceCapability getDeviceCapability(c10::Device d) const override {
    check_device(d.has_index() ? d.index() : current_device());
    return c10::DeviceCapability();
  }

  void record(void** event, const c10::Stream& stream, const c10::DeviceIndex device, const c10::EventFlag flag)
      const override {
    if (*event == nullptr) {
      {{ cookiecutter.DEVICE }}_CHECK(driver::event_create(event, flag == c10::EventFlag::BACKEND_DEFAULT));
    }
    {{ cookiecutter.DEVICE }}_CHECK(driver::event_record(*event, stream.device_index(), stream.id()));
    (void)device;
  }
  void block(void* event, const c10::Stream& stream) const override {
    if (event == nullptr) return;
    {{ cookiecutter.DEVICE }}_CHECK(driver::stream_wait_event(stream.device_index(), stream.id(), event));
  }
  bool queryEvent(void* event) const override {
    return event == nullptr || driver::event_query(event) == driver::Status::ok;
  }
  void destroyEvent(void* event, const c10::DeviceIndex) const noexcept override {
    if (event != nullptr) driver::event_destroy(event);
  }
  void synchronizeEvent(void* event) const override {
    if (event != nullptr) {{ cookiecutter.DEVICE }}_CHECK(driver::event_synchronize(event));
  }
  double elapsedTime(void* start, void* end, const c10::DeviceIndex) const override {
    TORCH_CHECK(start != nullptr && end != nullptr, "both events must be recorded before elapsed_time");
    float ms = 0;
    driver::Status s = driver::event_elapsed_ms(&ms, start, end);
    TORCH_CHECK(s == driver::Status::ok, "elapsed_time needs two recorded events created with enable_timing=True");
    return ms;
  }

  bool queryStream(const c10::Stream& stream) const override {
    return driver::stream_query(stream.device_index(), stream.id()) == driver::Status::ok;
  }
  void synchronizeStream(const c10::Stream& stream) const override {
    {{ cookiecutter.DEVICE }}_CHECK(driver::stream_synchronize(stream.device_index(), stream.id()));
  }
  // torch.Stream.native_handle: what generated code (Inductor's get_raw_stream) hands the SDK.
  // The {{ "emulated" if cookiecutter.driver == "emulator" else "minimal" }} driver's stream handle is the stream's id; an SDK returns its own stream object.
  void* getStreamNativeHandle(const c10::Stream stream) const override {
    return reinterpret_cast<void*>(static_cast<intptr_t>(stream.id()));
  }
  void synchronizeDevice(const c10::DeviceIndex device) const override {
    check_device(device);
    {{ cookiecutter.DEVICE }}_CHECK(driver::device_synchronize(device));
  }
  void recordDataPtrOnStream(const c10::DataPtr&, const c10::Stream&) const override {}
  // torch.Stream.is_capturing(): whether the stream records into a graph (runtime/graphs.cpp)
  bool isStreamCapturing(const c10::Stream& stream) const override {
    return driver::capture_id(stream.device_index(), stream.id()) != 0;
  }
};

}  // namespace

int64_t current_stream_id(c10::DeviceIndex device) {
  if (device < 0 || device >= device_count()) check_device(device);  // the error getStream raises
  return current_stream_of(device);
}

int stream_priority(c10::DeviceIndex device, int64_t stream) {
  check_device(device);
  StreamPools& p = stream_pools();
  std::lock_guard<std::mutex> lock(p.mu);
  auto it = p.priority_of[device].find(stream);
  return it == p.priority_of[device].end() ? p.least : it->second;  // the default stream: the default priority
}

std::pair<int, int> stream_priority_range() {
  return {stream_pools().least, stream_pools().greatest};
}

C10_REGISTER_GUARD_IMPL(PrivateUse1, GuardImpl)

}  // namespace {{ cookiecutter.device }}::runtime
