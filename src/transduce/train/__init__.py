"""Training (§5): a config in, checkpoints and a model directory out.

cli.py           — ``transduce train CONFIG.toml``: checks, then runs the trainer
config.py        — TrainConfig: every training setting, read from TOML, validated by key
trainer.py       — the training loop: steps, validation, checkpoints, time and step budgets
step.py          — one optimizer update over ``update_freq`` batches
kernels.py       — which kernel runs attention, loss, dropout and the allocator, and why (the fast-paths line)
loss.py          — label-smoothed cross-entropy (§5.4), tensor ops or the C++ block kernel
native.py        — the C++ training kernels, one extension: ``native_train.cpp`` (loss and dropout)
native_loss.py   — the C++ loss blocks (``native_loss.h``)
rdrop.py         — R-Drop: two dropout passes and their symmetric KL divergence
dropout.py       — FastDropout: dropout in C++ (``native_dropout.h``) or tensor ops
schedule.py      — learning-rate schedules (§5.3)
optim.py         — Adam(W) or Muon
muon.py          — Muon for the layers' weight matrices
init.py          — fine-tuning: start from a model directory's weights
ema.py           — an exponential moving average of the weights
checkpoint.py    — checkpoints that never lose work and never execute code on load
average.py       — ``transduce average``: the mean of the last N checkpoints
validate.py      — validation loss, perplexity and BLEU on a dev subset
distributed.py   — several processes under torchrun (DDP)
log.py           — progress bar, JSONL metrics, TensorBoard
"""
