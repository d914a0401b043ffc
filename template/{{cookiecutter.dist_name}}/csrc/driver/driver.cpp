// Emulated implementation of driver.h, part 1: devices and memory (streams.cpp has the rest), with
// every optional capability: host_mapping, memory_limit and ipc here, the others in streams.cpp.
//
// Device memory is host memory that the host cannot touch by accident. Each driver allocation is a
// memory file mapped twice: the device address handed out is mapped with no access at all (a
// kernel, copy or Python extension that dereferences it crashes with SIGSEGV, as it would on a
// real accelerator), and a second, read-write mapping is what driver::host_address (host_mapping) returns to
// the driver and to the kernels it runs. The memory file stays open with the allocation: it is what
// ipc_export hands another process, which maps the same file (ipc_open). The emulator also keeps
// the table of live allocations (which device owns a pointer, each device's capacity set by {{ cookiecutter.DEVICE }}_MEMORY_LIMIT such as
// 512M or 16G) and a current device per thread.
//
// What a hardware team replaces: this whole file, with calls into its SDK (device memory, pinned
// host memory, device properties) — or starts from the minimal driver (`backendgen new NAME
// --driver minimal`), which implements the port API alone. No torch headers here.
#include "driver/driver.h"

#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <map>
#include <mutex>
#include <new>
#include <pthread.h>
#include <string>
#include <thread>
#include <unordered_set>
#include <vector>

#include "driver/emulator.h"

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

struct Allocation {
  int device;
  size_t bytes;   // as requested (what the capacity counts)
  size_t mapped;  // page-rounded length of both mappings
  char* host;     // the driver's read-write mapping of the same pages
  int fd;         // the memory file (ipc_export's descriptor)
  bool imported;  // mapped by ipc_open from another process's allocation (ipc_close, not free)
};

struct MemoryState {
  // Read at every launch (count) and for every tensor a kernel reads (generation): a cache line of
  // their own, which no allocating thread writes; mu is taken by every allocation and lookup.
  alignas(64) int count = kDefaultDevices;
  std::atomic<uint64_t> generation{0};  // bumped when an allocation leaves the table (host_address's cache)
  alignas(64) std::mutex mu;
  std::vector<size_t> limit, used;
  std::map<const char*, Allocation> allocations;  // device address -> allocation
  std::map<const char*, size_t> pinned;  // pinned host block -> its size in bytes
  std::atomic<bool> initialized{false};  // a device was used in this process
  std::atomic<bool> bad_fork{false};
  size_t page = 4096;

  MemoryState() {
    if (const char* env = std::getenv("{{ cookiecutter.DEVICE }}_DEVICE_COUNT")) {
      int n = std::atoi(env);
      if (n >= 0 && n <= 64) count = n;
    }
    size_t lim = parse_bytes(std::getenv("{{ cookiecutter.DEVICE }}_MEMORY_LIMIT"), kDefaultLimit);
    limit.assign(count, lim);
    used.assign(count, 0);
    long p = sysconf(_SC_PAGESIZE);
    if (p > 0) page = static_cast<size_t>(p);
    // every allocation keeps its memory file open: allow as many descriptors as the system does
    rlimit files{};
    if (getrlimit(RLIMIT_NOFILE, &files) == 0 && files.rlim_cur < files.rlim_max) {
      files.rlim_cur = files.rlim_max;
      setrlimit(RLIMIT_NOFILE, &files);
    }
  }
};

MemoryState& memory() {
  static MemoryState* s = [] {
    auto* st = new MemoryState();  // never destroyed: safe to use from static destructors
    // The emulator's own fork safety: the child of a fork() must not wait on a lock some parent
    // thread held at the fork, and the device worker threads do not exist in the child, so once
    // the parent used a device, driver calls in the child return Status::forked. What Python sees
    // (torch.<device>._is_in_bad_fork, the lazy-init error) is PyTorch's own fork handler, which
    // the runtime's hooks register (runtime/hooks.cpp). An SDK has its own rules here.
    pthread_atfork(nullptr, nullptr, [] {
      new (&memory().mu) std::mutex();
      emulator::mark_forked();
    });
    return st;
  }();
  return *s;
}

