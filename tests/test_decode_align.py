"""Word alignments, document mode, HTML and streaming with the real test model and the CLI."""

from __future__ import annotations

import re
from collections import Counter

import pytest

from transduce.cli import main
from transduce.decode.align import align_pieces, pharaoh, word_of_pieces
from transduce.text.document import reassemble, sentences, split_text, translate_document
from transduce.text.markup import parse, translate_html

SENTENCES = ["A dog runs in the park.", "Two men are sitting on a bench.", "A woman is cooking."]
PHARAOH = re.compile(r"^(\d+-\d+( \d+-\d+)*)?$")


def test_word_of_pieces_follows_the_space_marks():
    assert word_of_pieces(["▁A", "▁do", "g", ".", "▁", "(", "x", ")"]) == [0, 1, 1, 1, None, 2, 2, 2]


def test_align_pieces_takes_the_argmax_source_word_per_target_piece():
    import torch

    weights = torch.tensor([[0.1, 0.8, 0.1], [0.7, 0.2, 0.1], [0.2, 0.2, 0.6]])  # (T + 1, S): 2 pieces + eos
    assert align_pieces(weights, [0, 1], [0, 1]) == [(1, 0), (0, 1)]
    assert pharaoh([(1, 0), (0, 1)]) == "1-0 0-1"


def test_alignments_in_the_api_index_real_words(tiny_translator):
    out = tiny_translator.translate(SENTENCES, alignments=True)
    for src, t in zip(SENTENCES, out):
        assert t.alignment, t
        assert all(0 <= i < len(src.split()) and 0 <= j < len(t.text.split()) for i, j in t.alignment)
        assert {j for _, j in t.alignment} == set(range(len(t.text.split())))  # every target word aligned
    assert [t.text for t in out] == tiny_translator.translate(SENTENCES)  # alignments change no translation


def test_alignments_cli_format(tiny_model_dir, tmp_path, capsys):
    src = tmp_path / "in.txt"
    src.write_text("\n".join(SENTENCES + [""]) + "\n")
    assert main(["translate", "--model", str(tiny_model_dir), "--alignments", str(src)]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert len(lines) == 4
    for line in lines:
        text, links = line.split(" ||| ")
        assert PHARAOH.match(links), line
    assert lines[-1] == " ||| "


def test_document_mode_equals_line_mode_on_the_same_sentences(tiny_translator, tiny_model_dir, tmp_path, capsys):
    text = "  " + " ".join(SENTENCES[:2]) + "\n\n\n" + SENTENCES[2] + "  \n"
    pieces = split_text(text, "en")
    expected = reassemble(pieces, tiny_translator.translate(sentences(pieces)))
    assert translate_document(tiny_translator, text) == expected
    path = tmp_path / "doc.txt"
    path.write_text(text)
    assert main(["translate", "--model", str(tiny_model_dir), "--document", "--chunk", "1", str(path)]) == 0
    got = capsys.readouterr().out
    assert got == expected and got.startswith("  ") and "\n\n\n" in got and got.endswith("  \n")


def test_stream_chunk_size_does_not_change_line_mode(tiny_model_dir, tmp_path, capsys):
    path = tmp_path / "in.txt"
    path.write_text("\n".join(SENTENCES * 3) + "\n")
    outs = []
    for chunk in ("1", "4", "1000"):
        assert main(["translate", "--model", str(tiny_model_dir), "--chunk", chunk, str(path)]) == 0
        outs.append(capsys.readouterr().out)
    assert outs[0] == outs[1] == outs[2] and len(outs[0].splitlines()) == 9


def test_html_with_the_model_keeps_every_tag(tiny_translator):
    snippet = (
        '<p>A <b>dog</b> runs in the <a href="/park?a=1&amp;b=2">park</a>.</p>'
        "<p><i>Two men</i> are sitting on a bench.<br/>A woman &amp; a man.</p>"
    )
    out = translate_html(tiny_translator, snippet)
    parse(out)  # well-formed
    assert Counter(re.findall(r"<[^>]+>", out)) == Counter(re.findall(r"<[^>]+>", snippet))


@pytest.mark.parametrize(
    "flags, message",
    [
        (["--document", "--nbest", "2"], "--nbest must be 1: --document gets one translation per sentence"),
        (["--format", "html", "--scores"], "--format html writes a translated text, not lines: --scores"),
        (["--format", "html", "--alignments"], "--alignments go with line mode only"),
        (["--alignments", "--ensemble", "ENSEMBLE"], "alignments need a single model, not an ensemble"),
    ],
)
def test_unsupported_combinations_are_errors_with_the_reason(tiny_model_dir, tmp_path, capsys, flags, message):
    path = tmp_path / "in.txt"
    path.write_text("A dog.\n")
    flags = [str(tiny_model_dir) if f == "ENSEMBLE" else f for f in flags]
    assert main(["translate", "--model", str(tiny_model_dir), str(path), *flags]) == 2
    err = capsys.readouterr().err
    assert message in err, err


@pytest.mark.parametrize("flags", [["--alignments"], ["--format", "html"]])
def test_the_cpp_step_aligns_and_places_tags_as_the_python_step_does(tiny_model_dir, tmp_path, capsys, flags):
    """The C++ step records no attention; the alignments come from the PyTorch model it stands for."""
    path = tmp_path / "in.txt"
    path.write_text("A <b>dog</b> runs in the park.\nTwo men are sitting on a bench.\n")
    outs = []
    for backend in (["--backend", "fp32"], ["--native"]):
        assert main(["translate", "--model", str(tiny_model_dir), *flags, *backend, str(path)]) == 0
        outs.append(capsys.readouterr().out)
    assert outs[0] == outs[1] and len(outs[0].splitlines()) == 2
