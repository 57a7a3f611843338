"""``transduce serve`` option sets side by side under concurrent one-sentence clients, in alternating rounds.

    python bench/serve_options.py --model DIR --sentences FILE [--rounds 8] [--clients 8] [--texts 6] \\
        --variant default= --variant nowindow='--wait-ms 0' [--variant NAME='[VAR=VALUE ...] SERVE ARGS' ...]

Each round starts each variant's server on all cores (``taskset``), warms it up, sends ``--count``
sentences (beam 4, length penalty 0.2: the LibreTranslate benchmark's settings) from ``--clients``
concurrent clients over the LibreTranslate API, then ``--texts`` whole texts of about 2,000 characters one
at a time (sentences after the first ``--count``), and stops it; the servers take turns, round after round.
A variant's leading ``VAR=VALUE`` words are its server's environment: ``PYTHONPATH=../other/src`` runs
another checkout's code. Prints, per variant, the medians of requests/s, the server's CPU cores (its
processes' CPU time over the wall time), the clients' cores (this process's CPU time over the wall time: the
clients share the machine with the server), characters/s of the texts, and in how many rounds it was the
fastest under the clients. Servers and loads are ``bench/libretranslate.py``'s.
"""

from __future__ import annotations

import argparse
import os
import shlex
import statistics
import sys
import tempfile
import time
from pathlib import Path

from common import machine, revision
from libretranslate import LT_LENGTH_PENALTY, Server, concurrent, one_at_a_time, whole_texts


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", type=Path, required=True)
    p.add_argument("--sentences", type=Path, required=True, help="source sentences, one per line")
    p.add_argument("--variant", action="append", required=True, help="NAME=SERVE ARGS (may be empty)")
    p.add_argument("--rounds", type=int, default=8)
    p.add_argument("--clients", type=int, default=8)
    p.add_argument("--count", type=int, default=400, help="sentences per round")
    p.add_argument("--texts", type=int, default=0, help="whole ~2,000-character texts per round (default none)")
    p.add_argument("--pair", default="en-de")
    args = p.parse_args()
    lines = [s.strip() for s in args.sentences.read_text(encoding="utf-8").splitlines() if s.strip()]
    sentences = (lines * (-(-args.count // len(lines))))[: args.count]
    texts = whole_texts(lines[args.count :], 2000, args.texts) if args.texts else []
    if args.texts and not texts:
        p.error(f"--texts {args.texts}: {args.sentences} has no sentences after the first --count {args.count}")
    pair = tuple(args.pair.split("-"))
    base = [sys.executable, "-m", "transduce", "serve", "--model", str(args.model), "--port", "{port}"]
    base += ["--disable-files-translation", "--beam", "4", "--alpha", str(LT_LENGTH_PENALTY)]
    cores = len(os.sched_getaffinity(0))
    servers = {}
    for spec in args.variant:
        name, _, extra = spec.partition("=")
        words, env = shlex.split(extra), {}
        while words and "=" in words[0] and not words[0].startswith("-"):  # VAR=VALUE before the serve args
            key, _, value = words.pop(0).partition("=")
            env[key] = value
        servers[name] = Server(name, base + words, env, f"0-{cores - 1}")
    rows: dict[str, list[tuple[float, float, float, float]]] = {name: [] for name in servers}
    with tempfile.TemporaryDirectory() as work:
        for _ in range(args.rounds):
            for name, server in servers.items():
                server.start(Path(work))
                try:
                    concurrent(server, sentences[:16], pair, args.clients)  # warm-up
                    wall, _, server_cores, client_cores = concurrent(server, sentences, pair, args.clients)
                    chars = 0.0
                    if texts:
                        text_wall, _, _ = one_at_a_time(server, texts, pair)
                        chars = sum(map(len, texts)) / text_wall
                    rows[name].append((len(sentences) / wall, server_cores, client_cores, chars))
                finally:
                    server.stop()
    print(f"`python bench/serve_options.py {shlex.join(sys.argv[1:])}`")
    print(f"{machine()}; {time.strftime('%Y-%m-%d')}; commit {revision()}; {args.clients} clients, {args.count}")
    print(f"sentences a round, {args.rounds} alternating rounds, medians\n")
    print("| variant | requests/s | server cores | client cores | texts, characters/s | fastest in rounds |")
    print("|---|---|---|---|---|---|")
    fastest = [max(rows, key=lambda n: rows[n][r][0]) for r in range(args.rounds)]
    for name, got in rows.items():
        rate, server_cores, client_cores, chars = (statistics.median(x[i] for x in got) for i in range(4))
        shown = f"{chars:,.0f}" if texts else "-"
        print(f"| {name} | {rate:.1f} | {server_cores:.2f} | {client_cores:.2f} | {shown} | {fastest.count(name)} |")


if __name__ == "__main__":
    main()
