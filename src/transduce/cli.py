"""The ``transduce`` command: one subcommand per job, each defined in the module that does it.

Each subcommand module has ``add_arguments(parser)`` and ``run(args) -> int``; it is
imported only when chosen, so ``transduce --help`` stays fast.
"""

from __future__ import annotations

import argparse
import importlib
import os
import sys

from .config import ConfigError

# name -> (module, one-line help)
COMMANDS: dict[str, tuple[str, str]] = {
    "info": ("transduce.info", "show a preset or config: sizes, parameter counts, settings"),
    "prepare": ("transduce.data.prepare", "build a data directory: corpora, BPE vocabulary, token-id cache"),
    "train": ("transduce.train.cli", "train a model from a prepared data directory"),
    "average": ("transduce.train.average", "average the last N checkpoints into a model directory"),
    "translate": ("transduce.translate", "translate files or stdin with a model directory"),
    "score": ("transduce.score", "log-probability of given translations under a model, one per line"),
    "evaluate": ("transduce.evaluate", "score translations: sacreBLEU, chrF, tokenized BLEU, perplexity"),
    "attention": ("transduce.viz.attention", "draw attention heatmaps for a sentence"),
    "plot": ("transduce.viz.plots", "plot the paper's arguments: positions, schedule, masks, curves"),
    "complexity": ("transduce.viz.complexity", "measure Table 1: cost of attention, recurrent, convolutional layers"),
    "serve": (
        "transduce.serve.command",
        "serve models over HTTP: the LibreTranslate API, its own API under /v1, a web page",
    ),
    "detect": ("transduce.langid", "identify the language of each line of text (offline, py3langid)"),
    "export": (
        "transduce.interop.export",
        "export a model directory to CTranslate2, HuggingFace MarianMT or an Argos Translate package",
    ),
    "import": (
        "transduce.import_model",
        "import an Argos Translate package (a file, or argos:FROM-TO from its index), or an OPUS-MT or MarianMT "
        "model: a directory, a release .zip, a hub name",
    ),
    "check-backends": ("transduce.check_backends", "score int8 decoding against fp32 and record it in the model dir"),
    "recipe": ("transduce.recipe", "prepare, train, average and evaluate from one recipe TOML"),
    "study": ("transduce.study.sweep", "the paper's Table 3 in miniature: train its variations, tabulate, plot"),
    "demo": ("transduce.demo", "the demo: Bible en-de from PyPI, trained for minutes, scored, shown"),
}


TRAINING = ("train", "recipe", "demo")  # commands that train: re-run with jemalloc preloaded (allocator.py)
# commands that decode: batch-invariant decoding needs MKL's strict reproducibility mode, which MKL reads at its
# first call, so it is set before the command imports torch (a value the user set is kept). On Intel CPUs MKL's
# sgemm picks other kernels for a few rows (rows 1-8 of a 256-wide input rounded differently from the same rows
# inside 64); strict mode stops that. Measured cost: none at batch 64, ~3 µs on a 4-row call.
DECODING = ("translate", "evaluate", "serve", "check-backends", "recipe", "demo", "attention", "export")
# commands that train: oneDNN, which runs PyTorch's bf16 matmuls on CPU, builds (JIT-compiles) a primitive for
# each new shape and keeps 1,024 of them by default. Batches of varying length make thousands of shapes (the demo:
# a few thousand in its first 300 updates), so with the default most updates rebuilt some: ~30 ms of a ~190 ms
# update on one core of an Intel Xeon with AMX (ONEDNN_VERBOSE=all). Kept for good, they made the demo's update ~10%
# faster, its two training processes then holding 2.5-2.8 GB each (docs/performance.md). A value the user set is kept.
ONEDNN_CACHE = "16384"


def main(argv: list[str] | None = None) -> int:
    if argv is None and any(a in TRAINING for a in sys.argv[1:2]):  # the process's own command line only
        from .allocator import reexec_with_jemalloc

        reexec_with_jemalloc()
    argv = sys.argv[1:] if argv is None else argv
    if any(a in DECODING for a in argv[:1]):
        os.environ.setdefault("MKL_CBWR", "AUTO,STRICT")
    if any(a in TRAINING for a in argv[:1]):
        os.environ.setdefault("ONEDNN_PRIMITIVE_CACHE_CAPACITY", ONEDNN_CACHE)
    parser = argparse.ArgumentParser(prog="transduce", description=__doc__.splitlines()[0])
    parser.add_argument("--version", action="version", version=f"transduce {_version()}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    chosen = next((a for a in argv if not a.startswith("-")), None)
    for name, (module, help_text) in COMMANDS.items():
        p = sub.add_parser(name, help=help_text, description=help_text)
        if name == chosen:
            importlib.import_module(module).add_arguments(p)
    args = parser.parse_args(argv)
    if args.command is None:
        parser.print_help()
        return 2
    try:
        return int(importlib.import_module(COMMANDS[args.command][0]).run(args) or 0)
    except (ConfigError, FileNotFoundError, ValueError) as e:
        print(f"transduce {args.command}: error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130


def _version() -> str:
    from . import __version__

    return __version__


if __name__ == "__main__":
    sys.exit(main())
