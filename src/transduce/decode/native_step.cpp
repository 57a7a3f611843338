// One incremental decoder step (paper §3.1, §3.2.3) as a single C++ call over ATen.
//
// fp32/bf16: the same arithmetic as Transformer.decode_step in Python (model/transformer.py,
// model/layers.py, model/attention.py: attention_reference), op for op, so the outputs are the same.
// What it saves is the Python side of each op: at batch 1 a step is a few hundred small ops and their
// dispatch from Python costs more than their work (BENCHMARKS.md, "Decoding").
// int8: every Linear of the step runs fbgemm's int8 GEMM (weights quantised once, per tensor;
// activations quantised per call from their min and max), an approximation of the fp32 step.
// Built on first use by transduce/decode/native.py with torch.utils.cpp_extension; without a compiler
// the Python step runs.
#include <torch/extension.h>

#include <limits>
#include <vector>

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

// Drops warnings: fbgemm_linear_int8_weight_fp32_activation announces a deprecation on first use
// (the torch this package pins has it; a torch without it fails the build and the Python step runs).
struct Quiet : c10::WarningHandler {
  void process(const c10::Warning&) override {}
};

}  // namespace

// y = x Wᵀ + b over the last dimension of x, in one of two arithmetics:
//   float: W pre-transposed, wt (in, out) contiguous (made once, the layout the GEMM reads fastest);
//          no bias: at::mm, as nn.Linear without bias.
//   int8:  fbgemm: W quantised per tensor (scale, zero point), packed once; x quantised per call.
struct Linear {
  Tensor wt, bias;                  // float
  Tensor wq, packed, col_offsets;   // int8 (bias is then always defined)
  double scale = 0.0;
  int64_t zero_point = 0;
  int64_t out_features = 0;

  static Linear floating(const Tensor& wt, const c10::optional<Tensor>& bias) {
    Linear l;
    l.wt = wt;
    if (bias.has_value()) l.bias = *bias;
    l.out_features = wt.size(1);
    return l;
  }

  static Linear int8(const Tensor& wq, const Tensor& packed, const Tensor& col_offsets, double scale,
                     int64_t zero_point, const Tensor& bias) {
    Linear l;
    l.wq = wq, l.packed = packed, l.col_offsets = col_offsets, l.bias = bias;
    l.scale = scale, l.zero_point = zero_point, l.out_features = wq.size(0);
    return l;
  }

  Tensor operator()(const Tensor& x) const {
    auto sizes = x.sizes().vec();
    sizes.back() = out_features;
    Tensor x2 = x.reshape({-1, x.size(-1)});  // (rows, in)
    Tensor y;
    if (packed.defined()) {
      static Quiet quiet;
      c10::WarningUtils::WarningHandlerGuard guard(&quiet);
      y = at::fbgemm_linear_int8_weight_fp32_activation(x2.contiguous(), wq, packed, col_offsets, scale,
                                                         zero_point, bias);
    } else {
      y = bias.defined() ? at::addmm(bias, x2, wt) : at::mm(x2, wt);
    }
    return y.view(sizes);  // (..., out)
  }
};

// The decoder's weights, held in C++ between steps. Per layer, `linears` holds 6 maps (self-attention
// qkv and out, cross-attention q and out, feed-forward w1 and w2) and `norms` 6 tensors (weight and bias
// of the self-attention, cross-attention and feed-forward layer norms).
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

  Decoder(std::vector<Linear> linears, std::vector<Tensor> norms, Linear generator, Tensor token_weight,
          double embed_scale, c10::optional<Tensor> final_w, c10::optional<Tensor> final_b, int64_t n_heads,
          double attn_scale, bool pre_norm, double eps)
      : linears(std::move(linears)), norms(std::move(norms)), generator(std::move(generator)),
        token_weight(std::move(token_weight)), final_w(std::move(final_w)), final_b(std::move(final_b)),
        embed_scale(embed_scale), attn_scale(attn_scale), eps(eps), n_heads(n_heads), pre_norm(pre_norm) {
    TORCH_CHECK(this->linears.size() % LINEARS == 0 && this->norms.size() == this->linears.size() / LINEARS * NORMS,
                "expected 6 linear maps and 6 norm tensors per layer, got ", this->linears.size(), " and ",
                this->norms.size());
  }

  // tokens (N,) long; positions (1, d_model): this step's positional encoding, in the model's dtype.
  // self_k/self_v: per layer (N', h, t, d_k), empty lists at the first step; rows (N,): which of their N'
  // rows to keep, in order (a beam reorder left for this step; none: all, N = N'); memory_k/memory_v: per
  // layer (B, h, S, d_k); memory_mask (B, 1, 1, S) bool. Returns {logits (N, V), new self_k..., new self_v...}.
  std::vector<Tensor> step(const Tensor& tokens, const Tensor& positions, const std::vector<Tensor>& self_k,
                           const std::vector<Tensor>& self_v, const std::vector<Tensor>& memory_k,
                           const std::vector<Tensor>& memory_v, const Tensor& memory_mask, int64_t beam,
                           const c10::optional<Tensor>& rows) const {
    at::NoGradGuard no_grad;
    const int64_t N = tokens.size(0);
    const size_t layers = memory_k.size();
    TORCH_CHECK(layers * LINEARS == linears.size(), "the cache has ", layers, " layers, the decoder ",
                linears.size() / LINEARS);
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
        return lin[5](at::relu(lin[4](h)));  // hidden (N, 1, d_ff)
      });
    }
    if (final_w.has_value()) x = layer_norm(x, *final_w, *final_b, eps);
    out[0] = generator(x.squeeze(1));  // (N, V)
    out.insert(out.end(), new_v.begin(), new_v.end());
    return out;
  }
};

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

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.def("beam_candidates", &beam_candidates, "beam search's candidate selection after a decoder step");
  pybind11::class_<Linear>(m, "Linear")
      .def_static("floating", &Linear::floating, "a float map from wt = Wᵀ (in, out) and an optional bias")
      .def_static("int8", &Linear::int8, "an fbgemm int8 map from torch.fbgemm_linear_quantize_weight's outputs");
  pybind11::class_<Decoder>(m, "Decoder")
      .def(pybind11::init<std::vector<Linear>, std::vector<Tensor>, Linear, Tensor, double, c10::optional<Tensor>,
                          c10::optional<Tensor>, int64_t, double, bool, double>())
      .def("step", &Decoder::step, "one incremental Transformer decoder step");
}
