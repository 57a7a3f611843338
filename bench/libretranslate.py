"""``transduce serve`` against the real LibreTranslate, on the same model and machine, side by side.

    python bench/libretranslate.py --model small=runs/demo/model --sentences runs/demo/data/test.en \\
        --model base=runs/bench/base-m30k/model --sentences runs/m30k/test.en --lt-venv runs/bench/lt/venv [--rounds 3]

(``make bench-libretranslate`` installs the pinned LibreTranslate in its own venv, trains or finds the models, and
runs this.) For each model: exports it to an int8 Argos package (``transduce export --to argos``), installs it
in a private Argos home for LibreTranslate (offline, as ``../shared/docs/libretranslate-offline.md`` says: an
empty package index, spaCy's rule-based sentencizer instead of MiniSBD's download, no torch in its process),
then measures, on all cores and on one core (``taskset``):

- LibreTranslate at its best (``ARGOS_INTRA_THREADS=1``, one replica per core: ``ARGOS_INTER_THREADS``) and with
  its defaults (all cores only);
- ``transduce serve`` with its defaults (one worker per core, one thread each: on 2 cores, threads sharing one
  copy of the model), and with ``--worker-kind process`` (a process and a copy of the model per worker, measured
  once all are up) on all cores.

Each server runs alone while it is measured; rounds alternate the servers. The loads: one sentence at a time
(requests/s, p50 ms), 8 concurrent clients of one sentence each (requests/s, p50 ms, cores used by the server's
processes), and whole ~2,000-character texts one at a time (characters/s). The clients run on the same cores
(as a co-located front end would), so no server can have all of them. Both servers decode with beam 4 and
length penalty 0.2: LibreTranslate's is hard-coded to CTranslate2's 0.2 (``length_penalty``), so transduce runs
with ``--alpha 0.2`` (its default is the paper's 0.6; the formulas differ: ``docs/serving.md``). The outputs of
both are compared (identical sentences, and BLEU of one against the other), and each server's resident memory
(all its processes) is read after its loads. Prints markdown.
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

import httpx
from common import ROOT, free_port, load_average, machine, revision

LT_VERSION = "1.9.6"
WARM_UP = "This sentence is not measured."
LT_LENGTH_PENALTY = 0.2  # argos-translate-lt's, hard-coded; transduce is given the same (--alpha)


# ---------------------------------------------------------------- LibreTranslate, offline
def lt_home(venv: Path, package: Path, work: Path) -> dict[str, str]:
    """A private Argos home with ``package`` installed, and the environment that makes LibreTranslate use it."""
    home = work / "lt-home"
    if home.exists():
        shutil.rmtree(home)
    env = {
        "XDG_DATA_HOME": str(home / "data"),
        "XDG_CONFIG_HOME": str(home / "config"),
        "XDG_CACHE_HOME": str(home / "cache"),
        "ARGOS_PACKAGES_DIR": str(home / "packages"),
        "ARGOS_CHUNK_TYPE": "SPACY",
        "PYTHONPATH": str(work / "no-torch"),  # thinc imports torch when it can: +180 MiB LibreTranslate never uses
    }
    index = home / "data" / "argos-translate" / "index.json"
    index.parent.mkdir(parents=True)
    index.write_text("[]")  # offline, fewer than 2 packages: without it boot loops fetching the index
    (home / "cache" / "argos-translate" / "spacy" / "senter" / "model").mkdir(parents=True)
    fake = work / "no-torch" / "torch"
    fake.mkdir(parents=True, exist_ok=True)
    (fake / "__init__.py").write_text("raise ImportError('torch is kept out of this benchmark process')\n")
    script = (
        "import sys, pathlib, spacy, argostranslate.package as p\n"
        "p.install_from_path(pathlib.Path(sys.argv[1]))\n"
        "for pkg in p.get_installed_packages():\n"
        "    spacy.blank('en').to_disk(pkg.package_path / 'spacy')\n"
    )
    install_env = {**os.environ, **env, "PYTHONPATH": ""}
    subprocess.run([str(venv / "bin" / "python"), "-c", script, str(package)], check=True, env=install_env)
    return env


# ---------------------------------------------------------------- servers
@dataclass
class Server:
    name: str
    cmd: list[str]
    env: dict[str, str]
    cores: str  # taskset's list
    proc: subprocess.Popen | None = None
    port: int = 0
    start_s: float = 0.0
    log: Path | None = None
    processes: int = 0  # worker processes a transduce server has when ready (measured once they are)

    def start(self, work: Path) -> None:
        self.port = free_port()
        cmd = [c.replace("{port}", str(self.port)) for c in self.cmd]
        self.log = work / f"{self.name.replace(' ', '_').replace(',', '')}.log"
        began = time.monotonic()
        self.proc = subprocess.Popen(
            ["taskset", "-c", self.cores, *cmd],
            env={**os.environ, **self.env},
            stdout=self.log.open("w"),
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        deadline = began + 300
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"{self.name} exited: {self.log.read_text()[-2000:]}")
            try:
                if httpx.get(f"{self.url}/languages", timeout=2).status_code == 200:
                    self.start_s = time.monotonic() - began
                    self.wait_for_workers(deadline)
                    return
            except httpx.HTTPError:
                time.sleep(0.2)
        self.stop()
        raise RuntimeError(f"{self.name} did not answer within 300 s: {self.log}")

    def wait_for_workers(self, deadline: float) -> None:
        """A transduce server answers while its worker processes load; they are measured once all are up."""
        while self.processes and time.monotonic() < deadline:
            if httpx.get(f"{self.url}/v1/health", timeout=2).json()["worker_processes"] == self.processes:
                return
            time.sleep(0.2)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def pids(self) -> list[int]:
        out = subprocess.run(["pgrep", "-s", str(self.proc.pid)], capture_output=True, text=True).stdout
        return [int(p) for p in out.split()] or [self.proc.pid]

    def cpu_s(self) -> float:
        """User + system CPU seconds of the server's processes."""
        tick = os.sysconf("SC_CLK_TCK")
        total = 0.0
        for pid in self.pids():
            try:
                fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
                total += (int(fields[11]) + int(fields[12])) / tick
            except (OSError, IndexError):
                pass
        return total

    def rss_mib(self) -> tuple[float, float, float]:
        """Resident MiB of the server's processes summed: all of it; its anonymous part (not mapped from a file: not
        the shared libraries, nor weights read as a map of their file, which the kernel can drop and read again);
        and the proportional set size (a page shared by n processes counts 1/n: what worker processes cost)."""
        sums = {"VmRSS:": 0, "RssAnon:": 0, "Pss:": 0}
        for pid in self.pids():
            for name in ("status", "smaps_rollup"):
                try:
                    for line in Path(f"/proc/{pid}/{name}").read_text().splitlines():
                        key = line.split(maxsplit=1)[0] if line else ""
                        if key in sums:
                            sums[key] += int(line.split()[1])
                except OSError:
                    pass
        return sums["VmRSS:"] / 1024, sums["RssAnon:"] / 1024, sums["Pss:"] / 1024

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait()


