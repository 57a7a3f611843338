// One incremental decoder step (paper §3.1, §3.2.3) as a single C++ call, in one of two forms:
//
// ATen ops (bf16, and fp32 when exactness is asked for): the same arithmetic as Transformer.decode_step in
// Python (model/transformer.py, model/layers.py, model/attention.py: attention_reference), op for op, so the
// outputs are the same. What it saves is the Python side of each op: at batch 1 a step is a few hundred
// small ops and their dispatch from Python costs more than their work (docs/performance.md).
// Loops (int8_step.h), with the encoder and the whole beam search in C++ too: every Linear runs
// int8_gemm.h's kernel (weights quantised once, per output channel; activations per call, per row: an
// approximation of fp32) or fp32_gemm.h's (fp32 with its own summation order: the fp32 step within
// rounding), and the rest of the step plain loops over float buffers.
// Built on first use by transduce/backends/native.py with torch.utils.cpp_extension; without a compiler
// the Python step runs.
// ATen's tensor type and ops one header each, and torch's pybind11 casters: <torch/extension.h> (all of
// libtorch's C++ API) takes about 2.5 times as long to parse (35 s against 14 s, g++ -fsyntax-only on a
// 2-core AMD EPYC), in every build and compile check.
#include <ATen/Parallel.h>
#include <ATen/core/Tensor.h>
#include <ATen/TensorOperators.h>
#include <ATen/core/grad_mode.h>
#include <ATen/ops/addmm.h>
#include <ATen/ops/constant_pad_nd.h>
#include <ATen/ops/div.h>
#include <ATen/ops/embedding.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/from_blob.h>
#include <ATen/ops/gelu.h>
#include <ATen/ops/index_select.h>
#include <ATen/ops/layer_norm.h>
#include <ATen/ops/log_softmax.h>
#include <ATen/ops/matmul.h>
#include <ATen/ops/mm.h>
#include <ATen/ops/relu.h>
#include <ATen/ops/remainder.h>
#include <ATen/ops/silu.h>
#include <ATen/ops/softmax.h>
#include <torch/csrc/utils/pybind.h>

#include <cmath>
#include <limits>
#include <memory>
#include <string>
#include <tuple>
#include <vector>

#include "fp32_gemm.h"
#include "int8_gemm.h"
#include "int8_step.h"

using at::Tensor;

namespace {

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

Tensor layer_norm(const Tensor& x, const Tensor& w, const Tensor& b, double eps) {
  return at::layer_norm(x, {x.size(-1)}, w, b, eps);
}

// The feed-forward activation named by backends/spec.py ("relu", "gelu", "swish").
int8::Activation activation_named(const std::string& name) {
  if (name == "relu") return int8::Activation::relu;
  if (name == "gelu") return int8::Activation::gelu;
  TORCH_CHECK(name == "swish", "unknown feed-forward activation '", name, "': expected relu, gelu or swish");
  return int8::Activation::swish;
}

// The activation as the Python step's modules compute it: nn.ReLU, nn.GELU, nn.SiLU.
Tensor activate(const Tensor& x, int8::Activation act) {
  if (act == int8::Activation::gelu) return at::gelu(x);
  if (act == int8::Activation::swish) return at::silu(x);
  return at::relu(x);
}

// cat({cache.index_select(0, rows), x}, 2) written in one copy: cache (N', h, t, d_k), x (N, h, 1, d_k).
Tensor append(const Tensor& cache, const Tensor& x, const c10::optional<Tensor>& rows) {
  const int64_t t = cache.size(2);
  Tensor out = at::empty({x.size(0), x.size(1), t + 1, x.size(3)}, x.options());  // (N, h, t+1, d_k)
  Tensor past = out.narrow(2, 0, t);
  if (rows.has_value())
    at::index_select_out(past, cache, 0, *rows);
  else
    past.copy_(cache);
  out.narrow(2, t, 1).copy_(x);
  return out;
}

}  // namespace

// y = x Wᵀ + b over the last dimension of x, in one of three arithmetics:
//   float: at::addmm(b, x, Wᵀ), the call F.linear makes, with Wᵀ = W.t() a view of nn.Linear's (out, in)
//          weight, exactly the operand F.linear passes (no bias: at::mm, as F.linear's matmul). Not a
//          contiguous (in, out) copy: with other strides ATen's CPU GEMMs may take another loop and round
//          differently (PyTorch's own bf16 GEMM on CPUs without AVX-512, where oneDNN is not used, and MKL's
//          fp32 GEMM at 1-3 rows), and the step would no longer equal the Python step bit for bit.
//   int8:  int8_gemm.h: W quantised per output channel and packed once; x quantised per call and row.
//   fp32:  fp32_gemm.h: W packed once; each output one chain of fused multiply-adds (the loop step's maps).
struct Linear {
  Tensor wt, bias;                         // float
  std::shared_ptr<const int8::Weights> q;  // int8
  std::shared_ptr<const f32::Weights> f;   // fp32
  int64_t out_features = 0;

  // w (out, in) as nn.Linear.weight
  static Linear floating(const Tensor& w, const c10::optional<Tensor>& bias) {
    Linear l;
    l.wt = w.t();  // (in, out), strides (1, in): a view, as in F.linear
    if (bias.has_value()) l.bias = *bias;
    l.out_features = w.size(0);
    return l;
  }

  // w (out, in) as nn.Linear.weight
  static Linear int8(const Tensor& w, const c10::optional<Tensor>& bias) {
    Linear l;
    l.q = std::make_shared<const int8::Weights>(w, bias.has_value() ? *bias : Tensor());
    l.out_features = w.size(0);
    return l;
  }

  // w (out, in) as nn.Linear.weight
  static Linear fp32(const Tensor& w, const c10::optional<Tensor>& bias) {
    Linear l;
    l.f = std::make_shared<const f32::Weights>(w, bias.has_value() ? *bias : Tensor());
    l.out_features = w.size(0);
    return l;
  }

  // Whether the map is for the loop step (int8 or fp32 packed weights), not ATen's.
  bool loops() const { return q || f; }

