// Random number generation: per-device default generators and torch.Generator(device=...).
//
// A device generator is counter-based (generator.h): its state is a seed and an offset, and each
// random kernel reserves one offset on the host when it launches, under the generator's lock. The
// queued work then draws with a CPU generator derived from (seed, offset) alone (`Draw::host`), so
// kernels run in any order, on any stream or thread, draw what the host's call order decided —
// as CUDA's Philox generator reserves (seed, offset) at launch. The {{ "emulated" if cookiecutter.driver == "emulator" else "minimal driver's" }} device draws with
// the CPU's Mersenne Twister engine. What a hardware team replaces: `Draw::host`, with its SDK's
// counter-based generator keyed by the same pair (keep seed/offset semantics so checkpoints and
// torch.utils.checkpoint's recompute stay portable).
#include "runtime/generator.h"

#include <ATen/CPUGeneratorImpl.h>
#include <ATen/core/MT19937RNGEngine.h>
#include <c10/core/CPUAllocator.h>
#include <c10/core/TensorImpl.h>

#include <cstring>
#include <mutex>
#include <vector>

#include "runtime/runtime.h"

namespace {{ cookiecutter.device }}::runtime {
namespace {

constexpr size_t kStateBytes = 16;  // seed, offset: little-endian uint64 each (CUDA's layout)

void put_u64(uint8_t* p, uint64_t v) {
  for (int i = 0; i < 8; ++i) p[i] = static_cast<uint8_t>(v >> (8 * i));
}
uint64_t get_u64(const uint8_t* p) {
  uint64_t v = 0;
  for (int i = 0; i < 8; ++i) v |= static_cast<uint64_t>(p[i]) << (8 * i);
  return v;
}

// SplitMix64's finaliser: a bijective 64-bit mix, the hash behind the derived engine states.
uint64_t mix(uint64_t z) {
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
  return z ^ (z >> 31);
}

class DeviceGenerator final : public c10::GeneratorImpl {
 public:
  explicit DeviceGenerator(c10::DeviceIndex index, uint64_t seed = c10::default_rng_seed_val)
      : c10::GeneratorImpl(c10::Device(c10::DeviceType::PrivateUse1, index),
                           c10::DispatchKeySet(c10::DispatchKey::PrivateUse1)),
        seed_(seed) {}

  void set_current_seed(uint64_t seed) override {
    seed_ = seed;
    offset_ = 0;
  }
  uint64_t current_seed() const override { return seed_; }
  uint64_t seed() override {
    set_current_seed(c10::detail::getNonDeterministicRandom());
    return seed_;
  }
  void set_offset(uint64_t offset) override { offset_ = offset; }
  uint64_t get_offset() const override { return offset_; }

  c10::intrusive_ptr<c10::TensorImpl> get_state() const override {
    // A CPU uint8 tensor built from c10 alone: the runtime files stay clear of ATen/core/Tensor.h.
    c10::Storage storage(c10::Storage::use_byte_size_t(), kStateBytes, c10::GetCPUAllocator(), /*resizable=*/true);
    auto state = c10::make_intrusive<c10::TensorImpl>(std::move(storage), c10::DispatchKeySet(c10::DispatchKey::CPU),
                                                      caffe2::TypeMeta::Make<uint8_t>());
    state->set_sizes_contiguous({static_cast<int64_t>(kStateBytes)});
    auto* bytes = static_cast<uint8_t*>(state->mutable_data());
    put_u64(bytes, seed_);
    put_u64(bytes + 8, offset_);
    return state;
  }
  void set_state(const c10::TensorImpl& state) override {
    TORCH_CHECK(state.device().is_cpu() && state.dtype() == caffe2::TypeMeta::Make<uint8_t>(),
                "RNG state must be a torch.ByteTensor (a CPU uint8 tensor)");
    TORCH_CHECK(state.numel() == static_cast<int64_t>(kStateBytes) && state.is_contiguous(),
                "{{ cookiecutter.device }} RNG state must be 16 contiguous bytes (seed, offset: little-endian uint64), got ",
                state.numel(), " elements");
    const auto* bytes = static_cast<const uint8_t*>(state.data());
    seed_ = get_u64(bytes);
    offset_ = get_u64(bytes + 8);
  }

