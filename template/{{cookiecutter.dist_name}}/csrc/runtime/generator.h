// Random number generators of the {{ cookiecutter.device }} device (declarations; see generator.cpp).
#pragma once

#include <ATen/core/Generator.h>
#include <c10/core/Device.h>

#include <atomic>
#include <cstdint>
#include <memory>
#include <mutex>
#include <optional>

namespace {{ cookiecutter.device }}::runtime {

// The default generator of a device (torch.{{ cookiecutter.device }}.manual_seed seeds these).
const at::Generator& default_generator(c10::DeviceIndex index);
// A new generator for torch.Generator(device="{{ cookiecutter.device }}").
at::Generator new_generator(c10::DeviceIndex index);

// A device generator is counter-based, as CUDA's Philox one: its state is (seed, offset), and a
// random kernel reserves the next offset on the host when it launches. What the kernel draws is
// then fixed by the order of the host's calls — not by when the queued work runs, nor by which
// stream or thread it runs on — and two kernels never draw the same numbers. get_state/set_state
// carry the pair as 16 bytes (torch.uint8): the seed, then the offset, each a little-endian
// uint64 — CUDA's layout.
// A graph's draws (runtime/graphs.cpp): the seed and base offset its replay reserved from one
// generator, set in stream order as each replay starts.
struct GraphDraws {
  std::atomic<uint64_t> seed{0}, base{0};
};

struct Draw {
  uint64_t seed = 0;
  uint64_t offset = 0;
  // Captured in a graph: `offset` counts from the base each replay reserves (graph->base), and the
  // seed is the generator's at that replay — CUDA's graph-safe (seed, offset): every replay draws
  // fresh numbers, the ones eager calls would have drawn from the same state.
  std::shared_ptr<const GraphDraws> graph;
  // The CPU generator the kernel draws with, derived from (seed, offset) alone: offset 0 is the CPU
  // generator seeded with `seed` (the first draw after manual_seed(s) is the CPU's after
  // torch.manual_seed(s)); any other offset, an engine state hashed from the pair.
  at::Generator host() const;
};

// Reserves the next offset of `gen` (the device's default generator when `gen` is empty) for one
// kernel on `device`, under the generator's lock.
Draw reserve(const std::optional<at::Generator>& gen, c10::Device device);

// Graph capture (runtime/graphs.cpp): the draw of a kernel launched on a stream capturing a graph,
// relative to that graph's base for `gen` (the caller holds gen's lock); false outside a capture.
bool draw_in_capture(const at::Generator& gen, Draw* draw);

// For a random operator run on the calling thread (the CPU fallback): reserves one offset of a
// device generator and lends the CPU kernel the generator derived from it. A caller that lends
// several generators at once (the CPU fallback) locks them itself, in a fixed order, and passes
// caller_holds_lock.
class HostGeneratorScope {
 public:
  HostGeneratorScope(const std::optional<at::Generator>& gen, c10::Device device, bool caller_holds_lock = false);
  HostGeneratorScope(const HostGeneratorScope&) = delete;
  HostGeneratorScope& operator=(const HostGeneratorScope&) = delete;
  std::optional<at::Generator> host() const { return host_; }

 private:
  at::Generator host_;
};

// For a host-side kernel that draws from the CPU's default generator (a random operator run by the
// CPU fallback with no generator argument): reserves one offset of the device's default generator,
// the CPU's default generator holds the generator derived from it for the duration, and the CPU's
// own state is restored. Another thread drawing CPU random numbers meanwhile would draw from the
// device's stream: the fallback is not meant for concurrent use with the CPU's generator.
class DefaultGeneratorScope {
 public:
  explicit DefaultGeneratorScope(c10::Device device, bool caller_holds_lock = false);
  ~DefaultGeneratorScope();
  DefaultGeneratorScope(const DefaultGeneratorScope&) = delete;
  DefaultGeneratorScope& operator=(const DefaultGeneratorScope&) = delete;

 private:
  at::Generator cpu_saved_;
};

}  // namespace {{ cookiecutter.device }}::runtime
