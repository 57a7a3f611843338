"""The paper's search (§6.1) and the Translator: text in, text out, whatever runs the decoder step.

translator.py     — Translator: encode, batch (batch-invariant), search, choose, detokenise; Translation
search.py         — greedy, beam search, sampling, and ``search()``, the one door to them and to constraints
search_options.py — SearchOptions (beam, alpha, length limits, n-best, sampling, MBR, reranking), its rules
                    and its doors: add_search_arguments / from_args (commands), from_request (the server)
step.py           — the decoder-step contract (DecoderStep, a typing.Protocol with shapes)
hypothesis.py     — Hypothesis, the length penalty and the length limit every search shares
constraints.py    — lexically constrained beam search (dynamic beam allocation); Constraints
ensemble.py       — several models decoded in lockstep, log-probabilities averaged
mbr.py            — minimum Bayes risk choice among the beam's candidates
rerank.py         — noisy-channel reranking with a target→source model
align.py          — word alignments from encoder–decoder attention (Pharaoh format)

What runs a step (fp32, bf16, int8, the C++ step) is :mod:`transduce.backends`; the text around translation
(documents, streaming, HTML, terminology) is :mod:`transduce.text`; the commands are ``transduce/translate.py``
and ``transduce/score.py``. Python users start from ``transduce.load(model_dir)`` (transduce/api.py).
"""
