// Global CPU fallback: every ATen operator without a {{ cookiecutter.device }} kernel runs on the CPU,
// with PyTorch's semantics intact.
//
// How: the fallback stages the operator's device arguments in host memory and runs the CPU kernel
// on them. Staging is by storage, not by tensor: every device storage an argument uses is copied
// once (the byte range its tensors cover) and each argument becomes a host tensor with the same
// sizes, strides and storage offset into that copy. So views, non-contiguous and overlapping
// arguments, and arguments that alias each other reach the CPU kernel exactly as they are on the
// device. Afterwards every storage the kernel changed is copied back — whether or not the
// operator's schema marks the argument as written (native_batch_norm updates its running
// statistics without the mark: a storage no argument marks written is kept as staged and compared
// after the kernel) — and a geometry the kernel changed (an out= tensor it resized) is carried to
// the device tensor. An operator tagged `pointwise` computes each output element from its inputs'
// corresponding elements and writes nothing else (the tag's definition), so for it the fallback
// keeps no such copy and compares nothing: staging then copies only what the kernel reads and the
// results it writes (a 1M-float atan2: its two inputs in and its result out, not also two 4 MB
// snapshots and an 8 MB comparison). Results that alias an argument come back as that argument (or
// as a view of its device storage); new results are copied to the device with their strides. The
// whole call is one item on the current stream: it holds the stream (after the work queued there)
// from the first staging copy to the last copy back, so work launched meanwhile queues behind it.
//
// Views: an operator whose schema says a result aliases an input (`Tensor(a)`, no `!`) must come
// back as a view of the input's device storage. If its CPU kernel returned new memory instead, the
// device result would be a copy that writes do not reach the input through, so the fallback raises
// an error naming `backendgen add-op <op>` (a native view kernel) — unless
// {{ cookiecutter.DEVICE }}_FALLBACK_VIEW_COPIES=1 accepts the copy. A view through the fallback is
// correct but not free: each call copies the bytes its input reaches to the host and waits for the
// stream, where a native view kernel moves nothing (the fallback warning says so).
//
// Sparse tensors (COO and the compressed layouts): a sparse device argument reaches the CPU kernel
// as a CPU sparse tensor with copies of its indices and values, a sparse result comes back as a
// device sparse tensor, and a sparse argument the kernel changed is written back (sparse.cpp). The
// same function serves the SparsePrivateUse1 and SparseCsrPrivateUse1 fallbacks (sparse.cpp
// registers them), redispatching to the CPU's sparse kernels.
//
// Random operators draw from the device's generator, not the CPU's: a device torch.Generator passed
// to the operator is lent to the CPU kernel as a CPU generator with its state, and for operators
// tagged nondeterministic_seeded the CPU's default generator holds the device's default state for
// the duration (runtime/generator.h), so torch.{{ cookiecutter.device }}.manual_seed reproduces them.
//
// It counts calls and time per operator (torch.{{ cookiecutter.device }}.fallback_stats(); `backendgen profile`)
// and, with {{ cookiecutter.DEVICE }}_WARN_FALLBACK=1 or torch.{{ cookiecutter.device }}.set_fallback_warning(True), warns once
// per operator — the list of kernels worth writing next (`backendgen add-op <op>`).
//
// Nested tensors (nested.cpp registers this fallback for NestedTensorPrivateUse1 too): a nested
// device argument is staged by its whole buffer and stands as a CPU nested tensor with the same
// nested sizes, strides and offsets, and the operator then runs as NestedTensorCPU; a nested CPU
// result comes back as a nested device tensor — on the device buffer of the argument it is a view
// of, else on a buffer of its own.
//
// Quantized tensors (QuantizedPrivateUse1, registered below): their integer bytes are staged like a
// dense tensor's and keep their quantizer, so torch.quantize_per_tensor, q_scale, int_repr and
// dequantize on the device run PyTorch's QuantizedCPU kernels.
//
// What a hardware team replaces: nothing. All device memory traffic goes through driver::memcpy, so
// the fallback stays correct on real device memory; it shrinks in importance as kernels land.
#include "aten/fallback.h"

#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/core/ivalue.h>
#include <ATen/quantized/QTensorImpl.h>
#include <ATen/quantized/Quantizer.h>
#include <c10/core/CPUAllocator.h>
#include <torch/library.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <mutex>
#include <optional>
#include <unordered_map>
#include <unordered_set>

#include "aten/kernel_support.h"
#include "aten/nested.h"
#include "aten/sparse.h"
#include "runtime/generator.h"
#include "runtime/runtime.h"

