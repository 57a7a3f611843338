"""Subword vocabularies: SentencePiece BPE with fixed special-token ids.

Special ids, the same in every vocabulary and in :class:`~transduce.model.ModelConfig`:
pad = 0, unk = 1, bos = 2, eos = 3.

A vocabulary directory holds ``vocab.json`` (what is shared, sizes) and one
SentencePiece model per side: ``shared.model`` (the paper's shared BPE, §5.1),
or ``src.model`` and ``tgt.model``.
"""

from __future__ import annotations

import io
import json
import unicodedata
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable

import sentencepiece as spm

PAD_ID, UNK_ID, BOS_ID, EOS_ID = 0, 1, 2, 3


class Vocab:
    """One SentencePiece model. ``encode`` adds neither bos nor eos."""

    pad_id, unk_id, bos_id, eos_id = PAD_ID, UNK_ID, BOS_ID, EOS_ID

    def __init__(self, model_proto: bytes):
        self.proto = model_proto
        self.sp = spm.SentencePieceProcessor(model_proto=model_proto)

    @classmethod
    def train(cls, sentences: Iterable[str], size: int) -> "Vocab":
        """Train a BPE model of ``size`` pieces on already NFC-normalised sentences.

        Every sentence is used in the given order (no sampling, no shuffling) and BPE
        merges are deterministic, so the same input gives a byte-identical model.
        Text is kept as is (identity normalisation, spaces preserved) so decoding
        returns the input exactly for text in the training alphabet.
        """
        buffer = io.BytesIO()
        spm.SentencePieceTrainer.train(
            sentence_iterator=iter(sentences), model_writer=buffer, vocab_size=size, model_type="bpe",
            pad_id=PAD_ID, unk_id=UNK_ID, bos_id=BOS_ID, eos_id=EOS_ID,
            character_coverage=1.0, normalization_rule_name="identity", remove_extra_whitespaces=False,
            input_sentence_size=0, shuffle_input_sentence=False,
            num_threads=1, minloglevel=2, hard_vocab_limit=False,
        )
        return cls(buffer.getvalue())

    @classmethod
    def load(cls, path: str | Path) -> "Vocab":
        return cls(Path(path).read_bytes())

    def save(self, path: str | Path) -> None:
        Path(path).write_bytes(self.proto)

    def __len__(self) -> int:
        return self.sp.get_piece_size()

    def encode(self, text: str) -> list[int]:
        """NFC-normalise and encode one sentence to ids (no bos/eos)."""
        return self.sp.encode(unicodedata.normalize("NFC", text))

    def encode_batch(self, texts: list[str]) -> list[list[int]]:
        return self.sp.encode([unicodedata.normalize("NFC", t) for t in texts])

    def decode(self, ids: Iterable[int]) -> str:
        """Ids -> text; special tokens are dropped."""
        return self.sp.decode([i for i in ids if i > EOS_ID])

    def pieces(self, ids: Iterable[int]) -> list[str]:
        """Readable subword strings for ids (e.g. axis labels)."""
        return [self.sp.id_to_piece(int(i)) for i in ids]


@dataclass
class Vocabs:
    """The source and target vocabularies; the same object twice when shared."""

    src: Vocab
    tgt: Vocab

    @property
    def shared(self) -> bool:
        return self.src is self.tgt

    def save(self, directory: str | Path) -> None:
        directory = Path(directory)
        directory.mkdir(parents=True, exist_ok=True)
        if self.shared:
            self.src.save(directory / "shared.model")
        else:
            self.src.save(directory / "src.model")
            self.tgt.save(directory / "tgt.model")
        meta = {"shared": self.shared, "src_size": len(self.src), "tgt_size": len(self.tgt),
                "pad_id": PAD_ID, "unk_id": UNK_ID, "bos_id": BOS_ID, "eos_id": EOS_ID}
        (directory / "vocab.json").write_text(json.dumps(meta, indent=2) + "\n")

    @classmethod
    def load(cls, directory: str | Path) -> "Vocabs":
        directory = Path(directory)
        meta_path = directory / "vocab.json"
        if not meta_path.is_file():
            raise FileNotFoundError(f"{meta_path}: missing vocabulary description")
        meta = json.loads(meta_path.read_text())
        if meta.get("shared"):
            shared = Vocab.load(_need(directory / "shared.model"))
            return cls(shared, shared)
        return cls(Vocab.load(_need(directory / "src.model")), Vocab.load(_need(directory / "tgt.model")))


def _need(path: Path) -> Path:
    if not path.is_file():
        raise FileNotFoundError(f"{path}: missing vocabulary file")
    return path
