// The {{ cookiecutter.device }} collective backend: a c10d::Backend, as ProcessGroupNCCL/XCCL are for CUDA/XPU.
//
// {{ cookiecutter.package }}/distributed.py registers it as "{{ cookiecutter.device }}ccl" for {{ cookiecutter.device }} tensors, so
// `init_process_group()` with no backend builds a c10d ProcessGroup holding PyTorch's own gloo for
// CPU tensors and this backend for device tensors; `pg._get_backend(torch.device("{{ cookiecutter.device }}"))`
// returns it, `device_id=` binds it, and TORCH_DISTRIBUTED_DEBUG=DETAIL wraps it in c10d's
// ProcessGroupWrapper (collective fingerprints checked on every rank) as it wraps NCCL.
//
// How it is built: every collective on device tensors is handed, as one call, to `transport_` —
// here a ProcessGroupGloo of its own, given host views of the device tensors when the driver has
// the host_mapping capability (gloo then reads and writes device memory in place; host_memory.cpp),
// else host copies made with the driver's copies and copied back when the collective completes.
// A view waits for the current stream first, so the collective sees the work queued before it.
// Tensors gloo cannot take as they are (non-contiguous) are staged through a contiguous device
// copy, copied back when the collective completes; ReduceOp.AVG runs as SUM and divides afterwards.
// `DeviceWork` is the Work the caller gets: wait(), the future DDP uses, result().
//
// What a hardware team replaces: the calls on `transport_` (one per collective in this file) with
// its collective library's, enqueued on a communication stream that waits on the caller's, and
// `DeviceWork::wait` with an event wait; the registration and staging stay.
#include <torch/csrc/distributed/c10d/Backend.hpp>
#include <torch/csrc/utils/pybind.h>

#include <c10/core/DeviceGuard.h>

#include <functional>
#include <mutex>
#include <utility>

#include "distributed/host_memory.h"
#include "runtime/runtime.h"

namespace {{ cookiecutter.device }}::distributed {
namespace {

constexpr const char* kName = "{{ cookiecutter.device }}ccl";

// A collective in flight. `finish` runs once after it completed: copies out of staging buffers,
// AVG's division; the device's stream is synchronized after it, so the result is in memory
// whichever stream the caller uses next.
class DeviceWork : public c10d::Work {
 public:
  DeviceWork(c10::intrusive_ptr<c10d::Work> inner, std::optional<c10::Device> device, std::vector<at::Tensor> result,
             std::function<void()> finish, c10d::OpType type)
      : Work(-1, type), inner_(std::move(inner)), device_(device), result_(std::move(result)), finish_(std::move(finish)) {}

  bool isCompleted() override { return finished() || inner_->isCompleted(); }
  bool isSuccess() const override { return inner_->isSuccess(); }
  std::exception_ptr exception() const override { return inner_->exception(); }
  std::vector<at::Tensor> result() override { return result_; }
  void synchronize() override { wait(); }
  void abort() override { inner_->abort(); }

  bool wait(std::chrono::milliseconds timeout = kNoTimeout) override {
    inner_->wait(timeout);
    complete();
    return true;
  }

  // Completes with the caller's (device) tensors once the collective and `finish` are done.
  c10::intrusive_ptr<c10::ivalue::Future> getFuture() override {
    std::lock_guard<std::mutex> lock(mutex_);
    if (!future_) {
      future_ = c10::make_intrusive<c10::ivalue::Future>(c10::ListType::create(c10::TensorType::get()));
      auto self = c10::intrusive_ptr<DeviceWork>::reclaim_copy(this);
      inner_->getFuture()->addCallback([self](c10::ivalue::Future& done) {
        if (done.hasError()) {
          self->future_->setError(done.exception_ptr());
          return;
        }
        try {
          self->complete();
          self->future_->markCompleted(c10::IValue(self->result_));
        } catch (...) {
          self->future_->setError(std::current_exception());
        }
      });
    }
    return future_;
  }

 private:
  bool finished() {
    std::lock_guard<std::mutex> lock(finish_mutex_);
    return finished_;
  }

  void complete() {
    std::lock_guard<std::mutex> lock(finish_mutex_);
    if (finished_) return;
    if (finish_ && device_) {
      c10::DeviceGuard guard(*device_);
      finish_();
      {{ cookiecutter.DEVICE }}_CHECK(driver::stream_synchronize(device_->index(), runtime::current_stream_id(device_->index())));
    }
    finished_ = true;
  }

