"""Reading text: strict UTF-8 naming file and line, NFC, aligned line counts, TSV fields, counted skips."""

import gzip
import io
import json

import pytest

from transduce.cli import main
from transduce.data.reading import read_aligned, read_lines
from transduce.data.userfiles import read_tsv


def write(path, data: bytes):
    path.write_bytes(data)
    return path


def test_invalid_utf8_names_file_and_line(tmp_path):
    f = write(tmp_path / "a.en", b"good\nalso good\nbad \xff byte\n")
    with pytest.raises(ValueError, match=r"a\.en, line 3: invalid UTF-8 \(byte 0xff at column 5\)"):
        read_lines(f)
    assert read_lines(f, skip_invalid=True).lines == ["good", "also good", None]


def test_nfc_crlf_bom_and_gzip(tmp_path):
    text = "\ufeffcafe\u0301\r\nzwei\n".encode()
    assert read_lines(write(tmp_path / "a.txt", text)).lines == ["caf\u00e9", "zwei"]
    gz = read_lines(write(tmp_path / "a.txt.gz", gzip.compress(text)))
    assert gz.lines == ["caf\u00e9", "zwei"]
    assert read_lines(write(tmp_path / "b.txt", b"no final newline")).lines == ["no final newline"]
    assert read_lines(write(tmp_path / "c.txt", b"x\n\n")).lines == ["x", ""]  # an empty line is a line


def test_bad_gzip_names_file(tmp_path):
    with pytest.raises(ValueError, match=r"x\.gz: not a valid gzip file"):
        read_lines(write(tmp_path / "x.gz", b"plain"))


def test_mismatched_line_counts_name_both_files_and_counts(tmp_path):
    a = write(tmp_path / "a.en", b"1\n2\n3\n")
    b = write(tmp_path / "b.de", b"1\n2\n")
    with pytest.raises(ValueError, match=r"a\.en has 3 lines, .*b\.de has 2"):
        read_aligned(a, b)


def test_tsv_errors_name_the_line(tmp_path):
    f = write(tmp_path / "d.tsv", b"a\tb\nc\td\ne without tab\n")
    with pytest.raises(ValueError, match=r"d\.tsv, line 3: expected 2 tab-separated fields .* found 1"):
        read_tsv(f)
    g = write(tmp_path / "e.tsv", b"a\tb\tc\n")
    with pytest.raises(ValueError, match=r"e\.tsv, line 1: .* found 3"):
        read_tsv(g)
    split, _ = read_tsv(write(tmp_path / "f.tsv", b"a\tb\n\xfe\tx\nc\td\n"), skip_invalid=True)
    assert (split.src, split.tgt, split.skipped) == (["a", "c"], ["b", "d"], {"invalid_utf8": 1})


def test_cli_errors_and_skip_invalid_counts(tmp_path, capsys):
    lines = [f"sentence number {i} here" for i in range(40)]
    src = write(tmp_path / "t.en", "\n".join(lines).encode() + b"\nbroken \xc3\x28\n")
    tgt = write(tmp_path / "t.de", "\n".join(f"Satz {i}" for i in range(41)).encode() + b"\n")
    out = tmp_path / "out"
    args = ["prepare", "files", "--src-file", str(src), "--tgt-file", str(tgt), "--out", str(out), "--vocab-size", "60"]
    assert main(args) == 2
    assert "t.en, line 41: invalid UTF-8" in capsys.readouterr().err
    assert main(args + ["--skip-invalid"]) == 0
    split = json.loads((out / "manifest.json").read_text())["splits"]["train"]
    assert (split["read"], split["sentences"], split["skipped"]) == (41, 40, {"invalid_utf8": 1})
    assert "invalid_utf8 1" in capsys.readouterr().out
    short = write(tmp_path / "s.de", b"eins\n")
    assert (
        main(
            ["prepare", "files", "--src-file", str(src), "--tgt-file", str(short), "--out", str(out), "--skip-invalid"]
        )
        == 2
    )
    err = capsys.readouterr().err
    assert "t.en has 41 lines" in err and "s.de has 1" in err


def test_commands_without_skip_invalid_read_the_same_way_and_do_not_suggest_it(tmp_path, capsys, monkeypatch):
    """evaluate (as score and check-backends) reads with read_lines: NFC text, stdin for ``-``, and an error
    that names file and line but not prepare's --skip-invalid, which these commands lack."""
    ref = write(tmp_path / "r.fr", "un caf\u00e9 noir et un croissant chaud\n".encode())
    hyp = write(
        tmp_path / "h.fr", "un cafe\u0301 noir et un croissant chaud\r\n".encode()
    )  # decomposed é, Windows line end
    assert main(["evaluate", "--hyp", str(hyp), "--ref", str(ref), "--lang", "fr", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["bleu"] == 100
    monkeypatch.setattr("sys.stdin", io.TextIOWrapper(io.BytesIO(hyp.read_bytes())))
    assert main(["evaluate", "--hyp", "-", "--ref", str(ref), "--lang", "fr", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["bleu"] == 100
    bad = write(tmp_path / "b.fr", b"un caf\xe9 noir\n")  # Latin-1
    assert main(["evaluate", "--hyp", str(bad), "--ref", str(ref), "--lang", "fr"]) == 2
    err = capsys.readouterr().err
    assert "b.fr, line 1: invalid UTF-8 (byte 0xe9 at column 7)" in err and "--skip-invalid" not in err
