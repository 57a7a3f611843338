// One incremental decoder step (paper §3.1, §3.2.3) as a single C++ call over ATen.
//
// The same arithmetic as Transformer.decode_step in Python (model/transformer.py, model/layers.py,
// model/attention.py: attention_reference), op for op, so the outputs are the same. What it saves is
// the Python side of each op: at batch 1 a step is a few hundred small ops and their dispatch from
// Python costs more than their work (BENCHMARKS.md, "Decoding"). Built on first use by
// transduce/decode/native.py with torch.utils.cpp_extension; without a compiler the Python step runs.
//
// Weights per decoder layer, in this order (PER_LAYER tensors):
//   self-attention:  qkv_w, qkv_b, out_w, out_b, norm_w, norm_b
//   cross-attention: q_w, q_b, out_w, out_b, norm_w, norm_b
//   feed-forward:    w1_w, w1_b, w2_w, w2_b, norm_w, norm_b
#include <torch/extension.h>

#include <limits>
#include <vector>

using at::Tensor;

namespace {

constexpr int64_t PER_LAYER = 18;

// A key mask prepared once per step for every layer, as attention_reference's _guard_empty_rows:
// `hidden` is true where a key must not be seen, `empty` marks query rows that see no key at all
// (they attend everywhere, then return zeros). Undefined tensors: no mask.
struct KeyMask {
  Tensor hidden, empty;
  explicit KeyMask(const Tensor& mask) {
    if (!mask.defined()) return;
    empty = mask.any(-1, /*keepdim=*/true).logical_not();
    hidden = mask.logical_or(empty).logical_not();
  }
};

// softmax(q kᵀ · scale) v over keys. q (B, h, T_q, d_k), k/v (B, h, T_k, d_k) -> (B, h, T_q, d_k).
Tensor attend(const Tensor& q, const Tensor& k, const Tensor& v, const KeyMask& mask, double scale) {
  Tensor scores = at::matmul(q, k.transpose(-2, -1)) * scale;  // (B, h, T_q, T_k)
  if (mask.hidden.defined()) scores = scores.masked_fill(mask.hidden, -std::numeric_limits<double>::infinity());
  Tensor weights = at::softmax(scores.to(at::kFloat), -1).to(v.scalar_type());  // (B, h, T_q, T_k)
  if (mask.empty.defined()) weights = weights.masked_fill(mask.empty, 0.0);
  return at::matmul(weights, v);  // (B, h, T_q, d_k)
}

// x (..., in) times a pre-transposed weight wt (in, out) plus bias: nn.Linear's map with its weight
// already laid out for the GEMM (a contiguous copy of weight.t(), made once when the model is wrapped)
Tensor lin(const Tensor& x, const Tensor& wt, const Tensor& b) {
  auto sizes = x.sizes().vec();
  sizes.back() = wt.size(1);
  return at::addmm(b, x.reshape({-1, x.size(-1)}), wt).view(sizes);
}

Tensor layer_norm(const Tensor& x, const Tensor& w, const Tensor& b, double eps) {
  return at::layer_norm(x, {x.size(-1)}, w, b, eps);
}

}  // namespace

// tokens (N,) long; positions (1, d_model): this step's positional encoding, in the model's dtype.
// self_k/self_v: per layer (N, h, t, d_k), empty lists at the first step; memory_k/memory_v: per layer
// (B, h, S, d_k); memory_mask (B, 1, 1, S) bool. Returns {logits (N, V), new self_k..., new self_v...}.
std::vector<Tensor> decoder_step(const Tensor& tokens, const Tensor& positions, const Tensor& token_weight,
                                 double embed_scale, const std::vector<Tensor>& weights,
                                 const c10::optional<Tensor>& final_w, const c10::optional<Tensor>& final_b,
                                 const Tensor& generator_weight, const std::vector<Tensor>& self_k,
                                 const std::vector<Tensor>& self_v, const std::vector<Tensor>& memory_k,
                                 const std::vector<Tensor>& memory_v, const Tensor& memory_mask, int64_t beam,
                                 int64_t n_heads, double attn_scale, bool pre_norm, double eps) {
  at::NoGradGuard no_grad;
  const int64_t N = tokens.size(0);
  const int64_t layers = static_cast<int64_t>(memory_k.size());
  TORCH_CHECK(static_cast<int64_t>(weights.size()) == layers * PER_LAYER, "expected ", layers * PER_LAYER,
              " layer weights, got ", weights.size());
  Tensor x = at::embedding(token_weight, tokens.unsqueeze(1)) * embed_scale + positions;  // (N, 1, d)
  const int64_t d = x.size(-1), d_k = d / n_heads;
  std::vector<Tensor> out{Tensor()};
  std::vector<Tensor> new_v;
  const KeyMask no_mask{Tensor()}, memory{memory_mask};

  auto residual = [&](const Tensor& x, const Tensor& nw, const Tensor& nb, auto&& sublayer) {
    if (pre_norm) return x + sublayer(layer_norm(x, nw, nb, eps));
    return layer_norm(x + sublayer(x), nw, nb, eps);
  };

  for (int64_t l = 0; l < layers; ++l) {
    const Tensor* w = weights.data() + l * PER_LAYER;
    // masked self-attention over the cache (the step sees only its prefix, so no mask)
    x = residual(x, w[4], w[5], [&](const Tensor& h) {
      auto qkv = lin(h, w[0], w[1]).view({N, 1, 3, n_heads, d_k});  // (N, 1, 3, h, d_k)
      Tensor q = qkv.select(2, 0).transpose(1, 2);  // (N, h, 1, d_k)
      Tensor k = qkv.select(2, 1).transpose(1, 2);
      Tensor v = qkv.select(2, 2).transpose(1, 2);
      if (!self_k.empty()) {
        k = at::cat({self_k[l], k}, 2);  // (N, h, t+1, d_k)
        v = at::cat({self_v[l], v}, 2);
      }
      out.push_back(k);
      new_v.push_back(v);
      Tensor a = attend(q, k, v, no_mask, attn_scale).transpose(1, 2).reshape({N, 1, d});  // (N, 1, d)
      return lin(a, w[2], w[3]);
    });
    // encoder-decoder attention: a sentence's beams are its query positions
    x = residual(x, w[10], w[11], [&](const Tensor& h) {
      Tensor q = lin(h, w[6], w[7]).view({N / beam, beam, n_heads, d_k}).transpose(1, 2);  // (B, h, beam, d_k)
      Tensor a = attend(q, memory_k[l], memory_v[l], memory, attn_scale);  // (B, h, beam, d_k)
      a = a.transpose(1, 2).reshape({N / beam, beam, d});  // (B, beam, d)
      return lin(a, w[8], w[9]).reshape({N, 1, d});  // (N, 1, d)
    });
    x = residual(x, w[16], w[17], [&](const Tensor& h) {
      return lin(at::relu(lin(h, w[12], w[13])), w[14], w[15]);  // hidden (N, 1, d_ff)
    });
  }
  if (final_w.has_value()) x = layer_norm(x, *final_w, *final_b, eps);
  out[0] = at::mm(x.squeeze(1), generator_weight);  // (N, V)
  out.insert(out.end(), new_v.begin(), new_v.end());
  return out;
}

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.def("decoder_step", &decoder_step, "one incremental Transformer decoder step");
}
