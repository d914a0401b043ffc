// Scaled dot-product attention on {{ cookiecutter.device }}: the entry points PyTorch reserves for a
// backend's fused attention kernel.
//
// F.scaled_dot_product_attention (and nn.MultiheadAttention, nn.Transformer*) first asks which
// backend to run: for a PrivateUse1 query it calls the DispatchStub _fused_sdp_choice_stub, and
// torch._fused_sdp_choice(q, k, v) asks the operator aten::_fused_sdp_choice. With neither
// registered, the stub's absence means the math backend and the operator reached the CPU fallback,
// which answered the CPU's choice (flash attention, 1) for a device that has no flash kernel.
// PyTorch's hook for a PrivateUse1 kernel is SDPBackend::overrideable (4): scaled_dot_product_attention
// then calls aten::_scaled_dot_product_fused_attention_overrideable, and autograd's formula for it
// calls aten::_scaled_dot_product_fused_attention_overrideable_backward with the forward's output
// and logsumexp.
//
// Here: the choice answers overrideable when the inputs qualify (`qualifies`: dense 4-d query, key
// and value of one floating dtype on one device, no dropout, a mask of that dtype or bool, equal
// head counts or grouped-query attention with enable_gqa) and the user has not disabled it
// (torch.nn.attention.sdpa_kernel), else math (the composite reference, operator by operator).
// The forward and backward are launches: the host checks the arguments and allocates the results,
// and the queued work computes attention with CPU ATen operators on host aliases of the device
// memory, in float32
// (float64 for float64 inputs): scores = scale * Q K^T, the causal mask (top-left, as the math
// backend) and attn_mask applied, logsumexp over keys, softmax = exp(scores - logsumexp) (0 for a
// row every key is masked from, as the math backend's _safe_softmax), output = softmax V. The
// backward recomputes the softmax from the saved logsumexp and returns the gradients of query,
// key, value and a floating attn_mask (summed over the dimensions it was broadcast along).
//
// What a hardware team replaces: both kernel bodies, with its fused attention kernel (output and
// logsumexp, in the shapes below), and `qualifies`, with that kernel's limits (dtypes, head
// dimensions, dropout once it draws from the device generator).
#include "aten/kernel_support.h"

#include <ATen/Context.h>
#include <ATen/SDPBackend.h>
#include <ATen/native/transformers/attention.h>
#include <ATen/ops/_scaled_dot_product_fused_attention_overrideable_backward_ops.h>
#include <ATen/ops/_scaled_dot_product_fused_attention_overrideable_ops.h>
#include <torch/library.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>
#include <vector>

