// Scaled dot-product attention (§3.2.1) for training on a CPU: forward and backward, one (sentence, head)
// at a time, in fp32 whatever the input dtype (fp32 or bf16).
//
// The written-out formula in attention.py (attention_written_out) makes each call a chain of whole-tensor
// ops: two casts to fp32, a batched matmul, a mask fill, a softmax over rows of a few dozen keys, a cast
// back and a second batched matmul, each a pass over (B, h, T_q, T_k) memory, and as many again backward.
// Here the scores of one head stay in cache from Q Kᵀ to the weighted sum of V.
//   forward:  S = scale · Q Kᵀ, masked; P = softmax(S) (rows); O = P V        (P kept, fp32)
//   backward: dV = Pᵀ dO;  dP = dO Vᵀ;  dS = P ⊙ (dP − rowsum(P ⊙ dP));  dQ = scale · dS K;  dK = scale · dSᵀ Q
// A query row with no key to attend gets output 0 and no gradient, as attention_reference's guard.
// Inputs may have any strides (the heads are views of the fused projections); the output is written as
// (B, T_q, h·d_k), the layout W^O reads, and the gradients as (B, T, h, d_k) memory, the projections' layout.
// An experiment (bench/native_attention/compare.py): slower than the written-out tensor ops at Multi30k's lengths.
#include <torch/extension.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <vector>

using at::Tensor;

