"""``transduce evaluate``: honest, labelled scores.

    transduce evaluate --hyp hyp.de --ref ref.de --lang de
    transduce evaluate --model DIR --src test.en --ref test.de [--beam 4 ...] [--json]

Reports
* **sacreBLEU** — cased, detokenised, sacreBLEU's own 13a tokenisation, with its signature;
* **chrF** (sacreBLEU, with its signature);
* **tok-lc BLEU** — the BLEU Multi30k papers report: Moses-tokenised (sacremoses) and
  lowercased BLEU-4, computed by sacreBLEU on those pre-tokenised strings with
  ``tokenize='none'``; comparable with published Multi30k tables, not with sacreBLEU;
* **tok BLEU, compounds split** — the figure the paper reports for WMT14 (tensor2tensor's
  ``get_ende_bleu.sh``): Moses-tokenised (escaping as ``tokenizer.perl``), cased, every hyphen between
  two non-spaces written ``##AT##-##AT##`` so a German compound counts as its parts, BLEU-4 as
  ``multi-bleu.perl`` (sacreBLEU with ``tokenize='none'``); comparable with the paper's 27.3 / 28.4;
* **reference perplexity** — exp(mean NLL per target token incl. eos) when a model is given.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path

from .backends.options import add_backend_arguments, backend_from_args
from .decode.search_options import SearchOptions, add_search_arguments
from .metrics import compound_split, moses_lower, score_translations  # noqa: F401 (this command's names)


def evaluate_model(translator, sources: list[str], refs: list[str], lang: str | None = None, **decode) -> dict:
    """Translate ``sources`` with ``translator`` (decode options as in ``Translator.translate``: ``search=``, ...)
    and score against ``refs``; adds reference perplexity. For the trainer and recipes."""
    if len(sources) != len(refs):
        raise ValueError(f"{len(sources)} source lines but {len(refs)} references")
    lang = lang or translator.meta.get("tgt_lang")
    if not lang:
        raise ValueError("the target language is unknown: give lang (--lang)")
    return score_outputs(translator, translator.translate(sources, **decode), sources, refs, lang)


def score_outputs(translator, hyps: list[str], sources: list[str], refs: list[str], lang: str) -> dict:
    """:func:`score_translations` of ``hyps`` (``translator``'s outputs for ``sources``) plus the
    reference perplexity under its model; the hypotheses are kept under ``"hypotheses"``."""
    return {
        **score_translations(hyps, refs, lang),
        **reference_perplexity(translator, sources, refs),
        "hypotheses": hyps,
    }


def reference_perplexity(translator, sources: list[str], refs: list[str]) -> dict:
    """``{"ref_perplexity", "ref_tokens"}`` under ``translator``'s model; empty for an ensemble."""
    if not hasattr(translator.model, "decode"):
        return {}
    nll, count = translator.reference_nll(sources, refs)
    return {"ref_perplexity": round(math.exp(nll / max(count, 1)), 3), "ref_tokens": count}


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--hyp", help="hypothesis file (one line per reference line)")
    p.add_argument("--ref", required=True, help="reference file")
    p.add_argument("--model", help="model directory: translate --src first")
    p.add_argument("--src", help="source file (with --model)")
    p.add_argument("--lang", help="target language for the Moses tokeniser (default: the model's tgt_lang)")
    p.add_argument("--batch-tokens", type=int, default=4096)
    add_search_arguments(p.add_argument_group("search (defaults: the paper, §6.1)"), modes=("mbr", "rerank"))
    p.add_argument("--device", default="cpu")
    add_backend_arguments(p)
    p.add_argument("--output", help="with --model: also write the translations here")
    p.add_argument("--json", action="store_true", help="print one JSON object")


def run(args) -> int:
    from .data.reading import read_lines

    refs = read_lines(args.ref).lines
    if (args.hyp is None) == (args.model is None):
        raise ValueError("give either --hyp or --model with --src")
    if args.hyp is not None:
        if not args.lang:
            raise ValueError("--lang (target language) is needed with --hyp")
        hyps = read_lines(args.hyp).lines
        if len(hyps) != len(refs):
            raise ValueError(f"{args.hyp} has {len(hyps)} lines but {args.ref} has {len(refs)}")
        result = score_translations(hyps, refs, args.lang)
    else:
        if args.src is None:
            raise ValueError("--model needs --src")
        from .api import load

        search = SearchOptions.from_args(args)
        src = read_lines(args.src).lines
        if len(src) != len(refs):
            raise ValueError(f"{args.src} has {len(src)} lines but {args.ref} has {len(refs)}")
        translator = load(args.model, args.device, channel=args.channel, backend=backend_from_args(args))
        print(f"transduce evaluate: {translator.fast_paths.line()}", file=sys.stderr)
        result = evaluate_model(
            translator,
            src,
            refs,
            args.lang,
            search=search,
            batch_tokens=args.batch_tokens,
        )
        hyps = result.pop("hypotheses")
        if args.output:
            Path(args.output).write_text("".join(h + "\n" for h in hyps), encoding="utf-8")
    if args.json:
        print(json.dumps(result, indent=2))
        return 0
    print(f"sacreBLEU   {result['bleu']:6.2f}  {result['bleu_signature']}")
    print(f"chrF        {result['chrf']:6.2f}  {result['chrf_signature']}")
    print(f"tok-lc BLEU {result['tok_lc_bleu']:6.2f}  ({result['tok_lc_bleu_note']})")
    print(f"tok BLEU    {result['tok_bleu_compound']:6.2f}  ({result['tok_bleu_compound_note']})")
    if "ref_perplexity" in result:
        print(f"ref ppl     {result['ref_perplexity']:8.3f}  over {result['ref_tokens']} reference tokens")
    print(result["bleu_detail"], file=sys.stderr)
    return 0
