// Emulated implementation of driver.h: device memory is host memory.
//
// What a hardware team replaces: this whole file, with calls into its SDK. The emulator keeps a
// table of live allocations (to answer "which device owns this pointer" and to enforce each
// device's capacity, set by {{ cookiecutter.DEVICE }}_MEMORY_LIMIT such as 512M or 16G), a
// current device per thread, and events that record a timestamp. No torch headers here.
#include "driver/driver.h"

#include <chrono>
#include <cstdlib>
#include <cstring>
#include <map>
#include <mutex>
#include <new>
#include <pthread.h>
#include <string>
#include <unordered_set>
#include <vector>

namespace {{ cookiecutter.device }}::driver {
namespace {

constexpr int kDefaultDevices = {{ cookiecutter.num_devices }};
constexpr size_t kDefaultLimit = size_t{16} << 30;  // 16 GiB per device

size_t parse_bytes(const char* text, size_t fallback) {
  if (text == nullptr || *text == '\0') return fallback;
  char* end = nullptr;
  double value = std::strtod(text, &end);
  if (end == text || value < 0) return fallback;
  switch (*end) {
    case 'k': case 'K': value *= 1024.0; break;
    case 'm': case 'M': value *= 1024.0 * 1024.0; break;
    case 'g': case 'G': value *= 1024.0 * 1024.0 * 1024.0; break;
    default: break;
  }
  return static_cast<size_t>(value);
}

struct Event {
  bool timing = false;
  bool recorded = false;
  std::chrono::steady_clock::time_point when{};
};

struct State {
  std::mutex mu;
  int count = kDefaultDevices;
  std::vector<size_t> limit, used;
  std::map<const char*, std::pair<int, size_t>> allocations;  // start -> (device, bytes)
  std::unordered_set<const void*> pinned;
  std::vector<int64_t> next_stream;
  bool initialized = false;  // a device was used (memory allocated) in this process
  bool bad_fork = false;

