"""The encoder–decoder Transformer (§3, Figure 1)."""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor, nn

from .attention import MultiHeadAttention
from .cache import DecoderCache, LayerCache
from .config import ModelConfig
from .embeddings import Embeddings, LearnedPositions, SinusoidalPositions
from .layers import DecoderLayer, EncoderLayer


def window_mask(length_q: int, length_k: int, r: int, causal: bool, device=None, offset: int = 0) -> Tensor:
    """Restricted self-attention (Table 1): which keys each query may see. Returns bool (T_q, T_k).

    Query i sits at absolute position ``offset + i``. Encoder (``causal=False``): the r
    positions centred on i, j ∈ [i − (r−1)//2, i + r//2]. Decoder (``causal=True``): the r
    most recent positions, j ∈ [i − r + 1, i].
    """
    i = torch.arange(offset, offset + length_q, device=device).unsqueeze(1)  # (T_q, 1)
    j = torch.arange(length_k, device=device).unsqueeze(0)  # (1, T_k)
    if causal:
        return (j <= i) & (j > i - r)
    return (j >= i - (r - 1) // 2) & (j <= i + r // 2)


@dataclass
class Encoded:
    """Encoder output: memory (B, S, d_model) and its key mask (B, 1, 1, S), True on real tokens."""

    memory: Tensor
    mask: Tensor


class Encoder(nn.Module):
    """A stack of N encoder layers (§3.1); pre-norm adds the final LayerNorm it needs."""

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.layers = nn.ModuleList(EncoderLayer(cfg) for _ in range(cfg.encoder_layers))
        self.final_norm = nn.LayerNorm(cfg.d_model, eps=cfg.layer_norm_eps) if cfg.norm == "pre" else None

    def forward(self, x: Tensor, mask: Tensor) -> Tensor:
        for layer in self.layers:
            x = layer(x, mask)
        return self.final_norm(x) if self.final_norm is not None else x


class Decoder(nn.Module):
    """A stack of N decoder layers (§3.1); pre-norm adds the final LayerNorm it needs."""

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.layers = nn.ModuleList(DecoderLayer(cfg) for _ in range(cfg.decoder_layers))
        self.final_norm = nn.LayerNorm(cfg.d_model, eps=cfg.layer_norm_eps) if cfg.norm == "pre" else None

    def forward(self, x: Tensor, memory: Tensor, self_mask: Tensor | None, memory_mask: Tensor) -> Tensor:
        for layer in self.layers:
            x = layer(x, memory, self_mask, memory_mask)
        return self.final_norm(x) if self.final_norm is not None else x

    def step(self, x: Tensor, cache: DecoderCache, self_mask: Tensor | None) -> Tensor:
        for layer, layer_cache in zip(self.layers, cache.layers):
            x = layer.step(x, layer_cache, self_mask, cache.memory_mask, cache.beam)
        return self.final_norm(x) if self.final_norm is not None else x


class Transformer(nn.Module):
    """The paper's model (Figure 1): embeddings, encoder, decoder, tied pre-softmax projection.

    The projection (``generator``) has no bias, as in the paper (§3.4), unless ``config.output_bias``
    (Marian / OPUS-MT models have one): then logits = h Wᵀ + b.

    ``model(src, tgt)`` takes right-padded LongTensors ``src`` (B, S) and ``tgt`` (B, T),
    where ``tgt`` is the decoder input — the target shifted right, starting with ``bos_id``
    (§3.1) — and returns logits (B, T, V): position t scores the token after ``tgt[:, t]``.
    Masks come from ``pad_id``; the decoder's self-attention is causal.

    Initialisation: Xavier-uniform weights for every projection (the fused Q/K/V matrix
    per part), zero biases, embeddings N(0, d_model^-0.5) with a zero padding row.
    """

    def __init__(self, config: ModelConfig):
        super().__init__()
        self.config = cfg = config
        src_pos, tgt_pos = self._positions(cfg)
        self.src_embed = Embeddings(cfg.vocab_size, cfg.d_model, cfg.pad_id, src_pos, cfg.dropout, cfg.scale_embeddings)
        shared = self.src_embed.token if cfg.tie_embeddings == "all" else None
        self.tgt_embed = Embeddings(
            cfg.target_vocab_size, cfg.d_model, cfg.pad_id, tgt_pos, cfg.dropout, cfg.scale_embeddings, token=shared
        )
        self.encoder = Encoder(cfg)
        self.decoder = Decoder(cfg)
        self.generator = nn.Linear(cfg.d_model, cfg.target_vocab_size, bias=cfg.output_bias)
        self._init_weights()
        if cfg.tie_embeddings in ("all", "target"):
            self.generator.weight = self.tgt_embed.token.weight  # one tensor (§3.4)

    @classmethod
    def empty(cls, config: ModelConfig) -> Transformer:
        """The model with its parameters on the meta device: no memory, no initialisation, for weights that
        replace every one of them (``modeldir.load_model_dir`` assigns a file's tensors). The fixed position
        table is real (``SinusoidalPositions``)."""
        with torch.device("meta"):
            return cls(config)

    @staticmethod
    def _positions(cfg: ModelConfig) -> tuple[nn.Module, nn.Module]:
        if cfg.positions == "learned":
            return LearnedPositions(cfg.d_model, cfg.max_positions), LearnedPositions(cfg.d_model, cfg.max_positions)
        table = SinusoidalPositions(cfg.d_model, cfg.max_positions)
        return table, table

    def _init_weights(self) -> None:
        fused = {}  # a fused Q/K/V projection -> its parts' row counts, each part initialised alone
        for module in self.modules():
            if isinstance(module, MultiHeadAttention):
                fused.update({getattr(module, name): rows for name, rows in module.fused_rows.items()})
        for module in self.modules():
            if isinstance(module, nn.Linear):
                for chunk in module.weight.data.split(fused.get(module, (module.weight.size(0),)), dim=0):
                    nn.init.xavier_uniform_(chunk)
                if module.bias is not None:
                    nn.init.zeros_(module.bias)

    # ----------------------------------------------------------------- masks
    def source_mask(self, src: Tensor) -> Tensor:
        """(B, S) ids -> (B, 1, 1, S) bool, True on real tokens."""
        return (src != self.config.pad_id)[:, None, None, :]

    def _encoder_self_mask(self, key_mask: Tensor) -> Tensor:
        r = self.config.attention_window
        if r is None:
            return key_mask  # (B, 1, 1, S)
        S = key_mask.size(-1)
        return key_mask & window_mask(S, S, r, causal=False, device=key_mask.device)  # (B, 1, S, S)

    def _decoder_self_mask(self, T_q: int, T_k: int, offset: int, device) -> Tensor | None:
        r = self.config.attention_window
        if r is None:
            return None  # causal: the fused kernel's flag in full passes; a step sees only its prefix
        return window_mask(T_q, T_k, r, causal=True, device=device, offset=offset)  # (T_q, T_k)

    # ----------------------------------------------------------------- passes
    def encode(self, src: Tensor) -> Encoded:
        """src (B, S) -> :class:`Encoded` with memory (B, S, d_model)."""
        mask = self.source_mask(src)
        memory = self.encoder(self.src_embed(src), self._encoder_self_mask(mask))
        return Encoded(memory, mask)

    def decode_hidden(self, tgt: Tensor, encoded: Encoded) -> Tensor:
        """Teacher-forced decoder pass: tgt (B, T) decoder input -> final states (B, T, d_model)."""
        T = tgt.size(1)
        self_mask = self._decoder_self_mask(T, T, 0, tgt.device)
        x = self.tgt_embed(tgt)  # (B, T, d_model)
        return self.decoder(x, encoded.memory, self_mask, encoded.mask)  # (B, T, d_model)

    def decode(self, tgt: Tensor, encoded: Encoded) -> Tensor:
        """Teacher-forced decoder pass: tgt (B, T) decoder input -> logits (B, T, V)."""
        return self.generator(self.decode_hidden(tgt, encoded))

    def forward(self, src: Tensor, tgt: Tensor) -> Tensor:
        """src (B, S), tgt (B, T) -> logits (B, T, V)."""
        return self.decode(tgt, self.encode(src))

    def hidden(self, src: Tensor, tgt: Tensor) -> Tensor:
        """Decoder states before the pre-softmax projection, (B, T, d_model).

        Training uses it to project only the non-padding positions: ``model.generator(h[keep])``.
        """
        return self.decode_hidden(tgt, self.encode(src))

    # ----------------------------------------------------------------- incremental decoding
    def init_cache(self, encoded: Encoded, beam: int = 1) -> DecoderCache:
        """Compute each layer's encoder–decoder keys/values once per sentence.

        ``beam`` is the number of decoder rows per sentence that the first step will feed.
        """
        layers = [LayerCache(*layer.cross_attn.project_kv(encoded.memory)) for layer in self.decoder.layers]
        return DecoderCache(layers=layers, memory_mask=encoded.mask, beam=beam)

    def decode_step(self, tokens: Tensor, cache: DecoderCache) -> Tensor:
        """Feed one token per row: tokens (N,) with N = B·beam -> logits (N, V).

        Rows of one sentence are adjacent. The cache advances by one position.
        """
        t = cache.position
        x = self.tgt_embed(tokens.unsqueeze(1), start=t)  # (N, 1, d_model)
        self_mask = self._decoder_self_mask(1, t + 1, t, tokens.device)
        h = self.decoder.step(x, cache, self_mask)  # (N, 1, d_model)
        cache.position += 1
        return self.generator(h.squeeze(1))  # (N, V)

    def num_parameters(self) -> int:
        """Trainable parameters, each shared tensor counted once."""
        return sum(p.numel() for p in self.parameters() if p.requires_grad)