  c10::intrusive_ptr<c10d::Work> inner_;
  std::optional<c10::Device> device_;
  std::vector<at::Tensor> result_;
  std::function<void()> finish_;
  std::mutex mutex_, finish_mutex_;
  bool finished_ = false;
  c10::intrusive_ptr<c10::ivalue::Future> future_;
};

// Several collectives as one Work (coalesced calls).
class AllWork : public c10d::Work {
 public:
  AllWork(std::vector<c10::intrusive_ptr<c10d::Work>> works, std::vector<at::Tensor> result)
      : Work(-1, c10d::OpType::COALESCED), works_(std::move(works)), result_(std::move(result)) {}
  bool isCompleted() override {
    for (auto& w : works_)
      if (!w->isCompleted()) return false;
    return true;
  }
  bool wait(std::chrono::milliseconds timeout = kNoTimeout) override {
    for (auto& w : works_) w->wait(timeout);
    return true;
  }
  std::vector<at::Tensor> result() override { return result_; }
  c10::intrusive_ptr<c10::ivalue::Future> getFuture() override {
    auto future = c10::make_intrusive<c10::ivalue::Future>(c10::ListType::create(c10::TensorType::get()));
    auto self = c10::intrusive_ptr<AllWork>::reclaim_copy(this);
    at::launch([self, future] {
      try {
        self->wait();
        future->markCompleted(c10::IValue(self->result_));
      } catch (...) {
        future->setError(std::current_exception());
      }
    });
    return future;
  }

 private:
  std::vector<c10::intrusive_ptr<c10d::Work>> works_;
  std::vector<at::Tensor> result_;
};

// What one collective hands the transport: host tensors for the caller's device tensors.
class Staging {
 public:
  at::Tensor operator()(const at::Tensor& t) {
    if (!t.defined() || t.device().type() != c10::DeviceType::PrivateUse1) return t;
    TORCH_CHECK(!device_ || *device_ == t.device(), kName, ": every tensor of a collective must be on one ",
                "{{ cookiecutter.device }} device, got ", *device_, " and ", t.device());
    device_ = t.device();
    if (!has_host_views()) {  // no host address for device memory: a host copy, copied back after
      at::Tensor host = t.to(c10::Device(c10::DeviceType::CPU), /*non_blocking=*/false, /*copy=*/true,
                             c10::MemoryFormat::Contiguous);
      copy_back_.emplace_back(t, host);
      return host;
    }
    if (t.is_contiguous()) return host_view(t);
    at::Tensor copy = t.contiguous();
    copy_back_.emplace_back(t, copy);
    return host_view(copy);
  }
  std::vector<at::Tensor> operator()(const std::vector<at::Tensor>& ts) {
    std::vector<at::Tensor> out;
    out.reserve(ts.size());
    for (const auto& t : ts) out.push_back((*this)(t));
    return out;
  }
  std::vector<std::vector<at::Tensor>> operator()(const std::vector<std::vector<at::Tensor>>& ts) {
    std::vector<std::vector<at::Tensor>> out;
    out.reserve(ts.size());
    for (const auto& t : ts) out.push_back((*this)(t));
    return out;
  }

  // The copies back to the caller's tensors (of staged tensors), for a Work that finishes itself.
  std::function<void()> take_copy_back() {
    return [copy_back = std::move(copy_back_)] {
      for (const auto& [original, copy] : copy_back) original.copy_(copy);
    };
  }

  // The Work to return: `divide` holds tensors to divide by `size` (AVG) once it completed.
  c10::intrusive_ptr<c10d::Work> work(c10::intrusive_ptr<c10d::Work> inner, std::vector<at::Tensor> result,
                                      c10d::OpType type, std::vector<at::Tensor> divide = {}, int size = 1) {
    std::function<void()> finish;
    if (!copy_back_.empty() || !divide.empty()) {
      finish = [copy_back = take_copy_back(), divide = std::move(divide), size] {
        copy_back();  // then AVG divides the result
        for (const auto& t : divide) t.div_(size);
      };
    }
    return c10::make_intrusive<DeviceWork>(std::move(inner), device_, std::move(result), std::move(finish), type);
  }