  // The loop step's y (M, out) = x (M, in) Wᵀ + b over float buffers.
  void gemm(const float* x, int64_t M, float* y) const {
    if (q)
      int8::gemm(x, M, *q, y);
    else
      f32::gemm(x, M, *f, y);
  }

  Tensor operator()(const Tensor& x) const {
    auto sizes = x.sizes().vec();
    sizes.back() = out_features;
    if (loops()) {  // the loop step's map over float buffers
      const int64_t in = q ? q->in : f->in;
      TORCH_CHECK(x.size(-1) == in, "linear map: expected ", in, " input features, got ", x.size(-1));
      Tensor x2 = x.reshape({-1, in}).to(at::kFloat).contiguous();  // (rows, in)
      Tensor y = at::empty({x2.size(0), out_features}, x2.options());  // (rows, out)
      gemm(x2.data_ptr<float>(), x2.size(0), y.data_ptr<float>());
      return y.view(sizes);  // (..., out)
    }
    Tensor x2 = x.reshape({-1, x.size(-1)});  // (rows, in)
    Tensor y = bias.defined() ? at::addmm(bias, x2, wt) : at::mm(x2, wt);
    return y.view(sizes);  // (..., out)
  }
};

// int8_gemm.h's map on its own, weights quantised anew (tests, benchmarks); portable: the plain loop.
Tensor int8_linear(const Tensor& x, const Tensor& w, const c10::optional<Tensor>& bias, bool portable) {
  return int8::linear(x, int8::Weights(w, bias.has_value() ? *bias : Tensor()), portable);
}

// The loop step's feed-forward (int8::feed_forward) with the maps' own kernel.
void feed_forward(const float* x, int64_t M, const Linear& w1, const Linear& w2, float* hidden, float* y,
                  int8::Activation act) {
  if (w1.q)
    int8::feed_forward(x, M, *w1.q, *w2.q, hidden, y, act);
  else
    int8::feed_forward(x, M, *w1.f, *w2.f, hidden, y, act);
}

// The loop step's RowBest of x (N, d) through the pre-softmax projection g (int8::best_of_projection).
int8::RowBest best_of_projection(const float* x, int64_t N, const Linear& g, int64_t k, int64_t eos) {
  return g.q ? int8::best_of_projection(x, N, *g.q, k, eos) : int8::best_of_projection(x, N, *g.f, k, eos);
}

// The decoder's weights, held in C++ between steps. Per layer, `linears` holds 6 maps (self-attention
// qkv and out, cross-attention q and out, feed-forward w1 and w2) and `norms` 6 tensors (weight and bias
// of the self-attention, cross-attention and feed-forward layer norms).
// One output of beam search (decode/hypothesis.py's Hypothesis): tokens without bos/eos, logprob = Σ log p
// including eos, score = logprob / lp(|Y|).
using Hyp = std::tuple<std::vector<int64_t>, double, double>;

struct Decoder {
  static constexpr size_t LINEARS = 6, NORMS = 6;
  std::vector<Linear> linears;
  std::vector<Tensor> norms;
  Linear generator;
  Tensor token_weight;
  c10::optional<Tensor> final_w, final_b;
  double embed_scale, attn_scale, eps;
  int64_t n_heads;
  bool pre_norm;
  int8::Activation act;  // the feed-forward's activation

  Decoder(std::vector<Linear> linears, std::vector<Tensor> norms, Linear generator, Tensor token_weight,
          double embed_scale, c10::optional<Tensor> final_w, c10::optional<Tensor> final_b, int64_t n_heads,
          double attn_scale, bool pre_norm, double eps, const std::string& activation)
      : linears(std::move(linears)), norms(std::move(norms)), generator(std::move(generator)),
        token_weight(std::move(token_weight)), final_w(std::move(final_w)), final_b(std::move(final_b)),
        embed_scale(embed_scale), attn_scale(attn_scale), eps(eps), n_heads(n_heads), pre_norm(pre_norm),
        act(activation_named(activation)) {
    TORCH_CHECK(this->linears.size() % LINEARS == 0 && this->norms.size() == this->linears.size() / LINEARS * NORMS,
                "expected 6 linear maps and 6 norm tensors per layer, got ", this->linears.size(), " and ",
                this->norms.size());
  }

  // The loop step up to the pre-softmax projection: {x (N, d), new self_k..., new self_v...}.
  std::vector<Tensor> hidden_loops(const Tensor& tokens, const Tensor& positions, const std::vector<Tensor>& self_k,
                                  const std::vector<Tensor>& self_v, const std::vector<Tensor>& memory_k,
                                  const std::vector<Tensor>& memory_v, const Tensor& memory_mask, int64_t beam,
                                  const c10::optional<Tensor>& rows, int8::History* history) const;

  // The loop step fused with beam search's candidate selection (beam_candidates_fast): the logits are folded
  // into each row's log Σ exp and k2 best as the projection makes them (int8::best_of_projection), never
  // written. Arguments as step, then beam_candidates_fast's. Returns {top_val, top_row, top_tok, new
  // self_k..., new self_v...}.
  std::vector<Tensor> step_candidates(const Tensor& tokens, const Tensor& positions, const std::vector<Tensor>& self_k,
                                      const std::vector<Tensor>& self_v, const std::vector<Tensor>& memory_k,
                                      const std::vector<Tensor>& memory_v, const Tensor& memory_mask, int64_t beam,
                                      const c10::optional<Tensor>& rows, int8::History* history, const Tensor& scores,
                                      const Tensor& forced, int64_t k2, int64_t want, int64_t eos) const;

  // decode/search.py's beam_search for the loop step, the whole loop in one call (no Python between steps,
  // the GIL released throughout): the same candidates, finished hypotheses, early stop and length limits, so
  // the same hypotheses as that loop over step_candidates. memory_k/memory_v per layer (B, h, S, d_k) and
  // memory_mask (B, 1, 1, S) from Encoder::encode; positions (max_positions, d_model): every step's positional
  // encoding; limits (B): most output tokens per sentence (hypothesis.py's max_lengths). Returns per sentence
  // its finished hypotheses, best first (at least nbest).
  std::vector<std::vector<Hyp>> beam_search(std::vector<Tensor> memory_k, std::vector<Tensor> memory_v,
                                            Tensor memory_mask, const Tensor& positions,
                                            const std::vector<int64_t>& limits, int64_t beam, double alpha,
                                            int64_t nbest, int64_t bos, int64_t eos) const;

