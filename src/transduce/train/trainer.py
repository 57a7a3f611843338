"""The training loop (:meth:`Trainer.train`), read top to bottom as the paper's recipe: batches of about
``max_tokens`` target tokens (§5.1) -> forward and the label-smoothed loss (§5.4; R-Drop's with
``rdrop_alpha``) -> the optimizer at the schedule's learning rate (§5.3) -> the weight EMA (``ema_decay``)
-> validation -> checkpoints; then the final model. The run directory it fills:

    RUN_DIR/config.toml        the resolved [train] and [model] tables
    RUN_DIR/vocab/             the data's vocabularies (so `transduce average` needs nothing else)
    RUN_DIR/checkpoints/       step_XXXXXXXX/ (the last ``keep_last``) and best/
    RUN_DIR/metrics.jsonl      one JSON object per logged update / validation
    RUN_DIR/tensorboard/       the same as TensorBoard events
    RUN_DIR/model/             the final model directory (best weights if validated, else the last)
    RUN_DIR/ema-model/         with train.ema_decay: the moving average of the weights at the last update

The data position (epoch, batch index), every rank's RNG states and the optimizer are in each checkpoint,
so a run killed at any moment resumes from its last checkpoint and, on CPU with the same thread count,
ends with bit-identical weights, dropout included.

The host does not wait for the device between updates. An update after which nothing is to be decided (no
log line, validation, checkpoint or stop: :meth:`Trainer._may_defer`) is counted one update late: its
non-finite flag is read once the next update's forward and backward are queued, from a copy made before
its optimizer step (``step.HostCopy``), and only then is it counted, folded into the moving average and
its tokens added to the log's. The weights and every decision are those of reading it at once: a
non-finite update is skipped by the optimizer on the device (``found_inf``), and the next update's step
number, learning rate and moving average follow the flag, which is known before they are needed.
"""

from __future__ import annotations

import dataclasses
import os
import random
import shutil
import signal
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch

from ..config import ConfigError, to_toml_text
from ..data.batching import TokenBatches
from ..fastpaths import FastPaths
from ..model import ModelConfig, Transformer
from ..modeldir import save_model_dir
from . import checkpoint as ckpt
from .config import TrainConfig
from .distributed import Dist, all_sum, setup, teardown
from .dropout import LateDropout, use_fast_dropout
from .ema import WeightEMA
from .kernels import for_training
from .log import RunLog
from .loss import SmoothedLoss
from .optim import build_optimizer
from .rdrop import RDrop
from .residual import use_native_residual
from .schedule import Schedule
from .step import Stepper, UpdateStats, resolve_dtype
from .validate import bleu_hook, valid_loss

EMA_MODEL = "ema-model"  # RUN_DIR/ema-model: the moving average of the weights (train.ema_decay)
# with several ranks: they agree on stopping and share the elapsed time every AGREE_EVERY updates (and at every
# log line, validation and step checkpoint), one all-reduce that the host reads; a signal waits for the next
AGREE_EVERY = 10


def training_objective(cfg: TrainConfig, model_cfg: ModelConfig, fast: FastPaths) -> SmoothedLoss | RDrop:
    """The loss the step minimises: label-smoothed cross-entropy (§5.4), or R-Drop's with ``rdrop_alpha``;
    its blocks in C++ where ``fast`` chose the native loss."""
    native = fast.loss is not None and fast.loss.name == "native"
    if cfg.rdrop_alpha > 0:
        return RDrop(model_cfg.label_smoothing, cfg.rdrop_alpha, model_cfg.pad_id, native=native)
    return SmoothedLoss(model_cfg.label_smoothing, model_cfg.pad_id, native=native)


class TrainingStopped(ValueError):
    """Training cannot go on (e.g. the loss stayed non-finite); the message says why and what to try."""


def pick_device(name: str, ctx_local_rank: int = 0) -> torch.device:
    if name == "auto":
        name = "cuda" if torch.cuda.is_available() else "cpu"
    if name == "cuda":
        if not torch.cuda.is_available():
            raise ValueError("key 'device': 'cuda' requested but no CUDA device is available")
        torch.cuda.set_device(ctx_local_rank)
        return torch.device("cuda", ctx_local_rank)
    return torch.device("cpu")


