"""Position-wise feed-forward network (§3.3): FFN(x) = max(0, x W1 + b1) W2 + b2."""

from __future__ import annotations

from torch import Tensor, nn

ACTIVATIONS = {"relu": nn.ReLU, "gelu": nn.GELU, "swish": nn.SiLU}


class FeedForward(nn.Module):
    """Two linear maps with an activation between, applied to each position alike.

    ``activation``: ``"relu"`` (§3.3), ``"gelu"`` (Hendrycks & Gimpel, 2016; the exact erf form,
    as BERT and fairseq's ``--activation-fn gelu``) or ``"swish"`` (x·σ(x), Ramachandran et al., 2017;
    PyTorch's SiLU, Marian's ``--transformer-ffn-activation swish``). ``activation_dropout`` (off in the
    paper presets) drops the hidden units.
    """

    def __init__(self, d_model: int, d_ff: int, activation_dropout: float = 0.0, activation: str = "relu"):
        super().__init__()
        self.w1 = nn.Linear(d_model, d_ff)
        self.w2 = nn.Linear(d_ff, d_model)
        self.act = ACTIVATIONS[activation]()
        self.dropout = nn.Dropout(activation_dropout) if activation_dropout > 0 else nn.Identity()

    def forward(self, x: Tensor) -> Tensor:
        """(B, T, d_model) -> (B, T, d_model)."""
        return self.w2(self.dropout(self.act(self.w1(x))))  # hidden: (B, T, d_ff)
