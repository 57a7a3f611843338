// The training step's C++ kernels as one extension: the loss of a block of logit rows (native_loss.h: label
// smoothing and R-Drop, §5.4), inverted dropout (native_dropout.h, §5.4), the post-norm sub-layer connection
// LayerNorm(x + Dropout(y)) (native_residual.h, §3.1) and multi-head attention over the projections' packed
// output (native_attention.h, §3.2). One translation unit, so that
// ATen's headers, most of a build's time, are parsed once. Built on first use by transduce/train/native.py
// (torch.utils.cpp_extension); without a compiler the tensor ops run.
#include <torch/csrc/utils/pybind.h>

#include "native_attention.h"
#include "native_dropout.h"
#include "native_loss.h"
#include "native_residual.h"

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.def("smoothed_block_", &smoothed_block_, "smoothed loss and NLL per row; logits -> gradient in place");
  m.def("rdrop_block_", &rdrop_block_, "R-Drop loss and NLL per row pair; both logit blocks -> gradients in place");
  m.def("dropout", &dropout, "in · keep(seed, index) · scale, keep at 1 − threshold/32768 (fp32 or bf16)");
  m.def("residual_norm", &residual_norm, "LayerNorm(x + Dropout(y)) -> z, x̂, rstd");
  m.def("attention", &attention, "heads from the packed projections -> merged heads (B, T_q, h·d_v), P");
  m.def("attention_backward", &attention_backward, "∂ merged heads, P -> ∂q_src, ∂kv_src in place");
  m.def("residual_norm_backward", &residual_norm_backward, "∂z -> ∂x, ∂y, ∂γ, ∂β");
}
