// Pinned (page-locked) host memory: what tensor.pin_memory() returns and is_pinned() recognises.
//
// Built on PyTorch's own caching host allocator (at::CachingHostAllocatorImpl, the one CUDA and
// XPU use): blocks are rounded to powers of two and cached, and a block that a non_blocking copy
// used is not handed out again until the copy's stream has passed it. The copy kernel
// (aten/minimal_ops.cpp) reports each use with record_event; when the tensor is freed, the
// allocator records one driver event per stream that used the block and reuses the block only
// once every event is complete. Without this, refilling a new pinned tensor could overwrite the
// bytes a queued copy has not read yet. Statistics (torch's host-memory stats) and empty_cache
// (torch.accelerator.empty_host_cache) come from the same building block.
//
// What a hardware team replaces: nothing here — the driver's host_malloc/host_free become the SDK's
// pinned allocation calls, and its events the SDK's events.
#if defined(__GNUC__) && !defined(__clang__) && __GNUC__ >= 12
// The header aligns its pools to std::hardware_destructive_interference_size; GCC warns that the
// value may differ between compilers. Only this library uses these pools: the warning is noise.
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Winterference-size"
#define {{ cookiecutter.DEVICE }}_POP_INTERFERENCE_WARNING
#endif
#include <ATen/core/CachingHostAllocator.h>

#include <utility>

#include "runtime/runtime.h"

namespace {{ cookiecutter.device }}::runtime {
namespace {

// A driver event owned by the allocator's list of pending frees (move-only; destroyed with it).
class PinnedEvent {
 public:
  PinnedEvent() = default;
  explicit PinnedEvent(void* event) : event_(event) {}
  PinnedEvent(PinnedEvent&& other) noexcept : event_(std::exchange(other.event_, nullptr)) {}
  PinnedEvent& operator=(PinnedEvent&& other) noexcept {
    if (this != &other) {
      reset();
      event_ = std::exchange(other.event_, nullptr);
    }
    return *this;
  }
  PinnedEvent(const PinnedEvent&) = delete;
  PinnedEvent& operator=(const PinnedEvent&) = delete;
  ~PinnedEvent() { reset(); }

  bool complete() const { return event_ == nullptr || driver::event_query(event_) == driver::Status::ok; }

 private:
  void reset() {
    if (event_ != nullptr) driver::event_destroy(event_);
    event_ = nullptr;
  }
  void* event_ = nullptr;
};

using PinnedBlock = at::HostBlock<c10::Stream>;

// The runtime half of PyTorch's caching host allocator: how to get and free pinned memory, and
// how to record and query the events that gate reuse.
struct PinnedMemoryImpl final : public at::CachingHostAllocatorImpl<c10::Stream, PinnedEvent, PinnedBlock> {
  void copy_data(void* dest, const void* src, std::size_t count) const override {
    // Both sides are host memory: the driver copies at once, ordered against no stream.
    const c10::DeviceIndex device = current_device();
    {{ cookiecutter.DEVICE }}_CHECK(driver::memcpy(dest, src, count, driver::CopyKind::host_to_host, device,
                                                   current_stream_id(device)));
  }

 private:
  void allocate_host_memory(size_t size, void** ptr) override {
    {{ cookiecutter.DEVICE }}_CHECK(driver::host_malloc(ptr, size));
  }

  void free_block(PinnedBlock* block) override { driver::host_free(block->ptr_); }

  // The block was used on `stream`: an event recorded there now completes once the stream has
  // passed every use queued before the free.
  void record_stream(std::optional<std::vector<PinnedEvent>>& events, c10::Stream stream) override {
    void* event = nullptr;
    {{ cookiecutter.DEVICE }}_CHECK(driver::event_create(&event, /*timing=*/false));
    PinnedEvent owned(event);
    {{ cookiecutter.DEVICE }}_CHECK(driver::event_record(event, stream.device_index(), stream.id()));
    events->push_back(std::move(owned));
  }

  bool query_event(PinnedEvent& event) override { return event.complete(); }

  c10::Stream get_current_stream() const override {
    return c10::impl::getDeviceGuardImpl(c10::DeviceType::PrivateUse1)
        ->getStream(c10::Device(c10::DeviceType::PrivateUse1, current_device()));
  }

  bool stream_is_capturing(c10::Stream) const override { return false; }  // no graph capture
};

void free_pinned(void* ctx);

struct HostAllocator final : public at::CachingHostAllocatorInterface<PinnedMemoryImpl, &free_pinned> {};

HostAllocator& pinned_allocator() {
  static HostAllocator* a = new HostAllocator();  // never destroyed: pinned tensors may outlive statics
  return *a;
}

void free_pinned(void* ctx) { pinned_allocator().free(ctx); }

}  // namespace

c10::Allocator* host_allocator() { return &pinned_allocator(); }

void record_host_use(const c10::DataPtr& block, c10::Stream stream) {
  pinned_allocator().record_event(block.get(), block.get_context(), stream);
}

REGISTER_HOST_ALLOCATOR(at::kPrivateUse1, &pinned_allocator())

}  // namespace {{ cookiecutter.device }}::runtime

#ifdef {{ cookiecutter.DEVICE }}_POP_INTERFERENCE_WARNING
#pragma GCC diagnostic pop
#undef {{ cookiecutter.DEVICE }}_POP_INTERFERENCE_WARNING
#endif
