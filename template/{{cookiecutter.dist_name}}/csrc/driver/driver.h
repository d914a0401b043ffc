// The device driver API of the {{ cookiecutter.device }} backend — THE seam a hardware team replaces.
//
// Everything above this file (allocators, guard, hooks, kernels, collectives, torch.compile's
// kernels) talks to the device only through these functions, and no file outside csrc/driver
// includes any other driver header. The API is shaped like CUDA's runtime: devices, memory, copies,
// pinned host memory, streams, events, activity tracing. A hardware team implements exactly this
// header on its SDK (docs/porting.md) and keeps the rest of the backend.
//
// The port API (everything up to "Optional capabilities") is what every driver must implement.
// The optional capabilities below it are what a driver may have: the backend asks has() and uses
// one only where the driver has it. Without host_mapping — device memory the host cannot address,
// as on a discrete accelerator — every kernel stages its device memory through memcpy
// (aten/kernel_support.cpp); without the others, the generated tests that need them skip and name
// the capability.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
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
  not_supported,  // an optional capability (below) the driver does not have
  capture_unsupported,  // graphs: the call is not allowed while a stream is capturing (the capture is broken)
  capture_invalidated,  // graphs: the capture was broken by an earlier call; end it and capture again
  capture_unjoined,     // graphs: a stream forked from the capture did not join back before its end
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
  int major = 0, minor = 0;  // the device's compute capability (torch.<device>.get_device_capability)
  size_t total_memory = 0;
  int multi_processor_count = 0;
};
Status get_device_properties(int device, DeviceProperties* props);

// Device memory. Driver allocations may be slow (a page-granular mapping, an SDK call): the device
// allocator above caches them. A device address need not be readable by the host.
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

// Profiling: while tracing is on, a driver with the tracing capability records every kernel, copy
// and spin it runs; one without it records nothing (take_activities() is empty).
struct Activity {
  enum Kind : int { kernel, memcpy, spin } kind = kernel;
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

// ---- Optional capabilities -------------------------------------------------------------------------
// A driver reports which it has; calling one it lacks returns Status::not_supported (host_address:
// nullptr). The backend checks has() first, so a driver may leave every one out.
enum class Capability : int {
  host_mapping,  // host_address: device memory the host can address (unified or integrated memory)
  host_tasks,    // launch_host, hold_stream/release_stream: host code run in a stream's order
  spin,          // spin: work that keeps a stream busy (a test aid, torch.{{ cookiecutter.device }}._sleep)
  memory_limit,  // set_memory_limit: caps a device's memory (torch.{{ cookiecutter.device }}.set_memory_limit)
  tracing,       // set_tracing records activities (the profiler's device timeline)
  graphs,        // stream capture and replay (torch.accelerator.Graph), as CUDA graphs
  ipc,           // device memory shared with other processes (torch.multiprocessing), as CUDA IPC
};
constexpr Capability kCapabilities[] = {Capability::host_mapping, Capability::host_tasks, Capability::spin,
                                        Capability::memory_limit, Capability::tracing, Capability::graphs,
                                        Capability::ipc};
bool has(Capability capability);
const char* capability_name(Capability capability);  // "host_mapping", ...

// host_mapping: the host address of device address `ptr` (any address inside an allocation), or
// nullptr if ptr is not device memory. Host code may read and write the bytes there, in stream order.
void* host_address(const void* ptr);

// host_tasks: launch_host queues `work` (host code) on the stream and returns; it runs when the
// stream reaches it, and an exception it throws is reported, with `name`, by the next call that
// waits for the stream (Status::launch_failed, last_launch_error). hold_stream waits for the
// stream's queued work and holds the stream for host code on the calling thread (work launched
// meanwhile queues behind it) until release_stream; re-entrant on one thread, always paired.
Status launch_host(int device, int64_t stream, const char* name, std::function<void()> work);
Status hold_stream(int device, int64_t stream);
void release_stream(int device, int64_t stream, const char* name = nullptr);

// spin: queues work that keeps the stream busy for `microseconds` (like torch.cuda._sleep).
Status spin(int device, int64_t stream, int64_t microseconds);

// memory_limit: the device's capacity from now on (malloc fails past it).
Status set_memory_limit(int device, size_t bytes);

// graphs: stream capture, as CUDA's. Between begin_capture and end_capture, work launched on the
// stream — and on any stream that waits for an event recorded in the capture, which joins it — is
// recorded into a graph instead of run. A launched graph runs the recorded work, in its order, on
// the memory it was captured on, as one unit of the stream it is launched on. During a capture,
// a call that would wait for the capturing streams (synchronizing them or the device, a blocking
// copy, hold_stream, querying them or an event recorded in the capture) returns
// capture_unsupported and breaks the capture; so does a potentially unsafe call (work on the
// default stream 0 of the device, free) made where the capture's mode forbids it: any thread
// (global), the capturing thread (thread_local), nowhere (relaxed). A broken capture's end returns
// capture_invalidated and no graph; the streams are usable again.
enum class CaptureMode : int { global = 0, thread_local_ = 1, relaxed = 2 };
Status begin_capture(int device, int64_t stream, CaptureMode mode);  // invalid_value on the default stream
Status end_capture(int device, int64_t stream, void** graph);
uint64_t capture_id(int device, int64_t stream);  // the capture the stream records into, or 0
Status graph_instantiate(void* graph, void** exec);  // an executable copy, launchable many times
Status graph_launch(void* exec, int device, int64_t stream);
Status graph_exec_destroy(void* exec);
Status graph_destroy(void* graph);
Status graph_debug_dump(void* graph, const char* path);  // a readable (Graphviz dot) dump of the work

// ipc: device memory another process of the same machine can use, as CUDA's IPC memory handles.
// ipc_export describes the allocation containing `ptr` (any address inside memory from malloc or
// ipc_open) as a handle another process can open: opaque bytes, and an OS file descriptor when the
// SDK shares memory through one (a dma-buf, a memory file; -1 when it does not). The descriptor
// stays the driver's and valid while the allocation lives: the backend duplicates it to send it.
// `offset` is ptr's offset in the allocation, `bytes` the allocation's size. ipc_open, in another
// process, maps the allocation of a handle (the descriptor, if any, is now the driver's: it closes
// it) and returns its base address on `device` of this process: device memory as malloc's, that
// kernels, copies and host_address use, the same bytes the exporter sees, which stay valid until
// ipc_close even if the exporting process exits. ipc_close unmaps it (free refuses it); work
// queued on the memory must be done first. Ordering across processes is the backend's: it waits
// for the device before it exports, and a process synchronizes before it tells another to read.
struct IpcHandle {
  unsigned char bytes[64] = {};
  int fd = -1;
};
Status ipc_export(const void* ptr, IpcHandle* handle, size_t* offset, size_t* bytes);
Status ipc_open(int device, const IpcHandle& handle, void** base);
Status ipc_close(void* base);

}  // namespace {{ cookiecutter.device }}::driver
