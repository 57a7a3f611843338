"""The training step never waits for the device between log lines.

On a GPU every read of a value the device computed (``.item()``, ``.tolist()``, ``float(t)``, ``int(t)``,
``bool(t)``, ``.cpu()``, ``.numpy()``, ``torch.nonzero``, indexing by a boolean mask, printing a tensor)
stops the host until the device's queue has run dry, and the device then idles while the host queues the
next work. There is no CUDA here, so :class:`Reads` counts those calls (wrapping them on ``torch.Tensor``)
while the trainer runs ``N`` updates of a tiny model with ``log_every = L``. Only the log lines may wait:
one read each, ``ceil(N / L)`` in all. Every other update's statistics go through ``step.HostCopy`` (on a GPU
a copy into pinned memory and an event) and are read one update later, once the next update's forward and
backward are queued; the test checks that lag. Checkpoints, validation and the final model directory read
by nature and are left out of the count.

The trainer counts updates late, so it must not change them: a run with ``log_every = 1`` (nothing deferred)
and one with ``log_every = 4`` end with the same weights, optimizer state and moving average, non-finite
updates included (the fused AdamW and Muon skip them on the device).
"""

from __future__ import annotations

import contextlib
import json
import math

import pytest
import torch
from conftest import train_in_process, write_config

from transduce.train import step as step_module
from transduce.train.muon import MuonAdamW
from transduce.train.trainer import Trainer

READS = ("item", "tolist", "__float__", "__int__", "__bool__", "__index__", "cpu", "numpy", "nonzero", "masked_select")
SHOWN = ("__repr__", "__format__")  # printing a tensor reads it too


class Reads:
    """Counts the calls that read tensors on the host, by update (the trainer's ``next_batches`` starts one).

    ``waits``: (update, what) for each read that waits for the device; ``late``: (update made, update read)
    for each ``HostCopy`` read after the update that made it. Calls inside a counted call, and inside
    ``paused`` methods, are not counted."""

    def __init__(self, monkeypatch):
        self.update, self.depth, self.paused = 0, 0, 0
        self.waits: list[tuple[int, str]] = []
        self.late: list[tuple[int, int]] = []
        for name in READS + SHOWN:
            monkeypatch.setattr(torch.Tensor, name, self._counted(name, getattr(torch.Tensor, name)))
        for name in ("nonzero", "masked_select"):
            monkeypatch.setattr(torch, name, self._counted(f"torch.{name}", getattr(torch, name)))
        getitem = torch.Tensor.__getitem__

        def masked_getitem(t, index):  # a boolean mask's result has a size only the device knows
            parts = index if isinstance(index, tuple) else (index,)
            if any(isinstance(i, torch.Tensor) and i.dtype == torch.bool for i in parts):
                return self._counted("[bool mask]", getitem)(t, index)
            return getitem(t, index)

        monkeypatch.setattr(torch.Tensor, "__getitem__", masked_getitem)
        next_batches = Trainer.next_batches

        def counted_next_batches(trainer):
            self.update += 1
            return next_batches(trainer)

        monkeypatch.setattr(Trainer, "next_batches", counted_next_batches)
        for name in ("save", "_validate", "_finish"):  # checkpoints, validation, the model directory
            monkeypatch.setattr(Trainer, name, self._pausing(getattr(Trainer, name)))
        host_copy = getattr(step_module, "HostCopy", None)
        if host_copy is not None:
            init, read = host_copy.__init__, host_copy.read

            def made(copy, values):
                init(copy, values)
                copy.made_in, copy.counted = self.update, False

            def read_copy(copy):
                if not copy.counted:
                    copy.counted = True
                    if copy.made_in < self.update:
                        self.late.append((copy.made_in, self.update))
                    elif not self.paused:
                        self.waits.append((self.update, "HostCopy.read"))
                with self.pause():
                    return read(copy)

            monkeypatch.setattr(host_copy, "__init__", made)
            monkeypatch.setattr(host_copy, "read", read_copy)

    def _counted(self, name, fn):
        def counted(*args, **kwargs):
            if not self.depth and not self.paused:
                self.waits.append((self.update, name))
            self.depth += 1
            try:
                return fn(*args, **kwargs)
            finally:
                self.depth -= 1

        return counted

    @contextlib.contextmanager
    def pause(self):
        self.paused += 1
        try:
            yield
        finally:
            self.paused -= 1

    def _pausing(self, fn):
        def paused(*args, **kwargs):
            with self.pause():
                return fn(*args, **kwargs)

        return paused