  // tokens (N,) long; positions (1, d_model): this step's positional encoding, in the model's dtype.
  // self_k/self_v: per layer (N', h, t, d_k), empty lists at the first step; rows (N,): which of their N'
  // rows to keep, in order (a beam reorder left for this step; none: all, N = N'); memory_k/memory_v: per
  // layer (B, h, S, d_k); memory_mask (B, 1, 1, S) bool. Returns {logits (N, V), new self_k..., new self_v...}.
  // history (the loop step only; null: none): the self-attention cache as an int8::History in place of self_k/self_v
  // (empty lists then); it takes this step and the reorder `rows`, and no keys/values are returned.
  std::vector<Tensor> step(const Tensor& tokens, const Tensor& positions, const std::vector<Tensor>& self_k,
                           const std::vector<Tensor>& self_v, const std::vector<Tensor>& memory_k,
                           const std::vector<Tensor>& memory_v, const Tensor& memory_mask, int64_t beam,
                           const c10::optional<Tensor>& rows, int8::History* history) const {
    at::NoGradGuard no_grad;
    const int64_t N = tokens.size(0);
    const size_t layers = memory_k.size();
    TORCH_CHECK(layers * LINEARS == linears.size(), "the cache has ", layers, " layers, the decoder ",
                linears.size() / LINEARS);
    TORCH_CHECK(history == nullptr || generator.loops(), "a History cache is for the loop step");
    if (generator.loops()) {
      std::vector<Tensor> out =
          hidden_loops(tokens, positions, self_k, self_v, memory_k, memory_v, memory_mask, beam, rows, history);
      out[0] = generator(out[0]);  // (N, V)
      return out;
    }
    Tensor x = at::embedding(token_weight, tokens.unsqueeze(1)) * embed_scale + positions;  // (N, 1, d)
    const int64_t d = x.size(-1), d_k = d / n_heads;
    std::vector<Tensor> out{Tensor()};
    std::vector<Tensor> new_v;
    const KeyMask no_mask{Tensor()}, memory{memory_mask};

    auto residual = [&](const Tensor& x, const Tensor& nw, const Tensor& nb, auto&& sublayer) {
      if (pre_norm) return x + sublayer(layer_norm(x, nw, nb, eps));
      return layer_norm(x + sublayer(x), nw, nb, eps);
    };

    for (size_t l = 0; l < layers; ++l) {
      const Linear* lin = linears.data() + l * LINEARS;
      const Tensor* nrm = norms.data() + l * NORMS;
      // masked self-attention over the cache (the step sees only its prefix, so no mask)
      x = residual(x, nrm[0], nrm[1], [&](const Tensor& h) {
        auto qkv = lin[0](h).view({N, 1, 3, n_heads, d_k});  // (N, 1, 3, h, d_k)
        Tensor q = qkv.select(2, 0).transpose(1, 2);  // (N, h, 1, d_k)
        Tensor k = qkv.select(2, 1).transpose(1, 2);
        Tensor v = qkv.select(2, 2).transpose(1, 2);
        if (!self_k.empty()) {  // the kept rows of the cache, then this position: one copy
          k = append(self_k[l], k, rows);  // (N, h, t+1, d_k)
          v = append(self_v[l], v, rows);
        }
        out.push_back(k);
        new_v.push_back(v);
        Tensor a = attend(q, k, v, no_mask, attn_scale).transpose(1, 2).reshape({N, 1, d});  // (N, 1, d)
        return lin[1](a);
      });
      // encoder-decoder attention: a sentence's beams are its query positions
      x = residual(x, nrm[2], nrm[3], [&](const Tensor& h) {
        Tensor q = lin[2](h).view({N / beam, beam, n_heads, d_k}).transpose(1, 2);  // (B, h, beam, d_k)
        Tensor a = attend(q, memory_k[l], memory_v[l], memory, attn_scale);  // (B, h, beam, d_k)
        a = a.transpose(1, 2).reshape({N / beam, beam, d});  // (B, beam, d)
        return lin[3](a).reshape({N, 1, d});  // (N, 1, d)
      });
      x = residual(x, nrm[4], nrm[5], [&](const Tensor& h) {
        Tensor hidden = lin[4](h);  // (N, 1, d_ff)
        return lin[5](activate(hidden, act));
      });
    }
    if (final_w.has_value()) x = layer_norm(x, *final_w, *final_b, eps);
    out[0] = generator(x.squeeze(1));  // (N, V)
    out.insert(out.end(), new_v.begin(), new_v.end());
    return out;
  }
};

// vecmath.h's element-wise functions ("exp", "gelu", "swish"), its reductions over the last dimension
// ("sum", "sum_squares" about 0.5, "dot" of each row with itself, "logsumexp") of a float tensor, and the
// SIMD level it was compiled for (tests).
Tensor vec_map(const Tensor& x, const std::string& name) {
  Tensor y = x.to(at::kFloat).contiguous().clone();
  float* p = y.data_ptr<float>();
  const int64_t n = y.numel();
  if (name == "gelu") {
    vec::gelu(p, n);
  } else if (name == "swish") {
    vec::swish(p, n);
  } else {
    TORCH_CHECK(name == "exp", "vec_map: unknown function '", name, "'");
    vec::exp_shifted(p, n, 0.0f);
  }
  return y;
}

Tensor vec_reduce(const Tensor& x, const std::string& name) {
  Tensor x2 = x.to(at::kFloat).contiguous();
  const int64_t V = x2.size(-1), N = x2.numel() / V;
  Tensor z = at::empty({N}, x2.options());
  for (int64_t n = 0; n < N; ++n) {
    const float* row = x2.data_ptr<float>() + n * V;
    float& out = z.data_ptr<float>()[n];
    if (name == "sum") {
      out = vec::sum(row, V);
    } else if (name == "sum_squares") {
      out = vec::sum_squares(row, 0.5f, V);
    } else if (name == "dot") {
      out = vec::dot(row, row, V);
    } else {
      TORCH_CHECK(name == "logsumexp", "vec_reduce: unknown reduction '", name, "'");
      out = vec::logsumexp(row, V);
    }
  }
  return z;
}

