// The device driver API of the {{ cookiecutter.device }} backend — THE seam a hardware team replaces.
//
// Everything above this file (allocators, guard, hooks, kernels) talks to the device only through
// these functions. Here they are implemented by an emulator (driver.cpp): device memory is host
// memory with a per-device capacity, and streams and events complete synchronously because the
// emulated kernels run on the calling thread. A hardware team re-implements this header on its SDK
// (runtime, memory, stream and event calls) and keeps the rest of the backend.
#pragma once

#include <cstddef>
#include <cstdint>

namespace {{ cookiecutter.device }}::driver {

enum class Status : int {
  ok = 0,
  out_of_memory,
  invalid_device,
  invalid_value,
  not_ready,
  forked,  // the device was initialised before fork(); the child cannot use it
};
const char* status_string(Status s);

enum class CopyKind : int { host_to_device, device_to_host, device_to_device, host_to_host };

// Devices
int device_count();
Status get_device(int* device);
Status set_device(int device);
Status device_synchronize(int device);
bool in_bad_fork();  // true in a child forked after the parent used a device

// Device memory
Status malloc(int device, void** ptr, size_t bytes);
Status free(void* ptr, int* device = nullptr, size_t* bytes = nullptr);  // reports what was freed
Status memcpy(void* dst, const void* src, size_t bytes, CopyKind kind);
Status mem_info(int device, size_t* free_bytes, size_t* total_bytes);
Status set_mem_limit(int device, size_t bytes);  // emulator only: the device's capacity
int pointer_device(const void* ptr);  // the device owning ptr, or -1

// Pinned (page-locked) host memory
Status host_malloc(void** ptr, size_t bytes);
Status host_free(void* ptr);
bool is_host_pinned(const void* ptr);

// Streams: handles are small integers per device; 0 is the default stream.
Status stream_create(int device, int64_t* stream);
Status stream_synchronize(int device, int64_t stream);
Status stream_query(int device, int64_t stream);  // ok when all work is done, else not_ready
Status stream_wait_event(int device, int64_t stream, void* event);

// Events
Status event_create(void** event, bool timing);
Status event_destroy(void* event);
Status event_record(void* event, int device, int64_t stream);
Status event_query(void* event);
Status event_synchronize(void* event);
Status event_elapsed_ms(float* ms, void* start, void* end);

}  // namespace {{ cookiecutter.device }}::driver
