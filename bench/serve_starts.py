"""Seconds from starting ``transduce serve`` to its first translation, over many starts.

    python bench/serve_starts.py --model DIR [--starts 20] [-- EXTRA SERVE ARGS]

Each start is a new process on a free port; the clock runs from ``Popen`` to the first ``200`` answer of
``POST /translate`` (one sentence), polled every 20 ms. Then the server is stopped (SIGTERM) and the next one
starts. Prints each start, the median, the slowest and how many took over 3 s.
"""

from __future__ import annotations

import argparse
import os
import signal
import statistics
import subprocess
import sys
import time
from pathlib import Path

import httpx
from common import free_port, machine


def one_start(model: Path, extra: list[str], pair: tuple[str, str]) -> float:
    port = free_port()
    cmd = [sys.executable, "-m", "transduce", "serve", "--model", str(model), "--port", str(port), *extra]
    began = time.monotonic()
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    try:
        while time.monotonic() - began < 300:
            try:
                r = httpx.post(
                    f"http://127.0.0.1:{port}/translate",
                    json={"q": "Hello.", "source": pair[0], "target": pair[1]},
                    timeout=60,
                )
                if r.status_code == 200:
                    return time.monotonic() - began
            except httpx.HTTPError:
                pass
            if proc.poll() is not None:
                raise RuntimeError(f"the server exited with {proc.returncode}: {' '.join(cmd)}")
            time.sleep(0.02)
        raise RuntimeError("no answer within 300 s")
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait()


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", type=Path, required=True)
    p.add_argument("--starts", type=int, default=20)
    p.add_argument("--source", default="en")
    p.add_argument("--target", default="de")
    p.add_argument("extra", nargs="*", help="more transduce serve arguments (after --)")
    args = p.parse_args()
    times = []
    for i in range(args.starts):
        times.append(one_start(args.model, args.extra, (args.source, args.target)))
        print(f"start {i + 1}: first answer after {times[-1]:.2f} s", flush=True)
    print(
        f"{machine()}, {time.strftime('%Y-%m-%d')}: {args.starts} starts, median {statistics.median(times):.2f} s, "
        f"slowest {max(times):.2f} s, {sum(t > 3 for t in times)} over 3 s"
    )


if __name__ == "__main__":
    main()
