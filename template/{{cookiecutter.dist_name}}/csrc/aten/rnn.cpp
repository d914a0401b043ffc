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
#include "aten/kernel_support.h"

#include <ATen/core/IListRef.h>
#include <ATen/ops/cat_ops.h>
#include <c10/core/ScalarType.h>
#include <torch/library.h>

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

}  // namespace {{ cookiecutter.device }}::rnn

TORCH_LIBRARY_IMPL(aten, PrivateUse1, m) {
  m.impl("_thnn_fused_lstm_cell", TORCH_FN({{ cookiecutter.device }}::rnn::lstm_cell));
  m.impl("_thnn_fused_lstm_cell_backward_impl", TORCH_FN({{ cookiecutter.device }}::rnn::lstm_cell_backward));
  m.impl("_thnn_fused_gru_cell", TORCH_FN({{ cookiecutter.device }}::rnn::gru_cell));
  m.impl("_thnn_fused_gru_cell_backward", TORCH_FN({{ cookiecutter.device }}::rnn::gru_cell_backward));
}