thread_local int current_device = 0;

bool valid(int device) { return device >= 0 && device < memory().count; }

// The allocation containing `p` (any address inside it); call with mu held.
const std::pair<const char* const, Allocation>* find(const void* ptr) {
  MemoryState& s = memory();
  const char* p = static_cast<const char*>(ptr);
  auto it = s.allocations.upper_bound(p);
  if (it == s.allocations.begin()) return nullptr;
  --it;
  return p < it->first + it->second.mapped ? &*it : nullptr;
}

// Two mappings of memory file `fd`: `device` with no access, `host` read-write.
bool map_twice(int fd, size_t length, char** device, char** host) {
  void* d = mmap(nullptr, length, PROT_NONE, MAP_SHARED, fd, 0);
  void* h = d != MAP_FAILED ? mmap(nullptr, length, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0) : MAP_FAILED;
  if (h == MAP_FAILED) {
    if (d != MAP_FAILED) munmap(d, length);
    return false;
  }
  *device = static_cast<char*>(d);
  *host = static_cast<char*>(h);
  return true;
}

// Undoes map_twice and closes the memory file (the allocation is out of the table).
void unmap(void* device, const Allocation& a) {
  munmap(device, a.mapped);
  munmap(a.host, a.mapped);
  close(a.fd);
}

// A new memory file of `length` bytes mapped twice; its descriptor in *fd.
bool map_new(size_t length, int* fd, char** device, char** host) {
  *fd = memfd_create("{{ cookiecutter.device }}-device-memory", MFD_CLOEXEC);
  if (*fd < 0) return false;
  if (ftruncate(*fd, static_cast<off_t>(length)) == 0 && map_twice(*fd, length, device, host)) return true;
  close(*fd);
  return false;
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
    case Status::launch_failed: return last_launch_error();
    case Status::not_supported: return "not supported by this driver";
    case Status::capture_unsupported:
    case Status::capture_invalidated: return emulator::last_capture_error();
    case Status::capture_unjoined:
      return "a stream forked from the capture (it waited for an event recorded in it) did not join back: make the "
             "capturing stream wait for it before the capture ends";
  }
  return "unknown status";
}

int device_count() { return memory().count; }

Status init() {
  MemoryState& s = memory();
  if (s.bad_fork) return Status::forked;
  if (!s.initialized.load(std::memory_order_relaxed)) s.initialized = true;  // not a store at every launch
  return Status::ok;
}

bool is_initialized() { return memory().initialized; }

Status get_device(int* device) {
  *device = current_device;
  return Status::ok;
}

Status set_device(int device) {
  if (!valid(device)) return Status::invalid_device;
  current_device = device;
  return Status::ok;
}

Status get_device_properties(int device, DeviceProperties* props) {
  if (!valid(device)) return Status::invalid_device;
  MemoryState& s = memory();
  std::lock_guard<std::mutex> lock(s.mu);
  props->name = "{{ cookiecutter.device }} emulated device";
  props->major = 1;
  props->minor = 0;
  props->total_memory = s.limit[device];
  // kernels the emulator runs (the CPU's, Inductor's compiled C++) use the host's cores
  props->multi_processor_count = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  return Status::ok;
}

Status malloc(int device, void** ptr, size_t bytes) {
  *ptr = nullptr;
  if (!valid(device)) return Status::invalid_device;
  MemoryState& s = memory();
  if (s.bad_fork) return Status::forked;
  if (bytes == 0) return Status::ok;
  {
    std::lock_guard<std::mutex> lock(s.mu);
    if (s.used[device] + bytes > s.limit[device]) return Status::out_of_memory;
    s.used[device] += bytes;  // reserved before mapping, so two threads cannot both pass the check
  }
  const size_t length = (bytes + s.page - 1) / s.page * s.page;
  char* dev = nullptr;
  char* host = nullptr;
  int fd = -1;
  if (!map_new(length, &fd, &dev, &host)) {
    std::lock_guard<std::mutex> lock(s.mu);
    s.used[device] -= bytes;
    return Status::out_of_memory;
  }
  std::lock_guard<std::mutex> lock(s.mu);
  s.initialized = true;
  s.allocations.emplace(dev, Allocation{device, bytes, length, host, fd, false});
  *ptr = dev;
  return Status::ok;
}