namespace {{ cookiecutter.device }}::fallback {
namespace {

// ---- counters ----------------------------------------------------------------------------------

struct Counters {
  std::mutex mu;
  std::unordered_map<std::string, Stat> stats;
};

Counters& counters() {
  static Counters* c = new Counters();  // never destroyed: ops may run during interpreter exit
  return *c;
}

bool env_flag(const char* name) {
  const char* env = std::getenv(name);
  return env != nullptr && env[0] != '\0' && env[0] != '0';
}

// {{ cookiecutter.DEVICE }}_FALLBACK_VIEW_COPIES=1: a view operator whose CPU kernel returns new memory
// gives the device a copy instead of raising (read once, at the first such call).
bool view_copies_allowed() {
  static const bool allowed = env_flag("{{ cookiecutter.DEVICE }}_FALLBACK_VIEW_COPIES");
  return allowed;
}

// How to give operator `name` a native kernel: backendgen add-op writes kernels for ATen operators
// and the backend's own; another library's operator gets one through torch.library.
std::string remedy(const std::string& name) {
  if (name.rfind("aten::", 0) == 0 || name.rfind("{{ cookiecutter.device }}::", 0) == 0) return "backendgen add-op " + name;
  return "register a PrivateUse1 kernel for " + name + " with torch.library (backendgen add-op covers aten:: and {{ cookiecutter.device }}:: operators)";
}

// Whether a schema return aliases an argument without writing it: Tensor(a), Tensor(a)[].
bool returns_view(const c10::Argument& ret) {
  const c10::AliasInfo* info = ret.alias_info();
  if (info == nullptr) return false;
  if (!info->isWrite() && !info->beforeSets().empty()) return true;
  for (const c10::AliasInfo& inner : info->containedTypes()) {
    if (!inner.isWrite() && !inner.beforeSets().empty()) return true;
  }
  return false;
}

bool returns_view(const c10::FunctionSchema& schema) {
  for (const c10::Argument& ret : schema.returns()) {
    if (returns_view(ret)) return true;
  }
  return false;
}

std::atomic<bool>& warn_flag() {
  static std::atomic<bool> flag{env_flag("{{ cookiecutter.DEVICE }}_WARN_FALLBACK")};
  return flag;
}

// ---- staging -----------------------------------------------------------------------------------

bool on_device(const at::Tensor& t) { return t.defined() && t.device().type() == c10::DeviceType::PrivateUse1; }

// A tensor's storage; a nested tensor's is its buffer (Tensor::storage() is not for nested tensors).
const c10::Storage& storage_of(const at::Tensor& t) { return t.is_nested() ? nested::storage_of(t) : t.storage(); }

size_t offset_bytes(const at::Tensor& t) { return static_cast<size_t>(t.storage_offset()) * t.dtype().itemsize(); }

// One past the last byte `t` can reach in its storage (0 for an empty tensor).
size_t end_bytes(const at::Tensor& t) {
  if (t.numel() == 0) return 0;
  int64_t last = t.storage_offset();
  for (int64_t d = 0; d < t.dim(); ++d) last += (t.size(d) - 1) * t.stride(d);
  return static_cast<size_t>(last + 1) * t.dtype().itemsize();
}

// A device storage mirrored in host memory while the CPU kernel runs: host byte i is device byte lo + i.
struct StagedStorage {
  c10::Storage device;
  c10::Device where = c10::Device(c10::DeviceType::PrivateUse1);
  size_t lo = 0, hi = 0;  // the byte range of `device` the arguments reach
  bool declared_written = false;  // an argument on it is marked written (Tensor(a!)) in the schema
  c10::Storage host;
  std::vector<char> before;  // the host copy as staged, to find writes the schema does not declare
  bool snapshot = false;      // `before` was taken (not for a declared write, nor for a pointwise operator)
};

// A device tensor argument and the host tensor that stands for it.
struct StagedTensor {
  at::Tensor device;
  size_t storage;
  at::Tensor host;
};

// A sparse device argument and its CPU copy (sparse.cpp).
struct StagedSparse {
  at::Tensor device;
  bool declared_written = false;
  at::Tensor host;
  sparse::Snapshot before;
};

c10::Storage new_device_storage(size_t nbytes, c10::Device where) {
  c10::DeviceGuard guard(where);  // the allocator allocates on the current device
  return c10::Storage(c10::Storage::use_byte_size_t(), nbytes, runtime::device_allocator(), /*resizable=*/true);
}

// A tensor over `storage` (at dispatch key `key`: CPU or PrivateUse1) with the given geometry and
// `bits_from`'s conjugate and negative bits — and its quantizer, if it is quantized (a quantized
// tensor is its integer bytes plus the quantizer's scales and zero points, which live on the host).
at::Tensor tensor_on(c10::Storage storage, c10::DispatchKey key, caffe2::TypeMeta dtype, c10::IntArrayRef sizes,
                     c10::IntArrayRef strides, int64_t offset, const at::Tensor& bits_from) {
  at::Tensor t;
  if (bits_from.is_quantized()) {
    const c10::DispatchKey quantized =
        key == c10::DispatchKey::CPU ? c10::DispatchKey::QuantizedCPU : c10::DispatchKey::QuantizedPrivateUse1;
    t = at::detail::make_tensor<at::QTensorImpl>(std::move(storage), c10::DispatchKeySet(quantized), dtype,
                                                 at::get_qtensorimpl(bits_from)->quantizer());
  } else {
    t = at::detail::make_tensor<c10::TensorImpl>(std::move(storage), c10::DispatchKeySet(key), dtype);
  }
  t.unsafeGetTensorImpl()->set_sizes_and_strides(sizes, strides, offset);
  if (bits_from.is_conj()) t._set_conj(true);
  if (bits_from.is_neg()) t._set_neg(true);
  return t;
}

bool declares_write(const c10::Argument& arg) {
  const c10::AliasInfo* info = arg.alias_info();
  if (info == nullptr) return false;
  if (info->isWrite()) return true;
  for (const c10::AliasInfo& inner : info->containedTypes()) {  // Tensor(a!)[]
    if (inner.isWrite()) return true;
  }
  return false;
}

class Staging {
 public:
  Staging(const c10::OperatorHandle& op, torch::jit::Stack* stack, const std::string& name)
      : stack_(stack), op_name_(name), undeclared_writes_possible_(!op.hasTag(at::Tag::pointwise)) {
    const auto& args = op.schema().arguments();
    begin_ = stack->size() - args.size();
    for (size_t i = 0; i < args.size(); ++i) visit((*stack_)[begin_ + i], declares_write(args[i]), &Staging::note);
  }

