"""One optimizer update (§5.3, §5.4): forward over ``update_freq`` batches, the training objective
(label-smoothed cross-entropy, or R-Drop's), backward, then the optimizer at the schedule's learning rate.

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

from ..model.attention import use_kernel
from .distributed import Dist, all_sum, wrap
from .kernels import attention_choice
from .loss import SmoothedLoss
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
    return False, (
        f"the CPU has no native bf16 (no AVX-512-BF16 or AMX; capability "
        f"{torch.backends.cpu.get_cpu_capability()}), where bf16 matmuls are emulated and ~20x slower"
    )


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
    """The SDPA backend context for a resolved kernel name (:func:`transduce.train.kernels.attention_choice`):
    "math", "flash", "efficient" = that SDPA kernel; "default" and "written" none (PyTorch's choice, or the
    written-out formula that :class:`TrainingLoss` sets on the model's attention modules)."""
    from torch.nn.attention import SDPBackend, sdpa_kernel

    kernels = {
        "math": SDPBackend.MATH,
        "flash": SDPBackend.FLASH_ATTENTION,
        "efficient": SDPBackend.EFFICIENT_ATTENTION,
    }
    return sdpa_kernel(kernels[name]) if name in kernels else contextlib.nullcontext()


def autocast(device: torch.device, dtype: str):
    """The autocast context for ``dtype`` ("fp32" = none)."""
    if dtype == "fp32":
        return contextlib.nullcontext()
    return torch.autocast(device.type, dtype=AUTOCAST[dtype])


class TrainingLoss(nn.Module):
    """The model plus its training objective, one module so DistributedDataParallel sees the whole forward.

    ``objective`` is :class:`~transduce.train.loss.SmoothedLoss` (the paper's) or another with its interface
    (:class:`~transduce.train.rdrop.RDrop`): the batch goes through the model ``objective.copies`` times in
    one forward, each copy under its own dropout masks. Only non-padding decoder positions reach the
    pre-softmax projection (``Transformer.hidden``), which saves the largest matmul and softmax on padding;
    the objective projects them block by block, so the (N, V) logits are never stored.
    Returns (loss_sum, nll_sum, tokens), tokens counting each copy of a position.
    """

    def __init__(self, model: nn.Module, objective, device: torch.device, dtype: str, kernel: str = "auto"):
        super().__init__()
        self.model, self.objective, self.device, self.dtype = model, objective, device, dtype
        self.kernel = attention_choice(kernel, device).name  # training's attention (transduce.train.kernels)
        use_kernel(model, "written" if self.kernel == "written" else "fused")

    @property
    def copies(self) -> int:
        """How many times each target token is counted (R-Drop: 2)."""
        return self.objective.copies

    def forward(self, src: torch.Tensor, tgt: torch.Tensor):
        copies, labels = self.copies, tgt[:, 1:]  # labels (B, T-1)
        keep = labels != self.objective.pad_id  # (B, T-1)
        src, tgt = src.repeat(copies, 1), tgt.repeat(copies, 1)  # (copies·B, S), (copies·B, T)
        with autocast(self.device, self.dtype), attention_kernel(self.kernel):
            h = self.model.hidden(src, tgt[:, :-1])  # (copies·B, T-1, d_model)
        states = h.unflatten(0, (copies, -1))[:, keep].flatten(0, 1)  # (copies·N, d_model), copy by copy
        rows = 64 if self.device.type == "cpu" else 8192  # CPU: blocks that stay in cache; GPU: few launches
        states, weight = with_bias(states, self.model.generator)
        loss, nll = self.objective(states, weight, labels[keep], AUTOCAST.get(self.dtype, torch.float32), rows)
        return loss, nll.detach(), copies * int(keep.sum())


def with_bias(states: torch.Tensor, generator: nn.Linear) -> tuple[torch.Tensor, torch.Tensor]:
    """The objectives take a bias-free projection (V, d); a model with ``output_bias`` gives them its bias as
    one more input feature that is always 1: h Wᵀ + b = [h, 1] [W, b]ᵀ, so states (N, d + 1) and weight
    (V, d + 1), and autograd carries the gradient back to W and b through the concatenations."""
    if generator.bias is None:
        return states, generator.weight
    ones = states.new_ones(states.size(0), 1)  # (N, 1)
    weight = torch.cat([generator.weight, generator.bias.unsqueeze(1).to(generator.weight.dtype)], 1)  # (V, d + 1)
    return torch.cat([states, ones], 1), weight  # (N, d + 1)


class Stepper:
    """Runs updates on a Transformer with ``optimizer`` and ``objective`` (default: label smoothing 0.1,
    pad id 0); the step number is the caller's.

    With several ranks the model and its loss are wrapped in DistributedDataParallel here.
    """

    def __init__(
        self,
        model: nn.Module,
        optimizer: torch.optim.Optimizer,
        schedule: Schedule,
        *,
        device: torch.device,
        objective=None,
        dtype: str = "fp32",
        clip_norm: float = 0.0,
        ctx: Dist = Dist(),
        kernel: str = "auto",
    ):
        if dtype == "fp16" and device.type != "cuda":
            raise ValueError("key 'dtype': 'fp16' needs a CUDA device (use 'bf16' on CPU)")
        self.loss = TrainingLoss(model, objective or SmoothedLoss(0.1), device, dtype, kernel)
        self.model = wrap(self.loss, ctx, device)
        self.optimizer, self.schedule = optimizer, schedule
        self.device, self.dtype, self.ctx, self.clip_norm = device, dtype, ctx, clip_norm
        self.scaler = torch.amp.GradScaler("cuda") if dtype == "fp16" else None

    def close(self) -> None:
        """Drop the DistributedDataParallel wrapper, whose reducer holds the process group, before teardown."""
        self.model = self.loss
        gc.collect()

    def update(self, batches: list, step: int, progress: float = 0.0) -> UpdateStats:
        """Accumulate gradients over ``batches`` and take update number ``step`` (≥ 1) unless non-finite.

        ``progress`` is the fraction of the run's budget used before this update (for the ``linear`` schedule).
        """
        local = sum(b.tgt_tokens for b in batches) * self.loss.copies  # two copies count each token twice
        total = int(all_sum(torch.tensor([float(local)], dtype=torch.float64, device=self.device), self.ctx).item())
        factor = self.ctx.world_size / max(total, 1)
        sums = torch.zeros(4, dtype=torch.float64, device=self.device)  # loss, nll, tokens, src tokens
        for i, batch in enumerate(batches):
            last = i == len(batches) - 1
            sync = contextlib.nullcontext() if last or not self.ctx.enabled else self.model.no_sync()
            src, tgt = batch.src.to(self.device, non_blocking=True), batch.tgt.to(self.device, non_blocking=True)
            with sync:
                loss, nll, n = self.model(src, tgt)
                scaled = loss * factor
                (self.scaler.scale(scaled) if self.scaler else scaled).backward()
            sums += torch.stack(
                [
                    loss.detach().double(),
                    nll.double(),
                    torch.tensor(float(n), dtype=torch.float64, device=self.device),
                    torch.tensor(float(batch.src_tokens), dtype=torch.float64, device=self.device),
                ]
            )
        loss_sum, nll_sum, tokens, src_tokens = all_sum(sums, self.ctx).tolist()
        lr = self.schedule(step, progress)
        stats = UpdateStats(
            loss_sum / max(tokens, 1),
            nll_sum / max(tokens, 1),
            int(tokens) // self.loss.copies,
            int(src_tokens),
            lr,
            math.isfinite(loss_sum),
        )
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
