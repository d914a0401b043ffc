// Graph capture and replay: torch.accelerator.Graph on {{ cookiecutter.device }}, as CUDA graphs.
//
// PyTorch's device-generic graph API (torch/accelerator/graphs.py) creates an at::GraphImplInterface
// registered under the device type's name ("{{ cookiecutter.DEVICE }}"). This one drives the driver's
// optional capability `graphs` (driver.h):
//   - capture_begin starts a capture on the current stream (never the default stream) in the
//     requested mode; until capture_end, the work launched on it (and on streams joined to it by
//     events) is recorded. Memory allocated on those streams comes from the graph's private pool
//     (pool(), shareable through pool=), which lives as long as a graph uses it
//     (runtime/device_allocator.cpp).
//   - Random kernels captured here take offsets relative to a base each replay reserves from the
//     generator, in host order (generator.h's GraphDraws): every replay draws fresh numbers, those
//     eager calls from the same generator state would have drawn.
//   - replay queues the recorded work as one unit of the current stream; keep_graph, instantiate,
//     reset, enable_debug_mode and debug_dump behave as torch/accelerator/graphs.py documents.
// A call that is not permitted during a capture (a synchronize, .item(), a blocking copy, ...) is
// refused by the driver, which breaks the capture; capture_end then reports the call.
// What a hardware team replaces: nothing here — its driver implements the `graphs` capability on
// its SDK's stream capture (docs/porting.md). A driver without it makes capture_begin raise.
#include <ATen/core/GraphImplInterface.h>
#include <c10/core/DeviceGuard.h>

#include <algorithm>
#include <atomic>
#include <memory>
#include <mutex>
#include <unordered_map>
#include <vector>

#include "runtime/generator.h"
#include "runtime/runtime.h"

namespace {{ cookiecutter.device }}::runtime {
namespace {

driver::CaptureMode driver_mode(at::GraphCaptureMode mode) {
  switch (mode) {
    case at::GraphCaptureMode::ThreadLocal: return driver::CaptureMode::thread_local_;
    case at::GraphCaptureMode::Relaxed: return driver::CaptureMode::relaxed;
    default: return driver::CaptureMode::global;  // "default" is CUDA's default: global
  }
}

// A generator the captured kernels drew from, and how many offsets they took past the base.
struct Drawn {
  at::Generator gen;
  std::shared_ptr<GraphDraws> draws;
  uint64_t count = 0;
};

class DeviceGraph;

// The captures under way in this process, by the driver's capture id.
struct Captures {
  std::mutex mu;
  std::unordered_map<uint64_t, DeviceGraph*> by_id;
  std::atomic<int> count{0};
};

Captures& captures() {
  static auto* c = new Captures();  // used until exit
  return *c;
}

c10::MempoolId_t new_pool_id() {
  static std::atomic<c10::CaptureId_t> next{1};
  return {next++, 0};  // a graph's own pool: (id, 0), as CUDA's; torch's pool handles are (0, id)
}

class DeviceGraph final : public at::GraphImplInterface {
 public:
  explicit DeviceGraph(const at::GraphImplArgs& args) : keep_graph_(args.keep_graph) {}
  ~DeviceGraph() override {
    try {
      reset();
    } catch (...) {  // a destructor does not throw; the driver reports failures at the next sync
    }
  }

  void capture_begin(c10::MempoolId_t pool, at::GraphCaptureMode mode) override {
    TORCH_CHECK(driver::has(driver::Capability::graphs),
                "{{ cookiecutter.device }}: graphs are not supported by this driver (it lacks driver.h's optional "
                "capability 'graphs')");
    TORCH_CHECK(capture_ == 0 && graph_ == nullptr && exec_ == nullptr,
                "{{ cookiecutter.device }} graph: capture_begin on a graph that already holds a capture; call reset() first");
    device_ = current_device();
    stream_ = current_stream_id(device_);
    TORCH_CHECK(stream_ != 0,
                "{{ cookiecutter.device }} graphs must be captured on a stream other than the default stream: capture "
                "inside `with torch.Stream(device=\"{{ cookiecutter.device }}\"):`");
    pool_ = pool.first != 0 || pool.second != 0 ? pool : new_pool_id();
    {{ cookiecutter.DEVICE }}_CHECK(driver::begin_capture(device_, stream_, driver_mode(mode)));
    capture_ = driver::capture_id(device_, stream_);
    begin_allocate_to_pool(device_, capture_, pool_);
    holds_pool_ = true;
    std::lock_guard<std::mutex> lock(captures().mu);
    captures().by_id[capture_] = this;
    captures().count += 1;
  }

  void capture_end() override {
    TORCH_CHECK(capture_ != 0, "{{ cookiecutter.device }} graph: capture_end without capture_begin");
    void* graph = nullptr;
    const driver::Status status = driver::end_capture(device_, stream_, &graph);
    forget_capture();
    if (status != driver::Status::ok) {
      release();
      {{ cookiecutter.DEVICE }}_DRIVER_ERROR(status, "{{ cookiecutter.device }} graph capture failed: ", driver::status_string(status));
    }
    graph_ = graph;
    if (!keep_graph_) {
      instantiate();
      if (!debug_) {  // the executable graph is all a replay needs; debug_dump needs the graph
        driver::graph_destroy(graph_);
        graph_ = nullptr;
      }
    }
  }

