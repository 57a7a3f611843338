"""Position-wise feed-forward network (§3.3): FFN(x) = max(0, x W1 + b1) W2 + b2."""

from __future__ import annotations

from torch import Tensor, nn

ACTIVATIONS = {"relu": nn.ReLU, "gelu": nn.GELU, "geglu": nn.GELU}
GATED = {"geglu"}


class FeedForward(nn.Module):
    """Two linear maps with an activation between, applied to each position alike.

    ``activation``: ``"relu"`` (§3.3), ``"gelu"`` (Hendrycks & Gimpel, 2016; the exact erf form,
    as BERT and fairseq's ``--activation-fn gelu``) or ``"geglu"`` (Shazeer, 2020: GLU Variants
    Improve Transformer): FFN(x) = (GELU(x W + b) ⊙ (x V + c)) W2 + b2, with W and V stored as one
    (2·d_ff, d_model) matrix ``w1`` (W's rows first). GEGLU has 1.5× the FFN weights of the same
    ``d_ff``: Shazeer keeps the parameter count by taking ``d_ff`` × 2/3. ``activation_dropout``
    (off in the paper presets) drops the hidden units.
    """

    def __init__(self, d_model: int, d_ff: int, activation_dropout: float = 0.0, activation: str = "relu"):
        super().__init__()
        self.gated = activation in GATED
        self.w1 = nn.Linear(d_model, 2 * d_ff if self.gated else d_ff)
        self.w2 = nn.Linear(d_ff, d_model)
        self.act = ACTIVATIONS[activation]()
        self.dropout = nn.Dropout(activation_dropout) if activation_dropout > 0 else nn.Identity()

    def forward(self, x: Tensor) -> Tensor:
        """(B, T, d_model) -> (B, T, d_model)."""
        h = self.w1(x)  # (B, T, d_ff), or (B, T, 2·d_ff) when gated
        if self.gated:
            a, b = h.chunk(2, dim=-1)  # (B, T, d_ff) each
            h = self.act(a) * b
        else:
            h = self.act(h)
        return self.w2(self.dropout(h))
