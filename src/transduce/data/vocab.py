"""Subword vocabularies: SentencePiece BPE with fixed special-token ids.

Special ids, the same in every vocabulary and in :class:`~transduce.model.ModelConfig`:
pad = 0, unk = 1, bos = 2, eos = 3.

A vocabulary directory holds ``vocab.json`` (what is shared, sizes, lowercasing) and one
SentencePiece model per side: ``shared.model`` (the paper's shared BPE, §5.1),
or ``src.model`` and ``tgt.model``.

Other SentencePiece models enter this layout through :func:`reorder_spm` (imports of foreign models),
and a multilingual model's ``>>code<<`` pieces are its target languages (:func:`language_tokens`).

A *lowercasing* vocabulary (``prepare --lowercase``, how Multi30k papers prepare their text) is
trained on lowercased text and lowercases whatever it encodes, so a model trained with it sees the
same normalisation in training, evaluation, ``translate`` and the server. Its outputs are lowercase.
"""

from __future__ import annotations

import io
import json
import tempfile
import unicodedata
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path

import sentencepiece as spm

from ..config import ConfigError

PAD_ID, UNK_ID, BOS_ID, EOS_ID = 0, 1, 2, 3
BATCH_ENCODE = 64  # sentences from which sentencepiece's threaded batch encoding pays (encode_batch)
SPECIALS = {"pad": "<pad>", "unk": "<unk>", "bos": "<s>", "eos": "</s>"}  # the pieces of those ids


class Vocab:
    """One SentencePiece model. ``encode`` adds neither bos nor eos."""

    pad_id, unk_id, bos_id, eos_id = PAD_ID, UNK_ID, BOS_ID, EOS_ID

    def __init__(self, model_proto: bytes, lowercase: bool = False):
        self.proto = model_proto
        self.lowercase = lowercase
        self.sp = spm.SentencePieceProcessor(model_proto=model_proto)

    @classmethod
    def train(cls, sentences: Iterable[str], size: int, lowercase: bool = False) -> Vocab:
        """Train a BPE model of ``size`` pieces on already NFC-normalised sentences (see :meth:`train_files`)."""
        with tempfile.TemporaryDirectory() as tmp:
            path = Path(tmp) / "sentences.txt"
            with open(path, "w", encoding="utf-8", newline="") as f:
                f.writelines((s.lower() if lowercase else s) + "\n" for s in sentences)
            return cls.train_files([path], size, lowercase, already_lowercased=True)

    @classmethod
    def train_files(
        cls, paths: list[Path], size: int, lowercase: bool = False, already_lowercased: bool = False
    ) -> Vocab:
        """Train a BPE model of ``size`` pieces on the lines of ``paths`` (NFC text, one sentence a line).

        Every line is used in the given order (no sampling, no shuffling: :mod:`.staging` draws the
        sample) and BPE merges are deterministic, so the same input gives a byte-identical model.
        Text is kept as is (identity normalisation, spaces preserved) so decoding returns the input
        exactly for text in the training alphabet. ``lowercase``: a vocabulary that lowercases on
        encode, trained on ``str.lower()`` of each line (which keeps ß, unlike case folding); pass
        ``already_lowercased`` when the files are lowercased already.
        """
        buffer = io.BytesIO()
        if lowercase and not already_lowercased:
            raise ValueError("train_files(lowercase=True) needs lowercased files (already_lowercased=True)")
        spm.SentencePieceTrainer.train(
            sentence_iterator=_lines(paths),  # not input=: the model would record the paths
            model_writer=buffer,
            vocab_size=size,
            model_type="bpe",
            pad_id=PAD_ID,
            unk_id=UNK_ID,
            bos_id=BOS_ID,
            eos_id=EOS_ID,
            character_coverage=1.0,
            normalization_rule_name="identity",
            remove_extra_whitespaces=False,
            input_sentence_size=0,
            shuffle_input_sentence=False,
            num_threads=1,
            minloglevel=2,
            hard_vocab_limit=False,
        )
        return cls(buffer.getvalue(), lowercase)

    @classmethod
    def load(cls, path: str | Path, lowercase: bool = False) -> Vocab:
        return cls(Path(path).read_bytes(), lowercase)

    def save(self, path: str | Path) -> None:
        Path(path).write_bytes(self.proto)

    def __len__(self) -> int:
        return self.sp.get_piece_size()

    def normalize(self, text: str) -> str:
        """What the model sees of ``text``: NFC, and lowercased for a lowercasing vocabulary."""
        text = unicodedata.normalize("NFC", text)
        return text.lower() if self.lowercase else text

    def encode(self, text: str) -> list[int]:
        """Normalise and encode one sentence to ids (no bos/eos)."""
        return self.sp.encode(self.normalize(text))

    def encode_batch(self, texts: list[str]) -> list[list[int]]:
        """Normalise and encode sentences: one by one below :data:`BATCH_ENCODE` of them, where sentencepiece's
        batch call (which starts threads) costs more than it saves (~0.5 ms for one sentence against 15 µs)."""
        normalized = [self.normalize(t) for t in texts]
        if len(normalized) < BATCH_ENCODE:
            return [self.sp.encode(t) for t in normalized]
        return self.sp.encode(normalized)

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
        meta = {
            "shared": self.shared,
            "src_size": len(self.src),
            "tgt_size": len(self.tgt),
            "pad_id": PAD_ID,
            "unk_id": UNK_ID,
            "bos_id": BOS_ID,
            "eos_id": EOS_ID,
        }
        if self.src.lowercase or self.tgt.lowercase:
            meta["lowercase"] = True  # written only when set: older directories read as False
        (directory / "vocab.json").write_text(json.dumps(meta, indent=2) + "\n")

    @classmethod
    def load(cls, directory: str | Path) -> Vocabs:
        directory = Path(directory)
        meta_path = directory / "vocab.json"
        if not meta_path.is_file():
            raise FileNotFoundError(f"{meta_path}: missing vocabulary description")
        meta = json.loads(meta_path.read_text())
        lowercase = meta.get("lowercase", False)
        if not isinstance(lowercase, bool):
            raise ValueError(f"{meta_path}: 'lowercase' must be true or false, got {lowercase!r}")
        if meta.get("shared"):
            shared = Vocab.load(_need(directory / "shared.model"), lowercase)
            return cls(shared, shared)
        return cls(
            Vocab.load(_need(directory / "src.model"), lowercase), Vocab.load(_need(directory / "tgt.model"), lowercase)
        )

    @property
    def lowercase(self) -> bool:
        return self.src.lowercase