 private:
  std::optional<c10::Device> device_;
  std::vector<std::pair<at::Tensor, at::Tensor>> copy_back_;
};

bool is_avg(c10d::ReduceOp op) { return op == c10d::ReduceOp::AVG; }

template <typename Opts>
Opts as_sum(Opts opts) {
  if (is_avg(opts.reduceOp)) opts.reduceOp = c10d::ReduceOp::SUM;
  return opts;
}

std::vector<at::Tensor> flat(const std::vector<std::vector<at::Tensor>>& lists) {
  std::vector<at::Tensor> out;
  for (const auto& l : lists) out.insert(out.end(), l.begin(), l.end());
  return out;
}

class DeviceBackend final : public c10d::Backend {
 public:
  DeviceBackend(c10::intrusive_ptr<c10d::Backend> transport, int rank, int size, std::chrono::milliseconds timeout)
      : Backend(rank, size), transport_(std::move(transport)), timeout_(timeout) {}

  const std::string getBackendName() const override { return kName; }

  c10::intrusive_ptr<Options> getBackendOptions() override {
    auto opts = c10::make_intrusive<Options>(kName, timeout_);
    return opts;
  }

  void setTimeout(std::chrono::milliseconds timeout) override {
    timeout_ = timeout;
    transport_->setTimeout(timeout);
  }
  void setSequenceNumberForGroup() override { transport_->setSequenceNumberForGroup(); }
  uint64_t getSequenceNumberForGroup() override { return transport_->getSequenceNumberForGroup(); }
  void abort() override { transport_->abort(); }
  void shutdown() override { transport_->shutdown(); }
  bool supportsCoalescing() const override { return true; }

  void startCoalescing() override {
    coalescing_ = true;
    coalesced_.clear();
  }
  c10::intrusive_ptr<c10d::Work> endCoalescing() override {
    coalescing_ = false;
    auto works = std::move(coalesced_);
    coalesced_.clear();
    return c10::make_intrusive<AllWork>(std::move(works), std::vector<at::Tensor>{});
  }

  c10::intrusive_ptr<c10d::Work> broadcast(std::vector<at::Tensor>& tensors, const c10d::BroadcastOptions& opts) override {
    Staging s;
    auto host = s(tensors);
    return track(s.work(transport_->broadcast(host, opts), tensors, c10d::OpType::BROADCAST));
  }

  c10::intrusive_ptr<c10d::Work> allreduce(std::vector<at::Tensor>& tensors, const c10d::AllreduceOptions& opts) override {
    Staging s;
    auto host = s(tensors);
    auto inner = transport_->allreduce(host, as_sum(opts));
    return track(s.work(inner, tensors, c10d::OpType::ALLREDUCE, is_avg(opts.reduceOp) ? tensors : std::vector<at::Tensor>{},
                        getSize()));
  }

  c10::intrusive_ptr<c10d::Work> allreduce_coalesced(std::vector<at::Tensor>& tensors,
                                                     const c10d::AllreduceCoalescedOptions& opts) override {
    c10d::AllreduceOptions one;
    one.reduceOp = opts.reduceOp;
    one.timeout = opts.timeout;
    std::vector<c10::intrusive_ptr<c10d::Work>> works;
    for (auto& t : tensors) {
      std::vector<at::Tensor> single{t};
      works.push_back(allreduce(single, one));
    }
    return c10::make_intrusive<AllWork>(std::move(works), tensors);
  }

  c10::intrusive_ptr<c10d::Work> reduce(std::vector<at::Tensor>& tensors, const c10d::ReduceOptions& opts) override {
    Staging s;
    auto host = s(tensors);
    auto inner = transport_->reduce(host, as_sum(opts));
    bool divide = is_avg(opts.reduceOp) && getRank() == opts.rootRank;
    return track(s.work(inner, tensors, c10d::OpType::REDUCE, divide ? tensors : std::vector<at::Tensor>{}, getSize()));
  }

  c10::intrusive_ptr<c10d::Work> allgather(std::vector<std::vector<at::Tensor>>& outputs, std::vector<at::Tensor>& inputs,
                                           const c10d::AllgatherOptions& opts) override {
    Staging s;
    auto host_out = s(outputs);
    auto host_in = s(inputs);
    return track(s.work(transport_->allgather(host_out, host_in, opts), flat(outputs), c10d::OpType::ALLGATHER));
  }

  c10::intrusive_ptr<c10d::Work> _allgather_base(at::Tensor& output, at::Tensor& input,
                                                 const c10d::AllgatherOptions& opts) override {
    // as flat buffers, as NCCL takes them (gloo splits the output along its first dimension)
    Staging s;
    auto host_out = s(output).view({-1});
    auto host_in = s(input).view({-1});
    return track(s.work(transport_->_allgather_base(host_out, host_in, opts), {output}, c10d::OpType::_ALLGATHER_BASE));
  }

