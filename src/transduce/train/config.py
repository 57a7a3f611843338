"""TrainConfig: every training setting, read from a TOML file with ``[train]`` and ``[model]`` tables.

    [train]
    data = "runs/multi30k-data"     # a directory made by `transduce prepare`
    out = "runs/small-en-de"
    max_tokens = 4096               # target tokens per batch, per process
    update_freq = 6                 # batches accumulated per update (§5.3: ~25k tokens)
    [model]
    preset = "small"                # plus any ModelConfig key; vocab sizes come from the data

``--set key=value`` overrides a ``[train]`` key; ``--set model.key=value`` a ``[model]`` key.
Unknown keys and impossible values raise :class:`~transduce.config.ConfigError` naming the key.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from ..config import ConfigError, build, check, parse_override, read_toml


@dataclass
class TrainConfig:
    """Training settings; defaults are the paper's recipe (§5.3, §5.4) where it gives one."""

    data: str = ""
    out: str = ""
    train_split: str = "train"
    valid_split: str = "valid"
    # batches (§5.1): tokens per batch per process; update = update_freq batches × world size
    max_tokens: int = 4096
    update_freq: int = 1
    # optimiser and schedule (§5.3)
    schedule: Literal["rsqrt", "inverse_sqrt", "linear"] = "rsqrt"  # linear: decays to 0 at the budget's end
    warmup: int = 4000
    warmup_share: float = 0.0  # linear: the warm-up also ends once this fraction of the budget is used (0 = off)
    lr_scale: float = 1.0  # rsqrt: multiplies d_model^-0.5 · min(...)
    peak_lr: float = 5e-4  # inverse_sqrt, linear: the learning rate reached at the end of warm-up
    init_lr: float = 0.0  # inverse_sqrt, linear: the learning rate at step 0
    # "adam": AdamW everywhere (the paper's Adam when weight_decay = 0); "muon": Muon for the layers' matrices,
    # AdamW for embeddings, biases and norms, at the same learning rate (train/optim.py)
    optimizer: Literal["adam", "muon"] = "adam"
    adam_betas: list[float] = field(default_factory=lambda: [0.9, 0.98])
    adam_eps: float = 1e-9
    weight_decay: float = 0.0  # decoupled (AdamW), as fairseq's --weight-decay; 0 = the paper's Adam
    # which parameters weight decay pulls to zero: "all" (fairseq's) or "matrices" (weights and the embedding,
    # not biases and layer-norm gains: nanoGPT's, Hugging Face's)
    weight_decay_scope: Literal["all", "matrices"] = "all"
    clip_norm: float = 0.0  # 0 = no clipping
    # an exponential moving average of the weights (train/ema.py), written to RUN_DIR/ema-model: w_ema <- decay *
    # w_ema + (1 - decay) * w after each update from ema_start on (absent: the end of warm-up); 0 = off
    ema_decay: float = 0.0
    ema_start: int | None = None
    # precision and device
    dtype: Literal["auto", "fp32", "bf16", "fp16"] = "fp32"  # auto: bf16 where the device has it natively
    device: Literal["auto", "cpu", "cuda"] = "auto"
    threads: int | None = None  # torch intra-op threads per process; None = torch's default
    fast_dropout: bool = True  # swap nn.Dropout for the cheaper mask of train/dropout.py
    # late dropout (train/dropout.py): the model's dropout off until this share of the budget is used, then on;
    # 0 = on from the start (the paper's)
    dropout_from: float = 0.0
    # R-Drop (train/rdrop.py): each batch twice under two dropout masks, + alpha x their symmetric KL; 0 = off
    rdrop_alpha: float = 0.0
    # the fast paths (transduce/train/kernels.py; the run's log says which ran and why, in one line).
    # attention in training: "auto" = the written-out formula with fp32 scores on CPU (model/attention.py:
    # faster than SDPA's kernels for short sentences, forward + backward) and PyTorch's SDPA choice on CUDA;
    # "native" = the C++ kernel over the packed projections (train/attention.py: less memory, the same speed so
    # far) or an error, "written", or an SDPA kernel by name
    attention_kernel: Literal["auto", "native", "written", "math", "flash", "efficient", "default"] = "auto"
    # the loss and the CPU dropout: "auto" = the C++ kernel on CPU where it builds (same arithmetic, faster),
    # "native" = that or an error, "tensor" = the tensor ops (the readable reference)
    loss_kernel: Literal["auto", "native", "tensor"] = "auto"
    dropout_kernel: Literal["auto", "native", "tensor"] = "auto"
    # post-norm's LayerNorm(x + Dropout(sublayer)): "auto" = one C++ pass each way where the dropout is the C++ one
    residual_kernel: Literal["auto", "native", "tensor"] = "auto"
    # Muon's Newton-Schulz iterations: "auto" = the run's dtype (bf16 in a bf16 run, as torch's Muon; fp32 in an
    # fp32 run, whose CPU may emulate bf16 ~20x slower), or "fp32" / "bf16"
    muon_dtype: Literal["auto", "fp32", "bf16"] = "auto"
    # fine-tuning (train/init.py): start from this model directory's weights (its shape and vocabulary too), and
    # keep the listed parts ("embeddings", "encoder", "decoder") as they are; optimizer and schedule start fresh
    init_from: str | None = None
    freeze: list[str] = field(default_factory=list)
    # length of the run
    max_steps: int = 100_000
    max_epochs: int | None = None
    max_minutes: float | None = None
    # checkpoints (the paper: one every 10 minutes)
    save_every_steps: int | None = 1000
    save_every_minutes: float | None = 10.0
    keep_last: int = 5
    # validation
    validate_every: int = 1000
    bleu_sentences: int = 200  # dev-subset size for BLEU; 0 = loss/perplexity only
    bleu_beam: int = 1
    patience: int | None = None  # stop after this many validations without improvement
    # at the end on CPU, decode this many validation sentences with fp32 and int8-native and record accuracy
    # and speed in the model directory (backends.json), so that decoding picks the fast path; 0 = off
    check_backends: int = 500
    # robustness and logging
    max_nonfinite: int = 10  # stop after this many non-finite losses in a row
    seed: int = 1
    log_every: int = 50
    tensorboard: bool = True

    def __post_init__(self) -> None:
        check(bool(self.data), "data", "must name a prepared data directory")
        check(bool(self.out), "out", "must name an output (run) directory")
        for key in (
            "max_tokens",
            "update_freq",
            "max_steps",
            "keep_last",
            "validate_every",
            "log_every",
            "max_nonfinite",
            "bleu_beam",
        ):
            check(getattr(self, key) >= 1, key, f"must be at least 1, got {getattr(self, key)}")
        check(self.warmup >= 1, "warmup", f"must be at least 1, got {self.warmup}")
        check(0 <= self.warmup_share < 1, "warmup_share", f"must be in [0, 1) (0 = off), got {self.warmup_share}")
        check(
            self.warmup_share == 0 or self.schedule == "linear",
            "warmup_share",
            f"applies to the linear schedule (a budget to share), not {self.schedule!r}",
        )
        for key in ("lr_scale", "peak_lr"):
            check(getattr(self, key) > 0, key, f"must be positive, got {getattr(self, key)}")
        check(self.init_lr >= 0, "init_lr", f"must be non-negative, got {self.init_lr}")
        check(
            len(self.adam_betas) == 2 and all(0 <= b < 1 for b in self.adam_betas),
            "adam_betas",
            f"must be two numbers in [0, 1), got {self.adam_betas}",
        )
        self.adam_betas = [float(b) for b in self.adam_betas]
        check(self.adam_eps > 0, "adam_eps", f"must be positive, got {self.adam_eps}")
        check(0 <= self.dropout_from < 1, "dropout_from", f"must be in [0, 1) (0 = off), got {self.dropout_from}")
        check(self.weight_decay >= 0, "weight_decay", f"must be non-negative, got {self.weight_decay}")
        check(self.clip_norm >= 0, "clip_norm", f"must be non-negative (0 = off), got {self.clip_norm}")
        check(0 <= self.ema_decay < 1, "ema_decay", f"must be in [0, 1) (0 = off), got {self.ema_decay}")
        check(
            self.ema_start is None or self.ema_start >= 1,
            "ema_start",
            f"must be an update number, at least 1 (or absent: the end of warm-up), got {self.ema_start}",
        )
        check(
            self.ema_start is None or self.ema_decay > 0,
            "ema_start",
            f"{self.ema_start} starts an average that is off: set ema_decay > 0 too",
        )
        check(self.rdrop_alpha >= 0, "rdrop_alpha", f"must be non-negative (0 = off), got {self.rdrop_alpha}")
        check(self.init_from is None or bool(self.init_from), "init_from", "must name a model directory (or be absent)")
        check(
            not self.freeze or self.init_from is not None,
            "freeze",
            f"{self.freeze} keeps randomly initialised parts as they are: set init_from to a model directory too",
        )
        check(
            all(p in ("embeddings", "encoder", "decoder") for p in self.freeze),
            "freeze",
            f"parts are 'embeddings', 'encoder' and 'decoder', got {self.freeze}",
        )
        check(self.bleu_sentences >= 0, "bleu_sentences", f"must be non-negative, got {self.bleu_sentences}")
        check(self.check_backends >= 0, "check_backends", f"must be non-negative, got {self.check_backends}")
        for key in ("threads", "max_epochs", "save_every_steps", "patience"):
            value = getattr(self, key)
            check(value is None or value >= 1, key, f"must be at least 1 (or absent), got {value}")
        for key in ("max_minutes", "save_every_minutes"):
            value = getattr(self, key)
            check(value is None or value > 0, key, f"must be positive (or absent), got {value}")

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


