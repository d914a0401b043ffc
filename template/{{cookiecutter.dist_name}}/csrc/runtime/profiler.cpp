// Profiler integration: what torch.profiler shows of the {{ cookiecutter.device }} device.
//
// Two registrations, both on the driver's profiling calls (driver.h):
//   - an activity source for Kineto, PyTorch's tracing library: while a trace that asks for
//     ProfilerActivity.PrivateUse1 runs, the driver records every kernel, copy and sleep the device
//     runs (set_tracing); when the trace stops they become Kineto activities on the device's
//     timeline — kernels and memcpys, with their device (the trace's "process") and stream (its
//     "thread"), start and end converted to the clock of the CPU events, and linked to the CPU op
//     that launched them (Kineto hands each op's correlation id to the session, which tags the
//     driver's launches with it through set_correlation). They show in prof.events() with
//     device_type PrivateUse1, in key_averages()' device time, and in export_chrome_trace();
//   - the PrivateUse1 profiler stubs, for the profiler's event-based fallback
//     (torch.autograd.profiler.profile(use_device="{{ cookiecutter.device }}") without Kineto):
//     a timing event recorded on the current stream around each op gives the op's device time.
// What a hardware team replaces: the driver calls underneath — the driver's tracing becomes the
// SDK's activity API (CUPTI-like: buffers of kernel/memcpy records with device timestamps and
// correlation ids), driver events become the SDK's. This file's Kineto and stub plumbing stays.
#ifndef USE_KINETO
#define USE_KINETO  // the torch wheel is built with Kineto; its PrivateUse1 registry needs the macro
#endif

#include <torch/csrc/profiler/standalone/privateuse1_profiler.h>
#include <torch/csrc/profiler/stubs/base.h>

#include <c10/core/DeviceType.h>
#include <c10/util/ApproximateClock.h>
#include <c10/util/Exception.h>
#include <libkineto.h>
#include <output_base.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <functional>
#include <limits>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "runtime/runtime.h"

namespace {{ cookiecutter.device }}::runtime {
namespace {

// ---------------------------------------------------------------------------------------------
// Kineto activity source

using libkineto::ActivityType;

// What the device contributes to a trace: torch asks for these when ProfilerActivity.PrivateUse1
// is in the activities (with only ProfilerActivity.CPU it asks for none of them).
const std::set<ActivityType>& device_activity_types() {
  static const std::set<ActivityType> types{ActivityType::CONCURRENT_KERNEL, ActivityType::GPU_MEMCPY};
  return types;
}

// The driver's timestamps are steady-clock ns; Kineto's (and the CPU events') are ns since the Unix
// epoch (system clock). The offset between the two, measured from the closest of a few readings.
int64_t steady_to_unix_offset_ns() {
  int64_t best_gap = std::numeric_limits<int64_t>::max();
  int64_t offset = 0;
  for (int i = 0; i < 5; ++i) {
    const int64_t before = driver::now_ns();
    const int64_t unix_now =
        std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::system_clock::now().time_since_epoch())
            .count();
    const int64_t after = driver::now_ns();
    if (after - before < best_gap) {
      best_gap = after - before;
      offset = unix_now - (before + (after - before) / 2);
    }
  }
  return offset;
}

// A copy, shown as a memcpy: the driver's own copies (memcpy, memcpy_async), and the runtime's
// copies between host and device, which {% if cookiecutter.driver == "emulator" %}the emulator runs{% else %}a driver may run{% endif %} as stream work named "copy ..." (ATen's
// copy_ moves the strided bytes). An SDK's activity records say which are copies themselves.
bool is_copy(const driver::Activity& record) {
  return record.kind == driver::Activity::memcpy || record.name.rfind("copy ", 0) == 0;
}

// Correlation ids Kineto pushes for the ops running on this thread (ops nest: aten::matmul calls
// aten::mm). The innermost one tags what the driver launches from this thread.
thread_local std::vector<uint64_t> correlation_stack;

void push_correlation(uint64_t id) {
  correlation_stack.push_back(id);
  driver::set_correlation(id);
}

void pop_correlation() {
  if (!correlation_stack.empty()) correlation_stack.pop_back();
  driver::set_correlation(correlation_stack.empty() ? 0 : correlation_stack.back());
}

class DeviceTraceSession final : public libkineto::IActivityProfilerSession {
 public:
  explicit DeviceTraceSession(std::set<ActivityType> types) : types_(std::move(types)) {}