  c10::intrusive_ptr<c10d::Work> allgather_coalesced(std::vector<std::vector<at::Tensor>>& outputs,
                                                     std::vector<at::Tensor>& inputs,
                                                     const c10d::AllgatherOptions& opts) override {
    std::vector<c10::intrusive_ptr<c10d::Work>> works;
    for (size_t i = 0; i < inputs.size(); ++i) {
      std::vector<std::vector<at::Tensor>> out{outputs[i]};
      std::vector<at::Tensor> in{inputs[i]};
      works.push_back(allgather(out, in, opts));
    }
    return c10::make_intrusive<AllWork>(std::move(works), flat(outputs));
  }

  c10::intrusive_ptr<c10d::Work> allgather_into_tensor_coalesced(std::vector<at::Tensor>& outputs,
                                                                 std::vector<at::Tensor>& inputs,
                                                                 const c10d::AllgatherOptions& opts) override {
    std::vector<c10::intrusive_ptr<c10d::Work>> works;
    for (size_t i = 0; i < inputs.size(); ++i) works.push_back(_allgather_base(outputs[i], inputs[i], opts));
    return c10::make_intrusive<AllWork>(std::move(works), outputs);
  }

  c10::intrusive_ptr<c10d::Work> gather(std::vector<std::vector<at::Tensor>>& outputs, std::vector<at::Tensor>& inputs,
                                        const c10d::GatherOptions& opts) override {
    Staging s;
    auto host_out = s(outputs);
    auto host_in = s(inputs);
    return track(s.work(transport_->gather(host_out, host_in, opts), flat(outputs), c10d::OpType::GATHER));
  }

  c10::intrusive_ptr<c10d::Work> scatter(std::vector<at::Tensor>& outputs, std::vector<std::vector<at::Tensor>>& inputs,
                                         const c10d::ScatterOptions& opts) override {
    Staging s;
    auto host_out = s(outputs);
    auto host_in = s(inputs);
    return track(s.work(transport_->scatter(host_out, host_in, opts), outputs, c10d::OpType::SCATTER));
  }

  c10::intrusive_ptr<c10d::Work> reduce_scatter(std::vector<at::Tensor>& outputs,
                                                std::vector<std::vector<at::Tensor>>& inputs,
                                                const c10d::ReduceScatterOptions& opts) override {
    Staging s;
    auto host_out = s(outputs);
    auto host_in = s(inputs);
    auto inner = transport_->reduce_scatter(host_out, host_in, as_sum(opts));
    return track(s.work(inner, outputs, c10d::OpType::REDUCE_SCATTER,
                        is_avg(opts.reduceOp) ? outputs : std::vector<at::Tensor>{}, getSize()));
  }

  c10::intrusive_ptr<c10d::Work> _reduce_scatter_base(at::Tensor& output, at::Tensor& input,
                                                      const c10d::ReduceScatterOptions& opts) override {
    Staging s;
    auto host_out = s(output).view({-1});
    auto host_in = s(input).view({-1});
    auto inner = transport_->_reduce_scatter_base(host_out, host_in, as_sum(opts));
    return track(s.work(inner, {output}, c10d::OpType::_REDUCE_SCATTER_BASE,
                        is_avg(opts.reduceOp) ? std::vector<at::Tensor>{output} : std::vector<at::Tensor>{}, getSize()));
  }

  c10::intrusive_ptr<c10d::Work> reduce_scatter_tensor_coalesced(std::vector<at::Tensor>& outputs,
                                                                 std::vector<at::Tensor>& inputs,
                                                                 const c10d::ReduceScatterOptions& opts) override {
    std::vector<c10::intrusive_ptr<c10d::Work>> works;
    for (size_t i = 0; i < inputs.size(); ++i) works.push_back(_reduce_scatter_base(outputs[i], inputs[i], opts));
    return c10::make_intrusive<AllWork>(std::move(works), outputs);
  }

  c10::intrusive_ptr<c10d::Work> alltoall_base(at::Tensor& output, at::Tensor& input, std::vector<int64_t>& output_splits,
                                               std::vector<int64_t>& input_splits,
                                               const c10d::AllToAllOptions& opts) override {
    Staging s;
    auto host_out = s(output);
    auto host_in = s(input);
    auto inner = transport_->alltoall_base(host_out, host_in, output_splits, input_splits, opts);
    return track(s.work(inner, {output}, c10d::OpType::ALLTOALL_BASE));
  }