  void instantiate() override {
    TORCH_CHECK(graph_ != nullptr,
                "{{ cookiecutter.device }} graph: nothing to instantiate (capture first; with keep_graph=False, "
                "capture_end instantiated it)");
    if (exec_ != nullptr) driver::graph_exec_destroy(exec_);
    exec_ = nullptr;
    {{ cookiecutter.DEVICE }}_CHECK(driver::graph_instantiate(graph_, &exec_));
  }

  void replay() override {
    if (exec_ == nullptr && graph_ != nullptr) instantiate();  // keep_graph=True: the first replay does
    TORCH_CHECK(exec_ != nullptr, "{{ cookiecutter.device }} graph: replay of a graph with no capture");
    c10::DeviceGuard on_device(c10::Device(c10::DeviceType::PrivateUse1, device_));
    const int64_t stream = current_stream_id(device_);
    for (Drawn& d : drawn_) start_draws(d, stream);
    {{ cookiecutter.DEVICE }}_CHECK(driver::graph_launch(exec_, device_, stream));
  }

  void reset() override {
    if (capture_ != 0) {  // a capture left open (an error inside it): end it, keep nothing
      void* graph = nullptr;
      driver::end_capture(device_, stream_, &graph);
      if (graph != nullptr) driver::graph_destroy(graph);
      forget_capture();
    }
    release();
  }

  c10::MempoolId_t pool() const override { return pool_; }

  void enable_debug_mode() override { debug_ = true; }

  void debug_dump(const std::string& path) override {
    TORCH_CHECK(debug_, "{{ cookiecutter.device }} graph: debug_dump needs enable_debug_mode() before the capture");
    TORCH_CHECK(graph_ != nullptr, "{{ cookiecutter.device }} graph: debug_dump before a capture ended");
    {{ cookiecutter.DEVICE }}_CHECK(driver::graph_debug_dump(graph_, path.c_str()));
  }

  // A random kernel captured here draws `count` offsets past the replay's base for `gen`.
  void draw(const at::Generator& gen, Draw* out) {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = std::find_if(drawn_.begin(), drawn_.end(), [&](const Drawn& d) { return d.gen == gen; });
    if (it == drawn_.end()) it = drawn_.insert(drawn_.end(), Drawn{gen, std::make_shared<GraphDraws>(), 0});
    out->seed = 0;
    out->offset = it->count++;
    out->graph = it->draws;
  }

 private:
  void forget_capture() {
    end_allocate_to_pool(capture_);
    std::lock_guard<std::mutex> lock(captures().mu);
    captures().by_id.erase(capture_);
    captures().count -= 1;
    capture_ = 0;
  }

  void release() {
    if (exec_ != nullptr) driver::graph_exec_destroy(exec_);  // a replay still queued keeps its work
    if (graph_ != nullptr) driver::graph_destroy(graph_);
    exec_ = graph_ = nullptr;
    if (holds_pool_) release_pool(device_, pool_);
    holds_pool_ = false;
    drawn_.clear();
  }

  // Reserves this replay's offsets of d.gen now, in host order, and sets them in stream order.
  void start_draws(Drawn& d, int64_t stream) {
    uint64_t seed = 0, base = 0;
    {
      std::lock_guard<std::mutex> lock(d.gen.mutex());
      c10::GeneratorImpl* impl = d.gen.unsafeGetGeneratorImpl();
      seed = impl->current_seed();
      base = impl->get_offset();
      impl->set_offset(base + d.count);
    }
    if (driver::has(driver::Capability::host_tasks)) {
      {{ cookiecutter.DEVICE }}_CHECK(driver::launch_host(device_, stream, "graph random state",
                                              [draws = d.draws, seed, base] {
                                                draws->seed = seed;
                                                draws->base = base;
                                              }));
    } else {  // no host work in stream order: the earlier replays must be done
      {{ cookiecutter.DEVICE }}_CHECK(driver::stream_synchronize(device_, stream));
      d.draws->seed = seed;
      d.draws->base = base;
    }
  }

  const bool keep_graph_;
  bool debug_ = false;
  c10::DeviceIndex device_ = 0;
  int64_t stream_ = 0;
  uint64_t capture_ = 0;  // the driver's id of the capture under way
  c10::MempoolId_t pool_{0, 0};
  bool holds_pool_ = false;
  void* graph_ = nullptr;
  void* exec_ = nullptr;
  std::mutex mu_;  // drawn_, while kernels of the capture reserve offsets (autograd's threads too)
  std::vector<Drawn> drawn_;
};

}  // namespace

bool capturing(c10::DeviceIndex device) {
  return captures().count.load() != 0 && driver::capture_id(device, current_stream_id(device)) != 0;
}

bool draw_in_capture(const at::Generator& gen, Draw* draw) {
  if (captures().count.load() == 0) return false;
  const c10::DeviceIndex device = gen.device().index() >= 0 ? gen.device().index() : current_device();
  const uint64_t capture = driver::capture_id(device, current_stream_id(device));
  if (capture == 0) return false;
  std::lock_guard<std::mutex> lock(captures().mu);
  auto it = captures().by_id.find(capture);
  if (it == captures().by_id.end()) return false;
  it->second->draw(gen, draw);
  return true;
}

}  // namespace {{ cookiecutter.device }}::runtime

// The registry key is c10::DeviceTypeName(PrivateUse1, /*lower_case=*/false): the backend's name
// in upper case once torch.utils.rename_privateuse1_backend has run.
namespace at {
REGISTER_GRAPH_IMPL({{ cookiecutter.DEVICE }}, {{ cookiecutter.device }}::runtime::DeviceGraph);
}  // namespace at
