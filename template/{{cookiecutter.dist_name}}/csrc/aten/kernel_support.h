// Helpers every {{ cookiecutter.device }} kernel uses to run on device memory (see kernel_support.cpp).
//
// A kernel's host code sees device tensors as CPU tensors (`host_alias`), runs the CPU kernel on
// them, and publishes the result back (`write_back` for mutated arguments, `to_device` for new
// results). Where the driver maps device memory for the host (driver.h's host_mapping capability,
// which the default driver has), a host alias is the device memory itself, no copy; where it does not (the
// minimal driver, a discrete chip), kernel bodies are staged through driver::memcpy inside their
// scope (`StreamScope`, `launch`) — the same kernel file runs on both. Kernels are asynchronous,
// as on a chip: a kernel decides its outputs on the host and queues its computation on the current
// stream (`launch`, below) — so a missing wait_stream, record_stream or synchronize shows here, not
// first on silicon. A kernel the host must wait for (output sizes that depend on the data, a value
// returned to the host) runs as the stream's next item on the calling thread (`StreamScope`). On
// real hardware kernels launch SDK work instead and need host aliases only for host<->device
// staging. `common_device`, `empty_device`, `launch` and `StreamScope` are what any backend's
// kernels need: argument checks, output allocation and stream order.
#pragma once

// Every kernel file includes this header, so it stays narrow: c10::List and c10::IListRef (their
// headers pull in the IValue machinery, ~3 s of every compile) are only forward-declared here,
// through ATen_fwd.h; kernels with a Tensor?[] or Tensor[] argument include <ATen/core/List.h> or
// <ATen/core/IListRef.h> themselves.
#include <ATen/core/ATen_fwd.h>
#include <ATen/core/Tensor.h>
#include <c10/core/Device.h>
#include <c10/core/DeviceGuard.h>
#include <c10/core/TensorOptions.h>

#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

namespace {{ cookiecutter.device }}::kernels {

// Whether host aliases are device memory itself (the driver's host_mapping) or staged copies.
bool host_mapped();

// A CPU tensor with t's sizes, strides, offset and dtype on t's device bytes (t itself if it is not
// a device tensor). Read or write it only inside a StreamScope or launched work: without host
// mapping, that is where its bytes are staged; outside, it serves views (geometry) only.
at::Tensor host_alias(const at::Tensor& t);
std::optional<at::Tensor> host_alias(const std::optional<at::Tensor>& t);
std::vector<at::Tensor> host_alias(at::ITensorListRef ts);
std::vector<at::Tensor> host_alias(at::TensorList ts);
c10::List<std::optional<at::Tensor>> host_alias(const c10::List<std::optional<at::Tensor>>& ts);

// A CPU tensor over the same bytes as the CPU tensor `t` that does not keep them alive: for work
// queued on a stream, which (like a kernel on real hardware) holds no reference to its buffers.
at::Tensor borrowed(const at::Tensor& t);

// After an in-place or out= call on `host_out` (a host alias of `device_out`): carry its new
// sizes/strides back, or — if the CPU kernel had to reallocate it — grow the device storage, give
// the device tensor the result's sizes and strides, and copy.
void write_back(const at::Tensor& device_out, const at::Tensor& host_out);

// A new host result -> a new device tensor on `device` (one copy).
at::Tensor to_device(const at::Tensor& host, c10::Device device);

// The shape `a` and `b` broadcast to, with PyTorch's message when they do not (at::infer_size's
// rule, whose header, ATen/ExpandUtils.h, brings every operator's declaration into a unit).
std::vector<int64_t> broadcast_shape(c10::IntArrayRef a, c10::IntArrayRef b);

// The device a kernel runs on: `t`'s device if it is a {{ cookiecutter.device }} tensor, else the current device.
c10::Device device_of(const at::Tensor& t);

// How an operator treats CPU tensors among its arguments. PyTorch checks this before or inside
// its kernels; the CPU kernels borrowed here cannot, because host aliases are all CPU tensors.
enum class CpuArgs {
  rejected,  // every tensor on one device (operators with device_check ExactSame)
  scalars,   // CPU scalars (0-dim tensors) allowed, as TensorIterator allows them
  allowed,   // any CPU tensor (device_check NoCheck, e.g. CPU indices); the device tensors must agree
};

namespace detail {
void check_device(std::optional<c10::Device>& common, const at::Tensor& t, CpuArgs cpu, const char* op);
void check_device(std::optional<c10::Device>& common, const std::optional<at::Tensor>& t, CpuArgs cpu, const char* op);
void check_device(std::optional<c10::Device>& common, at::ITensorListRef ts, CpuArgs cpu, const char* op);
void check_device(std::optional<c10::Device>& common, at::TensorList ts, CpuArgs cpu, const char* op);
void check_device(std::optional<c10::Device>& common, const c10::List<std::optional<at::Tensor>>& ts, CpuArgs cpu,
                  const char* op);
c10::Device current();
}  // namespace detail

// The device `op` runs on — that of its first {{ cookiecutter.device }} tensor argument, else the
// current device — after checking every tensor argument against it (a clear error, as on CPU/CUDA).
template <typename... Tensors>
c10::Device common_device(const char* op, CpuArgs cpu, const Tensors&... tensors) {
  std::optional<c10::Device> common;
  (detail::check_device(common, tensors, cpu, op), ...);
  return common.has_value() ? *common : detail::current();
}

namespace detail {
class StagingScope;
}

// Holds `device`'s current stream for a kernel body run on the calling thread: waits for the work
// queued on it, and work launched meanwhile from other threads queues behind the body (with the
// driver's host_tasks capability). Without host_mapping, it is also the body's staging scope: the
// device memory its host aliases reach is copied in, and what the body changed is copied back when
// it ends. `name` (a string literal) is what the profiler shows.
class StreamScope {
 public:
  explicit StreamScope(c10::Device device, const char* name = nullptr);
  ~StreamScope() noexcept(false);
  StreamScope(const StreamScope&) = delete;
  StreamScope& operator=(const StreamScope&) = delete;