  Draw take() {  // the caller holds mutex_
    return Draw{seed_, offset_++};
  }

 private:
  DeviceGenerator* clone_impl() const override {
    auto* gen = new DeviceGenerator(device_.index(), seed_);
    gen->offset_ = offset_;
    return gen;
  }

  uint64_t seed_;
  uint64_t offset_ = 0;
};

DeviceGenerator* device_impl(const at::Generator& gen) {
  TORCH_CHECK(gen.device().type() == c10::DeviceType::PrivateUse1,
              "Expected a '{{ cookiecutter.device }}' device type for generator but found '", gen.device().type(), "'");
  return static_cast<DeviceGenerator*>(gen.unsafeGetGeneratorImpl());
}

const at::Generator& generator_for(const std::optional<at::Generator>& gen, c10::Device device) {
  return gen.has_value() && gen->defined() ? *gen : default_generator(device.index());
}

Draw reserve_locked(const at::Generator& gen) {
  DeviceGenerator* impl = device_impl(gen);
  Draw captured;
  if (draw_in_capture(gen, &captured)) return captured;
  return impl->take();
}

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

at::Generator Draw::host() const {
  const uint64_t seed = graph != nullptr ? graph->seed.load() : this->seed;
  const uint64_t offset = graph != nullptr ? graph->base.load() + this->offset : this->offset;
  at::Generator gen = at::make_generator<at::CPUGeneratorImpl>(seed);
  if (offset == 0) return gen;
  // Mersenne Twister's whole 624-word state, hashed from (seed, offset, word index): a 64-bit seed
  // through init_with_uint32 would keep only 32 bits, and distinct offsets would soon collide.
  at::mt19937_data_pod pod{};
  const uint64_t key = mix(seed ^ mix(offset + 0x9e3779b97f4a7c15ULL));
  for (size_t i = 0; i < pod.state_.size(); i += 2) {
    const uint64_t word = mix(key + (i / 2 + 1) * 0x9e3779b97f4a7c15ULL);
    pod.state_[i] = static_cast<uint32_t>(word);
    if (i + 1 < pod.state_.size()) pod.state_[i + 1] = static_cast<uint32_t>(word >> 32);
  }
  pod.seed_ = seed;
  pod.seeded_ = true;
  pod.left_ = 1;  // the first draw generates the next block
  pod.next_ = 0;
  at::mt19937 engine;
  engine.set_data(pod);
  static_cast<at::CPUGeneratorImpl*>(gen.unsafeGetGeneratorImpl())->set_engine(engine);
  return gen;
}

Draw reserve(const std::optional<at::Generator>& gen, c10::Device device) {
  at::Generator g = generator_for(gen, device);
  std::lock_guard<std::mutex> lock(g.mutex());
  return reserve_locked(g);
}

// The state moves through GeneratorImpl (a TensorImpl), not at::Generator (an at::Tensor): the runtime
// files stay clear of ATen/core/Tensor.h (about a second more of compiling for the runtime unit).
HostGeneratorScope::HostGeneratorScope(const std::optional<at::Generator>& gen, c10::Device device,
                                       bool caller_holds_lock)
    : host_(caller_holds_lock ? reserve_locked(generator_for(gen, device)).host() : reserve(gen, device).host()) {}

DefaultGeneratorScope::DefaultGeneratorScope(c10::Device device, bool caller_holds_lock) {
  const at::Generator& dev = default_generator(device.index());
  const at::Generator host = (caller_holds_lock ? reserve_locked(dev) : reserve(std::nullopt, device)).host();
  at::Generator cpu = at::detail::getDefaultCPUGenerator();
  std::lock_guard<std::mutex> cpu_lock(cpu.mutex());  // not held during the draw: the CPU kernel takes it
  cpu_saved_ = cpu.clone();
  cpu.unsafeGetGeneratorImpl()->set_state(*host.unsafeGetGeneratorImpl()->get_state());
}

DefaultGeneratorScope::~DefaultGeneratorScope() {
  at::Generator cpu = at::detail::getDefaultCPUGenerator();
  std::lock_guard<std::mutex> cpu_lock(cpu.mutex());
  cpu.unsafeGetGeneratorImpl()->set_state(*cpu_saved_.unsafeGetGeneratorImpl()->get_state());
}

}  // namespace {{ cookiecutter.device }}::runtime
