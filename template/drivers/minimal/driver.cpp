// The minimal driver of the {{ cookiecutter.device }} backend: driver.h's port API and nothing else.
//
// Start here to port the backend to a chip: replace each function body below with the call into
// your SDK that does the same (the comment above each says what that call must guarantee), keep
// the signatures, and run the generated tests. No optional capability is implemented: has()
// answers false for each, their calls return Status::not_supported, and the tests that need one
// skip and name it.
//
// Where synchronous is simplest, this driver is synchronous: every copy is done before it
// returns, so streams never have queued work, events are complete once recorded, and
// synchronizing waits for nothing. Your SDK's streams will be asynchronous; the guarantees below
// are what the backend relies on.
//
// Device memory is not host-addressable, as on a discrete accelerator. A device address lies in a
// range of address space reserved with no access, so host code that dereferences one crashes
// with SIGSEGV, as it would on a chip; the bytes live in a host buffer only this file reaches, and
// every kernel stages its data through memcpy.
//
// Environment: {{ cookiecutter.DEVICE }}_DEVICE_COUNT (default {{ cookiecutter.num_devices }}) and
// {{ cookiecutter.DEVICE }}_MEMORY_LIMIT (each device's capacity, e.g. 512M or 16G; default 16G).
// Fork: a child forked after the parent used a device gets Status::forked from the calls that use
// one (PyTorch raises its usual fork error first). One mutex guards the tables. No torch headers.
#include "driver/driver.h"

#include <pthread.h>
#include <sys/mman.h>

#include <atomic>
#include <cctype>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <iterator>
#include <map>
#include <mutex>
#include <new>
#include <vector>

namespace {{ cookiecutter.device }}::driver {
namespace {

constexpr size_t kAlign = 512;             // device allocations start on this boundary
constexpr size_t kPage = 4096;             // pinned host blocks are page-aligned
constexpr size_t kDefaultLimit = size_t{16} << 30;

size_t round_up(size_t n, size_t to) { return (n + to - 1) / to * to; }

struct Allocation {
  size_t bytes;  // as requested: what the device's capacity counts and copies may reach
  size_t span;   // the address range it takes, rounded up to kAlign
  char* host;    // where its bytes live
  int device;
};

struct Event {
  bool timing = false;
  bool recorded = false;
  int64_t ns = 0;
};

struct State {
  std::mutex mu;  // everything below
  int count = {{ cookiecutter.num_devices }};
  std::vector<size_t> limit, used;
  std::vector<int64_t> next_stream;              // per device; 0 is the default stream
  uintptr_t base = 0, end = 0;                   // the reserved device address range
  std::map<uintptr_t, size_t> holes;             // free parts of it: start -> length
  std::map<uintptr_t, Allocation> allocations;   // device address -> allocation
  std::map<uintptr_t, size_t> pinned;            // pinned host block -> its size
  std::atomic<bool> initialized{false}, forked{false};

