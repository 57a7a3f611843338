"""Lexically constrained beam search: dynamic beam allocation (Hu et al., NAACL 2019; Post & Vilar 2018).

Each *constraint* is a target token sequence (a term) that the output must contain; a *prefix* is a
token sequence the output must start with. Plain beam search would let the terms fall out of the beam,
so, as in Post & Vilar's dynamic beam allocation (the variant of Hu et al.'s that fairseq's
``--constraints`` implements):

* every step, each hypothesis may extend with its ``beam`` best tokens *and* with the next token of each
  constraint it has not met (the next token of a term it is in the middle of, or a term's first token);
* a hypothesis tracks which terms it has met and how far into a term it is; leaving a term half-way
  drops that progress (the term must then start again);
* the ``beam`` slots are divided evenly over *banks*, hypotheses grouped by how many constraint tokens
  they have produced, so those that have met more terms are not crowded out by freer, higher-scoring
  ones; slots a bank cannot fill go to the best remaining candidates;
* eos is allowed only once every term is met; a prefix token is the only choice at its step.

It decodes one sentence at a time (``beam`` decoder rows), so it is slower than the batched
:func:`~transduce.decode.search.beam_search`; sentences without constraints or prefix use that instead.
Both are reached through :func:`~transduce.decode.search.search`, with :class:`Constraints` per sentence.
Scoring and stopping are those of §6.1's beam search (length penalty α, early stop with an exact bound).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from .hypothesis import Hypothesis, length_penalty, max_lengths
from .search_options import SearchOptions


@dataclass(frozen=True)
class _State:
    """Progress on the constraints: which are met, and (constraint, tokens produced) of one in progress."""

    met: tuple[bool, ...]
    active: tuple[int, int] | None = None
    just_met: bool = False  # the last token completed a term: the next must not continue its word

    def bank(self, constraints: list[list[int]]) -> int:
        """Constraint tokens produced: whole met terms plus the progress into the active one."""
        return sum(len(c) for c, m in zip(constraints, self.met) if m) + (self.active[1] if self.active else 0)

    def done(self) -> bool:
        return all(self.met)

    def wanted(self, constraints: list[list[int]]) -> set[int]:
        """Tokens that make progress: the active term's next token, any unmet term's first token."""
        out = {c[0] for c, m in zip(constraints, self.met) if not m}
        if self.active:
            c, k = self.active
            out.add(constraints[c][k])
        return out

    def advance(self, tok: int, constraints: list[list[int]]) -> _State:
        if self.active:
            c, k = self.active
            if constraints[c][k] == tok:
                if k + 1 < len(constraints[c]):
                    return _State(self.met, (c, k + 1))
                return _State(self.met[:c] + (True,) + self.met[c + 1 :], just_met=True)
        for c, (cons, m) in enumerate(zip(constraints, self.met)):
            if not m and cons[0] == tok:
                if len(cons) == 1:
                    return _State(self.met[:c] + (True,) + self.met[c + 1 :], just_met=True)
                return _State(self.met, (c, 1))
        return _State(self.met)


@dataclass
class _Hyp:
    tokens: list[int]
    logprob: float
    state: _State


@dataclass(frozen=True, eq=False)
class Constraints:
    """What one sentence's output must hold: every token sequence of ``terms``, and ``prefix`` first.

    ``continues_word`` (V,) bool marks subwords that continue a word (no leading ``▁``); they may not
    follow a completed term, so a term is a whole word in the output (not ``Katze`` + ``iten``)."""

    terms: list[list[int]]
    prefix: list[int] | None = None
    continues_word: Tensor | None = None


@torch.no_grad()
def constrained_search(model, src: Tensor, wanted: Constraints, options: SearchOptions) -> Hypothesis:
    """The best hypothesis for one sentence ``src`` (1, S) (ids + eos) that starts with ``wanted.prefix`` and
    contains every token sequence of ``wanted.terms``, by beam search with ``options`` (beam, alpha, length
    limits). The length limit a·|x| + b is raised to fit the prefix and the terms. Raises ``ValueError``
    when no such hypothesis ends within it."""
    cfg = model.config
    beam, alpha, max_len_a, max_len_b = options.beam, options.alpha, options.max_len_a, options.max_len_b
    continues_word = wanted.continues_word
    prefix = list(wanted.prefix or [])
    constraints = [c for c in wanted.terms if c]
    need = len(prefix) + sum(len(c) for c in constraints)
    limit = min(
        max(max_lengths(src, cfg.pad_id, max_len_a, max_len_b, cfg.max_positions - 1)[0], need + 1),
        cfg.max_positions - 1,
    )
    banks = sum(len(c) for c in constraints) + 1
    cache = model.init_cache(model.encode(src), 1)
    hyps = [_Hyp([], 0.0, _State((False,) * len(constraints)))]
    finished: list[Hypothesis] = []
    for t in range(limit + 1):
        tokens = torch.tensor([h.tokens[-1] if h.tokens else cfg.bos_id for h in hyps], device=src.device)
        lp = torch.log_softmax(model.decode_step(tokens, cache), dim=-1, dtype=torch.float32)  # (R, V)
        if continues_word is not None:
            ended = torch.tensor([h.state.just_met for h in hyps], device=lp.device)  # (R,)
            lp = lp.masked_fill(ended[:, None] & continues_word[None, :], float("-inf"))
        cands = _candidates(hyps, lp, constraints, prefix, t, t >= limit, beam, cfg.eos_id)
        live = []
        for row, tok, score in cands:
            h = hyps[row]
            if tok == cfg.eos_id:
                finished.append(Hypothesis(h.tokens, score, score / length_penalty(t + 1, alpha)))
            else:
                live.append((row, _Hyp(h.tokens + [tok], score, h.state.advance(tok, constraints))))
        live = _allocate(live, beam, banks, constraints)
        best = max(finished, key=lambda h: h.score, default=None)
        if not live or (best is not None and _cannot_beat(live, best, t, limit, alpha)):
            break
        rows = torch.tensor([row for row, _ in live] + [live[0][0]] * (beam - len(live)), device=src.device)
        cache.reorder(rows, beam=beam)  # always ``beam`` rows: unused ones repeat the first and are ignored
        hyps = [h for _, h in live] + [_Hyp(live[0][1].tokens, float("-inf"), live[0][1].state)] * (beam - len(live))
    if not finished:
        raise ValueError(f"no translation contains every constraint within {limit} tokens")
    return max(finished, key=lambda h: h.score)


def _candidates(
    hyps: list[_Hyp],
    lp: Tensor,
    constraints: list[list[int]],
    prefix: list[int],
    t: int,
    at_limit: bool,
    beam: int,
    eos: int,
) -> list[tuple[int, int, float]]:
    """(row, token, logprob) extensions: each row's ``beam`` best plus its constraint tokens; only the
    prefix token while in the prefix; eos only when all terms are met, and only eos at the limit."""
    out: dict[tuple[int, int], float] = {}
    for row, h in enumerate(hyps):
        if h.logprob == float("-inf"):
            continue
        if t < len(prefix):
            toks = {prefix[t]}
        elif at_limit:
            toks = {eos} if h.state.done() else set()
        else:
            toks = set(lp[row].topk(beam + 1).indices.tolist()) | h.state.wanted(constraints)
            if not h.state.done():
                toks.discard(eos)
        for tok in toks:
            out[(row, tok)] = h.logprob + float(lp[row, tok])
    return [(row, tok, score) for (row, tok), score in out.items() if score > float("-inf")]


def _allocate(
    live: list[tuple[int, _Hyp]], beam: int, banks: int, constraints: list[list[int]]
) -> list[tuple[int, _Hyp]]:
    """Dynamic beam allocation: the best ``beam // banks`` (at least 1) of each bank, the banks with more
    constraint tokens first (with more banks than slots, progress wins), then the best of the rest."""
    seen: dict[tuple[int, ...], tuple[int, _Hyp]] = {}
    for row, h in sorted(live, key=lambda x: -x[1].logprob):  # a token sequence reached twice: keep the better
        seen.setdefault(tuple(h.tokens), (row, h))
    ranked = list(seen.values())
    by_bank: dict[int, list[tuple[int, _Hyp]]] = {}
    for item in ranked:
        by_bank.setdefault(item[1].state.bank(constraints), []).append(item)
    quota = max(1, beam // banks)
    chosen = [item for bank in sorted(by_bank, reverse=True) for item in by_bank[bank][:quota]][:beam]
    taken = {id(item) for item in chosen}
    chosen += [item for item in ranked if id(item) not in taken][: beam - len(chosen)]
    return sorted(chosen, key=lambda x: -x[1].logprob)


def _cannot_beat(live: list[tuple[int, _Hyp]], best: Hypothesis, t: int, limit: int, alpha: float) -> bool:
    """No live hypothesis can end with a better score than ``best`` (log-probabilities only fall)."""
    top = max(h.logprob for _, h in live)
    return max(top / length_penalty(t + 2, alpha), top / length_penalty(limit + 1, alpha)) <= best.score
