"""``transduce translate``: files or stdin in, one translation per input line out.

    transduce translate --model DIR [FILE ...] [--beam 4 --alpha 0.6 ...] > out.txt
    transduce translate --model DIR                  # a prompt when stdin is a terminal
    transduce translate --model DIR --input report.docx --output report.de.docx

With ``--nbest N`` (N > 1) each input line gives N lines in the Moses n-best format
``LINE ||| translation ||| score`` (LINE counts from 0; an empty input line has one empty
hypothesis); ``--scores`` prefixes each 1-best line with its score and a tab. ``--mbr N`` outputs,
for each line, the one of the beam's N best that the others agree with most (minimum Bayes risk,
:mod:`~transduce.decode.mbr`); ``--rerank N --channel DIR`` the one of them that a target→source
model also scores well (noisy channel, :mod:`~transduce.decode.rerank`).

``--document`` translates plain text with paragraphs instead of lines (:mod:`~transduce.text.document`).
Either way the input is read, translated and written ``--chunk`` sentences at a time
(:mod:`~transduce.text.streaming`), with a progress bar when stderr is a terminal. ``--format html``
keeps inline markup (:mod:`~transduce.text.markup`), ``--alignments`` appends Pharaoh word alignments
(:mod:`~transduce.decode.align`), ``--glossary`` / ``--constraints`` require target terms
(:mod:`~transduce.text.terminology`). ``--input FILE --output OUT`` translates one .txt, .html, .srt,
.docx, .pptx, .odt or .odp file with its structure kept (:mod:`~transduce.text.files`), written whole
or not at all. The user guide is docs/documents.md.

The search options are every decoding command's (:func:`~transduce.decode.search_options.add_search_arguments`);
what combines with what is the library's to say (:meth:`~transduce.decode.search_options.SearchOptions.check`,
:mod:`transduce.text`), and this command refuses only what it cannot write: line mode's extras (scores,
alignments, per-line constraints) in a translated text.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

import torch

from .backends.options import add_backend_arguments, backend_from_args
from .backends.policy import for_python_model
from .decode.align import pharaoh
from .decode.search_options import SearchOptions, add_search_arguments, as_flags
from .text import files as files_
from .text import streaming as stream_
from .text.document import reassemble, sentences, source_language, split_text
from .text.markup import translate_html, translate_html_batch


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("files", nargs="*", help="input files, one sentence per line (default: stdin)")
    p.add_argument("--model", required=True, help="model directory")
    p.add_argument("--ensemble", nargs="+", default=[], metavar="DIR", help="more model directories to ensemble")
    p.add_argument("--output", "-o", help="write here instead of stdout")
    add_search_arguments(p.add_argument_group("search (defaults: the paper, §6.1)"))
    lines = p.add_argument_group("line mode's output")
    lines.add_argument("--scores", action="store_true", help="prefix each line with its score and a tab")
    lines.add_argument(
        "--alignments",
        action="store_true",
        help="append ' ||| ' and word alignments in Pharaoh format (src-tgt) to each translation",
    )
    lines.add_argument(
        "--alignment-layer",
        type=int,
        default=None,
        metavar="L",
        help="decoder layer (from 0) whose attention aligns (default: the last)",
    )
    run_ = p.add_argument_group("running")
    run_.add_argument("--batch-tokens", type=int, default=4096, help="padded source tokens per batch")
    run_.add_argument("--batch-size", type=int, default=None, help="at most this many sentences per batch")
    run_.add_argument("--device", default="cpu")
    run_.add_argument(
        "--threads",
        type=int,
        default=1,
        help="CPU threads; 1 (default) is bit-exactly batch-invariant, more may change last bits",
    )
    add_backend_arguments(run_)
    run_.add_argument(
        "--target-lang",
        metavar="CODE",
        help="multilingual models: the target language, as its >>CODE<< token (e.g. deu, fra)",
    )
    run_.add_argument("--no-truncate", action="store_true", help="error on inputs longer than the model allows")
    run_.add_argument("--stats", action="store_true", help="print sentences/s and tokens/s to stderr")
    run_.add_argument(
        "--chunk",
        type=int,
        default=stream_.DEFAULT_CHUNK,
        metavar="N",
        help="read, translate and write about N sentences at a time (memory does not grow "
        "with the input; the output does not depend on N)",
    )
    _add_text_arguments(p)


def _add_text_arguments(p: argparse.ArgumentParser) -> None:
    """Terms, documents, HTML and files (docs/documents.md)."""
    terms = p.add_argument_group("terminology (docs/documents.md)")
    terms.add_argument(
        "--glossary",
        metavar="TSV",
        help="'source term<TAB>target term' lines: the target term is required wherever the source "
        "term occurs (constrained beam search)",
    )
    terms.add_argument(
        "--constraints",
        action="store_true",
        help="input lines are 'sentence<TAB>term<TAB>term...': each term must appear in the output",
    )
    doc = p.add_argument_group("documents (docs/documents.md)")
    doc.add_argument(
        "--document",
        action="store_true",
        help="plain text with paragraphs: split into sentences, keep paragraphs and whitespace",
    )
    doc.add_argument(
        "--format",
        choices=["text", "html"],
        default="text",
        help="html: keep inline tags, placed by word alignment; each input line is one HTML "
        "snippet, or with --document the whole input is one HTML document",
    )
    doc.add_argument(
        "--input",
        metavar="FILE",
        help="one file translated with its structure kept, its format by suffix: "
        f"{' '.join(files_.SUFFIXES)} (docs/documents.md); needs --output",
    )
    doc.add_argument(
        "--lang", default=None, help="source language for sentence splitting (default: the model's src_lang, else en)"
    )


def _options(args, search: SearchOptions) -> dict:
    """The keyword arguments of :meth:`Translator.translate` (and of the text functions around it) the flags
    give; streamed lines and documents take :class:`Translation` s (scores, tokens counted), with alignments
    when asked."""
    options = dict(
        search=search,
        batch_tokens=args.batch_tokens,
        batch_size=args.batch_size,
        truncate=not args.no_truncate,
        target_lang=args.target_lang,
    )
    if _mode(args) in ("lines", "document"):
        options["return_scores"] = True
    if args.alignments:
        options.update(alignments=True, alignment_layer=args.alignment_layer)
    return options


def _mode(args) -> str:
    """What is written: a translated ``file`` (--input), ``html``, a ``document``, or ``lines`` (line mode)."""
    if args.input is not None:
        return "file"
    if args.format == "html":
        return "html"
    return "document" if args.document else "lines"


def _check(args, search: SearchOptions) -> None:
    """Before the model loads: the inputs are there and the flags say one thing. A translated text (a file,
    HTML, a document) holds one translation per sentence (the library's rule: :meth:`SearchOptions.check`)
    and none of line mode's extras; terms go through constrained search (its rule too)."""
    if args.chunk < 1:
        raise ValueError(f"--chunk must be at least 1, got {args.chunk}")
    for path in args.files:
        suffix = Path(path).suffix.lower()
        if suffix in files_.OFFICE or suffix in files_.NOT_SUPPORTED:
            files_.suffix_of(path)  # an unsupported one says so
            raise ValueError(
                f"{path} is a {suffix} file, not lines of text: translate it with --input {path} --output FILE"
            )
    mode = _mode(args)
    if mode == "file":
        _check_input(args)
    flag = {"file": "--input", "html": "--format html", "document": "--document"}.get(mode, "")
    with as_flags():
        search.check(one=flag, constrained=bool(args.glossary or args.constraints))
    if mode == "lines":
        return
    extras = (("--scores", args.scores), ("--alignments", args.alignments), ("--constraints", args.constraints))
    used = [name for name, on in extras if on]
    if used:
        raise ValueError(f"{flag} writes a translated text, not lines: {', '.join(used)} go with line mode only")
    if args.glossary and mode != "document":
        raise ValueError(f"{flag}: this translation takes no glossary (--glossary: line mode and --document)")


def _reads_attention(args) -> bool:
    """A job that reads one PyTorch model's attention or steps: alignments, HTML tags, markup in a file, terms."""
    if args.input is not None:
        return files_.suffix_of(args.input) not in (".txt", ".srt")
    return bool(args.alignments or args.format == "html" or args.glossary or args.constraints)


def run(args) -> int:
    from .api import load

    search = SearchOptions.from_args(args)
    _check(args, search)
    options = _options(args, search)
    backend = backend_from_args(args)
    if _reads_attention(args):
        backend = for_python_model(backend)  # auto: fp32 (backends/policy.py)
    torch.set_num_threads(args.threads)
    translator = load(args.model, args.device, ensemble=args.ensemble, channel=args.channel, backend=backend)
    print(f"transduce translate: {translator.fast_paths.line()}", file=sys.stderr)
    if args.input is not None:
        return _translate_structured(translator, options, args)
    if not args.files and sys.stdin.isatty():
        return _interactive(translator, options, args)
    out = open(args.output, "w", encoding="utf-8") if args.output else sys.stdout
    stats = stream_.StreamStats()
    try:
        for path in args.files or [None]:
            part = _translate_file(translator, options, args, path, out)
            stats.sentences += part.sentences
            stats.tokens += part.tokens
            stats.seconds += part.seconds
    finally:
        if args.output:
            out.close()
    if args.stats:
        seconds = max(stats.seconds, 1e-9)
        print(
            f"transduce translate: {stats.sentences} sentences, {stats.tokens} output tokens (with eos) in "
            f"{stats.seconds:.2f} s: {stats.sentences / seconds:.1f} sentences/s, {stats.tokens / seconds:.1f} "
            f"tokens/s ({torch.get_num_threads()} threads, {translator.fast_paths.decoder.name}, beam {search.beam})",
            file=sys.stderr,
        )
    return 0


def _check_input(args) -> None:
    """``--input FILE``'s checks: the file is there, the output another file, and no other input or format."""
    files_.suffix_of(args.input)
    if args.output is None:
        raise ValueError(f"--input {args.input} needs --output FILE (where the translated file is written)")
    source, target = Path(args.input), Path(args.output)
    if not source.is_file():
        raise FileNotFoundError(f"--input {args.input}: no such file")
    if source.resolve() == target.resolve() or (target.exists() and target.samefile(source)):
        raise ValueError(f"--output {args.output} is the input file: write the translation to another file")
    given = [("input files", args.files), ("--document", args.document), ("--format html", args.format == "html")]
    used = [name for name, on in given if on]
    if used:
        raise ValueError(f"--input translates one file, its format by its suffix: not with {', '.join(used)}")


def _translate_structured(translator, options: dict, args) -> int:
    """``--input FILE --output OUT``: the file translated with its structure kept (:mod:`transduce.text.files`),
    written to a temporary file beside OUT and renamed onto it, so OUT is never half written."""
    data = Path(args.input).read_bytes()
    done = files_.translate_file(translator, data, args.input, args.lang, **options)
    target = Path(args.output)
    tmp = target.with_name(f".{target.name}.{os.getpid()}.part")
    try:
        tmp.write_bytes(done.data)
        os.replace(tmp, target)
    finally:
        tmp.unlink(missing_ok=True)
    plural = lambda n, word: f"{n} {word}{'' if n == 1 else 's'}"  # noqa: E731
    counts = f"{plural(len(done.units.texts), done.units.kind)}, {plural(done.sentences, 'sentence')}"
    print(f"transduce translate: {args.input} -> {args.output}: {counts}", file=sys.stderr)
    return 0


def format_results(results: list, nbest: int, scores: bool, first_line: int = 0) -> list[str]:
    if nbest > 1:
        return [
            f"{first_line + i} ||| {t.text} ||| {t.score:.4f}{_alignment(t)}"
            for i, hyps in enumerate(results)
            for t in hyps
        ]
    return [(f"{t.score:.4f}\t{t.text}" if scores else t.text) + _alignment(t) for t in results]


def _alignment(t) -> str:
    """`` ||| 0-0 1-2`` for a translation carrying an alignment, else nothing."""
    return "" if getattr(t, "alignment", None) is None else f" ||| {pharaoh(t.alignment)}"


def _translate_file(translator, options: dict, args, path: str | None, out) -> stream_.StreamStats:
    """Stream one input (a file, or stdin for None / '-') to ``out``."""
    stdin = path in (None, "-")
    name = "<stdin>" if stdin else str(path)
    f = sys.stdin.buffer if stdin else open(path, "rb")
    try:
        total = None if stdin else Path(path).stat().st_size
        if args.format == "html":
            return _translate_html(translator, options, args, f, name, out)
        if args.document:
            units = stream_.document_units(f, name, args.lang or source_language(translator))
        else:
            units = stream_.line_units(f, name)
        return _stream(_translate_fn(translator, options, args), units, out, _renderer(args), args, name, total)
    finally:
        if not stdin:
            f.close()


def _translate_fn(translator, options: dict, args):
    """``batch -> results``: plain, or with the glossary and per-line constraints (constrained search)."""
    if not (args.glossary or args.constraints):
        return lambda batch: translator.translate(batch, **options)
    from .text.terminology import Glossary, translate_with_terms

    glossary = Glossary.load(args.glossary, translator.vocabs.src.lowercase) if args.glossary else None

    def translate(batch):
        if args.constraints:
            fields = [line.split("\t") for line in batch]
            batch, constraints = [f[0] for f in fields], [[t for t in f[1:] if t.strip()] for f in fields]
        else:
            constraints = None
        return translate_with_terms(translator, batch, constraints, glossary=glossary, **options)

    return translate


def _translate_html(translator, options: dict, args, f, name: str, out) -> stream_.StreamStats:
    """``--format html``: one snippet per line (streamed), or with ``--document`` the whole input as one."""
    html_options = dict(options, lang=args.lang, alignment_layer=args.alignment_layer)
    if args.document:
        text = "".join(stream_.decoded_lines(f, name))  # one document: held in memory whole
        out.write(translate_html(translator, text, **html_options))
        out.flush()
        return stream_.StreamStats(sentences=1)

    def translate(batch):
        return translate_html_batch(translator, batch, **html_options)

    def render(unit, results, first):
        return "".join(r + "\n" for r in results)

    total = None if name == "<stdin>" else Path(name).stat().st_size
    return _stream(translate, stream_.line_units(f, name), out, render, args, name, total)


def _stream(translate, units, out, render, args, name: str, total: int | None) -> stream_.StreamStats:
    """:func:`stream_.translate_stream` with a progress bar over ``total`` input bytes on a terminal."""
    bar = stream_.progress_bar(total)
    try:
        return stream_.translate_stream(translate, units, out, render, args.chunk, name, bar)
    finally:
        if bar is not None:
            bar.close()


def _renderer(args):
    """How a unit and its results are written: a document's text, or line mode's formats."""
    if args.document:
        return lambda unit, results, first: reassemble(unit.pieces, [r.text for r in results])

    def line(unit, results, first):
        return "".join(text + "\n" for text in format_results(results, args.nbest, args.scores, first))

    return line


def _interactive(translator, options: dict, args) -> int:
    """A prompt: each typed line is translated as the flags say (a paragraph with --document, HTML with
    --format html, with the glossary or constraints when given)."""
    print("type a sentence and Enter; Ctrl-D ends", file=sys.stderr)
    translate = _translate_fn(translator, options, args)
    n = 0
    while True:
        try:
            line = input("> ")
        except EOFError:
            print(file=sys.stderr)
            return 0
        if args.format == "html":
            texts = translate_html_batch(translator, [line], **dict(options, lang=args.lang))
        elif args.document:
            pieces = split_text(line, args.lang or source_language(translator))
            texts = [reassemble(pieces, [r.text for r in translate(sentences(pieces))])]
        else:
            texts = format_results(translate([line]), args.nbest, args.scores, n)
        for text in texts:
            print(text, flush=True)
        n += 1