def config_changes(current: ModelConfig, saved: dict[str, Any]) -> dict[str, tuple[Any, Any]]:
    """{key: (current value, checkpoint's value)} for every model key that differs from a checkpoint's
    config; a key the checkpoint predates counts as its default, which is what that model was built with."""
    saved = {f.name: f.default for f in dataclasses.fields(ModelConfig) if f.default is not dataclasses.MISSING} | saved
    return {k: (v, saved.get(k)) for k, v in current.to_dict().items() if saved.get(k) != v}


class Trainer:
    def __init__(self, cfg: TrainConfig, model_cfg: ModelConfig, data, resume: bool = False):
        self.cfg, self.model_cfg, self.data = cfg, model_cfg, data
        if cfg.threads is not None:
            torch.set_num_threads(cfg.threads)
        self.device = pick_device(cfg.device, int(os.environ.get("LOCAL_RANK", "0")))
        cfg.dtype = resolve_dtype(cfg.dtype, self.device.type)[0]  # "auto" (the CLI resolves it earlier)
        self.ctx: Dist = setup(self.device)
        self.run_dir, self.ckpt_dir = Path(cfg.out), Path(cfg.out) / "checkpoints"
        torch.manual_seed(cfg.seed)  # the same initial weights on every rank
        self.model = Transformer(model_cfg).to(self.device)
        if cfg.init_from is not None:  # fine-tuning (train/init.py): the weights of a model directory
            from .init import start_from

            start_from(self.model, cfg.init_from, cfg.freeze)
        self.fast = for_training(cfg, self.device)  # the kernels this run uses, logged in one line
        if self.ctx.is_main:
            print(self.fast.line(), flush=True)
        if cfg.fast_dropout:
            use_fast_dropout(self.model, native=self.fast.dropout.name == "native")
        if self.fast.residual.name == "native":
            use_native_residual(self.model)
        self.model.train()
        self.late_dropout = LateDropout(self.model, cfg.dropout_from) if cfg.dropout_from > 0 else None
        self.optimizer = build_optimizer(
            [np for np in self.model.named_parameters() if np[1].requires_grad],
            cfg,
            self.ctx,
            self.fast.muon.name if self.fast.muon else "fp32",
        )  # train.freeze's parameters stay as they are
        # the moving average lives on rank 0, which alone writes checkpoints (every rank has the same weights)
        self.ema = (
            WeightEMA(self.model, cfg.ema_decay, cfg.ema_start or cfg.warmup)
            if cfg.ema_decay > 0 and self.ctx.is_main
            else None
        )
        schedule = Schedule(
            cfg.schedule, cfg.warmup, model_cfg.d_model, cfg.lr_scale, cfg.peak_lr, cfg.init_lr, cfg.warmup_share
        )
        self.stepper = Stepper(
            self.model,
            self.optimizer,
            schedule,
            objective=training_objective(cfg, model_cfg, self.fast),
            device=self.device,
            dtype=cfg.dtype,
            clip_norm=cfg.clip_norm,
            ctx=self.ctx,
            kernel=self.fast.attention.name,
        )
        self.batches = TokenBatches(
            data.split(cfg.train_split),
            cfg.max_tokens,
            seed=cfg.seed,
            shuffle=True,
            rank=self.ctx.rank,
            world_size=self.ctx.world_size,
        )
        self.valid = data.split(cfg.valid_split) if has_split(data, cfg.valid_split) else None
        # progress, all of it in checkpoints
        self.step, self.epoch, self.index, self.elapsed = 0, 1, 0, 0.0
        self.nonfinite_run = self.nonfinite_total = self.bad_validations = 0
        self.best: dict[str, Any] | None = None
        self.validated_step: int | None = None  # not saved: a resumed run validates its end again
        self.resumed_from: Path | None = None
        self._plan_epoch, self._plan_cache = None, []
        random.seed(cfg.seed)
        np.random.seed(cfg.seed)
        torch.manual_seed(cfg.seed + 1 + self.ctx.rank)  # dropout differs across ranks
        self.resume_requested = resume
        if resume:
            self._resume()
        self.stop_reason: str | None = None  # set alike on every rank (_agree_on_stop)
        self.signalled: str | None = None  # a signal seen by this rank, acted on at the next agreement

    # ------------------------------------------------------------------ state
    def _resume(self) -> None:
        newest = ckpt.resume_point(self.ckpt_dir, self.ctx, self.device)  # one for all ranks
        if newest is None:
            return
        state = ckpt.read_state(newest)
        changed = config_changes(self.model_cfg, state["model_config"])
        if changed:
            raise ConfigError(
                f"{newest}: the [model] config differs from the checkpoint's: "
                + ", ".join(f"{k} = {new!r} (checkpoint: {old!r})" for k, (new, old) in changed.items())
            )
        if self.ema is not None and not (newest / "ema.safetensors").is_file():
            raise ConfigError(
                f"{newest}: written without train.ema_decay, so it holds no moving average to "
                "resume; resume with ema_decay = 0, or start a new run"
            )
        state = ckpt.load_checkpoint(newest, self.model, self.optimizer, extra=self._extra_weights())
        if self.ema is not None:
            self.ema.restore(state.get("ema_updates", 0))
        if state["world_size"] != self.ctx.world_size:
            raise ValueError(
                f"{newest}: written by {state['world_size']} processes, resumed with "
                f"{self.ctx.world_size}; the data shards would differ"
            )
        self.step, self.epoch, self.index = state["step"], state["epoch"], state["batch_index"]
        self.elapsed, self.best = state["elapsed_s"], state["best"]
        self.nonfinite_run, self.nonfinite_total = state["nonfinite_run"], state["nonfinite_total"]
        self.bad_validations = state["bad_validations"]
        if self.stepper.scaler is not None and state.get("scaler"):
            self.stepper.scaler.load_state_dict(state["scaler"])
        # each rank has its own dropout stream; a checkpoint without rank r's re-seeds it at the step
        if self.ctx.rank > 0 and not ckpt.restore_rank_rng(newest, self.ctx.rank):
            torch.manual_seed(self.cfg.seed + 1 + self.ctx.rank + 1000 * self.step)
        self.resumed_from = newest

    def _state(self) -> dict[str, Any]:
        return {
            "step": self.step,
            "epoch": self.epoch,
            "batch_index": self.index,
            "elapsed_s": self.elapsed,
            "best": self.best,
            "nonfinite_run": self.nonfinite_run,
            "nonfinite_total": self.nonfinite_total,
            "bad_validations": self.bad_validations,
            "world_size": self.ctx.world_size,
            "scaler": self.stepper.scaler.state_dict() if self.stepper.scaler is not None else None,
            "train_config": self.cfg.to_dict(),
            "model_config": self.model_cfg.to_dict(),
            "ema_updates": self.ema.updates if self.ema is not None else None,
        }

    def _extra_weights(self) -> dict[str, torch.nn.Module]:
        """Weights that checkpoints keep beside the model: the moving average, with train.ema_decay."""
        return {"ema": self.ema.model} if self.ema is not None else {}

    def save(self, name: str | None = None) -> Path | None:
        """A step checkpoint (every rank calls this together: it gathers their RNG states), or ``name``
        (rank 0 alone, e.g. ``best``: weights to keep, not to resume from)."""
        ranks_rng = ckpt.gather_rng(self.ctx, self.device) if name is None and self.ctx.enabled else None
        if not self.ctx.is_main:
            return None
        path = self.ckpt_dir / name if name else ckpt.step_dir(self.ckpt_dir, self.step)
        ckpt.save_checkpoint(
            path, self.model, self.optimizer, self._state(), extra=self._extra_weights(), ranks_rng=ranks_rng
        )
        if name is None:
            ckpt.prune(self.ckpt_dir, self.cfg.keep_last)
        return path

    # ------------------------------------------------------------------ data
    def next_batches(self) -> list | None:
        """The next ``update_freq`` batches, crossing epoch ends; None when ``max_epochs`` is reached."""
        out = []
        while len(out) < self.cfg.update_freq:
            if self.cfg.max_epochs is not None and self.epoch > self.cfg.max_epochs:
                return out or None
            plan = self._plan()
            if self.index >= len(plan):
                self.epoch, self.index = self.epoch + 1, 0
                continue
            out.append(self.batches.make(plan[self.index]))
            self.index += 1
        return out

    def _plan(self) -> list:
        if self._plan_epoch != self.epoch:
            self._plan_epoch, self._plan_cache = self.epoch, self.batches.indices(self.epoch)
        return self._plan_cache

    # ------------------------------------------------------------------ loop
    def train(self) -> Path:
        """Train until a budget (steps, epochs, minutes, patience) or a signal stops it; return RUN_DIR/model."""
        cfg = self.cfg
        log, bleu = self._open_log()
        previous = {s: signal.signal(s, self._on_signal) for s in (signal.SIGINT, signal.SIGTERM)}
        start, last_save = time.perf_counter() - self.elapsed, self.elapsed
        saved_step, finished = self.step, False
        pending = None  # an update the device has taken whose non-finite flag is not read yet
        try:
            while self.step < cfg.max_steps and self.stop_reason is None:
                batches = self.next_batches()  # update_freq batches of ~max_tokens target tokens (§5.1)
                if batches is None:
                    if pending is not None:
                        self._settle(pending, log, start)
                    self.stop_reason = f"max_epochs={cfg.max_epochs} reached"
                    break
                if self.late_dropout is not None and self.late_dropout(self.progress()) and self.ctx.is_main:
                    print(f"dropout on from update {self.step + 1} (train.dropout_from = {cfg.dropout_from})")
                # forward, the training objective and backward (§5.4), queued on the device
                accumulated = self.stepper.accumulate(batches)
                if pending is not None:  # the last update's flag, read while this one's work is queued
                    self._settle(pending, log, start)
                    pending = None
                # the optimizer at the schedule's rate (§5.3); a non-finite update changes nothing
                stats = self.stepper.apply(accumulated, self.step + 1, self.progress())
                if self._may_defer(self.step + 1, start, last_save):
                    pending = stats
                    continue
                if not self._settle(stats, log, start):
                    continue
                self.elapsed = time.perf_counter() - start
                if self.valid is not None and self.step % cfg.validate_every == 0:
                    self._validate(log, bleu)
                if cfg.max_minutes is not None and self.elapsed >= 60 * cfg.max_minutes:
                    self.stop_reason = f"max_minutes={cfg.max_minutes} reached"
                self._agree_on_stop()
                last = self.stop_reason is not None or self.step >= cfg.max_steps
                if last:  # the last weights compete for "best" too, however far from a validation
                    self._validate_last(log, bleu)
                if last or self._checkpoint_due(last_save):
                    self.save()
                    saved_step, last_save = self.step, self.elapsed
            if self.step != saved_step:
                self._validate_last(log, bleu)
                self.save()
            out = self._finish(log)
            finished = True
            return out
        finally:
            for s, handler in previous.items():
                signal.signal(s, handler)
            log.close()
            self.stepper.close()
            teardown(self.ctx, together=finished)

    def _open_log(self) -> tuple[RunLog, Any]:
        """The run's log, with what a reader needs first, and the validation BLEU function (or None)."""
        cfg, main = self.cfg, self.ctx.is_main
        log = RunLog(
            self.run_dir,
            main,
            cfg.max_steps,
            self.step,
            cfg.log_every,
            cfg.tensorboard,
            None if cfg.max_minutes is None else 60 * cfg.max_minutes - self.elapsed,
        )
        if self.resumed_from is not None:
            log.message(f"resumed from {self.resumed_from} (step {self.step}, epoch {self.epoch})")
        elif self.resume_requested:
            log.message(f"--resume: no checkpoint in {self.ckpt_dir}, starting from step 0")
        bleu = (
            bleu_hook(self.valid, self.data.vocabs, cfg.bleu_sentences, cfg.bleu_beam, self.device)
            if self.valid is not None and main
            else None
        )
        if self.valid is None:
            log.message(f"no split {cfg.valid_split!r} in {cfg.data}: no validation; the final model is the last")
        elif bleu is None and cfg.bleu_sentences > 0:
            log.message(
                "validation: loss and perplexity only (no translator in transduce.decode yet); "
                "best checkpoint by validation loss"
            )
        return log, bleu

    def _may_defer(self, step: int, start: float, last_save: float) -> bool:
        """Whether update ``step``, if taken, leaves nothing to decide before the next update starts: no log
        line, validation, checkpoint, last update, budget or signal. With several ranks it depends on the step
        alone (every rank must agree on it: the others are decided with :meth:`_agree_on_stop`, which every
        rank calls together), and every ``AGREE_EVERY``-th update is not deferred, so that they agree."""
        cfg = self.cfg
        if step >= cfg.max_steps:
            return False
        every = [cfg.log_every, cfg.save_every_steps, cfg.validate_every if self.valid is not None else None]
        if any(n is not None and step % n == 0 for n in every + [AGREE_EVERY if self.ctx.enabled else None]):
            return False
        if self.ctx.enabled:
            return True
        elapsed = time.perf_counter() - start
        return not (
            self.signalled is not None
            or (cfg.max_minutes is not None and elapsed >= 60 * cfg.max_minutes)
            or (cfg.save_every_minutes is not None and elapsed - last_save >= 60 * cfg.save_every_minutes)
        )

    def _settle(self, stats: UpdateStats, log: RunLog, start: float) -> bool:
        """Count an update the device has taken, or skipped as non-finite (which reads its statistics); fold a
        taken one into the moving average and the log. True if taken. The elapsed time of several ranks is
        the one they agree on (:meth:`_agree_on_stop`), so that a time-based learning rate is theirs alike."""
        if not self._account(stats, log):
            return False
        self.step += 1
        if self.ema is not None:  # from ema_start, or from the end of warm-up
            begun = self.cfg.ema_start is None and self.stepper.schedule.warmed_up(self.step, self.progress())
            self.ema.update(self.model, self.step, begun)
        if not self.ctx.enabled:
            self.elapsed = time.perf_counter() - start
        log.update(self.step, stats)
        return True

    def _checkpoint_due(self, last_save: float) -> bool:
        """Every ``save_every_steps`` updates, and every ``save_every_minutes`` (the paper: 10 minutes) of
        the elapsed time the ranks share (:meth:`_agree_on_stop`), so that all ranks decide alike."""
        cfg = self.cfg
        return (cfg.save_every_steps is not None and self.step % cfg.save_every_steps == 0) or (
            cfg.save_every_minutes is not None and self.elapsed - last_save >= 60 * cfg.save_every_minutes
        )

    def _on_signal(self, signum, _frame) -> None:
        self.signalled = f"{signal.Signals(signum).name} received"

    def progress(self) -> float:
        """The fraction of the budget used: the larger of steps / max_steps and elapsed / max_minutes."""
        used = self.step / self.cfg.max_steps
        if self.cfg.max_minutes is not None:
            used = max(used, self.elapsed / (60 * self.cfg.max_minutes))
        return min(used, 1.0)

    def _agree_on_stop(self) -> None:
        """With several ranks: stop together, and share one elapsed time (the mean), so that a time-based
        learning rate is the same on every rank. A signal counts from here (read once: one arriving later
        waits for the next agreement), so every rank leaves the loop, and checkpoints, at the same update.
        The ranks agree after every update that :meth:`_may_defer` does not defer: every ``AGREE_EVERY``
        updates, and at log lines, validations and step checkpoints; a time budget, a checkpoint every
        ``save_every_minutes`` and a signal are acted on there."""
        self.stop_reason = self.stop_reason or self.signalled
        if self.ctx.enabled:
            values = torch.tensor(
                [1.0 if self.stop_reason else 0.0, self.elapsed], dtype=torch.float64, device=self.device
            )
            flag, elapsed = all_sum(values, self.ctx).tolist()
            self.elapsed = elapsed / self.ctx.world_size
            if flag > 0 and self.stop_reason is None:
                self.stop_reason = "another rank stopped"

    def _account(self, stats: UpdateStats, log: RunLog) -> bool:
        """Count non-finite updates; raise after ``max_nonfinite`` in a row. True if the update was taken."""
        if stats.finite:
            self.nonfinite_run = 0
            return True
        self.nonfinite_run += 1
        self.nonfinite_total += 1
        log.record("nonfinite", self.step, {"in_a_row": self.nonfinite_run, "total": self.nonfinite_total})
        log.message(f"step {self.step + 1}: non-finite loss, update skipped ({self.nonfinite_run} in a row)")
        if self.nonfinite_run >= self.cfg.max_nonfinite:
            last = ckpt.list_checkpoints(self.ckpt_dir)
            raise TrainingStopped(
                f"the loss was not finite for {self.nonfinite_run} updates in a row (after step {self.step}, "
                f"lr {stats.lr:.3g}); last checkpoint: {last[-1] if last else 'none'}. Try a smaller lr_scale "
                f"or peak_lr, a longer warmup, clip_norm, or dtype 'bf16'/'fp32' instead of 'fp16'"
            )
        return False

    def _validate_last(self, log: RunLog, bleu) -> None:
        """Validate the final weights unless this step was just validated."""
        if self.valid is not None and self.validated_step != self.step:
            self._validate(log, bleu)

    def _validate(self, log: RunLog, bleu) -> None:
        self.validated_step = self.step
        if not self.ctx.is_main:
            return
        vb = TokenBatches(self.valid, self.cfg.max_tokens, shuffle=False)
        objective = SmoothedLoss(
            self.model_cfg.label_smoothing, self.model_cfg.pad_id, native=self.fast.loss.name == "native"
        )
        values = valid_loss(self.model, vb.epoch(0), self.device, self.cfg.dtype, objective, self.fast.attention.name)
        if bleu is not None:
            values["valid_bleu"] = bleu(self.model)
        metric = "valid_bleu" if "valid_bleu" in values else "valid_loss"
        value, sign = values[metric], (1 if metric == "valid_bleu" else -1)
        improved = self.best is None or sign * (value - self.best["value"]) > 0
        if improved:
            self.best, self.bad_validations = {"metric": metric, "value": value, "step": self.step}, 0
            self.save("best")
        else:
            self.bad_validations += 1
        log.record("valid", self.step, {**values, "best": improved})
        shown = "  ".join(f"{k} {v:.4g}" for k, v in values.items() if k != "valid_tokens")
        log.message(f"validation at step {self.step}: {shown}{'  (best)' if improved else ''}")
        if self.cfg.patience is not None and self.bad_validations >= self.cfg.patience:
            self.stop_reason = f"early stopping: {metric} did not improve in {self.cfg.patience} validations"

    def _finish(self, log: RunLog) -> Path:
        out = self.run_dir / "model"
        if not self.ctx.is_main:
            return out
        model, source = self.model, f"last (step {self.step})"
        best_dir = self.ckpt_dir / "best"
        if self.best is not None and (best_dir / ckpt.STATE).is_file():
            model = Transformer(self.model_cfg)
            ckpt.load_checkpoint(best_dir, model, restore_rng=False)
            source = f"best by {self.best['metric']} = {self.best['value']:.4g} (step {self.best['step']})"
        manifest = self.data.manifest
        meta = {
            "src_lang": manifest.get("src_lang", ""),
            "tgt_lang": manifest.get("tgt_lang", ""),
            "weights": source,
            "steps": self.step,
        }
        save_model_dir(out, model, self.data.vocabs, meta)
        self._save_ema_model(meta, log)
        reason = self.stop_reason or f"max_steps={self.cfg.max_steps} reached"
        log.record("end", self.step, {"reason": reason, "model": str(out), "weights": source})
        log.message(f"stopped at step {self.step}: {reason}; model directory {out} ({source})")
        self._check_backends(out, log)
        return out

    def _check_backends(self, out: Path, log: RunLog) -> None:
        """Measure the model's decoding backends on this machine (train.check_backends validation sentences)
        and record them in ``out``, so that ``transduce.load(out)`` picks the fast path where it is accurate
        and faster here (backends/measure.py)."""
        later = f"`transduce check-backends {out} --data {self.cfg.data}` records it"
        n = self.cfg.check_backends
        why = None
        if n == 0:
            why = "train.check_backends = 0"
        elif self.device.type != "cpu":
            why = f"training ran on {self.device.type}; the measured backends are the CPU's"
        elif self.valid is None:
            why = f"the data has no {self.cfg.valid_split} split"
        if why is not None:  # train.check_backends = 0: the caller measures (the recipe) or chose not to
            log.message(f"decoding backends not measured ({why})" + ("" if n == 0 else f": exact fp32 until {later}"))
            return
        from ..backends.measure import measure_valid, summary

        try:
            command = f"transduce train (train.check_backends = {n})"
            record = measure_valid(out, self.cfg.data, n, command, split_name=self.cfg.valid_split)
        except (RuntimeError, ValueError) as e:  # the C++ step cannot run here: decoding stays exact
            log.message(f"decoding backends not measured ({e}): exact fp32 until {later}")
            return
        log.message(f"decoding backends: {summary(record)} (recorded in {out / 'backends.json'})")

    def _save_ema_model(self, meta: dict[str, Any], log: RunLog) -> None:
        """RUN_DIR/ema-model: the moving average at the last update (train.ema_decay). A stale copy from an
        earlier run in this directory goes first, so that the recipe never scores it."""
        out = self.run_dir / EMA_MODEL
        shutil.rmtree(out, ignore_errors=True)
        if self.ema is not None:
            log.message(self.ema.save_model(out, self.data.vocabs, meta, self.step))


def write_run_header(cfg: TrainConfig, model_cfg: ModelConfig, vocabs) -> None:
    """Write RUN_DIR/config.toml and RUN_DIR/vocab (rank 0, before training)."""
    run = Path(cfg.out)
    run.mkdir(parents=True, exist_ok=True)
    train = {k: v for k, v in cfg.to_dict().items() if v is not None}
    (run / "config.toml").write_text(to_toml_text({"train": train}) + "\n" + model_cfg.to_toml())
    vocabs.save(run / "vocab")


def has_split(data, name: str) -> bool:
    return name in data.splits or name in data.manifest.get("aliases", {})
