"""Validation BLEU during training (transduce.train.validate.bleu_hook)."""

from types import SimpleNamespace

import torch

import transduce.decode.translator as translator_module
from transduce.data.vocab import Vocab
from transduce.train.validate import bleu_hook

REFS = ["Und Gott sprach: Es werde Licht!", "Im Anfang schuf Gott den Himmel und die Erde."]


class _Split:
    def __len__(self):
        return len(REFS)

    def src_text(self, i):
        return f"source {i}"

    def tgt_text(self, i):
        return REFS[i]


class _LowercasingTranslator:
    """Stands in for the decoder: translates perfectly, in lowercase (as a lowercased model does)."""

    def __init__(self, model, vocabs, device):
        pass

    def translate(self, sources, options):
        return [r.lower() for r in REFS[: len(sources)]]


def _vocabs(lowercase: bool):
    vocab = Vocab.__new__(Vocab)  # normalize() needs only the flag, not a trained model
    vocab.lowercase = lowercase
    return SimpleNamespace(src=vocab, tgt=vocab)


def test_a_lowercasing_vocabulary_scores_against_lowercased_references(monkeypatch):
    monkeypatch.setattr(translator_module, "Translator", _LowercasingTranslator)
    model = torch.nn.Linear(1, 1)
    lowercased = bleu_hook(_Split(), _vocabs(True), 2, 1, torch.device("cpu"))(model)
    cased = bleu_hook(_Split(), _vocabs(False), 2, 1, torch.device("cpu"))(model)
    assert round(lowercased, 6) == 100.0  # the perfect lowercase translation is perfect against lowercased references
    assert cased < 50.0  # against cased references the same output loses every capitalised word
