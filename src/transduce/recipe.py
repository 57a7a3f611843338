"""``transduce recipe CONFIG.toml``: prepare → train → average → evaluate, driven by one TOML file.

    [recipe]    out = "runs/multi30k-en-de"        # everything goes under this directory
                processes = 2                      # train with DDP in 2 processes (torchrun), else in-process
                members = 1                        # > 1: independent models trained at once, one ensemble
    [prepare]   corpus, src, tgt, raw | download, vocab_size ... (the flags of `transduce prepare`)
    [train]     TrainConfig keys (data and out are filled in from the recipe)
    [model]     ModelConfig keys or a preset
    [average]   last = 5                           # the paper averages the last 5 (base) / 20 (big);
                                                   # a list, e.g. [5, 10]: each window is a candidate
    [evaluate]  splits, beam, alpha, ...

``--set section.key=value`` overrides any key. The averaged model (one per window in [average] last) and
the trainer's own final model (the best validated weights, the last update's included) are all scored on
the validation split, with each length penalty α listed in [evaluate] alpha, and with ``train.ema_decay``
so is the moving average of the weights (RUN_DIR/ema-model). The best model and
α are the recipe's, and only they are scored on the test splits (the choice never looks at test data).
Results go to OUT/results.json and are printed as a table.

With ``members = M > 1`` the recipe trains M models at the same time, each from its own seed and with
``processes`` processes of its own, in OUT/member-1 ... OUT/member-M (each a whole recipe run: its model chosen
on valid as above, its test scores). Their chosen models are then decoded together as one ensemble (the average
of their log-probabilities, :mod:`transduce.decode.ensemble`), scored on valid with each α, and the ensemble
or a single member, whichever is best on valid, is scored on the test splits. The ensemble translates with
``transduce translate --model OUT/member-1/model --ensemble OUT/member-2/model ...``.
"""

from __future__ import annotations

import argparse
import json
import platform
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import torch

from .backends import DTYPES
from .config import ConfigError, build, check, parse_override, read_toml, to_toml_text
from .decode.search_options import PAPER, SearchOptions


@dataclass
class RecipeSection:
    out: str = ""
    seed: int = 1
    processes: int = 1  # > 1: train under torchrun (DistributedDataParallel), [train] threads each
    members: int = 1  # > 1: that many independent models trained at once, each with `processes` processes

    def __post_init__(self) -> None:
        check(bool(self.out), "out", "must name the recipe's output directory")
        check(self.processes >= 1, "processes", f"must be at least 1, got {self.processes}")
        check(self.members >= 1, "members", f"must be at least 1, got {self.members}")
        check(self.members == 1 or self.seed >= 1, "seed", f"must be at least 1 with members > 1, got {self.seed}")

    def member_seeds(self) -> list[int]:
        """Member i (from 1) of seed s trains from seed (s − 1) · members + i: seeds 1 and 2 share no member."""
        return [(self.seed - 1) * self.members + i for i in range(1, self.members + 1)]


@dataclass
class PrepareSection:
    corpus: str = "multi30k"
    src: str = "en"
    tgt: str = "de"
    extra_src: list[str] = field(default_factory=list)  # bible: more source versions for the training books
    raw: str | None = None
    download: bool = False
    vocab_size: int = 8000
    separate_vocab: bool = False
    lowercase: bool = False  # the model sees lowercased text, as Multi30k papers train (outputs are lowercase)
    max_tokens_per_sentence: int | None = None
    max_ratio: float | None = None
    dedup: bool = False
    cache_dir: str | None = None
    out: str | None = None  # default: RECIPE_OUT/data
    vocab_from: str | None = None  # fine-tuning: a model directory's vocabulary (with [train] init_from)

    def __post_init__(self) -> None:
        check(self.corpus in ("multi30k", "bible"), "corpus", f"must be 'multi30k' or 'bible', got {self.corpus!r}")
        check(self.vocab_size >= 8, "vocab_size", f"must be at least 8, got {self.vocab_size}")
        check(
            not self.extra_src or self.corpus == "bible",
            "extra_src",
            f"only the bible corpus has other versions of its source, not {self.corpus!r}",
        )

    def argv(self, out: Path) -> list[str]:
        argv = [
            "prepare",
            self.corpus,
            "--src",
            self.src,
            "--tgt",
            self.tgt,
            "--out",
            str(out),
            "--vocab-size",
            str(self.vocab_size),
        ]
        if self.extra_src:
            argv += ["--extra-src", ",".join(self.extra_src)]
        if self.raw:
            argv += ["--raw", self.raw]
        if self.download:
            argv.append("--download")
        if self.cache_dir:
            argv += ["--cache-dir", self.cache_dir]
        if self.vocab_from:
            argv += ["--vocab-from", self.vocab_from]
        for flag, value in (
            ("--max-tokens-per-sentence", self.max_tokens_per_sentence),
            ("--max-ratio", self.max_ratio),
        ):
            if value is not None:
                argv += [flag, str(value)]
        argv += ["--separate-vocab"] * self.separate_vocab + ["--dedup"] * self.dedup + ["--lowercase"] * self.lowercase
        return argv