  // Copies the storages noted to the host and puts host tensors on the stack in place of the device
  // arguments. Called while the current stream is held, so the copies see its queued work done.
  void copy_in() {
    copy_to_host();
    next_ = 0;
    const size_t n = stack_->size() - begin_;
    for (size_t i = 0; i < n; ++i) visit((*stack_)[begin_ + i], false, &Staging::substitute);
  }

  // The device the operator runs on: its first device tensor's, else a device argument's, else the current one.
  c10::Device device() const {
    if (first_device_.has_value()) return *first_device_;
    if (device_arg_.has_value()) return *device_arg_;
    return c10::Device(c10::DeviceType::PrivateUse1, runtime::current_device());
  }

  // After the CPU kernel: copy back every storage it changed, carry changed geometry to the device.
  void write_back();

  // A result of the CPU kernel as the device sees it. `view`: the schema says it aliases an argument.
  c10::IValue to_device(const c10::IValue& v, bool view);
  at::Tensor nested_to_device(const at::Tensor& h, bool view);

  // Whether an argument is a nested tensor: the CPU kernel to run is then NestedTensorCPU's.
  bool nested() const { return nested_; }

 private:
  using Visitor = at::Tensor (Staging::*)(const at::Tensor&, bool written);

  void visit(c10::IValue& v, bool written, Visitor fn) {
    if (v.isTensor()) {
      v = (this->*fn)(v.toTensor(), written);
    } else if (v.isTensorList()) {
      c10::List<at::Tensor> list = v.toTensorList();
      c10::List<at::Tensor> out;
      out.reserve(list.size());
      for (const at::Tensor& t : list) out.push_back((this->*fn)(t, written));
      v = std::move(out);
    } else if (v.isOptionalTensorList()) {
      c10::List<std::optional<at::Tensor>> list = v.toOptionalTensorList();
      c10::List<std::optional<at::Tensor>> out;
      out.reserve(list.size());
      for (const std::optional<at::Tensor>& t : list) {
        out.push_back(t.has_value() ? std::optional<at::Tensor>((this->*fn)(*t, written)) : std::nullopt);
      }
      v = std::move(out);
    } else if (v.isDevice() && v.toDevice().type() == c10::DeviceType::PrivateUse1) {
      if (fn == &Staging::note) {  // a factory operator's device= argument: the CPU kernel makes host results
        device_arg_ = v.toDevice();
        v = c10::IValue(c10::Device(c10::DeviceType::CPU));
      }
    } else if (v.isDevice() && v.toDevice().is_cpu() && fn == &Staging::note) {
      results_on_host_ = true;  // device=cpu (a quantized tensor's .cpu()): the results stay on the host
    }
  }

