"""Muon (Jordan et al., 2024) for the layers' weight matrices, AdamW for the rest (``train.optimizer = "muon"``).

Muon updates the 2-D weights inside the encoder and decoder layers (attention projections, feed-forward;
:func:`muon_parameter`), AdamW the rest (the shared embedding, which is also the output projection, biases,
layer norms), as Muon's authors prescribe. Muon replaces a matrix's momentum by the nearest
semi-orthogonal matrix (Newton-Schulz iterations), so every direction of the update moves at the same rate.
The update is scaled as ``torch.optim.Muon``'s ``match_rms_adamw`` does (Liu et al., 2025, "Muon is Scalable
for LLM Training"): its RMS is that of AdamW's, so one learning rate and one schedule drive both halves.
The step is torch's Muon step but for one thing: torch runs the Newton-Schulz iterations in bf16, which a
CPU without native bf16 (AVX2) emulates about 20x slower; :func:`orthogonalize` runs them in the dtype it is
given, which :func:`transduce.train.kernels.muon_choice` picks: the run's own (bf16 where training autocasts to
bf16, as torch's Muon; fp32 in an fp32 run). For the ``small`` model that is 4.28 GFLOP per update: on one core
of an Intel Xeon with AMX 36 ms in fp32 and 22 ms in bf16, one rank's half of it 25 and 12 ms
(bench/optimizer_step.py). So that it falls with more processes, the matrices are stacked by shape and each
rank orthogonalizes a share of every stack (:func:`orthogonalize_shared`), as modded-nanogpt's distributed
Muon does.

Both halves are one ``torch.optim.Optimizer``, :class:`MuonAdamW`, so the schedule's ``set_lr``, gradient
clipping and the checkpoint's optimizer state need no special case: its parameter groups *are* the inner
AdamW's group (the same dict object) and the Muon group, and the AdamW shares its ``state``.
"""

from __future__ import annotations

import torch
import torch.distributed as dist

from .distributed import Dist

MUON_MOMENTUM = 0.95  # Muon's default Nesterov momentum
NS_COEFFICIENTS = (3.4445, -4.7750, 2.0315)  # the quintic of Jordan et al. (torch.optim.Muon's default)
NS_STEPS = 5


def orthogonalize(
    update: torch.Tensor, steps: int = NS_STEPS, eps: float = 1e-7, dtype: torch.dtype = torch.float32
) -> torch.Tensor:
    """About ``U V^T`` for each ``U S V^T`` in ``update`` (singular values pushed into roughly [0.7, 1.2]) by
    Newton-Schulz iterations in ``dtype`` (the norm taken in fp32 first). ``update``: (..., A, B) -> (..., A, B),
    a stack of matrices at once. Each iteration is X <- a X + (b G + c G²) X with G = X Xᵀ, written as two
    fused multiply-adds (``baddbmm``: in bf16 the separate scalings and sums cost a third of the time)."""
    a, b, c = NS_COEFFICIENTS
    x = update.float()
    tall = x.shape[-2] > x.shape[-1]
    if tall:
        x = x.mT  # (..., min, max): the Gram matrix below is the small one
    x = x / x.norm(dim=(-2, -1), keepdim=True).clamp(min=eps)  # spectral norm <= Frobenius norm = 1
    shape = x.shape
    x = x.to(dtype).reshape(-1, *shape[-2:])  # (n, min, max): one batch of matrices
    for _ in range(steps):
        gram = x @ x.mT  # (n, min, min)
        poly = torch.baddbmm(gram, gram, gram, beta=b, alpha=c)  # b G + c G²
        x = torch.baddbmm(x, poly, x, beta=a)  # a X + (b G + c G²) X
    x = x.reshape(shape)
    return (x.mT if tall else x).to(update.dtype)


