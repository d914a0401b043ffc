// Device memory allocator: every tensor on {{ cookiecutter.device }} gets its memory here.
//
{% if cookiecutter.driver == "emulator" -%}
// A caching allocator, as a real accelerator needs one: driver allocations are slow (two memory
// mappings each in the emulator, a device call with an SDK), so freed blocks are kept for reuse.
{% else -%}
// A caching allocator, as a real accelerator needs one: driver allocations are slow (a host buffer
// and an address range each in the minimal driver, a device call with an SDK), so freed blocks
// are kept for reuse.
{% endif -%}
//   - Pools per stream: a block freed by its stream goes back to that stream's pool, and only
//     allocations on that stream reuse it. Queued work on the stream that still reads the block
//     runs before anything the new owner queues there, so no synchronisation is needed.
//   - recordStream (tensor.record_stream(s)): a block also used on stream s is not reused until s
//     has passed the work queued at the time of the free: the free records an event on s, and
//     the block returns to its pool when the event completes. Forgetting record_stream lets the
//     block be reused while s still reads it — a use-after-free the tests show on this device.
//   - Small requests (up to 1 MiB) are cut from 2 MiB segments; larger ones get a segment each.
//     Requests round up to 512 bytes.
//   - Graph pools (runtime/graphs.cpp): while a graph captures, allocations on its streams come from
//     its private pool (a pool key of its own in place of a stream), and blocks freed there return
//     to it, as the work the graph replays keeps using them. A live pool's memory is never
//     released; the last graph using it (pool=) gives it back (release_pool). Nothing is released
//     to the driver during a capture (its free would be an unsafe call).
//   - Out of memory: the cache is released and the allocation retried, then torch.OutOfMemoryError.
//   - Statistics (allocated, reserved, active, requested; current, peak, totals) per device and
//     pool back torch.accelerator.memory_* and torch.{{ cookiecutter.device }}.memory_*.
// What a hardware team replaces: nothing here at first — the driver's malloc/free and events
// become the SDK's. Tuning (segment sizes, rounding) is theirs to change.
#include <c10/core/CachingDeviceAllocator.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <functional>
#include <map>
#include <mutex>
#include <set>
#include <unordered_map>
#include <vector>

#include "runtime/runtime.h"

