// Nested tensors on {{ cookiecutter.device }} (see nested.cpp): what the CPU fallback needs to stage them.
#pragma once

#include <ATen/core/Tensor.h>
#include <c10/core/DispatchKey.h>
#include <c10/core/Storage.h>

namespace {{ cookiecutter.device }}::nested {

// A nested tensor (strided NestedTensorImpl) over the whole of `storage` — host memory for
// `backend` CPU, device memory for PrivateUse1 — with `like`'s nested sizes and strides and its
// storage offsets moved by `shift` elements (where `like`'s storage starts `shift` elements into
// `storage`). No data moves: this is how a nested tensor crosses between host and device copies
// of its buffer.
at::Tensor over_storage(c10::Storage storage, c10::DispatchKey backend, const at::Tensor& like, int64_t shift = 0);

// The storage of nested tensor `t` (a nested tensor's storage is its buffer; Tensor::storage()
// is not for nested tensors).
const c10::Storage& storage_of(const at::Tensor& t);

}  // namespace {{ cookiecutter.device }}::nested