  // Pass 1: which device storages, and which byte range of each, the arguments reach.
  at::Tensor note(const at::Tensor& t, bool written) {
    if (t.defined() && t.is_nested()) nested_ = true;  // a host one too: the CPU kernel to run is the nested one
    if (!on_device(t)) return t;
    if (!first_device_.has_value()) first_device_ = t.device();
    if (sparse::is_sparse_layout(t)) {  // no storage of its own: staged whole, in pass 2
      // once per tensor: an argument passed twice (smm passes its result as sspaddmm's out= and
      // self) is one CPU tensor, so what the kernel does to one it does to the other
      auto [it, added] = sparse_index_.emplace(t.unsafeGetTensorImpl(), sparse_.size());
      if (added) sparse_.push_back(StagedSparse{t, false, at::Tensor(), {}});
      sparse_[it->second].declared_written |= written;
      return t;
    }
    const c10::Storage& storage = storage_of(t);
    const c10::StorageImpl* key = storage.unsafeGetStorageImpl();
    auto [it, added] = index_.emplace(key, storages_.size());
    if (added) {
      StagedStorage s;
      s.device = storage;
      s.where = t.device();
      s.lo = s.device.nbytes();
      storages_.push_back(std::move(s));
    }
    StagedStorage& s = storages_[it->second];
    if (t.is_nested()) {  // its components' offsets are into the whole buffer: stage all of it
      s.lo = 0;
      s.hi = std::max(s.hi, storage.nbytes());
    } else {
      s.lo = std::min(s.lo, offset_bytes(t));  // an empty tensor's offset may lie past the end
      s.hi = std::max(s.hi, end_bytes(t));
    }
    s.declared_written |= written;
    tensors_.push_back(StagedTensor{t, it->second, at::Tensor()});
    return t;
  }

  void copy_to_host() {
    for (StagedStorage& s : storages_) {
      s.lo -= s.lo % 16;  // host offsets stay whole elements for every dtype (itemsizes divide 16)
      s.hi = std::max(s.hi, s.lo);
      const size_t n = s.hi - s.lo;
      s.host = c10::Storage(c10::Storage::use_byte_size_t(), n, c10::GetCPUAllocator(), /*resizable=*/true);
      if (n > 0) {
        {{ cookiecutter.DEVICE }}_CHECK(driver::memcpy(s.host.mutable_data(), static_cast<const char*>(s.device.data()) + s.lo,
                                                       n, driver::CopyKind::device_to_host, s.where.index(),
                                                       runtime::current_stream_id(s.where.index())));
      }
      if (!s.declared_written && n > 0 && undeclared_writes_possible_) {
        const char* p = static_cast<const char*>(s.host.data());
        s.before.assign(p, p + n);
        s.snapshot = true;
      }
    }
  }

  // Pass 2: each device tensor argument becomes a host tensor on its storage's host copy.
  at::Tensor substitute(const at::Tensor& t, bool) {
    if (!on_device(t)) return t;
    if (sparse::is_sparse_layout(t)) {
      StagedSparse& ss = sparse_[sparse_index_.at(t.unsafeGetTensorImpl())];
      if (!ss.host.defined()) {
        ss.host = sparse::to_host(t);
        ss.before = sparse::snapshot(ss.host);
      }
      return ss.host;
    }
    StagedTensor& st = tensors_[next_++];
    const StagedStorage& s = storages_[st.storage];
    if (t.is_nested()) {  // staged from byte 0: the same offsets
      st.host = nested::over_storage(s.host, c10::DispatchKey::CPU, t);
      return st.host;
    }
    const int64_t offset = static_cast<int64_t>((offset_bytes(t) - s.lo) / t.dtype().itemsize());
    st.host = tensor_on(s.host, c10::DispatchKey::CPU, t.dtype(), t.sizes(), t.strides(), offset, t);
    return st.host;
  }

  torch::jit::Stack* stack_;
  const std::string& op_name_;
  const bool undeclared_writes_possible_;  // false for a pointwise operator: it writes only what its schema marks
  size_t begin_ = 0, next_ = 0;
  std::deque<StagedStorage> storages_;
  std::vector<StagedTensor> tensors_;
  std::vector<StagedSparse> sparse_;
  std::unordered_map<const c10::TensorImpl*, size_t> sparse_index_;
  std::optional<c10::Device> first_device_;
  std::unordered_map<const c10::StorageImpl*, size_t> index_;
  std::unordered_map<const c10::StorageImpl*, c10::Storage> new_results_;  // host storage -> its device copy
  std::optional<c10::Device> device_arg_;
  bool results_on_host_ = false;
  bool nested_ = false;