  State() {
    if (const char* env = std::getenv("{{ cookiecutter.DEVICE }}_DEVICE_COUNT")) {
      int n = std::atoi(env);
      if (n >= 0 && n <= 64) count = n;
    }
    size_t lim = parse_bytes(std::getenv("{{ cookiecutter.DEVICE }}_MEMORY_LIMIT"), kDefaultLimit);
    limit.assign(count, lim);
    used.assign(count, 0);
    next_stream.assign(count, 1);
  }
};

State& state();

// Like a real device context, the emulated one does not survive fork(): a child forked after the
// parent used a device gets Status::forked (PyTorch users know this from CUDA: use 'spawn').
void on_fork_child() {
  State& s = state();
  new (&s.mu) std::mutex();  // the parent's lock state is meaningless in the child
  if (s.initialized) s.bad_fork = true;
}

State& state() {
  static State* s = [] {
    auto* st = new State();  // never destroyed: safe to use from static destructors
    pthread_atfork(nullptr, nullptr, &on_fork_child);
    return st;
  }();
  return *s;
}

thread_local int current_device = 0;

bool valid(int device) { return device >= 0 && device < state().count; }

}  // namespace

const char* status_string(Status s) {
  switch (s) {
    case Status::ok: return "ok";
    case Status::out_of_memory: return "out of memory";
    case Status::invalid_device: return "invalid device";
    case Status::invalid_value: return "invalid value";
    case Status::not_ready: return "not ready";
    case Status::forked:
      return "the device was initialised before fork(); use the 'spawn' multiprocessing start method";
  }
  return "unknown status";
}

int device_count() { return state().count; }

Status get_device(int* device) {
  *device = current_device;
  return Status::ok;
}

Status set_device(int device) {
  if (!valid(device)) return Status::invalid_device;
  current_device = device;
  return Status::ok;
}

Status device_synchronize(int device) { return valid(device) ? Status::ok : Status::invalid_device; }

bool in_bad_fork() { return state().bad_fork; }

Status malloc(int device, void** ptr, size_t bytes) {
  *ptr = nullptr;
  if (!valid(device)) return Status::invalid_device;
  State& s = state();
  if (s.bad_fork) return Status::forked;
  if (bytes == 0) return Status::ok;
  std::lock_guard<std::mutex> lock(s.mu);
  if (s.used[device] + bytes > s.limit[device]) return Status::out_of_memory;
  void* p = std::aligned_alloc(64, (bytes + 63) / 64 * 64);
  if (p == nullptr) return Status::out_of_memory;
  s.initialized = true;
  s.used[device] += bytes;
  s.allocations.emplace_hint(s.allocations.end(), static_cast<const char*>(p), std::make_pair(device, bytes));
  *ptr = p;
  return Status::ok;
}

Status free(void* ptr, int* device, size_t* bytes) {
  if (ptr == nullptr) return Status::ok;
  State& s = state();
  {
    std::lock_guard<std::mutex> lock(s.mu);
    auto it = s.allocations.find(static_cast<const char*>(ptr));
    if (it == s.allocations.end()) return Status::invalid_value;
    if (device != nullptr) *device = it->second.first;
    if (bytes != nullptr) *bytes = it->second.second;
    s.used[it->second.first] -= it->second.second;
    s.allocations.erase(it);
  }
  std::free(ptr);
  return Status::ok;
}

Status memcpy(void* dst, const void* src, size_t bytes, CopyKind, int, int64_t) {
  if (bytes == 0) return Status::ok;
  if (dst == nullptr || src == nullptr) return Status::invalid_value;
  std::memmove(dst, src, bytes);
  return Status::ok;
}

Status mem_info(int device, size_t* free_bytes, size_t* total_bytes) {
  if (!valid(device)) return Status::invalid_device;
  State& s = state();
  std::lock_guard<std::mutex> lock(s.mu);
  *total_bytes = s.limit[device];
  *free_bytes = s.limit[device] > s.used[device] ? s.limit[device] - s.used[device] : 0;
  return Status::ok;
}

Status set_mem_limit(int device, size_t bytes) {
  if (!valid(device)) return Status::invalid_device;
  State& s = state();
  std::lock_guard<std::mutex> lock(s.mu);
  s.limit[device] = bytes;
  return Status::ok;
}

int pointer_device(const void* ptr) {
  State& s = state();
  const char* p = static_cast<const char*>(ptr);
  std::lock_guard<std::mutex> lock(s.mu);
  auto it = s.allocations.upper_bound(p);
  if (it == s.allocations.begin()) return -1;
  --it;
  return p < it->first + it->second.second ? it->second.first : -1;
}

Status host_malloc(void** ptr, size_t bytes) {
  *ptr = bytes ? std::aligned_alloc(64, (bytes + 63) / 64 * 64) : nullptr;
  if (bytes && *ptr == nullptr) return Status::out_of_memory;
  if (*ptr) {
    std::lock_guard<std::mutex> lock(state().mu);
    state().pinned.insert(*ptr);
  }
  return Status::ok;
}

Status host_free(void* ptr) {
  if (ptr == nullptr) return Status::ok;
  {
    std::lock_guard<std::mutex> lock(state().mu);
    if (state().pinned.erase(ptr) == 0) return Status::invalid_value;
  }
  std::free(ptr);
  return Status::ok;
}

bool is_host_pinned(const void* ptr) {
  std::lock_guard<std::mutex> lock(state().mu);
  return state().pinned.count(ptr) != 0;
}

Status stream_create(int device, int, int64_t* stream) {
  if (!valid(device)) return Status::invalid_device;
  std::lock_guard<std::mutex> lock(state().mu);
  *stream = state().next_stream[device]++;
  return Status::ok;
}

// Work runs synchronously on the calling thread, so every stream is always idle.
Status stream_synchronize(int device, int64_t) { return valid(device) ? Status::ok : Status::invalid_device; }
Status stream_query(int device, int64_t) { return valid(device) ? Status::ok : Status::invalid_device; }
Status stream_wait_event(int device, int64_t, void*) { return valid(device) ? Status::ok : Status::invalid_device; }

Status event_create(void** event, bool timing) {
  auto* e = new (std::nothrow) Event();
  if (e == nullptr) return Status::out_of_memory;
  e->timing = timing;
  *event = e;
  return Status::ok;
}

Status event_destroy(void* event) {
  delete static_cast<Event*>(event);
  return Status::ok;
}

Status event_record(void* event, int device, int64_t) {
  if (!valid(device)) return Status::invalid_device;
  auto* e = static_cast<Event*>(event);
  e->recorded = true;
  e->when = std::chrono::steady_clock::now();
  return Status::ok;
}

Status event_query(void*) { return Status::ok; }
Status event_synchronize(void*) { return Status::ok; }

Status event_elapsed_ms(float* ms, void* start, void* end) {
  auto* a = static_cast<Event*>(start);
  auto* b = static_cast<Event*>(end);
  if (!a->timing || !b->timing || !a->recorded || !b->recorded) return Status::invalid_value;
  *ms = std::chrono::duration<float, std::milli>(b->when - a->when).count();
  return Status::ok;
}

// --- interim synchronous versions of the asynchronous API (replaced by the stream workers) ---
Status init() { return Status::ok; }
bool is_initialized() { return state().initialized; }
void mark_forked() { state().bad_fork = true; }
Status get_device_properties(int device, DeviceProperties* props) {
  if (!valid(device)) return Status::invalid_device;
  props->name = "{{ cookiecutter.device }} (emulated)";
  props->major = 1;
  props->minor = 0;
  props->total_memory = state().limit[device];
  props->multi_processor_count = 1;
  return Status::ok;
}
Status memcpy_async(void* dst, const void* src, size_t bytes, CopyKind kind, int device, int64_t stream) {
  return memcpy(dst, src, bytes, kind, device, stream);
}
void* host_address(const void* ptr) { return pointer_device(ptr) >= 0 ? const_cast<void*>(ptr) : nullptr; }
Status stream_priority_range(int* least, int* greatest) {
  *least = 0;
  *greatest = -1;
  return Status::ok;
}
Status launch(int device, int64_t, const char*, std::function<void()> work) {
  if (!valid(device)) return Status::invalid_device;
  work();
  return Status::ok;
}
Status run_blocking(int device, int64_t, const char*, const std::function<void()>& work) {
  if (!valid(device)) return Status::invalid_device;
  work();
  return Status::ok;
}
Status sleep(int device, int64_t, int64_t) { return valid(device) ? Status::ok : Status::invalid_device; }
void set_tracing(bool) {}
std::vector<Activity> take_activities() { return {}; }
void set_correlation(uint64_t) {}
int64_t now_ns() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

}  // namespace {{ cookiecutter.device }}::driver
