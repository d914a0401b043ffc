// Recurrent cells on {{ cookiecutter.device }}: the fused LSTM and GRU cells behind nn.LSTM, nn.GRU,
// nn.LSTMCell and nn.GRUCell.
//
// On a PrivateUse1 input ATen's LSTM and GRU cells (aten/src/ATen/native/RNN.cpp) take the path CUDA
// takes: the gate matmuls run as ordinary operators, then aten::_thnn_fused_lstm_cell or
// aten::_thnn_fused_gru_cell combine the gates into the new state, and autograd's backward calls
// aten::_thnn_fused_lstm_cell_backward_impl or aten::_thnn_fused_gru_cell_backward (double backward
// uses PyTorch's composite _thnn_differentiable_* formulas instead). Those four have CUDA kernels
// only, so the CPU fallback has nothing to call. Here each is composed of ATen operators on the
// device tensors (sigmoid, tanh, mul, add, cat, sum), so the cells run wherever the device's
// elementwise operators run, natively or through the fallback.
//
// The forward hands its backward a workspace (derivatives.yaml passes it through unchanged), laid out
// as CUDA's kernels lay it out, row by row:
//   LSTM  [batch, 4*hidden]: the activated gates  input | forget | cell | output
//   GRU   [batch, 5*hidden]: reset | update | new | hx | the hidden new-gate pre-activation (with its bias)
// Half and bfloat16 are computed in float, as CUDA does, and returned in their own dtype; inputs of
// mixed dtypes (autocast: lower-precision gates, a float state) give results in their promoted dtype.
// What a hardware team replaces: the four bodies, with one fused elementwise kernel each (a forward
// and its backward must agree on the workspace layout; nothing else reads it).
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

at::Tensor in_type(const at::Tensor& t, c10::ScalarType type) {
  return t.scalar_type() == type ? t : t.to(type);
}

at::Tensor one_minus(const at::Tensor& t) { return t.neg().add(1); }

at::Tensor cat_columns(std::initializer_list<at::Tensor> parts) {
  return at::_ops::cat::call(std::vector<at::Tensor>(parts), 1);
}

at::Tensor sum_rows(const at::Tensor& t, c10::ScalarType type) {
  const int64_t dim = 0;
  return in_type(t.sum(at::IntArrayRef(&dim, 1), /*keepdim=*/false, std::nullopt), type);
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

}  // namespace

