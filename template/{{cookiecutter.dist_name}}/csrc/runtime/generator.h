// Random number generators of the {{ cookiecutter.device }} device (declarations; see generator.cpp).
#pragma once

#include <ATen/core/Generator.h>
#include <c10/core/Device.h>

#include <mutex>
#include <optional>

namespace {{ cookiecutter.device }}::runtime {

// The default generator of a device (torch.{{ cookiecutter.device }}.manual_seed seeds these).
const at::Generator& default_generator(c10::DeviceIndex index);
// A new generator for torch.Generator(device="{{ cookiecutter.device }}").
at::Generator new_generator(c10::DeviceIndex index);

// Lends a device generator's state to a CPU generator for the duration of a host-side kernel and
// takes the advanced state back afterwards, so device random streams stay reproducible. The device
// generator's lock is held for the whole scope — copy the state, draw, write it back — so two
// threads drawing from one generator draw in turn and never get the same numbers. A caller that
// lends several generators at once (the CPU fallback) locks them itself, in a fixed order, and
// passes caller_holds_lock.
class HostGeneratorScope {
 public:
  HostGeneratorScope(const std::optional<at::Generator>& gen, c10::Device device, bool caller_holds_lock = false);
  ~HostGeneratorScope();
  HostGeneratorScope(const HostGeneratorScope&) = delete;
  HostGeneratorScope& operator=(const HostGeneratorScope&) = delete;
  std::optional<at::Generator> host() const { return host_; }

 private:
  at::Generator device_;
  std::unique_lock<std::mutex> lock_;  // of device_, unless the caller holds it
  at::Generator host_;
};

// For a host-side kernel that draws from the CPU's default generator (a random operator run by the
// CPU fallback with no generator argument): the CPU's default generator holds the device's default
// state for the duration, the device generator takes the advanced state back, and the CPU's own
// state is restored. The device generator's lock is held throughout (as above). Another thread
// drawing CPU random numbers meanwhile would draw from the device's stream: the fallback is not
// meant for concurrent use with the CPU's generator.
class DefaultGeneratorScope {
 public:
  explicit DefaultGeneratorScope(c10::Device device, bool caller_holds_lock = false);
  ~DefaultGeneratorScope();
  DefaultGeneratorScope(const DefaultGeneratorScope&) = delete;
  DefaultGeneratorScope& operator=(const DefaultGeneratorScope&) = delete;

 private:
  at::Generator device_;
  std::unique_lock<std::mutex> lock_;  // of device_, unless the caller holds it
  at::Generator cpu_saved_;
};

}  // namespace {{ cookiecutter.device }}::runtime