namespace {{ cookiecutter.device }}::runtime {
namespace {

using c10::CachingAllocator::Stat;
using c10::CachingAllocator::StatType;
using c10::CachingDeviceAllocator::DeviceStats;

constexpr size_t kRound = 512;                  // every block is a multiple of this
constexpr size_t kSmallLimit = size_t{1} << 20;  // requests up to this come from shared segments
constexpr size_t kSmallSegment = size_t{2} << 20;

void update(Stat& stat, int64_t delta) {
  stat.current += delta;
  stat.peak = std::max(stat.peak, stat.current);
  if (delta > 0) stat.allocated += delta; else stat.freed -= delta;
}

void reset_peak(Stat& stat) { stat.peak = stat.current; }
void reset_accumulated(Stat& stat) { stat.allocated = 0; stat.freed = 0; }

template <typename Fn>
void for_each_stat(DeviceStats& s, Fn fn) {
  for (auto* arr : {&s.allocation, &s.segment, &s.active, &s.allocated_bytes, &s.reserved_bytes, &s.active_bytes,
                    &s.requested_bytes})
    for (auto& stat : *arr) fn(stat);
}

struct Segment;

struct Block {
  char* ptr = nullptr;
  size_t size = 0;       // rounded
  size_t requested = 0;  // as asked
  int64_t stream = 0;    // the stream it was allocated on, or a graph's pool key (< 0): its pool
  Segment* segment = nullptr;
  bool allocated = false;
  std::vector<c10::Stream> uses;  // other streams recorded with record_stream while allocated
};

struct Segment {
  char* ptr = nullptr;
  size_t size = 0;
  c10::DeviceIndex device = 0;
  bool small = false;
  int64_t stream = 0;
  size_t carved = 0;  // small segments: bytes handed out as blocks so far
  int busy = 0;       // blocks allocated or waiting for events
  std::vector<Block*> blocks;
};

// Free large blocks ordered by (stream, size, address): lower_bound finds the best fit on a stream.
struct ByStreamSize {
  bool operator()(const Block* a, const Block* b) const {
    if (a->stream != b->stream) return a->stream < b->stream;
    if (a->size != b->size) return a->size < b->size;
    return a->ptr < b->ptr;
  }
};

// Free small blocks by (stream, size). Small requests are served at their exact size, so a stack
// per size does what the ordered set does for large blocks without rebalancing a tree at every
// allocation and free; the most recently freed block, still in cache, is the next one handed out.
struct SmallKey {
  int64_t stream;
  size_t size;
  bool operator==(const SmallKey& o) const { return stream == o.stream && size == o.size; }
};
struct SmallKeyHash {
  size_t operator()(const SmallKey& k) const { return std::hash<int64_t>()(k.stream) * 0x9e3779b97f4a7c15ULL ^ k.size; }
};

struct Pending {  // a freed block waiting for the streams that used it
  Block* block;
  std::vector<void*> events;
};

struct DeviceState {
  DeviceStats stats;
  std::unordered_map<SmallKey, std::vector<Block*>, SmallKeyHash> free_small;
  std::set<Block*, ByStreamSize> free_large;
  std::vector<Segment*> segments;
  std::unordered_map<int64_t, Segment*> carving;  // per stream: the small segment being cut
  std::vector<Pending> pending;
};

class DeviceAllocator final : public c10::DeviceAllocator {
 public:
  c10::DataPtr allocate(size_t nbytes) override {
    const c10::DeviceIndex device = current_device();
    const c10::Device where(c10::DeviceType::PrivateUse1, device);
    if (nbytes == 0) return {nullptr, nullptr, &DeviceAllocator::deleter, where};
    int64_t stream = current_stream_id(device);
    const uint64_t capture = capturing_ > 0 ? driver::capture_id(device, stream) : 0;
    std::lock_guard<std::mutex> lock(mu_);
    if (capture != 0) {
      auto it = capture_pools_.find(capture);
      if (it != capture_pools_.end()) stream = it->second;
    }
    Block* b = take(device, stream, nbytes);
    blocks_.emplace(b->ptr, b);
    return {b->ptr, b->ptr, &DeviceAllocator::deleter, where};
  }

  c10::DeleterFnPtr raw_deleter() const override { return &DeviceAllocator::deleter; }

  void copy_data(void* dest, const void* src, std::size_t count) const override {
    const c10::DeviceIndex device = current_device();
    {{ cookiecutter.DEVICE }}_CHECK(
        driver::memcpy(dest, src, count, driver::CopyKind::device_to_device, device, current_stream_id(device)));
  }

  bool initialized() override { return true; }

  void emptyCache(c10::MempoolId_t) override {
    std::lock_guard<std::mutex> lock(mu_);
    for (c10::DeviceIndex d = 0; d < static_cast<c10::DeviceIndex>(devices_.size()); ++d) release_cached(d);
  }

  void recordStream(const c10::DataPtr& ptr, c10::Stream stream) override {
    if (ptr.get() == nullptr || ptr.get_deleter() != &DeviceAllocator::deleter) return;
    std::lock_guard<std::mutex> lock(mu_);
    auto it = blocks_.find(ptr.get());
    if (it == blocks_.end()) return;
    Block* b = it->second;
    if (stream.id() == b->stream && stream.device_index() == device_of(b)) return;
    if (std::find(b->uses.begin(), b->uses.end(), stream) == b->uses.end()) b->uses.push_back(stream);
  }

  DeviceStats getDeviceStats(c10::DeviceIndex device) override {
    check_device(device);
    std::lock_guard<std::mutex> lock(mu_);
    process_pending(device);
    return state(device).stats;
  }

  void resetAccumulatedStats(c10::DeviceIndex device) override {
    check_device(device);
    std::lock_guard<std::mutex> lock(mu_);
    DeviceStats& s = state(device).stats;
    for_each_stat(s, reset_accumulated);
    s.num_ooms = 0;
    s.num_alloc_retries = 0;
    s.num_device_alloc = 0;
    s.num_device_free = 0;
  }

  void resetPeakStats(c10::DeviceIndex device) override {
    check_device(device);
    std::lock_guard<std::mutex> lock(mu_);
    for_each_stat(state(device).stats, reset_peak);
  }