# ---------------------------------------------------------------- loads
@dataclass
class Result:
    rate: list[float] = field(default_factory=list)  # requests/s or characters/s, one per round
    p50_ms: list[float] = field(default_factory=list)
    cores: list[float] = field(default_factory=list)  # CPU seconds of the server / wall seconds
    client_cores: list[float] = field(default_factory=list)  # CPU seconds of the clients / wall seconds


class Client:
    """One keep-alive HTTP/1.1 connection (the standard library's): a client of the loads. httpx spent about 3 ms
    of CPU per request (0.3 of the 2 cores at 100 requests/s, taken from both servers alike); this spends about
    0.5 ms, closer to clients on other machines."""

    def __init__(self, server: Server):
        self.conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=300)

    def post(self, text: str, source: str, target: str) -> tuple[float, str]:
        body = json.dumps({"q": text, "source": source, "target": target, "format": "text"})
        start = time.perf_counter()
        self.conn.request("POST", "/translate", body, {"Content-Type": "application/json"})
        r = self.conn.getresponse()
        data = r.read()
        took = time.perf_counter() - start
        if r.status != 200:
            raise RuntimeError(f"{r.status} {data[:300]!r}")
        return took, json.loads(data)["translatedText"]

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc) -> None:
        self.conn.close()


def one_at_a_time(server: Server, texts: list[str], pair) -> tuple[float, float, list[str]]:
    with Client(server) as c:
        # warm-up with a text not measured: LibreTranslate (argos-translate's CachedTranslation) answers a
        # paragraph it translated in the previous request from its cache, so warming up with texts[0] would
        # give it the first measured text for free
        c.post(WARM_UP, *pair)
        start = time.perf_counter()
        answers = [c.post(t, *pair) for t in texts]
        wall = time.perf_counter() - start
    return wall, statistics.median(t for t, _ in answers) * 1000, [a for _, a in answers]


def concurrent(server: Server, texts: list[str], pair, clients: int) -> tuple[float, float, float, float]:
    """Wall seconds, p50 ms, the server's cores and the clients' cores (this process's CPU / wall)."""
    shares = [texts[i::clients] for i in range(clients)]

    def client(mine):
        with Client(server) as c:
            return [c.post(t, *pair)[0] for t in mine]

    cpu, own = server.cpu_s(), time.process_time()
    start = time.perf_counter()
    with ThreadPoolExecutor(clients) as pool:
        times = [t for ts in pool.map(client, shares) for t in ts]
    wall = time.perf_counter() - start
    return wall, statistics.median(times) * 1000, (server.cpu_s() - cpu) / wall, (time.process_time() - own) / wall


