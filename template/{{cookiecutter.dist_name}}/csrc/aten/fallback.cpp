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
// That is the synchronous call. A call whose results the host can decide from its meta kernel is
// a launch instead: the CPU kernel is queued on the stream and the host returns without waiting
// (see "queued calls" below for which calls, and how a meta kernel earns the trust).
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
#include <dlfcn.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <fstream>
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

  // A factory call: a device= argument names this device, and no argument reaches device memory,
  // so the CPU kernel reads nothing the stream's queued work may still write.
  bool factory() const {
    return device_arg_.has_value() && !first_device_.has_value() && storages_.empty() && tensors_.empty() &&
           sparse_.empty() && !nested_ && !results_on_host_;
  }

  // From now on, a new result reaches the device by a copy queued on the current stream (a launch,
  // holding the host result until it has run) instead of a copy the host waits for.
  void queue_result_copies() { queue_copies_ = true; }

  // Whether a result of the CPU kernel is (or is on the memory of) a staged argument.
  bool aliases_argument(const at::Tensor& h) const {
    if (!h.defined() || !h.has_storage()) return false;
    for (const StagedTensor& st : tensors_) {
      if (st.host.unsafeGetTensorImpl() == h.unsafeGetTensorImpl()) return true;
    }
    for (const StagedStorage& s : storages_) {
      if (h.storage().is_alias_of(s.host)) return true;
    }
    return false;
  }

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
  bool queue_copies_ = false;

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
    if (n > 0 && queue_copies_) {
      const at::Tensor bytes = tensor_on(fresh, c10::DispatchKey::PrivateUse1, caffe2::TypeMeta::Make<uint8_t>(),
                                         {static_cast<int64_t>(n)}, {1}, 0, at::Tensor());
      kernels::launch(device(), "cpu fallback: a new result to the device",
                      [host, to = kernels::held(bytes), n]() mutable {
                        void* dst = to.get().data_ptr();
                        if (host.data() == nullptr) {
                          std::memset(dst, 0, n);  // an efficient zero tensor has no memory
                        } else {
                          std::memcpy(dst, host.data(), n);
                        }
                      });
    } else if (n > 0) {
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

// Whether a call draws from a device generator: the operator is seeded (it draws from the device's
// default generator) or a device generator is among its arguments. Generators (below) lends them.
bool draws_from_device_generator(const c10::OperatorHandle& op, const torch::jit::Stack& stack) {
  if (op.hasTag(at::Tag::nondeterministic_seeded)) return true;
  const size_t n = op.schema().arguments().size();
  return std::any_of(stack.end() - static_cast<std::ptrdiff_t>(n), stack.end(), [](const c10::IValue& v) {
    return v.isGenerator() && v.toGenerator().device().type() == c10::DeviceType::PrivateUse1;
  });
}

// Lends device generators to the CPU kernel (see the top of this file). Every device generator
// involved — each generator argument and, for a seeded operator, the device's default one — stays
// locked until the kernel's draws are written back; they are locked in one order (by address) so
// two threads lending overlapping sets cannot deadlock, and a generator that appears twice (the
// default generator passed explicitly) is locked once.
class Generators {
 public:
  Generators(const c10::OperatorHandle& op, torch::jit::Stack* stack, c10::Device device) {
    if (!draws_from_device_generator(op, *stack)) return;
    const size_t n = op.schema().arguments().size();
    const bool seeded = op.hasTag(at::Tag::nondeterministic_seeded);
    std::vector<at::Generator> involved;
    for (size_t i = stack->size() - n; i < stack->size(); ++i) {
      const c10::IValue& v = (*stack)[i];
      if (v.isGenerator() && v.toGenerator().device().type() == c10::DeviceType::PrivateUse1) {
        involved.push_back(v.toGenerator());
      }
    }
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

// Which ATen operators ask for every tensor argument on one device: in native_functions.yaml, those
// without `device_check: NoCheck` (NoCheck: the kernel checks for itself, e.g. TensorIterator's CPU
// scalars, or indexing's CPU indices). PyTorch's generated CUDA wrappers check them before the
// kernel runs; a backend's boxed fallback must do it itself. Read once, at the first call that mixes
// devices, from the installed torch's own file: the torch wheel ships torchgen/packaged/ beside
// torch/ (found from where libc10 was loaded), so the table is always that torch's. Without the
// file (a torch installed without torchgen) the rules in check_mixed_devices below it still apply.
struct DeviceCheckTable {
  std::unordered_set<std::string> declared;  // every ATen operator, "name" or "name.overload"
  std::unordered_set<std::string> no_check;  // those declaring `device_check: NoCheck`
};

std::string parent_dir(const std::string& path) {
  const size_t slash = path.find_last_of('/');
  return slash == std::string::npos ? std::string(".") : path.substr(0, slash);
}

DeviceCheckTable read_device_check_table() {
  DeviceCheckTable table;
  Dl_info info;
  if (dladdr(reinterpret_cast<void*>(&c10::GetCPUAllocator), &info) == 0 || info.dli_fname == nullptr) return table;
  const std::string packages = parent_dir(parent_dir(parent_dir(info.dli_fname)));  // <packages>/torch/lib/libc10.so
  std::ifstream yaml(packages + "/torchgen/packaged/ATen/native/native_functions.yaml");
  std::string line, current;
  while (std::getline(yaml, line)) {
    if (line.rfind("- func: ", 0) == 0) {
      current = line.substr(8, line.find('(') - 8);
      table.declared.insert(current);
    } else if (!current.empty() && line.rfind("  device_check: NoCheck", 0) == 0) {
      table.no_check.insert(current);
    }
  }
  return table;
}

bool requires_one_device(const c10::OperatorHandle& op) {
  static const DeviceCheckTable table = read_device_check_table();
  const c10::OperatorName& name = op.operator_name();
  if (name.name.rfind("aten::", 0) != 0) return false;  // not ATen's: its kernels decide
  std::string key = name.name.substr(6);
  if (!name.overload_name.empty()) key += "." + name.overload_name;
  return table.declared.count(key) != 0 && table.no_check.count(key) == 0;
}

// PyTorch's device rules, checked before anything is staged (on the CPU side every argument is a
// CPU tensor, so the CPU kernel cannot check them):
//   - an operator that asks for one device (above) takes no tensor on another device, a CPU scalar
//     neither, as on CUDA (torch.cat([cpu, device]) raises);
//   - a pointwise operator (TensorIterator) takes CPU tensors beside device ones only as scalars
//     (0-dim), as on CUDA;
//   - indexing takes CPU indices for a device tensor, not device indices for a CPU tensor.
void check_one_device(const c10::OperatorHandle& op, const torch::jit::Stack& stack) {
  const std::vector<c10::Argument>& args = op.schema().arguments();
  const size_t first = stack.size() - args.size();
  std::optional<c10::Device> common;
  auto same = [&](const at::Tensor& t, const std::string& arg) {
    if (!t.defined()) return;
    if (!common.has_value()) {
      common = t.device();
      return;
    }
    TORCH_CHECK(t.device() == *common, "Expected all tensors to be on the same device, but got ", arg, " is on ",
                t.device(), ", different from other tensors on ", *common, " (when checking argument in method ",
                op.schema().name(), ")");
  };
  for (size_t i = 0; i < args.size(); ++i) {
    const c10::IValue& v = stack[first + i];
    if (v.isTensor()) {
      same(v.toTensor(), args[i].name());
    } else if (v.isTensorList()) {
      for (const at::Tensor& t : v.toTensorList()) same(t, args[i].name());
    } else if (v.isOptionalTensorList()) {
      for (const std::optional<at::Tensor>& t : v.toOptionalTensorList()) {
        if (t.has_value()) same(*t, args[i].name());
      }
    }
  }
}

void check_mixed_devices(const c10::OperatorHandle& op, const torch::jit::Stack& stack) {
  const std::vector<c10::Argument>& args = op.schema().arguments();
  const size_t first = stack.size() - args.size();
  std::optional<c10::Device> device;
  bool cpu_tensor = false, cpu_scalar = false, two_devices = false;
  auto visit = [&](const at::Tensor& t) {
    if (!t.defined()) return;
    if (t.device().type() == c10::DeviceType::PrivateUse1) {
      if (!device.has_value()) device = t.device();
      two_devices = two_devices || t.device() != *device;
    } else if (t.device().is_cpu()) {
      (t.dim() > 0 ? cpu_tensor : cpu_scalar) = true;
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
  if (device.has_value() && (cpu_tensor || cpu_scalar || two_devices) && requires_one_device(op)) {
    check_one_device(op, stack);
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


// ---- queued calls ------------------------------------------------------------------------------
// A call whose results the host can decide without the data is a launch, as a native kernel is
// (kernel_support.h): on the host, the operator runs on meta tensors (kernels::meta_like: PyTorch's
// own shape, dtype and overlap checks, with their messages), the new results are allocated on the
// device with the geometry the meta kernel gave them, and the CPU kernel is queued on the current
// stream, on host aliases of the arguments (kernels::held), its results copied into the outputs'.
// The host does not wait for the stream, so a model of many fallback operators fills the queue.
//
// What stays a synchronous call (above): operators the host must wait for or cannot stage — a
// result that is not a Tensor (item, equal), sizes that depend on the data (nonzero, unique,
// masked_select: tagged so, or no meta kernel, or one that raises), views, Tensor[] or optional
// results, a written Tensor[] or optional argument, an out= argument with elements the operator
// resizes (an empty out= is resized on the host to the meta kernel's geometry, and queued: every
// composite factory, `torch.eye` say, ends in an out= call on an empty tensor),
// random operators (they draw from the device's generator in call order), sparse, nested and
// quantized tensors, arguments on two devices, operators outside aten (their CPU kernel may be
// Python code, which queued work must not run), a meta pass that warns (the CPU kernel then warns
// as before) or that raises (the CPU kernel then raises its own error, as before) — and a call
// whose meta kernel is not yet known to agree with the CPU's.
// A factory operator (a device= argument, no device tensor: torch.tril_indices) reads no device
// memory: it runs on the host at once, and its results reach the device by copies queued on the stream.
//
// Trust: a meta kernel is PyTorch's statement of what the CPU kernel returns, but a few disagree
// (strides, mostly). So the first call of an operator for each kind of arguments (dtypes, ranks,
// memory layouts: `signature`) runs synchronously and compares its CPU results with what the meta
// kernel decided — sizes, dtypes, strides, no result on an argument's memory, no warning; only a
// kind that agreed is queued afterwards. Queued work checks the sizes and dtypes again and raises
// a clear error (at the next synchronize) if they differ; a stride difference it cannot raise for
// (the values are right) makes later calls of that kind synchronous.
// {{ cookiecutter.DEVICE }}_FALLBACK_SYNC=1 turns the queued path off.

bool queue_disabled() {
  static const bool disabled = env_flag("{{ cookiecutter.DEVICE }}_FALLBACK_SYNC");
  return disabled;
}

enum class ArgKind : uint8_t { other, tensor, optional_tensor, tensor_list, optional_tensor_list };

ArgKind kind_of(const c10::TypePtr& type) {
  if (type->kind() == c10::TypeKind::TensorType) return ArgKind::tensor;
  if (auto opt = type->cast<c10::OptionalType>()) {
    return opt->getElementType()->kind() == c10::TypeKind::TensorType ? ArgKind::optional_tensor : ArgKind::other;
  }
  if (auto list = type->cast<c10::ListType>()) {
    const c10::TypePtr& elem = list->getElementType();
    if (elem->kind() == c10::TypeKind::TensorType) return ArgKind::tensor_list;
    if (auto opt = elem->cast<c10::OptionalType>()) {
      if (opt->getElementType()->kind() == c10::TypeKind::TensorType) return ArgKind::optional_tensor_list;
    }
  }
  return ArgKind::other;
}

enum class Verdict : uint8_t { unknown, trusted, untrusted };

// Per operator: the name queued work runs under (the profiler's and errors') and the verdict on its
// meta kernel for each kind of arguments. Entries are never removed (names stay valid for queued work).
struct OpTrust {
  std::string name;   // the operator's, as the counters know it
  std::string label;  // what queued work runs under
  std::unordered_map<std::string, Verdict> verdicts;
  // Meta passes by exact call (`Plan::key`): empty until a call is seen a second time (a call made
  // once pays no meta pass: a Python meta kernel's first use imports much of torch), then the
  // results of a pass that could be queued — the next same call allocates from them without one.
  std::unordered_map<std::string, std::vector<at::Tensor>> metas;
};

struct TrustTable {
  std::mutex mu;
  std::unordered_map<std::string, OpTrust> ops;
};

TrustTable& trust_table() {
  static TrustTable* t = new TrustTable();  // never destroyed: queued work may outlive the interpreter's exit
  return *t;
}

// What a call would queue: decided from the schema and the arguments, before any meta pass.
struct Plan {
  c10::Device device = c10::Device(c10::DeviceType::PrivateUse1);
  size_t begin = 0, nargs = 0;
  std::vector<ArgKind> kinds;
  std::vector<size_t> written;  // arguments the schema marks written (plain Tensor(a!))
  std::vector<bool> written_out;  // per written argument: an out= argument (which the operator may resize)
  std::vector<int> ret_arg;     // per return: the written argument it is, or -1 (a new result)
  std::vector<const void*> storages;  // the arguments' storages, in order of first use (for `key`)
  std::string signature;  // the kind of call (dtypes, ranks, layouts): what a verdict is for
  std::string key;        // the exact call (geometry, sharing, argument values): what a meta pass is for
  OpTrust* trust = nullptr;
  Verdict verdict = Verdict::unknown;
  bool first_sight = true;                       // the exact call was not seen before: no meta pass
  // the same call's meta pass, if it was queued before: its results, then its written arguments
  std::optional<std::vector<at::Tensor>> cached;
};

template <typename T>
void put(std::string& key, const T& v) {
  key.append(reinterpret_cast<const char*>(&v), sizeof(T));
}

// A value queued work can keep as it is (no device, generator, storage, stream or object), added to the key.
bool plain_value(const c10::IValue& v, std::string& key) {
  if (v.isNone()) return key.push_back('N'), true;
  if (v.isInt()) return key.push_back('i'), put(key, v.toInt()), true;
  if (v.isDouble()) return key.push_back('d'), put(key, v.toDouble()), true;
  if (v.isBool()) return key.push_back('b'), put(key, v.toBool()), true;
  if (v.isComplexDouble()) return key.push_back('c'), put(key, v.toComplexDouble()), true;
  if (v.isString()) return key.push_back('s'), key.append(v.toStringRef()).push_back('\0'), true;
  key.push_back('l');
  if (v.isIntList()) {
    for (int64_t x : v.toIntList()) put(key, x);
    return put(key, v.toIntList().size()), true;
  }
  if (v.isDoubleList()) {
    for (double x : v.toDoubleList()) put(key, x);
    return put(key, v.toDoubleList().size()), true;
  }
  if (v.isBoolList()) {
    for (bool x : v.toBoolList()) put(key, x);
    return put(key, v.toBoolList().size()), true;
  }
  return false;
}

// Adds one tensor argument to the signature; false if the queued path cannot take it.
bool note_tensor(Plan& plan, const at::Tensor& t, std::optional<c10::Device>& device) {
  if (!t.defined()) {
    plan.signature.push_back('u');
    return true;
  }
  if (t.layout() != c10::kStrided || t.is_nested() || t.is_quantized()) return false;
  if (on_device(t)) {
    if (device.has_value() && *device != t.device()) return false;
    device = t.device();
  } else if (!t.is_cpu()) {
    return false;
  }
  uint8_t flags = on_device(t) ? 1 : 0;
  if (t.is_contiguous()) flags |= 2;
  if (t.dim() == 4 && t.is_contiguous(c10::MemoryFormat::ChannelsLast)) flags |= 4;
  if (t.dim() == 5 && t.is_contiguous(c10::MemoryFormat::ChannelsLast3d)) flags |= 4;
  if (t.is_non_overlapping_and_dense()) flags |= 8;
  if (t.numel() == 0) flags |= 16;
  if (t.is_conj() || t.is_neg()) flags |= 32;
  if (t.storage_offset() != 0) flags |= 64;
  plan.signature.push_back(static_cast<char>(flags));
  plan.signature.push_back(static_cast<char>(t.scalar_type()));
  plan.signature.push_back(static_cast<char>(std::min<int64_t>(t.dim(), 127)));
  // the exact call: geometry, and which arguments share memory (the meta pass's overlap checks)
  put(plan.key, flags);
  put(plan.key, t.scalar_type());
  put(plan.key, t.dim());
  for (int64_t x : t.sizes()) put(plan.key, x);
  for (int64_t x : t.strides()) put(plan.key, x);
  put(plan.key, t.storage_offset());
  const void* storage = t.has_storage() ? t.storage().unsafeGetStorageImpl() : nullptr;
  size_t id = 0;
  while (id < plan.storages.size() && plan.storages[id] != storage) ++id;
  if (id == plan.storages.size()) plan.storages.push_back(storage);
  put(plan.key, id);
  if (!on_device(t) && t.dim() == 0) {  // a CPU scalar goes to the meta kernel as it is: its value too
    const char* p = static_cast<const char*>(t.data_ptr());
    plan.key.append(p, t.dtype().itemsize());
  }
  return true;
}

// The plan for a call, or nothing if it must run synchronously whatever its meta kernel says.
std::optional<Plan> plan_call(const c10::OperatorHandle& op, const torch::jit::Stack& stack, const std::string& name,
                              c10::DispatchKey cpu_key) {
  if (cpu_key != c10::DispatchKey::CPU || queue_disabled() || name.rfind("aten::", 0) != 0) return std::nullopt;
  // the FFTs' meta kernels give some results strides pocketfft does not (fft.rfftn on int64)
  if (name.rfind("aten::_fft_", 0) == 0) return std::nullopt;
  if (op.hasTag(at::Tag::nondeterministic_seeded) || op.hasTag(at::Tag::dynamic_output_shape) ||
      op.hasTag(at::Tag::data_dependent_output) || op.hasTag(at::Tag::inplace_view)) {
    return std::nullopt;
  }
  const c10::FunctionSchema& schema = op.schema();
  if (schema.returns().empty() || schema.is_vararg() || schema.is_varret()) return std::nullopt;
  const auto& args = schema.arguments();
  Plan plan;
  plan.nargs = args.size();
  plan.begin = stack.size() - args.size();
  plan.kinds.reserve(args.size());
  plan.signature.reserve(16);
  std::optional<c10::Device> device;
  for (size_t i = 0; i < args.size(); ++i) {
    const ArgKind kind = kind_of(args[i].type());
    plan.kinds.push_back(kind);
    const c10::IValue& v = stack[plan.begin + i];
    if (declares_write(args[i])) {
      if (kind != ArgKind::tensor || !v.isTensor() || !on_device(v.toTensor())) return std::nullopt;
      plan.written.push_back(i);
      plan.written_out.push_back(args[i].is_out());
    }
    if (kind == ArgKind::other) {
      // non-tensor arguments belong to the kind of call too (batch norm's training flag, fft's dims)
      if (!plain_value(v, plan.signature)) return std::nullopt;
      plain_value(v, plan.key);
    } else if (v.isTensor()) {
      if (!note_tensor(plan, v.toTensor(), device)) return std::nullopt;
    } else if (v.isTensorList()) {
      for (const at::Tensor& t : v.toTensorList()) {
        if (!note_tensor(plan, t, device)) return std::nullopt;
      }
      plan.signature.push_back(']');
    } else if (v.isOptionalTensorList()) {
      for (const std::optional<at::Tensor>& t : v.toOptionalTensorList()) {
        if (!note_tensor(plan, t.has_value() ? *t : at::Tensor(), device)) return std::nullopt;
      }
      plan.signature.push_back(']');
    } else if (v.isNone()) {
      plan.signature.push_back('n');
    } else {
      return std::nullopt;
    }
  }
  if (!device.has_value()) return std::nullopt;  // no device tensor: a factory call (device=), or host results
  plan.device = *device;
  for (const c10::Argument& ret : schema.returns()) {
    if (ret.type()->kind() != c10::TypeKind::TensorType) return std::nullopt;
    const c10::AliasInfo* info = ret.alias_info();
    if (info == nullptr) {
      plan.ret_arg.push_back(-1);
      continue;
    }
    if (!info->isWrite()) return std::nullopt;  // a view
    int found = -1;
    for (size_t w : plan.written) {
      const c10::AliasInfo* arg_info = args[w].alias_info();
      if (arg_info->beforeSets() == info->beforeSets()) found = static_cast<int>(w);
    }
    if (found < 0) return std::nullopt;
    plan.ret_arg.push_back(found);
  }
  TrustTable& table = trust_table();
  std::lock_guard<std::mutex> lock(table.mu);
  auto it = table.ops.find(name);
  if (it == table.ops.end()) it = table.ops.emplace(name, OpTrust{name, name + " (cpu fallback)", {}}).first;
  plan.trust = &it->second;
  auto v = plan.trust->verdicts.find(plan.signature);
  plan.verdict = v == plan.trust->verdicts.end() ? Verdict::unknown : v->second;
  if (plan.verdict == Verdict::untrusted) return std::nullopt;
  auto m = plan.trust->metas.find(plan.key);
  if (m == plan.trust->metas.end()) {
    if (plan.trust->metas.size() >= 4096) plan.trust->metas.clear();  // bounded: a loop's calls come back
    plan.trust->metas.emplace(plan.key, std::vector<at::Tensor>());
  } else {
    plan.first_sight = false;
    if (!m->second.empty()) plan.cached = m->second;
  }
  return plan;
}

// A queueable meta pass's outcome, as queue_call takes it: the results, then the written arguments.
std::vector<at::Tensor> meta_outcome(const Plan& plan, const std::vector<at::Tensor>& results,
                                     const std::vector<c10::IValue>& args) {
  std::vector<at::Tensor> outcome = results;
  for (size_t w : plan.written) outcome.push_back(args[w].toTensor());
  return outcome;
}

// Keeps a queueable meta pass's outcome for the next same call.
void remember_meta(const Plan& plan, const std::vector<at::Tensor>& outcome) {
  TrustTable& table = trust_table();
  std::lock_guard<std::mutex> lock(table.mu);
  plan.trust->metas[plan.key] = outcome;
}

void set_verdict(OpTrust* trust, const std::string& signature, Verdict verdict) {
  TrustTable& table = trust_table();
  std::lock_guard<std::mutex> lock(table.mu);
  Verdict& v = trust->verdicts[signature];
  if (v != Verdict::untrusted) v = verdict;  // a disagreement seen once is final
}

// Collects warnings instead of showing them (the meta pass), or notes them and passes them on.
struct WarningWatch : c10::WarningHandler {
  explicit WarningWatch(bool forward) : previous(forward ? c10::WarningUtils::get_warning_handler() : nullptr) {}
  void process(const c10::Warning& warning) override {
    warned = true;
    if (previous != nullptr) previous->process(warning);
  }
  c10::WarningHandler* previous;
  bool warned = false;
};

// The operator run on meta copies of the call's arguments: the arguments as the meta kernel left
// them (a written one's new geometry) and its results.
struct MetaRun {
  std::vector<c10::IValue> args;
  std::vector<at::Tensor> results;
};

c10::IValue meta_value(const c10::IValue& v, ArgKind kind) {
  if (kind == ArgKind::other || v.isNone()) return v;
  if (v.isTensor()) return kernels::meta_like(v.toTensor());
  if (v.isTensorList()) {
    c10::List<at::Tensor> out;
    out.reserve(v.toTensorList().size());
    for (const at::Tensor& t : v.toTensorList()) out.push_back(kernels::meta_like(t));
    return out;
  }
  if (v.isOptionalTensorList()) {
    c10::List<std::optional<at::Tensor>> out;
    for (const std::optional<at::Tensor>& t : v.toOptionalTensorList()) out.push_back(kernels::meta_like(t));
    return out;
  }
  return v;
}

// Runs the meta pass; nothing if the operator has no meta kernel, or its meta kernel raised or
// warned (the CPU kernel then decides, synchronously, and raises or warns as it always has).
std::optional<MetaRun> run_meta(const c10::OperatorHandle& op, const torch::jit::Stack& stack, const Plan& plan) {
  MetaRun run;
  WarningWatch watch(/*forward=*/false);
  try {
    const bool has_meta = kernels::on_meta([&] {
      c10::WarningUtils::WarningHandlerGuard guard(&watch);
      torch::jit::Stack meta;
      meta.reserve(plan.nargs);
      for (size_t i = 0; i < plan.nargs; ++i) meta.push_back(meta_value(stack[plan.begin + i], plan.kinds[i]));
      run.args.assign(meta.begin(), meta.end());  // the same tensors: a resize the kernel does shows in them
      op.redispatchBoxed(c10::DispatchKeySet(c10::DispatchKey::Meta), &meta);
      for (const c10::IValue& r : meta) run.results.push_back(r.isTensor() ? r.toTensor() : at::Tensor());
    });
    if (!has_meta) return std::nullopt;
  } catch (const std::exception&) {
    return std::nullopt;
  }
  if (watch.warned || run.results.size() != plan.ret_arg.size()) return std::nullopt;
  return run;
}

bool meta_storage_of_argument(const MetaRun& meta, const at::Tensor& r) {
  auto same = [&](const at::Tensor& t) {
    return t.defined() && t.has_storage() && r.storage().is_alias_of(t.storage());
  };
  for (const c10::IValue& v : meta.args) {
    if (v.isTensor() && same(v.toTensor())) return true;
    if (v.isTensorList()) {
      for (const at::Tensor& t : v.toTensorList()) {
        if (same(t)) return true;
      }
    }
  }
  return false;
}

// Whether this call can be queued with the outputs the meta pass decided: every written argument
// keeps its geometry (or is an empty out= that grows), and every new result is new dense memory.
bool queueable(const torch::jit::Stack& stack, const Plan& plan, const MetaRun& meta) {
  for (size_t i = 0; i < plan.written.size(); ++i) {
    const at::Tensor& m = meta.args[plan.written[i]].toTensor();
    const at::Tensor& d = stack[plan.begin + plan.written[i]].toTensor();
    if (m.dtype() != d.dtype()) return false;
    if (!kernels::same_geometry(d, m) && !(plan.written_out[i] && kernels::grows_from_empty(d, m))) return false;
  }
  for (size_t r = 0; r < plan.ret_arg.size(); ++r) {
    const at::Tensor& m = meta.results[r];
    if (plan.ret_arg[r] >= 0) {
      if (!m.defined() || m.unsafeGetTensorImpl() != meta.args[plan.ret_arg[r]].toTensor().unsafeGetTensorImpl()) {
        return false;
      }
      continue;
    }
    if (!m.defined()) continue;  // an undefined result (an output_mask's false)
    if (!m.is_meta() || m.layout() != c10::kStrided || !m.is_non_overlapping_and_dense() ||
        meta_storage_of_argument(meta, m)) {
      return false;
    }
  }
  return true;
}

// Strides that locate elements (those of dimensions longer than 1) are equal.
bool same_layout(const at::Tensor& a, const at::Tensor& b) {
  if (a.sizes() != b.sizes() || a.dtype() != b.dtype()) return false;
  for (int64_t d = 0; d < a.dim(); ++d) {
    if (a.size(d) > 1 && a.stride(d) != b.stride(d)) return false;
  }
  return true;
}

// The CPU work of a queued call and what it needs when it runs.
struct QueuedCall {
  c10::OperatorHandle op;
  OpTrust* trust = nullptr;
  std::string signature;
  std::vector<c10::IValue> values;  // the arguments; tensors are taken from `held` when the work runs
  std::vector<ArgKind> kinds;
  std::vector<size_t> list_sizes;   // the length of each list argument, in order
  std::vector<kernels::Held> held;  // every tensor argument (undefined ones too), in order
  std::vector<size_t> written;
  std::vector<int> ret_arg;
  std::vector<kernels::Held> outputs;  // the device outputs of new results, in order
  std::vector<bool> output_defined;

  explicit QueuedCall(const c10::OperatorHandle& handle) : op(handle) {}

  at::Tensor next(size_t& h) {
    at::Tensor& t = held[h++].get();
    return t;
  }

  void run();
};

void QueuedCall::run() {
  const auto start = std::chrono::steady_clock::now();
  const std::string& label = trust->label;
  torch::jit::Stack stack;
  stack.reserve(values.size());
  size_t h = 0, l = 0;
  for (size_t i = 0; i < values.size(); ++i) {
    if (kinds[i] != ArgKind::other && values[i].isNone()) {
      stack.emplace_back();
      continue;
    }
    switch (kinds[i]) {
      case ArgKind::other:
        stack.push_back(values[i]);
        break;
      case ArgKind::tensor:
      case ArgKind::optional_tensor:
        stack.emplace_back(next(h));
        break;
      case ArgKind::tensor_list: {
        c10::List<at::Tensor> list;
        const size_t n = list_sizes[l++];
        list.reserve(n);
        for (size_t k = 0; k < n; ++k) list.push_back(next(h));
        stack.emplace_back(std::move(list));
        break;
      }
      case ArgKind::optional_tensor_list: {
        c10::List<std::optional<at::Tensor>> list;
        const size_t n = list_sizes[l++];
        for (size_t k = 0; k < n; ++k) {
          at::Tensor t = next(h);
          list.push_back(t.defined() ? std::optional<at::Tensor>(t) : std::nullopt);
        }
        stack.emplace_back(std::move(list));
        break;
      }
    }
  }
  // The written arguments' host aliases as they are before the kernel: it must write them in place.
  struct Before {
    at::Tensor alias;
    const void* data;
    c10::SmallVector<int64_t, 5> sizes, strides;
    int64_t offset;
  };
  std::vector<Before> before;
  for (size_t w : written) {
    const at::Tensor& a = stack[w].toTensor();
    before.push_back(Before{a, a.storage().data(), {a.sizes().begin(), a.sizes().end()},
                            {a.strides().begin(), a.strides().end()}, a.storage_offset()});
  }
  op.redispatchBoxed(c10::DispatchKeySet(c10::DispatchKey::CPU), &stack);
  for (const Before& b : before) {
    TORCH_CHECK(b.alias.storage().data() == b.data && b.alias.sizes() == c10::IntArrayRef(b.sizes) &&
                    b.alias.strides() == c10::IntArrayRef(b.strides) && b.alias.storage_offset() == b.offset,
                label, ": the CPU kernel resized an out= or in-place argument its meta kernel left as it was "
                "(the {{ cookiecutter.device }} tensor keeps its old size); set {{ cookiecutter.DEVICE }}_FALLBACK_SYNC=1 "
                "to run the CPU fallback synchronously, or give the operator a native kernel: ", remedy(op.schema().name()));
  }
  size_t o = 0;
  for (size_t r = 0; r < ret_arg.size(); ++r) {
    if (ret_arg[r] >= 0) continue;  // a written argument, written in place
    const bool defined = output_defined[r];
    kernels::Held& out_held = outputs[o++];
    if (!defined) continue;
    const at::Tensor& result = stack[r].toTensor();
    at::Tensor& out = out_held.get();
    if (!result.defined() || result.sizes() != out.sizes() || result.dtype() != out.dtype()) {
      set_verdict(trust, signature, Verdict::untrusted);
      TORCH_CHECK(false, label, ": the CPU kernel returned ",
                  result.defined() ? std::string(result.dtype().name()) + c10::str(result.sizes()) : "nothing",
                  " where its meta kernel promised ", out.dtype().name(), out.sizes(),
                  ": the {{ cookiecutter.device }} result is wrong. Later calls of this kind run synchronously; set "
                  "{{ cookiecutter.DEVICE }}_FALLBACK_SYNC=1 to run every fallback call so");
    }
    if (!same_layout(result, out)) set_verdict(trust, signature, Verdict::untrusted);
    kernels::copy_result(out, result);
  }
  stack.clear();
  const auto ns = std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now() - start);
  Counters& c = counters();
  std::lock_guard<std::mutex> lock(c.mu);
  c.stats[trust->name].nanos += ns.count();
}

// Queues the call (its meta pass decided the outputs: `meta`, as meta_outcome orders it) and
// leaves its results on the stack.
void queue_call(const c10::OperatorHandle& op, torch::jit::Stack* stack, const Plan& plan,
                const std::vector<at::Tensor>& meta) {
  // an empty out= the operator resizes (queueable): resized here, as the CPU kernel would, so the
  // queued kernel finds it the right size and the caller sees the size at once
  for (size_t i = 0; i < plan.written.size(); ++i) {
    at::Tensor out = (*stack)[plan.begin + plan.written[i]].toTensor();
    const at::Tensor& m = meta[plan.ret_arg.size() + i];
    if (!kernels::same_geometry(out, m)) kernels::take_geometry(out, m);
  }
  auto call = std::make_shared<QueuedCall>(op);
  call->trust = plan.trust;
  call->signature = plan.signature;
  call->kinds = plan.kinds;
  call->written = plan.written;
  call->ret_arg = plan.ret_arg;
  call->values.reserve(plan.nargs);
  for (size_t i = 0; i < plan.nargs; ++i) {
    const c10::IValue& v = (*stack)[plan.begin + i];
    if (plan.kinds[i] != ArgKind::other && v.isNone()) {
      call->values.emplace_back();
      continue;
    }
    switch (plan.kinds[i]) {
      case ArgKind::other:
        call->values.push_back(v);
        break;
      case ArgKind::tensor:
      case ArgKind::optional_tensor:
        call->values.emplace_back(true);
        call->held.emplace_back(v.toTensor());
        break;
      case ArgKind::tensor_list: {
        call->values.emplace_back(true);
        const c10::List<at::Tensor> list = v.toTensorList();
        call->list_sizes.push_back(list.size());
        for (const at::Tensor& t : list) call->held.emplace_back(t);
        break;
      }
      case ArgKind::optional_tensor_list: {
        call->values.emplace_back(true);
        const c10::List<std::optional<at::Tensor>> list = v.toOptionalTensorList();
        call->list_sizes.push_back(list.size());
        for (const std::optional<at::Tensor>& t : list) call->held.emplace_back(t.has_value() ? *t : at::Tensor());
        break;
      }
    }
  }
  std::vector<c10::IValue> results;
  results.reserve(plan.ret_arg.size());
  for (size_t r = 0; r < plan.ret_arg.size(); ++r) {
    if (plan.ret_arg[r] >= 0) {
      results.push_back((*stack)[plan.begin + plan.ret_arg[r]]);
      call->output_defined.push_back(true);
      continue;
    }
    const at::Tensor out = kernels::empty_like_meta(meta[r], plan.device);
    call->output_defined.push_back(out.defined());
    call->outputs.emplace_back(out);
    results.emplace_back(out);
  }
  // The work may run more than once (a graph replays it): what it made (host aliases) goes with it.
  kernels::launch(plan.device, plan.trust->label.c_str(), [call] { call->run(); });
  torch::jit::drop(*stack, plan.nargs);
  for (c10::IValue& r : results) stack->push_back(std::move(r));
}

// After a synchronous call made to judge the meta kernel: whether the CPU kernel's results (still
// on the host) and written arguments agree with the meta pass's.
bool agrees(const Staging& staging, const torch::jit::Stack& stack, const Plan& plan, const MetaRun& meta,
            const std::vector<at::Tensor>& written_hosts) {
  const size_t first = stack.size() - plan.ret_arg.size();
  for (size_t r = 0; r < plan.ret_arg.size(); ++r) {
    const c10::IValue& v = stack[first + r];
    const at::Tensor h = v.isTensor() ? v.toTensor() : at::Tensor();
    const at::Tensor& m = meta.results[r];
    if (h.defined() != m.defined()) return false;
    if (!h.defined()) continue;
    if (!h.is_cpu() || h.layout() != c10::kStrided || !same_layout(h, m)) return false;
    if (plan.ret_arg[r] < 0 && staging.aliases_argument(h)) return false;
  }
  for (size_t i = 0; i < plan.written.size(); ++i) {
    if (!same_layout(written_hosts[i], meta.args[plan.written[i]].toTensor())) return false;
  }
  return true;
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
  // A launch where the host can decide the results (see "queued calls" above).
  std::optional<Plan> plan = plan_call(op, *stack, name, cpu_key);
  std::optional<MetaRun> meta;
  if (plan.has_value() && plan->verdict == Verdict::trusted && plan->cached.has_value()) {
    queue_call(op, stack, *plan, *plan->cached);  // the same call was queued before: its meta pass holds
    return;
  }
  // During a graph capture nothing may wait for the stream: a call not yet judged is queued on its
  // meta kernel's word (queued work still checks the sizes and dtypes it gets). The capture that
  // counts is that of the device the call runs on, whatever the current device is.
  const bool capturing = plan.has_value() && runtime::capturing(plan->device.index());
  if (plan.has_value() && (!plan->first_sight || capturing)) meta = run_meta(op, *stack, *plan);
  if (meta.has_value() && (plan->verdict == Verdict::trusted || (capturing && plan->verdict == Verdict::unknown)) &&
      queueable(*stack, *plan, *meta)) {
    std::vector<at::Tensor> outcome = meta_outcome(*plan, meta->results, meta->args);
    remember_meta(*plan, outcome);
    queue_call(op, stack, *plan, outcome);
    return;
  }
  const bool judge = meta.has_value() && plan->verdict == Verdict::unknown;
  Staging staging(op, stack, name);  // which device storages the arguments reach; nothing copied yet
  const c10::Device device = staging.device();
  c10::DeviceGuard guard(device);
  if (staging.factory() && !judge && !draws_from_device_generator(op, *stack)) {
    // A factory (torch.tril_indices(..., device=)): its results depend on its arguments alone, so its
    // CPU kernel runs now, without waiting for the stream, and they reach the device by queued copies.
    op.redispatchBoxed(cpu_keys, stack);
    staging.queue_result_copies();
    const std::vector<c10::Argument>& returns = schema.returns();
    const size_t first = stack->size() - returns.size();
    for (size_t i = 0; i < returns.size(); ++i) {
      (*stack)[first + i] = staging.to_device((*stack)[first + i], returns_view(returns[i]));
    }
    return;
  }
  // One item on the current stream: after the work queued there (held, the stream's queue waits
  // behind us), the staging copies, the CPU kernel and the copies back run as its next item.
  kernels::StreamScope on_stream(device, "cpu fallback");
  staging.copy_in();
  std::vector<at::Tensor> written_hosts;  // when judging the meta kernel: the written arguments as staged
  if (judge) {
    for (size_t w : plan->written) written_hosts.push_back((*stack)[plan->begin + w].toTensor());
  }
  WarningWatch watch(/*forward=*/true);
  {
    std::optional<c10::WarningUtils::WarningHandlerGuard> watching;
    if (judge) watching.emplace(&watch);
    Generators generators(op, stack, device);
    // a nested argument: the CPU kernel is NestedTensorCPU's (nested.cpp registers this fallback there too)
    op.redispatchBoxed(staging.nested() ? c10::DispatchKeySet(c10::DispatchKey::NestedTensorCPU) : cpu_keys, stack);
  }
  if (judge) {
    // a kernel that warns stays synchronous: queued work could not show its warnings
    set_verdict(plan->trust, plan->signature,
                !watch.warned && agrees(staging, *stack, *plan, *meta, written_hosts) ? Verdict::trusted
                                                                                      : Verdict::untrusted);
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