 private:
  int device_;
  int64_t stream_;
  const char* name_;
  std::unique_ptr<detail::StagingScope> staging_;
};

// ---- queued kernels (a launch) ------------------------------------------------------------------
// A kernel decides its outputs on the host, as a launch on real hardware does: it checks its
// arguments and computes the outputs' geometry by running the operator on meta tensors
// (`meta_like`: no memory, PyTorch's own shape rules and error messages), allocates the outputs
// (`empty_like_meta`), and then queues its computation on the current stream
// (`launch`) and returns. The queued work holds the memory and geometry of what it reads and
// writes (`held`), not the tensors, so — like a kernel on a chip — it does not keep them alive;
// the stream-ordered caching allocator and record_stream do that, and driver::free waits for
// queued work before it unmaps memory. An exception the work throws is
// reported, with `name`, by the next call that waits for the stream (synchronize, a blocking copy).

namespace detail {
// Around queued work, on the thread that runs it: the host aliases its `held` arguments made go back
// to that thread's pool when it returns (kernel_support.cpp). `check()`, once the work has returned:
// every device argument's alias is still its device memory with the geometry the host gave it —
// a CPU kernel that reallocated an out= argument and brought it back to that geometry (mse_loss's
// reduction: the unreduced loss first, in the out) has its result copied to the device memory; one
// that left another geometry than its meta function decided raises.
class AliasesBack {
 public:
  AliasesBack();
  ~AliasesBack();
  void check();
  AliasesBack(const AliasesBack&) = delete;
  AliasesBack& operator=(const AliasesBack&) = delete;