// aten::_thnn_fused_lstm_cell -> (hy, cy, workspace)
std::tuple<at::Tensor, at::Tensor, at::Tensor> lstm_cell(const at::Tensor& input_gates, const at::Tensor& hidden_gates,
                                                         const at::Tensor& cx,
                                                         const std::optional<at::Tensor>& input_bias_opt,
                                                         const std::optional<at::Tensor>& hidden_bias_opt) {
  const char* op = "_thnn_fused_lstm_cell";
  const c10::Device device = kernels::common_device(op, kernels::CpuArgs::rejected, input_gates, hidden_gates, cx,
                                                    input_bias_opt, hidden_bias_opt);
  c10::OptionalDeviceGuard guard(device);
  const at::Tensor input_bias = value_or_undefined(input_bias_opt);
  const at::Tensor hidden_bias = value_or_undefined(hidden_bias_opt);
  check_cell(op, input_gates, hidden_gates, input_bias, hidden_bias, 4, cx);
  const c10::ScalarType type = result_type({&input_gates, &hidden_gates, &cx, &input_bias, &hidden_bias});
  const c10::ScalarType acc = compute_type(type);

  at::Tensor gates = in_type(input_gates, acc).add(in_type(hidden_gates, acc));
  if (input_bias.defined()) gates = gates.add(in_type(input_bias, acc)).add(in_type(hidden_bias, acc));
  const std::vector<at::Tensor> g = gates.chunk(4, 1);
  const at::Tensor in_gate = g[0].sigmoid();
  const at::Tensor forget_gate = g[1].sigmoid();
  const at::Tensor cell_gate = g[2].tanh();
  const at::Tensor out_gate = g[3].sigmoid();

  const at::Tensor cy = forget_gate.mul(in_type(cx, acc)).add(in_gate.mul(cell_gate));
  const at::Tensor hy = out_gate.mul(cy.tanh());
  const at::Tensor workspace = cat_columns({in_gate, forget_gate, cell_gate, out_gate});
  return {in_type(hy, type), in_type(cy, type), in_type(workspace, type)};
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
  c10::OptionalDeviceGuard guard(device);
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

  const std::vector<at::Tensor> w = in_type(workspace, acc).chunk(4, 1);
  const at::Tensor &in_gate = w[0], &forget_gate = w[1], &cell_gate = w[2], &out_gate = w[3];
  // The gradient reaching the cell state: through cy directly and through hy = out * tanh(cy).
  at::Tensor grad_cell = grad_cy.defined() ? in_type(grad_cy, acc) : at::Tensor();
  at::Tensor grad_out;
  if (grad_hy.defined()) {
    const at::Tensor go = in_type(grad_hy, acc);
    const at::Tensor tanh_cy = in_type(cy, acc).tanh();
    grad_out = go.mul(tanh_cy);
    const at::Tensor through_hy = go.mul(out_gate).mul(one_minus(tanh_cy.mul(tanh_cy)));
    grad_cell = grad_cell.defined() ? through_hy.add(grad_cell) : through_hy;
  } else {
    grad_out = out_gate.new_zeros(out_gate.sizes());
  }
  // Back through the activations: sigmoid' = s (1 - s), tanh' = 1 - t^2.
  const at::Tensor grad_in = grad_cell.mul(cell_gate).mul(in_gate.mul(one_minus(in_gate)));
  const at::Tensor grad_forget = grad_cell.mul(in_type(cx, acc)).mul(forget_gate.mul(one_minus(forget_gate)));
  const at::Tensor grad_cell_gate = grad_cell.mul(in_gate).mul(one_minus(cell_gate.mul(cell_gate)));
  grad_out = grad_out.mul(out_gate.mul(one_minus(out_gate)));

  const at::Tensor grad_gates = cat_columns({grad_in, grad_forget, grad_cell_gate, grad_out});
  const at::Tensor grad_cx = grad_cell.mul(forget_gate);
  const at::Tensor grad_bias = has_bias ? sum_rows(grad_gates, type) : at::Tensor();
  return {in_type(grad_gates, type), in_type(grad_cx, cx.scalar_type()), grad_bias};
}

// aten::_thnn_fused_gru_cell -> (hy, workspace)
std::tuple<at::Tensor, at::Tensor> gru_cell(const at::Tensor& input_gates, const at::Tensor& hidden_gates,
                                            const at::Tensor& hx, const std::optional<at::Tensor>& input_bias_opt,
                                            const std::optional<at::Tensor>& hidden_bias_opt) {
  const char* op = "_thnn_fused_gru_cell";
  const c10::Device device = kernels::common_device(op, kernels::CpuArgs::rejected, input_gates, hidden_gates, hx,
                                                    input_bias_opt, hidden_bias_opt);
  c10::OptionalDeviceGuard guard(device);
  const at::Tensor input_bias = value_or_undefined(input_bias_opt);
  const at::Tensor hidden_bias = value_or_undefined(hidden_bias_opt);
  check_cell(op, input_gates, hidden_gates, input_bias, hidden_bias, 3, hx);
  const c10::ScalarType type = result_type({&input_gates, &hidden_gates, &hx, &input_bias, &hidden_bias});
  const c10::ScalarType acc = compute_type(type);

  at::Tensor input_side = in_type(input_gates, acc);
  at::Tensor hidden_side = in_type(hidden_gates, acc);
  if (input_bias.defined()) {
    input_side = input_side.add(in_type(input_bias, acc));
    hidden_side = hidden_side.add(in_type(hidden_bias, acc));
  }
  const std::vector<at::Tensor> i = input_side.chunk(3, 1);
  const std::vector<at::Tensor> h = hidden_side.chunk(3, 1);
  const at::Tensor reset_gate = i[0].add(h[0]).sigmoid();
  const at::Tensor update_gate = i[1].add(h[1]).sigmoid();
  const at::Tensor& hidden_new = h[2];  // enters the new gate scaled by the reset gate
  const at::Tensor new_gate = i[2].add(reset_gate.mul(hidden_new)).tanh();
  const at::Tensor hx_acc = in_type(hx, acc);
  const at::Tensor hy = new_gate.add(update_gate.mul(hx_acc.sub(new_gate)));
  const at::Tensor workspace = cat_columns({reset_gate, update_gate, new_gate, hx_acc, hidden_new});
  return {in_type(hy, type), in_type(workspace, type)};
}