@dataclass
class AverageSection:
    last: int | list[int] = 5  # a list: each window is averaged and scored on valid, with the final model

    def __post_init__(self) -> None:
        lasts = self.last if isinstance(self.last, list) else [self.last]
        check(
            len(lasts) > 0 and all(type(n) is int and n >= 0 for n in lasts),
            "last",
            f"must be a non-negative number (0 = no averaging) or a non-empty list of them, got {self.last}",
        )
        check(len(set(lasts)) == len(lasts), "last", f"lists a window twice: {self.last}")
        self.lasts = lasts


@dataclass
class EvaluateSection:
    valid_split: str = "valid"
    test_splits: list[str] = field(default_factory=lambda: ["test"])
    beam: int = PAPER.beam
    alpha: float | list[float] = PAPER.alpha  # a list: each is tried on the validation split, the best on test
    max_len_a: float = PAPER.max_len_a
    max_len_b: int = PAPER.max_len_b
    dtype: str = "fp32"
    device: str = "cpu"  # "cuda", or "auto": cuda when available

    def __post_init__(self) -> None:
        check(self.device in ("cpu", "cuda", "auto"), "device", f"must be cpu, cuda or auto, got {self.device!r}")
        check(self.beam >= 1, "beam", f"must be at least 1, got {self.beam}")
        alphas = self.alpha if isinstance(self.alpha, list) else [self.alpha]
        check(
            len(alphas) > 0 and all(a >= 0 for a in alphas),
            "alpha",
            f"must be a non-negative number or a non-empty list of them, got {self.alpha}",
        )
        self.alphas = [float(a) for a in alphas]
        check(self.dtype in DTYPES, "dtype", f"must be one of {', '.join(DTYPES)}, got {self.dtype!r}")


SECTIONS = {"recipe": RecipeSection, "prepare": PrepareSection, "average": AverageSection, "evaluate": EvaluateSection}
PASSED_ON = ("train", "model")  # validated by `transduce train`


@dataclass
class Recipe:
    path: Path
    recipe: RecipeSection
    prepare: PrepareSection
    average: AverageSection
    evaluate: EvaluateSection
    train: dict[str, Any]
    model: dict[str, Any]

    @property
    def out(self) -> Path:
        return Path(self.recipe.out)

    @property
    def data_dir(self) -> Path:
        return Path(self.prepare.out) if self.prepare.out else self.out / "data"


def load_recipe(path: str | Path, overrides: list[str] = ()) -> Recipe:
    """Read and validate a recipe: the file's tables, then ``overrides`` ("section.key=value", the command
    line's ``--set``)."""
    path = Path(path)
    raw = read_toml(path)
    over: dict[str, dict[str, Any]] = {}  # --set section.key=value
    for text in overrides:
        key, value = parse_override(text)
        if "." not in key:
            raise ConfigError(f"override {text!r}: name the section, e.g. train.max_minutes=5")
        section, name = key.split(".", 1)
        if section not in (*SECTIONS, *PASSED_ON):
            raise ConfigError(f"override {text!r}: unknown section {section!r}")
        over.setdefault(section, {})[name] = value
    for section in raw:
        if section not in (*SECTIONS, *PASSED_ON):
            raise ConfigError(f"{path}: unknown table [{section}] (expected {', '.join((*SECTIONS, *PASSED_ON))})")
    tables = {name: {**raw.get(name, {}), **over.get(name, {})} for name in (*SECTIONS, *PASSED_ON)}
    built = {name: build(cls, tables[name], where=f"{path} [{name}]") for name, cls in SECTIONS.items()}
    return Recipe(path, **built, train=tables["train"], model=tables["model"])


