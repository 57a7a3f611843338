"""How decoding scales with workers, offline: one sentence per call, as a server's lone requests come.

    python bench/decode_workers.py --model DIR --sentences FILE [--count 200] [--rounds 3]

Contenders, in alternating rounds, each translating the same ``--count`` sentences one call per sentence
(the paper's beam 4 and α 0.6, the model's ``auto`` backend, one intra-op thread per worker):

- ``1 thread``: one worker;
- ``2 threads``: two threads sharing one translator (``transduce serve``'s thread workers), the sentences
  dealt out in turn;
- ``2 processes``: two processes, each with its own translator (``--worker-kind process``).

Prints sentences/s (median of the rounds) and each contender's speed-up over one thread. Threads add up to
whole cores only where decoding holds no Python lock: the int8 C++ step runs beam search in one call that
releases it (``backends/native_step.cpp``: ``Decoder::beam_search``).
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import statistics
import threading
import time
from pathlib import Path

import torch
from common import machine, revision

from transduce.api import load
from transduce.decode.search_options import PAPER


def _translate_all(translator, sentences: list[str]) -> None:
    for s in sentences:
        translator.translate([s], search=PAPER)


def _threads(translator, sentences: list[str], workers: int) -> float:
    shares = [sentences[i::workers] for i in range(workers)]
    threads = [threading.Thread(target=_translate_all, args=(translator, s)) for s in shares]
    start = time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return time.perf_counter() - start


def _process_worker(model: str, sentences: list[str], ready, go, done) -> None:  # pragma: no cover - a child
    torch.set_num_threads(1)
    translator = load(model)
    _translate_all(translator, sentences[:4])  # warm-up
    ready.wait()
    go.wait()
    _translate_all(translator, sentences)
    done.wait()


def _processes(model: str, sentences: list[str], workers: int) -> float:
    ctx = mp.get_context("spawn")
    ready, go, done = (ctx.Barrier(workers + 1) for _ in range(3))
    procs = [
        ctx.Process(target=_process_worker, args=(model, sentences[i::workers], ready, go, done))
        for i in range(workers)
    ]
    for p in procs:
        p.start()
    ready.wait()  # every worker loaded and warm
    start = time.perf_counter()
    go.wait()
    done.wait()
    took = time.perf_counter() - start
    for p in procs:
        p.join()
    return took


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", required=True)
    p.add_argument("--sentences", type=Path, required=True)
    p.add_argument("--count", type=int, default=200)
    p.add_argument("--rounds", type=int, default=3)
    args = p.parse_args()
    sentences = [line.strip() for line in args.sentences.read_text(encoding="utf-8").splitlines() if line.strip()]
    sentences = sentences[: args.count]
    torch.set_num_threads(1)
    translator = load(args.model)
    _translate_all(translator, sentences[:4])  # warm-up
    contenders = {
        "1 thread": lambda: _threads(translator, sentences, 1),
        "2 threads": lambda: _threads(translator, sentences, 2),
        "2 processes": lambda: _processes(args.model, sentences, 2),
    }
    rates: dict[str, list[float]] = {name: [] for name in contenders}
    for _ in range(args.rounds):
        for name, run in contenders.items():
            rates[name].append(len(sentences) / run())
    print(f"`python bench/decode_workers.py --model {args.model} --sentences {args.sentences} --count {args.count}")
    print(f"--rounds {args.rounds}`; {machine()}; commit {revision()}; {translator.fast_paths.line()}")
    one = statistics.median(rates["1 thread"])
    for name, r in rates.items():
        print(f"{name}: {statistics.median(r):.1f} sentences/s, {statistics.median(r) / one:.2f}x one thread")


if __name__ == "__main__":
    main()