// aten::_thnn_fused_gru_cell_backward -> (grad_input_gates, grad_hidden_gates, grad_hx, grad_input_bias,
// grad_hidden_bias)
std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor, at::Tensor> gru_cell_backward(const at::Tensor& grad_hy,
                                                                                          const at::Tensor& workspace,
                                                                                          bool has_bias) {
  const char* op = "_thnn_fused_gru_cell_backward";
  const c10::Device device = kernels::common_device(op, kernels::CpuArgs::rejected, grad_hy, workspace);
  c10::OptionalDeviceGuard guard(device);
  TORCH_CHECK(grad_hy.dim() == 2, op, ": expected a 2-D grad_hy, got ", grad_hy.sizes());
  TORCH_CHECK(workspace.dim() == 2 && workspace.size(0) == grad_hy.size(0) && workspace.size(1) == 5 * grad_hy.size(1),
              op, ": expected a workspace of size [", grad_hy.size(0), ", ", 5 * grad_hy.size(1), "], got ",
              workspace.sizes());
  const c10::ScalarType type = grad_hy.scalar_type();
  const c10::ScalarType acc = compute_type(type);

  const std::vector<at::Tensor> w = in_type(workspace, acc).chunk(5, 1);
  const at::Tensor &reset_gate = w[0], &update_gate = w[1], &new_gate = w[2], &hx = w[3], &hidden_new = w[4];
  const at::Tensor go = in_type(grad_hy, acc);
  // hy = new + update * (hx - new)
  const at::Tensor grad_update = go.mul(hx.sub(new_gate)).mul(update_gate.mul(one_minus(update_gate)));
  const at::Tensor grad_hx = go.mul(update_gate);
  const at::Tensor grad_new = go.mul(one_minus(update_gate)).mul(one_minus(new_gate.mul(new_gate)));
  const at::Tensor grad_hidden_new = grad_new.mul(reset_gate);
  const at::Tensor grad_reset = grad_new.mul(hidden_new).mul(reset_gate.mul(one_minus(reset_gate)));

  const at::Tensor grad_input_gates = cat_columns({grad_reset, grad_update, grad_new});
  const at::Tensor grad_hidden_gates = cat_columns({grad_reset, grad_update, grad_hidden_new});
  at::Tensor grad_input_bias, grad_hidden_bias;
  if (has_bias) {
    grad_input_bias = sum_rows(grad_input_gates, type);
    grad_hidden_bias = sum_rows(grad_hidden_gates, type);
  }
  return {in_type(grad_input_gates, type), in_type(grad_hidden_gates, type), in_type(grad_hx, type), grad_input_bias,
          grad_hidden_bias};
}

}  // namespace {{ cookiecutter.device }}::rnn

TORCH_LIBRARY_IMPL(aten, PrivateUse1, m) {
  m.impl("_thnn_fused_lstm_cell", TORCH_FN({{ cookiecutter.device }}::rnn::lstm_cell));
  m.impl("_thnn_fused_lstm_cell_backward_impl", TORCH_FN({{ cookiecutter.device }}::rnn::lstm_cell_backward));
  m.impl("_thnn_fused_gru_cell", TORCH_FN({{ cookiecutter.device }}::rnn::gru_cell));
  m.impl("_thnn_fused_gru_cell_backward", TORCH_FN({{ cookiecutter.device }}::rnn::gru_cell_backward));
}