def write_train_config(recipe: Recipe) -> Path:
    """RECIPE_OUT/train.toml: the [train] and [model] tables with the recipe's paths and seed. The recipe
    measures the backends of the model it keeps (check-backends), not of the run's own final model."""
    train = {
        "seed": recipe.recipe.seed,
        "check_backends": 0,
        **recipe.train,
        "data": str(recipe.data_dir),
        "out": str(recipe.out / "run"),
    }
    path = recipe.out / "train.toml"
    path.write_text(to_toml_text({"train": train, "model": recipe.model}))
    return path


def machine() -> dict[str, Any]:
    cpu = platform.processor() or platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return {"cpu": cpu, "threads": torch.get_num_threads(), "torch": torch.__version__}


def run_recipe(recipe: Recipe, resume: bool = False, evaluate_only: bool = False) -> dict[str, Any]:
    """Run the recipe; ``evaluate_only`` re-runs only averaging and evaluation on a finished run (for
    other [evaluate] settings), keeping the training figures of its results.json."""
    if recipe.recipe.members > 1:
        return _run_members(recipe, resume, evaluate_only)
    recipe.out.mkdir(parents=True, exist_ok=True)
    results = _header(recipe)
    if evaluate_only:
        _keep_training_figures(recipe, results)
    else:
        _train(recipe, resume, results)
    return _evaluate(recipe, results)


def _evaluate(recipe: Recipe, results: dict[str, Any]) -> dict[str, Any]:
    """average → choose among final, averaged and EMA on valid → test; OUT/results.json written."""
    _choose(recipe, results, _candidates(recipe, results))
    (recipe.out / "results.json").write_text(json.dumps(results, indent=2) + "\n")
    return results


def _header(recipe: Recipe) -> dict[str, Any]:
    return {
        "recipe": str(recipe.path),
        "machine": machine(),
        "seed": recipe.recipe.seed,
        "train_threads": recipe.train.get("threads", torch.get_num_threads()),
        "train_processes": recipe.recipe.processes,
    }


def _keep_training_figures(recipe: Recipe, results: dict[str, Any]) -> None:
    previous = recipe.out / "results.json"
    if not previous.is_file():
        raise FileNotFoundError(f"--evaluate-only: {previous} not found; run the recipe to the end first")
    old = json.loads(previous.read_text())
    kept = ("seed", "train_threads", "train_processes", "train_wall_s", "train", "dtype")
    results.update({k: old[k] for k in kept if k in old})


def _prepare(recipe: Recipe) -> None:
    from .cli import main as cli

    _stage("prepare", " ".join(recipe.prepare.argv(recipe.data_dir)))
    if cli(recipe.prepare.argv(recipe.data_dir)) != 0:
        raise RuntimeError("transduce prepare failed (its message is above)")


def _train_command(recipe: Recipe, resume: bool) -> tuple[list[str], str]:
    """(what runs ``transduce train`` on the recipe's train.toml in a new process, the command as a user types it):
    torchrun with [recipe] processes > 1, else one Python process."""
    argv = ["train", str(write_train_config(recipe))] + (["--resume"] if resume else [])
    n = recipe.recipe.processes
    if n == 1:
        return [sys.executable, "-m", "transduce", *argv], " ".join(["transduce", *argv])
    torchrun = ["torch.distributed.run", "--standalone", f"--nproc_per_node={n}", "-m", "transduce", *argv]
    return [sys.executable, "-m", *torchrun], " ".join(["torchrun", *torchrun[1:]])


def _train(recipe: Recipe, resume: bool, results: dict[str, Any]) -> None:
    """prepare → train (in-process, or under torchrun with [recipe] processes > 1)."""
    from .cli import main as cli

    _prepare(recipe)
    command, shown = _train_command(recipe, resume)
    _stage("train", shown)
    start = time.perf_counter()
    # in-process with one process: the arguments after "python -m transduce"
    status = subprocess.run(command).returncode if recipe.recipe.processes > 1 else cli(command[3:])
    if status != 0:
        raise RuntimeError(f"transduce train failed with status {status} (its message is above)")
    _record_training(recipe, results, time.perf_counter() - start)