namespace streams_impl {
void wait_for_queued_work(int device);  // streams.cpp
}  // namespace streams_impl

Status free(void* ptr, int* device, size_t* bytes) {
  if (ptr == nullptr) return Status::ok;
  MemoryState& s = memory();
  const int owner = pointer_device(ptr);
  if (owner >= 0) {
    Status refused = emulator::refuse_unsafe_call(owner, "freeing device memory");
    if (refused != Status::ok) return refused;
    streams_impl::wait_for_queued_work(owner);
  }  // queued kernels may still read it
  Allocation a{};
  {
    std::lock_guard<std::mutex> lock(s.mu);
    auto it = s.allocations.find(static_cast<const char*>(ptr));
    if (it == s.allocations.end() || it->second.imported) return Status::invalid_value;
    a = it->second;
    s.used[a.device] -= a.bytes;
    s.allocations.erase(it);
    s.generation.fetch_add(1, std::memory_order_release);
  }
  if (device != nullptr) *device = a.device;
  if (bytes != nullptr) *bytes = a.bytes;
  unmap(ptr, a);
  return Status::ok;
}

int pointer_device(const void* ptr) {
  MemoryState& s = memory();
  std::lock_guard<std::mutex> lock(s.mu);
  const auto* entry = find(ptr);
  return entry == nullptr ? -1 : entry->second.device;
}

Status mem_info(int device, size_t* free_bytes, size_t* total_bytes) {
  if (!valid(device)) return Status::invalid_device;
  MemoryState& s = memory();
  std::lock_guard<std::mutex> lock(s.mu);
  *total_bytes = s.limit[device];
  *free_bytes = s.limit[device] > s.used[device] ? s.limit[device] - s.used[device] : 0;
  return Status::ok;
}

Status host_malloc(void** ptr, size_t bytes) {
  *ptr = bytes ? std::aligned_alloc(64, (bytes + 63) / 64 * 64) : nullptr;
  if (bytes && *ptr == nullptr) return Status::out_of_memory;
  if (*ptr) {
    std::lock_guard<std::mutex> lock(memory().mu);
    memory().pinned.emplace(static_cast<const char*>(*ptr), bytes);
  }
  return Status::ok;
}

Status host_free(void* ptr) {
  if (ptr == nullptr) return Status::ok;
  {
    std::lock_guard<std::mutex> lock(memory().mu);
    if (memory().pinned.erase(static_cast<const char*>(ptr)) == 0) return Status::invalid_value;
  }
  std::free(ptr);
  return Status::ok;
}

bool is_host_pinned(const void* ptr) {
  // any address inside a block counts: a tensor on a slice of a pinned storage starts past the block's start
  const char* p = static_cast<const char*>(ptr);
  std::lock_guard<std::mutex> lock(memory().mu);
  auto it = memory().pinned.upper_bound(p);
  if (it == memory().pinned.begin()) return false;
  --it;
  return p < it->first + it->second;
}

}  // namespace {{ cookiecutter.device }}::driver

// emulator.h: the emulator's own fork bookkeeping (streams.cpp asks it too)
namespace {{ cookiecutter.device }}::emulator {

bool in_bad_fork() { return driver::memory().bad_fork; }

void mark_forked() {
  driver::MemoryState& s = driver::memory();
  if (s.initialized) s.bad_fork = true;
}

}  // namespace {{ cookiecutter.device }}::emulator

