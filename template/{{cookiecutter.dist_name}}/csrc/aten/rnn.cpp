// Recurrent cells on {{ cookiecutter.device }}: the fused LSTM and GRU cells behind nn.LSTM, nn.GRU,
// nn.LSTMCell and nn.GRUCell.
//
// On a PrivateUse1 input ATen's LSTM and GRU cells (aten/src/ATen/native/RNN.cpp) take the path CUDA
// takes: the gate matmuls run as ordinary operators, then aten::_thnn_fused_lstm_cell or
// aten::_thnn_fused_gru_cell combine the gates into the new state, and autograd's backward calls
// aten::_thnn_fused_lstm_cell_backward_impl or aten::_thnn_fused_gru_cell_backward (double backward
// uses PyTorch's composite _thnn_differentiable_* formulas instead). Those four have CUDA kernels
// only, so the CPU fallback has nothing to call. Here each is one launch, like every kernel: the
// host checks the arguments, decides the results' sizes and dtypes and allocates them, and queues
// one computation on the current stream, which runs CPU ATen operators (sigmoid, tanh, mul, ...)
// on host aliases of the device memory and writes the results in place.
//
// The forward hands its backward a workspace (derivatives.yaml passes it through unchanged), laid out
// as CUDA's kernels lay it out, row by row:
//   LSTM  [batch, 4*hidden]: the activated gates  input | forget | cell | output
//   GRU   [batch, 5*hidden]: reset | update | new | hx | the hidden new-gate pre-activation (with its bias)
// Half and bfloat16 are computed in float, as CUDA does, and returned in their own dtype; inputs of
// mixed dtypes (autocast: lower-precision gates, a float state) give results in their promoted dtype.
// What a hardware team replaces: the four queued bodies, with one fused elementwise kernel each (a
// forward and its backward must agree on the workspace layout; nothing else reads it).
//
// nn.LSTM (aten::lstm.input) on float32 takes the path the CPU takes instead: the whole sequence of
// each layer and direction is one aten::mkldnn_rnn_layer call (autograd's backward: one
// aten::mkldnn_rnn_layer_backward; double backward: PyTorch's differentiable formula), where the
// cell path makes two matmuls and a fused cell per time step. Both are launches here too, queued
// bodies that run the CPU's fused sequence kernel, so a training step queues a few calls per layer
// rather than thousands of small ones (issue #44: a 2-layer LSTM step went from 2.2-3.2x the CPU's
// time to about 1x). The forward's workspace (what its backward reads) has the size the CPU's
// oneDNN kernel chooses, which no meta kernel knows: the first call of each geometry runs on the
// calling thread and records it; later ones are queued. Other dtypes, projections, no bias, packed
// sequences, evaluation with autograd recording, and torch.backends.mkldnn off keep PyTorch's own
// composite (the cells above). What a hardware team replaces: the two sequence bodies, with its
// SDK's fused RNN layer (any workspace layout its backward agrees on), or the lstm registration, to
// keep the cells.
#include "aten/kernel_support.h"

#include <ATen/Context.h>
#include <ATen/core/IListRef.h>
#include <ATen/ops/cat_ops.h>
#include <ATen/ops/dropout_ops.h>
#include <ATen/ops/lstm_native.h>
#include <ATen/ops/mkldnn_rnn_layer_backward_ops.h>
#include <ATen/ops/mkldnn_rnn_layer_ops.h>
#include <ATen/ops/stack_ops.h>
#include <c10/core/GradMode.h>
#include <c10/core/ScalarType.h>
#include <torch/library.h>

#include <map>
#include <mutex>
#include <tuple>

