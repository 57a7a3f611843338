"""Whole training updates with two attention kernels, side by side in one process: the same weights and batches
through two Steppers, update by update, so both see the machine in the same state.
``python bench/attention_updates.py DATA --preset paper-base --threads 2 --max-tokens 4224 --updates 16``
(``--kernels native,written``: `train.attention_kernel` values; the rest of the update is the trainer's CPU path:
C++ dropout, sub-layer connection and loss, fused Adam, bf16 autocast)."""

import argparse
import time

import torch
from common import set_threads

from transduce.data import PreparedData
from transduce.data.batching import TokenBatches
from transduce.model import ModelConfig, Transformer
from transduce.train.dropout import use_fast_dropout
from transduce.train.residual import use_native_residual
from transduce.train.schedule import Schedule
from transduce.train.step import Stepper

parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
parser.add_argument("data")
parser.add_argument("--preset", default="small")
parser.add_argument("--threads", type=int, default=2)
parser.add_argument("--max-tokens", type=int, default=4224)
parser.add_argument("--updates", type=int, default=16, help="timed updates per kernel, after 3 untimed")
parser.add_argument("--kernels", default="native,written")
args = parser.parse_args()
set_threads(args.threads)
data = PreparedData.open(args.data)
cfg = ModelConfig.preset(args.preset, vocab_size=len(data.vocabs.src))
torch.manual_seed(1)
first = Transformer(cfg)
steppers = {}
for kernel in args.kernels.split(","):
    model = Transformer(cfg)
    model.load_state_dict(first.state_dict())
    use_fast_dropout(model)
    use_native_residual(model)
    opt = torch.optim.Adam(model.parameters(), lr=0.0, betas=(0.9, 0.98), eps=1e-9, fused=True)  # as the trainer
    schedule = Schedule("rsqrt", 4000, cfg.d_model)
    steppers[kernel] = Stepper(model.train(), opt, schedule, device=torch.device("cpu"), dtype="bf16", kernel=kernel)
batches = TokenBatches(data.split("train"), args.max_tokens, seed=1).epoch(1)[: args.updates + 3]
seconds = {k: [] for k in steppers}
tokens = 0
for i, batch in enumerate(batches):
    for kernel, stepper in steppers.items():
        start = time.perf_counter()
        stepper.update([batch], i + 1)
        if i >= 3:
            seconds[kernel].append(time.perf_counter() - start)
    tokens += batch.tgt_tokens if i >= 3 else 0
a, b = steppers
print(
    f"{args.preset}, {args.threads} thread(s), {args.updates} updates of ~{tokens // args.updates} target tokens: "
    + ", ".join(f"{k} {tokens / sum(s):.0f} tok/s" for k, s in seconds.items())
    + f"; {a} / {b} {sum(seconds[b]) / sum(seconds[a]):.3f}"
)
