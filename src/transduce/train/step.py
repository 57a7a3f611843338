"""One optimizer update (§5.3, §5.4): forward over ``update_freq`` batches, the training objective
(label-smoothed cross-entropy, or R-Drop's), backward, then the optimizer at the schedule's learning rate.

Gradients are those of the **summed** label-smoothed loss divided by the update's **global** target-token
count (all micro-batches, all ranks). DistributedDataParallel averages gradients over ranks, so each rank
multiplies its loss by ``world_size / global_tokens``: R ranks with batches b then compute exactly the
gradient one process computes from the same R·b sentences.

Precision: fp32; bf16 autocast (CPU or CUDA) with fp32 master weights and fp32 loss; fp16 autocast with a
GradScaler (CUDA only). A non-finite loss skips the update (all ranks agree: the statistics are summed).

Nothing in an update waits for the device. The token counts come from the batches (known on the host when
they are made), the non-padding positions are found on the device from that count, the statistics (loss,
NLL, counts, gradient norm) stay on the device and reach the host through :class:`HostCopy` only when read,
and an optimizer that can skip an update on the device (fused Adam/AdamW: ``found_inf``) is handed the
non-finite flag instead of the host deciding. :meth:`Stepper.update` is :meth:`Stepper.accumulate` then
:meth:`Stepper.apply`; the trainer calls them apart, to read an update's flag during the next one.
"""

from __future__ import annotations

import contextlib
import gc
import math
from dataclasses import dataclass

import torch
from torch import nn

from ..model.attention import use_kernel
from .attention import use_native_attention
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


class HostCopy:
    """A small device tensor's values on their way to the host. On CUDA they are copied into pinned memory
    without waiting and an event marks the copy; :meth:`read` waits for that event only, not for the work
    queued after it, so values read an update later are there already and the GPU's queue stays full. On
    CPU the tensor is its own copy. The training step's statistics reach the host only through here."""

    def __init__(self, values: torch.Tensor):
        self._event = None
        if values.device.type == "cuda":
            host = torch.empty(values.shape, dtype=values.dtype, pin_memory=True)
            host.copy_(values, non_blocking=True)
            self._event = torch.cuda.Event()
            self._event.record()
            values = host
        self._values, self._read = values, None

    def read(self) -> list[float]:
        """The values (the first call waits for the copy)."""
        if self._read is None:
            if self._event is not None:
                self._event.synchronize()
            self._read = self._values.tolist()
        return self._read


class UpdateStats:
    """What one update measured, read from the device on first use: the first of ``loss``, ``nll``,
    ``tokens``, ``src_tokens``, ``finite`` and ``grad_norm`` reads them all (one :class:`HostCopy`).

    ``values`` = [loss sum, NLL sum, target tokens × copies, source tokens(, gradient norm)], all ranks.
    ``local`` = (target, source) tokens where the host knows the update's totals (one process): then
    ``tokens`` and ``src_tokens`` read nothing. ``token_count``: the target tokens without reading anything,
    an int (one process) or a device scalar (several), which sums on the device until the log reads it.
    """

    def __init__(self, values: HostCopy, sums: torch.Tensor, copies: int, lr: float, local: tuple[int, int] | None):
        self._values, self._sums, self.copies, self.lr, self._local = values, sums, copies, lr, local

    @property
    def token_count(self) -> int | torch.Tensor:
        return self._local[0] if self._local is not None else self._sums[2] / self.copies

    @property
    def finite(self) -> bool:
        return math.isfinite(self._values.read()[0])

    @property
    def loss(self) -> float:  # smoothed loss per target token (all ranks)
        values = self._values.read()
        return values[0] / max(values[2], 1)

    @property
    def nll(self) -> float:  # NLL per target token; perplexity = exp(nll)
        values = self._values.read()
        return values[1] / max(values[2], 1)

    @property
    def tokens(self) -> int:  # target tokens in the update (all ranks), each counted once
        return self._local[0] if self._local is not None else int(self._values.read()[2]) // self.copies

    @property
    def src_tokens(self) -> int:
        return self._local[1] if self._local is not None else int(self._values.read()[3])

    @property
    def grad_norm(self) -> float | None:  # with clip_norm, of a taken update
        values = self._values.read()
        return values[4] if len(values) > 4 and self.finite else None


