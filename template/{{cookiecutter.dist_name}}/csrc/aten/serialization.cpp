// Serialization hooks: what torch.save/torch.load keep of a {{ cookiecutter.device }} tensor beyond its data.
//
// A backend may hang its own metadata on a tensor (c10::BackendMeta) — a memory layout tag,
// say. The functions registered with torch::jit::TensorBackendMetaRegistry write it into the
// checkpoint and restore it on load. Here the metadata is one example flag, `layout_tag`, which
// Python reads and sets through two custom operators, torch.ops.{{ cookiecutter.package }}.layout_tag and
// .set_layout_tag (the way to give Python a C++ function that takes tensors without binding code).
// What a hardware team replaces: DeviceMeta's fields and the functions, with what its tensors carry.
#include "aten/serialization.h"

#include <torch/csrc/jit/serialization/pickler_helper.h>
#include <torch/library.h>

namespace {{ cookiecutter.device }}::serialization {
namespace {

constexpr const char* kTagKey = "{{ cookiecutter.device }}_layout_tag";

struct DeviceMeta final : c10::BackendMeta {
  bool layout_tag = false;
  c10::intrusive_ptr<c10::BackendMeta> clone(const c10::intrusive_ptr<c10::BackendMeta>&) const override {
    auto copy = c10::make_intrusive<DeviceMeta>();
    copy->layout_tag = layout_tag;
    return copy;
  }
};

DeviceMeta* meta_of(const at::Tensor& t) {
  return dynamic_cast<DeviceMeta*>(t.unsafeGetTensorImpl()->get_backend_meta());
}

// torch.save: record the metadata in the map the pickler stores beside the tensor.
void save_meta(const at::Tensor& t, std::unordered_map<std::string, bool>& m) {
  if (DeviceMeta* meta = meta_of(t)) m[kTagKey] = meta->layout_tag;
}

// torch.load: restore it.
void load_meta(const at::Tensor& t, std::unordered_map<std::string, bool>& m) {
  auto it = m.find(kTagKey);
  if (it != m.end()) set_layout_tag(t, it->second);
}

struct Registration {
  Registration() { torch::jit::TensorBackendMetaRegistry(c10::DeviceType::PrivateUse1, &save_meta, &load_meta); }
} registration;

}  // namespace

void set_layout_tag(const at::Tensor& t, bool tagged) {
  auto meta = c10::make_intrusive<DeviceMeta>();
  meta->layout_tag = tagged;
  t.unsafeGetTensorImpl()->set_backend_meta(meta);
}

bool layout_tag(const at::Tensor& t) {
  DeviceMeta* meta = meta_of(t);
  return meta != nullptr && meta->layout_tag;
}

}  // namespace {{ cookiecutter.device }}::serialization

// Custom operators in the backend's own namespace; registered for every dispatch key, so they also
// answer for CPU tensors (which never carry the tag).
TORCH_LIBRARY({{ cookiecutter.package }}, m) {
  m.def("set_layout_tag(Tensor self, bool tagged) -> ()", &{{ cookiecutter.device }}::serialization::set_layout_tag);
  m.def("layout_tag(Tensor self) -> bool", &{{ cookiecutter.device }}::serialization::layout_tag);
}