  // A new host storage (a new result's) copied to a device storage, once per storage.
  const c10::Storage& device_copy(const c10::Storage& host);
};

void Staging::write_back() {
  for (StagedStorage& s : storages_) {
    const c10::StorageImpl* host = s.host.unsafeGetStorageImpl();
    const size_t n = host->nbytes();
    const bool grown = n != s.hi - s.lo;  // the kernel resized an argument beyond the staged range
    const bool changed = s.declared_written || grown ||
                         (s.snapshot && std::memcmp(s.before.data(), host->data(), n) != 0);
    if (!changed || n == 0) continue;
    kernels::grow_storage(s.device, s.lo + n, s.where);
    {{ cookiecutter.DEVICE }}_CHECK(driver::memcpy(static_cast<char*>(s.device.mutable_data()) + s.lo, host->data(), n,
                                                   driver::CopyKind::host_to_device, s.where.index(),
                                                   runtime::current_stream_id(s.where.index())));
  }
  for (StagedTensor& st : tensors_) {
    const at::Tensor& h = st.host;
    if (h.is_nested()) continue;  // the buffer went back above; nested geometry lives in host metadata
    c10::TensorImpl* d = st.device.unsafeGetTensorImpl();
    const StagedStorage& s = storages_[st.storage];
    if (!h.storage().is_alias_of(s.host)) {  // the kernel gave the argument new memory (set_)
      c10::Storage fresh = new_device_storage(h.storage().nbytes(), st.device.device());
      if (h.storage().nbytes() > 0) {
        {{ cookiecutter.DEVICE }}_CHECK(driver::memcpy(fresh.mutable_data(), h.storage().data(), h.storage().nbytes(),
                                                       driver::CopyKind::host_to_device, st.device.device().index(),
                                                       runtime::current_stream_id(st.device.device().index())));
      }
      d->set_storage_keep_dtype(std::move(fresh));
      d->set_sizes_and_strides(h.sizes(), h.strides(), h.storage_offset());
      continue;
    }
    const int64_t offset = static_cast<int64_t>((offset_bytes(h) + s.lo) / h.dtype().itemsize());
    if (h.sizes() != st.device.sizes() || h.strides() != st.device.strides() || offset != st.device.storage_offset()) {
      d->set_sizes_and_strides(h.sizes(), h.strides(), offset);
    }
  }
  for (StagedSparse& ss : sparse_) {
    if (ss.declared_written || sparse::changed(ss.before, ss.host)) sparse::write_back(ss.device, ss.host);
  }
}

c10::IValue Staging::to_device(const c10::IValue& v, bool view) {
  auto one = [&](const at::Tensor& h) -> at::Tensor {
    if (!h.defined() || on_device(h)) return h;
    if (results_on_host_ && !view) return h;  // the operator was asked for host results
    if (h.is_nested()) return nested_to_device(h, view);
    if (sparse::is_sparse_layout(h)) {
      for (const StagedSparse& ss : sparse_) {
        if (ss.host.unsafeGetTensorImpl() == h.unsafeGetTensorImpl()) return ss.device;  // in-place, out=
      }
      TORCH_CHECK(!view || view_copies_allowed(), op_name_,
                  " returns a view of its input, but through the CPU fallback the {{ cookiecutter.device }} result "
                  "would be a copy of the sparse tensor, and writes through it would not reach the input. Give it a "
                  "native kernel at the SparsePrivateUse1 or SparseCsrPrivateUse1 key (csrc/aten/sparse.cpp), or set "
                  "{{ cookiecutter.DEVICE }}_FALLBACK_VIEW_COPIES=1 to accept a copy");
      return sparse::to_device(h, device());
    }
    TORCH_CHECK(h.layout() == c10::kStrided, "{{ cookiecutter.device }} supports strided and sparse tensors only, but the CPU kernel of ",
                op_name_, " returned a ", h.layout(), " tensor");
    for (const StagedTensor& st : tensors_) {
      if (st.host.unsafeGetTensorImpl() == h.unsafeGetTensorImpl()) return st.device;  // in-place, out=
    }
    for (const StagedStorage& s : storages_) {
      if (h.storage().is_alias_of(s.host)) {  // a view of an argument: the same view of its device storage
        const int64_t offset = static_cast<int64_t>((offset_bytes(h) + s.lo) / h.dtype().itemsize());
        return tensor_on(s.device, c10::DispatchKey::PrivateUse1, h.dtype(), h.sizes(), h.strides(), offset, h);
      }
    }
    // A view operator's result must be a view of an argument (see the top of this file).
    TORCH_CHECK(!view || view_copies_allowed(), op_name_,
                " returns a view of its input, but its CPU kernel returned new memory: through the CPU fallback the "
                "{{ cookiecutter.device }} result would be a copy, and writes through it would not reach the input. "
                "Give it a native view kernel: ", remedy(op_name_),
                " (or set {{ cookiecutter.DEVICE }}_FALLBACK_VIEW_COPIES=1 to accept a copy)");
    // A new result: copied to the device storage by storage, so strides and aliasing between results stay.
    return tensor_on(device_copy(h.storage()), c10::DispatchKey::PrivateUse1, h.dtype(), h.sizes(), h.strides(),
                     h.storage_offset(), h);
  };
  if (v.isTensor()) return one(v.toTensor());
  if (v.isTensorList()) {
    c10::List<at::Tensor> out;
    for (const at::Tensor& t : v.toTensorList()) out.push_back(one(t));
    return out;
  }
  return v;
}

const c10::Storage& Staging::device_copy(const c10::Storage& host) {
  auto it = new_results_.find(host.unsafeGetStorageImpl());
  if (it == new_results_.end()) {
    const size_t n = host.nbytes();
    c10::Storage fresh = new_device_storage(n, device());
    if (n > 0) {
      // an efficient zero tensor (autograd's zeros) has no memory: the device gets real zeros
      std::vector<char> zeros(host.data() == nullptr ? n : 0);
      const void* src = zeros.empty() ? host.data() : zeros.data();
      {{ cookiecutter.DEVICE }}_CHECK(driver::memcpy(fresh.mutable_data(), src, n, driver::CopyKind::host_to_device,
                                                     device().index(), runtime::current_stream_id(device().index())));
    }
    it = new_results_.emplace(host.unsafeGetStorageImpl(), std::move(fresh)).first;
  }
  return it->second;
}

at::Tensor Staging::nested_to_device(const at::Tensor& h, bool view) {
  for (const StagedTensor& st : tensors_) {
    if (st.host.unsafeGetTensorImpl() == h.unsafeGetTensorImpl()) return st.device;  // in-place
  }
  const c10::Storage& storage = nested::storage_of(h);
  for (const StagedStorage& s : storages_) {
    if (storage.is_alias_of(s.host)) {  // a view of an argument: the same view of its device buffer
      return nested::over_storage(s.device, c10::DispatchKey::PrivateUse1, h,
                                  static_cast<int64_t>(s.lo / h.dtype().itemsize()));
    }
  }
  TORCH_CHECK(!view || view_copies_allowed(), op_name_,
              " returns a view of its input, but its CPU kernel returned a nested tensor in new memory: give it a "
              "native view kernel: ", remedy(op_name_), " (or set {{ cookiecutter.DEVICE }}_FALLBACK_VIEW_COPIES=1 to accept a copy)");
  return nested::over_storage(device_copy(storage), c10::DispatchKey::PrivateUse1, h);
}

// Lends device generators to the CPU kernel (see the top of this file). Every device generator
// involved — each generator argument and, for a seeded operator, the device's default one — stays
// locked until the kernel's draws are written back; they are locked in one order (by address) so
// two threads lending overlapping sets cannot deadlock, and a generator that appears twice (the
// default generator passed explicitly) is locked once.
class Generators {
 public:
  Generators(const c10::OperatorHandle& op, torch::jit::Stack* stack, c10::Device device) {
    const size_t n = op.schema().arguments().size();
    const bool seeded = op.hasTag(at::Tag::nondeterministic_seeded);
    std::vector<at::Generator> involved;
    for (size_t i = stack->size() - n; i < stack->size(); ++i) {
      const c10::IValue& v = (*stack)[i];
      if (v.isGenerator() && v.toGenerator().device().type() == c10::DeviceType::PrivateUse1) {
        involved.push_back(v.toGenerator());
      }
    }
    if (involved.empty() && !seeded) return;
    if (seeded) involved.push_back(runtime::default_generator(device.index()));
    std::sort(involved.begin(), involved.end(), [](const at::Generator& a, const at::Generator& b) {
      return a.unsafeGetGeneratorImpl() < b.unsafeGetGeneratorImpl();
    });
    for (size_t i = 0; i < involved.size(); ++i) {
      if (i > 0 && involved[i].unsafeGetGeneratorImpl() == involved[i - 1].unsafeGetGeneratorImpl()) continue;
      locks_.emplace_back(involved[i].mutex());
    }
    for (size_t i = stack->size() - n; i < stack->size(); ++i) {
      c10::IValue& v = (*stack)[i];
      if (v.isGenerator() && v.toGenerator().device().type() == c10::DeviceType::PrivateUse1) {
        lent_.emplace_back(std::optional<at::Generator>(v.toGenerator()), device, /*caller_holds_lock=*/true);
        v = c10::IValue(*lent_.back().host());
      }
    }
    if (seeded) default_.emplace(device, /*caller_holds_lock=*/true);
  }

