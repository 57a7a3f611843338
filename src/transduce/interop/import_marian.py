"""``transduce import SOURCE --out MODELDIR``: an OPUS-MT / Marian model or an Argos Translate package ->
a transduce model directory.

SOURCE is an Argos Translate package (an ``.argosmodel`` file or an installed package folder; see
interop/argos.py) or the name of one in the Argos package index (``argos:en-de``; interop/argos_index.py),
a MarianMT directory (config.json, model.safetensors, source/target.spm, vocab.json), a native
Marian release (a .npz, decoder.yml, *.vocab.yml, source/target.spm) as a directory or a .zip, a URL of
such a .zip, or a HuggingFace hub name (``Helsinki-NLP/opus-mt-en-de``, or ``opus-mt-en-de``); see
interop/fetch.py. Nothing read executes code: safetensors, .npz without pickles, JSON and safe YAML.
OPUS-MT models are the paper's base architecture. ``--out`` must be a new or empty folder, or (with ``--force``)
a model directory to replace; the model is written to a temporary folder beside it and renamed into place.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from ..modeldir import CONFIG, save_model_dir
from .argos_index import DEFAULT_INDEX, INDEX_ENV, fetch_by_name, is_argos_name
from .fetch import DEFAULT_MODEL_CACHE, resolve
from .marian import convert_release, read_marian_dir


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "source",
        help="an .argosmodel (or installed Argos package folder), argos:FROM-TO (a package from the Argos index), "
        "a MarianMT or native Marian directory, release .zip, URL, or hub name",
    )
    parser.add_argument("--out", required=True, type=Path, help="transduce model directory to write")
    parser.add_argument("--force", action="store_true", help="replace the model directory --out already holds")
    parser.add_argument(
        "--cache-dir",
        type=Path,
        default=DEFAULT_MODEL_CACHE,
        help=f"where downloads are kept (default {DEFAULT_MODEL_CACHE})",
    )
    parser.add_argument("--revision", help="hub only: a branch, tag or commit (default: main)")
    parser.add_argument(
        "--argos-index",
        metavar="URL|FILE",
        help=f"argos:FROM-TO only: the package index, a URL, a JSON file or its folder (default: argostranslate's, "
        f"${INDEX_ENV} + index.json if set, else {DEFAULT_INDEX})",
    )


def import_model(
    source: str | Path,
    cache_dir: Path = DEFAULT_MODEL_CACHE,
    revision: str | None = None,
    argos_index: str | None = None,
):
    """(model, vocabs, meta) for any SOURCE that ``transduce import`` takes."""
    from .argos import import_argos, is_argos_package
    from .marian_native import is_native_release, read_native_release

    cache_dir = Path(cache_dir).expanduser()
    if is_argos_name(str(source)):
        package, _, index = fetch_by_name(str(source), cache_dir, argos_index)
        model, vocabs, meta = import_argos(package)
        meta.update(imported_from=str(source), argos_index=index)
        return model, vocabs, meta
    if argos_index is not None:
        raise ValueError(f"--argos-index is for argos:FROM-TO sources, not {source}")
    if is_argos_package(Path(source).expanduser()):
        return import_argos(source)
    directory = resolve(str(source), cache_dir, revision)
    native = not (directory / "config.json").is_file() and is_native_release(directory)
    release = read_native_release(directory) if native else read_marian_dir(directory)
    model, vocabs, meta = convert_release(release)
    meta["imported_from"] = str(source) if not Path(source).exists() else meta["imported_from"]
    meta["import_format"] = "marian-npz" if native else "marianmt"
    return model, vocabs, meta


def check_out(out: Path, force: bool) -> None:
    """Refuse, before anything is read or downloaded, an ``--out`` that is a file, a folder holding other
    things, or (without ``--force``) a model directory already."""
    if not out.exists() or (out.is_dir() and not any(out.iterdir())):
        return
    if out.is_dir() and (out / CONFIG).is_file():
        if not force:
            raise ValueError(f"{out}: already holds a model; give --force to replace it, or another --out")
        return
    raise ValueError(f"{out}: exists and is not a model directory; give a new or empty folder as --out")


def run(args: argparse.Namespace) -> int:
    check_out(args.out, args.force)
    model, vocabs, meta = import_model(args.source, args.cache_dir, args.revision, args.argos_index)
    save_model_dir(args.out, model, vocabs, meta)
    cfg = model.config
    print(
        f"wrote {args.out}: {cfg.encoder_layers}/{cfg.decoder_layers} layers, d_model={cfg.d_model}, "
        f"vocab {cfg.vocab_size}/{cfg.target_vocab_size}, tie_embeddings={cfg.tie_embeddings}"
    )
    if meta.get("target_langs"):
        langs = meta["target_langs"]
        print(
            f"multilingual: {len(langs)} target languages ({', '.join(langs[:12])}{', ...' if len(langs) > 12 else ''});"
            " choose one with `transduce translate --target-lang CODE`"
        )
    if meta["spm_pieces_without_id"]:
        print(
            f"note: {meta['spm_pieces_without_id']} SentencePiece pieces have no id in the vocabulary "
            "(Marian and CTranslate2 map them to <unk>; transduce segments such text into smaller pieces)"
        )
    return 0
