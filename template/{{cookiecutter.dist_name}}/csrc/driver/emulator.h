// The emulator's own calls: what exists only because the emulated device's memory is host memory
// and its kernels are host code. NOT part of the port API (driver.h).
//
// A hardware team deletes this file together with the emulator that implements it (driver.cpp,
// streams.cpp). The template's contract (template.json, "emulator") lists the only files allowed
// to include it; each says what its use becomes on a chip:
//   - aten/kernel_support.cpp: host aliases of device memory (host_address), kernels queued as host
//     code (launch) and host bodies run in stream order (enter_stream/leave_stream) become the
//     SDK's kernel launches on device pointers;
//   - distributed/host_memory.cpp: host views for the emulated collective transport (gloo) go with
//     that transport, replaced by a collective library that takes device pointers;
//   - python/module.cpp: the test aids torch.{{ cookiecutter.device }}._sleep (a spin kernel on
//     a chip) and set_memory_limit (the SDK's memory limit, if it has one).
// Generated kernels never include it: they reach device memory through kernels:: helpers
// (aten/kernel_support.h).
//
// launch is here, not in driver.h, because it queues a host lambda that reads and writes device
// memory through host_address: it only makes sense while kernels are host code. A chip's kernel
// launch names device code and its arguments in the SDK's own terms (and a CUDA-style host
// callback on a stream may not touch device memory), so the port API has no generic launch.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>

#include "driver/driver.h"

namespace {{ cookiecutter.device }}::emulator {

using driver::Status;

// The host address the emulator's code uses for device address `ptr` (any address inside an
// allocation), or nullptr if ptr is not device memory.
void* host_address(const void* ptr);
// The device's capacity (torch.{{ cookiecutter.device }}.set_memory_limit; {{ cookiecutter.DEVICE }}_MEMORY_LIMIT at start).
Status set_mem_limit(int device, size_t bytes);

// Work on a stream. launch queues `work` (a kernel) on the stream's worker thread and returns;
// `name` is what the profiler shows. run_blocking waits for the stream's queued work, runs `work`
// on the calling thread as the stream's next item, and returns when it is done (kernels whose
// output sizes depend on their inputs, and the emulator's kernels that return new tensors).
Status launch(int device, int64_t stream, const char* name, std::function<void()> work);
Status run_blocking(int device, int64_t stream, const char* name, const std::function<void()>& work);
// run_blocking in two halves, for a kernel body that runs between them: enter waits for the
// stream's queued work and holds the stream (work launched meanwhile queues behind); leave lets
// it go. Re-entrant on one thread. Every enter must be matched by a leave.
Status enter_stream(int device, int64_t stream);
void leave_stream(int device, int64_t stream, const char* name = nullptr);
// Test aid, like torch.cuda._sleep: queues work that keeps the stream busy for `microseconds`.
Status sleep(int device, int64_t stream, int64_t microseconds);

// Inside the emulator only (driver.cpp and streams.cpp): its own fork safety. An SDK has its own
// rules for fork().
bool in_bad_fork();  // true in a child forked after the parent used a device
void mark_forked();  // called by the emulator's own fork handler in the child

}  // namespace {{ cookiecutter.device }}::emulator