  // gloo's alltoall takes equal sizes only: the pieces go as one flat buffer with splits (uneven
  // sizes allowed) and are copied out when it completes.
  c10::intrusive_ptr<c10d::Work> alltoall(std::vector<at::Tensor>& outputs, std::vector<at::Tensor>& inputs,
                                          const c10d::AllToAllOptions& opts) override {
    std::vector<at::Tensor> flat_in;
    std::vector<int64_t> in_splits, out_splits;
    int64_t out_numel = 0;
    for (const auto& t : inputs) {
      flat_in.push_back(t.reshape(-1));
      in_splits.push_back(t.numel());
    }
    for (const auto& t : outputs) {
      out_splits.push_back(t.numel());
      out_numel += t.numel();
    }
    TORCH_CHECK(!inputs.empty() && !outputs.empty(), kName, ": alltoall needs tensors");
    at::Tensor send = at::cat(flat_in);
    at::Tensor recv = at::empty({out_numel}, send.options());
    Staging s;
    auto host_out = s(recv);
    auto host_in = s(send);
    auto outs = outputs;
    auto finish = [outs, recv, copy_back = s.take_copy_back()] {
      copy_back();  // recv's host copy, without host views
      int64_t offset = 0;
      for (const auto& out : outs) {
        out.copy_(recv.narrow(0, offset, out.numel()).view(out.sizes()));
        offset += out.numel();
      }
    };
    // (gloo may take the split vectors' contents)
    auto inner = transport_->alltoall_base(host_out, host_in, out_splits, in_splits, opts);
    return track(c10::make_intrusive<DeviceWork>(inner, recv.device(), outputs, finish, c10d::OpType::ALLTOALL));
  }

  c10::intrusive_ptr<c10d::Work> send(std::vector<at::Tensor>& tensors, int dst, int tag) override {
    Staging s;
    auto host = s(tensors);
    return track(s.work(transport_->send(host, dst, tag), tensors, c10d::OpType::SEND));
  }

  c10::intrusive_ptr<c10d::Work> recv(std::vector<at::Tensor>& tensors, int src, int tag) override {
    Staging s;
    auto host = s(tensors);
    return track(s.work(transport_->recv(host, src, tag), tensors, c10d::OpType::RECV));
  }

  c10::intrusive_ptr<c10d::Work> recvAnysource(std::vector<at::Tensor>& tensors, int tag) override {
    Staging s;
    auto host = s(tensors);
    return track(s.work(transport_->recvAnysource(host, tag), tensors, c10d::OpType::RECVANYSOURCE));
  }

  c10::intrusive_ptr<c10d::Work> barrier(const c10d::BarrierOptions& opts) override {
    // the work queued on the device so far comes before the barrier
    const auto device = runtime::current_device();
    {{ cookiecutter.DEVICE }}_CHECK(driver::stream_synchronize(device, runtime::current_stream_id(device)));
    c10d::BarrierOptions cpu = opts;
    cpu.device_ids.clear();
    cpu.device = std::nullopt;
    return transport_->barrier(cpu);
  }

 private:
  c10::intrusive_ptr<c10d::Work> track(c10::intrusive_ptr<c10d::Work> work) {
    if (coalescing_) coalesced_.push_back(work);
    return work;
  }

  c10::intrusive_ptr<c10d::Backend> transport_;
  std::chrono::milliseconds timeout_;
  bool coalescing_ = false;
  std::vector<c10::intrusive_ptr<c10d::Work>> coalesced_;
};

}  // namespace

// {{ cookiecutter.package }}._C._make_process_group_backend(transport, rank, size, timeout_seconds): the
// backend (a torch._C._distributed_c10d.Backend) over `transport`, a gloo Backend of its own.
PyObject* make_process_group_backend(PyObject*, PyObject* args) {
  try {
    PyObject* transport_obj = nullptr;
    int rank = 0, size = 0;
    double timeout_s = 0;
    if (!PyArg_ParseTuple(args, "Oiid", &transport_obj, &rank, &size, &timeout_s)) return nullptr;
    auto transport = py::cast<c10::intrusive_ptr<c10d::Backend>>(py::handle(transport_obj));
    auto timeout = std::chrono::milliseconds(static_cast<int64_t>(timeout_s * 1000));
    c10::intrusive_ptr<c10d::Backend> backend = c10::make_intrusive<DeviceBackend>(transport, rank, size, timeout);
    return py::cast(backend).release().ptr();
  } catch (py::error_already_set& e) {
    e.restore();
    return nullptr;
  } catch (const std::exception& e) {
    PyErr_SetString(PyExc_RuntimeError, e.what());
    return nullptr;
  }
}

}  // namespace {{ cookiecutter.device }}::distributed