  std::pair<size_t, size_t> getMemoryInfo(c10::DeviceIndex device) override {
    size_t free_bytes = 0, total = 0;
    {{ cookiecutter.DEVICE }}_CHECK(driver::mem_info(device, &free_bytes, &total));
    return {free_bytes, total};
  }

  static DeviceAllocator& instance();

  // Graphs: the allocations on the streams of `capture` come from `pool` until the capture ends.
  void begin_pool(c10::DeviceIndex device, uint64_t capture, c10::MempoolId_t pool) {
    std::lock_guard<std::mutex> lock(mu_);
    state(device);
    auto it = pools_.find(pool);
    if (it == pools_.end()) it = pools_.emplace(pool, PoolUse{next_pool_key_--, 0}).first;
    it->second.users += 1;
    capture_pools_[capture] = it->second.key;
    capturing_ += 1;
  }

  void end_pool(uint64_t capture) {
    std::lock_guard<std::mutex> lock(mu_);
    if (capture_pools_.erase(capture) > 0) capturing_ -= 1;
  }

  // A graph no longer uses `pool`: with its last user gone, its unused memory goes back to the driver.
  void release_pool(c10::DeviceIndex device, c10::MempoolId_t pool) {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = pools_.find(pool);
    if (it == pools_.end() || --it->second.users > 0) return;
    const int64_t key = it->second.key;
    pools_.erase(it);
    if (capturing_ == 0) release_segments(device, [key](const Segment* seg) { return seg->stream == key; });
  }

  void free_block(void* ptr) {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = blocks_.find(ptr);
    if (it == blocks_.end()) return;
    Block* b = it->second;
    blocks_.erase(it);
    const c10::DeviceIndex device = device_of(b);
    DeviceState& d = state(device);
    b->allocated = false;
    count(d.stats, b->segment->small, &DeviceStats::allocation, -1);
    count(d.stats, b->segment->small, &DeviceStats::allocated_bytes, -static_cast<int64_t>(b->size));
    count(d.stats, b->segment->small, &DeviceStats::requested_bytes, -static_cast<int64_t>(b->requested));
    if (b->uses.empty()) {
      make_free(device, b);
      return;
    }
    // Used on other streams: reusable once each of them has passed what is queued there now.
    Pending p{b, {}};
    for (const c10::Stream& s : b->uses) {
      void* event = nullptr;
      if (driver::event_create(&event, false) != driver::Status::ok) continue;
      driver::event_record(event, s.device_index(), s.id());
      p.events.push_back(event);
    }
    b->uses.clear();
    d.pending.push_back(std::move(p));
  }

 private:
  static void deleter(void* ptr);

  DeviceState& state(c10::DeviceIndex device) {
    if (devices_.size() < static_cast<size_t>(device_count())) devices_.resize(device_count());
    return devices_[device];
  }

  // Kept with the segment: a free (every tensor's) asks the driver nothing.
  static c10::DeviceIndex device_of(const Block* b) { return b->segment->device; }

  // Applies delta to the pool's statistic and the aggregate one.
  static void count(DeviceStats& s, bool small, std::array<Stat, static_cast<size_t>(StatType::NUM_TYPES)> DeviceStats::*
                    field, int64_t delta) {
    update((s.*field)[static_cast<size_t>(StatType::AGGREGATE)], delta);
    update((s.*field)[static_cast<size_t>(small ? StatType::SMALL_POOL : StatType::LARGE_POOL)], delta);
  }

  void make_free(c10::DeviceIndex device, Block* b) {
    DeviceState& d = state(device);
    count(d.stats, b->segment->small, &DeviceStats::active, -1);
    count(d.stats, b->segment->small, &DeviceStats::active_bytes, -static_cast<int64_t>(b->size));
    b->segment->busy -= 1;
    if (b->segment->small) {
      d.free_small[SmallKey{b->stream, b->size}].push_back(b);
    } else {
      d.free_large.insert(b);
    }
  }