@dataclass
class Accumulated:
    """One update's gradients (in the parameters' ``.grad``) and its statistics, still on the device:
    ``sums`` (4,) float64 = loss sum, NLL sum, target tokens × copies, source tokens, over all ranks."""

    sums: torch.Tensor
    local: tuple[int, int] | None  # (target, source) tokens where the host knows the update's totals


def targets(tgt: torch.Tensor, pad_id: int, count: int | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """The non-pad labels of ``tgt`` (B, T): their flat positions in ``tgt[:, 1:]`` (N,), in order, and the
    labels (N,). ``count`` = N, the batch's target tokens as the host knows them; then nothing waits for
    the device (a stable sort puts the N non-pad positions first). Without it N is read from the device."""
    labels = tgt[:, 1:].flatten()  # (B·(T−1),)
    pad = labels == pad_id
    if count is None:
        count = int(pad.numel() - pad.sum())  # a host synchronisation on a GPU
    positions = torch.argsort(pad.to(torch.uint8), stable=True)[:count]  # (N,) the non-pad positions, in order
    return positions, labels.index_select(0, positions)


def attention_kernel(name: str):
    """The SDPA backend context for a resolved kernel name (:func:`transduce.train.kernels.attention_choice`):
    "math", "flash", "efficient" = that SDPA kernel; "default", "written" and "native" none (PyTorch's choice, or
    the written-out formula or C++ kernel that :class:`TrainingLoss` sets on the model's attention modules)."""
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
    Returns (loss_sum, nll_sum, tokens), tokens counting each copy of a position. ``tokens``: the batch's
    non-pad target tokens where the caller knows them (``Batch.tgt_tokens``), so that no step of the forward
    waits for the device (:func:`targets`).
    """

    def __init__(self, model: nn.Module, objective, device: torch.device, dtype: str, kernel: str = "auto"):
        super().__init__()
        self.model, self.objective, self.device, self.dtype = model, objective, device, dtype
        self.kernel = attention_choice(kernel, device).name  # training's attention (transduce.train.kernels)
        use_kernel(model, "written" if self.kernel in ("written", "native") else "fused")  # "native" falls back to it
        use_native_attention(model, self.kernel == "native")

    @property
    def copies(self) -> int:
        """How many times each target token is counted (R-Drop: 2)."""
        return self.objective.copies

    def forward(self, src: torch.Tensor, tgt: torch.Tensor, tokens: int | None = None):
        copies = self.copies
        positions, labels = targets(tgt, self.objective.pad_id, tokens)  # (N,), (N,)
        src, tgt = src.repeat(copies, 1), tgt.repeat(copies, 1)  # (copies·B, S), (copies·B, T)
        with autocast(self.device, self.dtype), attention_kernel(self.kernel):
            h = self.model.hidden(src, tgt[:, :-1])  # (copies·B, T-1, d_model)
        states = h.unflatten(0, (copies, -1)).flatten(1, 2).index_select(1, positions)  # (copies, N, d_model)
        states = states.flatten(0, 1)  # (copies·N, d_model), copy by copy
        states, weight = with_bias(states, self.model.generator)
        rows = loss_block_rows(self.device)
        loss, nll = self.objective(states, weight, labels, AUTOCAST.get(self.dtype, torch.float32), rows)
        return loss, nll.detach(), copies * labels.numel()


def loss_block_rows(device: torch.device) -> int:
    """Positions per block of the projected loss (:class:`~transduce.train.loss.ProjectedSmoothedCrossEntropy`;
    R-Drop's pair loss takes half as many of each copy): a block's logits are one (rows, d) × (d, V) matmul.

    GPU: 8192, few launches. CPU: 512. In fp32, at 64 rows that matmul ran at about half the speed it reaches
    at 512 (d 128, V 8000, one thread: 58 against 30 ms for 936 rows), and an update made 5-11% more tokens/s at
    ``small``, ~13% at ``medium``, the same at paper-base (``bench/train_step.py --gemm-shapes`` and timed
    updates, 2-core AMD EPYC Zen 3, AVX2). In bf16 the loss's forward and backward took 14-15 ms at 512 rows
    against 17-18 ms at 64 (914 rows, ``python bench/loss_rows.py``, one core of an Intel Xeon with AMX,
    2026-12-05). The C++ loss reads a block row by row, three passes over a row that fits in L2, so the block
    itself need not stay in cache.
    """
    if device.type != "cpu":
        return 8192
    return 512


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

    @property
    def skips_on_device(self) -> bool:
        """Whether the optimizer takes the non-finite flag as a tensor and skips the update on the device
        (``found_inf``: fused Adam and AdamW, the trainer's), so that the host need not read it first."""
        return self.scaler is None and getattr(self.optimizer, "_step_supports_amp_scaling", False)

    def update(self, batches: list, step: int, progress: float = 0.0) -> UpdateStats:
        """Accumulate gradients over ``batches`` and take update number ``step`` (≥ 1) unless non-finite.

        ``progress`` is the fraction of the run's budget used before this update (for the ``linear`` schedule).
        """
        return self.apply(self.accumulate(batches), step, progress)

    def accumulate(self, batches: list) -> Accumulated:
        """Forward and backward over ``batches``, the gradients of the summed loss over the update's global
        target-token count. Reads nothing from the device."""
        copies = self.loss.copies
        local = sum(b.tgt_tokens for b in batches)  # the batches' counts, known on the host
        if self.ctx.enabled:  # the global count stays on the device: all-reduced, never read here
            count = torch.full((1,), float(local * copies), dtype=torch.float64, device=self.device)
            factor = (self.ctx.world_size / all_sum(count, self.ctx).clamp(min=1)).float().squeeze(0)
        else:
            factor = 1 / max(local * copies, 1)
        sums = torch.zeros(4, dtype=torch.float64, device=self.device)  # loss, nll, tokens, src tokens
        for i, batch in enumerate(batches):
            last = i == len(batches) - 1
            sync = contextlib.nullcontext() if last or not self.ctx.enabled else self.model.no_sync()
            src, tgt = batch.src.to(self.device, non_blocking=True), batch.tgt.to(self.device, non_blocking=True)
            with sync:
                loss, nll, _ = self.model(src, tgt, batch.tgt_tokens)
                scaled = loss * factor
                (self.scaler.scale(scaled) if self.scaler else scaled).backward()
            sums[:2].add_(torch.stack([loss.detach().double(), nll.double()]))
        src_tokens = sum(b.src_tokens for b in batches)
        sums[2].add_(local * copies)  # host numbers into the device tensor: kernel arguments, not copies
        sums[3].add_(src_tokens)
        return Accumulated(all_sum(sums, self.ctx), None if self.ctx.enabled else (local, src_tokens))

    def apply(self, acc: Accumulated, step: int, progress: float = 0.0) -> UpdateStats:
        """Take update number ``step`` from :meth:`accumulate`'s gradients unless the loss was not finite.

        With :attr:`skips_on_device` nothing is read: the optimizer gets the non-finite flag as a tensor, and
        the returned statistics are read when first used. Otherwise the host reads the flag first."""
        lr = self.schedule(step, progress)
        sums = acc.sums

        def stats(norm: torch.Tensor | None) -> UpdateStats:
            values = sums if norm is None else torch.cat([sums, norm.detach().double().reshape(1)])
            return UpdateStats(HostCopy(values), sums, self.loss.copies, lr, acc.local)

        checked = None
        if not self.skips_on_device:  # the host reads the flag now: this optimizer cannot skip on the device
            checked = stats(None)
            if not checked.finite:
                self.optimizer.zero_grad(set_to_none=True)
                return checked
        set_lr(self.optimizer, lr)
        if self.scaler:
            self.scaler.unscale_(self.optimizer)
        norm = nn.utils.clip_grad_norm_(self.model.parameters(), self.clip_norm) if self.clip_norm > 0 else None
        # copied before the optimizer's kernels are queued: reading it waits for the backward and clip only
        out = checked if checked is not None and norm is None else stats(norm)
        if self.scaler:
            self.scaler.step(self.optimizer)
            self.scaler.update()
        elif self.skips_on_device:
            self.optimizer.found_inf = (~torch.isfinite(sums[0])).float()  # 1: the update changes nothing
            try:
                self.optimizer.step()
            finally:
                del self.optimizer.found_inf
        else:
            self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        return out