Tensor vec_gelu(const Tensor& x) { return vec_map(x, "gelu"); }

Tensor vec_logsumexp(const Tensor& x) {
  Tensor x2 = x.to(at::kFloat).contiguous();
  const int64_t V = x2.size(-1), N = x2.numel() / V;
  Tensor z = at::empty({N}, x2.options());
  for (int64_t n = 0; n < N; ++n) z.data_ptr<float>()[n] = vec::logsumexp(x2.data_ptr<float>() + n * V, V);
  return z;
}

// The loop encoder (§3.1) and each decoder layer's encoder-decoder keys/values, computed once per batch:
// int8_gemm.h's or fp32_gemm.h's GEMMs and int8_step.h's loops, fp32 activations. Per layer, `linears` holds 4 maps
// (self-attention qkv and out, feed-forward w1 and w2) and `norms` 4 tensors (the two layer norms'
// weight and bias); `kv` one map per decoder layer.
struct Encoder {
  std::vector<Linear> linears, kv;
  std::vector<Tensor> norms;
  Tensor token_weight;
  c10::optional<Tensor> final_w, final_b;
  double embed_scale, attn_scale, eps;
  int64_t n_heads, pad_id;
  bool pre_norm;
  int8::Activation act;  // the feed-forward's activation

  Encoder(std::vector<Linear> linears, std::vector<Tensor> norms, std::vector<Linear> kv, Tensor token_weight,
          double embed_scale, c10::optional<Tensor> final_w, c10::optional<Tensor> final_b, int64_t n_heads,
          double attn_scale, bool pre_norm, double eps, int64_t pad_id, const std::string& activation)
      : linears(std::move(linears)), kv(std::move(kv)), norms(std::move(norms)),
        token_weight(std::move(token_weight).to(at::kFloat).contiguous()), final_w(std::move(final_w)),
        final_b(std::move(final_b)), embed_scale(embed_scale), attn_scale(attn_scale), eps(eps), n_heads(n_heads),
        pad_id(pad_id), pre_norm(pre_norm), act(activation_named(activation)) {
    TORCH_CHECK(this->linears.size() % 4 == 0 && this->norms.size() == this->linears.size(),
                "expected 4 linear maps and 4 norm tensors per encoder layer");
    for (const Linear& l : this->linears) TORCH_CHECK(l.loops(), "the C++ encoder runs the loop step's maps only");
  }

  // src (B, S) ids, right-padded; positions (S, d_model) fp32. Returns {memory (B, S, d), keys...,
  // values...}: per decoder layer (B, h, S, d_k), as Transformer.init_cache.
  std::vector<Tensor> encode(const Tensor& src, const Tensor& positions) const {
    at::NoGradGuard no_grad;
    Tensor ids = src.to(at::kLong).contiguous(), pos = positions.to(at::kFloat).contiguous();
    const int64_t B = ids.size(0), S = ids.size(1), d = token_weight.size(1), h = n_heads, d_k = d / h, M = B * S;
    const float scale = static_cast<float>(attn_scale), e = static_cast<float>(eps);
    auto opts = token_weight.options();
    Tensor x = at::empty({B, S, d}, opts), hbuf = at::empty({M, d}, opts), ybuf = at::empty({M, d}, opts);
    Tensor abuf = at::empty({M, d}, opts), qkv = at::empty({M, 3 * d}, opts);
    Tensor fbuf = at::empty({M, linears[2].out_features}, opts);
    float *xp = x.data_ptr<float>(), *hp = hbuf.data_ptr<float>(), *yp = ybuf.data_ptr<float>();
    float *ap = abuf.data_ptr<float>(), *qp = qkv.data_ptr<float>(), *fp = fbuf.data_ptr<float>();
    const int64_t* tk = ids.data_ptr<int64_t>();
    std::unique_ptr<bool[]> visible(new bool[M]);  // real tokens: the keys every query may see (Transformer.source_mask)
    const float *emb = token_weight.data_ptr<float>(), *pe = pos.data_ptr<float>();
    const float sc = static_cast<float>(embed_scale);
    for (int64_t m = 0; m < M; ++m) {
      visible[m] = tk[m] != pad_id;
      for (int64_t i = 0; i < d; ++i) xp[m * d + i] = emb[tk[m] * d + i] * sc + pe[(m % S) * d + i];
    }
    auto residual = [&](const Tensor* norm, auto&& sublayer) {
      int8::residual(pre_norm, xp, hp, yp, norm[0].data_ptr<float>(), norm[1].data_ptr<float>(), M, d, e, sublayer);
    };
    for (size_t l = 0; l < linears.size() / 4; ++l) {
      const Linear* lin = linears.data() + l * 4;
      const Tensor* nrm = norms.data() + l * 4;
      residual(nrm, [&](const float* in) {
        lin[0].gemm(in, M, qp);  // (B, S, 3, h, d_k)
        int8::rows(M, h * S * d_k, [&](int64_t m) {  // query position m = b·S + i
          thread_local int8::AttendScratch scratch;
          scratch.fit(S);
          const int64_t b = m / S;
          for (int64_t j = 0; j < h; ++j) {
            const float* base = qp + b * S * 3 * d + j * d_k;  // this head's q of position 0
            int8::attend_one(qp + m * 3 * d + j * d_k, base + d, base + 2 * d, S, 3 * d, 3 * d, d_k, scale,
                             visible.get() + b * S, scratch.scores.data(), scratch.keep.data(), ap + m * d + j * d_k);
          }
        });
        lin[1].gemm(ap, M, yp);
      });
      residual(nrm + 2, [&](const float* in) { feed_forward(in, M, lin[2], lin[3], fp, yp, act); });
    }
    if (final_w.has_value())
      int8::add_layer_norm(xp, nullptr, final_w->data_ptr<float>(), final_b->data_ptr<float>(), M, d, e);
    std::vector<Tensor> out{x}, values;
    for (const Linear& map : kv) {
      Tensor both = map(x).view({B, S, 2, h, d_k});  // (B, S, 2, h, d_k)
      out.push_back(both.select(2, 0).transpose(1, 2));  // (B, h, S, d_k)
      values.push_back(both.select(2, 1).transpose(1, 2));
    }
    out.insert(out.end(), values.begin(), values.end());
    return out;
  }
};

