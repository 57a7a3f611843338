"""ModelConfig: the architecture's hyper-parameters, with the paper's presets (Table 3)."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from ..config import ConfigError, build, check, read_toml, to_toml_text

# Presets. paper-base / paper-big are Table 3's rows; the rest are sized for two CPU cores.
PRESETS: dict[str, dict[str, Any]] = {
    # Table 3 "base": N=6, d_model=512, d_ff=2048, h=8, P_drop=0.1, eps_ls=0.1 (65M params)
    "paper-base": dict(
        encoder_layers=6, decoder_layers=6, d_model=512, d_ff=2048, n_heads=8, dropout=0.1, label_smoothing=0.1
    ),
    # Table 3 "big": N=6, d_model=1024, d_ff=4096, h=16, P_drop=0.3, eps_ls=0.1 (213M params)
    "paper-big": dict(
        encoder_layers=6, decoder_layers=6, d_model=1024, d_ff=4096, n_heads=16, dropout=0.3, label_smoothing=0.1
    ),
    # ~0.23M params without embeddings: unit tests and smoke runs, seconds per epoch slice.
    "tiny": dict(encoder_layers=2, decoder_layers=2, d_model=64, d_ff=256, n_heads=4, dropout=0.1, label_smoothing=0.1),
    # ~1.3M params without embeddings: the Multi30k-sized model (Wu et al. 2021's "tiny" shape).
    "small": dict(
        encoder_layers=4, decoder_layers=4, d_model=128, d_ff=256, n_heads=4, dropout=0.3, label_smoothing=0.1
    ),
    # ~5.5M params without embeddings: a CPU model for larger corpora (Bible) in tens of minutes.
    "medium": dict(
        encoder_layers=3, decoder_layers=3, d_model=256, d_ff=1024, n_heads=4, dropout=0.1, label_smoothing=0.1
    ),
}


@dataclass
class ModelConfig:
    """Hyper-parameters of :class:`~transduce.model.transformer.Transformer`.

    Defaults are the paper's base model (§3, Table 3). Switches select the
    alternatives the paper discusses:

    * ``norm``: ``"post"`` (the paper) or ``"pre"``.
    * ``activation``: the feed-forward's ``"relu"`` (§3.3), ``"gelu"`` or ``"swish"`` (x·σ(x), also called SiLU).
    * ``positions``: ``"sinusoidal"`` (§3.5) or ``"learned"`` (Table 3 row E).
    * ``tie_embeddings``: ``"all"`` (source, target and pre-softmax share one matrix, §3.4),
      ``"target"`` (target embedding and pre-softmax only) or ``"none"``.
    * ``output_bias``: a bias on the pre-softmax projection (the logits' ``b`` of Marian and OPUS-MT models,
      HF's ``final_logits_bias``). Off by default: the paper's projection shares the embedding matrix and
      has no bias (§3.4).
    * ``attention``: ``"scaled_dot"`` (§3.2.1), ``"dot"`` (no 1/√d_k) or ``"additive"``.
    * ``d_k``: the query/key width per head, d_model / n_heads when absent; values keep d_model / n_heads
      (Table 3 row B).
    * ``attention_window``: restricted self-attention over a neighbourhood of r
      positions (Table 1): centred on i in the encoder, the r most recent in the decoder.
    * ``source_eos``: the source ends with ``</s>`` (every model transduce trains). OpenNMT-py models (and so
      Argos Translate packages) encode the source without it: ``false`` when imported from one.
    """

    vocab_size: int = 37000
    tgt_vocab_size: int | None = None  # None: same vocabulary as the source
    pad_id: int = 0
    unk_id: int = 1
    bos_id: int = 2
    eos_id: int = 3
    encoder_layers: int = 6
    decoder_layers: int = 6
    d_model: int = 512
    d_ff: int = 2048
    n_heads: int = 8
    d_k: int | None = None  # query/key width per head; None: d_model / n_heads (§3.2.2); Table 3 row B narrows it
    dropout: float = 0.1
    attention_dropout: float = 0.0
    activation_dropout: float = 0.0
    activation: Literal["relu", "gelu", "swish"] = "relu"
    label_smoothing: float = 0.1
    norm: Literal["post", "pre"] = "post"
    positions: Literal["sinusoidal", "learned"] = "sinusoidal"
    max_positions: int = 1024
    tie_embeddings: Literal["all", "target", "none"] = "all"
    output_bias: bool = False
    scale_embeddings: bool = True
    attention: Literal["scaled_dot", "dot", "additive"] = "scaled_dot"
    attention_window: int | None = None
    layer_norm_eps: float = 1e-5
    source_eos: bool = True

    def __post_init__(self) -> None:
        for key in ("vocab_size", "encoder_layers", "decoder_layers", "d_model", "d_ff", "n_heads", "max_positions"):
            check(getattr(self, key) >= 1, key, f"must be at least 1, got {getattr(self, key)}")
        check(
            self.tgt_vocab_size is None or self.tgt_vocab_size >= 1,
            "tgt_vocab_size",
            f"must be at least 1, got {self.tgt_vocab_size}",
        )
        check(self.d_k is None or self.d_k >= 1, "d_k", f"must be at least 1 (or absent), got {self.d_k}")
        check(
            self.d_model % self.n_heads == 0,
            "d_model",
            f"d_model={self.d_model} is not divisible by n_heads={self.n_heads}",
        )
        check(
            self.d_model % 2 == 0 or self.positions != "sinusoidal",
            "d_model",
            f"sinusoidal positions need an even d_model, got {self.d_model}",
        )
        for key in ("dropout", "attention_dropout", "activation_dropout", "label_smoothing"):
            value = getattr(self, key)
            check(0.0 <= value < 1.0, key, f"must be in [0, 1), got {value}")
        check(self.layer_norm_eps > 0, "layer_norm_eps", f"must be positive, got {self.layer_norm_eps}")
        check(
            self.attention_window is None or self.attention_window >= 1,
            "attention_window",
            f"the neighbourhood r must be at least 1, got {self.attention_window}",
        )
        specials = {"pad_id": self.pad_id, "unk_id": self.unk_id, "bos_id": self.bos_id, "eos_id": self.eos_id}
        for key, value in specials.items():
            check(
                0 <= value < min(self.vocab_size, self.target_vocab_size),
                key,
                f"must be a token id below the vocabulary size, got {value}",
            )
        check(len(set(specials.values())) == 4, "pad_id", f"special token ids must differ, got {specials}")
        check(
            self.tie_embeddings != "all" or self.target_vocab_size == self.vocab_size,
            "tie_embeddings",
            "'all' shares one matrix between source and target, so tgt_vocab_size must equal vocab_size "
            f"(got {self.vocab_size} and {self.tgt_vocab_size}); use 'target' or 'none'",
        )

    @property
    def target_vocab_size(self) -> int:
        return self.vocab_size if self.tgt_vocab_size is None else self.tgt_vocab_size

    @classmethod
    def preset(cls, name: str, **overrides: Any) -> ModelConfig:
        """A named preset (``paper-base``, ``paper-big``, ``tiny``, ``small``, ``medium``) with overrides."""
        if name not in PRESETS:
            raise ConfigError(f"unknown preset {name!r}; choose from {', '.join(PRESETS)}")
        return build(cls, {**PRESETS[name], **overrides}, where=f"preset {name!r}")

    @classmethod
    def from_dict(cls, values: dict[str, Any], where: str = "") -> ModelConfig:
        """Build from a mapping; a ``preset`` key picks the starting point."""
        values = dict(values)
        base = values.pop("preset", None)
        if base is not None:
            if base not in PRESETS:
                raise ConfigError(
                    f"{where + ': ' if where else ''}key 'preset': unknown preset {base!r}; "
                    f"choose from {', '.join(PRESETS)}"
                )
            values = {**PRESETS[base], **values}
        return build(cls, values, where=where)

    @classmethod
    def from_toml(cls, path: str | Path) -> ModelConfig:
        """Read the ``[model]`` table of a TOML file (or the whole file if it has none)."""
        data = read_toml(path)
        table = data.get("model", data)
        if not isinstance(table, dict):
            raise ConfigError(f"{path}: [model] must be a table")
        return cls.from_dict(table, where=f"{path} [model]")

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    def to_toml(self) -> str:
        return to_toml_text({"model": self.to_dict()})
