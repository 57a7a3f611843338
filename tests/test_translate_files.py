"""``transduce translate --input FILE --output OUT``: every format that keeps its structure (the samples and
checks of tests/file_samples.py, as the server's /translate_file), written whole or not at all, and the
refusals: an unknown suffix, .epub, the input as output, a flag that does not fit."""

from __future__ import annotations

import pytest
from file_samples import check, sample

from transduce.cli import main


def cli(capsys, *argv) -> tuple[int, str]:
    code = main([str(a) for a in argv])
    return code, capsys.readouterr().err


@pytest.mark.parametrize("suffix", [".txt", ".srt", ".html", ".docx", ".pptx", ".odt", ".odp"])
def test_each_format_keeps_its_structure(suffix, tiny_model_dir, translator, tmp_path, capsys):
    source, target = tmp_path / f"in{suffix}", tmp_path / f"out{suffix}"
    source.write_bytes(sample(suffix))
    code, err = cli(capsys, "translate", "--model", tiny_model_dir, "--input", source, "--output", target)
    assert code == 0, err
    check(suffix, target.read_bytes(), translator)
    said = {".txt": "1 text, 3 sentences", ".srt": "2 cues, 2 sentences", ".html": "1 document, 2 sentences"}
    said.update({".docx": "2 paragraphs, 3 sentences", ".pptx": "1 paragraph, 1 sentence"})
    said.update({".odt": "3 paragraphs, 4 sentences", ".odp": "3 paragraphs, 4 sentences"})
    assert f"{source} -> {target}: {said[suffix]}" in err
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted([source.name, target.name])  # no temporary file


def test_refusals_name_the_file(tiny_model_dir, tmp_path, capsys):
    model = ["translate", "--model", tiny_model_dir]
    doc = tmp_path / "report.docx"
    doc.write_bytes(sample(".docx"))
    for name, message in (
        ("notes.pdf", "notes.pdf: file type .pdf is not supported (supported: .txt, .html, .htm, .srt, .docx"),
        ("book.epub", "book.epub: file type .epub (EPUB books"),
    ):
        (tmp_path / name).write_bytes(b"PK")
        code, err = cli(capsys, *model, "--input", tmp_path / name, "--output", tmp_path / "out")
        assert code == 2 and message in err, err
    code, err = cli(capsys, *model, "--input", doc, "--output", doc)
    assert code == 2 and "is the input file" in err
    code, err = cli(capsys, *model, "--input", doc)
    assert code == 2 and "needs --output" in err
    code, err = cli(capsys, *model, "--input", doc, "--output", tmp_path / "o.docx", "--nbest", "2")
    assert code == 2 and "--nbest must be 1: --input gets one translation per sentence, got 2" in err
    code, err = cli(capsys, *model, doc)  # line mode is for lines of text
    assert code == 2 and f"translate it with --input {doc}" in err
    broken = tmp_path / "broken.docx"
    broken.write_bytes(b"PK not a zip")
    code, err = cli(capsys, *model, "--input", broken, "--output", tmp_path / "b.docx")
    assert code == 2 and f"{broken}: not a readable .docx file" in err
    assert not (tmp_path / "b.docx").exists() and not (tmp_path / "o.docx").exists()


def test_a_failed_write_leaves_no_half_file(tiny_model_dir, tmp_path, monkeypatch):
    import os

    source, target = tmp_path / "in.txt", tmp_path / "out.txt"
    source.write_bytes(sample(".txt"))
    target.write_text("the previous translation")

    def refuse(src, dst):
        raise OSError("disk full")

    monkeypatch.setattr(os, "replace", refuse)
    with pytest.raises(OSError, match="disk full"):
        main(["translate", "--model", str(tiny_model_dir), "--input", str(source), "--output", str(target)])
    assert target.read_text() == "the previous translation"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["in.txt", "out.txt"]
