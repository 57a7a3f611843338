"""One optimizer update: forward/backward over ``update_freq`` batches, then Adam (§5.3, §5.4).

Gradients are those of the **summed** label-smoothed loss divided by the update's **global** target-token
count (all micro-batches, all ranks). DistributedDataParallel averages gradients over ranks, so each rank
multiplies its loss by ``world_size / global_tokens``: R ranks with batches b then compute exactly the
gradient one process computes from the same R·b sentences.

Precision: fp32; bf16 autocast (CPU or CUDA) with fp32 master weights and fp32 loss; fp16 autocast with a
GradScaler (CUDA only). A non-finite loss skips the update (all ranks agree: the statistics are summed).
"""

from __future__ import annotations

import contextlib
import gc
import math
from dataclasses import dataclass

import torch
from torch import nn

from ..fastpaths import attention_choice
from ..model.attention import use_kernel
from .distributed import Dist, all_sum, wrap
from .loss import ProjectedPairLoss, ProjectedSmoothedCrossEntropy, projected_rdrop_loss
from .schedule import Schedule, set_lr

AUTOCAST = {"bf16": torch.bfloat16, "fp16": torch.float16}


def native_bf16(device_type: str) -> tuple[bool, str]:
    """Whether ``device_type`` computes bf16 natively, and why (or why not).

    On a CPU without AVX-512-BF16 or AMX, bf16 matmuls are emulated: measured at ~1 GFLOP/s against
    ~170 GFLOP/s in fp32 on a 2-core AVX2 machine, so bf16 autocast there is ~20x slower, not faster.
    """
    if device_type == "cuda":
        ok = torch.cuda.is_available() and torch.cuda.is_bf16_supported()
        return ok, "the GPU supports bf16" if ok else "this GPU has no bf16"
    if torch.cpu._is_avx512_bf16_supported() or torch.cpu._is_amx_tile_supported():
        return True, "the CPU has AVX-512-BF16/AMX"
    return False, (f"the CPU has no native bf16 (no AVX-512-BF16 or AMX; capability "
                   f"{torch.backends.cpu.get_cpu_capability()}), where bf16 matmuls are emulated and ~20x slower")


def resolve_dtype(dtype: str, device_type: str) -> tuple[str, str]:
    """``dtype`` with "auto" resolved: bf16 where the device computes it natively, else fp32. Returns
    (dtype, a sentence saying why)."""
    if dtype != "auto":
        return dtype, f"dtype {dtype} as configured"
    ok, why = native_bf16(device_type)
    return ("bf16" if ok else "fp32"), f"dtype auto -> {'bf16' if ok else 'fp32'}: {why}"


@dataclass
class UpdateStats:
    loss: float  # smoothed loss per target token (all ranks)
    nll: float  # NLL per target token; perplexity = exp(nll)
    tokens: int  # target tokens in the update (all ranks)
    src_tokens: int
    lr: float
    finite: bool
    grad_norm: float | None = None


def attention_kernel(name: str):
    """The SDPA backend context for a resolved kernel name (:func:`transduce.fastpaths.attention_choice`):
    "math", "flash", "efficient" = that SDPA kernel; "default" and "written" none (PyTorch's choice, or the
    written-out formula that :class:`TrainingLoss` sets on the model's attention modules)."""
    from torch.nn.attention import SDPBackend, sdpa_kernel

    kernels = {"math": SDPBackend.MATH, "flash": SDPBackend.FLASH_ATTENTION, "efficient": SDPBackend.EFFICIENT_ATTENTION}
    return sdpa_kernel(kernels[name]) if name in kernels else contextlib.nullcontext()


def autocast(device: torch.device, dtype: str):
    """The autocast context for ``dtype`` ("fp32" = none)."""
    if dtype == "fp32":
        return contextlib.nullcontext()
    return torch.autocast(device.type, dtype=AUTOCAST[dtype])


def cutoff_mask(ids: torch.Tensor, first: int, p: float, pad_id: int) -> torch.Tensor:
    """Token cutoff's choice (Shen et al., 2020; SimCut, Gao et al., 2022): ids (2B, T) -> (2B, T) bool.

    Each real token of the rows from ``first`` on is chosen with probability ``p``; rows before ``first``
    (R-Drop's first copy) and padding never are. Draws from torch's generator, so a seeded run repeats it.
    """
    cut = torch.zeros_like(ids, dtype=torch.bool)  # (2B, T)
    cut[first:] = torch.rand(ids[first:].shape, device=ids.device) < p  # draws for the cut rows only
    return cut & (ids != pad_id)


