"""The peer: ``torch.nn.Transformer`` wired the paper's way, as a careful user would write it.

Same architecture and arithmetic as :class:`transduce.model.Transformer` with a paper preset:
one shared embedding table × √d_model (§3.4), sinusoidal positions (§3.5), post-norm layers
(``norm_first=False``) without the final LayerNorm that ``nn.Transformer`` adds by default,
ReLU feed-forward, residual and embedding dropout only (attention-weight and feed-forward-hidden
dropout off, as in transduce's presets), the output projection tied to the embedding, and the same
initialisation (Xavier-uniform per Q/K/V block, zero biases, embeddings N(0, d^-0.5)).
"""

from __future__ import annotations

import math

import torch
from torch import Tensor, nn

from transduce.model import ModelConfig
from transduce.model.embeddings import sinusoid_table


class PeerTransformer(nn.Module):
    """``model(src (B, S), tgt_in (B, T)) -> logits (B, T, V)``, like transduce's."""

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.cfg = cfg
        d = cfg.d_model
        self.embed = nn.Embedding(cfg.vocab_size, d, padding_idx=cfg.pad_id)
        self.register_buffer("pe", sinusoid_table(cfg.max_positions, d), persistent=False)
        self.embed_dropout = nn.Dropout(cfg.dropout)
        encoder = nn.TransformerEncoder(
            self._layer(nn.TransformerEncoderLayer, cfg), cfg.encoder_layers, norm=None, enable_nested_tensor=False
        )
        decoder = nn.TransformerDecoder(self._layer(nn.TransformerDecoderLayer, cfg), cfg.decoder_layers, norm=None)
        self.transformer = nn.Transformer(
            d, cfg.n_heads, custom_encoder=encoder, custom_decoder=decoder, batch_first=True
        )
        self.generator = nn.Linear(d, cfg.vocab_size, bias=False)
        self._init_weights()
        self.generator.weight = self.embed.weight  # three-way tying (§3.4)

    @staticmethod
    def _layer(cls, cfg: ModelConfig) -> nn.Module:
        layer = cls(
            cfg.d_model,
            cfg.n_heads,
            cfg.d_ff,
            dropout=cfg.dropout,
            activation="relu",
            batch_first=True,
            norm_first=False,
            layer_norm_eps=cfg.layer_norm_eps,
        )
        layer.dropout = nn.Identity()  # feed-forward hidden dropout: off in the paper presets
        for name in ("self_attn", "multihead_attn"):
            if hasattr(layer, name):
                getattr(layer, name).dropout = cfg.attention_dropout  # attention-weight dropout: off
        return layer

    def _init_weights(self) -> None:
        for module in self.modules():
            if isinstance(module, nn.MultiheadAttention):
                for chunk in module.in_proj_weight.data.chunk(3, dim=0):
                    nn.init.xavier_uniform_(chunk)
                nn.init.zeros_(module.in_proj_bias)
            elif isinstance(module, nn.Linear):
                nn.init.xavier_uniform_(module.weight)
                if module.bias is not None:
                    nn.init.zeros_(module.bias)
        nn.init.normal_(self.embed.weight, std=self.cfg.d_model**-0.5)
        with torch.no_grad():
            self.embed.weight[self.cfg.pad_id].zero_()

    def _embed(self, ids: Tensor) -> Tensor:
        x = self.embed(ids) * math.sqrt(self.cfg.d_model)  # (B, T, d)
        return self.embed_dropout(x + self.pe[: ids.size(1)].to(x.dtype))

    def hidden(self, src: Tensor, tgt: Tensor) -> Tensor:
        """Decoder states before the output projection, (B, T, d) — the trainer's entry point."""
        pad = src == self.cfg.pad_id  # (B, S) True = ignore
        T = tgt.size(1)
        causal = nn.Transformer.generate_square_subsequent_mask(T, device=tgt.device)  # (T, T) -inf above
        return self.transformer(
            self._embed(src),
            self._embed(tgt),
            tgt_mask=causal,
            src_key_padding_mask=pad,
            memory_key_padding_mask=pad,
            tgt_is_causal=True,
        )  # (B, T, d)

    def forward(self, src: Tensor, tgt: Tensor) -> Tensor:
        return self.generator(self.hidden(src, tgt))  # (B, T, V)

    def num_parameters(self) -> int:
        return sum(p.numel() for p in self.parameters() if p.requires_grad)


def copy_weights(peer: PeerTransformer, model: nn.Module) -> None:
    """Give ``peer`` the exact weights of a transduce ``model`` (same config): same init, same function."""
    src = model.state_dict()
    names = {"embed.weight": "src_embed.token.weight"}
    for side, n in (("encoder", peer.cfg.encoder_layers), ("decoder", peer.cfg.decoder_layers)):
        norms = ("res_attn", "res_ff") if side == "encoder" else ("res_self", "res_cross", "res_ff")
        for i in range(n):
            a, b = f"transformer.{side}.layers.{i}.", f"{side}.layers.{i}."
            for kind in ("weight", "bias"):
                names[f"{a}self_attn.in_proj_{kind}"] = f"{b}self_attn.qkv_proj.{kind}"
                names[f"{a}self_attn.out_proj.{kind}"] = f"{b}self_attn.out_proj.{kind}"
                names[f"{a}linear1.{kind}"] = f"{b}ff.w1.{kind}"
                names[f"{a}linear2.{kind}"] = f"{b}ff.w2.{kind}"
                for j, norm in enumerate(norms, 1):
                    names[f"{a}norm{j}.{kind}"] = f"{b}{norm}.norm.{kind}"
                if side == "decoder":
                    q, kv = src[f"{b}cross_attn.q_proj.{kind}"], src[f"{b}cross_attn.kv_proj.{kind}"]
                    names[f"{a}multihead_attn.in_proj_{kind}"] = torch.cat([q, kv])  # (3d, ...) = q; k; v
                    names[f"{a}multihead_attn.out_proj.{kind}"] = f"{b}cross_attn.out_proj.{kind}"
    state = {k: (v if isinstance(v, Tensor) else src[v]) for k, v in names.items()}
    state["generator.weight"] = state["embed.weight"]
    missing, unexpected = peer.load_state_dict(state, strict=False)
    if missing or unexpected:
        raise KeyError(f"weight mapping incomplete: missing {missing}, unexpected {unexpected}")