namespace {

inline float load(const float* p) { return *p; }
inline float load(const uint16_t* p) {  // bf16 -> fp32 is exact: the top 16 bits
  uint32_t bits = static_cast<uint32_t>(*p) << 16;
  float f;
  std::memcpy(&f, &bits, 4);
  return f;
}
inline void store(float* p, float v) { *p = v; }
inline void store(uint16_t* p, float v) {  // fp32 -> bf16, rounding to nearest even (as torch)
  uint32_t bits;
  std::memcpy(&bits, &v, 4);
  bits += 0x7FFFu + ((bits >> 16) & 1u);
  *p = static_cast<uint16_t>(bits >> 16);
}

// A strided (B, h, T, d) tensor's element pointer arithmetic.
template <typename T>
struct Heads {
  T* data;
  int64_t sb, sh, st, sd;
  Heads(const Tensor& x, T* ptr) : data(ptr), sb(x.stride(0)), sh(x.stride(1)), st(x.stride(2)), sd(x.stride(3)) {}
  // rows (T, d) of head (b, h) into fp32 `out`, row-major
  void gather(int64_t b, int64_t h, int64_t T_, int64_t d, float* out) const {
    const T* base = data + b * sb + h * sh;
    for (int64_t t = 0; t < T_; ++t)
      for (int64_t j = 0; j < d; ++j) out[t * d + j] = load(base + t * st + j * sd);
  }
};

// Head (b, h) of q, k, v into fp32 scratch, row-major, and `transposed` (d, Tk) = the transpose of k
// (forward: for the scores) or of v (backward: for dP = dO Vᵀ).
template <typename T>
void load_head(const Heads<T>& Q, const Heads<T>& K, const Heads<T>& V, int64_t b, int64_t h, int64_t Tq,
               int64_t Tk, int64_t d, float* qs, float* ks, float* vs, bool transpose_k, float* transposed) {
  Q.gather(b, h, Tq, d, qs);
  K.gather(b, h, Tk, d, ks);
  V.gather(b, h, Tk, d, vs);
  const float* src = transpose_k ? ks : vs;
  for (int64_t j = 0; j < Tk; ++j)
    for (int64_t c = 0; c < d; ++c) transposed[c * Tk + j] = src[j * d + c];
}

// Whether query i may see key j: the mask (broadcast over B and T_q by zero strides) and causality.
struct Visible {
  const bool* mask = nullptr;
  int64_t sb = 0, sq = 0, sk = 0, offset = 0;
  bool causal = false;
  bool operator()(int64_t b, int64_t i, int64_t j) const {
    if (causal && j > i + offset) return false;
    return mask == nullptr || mask[b * sb + i * sq + j * sk];
  }
};

template <typename T>
void forward_impl(const Tensor& q, const Tensor& k, const Tensor& v, const Visible& visible, float scale,
                  Tensor& out, Tensor& probs) {
  const int64_t B = q.size(0), H = q.size(1), Tq = q.size(2), Tk = k.size(2), d = q.size(3);
  Heads<T> Q(q, reinterpret_cast<T*>(q.data_ptr())), K(k, reinterpret_cast<T*>(k.data_ptr())),
      V(v, reinterpret_cast<T*>(v.data_ptr()));
  T* o = reinterpret_cast<T*>(out.data_ptr());  // (B, Tq, H, d)
  float* P = probs.data_ptr<float>();           // (B, H, Tq, Tk)
  at::parallel_for(0, B * H, 1, [&](int64_t begin, int64_t end) {
    std::vector<float> qs(Tq * d), ks(Tk * d), kt(d * Tk), vs(Tk * d), acc(d);
    for (int64_t bh = begin; bh < end; ++bh) {
      const int64_t b = bh / H, h = bh % H;
      load_head(Q, K, V, b, h, Tq, Tk, d, qs.data(), ks.data(), vs.data(), true, kt.data());
      for (int64_t i = 0; i < Tq; ++i) {
        float* p = P + (bh * Tq + i) * Tk;  // this query's scores, then weights
        std::fill(p, p + Tk, 0.0f);
        for (int64_t c = 0; c < d; ++c) {
          const float a = qs[i * d + c] * scale;
          const float* kc = kt.data() + c * Tk;
          for (int64_t j = 0; j < Tk; ++j) p[j] += a * kc[j];
        }
        float m = -std::numeric_limits<float>::infinity();
        bool any = false;
        for (int64_t j = 0; j < Tk; ++j) {
          if (visible(b, i, j)) {
            m = std::max(m, p[j]);
            any = true;
          }
        }
        T* orow = o + ((b * Tq + i) * H + h) * d;
        if (!any) {  // no key to attend: output 0, weights 0 (so no gradient)
          std::fill(p, p + Tk, 0.0f);
          for (int64_t c = 0; c < d; ++c) store(orow + c, 0.0f);
          continue;
        }
        float s = 0;
        for (int64_t j = 0; j < Tk; ++j) {
          const float e = visible(b, i, j) ? std::exp(p[j] - m) : 0.0f;
          p[j] = e;
          s += e;
        }
        const float inv = 1.0f / s;
        std::fill(acc.begin(), acc.end(), 0.0f);
        for (int64_t j = 0; j < Tk; ++j) {
          p[j] *= inv;
          const float w = p[j];
          const float* vj = vs.data() + j * d;
          for (int64_t c = 0; c < d; ++c) acc[c] += w * vj[c];
        }
        for (int64_t c = 0; c < d; ++c) store(orow + c, acc[c]);
      }
    }
  });
}

template <typename T>
void backward_impl(const Tensor& dout, const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& probs,
                   float scale, Tensor& dq, Tensor& dk, Tensor& dv) {
  const int64_t B = q.size(0), H = q.size(1), Tq = q.size(2), Tk = k.size(2), d = q.size(3);
  Heads<T> Q(q, reinterpret_cast<T*>(q.data_ptr())), K(k, reinterpret_cast<T*>(k.data_ptr())),
      V(v, reinterpret_cast<T*>(v.data_ptr()));
  const T* go = reinterpret_cast<const T*>(dout.data_ptr());  // (B, Tq, H, d)
  const float* P = probs.data_ptr<float>();                   // (B, H, Tq, Tk)
  T *gq = reinterpret_cast<T*>(dq.data_ptr()), *gk = reinterpret_cast<T*>(dk.data_ptr()),
    *gv = reinterpret_cast<T*>(dv.data_ptr());  // (B, T, H, d) each
  at::parallel_for(0, B * H, 1, [&](int64_t begin, int64_t end) {
    std::vector<float> qs(Tq * d), ks(Tk * d), vt(d * Tk), vs(Tk * d), g(Tq * d), dp(Tk), gqs(d),
        gks(Tk * d), gvs(Tk * d);
    for (int64_t bh = begin; bh < end; ++bh) {
      const int64_t b = bh / H, h = bh % H;
      load_head(Q, K, V, b, h, Tq, Tk, d, qs.data(), ks.data(), vs.data(), false, vt.data());
      for (int64_t i = 0; i < Tq; ++i)
        for (int64_t c = 0; c < d; ++c) g[i * d + c] = load(go + ((b * Tq + i) * H + h) * d + c);
      std::fill(gks.begin(), gks.end(), 0.0f);
      std::fill(gvs.begin(), gvs.end(), 0.0f);
      for (int64_t i = 0; i < Tq; ++i) {
        const float* p = P + (bh * Tq + i) * Tk;
        const float* gi = g.data() + i * d;
        std::fill(dp.begin(), dp.end(), 0.0f);
        for (int64_t c = 0; c < d; ++c) {  // dP = dO Vᵀ
          const float a = gi[c];
          const float* vc = vt.data() + c * Tk;
          for (int64_t j = 0; j < Tk; ++j) dp[j] += a * vc[j];
        }
        float row = 0;
        for (int64_t j = 0; j < Tk; ++j) row += p[j] * dp[j];
        std::fill(gqs.begin(), gqs.end(), 0.0f);
        const float* qi = qs.data() + i * d;
        for (int64_t j = 0; j < Tk; ++j) {
          if (p[j] == 0.0f) continue;  // masked (or underflowed) keys pass no gradient
          const float ds = p[j] * (dp[j] - row) * scale, w = p[j];
          const float* kj = ks.data() + j * d;
          float* gkj = gks.data() + j * d;
          float* gvj = gvs.data() + j * d;
          for (int64_t c = 0; c < d; ++c) {
            gqs[c] += ds * kj[c];
            gkj[c] += ds * qi[c];
            gvj[c] += w * gi[c];
          }
        }
        T* out = gq + ((b * Tq + i) * H + h) * d;
        for (int64_t c = 0; c < d; ++c) store(out + c, gqs[c]);
      }
      for (int64_t j = 0; j < Tk; ++j) {
        T* ok = gk + ((b * Tk + j) * H + h) * d;
        T* ov = gv + ((b * Tk + j) * H + h) * d;
        for (int64_t c = 0; c < d; ++c) {
          store(ok + c, gks[j * d + c]);
          store(ov + c, gvs[j * d + c]);
        }
      }
    }
  });
}

void check(const Tensor& x, const Tensor& like, const char* name) {
  TORCH_CHECK(x.device().is_cpu() && x.dim() == 4, name, ": a (B, h, T, d_k) CPU tensor");
  TORCH_CHECK(x.scalar_type() == like.scalar_type(), name, ": the same dtype as q");
  TORCH_CHECK(x.scalar_type() == at::kFloat || x.scalar_type() == at::kBFloat16, name, ": fp32 or bf16");
}

Visible visibility(const c10::optional<Tensor>& mask, bool causal, int64_t Tq, int64_t Tk) {
  Visible vis;
  vis.causal = causal;
  vis.offset = Tk - Tq;  // as tril(T_k - T_q): the last query sees every key
  if (mask.has_value() && mask->defined()) {
    const Tensor& m = *mask;
    TORCH_CHECK(m.scalar_type() == at::kBool && m.dim() == 3 && m.size(1) == Tq && m.size(2) == Tk,
                "mask: a bool (B, T_q, T_k) tensor (broadcast by strides)");
    vis.mask = m.data_ptr<bool>();
    vis.sb = m.stride(0);
    vis.sq = m.stride(1);
    vis.sk = m.stride(2);
  }
  return vis;
}

// q (B, h, T_q, d_k), k/v (B, h, T_k, d_k) -> output (B, T_q, h·d_k) in q's dtype and the weights
// (B, h, T_q, T_k) fp32 that backward needs. mask: bool (B, T_q, T_k), True = may attend.
std::vector<Tensor> forward(const Tensor& q, const Tensor& k, const Tensor& v, const c10::optional<Tensor>& mask,
                            bool causal, double scale) {
  check(q, q, "q");
  check(k, q, "k");
  check(v, q, "v");
  const int64_t B = q.size(0), H = q.size(1), Tq = q.size(2), Tk = k.size(2), d = q.size(3);
  TORCH_CHECK(k.size(0) == B && v.size(0) == B && k.size(1) == H && v.size(1) == H && v.size(2) == Tk &&
                  k.size(3) == d && v.size(3) == d,
              "q, k, v: shapes (B, h, T_q, d_k), (B, h, T_k, d_k), (B, h, T_k, d_k)");
  TORCH_CHECK(!mask.has_value() || !mask->defined() || mask->size(0) == B, "mask: first dimension B");
  Tensor out = at::empty({B, Tq, H * d}, q.options());
  Tensor probs = at::empty({B, H, Tq, Tk}, q.options().dtype(at::kFloat));
  const Visible vis = visibility(mask, causal, Tq, Tk);
  if (q.scalar_type() == at::kFloat)
    forward_impl<float>(q, k, v, vis, static_cast<float>(scale), out, probs);
  else
    forward_impl<uint16_t>(q, k, v, vis, static_cast<float>(scale), out, probs);
  return {out, probs};
}

// dout (B, T_q, h·d_k) -> dq (B, h, T_q, d_k), dk, dv (B, h, T_k, d_k), each a view of (B, T, h, d_k) memory.
std::vector<Tensor> backward(const Tensor& dout, const Tensor& q, const Tensor& k, const Tensor& v,
                             const Tensor& probs, double scale) {
  const int64_t B = q.size(0), H = q.size(1), Tq = q.size(2), Tk = k.size(2), d = q.size(3);
  Tensor g = dout.to(q.scalar_type()).contiguous();
  TORCH_CHECK(g.dim() == 3 && g.size(0) == B && g.size(1) == Tq && g.size(2) == H * d, "dout: (B, T_q, h·d_k)");
  Tensor dq = at::empty({B, Tq, H, d}, q.options()), dk = at::empty({B, Tk, H, d}, q.options()),
         dv = at::empty({B, Tk, H, d}, q.options());
  if (q.scalar_type() == at::kFloat)
    backward_impl<float>(g, q, k, v, probs, static_cast<float>(scale), dq, dk, dv);
  else
    backward_impl<uint16_t>(g, q, k, v, probs, static_cast<float>(scale), dq, dk, dv);
  return {dq.transpose(1, 2), dk.transpose(1, 2), dv.transpose(1, 2)};
}

}  // namespace

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.def("forward", &forward, "attention output (B, T_q, h·d_k) and weights (B, h, T_q, T_k)");
  m.def("backward", &backward, "dq, dk, dv of attention from dout and the forward's weights");
}