def load_config(path: str | Path, overrides: list[str] = ()) -> tuple[TrainConfig, dict[str, Any]]:
    """Read ``path`` and apply ``--set`` overrides; return (TrainConfig, the raw [model] table).

    The [model] table is validated later, once the data directory has told the vocabulary sizes.
    """
    raw = read_toml(path)
    for section in raw:
        if section not in ("train", "model"):
            raise ConfigError(f"{path}: unknown table [{section}] (expected [train] and [model])")
    train = dict(raw.get("train", {}))
    model = dict(raw.get("model", {}))
    for text in overrides:
        key, value = parse_override(text)
        if key.startswith("model."):
            model[key[len("model.") :]] = value
        else:
            train[key.removeprefix("train.")] = value
    where = f"{path} [train]" + (" (with --set overrides)" if overrides else "")
    return build(TrainConfig, train, where=where), model


def model_config(table: dict[str, Any], vocabs, where: str):
    """Build the ModelConfig from a [model] table, taking vocabulary sizes from ``vocabs`` when absent.

    A size given in the table must match the data's vocabulary (ConfigError naming the key otherwise).
    """
    from ..model import ModelConfig

    table = dict(table)
    sizes = {"vocab_size": len(vocabs.src), "tgt_vocab_size": None if vocabs.shared else len(vocabs.tgt)}
    for key, actual in sizes.items():
        given = table.get(key)
        if given is not None and actual is not None and given != actual:
            raise ConfigError(f"{where}: key {key!r} = {given} does not match the data's vocabulary of {actual} pieces")
        table.setdefault(key, actual)
    if not vocabs.shared and "tie_embeddings" not in table:
        table["tie_embeddings"] = "target"  # separate vocabularies cannot share the source matrix
    return ModelConfig.from_dict(table, where=where)
