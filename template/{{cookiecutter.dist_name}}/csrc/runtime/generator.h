// Random number generators of the {{ cookiecutter.device }} device (declarations; see generator.cpp).
#pragma once

#include <ATen/core/Generator.h>
#include <c10/core/Device.h>

namespace {{ cookiecutter.device }}::runtime {

// The default generator of a device (torch.{{ cookiecutter.device }}.manual_seed seeds these).
const at::Generator& default_generator(c10::DeviceIndex index);
// A new generator for torch.Generator(device="{{ cookiecutter.device }}").
at::Generator new_generator(c10::DeviceIndex index);

// Lends a device generator's state to a CPU generator for the duration of a host-side kernel and
// takes the advanced state back afterwards, so device random streams stay reproducible.
class HostGeneratorScope {
 public:
  HostGeneratorScope(const std::optional<at::Generator>& gen, c10::Device device);
  ~HostGeneratorScope();
  HostGeneratorScope(const HostGeneratorScope&) = delete;
  HostGeneratorScope& operator=(const HostGeneratorScope&) = delete;
  std::optional<at::Generator> host() const { return host_; }

 private:
  at::Generator device_;
  at::Generator host_;
};

}  // namespace {{ cookiecutter.device }}::runtime