def orthogonalize_shared(
    updates: list[torch.Tensor], ctx: Dist, dtype: torch.dtype = torch.float32
) -> list[torch.Tensor]:
    """:func:`orthogonalize` every matrix of ``updates`` in ``dtype``, the work split over ``ctx``'s ranks.

    Every rank holds the same ``updates`` (the gradients are all-reduced). Matrices of one shape are
    stacked, each rank orthogonalizes its slice of every stack, and one all-gather gives every rank all
    the results, bit for bit the same on each."""
    shapes: dict[tuple[int, int], list[int]] = {}
    for i, u in enumerate(updates):
        shapes.setdefault(tuple(u.shape), []).append(i)
    world, rank = ctx.world_size, ctx.rank
    mine = []
    for shape, indices in shapes.items():
        per_rank = -(-len(indices) // world)
        own = indices[rank * per_rank : (rank + 1) * per_rank]  # the last ranks' shares may be short or empty
        stack = updates[indices[0]].new_zeros(per_rank, *shape)  # (per_rank, A, B), zero-padded
        if own:
            torch.stack([updates[i] for i in own], out=stack[: len(own)])
        mine.append(orthogonalize(stack, dtype=dtype))  # (per_rank, A, B)
    if world > 1:
        flat = torch.cat([m.flatten() for m in mine])
        gathered = [torch.empty_like(flat) for _ in range(world)]
        dist.all_gather(gathered, flat)
        parts = [g.split([m.numel() for m in mine]) for g in gathered]  # [rank][shape] flat slices
        mine = [torch.cat([parts[r][k] for r in range(world)]).view(-1, *m.shape[1:]) for k, m in enumerate(mine)]
    out: list[torch.Tensor] = [torch.empty(0)] * len(updates)
    for (shape, indices), done in zip(shapes.items(), mine):
        for i, matrix in zip(indices, done):  # the zero padding at the end is left out
            out[i] = matrix
    return out


def muon_parameter(name: str, param: torch.Tensor) -> bool:
    """Whether Muon updates ``param``: a matrix inside an encoder or decoder layer. The embedding (tied to
    the output projection) stays with AdamW: it is a lookup table, not a linear map of the hidden state."""
    return param.ndim == 2 and ".layers." in f".{name}"


class MuonAdamW(torch.optim.Optimizer):
    """Muon over ``muon_params``, AdamW over ``adam_params``; one optimizer for the trainer and checkpoints."""

    def __init__(
        self,
        muon_params: list[torch.Tensor],
        adam_params: list[torch.Tensor],
        *,
        adam_no_decay: list[torch.Tensor] = (),
        betas,
        eps: float,
        weight_decay: float,
        momentum: float = MUON_MOMENTUM,
        ctx: Dist | None = None,
        ns_dtype: torch.dtype = torch.float32,
    ):
        if not muon_params:
            raise ValueError("Muon has no matrices to update: the model has no encoder or decoder layers")
        muon_group = {
            "params": list(muon_params),
            "kind": "muon",
            "lr": 0.0,
            "momentum": momentum,
            "weight_decay": weight_decay,
        }
        adam_groups = [{"params": list(adam_params), "kind": "adamw"}]
        if adam_no_decay:  # biases and norm gains under ``weight_decay_scope = "matrices"``
            adam_groups.append({"params": list(adam_no_decay), "kind": "adamw", "weight_decay": 0.0})
        super().__init__([muon_group, *adam_groups], defaults={})
        self.ctx = ctx or Dist()  # ranks that share the Newton-Schulz work
        self.ns_dtype = ns_dtype  # the Newton-Schulz iterations' dtype (kernels.muon_choice)
        self.adamw = torch.optim.AdamW(
            adam_groups, lr=0.0, betas=tuple(betas), eps=eps, weight_decay=weight_decay, fused=True
        )
        self._share()

    def _share(self) -> None:
        """Point the inner AdamW at this one's groups and state (again after ``load_state_dict``)."""
        self.adamw.param_groups = [g for g in self.param_groups if g["kind"] == "adamw"]
        self.adamw.state = self.state

    def load_state_dict(self, state_dict) -> None:
        super().load_state_dict(state_dict)
        self._share()

    # Stepper sets ``found_inf`` (a 1-element float tensor, 1 = the loss was not finite) before ``step``. On a GPU
    # the update is skipped on the device, as the fused AdamW does, so that the host need not wait to read the
    # flag; on a CPU reading it waits for nothing, and a skipped update is simply not made (no masking of
    # every tensor; with the foreach updates 2-4 ms of the demo's ~40 ms step: docs/performance.md)
    _step_supports_amp_scaling = True

    @staticmethod
    def reads_flag_on_host(found_inf: torch.Tensor) -> bool:
        """Whether ``step`` reads ``found_inf`` on the host (a CPU tensor) rather than masking on the device."""
        return found_inf.device.type == "cpu"

    @torch.no_grad()
    def step(self, closure=None):
        if closure is not None:
            raise ValueError("MuonAdamW.step takes no closure")
        found_inf = getattr(self, "found_inf", None)
        if found_inf is not None and self.reads_flag_on_host(found_inf):
            if found_inf.item():
                return None
            found_inf = None
        skip = None if found_inf is None else found_inf.bool()  # (1,) or (): broadcast over every tensor

        for group in self.param_groups:
            if group["kind"] != "muon":
                continue
            lr, momentum, decay = group["lr"], group["momentum"], group["weight_decay"]
            params = [p for p in group["params"] if p.grad is not None]
            grads = [p.grad for p in params]
            bufs = [self.state[p].setdefault("momentum_buffer", torch.zeros_like(p)) for p in params]
            scales = [-lr * 0.2 * max(p.shape) ** 0.5 for p in params]  # AdamW's RMS (match_rms_adamw)
            # buf <- lerp(buf, g); p <- p (1 - lr·decay) + scale · orth(lerp(g, buf))
            if skip is None:
                torch._foreach_lerp_(bufs, grads, 1 - momentum)
                updates = orthogonalize_shared(torch._foreach_lerp(grads, bufs, momentum), self.ctx, self.ns_dtype)
                torch._foreach_mul_(params, 1 - lr * decay)
                torch._foreach_add_(params, torch._foreach_mul(updates, scales))
                continue
            for buf, g in zip(bufs, grads):  # the same, each new value masked by the device's flag
                buf.copy_(torch.where(skip, buf, buf.lerp(g, 1 - momentum)))
            updates = orthogonalize_shared([g.lerp(b, momentum) for g, b in zip(grads, bufs)], self.ctx, self.ns_dtype)
            for p, update, scale in zip(params, updates, scales):
                p.copy_(torch.where(skip, p, p.mul(1 - lr * decay).add_(update, alpha=scale)))
        if found_inf is not None:
            self.adamw.found_inf = found_inf  # the fused AdamW skips on the device itself
        try:
            self.adamw.step()
        finally:
            self.adamw.__dict__.pop("found_inf", None)