// driver.h's optional capabilities: the emulator has them all.
namespace {{ cookiecutter.device }}::driver {

bool has(Capability) { return true; }

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

// The allocations this thread looked up last, valid while no allocation has left the table since
// (MemoryState::generation): a kernel's arguments are found without taking mu, which the host's
// allocations take, and without a walk of the table.
struct Looked {
  const char* device;
  size_t mapped;
  char* host;
};
constexpr size_t kLooked = 8;
thread_local std::array<Looked, kLooked> looked{};
thread_local size_t looked_next = 0;
thread_local uint64_t looked_generation = ~uint64_t{0};

void* host_address(const void* ptr) {
  MemoryState& s = memory();
  const char* p = static_cast<const char*>(ptr);
  const uint64_t generation = s.generation.load(std::memory_order_acquire);
  if (generation == looked_generation) {
    for (const Looked& l : looked) {
      if (l.device != nullptr && p >= l.device && p < l.device + l.mapped) return l.host + (p - l.device);
    }
  } else {
    looked.fill(Looked{});
    looked_generation = generation;
  }
  std::lock_guard<std::mutex> lock(s.mu);
  const auto* entry = find(ptr);
  if (entry == nullptr) return nullptr;
  looked[looked_next++ % kLooked] = Looked{entry->first, entry->second.mapped, entry->second.host};
  return entry->second.host + (p - entry->first);
}

Status set_memory_limit(int device, size_t bytes) {
  if (!valid(device)) return Status::invalid_device;
  MemoryState& s = memory();
  std::lock_guard<std::mutex> lock(s.mu);
  s.limit[device] = bytes;
  return Status::ok;
}

// ipc: a handle is the allocation's memory file (the descriptor) and what the opener checks it
// against: a tag and the mapped length.
namespace {
constexpr char kIpcTag[8] = "{{ cookiecutter.device[:7] }}";
struct IpcBytes {
  char tag[8];
  uint64_t mapped;
};
static_assert(sizeof(IpcBytes) <= sizeof(IpcHandle::bytes));
}  // namespace

Status ipc_export(const void* ptr, IpcHandle* handle, size_t* offset, size_t* bytes) {
  MemoryState& s = memory();
  std::lock_guard<std::mutex> lock(s.mu);
  const auto* entry = find(ptr);
  if (entry == nullptr) return Status::invalid_value;
  IpcBytes b{};
  std::memcpy(b.tag, kIpcTag, sizeof(b.tag));
  b.mapped = entry->second.mapped;
  *handle = IpcHandle{};
  std::memcpy(handle->bytes, &b, sizeof(b));
  handle->fd = entry->second.fd;
  *offset = static_cast<size_t>(static_cast<const char*>(ptr) - entry->first);
  *bytes = entry->second.mapped;
  return Status::ok;
}

Status ipc_open(int device, const IpcHandle& handle, void** base) {
  *base = nullptr;
  if (!valid(device)) return Status::invalid_device;
  MemoryState& s = memory();
  if (s.bad_fork) return Status::forked;
  IpcBytes b{};
  std::memcpy(&b, handle.bytes, sizeof(b));
  struct stat st{};
  if (std::memcmp(b.tag, kIpcTag, sizeof(b.tag)) != 0 || handle.fd < 0 || fstat(handle.fd, &st) != 0 ||
      static_cast<uint64_t>(st.st_size) != b.mapped) {
    if (handle.fd >= 0) close(handle.fd);
    return Status::invalid_value;
  }
  char* dev = nullptr;
  char* host = nullptr;
  if (!map_twice(handle.fd, b.mapped, &dev, &host)) {
    close(handle.fd);
    return Status::out_of_memory;
  }
  std::lock_guard<std::mutex> lock(s.mu);
  s.initialized = true;
  // not counted against the capacity: the memory is the exporter's
  s.allocations.emplace(dev, Allocation{device, 0, b.mapped, host, handle.fd, true});
  *base = dev;
  return Status::ok;
}

Status ipc_close(void* base) {
  MemoryState& s = memory();
  const int owner = pointer_device(base);
  if (owner >= 0) streams_impl::wait_for_queued_work(owner);  // queued kernels may still use it
  Allocation a{};
  {
    std::lock_guard<std::mutex> lock(s.mu);
    auto it = s.allocations.find(static_cast<const char*>(base));
    if (it == s.allocations.end() || !it->second.imported) return Status::invalid_value;
    a = it->second;
    s.allocations.erase(it);
    s.generation.fetch_add(1, std::memory_order_release);
  }
  unmap(base, a);
  return Status::ok;
}

}  // namespace {{ cookiecutter.device }}::driver