// The loop step: int8_gemm.h's or fp32_gemm.h's GEMMs, int8_step.h's loops for everything else, fp32
// activations and caches. Same arguments as Decoder::step; the decoder's output x (N, d) in place of the logits.
std::vector<Tensor> Decoder::hidden_loops(const Tensor& tokens, const Tensor& positions,
                                       const std::vector<Tensor>& self_k, const std::vector<Tensor>& self_v,
                                       const std::vector<Tensor>& memory_k, const std::vector<Tensor>& memory_v,
                                       const Tensor& memory_mask, int64_t beam,
                                       const c10::optional<Tensor>& rows, int8::History* history) const {
  const int64_t N = tokens.size(0), d = token_weight.size(1), h = n_heads, d_k = d / h;
  const int64_t t = self_k.empty() ? 0 : self_k[0].size(2), S = memory_k[0].size(2), B = N / beam;
  TORCH_CHECK(history == nullptr || self_k.empty(), "give the self-attention cache as tensors or as a History");
  const size_t layers = memory_k.size();
  const float scale = static_cast<float>(attn_scale), e = static_cast<float>(eps);
  TORCH_CHECK(token_weight.scalar_type() == at::kFloat, "the loop step runs an fp32 model");
  auto opts = token_weight.options();
  Tensor x = at::empty({N, d}, opts), hbuf = at::empty({N, d}, opts), ybuf = at::empty({N, d}, opts);
  Tensor abuf = at::empty({N, d}, opts), qkv = at::empty({N, 3 * d}, opts);
  Tensor fbuf = at::empty({N, linears[4].out_features}, opts);
  float *xp = x.data_ptr<float>(), *hp = hbuf.data_ptr<float>(), *yp = ybuf.data_ptr<float>();
  float *ap = abuf.data_ptr<float>(), *qkvp = qkv.data_ptr<float>(), *fp = fbuf.data_ptr<float>();
  {  // embedding · √d + this position's encoding (§3.4, §3.5)
    Tensor tok = tokens.to(at::kLong).contiguous(), pos = positions.to(at::kFloat).contiguous();
    const int64_t* tk = tok.data_ptr<int64_t>();
    const float *emb = token_weight.data_ptr<float>(), *pe = pos.data_ptr<float>();
    const float sc = static_cast<float>(embed_scale);
    for (int64_t n = 0; n < N; ++n)
      for (int64_t i = 0; i < d; ++i) xp[n * d + i] = emb[tk[n] * d + i] * sc + pe[i];
  }
  Tensor visible;
  if (memory_mask.defined()) visible = memory_mask.reshape({B, S}).to(at::kBool).contiguous();
  const bool* vis = visible.defined() ? visible.data_ptr<bool>() : nullptr;
  Tensor kept;
  if (rows.has_value()) kept = rows->to(at::kLong).contiguous();
  const int64_t* kept_rows = kept.defined() ? kept.data_ptr<int64_t>() : nullptr;
  std::vector<Tensor> out{Tensor()}, new_v;
  if (history != nullptr) {
    TORCH_CHECK(history->layers == static_cast<int64_t>(layers) && history->d == d, "the History is for ",
                history->layers, " layers of width ", history->d);
    history->advance(N, kept_rows);
  }

  auto residual = [&](const Tensor* norm, auto&& sublayer) {  // sublayer(in) writes ybuf
    int8::residual(pre_norm, xp, hp, yp, norm[0].data_ptr<float>(), norm[1].data_ptr<float>(), N, d, e, sublayer);
  };
  for (size_t l = 0; l < layers; ++l) {
    const Linear* lin = linears.data() + l * LINEARS;
    const Tensor* nrm = norms.data() + l * NORMS;
    if (history != nullptr) {
      residual(nrm, [&](const float* in) {
        lin[0].gemm(in, N, qkvp);  // (N, 3, h, d_k)
        int8::self_attention(qkvp, *history, l, h, d_k, scale, ap);
        lin[1].gemm(ap, N, yp);
      });
    } else {
      Tensor k_new = at::empty({N, h, t + 1, d_k}, opts), v_new = at::empty({N, h, t + 1, d_k}, opts);
      residual(nrm, [&](const float* in) {
        lin[0].gemm(in, N, qkvp);  // (N, 3, h, d_k)
        Tensor k_old = t > 0 ? self_k[l].contiguous() : Tensor(), v_old = t > 0 ? self_v[l].contiguous() : Tensor();
        int8::self_attention(qkvp, t > 0 ? k_old.data_ptr<float>() : nullptr, t > 0 ? v_old.data_ptr<float>() : nullptr,
                             kept_rows, N, h, t, d_k, scale, k_new.data_ptr<float>(), v_new.data_ptr<float>(), ap);
        lin[1].gemm(ap, N, yp);
      });
      out.push_back(k_new);
      new_v.push_back(v_new);
    }
    residual(nrm + 2, [&](const float* in) {
      lin[2].gemm(in, N, qkvp);  // (N, h·d_k)
      const Tensor& mk = memory_k[l];
      const Tensor& mv = memory_v[l];
      TORCH_CHECK(mk.scalar_type() == at::kFloat && mk.stride(3) == 1 && mv.stride(3) == 1,
                  "the loop step expects fp32 encoder keys/values with contiguous heads");
      const int64_t ks[3] = {mk.stride(0), mk.stride(1), mk.stride(2)}, vs[3] = {mv.stride(0), mv.stride(1), mv.stride(2)};
      int8::cross_attention(qkvp, mk.data_ptr<float>(), mv.data_ptr<float>(), ks, vs, vis, N, beam, h, S, d_k,
                            scale, ap);
      lin[3].gemm(ap, N, yp);
    });
    residual(nrm + 4, [&](const float* in) { feed_forward(in, N, lin[4], lin[5], fp, yp, act); });
  }
  if (final_w.has_value())
    int8::add_layer_norm(xp, nullptr, final_w->data_ptr<float>(), final_b->data_ptr<float>(), N, d, e);
  out[0] = x;  // (N, d)
  out.insert(out.end(), new_v.begin(), new_v.end());
  return out;
}

