// The emulator's internal header: what driver.cpp and streams.cpp share beyond driver.h. Nothing
// outside csrc/driver includes it (backendgen's contract audit checks): the rest of the backend
// reaches the device through driver.h alone, and what the emulator offers beyond the port API it
// offers as driver.h's optional capabilities.
//
// A hardware team deletes this file with the emulator (driver.cpp, streams.cpp).
#pragma once

#include <cstdint>
#include <functional>

#include "driver/driver.h"

namespace {{ cookiecutter.device }}::emulator {

using driver::Status;

// Runs `work` on the calling thread as the stream's next item (the stream's queued work first; work
// launched meanwhile queues behind it): the emulator's blocking copies.
Status run_blocking(int device, int64_t stream, const char* name, const std::function<void()>& work);

// Graphs: the message of the last call refused during a capture (status_string), and the check of
// a potentially unsafe call (driver::free) against the captures under way on the device.
const char* last_capture_error();
Status refuse_unsafe_call(int device, const char* what);

// Fork safety: an SDK has its own rules for fork().
bool in_bad_fork();  // true in a child forked after the parent used a device
void mark_forked();  // called by the emulator's own fork handler in the child

}  // namespace {{ cookiecutter.device }}::emulator