 private:
  size_t first_;
};
// `launch` below, once its work is wrapped.
void launch_wrapped(c10::Device device, const char* name, std::function<void()> work);
}  // namespace detail

// Queues `work` on `device`'s current stream; returns at once. `name`: a string literal (profiler, errors).
template <typename Work, typename = std::enable_if_t<std::is_invocable_v<std::decay_t<Work>&>>>
void launch(c10::Device device, const char* name, Work&& work) {
  detail::launch_wrapped(device, name, std::function<void()>([work = std::forward<Work>(work)]() mutable {
    detail::AliasesBack back;
    work();
    back.check();
  }));
}

namespace detail {
struct InPlace;
// A kernel's computation run on the calling thread instead of queued (launch with queue = false):
// holds the stream (StreamScope) and, when the work is done, gives every device tensor the work
// reached through `held` what the CPU kernel made of its host alias — new sizes, or a storage it
// had to reallocate (`write_back`) — and every result the launch could not allocate beforehand
// (no meta kernel) the device copy of what the operator returned.
class RunInPlace {
 public:
  RunInPlace(c10::Device device, const char* name);
  ~RunInPlace();
  void finish();
  RunInPlace(const RunInPlace&) = delete;
  RunInPlace& operator=(const RunInPlace&) = delete;

 private:
  StreamScope scope_;
  InPlace* saved_;  // an enclosing run in place's (none, as a rule)
};
}  // namespace detail

// One computation body for both ways a kernel runs: `queue` true (the meta pre-pass decided the
// outputs, and the kernel allocated them) queues `work` on the current stream, as the launch above;
// false (the installed torch has no meta kernel for the operator, or an out= argument must be
// resized) runs it at once on the calling thread, in order on the stream, on the same `held`
// arguments — whose device tensors then take the geometry the CPU kernel gave their host aliases,
// and whose undefined results (nothing allocated without a meta kernel) the operator's results.
template <typename Work>
void launch(c10::Device device, const char* name, bool queue, Work&& work) {
  if (queue) {
    launch(device, name, std::forward<Work>(work));
    return;
  }
  detail::RunInPlace run(device, name);
  work();
  run.finish();
}

// A meta tensor with t's sizes, strides, storage offset, dtype and conj/neg bits (CPU tensors too,
// but for CPU scalars, which every device's kernels take as they are).
at::Tensor meta_like(const at::Tensor& t);
std::optional<at::Tensor> meta_like(const std::optional<at::Tensor>& t);
std::vector<at::Tensor> meta_like(at::ITensorListRef ts);
std::vector<at::Tensor> meta_like(at::TensorList ts);
c10::List<std::optional<at::Tensor>> meta_like(const c10::List<std::optional<at::Tensor>>& ts);

// Runs `pre_pass` (the operator on meta tensors). False if the installed torch has no meta kernel
// for the operator, or its meta kernel cannot decide the outputs (a size that depends on the data):
// it then runs on the calling thread instead; the operator's own errors — a shape mismatch, a bad
// argument — propagate, raised on the host as on CUDA.
bool on_meta(const std::function<void()>& pre_pass);
namespace detail {
void forget_meta_storages();
}
// The same for a lambda, with no std::function to allocate (what the generated kernels call).
template <typename PrePass, typename = std::enable_if_t<!std::is_same_v<std::decay_t<PrePass>, std::function<void()>>>>
bool on_meta(PrePass&& pre_pass) {
  struct Forget {
    ~Forget() { detail::forget_meta_storages(); }
  } forget;
  try {
    pre_pass();
    return true;
  } catch (const c10::NotImplementedError&) {
    return false;  // no Meta kernel in the installed torch
  } catch (const c10::Error&) {
    throw;  // the operator's own argument checks, raised by the call
  } catch (const std::exception&) {
    // not c10's: a meta kernel written in Python gave up (an output size that depends on the data,
    // e.g. nonzero under index with a boolean mask); the call runs in place, where the CPU kernel
    // raises any argument error itself
    return false;
  }
}

// A new device tensor on `device` with the geometry and dtype the meta pre-pass decided.
at::Tensor empty_like_meta(const at::Tensor& meta, c10::Device device);
std::vector<at::Tensor> empty_like_meta(const std::vector<at::Tensor>& meta, c10::Device device);
// Whether a written argument keeps its geometry through the operator (its meta tensor after the
// pre-pass has the same sizes, strides and offset). An out= call that must resize its output runs
// on the calling thread instead: some CPU kernels reshape an output again after their meta
// function sized it (mse_loss's reduction), which only the host-side write-back can follow.
bool same_geometry(const at::Tensor& device_t, const at::Tensor& meta);
bool same_geometry(at::ITensorListRef device_ts, const std::vector<at::Tensor>& meta);
bool same_geometry(at::TensorList device_ts, const std::vector<at::Tensor>& meta);
// An out= argument with no elements that the pre-pass resized to dense memory at its own offset:
// the host can give it that geometry before the call is queued, as the CPU kernel's resize_output
// would (which warns only for a tensor with elements).
bool grows_from_empty(const at::Tensor& device_t, const at::Tensor& meta);
// Gives `device_t` the sizes and strides of `meta` (grows_from_empty), through the device's resize_.
void take_geometry(const at::Tensor& device_t, const at::Tensor& meta);
// A structured operator's out= argument (its CPU kernel ends with its outputs as the meta function
// sized them; one that moves an output meanwhile, as mse_loss's does, is followed by
// AliasesBack::check): true if `device_t` has the geometry the pre-pass gave `meta`, or had no
// elements and has been given it here — the call is then queued, and the caller sees the new size
// at once; false for an out with elements of another size, which the call resizes in place.
bool resize_empty_out(const at::Tensor& device_t, const at::Tensor& meta);

namespace detail {
// A tensor's sizes and strides as queued work keeps them: up to kInline dimensions in the object
// itself, so moving a held argument into its closure (twice a launch) copies a few words, where
// c10::SmallVector's move is a call and a memcpy per vector. More dimensions go to the heap.
class Shape {
 public:
  static constexpr size_t kInline = 5;
  Shape() = default;
  Shape(c10::IntArrayRef sizes, c10::IntArrayRef strides);
  c10::IntArrayRef sizes() const { return {data(), dim_}; }
  c10::IntArrayRef strides() const { return {data() + dim_, dim_}; }