  ~DeviceTraceSession() override {
    if (status_ == libkineto::TraceStatus::RECORDING) driver::set_tracing(false);
  }

  void start() override {
    offset_ns_ = steady_to_unix_offset_ns();
    (void)driver::take_activities();  // records of an earlier trace that was never collected
    driver::set_tracing(true);
    status_ = libkineto::TraceStatus::RECORDING;
  }

  // torch's profiler synchronizes the current device (the device module's synchronize) before it
  // stops, so the work launched there inside the trace has run and been recorded by now. Work still
  // queued on another device is not in the trace unless the user synchronized it. (Not synchronized
  // here: a synchronize reports a failure of queued work once, and the user's next call must see it.)
  void stop() override {
    driver::set_tracing(false);
    records_ = driver::take_activities();
    status_ = libkineto::TraceStatus::PROCESSING;
  }

  std::vector<std::string> errors() override { return {}; }

  void processTrace(libkineto::ActivityLogger& logger) override {
    processTrace(logger, nullptr, 0, std::numeric_limits<int64_t>::max());
  }

  // Turns the driver's records into activities owned by buffer_ (Kineto's logger keeps pointers to
  // them; the buffer travels with the trace through getTraceBuffer), in time order per stream.
  void processTrace(libkineto::ActivityLogger& logger, libkineto::getLinkedActivityCallback linked_activity,
                    int64_t start_time, int64_t end_time) override {
    buffer_ = std::make_unique<libkineto::CpuTraceBuffer>();
    buffer_->span = libkineto::TraceSpan(start_time, end_time, "{{ cookiecutter.device }}");
    buffer_->gpuOpCount = 0;
    std::stable_sort(records_.begin(), records_.end(), [](const driver::Activity& a, const driver::Activity& b) {
      return a.start_ns < b.start_ns;
    });
    for (const driver::Activity& record : records_) {
      const ActivityType type = is_copy(record) ? ActivityType::GPU_MEMCPY : ActivityType::CONCURRENT_KERNEL;
      if (types_.count(type) == 0) continue;
      const int64_t start = record.start_ns + offset_ns_;
      const int64_t end = std::max(record.end_ns + offset_ns_, start);
      if (start < start_time || end > end_time) continue;  // ran (partly) outside the trace's window
      buffer_->emplace_activity(buffer_->span, type, record.name);
      libkineto::GenericTraceActivity& act = *buffer_->activities.back();
      act.device = record.device;    // the trace's "process" row: the device index
      act.resource = record.stream;  // its "thread" row: the stream
      act.startTime = start;
      act.endTime = end;
      act.id = static_cast<int32_t>(record.correlation);
      if (record.correlation != 0 && linked_activity) {
        act.linked = linked_activity(static_cast<int32_t>(record.correlation));  // the CPU op that launched it
      }
      streams_.emplace(record.device, record.stream);
      ++buffer_->gpuOpCount;
      logger.handleGenericActivity(act);
    }
    records_.clear();
    status_ = libkineto::TraceStatus::READY;
  }

  std::unique_ptr<libkineto::DeviceInfo> getDeviceInfo() override {
    if (streams_.empty()) return nullptr;
    const int64_t device = streams_.begin()->first;
    return std::make_unique<libkineto::DeviceInfo>(libkineto::DeviceInfo{
        device, device, "{{ cookiecutter.device }}", "{{ cookiecutter.device }}:" + std::to_string(device)});
  }

  std::vector<libkineto::ResourceInfo> getResourceInfos() override {
    std::vector<libkineto::ResourceInfo> out;
    for (const auto& [device, stream] : streams_) {
      out.push_back(libkineto::ResourceInfo{stream, stream, device, "stream " + std::to_string(stream)});
    }
    return out;
  }

  std::unique_ptr<libkineto::CpuTraceBuffer> getTraceBuffer() override { return std::move(buffer_); }

  void pushCorrelationId(uint64_t id) override { push_correlation(id); }
  void popCorrelationId() override { pop_correlation(); }
  void pushUserCorrelationId(uint64_t id) override { push_correlation(id); }
  void popUserCorrelationId() override { pop_correlation(); }

