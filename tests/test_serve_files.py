"""LibreTranslate's file translation: POST /translate_file and GET /download_file/<name> for .txt, .html,
.srt and office files, with their structure kept (the samples and checks of tests/file_samples.py), size
limits, expiry, and no way out of the files folder."""

import time

import pytest

pytest.importorskip("fastapi", reason="server tests need fastapi (the serve extra)")

from fastapi.testclient import TestClient  # noqa: E402
from file_samples import DOCX, archive, check, sample  # noqa: E402

from transduce.serve.files import FORMATS, FileStore  # noqa: E402
from transduce.serve.server import create_app  # noqa: E402
from transduce.serve.service import Settings  # noqa: E402


def upload(c, name, data, **fields):
    return c.post("/translate_file", files={"file": (name, data)}, data={"source": "en", "target": "fr", **fields})


@pytest.mark.slow
def test_every_format_comes_back_translated_with_its_structure(translator, tmp_path):
    assert FORMATS == (".txt", ".html", ".htm", ".srt", ".docx", ".pptx", ".odt", ".odp")
    with TestClient(create_app(translator, files=FileStore(tmp_path / "files"))) as c:
        assert c.get("/frontend/settings").json()["supportedFilesFormat"] == list(FORMATS)
        for suffix in (".txt", ".srt", ".html", ".docx", ".pptx", ".odt", ".odp"):
            name = "sample" + suffix
            r = upload(c, name, sample(suffix))
            assert r.status_code == 200, r.text
            url = r.json()["translatedFileUrl"]
            assert url.startswith("http://testserver/download_file/") and url.endswith("." + name)
            download = c.get(url)
            assert download.status_code == 200 and name in download.headers["content-disposition"]
            check(suffix, download.content, translator)


def test_file_errors_limits_expiry_and_no_path_escape(translator, tmp_path):
    store = FileStore(tmp_path / "files", expiry_s=0.5)
    secret = tmp_path / "secret.txt"
    secret.write_text("do not serve")
    with TestClient(create_app(translator, Settings(max_body=2000, char_limit=100), files=store)) as c:
        r = upload(c, "report.pdf", b"%PDF")
        assert r.status_code == 400 and "file type .pdf is not supported" in r.json()["error"]
        r = upload(c, "latin1.txt", "caf\xe9".encode("latin-1"))
        assert r.status_code == 400 and "latin1.txt is not UTF-8 text" in r.json()["error"]
        r = upload(c, "long.txt", b"A dog runs. " * 20)
        assert r.status_code == 413 and "exceeds the text limit of 100" in r.json()["error"]
        r = upload(c, "huge.txt", b"x" * 5000)
        assert r.status_code == 413 and "limit of 2000 bytes" in r.json()["error"]
        r = c.post("/translate_file", data={"source": "en", "target": "fr"})
        assert r.status_code == 400 and "missing file parameter" in r.json()["error"]
        for name in (
            "..%2Fsecret.txt",
            "secret.txt",
            "0" * 32 + ".secret.txt",
            "%2E%2E%2Fsecret.txt",
            "..%5Csecret.txt",
        ):
            r = c.get(f"/download_file/{name}")
            assert r.status_code == 404 and "do not serve" not in r.text, name
        url = upload(c, "../../etc/passwd.txt", b"A dog runs.", source="auto").json()["translatedFileUrl"]
        assert url.endswith(".passwd.txt") and list((tmp_path / "files").iterdir())[0].name.endswith(".passwd.txt")
        assert c.get(url).status_code == 200
        time.sleep(0.6)
        assert c.get(url).status_code == 404 and not list((tmp_path / "files").iterdir())  # expired, deleted
    with TestClient(create_app(translator, files=False)) as c:
        assert c.get("/frontend/settings").json()["filesTranslation"] is False
        assert upload(c, "a.txt", b"A dog.").status_code in (404, 405)


def test_file_options_on_the_command_line(tiny_model_dir, tmp_path, monkeypatch):
    import uvicorn

    from transduce.cli import main

    seen = {}
    monkeypatch.setattr(uvicorn, "run", lambda app, **kw: seen.update(app=app))
    argv = ["serve", "--model", str(tiny_model_dir), "--threads", "1"]
    assert main([*argv, "--files-dir", str(tmp_path / "out"), "--file-expiry", "60"]) == 0
    assert {"/translate_file", "/download_file/{name}"} <= set(seen["app"].openapi()["paths"])
    assert (tmp_path / "out").is_dir()
    assert main([*argv, "--disable-files-translation"]) == 0
    assert "/translate_file" not in seen["app"].openapi()["paths"]
    assert main([*argv, "--file-expiry", "0"]) == 2


def test_broken_and_oversized_office_files(translator, tmp_path):
    with TestClient(create_app(translator, files=FileStore(tmp_path / "files"))) as c:
        r = upload(c, "broken.docx", b"PK not a zip")
        assert r.status_code == 400 and "broken.docx: not a readable .docx file" in r.json()["error"]
        r = upload(c, "book.epub", b"PK")
        assert r.status_code == 400 and "file type .epub (EPUB books" in r.json()["error"]
    with TestClient(create_app(translator, Settings(max_body=4000), files=FileStore(tmp_path / "files"))) as c:
        bomb = archive({"word/document.xml": DOCX, "word/media/zeros.bin": "0" * 300_000})  # a few hundred bytes
        r = upload(c, "bomb.docx", bomb)
        assert r.status_code == 400 and "unpacks to 300" in r.json()["error"] and "limit of 200000" in r.json()["error"]
