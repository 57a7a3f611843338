"""Load test for ``transduce serve``: throughput and latency, batched vs one request at a time.

    python bench/serve_load.py --model DIR --sentences FILE [--clients 8] [--requests 10] [--beam 4]

Starts ``transduce serve`` twice as a subprocess on 127.0.0.1 (dynamic batching on, then
``--max-batch-requests 1``), sends ``clients`` × ``requests`` one-sentence requests from
concurrent client threads, checks every answer against offline ``Translator.translate``, and prints
sentences/s and p50/p95 request latency for each mode.
"""

from __future__ import annotations

import argparse
import os
import socket
import statistics
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_server(model: Path, port: int, extra: list[str], threads: int) -> subprocess.Popen:
    cmd = [sys.executable, "-m", "transduce", "serve", "--model", str(model), "--port", str(port),
           "--threads", str(threads), *extra]
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    import httpx

    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"server exited: {proc.stderr.read()}")
        try:
            if httpx.get(f"http://127.0.0.1:{port}/health", timeout=1).status_code == 200:
                return proc
        except httpx.HTTPError:
            time.sleep(0.2)
    proc.terminate()
    raise RuntimeError("server did not start within 120 s")


def load_test(url: str, texts: list[str], clients: int, requests: int, beam: int) -> tuple[dict, list[str]]:
    import httpx

    jobs = [[texts[(c * requests + r) % len(texts)] for r in range(requests)] for c in range(clients)]

    def client(mine: list[str]) -> list[tuple[float, str]]:
        out = []
        with httpx.Client(base_url=url, timeout=300) as c:
            for text in mine:
                t = time.perf_counter()
                r = c.post("/translate", json={"text": [text], "beam": beam})
                r.raise_for_status()
                out.append((time.perf_counter() - t, r.json()["translations"][0]))
        return out

    start = time.perf_counter()
    with ThreadPoolExecutor(clients) as pool:
        results = list(pool.map(client, jobs))
    wall = time.perf_counter() - start
    latencies = sorted(t for res in results for t, _ in res)
    n = len(latencies)
    stats = {"requests": n, "seconds": wall, "sent_per_s": n / wall,
             "p50_ms": 1000 * statistics.median(latencies),
             "p95_ms": 1000 * latencies[min(n - 1, int(round(0.95 * (n - 1))))]}
    health = httpx.get(url + "/health").json()
    stats["batches"], stats["max_requests_in_batch"] = health["batches"], health["max_requests_in_batch"]
    return stats, [text for res in results for _, text in res]


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", required=True, type=Path)
    p.add_argument("--sentences", required=True, type=Path, help="one source sentence per line (.gz allowed)")
    p.add_argument("--clients", type=int, default=8)
    p.add_argument("--requests", type=int, default=10, help="per client")
    p.add_argument("--beam", type=int, default=4)
    p.add_argument("--threads", type=int, default=1, help="server torch threads")
    args = p.parse_args(argv)
    opener = __import__("gzip").open if args.sentences.suffix == ".gz" else open
    with opener(args.sentences, "rt", encoding="utf-8") as f:
        texts = [line.strip() for line in f if line.strip()]
    modes = {"batched": [], "one-at-a-time": ["--max-batch-requests", "1", "--wait-ms", "0"]}
    import torch

    from transduce.api import load

    torch.set_num_threads(args.threads)
    jobs = [texts[(c * args.requests + r) % len(texts)] for c in range(args.clients) for r in range(args.requests)]
    reference = load(args.model).translate(jobs, beam=args.beam)  # offline, in the order the clients send
    print(f"{args.clients} clients x {args.requests} requests, 1 sentence each, beam {args.beam}, "
          f"server threads {args.threads}, cpus {os.cpu_count()}")
    for name, extra in modes.items():
        port = free_port()
        proc = start_server(args.model, port, extra, args.threads)
        try:
            stats, outputs = load_test(f"http://127.0.0.1:{port}", texts, args.clients, args.requests, args.beam)
        finally:
            proc.terminate()
            proc.wait(60)
        same = sum(a == b for a, b in zip(reference, outputs))
        print(f"{name:>14}: {stats['sent_per_s']:.1f} sent/s, p50 {stats['p50_ms']:.0f} ms, "
              f"p95 {stats['p95_ms']:.0f} ms, {stats['batches']} batches (max {stats['max_requests_in_batch']} "
              f"requests), equal to offline translate: {same}/{len(outputs)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