 private:
  std::vector<std::unique_lock<std::mutex>> locks_;  // released last, after the states are written back
  std::deque<runtime::HostGeneratorScope> lent_;
  std::optional<runtime::DefaultGeneratorScope> default_;
};

// Counts a call and, when the fallback warning is on, names the operator the first time it falls back.
void count_call(const std::string& name, const c10::FunctionSchema& schema) {
  bool first = false;
  {
    Counters& c = counters();
    std::lock_guard<std::mutex> lock(c.mu);
    first = c.stats[name].calls++ == 0;
  }
  if (first && warn_flag().load()) {
    if (returns_view(schema)) {
      TORCH_WARN(name, " has no {{ cookiecutter.device }} kernel and runs on the CPU: a view operator, so each call copies "
                 "the bytes its input reaches to the host and waits for the stream, where a native view kernel moves "
                 "nothing (add one: ", remedy(name), ")");
    } else {
      TORCH_WARN(name, " has no {{ cookiecutter.device }} kernel and runs on the CPU (add one: ", remedy(name), ")");
    }
  }
}

// Adds the time until the end of its scope to an operator's total.
struct Timed {
  const std::string& name;
  std::chrono::steady_clock::time_point start = std::chrono::steady_clock::now();
  ~Timed() {
    const auto ns = std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now() - start);
    Counters& c = counters();
    std::lock_guard<std::mutex> lock(c.mu);
    c.stats[name].nanos += ns.count();
  }
};

// PyTorch's device rules for arguments that mix the device and the CPU, checked before anything is
// staged (on the CPU side every argument is a CPU tensor, so the CPU kernel cannot check them):
//   - a pointwise operator (TensorIterator) takes CPU tensors beside device ones only as scalars
//     (0-dim), as on CUDA;
//   - indexing takes CPU indices for a device tensor, not device indices for a CPU tensor.
void check_mixed_devices(const c10::OperatorHandle& op, const torch::jit::Stack& stack) {
  const std::vector<c10::Argument>& args = op.schema().arguments();
  const size_t first = stack.size() - args.size();
  std::optional<c10::Device> device;
  bool cpu_tensor = false;
  auto visit = [&](const at::Tensor& t) {
    if (!t.defined()) return;
    if (t.device().type() == c10::DeviceType::PrivateUse1) {
      if (!device.has_value()) device = t.device();
    } else if (t.device().is_cpu() && t.dim() > 0) {
      cpu_tensor = true;
    }
  };
  for (size_t i = 0; i < args.size(); ++i) {
    const c10::IValue& v = stack[first + i];
    if (v.isTensor()) {
      visit(v.toTensor());
    } else if (v.isTensorList()) {
      for (const at::Tensor& t : v.toTensorList()) visit(t);
    } else if (v.isOptionalTensorList()) {
      for (const std::optional<at::Tensor>& t : v.toOptionalTensorList()) {
        if (t.has_value()) visit(*t);
      }
    }
  }
  if (!device.has_value() || !cpu_tensor) return;
  TORCH_CHECK(!op.hasTag(at::Tag::pointwise), "Expected all tensors to be on the same device, but found at least two ",
              "devices, ", *device, " and cpu!");
  static const std::unordered_set<std::string> indexing = {"aten::index", "aten::_unsafe_index", "aten::index_put",
                                                           "aten::index_put_", "aten::_index_put_impl_",
                                                           "aten::_unsafe_index_put"};
  const c10::IValue& self = stack[first];
  if (indexing.count(op.schema().name()) != 0 && self.isTensor() && self.toTensor().device().is_cpu()) {
    TORCH_CHECK(false, "indices should be either on cpu or on the same device as the indexed tensor (cpu)");
  }
}

}  // namespace

