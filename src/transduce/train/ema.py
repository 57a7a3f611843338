"""An exponential moving average of the weights (``train.ema_decay``): a third model beside the final and the
checkpoint average, as fairseq's ``--ema-decay`` and OpenNMT-py's ``-average_decay``.

After update t (from ``start`` on), every parameter ``w`` of the average moves towards the model's:
``w_ema <- decay * w_ema + (1 - decay) * w``; the first averaged update copies the weights, so the warm-up's
weights, far from the end's, never enter. PyTorch's ``AveragedModel`` holds the average; the update is its EMA
function's (one ``_foreach_lerp_``), with the count of averaged updates kept on the host: ``AveragedModel``'s
own ``update_parameters`` tests its count tensor (``n_averaged == 0``) and copies it to the device each call,
which on a GPU waits for the device at every update.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
from torch.optim.swa_utils import AveragedModel, get_ema_multi_avg_fn

from ..modeldir import save_model_dir


class WeightEMA:
    """The average of ``model``'s weights over the updates from ``start`` on, with ``decay`` per update."""

    def __init__(self, model: torch.nn.Module, decay: float, start: int):
        if not 0 < decay < 1:
            raise ValueError(f"EMA decay must be in (0, 1), got {decay}")
        self.decay, self.start = decay, start
        self.average = get_ema_multi_avg_fn(decay)
        self.averaged = AveragedModel(model, multi_avg_fn=self.average, use_buffers=False)
        self.averaged.module.eval().requires_grad_(False)
        self.updates = 0  # how many updates are in the average (0: it has not started)

    @property
    def model(self) -> torch.nn.Module:
        """The averaged weights, in a copy of the model (what checkpoints and RUN_DIR/ema-model store)."""
        return self.averaged.module

    @torch.no_grad()
    def update(self, model: torch.nn.Module, step: int, begun: bool = False) -> None:
        """Fold ``model``'s weights after update ``step`` (1-based) into the average, once ``step`` >= start
        (or ``begun``: the caller's own start, the end of a warm-up counted in time). As
        ``AveragedModel.update_parameters`` with ``get_ema_multi_avg_fn``; nothing is read from the device."""
        if step < self.start and not begun and self.updates == 0:
            return
        groups: dict[tuple, tuple[list, list]] = {}  # by device and dtype, as AveragedModel groups them
        for kept, live in zip(self.averaged.parameters(), model.parameters()):
            pair = groups.setdefault((kept.device, kept.dtype), ([], []))
            pair[0].append(kept.detach())
            pair[1].append(live.detach())
        for averaged, current in groups.values():
            if self.updates == 0:
                torch._foreach_copy_(averaged, current)
            else:
                self.average(averaged, current, self.updates)
        for kept, live in zip(self.model.buffers(), model.buffers()):  # buffers follow the model (use_buffers=False)
            kept.copy_(live)
        self.updates += 1
        self.averaged.n_averaged.fill_(self.updates)

    def save_model(self, out: Path, vocabs, meta: dict[str, Any], step: int) -> str:
        """Write the average after update ``step`` as the model directory ``out``; return a line for the log."""
        if self.updates == 0:
            return f"no moving average to save: training stopped at update {step}, before ema_start ({self.start})"
        first = step - self.updates + 1
        save_model_dir(
            out,
            self.model,
            vocabs,
            {**meta, "weights": f"moving average (decay {self.decay}) of updates {first}-{step}"},
        )
        return f"moving average of updates {first}-{step} (decay {self.decay}): {out}"

    def restore(self, updates: int) -> None:
        """After loading a checkpoint's averaged weights into :attr:`model`: how many updates they hold."""
        self.updates = updates
        self.averaged.n_averaged.fill_(updates)