def _record_training(recipe: Recipe, results: dict[str, Any], wall_s: float) -> None:
    results["train_wall_s"] = round(wall_s, 1)
    results["dtype"] = read_toml(recipe.out / "run" / "config.toml")["train"]["dtype"]  # "auto" resolved
    results["train"] = _train_summary(recipe.out / "run")


def member_recipe(recipe: Recipe, i: int) -> Recipe:
    """Member ``i`` (from 1) of a recipe with [recipe] members > 1: OUT/member-i, its own seed, the shared data."""
    section = replace(
        recipe.recipe, out=str(recipe.out / f"member-{i}"), seed=recipe.recipe.member_seeds()[i - 1], members=1
    )
    return replace(recipe, recipe=section, prepare=replace(recipe.prepare, out=str(recipe.data_dir)))


def _run_members(recipe: Recipe, resume: bool, evaluate_only: bool) -> dict[str, Any]:
    """Train the members at once (each alone a whole recipe run), then choose on valid among their ensemble and
    each member alone."""
    if "seed" in recipe.train:
        raise ConfigError(
            f"{recipe.path} [train] seed: with [recipe] members > 1 set recipe.seed (members derive theirs)"
        )
    members = [member_recipe(recipe, i) for i in range(1, recipe.recipe.members + 1)]
    recipe.out.mkdir(parents=True, exist_ok=True)
    results = {**_header(recipe), "members": len(members), "member_seeds": recipe.recipe.member_seeds()}
    if evaluate_only:
        member_results = [run_recipe(m, evaluate_only=True) for m in members]
    else:
        _prepare(recipe)
        member_results = []
        for m, wall_s in zip(members, _train_at_once(members, resume)):
            r = _header(m)
            _record_training(m, r, wall_s)
            member_results.append(_evaluate(m, r))
    results["train_wall_s"] = max(r["train_wall_s"] for r in member_results)
    results["dtype"] = member_results[0]["dtype"]
    results["train"] = {"step": [r["train"].get("step") for r in member_results]}
    chosen = [Path(r["model"]) for r in member_results]
    candidates = {"ensemble": chosen, **{f"member {i}": [d] for i, d in enumerate(chosen, 1)}}
    _choose(recipe, results, candidates)
    (recipe.out / "results.json").write_text(json.dumps(results, indent=2) + "\n")
    return results


def _train_at_once(members: list[Recipe], resume: bool) -> list[float]:
    """Start every member's training, each in its own process(es) with its output in OUT/member-i/train.log; wait
    for all. Returns each one's wall-clock seconds. If one fails, the others are stopped."""
    running = []
    for m in members:
        m.out.mkdir(parents=True, exist_ok=True)
        command, shown = _train_command(m, resume)
        log = m.out / "train.log"
        _stage("train", f"{shown} > {log}")
        with open(log, "w") as f:
            running.append((subprocess.Popen(command, stdout=f, stderr=subprocess.STDOUT), log, time.perf_counter()))
    walls: dict[int, float] = {}
    while len(walls) < len(running):
        for i, (process, log, start) in enumerate(running):
            if i not in walls and process.poll() is not None:
                walls[i] = time.perf_counter() - start
                if process.returncode != 0:
                    for other, _, _ in running:
                        if other.poll() is None:
                            other.terminate()
                            other.wait()
                    raise RuntimeError(f"transduce train failed with status {process.returncode}: see {log}")
        time.sleep(0.5)
    return [walls[i] for i in range(len(running))]


def _candidates(recipe: Recipe, results: dict[str, Any]) -> dict[str, list[Path]]:
    """The run's models to choose from, name -> [model directory]: final, averaged (each window) and EMA."""
    from .train.average import average
    from .train.checkpoint import list_checkpoints
    from .train.trainer import EMA_MODEL

    run = recipe.out / "run"
    candidates = {"final": [run / "model"]}
    available = len(list_checkpoints(run / "checkpoints"))
    windows = []  # the distinct windows that can be averaged, each at most the checkpoints there are
    for wanted in recipe.average.lasts:
        last = min(wanted, available)
        if last < wanted:
            print(f"only {available} checkpoints were written; averaging {last}, not {wanted}")
        if last > 1 and last not in windows:
            windows.append(last)
    one = len(recipe.average.lasts) == 1  # one window keeps the plain names: "averaged", OUT/averaged
    results["averaged_checkpoints"] = (windows[0] if windows else 0) if one else windows
    for last in windows:
        name, folder = ("averaged", "averaged") if one else (f"averaged {last}", f"averaged-{last}")
        _stage("average", f"transduce average {run} --last {last}")
        candidates[name] = [average(run, last, recipe.out / folder)]
    if (run / EMA_MODEL).is_dir():  # train.ema_decay: the moving average of the weights competes too
        candidates["ema"] = [run / EMA_MODEL]
    return candidates


