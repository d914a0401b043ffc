// Random number generation: per-device default generators and torch.Generator(device=...).
//
// The {{ "emulated" if cookiecutter.driver == "emulator" else "minimal driver's" }} device draws random numbers with the CPU's Philox/MT engine: a device generator is
// a CPUGeneratorImpl whose device and dispatch key say {{ cookiecutter.device }}. Seeding, get_state
// and set_state therefore behave like the CPU's. What a hardware team replaces: the engine, with
// its SDK's counter-based generator (keep seed/offset semantics so checkpoints stay portable).
#include "runtime/generator.h"

#include <ATen/CPUGeneratorImpl.h>

#include <mutex>
#include <vector>

#include "runtime/runtime.h"

namespace {{ cookiecutter.device }}::runtime {
namespace {

class DeviceGenerator final : public at::CPUGeneratorImpl {
 public:
  explicit DeviceGenerator(c10::DeviceIndex index, uint64_t seed = c10::default_rng_seed_val)
      : at::CPUGeneratorImpl(seed) {
    device_ = c10::Device(c10::DeviceType::PrivateUse1, index);
    key_set_ = c10::DispatchKeySet(c10::DispatchKey::PrivateUse1);
  }

 private:
  DeviceGenerator* clone_impl() const override {
    auto* gen = new DeviceGenerator(device_.index());
    gen->set_state(*get_state());
    return gen;
  }
};

}  // namespace

const at::Generator& default_generator(c10::DeviceIndex index) {
  static std::once_flag once;
  static std::vector<at::Generator>* gens = nullptr;  // leaked on purpose: used until exit
  std::call_once(once, [] {
    gens = new std::vector<at::Generator>();
    for (c10::DeviceIndex i = 0; i < device_count(); ++i) gens->push_back(at::make_generator<DeviceGenerator>(i));
  });
  if (index < 0) index = current_device();
  check_device(index);
  return (*gens)[index];
}

at::Generator new_generator(c10::DeviceIndex index) {
  if (index < 0) index = current_device();
  check_device(index);
  return at::make_generator<DeviceGenerator>(index);
}

// The state moves through GeneratorImpl (a TensorImpl), not at::Generator (an at::Tensor): the runtime
// files stay clear of ATen/core/Tensor.h (about a second more of compiling for the runtime unit).
// Lock order, everywhere: device generators (by address, when several), then the CPU's default one.
HostGeneratorScope::HostGeneratorScope(const std::optional<at::Generator>& gen, c10::Device device,
                                       bool caller_holds_lock)
    : device_(gen.has_value() && gen->defined() ? *gen : default_generator(device.index())),
      lock_(caller_holds_lock ? std::unique_lock<std::mutex>() : std::unique_lock<std::mutex>(device_.mutex())),
      host_(at::make_generator<at::CPUGeneratorImpl>()) {
  host_.unsafeGetGeneratorImpl()->set_state(*device_.unsafeGetGeneratorImpl()->get_state());
}

HostGeneratorScope::~HostGeneratorScope() {
  device_.unsafeGetGeneratorImpl()->set_state(*host_.unsafeGetGeneratorImpl()->get_state());
}  // then lock_ lets the next draw in

DefaultGeneratorScope::DefaultGeneratorScope(c10::Device device, bool caller_holds_lock)
    : device_(default_generator(device.index())),
      lock_(caller_holds_lock ? std::unique_lock<std::mutex>() : std::unique_lock<std::mutex>(device_.mutex())) {
  at::Generator cpu = at::detail::getDefaultCPUGenerator();
  std::lock_guard<std::mutex> cpu_lock(cpu.mutex());  // not held during the draw: the CPU kernel takes it
  cpu_saved_ = cpu.clone();
  cpu.unsafeGetGeneratorImpl()->set_state(*device_.unsafeGetGeneratorImpl()->get_state());
}

DefaultGeneratorScope::~DefaultGeneratorScope() {
  at::Generator cpu = at::detail::getDefaultCPUGenerator();
  std::lock_guard<std::mutex> cpu_lock(cpu.mutex());
  device_.unsafeGetGeneratorImpl()->set_state(*cpu.unsafeGetGeneratorImpl()->get_state());
  cpu.unsafeGetGeneratorImpl()->set_state(*cpu_saved_.unsafeGetGeneratorImpl()->get_state());
}

}  // namespace {{ cookiecutter.device }}::runtime