class TrainingLoss(nn.Module):
    """The model (and its peer, under mutual learning) plus the loss, one module so DistributedDataParallel
    sees the whole forward.

    Only non-padding decoder positions go through the pre-softmax projection (``Transformer.hidden``),
    which saves the largest matmul and softmax on padding; the projection and the loss are one block-wise
    function (:mod:`~transduce.train.loss`), so the (N, V) logits are never stored.
    Returns (smoothed_sum, nll_sum, tokens), tokens counting each copy of a position.

    Two copies of every position are scored when training with ``rdrop_alpha`` > 0 (R-Drop: the model twice,
    under independent dropout masks) or with a ``peer`` (mutual learning: the model and its peer, a second
    Transformer of its own initialisation); either way the loss is both copies' smoothed losses plus α times
    their symmetric KL (:class:`~transduce.train.loss.ProjectedPairLoss`).

    ``cutoff`` > 0 (R-Drop only) is SimCut: R-Drop's second copy also loses a ``cutoff`` fraction of its
    source and decoder-input token embeddings (:func:`cutoff_mask`), so the KL term asks the model to
    predict the same with and without them.
    """

    def __init__(self, model: nn.Module, device: torch.device, dtype: str, epsilon: float, pad_id: int,
                 kernel: str = "auto", rdrop_alpha: float = 0.0, peer: nn.Module | None = None,
                 mutual_alpha: float = 0.0, cutoff: float = 0.0, native_loss: bool = True):
        super().__init__()
        if peer is not None and rdrop_alpha > 0:
            raise ValueError("R-Drop (rdrop_alpha) and mutual learning (mutual_alpha) do not combine: use one")
        if cutoff > 0 and rdrop_alpha <= 0:
            raise ValueError("token cutoff (cutoff) perturbs R-Drop's second copy: it needs rdrop_alpha > 0")
        self.cutoff = cutoff
        self.model, self.device, self.dtype, self.epsilon, self.pad_id = model, device, dtype, epsilon, pad_id
        self.rdrop_alpha, self.peer, self.mutual_alpha = rdrop_alpha, peer, mutual_alpha
        self.kernel = attention_choice(kernel, device).name  # training's attention (transduce.fastpaths)
        for m in (model, peer):
            if m is not None:
                use_kernel(m, "written" if self.kernel == "written" else "fused")
        self.native_loss = native_loss  # the C++ loss blocks where they apply (transduce.fastpaths)
        self.rdrop_on = True  # False while train.rdrop_from holds R-Drop back (Stepper.update sets it)

    @property
    def models(self) -> int:
        """How many models the loss trains: 2 with a peer, else 1."""
        return 2 if self.peer is not None else 1

    @property
    def copies(self) -> int:
        """How many times each target token is counted: 2 under R-Drop or mutual learning while training."""
        rdrop = self.rdrop_alpha > 0 and self.rdrop_on
        return 2 if (rdrop or self.peer is not None) and self.model.training else 1

    def forward(self, src: torch.Tensor, tgt: torch.Tensor):
        labels = tgt[:, 1:]  # (B, T-1)
        keep = labels != self.pad_id  # (B, T-1)
        mutual = self.peer is not None and self.model.training  # the peer scores the second copy
        rdrop = self.copies == 2 and not mutual  # the model scores both
        cut = None
        if rdrop:  # R-Drop: every sentence twice in one batch, under independent dropout masks
            src, tgt = torch.cat([src, src]), torch.cat([tgt, tgt])  # (2B, S), (2B, T)
            if self.cutoff > 0:  # SimCut: the second copy also loses some token embeddings
                b = labels.size(0)
                cut = (cutoff_mask(src, b, self.cutoff, self.pad_id),
                       cutoff_mask(tgt[:, :-1], b, self.cutoff, self.pad_id))  # (2B, S), (2B, T-1)
        with autocast(self.device, self.dtype), attention_kernel(self.kernel):
            inputs = (src, tgt[:, :-1]) if cut is None else (src, tgt[:, :-1], cut)  # bench peers: no cut
            h = self.model.hidden(*inputs)  # (copies·B, T-1, d_model) for R-Drop, else (B, T-1, d_model)
            h_peer = self.peer.hidden(src, tgt[:, :-1]) if mutual else None  # (B, T-1, d_model)
        rows = 64 if self.device.type == "cpu" else 8192  # CPU: blocks that stay in cache; GPU: few launches
        dtype, y = AUTOCAST.get(self.dtype, torch.float32), labels[keep]
        if rdrop:
            b = labels.size(0)
            states = torch.cat([h[:b][keep], h[b:][keep]])  # (2N, d_model): copy 1's positions, then copy 2's
            loss, nll = projected_rdrop_loss(states, self.model.generator.weight, y, float(self.epsilon),
                                             self.pad_id, float(self.rdrop_alpha), dtype, rows // 2,
                                             self.native_loss)
            return loss, nll.detach(), 2 * int(keep.sum())
        if mutual:
            loss, nll = ProjectedPairLoss.apply(h[keep], self.model.generator.weight, h_peer[keep],
                                                self.peer.generator.weight, y, float(self.epsilon), self.pad_id,
                                                float(self.mutual_alpha), dtype, rows // 2, self.native_loss)
            return loss, nll.detach(), 2 * int(keep.sum())
        loss, nll = ProjectedSmoothedCrossEntropy.apply(h[keep], self.model.generator.weight, y,
                                                        float(self.epsilon), self.pad_id, dtype, rows,
                                                        self.native_loss)
        return loss, nll.detach(), int(keep.sum())


class Stepper:
    """Runs updates on a Transformer with ``optimizer``; the step number is the caller's.

    With several ranks the model and its loss are wrapped in DistributedDataParallel here.
    """

    def __init__(self, model: nn.Module, optimizer: torch.optim.Optimizer, schedule: Schedule, *,
                 device: torch.device, dtype: str = "fp32", label_smoothing: float = 0.1, pad_id: int = 0,
                 clip_norm: float = 0.0, ctx: Dist = Dist(), kernel: str = "auto", rdrop_alpha: float = 0.0,
                 peer: nn.Module | None = None, mutual_alpha: float = 0.0, rdrop_from: float = 0.0,
                 cutoff: float = 0.0, native_loss: bool = True):
        if dtype == "fp16" and device.type != "cuda":
            raise ValueError("key 'dtype': 'fp16' needs a CUDA device (use 'bf16' on CPU)")
        self.loss = TrainingLoss(model, device, dtype, label_smoothing, pad_id, kernel, rdrop_alpha, peer,
                                 mutual_alpha, cutoff, native_loss)
        self.model = wrap(self.loss, ctx, device)
        self.optimizer, self.schedule = optimizer, schedule
        self.device, self.dtype, self.ctx, self.clip_norm = device, dtype, ctx, clip_norm
        self.scaler = torch.amp.GradScaler("cuda") if dtype == "fp16" else None
        self.rdrop_from = rdrop_from

    def close(self) -> None:
        """Drop the DistributedDataParallel wrapper, whose reducer holds the process group, before teardown."""
        self.model = self.loss
        gc.collect()

    def update(self, batches: list, step: int, progress: float = 0.0) -> UpdateStats:
        """Accumulate gradients over ``batches`` and take update number ``step`` (≥ 1) unless non-finite.

        ``progress`` is the fraction of the run's budget used before this update (for the ``linear`` schedule).
        """
        self.loss.rdrop_on = progress >= self.rdrop_from
        local = sum(b.tgt_tokens for b in batches) * self.loss.copies  # two copies count each token twice
        total = int(all_sum(torch.tensor([float(local)], dtype=torch.float64, device=self.device), self.ctx).item())
        # each model's gradient is that of its own loss per token: with a peer, the summed loss holds two models'
        factor = self.ctx.world_size * self.loss.models / max(total, 1)
        sums = torch.zeros(4, dtype=torch.float64, device=self.device)  # loss, nll, tokens, src tokens
        for i, batch in enumerate(batches):
            last = i == len(batches) - 1
            sync = contextlib.nullcontext() if last or not self.ctx.enabled else self.model.no_sync()
            src, tgt = batch.src.to(self.device, non_blocking=True), batch.tgt.to(self.device, non_blocking=True)
            with sync:
                loss, nll, n = self.model(src, tgt)
                scaled = loss * factor
                (self.scaler.scale(scaled) if self.scaler else scaled).backward()
            sums += torch.stack([loss.detach().double(), nll.double(),
                                 torch.tensor(float(n), dtype=torch.float64, device=self.device),
                                 torch.tensor(float(batch.src_tokens), dtype=torch.float64, device=self.device)])
        loss_sum, nll_sum, tokens, src_tokens = all_sum(sums, self.ctx).tolist()
        lr = self.schedule(step, progress)
        stats = UpdateStats(loss_sum / max(tokens, 1), nll_sum / max(tokens, 1), int(tokens) // self.loss.copies,
                            int(src_tokens),
                            lr, math.isfinite(loss_sum))
        if not stats.finite:
            self.optimizer.zero_grad(set_to_none=True)
            return stats
        set_lr(self.optimizer, lr)
        if self.scaler:
            self.scaler.unscale_(self.optimizer)
        if self.clip_norm > 0:
            stats.grad_norm = float(nn.utils.clip_grad_norm_(self.model.parameters(), self.clip_norm))
        if self.scaler:
            self.scaler.step(self.optimizer)
            self.scaler.update()
        else:
            self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        return stats