  State() {
    if (const char* env = std::getenv("{{ cookiecutter.DEVICE }}_DEVICE_COUNT")) {
      char* rest = nullptr;
      long n = std::strtol(env, &rest, 10);
      if (rest != env && n >= 0 && n <= 64) count = static_cast<int>(n);
    }
    size_t lim = kDefaultLimit;
    if (const char* env = std::getenv("{{ cookiecutter.DEVICE }}_MEMORY_LIMIT")) {  // 512M, 16G, 1.5G, 4096
      char* unit = nullptr;
      double v = std::strtod(env, &unit);
      const char u = static_cast<char>(std::toupper(static_cast<unsigned char>(*unit)));
      const double scale = u == 'K' ? 1 << 10 : u == 'M' ? 1 << 20 : u == 'G' ? 1 << 30 : 1;
      if (unit != env && v >= 0) lim = static_cast<size_t>(v * scale);
    }
    limit.assign(count, lim);
    used.assign(count, 0);
    next_stream.assign(count, 1);
  }
};

State& state() {
  static State* s = [] {
    auto* st = new State();  // never destroyed: allocators may free memory from static destructors
    pthread_atfork(nullptr, nullptr, [] {  // in the child: no lock is held; a used device is gone
      new (&state().mu) std::mutex();
      if (state().initialized) state().forked = true;
    });
    return st;
  }();
  return *s;
}

thread_local int current_device = 0;

// What every call on a device checks first (it starts the driver, as driver.h asks).
Status use(int device) {
  const Status started = init();
  if (started != Status::ok) return started;
  return device >= 0 && device < device_count() ? Status::ok : Status::invalid_device;
}

// Reserves the device address range on first use: no access, no memory behind it; 1 TiB, or half
// as much while mmap refuses (a ulimit -v), down to 16 MiB (mu held).
bool reserve(State& s) {
  if (s.base != 0) return true;
  for (size_t n = size_t{1} << 40; n >= (size_t{1} << 24); n /= 2) {
    void* p = mmap(nullptr, n, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (p == MAP_FAILED) continue;
    s.base = reinterpret_cast<uintptr_t>(p);  // page-aligned, so kAlign-aligned
    s.end = s.base + n;
    s.holes.emplace(s.base, s.end - s.base);
    return true;
  }
  return false;
}

// The allocation whose range holds `p` (any address inside it), or nullptr (mu held).
const std::pair<const uintptr_t, Allocation>* find(State& s, uintptr_t p) {
  auto it = s.allocations.upper_bound(p);
  if (it == s.allocations.begin()) return nullptr;
  --it;
  return p < it->first + it->second.span ? &*it : nullptr;
}

// The host bytes behind [p, p + n): a device side must lie inside one allocation (else nullptr);
// a host side is used as is, unless it is a device address (a wrong CopyKind).
char* resolve(const void* ptr, size_t n, bool on_device) {
  State& s = state();
  const auto p = reinterpret_cast<uintptr_t>(ptr);
  std::lock_guard<std::mutex> lock(s.mu);
  if (!on_device) return p >= s.base && p < s.end ? nullptr : static_cast<char*>(const_cast<void*>(ptr));
  const auto* entry = find(s, p);
  if (entry == nullptr) return nullptr;
  const size_t offset = p - entry->first;
  if (offset > entry->second.bytes || n > entry->second.bytes - offset) return nullptr;  // runs past the end
  return entry->second.host + offset;
}

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
    case Status::launch_failed: return "work queued on the device failed";
    case Status::not_supported: return "not supported by this driver";
    case Status::capture_unsupported: return "operation not permitted when stream is capturing";
    case Status::capture_invalidated: return "the graph capture was invalidated";
    case Status::capture_unjoined: return "a stream forked from the capture did not join back";
  }
  return "unknown status";
}

// The message of the last failed queued work: nothing is ever queued here.
const char* last_launch_error() { return ""; }

// ---- Devices ---------------------------------------------------------------------------------------

// How many devices the SDK sees; must not start the driver (PyTorch asks before it initialises).
int device_count() { return state().count; }

// Opens the SDK / its devices; idempotent, cheap after the first call.
Status init() {
  State& s = state();
  if (s.forked) return Status::forked;
  s.initialized = true;
  return Status::ok;
}

// Whether init() (or a call that starts the driver) has run in this process.
bool is_initialized() { return state().initialized; }

// The calling thread's current device (the SDK's per-thread context), 0 until set.
Status get_device(int* device) {
  *device = current_device;
  return Status::ok;
}

// Makes `device` the calling thread's current device; other threads keep theirs.
Status set_device(int device) {
  if (device < 0 || device >= device_count()) return Status::invalid_device;
  current_device = device;
  return Status::ok;
}

// Returns when all work queued on every stream of the device is done.
Status device_synchronize(int device) { return use(device); }

// What torch.{{ cookiecutter.device }}.get_device_properties shows; total_memory is what malloc may hand out.
Status get_device_properties(int device, DeviceProperties* props) {
  if (Status st = use(device); st != Status::ok) return st;
  State& s = state();
  std::lock_guard<std::mutex> lock(s.mu);
  props->name = "{{ cookiecutter.device }} minimal device";
  props->major = 1;
  props->minor = 0;
  props->total_memory = s.limit[device];
  props->multi_processor_count = 1;
  return Status::ok;
}

// ---- Device memory ---------------------------------------------------------------------------------

// Allocates device memory (no host access needed); 0 bytes gives nullptr. Past the device's
// capacity: out_of_memory, and the process goes on (the caching allocator frees and retries).
Status malloc(int device, void** ptr, size_t bytes) {
  *ptr = nullptr;
  if (Status st = use(device); st != Status::ok) return st;
  if (bytes == 0) return Status::ok;
  State& s = state();
  std::lock_guard<std::mutex> lock(s.mu);
  if (bytes > s.limit[device] - s.used[device] || !reserve(s)) return Status::out_of_memory;
  const size_t span = round_up(bytes, kAlign);
  auto hole = s.holes.begin();  // first fit
  while (hole != s.holes.end() && hole->second < span) ++hole;
  if (hole == s.holes.end()) return Status::out_of_memory;
  char* host = static_cast<char*>(std::calloc(bytes, 1));
  if (host == nullptr) return Status::out_of_memory;
  const uintptr_t start = hole->first;
  const size_t rest = hole->second - span;
  s.holes.erase(hole);
  if (rest > 0) s.holes.emplace(start + span, rest);
  s.allocations.emplace(start, Allocation{bytes, span, host, device});
  s.used[device] += bytes;
  *ptr = reinterpret_cast<void*>(start);
  return Status::ok;
}

// Frees what malloc returned (waiting for work that still uses it) and says what it was.
Status free(void* ptr, int* device, size_t* bytes) {
  if (ptr == nullptr) return Status::ok;
  State& s = state();
  std::lock_guard<std::mutex> lock(s.mu);
  auto it = s.allocations.find(reinterpret_cast<uintptr_t>(ptr));
  if (it == s.allocations.end()) return Status::invalid_value;
  const Allocation a = it->second;
  s.allocations.erase(it);
  s.used[a.device] -= a.bytes;
  std::free(a.host);
  if (device != nullptr) *device = a.device;
  if (bytes != nullptr) *bytes = a.bytes;
  // the range becomes a hole again, merged with its neighbours
  uintptr_t start = reinterpret_cast<uintptr_t>(ptr);
  size_t length = a.span;
  auto next = s.holes.lower_bound(start);
  if (next != s.holes.end() && start + length == next->first) {
    length += next->second;
    next = s.holes.erase(next);
  }
  if (next != s.holes.begin()) {
    auto prev = std::prev(next);
    if (prev->first + prev->second == start) {
      prev->second += length;
      return Status::ok;
    }
  }
  s.holes.emplace(start, length);
  return Status::ok;
}

// Copies `bytes` in the direction `kind` says; device addresses may point inside an allocation.
// Ordered after all work queued on (device, stream) (-1: the current device); returns when done.
Status memcpy(void* dst, const void* src, size_t bytes, CopyKind kind, int device, int64_t /*stream*/) {
  if (bytes == 0) return Status::ok;
  if (dst == nullptr || src == nullptr) return Status::invalid_value;
  if (device < 0) get_device(&device);
  if (kind != CopyKind::host_to_host) {
    if (Status st = use(device); st != Status::ok) return st;
  }
  char* to = resolve(dst, bytes, kind == CopyKind::host_to_device || kind == CopyKind::device_to_device);
  const char* from = resolve(src, bytes, kind == CopyKind::device_to_host || kind == CopyKind::device_to_device);
  if (to == nullptr || from == nullptr) return Status::invalid_value;
  std::memmove(to, from, bytes);
  return Status::ok;
}

// Queues the copy on (device, stream) and returns; it must run after the stream's earlier work and
// before its later work. Synchronous here, which keeps that order.
Status memcpy_async(void* dst, const void* src, size_t bytes, CopyKind kind, int device, int64_t stream) {
  return memcpy(dst, src, bytes, kind, device, stream);
}

// The device's capacity and what is left of it.
Status mem_info(int device, size_t* free_bytes, size_t* total_bytes) {
  if (Status st = use(device); st != Status::ok) return st;
  State& s = state();
  std::lock_guard<std::mutex> lock(s.mu);
  *total_bytes = s.limit[device];
  *free_bytes = s.limit[device] - s.used[device];
  return Status::ok;
}

// The device whose allocation holds `ptr` (any address inside it), or -1 (host memory, unknown).
int pointer_device(const void* ptr) {
  State& s = state();
  std::lock_guard<std::mutex> lock(s.mu);
  const auto* entry = find(s, reinterpret_cast<uintptr_t>(ptr));
  return entry == nullptr ? -1 : entry->second.device;
}

// ---- Pinned host memory ----------------------------------------------------------------------------

// Page-locked host memory the device can copy from and to asynchronously; 0 bytes gives nullptr.
Status host_malloc(void** ptr, size_t bytes) {
  *ptr = nullptr;
  if (bytes == 0) return Status::ok;
  *ptr = std::aligned_alloc(kPage, round_up(bytes, kPage));
  if (*ptr == nullptr) return Status::out_of_memory;
  std::lock_guard<std::mutex> lock(state().mu);
  state().pinned.emplace(reinterpret_cast<uintptr_t>(*ptr), bytes);
  return Status::ok;
}

// Frees what host_malloc returned; anything else: invalid_value.
Status host_free(void* ptr) {
  if (ptr == nullptr) return Status::ok;
  {
    std::lock_guard<std::mutex> lock(state().mu);
    if (state().pinned.erase(reinterpret_cast<uintptr_t>(ptr)) == 0) return Status::invalid_value;
  }
  std::free(ptr);
  return Status::ok;
}

// True for any address inside a pinned block (a tensor on a slice of one starts past its start).
bool is_host_pinned(const void* ptr) {
  const auto p = reinterpret_cast<uintptr_t>(ptr);
  std::lock_guard<std::mutex> lock(state().mu);
  auto it = state().pinned.upper_bound(p);
  if (it == state().pinned.begin()) return false;
  --it;
  return p < it->first + it->second;
}

// ---- Streams: every stream is always idle here -----------------------------------------------------

// A new stream (queue) of the device; ids are small integers, 0 is the default stream.
// Lower priority values run first on a busy device: nothing is ever busy here.
Status stream_create(int device, int /*priority*/, int64_t* stream) {
  if (Status st = use(device); st != Status::ok) return st;
  std::lock_guard<std::mutex> lock(state().mu);
  *stream = state().next_stream[device]++;
  return Status::ok;
}

// The priorities stream_create accepts: least (the default) to greatest.
Status stream_priority_range(int* least, int* greatest) {
  *least = 0;
  *greatest = -1;
  return Status::ok;
}

// Returns when all work queued on the stream is done.
Status stream_synchronize(int device, int64_t /*stream*/) {
  return use(device);
}

// ok when all work queued on the stream is done, else not_ready; never blocks.
Status stream_query(int device, int64_t /*stream*/) {
  return use(device);
}

// Work queued on the stream after this waits (on the device, not the host) for the event's record.
Status stream_wait_event(int device, int64_t /*stream*/, void* /*event*/) {
  return use(device);
}

// ---- Events ----------------------------------------------------------------------------------------

// A new event (an opaque handle); `timing`: records take timestamps for event_elapsed_ms.
Status event_create(void** event, bool timing) {
  auto* e = new (std::nothrow) Event();
  if (e == nullptr) return Status::out_of_memory;
  e->timing = timing;
  *event = e;
  return Status::ok;
}

// Destroys the event; a record still queued on a stream stays valid for that stream.
Status event_destroy(void* event) {
  delete static_cast<Event*>(event);
  return Status::ok;
}

// Marks the point after all work queued on (device, stream) so far; with timing, the device's
// clock when the stream reaches it. Here everything before it is done, so that is now.
Status event_record(void* event, int device, int64_t /*stream*/) {
  if (event == nullptr) return Status::invalid_value;
  if (Status st = use(device); st != Status::ok) return st;
  auto* e = static_cast<Event*>(event);
  e->ns = now_ns();
  e->recorded = true;
  return Status::ok;
}

// ok once the stream has passed the last record (or none was made), else not_ready.
Status event_query(void* /*event*/) { return Status::ok; }

// Returns when the stream has passed the last record.
Status event_synchronize(void* /*event*/) { return Status::ok; }

// Milliseconds between two recorded timing events.
Status event_elapsed_ms(float* ms, void* start, void* end) {
  const auto* a = static_cast<const Event*>(start);
  const auto* b = static_cast<const Event*>(end);
  if (a == nullptr || b == nullptr || !a->timing || !b->timing || !a->recorded || !b->recorded) {
    return Status::invalid_value;
  }
  *ms = static_cast<float>(b->ns - a->ns) / 1e6f;
  return Status::ok;
}

// ---- Profiling: no tracing capability, so nothing is recorded --------------------------------------

void set_tracing(bool /*on*/) {}

std::vector<Activity> take_activities() { return {}; }

void set_correlation(uint64_t /*id*/) {}

// The clock of Activity times and events (steady, in nanoseconds).
int64_t now_ns() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

// ---- Optional capabilities: none ---------------------------------------------------------------------

bool has(Capability) { return false; }

const char* capability_name(Capability capability) {
  switch (capability) {
    case Capability::host_mapping: return "host_mapping";
    case Capability::host_tasks: return "host_tasks";
    case Capability::spin: return "spin";
    case Capability::memory_limit: return "memory_limit";
    case Capability::tracing: return "tracing";
    case Capability::graphs: return "graphs";
    case Capability::ipc: return "ipc";
  }
  return "unknown";
}

void* host_address(const void*) { return nullptr; }

Status launch_host(int, int64_t, const char*, std::function<void()>) { return Status::not_supported; }

Status hold_stream(int, int64_t) { return Status::not_supported; }

void release_stream(int, int64_t, const char*) {}

Status spin(int, int64_t, int64_t) { return Status::not_supported; }

Status set_memory_limit(int, size_t) { return Status::not_supported; }

Status begin_capture(int, int64_t, CaptureMode) { return Status::not_supported; }
Status end_capture(int, int64_t, void** graph) {
  *graph = nullptr;
  return Status::not_supported;
}
uint64_t capture_id(int, int64_t) { return 0; }
Status graph_instantiate(void*, void**) { return Status::not_supported; }
Status graph_launch(void*, int, int64_t) { return Status::not_supported; }
Status graph_exec_destroy(void*) { return Status::not_supported; }
Status graph_destroy(void*) { return Status::not_supported; }
Status graph_debug_dump(void*, const char*) { return Status::not_supported; }

Status ipc_export(const void*, IpcHandle*, size_t*, size_t*) { return Status::not_supported; }
Status ipc_open(int, const IpcHandle&, void** base) {
  *base = nullptr;
  return Status::not_supported;
}
Status ipc_close(void*) { return Status::not_supported; }

}  // namespace {{ cookiecutter.device }}::driver
