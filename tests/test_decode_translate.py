"""Translator and `transduce translate`: line counts, empty and overlong lines, errors, the CLI."""

from __future__ import annotations

import io
import sys

import pytest

from conftest import read_multi30k
from transduce.cli import main


@pytest.fixture
def translator(tiny_translator):
    return tiny_translator


@pytest.fixture(scope="module")
def sources():
    return read_multi30k("test_2016_flickr", "en", 12)


def test_empty_and_overlong_lines_keep_the_line_count(translator, sources):
    overlong = " ".join(["dog"] * 400)  # far beyond the tiny model's max_positions=128
    lines = [sources[0], "", overlong, "   ", sources[1]]
    with pytest.warns(UserWarning, match=r"truncated 1 input line\(s\).*lines 3\b"):
        out = translator.translate(lines, beam=2, max_len_b=5)
    assert len(out) == 5
    assert out[1] == "" and out[3] == ""
    assert out[0] and out[4] and out[2]
    assert out[0] == translator.translate([sources[0]], beam=2, max_len_b=5)[0]
    with pytest.raises(ValueError, match="input line 3: .*max_positions=128"):
        translator.translate(lines, beam=2, truncate=False)


def test_results_in_input_order(translator, sources):
    one_by_one = [translator.translate([s], beam=1)[0] for s in sources[:6]]
    assert translator.translate(sources[:6], beam=1, batch_size=4) == one_by_one


def test_translations_look_like_german(translator, sources):
    """The tiny fixture model is weak but trained: its output shares words with the reference."""
    refs = read_multi30k("test_2016_flickr", "de", 12)
    out = translator.translate(sources, beam=4)
    common = sum(len(set(h.lower().split()) & set(r.lower().split())) for h, r in zip(out, refs))
    assert common >= 12, out


def _cli(argv, stdin_bytes=None, monkeypatch=None, capsys=None):
    if stdin_bytes is not None:
        monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(stdin_bytes)))
    code = main(argv)
    out = capsys.readouterr()
    return code, out.out, out.err


def test_cli_files_and_stdin(tiny_model_dir, translator, sources, tmp_path, monkeypatch, capsys):
    src = tmp_path / "in.en"
    src.write_text("\n".join([sources[0], "", sources[1]]) + "\n", encoding="utf-8")
    code, out, err = _cli(["translate", "--model", str(tiny_model_dir), "--beam", "4", str(src)],
                          capsys=capsys)
    assert code == 0, err
    expected = translator.translate([sources[0], "", sources[1]], beam=4)
    assert out.split("\n")[:-1] == expected
    code, out2, _ = _cli(["translate", "--model", str(tiny_model_dir)], stdin_bytes=src.read_bytes(),
                         monkeypatch=monkeypatch, capsys=capsys)
    assert code == 0 and out2 == out
    code, nbest, _ = _cli(["translate", "--model", str(tiny_model_dir), "--nbest", "2", str(src)], capsys=capsys)
    rows = nbest.strip("\n").split("\n")
    assert code == 0 and len(rows) == 5 and rows[0].startswith("0 ||| ") and rows[4].startswith("2 ||| ")
    assert rows[2] == "1 |||  ||| 0.0000"  # an empty line has one (empty) hypothesis


def test_cli_invalid_utf8_names_file_and_line(tiny_model_dir, tmp_path, capsys):
    bad = tmp_path / "bad.en"
    bad.write_bytes(b"a dog\nthe cat\n\xff\xfe broken\n")
    code, out, err = _cli(["translate", "--model", str(tiny_model_dir), str(bad)], capsys=capsys)
    assert code == 2 and f"{bad}:3: invalid UTF-8" in err and out == ""


def test_cli_bad_options(tiny_model_dir, capsys):
    code, _, err = _cli(["translate", "--model", str(tiny_model_dir), "--nbest", "5", "--beam", "2"], capsys=capsys)
    assert code == 2 and "--nbest 5 needs --beam" in err
    code, _, err = _cli(["translate", "--model", str(tiny_model_dir / "nope")], capsys=capsys)
    assert code == 2 and "not a model directory" in err