def _choose(recipe: Recipe, results: dict[str, Any], candidates: dict[str, list[Path]]) -> None:
    """Score each candidate (a model, or an ensemble of several) on valid with each α, keep the best, and score
    only it on the test splits. A single model is copied to OUT/model; an ensemble is named by its members."""
    from .api import load
    from .data import PreparedData
    from .evaluate import evaluate_model

    data = PreparedData.open(recipe.data_dir)
    ev = recipe.evaluate
    device = ("cuda" if torch.cuda.is_available() else "cpu") if ev.device == "auto" else ev.device
    base = dict(beam=ev.beam, max_len_a=ev.max_len_a, max_len_b=ev.max_len_b)
    # lowercased outputs make cased sacreBLEU meaningless: choose them on tok-lc BLEU, the figure that applies
    metric = "tok_lc_bleu" if recipe.prepare.lowercase else "bleu"
    scores: dict[str, dict[str, Any]] = {}
    sweeps: dict[str, dict[str, float]] = {}
    translators = {}
    for name, (first, *others) in candidates.items():
        translators[name] = load(first, device=device, dtype=ev.dtype, ensemble=others)
        tried = {}  # alpha -> scores on valid
        for alpha in ev.alphas:
            _stage("evaluate", f"{name} model on {ev.valid_split} (beam {ev.beam}, alpha {alpha})")
            tried[alpha] = _score(evaluate_model, translators[name], data, ev.valid_split, {**base, "alpha": alpha})
        best = max(tried, key=lambda a: tried[a][metric])  # the first of equals
        scores[name] = {ev.valid_split: {**tried[best], "alpha": best}}
        sweeps[name] = {str(a): tried[a][metric] for a in tried}
    chosen = max(scores, key=lambda n: scores[n][ev.valid_split][metric])
    decode = {**base, "alpha": scores[chosen][ev.valid_split]["alpha"]}
    results["chosen_by"] = metric
    if len(ev.alphas) > 1:
        results["alpha_sweep_valid_bleu"] = sweeps
    for split in ev.test_splits:
        _stage("evaluate", f"{chosen} model on {split}")
        scores[chosen][split] = {
            **_score(evaluate_model, translators[chosen], data, split, decode, recipe.out / f"{split}.hyp"),
            "alpha": decode["alpha"],
        }
    first, *others = candidates[chosen]
    results.update({"chosen": chosen, "scores": scores, "decode": decode})
    results.setdefault("dtype", recipe.train.get("dtype", "fp32"))
    if others:  # an ensemble: its members' directories are the model
        results.update({"model": str(first), "ensemble": [str(d) for d in others]})
        results["backends"] = "not checked: an ensemble decodes in PyTorch (the C++ step is one model's)"
        return
    target = recipe.out / "model"
    shutil.rmtree(target, ignore_errors=True)
    shutil.copytree(first, target)
    results["model"] = str(target)
    results["backends"] = _check_backends(recipe, target, device, decode, metric)


def _check_backends(recipe: Recipe, model_dir: Path, device: str, decode: dict, metric: str) -> str:
    """Score int8-native against fp32 on the validation split and record it in the kept model's directory
    (backends.json, :mod:`transduce.check_backends`), so that loading it picks int8 by default where it is
    within 0.3 BLEU. Returns the result in one line, or why it was not checked."""
    from .backends.measure import measure, summary

    if device != "cpu":
        return f"not checked: decoded on {device}, int8 is for CPUs"
    ev, data_dir = recipe.evaluate, recipe.data_dir
    command = (
        f"transduce check-backends {model_dir} --data {data_dir} --split {ev.valid_split} "
        f"--beam {ev.beam} --alpha {decode['alpha']} --metric {metric}"
    )
    _stage("check-backends", command)
    from .data import PreparedData

    data = PreparedData.open(data_dir)
    sources, refs = _texts(data, ev.valid_split)
    try:
        record = measure(
            model_dir,
            sources,
            refs,
            data.manifest["tgt_lang"],
            f"{data_dir} {ev.valid_split}",
            PAPER.replace(beam=ev.beam, alpha=decode["alpha"]),  # as the command above says
            command=command,
            metric=metric,
        )
    except RuntimeError as e:  # the C++ step cannot run here: the model stays on fp32 by default
        print(f"check-backends: {e}")
        return f"not checked: {e}"
    print(f"check-backends: {summary(record)}")
    return summary(record)


