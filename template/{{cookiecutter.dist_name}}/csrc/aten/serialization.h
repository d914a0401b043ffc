// Backend metadata carried through torch.save/torch.load (see serialization.cpp).
#pragma once

#include <ATen/core/Tensor.h>

namespace {{ cookiecutter.device }}::serialization {

// An example per-tensor attribute a backend keeps beside the data (e.g. a memory layout tag).
void set_layout_tag(const at::Tensor& t, bool tagged);
bool layout_tag(const at::Tensor& t);

}  // namespace {{ cookiecutter.device }}::serialization