// Beam search after the decoder, op for op as decode/search.py's _candidates (log-softmax, row_topk, the
// candidate top-k), so the same values come out. logits (N, V) with N = S·R (S slots of R rows); scores
// (S, R) fp32; forced (F,) long: rows at their length limit, where only eos may follow (may be empty).
// Returns {top_val, top_row, top_tok}, each (S, c) with c = min(want, R·k2), best first.
std::vector<Tensor> beam_candidates(const Tensor& logits, const Tensor& scores, const Tensor& forced, int64_t k2,
                                    int64_t want, int64_t eos, int64_t block) {
  at::NoGradGuard no_grad;
  const int64_t N = logits.size(0), V = logits.size(1), S = scores.size(0), R = scores.size(1);
  Tensor lp = at::log_softmax(logits, -1, at::kFloat);  // (N, V)
  Tensor row_val, row_tok;
  const int64_t blocks = (V + block - 1) / block;
  if (k2 * block * 4 > V) {  // few blocks: the plain top-k
    std::tie(row_val, row_tok) = lp.topk(k2, -1);
  } else {  // the k2 largest lie in the k2 blocks with the largest maxima (search.py: row_topk)
    Tensor x = blocks * block == V ? lp : at::constant_pad_nd(lp, {0, blocks * block - V},
                                                              -std::numeric_limits<double>::infinity());
    Tensor grid = x.view({N, blocks, block});  // (N, V/block, block)
    Tensor best_blocks = std::get<1>(grid.amax(-1).topk(k2, -1));  // (N, k2)
    Tensor cand = grid.gather(1, best_blocks.unsqueeze(2).expand({N, k2, block})).view({N, k2 * block});
    Tensor pos;
    std::tie(row_val, pos) = cand.topk(k2, -1);  // (N, k2) each
    row_tok = best_blocks.gather(1, at::div(pos, block, "floor")) * block + at::remainder(pos, block);
  }
  if (forced.numel() > 0) {  // at the length limit only eos may follow
    row_val.index_fill_(0, forced, -std::numeric_limits<double>::infinity());
    row_val.select(1, 0).index_copy_(0, forced, lp.select(1, eos).index_select(0, forced));
    row_tok.select(1, 0).index_fill_(0, forced, eos);
  }
  Tensor cand = (scores.unsqueeze(2) + row_val.view({S, R, k2})).view({S, R * k2});  // (S, R·k2)
  auto [top_val, top_pos] = cand.topk(std::min(want, R * k2), -1);  // (S, c) into R·k2
  Tensor top_tok = row_tok.view({S, R * k2}).gather(1, top_pos);
  Tensor top_row = at::div(top_pos, k2, "floor");  // which of the slot's rows
  return {top_val, top_row, top_tok};
}

// The second half of beam_candidates in loops, from each row's RowBest (int8_step.h): log p = logit - z;
// at the length limit (at_limit (N) nonzero) a row offers eos alone; then each slot's c best of its R·k2
// candidates (score + log p). scores (S, R); top_val/top_row/top_tok (S, c), best first (ties: the earlier
// row and rank). Rewrites best.val as log p.
void select_into(int8::RowBest& best, const float* s, int64_t S, int64_t R, const char* at_limit, int64_t c,
                 int64_t eos, float* top_val, int64_t* top_row, int64_t* top_tok) {
  const int64_t N = S * R, k2 = best.k;
  for (int64_t n = 0; n < N; ++n) {
    float* val = best.val.data() + n * k2;
    if (at_limit[n]) {  // at the length limit only eos may follow
      std::fill(val, val + k2, -std::numeric_limits<float>::infinity());
      std::fill(best.tok.data() + n * k2, best.tok.data() + (n + 1) * k2, eos);
      val[0] = best.eos_logit[n] - best.z[n];
    } else {
      for (int64_t j = 0; j < k2; ++j) val[j] -= best.z[n];
    }
  }
  std::vector<int64_t> order(R * k2);
  std::vector<float> cand(R * k2);
  for (int64_t slot = 0; slot < S; ++slot) {
    for (int64_t j = 0; j < R * k2; ++j) cand[j] = s[slot * R + j / k2] + best.val[slot * R * k2 + j], order[j] = j;
    std::partial_sort(order.begin(), order.begin() + c, order.end(), [&](int64_t a, int64_t b) {
      return cand[a] > cand[b] || (cand[a] == cand[b] && a < b);
    });
    for (int64_t j = 0; j < c; ++j) {
      top_val[slot * c + j] = cand[order[j]];
      top_row[slot * c + j] = order[j] / k2;
      top_tok[slot * c + j] = best.tok[slot * R * k2 + order[j]];
    }
  }
}

// select_into over tensors: scores (S, R) fp32, forced (F,) long (rows at their length limit, may be empty).
// Returns {top_val, top_row, top_tok}, each (S, c) with c = min(want, R·k2).
std::vector<Tensor> select_candidates(int8::RowBest& best, const Tensor& scores, const Tensor& forced, int64_t want,
                                      int64_t eos) {
  Tensor sc = scores.to(at::kFloat).contiguous(), fr = forced.to(at::kLong).contiguous();
  const int64_t S = sc.size(0), R = sc.size(1), N = S * R, c = std::min(want, R * best.k);
  TORCH_CHECK(static_cast<int64_t>(best.z.size()) == N, "scores (", S, ", ", R, ") do not match ", best.z.size(),
              " decoder rows");
  std::vector<char> at_limit(N, 0);
  for (int64_t i = 0; i < fr.numel(); ++i) at_limit[fr.data_ptr<int64_t>()[i]] = 1;
  Tensor top_val = at::empty({S, c}, sc.options()), top_row = at::empty({S, c}, fr.options());
  Tensor top_tok = at::empty({S, c}, fr.options());
  select_into(best, sc.data_ptr<float>(), S, R, at_limit.data(), c, eos, top_val.data_ptr<float>(),
              top_row.data_ptr<int64_t>(), top_tok.data_ptr<int64_t>());
  return {top_val, top_row, top_tok};
}