// The CPU fallback, redispatching to the CPU kernel at `cpu_keys` (CPU; SparseCPU or SparseCsrCPU
// for the sparse fallbacks of sparse.cpp).
void run_on_cpu_as(const c10::OperatorHandle& op, torch::jit::Stack* stack, c10::DispatchKeySet cpu_keys) {
  const std::string name = c10::toString(op.operator_name());
  const c10::FunctionSchema& schema = op.schema();
  const c10::DispatchKey cpu_key = cpu_keys.highestPriorityTypeId();
  TORCH_CHECK_NOT_IMPLEMENTED(cpu_key == c10::DispatchKey::CPU || op.hasComputedKernelForDispatchKey(cpu_key), name,
                              " has no {{ cookiecutter.device }} kernel for ",
                              cpu_key == c10::DispatchKey::SparseCPU      ? "sparse COO"
                              : cpu_key == c10::DispatchKey::QuantizedCPU ? "quantized"
                                                                          : "sparse compressed (CSR/CSC/BSR/BSC)",
                              " tensors, and the CPU fallback cannot run it: the CPU has no ", cpu_key,
                              " kernel for it either (PyTorch does not support this operator on this layout)");
  check_mixed_devices(op, *stack);
  count_call(name, schema);
  Timed timed{name};
  Staging staging(op, stack, name);  // which device storages the arguments reach; nothing copied yet
  const c10::Device device = staging.device();
  c10::DeviceGuard guard(device);
  // One item on the current stream: after the work queued there (held, the stream's queue waits
  // behind us), the staging copies, the CPU kernel and the copies back run as its next item.
  kernels::StreamScope on_stream(device, "cpu fallback");
  staging.copy_in();
  {
    Generators generators(op, stack, device);
    // a nested argument: the CPU kernel is NestedTensorCPU's (nested.cpp registers this fallback there too)
    op.redispatchBoxed(staging.nested() ? c10::DispatchKeySet(c10::DispatchKey::NestedTensorCPU) : cpu_keys, stack);
  }
  staging.write_back();
  const std::vector<c10::Argument>& returns = schema.returns();
  const size_t first = stack->size() - returns.size();
  for (size_t i = 0; i < returns.size(); ++i) {
    (*stack)[first + i] = staging.to_device((*stack)[first + i], returns_view(returns[i]));
  }
}