def whole_texts(sentences: list[str], chars: int, count: int) -> list[str]:
    """``count`` texts of consecutive sentences joined by a space, each about ``chars`` characters."""
    texts, current = [], ""
    for s in sentences:
        if current and len(current) + 1 + len(s) > chars:
            texts.append(current)
            current = ""
            if len(texts) == count:
                break
        current = f"{current} {s}" if current else s
    return texts


# ---------------------------------------------------------------- one model
PRECISIONS = {"int8": [], "float32": ["--backend", "fp32-native"]}  # the Argos package's -> transduce serve's


def export_package(model: Path, out: Path, precision: str) -> Path:
    package = out / f"model-{precision}.argosmodel"
    cmd = [sys.executable, "-m", "transduce", "export", "--to", "argos", "--model", str(model)]
    subprocess.run([*cmd, "--out", str(package), "--quantization", precision], check=True, stdout=subprocess.DEVNULL)
    return package


def servers_for(
    model: Path, venv: Path, env: dict[str, str], pair, cores: int, precision: str
) -> dict[str, list[Server]]:
    """The contenders on all cores and on one core; transduce in ``precision`` (its default choice for int8)."""
    lt_cmd = [str(venv / "bin" / "libretranslate"), "--host", "127.0.0.1", "--port", "{port}"]
    lt_cmd += ["--load-only", ",".join(pair), "--disable-files-translation"]
    td_cmd = [sys.executable, "-m", "transduce", "serve", "--model", str(model), "--port", "{port}"]
    td_cmd += ["--disable-files-translation", "--beam", "4", "--alpha", str(LT_LENGTH_PENALTY), *PRECISIONS[precision]]
    every = f"0-{cores - 1}"
    best = {"ARGOS_INTRA_THREADS": "1", "ARGOS_INTER_THREADS": str(cores)}
    return {
        f"{cores} cores": [
            Server("LibreTranslate, best", lt_cmd, {**env, **best}, every),
            Server("LibreTranslate, defaults", lt_cmd, env, every),
            Server("transduce", td_cmd, {}, every),
            Server("transduce, processes", [*td_cmd, "--worker-kind", "process"], {}, every, processes=cores),
        ],
        "1 core": [
            Server(
                "LibreTranslate, best", lt_cmd, {**env, "ARGOS_INTRA_THREADS": "1", "ARGOS_INTER_THREADS": "1"}, "0"
            ),
            Server("transduce", td_cmd, {}, "0"),
        ],
    }


def measure(servers: list[Server], sentences: list[str], texts: list[str], pair, rounds: int, work: Path):
    loads = ("one sentence at a time", "8 clients, one sentence each", "whole ~2,000-character texts")
    results = {s.name: {load: Result() for load in loads} for s in servers}
    outputs, memory, starts = {}, {}, {}
    for r in range(rounds):
        for server in servers if r % 2 == 0 else servers[::-1]:
            server.start(work)
            starts.setdefault(server.name, []).append(server.start_s)
            try:
                res = results[server.name]
                wall, p50, out = one_at_a_time(server, sentences, pair)
                res[loads[0]].rate.append(len(sentences) / wall)
                res[loads[0]].p50_ms.append(p50)
                outputs[server.name] = out
                wall, p50, cores, client_cores = concurrent(server, sentences * 2, pair, 8)
                res[loads[1]].rate.append(2 * len(sentences) / wall)
                res[loads[1]].p50_ms.append(p50)
                res[loads[1]].cores.append(cores)
                res[loads[1]].client_cores.append(client_cores)
                wall, _, _ = one_at_a_time(server, texts, pair)
                res[loads[2]].rate.append(sum(map(len, texts)) / wall)
                memory[server.name] = server.rss_mib()
            finally:
                server.stop()
            print(f"  round {r + 1}: {server.name} done (load {load_average()})", file=sys.stderr, flush=True)
    return loads, results, outputs, memory, starts


