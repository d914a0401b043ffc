// Implementation of kernel_support.h: host views of {{ cookiecutter.device }} memory for kernels, device checks,
// output allocation and the launch. Everything here reaches the device through driver.h alone.
//
// How a kernel's host code sees device memory depends on the driver's optional capabilities
// (driver.h):
//   - host_mapping (the default driver has it): a host alias is a CPU tensor over the driver's host
//     address of the device bytes — no copy; queued work (host_tasks) runs on the stream's worker.
//   - no host_mapping (the minimal driver, a discrete chip): kernels are staged, as the CPU
//     fallback is. A kernel body runs on the calling thread, in order on its stream, inside a
//     staging scope (StreamScope, or launch's): the first host alias of a device storage in the
//     scope copies the storage to host memory with driver::memcpy, every alias of that storage in
//     the scope shares the copy, and when the scope ends each copy the body changed goes back with
//     driver::memcpy. Outside a scope a host alias carries geometry only (view kernels compute
//     views on it and never read it): its address is the device address, so a kernel that reads it
//     outside a scope crashes, as host code reading device memory does on a chip.
// So the same kernel files run on both drivers, and the staging is what a team's kernels drop as
// they become SDK launches on device pointers.
#include "aten/kernel_support.h"

#include <ATen/EmptyTensor.h>
#include <ATen/core/List.h>
#include <ATen/ops/copy_ops.h>
#include <ATen/ops/empty_ops.h>
#include <ATen/ops/empty_strided_ops.h>
#include <c10/core/CPUAllocator.h>

#include <algorithm>
#include <array>
#include <cstring>
#include <exception>
#include <unordered_map>
#include <vector>

#include "driver/driver.h"
#include "runtime/runtime.h"

namespace {{ cookiecutter.device }}::kernels {

bool host_mapped() {
  static const bool mapped = driver::has(driver::Capability::host_mapping);
  return mapped;
}

std::vector<int64_t> broadcast_shape(c10::IntArrayRef a, c10::IntArrayRef b) {
  const size_t dims = std::max(a.size(), b.size());
  std::vector<int64_t> shape(dims);
  for (size_t k = 0; k < dims; ++k) {  // k counts dimensions from the last
    const int64_t x = k < a.size() ? a[a.size() - 1 - k] : 1;
    const int64_t y = k < b.size() ? b[b.size() - 1 - k] : 1;
    TORCH_CHECK(x == y || x == 1 || y == 1, "The size of tensor a (", x, ") must match the size of tensor b (", y,
                ") at non-singleton dimension ", dims - 1 - k);
    shape[dims - 1 - k] = x == 1 ? y : x;
  }
  return shape;
}

namespace {
bool on_device(const at::Tensor& t) { return t.defined() && t.device().type() == c10::DeviceType::PrivateUse1; }

bool has_host_tasks() {
  static const bool tasks = driver::has(driver::Capability::host_tasks);
  return tasks;
}

}  // namespace

namespace detail {

// ---- staging (drivers without host_mapping) ------------------------------------------------------
// One scope per thread at a time (nested scopes join the outermost): the host copies of the device
// storages its body touched, by device address.
class Staging {
 public:
  Staging(int device, int64_t stream) : device_(device), stream_(stream) {}

  // The host copy of the `nbytes` of device memory at `memory` (made on first use in this scope).
  void* host_copy(const void* memory, size_t nbytes, const c10::Storage* keep) {
    auto it = copies_.find(memory);
    if (it != copies_.end() && it->second.nbytes >= nbytes) return it->second.host.data();
    Copy& c = copies_[memory];
    c.nbytes = nbytes;
    c.host.assign(nbytes, 0);
    if (keep != nullptr) c.storage = *keep;
    const int owner = driver::pointer_device(memory);
    c.where = owner >= 0 ? owner : device_;
    if (nbytes > 0) {
      {{ cookiecutter.DEVICE }}_CHECK(driver::memcpy(c.host.data(), memory, nbytes, driver::CopyKind::device_to_host, c.where,
                                                     stream_of(c.where)));
    }
    c.before = c.host;
    return c.host.data();
  }

  // Every copy the body changed goes back to its device memory (still the storage's: a storage
  // the body grew has new memory, and its old copy is dropped).
  void copy_back() {
    for (auto& [memory, c] : copies_) {
      if (c.nbytes == 0 || c.host == c.before) continue;
      if (c.storage.has_value() && c.storage->data() != memory) continue;
      {{ cookiecutter.DEVICE }}_CHECK(driver::memcpy(const_cast<void*>(memory), c.host.data(), c.nbytes,
                                                     driver::CopyKind::host_to_device, c.where, stream_of(c.where)));
    }
    copies_.clear();
  }

