// Global CPU fallback: every ATen operator without a {{ cookiecutter.device }} kernel runs on the CPU.
//
// The boxed fallback copies the device inputs to the CPU, runs the CPU kernel and copies results
// back (at::native::cpu_fallback). It counts calls per operator (torch.{{ cookiecutter.device }}.fallback_counts())
// and, with {{ cookiecutter.DEVICE }}_WARN_FALLBACK=1 or torch.{{ cookiecutter.device }}.set_fallback_warning(True),
// warns once per operator, naming it — the list of kernels worth writing next
// (`backendgen add-op <op>`). What a hardware team replaces: nothing; it shrinks as kernels land.
#include "aten/fallback.h"

#include <ATen/native/CPUFallback.h>
#include <torch/library.h>

#include <atomic>
#include <cstdlib>
#include <mutex>
#include <unordered_map>

namespace {{ cookiecutter.device }}::fallback {
namespace {

struct Counters {
  std::mutex mu;
  std::unordered_map<std::string, int64_t> calls;
};

Counters& counters() {
  static Counters* c = new Counters();  // never destroyed: ops may run during interpreter exit
  return *c;
}

std::atomic<bool>& warn_flag() {
  static std::atomic<bool> flag{[] {
    const char* env = std::getenv("{{ cookiecutter.DEVICE }}_WARN_FALLBACK");
    return env != nullptr && env[0] != '\0' && env[0] != '0';
  }()};
  return flag;
}

void run_on_cpu(const c10::OperatorHandle& op, torch::jit::Stack* stack) {
  const std::string name = c10::toString(op.operator_name());
  bool first = false;
  {
    Counters& c = counters();
    std::lock_guard<std::mutex> lock(c.mu);
    first = c.calls[name]++ == 0;
  }
  if (first && warn_flag().load()) {
    TORCH_WARN(name, " has no {{ cookiecutter.device }} kernel and runs on the CPU (add one: backendgen add-op ", name, ")");
  }
  at::native::cpu_fallback(op, stack);
}

}  // namespace

std::vector<std::pair<std::string, int64_t>> counts() {
  Counters& c = counters();
  std::lock_guard<std::mutex> lock(c.mu);
  return {c.calls.begin(), c.calls.end()};
}

void reset_counts() {
  Counters& c = counters();
  std::lock_guard<std::mutex> lock(c.mu);
  c.calls.clear();
}

void set_warning(bool enabled) { warn_flag().store(enabled); }
bool warning_enabled() { return warn_flag().load(); }

}  // namespace {{ cookiecutter.device }}::fallback

TORCH_LIBRARY_IMPL(_, PrivateUse1, m) {
  m.fallback(torch::CppFunction::makeFromBoxedFunction<&{{ cookiecutter.device }}::fallback::run_on_cpu>());
}