 private:
  const int64_t* data() const { return dim_ <= kInline ? inline_ : heap_.data(); }
  int64_t inline_[2 * kInline] = {};  // sizes, then strides (the first 2 * dim_; the rest zero, as copies read it)
  std::vector<int64_t> heap_;    // the same, past kInline dimensions
  size_t dim_ = 0;
};
}  // namespace detail

// What queued work keeps of a tensor argument (`held`), and the tensor it passes on when it runs
// (`get()`): of a device tensor, its memory and geometry at launch — the host alias is made when
// the work runs, on the worker (so launching costs no tensor) —; of a CPU tensor, a copy taken at
// launch (as CUDA copies host arguments when it launches), so the caller may change or free it.
class Held {
 public:
  Held() = default;
  explicit Held(const at::Tensor& t);
  at::Tensor& get();

 private:
  friend class detail::RunInPlace;
  friend class detail::AliasesBack;
  friend class HeldOptionalList;  // its elements are copies: they have no source to write back to
  static void let_go(void* held);  // queued work's end: the alias goes back to the pool
  void carry_back();               // see AliasesBack::check
  at::Tensor tensor_;             // the CPU copy, or the host alias once made
  at::Tensor* source_ = nullptr;  // the tensor it was made from: read only by a launch run in place
  bool device_ = false;           // a device tensor (else tensor_ is all there is)
  const void* memory_ = nullptr;  // its storage's device address
  void* host_ = nullptr;          // the host address its alias was made on
  size_t nbytes_ = 0;
  detail::Shape shape_;
  int64_t offset_ = 0;
  caffe2::TypeMeta dtype_;
  bool conj_ = false, neg_ = false;
  bool noted_ = false;  // reported to the launch run in place that reads it
};

class HeldOptional {
 public:
  explicit HeldOptional(const std::optional<at::Tensor>& t);
  std::optional<at::Tensor>& get();

