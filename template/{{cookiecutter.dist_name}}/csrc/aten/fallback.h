// The CPU fallback's counters and warning switch (see fallback.cpp), for the Python module.
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

namespace {{ cookiecutter.device }}::fallback {

struct Stat {
  int64_t calls = 0;
  int64_t nanos = 0;  // wall time in the fallback: staging, the CPU kernel, copying back (queued work: its time on the stream)
};

std::vector<std::pair<std::string, Stat>> stats();
void reset_counts();
void set_warning(bool enabled);
bool warning_enabled();

}  // namespace {{ cookiecutter.device }}::fallback
