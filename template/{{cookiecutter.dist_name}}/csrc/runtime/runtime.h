// Shared declarations of the {{ cookiecutter.device }} runtime (allocator, guard, hooks, generator).
//
// Light on purpose: only c10 headers, so the runtime's translation units compile in seconds.
// A hardware team keeps this file; it changes only when the driver API does.
#pragma once

#include <c10/core/Allocator.h>
#include <c10/core/Device.h>
#include <c10/core/Stream.h>
#include <c10/core/impl/DeviceGuardImplInterface.h>
#include <c10/util/Exception.h>

#include <utility>

#include "driver/driver.h"

// A driver call's failure: c10::AcceleratorError, which Python sees as torch.AcceleratorError (a
// RuntimeError, as CUDA's errors are), the driver's status as its error_code; the rest of the
// arguments make the message.
#define {{ cookiecutter.DEVICE }}_DRIVER_ERROR(status, ...)                                            \
  throw ::c10::AcceleratorError({__func__, __FILE__, static_cast<uint32_t>(__LINE__)}, \
                                static_cast<int32_t>(status), ::c10::str(__VA_ARGS__))

// Fail with a Python-visible error naming the driver call and its status.
#define {{ cookiecutter.DEVICE }}_CHECK(expr)                                                       \
  do {                                                                                            \
    ::{{ cookiecutter.device }}::driver::Status status_ = (expr);                                 \
    if (status_ != ::{{ cookiecutter.device }}::driver::Status::ok) {                             \
      {{ cookiecutter.DEVICE }}_DRIVER_ERROR(status_, "{{ cookiecutter.device }} driver: ", #expr, " failed: ", \
                                             ::{{ cookiecutter.device }}::driver::status_string(status_)); \
    }                                                                                             \
  } while (0)

namespace {{ cookiecutter.device }}::runtime {

c10::DeviceIndex device_count();
c10::DeviceIndex current_device();
void set_device(c10::DeviceIndex index);
// Whether the hooks' init() has run in this process (torch's lazy device initialisation).
bool is_initialized();
// Throws a clear error (not a crash) for an index that is not a device of this machine.
void check_device(c10::DeviceIndex index);

// The id of the calling thread's current stream on `device` (what driver calls take as `stream`):
// the guard's getStream without its checks and virtual call, as every launch and allocation asks.
int64_t current_stream_id(c10::DeviceIndex device);

// The priority of a stream handed out by the guard's stream pools (the default stream: 0), and
// the range of priorities, (least, greatest) — lower values run first, as on CUDA.
int stream_priority(c10::DeviceIndex device, int64_t stream);
std::pair<int, int> stream_priority_range();

c10::Allocator* device_allocator();
// Graph pools (runtime/graphs.cpp): allocations on the streams of a capture under way come from a
// pool the graph keeps (begin/end), until the last graph using the pool releases it.
void begin_allocate_to_pool(c10::DeviceIndex device, uint64_t capture, c10::MempoolId_t pool);
void end_allocate_to_pool(uint64_t capture);
void release_pool(c10::DeviceIndex device, c10::MempoolId_t pool);
// Whether the calling thread's current stream on `device` records into a graph (cheap when no
// graph captures anywhere).
bool capturing(c10::DeviceIndex device);
c10::Allocator* host_allocator();
// Work queued on `stream` reads or writes the pinned block `block` (a host_allocator() DataPtr,
// e.g. a non_blocking copy): the block is not handed out again until that work is done.
void record_host_use(const c10::DataPtr& block, c10::Stream stream);

}  // namespace {{ cookiecutter.device }}::runtime