// beam_candidates for the loop step, in loops: each row's z = logsumexp and k2 best by one scan
// (int8::best_of_logits), then select_candidates. The same selection as beam_candidates, with fp32
// rounding of its own. Returns {top_val, top_row, top_tok}, each (S, c) with c = min(want, R·k2).
std::vector<Tensor> beam_candidates_fast(const Tensor& logits, const Tensor& scores, const Tensor& forced,
                                         int64_t k2, int64_t want, int64_t eos) {
  at::NoGradGuard no_grad;
  Tensor lg = logits.to(at::kFloat).contiguous();
  int8::RowBest best = int8::best_of_logits(lg.data_ptr<float>(), lg.size(0), lg.size(1), k2, eos);
  return select_candidates(best, scores, forced, want, eos);
}

std::vector<Tensor> Decoder::step_candidates(const Tensor& tokens, const Tensor& positions,
                                             const std::vector<Tensor>& self_k, const std::vector<Tensor>& self_v,
                                             const std::vector<Tensor>& memory_k, const std::vector<Tensor>& memory_v,
                                             const Tensor& memory_mask, int64_t beam, const c10::optional<Tensor>& rows,
                                             int8::History* history, const Tensor& scores, const Tensor& forced,
                                             int64_t k2, int64_t want, int64_t eos) const {
  at::NoGradGuard no_grad;
  TORCH_CHECK(generator.loops(), "step_candidates runs the loop step");
  std::vector<Tensor> out =
      hidden_loops(tokens, positions, self_k, self_v, memory_k, memory_v, memory_mask, beam, rows, history);
  int8::RowBest best = best_of_projection(out[0].data_ptr<float>(), out[0].size(0), generator, k2, eos);
  std::vector<Tensor> top = select_candidates(best, scores, forced, want, eos);
  top.insert(top.end(), out.begin() + 1, out.end());
  return top;
}

// GNMT's lp(Y) = ((5 + |Y|) / 6)^α, as hypothesis.py's length_penalty (the same pow, the same double).
double length_penalty(int64_t length, double alpha) { return std::pow((5.0 + length) / 6.0, alpha); }

std::vector<std::vector<Hyp>> Decoder::beam_search(std::vector<Tensor> memory_k, std::vector<Tensor> memory_v,
                                                   Tensor memory_mask, const Tensor& positions,
                                                   const std::vector<int64_t>& limits, int64_t beam, double alpha,
                                                   int64_t nbest, int64_t bos, int64_t eos) const {
  at::NoGradGuard no_grad;
  TORCH_CHECK(generator.loops(), "beam_search runs the loop step");
  TORCH_CHECK(1 <= nbest && nbest <= beam, "nbest must be between 1 and the beam size ", beam, ", got ", nbest);
  const int64_t B = static_cast<int64_t>(limits.size()), want = 2 * beam, k2 = std::min(want, generator.out_features);
  TORCH_CHECK(B == memory_k[0].size(0), limits.size(), " length limits for ", memory_k[0].size(0), " sentences");
  const float inf = std::numeric_limits<float>::infinity();
  int8::History history(static_cast<int64_t>(memory_k.size()), token_weight.size(1));
  std::vector<std::vector<Hyp>> finished(B);
  std::vector<int64_t> slots(B), tokens(B, bos), kept;  // sentence per slot; each decoder row's last token
  for (int64_t b = 0; b < B; ++b) slots[b] = b;
  std::vector<float> scores(B, 0.0f);  // (slots, rows): the live beams' log-probabilities
  std::vector<std::vector<int64_t>> paths(B);  // tokens so far per decoder row
  int64_t rows = 1;  // decoder rows per slot: 1 at the first step, then beam
  for (int64_t t = 0;; ++t) {
    const int64_t S = static_cast<int64_t>(slots.size()), N = S * rows, c = std::min(want, rows * k2);
    TORCH_CHECK(t < positions.size(0), "position ", t, " exceeds max_positions=", positions.size(0));
    Tensor tok = at::from_blob(tokens.data(), {N}, at::kLong);
    c10::optional<Tensor> reorder;
    if (t > 0) reorder = at::from_blob(kept.data(), {N}, at::kLong);
    std::vector<Tensor> out = hidden_loops(tok, positions.narrow(0, t, 1), {}, {}, memory_k, memory_v, memory_mask,
                                          rows, reorder, &history);
    int8::RowBest best = best_of_projection(out[0].data_ptr<float>(), N, generator, k2, eos);
    std::vector<char> at_limit(N);
    for (int64_t n = 0; n < N; ++n) at_limit[n] = limits[slots[n / rows]] <= t;
    std::vector<float> top_val(S * c);
    std::vector<int64_t> top_row(S * c), top_tok(S * c);
    select_into(best, scores.data(), S, rows, at_limit.data(), c, eos, top_val.data(), top_row.data(), top_tok.data());

    std::vector<int64_t> keep_slots, next_rows, next_tok;
    std::vector<float> next_scores;
    for (int64_t slot = 0; slot < S; ++slot) {
      const int64_t i = slots[slot];
      std::vector<Hyp>& fin = finished[i];
      const size_t first = next_rows.size();  // this slot's picks start here
      for (int64_t j = 0; j < c; ++j) {
        const float val = top_val[slot * c + j];
        if (val == -inf || static_cast<int64_t>(next_rows.size() - first) == beam) break;
        const int64_t r = top_row[slot * c + j], token = top_tok[slot * c + j];
        if (token == eos) {  // any of the 2k candidates may finish (as tensor2tensor does)
          Hyp hyp{paths[slot * rows + r], val, val / length_penalty(t + 1, alpha)};
          // after every hypothesis that scores at least as well (search.py's _Finished: a stable sort)
          auto at = std::upper_bound(fin.begin(), fin.end(), hyp,
                                     [](const Hyp& a, const Hyp& b) { return std::get<2>(a) > std::get<2>(b); });
          fin.insert(at, std::move(hyp));
        } else {
          next_rows.push_back(slot * rows + r), next_tok.push_back(token), next_scores.push_back(val);
        }
      }
      const int64_t picked = static_cast<int64_t>(next_rows.size() - first);
      bool done = picked == 0 || t >= limits[i];  // search.py's _sentence_done
      if (!done && static_cast<int64_t>(fin.size()) >= nbest) {
        const double live = *std::max_element(next_scores.begin() + first, next_scores.end());
        const double bound = std::max(live / length_penalty(t + 2, alpha), live / length_penalty(limits[i] + 1, alpha));
        done = bound <= std::get<2>(fin[nbest - 1]);
      }
      if (done) {
        next_rows.resize(first), next_tok.resize(first), next_scores.resize(first);
      } else {
        TORCH_CHECK(picked == beam, "beam search kept ", picked, " of ", beam, " beams: the vocabulary of ",
                    generator.out_features, " is too small for a beam of ", beam);
        keep_slots.push_back(slot);
      }
    }
    if (keep_slots.empty()) return finished;
    if (static_cast<int64_t>(keep_slots.size()) < S) {  // finished sentences leave: their encoder side too
      Tensor idx = at::from_blob(keep_slots.data(), {static_cast<int64_t>(keep_slots.size())}, at::kLong);
      for (size_t l = 0; l < memory_k.size(); ++l)
        memory_k[l] = memory_k[l].index_select(0, idx), memory_v[l] = memory_v[l].index_select(0, idx);
      if (memory_mask.defined()) memory_mask = memory_mask.index_select(0, idx);
      std::vector<int64_t> next_slots;
      for (int64_t slot : keep_slots) next_slots.push_back(slots[slot]);
      slots.swap(next_slots);
    }
    std::vector<std::vector<int64_t>> next_paths;
    for (size_t j = 0; j < next_rows.size(); ++j) {
      next_paths.push_back(paths[next_rows[j]]);
      next_paths.back().push_back(next_tok[j]);
    }
    paths.swap(next_paths), kept.swap(next_rows), tokens.swap(next_tok), scores.swap(next_scores);
    rows = beam;
  }
}

