// The device driver API of the {{ cookiecutter.device }} backend — THE seam a hardware team replaces.
//
// Everything above this file (allocators, guard, hooks, kernels) talks to the device only through
// these functions: the port API, shaped like CUDA's runtime (devices, memory, copies, pinned host
// memory, streams, events, activity tracing). A hardware team re-implements exactly this header
// on its SDK and keeps the rest of the backend.
//
// Here they are implemented by an emulator (driver.cpp, streams.cpp) that behaves like an
// asynchronous accelerator, so that lifetime and ordering bugs show up on a CPU machine:
//   - each stream runs its work (kernels, copies, event records, waits) in order on a worker
//     thread of its own; launching returns at once, and only the synchronize calls, event
//     queries and blocking copies tell the host that the work is done;
//   - device memory is host memory the host cannot touch by accident: the address a device
//     allocation returns is mapped with no access, and only the driver (and kernels it runs)
//     reaches the bytes through a second mapping;
//   - events complete when their stream reaches them, and a stream that waits on an event does
//     not run past the wait until the event completes.
// The emulator's own calls — those that exist only because device memory is host memory and
// kernels are host code (host addresses, queuing host code on a stream, test aids) — are not
// here but in emulator.h, which a hardware team deletes with driver.cpp and streams.cpp.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

namespace {{ cookiecutter.device }}::driver {

enum class Status : int {
  ok = 0,
  out_of_memory,
  invalid_device,
  invalid_value,
  not_ready,
  forked,         // the device was initialised before fork(); the child cannot use it
  launch_failed,  // queued work failed; reported by the next call that waits for the stream
};
const char* status_string(Status s);
const char* last_launch_error();  // what the failed work reported

enum class CopyKind : int { host_to_device, device_to_host, device_to_device, host_to_host };

// Devices
int device_count();
Status init();  // starts the driver (idempotent); every other call but device_count starts it too
bool is_initialized();
Status get_device(int* device);
Status set_device(int device);
Status device_synchronize(int device);  // waits for the work of every stream of the device

struct DeviceProperties {
  std::string name;
  int major = 0, minor = 0;  // compute capability of the emulated device
  size_t total_memory = 0;
  int multi_processor_count = 0;
};
Status get_device_properties(int device, DeviceProperties* props);

// Device memory. Driver allocations are page-granular and slow (two mappings each): the device
// allocator above caches them.
Status malloc(int device, void** ptr, size_t bytes);
Status free(void* ptr, int* device = nullptr, size_t* bytes = nullptr);  // reports what was freed
// Synchronous copy: ordered after all work queued on (device, stream), returns when done.
Status memcpy(void* dst, const void* src, size_t bytes, CopyKind kind, int device = -1, int64_t stream = 0);
// Asynchronous copy queued on (device, stream); the caller keeps both buffers alive and unchanged
// until the stream passes it (record an event after it).
Status memcpy_async(void* dst, const void* src, size_t bytes, CopyKind kind, int device, int64_t stream);
Status mem_info(int device, size_t* free_bytes, size_t* total_bytes);
int pointer_device(const void* ptr);  // the device owning ptr, or -1

// Pinned (page-locked) host memory
Status host_malloc(void** ptr, size_t bytes);
Status host_free(void* ptr);
bool is_host_pinned(const void* ptr);

// Streams: handles are small integers per device; 0 is the default stream. Lower priority values
// run first when a device is busy (as in CUDA, 0 is the default and -1 the high priority).
Status stream_create(int device, int priority, int64_t* stream);
Status stream_priority_range(int* least, int* greatest);  // e.g. 0 and -1
Status stream_synchronize(int device, int64_t stream);
Status stream_query(int device, int64_t stream);  // ok when all work is done, else not_ready
Status stream_wait_event(int device, int64_t stream, void* event);

// Events
Status event_create(void** event, bool timing);
Status event_destroy(void* event);
Status event_record(void* event, int device, int64_t stream);
Status event_query(void* event);  // ok once the stream has passed the record, else not_ready
Status event_synchronize(void* event);
Status event_elapsed_ms(float* ms, void* start, void* end);

// Profiling: while tracing is on, the driver records every kernel, copy and sleep (the emulator's
// test aid, emulator.h) it runs.
struct Activity {
  enum Kind : int { kernel, memcpy, sleep } kind = kernel;
  std::string name;
  int device = 0;
  int64_t stream = 0;
  int64_t start_ns = 0, end_ns = 0;  // steady clock
  uint64_t correlation = 0;          // the value of set_correlation on the launching thread
};
void set_tracing(bool on);
std::vector<Activity> take_activities();
void set_correlation(uint64_t id);  // per thread: tags the launches that follow
int64_t now_ns();                   // the clock of Activity times

}  // namespace {{ cookiecutter.device }}::driver
