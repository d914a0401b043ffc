// The CPU fallback's counters and warning switch (see fallback.cpp), for the Python module.
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

namespace {{ cookiecutter.device }}::fallback {

std::vector<std::pair<std::string, int64_t>> counts();
void reset_counts();
void set_warning(bool enabled);
bool warning_enabled();

}  // namespace {{ cookiecutter.device }}::fallback
