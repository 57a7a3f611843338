"""Load test for ``transduce serve``: throughput and latency, batched vs one request at a time.

    python bench/serve_load.py --model DIR --sentences FILE [--clients 8] [--requests 10] [--beam 4]
    python bench/serve_load.py --models models.toml --sentences en=EN_FILE --sentences de=DE_FILE ...

Starts ``transduce serve`` twice as a subprocess on 127.0.0.1 (dynamic batching on, then
``--max-batch-requests 1``), sends ``clients`` × ``requests`` one-sentence requests to
``POST /v1/translate`` from concurrent client threads (with ``--models``, request k of a client goes
to the k-th pair in turn, its sentence from the file given for that source language), checks every
answer against offline ``Translator.translate``, and prints sentences/s and p50/p95/p99 request
latency for each mode.
"""

from __future__ import annotations

import argparse
import gzip
import os
import statistics
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from common import free_port

from transduce.decode.search_options import SearchOptions


def start_server(served: list[str], port: int, extra: list[str], threads: int) -> subprocess.Popen:
    cmd = [sys.executable, "-m", "transduce", "serve", *served, "--port", str(port), "--threads", str(threads), *extra]
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


def percentile(sorted_values: list[float], q: float) -> float:
    return sorted_values[min(len(sorted_values) - 1, round(q * (len(sorted_values) - 1)))]


def load_test(url: str, jobs: list[list[tuple[str, str, str]]], beam: int) -> tuple[dict, list[str]]:
    """``jobs``: per client, its (source, target, sentence) requests, sent one after another."""
    import httpx

    def client(mine: list[tuple[str, str, str]]) -> list[tuple[float, str]]:
        out = []
        with httpx.Client(base_url=url, timeout=300) as c:
            for source, target, text in mine:
                t = time.perf_counter()
                body = {"text": [text], "beam": beam, **({"source": source, "target": target} if source else {})}
                r = c.post("/v1/translate", json=body)
                r.raise_for_status()
                out.append((time.perf_counter() - t, r.json()["translations"][0]))
        return out

    start = time.perf_counter()
    with ThreadPoolExecutor(len(jobs)) as pool:
        results = list(pool.map(client, jobs))
    wall = time.perf_counter() - start
    latencies = sorted(t for res in results for t, _ in res)
    n = len(latencies)
    stats = {
        "requests": n,
        "seconds": wall,
        "sent_per_s": n / wall,
        "p50_ms": 1000 * statistics.median(latencies),
        "p95_ms": 1000 * percentile(latencies, 0.95),
        "p99_ms": 1000 * percentile(latencies, 0.99),
    }
    health = httpx.get(url + "/v1/health").json()
    stats["batches"], stats["max_requests_in_batch"] = health["batches"], health["max_requests_in_batch"]
    return stats, [text for res in results for _, text in res]


def read_lines(path: Path) -> list[str]:
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "rt", encoding="utf-8") as f:
        return [line.strip() for line in f if line.strip()]


def plan(args) -> tuple[list[str], list[list[tuple[str, str, str]]], dict]:
    """(server arguments, per-client jobs, {(source, target): model path})."""
    from transduce.serve.registry import read_models

    if args.model is not None:
        if len(args.sentences) != 1 or "=" in args.sentences[0]:
            raise SystemExit("--model takes one --sentences FILE")
        texts = {"": read_lines(Path(args.sentences[0]))}
        pairs = [("", "")]
        paths = {("", ""): args.model}
        served = ["--model", str(args.model)]
    else:
        specs = read_models(args.models)
        texts = {}
        for item in args.sentences:
            lang, sep, path = item.partition("=")
            if not sep:
                raise SystemExit(f"--sentences {item}: with --models, give LANG=FILE")
            texts[lang] = read_lines(Path(path))
        pairs = [(s.source, s.target) for s in specs if s.source in texts]
        if not pairs:
            raise SystemExit("no --sentences LANG=FILE matches a model's source language")
        paths = {(s.source, s.target): s.path for s in specs}
        served = ["--models", str(args.models)]
    jobs = []
    for c in range(args.clients):
        mine = []
        for r in range(args.requests):
            source, target = pairs[(c + r) % len(pairs)]
            lines = texts[source]
            mine.append((source, target, lines[(c * args.requests + r) % len(lines)]))
        jobs.append(mine)
    return served, jobs, paths


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    which = p.add_mutually_exclusive_group(required=True)
    which.add_argument("--model", type=Path, help="one model directory")
    which.add_argument("--models", type=Path, help="models TOML or directory of model directories")
    p.add_argument(
        "--sentences",
        required=True,
        action="append",
        help="one source sentence per line (.gz allowed); with --models, LANG=FILE per source language",
    )
    p.add_argument("--clients", type=int, default=8)
    p.add_argument("--requests", type=int, default=10, help="per client")
    p.add_argument("--beam", type=int, default=4)
    p.add_argument("--threads", type=int, default=1, help="server torch threads")
    args = p.parse_args(argv)
    served, jobs, paths = plan(args)
    modes = {"batched": [], "one-at-a-time": ["--max-batch-requests", "1", "--wait-ms", "0"]}
    import torch

    from transduce.api import load

    torch.set_num_threads(args.threads)
    reference = []
    for pair, path in paths.items():  # offline translations, in the order the answers are collected
        mine = [text for client in jobs for s, t, text in client if (s, t) == pair]
        reference.append(
            (pair, dict(zip(mine, load(path).translate(mine, search=SearchOptions(beam=args.beam)), strict=True)))
        )
    offline = dict(reference)
    expected = [offline[s, t][text] for client in jobs for s, t, text in client]
    print(
        f"{args.clients} clients x {args.requests} requests, 1 sentence each, {len(paths)} model(s), "
        f"beam {args.beam}, server threads {args.threads}, cpus {os.cpu_count()}"
    )
    for name, extra in modes.items():
        port = free_port()
        proc = start_server(served, port, extra, args.threads)
        try:
            stats, outputs = load_test(f"http://127.0.0.1:{port}", jobs, args.beam)
        finally:
            proc.terminate()
            proc.wait(60)
        same = sum(a == b for a, b in zip(expected, outputs, strict=True))
        print(
            f"{name:>14}: {stats['sent_per_s']:.1f} sent/s, p50 {stats['p50_ms']:.0f} ms, "
            f"p95 {stats['p95_ms']:.0f} ms, p99 {stats['p99_ms']:.0f} ms, {stats['batches']} batches "
            f"(max {stats['max_requests_in_batch']} requests), equal to offline translate: {same}/{len(outputs)}"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
