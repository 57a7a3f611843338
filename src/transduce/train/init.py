"""Fine-tuning: start training from a model directory (``train.init_from``) instead of random weights.

    [train]
    init_from = "models/opus-mt-en-de"     # any model directory: trained by transduce or imported
    freeze = ["embeddings"]                # optional: "embeddings", "encoder", "decoder" stay as they are
    schedule = "linear"                    # a short warm-up to a small peak, then down to 0
    peak_lr = 1e-4
    warmup = 100

The shape comes from the model directory ([model] may only change dropout and label smoothing), the
vocabulary too: the data directory must be prepared with the model's SentencePiece models
(``transduce prepare ... --vocab-from MODEL_DIR``), and a different one is an error naming both. Only the
weights are taken: the optimizer, schedule, data order and step count start fresh.
"""

from __future__ import annotations

from pathlib import Path

import torch

from ..config import ConfigError
from ..model import ModelConfig
from ..modeldir import VOCAB, WEIGHTS, load_vocabs, load_weights, read_model_config

FREEZABLE = ("embeddings", "encoder", "decoder")
ADJUSTABLE = (
    "dropout",
    "attention_dropout",
    "activation_dropout",
    "label_smoothing",
)  # [model] keys fine-tuning may set


def model_config(init_from: str | Path, table: dict, where: str) -> ModelConfig:
    """The model directory's config, with the [model] table's regularisation settings applied.

    Any other [model] key that differs from the model directory's is an error naming it."""
    config, _ = read_model_config(init_from)
    values = config.to_dict()
    for key, value in table.items():
        if key in ADJUSTABLE:
            values[key] = value
        elif key == "preset" or values.get(key) != value:
            raise ConfigError(
                f"{where}: key {key!r} = {value!r}: with train.init_from the model's shape comes from "
                f"{init_from} ({key} = {values.get(key, 'not set')!r}); [model] may set only "
                f"{', '.join(ADJUSTABLE)}"
            )
    return ModelConfig.from_dict(values, where=f"{Path(init_from) / 'config.toml'} [model]")


def check_vocabulary(init_from: str | Path, data) -> None:
    """Raise unless the data directory was prepared with the model directory's vocabulary."""
    vocabs = load_vocabs(Path(init_from) / VOCAB)
    same = (
        vocabs.src.proto == data.vocabs.src.proto
        and vocabs.tgt.proto == data.vocabs.tgt.proto
        and vocabs.lowercase == data.vocabs.lowercase
    )
    if not same:
        raise ConfigError(
            f"key 'init_from': {init_from} and the data directory {data.directory} have different "
            f"vocabularies; prepare the data with the model's: `transduce prepare ... --vocab-from "
            f"{init_from}`"
        )


def start_from(model: torch.nn.Module, init_from: str | Path, freeze: list[str]) -> None:
    """Load the model directory's weights into ``model`` and stop gradients to the ``freeze`` parts."""
    load_weights(model, Path(init_from) / WEIGHTS)
    for part in freeze:
        for param in frozen_parameters(model, part):
            param.requires_grad_(False)


def frozen_parameters(model: torch.nn.Module, part: str) -> list[torch.nn.Parameter]:
    """The parameters of ``part``: the token embeddings (and the output layer tied to them, its bias too), or
    one stack."""
    if part == "embeddings":
        params = [model.src_embed.token.weight, model.tgt_embed.token.weight]
        if model.config.tie_embeddings == "none":
            return params
        return params + [p for p in (model.generator.weight, model.generator.bias) if p is not None]
    if part in ("encoder", "decoder"):
        return list(getattr(model, part).parameters())
    raise ConfigError(f"key 'freeze': unknown part {part!r}; choose from {', '.join(FREEZABLE)}")