 private:
  std::optional<Held> held_;
  std::optional<at::Tensor> value_;
};

class HeldList {
 public:
  explicit HeldList(at::ITensorListRef ts);
  explicit HeldList(at::TensorList ts);
  // a kernel's list of results: without a meta kernel it is empty, and a launch run in place fills it
  explicit HeldList(std::vector<at::Tensor>& results);
  std::vector<at::Tensor>& get();

 private:
  friend class detail::RunInPlace;
  std::vector<Held> held_;
  std::vector<at::Tensor> values_;
  std::vector<at::Tensor>* results_ = nullptr;
};

class HeldOptionalList {
 public:
  explicit HeldOptionalList(const c10::List<std::optional<at::Tensor>>& ts);
  c10::List<std::optional<at::Tensor>> get();  // c10::List is a reference to shared elements

 private:
  std::vector<std::optional<Held>> held_;
};

inline Held held(const at::Tensor& t) { return Held(t); }
inline HeldOptional held(const std::optional<at::Tensor>& t) { return HeldOptional(t); }
HeldList held(at::ITensorListRef ts);
HeldList held(at::TensorList ts);
HeldList held(std::vector<at::Tensor>& results);
HeldOptionalList held(const c10::List<std::optional<at::Tensor>>& ts);

// Inside queued work: a result the CPU operator returned -> the host alias of the output the launch
// allocated (in a launch run in place without a meta kernel, nothing was allocated: the result
// itself, which the launch then copies to the device).
void copy_result(at::Tensor& out_alias, const at::Tensor& result);
void copy_result(std::vector<at::Tensor>& out_aliases, const std::vector<at::Tensor>& results);

// What queued work keeps of a non-tensor argument (`keep`) and how it passes it on (`pass`):
// array and string views become owning vectors and strings; everything else is kept as it is.
template <typename T>
T keep(const T& v) { return v; }
template <typename T>
std::vector<T> keep(c10::ArrayRef<T> v) { return v.vec(); }
template <typename T>
std::optional<std::vector<T>> keep(const c10::OptionalArrayRef<T>& v) {
  return v.has_value() ? std::optional<std::vector<T>>(v->vec()) : std::nullopt;
}
inline std::string keep(c10::string_view v) { return std::string(v); }
inline std::optional<std::string> keep(const std::optional<c10::string_view>& v) {
  return v.has_value() ? std::optional<std::string>(std::string(*v)) : std::nullopt;
}
template <typename T>
const T& pass(const T& v) { return v; }
template <typename T>
c10::ArrayRef<T> pass(const std::vector<T>& v) { return v; }
template <typename T>
c10::OptionalArrayRef<T> pass(const std::optional<std::vector<T>>& v) {
  return v.has_value() ? c10::OptionalArrayRef<T>(*v) : c10::OptionalArrayRef<T>();
}
inline c10::string_view pass(const std::string& v) { return v; }
inline std::optional<c10::string_view> pass(const std::optional<std::string>& v) {
  return v.has_value() ? std::optional<c10::string_view>(*v) : std::nullopt;
}

// A new tensor in device memory on the current device: contiguous (in `options`' memory format)
// when `strides` is empty, else with those strides. Takes the allocator directly, not the
// dispatcher: this is how a kernel allocates its outputs.
at::Tensor empty_device(c10::IntArrayRef sizes, c10::IntArrayRef strides, const c10::TensorOptions& options);

// A device tensor sharing `base`'s storage with the geometry of `view`, a view of `host_alias(base)`
// (e.g. what the CPU operator returned for it): its sizes, strides, storage offset and dtype — which
// may differ from base's (view_as_real, view.dtype: the offset counts elements of the view's dtype)
// — and its conjugate and negative bits. Metadata only: no data moves, no stream work. Throws if
// `view` is not on base's memory (a CPU kernel that returned a copy).
at::Tensor device_view(const at::Tensor& base, const at::Tensor& view);

// Makes a device storage at least `nbytes` long, keeping its contents (resize_, out= results).
void grow_storage(const c10::Storage& storage, size_t nbytes, c10::Device device);

}  // namespace {{ cookiecutter.device }}::kernels