namespace {{ cookiecutter.device }}::rnn {

namespace {

// The dtype the gate arithmetic runs in: float for half and bfloat16 (as CUDA's kernels accumulate).
c10::ScalarType compute_type(c10::ScalarType t) {
  return (t == c10::kHalf || t == c10::kBFloat16) ? c10::kFloat : t;
}

// In the queued work: a host tensor in the compute dtype.
at::Tensor in_type(const at::Tensor& t, c10::ScalarType type) {
  return t.scalar_type() == type ? t : t.to(type);
}

at::Tensor one_minus(const at::Tensor& t) { return t.neg().add(1); }

at::Tensor cat_columns(std::initializer_list<at::Tensor> parts) {
  return at::_ops::cat::call(std::vector<at::Tensor>(parts), 1);
}

at::Tensor sum_rows(const at::Tensor& t) {
  const int64_t dim = 0;
  return t.sum(at::IntArrayRef(&dim, 1), /*keepdim=*/false, std::nullopt);
}

// Writes a result computed on the host into the host alias of the output the launch allocated
// (converting to the output's dtype).
void put(at::Tensor& out_alias, const at::Tensor& value) {
  if (out_alias.defined()) out_alias.copy_(value);
}

// A new contiguous device tensor on the current device.
at::Tensor new_output(c10::IntArrayRef sizes, c10::ScalarType type) {
  return kernels::empty_device(sizes, {}, c10::TensorOptions().dtype(type));
}

// PyTorch's checks of the fused cells' inputs (factor: 4 gates for the LSTM, 3 for the GRU).
void check_cell(const char* op, const at::Tensor& input_gates, const at::Tensor& hidden_gates,
                const at::Tensor& input_bias, const at::Tensor& hidden_bias, int64_t factor, const at::Tensor& prev) {
  TORCH_CHECK(input_gates.dim() == 2, op, ": expected 2-D input_gates, got ", input_gates.dim(), "-D");
  TORCH_CHECK(input_gates.sizes() == hidden_gates.sizes(), op, ": input_gates ", input_gates.sizes(),
              " and hidden_gates ", hidden_gates.sizes(), " differ in size");
  const int64_t gates = input_gates.size(1);
  TORCH_CHECK(gates % factor == 0, op, ": ", gates, " gate columns are not ", factor, " gates");
  if (input_bias.defined() || hidden_bias.defined()) {
    TORCH_CHECK(input_bias.defined() && hidden_bias.defined(), op, ": give both biases or neither");
    TORCH_CHECK(input_bias.dim() == 1 && input_bias.numel() == gates, op, ": expected input_bias of size [", gates,
                "], got ", input_bias.sizes());
    TORCH_CHECK(input_bias.sizes() == hidden_bias.sizes(), op, ": input_bias ", input_bias.sizes(),
                " and hidden_bias ", hidden_bias.sizes(), " differ in size");
  }
  TORCH_CHECK(prev.dim() == 2 && prev.size(0) == input_gates.size(0) && prev.size(1) * factor == gates, op,
              ": expected a hidden state of size [", input_gates.size(0), ", ", gates / factor, "], got ", prev.sizes());
}

// The dtype of a cell's results: its inputs' promoted dtype. They differ under autocast, where the
// gate matmuls run in lower precision and the state stays float (the CPU's unfused cell promotes too).
c10::ScalarType result_type(std::initializer_list<const at::Tensor*> tensors) {
  std::optional<c10::ScalarType> type;
  for (const at::Tensor* t : tensors) {
    if (t->defined()) type = type.has_value() ? c10::promoteTypes(*type, t->scalar_type()) : t->scalar_type();
  }
  return *type;
}

at::Tensor value_or_undefined(const std::optional<at::Tensor>& t) { return t.has_value() ? *t : at::Tensor(); }

// ---- the queued bodies: host tensors in, host results out (replace with your SDK's kernels) ----

struct LstmForward {
  at::Tensor hy, cy, workspace;
};

LstmForward lstm_forward(const at::Tensor& input_gates, const at::Tensor& hidden_gates, const at::Tensor& cx,
                         const at::Tensor& input_bias, const at::Tensor& hidden_bias, c10::ScalarType acc) {
  at::Tensor gates = in_type(input_gates, acc).add(in_type(hidden_gates, acc));
  if (input_bias.defined()) gates.add_(in_type(input_bias, acc)).add_(in_type(hidden_bias, acc));
  // the workspace is the activated gates, in place: input | forget | cell | output
  const std::vector<at::Tensor> g = gates.chunk(4, 1);
  g[0].sigmoid_();
  g[1].sigmoid_();
  g[2].tanh_();
  g[3].sigmoid_();
  const at::Tensor &in_gate = g[0], &forget_gate = g[1], &cell_gate = g[2], &out_gate = g[3];
  at::Tensor cy = forget_gate.mul(in_type(cx, acc)).addcmul_(in_gate, cell_gate);
  at::Tensor hy = out_gate.mul(cy.tanh());
  return {hy, cy, gates};
}

struct LstmBackward {
  at::Tensor grad_gates, grad_cx;
};

LstmBackward lstm_backward(const at::Tensor& grad_hy, const at::Tensor& grad_cy, const at::Tensor& cx,
                           const at::Tensor& cy, const at::Tensor& workspace, c10::ScalarType acc) {
  const std::vector<at::Tensor> w = in_type(workspace, acc).chunk(4, 1);
  const at::Tensor &in_gate = w[0], &forget_gate = w[1], &cell_gate = w[2], &out_gate = w[3];
  // The gradient reaching the cell state: through cy directly and through hy = out * tanh(cy).
  at::Tensor grad_cell = grad_cy.defined() ? in_type(grad_cy, acc) : at::Tensor();
  at::Tensor grad_out;
  if (grad_hy.defined()) {
    const at::Tensor go = in_type(grad_hy, acc);
    const at::Tensor tanh_cy = in_type(cy, acc).tanh();
    grad_out = go.mul(tanh_cy);
    at::Tensor through_hy = go.mul(out_gate).mul_(one_minus(tanh_cy.mul(tanh_cy)));
    grad_cell = grad_cell.defined() ? through_hy.add_(grad_cell) : through_hy;
  } else {
    grad_out = out_gate.new_zeros(out_gate.sizes());
  }
  // Back through the activations: sigmoid' = s (1 - s), tanh' = 1 - t^2.
  const at::Tensor grad_in = grad_cell.mul(cell_gate).mul_(in_gate.mul(one_minus(in_gate)));
  const at::Tensor grad_forget = grad_cell.mul(in_type(cx, acc)).mul_(forget_gate.mul(one_minus(forget_gate)));
  const at::Tensor grad_cell_gate = grad_cell.mul(in_gate).mul_(one_minus(cell_gate.mul(cell_gate)));
  grad_out.mul_(out_gate.mul(one_minus(out_gate)));
  return {cat_columns({grad_in, grad_forget, grad_cell_gate, grad_out}), grad_cell.mul(forget_gate)};
}

struct GruForward {
  at::Tensor hy, workspace;
};

GruForward gru_forward(const at::Tensor& input_gates, const at::Tensor& hidden_gates, const at::Tensor& hx,
                       const at::Tensor& input_bias, const at::Tensor& hidden_bias, c10::ScalarType acc) {
  at::Tensor input_side = in_type(input_gates, acc);
  at::Tensor hidden_side = in_type(hidden_gates, acc);
  if (input_bias.defined()) {
    input_side = input_side.add(in_type(input_bias, acc));
    hidden_side = hidden_side.add(in_type(hidden_bias, acc));
  }
  const std::vector<at::Tensor> i = input_side.chunk(3, 1);
  const std::vector<at::Tensor> h = hidden_side.chunk(3, 1);
  const at::Tensor reset_gate = i[0].add(h[0]).sigmoid_();
  const at::Tensor update_gate = i[1].add(h[1]).sigmoid_();
  const at::Tensor& hidden_new = h[2];  // enters the new gate scaled by the reset gate
  const at::Tensor new_gate = i[2].addcmul(reset_gate, hidden_new).tanh_();
  const at::Tensor hx_acc = in_type(hx, acc);
  const at::Tensor hy = new_gate.addcmul(update_gate, hx_acc.sub(new_gate));
  return {hy, cat_columns({reset_gate, update_gate, new_gate, hx_acc, hidden_new})};
}

struct GruBackward {
  at::Tensor grad_input_gates, grad_hidden_gates, grad_hx;
};

GruBackward gru_backward(const at::Tensor& grad_hy, const at::Tensor& workspace, c10::ScalarType acc) {
  const std::vector<at::Tensor> w = in_type(workspace, acc).chunk(5, 1);
  const at::Tensor &reset_gate = w[0], &update_gate = w[1], &new_gate = w[2], &hx = w[3], &hidden_new = w[4];
  const at::Tensor go = in_type(grad_hy, acc);
  // hy = new + update * (hx - new)
  const at::Tensor grad_update = go.mul(hx.sub(new_gate)).mul_(update_gate.mul(one_minus(update_gate)));
  const at::Tensor grad_hx = go.mul(update_gate);
  const at::Tensor grad_new = go.mul(one_minus(update_gate)).mul_(one_minus(new_gate.mul(new_gate)));
  const at::Tensor grad_hidden_new = grad_new.mul(reset_gate);
  const at::Tensor grad_reset = grad_new.mul(hidden_new).mul_(reset_gate.mul(one_minus(reset_gate)));
  return {cat_columns({grad_reset, grad_update, grad_new}), cat_columns({grad_reset, grad_update, grad_hidden_new}),
          grad_hx};
}

}  // namespace

// ---- the operators: checks and outputs on the host, one launch each ----------------------------

// aten::_thnn_fused_lstm_cell -> (hy, cy, workspace)
std::tuple<at::Tensor, at::Tensor, at::Tensor> lstm_cell(const at::Tensor& input_gates, const at::Tensor& hidden_gates,
                                                         const at::Tensor& cx,
                                                         const std::optional<at::Tensor>& input_bias_opt,
                                                         const std::optional<at::Tensor>& hidden_bias_opt) {
  const char* op = "_thnn_fused_lstm_cell";
  const c10::Device device = kernels::common_device(op, kernels::CpuArgs::rejected, input_gates, hidden_gates, cx,
                                                    input_bias_opt, hidden_bias_opt);
  c10::DeviceGuard guard(device);
  const at::Tensor input_bias = value_or_undefined(input_bias_opt);
  const at::Tensor hidden_bias = value_or_undefined(hidden_bias_opt);
  check_cell(op, input_gates, hidden_gates, input_bias, hidden_bias, 4, cx);
  const c10::ScalarType type = result_type({&input_gates, &hidden_gates, &cx, &input_bias, &hidden_bias});
  const c10::ScalarType acc = compute_type(type);
  at::Tensor hy = new_output(cx.sizes(), type);
  at::Tensor cy = new_output(cx.sizes(), type);
  at::Tensor workspace = new_output(input_gates.sizes(), type);
  kernels::launch(device, "aten::_thnn_fused_lstm_cell",
                  [ig = kernels::held(input_gates), hg = kernels::held(hidden_gates), c = kernels::held(cx),
                   ib = kernels::held(input_bias), hb = kernels::held(hidden_bias), hy_h = kernels::held(hy),
                   cy_h = kernels::held(cy), ws_h = kernels::held(workspace), acc]() mutable {
                    LstmForward r = lstm_forward(ig.get(), hg.get(), c.get(), ib.get(), hb.get(), acc);
                    put(hy_h.get(), r.hy);
                    put(cy_h.get(), r.cy);
                    put(ws_h.get(), r.workspace);
                  });
  return {hy, cy, workspace};
}

// aten::_thnn_fused_lstm_cell_backward_impl -> (grad_gates, grad_cx, grad_bias); grad_gates serves
// both gate inputs and grad_bias both biases (the composite _thnn_fused_lstm_cell_backward duplicates them).
std::tuple<at::Tensor, at::Tensor, at::Tensor> lstm_cell_backward(const std::optional<at::Tensor>& grad_hy_opt,
                                                                  const std::optional<at::Tensor>& grad_cy_opt,
                                                                  const at::Tensor& cx, const at::Tensor& cy,
                                                                  const at::Tensor& workspace, bool has_bias) {
  const char* op = "_thnn_fused_lstm_cell_backward_impl";
  const at::Tensor grad_hy = value_or_undefined(grad_hy_opt);
  const at::Tensor grad_cy = value_or_undefined(grad_cy_opt);
  if (!grad_hy.defined() && !grad_cy.defined()) return {};
  const c10::Device device =
      kernels::common_device(op, kernels::CpuArgs::rejected, grad_hy_opt, grad_cy_opt, cx, cy, workspace);
  c10::DeviceGuard guard(device);
  const at::Tensor& some_grad = grad_hy.defined() ? grad_hy : grad_cy;
  TORCH_CHECK(some_grad.dim() == 2, op, ": expected 2-D gradients, got ", some_grad.sizes());
  for (const at::Tensor* t : {&grad_hy, &grad_cy, &cx, &cy}) {
    TORCH_CHECK(!t->defined() || t->sizes() == some_grad.sizes(), op, ": expected size ", some_grad.sizes(), ", got ",
                t->sizes());
  }
  TORCH_CHECK(workspace.dim() == 2 && workspace.size(0) == cx.size(0) && workspace.size(1) == 4 * cx.size(1), op,
              ": expected a workspace of size [", cx.size(0), ", ", 4 * cx.size(1), "], got ", workspace.sizes());
  const c10::ScalarType type = workspace.scalar_type();
  const c10::ScalarType acc = compute_type(type);
  at::Tensor grad_gates = new_output(workspace.sizes(), type);
  at::Tensor grad_cx = new_output(cx.sizes(), cx.scalar_type());
  at::Tensor grad_bias = has_bias ? new_output({workspace.size(1)}, type) : at::Tensor();
  kernels::launch(device, "aten::_thnn_fused_lstm_cell_backward_impl",
                  [ghy = kernels::held(grad_hy), gcy = kernels::held(grad_cy), c = kernels::held(cx),
                   cy_in = kernels::held(cy), ws = kernels::held(workspace), gg_h = kernels::held(grad_gates),
                   gcx_h = kernels::held(grad_cx), gb_h = kernels::held(grad_bias), acc]() mutable {
                    LstmBackward r = lstm_backward(ghy.get(), gcy.get(), c.get(), cy_in.get(), ws.get(), acc);
                    put(gg_h.get(), r.grad_gates);
                    put(gcx_h.get(), r.grad_cx);
                    if (gb_h.get().defined()) put(gb_h.get(), sum_rows(r.grad_gates));
                  });
  return {grad_gates, grad_cx, grad_bias};
}

// aten::_thnn_fused_gru_cell -> (hy, workspace)
std::tuple<at::Tensor, at::Tensor> gru_cell(const at::Tensor& input_gates, const at::Tensor& hidden_gates,
                                            const at::Tensor& hx, const std::optional<at::Tensor>& input_bias_opt,
                                            const std::optional<at::Tensor>& hidden_bias_opt) {
  const char* op = "_thnn_fused_gru_cell";
  const c10::Device device = kernels::common_device(op, kernels::CpuArgs::rejected, input_gates, hidden_gates, hx,
                                                    input_bias_opt, hidden_bias_opt);
  c10::DeviceGuard guard(device);
  const at::Tensor input_bias = value_or_undefined(input_bias_opt);
  const at::Tensor hidden_bias = value_or_undefined(hidden_bias_opt);
  check_cell(op, input_gates, hidden_gates, input_bias, hidden_bias, 3, hx);
  const c10::ScalarType type = result_type({&input_gates, &hidden_gates, &hx, &input_bias, &hidden_bias});
  const c10::ScalarType acc = compute_type(type);
  at::Tensor hy = new_output(hx.sizes(), type);
  at::Tensor workspace = new_output({hx.size(0), 5 * hx.size(1)}, type);
  kernels::launch(device, "aten::_thnn_fused_gru_cell",
                  [ig = kernels::held(input_gates), hg = kernels::held(hidden_gates), h = kernels::held(hx),
                   ib = kernels::held(input_bias), hb = kernels::held(hidden_bias), hy_h = kernels::held(hy),
                   ws_h = kernels::held(workspace), acc]() mutable {
                    GruForward r = gru_forward(ig.get(), hg.get(), h.get(), ib.get(), hb.get(), acc);
                    put(hy_h.get(), r.hy);
                    put(ws_h.get(), r.workspace);
                  });
  return {hy, workspace};
}

// aten::_thnn_fused_gru_cell_backward -> (grad_input_gates, grad_hidden_gates, grad_hx, grad_input_bias,
// grad_hidden_bias)
std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor, at::Tensor> gru_cell_backward(const at::Tensor& grad_hy,
                                                                                          const at::Tensor& workspace,
                                                                                          bool has_bias) {
  const char* op = "_thnn_fused_gru_cell_backward";
  const c10::Device device = kernels::common_device(op, kernels::CpuArgs::rejected, grad_hy, workspace);
  c10::DeviceGuard guard(device);
  TORCH_CHECK(grad_hy.dim() == 2, op, ": expected a 2-D grad_hy, got ", grad_hy.sizes());
  TORCH_CHECK(workspace.dim() == 2 && workspace.size(0) == grad_hy.size(0) && workspace.size(1) == 5 * grad_hy.size(1),
              op, ": expected a workspace of size [", grad_hy.size(0), ", ", 5 * grad_hy.size(1), "], got ",
              workspace.sizes());
  const c10::ScalarType type = grad_hy.scalar_type();
  const c10::ScalarType acc = compute_type(type);
  const int64_t batch = grad_hy.size(0), gates = 3 * grad_hy.size(1);
  at::Tensor grad_input_gates = new_output({batch, gates}, type);
  at::Tensor grad_hidden_gates = new_output({batch, gates}, type);
  at::Tensor grad_hx = new_output(grad_hy.sizes(), type);
  at::Tensor grad_input_bias, grad_hidden_bias;
  if (has_bias) {
    grad_input_bias = new_output({gates}, type);
    grad_hidden_bias = new_output({gates}, type);
  }
  kernels::launch(device, "aten::_thnn_fused_gru_cell_backward",
                  [ghy = kernels::held(grad_hy), ws = kernels::held(workspace), gi_h = kernels::held(grad_input_gates),
                   gh_h = kernels::held(grad_hidden_gates), ghx_h = kernels::held(grad_hx),
                   gib_h = kernels::held(grad_input_bias), ghb_h = kernels::held(grad_hidden_bias), acc]() mutable {
                    GruBackward r = gru_backward(ghy.get(), ws.get(), acc);
                    put(gi_h.get(), r.grad_input_gates);
                    put(gh_h.get(), r.grad_hidden_gates);
                    put(ghx_h.get(), r.grad_hx);
                    if (gib_h.get().defined()) {
                      put(gib_h.get(), sum_rows(r.grad_input_gates));
                      put(ghb_h.get(), sum_rows(r.grad_hidden_gates));
                    }
                  });
  return {grad_input_gates, grad_hidden_gates, grad_hx, grad_input_bias, grad_hidden_bias};
}

namespace {

constexpr int64_t kLstmMode = 2;  // mkldnn_rnn_layer's mode argument for an LSTM (the CPU's value)

// Every tensor defined, float32 and on the device.
bool float_on_device(at::TensorList tensors) {
  for (const at::Tensor& t : tensors) {
    if (!t.defined() || t.scalar_type() != c10::kFloat || !t.is_privateuseone()) return false;
  }
  return true;
}

// Whether aten::lstm.input can run as the CPU runs it (one mkldnn_rnn_layer per layer and direction).
bool sequence_path(const at::Tensor& input, at::TensorList hx, at::TensorList params, bool has_biases,
                   int64_t num_layers, bool train, bool bidirectional) {
  const int64_t directions = bidirectional ? 2 : 1;
  if (!at::hasMKLDNN() || !at::globalContext().userEnabledMkldnn()) return false;
  if (!has_biases || input.dim() != 3 || input.numel() == 0 || hx.size() != 2) return false;
  if (static_cast<int64_t>(params.size()) != 4 * num_layers * directions) return false;  // 5 with proj_size
  if (!float_on_device({input}) || !float_on_device(hx) || !float_on_device(params)) return false;
  if (hx[0].dim() != 3 || hx[0].size(0) != num_layers * directions || hx[0].size(2) != params[1].size(1)) return false;
  return train || !c10::GradMode::is_enabled();  // evaluation that records autograd: the workspace is train's
}

}  // namespace

// ---- a layer's whole sequence: aten::mkldnn_rnn_layer and its backward --------------------------

namespace {

// The workspace the CPU kernel returns for a geometry: its size and dtype (numel -1: none).
struct Workspace {
  int64_t numel = -1;
  c10::ScalarType type = c10::kByte;
};
std::mutex workspaces_mu;
std::map<std::vector<int64_t>, Workspace> workspaces;

std::vector<int64_t> geometry(const at::Tensor& input, const at::Tensor& w0, const at::Tensor& w1, bool reverse,
                              c10::IntArrayRef batch_sizes, int64_t mode, int64_t hidden_size, int64_t num_layers,
                              bool has_biases, bool bidirectional, bool batch_first, bool train) {
  std::vector<int64_t> key(input.sizes().begin(), input.sizes().end());
  key.insert(key.end(), w0.sizes().begin(), w0.sizes().end());
  key.insert(key.end(), w1.sizes().begin(), w1.sizes().end());
  key.insert(key.end(), {static_cast<int64_t>(input.scalar_type()), reverse, mode, hidden_size, num_layers, has_biases,
                         bidirectional, batch_first, train, -1});
  key.insert(key.end(), batch_sizes.begin(), batch_sizes.end());
  return key;
}

}  // namespace

std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor> rnn_layer(
    const at::Tensor& input, const at::Tensor& w0, const at::Tensor& w1, const at::Tensor& w2, const at::Tensor& w3,
    const at::Tensor& hx, const at::Tensor& cx, bool reverse, c10::IntArrayRef batch_sizes, int64_t mode,
    int64_t hidden_size, int64_t num_layers, bool has_biases, bool bidirectional, bool batch_first, bool train) {
  const c10::Device device =
      kernels::common_device("aten::mkldnn_rnn_layer", kernels::CpuArgs::rejected, input, w0, w1, w2, w3, hx, cx);
  c10::DeviceGuard guard(device);
  namespace k = kernels;
  std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor> meta;
  bool queue = k::on_meta([&] {
    meta = at::_ops::mkldnn_rnn_layer::call(k::meta_like(input), k::meta_like(w0), k::meta_like(w1), k::meta_like(w2),
                                            k::meta_like(w3), k::meta_like(hx), k::meta_like(cx), reverse, batch_sizes,
                                            mode, hidden_size, num_layers, has_biases, bidirectional, batch_first, train);
  });
  const std::vector<int64_t> key = geometry(input, w0, w1, reverse, batch_sizes, mode, hidden_size, num_layers,
                                            has_biases, bidirectional, batch_first, train);
  std::optional<Workspace> known;
  {
    std::lock_guard<std::mutex> lock(workspaces_mu);
    auto it = workspaces.find(key);
    if (it != workspaces.end()) known = it->second;
  }
  queue = queue && known.has_value();  // else run on the calling thread, and learn the workspace's size
  at::Tensor output, hy, cy, workspace;
  if (queue) {
    output = k::empty_like_meta(std::get<0>(meta), device);
    hy = k::empty_like_meta(std::get<1>(meta), device);
    cy = k::empty_like_meta(std::get<2>(meta), device);
    if (known->numel >= 0) workspace = new_output({known->numel}, known->type);
  }
  k::launch(device, "aten::mkldnn_rnn_layer", queue,
            [input_h = k::held(input), w0_h = k::held(w0), w1_h = k::held(w1), w2_h = k::held(w2), w3_h = k::held(w3),
             hx_h = k::held(hx), cx_h = k::held(cx), batch = k::keep(batch_sizes), out_h = k::held(output),
             hy_h = k::held(hy), cy_h = k::held(cy), ws_h = k::held(workspace), reverse, mode, hidden_size, num_layers,
             has_biases, bidirectional, batch_first, train]() mutable {
              auto r = at::_ops::mkldnn_rnn_layer::call(input_h.get(), w0_h.get(), w1_h.get(), w2_h.get(), w3_h.get(),
                                                        hx_h.get(), cx_h.get(), reverse, k::pass(batch), mode,
                                                        hidden_size, num_layers, has_biases, bidirectional, batch_first,
                                                        train);
              k::copy_result(out_h.get(), std::get<0>(r));
              k::copy_result(hy_h.get(), std::get<1>(r));
              k::copy_result(cy_h.get(), std::get<2>(r));
              if (std::get<3>(r).defined()) k::copy_result(ws_h.get(), std::get<3>(r));
            });
  if (!known.has_value()) {
    Workspace seen;
    if (workspace.defined()) seen = Workspace{workspace.numel(), workspace.scalar_type()};
    std::lock_guard<std::mutex> lock(workspaces_mu);
    workspaces.emplace(key, seen);
  }
  return {output, hy, cy, workspace};
}

std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor, at::Tensor, at::Tensor, at::Tensor> rnn_layer_backward(
    const at::Tensor& input, const at::Tensor& w1, const at::Tensor& w2, const at::Tensor& w3, const at::Tensor& w4,
    const at::Tensor& hx, const at::Tensor& cx_tmp, const at::Tensor& output, const at::Tensor& hy,
    const at::Tensor& cy, const std::optional<at::Tensor>& grad_output, const std::optional<at::Tensor>& grad_hy,
    const std::optional<at::Tensor>& grad_cy, bool reverse, int64_t mode, int64_t hidden_size, int64_t num_layers,
    bool has_biases, bool train, bool bidirectional, c10::IntArrayRef batch_sizes, bool batch_first,
    const at::Tensor& workspace) {
  const c10::Device device =
      kernels::common_device("aten::mkldnn_rnn_layer_backward", kernels::CpuArgs::rejected, input, w1, w2, w3, w4, hx,
                             cx_tmp, output, hy, cy, grad_output, grad_hy, grad_cy, workspace);
  c10::DeviceGuard guard(device);
  namespace k = kernels;
  std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor, at::Tensor, at::Tensor, at::Tensor> meta;
  const bool queue = k::on_meta([&] {
    meta = at::_ops::mkldnn_rnn_layer_backward::call(
        k::meta_like(input), k::meta_like(w1), k::meta_like(w2), k::meta_like(w3), k::meta_like(w4), k::meta_like(hx),
        k::meta_like(cx_tmp), k::meta_like(output), k::meta_like(hy), k::meta_like(cy), k::meta_like(grad_output),
        k::meta_like(grad_hy), k::meta_like(grad_cy), reverse, mode, hidden_size, num_layers, has_biases, train,
        bidirectional, batch_sizes, batch_first, k::meta_like(workspace));
  });
  at::Tensor g0 = k::empty_like_meta(std::get<0>(meta), device), g1 = k::empty_like_meta(std::get<1>(meta), device),
             g2 = k::empty_like_meta(std::get<2>(meta), device), g3 = k::empty_like_meta(std::get<3>(meta), device),
             g4 = k::empty_like_meta(std::get<4>(meta), device), g5 = k::empty_like_meta(std::get<5>(meta), device),
             g6 = k::empty_like_meta(std::get<6>(meta), device);
  k::launch(device, "aten::mkldnn_rnn_layer_backward", queue,
            [input_h = k::held(input), w1_h = k::held(w1), w2_h = k::held(w2), w3_h = k::held(w3), w4_h = k::held(w4),
             hx_h = k::held(hx), cx_h = k::held(cx_tmp), out_h = k::held(output), hy_h = k::held(hy),
             cy_h = k::held(cy), go_h = k::held(grad_output), ghy_h = k::held(grad_hy), gcy_h = k::held(grad_cy),
             ws_h = k::held(workspace), batch = k::keep(batch_sizes), g0_h = k::held(g0), g1_h = k::held(g1),
             g2_h = k::held(g2), g3_h = k::held(g3), g4_h = k::held(g4), g5_h = k::held(g5), g6_h = k::held(g6),
             reverse, mode, hidden_size, num_layers, has_biases, train, bidirectional, batch_first]() mutable {
              auto r = at::_ops::mkldnn_rnn_layer_backward::call(
                  input_h.get(), w1_h.get(), w2_h.get(), w3_h.get(), w4_h.get(), hx_h.get(), cx_h.get(), out_h.get(),
                  hy_h.get(), cy_h.get(), go_h.get(), ghy_h.get(), gcy_h.get(), reverse, mode, hidden_size,
                  num_layers, has_biases, train, bidirectional, k::pass(batch), batch_first, ws_h.get());
              k::copy_result(g0_h.get(), std::get<0>(r));
              k::copy_result(g1_h.get(), std::get<1>(r));
              k::copy_result(g2_h.get(), std::get<2>(r));
              k::copy_result(g3_h.get(), std::get<3>(r));
              k::copy_result(g4_h.get(), std::get<4>(r));
              k::copy_result(g5_h.get(), std::get<5>(r));
              k::copy_result(g6_h.get(), std::get<6>(r));
            });
  return {g0, g1, g2, g3, g4, g5, g6};
}

// aten::lstm.input, for AutogradPrivateUse1 (autograd records each mkldnn_rnn_layer it calls) and for
// PrivateUse1 (inference mode, below autograd).
std::tuple<at::Tensor, at::Tensor, at::Tensor> lstm(const at::Tensor& input, at::TensorList hx, at::TensorList params,
                                                    bool has_biases, int64_t num_layers, double dropout, bool train,
                                                    bool bidirectional, bool batch_first) {
  if (!sequence_path(input, hx, params, has_biases, num_layers, train, bidirectional)) {
    return at::native::lstm(input, hx, params, has_biases, num_layers, dropout, train, bidirectional, batch_first);
  }
  const int64_t directions = bidirectional ? 2 : 1;
  const int64_t hidden = params[1].size(1);
  const at::Tensor h0 = hx[0].contiguous(), c0 = hx[1].contiguous();
  at::Tensor layer_input = (batch_first ? input.transpose(0, 1) : input).contiguous();
  std::vector<at::Tensor> hy, cy;
  for (int64_t layer = 0; layer < num_layers; ++layer) {
    std::vector<at::Tensor> outputs;
    for (int64_t direction = 0; direction < directions; ++direction) {
      const int64_t index = layer * directions + direction;
      const at::Tensor* w = &params[4 * index];  // weight_ih, weight_hh, bias_ih, bias_hh
      auto result = at::_ops::mkldnn_rnn_layer::call(layer_input, w[0], w[1], w[2], w[3], h0[index], c0[index],
                                                     /*reverse=*/direction == 1, /*batch_sizes=*/{}, kLstmMode, hidden,
                                                     num_layers, has_biases, bidirectional, /*batch_first=*/false, train);
      outputs.push_back(std::get<0>(result));
      hy.push_back(std::get<1>(result));
      cy.push_back(std::get<2>(result));
    }
    layer_input = directions == 1 ? outputs[0] : at::_ops::cat::call(outputs, -1);
    if (dropout != 0 && train && layer + 1 < num_layers) layer_input = at::_ops::dropout::call(layer_input, dropout, true);
  }
  at::Tensor output = batch_first ? layer_input.transpose(0, 1) : layer_input;
  return {output, at::_ops::stack::call(hy, 0), at::_ops::stack::call(cy, 0)};
}

}  // namespace {{ cookiecutter.device }}::rnn

TORCH_LIBRARY_IMPL(aten, AutogradPrivateUse1, m) {
  m.impl("lstm.input", TORCH_FN({{ cookiecutter.device }}::rnn::lstm));
}

TORCH_LIBRARY_IMPL(aten, PrivateUse1, m) {
  m.impl("lstm.input", TORCH_FN({{ cookiecutter.device }}::rnn::lstm));
  m.impl("mkldnn_rnn_layer", TORCH_FN({{ cookiecutter.device }}::rnn::rnn_layer));
  m.impl("mkldnn_rnn_layer_backward", TORCH_FN({{ cookiecutter.device }}::rnn::rnn_layer_backward));
  m.impl("_thnn_fused_lstm_cell", TORCH_FN({{ cookiecutter.device }}::rnn::lstm_cell));
  m.impl("_thnn_fused_lstm_cell_backward_impl", TORCH_FN({{ cookiecutter.device }}::rnn::lstm_cell_backward));
  m.impl("_thnn_fused_gru_cell", TORCH_FN({{ cookiecutter.device }}::rnn::gru_cell));
  m.impl("_thnn_fused_gru_cell_backward", TORCH_FN({{ cookiecutter.device }}::rnn::gru_cell_backward));
}
