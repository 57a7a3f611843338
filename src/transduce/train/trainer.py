"""The training loop: updates, validation, checkpoints, stopping; the run directory it fills.

    RUN_DIR/config.toml        the resolved [train] and [model] tables
    RUN_DIR/vocab/             the data's vocabularies (so `transduce average` needs nothing else)
    RUN_DIR/checkpoints/       step_XXXXXXXX/ (the last ``keep_last``) and best/
    RUN_DIR/metrics.jsonl      one JSON object per logged update / validation
    RUN_DIR/tensorboard/       the same as TensorBoard events
    RUN_DIR/model/             the final model directory (best weights if validated, else the last)
    RUN_DIR/peer-model/        with mutual learning (train.mutual_alpha): the peer's, from the same step
    RUN_DIR/ema-model/         with train.ema_decay: the moving average of the weights at the last update
    RUN_DIR/bit-model/         with BiT (train.bidirectional): the weights at the switch to source→target
                               alone, a target→source model too (the recipe's channel model for reranking)

The data position (epoch, batch index), every RNG state and the optimizer are in each checkpoint, so a
run killed at any moment resumes from its last checkpoint and, on CPU with the same thread count, ends
with bit-identical weights.
"""

from __future__ import annotations

import json
import os
import random
import shutil
import signal
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch
from safetensors.torch import load_file

from ..config import ConfigError, to_toml_text
from ..data.batching import TokenBatches
from ..data.bidirectional import BothDirections
from ..data.diversified import Diversified
from ..data.subword_dropout import SampledSplit
from ..fastpaths import for_training
from ..model import ModelConfig, Transformer
from ..modeldir import save_model_dir
from . import checkpoint as ckpt
from . import diversify
from .config import TrainConfig
from .distributed import Dist, all_sum, broadcast, setup, teardown
from .dropout import DropoutRamp, use_fast_dropout
from .ema import WeightEMA
from .log import RunLog
from .optim import build_optimizer
from .schedule import Schedule
from .step import Stepper, UpdateStats, resolve_dtype
from .validate import bleu_hook, valid_loss

BIT_MODEL = "bit-model"  # RUN_DIR/bit-model: the weights at BiT's switch (see _save_bit_model)
EMA_MODEL = "ema-model"  # RUN_DIR/ema-model: the moving average of the weights (train.ema_decay)