def table(loads, results, names: list[str], rival: str, memory, starts) -> list[str]:
    head = "| load | " + " | ".join(names) + " |"
    lines = [head, "|" + "---|" * (len(names) + 1)]
    for load in loads:
        cells = []
        for name in names:
            res = results[name][load]
            rate = statistics.median(res.rate)
            cell = f"{rate:,.0f}" if "texts" in load else f"{rate:.1f}"
            if res.p50_ms:
                cell += f" ({statistics.median(res.p50_ms):.1f} ms)"
            if res.cores:
                cell += (
                    f", {statistics.median(res.cores):.2f} cores (clients {statistics.median(res.client_cores):.2f})"
                )
            if name != rival:
                cell += f", **{rate / statistics.median(results[rival][load].rate):.2f}×**"
            cells.append(cell)
        lines.append(f"| {load} | " + " | ".join(cells) + " |")
    lines.append(
        "| resident memory, MiB (anonymous; proportional) | "
        + " | ".join("{:.0f} ({:.0f}; {:.0f})".format(*memory[n]) for n in names)
        + " |"
    )
    lines.append(
        "| start to first answer (s) | " + " | ".join(f"{statistics.median(starts[n]):.1f}" for n in names) + " |"
    )
    return lines


def agreement(outputs: dict[str, list[str]], a: str, b: str) -> str:
    import sacrebleu

    same = sum(x == y for x, y in zip(outputs[a], outputs[b]))
    bleu = sacrebleu.corpus_bleu(outputs[a], [outputs[b]]).score
    return f"{same} of {len(outputs[a])} sentences identical; BLEU of {a} against {b}: {bleu:.1f}"


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", action="append", required=True, metavar="NAME=DIR", help="a model directory, named")
    p.add_argument(
        "--sentences",
        type=Path,
        action="append",
        required=True,
        help="source sentences, one per line: once for every model, or once per model in --model's order",
    )
    p.add_argument("--lt-venv", type=Path, required=True, help=f"a venv with libretranslate=={LT_VERSION}")
    p.add_argument("--work", type=Path, default=ROOT / "runs" / "bench" / "libretranslate")
    p.add_argument("--count", type=int, default=200, help="sentences of the one-at-a-time load (default 200)")
    p.add_argument("--texts", type=int, default=8, help="whole texts per round (default 8)")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--cores", type=int, default=len(os.sched_getaffinity(0)))
    p.add_argument(
        "--precision",
        choices=list(PRECISIONS),
        default="int8",
        help="the Argos package's CTranslate2 weights; float32: transduce serves --backend fp32-native, what auto "
        "runs where no accuracy record vouches for int8",
    )
    args = p.parse_args()
    if len(args.sentences) not in (1, len(args.model)):
        p.error(f"--sentences: give it once, or once per --model ({len(args.model)}), not {len(args.sentences)} times")
    print(f"# transduce serve and LibreTranslate {LT_VERSION}, side by side\n")
    print(
        f"`python bench/libretranslate.py {' '.join(sys.argv[1:])}`; {machine()}; {time.strftime('%Y-%m-%d')}; "
        f"commit {revision()}; {args.rounds} rounds, medians; beam 4 and length penalty {LT_LENGTH_PENALTY} both; "
        f"{args.precision}.\n"
    )
    for spec, source in zip(
        args.model, args.sentences * len(args.model) if len(args.sentences) == 1 else args.sentences
    ):
        lines = [s.strip() for s in source.read_text(encoding="utf-8").splitlines() if s.strip()]
        sentences = lines[: args.count]
        texts = whole_texts(lines[args.count :], 2000, args.texts)
        name, _, directory = spec.partition("=")
        model = Path(directory)
        meta = json.loads(
            subprocess.run(
                [
                    sys.executable,
                    "-c",
                    "import json,sys; from transduce.modeldir import read_model_config as r; "
                    "print(json.dumps(r(sys.argv[1])[1]))",
                    str(model),
                ],
                capture_output=True,
                text=True,
                check=True,
            ).stdout
        )
        pair = (str(meta["src_lang"]), str(meta["tgt_lang"]))
        work = args.work / name
        work.mkdir(parents=True, exist_ok=True)
        env = lt_home(args.lt_venv, export_package(model, work, args.precision), work)
        for where, servers in servers_for(model, args.lt_venv, env, pair, args.cores, args.precision).items():
            print(f"{name}, {where} ...", file=sys.stderr, flush=True)
            loads, results, outputs, memory, starts = measure(servers, sentences, texts, pair, args.rounds, work)
            names = [s.name for s in servers]
            print(f"## {name} model ({model}), {where}\n")
            print(f"{len(sentences)} sentences of {source}, {len(texts)} texts of about 2,000 characters from it.\n")
            print("Requests/s (p50 latency); whole texts in characters/s; ratios against LibreTranslate at its best.\n")
            print("\n".join(table(loads, results, names, "LibreTranslate, best", memory, starts)))
            print(f"\nOutputs: {agreement(outputs, 'transduce', 'LibreTranslate, best')}.\n", flush=True)


if __name__ == "__main__":
    main()