def _texts(data, split: str) -> tuple[list[str], list[str]]:
    """The source and reference lines of a prepared split."""
    ids = data.split(split)
    return [ids.src_text(i) for i in range(len(ids))], [ids.tgt_text(i) for i in range(len(ids))]


def _score(evaluate_model, translator, data, split: str, decode: dict, hyp_path: Path | None = None) -> dict:
    sources, refs = _texts(data, split)
    start = time.perf_counter()
    result = evaluate_model(translator, sources, refs, lang=data.manifest["tgt_lang"], search=SearchOptions(**decode))
    result["decode_wall_s"] = round(time.perf_counter() - start, 1)
    hyps = result.pop("hypotheses")
    if hyp_path is not None:
        hyp_path.write_text("".join(h + "\n" for h in hyps))
    return {k: v for k, v in result.items() if not k.endswith("_detail")}


def _train_summary(run_dir: Path) -> dict[str, Any]:
    summary: dict[str, Any] = {}
    path = run_dir / "metrics.jsonl"
    if path.is_file():
        for line in path.read_text().splitlines():
            record = json.loads(line)
            if record.get("kind") == "end":
                summary.update({k: record[k] for k in ("step", "reason", "weights") if k in record})
    return summary


def _stage(name: str, what: str) -> None:
    print(f"\n== {name}: {what}", flush=True)


def results_table(results: dict[str, Any]) -> str:
    rows = [
        "| model | split | α | tok-lc BLEU | sacreBLEU | chrF | ref. ppl | decode s |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for name, splits in results["scores"].items():
        for split, s in splits.items():
            rows.append(
                f"| {name} | {split} | {s['alpha']} | {s['tok_lc_bleu']:.2f} | {s['bleu']:.2f} | {s['chrf']:.2f} | "
                f"{s.get('ref_perplexity', float('nan')):.2f} | {s['decode_wall_s']} |"
            )
    return "\n".join(rows)


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("config", type=Path, help="a recipe TOML file (see configs/)")
    p.add_argument("--set", action="append", default=[], metavar="SECTION.KEY=VALUE", help="override a key")
    p.add_argument("--resume", action="store_true", help="continue the run's training from its last checkpoint")
    p.add_argument(
        "--evaluate-only",
        action="store_true",
        help="a finished run: average and evaluate again (e.g. with other [evaluate] settings)",
    )


def run(args: argparse.Namespace) -> int:
    recipe = load_recipe(args.config, args.set)
    results = run_recipe(recipe, resume=args.resume, evaluate_only=args.evaluate_only)
    m = results["machine"]
    print(f"\n{results_table(results)}\n")
    by = "tok-lc BLEU" if results.get("chosen_by") == "tok_lc_bleu" else "sacreBLEU"
    steps = results["train"].get("step", "?")
    updates = (
        " + ".join(f"{s:,}" if isinstance(s, int) else "?" for s in steps) + " (members)"
        if isinstance(steps, list)
        else f"{steps}"
    )
    processes = f"{results['train_processes']} process(es)"
    if "members" in results:
        processes = f"{results['members']} members x {processes}"
    print(
        f"chosen on {recipe.evaluate.valid_split} {by}: {results['chosen']}; training {results['train_wall_s']} s "
        f"wall-clock, {updates} updates; {m['cpu']}, {processes} x {results['train_threads']} training thread(s), "
        f"{results['dtype']}, seed {results['seed']}"
    )
    ensemble = "".join(f" --ensemble {d}" for d in results.get("ensemble", []))
    print(f"model: {results['model']}{ensemble}   results: {recipe.out / 'results.json'}")
    sig = next(iter(next(iter(results["scores"].values())).values()))
    print(f"sacreBLEU signature: {sig['bleu_signature']}")
    return 0