 private:
  struct Copy {
    size_t nbytes = 0;
    int where = 0;
    std::vector<char> host, before;
    std::optional<c10::Storage> storage;  // keeps a storage's memory while the scope uses it
  };
  int64_t stream_of(int where) const {
    return where == device_ ? stream_ : runtime::current_stream_id(static_cast<c10::DeviceIndex>(where));
  }
  int device_;
  int64_t stream_;
  std::unordered_map<const void*, Copy> copies_;
};

thread_local Staging* staging = nullptr;  // the calling thread's open scope, if any
thread_local int staging_depth = 0;

// Opens a staging scope on the calling thread (or joins the open one); the outermost copies back.
class StagingScope {
 public:
  StagingScope(int device, int64_t stream) {
    if (staging_depth++ == 0) {
      own_.emplace(device, stream);
      staging = &*own_;
    }
  }
  // Copies back unless the body threw (a failed kernel's outputs are undefined, as on a chip).
  void finish() {
    if (own_.has_value() && std::uncaught_exceptions() == 0) own_->copy_back();
  }
  ~StagingScope() {
    if (--staging_depth == 0) staging = nullptr;
  }
  StagingScope(const StagingScope&) = delete;
  StagingScope& operator=(const StagingScope&) = delete;

 private:
  std::optional<Staging> own_;
};

struct InPlace;
extern thread_local InPlace* in_place;  // the launch run in place on this thread (below)

}  // namespace detail

namespace {

using detail::staging;

// The host address of device memory for a host alias: the driver's mapping; without one, the
// open staging scope's copy; outside a scope, the device address itself (geometry only).
void* host_memory(const void* memory, size_t nbytes, const c10::Storage* keep) {
  if (memory == nullptr) return nullptr;
  if (host_mapped()) {
    void* host = driver::host_address(memory);
    TORCH_CHECK(host != nullptr, "{{ cookiecutter.device }}: a device tensor's storage is not device memory");
    return host;
  }
  if (staging != nullptr) return staging->host_copy(memory, nbytes, keep);
  return const_cast<void*>(memory);
}

// The host address of a device storage's bytes (see host_memory).
void* host_bytes(const c10::Storage& st) { return host_memory(st.data(), st.nbytes(), &st); }

// What a host alias is made of: the host address of a device storage's bytes and a tensor's
// geometry on them.
struct Geometry {
  void* host;
  size_t nbytes;
  c10::IntArrayRef sizes, strides;
  int64_t offset;
  caffe2::TypeMeta dtype;
  bool conj, neg;
};

Geometry geometry_of(const at::Tensor& t) {
  const c10::Storage& st = t.storage();
  return Geometry{host_bytes(st), st.nbytes(), t.sizes(), t.strides(), t.storage_offset(), t.dtype(), t.is_conj(),
                  t.is_neg()};
}

// A CPU tensor over the given memory, sharing nothing with the device tensor but the bytes.
at::Tensor make_alias(const Geometry& g) {
  // Non-owning: the device allocator frees the memory; resizable, so an out= kernel may grow it
  // (write_back notices and moves the result to device memory).
  c10::Storage host(c10::Storage::use_byte_size_t(), g.nbytes, c10::DataPtr(g.host, c10::Device(c10::DeviceType::CPU)),
                    c10::GetCPUAllocator(), /*resizable=*/true);
  auto h = at::detail::make_tensor<c10::TensorImpl>(std::move(host), c10::DispatchKeySet(c10::DispatchKey::CPU),
                                                    g.dtype);
  h.unsafeGetTensorImpl()->set_sizes_and_strides(g.sizes, g.strides, g.offset);
  if (g.conj) h._set_conj(true);
  if (g.neg) h._set_neg(true);
  return h;
}

// Creating and destroying a tensor costs about as much as adding 16 floats, and every kernel call
// makes one alias per tensor argument. So each thread keeps a few aliases and re-points one
// whose last user has let go: nothing but this pool holds it, its storage or a weak reference,
// and no kernel turned it into something else (autograd metadata, a Python object, a wrapped number).
constexpr size_t kPoolSize = 8;
thread_local std::array<at::Tensor, kPoolSize> alias_pool;

bool is_free(const at::Tensor& alias) {
  const c10::TensorImpl* impl = alias.unsafeGetTensorImpl();
  return alias.use_count() == 1 && alias.weak_use_count() == 1 && impl->storage().use_count() == 1 &&
         impl->autograd_meta() == nullptr && !impl->is_wrapped_number() && impl->pyobj_slot()->load_pyobj() == nullptr;
}

void repoint(const at::Tensor& alias, const Geometry& g) {
  c10::TensorImpl* impl = alias.unsafeGetTensorImpl();
  c10::StorageImpl* storage = impl->storage().unsafeGetStorageImpl();
  // Drops whatever the alias pointed at; if an out= kernel had grown it, that frees the CPU memory.
  storage->set_data_ptr_noswap(c10::DataPtr(g.host, c10::Device(c10::DeviceType::CPU)));
  storage->set_nbytes(g.nbytes);
  if (impl->dtype() != g.dtype) impl->set_storage_and_dtype(impl->storage(), g.dtype);
  impl->set_sizes_and_strides(g.sizes, g.strides, g.offset);
  impl->_set_conj(g.conj);
  impl->_set_neg(g.neg);
}

// Queued work gives its host aliases back to the pool of the thread that ran it as soon as it
// returns (AliasesBack), not when its closure is destroyed: that happens later, on the host thread
// that launched it (the driver hands finished closures back to it), which then freed the worker's
// tensors while the worker, its pool still lent out, made new ones — both threads in malloc's locks.
// Each entry: what holds an alias, and how it lets go (the same work may run again, a graph's
// replay, and makes its aliases anew).
thread_local std::vector<std::pair<void*, void (*)(void*)>> lent_aliases;
thread_local int lending = 0;

// Inside queued work only (a launch run in place keeps its aliases, to write them back): `let_go`
// gives back what `holder` holds when the work returns.
void lend(void* holder, void (*let_go)(void*)) {
  if (lending > 0 && detail::in_place == nullptr) lent_aliases.emplace_back(holder, let_go);
}

template <typename Holder>
void note_lent(Holder& holder) {
  lend(&holder, [](void* h) { *static_cast<Holder*>(h) = Holder(); });
}

// A host alias from this thread's pool (see above), or a new one when every slot is in use.
at::Tensor pooled_alias(const Geometry& g) {
  for (at::Tensor& slot : alias_pool) {
    if (!slot.defined()) {
      slot = make_alias(g);
      return slot;
    }
    if (is_free(slot)) {
      repoint(slot, g);
      return slot;
    }
  }
  return make_alias(g);  // more aliases alive than the pool holds
}

}  // namespace

at::Tensor host_alias(const at::Tensor& t) {
  if (!on_device(t)) return t;
  return pooled_alias(geometry_of(t));
}

at::Tensor borrowed(const at::Tensor& t) {
  const c10::Storage& st = t.storage();
  c10::Storage view(c10::Storage::use_byte_size_t(), st.nbytes(),
                    c10::DataPtr(const_cast<void*>(st.data()), c10::Device(c10::DeviceType::CPU)), nullptr,
                    /*resizable=*/false);
  auto b = at::detail::make_tensor<c10::TensorImpl>(std::move(view), c10::DispatchKeySet(c10::DispatchKey::CPU),
                                                    t.dtype());
  b.unsafeGetTensorImpl()->set_sizes_and_strides(t.sizes(), t.strides(), t.storage_offset());
  if (t.is_conj()) b._set_conj(true);
  if (t.is_neg()) b._set_neg(true);
  return b;
}

std::optional<at::Tensor> host_alias(const std::optional<at::Tensor>& t) {
  if (!t.has_value()) return t;
  return host_alias(*t);
}

std::vector<at::Tensor> host_alias(at::ITensorListRef ts) {
  std::vector<at::Tensor> out;
  out.reserve(ts.size());
  for (const at::Tensor& t : ts) out.push_back(host_alias(t));
  return out;
}

std::vector<at::Tensor> host_alias(at::TensorList ts) {
  std::vector<at::Tensor> out;
  out.reserve(ts.size());
  for (const at::Tensor& t : ts) out.push_back(host_alias(t));
  return out;
}

c10::List<std::optional<at::Tensor>> host_alias(const c10::List<std::optional<at::Tensor>>& ts) {
  c10::List<std::optional<at::Tensor>> out;
  out.reserve(ts.size());
  for (const std::optional<at::Tensor>& t : ts) out.push_back(host_alias(t));
  return out;
}

void write_back(const at::Tensor& device_out, const at::Tensor& host_out) {
  if (!on_device(device_out) || !host_out.defined()) return;
  c10::TensorImpl* d = device_out.unsafeGetTensorImpl();
  if (host_out.storage().data() == host_bytes(device_out.storage())) {
    if (host_out.sizes() != device_out.sizes() || host_out.strides() != device_out.strides() ||
        host_out.storage_offset() != device_out.storage_offset()) {
      d->set_sizes_and_strides(host_out.sizes(), host_out.strides(), host_out.storage_offset());
    }
    return;
  }
  // The CPU kernel reallocated the output (it was too small): grow the device storage, take the
  // result's geometry (an out= kernel may have given it strides, e.g. channels_last), copy in.
  const size_t itemsize = device_out.dtype().itemsize();
  const size_t needed =
      at::detail::computeStorageNbytes(host_out.sizes(), host_out.strides(), itemsize, device_out.storage_offset());
  grow_storage(device_out.storage(), needed, device_out.device());
  d->set_sizes_and_strides(host_out.sizes(), host_out.strides(), device_out.storage_offset());
  std::optional<StreamScope> staged;  // inside the kernel's scope already, as a rule
  if (!host_mapped() && detail::staging == nullptr) staged.emplace(device_out.device());
  at::Tensor alias = host_alias(device_out);
  at::_ops::copy_::call(alias, host_out, false);
}

at::Tensor to_device(const at::Tensor& host, c10::Device device) {
  if (!host.defined() || on_device(host)) return host;
  if (device.index() < 0) device = c10::Device(c10::DeviceType::PrivateUse1, runtime::current_device());
  const bool dense = host.is_non_overlapping_and_dense();
  at::Tensor out = dense ? at::_ops::empty_strided::call(host.sym_sizes(), host.sym_strides(), host.scalar_type(),
                                                         std::nullopt, device, std::nullopt)
                         : at::_ops::empty_memory_format::call(host.sym_sizes(), host.scalar_type(), std::nullopt,
                                                               device, std::nullopt, std::nullopt);
  if (dense) {
    {{ cookiecutter.DEVICE }}_CHECK(driver::memcpy(out.data_ptr(), host.data_ptr(), host.nbytes(),
                                                   driver::CopyKind::host_to_device, device.index(),
                                                   runtime::current_stream_id(device.index())));
  } else {
    std::optional<StreamScope> staged;  // without host mapping, the alias's bytes live in a scope
    if (!host_mapped()) staged.emplace(device);
    at::Tensor alias = host_alias(out);
    at::_ops::copy_::call(alias, host, false);
  }
  return out;
}

c10::Device device_of(const at::Tensor& t) {
  if (on_device(t)) return t.device();
  return c10::Device(c10::DeviceType::PrivateUse1, runtime::current_device());
}

namespace detail {

void check_device(std::optional<c10::Device>& common, const at::Tensor& t, CpuArgs cpu, const char* op) {
  if (!t.defined()) return;
  if (!on_device(t)) {
    if (cpu == CpuArgs::allowed || (cpu == CpuArgs::scalars && t.device().is_cpu() && t.dim() == 0)) return;
    TORCH_CHECK(false, op, ": expected all tensors on the same {{ cookiecutter.device }} device, but found one on ", t.device());
  }
  if (!common.has_value()) {
    common = t.device();
  } else {
    TORCH_CHECK(*common == t.device(), op, ": expected all tensors on the same device, but found ", *common, " and ",
                t.device());
  }
}

void check_device(std::optional<c10::Device>& common, const std::optional<at::Tensor>& t, CpuArgs cpu, const char* op) {
  if (t.has_value()) check_device(common, *t, cpu, op);
}

void check_device(std::optional<c10::Device>& common, at::ITensorListRef ts, CpuArgs cpu, const char* op) {
  for (const at::Tensor& t : ts) check_device(common, t, cpu, op);
}

void check_device(std::optional<c10::Device>& common, at::TensorList ts, CpuArgs cpu, const char* op) {
  for (const at::Tensor& t : ts) check_device(common, t, cpu, op);
}

void check_device(std::optional<c10::Device>& common, const c10::List<std::optional<at::Tensor>>& ts, CpuArgs cpu,
                  const char* op) {
  for (const std::optional<at::Tensor>& t : ts) check_device(common, t, cpu, op);
}

c10::Device current() { return c10::Device(c10::DeviceType::PrivateUse1, runtime::current_device()); }

}  // namespace detail

StreamScope::StreamScope(c10::Device device, const char* name)
    : device_(device.index() >= 0 ? device.index() : runtime::current_device()),
      stream_(runtime::current_stream_id(static_cast<c10::DeviceIndex>(device_))),
      name_(name) {
  const driver::Status status =
      has_host_tasks() ? driver::hold_stream(device_, stream_) : driver::stream_synchronize(device_, stream_);
  // names the call: during a graph capture, the one that cannot be captured
  if (status != driver::Status::ok) {
    {{ cookiecutter.DEVICE }}_DRIVER_ERROR(status, "{{ cookiecutter.device }}: ", name_ != nullptr ? name_ : "a call on the stream",
                                           " waits for its stream, and the driver refused: ", driver::status_string(status));
  }
  if (!host_mapped()) staging_ = std::make_unique<detail::StagingScope>(device_, stream_);
}

StreamScope::~StreamScope() noexcept(false) {
  std::exception_ptr failed;
  if (staging_ != nullptr) {
    try {
      staging_->finish();
    } catch (...) {
      failed = std::current_exception();
    }
    staging_.reset();
  }
  if (has_host_tasks()) driver::release_stream(device_, stream_, name_);
  if (failed) std::rethrow_exception(failed);
}

namespace detail {
// The launch run in place on this thread, if any: what its work's `held` arguments report to.
struct InPlace {
  std::vector<Held*> held;
  std::vector<HeldList*> lists;
};
thread_local InPlace* in_place = nullptr;
}  // namespace detail

namespace {
// Work queued, or run by a launch, is not part of a run in place that launched it.
struct NotInPlace {
  detail::InPlace* saved = detail::in_place;
  NotInPlace() { detail::in_place = nullptr; }
  ~NotInPlace() { detail::in_place = saved; }
};
}  // namespace

namespace detail {

AliasesBack::AliasesBack() : first_(lent_aliases.size()) { ++lending; }

AliasesBack::~AliasesBack() {
  for (size_t i = first_; i < lent_aliases.size(); ++i) lent_aliases[i].second(lent_aliases[i].first);
  lent_aliases.resize(first_);
  --lending;
}

void AliasesBack::check() {
  for (size_t i = first_; i < lent_aliases.size(); ++i) {
    if (lent_aliases[i].second == &Held::let_go) static_cast<Held*>(lent_aliases[i].first)->carry_back();
  }
}

void launch_wrapped(c10::Device device, const char* name, std::function<void()> work) {
  const int index = device.index() >= 0 ? device.index() : runtime::current_device();
  const int64_t stream = runtime::current_stream_id(static_cast<c10::DeviceIndex>(index));
  NotInPlace not_in_place;
  if (host_mapped() && has_host_tasks()) {
    {{ cookiecutter.DEVICE }}_CHECK(driver::launch_host(index, stream, name, std::move(work)));
    return;
  }
  // No host code on the stream, or no host address for device memory: the work runs now, on this
  // thread, in stream order (and staged, without host_mapping).
  StreamScope on_stream(c10::Device(c10::DeviceType::PrivateUse1, static_cast<c10::DeviceIndex>(index)), name);
  work();
}

namespace {
thread_local std::vector<std::unique_ptr<InPlace>> in_place_free;  // reused: a run in place allocates nothing
}  // namespace

RunInPlace::RunInPlace(c10::Device device, const char* name) : scope_(device, name) {
  std::unique_ptr<InPlace> state;
  if (in_place_free.empty()) {
    state = std::make_unique<InPlace>();
  } else {
    state = std::move(in_place_free.back());
    in_place_free.pop_back();
  }
  saved_ = in_place;
  in_place = state.release();
}

RunInPlace::~RunInPlace() {
  std::unique_ptr<InPlace> state(in_place);
  in_place = saved_;
  state->held.clear();
  state->lists.clear();
  in_place_free.push_back(std::move(state));
}

void RunInPlace::finish() {
  InPlace* state = in_place;
  const c10::Device device = current();
  for (Held* h : state->held) {
    if (h->device_) {
      write_back(*h->source_, h->tensor_);  // new sizes, or a storage the CPU kernel reallocated
    } else if (!h->source_->defined() && h->tensor_.defined()) {
      *h->source_ = to_device(h->tensor_, device);  // a result nothing was allocated for
    }
  }
  for (HeldList* l : state->lists) {
    if (l->results_ == nullptr || !l->results_->empty()) continue;
    l->results_->reserve(l->values_.size());
    for (const at::Tensor& r : l->values_) l->results_->push_back(to_device(r, device));
  }
}

}  // namespace detail

namespace {
// The meta storages of one pre-pass, by the storage of the tensor each stands for: arguments that
// share memory share a meta storage, so the operator's overlap checks (an out= that overlaps an
// input, an output with internal overlap) run on the host in the pre-pass, as on CUDA, instead of
// failing later in the queued work. on_meta forgets them when the pre-pass ends.
thread_local std::vector<std::pair<const c10::StorageImpl*, c10::Storage>> meta_storages;

c10::Storage meta_storage_for(const at::Tensor& t) {
  const c10::Device meta(c10::DeviceType::Meta);
  const c10::StorageImpl* key = t.has_storage() ? t.storage().unsafeGetStorageImpl() : nullptr;
  if (key != nullptr) {
    for (const auto& [impl, storage] : meta_storages) {
      if (impl == key) return storage;
    }
  }
  c10::Storage storage(c10::Storage::use_byte_size_t(), t.has_storage() ? t.storage().nbytes() : 0,
                       c10::DataPtr(nullptr, meta), c10::GetAllocator(c10::DeviceType::Meta), /*resizable=*/true);
  if (key != nullptr && meta_storages.size() < 64) meta_storages.emplace_back(key, storage);
  return storage;
}
}  // namespace

at::Tensor meta_like(const at::Tensor& t) {
  // CPU scalars (a Python number is a 0-dim "wrapped number") go as they are: every device's
  // kernels, meta's included, take them beside their own tensors.
  if (!t.defined() || (t.is_cpu() && t.dim() == 0)) return t;
  c10::Storage storage = meta_storage_for(t);
  auto m = at::detail::make_tensor<c10::TensorImpl>(std::move(storage), c10::DispatchKeySet(c10::DispatchKey::Meta),
                                                    t.dtype());
  m.unsafeGetTensorImpl()->set_sizes_and_strides(t.sizes(), t.strides(), t.storage_offset());
  if (t.is_conj()) m._set_conj(true);
  if (t.is_neg()) m._set_neg(true);
  return m;
}

std::optional<at::Tensor> meta_like(const std::optional<at::Tensor>& t) {
  if (!t.has_value()) return t;
  return meta_like(*t);
}

std::vector<at::Tensor> meta_like(at::ITensorListRef ts) {
  std::vector<at::Tensor> out;
  out.reserve(ts.size());
  for (const at::Tensor& t : ts) out.push_back(meta_like(t));
  return out;
}

std::vector<at::Tensor> meta_like(at::TensorList ts) {
  std::vector<at::Tensor> out;
  out.reserve(ts.size());
  for (const at::Tensor& t : ts) out.push_back(meta_like(t));
  return out;
}

c10::List<std::optional<at::Tensor>> meta_like(const c10::List<std::optional<at::Tensor>>& ts) {
  c10::List<std::optional<at::Tensor>> out;
  out.reserve(ts.size());
  for (const std::optional<at::Tensor>& t : ts) out.push_back(meta_like(t));
  return out;
}

namespace detail {
void forget_meta_storages() { meta_storages.clear(); }
}  // namespace detail

bool on_meta(const std::function<void()>& pre_pass) {
  return on_meta([&pre_pass] { pre_pass(); });  // the lambda overload (kernel_support.h): one set of rules
}

at::Tensor empty_like_meta(const at::Tensor& meta, c10::Device device) {
  if (!meta.defined()) return meta;
  c10::DeviceGuard guard(device);
  at::Tensor out = empty_device(meta.sizes(), meta.strides(), c10::TensorOptions().dtype(meta.dtype()));
  if (meta.storage_offset() != 0) {  // a result at an offset into its storage (rare): same geometry
    grow_storage(out.storage(),
                 at::detail::computeStorageNbytes(meta.sizes(), meta.strides(), meta.dtype().itemsize(),
                                                  meta.storage_offset()),
                 device);
    out.unsafeGetTensorImpl()->set_sizes_and_strides(meta.sizes(), meta.strides(), meta.storage_offset());
  }
  return out;
}

std::vector<at::Tensor> empty_like_meta(const std::vector<at::Tensor>& meta, c10::Device device) {
  std::vector<at::Tensor> out;
  out.reserve(meta.size());
  for (const at::Tensor& m : meta) out.push_back(empty_like_meta(m, device));
  return out;
}

bool same_geometry(const at::Tensor& device_t, const at::Tensor& meta) {
  if (!device_t.defined() || !meta.defined()) return device_t.defined() == meta.defined();
  return meta.sizes() == device_t.sizes() && meta.strides() == device_t.strides() &&
         meta.storage_offset() == device_t.storage_offset();
}

bool same_geometry(at::ITensorListRef device_ts, const std::vector<at::Tensor>& meta) {
  if (device_ts.size() != meta.size()) return false;
  size_t i = 0;
  for (const at::Tensor& t : device_ts) {
    if (!same_geometry(t, meta[i++])) return false;
  }
  return true;
}

bool same_geometry(at::TensorList device_ts, const std::vector<at::Tensor>& meta) {
  if (device_ts.size() != meta.size()) return false;
  for (size_t i = 0; i < meta.size(); ++i) {
    if (!same_geometry(device_ts[i], meta[i])) return false;
  }
  return true;
}

bool grows_from_empty(const at::Tensor& device_t, const at::Tensor& meta) {
  return device_t.defined() && meta.defined() && device_t.numel() == 0 &&
         meta.storage_offset() == device_t.storage_offset() && meta.is_non_overlapping_and_dense();
}

void take_geometry(const at::Tensor& device_t, const at::Tensor& meta) {
  at::Tensor t = device_t;  // the same TensorImpl
  t.resize_(meta.sizes());
  if (t.strides() != meta.strides()) t.as_strided_(meta.sizes(), meta.strides(), meta.storage_offset());
}

bool resize_empty_out(const at::Tensor& device_t, const at::Tensor& meta) {
  if (same_geometry(device_t, meta)) return true;
  if (!grows_from_empty(device_t, meta)) return false;
  take_geometry(device_t, meta);
  return true;
}

detail::Shape::Shape(c10::IntArrayRef sizes, c10::IntArrayRef strides) : dim_(sizes.size()) {
  int64_t* out = inline_;
  if (dim_ > kInline) {
    heap_.resize(2 * dim_);
    out = heap_.data();
  }
  std::copy(sizes.begin(), sizes.end(), out);
  std::copy(strides.begin(), strides.end(), out + dim_);
}

Held::Held(const at::Tensor& t) : source_(const_cast<at::Tensor*>(&t)) {
  if (!on_device(t)) {
    if (!t.defined()) return;
    if (t.dim() == 0 && t.layout() == c10::kStrided && !t.is_conj() && !t.is_neg()) {
      // a CPU scalar (a Python number): one element, copied without the dispatcher
      tensor_ = at::detail::empty_cpu({}, t.scalar_type());
      std::memcpy(tensor_.mutable_data_ptr(), t.const_data_ptr(), t.dtype().itemsize());
    } else {
      tensor_ = t.clone();
    }
    if (t.unsafeGetTensorImpl()->is_wrapped_number()) tensor_.unsafeGetTensorImpl()->set_wrapped_number(true);
    return;
  }
  const c10::Storage& st = t.storage();
  device_ = true;
  memory_ = st.data();
  nbytes_ = st.nbytes();
  shape_ = detail::Shape(t.sizes(), t.strides());
  offset_ = t.storage_offset();
  dtype_ = t.dtype();
  conj_ = t.is_conj();
  neg_ = t.is_neg();
}

at::Tensor& Held::get() {
  if (detail::in_place != nullptr && !noted_ && source_ != nullptr && (device_ || !source_->defined())) {
    noted_ = true;  // a launch run in place: it gives the device tensor what became of the alias
    detail::in_place->held.push_back(this);
  }
  if (device_ && !tensor_.defined()) {
    host_ = host_memory(memory_, nbytes_, nullptr);
    tensor_ = pooled_alias(Geometry{host_, nbytes_, shape_.sizes(), shape_.strides(), offset_, dtype_, conj_, neg_});
    lend(this, &Held::let_go);  // AliasesBack::check finds it by its let_go
  }
  return tensor_;
}

void Held::let_go(void* held) { static_cast<Held*>(held)->tensor_ = at::Tensor(); }

void Held::carry_back() {
  const c10::TensorImpl* alias = tensor_.unsafeGetTensorImpl();
  const bool same = alias->sizes() == shape_.sizes() && alias->strides() == shape_.strides() &&
                    alias->storage_offset() == offset_;
  if (same && alias->storage().data() == host_) return;  // as a rule
  TORCH_CHECK(same, "the CPU kernel left a device argument with sizes ", alias->sizes(), " and strides ",
              alias->strides(), " where its meta function decided ", shape_.sizes(), " and ", shape_.strides(),
              " (the device tensor keeps those); give the operator a kernel whose outputs are decided on the host "
              "as its CPU kernel decides them");
  at::Tensor device_memory = make_alias(
      Geometry{host_, nbytes_, shape_.sizes(), shape_.strides(), offset_, dtype_, conj_, neg_});
  at::_ops::copy_::call(device_memory, tensor_, false);  // the result, from the memory the kernel moved it to
}

HeldOptional::HeldOptional(const std::optional<at::Tensor>& t) {
  if (t.has_value()) held_.emplace(*t);
}

std::optional<at::Tensor>& HeldOptional::get() {
  if (held_.has_value() && !value_.has_value()) {
    value_ = held_->get();
    note_lent(value_);
  }
  return value_;
}

HeldList::HeldList(at::ITensorListRef ts) {
  held_.reserve(ts.size());
  for (const at::Tensor& t : ts) held_.emplace_back(t);
}

HeldList::HeldList(at::TensorList ts) {
  held_.reserve(ts.size());
  for (const at::Tensor& t : ts) held_.emplace_back(t);
}

HeldList::HeldList(std::vector<at::Tensor>& results) : HeldList(at::TensorList(results)) { results_ = &results; }

std::vector<at::Tensor>& HeldList::get() {
  if (results_ != nullptr && held_.empty() && detail::in_place != nullptr) {
    detail::in_place->lists.push_back(this);  // no meta kernel: the run in place fills the results
  }
  if (values_.size() != held_.size()) {
    values_.clear();
    values_.reserve(held_.size());
    for (Held& h : held_) values_.push_back(h.get());
    note_lent(values_);
  }
  return values_;
}

HeldOptionalList::HeldOptionalList(const c10::List<std::optional<at::Tensor>>& ts) {
  held_.reserve(ts.size());
  for (const std::optional<at::Tensor>& t : ts) {
    held_.push_back(t.has_value() ? std::optional<Held>(Held(*t)) : std::nullopt);
    if (held_.back().has_value()) held_.back()->source_ = nullptr;  // `t` is a copy of the element
  }
}

HeldList held(at::ITensorListRef ts) { return HeldList(ts); }
HeldList held(at::TensorList ts) { return HeldList(ts); }
HeldList held(std::vector<at::Tensor>& results) { return HeldList(results); }
HeldOptionalList held(const c10::List<std::optional<at::Tensor>>& ts) { return HeldOptionalList(ts); }

c10::List<std::optional<at::Tensor>> HeldOptionalList::get() {
  c10::List<std::optional<at::Tensor>> values;
  values.reserve(held_.size());
  for (std::optional<Held>& h : held_) values.push_back(h.has_value() ? std::optional<at::Tensor>(h->get()) : std::nullopt);
  return values;
}

void copy_result(at::Tensor& out_alias, const at::Tensor& result) {
  if (!out_alias.defined()) {
    out_alias = result;  // nothing was allocated (a launch run in place without a meta kernel)
    return;
  }
  if (out_alias.is_same(result)) return;
  at::_ops::copy_::call(out_alias, result, false);
}

void copy_result(std::vector<at::Tensor>& out_aliases, const std::vector<at::Tensor>& results) {
  if (out_aliases.empty() && !results.empty()) {
    out_aliases = results;  // as above
    return;
  }
  TORCH_CHECK(out_aliases.size() == results.size(), "the operator returned ", results.size(),
              " tensors; its meta kernel promised ", out_aliases.size());
  for (size_t i = 0; i < results.size(); ++i) copy_result(out_aliases[i], results[i]);
}

at::Tensor empty_device(c10::IntArrayRef sizes, c10::IntArrayRef strides, const c10::TensorOptions& options) {
  constexpr auto keys = c10::DispatchKeySet(c10::DispatchKey::PrivateUse1);
  const c10::ScalarType dtype = options.dtype().toScalarType();
  if (strides.empty()) {
    return at::detail::empty_generic(sizes, runtime::device_allocator(), keys, dtype, options.memory_format_opt());
  }
  return at::detail::empty_strided_generic(sizes, strides, runtime::device_allocator(), keys, dtype);
}

void grow_storage(const c10::Storage& storage, size_t nbytes, c10::Device device) {
  c10::StorageImpl* s = storage.unsafeGetStorageImpl();
  if (nbytes <= s->nbytes()) return;
  TORCH_CHECK(s->resizable(), "trying to resize storage that is not resizable");
  c10::DeviceGuard guard(device);  // the allocator allocates on the current device
  c10::DataPtr fresh = runtime::device_allocator()->allocate(nbytes);
  if (s->nbytes() > 0) {
    {{ cookiecutter.DEVICE }}_CHECK(driver::memcpy(fresh.get(), s->data(), s->nbytes(), driver::CopyKind::device_to_device,
                                                   device.index(), runtime::current_stream_id(device.index())));
  }
  s->set_data_ptr_noswap(std::move(fresh));
  s->set_nbytes(nbytes);
}

at::Tensor device_view(const at::Tensor& base, const at::Tensor& view) {
  TORCH_CHECK(view.layout() == c10::kStrided && !view.is_nested(),
              "{{ cookiecutter.device }}: a view of a device tensor must be a strided tensor, not ", view.layout());
  // The same bytes: the host alias covers base's whole storage from its first byte, so the view's
  // offset into it is its offset into the device storage.
  TORCH_CHECK(view.storage().data() == host_bytes(base.storage()),
              "{{ cookiecutter.device }}: the CPU operator returned new memory, not a view of its input's; a device "
              "view needs a view (see kernels::device_view)");
  // as PyTorch's own view_tensor (ATen/native/ComplexHelper.h): base's keys, the view's dtype and bits
  const c10::DispatchKeySet keys =
      base.key_set().remove(c10::DispatchKey::Conjugate).remove(c10::DispatchKey::Negative);
  auto v = at::detail::make_tensor<c10::TensorImpl>(c10::TensorImpl::VIEW, c10::Storage(base.storage()), keys,
                                                    view.dtype());
  v.unsafeGetTensorImpl()->set_sizes_and_strides(view.sizes(), view.strides(), view.storage_offset());
  if (view.is_conj()) v._set_conj(true);
  if (view.is_neg()) v._set_neg(true);
  return v;
}

}  // namespace {{ cookiecutter.device }}::kernels