  // Blocks whose streams have passed their recorded events go back to their pools.
  void process_pending(c10::DeviceIndex device) {
    auto& pending = state(device).pending;
    for (auto it = pending.begin(); it != pending.end();) {
      bool done = std::all_of(it->events.begin(), it->events.end(),
                              [](void* e) { return driver::event_query(e) == driver::Status::ok; });
      if (!done) {
        ++it;
        continue;
      }
      for (void* e : it->events) driver::event_destroy(e);
      make_free(device, it->block);
      it = pending.erase(it);
    }
  }

  Block* take(c10::DeviceIndex device, int64_t stream, size_t nbytes) {
    const size_t size = (nbytes + kRound - 1) / kRound * kRound;
    const bool small = size <= kSmallLimit;
    process_pending(device);
    Block* b = reuse(device, stream, size, small);
    if (b == nullptr) b = carve(device, stream, size, small);
    DeviceState& d = state(device);
    b->allocated = true;
    b->requested = nbytes;
    b->segment->busy += 1;
    count(d.stats, small, &DeviceStats::allocation, 1);
    count(d.stats, small, &DeviceStats::allocated_bytes, static_cast<int64_t>(size));
    count(d.stats, small, &DeviceStats::requested_bytes, static_cast<int64_t>(nbytes));
    count(d.stats, small, &DeviceStats::active, 1);
    count(d.stats, small, &DeviceStats::active_bytes, static_cast<int64_t>(size));
    return b;
  }

  // A cached free block of this stream: the same size for small requests, at most 1/8 larger for large.
  Block* reuse(c10::DeviceIndex device, int64_t stream, size_t size, bool small) {
    if (small) {
      auto it = state(device).free_small.find(SmallKey{stream, size});
      if (it == state(device).free_small.end() || it->second.empty()) return nullptr;
      Block* b = it->second.back();
      it->second.pop_back();
      return b;
    }
    auto& pool = state(device).free_large;
    Block key;
    key.stream = stream;
    key.size = size;
    auto it = pool.lower_bound(&key);
    if (it == pool.end() || (*it)->stream != stream) return nullptr;
    if ((*it)->size > size + size / 8) return nullptr;
    Block* b = *it;
    pool.erase(it);
    return b;
  }

  // A new block: cut from the stream's small segment, or a segment of its own.
  Block* carve(c10::DeviceIndex device, int64_t stream, size_t size, bool small) {
    DeviceState& d = state(device);
    Segment* seg = nullptr;
    if (small) {
      auto it = d.carving.find(stream);
      if (it != d.carving.end() && it->second->size - it->second->carved >= size) seg = it->second;
    }
    if (seg == nullptr) {
      seg = new_segment(device, stream, small ? kSmallSegment : size, small);
      if (small) d.carving[stream] = seg;
    }
    auto* b = new Block();
    b->ptr = seg->ptr + seg->carved;
    b->size = size;
    b->stream = stream;
    b->segment = seg;
    seg->carved += size;
    seg->blocks.push_back(b);
    return b;
  }

  Segment* new_segment(c10::DeviceIndex device, int64_t stream, size_t size, bool small) {
    DeviceState& d = state(device);
    void* ptr = nullptr;
    driver::Status s = driver::malloc(device, &ptr, size);
    if (s == driver::Status::out_of_memory) {  // give the cache back and try again
      d.stats.num_alloc_retries += 1;
      release_cached(device);
      s = driver::malloc(device, &ptr, size);
      if (s == driver::Status::out_of_memory && capturing_ == 0) {  // blocks waiting for streams: wait for them
        driver::device_synchronize(device);
        release_cached(device);
        s = driver::malloc(device, &ptr, size);
      }
    }
    if (s == driver::Status::out_of_memory) {
      size_t free_bytes = 0, total = 0;
      driver::mem_info(device, &free_bytes, &total);
      d.stats.num_ooms += 1;
      TORCH_CHECK_WITH(OutOfMemoryError, false, "{{ cookiecutter.device }} out of memory: tried to allocate ", size,
                       " bytes on device ", int(device), " with ", free_bytes, " bytes free of ", total, " (",
                       d.stats.allocated_bytes[0].current, " bytes allocated by tensors, ",
                       d.stats.reserved_bytes[0].current, " reserved by the caching allocator)");
    }
    if (s != driver::Status::ok) {
      {{ cookiecutter.DEVICE }}_DRIVER_ERROR(s, "{{ cookiecutter.device }} driver: malloc of ", size, " bytes on device ",
                                             int(device), " failed: ", driver::status_string(s));
    }
    auto* seg = new Segment();
    seg->ptr = static_cast<char*>(ptr);
    seg->size = size;
    seg->device = device;
    seg->small = small;
    seg->stream = stream;
    d.segments.push_back(seg);
    d.stats.num_device_alloc += 1;
    count(d.stats, small, &DeviceStats::segment, 1);
    count(d.stats, small, &DeviceStats::reserved_bytes, static_cast<int64_t>(size));
    return seg;
  }

