"""Data diversification at BiT's switch: the model translates its own training split both ways.

``train.diversify`` (needs ``train.bidirectional``): when the run turns to source→target alone, the
model, trained on both directions so far, translates every training source forward and every training
target backward with greedy search. Training goes on over :class:`~transduce.data.diversified.Diversified`:
the original pairs, (x, f(x)) and (b(y), y) (Nguyen et al., NeurIPS 2020, with one model for both
directions). The time it takes counts in the budget like any update.

Each rank translates its share (every world_size-th pair) and the ranks exchange them, so all hold the
same split. Rank 0 stores it in RUN_DIR/diversified.safetensors, which a resumed run reads back.
An empty output, or one that runs to the length limit (``MAX_LEN_A``·|x| + ``MAX_LEN_B``) without ending,
is left out and counted.
"""

from __future__ import annotations

import copy
import os
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file

from ..data.dataset import ParallelIds, TokenArray
from ..decode.translator import Translator
from .distributed import Dist, gather

MAX_LEN_A, MAX_LEN_B = 1.5, 5  # the made translation's length limit: reaching it means it never ended
BATCH_TOKENS = 4096  # padded source tokens per decoding batch
FILE = "diversified.safetensors"
PARTS = {"both": ("forward", "backward"), "forward": ("forward",), "back": ("backward",)}  # train.diversify


def decoding_copy(model: torch.nn.Module, dtype: str) -> torch.nn.Module:
    """An eval-mode copy of ``model`` to translate with (bf16 when training is), leaving it untouched."""
    decoder = copy.deepcopy(model).eval()
    return decoder.to(torch.bfloat16) if dtype == "bf16" else decoder


def translate_ids(decoder: torch.nn.Module, sources: list[list[int]], eos_id: int,
                  device: torch.device) -> list[list[int] | None]:
    """Greedy translations of ``sources`` (ids without eos); None for an empty one or one cut at the
    length limit."""
    translator = Translator(decoder, vocabs=None, device=device)
    hyps = translator.search([s + [eos_id] for s in sources], beam=1, max_len_a=MAX_LEN_A, max_len_b=MAX_LEN_B,
                             batch_tokens=BATCH_TOKENS)
    out: list[list[int] | None] = []
    for src, (hyp,) in zip(sources, hyps):
        limit = int(MAX_LEN_A * len(src) + MAX_LEN_B)
        out.append(hyp.tokens if 0 < len(hyp.tokens) < limit else None)
    return out


def self_translate(model: torch.nn.Module, split: ParallelIds, parts: str, ctx: Dist, dtype: str,
                   device: torch.device) -> dict[str, list[list[int] | None] | None]:
    """``{"forward": f(x) per pair or None, "backward": b(y) per pair or None}`` for ``parts`` in
    ``"both"``, ``"forward"``, ``"back"``; the same on every rank."""
    eos, decoder = model.config.eos_id, decoding_copy(model, dtype)
    mine = list(range(ctx.rank, len(split), ctx.world_size))
    made: dict[str, list[list[int] | None] | None] = {"forward": None, "backward": None}
    for part, side in (("forward", split.src), ("backward", split.tgt)):
        if part not in PARTS[parts]:
            continue
        outputs = translate_ids(decoder, [side[i].tolist() for i in mine], eos, device)
        every: list[list[int] | None] = [None] * len(split)
        for rank, rank_outputs in enumerate(gather(outputs, ctx)):
            for i, ids in zip(range(rank, len(split), ctx.world_size), rank_outputs):
                every[i] = ids
        made[part] = every
    return made


def save(path: Path, made: dict[str, list[list[int] | None] | None]) -> None:
    """Write the made translations atomically (ids, offsets and a kept mask per part)."""
    tensors: dict[str, torch.Tensor] = {}
    for part, outputs in made.items():
        if outputs is None:
            continue
        arr = TokenArray.from_sentences([o if o is not None else [] for o in outputs])
        tensors[f"{part}.ids"], tensors[f"{part}.offsets"] = torch.from_numpy(arr.ids), torch.from_numpy(arr.offsets)
        tensors[f"{part}.kept"] = torch.tensor([o is not None for o in outputs], dtype=torch.bool)
    tmp = path.with_name(path.name + ".tmp")
    save_file(tensors, str(tmp))
    os.replace(tmp, path)


def load(path: Path, pairs: int) -> dict[str, list[list[int] | None] | None]:
    """What :func:`save` wrote, checked against the split's ``pairs``."""
    if not path.is_file():
        raise FileNotFoundError(f"{path}: the run switched to diversified data before this checkpoint, but the "
                                "made translations are missing; resume needs them (or start a new run)")
    tensors = load_file(str(path))
    made: dict[str, list[list[int] | None] | None] = {"forward": None, "backward": None}
    for part in made:
        if f"{part}.kept" not in tensors:
            continue
        ids, offsets = tensors[f"{part}.ids"].tolist(), tensors[f"{part}.offsets"].tolist()
        kept = tensors[f"{part}.kept"].tolist()
        if len(kept) != pairs:
            raise ValueError(f"{path}: {part} holds {len(kept)} sentences, the training split {pairs}")
        made[part] = [ids[offsets[i]:offsets[i + 1]] if kept[i] else None for i in range(pairs)]
    return made
