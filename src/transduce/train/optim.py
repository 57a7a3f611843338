"""The optimiser (§5.3): Adam as the paper's, or Muon for the layers' weight matrices (train/muon.py).

``adam``: AdamW over every parameter; with ``weight_decay = 0`` it is the paper's Adam, step for step.
``muon``: :class:`~transduce.train.muon.MuonAdamW`, one ``torch.optim.Optimizer`` whose groups are Muon's
matrices and AdamW's rest, at one learning rate, so the schedule, clipping and checkpoints treat it as Adam.
"""

from __future__ import annotations

from collections.abc import Iterable

import torch
from torch import nn

from .config import TrainConfig
from .distributed import Dist
from .muon import MuonAdamW, muon_parameter


def split_by_decay(params: list[torch.Tensor], scope: str) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
    """``params`` as (decayed, spared) under ``train.weight_decay_scope``: ``all`` (fairseq's ``--weight-decay``)
    decays every parameter; ``matrices`` (nanoGPT's, Hugging Face's) only the weight matrices and the embedding,
    sparing biases and layer-norm gains."""
    decays = [scope == "all" or p.ndim >= 2 for p in params]
    return [p for p, d in zip(params, decays) if d], [p for p, d in zip(params, decays) if not d]


def build_optimizer(
    named_params: Iterable[tuple[str, nn.Parameter]],
    cfg: TrainConfig,
    ctx: Dist | None = None,
    muon_dtype: str = "fp32",
) -> torch.optim.Optimizer:
    """``cfg.optimizer``'s optimiser over ``named_params``, learning rate 0 (the schedule sets it); ``ctx``:
    the ranks of data-parallel training, which share Muon's work; ``muon_dtype``: "fp32" or "bf16", the dtype of
    Muon's Newton-Schulz iterations (:func:`transduce.train.kernels.muon_choice`)."""
    named = list(named_params)
    if cfg.optimizer == "muon":
        muon = [p for n, p in named if muon_parameter(n, p)]
        adam, still = split_by_decay([p for n, p in named if not muon_parameter(n, p)], cfg.weight_decay_scope)
        ns_dtype = {"fp32": torch.float32, "bf16": torch.bfloat16}[muon_dtype]
        return MuonAdamW(
            muon,
            adam,
            adam_no_decay=still,
            betas=cfg.adam_betas,
            eps=cfg.adam_eps,
            weight_decay=cfg.weight_decay,
            ctx=ctx,
            ns_dtype=ns_dtype,
        )
    # AdamW: weight decay decoupled from the gradient (Loshchilov & Hutter, 2019), as fairseq's --weight-decay
    decayed, still = split_by_decay([p for _, p in named], cfg.weight_decay_scope)
    groups = [{"params": decayed}]
    if still:
        groups.append({"params": still, "weight_decay": 0.0})
    return torch.optim.AdamW(
        groups,
        lr=0.0,
        betas=tuple(cfg.adam_betas),
        eps=cfg.adam_eps,
        weight_decay=cfg.weight_decay,
        fused=True,
    )