PEER_SEED = 1_000_003  # mutual learning: the peer's initial weights come from torch.manual_seed(seed + this)


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
        self.fast = for_training(cfg, self.device)  # the kernels this run uses, logged in one line
        if self.ctx.is_main:
            print(self.fast.line(), flush=True)
        self.peer: Transformer | None = None  # mutual learning's second model: its own initial weights
        if cfg.mutual_alpha > 0:
            torch.manual_seed(cfg.seed + PEER_SEED)
            self.peer = Transformer(model_cfg).to(self.device).train()
        if cfg.fast_dropout:
            for m in self.models():
                use_fast_dropout(m, native=self.fast.dropout.name == "native")
        self.ramp = DropoutRamp(self.model, *cfg.dropout_ramp) if cfg.dropout_ramp else None
        self.model.train()
        self.optimizer = build_optimizer([np for m in self.models() for np in m.named_parameters()], cfg, self.ctx)
        # the moving average lives on rank 0, which alone writes checkpoints (every rank has the same weights)
        self.ema = WeightEMA(self.model, cfg.ema_decay, cfg.ema_start or cfg.warmup) \
            if cfg.ema_decay > 0 and self.ctx.is_main else None
        schedule = Schedule(cfg.schedule, cfg.warmup, model_cfg.d_model, cfg.lr_scale, cfg.peak_lr, cfg.init_lr)
        self.stepper = Stepper(self.model, self.optimizer, schedule,
                               device=self.device, dtype=cfg.dtype, label_smoothing=model_cfg.label_smoothing,
                               pad_id=model_cfg.pad_id, clip_norm=cfg.clip_norm, ctx=self.ctx,
                               kernel=self.fast.attention.name, rdrop_alpha=cfg.rdrop_alpha, peer=self.peer,
                               mutual_alpha=cfg.mutual_alpha, rdrop_from=cfg.rdrop_from, cutoff=cfg.cutoff,
                               native_loss=self.fast.loss.name == "native")
        self.batches = TokenBatches(data.split(cfg.train_split), cfg.max_tokens, seed=cfg.seed, shuffle=True,
                                    rank=self.ctx.rank, world_size=self.ctx.world_size)
        self.forward_batches, self.both_batches = self.batches, None  # BiT: the doubled split's batches
        if cfg.bidirectional > 0:
            if not data.vocabs.shared:
                raise ConfigError(f"key 'bidirectional': {cfg.data} has separate source and target vocabularies; "
                                  "training on reversed pairs needs one shared vocabulary (prepare without "
                                  "--separate-vocab), or set bidirectional = 0")
            self.both_batches = TokenBatches(BothDirections(data.split(cfg.train_split)), cfg.max_tokens,
                                             seed=cfg.seed, shuffle=True, rank=self.ctx.rank,
                                             world_size=self.ctx.world_size)
        self.both_epochs = 0  # BiT: epochs 1..both_epochs were trained in both directions
        self.diversified = False  # train.diversify: later epochs train on the split plus its made translations
        self.valid = data.split(cfg.valid_split) if has_split(data, cfg.valid_split) else None
        # progress, all of it in checkpoints
        self.step, self.epoch, self.index, self.elapsed = 0, 1, 0, 0.0
        self.nonfinite_run = self.nonfinite_total = self.bad_validations = 0
        self.best: dict[str, Any] | None = None
        self.validated_step: int | None = None  # not saved: a resumed run validates its end again
        self.resumed_from: Path | None = None
        self._plan_epoch, self._plan_cache = None, []
        self.log: RunLog | None = None  # set by train(); _plan reports BPE-dropout through it
        self.sampled: SampledSplit | None = None  # BPE-dropout: the current epoch's segmentation
        self.resumed_subwords: tuple[int, dict] | None = None  # (epoch, tensors) from a resumed checkpoint
        random.seed(cfg.seed)
        np.random.seed(cfg.seed)
        torch.manual_seed(cfg.seed + 1 + self.ctx.rank)  # dropout differs across ranks
        self.resume_requested = resume
        if resume:
            self._resume()
        self.stop_reason: str | None = None

    def models(self) -> list[Transformer]:
        """The model, and its peer under mutual learning."""
        return [self.model] + ([self.peer] if self.peer is not None else [])

    # ------------------------------------------------------------------ state
    def _resume(self) -> None:
        found = ckpt.list_checkpoints(self.ckpt_dir)
        if not found:
            return
        state = json.loads((found[-1] / ckpt.STATE).read_text())
        changed = {k: (v, state["model_config"].get(k)) for k, v in self.model_cfg.to_dict().items()
                   if state["model_config"].get(k) != v}
        if changed:
            raise ConfigError(f"{found[-1]}: the [model] config differs from the checkpoint's: "
                              + ", ".join(f"{k} = {new!r} (checkpoint: {old!r})" for k, (new, old) in changed.items()))
        if self.ema is not None and not (found[-1] / ckpt.EMA).is_file():
            raise ConfigError(f"{found[-1]}: written without train.ema_decay, so it holds no moving average to "
                              "resume; resume with ema_decay = 0, or start a new run")
        state = ckpt.load_checkpoint(found[-1], self.model, self.optimizer, peer=self.peer,
                                     ema=self.ema.model if self.ema is not None else None)
        if self.ema is not None:
            self.ema.restore(state.get("ema_updates", 0))
        if state["world_size"] != self.ctx.world_size:
            raise ValueError(f"{found[-1]}: written by {state['world_size']} processes, resumed with "
                             f"{self.ctx.world_size}; the data shards would differ")
        self.step, self.epoch, self.index = state["step"], state["epoch"], state["batch_index"]
        self.elapsed, self.best = state["elapsed_s"], state["best"]
        self.nonfinite_run, self.nonfinite_total = state["nonfinite_run"], state["nonfinite_total"]
        self.bad_validations = state["bad_validations"]
        self.both_epochs = state.get("both_epochs", 0)
        if state.get("diversified"):
            made = diversify.load(self.run_dir / diversify.FILE, len(self.data.split(self.cfg.train_split)))
            self._use_diversified(made)
        if state.get("subwords_epoch") is not None and (found[-1] / ckpt.SUBWORDS).is_file():
            self.resumed_subwords = (state["subwords_epoch"], load_file(str(found[-1] / ckpt.SUBWORDS)))
        if self.stepper.scaler is not None and state.get("scaler"):
            self.stepper.scaler.load_state_dict(state["scaler"])
        if self.ctx.rank > 0:  # each rank has its own dropout stream; rank 0's was saved
            torch.manual_seed(self.cfg.seed + 1 + self.ctx.rank + 1000 * self.step)
        self.resumed_from = found[-1]

    def _state(self) -> dict[str, Any]:
        return {"step": self.step, "epoch": self.epoch, "batch_index": self.index, "elapsed_s": self.elapsed,
                "best": self.best, "nonfinite_run": self.nonfinite_run, "nonfinite_total": self.nonfinite_total,
                "bad_validations": self.bad_validations, "world_size": self.ctx.world_size,
                "scaler": self.stepper.scaler.state_dict() if self.stepper.scaler is not None else None,
                "train_config": self.cfg.to_dict(), "model_config": self.model_cfg.to_dict(),
                "subwords_epoch": self._plan_epoch if self.sampled is not None else None,
                "both_epochs": self.both_epochs, "diversified": self.diversified,
                "ema_updates": self.ema.updates if self.ema is not None else None}

    def save(self, name: str | None = None) -> Path | None:
        if not self.ctx.is_main:
            return None
        path = self.ckpt_dir / name if name else ckpt.step_dir(self.ckpt_dir, self.step)
        ckpt.save_checkpoint(path, self.model, self.optimizer, self._state(),
                             self.sampled.tensors() if self.sampled is not None else None, peer=self.peer,
                             ema=self.ema.model if self.ema is not None else None)
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
            if self.cfg.subword_dropout > 0:
                self._segment(self.epoch)
            if self.both_batches is not None:
                self._choose_direction(self.epoch)
            self._plan_epoch, self._plan_cache = self.epoch, self.batches.indices(self.epoch)
        return self._plan_cache

    def _choose_direction(self, epoch: int) -> None:
        """BiT: epochs 1, 2, ... train in both directions while they start within the first
        ``bidirectional`` of the budget; every later epoch on source→target alone. The decision uses the
        ranks' shared elapsed time, and checkpoints keep it (``both_epochs``), so ranks and resumed runs agree."""
        both = epoch <= self.both_epochs or (
            epoch == self.both_epochs + 1 and self.progress() < self.cfg.bidirectional)
        if not both and self.both_epochs > 0 and epoch == self.both_epochs + 1:
            self._save_bit_model()
        if not both and self.cfg.diversify != "off" and not self.diversified:
            self._diversify()
        batches = self.both_batches if both else self.forward_batches
        if self.log is not None and (batches is not self.batches or self._plan_epoch is None):
            split = batches.split
            self.log.message(f"epoch {epoch} (update {self.step}, {self.progress():.1%} of the budget): "
                             + (f"both directions, {len(split):,} pairs (train.bidirectional = "
                                f"{self.cfg.bidirectional})" if both else
                                f"source -> target only from here, {len(split):,} pairs"))
        if both:
            self.both_epochs = epoch
        self.batches = batches

    def _save_bit_model(self) -> None:
        """RUN_DIR/bit-model: the model as BiT leaves it, trained on both directions, kept for use as a
        target→source (channel) model. Written once; a resumed run finds it there."""
        out = self.run_dir / BIT_MODEL
        if not self.ctx.is_main or out.is_dir():
            return
        manifest = self.data.manifest
        meta = {"src_lang": manifest.get("tgt_lang", ""), "tgt_lang": manifest.get("src_lang", ""),
                "weights": f"BiT's switch (step {self.step}): trained on both directions", "steps": self.step}
        save_model_dir(out, self.model, self.data.vocabs, meta)
        if self.log is not None:
            self.log.message(f"update {self.step}: saved the model at BiT's switch to {out} (both directions)")

    def _diversify(self) -> None:
        """Data diversification at the switch: translate the training split both ways with the current
        model (every rank its share), store it, and train on it from here (train/diversify.py)."""
        split, start = self.data.split(self.cfg.train_split), time.perf_counter()
        made = diversify.self_translate(self.model, split, self.cfg.diversify, self.ctx, self.cfg.dtype,
                                        self.device)
        if self.ctx.is_main:
            self.run_dir.mkdir(parents=True, exist_ok=True)
            diversify.save(self.run_dir / diversify.FILE, made)
        self._use_diversified(made)
        if self.log is not None:
            dropped = {part: len(split) - kept for part, kept in self.forward_batches.split.kept.items()}
            self.log.message(f"update {self.step}: the model translated the {len(split):,} training pairs "
                             f"({self.cfg.diversify}) in {time.perf_counter() - start:.0f} s; left out as empty "
                             f"or unfinished: " + ", ".join(f"{part} {n:,}" for part, n in dropped.items())
                             + f" (train.diversify, stored in {self.run_dir / diversify.FILE})")

    def _use_diversified(self, made: dict) -> None:
        split = Diversified(self.data.split(self.cfg.train_split), made["forward"], made["backward"])
        self.forward_batches = TokenBatches(split, self.cfg.max_tokens, seed=self.cfg.seed, shuffle=True,
                                            rank=self.ctx.rank, world_size=self.ctx.world_size)
        self.diversified = True

    def _segment(self, epoch: int) -> None:
        """BPE-dropout: batches of ``epoch``'s segmentation, sampled on rank 0 and broadcast (or the one a
        resumed checkpoint stored for this epoch)."""
        cfg, split = self.cfg, self.data.split(self.cfg.train_split)
        stored, self.resumed_subwords = self.resumed_subwords, None
        if stored is not None and stored[0] == epoch:
            tensors = stored[1]
        else:
            tensors = SampledSplit.sample(split, self.data.vocabs, cfg.subword_dropout, [cfg.seed, epoch],
                                          cfg.max_tokens).tensors() if self.ctx.is_main else None
            tensors = broadcast(tensors, self.ctx)
        self.sampled = SampledSplit.from_tensors(split, tensors)
        self.batches = TokenBatches(self.sampled, cfg.max_tokens, seed=cfg.seed, shuffle=True,
                                    rank=self.ctx.rank, world_size=self.ctx.world_size)
        if self.log is not None and (self._plan_epoch is None or self.sampled.kept):
            self.log.message(f"epoch {epoch}: {self.sampled.describe()}")

    # ------------------------------------------------------------------ loop
    def train(self) -> Path:
        cfg, main = self.cfg, self.ctx.is_main
        log = RunLog(self.run_dir, main, cfg.max_steps, self.step, cfg.log_every, cfg.tensorboard,
                     None if cfg.max_minutes is None else 60 * cfg.max_minutes - self.elapsed)
        self.log = log
        if self.resumed_from is not None:
            log.message(f"resumed from {self.resumed_from} (step {self.step}, epoch {self.epoch})")
        elif self.resume_requested:
            log.message(f"--resume: no checkpoint in {self.ckpt_dir}, starting from step 0")
        if self.ramp is not None:
            log.message(f"residual dropout ramps {self.ramp.start} -> {self.ramp.end} over the budget "
                        f"(train.dropout_ramp); now {self.ramp(self.progress()):.3f}")
        bleu = bleu_hook(self.valid, self.data.vocabs, cfg.bleu_sentences, cfg.bleu_beam, self.device) \
            if self.valid is not None and main else None
        if self.valid is None:
            log.message(f"no split {cfg.valid_split!r} in {cfg.data}: no validation; the final model is the last")
        elif bleu is None and cfg.bleu_sentences > 0:
            log.message("validation: loss and perplexity only (no translator in transduce.decode yet); "
                        "best checkpoint by validation loss")
        previous = {s: signal.signal(s, self._on_signal) for s in (signal.SIGINT, signal.SIGTERM)}
        start, last_save = time.perf_counter() - self.elapsed, time.perf_counter()
        saved_step, finished = self.step, False
        if cfg.cutoff > 0:
            log.message(f"token cutoff (train.cutoff): R-Drop's second copy loses {cfg.cutoff:.0%} of its source "
                        "and decoder-input token embeddings")
        held = cfg.rdrop_from > 0 and self.progress() < cfg.rdrop_from  # R-Drop waits (train.rdrop_from)
        if held:
            log.message(f"R-Drop waits until {cfg.rdrop_from:.0%} of the budget (train.rdrop_from): "
                        "each batch once until then")
        try:
            while self.step < cfg.max_steps and self.stop_reason is None:
                batches = self.next_batches()
                if batches is None:
                    self.stop_reason = f"max_epochs={cfg.max_epochs} reached"
                    break
                progress = self.progress()
                if self.ramp is not None:
                    self.ramp(progress)
                stats = self.stepper.update(batches, self.step + 1, progress)
                if held and progress >= cfg.rdrop_from:
                    held = False
                    log.message(f"update {self.step + 1} ({progress:.1%} of the budget): R-Drop from here")
                if not self._account(stats, log):
                    continue
                self.step += 1
                if self.ema is not None:
                    self.ema.update(self.model, self.step)
                self.elapsed = time.perf_counter() - start
                log.update(self.step, stats)
                if self.valid is not None and self.step % cfg.validate_every == 0:
                    self._validate(log, bleu)
                if cfg.max_minutes is not None and self.elapsed >= 60 * cfg.max_minutes:
                    self.stop_reason = f"max_minutes={cfg.max_minutes} reached"
                self._agree_on_stop()
                last = self.stop_reason is not None or self.step >= cfg.max_steps
                if last:  # the last weights compete for "best" too, however far from a validation
                    self._validate_last(log, bleu)
                due = (cfg.save_every_steps is not None and self.step % cfg.save_every_steps == 0) or \
                      (cfg.save_every_minutes is not None and time.perf_counter() - last_save >= 60 * cfg.save_every_minutes)
                if due or last:
                    self.save()
                    saved_step, last_save = self.step, time.perf_counter()
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

    def _on_signal(self, signum, _frame) -> None:
        self.stop_reason = f"{signal.Signals(signum).name} received"

    def progress(self) -> float:
        """The fraction of the budget used: the larger of steps / max_steps and elapsed / max_minutes."""
        used = self.step / self.cfg.max_steps
        if self.cfg.max_minutes is not None:
            used = max(used, self.elapsed / (60 * self.cfg.max_minutes))
        return min(used, 1.0)

    def _agree_on_stop(self) -> None:
        """With several ranks: stop together, and share one elapsed time (the mean), so that a time-based
        learning rate is the same on every rank."""
        if self.ctx.enabled:
            values = torch.tensor([1.0 if self.stop_reason else 0.0, self.elapsed], dtype=torch.float64,
                                  device=self.device)
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
                f"or peak_lr, a longer warmup, clip_norm, or dtype 'bf16'/'fp32' instead of 'fp16'")
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
        values = valid_loss(self.model, vb.epoch(0), self.device, self.cfg.dtype, self.model_cfg.label_smoothing,
                            self.model_cfg.pad_id, self.cfg.attention_kernel)
        if self.peer is not None:  # logged only; "best" follows the model
            values["peer_valid_ppl"] = valid_loss(self.peer, vb.epoch(0), self.device, self.cfg.dtype,
                                                  self.model_cfg.label_smoothing, self.model_cfg.pad_id,
                                                  self.cfg.attention_kernel)["valid_ppl"]
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
        model, peer, source = self.model, self.peer, f"last (step {self.step})"
        best_dir = self.ckpt_dir / "best"
        if self.best is not None and (best_dir / ckpt.STATE).is_file():
            model = Transformer(self.model_cfg)
            peer = Transformer(self.model_cfg) if self.peer is not None else None
            ckpt.load_checkpoint(best_dir, model, restore_rng=False, peer=peer)
            source = f"best by {self.best['metric']} = {self.best['value']:.4g} (step {self.best['step']})"
        manifest = self.data.manifest
        meta = {"src_lang": manifest.get("src_lang", ""), "tgt_lang": manifest.get("tgt_lang", ""),
                "weights": source, "steps": self.step}
        save_model_dir(out, model, self.data.vocabs, meta)
        if peer is not None:
            save_model_dir(self.run_dir / "peer-model", peer, self.data.vocabs, {**meta, "peer": True})
        self._save_ema_model(meta, log)
        reason = self.stop_reason or f"max_steps={self.cfg.max_steps} reached"
        log.record("end", self.step, {"reason": reason, "model": str(out), "weights": source})
        log.message(f"stopped at step {self.step}: {reason}; model directory {out} ({source})")
        return out

    def _save_ema_model(self, meta: dict[str, Any], log: RunLog) -> None:
        """RUN_DIR/ema-model: the moving average at the last update (train.ema_decay); without one, a stale
        copy from an earlier run in this directory goes, so that the recipe never scores it."""
        out = self.run_dir / EMA_MODEL
        if self.ema is None or self.ema.updates == 0:
            shutil.rmtree(out, ignore_errors=True)
            if self.ema is not None:
                log.message(f"no moving average to save: training stopped at update {self.step}, before "
                            f"ema_start ({self.ema.start})")
            return
        first = self.step - self.ema.updates + 1
        save_model_dir(out, self.ema.model, self.data.vocabs,
                       {**meta, "weights": f"moving average (decay {self.ema.decay}) of updates {first}-{self.step}"})
        log.message(f"moving average of updates {first}-{self.step} (decay {self.ema.decay}): {out}")


def write_run_header(cfg: TrainConfig, model_cfg: ModelConfig, vocabs) -> None:
    """Write RUN_DIR/config.toml and RUN_DIR/vocab (rank 0, before training)."""
    run = Path(cfg.out)
    run.mkdir(parents=True, exist_ok=True)
    train = {k: v for k, v in cfg.to_dict().items() if v is not None}
    (run / "config.toml").write_text(to_toml_text({"train": train}) + "\n" + model_cfg.to_toml())
    vocabs.save(run / "vocab")


def has_split(data, name: str) -> bool:
    return name in data.splits or name in data.manifest.get("aliases", {})