// The boxed fallback: registered for every operator below, and by name for the functional forms of
// structured operators (csrc/aten/ops/generated/registration.cpp).
void run_on_cpu(const c10::OperatorHandle& op, torch::jit::Stack* stack) {
  run_on_cpu_as(op, stack, c10::DispatchKeySet(c10::DispatchKey::CPU));
}

// Quantized tensors (QuantizedPrivateUse1): staged like dense ones, with their quantizer, and run by
// the QuantizedCPU kernel.
void run_quantized_on_cpu(const c10::OperatorHandle& op, torch::jit::Stack* stack) {
  run_on_cpu_as(op, stack, c10::DispatchKeySet(c10::DispatchKey::QuantizedCPU));
}

std::vector<std::pair<std::string, Stat>> stats() {
  Counters& c = counters();
  std::lock_guard<std::mutex> lock(c.mu);
  return {c.stats.begin(), c.stats.end()};
}

void reset_counts() {
  Counters& c = counters();
  std::lock_guard<std::mutex> lock(c.mu);
  c.stats.clear();
}

void set_warning(bool enabled) { warn_flag().store(enabled); }
bool warning_enabled() { return warn_flag().load(); }

}  // namespace {{ cookiecutter.device }}::fallback

TORCH_LIBRARY_IMPL(_, PrivateUse1, m) {
  m.fallback(torch::CppFunction::makeFromBoxedFunction<&{{ cookiecutter.device }}::fallback::run_on_cpu>());
}

TORCH_LIBRARY_IMPL(_, QuantizedPrivateUse1, m) {
  m.fallback(torch::CppFunction::makeFromBoxedFunction<&{{ cookiecutter.device }}::fallback::run_quantized_on_cpu>());
}

namespace {{ cookiecutter.device }}::fallback {
namespace {

// Operators with a QuantizedCPU kernel and a CompositeExplicitAutograd one (clone, empty_like in
// torch 2.13): a QuantizedPrivateUse1 tensor would take the composite, which makes its result
// with a plain empty() and so loses the quantizer ("cannot call qscheme on UnknownQuantizer" from a
// non-contiguous quantized tensor's ravel()). They go to the quantized fallback by name instead, so
// the QuantizedCPU kernel runs; found in the dispatcher when the library loads, views excepted (the
// composite keeps those metadata-only).
struct QuantizedComposites {
  QuantizedComposites() : library(torch::Library::IMPL, "aten", c10::DispatchKey::QuantizedPrivateUse1, __FILE__, __LINE__) {
    c10::Dispatcher& dispatcher = c10::Dispatcher::singleton();
    for (const c10::OperatorName& name : dispatcher.getAllOpNames()) {
      if (name.name.rfind("aten::", 0) != 0) continue;
      std::optional<c10::OperatorHandle> op = dispatcher.findOp(name);
      if (!op.has_value() || !op->hasKernelForDispatchKey(c10::DispatchKey::QuantizedCPU) ||
          !op->hasKernelForDispatchKey(c10::DispatchKey::CompositeExplicitAutograd) ||
          op->hasKernelForDispatchKey(c10::DispatchKey::QuantizedPrivateUse1)) {
        continue;
      }
      bool view = false;
      for (const c10::Argument& r : op->schema().returns()) view |= r.alias_info() != nullptr;
      if (view) continue;
      names.push_back(name.name.substr(6) + (name.overload_name.empty() ? "" : "." + name.overload_name));
      library.impl(names.back().c_str(), torch::CppFunction::makeFromBoxedFunction<&run_quantized_on_cpu>());
    }
  }
  torch::Library library;
  std::deque<std::string> names;
};
const QuantizedComposites quantized_composites;

}  // namespace
}  // namespace {{ cookiecutter.device }}::fallback