 private:
  std::set<ActivityType> types_;
  int64_t offset_ns_ = 0;
  std::vector<driver::Activity> records_;
  std::set<std::pair<int64_t, int64_t>> streams_;  // (device, stream) seen in the trace
  std::unique_ptr<libkineto::CpuTraceBuffer> buffer_;
};

class DeviceActivityProfiler final : public libkineto::IActivityProfiler {
 public:
  const std::string& name() const override { return name_; }
  const std::set<ActivityType>& availableActivities() const override { return device_activity_types(); }

  // A session only when the trace asks for something the device has (ProfilerActivity.PrivateUse1).
  std::unique_ptr<libkineto::IActivityProfilerSession> configure(const std::set<ActivityType>& activity_types,
                                                                 const libkineto::Config& /*config*/) override {
    std::set<ActivityType> wanted;
    for (ActivityType t : device_activity_types()) {
      if (activity_types.count(t) != 0) wanted.insert(t);
    }
    if (wanted.empty()) return nullptr;
    return std::make_unique<DeviceTraceSession>(std::move(wanted));
  }

  std::unique_ptr<libkineto::IActivityProfilerSession> configure(int64_t /*ts_ms*/, int64_t /*duration_ms*/,
                                                                 const std::set<ActivityType>& activity_types,
                                                                 const libkineto::Config& config) override {
    return configure(activity_types, config);
  }

 private:
  std::string name_ = "{{ cookiecutter.device }}";
};

// torch hands the factory to Kineto when a trace with ProfilerActivity.PrivateUse1 is prepared.
REGISTER_PRIVATEUSE1_PROFILER(DeviceActivityProfiler);

// ---------------------------------------------------------------------------------------------
// PrivateUse1 profiler stubs (the event-based fallback)

struct ProfilerEvent {
  void* event = nullptr;
  int device = 0;
};

class DeviceProfilerStubs final : public torch::profiler::impl::ProfilerStubs {
 public:
  // A timing event recorded on the current stream of the current device: complete when the
  // stream has run what was queued before it.
  void record(c10::DeviceIndex* device, torch::profiler::impl::ProfilerVoidEventStub* event,
              int64_t* cpu_ns) const override {
    const c10::DeviceIndex index = current_device();
    if (device != nullptr) *device = index;
    void* handle = nullptr;
    {{ cookiecutter.DEVICE }}_CHECK(driver::event_create(&handle, /*timing=*/true));
    *event = std::shared_ptr<void>(handle, [](void* e) { (void)driver::event_destroy(e); });
    if (cpu_ns != nullptr) *cpu_ns = c10::getTime();
    {{ cookiecutter.DEVICE }}_CHECK(driver::event_record(handle, index, current_stream_id(index)));
  }

  // Microseconds between two recorded events (waits for both).
  float elapsed(const torch::profiler::impl::ProfilerVoidEventStub* event,
                const torch::profiler::impl::ProfilerVoidEventStub* event2) const override {
    {{ cookiecutter.DEVICE }}_CHECK(driver::event_synchronize(event->get()));
    {{ cookiecutter.DEVICE }}_CHECK(driver::event_synchronize(event2->get()));
    float ms = 0;
    {{ cookiecutter.DEVICE }}_CHECK(driver::event_elapsed_ms(&ms, event->get(), event2->get()));
    return ms * 1000.0f;
  }

  // Markers and ranges go to an external tool on real hardware (NVTX's part on CUDA: the SDK's
  // tracing annotations). The {{ "emulator" if cookiecutter.driver == "emulator" else "minimal driver" }} has no such tool, so they mark nothing.
  void mark(const char* /*name*/) const override {}
  void rangePush(const char* /*name*/) const override {}
  void rangePop() const override {}

  bool enabled() const override { return true; }

  void onEachDevice(std::function<void(int)> op) const override {
    const c10::DeviceIndex previous = current_device();
    for (c10::DeviceIndex d = 0; d < device_count(); ++d) {
      set_device(d);
      op(d);
    }
    set_device(previous);
  }

  void synchronize() const override {
    for (c10::DeviceIndex d = 0; d < device_count(); ++d) {
      {{ cookiecutter.DEVICE }}_CHECK(driver::device_synchronize(d));
    }
  }
};

const bool stubs_registered = [] {
  static DeviceProfilerStubs stubs;
  torch::profiler::impl::registerPrivateUse1Methods(&stubs);
  return true;
}();

}  // namespace
}  // namespace {{ cookiecutter.device }}::runtime
