"""What a run reports: a progress bar on a terminal (plain lines otherwise), JSONL metrics, TensorBoard.

Only rank 0 logs. ``RUN_DIR/metrics.jsonl`` gets one JSON object per logged update or validation; after a
resume, the updates replayed since the last checkpoint are logged again (with the same step numbers).

An update's loss, NLL and gradient norm stay on the device until a logged update reads them (one read,
:class:`~transduce.train.step.UpdateStats`); the tokens between two log lines are counted on the host (one
process) or summed on the device (several) and read with the log line.
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path
from typing import Any


class RunLog:
    def __init__(
        self,
        run_dir: Path,
        enabled: bool,
        total_steps: int,
        start_step: int,
        log_every: int,
        tensorboard: bool,
        seconds_left: float | None = None,
    ):
        """``seconds_left``: the wall-clock budget still to run (max_minutes), so the ETA is the sooner end."""
        self.enabled, self.log_every, self.total = enabled, log_every, total_steps
        self.deadline = None if seconds_left is None else time.perf_counter() + seconds_left
        self.bar = self.writer = self.jsonl = None
        self.window_tokens, self.window_start = 0, time.perf_counter()
        self.start_step, self.start_time = start_step, time.perf_counter()
        if not enabled:
            return
        self.jsonl = open(run_dir / "metrics.jsonl", "a", encoding="utf-8")
        if tensorboard:
            from torch.utils.tensorboard import SummaryWriter

            self.writer = SummaryWriter(str(run_dir / "tensorboard"))
        if sys.stderr.isatty():
            from tqdm import tqdm

            self.bar = tqdm(total=total_steps, initial=start_step, unit="upd", dynamic_ncols=True)

    def record(self, kind: str, step: int, values: dict[str, Any]) -> None:
        if not self.enabled:
            return
        self.jsonl.write(json.dumps({"kind": kind, "step": step, "time": round(time.time(), 3), **values}) + "\n")
        self.jsonl.flush()
        if self.writer is not None:
            for key, value in values.items():
                if isinstance(value, (int, float)) and not isinstance(value, bool):
                    self.writer.add_scalar(f"{kind}/{key}", value, step)

    def due(self, step: int) -> bool:
        """Whether update ``step`` writes a log line (every ``log_every`` updates, and the last)."""
        return step % self.log_every == 0 or step == self.total

    def update(self, step: int, stats) -> None:
        """Called after every update; writes metrics every ``log_every`` updates, the only ones it reads."""
        if not self.enabled:
            return
        self.window_tokens = self.window_tokens + stats.token_count  # an int, or a device scalar (several ranks)
        if self.bar is not None:
            self.bar.update(1)
        if not self.due(step):
            return
        elapsed = time.perf_counter() - self.window_start
        speed = float(self.window_tokens) / max(elapsed, 1e-9)
        values = {
            "loss": round(stats.loss, 4),
            "nll": round(stats.nll, 4),
            "lr": stats.lr,
            "tgt_tokens_per_s": round(speed, 1),
        }
        if stats.grad_norm is not None:
            values["grad_norm"] = round(stats.grad_norm, 4)
        self.record("train", step, values)
        now = time.perf_counter()
        eta = int((now - self.start_time) / max(step - self.start_step, 1) * (self.total - step))
        if self.deadline is not None:
            eta = max(0, min(eta, int(self.deadline - now)))
        if self.bar is not None:
            self.bar.set_postfix(
                loss=f"{stats.loss:.3f}",
                lr=f"{stats.lr:.2e}",
                tok_s=f"{speed:.0f}",
                left=f"{eta // 3600}:{eta // 60 % 60:02d}:{eta % 60:02d}",
            )
        else:
            self.message(
                f"step {step}/{self.total}  loss {stats.loss:.4f}  nll {stats.nll:.4f}  "
                f"lr {stats.lr:.3e}  {speed:.0f} tgt tok/s  ETA {eta // 3600}:{eta // 60 % 60:02d}:{eta % 60:02d}"
            )
        self.window_tokens, self.window_start = 0, time.perf_counter()

    def message(self, text: str) -> None:
        if not self.enabled:
            return
        if self.bar is not None:
            self.bar.write(text, file=sys.stderr)
        else:
            print(text, flush=True)

    def close(self) -> None:
        for thing in (self.bar, self.writer, self.jsonl):
            if thing is not None:
                thing.close()