@pytest.mark.parametrize("optimizer", ["adam", "muon"])
def test_only_log_lines_wait_for_the_device(data_dir, tmp_path, monkeypatch, optimizer):
    n, every = 12, 4
    config = write_config(
        tmp_path / "c.toml",
        data_dir,
        tmp_path / "run",
        optimizer=optimizer,  # both skip a non-finite update on the device (found_inf)
        dtype="fp32",
        max_steps=n,
        log_every=every,
        save_every_steps=1000,
        update_freq=2,
        clip_norm=1.0,
        ema_decay=0.9,
        ema_start=1,
        fast_dropout=False,  # the CPU's C++ dropout draws its seed on the host; a GPU runs F.dropout
    )
    # Muon reads its skip flag on the host only on a CPU, where that waits for nothing; a GPU masks on the device
    monkeypatch.setattr(MuonAdamW, "reads_flag_on_host", staticmethod(lambda flag: False))
    reads = Reads(monkeypatch)
    assert torch.ones(1).item() == 1.0 and reads.waits == [(0, "item")]  # the counter counts
    reads.waits.clear()
    train_in_process(config)  # reads before the first update (update 0) set the run up
    logged = [u for u in range(1, n + 1) if u % every == 0]
    waits = [w for w in reads.waits if w[0] > 0]
    assert reads.update == n
    # at most one read per log line, and each log line read its update's statistics (no vacuous pass)
    assert waits == [(u, "HostCopy.read") for u in logged], f"{len(waits)} reads in {n} updates: {waits}"
    assert len(waits) <= math.ceil(n / every)
    # every other update was read during the next one, after its forward and backward were queued
    assert reads.late == [(u, u + 1) for u in range(1, n + 1) if u not in logged]
    lines = [json.loads(x) for x in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in lines if r["kind"] == "train"] == logged
    assert all(r["grad_norm"] > 0 and math.isfinite(r["loss"]) for r in lines if r["kind"] == "train")


def nan_on(attempts: set[int], monkeypatch) -> None:
    """Make the loss of the given update attempts (1-based, one batch each) non-finite."""
    from transduce.train import loss as loss_module

    real, calls = loss_module.ProjectedSmoothedCrossEntropy, [0]

    class SomeNaN:
        @staticmethod
        def apply(*args):
            calls[0] += 1
            loss, nll = real.apply(*args)
            return (loss * float("nan"), nll) if calls[0] in attempts else (loss, nll)

    monkeypatch.setattr(loss_module, "ProjectedSmoothedCrossEntropy", SomeNaN)


@pytest.mark.slow
@pytest.mark.parametrize("optimizer", ["adam", "muon"])
@pytest.mark.parametrize("nonfinite", [set(), {3, 4, 9}], ids=["finite", "some non-finite"])
def test_reading_updates_late_changes_nothing(data_dir, tmp_path, monkeypatch, nonfinite, optimizer):
    runs = {}
    for every in (1, 4):
        with monkeypatch.context() as patch:
            nan_on(nonfinite, patch)
            out = tmp_path / f"every{every}"
            config = write_config(
                tmp_path / f"{every}.toml",
                data_dir,
                out,
                optimizer=optimizer,
                dtype="fp32",
                max_steps=9,
                log_every=every,
                save_every_steps=1000,
                clip_norm=1.0,
                ema_decay=0.9,
                ema_start=2,
            )
            trainer = train_in_process(config)
        records = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
        runs[every] = (
            trainer.step,
            {k: v.clone() for k, v in trainer.model.state_dict().items()},
            trainer.optimizer.state_dict()["state"],
            trainer.ema.model.state_dict(),
            [r for r in records if r["kind"] == "nonfinite"],
            next(r for r in records if r["kind"] == "train" and r["step"] == 9),
        )
    (steps1, model1, opt1, ema1, bad1, last1), (steps4, model4, opt4, ema4, bad4, last4) = runs[1], runs[4]
    assert steps1 == steps4 == 9
    assert all(torch.equal(model1[k], model4[k]) for k in model1)
    assert all(torch.equal(ema1[k], ema4[k]) for k in ema1)
    assert opt1.keys() == opt4.keys()
    assert all(torch.equal(opt1[i][k], opt4[i][k]) for i in opt1 for k in opt1[i])
    assert bad1 == [dict(r, time=bad1[i]["time"]) for i, r in enumerate(bad4)]
    assert len(bad1) == len(nonfinite)
    assert {k: last1[k] for k in ("loss", "nll", "lr", "grad_norm")} == {
        k: last4[k] for k in ("loss", "nll", "lr", "grad_norm")
    }


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device (torch.cuda.set_sync_debug_mode)")
def test_updates_on_a_gpu_do_not_synchronise(data_dir):
    """On a GPU, CUDA's own check: a synchronising call inside the update raises (after one update to warm up)."""
    from transduce.data import PreparedData
    from transduce.data.batching import TokenBatches
    from transduce.model import Transformer
    from transduce.train.config import TrainConfig, model_config
    from transduce.train.optim import build_optimizer
    from transduce.train.schedule import Schedule
    from transduce.train.step import Stepper

    data = PreparedData.open(data_dir)
    device = torch.device("cuda")
    model = Transformer(model_config({"preset": "tiny"}, data.vocabs, "test")).to(device).train()
    optimizer = build_optimizer(model.named_parameters(), TrainConfig(data="d", out="o"))  # fused AdamW
    stepper = Stepper(model, optimizer, Schedule("inverse_sqrt", 4), device=device, dtype="bf16", clip_norm=1.0)
    batches = TokenBatches(data.split("train"), 300, seed=1).epoch(1)[:5]
    assert stepper.skips_on_device and math.isfinite(stepper.update(batches[:1], 1).loss)
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        stats = [stepper.update([b], i + 2) for i, b in enumerate(batches[1:])]
    finally:
        torch.cuda.set_sync_debug_mode(0)
    assert all(s.finite and s.grad_norm > 0 for s in stats)