// The calls that decode (encode, step, step_candidates, the candidate selections, a linear map) release the
// GIL: they touch no Python object, so a server's worker threads decode their batches on all cores at once.
using NoGil = pybind11::call_guard<pybind11::gil_scoped_release>;

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.def("beam_candidates_fast", &beam_candidates_fast, "beam_candidates in loops (the loop step)", NoGil());
  m.def("int8_linear", &int8_linear, "int8_gemm.h's y = x wᵀ + b (tests, benchmarks)", NoGil());
  m.def("has_vnni", &int8::has_vnni, "whether the AVX-512 VNNI int8 kernel is compiled in");
  m.def("has_avx2_kernel", &int8::has_avx2_kernel, "whether the AVX2 int8 kernel (no VNNI) is compiled in");
  m.def("beam_candidates", &beam_candidates, "beam search's candidate selection after a decoder step", NoGil());
  m.def("vec_gelu", &vec_gelu, "vecmath.h's GELU (tests)");
  m.def("vec_map", &vec_map, "vecmath.h's exp, gelu or swish, element-wise (tests)");
  m.def("vec_reduce", &vec_reduce, "vecmath.h's sum, sum_squares, dot or logsumexp of each row (tests)");
  m.def("vec_level", &vec::level, "the SIMD level vecmath.h was compiled for");
  m.def("vec_logsumexp", &vec_logsumexp, "vecmath.h's log sum exp over the last dimension (tests)");
  pybind11::class_<Linear>(m, "Linear", pybind11::module_local())
      .def_static("floating", &Linear::floating, "a float map of w (out, in) as nn.Linear.weight, optional bias")
      .def_static("int8", &Linear::int8, "an int8 map (int8_gemm.h) of w (out, in) and an optional bias")
      .def_static("fp32", &Linear::fp32, "an fp32 map (fp32_gemm.h) of w (out, in) and an optional bias")
      .def("__call__", &Linear::operator(), "y = x Wᵀ + b over the last dimension", NoGil());
  pybind11::class_<int8::History>(m, "History", pybind11::module_local())
      .def(pybind11::init<int64_t, int64_t>(), pybind11::arg("layers"), pybind11::arg("d_model"))
      .def_readonly("steps", &int8::History::t, "steps taken so far");
  pybind11::class_<Encoder>(m, "Encoder", pybind11::module_local())
      .def(pybind11::init<std::vector<Linear>, std::vector<Tensor>, std::vector<Linear>, Tensor, double,
                          c10::optional<Tensor>, c10::optional<Tensor>, int64_t, double, bool, double, int64_t,
                          const std::string&>(),
           // by name: backends/spec.py's TransformerSpec, flattened by backends/native.py
           pybind11::kw_only(), pybind11::arg("linears"), pybind11::arg("norms"), pybind11::arg("kv"),
           pybind11::arg("token_weight"), pybind11::arg("embed_scale"), pybind11::arg("final_w"),
           pybind11::arg("final_b"), pybind11::arg("n_heads"), pybind11::arg("attn_scale"),
           pybind11::arg("pre_norm"), pybind11::arg("eps"), pybind11::arg("pad_id"), pybind11::arg("activation"))
      .def("encode", &Encoder::encode, "the loop encoder and the encoder-decoder keys/values", NoGil());
  pybind11::class_<Decoder>(m, "Decoder", pybind11::module_local())
      .def(pybind11::init<std::vector<Linear>, std::vector<Tensor>, Linear, Tensor, double, c10::optional<Tensor>,
                          c10::optional<Tensor>, int64_t, double, bool, double, const std::string&>(),
           pybind11::kw_only(), pybind11::arg("linears"), pybind11::arg("norms"), pybind11::arg("generator"),
           pybind11::arg("token_weight"), pybind11::arg("embed_scale"), pybind11::arg("final_w"),
           pybind11::arg("final_b"), pybind11::arg("n_heads"), pybind11::arg("attn_scale"),
           pybind11::arg("pre_norm"), pybind11::arg("eps"), pybind11::arg("activation"))
      .def("step", &Decoder::step, "one incremental Transformer decoder step", NoGil())
      .def("step_candidates", &Decoder::step_candidates, "the loop step and beam search's candidate selection",
           NoGil())
      .def("beam_search", &Decoder::beam_search, "decode/search.py's beam_search with the loop step, in one call",
           NoGil());
}