  // Returns every segment with no block in use to the driver (empty_cache, out-of-memory retries),
  // but a live graph pool's; nothing during a capture.
  void release_cached(c10::DeviceIndex device) {
    if (capturing_ > 0) return;
    release_segments(device, [this](const Segment* seg) {
      return seg->stream >= 0 || std::none_of(pools_.begin(), pools_.end(),
                                              [seg](const auto& p) { return p.second.key == seg->stream; });
    });
  }

  template <typename Releasable>
  void release_segments(c10::DeviceIndex device, Releasable releasable) {
    process_pending(device);
    DeviceState& d = state(device);
    for (auto it = d.segments.begin(); it != d.segments.end();) {
      Segment* seg = *it;
      if (seg->busy > 0 || !releasable(seg)) {
        ++it;
        continue;
      }
      for (Block* b : seg->blocks) {  // every one is free (busy == 0)
        if (seg->small) {
          auto stack = d.free_small.find(SmallKey{b->stream, b->size});
          if (stack != d.free_small.end()) {  // (always: with busy == 0, every block of the segment is free)
            auto& blocks = stack->second;
            blocks.erase(std::remove(blocks.begin(), blocks.end(), b), blocks.end());
            if (blocks.empty()) d.free_small.erase(stack);
          }
        } else {
          d.free_large.erase(b);
        }
        delete b;
      }
      auto carving = d.carving.find(seg->stream);
      if (carving != d.carving.end() && carving->second == seg) d.carving.erase(carving);
      driver::free(seg->ptr);
      d.stats.num_device_free += 1;
      count(d.stats, seg->small, &DeviceStats::segment, -1);
      count(d.stats, seg->small, &DeviceStats::reserved_bytes, -static_cast<int64_t>(seg->size));
      delete seg;
      it = d.segments.erase(it);
    }
  }

  std::mutex mu_;
  std::vector<DeviceState> devices_;
  // Allocated blocks by address. A DataPtr's context stays its address, not its block: torch's
  // copy-on-write clones (torch._lazy_clone) take over a context as the data pointer itself.
  std::unordered_map<void*, Block*> blocks_;
  struct PoolUse {
    int64_t key;  // the pool's blocks' `stream`
    int users;    // graphs using it (captured into it or sharing it)
  };
  std::map<c10::MempoolId_t, PoolUse> pools_;
  std::unordered_map<uint64_t, int64_t> capture_pools_;  // capture under way -> its pool key
  int64_t next_pool_key_ = -1;
  std::atomic<int> capturing_{0};
};

DeviceAllocator& DeviceAllocator::instance() {
  static DeviceAllocator* a = new DeviceAllocator();  // outlives every tensor, even at exit
  return *a;
}

// An allocated block stays until its segment has no block in use (release_segments).
void DeviceAllocator::deleter(void* ptr) {
  if (ptr != nullptr) instance().free_block(ptr);
}

}  // namespace

c10::Allocator* device_allocator() { return &DeviceAllocator::instance(); }

void begin_allocate_to_pool(c10::DeviceIndex device, uint64_t capture, c10::MempoolId_t pool) {
  DeviceAllocator::instance().begin_pool(device, capture, pool);
}
void end_allocate_to_pool(uint64_t capture) { DeviceAllocator::instance().end_pool(capture); }
void release_pool(c10::DeviceIndex device, c10::MempoolId_t pool) { DeviceAllocator::instance().release_pool(device, pool); }

REGISTER_ALLOCATOR(c10::DeviceType::PrivateUse1, device_allocator())

}  // namespace {{ cookiecutter.device }}::runtime