def _lines(paths: list[Path]) -> Iterator[str]:
    for path in paths:
        with open(path, "rb") as f:  # binary: only b"\n" ends a line (a text-mode file also splits at \r)
            for line in f:
                yield line.removesuffix(b"\n").decode()


def _need(path: Path) -> Path:
    if not path.is_file():
        raise FileNotFoundError(f"{path}: missing vocabulary file")
    return path


def language_tokens(vocab: Vocab) -> dict[str, int]:
    """Multilingual models' target-language tokens: ``{"deu": id of ">>deu<<", ...}`` (empty for others)."""
    out = {}
    for i in range(len(vocab)):
        piece = vocab.sp.id_to_piece(i)
        if piece.startswith(">>") and piece.endswith("<<") and len(piece) > 4:
            out[piece[2:-2]] = i
    return out


def reorder_spm(proto_bytes: bytes, order: list[str], where: str) -> tuple[bytes, list[str]]:
    """A SentencePiece model whose piece i is ``order[i]`` and whose specials sit at ids 0..3.

    Scores and types come from the original model, so segmentation is unchanged; pieces of
    ``order`` unknown to this model become UNUSED (never produced). Returns the new model
    and the original pieces that ``order`` lacks (they could not be given an id). What an import
    (``interop/``) makes of a foreign model's vocabulary.
    """
    from sentencepiece import sentencepiece_model_pb2 as spm_pb2  # protobuf: loaded only for an import

    model = spm_pb2.ModelProto()
    try:
        model.ParseFromString(proto_bytes)
    except Exception as e:  # protobuf's DecodeError
        raise ConfigError(f"{where}: not a SentencePiece model ({e})") from None
    old = {p.piece: p for p in model.pieces}
    kinds = {
        SPECIALS["pad"]: spm_pb2.ModelProto.SentencePiece.CONTROL,
        SPECIALS["unk"]: spm_pb2.ModelProto.SentencePiece.UNKNOWN,
        SPECIALS["bos"]: spm_pb2.ModelProto.SentencePiece.CONTROL,
        SPECIALS["eos"]: spm_pb2.ModelProto.SentencePiece.CONTROL,
    }
    new = spm_pb2.ModelProto()
    new.CopyFrom(model)
    del new.pieces[:]
    # Below every real score: BPE merges by score and would otherwise try an UNUSED piece first.
    floor = min((p.score for p in model.pieces), default=0.0) - 1000.0
    for piece in order:
        p = new.pieces.add()
        if piece in old:
            p.CopyFrom(old[piece])
        else:
            p.piece, p.score = piece, floor
            p.type = spm_pb2.ModelProto.SentencePiece.UNUSED
        if piece in kinds and p.type != kinds[piece]:
            p.type = kinds[piece]
    spec = new.trainer_spec
    wanted_spec = dict(
        pad_id=PAD_ID,
        unk_id=UNK_ID,
        bos_id=BOS_ID,
        eos_id=EOS_ID,
        vocab_size=len(order),
        pad_piece=SPECIALS["pad"],
        unk_piece=SPECIALS["unk"],
        bos_piece=SPECIALS["bos"],
        eos_piece=SPECIALS["eos"],
    )
    for field, value in wanted_spec.items():  # only what differs, so an unchanged model stays byte-identical
        if getattr(spec, field) != value:
            setattr(spec, field, value)
    wanted = set(order)
    dropped = [
        p.piece for p in model.pieces if p.piece not in wanted and p.type == spm_pb2.ModelProto.SentencePiece.NORMAL
    ]
    return new.SerializeToString(), dropped
