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
    lr_scale: float = 1.0  # rsqrt: multiplies d_model^-0.5 · min(...)
    peak_lr: float = 5e-4  # inverse_sqrt, linear: the learning rate reached at the end of warm-up
    init_lr: float = 0.0  # inverse_sqrt, linear: the learning rate at step 0
    # "adam": AdamW everywhere (the paper's Adam when weight_decay = 0); "muon": Muon for the layers' matrices,
    # AdamW for embeddings, biases and norms, at the same learning rate (train/optim.py)
    optimizer: Literal["adam", "muon"] = "adam"
    adam_betas: list[float] = field(default_factory=lambda: [0.9, 0.98])
    adam_eps: float = 1e-9
    weight_decay: float = 0.0  # decoupled (AdamW), as fairseq's --weight-decay; 0 = the paper's Adam
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
    subword_dropout: float = 0.0  # BPE-dropout p: a new segmentation of the training text each epoch; 0 = off
    # BiT (data/bidirectional.py): epochs that start within this fraction of the budget train on every pair in
    # both directions (needs a shared vocabulary), later epochs on source -> target alone; 0 = off
    bidirectional: float = 0.0
    # data diversification (train/diversify.py): at BiT's switch the model translates the training split, and
    # later epochs add (x, f(x)) pairs ("forward"), (b(y), y) pairs ("back") or both; "off" = the split alone
    diversify: Literal["off", "both", "forward", "back"] = "off"
    rdrop_alpha: float = 0.0  # R-Drop: each batch twice (two dropout masks), + alpha x their symmetric KL; 0 = off
    # R-Drop starts once this fraction of the budget is used; before, each batch once (half the compute per
    # update, so twice the updates while the model still under-fits); 0 = from the start
    rdrop_from: float = 0.0
    # token cutoff (SimCut, Gao et al., 2022): R-Drop's second copy loses this fraction of its source and
    # decoder-input token embeddings (zeroed, positions kept); needs rdrop_alpha > 0; 0 = off
    cutoff: float = 0.0
    # mutual learning: two models (RUN_DIR/model and RUN_DIR/peer-model) trained side by side on each batch, each
    # with its smoothed loss, + alpha x their symmetric KL; decoded as an ensemble; 0 = off (one model)
    mutual_alpha: float = 0.0
    # [start, end]: residual dropout P_drop rises (or falls) linearly over the budget instead of model.dropout
    dropout_ramp: list[float] | None = None
    # the fast paths (transduce/fastpaths.py; the run's log says which ran and why, in one line).
    # attention in training: "auto" = the written-out formula with fp32 scores on CPU (model/attention.py:
    # faster than SDPA's kernels for short sentences, forward + backward) and PyTorch's SDPA choice on CUDA;
    # "written", or an SDPA kernel by name
    attention_kernel: Literal["auto", "written", "math", "flash", "efficient", "default"] = "auto"
    # the loss and the CPU dropout: "auto" = the C++ kernel on CPU where it builds (same arithmetic, faster),
    # "native" = that or an error, "tensor" = the tensor ops (the readable reference)
    loss_kernel: Literal["auto", "native", "tensor"] = "auto"
    dropout_kernel: Literal["auto", "native", "tensor"] = "auto"
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
    # robustness and logging
    max_nonfinite: int = 10  # stop after this many non-finite losses in a row
    seed: int = 1
    log_every: int = 50
    tensorboard: bool = True

    def __post_init__(self) -> None:
        check(bool(self.data), "data", "must name a prepared data directory")
        check(bool(self.out), "out", "must name an output (run) directory")
        for key in ("max_tokens", "update_freq", "max_steps", "keep_last", "validate_every", "log_every",
                    "max_nonfinite", "bleu_beam"):
            check(getattr(self, key) >= 1, key, f"must be at least 1, got {getattr(self, key)}")
        check(self.warmup >= 1, "warmup", f"must be at least 1, got {self.warmup}")
        for key in ("lr_scale", "peak_lr"):
            check(getattr(self, key) > 0, key, f"must be positive, got {getattr(self, key)}")
        check(self.init_lr >= 0, "init_lr", f"must be non-negative, got {self.init_lr}")
        check(len(self.adam_betas) == 2 and all(0 <= b < 1 for b in self.adam_betas), "adam_betas",
              f"must be two numbers in [0, 1), got {self.adam_betas}")
        self.adam_betas = [float(b) for b in self.adam_betas]
        check(self.adam_eps > 0, "adam_eps", f"must be positive, got {self.adam_eps}")
        check(self.weight_decay >= 0, "weight_decay", f"must be non-negative, got {self.weight_decay}")
        check(self.clip_norm >= 0, "clip_norm", f"must be non-negative (0 = off), got {self.clip_norm}")
        check(0 <= self.ema_decay < 1, "ema_decay", f"must be in [0, 1) (0 = off), got {self.ema_decay}")
        check(self.ema_start is None or self.ema_start >= 1, "ema_start",
              f"must be an update number, at least 1 (or absent: the end of warm-up), got {self.ema_start}")
        check(self.ema_start is None or self.ema_decay > 0, "ema_start",
              f"{self.ema_start} starts an average that is off: set ema_decay > 0 too")
        check(self.dropout_ramp is None or (len(self.dropout_ramp) == 2 and all(
            isinstance(p, (int, float)) and 0 <= p < 1 for p in self.dropout_ramp)), "dropout_ramp",
            f"must be two rates [start, end], each in [0, 1), got {self.dropout_ramp}")
        if self.dropout_ramp is not None:
            self.dropout_ramp = [float(p) for p in self.dropout_ramp]
        check(self.rdrop_alpha >= 0, "rdrop_alpha", f"must be non-negative (0 = off), got {self.rdrop_alpha}")
        check(0 <= self.rdrop_from < 1, "rdrop_from",
              f"must be a fraction of the budget in [0, 1) (0 = from the start), got {self.rdrop_from}")
        check(self.rdrop_from == 0 or self.rdrop_alpha > 0, "rdrop_from",
              f"{self.rdrop_from} delays R-Drop, which is off: set rdrop_alpha > 0 too")
        check(0 <= self.cutoff < 1, "cutoff", f"must be a probability in [0, 1) (0 = off), got {self.cutoff}")
        check(self.cutoff == 0 or self.rdrop_alpha > 0, "cutoff",
              f"{self.cutoff} cuts tokens from R-Drop's second copy, and R-Drop is off: set rdrop_alpha > 0 too")
        check(self.mutual_alpha >= 0, "mutual_alpha", f"must be non-negative (0 = off), got {self.mutual_alpha}")
        check(not (self.mutual_alpha > 0 and self.rdrop_alpha > 0), "mutual_alpha",
              "does not combine with rdrop_alpha (both score two copies of each batch): set one of them to 0")
        check(not (self.mutual_alpha > 0 and self.dropout_ramp is not None), "mutual_alpha",
              "does not combine with dropout_ramp (which ramps one model's dropout)")
        check(0 <= self.subword_dropout < 1, "subword_dropout", f"must be in [0, 1), got {self.subword_dropout}")
        check(0 <= self.bidirectional < 1, "bidirectional",
              f"must be a fraction of the budget in [0, 1) (0 = off), got {self.bidirectional}")
        check(not (self.bidirectional > 0 and self.subword_dropout > 0), "bidirectional",
              "does not combine with subword_dropout (which re-segments the one-direction split each epoch)")
        check(self.diversify == "off" or self.bidirectional > 0, "diversify",
              f"{self.diversify!r} translates with the model BiT trained both ways: set bidirectional > 0 too")
        check(self.bleu_sentences >= 0, "bleu_sentences", f"must be non-negative, got {self.bleu_sentences}")
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
            model[key[len("model."):]] = value
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
            raise ConfigError(f"{where}: key {key!r} = {given} does not match the data's vocabulary "
                              f"of {actual} pieces")
        table.setdefault(key, actual)
    if not vocabs.shared and "tie_embeddings" not in table:
        table["tie_embeddings"] = "target"  # separate vocabularies cannot share the source matrix
    return ModelConfig.from_dict(table, where=where)