namespace {{ cookiecutter.device }}::attention {

namespace {

bool on_device(const at::Tensor& t) { return t.defined() && t.device().type() == c10::DeviceType::PrivateUse1; }

bool dense(const at::Tensor& t) { return t.layout() == c10::kStrided && !t.is_nested(); }

// What the overrideable kernels below accept; anything else runs on the math backend.
bool qualifies(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const std::optional<at::Tensor>& mask,
               double dropout_p, bool is_causal, bool enable_gqa) {
  for (const at::Tensor* t : {&q, &k, &v}) {
    if (!on_device(*t) || !dense(*t) || t->dim() != 4 || t->device() != q.device() || t->scalar_type() != q.scalar_type()) {
      return false;
    }
  }
  const c10::ScalarType dtype = q.scalar_type();
  if (dtype != at::kFloat && dtype != at::kDouble && dtype != at::kHalf && dtype != at::kBFloat16) return false;
  if (dropout_p > 0.0) return false;  // dropout needs the device generator's draws: the math backend has them
  if (q.numel() == 0 || k.numel() == 0 || v.numel() == 0) return false;
  const int64_t batch = q.size(0), heads = q.size(1), L = q.size(2), S = k.size(2);
  if (k.size(0) != batch || v.size(0) != batch || v.size(2) != S || k.size(3) != q.size(3) || v.size(1) != k.size(1)) {
    return false;
  }
  if (k.size(1) != heads && !(enable_gqa && heads % k.size(1) == 0)) return false;
  if (mask.has_value() && mask->defined()) {
    if (is_causal) return false;  // the math backend raises PyTorch's error for both
    const at::Tensor& m = *mask;
    if (!on_device(m) || !dense(m) || m.dim() > 4 || (m.scalar_type() != at::kBool && m.scalar_type() != dtype)) return false;
    const int64_t full[4] = {batch, heads, L, S};
    for (int64_t d = 1; d <= m.dim(); ++d) {  // broadcastable to (batch, heads, L, S)
      if (m.size(-d) != 1 && m.size(-d) != full[4 - d]) return false;
    }
  }
  return true;
}

// The choice, for the operator and for the stub scaled_dot_product_attention calls.
int64_t fused_sdp_choice(const at::Tensor& query, const at::Tensor& key, const at::Tensor& value,
                         const std::optional<at::Tensor>& attn_mask, double dropout_p, bool is_causal,
                         std::optional<double> scale, bool enable_gqa) {
  const at::Context& ctx = at::globalContext();
  if (ctx.userEnabledOverrideableSDP() && qualifies(query, key, value, attn_mask, dropout_p, is_causal, enable_gqa)) {
    return static_cast<int64_t>(at::SDPBackend::overrideable);
  }
  if (ctx.userEnabledMathSDP()) return static_cast<int64_t>(at::SDPBackend::math);
  return static_cast<int64_t>(at::SDPBackend::error);  // scaled_dot_product_attention: "No viable backend"
}

c10::ScalarType accumulate_type(c10::ScalarType t) { return t == at::kDouble ? at::kDouble : at::kFloat; }

double scale_of(const at::Tensor& q, std::optional<double> scale) {
  return scale.has_value() ? *scale : 1.0 / std::sqrt(static_cast<double>(q.size(-1)));
}

// K or V with the query's head count: in grouped-query attention each of their heads serves
// heads / size(-3) consecutive query heads.
at::Tensor expand_heads(const at::Tensor& t, int64_t heads) {
  const int64_t h = t.size(-3);
  return h == heads ? t : t.repeat_interleave(heads / h, -3);
}

// The gradient of an expanded K or V back to its own head count.
at::Tensor reduce_heads(const at::Tensor& t, int64_t heads) {
  if (t.size(-3) == heads) return t;
  std::vector<int64_t> shape(t.sizes().begin(), t.sizes().end() - 3);
  shape.insert(shape.end(), {heads, t.size(-3) / heads, t.size(-2), t.size(-1)});
  return t.reshape(shape).sum(-3);  // over the query heads of each group
}

// scale * Q K^T with the causal mask and attn_mask applied (Q, K in the accumulate type, K expanded).
at::Tensor scores(const at::Tensor& q, const at::Tensor& k, const at::Tensor& mask, bool is_causal, double scale) {
  at::Tensor s = q.matmul(k.transpose(-2, -1)).mul_(scale);
  constexpr double minus_inf = -std::numeric_limits<double>::infinity();
  if (is_causal) {  // query i sees keys 0..i
    s.masked_fill_(s.new_ones({q.size(-2), k.size(-2)}, at::kBool).tril().logical_not(), minus_inf);
  }
  if (mask.defined()) {
    if (mask.scalar_type() == at::kBool) {
      s.masked_fill_(mask.logical_not(), minus_inf);
    } else {
      s.add_(mask.to(s.scalar_type()));
    }
  }
  return s;
}

// softmax(scores) from its logsumexp; 0 in rows every key is masked from.
at::Tensor softmax_from(const at::Tensor& s, const at::Tensor& logsumexp) {
  const at::Tensor lse = logsumexp.unsqueeze(-1);
  return s.sub(lse).exp_().masked_fill_(lse.isneginf(), 0.0);
}

struct HostForward {
  at::Tensor output, logsumexp;
};

HostForward forward_on_host(const at::Tensor& query, const at::Tensor& key, const at::Tensor& value,
                            const at::Tensor& mask, bool is_causal, std::optional<double> scale) {
  const c10::ScalarType acc = accumulate_type(query.scalar_type());
  const int64_t heads = query.size(-3);
  const at::Tensor q = query.to(acc), k = expand_heads(key.to(acc), heads), v = expand_heads(value.to(acc), heads);
  const at::Tensor s = scores(q, k, mask, is_causal, scale_of(query, scale));
  at::Tensor logsumexp = s.logsumexp({-1});
  at::Tensor output = softmax_from(s, logsumexp).matmul(v).to(query.scalar_type());
  return {output, logsumexp};
}

using ForwardResult = std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor, c10::SymInt, c10::SymInt, at::Tensor,
                                 at::Tensor, at::Tensor>;

// The strides of a result of `sizes` laid out as PyTorch's fake kernels promise, which
// torch.compile asserts: `like`'s order of dimensions by stride (what empty_like(like) gives; the
// forward's output follows the query even when its last dimension differs).
std::vector<int64_t> strides_like(c10::IntArrayRef sizes, const at::Tensor& like) {
  const int64_t n = like.dim();
  std::vector<int64_t> order(n);
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(), [&](int64_t a, int64_t b) { return like.stride(a) > like.stride(b); });
  std::vector<int64_t> strides(n);
  int64_t stride = 1;
  for (auto it = order.rbegin(); it != order.rend(); ++it) {
    strides[*it] = stride;
    stride *= sizes[*it];
  }
  return strides;
}

// A new device tensor on the current device with `like`'s sizes and order of strides.
at::Tensor empty_in_layout_of(c10::IntArrayRef sizes, const at::Tensor& like, c10::ScalarType dtype) {
  return kernels::empty_device(sizes, strides_like(sizes, like), c10::TensorOptions().dtype(dtype));
}

at::Tensor defined_or_none(const std::optional<at::Tensor>& t) { return t.has_value() ? *t : at::Tensor(); }

// Returns (output [B, H, L, Ev], logsumexp [B, H, L] in the accumulate type, cum_seq_q, cum_seq_k
// (undefined: no nested inputs), max_q = L, max_k = S, philox_seed, philox_offset (0: no dropout),
// debug_attn_mask (empty)).
ForwardResult forward(const at::Tensor& query, const at::Tensor& key, const at::Tensor& value,
                      const std::optional<at::Tensor>& attn_bias, double dropout_p, bool is_causal,
                      bool return_debug_mask, std::optional<double> scale) {
  const char* op = "_scaled_dot_product_fused_attention_overrideable";
  const c10::Device device = kernels::common_device(op, kernels::CpuArgs::rejected, query, key, value, attn_bias);
  TORCH_CHECK(dropout_p == 0.0, op, " on {{ cookiecutter.device }} has no dropout (_fused_sdp_choice picks the math backend for "
              "dropout_p > 0), got dropout_p=", dropout_p);
  TORCH_CHECK(query.dim() == 4 && key.dim() == 4 && value.dim() == 4, op, ": expected 4-D query, key and value, got ",
              query.sizes(), ", ", key.sizes(), " and ", value.sizes());
  c10::DeviceGuard guard(device);
  // ---- on the host: the results' geometry ----
  const c10::ScalarType acc = accumulate_type(query.scalar_type());
  const int64_t out_sizes[4] = {query.size(0), query.size(1), query.size(2), value.size(3)};
  at::Tensor output = empty_in_layout_of(out_sizes, query, query.scalar_type());
  at::Tensor logsumexp = kernels::empty_device({query.size(0), query.size(1), query.size(2)}, {},
                                               c10::TensorOptions().dtype(acc));
  at::Tensor philox_seed = kernels::empty_device({}, {}, c10::TensorOptions().dtype(at::kLong));
  at::Tensor philox_offset = kernels::empty_device({}, {}, c10::TensorOptions().dtype(at::kLong));
  at::Tensor debug_mask = kernels::empty_device({0}, {}, c10::TensorOptions().dtype(acc));
  // ---- queued: replace with your SDK's fused attention kernel ----
  kernels::launch(device, "scaled_dot_product_attention",
                  [q = kernels::held(query), k = kernels::held(key), v = kernels::held(value),
                   mask = kernels::held(attn_bias), out_h = kernels::held(output), lse_h = kernels::held(logsumexp),
                   seed_h = kernels::held(philox_seed), offset_h = kernels::held(philox_offset), is_causal,
                   scale]() mutable {
                    HostForward host = forward_on_host(q.get(), k.get(), v.get(), defined_or_none(mask.get()),
                                                       is_causal, scale);
                    out_h.get().copy_(host.output);
                    lse_h.get().copy_(host.logsumexp);
                    seed_h.get().zero_();
                    offset_h.get().zero_();
                  });
  return {output,
          logsumexp,
          at::Tensor(),
          at::Tensor(),
          c10::SymInt(query.size(-2)),
          c10::SymInt(key.size(-2)),
          philox_seed,
          philox_offset,
          debug_mask};
}

std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor> backward(
    const at::Tensor& grad_out, const at::Tensor& query, const at::Tensor& key, const at::Tensor& value,
    const at::Tensor& attn_bias, std::array<bool, 4> grad_input_mask, const at::Tensor& out, const at::Tensor& logsumexp,
    const at::Tensor& cum_seq_q, const at::Tensor& cum_seq_k, c10::SymInt max_q, c10::SymInt max_k, double dropout_p,
    bool is_causal, const at::Tensor& philox_seed, const at::Tensor& philox_offset, std::optional<double> scale) {
  const char* op = "_scaled_dot_product_fused_attention_overrideable_backward";
  const c10::Device device =
      kernels::common_device(op, kernels::CpuArgs::rejected, grad_out, query, key, value, attn_bias, logsumexp);
  TORCH_CHECK(dropout_p == 0.0, op, " on {{ cookiecutter.device }} has no dropout, got dropout_p=", dropout_p);
  TORCH_CHECK(query.dim() == 4 && key.dim() == 4 && value.dim() == 4, op, ": expected 4-D query, key and value, got ",
              query.sizes(), ", ", key.sizes(), " and ", value.sizes());
  c10::DeviceGuard guard(device);
  // ---- on the host: each gradient in its input's layout (the fake kernels' empty_like) ----
  at::Tensor dq, dk, dv, dbias;
  if (grad_input_mask[0]) dq = empty_in_layout_of(query.sizes(), query, query.scalar_type());
  if (grad_input_mask[1]) dk = empty_in_layout_of(key.sizes(), key, key.scalar_type());
  if (grad_input_mask[2]) dv = empty_in_layout_of(value.sizes(), value, value.scalar_type());
  if (grad_input_mask[3] && attn_bias.defined() && attn_bias.is_floating_point()) {
    dbias = empty_in_layout_of(attn_bias.sizes(), attn_bias, attn_bias.scalar_type());
  }
  // ---- queued: replace with your SDK's fused attention backward ----
  kernels::launch(
      device, "scaled_dot_product_attention_backward",
      [go = kernels::held(grad_out), query_h = kernels::held(query), key_h = kernels::held(key),
       value_h = kernels::held(value), mask_h = kernels::held(attn_bias), lse_h = kernels::held(logsumexp),
       dq_h = kernels::held(dq), dk_h = kernels::held(dk), dv_h = kernels::held(dv), dbias_h = kernels::held(dbias),
       is_causal, scale]() mutable {
        const at::Tensor& query = query_h.get();
        const c10::ScalarType acc = accumulate_type(query.scalar_type());
        const int64_t heads = query.size(-3), kv_heads = key_h.get().size(-3);
        const double s = scale_of(query, scale);
        const at::Tensor q = query.to(acc);
        const at::Tensor k = expand_heads(key_h.get().to(acc), heads);
        const at::Tensor v = expand_heads(value_h.get().to(acc), heads);
        const at::Tensor& mask = mask_h.get();
        const at::Tensor dout = go.get().to(acc);
        const at::Tensor sc = scores(q, k, mask, is_causal, s);
        const at::Tensor lse = lse_h.get().defined() ? lse_h.get().to(acc) : sc.logsumexp({-1});
        const at::Tensor p = softmax_from(sc, lse);
        const at::Tensor dp = dout.matmul(v.transpose(-2, -1));
        const at::Tensor ds = p.mul(dp.sub(dp.mul(p).sum({-1}, /*keepdim=*/true)));  // d scores (before the scale)
        if (dq_h.get().defined()) dq_h.get().copy_(ds.matmul(k).mul_(s));
        if (dk_h.get().defined()) dk_h.get().copy_(reduce_heads(ds.transpose(-2, -1).matmul(q).mul_(s), kv_heads));
        if (dv_h.get().defined()) dv_h.get().copy_(reduce_heads(p.transpose(-2, -1).matmul(dout), kv_heads));
        if (dbias_h.get().defined()) dbias_h.get().copy_(ds.sum_to_size(mask.sizes()));
      });
  return {dq, dk, dv, dbias};
}

}  // namespace
}  // namespace {{ cookiecutter.device }}::attention

// scaled_dot_product_attention asks the stub; torch._fused_sdp_choice asks the operator.
namespace at::native {
REGISTER_PRIVATEUSE1_DISPATCH(_fused_sdp_choice_stub, &{{ cookiecutter.device }}::attention::fused_sdp_choice);
}

TORCH_LIBRARY_IMPL(aten, PrivateUse1, m) {
  namespace attention = {{ cookiecutter.device }}::attention;
  m.impl("_fused_sdp_choice", TORCH_FN(attention::fused_sdp_choice));
  m.impl("_scaled_dot_product_fused_attention_overrideable", TORCH_FN(attention::forward));
  m.impl("_scaled_dot_product_fused_attention_overrideable_backward", TORCH_FN(attention::backward));
}
